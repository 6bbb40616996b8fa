/* backends/cpu/norm.c: CPU reference kernels (f32, f64); see stoke/ops.h.
 *
 * batch_norm (forward and backward, training and eval; x is (N, C, ...),
 * 4-D x in NCHW or NHWC memory), its fused forms bn_relu, bn_add_relu and
 * bn_add_bn_relu
 * (the same bodies with the ReLU, and the residual add, applied per
 * element: the reference the fused GPU kernels are checked against) and
 * normalize (u8 HWC images to f32 in the memory order its `layout`
 * attribute names; forward only). The batch-norm bodies work one channel
 * at a time (bn.h, also used by convbn.c): written once in BN_BODIES and
 * instantiated for float and double; the kernels dispatch on the dtype.
 * Statistics and reductions run in double for both types. */
#include <math.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"
#include "check.h"
#include "bn.h"
#include "cpu_cnn.h"

/* ------------------------------------------------------------- batch_norm */

/* The op a batch-norm kernel serves: 0 batch_norm, 1 bn_relu, 2 bn_add_relu. */
static const char *const bn_ops[] = {STOKE_OP_BATCH_NORM, STOKE_OP_BN_RELU, STOKE_OP_BN_ADD_RELU};

bn_strides bn_strides_of(const stoke_tensor *t, const bn_geom *g) {
  if (stoke_is_nhwc(t)) return (bn_strides){g->c * g->s, 1, g->c};
  return (bn_strides){g->c * g->s, g->s, 1};
}

/* (x, weight, bias, running_mean, running_var) -> (y, saved_mean,
 * saved_invstd); every tensor of dtype dt. Forward needs all the data;
 * backward needs dy, and x, weight, saved_* as the requested gradients do
 * (inputs 2-4 and output 0 hold no data there: bwd_needs). */
