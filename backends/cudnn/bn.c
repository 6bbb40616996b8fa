/* backends/cudnn/bn.c: batch_norm forward and backward (f32, bf16, f16; 4-D
 * x in NCHW or NHWC) through cuDNN's batch-norm API, as PyTorch's cudnn
 * path does (aten/src/ATen/native/cudnn/BatchNorm.cpp).
 *
 * Training forward: cudnnBatchNormalizationForwardTrainingEx (bnOps BN)
 * writes y, saved_mean, saved_invstd (cuDNN's resultSaveInvVariance is
 * 1/sqrt(var + eps)) and updates the running statistics in place with
 * exponentialAverageFactor = momentum; cuDNN's running variance takes the
 * unbiased batch variance, as PyTorch's (checked against the CPU reference
 * by tests/gpu/cudnn_bn_test.c). Eval forward:
 * cudnnBatchNormalizationForwardInference on the running statistics, and a
 * small kernel writes them as saved_mean / saved_invstd.
 *
 * Backward: cudnnBatchNormalizationBackwardEx with the saved statistics
 * gives dscale = sum dy xhat and dbias = sum dy (right in eval too, where
 * saved_* hold the running statistics) and the training dx. In eval dx is
 * w invstd dy instead: cuDNN's inference forward run on dy with scale
 * w invstd, mean 0, variance 1 and eps 0 overwrites it.
 *
 * Mode: CUDNN_BATCHNORM_SPATIAL_PERSISTENT for NHWC bf16/f16 training (its
 * fast NHWC kernels), else CUDNN_BATCHNORM_SPATIAL; the backward uses the
 * forward's mode. cuDNN wants scale, bias and their gradients in f32: they
 * are staged in the workspace (bn_cast.cu converts weight/bias, and adds
 * dscale/dbias onto dw/db with param_grad_beta), for f32 too, so that dw
 * and db may each be wanted or not and accumulate each with its own beta.
 *
 * Registered for STOKE_NCHW and STOKE_NHWC only: a 2-D x (BatchNorm1d) has
 * layout STOKE_LAYOUT_ANY, finds no kernel here and falls through to the
 * next engine (cuda). */

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke_cudnn.h"

/* bn_cast.cu; dtype codes 0 f32, 1 bf16, 2 f16. */
cudaError_t stoke_cudnn_bn_params(const void *w, const void *b, int dt, long long c, float *scale, float *bias,
                                  cudaStream_t s);
cudaError_t stoke_cudnn_bn_eval_stats(const float *rm, const float *rv, double eps, long long c, float *sm,
                                      float *si, cudaStream_t s);
cudaError_t stoke_cudnn_bn_eval_dx_params(const void *w, int dt, const float *si, long long c, float *scale,
                                          float *zeros, float *ones, cudaStream_t s);
cudaError_t stoke_cudnn_bn_param_grads(const float *dscale, const float *dbias, int dt, long long c, void *dw,
                                       float bw, void *db, float bb, cudaStream_t s);

#define BN_ALIGN 256
#define BN_NF 7 /* f32 per-channel arrays staged: scale, bias, dscale, dbias, zeros, ones, eval scale */

static size_t bn_align(size_t n) { return (n + BN_ALIGN - 1) / BN_ALIGN * BN_ALIGN; }

typedef struct bn_state {
  cudnn_engine *eng;
  cudnnTensorDescriptor_t x, bn; /* x also y, dx, dy; bn: 1xCx1x1 f32 */
  cudnnBatchNormMode_t mode;     /* training forward and backward */
  int bwd, training, dt;         /* dt: the code bn_cast.cu takes */
  int64_t n, c, h, w;
  double eps, momentum;
  size_t f_region;  /* the staged f32 arrays */
  size_t dx_region; /* backward, dx not wanted: a scratch dx for cuDNN */
  size_t reserve;   /* cuDNN's reserve space (bnOps BN: expected 0) */
  size_t cudnn_ws;  /* cuDNN's workspace */
  size_t total;
  char ctx[256];
} bn_state;

