/* backends/cpu/bn.h: the batch-norm bodies of the CPU reference kernels, one
 * channel at a time, shared by the batch_norm family (norm.c) and the ops
 * that fold batch norm into convolutions (convbn.c); defined in norm.c.
 *
 * A value x is seen as logical (N, C, S), S the product of the trailing
 * dimensions, in NCHW or NHWC memory (bn_strides). Every tensor of a job
 * has the job's dtype (f32 or f64), the statistics too; the sums and the
 * statistics are computed in double for both. */
#ifndef STOKE_CPU_BN_H
#define STOKE_CPU_BN_H

#include <stdint.h>

#include "stoke/plugin.h"

typedef struct bn_geom {
  int64_t n, c, s;
  double eps, momentum;
  int relu, add; /* a ReLU after the normalization; a residual added before it */
} bn_geom;

/* Element strides of logical (n, c, s). */
typedef struct bn_strides {
  int64_t n, c, s;
} bn_strides;

/* Channels last for a 4-D NHWC tensor, channels-major (NCHW, or any
 * tensor of another rank) else. */
bn_strides bn_strides_of(const stoke_tensor *t, const bn_geom *g);

/* One batch normalization: y = act(weight (x - mean) invstd + bias [+ r])
 * forward; its gradients backward. The statistics are handed to each call. */
typedef struct bn_job {
  stoke_dtype dt; /* STOKE_F32 or STOKE_F64 */
  bn_geom g;
  int training;    /* backward: through the batch statistics (1) or with them constant (0) */
  /* bn_add_relu's ReLU bitmask (stoke/ops.h): written by the forward, read by
   * the backward; NULL: the mask is recomputed from x, weight and bias */
  uint8_t *mask;
  const void *x, *w, *b, *r;
  void *y;
  const void *dy;
  void *dx, *dw, *db, *dr;  /* gradients wanted, NULL where not */
  double bx, bw, bb, br;    /* their param_grad_beta (0: overwrite) */
  bn_strides sx, sy, sr, sdy, sdx, sdr;
} bn_job;

/* The job of a kernel call whose x is input 0, y output 0 (dy, dx their
 * gradients), weight, bias and the residual inputs wi, bi, ri (ri < 0: no
 * residual; dw, db, dr their gradients, with their param_grad_beta). */
bn_job bn_job_from(const stoke_kernel_args_v1 *a, const bn_geom *g, stoke_dtype dt, int wi, int bi, int ri);

/* Element c of a statistics vector of dtype dt, as double. */
static inline double bn_stat_at(const void *p, stoke_dtype dt, int64_t c) {
  return dt == STOKE_F64 ? ((const double *)p)[c] : (double)((const float *)p)[c];
}

/* Channel c's statistics. Training: the batch mean and biased variance of
 * x over (N, S) (two passes), the running statistics rm, rv updated in
 * place (running = (1 - momentum) running + momentum batch, unbiased
 * variance for rv). Eval: rm and 1/sqrt(rv + eps), rm and rv left alone.
 * Writes saved sm[c], si[c] = (mean, invstd) and returns them in double. */
void bn_stats(const bn_job *j, int64_t c, void *rm, void *rv, void *sm, void *si, double *mean, double *invstd);

/* y of channel c, x normalized by (mean, invstd): rounded to the dtype,
 * then + r rounded, then the ReLU, as the unfused nodes compute it. */
void bn_apply_channel(const bn_job *j, int64_t c, double mean, double invstd);

/* The gradients of channel c from dy (masked by the ReLU): with
 * xhat = (x - mean) invstd, g the masked dy, over the channel's m = N S:
 *   db = sum g;  dw = sum g xhat;  dr = g
 *   dx = w invstd (g - db/m - xhat dw/m) in training, w invstd g in eval.
 * mean and invstd are read only where dx, dw or the mask need them. */
void bn_backward_channel(const bn_job *j, int64_t c, double mean, double invstd);

#endif