static stoke_err *bn_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run,
                           bn_geom *g, int act) {
  const char *op = bn_ops[act];
  g->relu = act >= 1;
  g->add = act == 2;
  CHECK(stoke_check_counts(a, op, bwd, g->add ? 6 : 5, g->add ? 4 : 3));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_BATCH_NORM_MOMENTUM)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes eps and momentum missing", op,
                      stoke_node_name(a));
  g->eps = n->attrs[STOKE_BATCH_NORM_EPS].f;
  g->momentum = n->attrs[STOKE_BATCH_NORM_MOMENTUM].f;
  if (!(g->eps > 0 && isfinite(g->eps)) || !(g->momentum >= 0 && g->momentum <= 1))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': eps %g must be > 0 and momentum %g in [0, 1]",
                      op, stoke_node_name(a), g->eps, g->momentum);
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape;
  if (xs->ndim < 2 || !stoke_same_shape(xs, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x[N, C, ...] -> y of x's shape, got x %s, y %s",
                      op, stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(&y->shape).s);
  g->n = xs->d[0];
  g->c = xs->d[1];
  g->s = 1;
  for (int i = 2; i < xs->ndim; i++) g->s *= xs->d[i];
  static const char *const in_names[] = {"x", "weight", "bias", "running_mean", "running_var"};
  static const char *const out_names[] = {"y", "saved_mean", "saved_invstd"};
  for (int i = 1; i < 5; i++)
    if (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a),
                        in_names[i], stoke_shape_str(&a->in[i].shape).s, stoke_shape_str(xs).s, (long long)g->c);
  for (int i = 1; i < 3; i++)
    if (a->out[i].shape.ndim != 1 || a->out[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a),
                        out_names[i], stoke_shape_str(&a->out[i].shape).s, stoke_shape_str(xs).s, (long long)g->c);
  for (int i = 0; i < 5; i++) CHECK(stoke_check_dtype(a, op, in_names[i], &a->in[i], dt));
  for (int i = 0; i < 3; i++) CHECK(stoke_check_dtype(a, op, out_names[i], &a->out[i], dt));
  CHECK(stoke_check_layout_known(a, op, "x", x));
  CHECK(stoke_check_layout_known(a, op, "y", y));
  const stoke_tensor *r = g->add ? &a->in[STOKE_BN_ADD_RELU_RESIDUAL] : NULL;
  const stoke_tensor *mk = g->add ? &a->out[STOKE_BN_ADD_RELU_MASK] : NULL;
  /* the forward writes the mask; the backward reads it where the ReLU is needed (below) */
  if (mk) CHECK(stoke_check_relu_mask(a, op, mk, x, run && !bwd));
  if (r) {
    if (!stoke_same_shape(&r->shape, xs) || stoke_is_nhwc(r) != stoke_is_nhwc(x))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the residual %s must have x's shape %s and memory order", op,
                        stoke_node_name(a), stoke_shape_str(&r->shape).s, stoke_shape_str(xs).s);
    CHECK(stoke_check_dtype(a, op, "residual", r, dt));
    if (!bwd) CHECK(stoke_check_data(a, op, "residual", r, run));
    else CHECK(stoke_check_grad(a, op, "residual", &a->din[STOKE_BN_ADD_RELU_RESIDUAL], r));
  }
  if (!bwd) {
    for (int i = 0; i < 5; i++) CHECK(stoke_check_data(a, op, in_names[i], &a->in[i], run));
    for (int i = 0; i < 3; i++) CHECK(stoke_check_data(a, op, out_names[i], &a->out[i], run));
    /* PyTorch: "Expected more than 1 value per channel when training" */
    if (run && a->training && g->n * g->s < 2)
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': training needs more than 1 value per channel, x is %s", op,
                        stoke_node_name(a), stoke_shape_str(xs).s);
    return NULL;
  }
  for (int i = 0; i < 3; i++) CHECK(stoke_check_grad(a, op, in_names[i], &a->din[i], &a->in[i]));
  CHECK(stoke_check_grad(a, op, "y", &a->dout[0], y));
  CHECK(stoke_check_layout_known(a, op, "dx", &a->din[0]));
  CHECK(stoke_check_layout_known(a, op, "dy", &a->dout[0]));
  int dx = a->din[0].data != NULL, dw = a->din[1].data != NULL, db = a->din[2].data != NULL;
  if (dx || dw || db) CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
  if (dx || dw) {
    CHECK(stoke_check_data(a, op, "x (the forward input)", x, run));
    CHECK(stoke_check_data(a, op, "saved_mean", &a->out[1], run));
    CHECK(stoke_check_data(a, op, "saved_invstd", &a->out[2], run));
  }
  if (dx) CHECK(stoke_check_data(a, op, "weight", &a->in[1], run));
  /* the ReLU's mask: bn_add_relu's is the forward's bitmask; bn_relu's is
   * recomputed from x, the saved statistics, weight and bias (neither
   * backward reads y) */
  int mask = g->relu && (dx || dw || db || (r && a->din[STOKE_BN_ADD_RELU_RESIDUAL].data));
  if (mask && g->add) CHECK(stoke_check_relu_mask(a, op, mk, x, run));
  if (mask && !g->add) {
    CHECK(stoke_check_data(a, op, "x (the forward input)", x, run));
    CHECK(stoke_check_data(a, op, "weight", &a->in[1], run));
    CHECK(stoke_check_data(a, op, "bias", &a->in[2], run));
    CHECK(stoke_check_data(a, op, "saved_mean", &a->out[1], run));
    CHECK(stoke_check_data(a, op, "saved_invstd", &a->out[2], run));
  }
  return NULL;
}

/* -------------------------------------------------------------- normalize */

/* u8 x[N, C, H, W] in HWC memory -> f32 y in the attribute's memory order.
 * The input is HWC whatever x's layout field says (the graph labels every
 * 4-D value with the graph's layout, the decoded images included). An
 * output whose layout field names an order must match the attribute. */