static void bn_destroy(void *state) {
  bn_state *st = state;
  if (!st) return;
  if (st->x) cudnnDestroyTensorDescriptor(st->x);
  if (st->bn) cudnnDestroyTensorDescriptor(st->bn);
  stoke_host->free(st);
}

/* Shapes, dtypes and layouts the kernel serves; fills the geometry. */
static stoke_err *bn_validate(const stoke_kernel_args_v1 *a, stoke_dtype dt, stoke_layout lay, int bwd, bn_state *st) {
  const char *nn = stoke_node_name(a);
  if (a->n_in < 5 || a->n_out < 3 || !a->in || !a->out)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': needs 5 inputs and 3 outputs, got %d and %d", nn,
                      a->n_in, a->n_out);
  if (bwd && (!a->din || !a->dout))
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': backward called without gradient tensors", nn);
  if (!a->node || a->node->n_attrs <= STOKE_BATCH_NORM_MOMENTUM)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': attributes eps and momentum missing", nn);
  st->eps = a->node->attrs[STOKE_BATCH_NORM_EPS].f;
  st->momentum = a->node->attrs[STOKE_BATCH_NORM_MOMENTUM].f;
  if (!(st->eps > 0 && isfinite(st->eps)) || !(st->momentum >= 0 && st->momentum <= 1))
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': eps %g must be > 0 and momentum %g in [0, 1]", nn,
                      st->eps, st->momentum);
  const stoke_tensor *x = &a->in[0];
  if (x->shape.ndim != 4)
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "cudnn batch_norm '%s': only 4-D x (N, C, H, W) is supported, x is %d-D; 2-D batch norms "
                      "(layout any) are served by the cuda engine",
                      nn, x->shape.ndim);
  if (x->dtype != dt || x->layout != lay)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': kernel for %s %s called with x %s %s", nn,
                      stoke_dtype_name(dt), stoke_layout_name(lay), stoke_dtype_name(x->dtype),
                      stoke_layout_name(x->layout));
  st->n = x->shape.d[0], st->c = x->shape.d[1], st->h = x->shape.d[2], st->w = x->shape.d[3];
  if (st->n < 1 || st->c < 1 || st->h < 1 || st->w < 1 || st->n > INT_MAX || st->c > INT_MAX || st->h > INT_MAX ||
      st->w > INT_MAX || stoke_numel(&x->shape) > INT_MAX)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cudnn batch_norm '%s': x (%lld, %lld, %lld, %lld) is empty or too large",
                      nn, (long long)st->n, (long long)st->c, (long long)st->h, (long long)st->w);
  static const char *const in_names[] = {"x", "weight", "bias", "running_mean", "running_var"};
  static const char *const out_names[] = {"y", "saved_mean", "saved_invstd"};
  if (!stoke_same_shape(&x->shape, &a->out[0].shape) || a->out[0].dtype != dt || a->out[0].layout != lay)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': y must have x's shape, dtype and layout", nn);
  for (int i = 1; i < 5; i++) {
    stoke_dtype want = i < 3 ? dt : STOKE_F32;
    if (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != st->c || a->in[i].dtype != want)
      return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': %s must be %s [%lld]", nn, in_names[i],
                        stoke_dtype_name(want), (long long)st->c);
  }
  for (int j = 1; j < 3; j++)
    if (a->out[j].shape.ndim != 1 || a->out[j].shape.d[0] != st->c || a->out[j].dtype != STOKE_F32)
      return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': %s must be f32 [%lld]", nn, out_names[j],
                        (long long)st->c);
  if (bwd) {
    for (int i = 0; i < 3; i++)
      if (a->din[i].data && (!stoke_same_shape(&a->din[i].shape, &a->in[i].shape) || a->din[i].dtype != dt ||
                             (i == 0 && a->din[0].layout != lay)))
        return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': gradient of %s must match it", nn, in_names[i]);
    if (!stoke_same_shape(&a->dout[0].shape, &x->shape) || a->dout[0].dtype != dt || a->dout[0].layout != lay)
      return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': dy must have x's shape, dtype and layout", nn);
  }
  if (a->training && st->n * st->h * st->w < 2)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': training needs more than 1 value per channel", nn);
  return NULL;
}