static stoke_err *normalize_check(const stoke_kernel_args_v1 *a, int run, int *nhwc) {
  const char *op = STOKE_OP_NORMALIZE;
  CHECK(stoke_check_counts(a, op, 0, 1, 1));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_NORMALIZE_LAYOUT)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes mean, std and layout missing", op,
                      stoke_node_name(a));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape;
  if (xs->ndim != 4 || !stoke_same_shape(xs, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': expects x[N, C, H, W] -> y of x's shape, got x %s, y %s", op,
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(&y->shape).s);
  CHECK(stoke_check_dtype(a, op, "x", x, STOKE_U8));
  CHECK(stoke_check_dtype(a, op, "y", y, STOKE_F32));
  const stoke_attr_v1 *m = &n->attrs[STOKE_NORMALIZE_MEAN], *s = &n->attrs[STOKE_NORMALIZE_STD];
  int64_t c = xs->d[1];
  if ((m->n != 1 && m->n != c) || (s->n != 1 && s->n != c))
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': mean (%d values) and std (%d values) need 1 or %lld values", op,
                      stoke_node_name(a), m->n, s->n, (long long)c);
  for (int i = 0; i < s->n; i++)
    if (!(s->floats[i] > 0))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': std %g must be > 0", op, stoke_node_name(a),
                        s->floats[i]);
  const char *l = n->attrs[STOKE_NORMALIZE_LAYOUT].s;
  if (!strcmp(l, "nhwc"))
    *nhwc = 1;
  else if (!strcmp(l, "nchw"))
    *nhwc = 0;
  else
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': layout '%s' must be nchw or nhwc", op,
                      stoke_node_name(a), l);
  CHECK(stoke_check_layout_known(a, op, "y", y));
  if ((y->layout == STOKE_NHWC && !*nhwc) || (y->layout == STOKE_NCHW && *nhwc))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': layout attribute '%s' but the output is %s", op,
                      stoke_node_name(a), l, y->layout == STOKE_NHWC ? "NHWC" : "NCHW");
  CHECK(stoke_check_data(a, op, "x", x, run));
  return stoke_check_data(a, op, "y", y, run);
}

CPU_PLAN(normalize_fwd_plan, int nhwc, normalize_check(a, 0, &nhwc))

/* y = (x / 255 - mean[c]) / std[c], in float as ToTensor then Normalize. */
static stoke_err *normalize_fwd(const stoke_kernel_args_v1 *a, void *state) {
  int nhwc;
  CHECK(normalize_check(a, 1, &nhwc));
  const stoke_attr_v1 *m = &a->node->attrs[STOKE_NORMALIZE_MEAN];
  const stoke_attr_v1 *sd = &a->node->attrs[STOKE_NORMALIZE_STD];
  const uint8_t *x = a->in[0].data;
  float *y = a->out[0].data;
  const int64_t *d = a->in[0].shape.d;
  int64_t nn = d[0], c = d[1], hw = d[2] * d[3];
  for (int64_t n = 0; n < nn; n++) {
    const uint8_t *xn = x + n * hw * c;
    float *yn = y + n * hw * c;
    for (int64_t k = 0; k < c; k++) {
      float mean = (float)m->floats[m->n == 1 ? 0 : k];
      float std = (float)sd->floats[sd->n == 1 ? 0 : k];
      if (nhwc)
        for (int64_t p = 0; p < hw; p++) yn[p * c + k] = ((float)xn[p * c + k] / 255.0f - mean) / std;
      else
        for (int64_t p = 0; p < hw; p++) yn[k * hw + p] = ((float)xn[p * c + k] / 255.0f - mean) / std;
    }
  }
  return NULL;
}

/* ========================================================== the bodies */

/* Offset of logical (n, c, s) under strides st. */
#define NOFF(st, n, c, s) ((n) * (st).n + (c) * (st).c + (s) * (st).s)

/* bn.h's functions for element type T: channel c's statistics, apply and
 * backward. */
#define BN_BODIES(T, SFX)                                                                   \
  static void bn_stats_##SFX(const bn_job *j, int64_t c, T *rm, T *rv, T *sm, T *si,        \
                             double *mean_out, double *invstd_out) {                        \
    const T *x = j->x;                                                                      \
    double m = (double)(j->g.n * j->g.s), mom = j->g.momentum, mean, invstd;                \
    if (j->training) {                                                                      \
      double sum = 0, sq = 0;                                                               \
      for (int64_t n = 0; n < j->g.n; n++)                                                  \
        for (int64_t s = 0; s < j->g.s; s++) sum += (double)x[NOFF(j->sx, n, c, s)];        \
      mean = sum / m;                                                                       \
      for (int64_t n = 0; n < j->g.n; n++)                                                  \
        for (int64_t s = 0; s < j->g.s; s++) {                                              \
          double dv = (double)x[NOFF(j->sx, n, c, s)] - mean;                               \
          sq += dv * dv;                                                                    \
        }                                                                                   \
      double var = sq / m;                                                                  \
      invstd = 1.0 / sqrt(var + j->g.eps);                                                  \
      rm[c] = (T)((1 - mom) * (double)rm[c] + mom * mean);                                  \
      rv[c] = (T)((1 - mom) * (double)rv[c] + mom * var * m / (m - 1));                     \
    } else {                                                                                \
      mean = (double)rm[c];                                                                 \
      invstd = 1.0 / sqrt((double)rv[c] + j->g.eps);                                        \
    }                                                                                       \
    sm[c] = (T)mean;                                                                        \
    si[c] = (T)invstd;                                                                      \
    *mean_out = mean;                                                                       \
    *invstd_out = invstd;                                                                   \
  }                                                                                         \
                                                                                            \
  /* The pre-activation at (n, c, s): (x - mean) scale + shift rounded to T,                \
   * then + r rounded (bn_add_relu's), as the unfused nodes round. */                       \
  static inline T bn_pre_##SFX(const bn_job *j, int64_t n, int64_t c, int64_t s, double mean, \
                               double scale, double shift) {                                \
    T v = (T)(((double)((const T *)j->x)[NOFF(j->sx, n, c, s)] - mean) * scale + shift);    \
    if (j->g.add) v = (T)((double)v + (double)((const T *)j->r)[NOFF(j->sr, n, c, s)]);     \
    return v;                                                                               \
  }                                                                                         \
                                                                                            \
  static void bn_apply_##SFX(const bn_job *j, int64_t c, double mean, double invstd) {      \
    double scale = (double)((const T *)j->w)[c] * invstd, shift = (double)((const T *)j->b)[c]; \
    T *y = j->y;                                                                            \
    for (int64_t n = 0; n < j->g.n; n++)                                                    \
      for (int64_t s = 0; s < j->g.s; s++) {                                                \
        T v = bn_pre_##SFX(j, n, c, s, mean, scale, shift);                                 \
        if (j->g.relu && v <= 0) v = (T)0; /* NaN stays NaN, as the relu node */           \
        int64_t o = NOFF(j->sy, n, c, s);                                                   \
        y[o] = v;                                                                           \
        if (j->mask && v > 0) j->mask[o >> 3] |= (uint8_t)(1u << (o & 7));                  \
      }                                                                                     \
  }                                                                                         \
                                                                                            \
  /* dy at (n, c, s), masked by the ReLU (the forward's bitmask, or the recomputed        \
   * pre-activation > 0: scale and shift are then the forward's). */                        \
  static inline double bn_gy_##SFX(const bn_job *j, int64_t n, int64_t c, int64_t s, double mean, \
                                   double scale, double shift) {                            \
    double d = (double)((const T *)j->dy)[NOFF(j->sdy, n, c, s)];                           \
    if (!j->g.relu) return d;                                                               \
    if (j->mask) {                                                                          \
      int64_t o = NOFF(j->sy, n, c, s);                                                     \
      return (j->mask[o >> 3] >> (o & 7)) & 1 ? d : 0.0;                                    \
    }                                                                                       \
    return bn_pre_##SFX(j, n, c, s, mean, scale, shift) > 0 ? d : 0.0;                      \
  }                                                                                         \
                                                                                            \
  static void bn_backward_##SFX(const bn_job *j, int64_t c, double mean, double invstd) {   \
    const T *x = j->x, *w = j->w;                                                           \
    T *dx = j->dx, *dw = j->dw, *db = j->db, *dr = j->dr;                                   \
    double m = (double)(j->g.n * j->g.s);                                                   \
    int need_x = dx || dw, recompute = j->g.relu && !j->mask;                               \
    double scale = recompute ? (double)w[c] * invstd : 0;                                   \
    double shift = recompute ? (double)((const T *)j->b)[c] : 0;                            \
    double sdy_c = 0, sdyx_c = 0;                                                           \
    for (int64_t n = 0; n < j->g.n; n++)                                                    \
      for (int64_t s = 0; s < j->g.s; s++) {                                                \
        double gy = bn_gy_##SFX(j, n, c, s, mean, scale, shift);                            \
        sdy_c += gy;                                                                        \
        if (dr) ACC(T, dr[NOFF(j->sdr, n, c, s)], j->br, gy);                               \
        if (need_x) sdyx_c += gy * ((double)x[NOFF(j->sx, n, c, s)] - mean) * invstd;       \
      }                                                                                     \
    if (dw) ACC(T, dw[c], j->bw, sdyx_c);                                                   \
    if (db) ACC(T, db[c], j->bb, sdy_c);                                                    \
    if (!dx) return;                                                                        \
    double k = (double)w[c] * invstd;                                                       \
    double mdy = j->training ? sdy_c / m : 0, mdyx = j->training ? sdyx_c / m : 0;          \
    for (int64_t n = 0; n < j->g.n; n++)                                                    \
      for (int64_t s = 0; s < j->g.s; s++) {                                                \
        double xhat = ((double)x[NOFF(j->sx, n, c, s)] - mean) * invstd;                    \
        double gy = bn_gy_##SFX(j, n, c, s, mean, scale, shift);                            \
        ACC(T, dx[NOFF(j->sdx, n, c, s)], j->bx, k * (gy - mdy - xhat * mdyx));             \
      }                                                                                     \
  }