static cudnnDataType_t cudnn_dtype(stoke_dtype dt) {
  return dt == STOKE_BF16 ? CUDNN_DATA_BFLOAT16 : dt == STOKE_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

static stoke_err *bn_plan(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes, stoke_dtype dt,
                          stoke_layout lay, int bwd) {
  if (state) *state = NULL;
  if (workspace_bytes) *workspace_bytes = 0;
  cudnn_engine *eng = a->engine;
  if (!eng) return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': no engine state", stoke_node_name(a));
  bn_state *st = stoke_host->alloc(sizeof *st);
  if (!st) return STOKE_PERR(STOKE_E_OOM, "cudnn batch_norm: out of host memory");
  memset(st, 0, sizeof *st);
  stoke_err *e = bn_validate(a, dt, lay, bwd, st);
  if (e) {
    stoke_host->free(st);
    return e;
  }
  st->eng = eng;
  st->bwd = bwd;
  st->training = a->training;
  st->dt = dt == STOKE_BF16 ? 1 : dt == STOKE_F16 ? 2 : 0;
  int nhwc = lay == STOKE_NHWC;
  st->mode = nhwc && dt != STOKE_F32 && a->training ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
  snprintf(st->ctx, sizeof st->ctx, "node '%s', x (%lld, %lld, %lld, %lld) %s %s, %s, mode %s", stoke_node_name(a),
           (long long)st->n, (long long)st->c, (long long)st->h, (long long)st->w, stoke_dtype_name(dt),
           nhwc ? "NHWC" : "NCHW", a->training ? "training" : "eval",
           st->mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? "spatial-persistent" : "spatial");
#define BN_TRY(call)                                                         \
  do {                                                                       \
    cudnnStatus_t s_ = (call);                                               \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                        \
      e = stoke_cudnn_err(s_, __FILE__, __LINE__, #call, st->ctx);           \
      bn_destroy(st);                                                        \
      return e;                                                              \
    }                                                                        \
  } while (0)
  BN_TRY(cudnnCreateTensorDescriptor(&st->x));
  BN_TRY(cudnnCreateTensorDescriptor(&st->bn));
  BN_TRY(cudnnSetTensor4dDescriptor(st->x, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, cudnn_dtype(dt), (int)st->n,
                                    (int)st->c, (int)st->h, (int)st->w));
  BN_TRY(cudnnDeriveBNTensorDescriptor(st->bn, st->x, st->mode));
  size_t cb = (size_t)st->c * sizeof(float);
  st->f_region = BN_NF * bn_align(cb);
  if (a->training) {
    BN_TRY(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(eng->handle, st->mode, CUDNN_BATCHNORM_OPS_BN, NULL,
                                                               st->x, &st->reserve));
    if (!bwd)
      BN_TRY(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(eng->handle, st->mode, CUDNN_BATCHNORM_OPS_BN,
                                                                      st->x, NULL, st->x, st->bn, NULL,
                                                                      &st->cudnn_ws));
  }
  if (bwd) {
    cudnnBatchNormMode_t m = a->training ? st->mode : CUDNN_BATCHNORM_SPATIAL;
    BN_TRY(cudnnGetBatchNormalizationBackwardExWorkspaceSize(eng->handle, m, CUDNN_BATCHNORM_OPS_BN, st->x, st->x,
                                                             st->x, NULL, st->x, st->bn, NULL, &st->cudnn_ws));
    if (!a->din[0].data) st->dx_region = bn_align((size_t)stoke_numel(&a->in[0].shape) * stoke_dtype_size(dt));
  }
#undef BN_TRY
  st->total = st->f_region + st->dx_region + bn_align(st->reserve) + bn_align(st->cudnn_ws);
  stoke_host->log(STOKE_LOG_DEBUG, "cudnn", "batch_norm %s: %s workspace %zu B (cuDNN %zu, reserve %zu)",
                  bwd ? "backward" : "forward", st->ctx, st->total, st->cudnn_ws, st->reserve);
  if (workspace_bytes) *workspace_bytes = st->total;
  if (state) *state = st;
  else bn_destroy(st);
  return NULL;
}

/* Pointers into the workspace: the f32 arrays, the dx scratch, reserve, cuDNN's. */
typedef struct bn_ws {
  float *f[BN_NF];
  void *dx, *reserve, *cudnn;
} bn_ws;

static stoke_err *bn_layout_ws(const stoke_kernel_args_v1 *a, const bn_state *st, bn_ws *w) {
  if (a->workspace_bytes < st->total || (st->total && !a->workspace))
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm: workspace of %zu bytes, the kernel needs %zu; %s",
                      a->workspace_bytes, st->total, st->ctx);
  char *p = a->workspace;
  size_t cb = bn_align((size_t)st->c * sizeof(float));
  for (int i = 0; i < BN_NF; i++) w->f[i] = (float *)(p + (size_t)i * cb);
  p += st->f_region;
  w->dx = st->dx_region ? p : NULL;
  p += st->dx_region;
  w->reserve = st->reserve ? p : NULL;
  p += bn_align(st->reserve);
  w->cudnn = st->cudnn_ws ? p : NULL;
  return NULL;
}