BN_BODIES(float, f32)
BN_BODIES(double, f64)

void bn_stats(const bn_job *j, int64_t c, void *rm, void *rv, void *sm, void *si, double *mean, double *invstd) {
  if (j->dt == STOKE_F64) bn_stats_f64(j, c, rm, rv, sm, si, mean, invstd);
  else bn_stats_f32(j, c, rm, rv, sm, si, mean, invstd);
}

void bn_apply_channel(const bn_job *j, int64_t c, double mean, double invstd) {
  if (j->dt == STOKE_F64) bn_apply_f64(j, c, mean, invstd);
  else bn_apply_f32(j, c, mean, invstd);
}

void bn_backward_channel(const bn_job *j, int64_t c, double mean, double invstd) {
  if (j->dt == STOKE_F64) bn_backward_f64(j, c, mean, invstd);
  else bn_backward_f32(j, c, mean, invstd);
}

/* ================================================================ kernels */

bn_job bn_job_from(const stoke_kernel_args_v1 *a, const bn_geom *g, stoke_dtype dt, int wi, int bi, int ri) {
  bn_job j = {.dt = dt, .g = *g, .training = a->training};
  j.x = a->in[0].data, j.w = a->in[wi].data, j.b = a->in[bi].data, j.y = a->out[0].data;
  j.sx = bn_strides_of(&a->in[0], g), j.sy = bn_strides_of(&a->out[0], g);
  if (ri >= 0) j.r = a->in[ri].data, j.sr = bn_strides_of(&a->in[ri], g);
  if (!a->din) return j;
  j.dy = a->dout[0].data, j.sdy = bn_strides_of(&a->dout[0], g);
  j.dx = a->din[0].data, j.dw = a->din[wi].data, j.db = a->din[bi].data;
  j.sdx = bn_strides_of(&a->din[0], g);
  j.bx = stoke_grad_beta(a, 0), j.bw = stoke_grad_beta(a, wi), j.bb = stoke_grad_beta(a, bi);
  if (ri >= 0) j.dr = a->din[ri].data, j.sdr = bn_strides_of(&a->din[ri], g), j.br = stoke_grad_beta(a, ri);
  return j;
}

/* The job of a batch_norm-family call: (x, weight, bias, running_mean,
 * running_var [, r]) -> (y, saved_mean, saved_invstd [, relu_mask]);
 * bn_add_relu's ReLU mask is its output 3 (bwd_needs keeps it), bn_relu's
 * recomputed from x (its bwd_needs keeps x, weight, bias and the saved
 * statistics, not y). */
static bn_job bn_job_of(const stoke_kernel_args_v1 *a, const bn_geom *g, stoke_dtype dt) {
  bn_job j = bn_job_from(a, g, dt, 1, 2, g->add ? STOKE_BN_ADD_RELU_RESIDUAL : -1);
  if (g->add) j.mask = a->out[STOKE_BN_ADD_RELU_MASK].data;
  return j;
}

/* Per channel: the statistics (training: the batch's, running statistics
 * updated; eval: the running ones), saved_* = (mean, 1/sqrt(var + eps)),
 * then y = act((x - mean) invstd weight + bias [+ r]). */