static stoke_err *bn_check_run(const stoke_kernel_args_v1 *a, const bn_state *st) {
  if (!st) return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm '%s': run without plan", stoke_node_name(a));
  if (a->training != st->training)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm: planned for %s, run in %s; %s",
                      st->training ? "training" : "eval", a->training ? "training" : "eval", st->ctx);
  return NULL;
}

static stoke_err *bn_fwd_run(const stoke_kernel_args_v1 *a, void *state) {
  bn_state *st = state;
  STOKE_PROPAGATE_P(bn_check_run(a, st));
  bn_ws w;
  STOKE_PROPAGATE_P(bn_layout_ws(a, st, &w));
  for (int i = 0; i < 5; i++)
    if (!a->in[i].data) return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm: input %d has no data; %s", i, st->ctx);
  for (int j = 0; j < 3; j++)
    if (!a->out[j].data) return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm: output %d has no data; %s", j, st->ctx);
  cudnnHandle_t h = st->eng->handle;
  cudaStream_t s = a->stream;
  CUDNN_CHECK(cudnnSetStream(h, s), st->ctx);
  const void *scale = a->in[1].data, *bias = a->in[2].data;
  if (st->dt != 0) {
    STOKE_CUDA(stoke_cudnn_bn_params(a->in[1].data, a->in[2].data, st->dt, st->c, w.f[0], w.f[1], s));
    scale = w.f[0], bias = w.f[1];
  }
  const float one = 1.0f, zero = 0.0f;
  if (a->training) {
    CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
                    h, st->mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, st->x, a->in[0].data, NULL, NULL, st->x,
                    a->out[0].data, st->bn, scale, bias, st->momentum, a->in[3].data, a->in[4].data, st->eps,
                    a->out[1].data, a->out[2].data, NULL, w.cudnn, st->cudnn_ws, w.reserve, st->reserve),
                st->ctx);
  } else {
    CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, st->x,
                                                        a->in[0].data, st->x, a->out[0].data, st->bn, scale, bias,
                                                        a->in[3].data, a->in[4].data, st->eps),
                st->ctx);
    STOKE_CUDA(stoke_cudnn_bn_eval_stats(a->in[3].data, a->in[4].data, st->eps, st->c, a->out[1].data,
                                         a->out[2].data, s));
  }
  return NULL;
}

static float bn_beta(const stoke_kernel_args_v1 *a, int i) {
  return (a->param_grads >> i) & 1u ? a->param_grad_beta : 0.0f;
}