static stoke_err *bn_fwd(const stoke_kernel_args_v1 *a, stoke_dtype dt, int act) {
  bn_geom g;
  CHECK(bn_check(a, dt, 0, 1, &g, act));
  bn_job j = bn_job_of(a, &g, dt);
  if (j.mask) memset(j.mask, 0, (size_t)a->out[STOKE_BN_ADD_RELU_MASK].shape.d[0]);
  for (int64_t c = 0; c < g.c; c++) {
    double mean, invstd;
    bn_stats(&j, c, a->in[3].data, a->in[4].data, a->out[1].data, a->out[2].data, &mean, &invstd);
    bn_apply_channel(&j, c, mean, invstd);
  }
  return NULL;
}

/* From x, weight, saved_mean, saved_invstd (bwd_needs) and dy, see
 * bn_backward_channel; bn_add_relu's dr is the masked dy. */
static stoke_err *bn_bwd(const stoke_kernel_args_v1 *a, stoke_dtype dt, int act) {
  bn_geom g;
  CHECK(bn_check(a, dt, 1, 1, &g, act));
  bn_job j = bn_job_of(a, &g, dt);
  if (!j.dx && !j.dw && !j.db && !j.dr) return NULL;
  int need_x = j.dx || j.dw || (g.relu && !g.add);
  for (int64_t c = 0; c < g.c; c++) {
    double mean = need_x ? bn_stat_at(a->out[1].data, dt, c) : 0;
    double invstd = need_x ? bn_stat_at(a->out[2].data, dt, c) : 0;
    bn_backward_channel(&j, c, mean, invstd);
  }
  return NULL;
}

#define BN_KERNELS(SFX, DT, ACT)                                                                \
  CPU_PLAN(bn_fwd_plan_##SFX, bn_geom g, bn_check(a, DT, 0, 0, &g, ACT))                        \
  CPU_PLAN(bn_bwd_plan_##SFX, bn_geom g, bn_check(a, DT, 1, 0, &g, ACT))                        \
  static stoke_err *bn_fwd_##SFX(const stoke_kernel_args_v1 *a, void *state) { return bn_fwd(a, DT, ACT); } \
  static stoke_err *bn_bwd_##SFX(const stoke_kernel_args_v1 *a, void *state) { return bn_bwd(a, DT, ACT); }

BN_KERNELS(f32, STOKE_F32, 0)
BN_KERNELS(f64, STOKE_F64, 0)
BN_KERNELS(relu_f32, STOKE_F32, 1)
BN_KERNELS(relu_f64, STOKE_F64, 1)
BN_KERNELS(add_relu_f32, STOKE_F32, 2)
BN_KERNELS(add_relu_f64, STOKE_F64, 2)

/* ======================================================== bn_add_bn_relu */

/* bn_add_bn_relu (stoke/ops.h) as the nodes it joins: the shortcut's
 * batch_norm over r into a workspace copy of bn2(r), then bn_add_relu with
 * that as its residual; backward: bn_add_relu's (its dr, the masked dy,
 * into the workspace), then the shortcut's batch_norm backward from it.
 * The reference the fused kernels are checked against, rounding where the
 * unfused nodes round. The views below are those nodes' arguments: `a1`
 * bn_add_relu's (inputs 0-5, outputs 0-3), `a2` the batch_norm's (r,
 * inputs 6-9; outputs a y that is the workspace, 4 and 5), their gradient
 * flags and betas moved to their own indices. */
typedef struct bn2_view {
  stoke_kernel_args_v1 a1, a2;
  stoke_node_v1 n2;
  stoke_tensor in1[6], in2[5], out2[3], din1[6], din2[5], dout2[1];
  bn_geom g1, g2;
} bn2_view;

/* Bit `from` of m as bit `to`. */
static uint32_t bit_to(uint32_t m, int from, int to) { return ((m >> from) & 1u) << to; }

static size_t bn2_ws(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd) {
  return (size_t)stoke_numel(&a->in[0].shape) * stoke_dtype_size(dt) * (bwd ? 2 : 1);
}

/* `ws` holds bn2(r) (forward) or dz, then dx before it is added into din[0] (backward). */
static stoke_err *bn2_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, bn2_view *v) {
  const char *op = STOKE_OP_BN_ADD_BN_RELU;
  CHECK(stoke_check_counts(a, op, bwd, 10, 6));
  if (!a->node || a->node->n_attrs < 4)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes eps, momentum, shortcut_eps, shortcut_momentum missing",
                      op, stoke_node_name(a));
  if (run && a->workspace_bytes < bn2_ws(a, dt, bwd))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': workspace of %zu bytes, the kernel needs %zu", op,
                      stoke_node_name(a), a->workspace_bytes, bn2_ws(a, dt, bwd));
  memset(v, 0, sizeof *v);
  /* the workspace's first half as an r-shaped tensor (x's shape, r's memory order), its second dx's */
  stoke_tensor ws0 = a->in[5];
  ws0.data = run ? a->workspace : NULL;
  void *ws_dx = run ? (char *)a->workspace + bn2_ws(a, dt, 0) : NULL;
  /* bn_add_relu: x, weight, bias, running stats, residual (bn2(r): the workspace in forward) */
  for (int i = 0; i < 6; i++) v->in1[i] = a->in[i];
  if (!bwd) v->in1[5] = ws0;
  v->a1 = *a;
  v->a1.n_in = 6, v->a1.n_out = 4, v->a1.in = v->in1;
  /* the shortcut's batch_norm: r, weight, bias, running stats -> bn2(r) (the workspace), saved stats */
  v->in2[0] = a->in[5];
  for (int i = 1; i < 5; i++) v->in2[i] = a->in[STOKE_BN2_WEIGHT + i - 1];
  v->out2[0] = ws0;
  if (bwd) v->out2[0].data = NULL; /* batch_norm's backward reads no y */
  v->out2[1] = a->out[STOKE_BN2_SAVED_MEAN], v->out2[2] = a->out[STOKE_BN2_SAVED_MEAN + 1];
  v->n2 = *a->node;
  v->n2.attrs[STOKE_BATCH_NORM_EPS] = a->node->attrs[STOKE_BN2_EPS];
  v->n2.attrs[STOKE_BATCH_NORM_MOMENTUM] = a->node->attrs[STOKE_BN2_EPS + 1];
  v->n2.n_attrs = 2;
  v->a2 = *a;
  v->a2.node = &v->n2, v->a2.n_in = 5, v->a2.n_out = 3, v->a2.in = v->in2, v->a2.out = v->out2;
  if (bwd) {
    /* bn_add_relu's dx into the workspace (added into din[0] last: din[0] may share r's memory), its
     * dr, the masked dy, into the workspace too, which the shortcut's backward takes as its dy */
    for (int i = 0; i < 6; i++) v->din1[i] = a->din[i];
    v->din1[0].data = a->din[0].data ? ws_dx : NULL;
    v->din1[5] = ws0;
    v->a1.din = v->din1;
    v->a1.param_grads = a->param_grads & 6u, v->a1.din_accumulate = a->din_accumulate & 6u;
    for (int i = 0; i < 3; i++) v->din2[i] = a->din[i == 0 ? STOKE_BN_ADD_RELU_RESIDUAL : STOKE_BN2_WEIGHT + i - 1];
    v->din2[3] = a->din[STOKE_BN2_WEIGHT + 2], v->din2[4] = a->din[STOKE_BN2_WEIGHT + 3];
    v->dout2[0] = ws0;
    v->a2.din = v->din2, v->a2.dout = v->dout2;
    v->a2.param_grads = bit_to(a->param_grads, 5, 0) | bit_to(a->param_grads, 6, 1) | bit_to(a->param_grads, 7, 2);
    v->a2.din_accumulate =
        bit_to(a->din_accumulate, 5, 0) | bit_to(a->din_accumulate, 6, 1) | bit_to(a->din_accumulate, 7, 2);
  }
  CHECK(bn_check(&v->a1, dt, bwd, run, &v->g1, 2));
  CHECK(bn_check(&v->a2, dt, bwd, run, &v->g2, 0));
  return NULL;
}

static stoke_err *bn2_plan(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, void **state, size_t *ws) {
  bn2_view v;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(bn2_check(a, dt, bwd, 0, &v));
  if (ws) *ws = bn2_ws(a, dt, bwd);
  return NULL;
}

static stoke_err *bn2_fwd(const stoke_kernel_args_v1 *a, stoke_dtype dt) {
  bn2_view v;
  CHECK(bn2_check(a, dt, 0, 1, &v));
  CHECK(bn_fwd(&v.a2, dt, 0));
  return bn_fwd(&v.a1, dt, 2);
}