static stoke_err *bn_bwd_run(const stoke_kernel_args_v1 *a, void *state) {
  bn_state *st = state;
  STOKE_PROPAGATE_P(bn_check_run(a, st));
  void *dx = a->din[0].data, *dw = a->din[1].data, *db = a->din[2].data;
  if (!dx && !dw && !db) return NULL;
  bn_ws w;
  STOKE_PROPAGATE_P(bn_layout_ws(a, st, &w));
  if (!dx && !w.dx)
    return STOKE_PERR(STOKE_E_INTERNAL, "cudnn batch_norm backward: dx not wanted but plan() saw it wanted; %s",
                      st->ctx);
  if (!a->in[0].data || !a->in[1].data || !a->out[1].data || !a->out[2].data || !a->dout[0].data)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn batch_norm backward: x, weight, saved statistics or dy has no data; %s",
                      st->ctx);
  cudnnHandle_t h = st->eng->handle;
  cudaStream_t s = a->stream;
  CUDNN_CHECK(cudnnSetStream(h, s), st->ctx);
  const void *scale = a->in[1].data;
  if (st->dt != 0) {
    STOKE_CUDA(stoke_cudnn_bn_params(a->in[1].data, NULL, st->dt, st->c, w.f[0], w.f[1], s));
    scale = w.f[0];
  }
  const float one = 1.0f, zero = 0.0f;
  void *dxo = dx ? dx : w.dx;
  cudnnBatchNormMode_t m = a->training ? st->mode : CUDNN_BATCHNORM_SPATIAL;
  CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(h, m, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, &zero, st->x,
                                                a->in[0].data, NULL, NULL, st->x, a->dout[0].data, NULL, NULL, st->x,
                                                dxo, st->bn, scale, NULL, w.f[2], w.f[3], st->eps, a->out[1].data,
                                                a->out[2].data, NULL, w.cudnn, st->cudnn_ws, w.reserve, st->reserve),
              st->ctx);
  STOKE_CUDA(stoke_cudnn_bn_param_grads(w.f[2], w.f[3], st->dt, st->c, dw, bn_beta(a, 1), db, bn_beta(a, 2), s));
  if (!a->training && dx) {
    /* eval: dx = w invstd dy, as an inference forward of dy */
    STOKE_CUDA(stoke_cudnn_bn_eval_dx_params(a->in[1].data, st->dt, a->out[2].data, st->c, w.f[6], w.f[4], w.f[5], s));
    CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, st->x,
                                                        a->dout[0].data, st->x, dx, st->bn, w.f[6], w.f[4], w.f[4],
                                                        w.f[5], 0.0),
                st->ctx);
  }
  return NULL;
}

#define BN_PLANS(DT, LAY, TAG)                                                                               \
  static stoke_err *plan_fwd_##TAG(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {                  \
    return bn_plan(a, st, ws, DT, LAY, 0);                                                                   \
  }                                                                                                          \
  static stoke_err *plan_bwd_##TAG(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {                  \
    return bn_plan(a, st, ws, DT, LAY, 1);                                                                   \
  }

BN_PLANS(STOKE_BF16, STOKE_NHWC, bf16_nhwc)
BN_PLANS(STOKE_F16, STOKE_NHWC, f16_nhwc)

#define BN_KERNELS(DT, LAY, TAG)                                                                           \
  {"cudnn", STOKE_OP_BATCH_NORM, STOKE_FWD, DT, LAY, plan_fwd_##TAG, bn_fwd_run, bn_destroy},           \
  {"cudnn", STOKE_OP_BATCH_NORM, STOKE_BWD, DT, LAY, plan_bwd_##TAG, bn_bwd_run, bn_destroy}

/* NCHW and NHWC explicitly, not STOKE_LAYOUT_ANY: see the top. */
static const stoke_kernel_v1 bn_kernels[] = {
    /* NHWC bf16/fp16 only: there cuDNN's (persistent) batch norm was
     * 2-3.7x faster than the cuda engine's on every ResNet-50 shape (H100),
     * while in NCHW it was up to 2.2x slower on the large-image,
     * few-channel ones, and in f32 NHWC (not persistent) ResNet-50 tf32 fell
     * from 1,727 to 213 img/s; those keep the cuda engine's kernels. */
    BN_KERNELS(STOKE_BF16, STOKE_NHWC, bf16_nhwc),
    BN_KERNELS(STOKE_F16, STOKE_NHWC, f16_nhwc),
};

stoke_err *stoke_cudnn_register_bn(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof bn_kernels / sizeof *bn_kernels; i++)
    STOKE_PROPAGATE_P(r->add_kernel(r->self, &bn_kernels[i]));
  return NULL;
}