static stoke_err *bn2_bwd(const stoke_kernel_args_v1 *a, stoke_dtype dt) {
  bn2_view v;
  CHECK(bn2_check(a, dt, 1, 1, &v));
  CHECK(bn_bwd(&v.a1, dt, 2));
  CHECK(bn_bwd(&v.a2, dt, 0));
  if (!a->din[0].data) return NULL;
  double beta = stoke_grad_beta(a, 0);
  const void *src = v.din1[0].data;
  void *dst = a->din[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++)
    if (dt == STOKE_F64) ACC(double, ((double *)dst)[i], beta, ((const double *)src)[i]);
    else ACC(float, ((float *)dst)[i], beta, ((const float *)src)[i]);
  return NULL;
}

#define BN2_KERNELS(SFX, DT)                                                                                      \
  static stoke_err *bn2_fwd_plan_##SFX(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {                   \
    return bn2_plan(a, DT, 0, st, ws);                                                                           \
  }                                                                                                              \
  static stoke_err *bn2_bwd_plan_##SFX(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {                   \
    return bn2_plan(a, DT, 1, st, ws);                                                                           \
  }                                                                                                              \
  static stoke_err *bn2_fwd_##SFX(const stoke_kernel_args_v1 *a, void *state) { return bn2_fwd(a, DT); }        \
  static stoke_err *bn2_bwd_##SFX(const stoke_kernel_args_v1 *a, void *state) { return bn2_bwd(a, DT); }

BN2_KERNELS(f32, STOKE_F32)
BN2_KERNELS(f64, STOKE_F64)

/* ============================================================ registration */

#define NKERNEL(op, pass, fn, sfx, dt) CPU_KERNEL(op, pass, fn, sfx, dt, stoke_destroy_none)

static const stoke_kernel_v1 norm_kernels[] = {
    NKERNEL(STOKE_OP_BATCH_NORM, STOKE_FWD, bn_fwd, f32, STOKE_F32),
    NKERNEL(STOKE_OP_BATCH_NORM, STOKE_BWD, bn_bwd, f32, STOKE_F32),
    NKERNEL(STOKE_OP_BATCH_NORM, STOKE_FWD, bn_fwd, f64, STOKE_F64),
    NKERNEL(STOKE_OP_BATCH_NORM, STOKE_BWD, bn_bwd, f64, STOKE_F64),
    NKERNEL(STOKE_OP_BN_RELU, STOKE_FWD, bn_fwd, relu_f32, STOKE_F32),
    NKERNEL(STOKE_OP_BN_RELU, STOKE_BWD, bn_bwd, relu_f32, STOKE_F32),
    NKERNEL(STOKE_OP_BN_RELU, STOKE_FWD, bn_fwd, relu_f64, STOKE_F64),
    NKERNEL(STOKE_OP_BN_RELU, STOKE_BWD, bn_bwd, relu_f64, STOKE_F64),
    NKERNEL(STOKE_OP_BN_ADD_RELU, STOKE_FWD, bn_fwd, add_relu_f32, STOKE_F32),
    NKERNEL(STOKE_OP_BN_ADD_RELU, STOKE_BWD, bn_bwd, add_relu_f32, STOKE_F32),
    NKERNEL(STOKE_OP_BN_ADD_RELU, STOKE_FWD, bn_fwd, add_relu_f64, STOKE_F64),
    NKERNEL(STOKE_OP_BN_ADD_RELU, STOKE_BWD, bn_bwd, add_relu_f64, STOKE_F64),
    NKERNEL(STOKE_OP_BN_ADD_BN_RELU, STOKE_FWD, bn2_fwd, f32, STOKE_F32),
    NKERNEL(STOKE_OP_BN_ADD_BN_RELU, STOKE_BWD, bn2_bwd, f32, STOKE_F32),
    NKERNEL(STOKE_OP_BN_ADD_BN_RELU, STOKE_FWD, bn2_fwd, f64, STOKE_F64),
    NKERNEL(STOKE_OP_BN_ADD_BN_RELU, STOKE_BWD, bn2_bwd, f64, STOKE_F64),
    {"cpu", STOKE_OP_NORMALIZE, STOKE_FWD, STOKE_U8, STOKE_LAYOUT_ANY, normalize_fwd_plan,
     normalize_fwd, stoke_destroy_none},
};

stoke_err *cpu_register_norm(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, norm_kernels, sizeof norm_kernels / sizeof *norm_kernels);
}
