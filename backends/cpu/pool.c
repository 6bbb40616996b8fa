/* backends/cpu/pool.c: CPU reference kernels (f32, f64); see stoke/ops.h.
 *
 * max_pool2d, max_pool2d_idx, avg_pool2d (NCHW and NHWC memory, shapes
 * logical N, C, H, W) and dropout. The type-independent parts (argument
 * checks, geometry) are plain functions; the kernel bodies are written once
 * in POOL_KERNELS and instantiated for float and double at the bottom. */
#include <math.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"
#include "stoke/rng.h"
#include "check.h"
#include "cpu_cnn.h"

/* ========================================================= argument checks */

/* Pools: stoke_check_pool (stoke/check.h), shared with the cuda engine. */
typedef stoke_pool_geom pool_geom;

/* Element strides of a logical (N, C, H, W) tensor from its layout. */
typedef struct pstrides {
  int64_t n, c, h, w;
} pstrides;

static pstrides pool_strides(const stoke_tensor *t) {
  const int64_t *d = t->shape.d;
  if (t->layout == STOKE_NHWC) return (pstrides){d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return (pstrides){d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

/* ---------------------------------------------------------------- dropout */

static stoke_err *dropout_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run,
                                double *p) {
  const char *op = STOKE_OP_DROPOUT;
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  if (!a->node || a->node->n_attrs <= STOKE_DROPOUT_P)
    return STOKE_PERR(STOKE_E_INVALID, "dropout '%s': attribute p missing", stoke_node_name(a));
  *p = a->node->attrs[STOKE_DROPOUT_P].f;
  if (!(*p >= 0 && *p < 1))
    return STOKE_PERR(STOKE_E_INVALID, "dropout '%s': p = %g not in [0, 1)", stoke_node_name(a), *p);
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (!stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "dropout '%s': x is %s but y is %s", stoke_node_name(a),
                      stoke_shape_str(&x->shape).s, stoke_shape_str(&y->shape).s);
  CHECK(check_xy(a, op, dt, bwd, run));
  if (!bwd) return NULL;
  return stoke_check_data(a, op, "dy", &a->dout[0], run);
}

/* ================================================================ kernels */

/* Offset of logical (n, c, h, w) under strides st. */
static inline int64_t POFF(pstrides st, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * st.n + c * st.c + h * st.h + w * st.w;
}

/* Offset in x of the first maximum of the window at (oh, ow) of channel
 * (n, c) in row-major scan order, and its position in the window (i kw + j)
 * into *pos when pos is given; -inf padding never wins (every window holds
 * a real element since padding <= kernel/2). A NaN wins, as in PyTorch. */
#define POOL_ARGMAX(T, SFX)                                                          \
  static int64_t max_window_##SFX(const T *x, pstrides sx, const stoke_shape *xs,    \
                                  const pool_geom *g, int64_t n, int64_t c,          \
                                  int64_t oh, int64_t ow, int64_t *pos) {            \
    int64_t h0 = oh * g->s[0] - g->p[0], w0 = ow * g->s[1] - g->p[1], arg = -1;      \
    T best = (T)-INFINITY;                                                           \
    for (int64_t i = 0; i < g->k[0]; i++) {                                          \
      int64_t h = h0 + i;                                                            \
      if (h < 0 || h >= xs->d[2]) continue;                                          \
      for (int64_t j = 0; j < g->k[1]; j++) {                                        \
        int64_t w = w0 + j;                                                          \
        if (w < 0 || w >= xs->d[3]) continue;                                        \
        int64_t off = POFF(sx, n, c, h, w);                                          \
        T v = x[off];                                                                \
        if (arg < 0 || v > best || (isnan(v) && !isnan(best))) {                     \
          best = v;                                                                  \
          arg = off;                                                                 \
          if (pos) *pos = i * g->k[1] + j;                                           \
        }                                                                            \
      }                                                                              \
    }                                                                                \
    return arg;                                                                      \
  }

#define POOL_KERNELS(T, SFX, DT)                                                           \
  POOL_ARGMAX(T, SFX)                                                                      \
                                                                                           \
  CPU_PLAN(max_pool_fwd_plan_##SFX, pool_geom g,                                           \
           stoke_check_pool(a, STOKE_OP_MAX_POOL2D, DT, 0, 0, 1, &g))                      \
  CPU_PLAN(max_pool_bwd_plan_##SFX, pool_geom g,                                           \
           stoke_check_pool(a, STOKE_OP_MAX_POOL2D, DT, 1, 0, 1, &g))                      \
  CPU_PLAN(max_pool_idx_fwd_plan_##SFX, pool_geom g,                                       \
           stoke_check_pool(a, STOKE_OP_MAX_POOL2D_IDX, DT, 0, 0, 2, &g))                  \
  CPU_PLAN(max_pool_idx_bwd_plan_##SFX, pool_geom g,                                       \
           stoke_check_pool(a, STOKE_OP_MAX_POOL2D_IDX, DT, 1, 0, 2, &g))                  \
  CPU_PLAN(avg_pool_fwd_plan_##SFX, pool_geom g,                                           \
           stoke_check_pool(a, STOKE_OP_AVG_POOL2D, DT, 0, 0, 0, &g))                      \
  CPU_PLAN(avg_pool_bwd_plan_##SFX, pool_geom g,                                           \
           stoke_check_pool(a, STOKE_OP_AVG_POOL2D, DT, 1, 0, 0, &g))                      \
  CPU_PLAN(dropout_fwd_plan_##SFX, double p, dropout_check(a, DT, 0, 0, &p))               \
  CPU_PLAN(dropout_bwd_plan_##SFX, double p, dropout_check(a, DT, 1, 0, &p))               \
                                                                                           \
  /* y = max over each window (first maximum in scan order); with idx                      \
   * (max_pool2d_idx) also that maximum's position (i kw + j) as u8 in output 1             \
   * (y's layout) */                                                                       \
  static stoke_err *max_pool_y_##SFX(const stoke_kernel_args_v1 *a, int idx) {            \
    pool_geom g;                                                                           \
    CHECK(stoke_check_pool(a, idx ? STOKE_OP_MAX_POOL2D_IDX : STOKE_OP_MAX_POOL2D, DT, 0, 1, \
                           idx ? 2 : 1, &g));                                              \
    const stoke_tensor *xt = &a->in[0], *yt = &a->out[0];                                  \
    const T *x = xt->data;                                                                 \
    T *y = yt->data;                                                                       \
    uint8_t *ix = idx ? a->out[1].data : NULL;                                             \
    pstrides sx = pool_strides(xt), sy = pool_strides(yt);                                 \
    const int64_t *yd = yt->shape.d;                                                       \
    for (int64_t n = 0; n < yd[0]; n++)                                                    \
      for (int64_t c = 0; c < yd[1]; c++)                                                  \
        for (int64_t oh = 0; oh < yd[2]; oh++)                                             \
          for (int64_t ow = 0; ow < yd[3]; ow++) {                                         \
            int64_t pos = 0, o = POFF(sy, n, c, oh, ow);                                   \
            int64_t arg = max_window_##SFX(x, sx, &xt->shape, &g, n, c, oh, ow, &pos);     \
            y[o] = arg >= 0 ? x[arg] : (T)-INFINITY;                                       \
            if (ix) ix[o] = (uint8_t)pos;                                                  \
          }                                                                                \
    return NULL;                                                                           \
  }                                                                                        \
  static stoke_err *max_pool_fwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {      \
    return max_pool_y_##SFX(a, 0);                                                         \
  }                                                                                        \
  static stoke_err *max_pool_idx_fwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {  \
    return max_pool_y_##SFX(a, 1);                                                         \
  }                                                                                        \
                                                                                           \
  /* dx[first argmax of each window] += dy, from x (bwd_needs input 0) */                  \
  static stoke_err *max_pool_bwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {      \
    pool_geom g;                                                                           \
    CHECK(stoke_check_pool(a, STOKE_OP_MAX_POOL2D, DT, 1, 1, 1, &g));                     \
    T *dx = a->din[0].data;                                                                \
    if (!dx) return NULL;                                                                  \
    const stoke_tensor *xt = &a->in[0], *dyt = &a->dout[0];                                \
    const T *x = xt->data, *dy = dyt->data;                                                \
    pstrides sx = pool_strides(xt), sdx = pool_strides(&a->din[0]),                        \
             sdy = pool_strides(dyt);                                                      \
    const int64_t *xd = xt->shape.d, *yd = dyt->shape.d;                                   \
    double beta = stoke_grad_beta(a, 0);                                                        \
    int64_t nx = stoke_numel(&xt->shape);                                                  \
    for (int64_t i = 0; i < nx; i++) ACC(T, dx[i], beta, 0);                              \
    int same = sx.c == sdx.c; /* x and dx in the same memory order */                     \
    for (int64_t n = 0; n < yd[0]; n++)                                                    \
      for (int64_t c = 0; c < yd[1]; c++)                                                  \
        for (int64_t oh = 0; oh < yd[2]; oh++)                                             \
          for (int64_t ow = 0; ow < yd[3]; ow++) {                                         \
            int64_t arg = max_window_##SFX(x, sx, &xt->shape, &g, n, c, oh, ow, NULL);     \
            if (arg < 0) continue;                                                         \
            if (!same) { /* logical (h, w) of arg, then dx's offset */                     \
              int64_t r = arg - n * sx.n - c * sx.c;                                       \
              int64_t h = r / sx.h, w = (r % sx.h) / sx.w;                                 \
              arg = POFF(sdx, n, c, h, w);                                                 \
            }                                                                              \
            dx[arg] = (T)((double)dx[arg] + (double)dy[POFF(sdy, n, c, oh, ow)]);          \
          }                                                                                \
    (void)xd;                                                                              \
    return NULL;                                                                           \
  }                                                                                        \
                                                                                           \
  /* dx[the position index names in each window] += dy, in max_pool2d's order             \
   * (bwd_needs output 1: the index; x is not read) */                                     \
  static stoke_err *max_pool_idx_bwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {  \
    pool_geom g;                                                                           \
    CHECK(stoke_check_pool(a, STOKE_OP_MAX_POOL2D_IDX, DT, 1, 1, 2, &g));                 \
    T *dx = a->din[0].data;                                                                \
    if (!dx) return NULL;                                                                  \
    const stoke_tensor *dxt = &a->din[0], *dyt = &a->dout[0];                              \
    const T *dy = dyt->data;                                                               \
    const uint8_t *ix = a->out[1].data;                                                    \
    pstrides sdx = pool_strides(dxt), sdy = pool_strides(dyt), si = pool_strides(&a->out[1]); \
    const int64_t *xd = dxt->shape.d, *yd = dyt->shape.d;                                  \
    double beta = stoke_grad_beta(a, 0);                                                   \
    int64_t nx = stoke_numel(&dxt->shape);                                                 \
    for (int64_t i = 0; i < nx; i++) ACC(T, dx[i], beta, 0);                              \
    for (int64_t n = 0; n < yd[0]; n++)                                                    \
      for (int64_t c = 0; c < yd[1]; c++)                                                  \
        for (int64_t oh = 0; oh < yd[2]; oh++)                                             \
          for (int64_t ow = 0; ow < yd[3]; ow++) {                                         \
            int64_t pos = ix[POFF(si, n, c, oh, ow)];                                      \
            int64_t h = oh * g.s[0] - g.p[0] + pos / g.k[1], w = ow * g.s[1] - g.p[1] + pos % g.k[1]; \
            if (pos >= g.k[0] * g.k[1] || h < 0 || h >= xd[2] || w < 0 || w >= xd[3])     \
              return STOKE_PERR(STOKE_E_INVALID,                                           \
                                "max_pool2d_idx '%s': index %lld at output (%lld, %lld, %lld, %lld) is no "  \
                                "position of a %lldx%lld window inside x (not the forward's index?)",        \
                                stoke_node_name(a), (long long)pos, (long long)n, (long long)c,             \
                                (long long)oh, (long long)ow, (long long)g.k[0], (long long)g.k[1]);        \
            int64_t at = POFF(sdx, n, c, h, w);                                            \
            dx[at] = (T)((double)dx[at] + (double)dy[POFF(sdy, n, c, oh, ow)]);            \
          }                                                                                \
    return NULL;                                                                           \
  }                                                                                        \
                                                                                           \
  /* y = sum over the window of the real elements / (kh kw) (padding counts) */            \
  static stoke_err *avg_pool_fwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {      \
    pool_geom g;                                                                           \
    CHECK(stoke_check_pool(a, STOKE_OP_AVG_POOL2D, DT, 0, 1, 0, &g));                     \
    const stoke_tensor *xt = &a->in[0], *yt = &a->out[0];                                  \
    const T *x = xt->data;                                                                 \
    T *y = yt->data;                                                                       \
    pstrides sx = pool_strides(xt), sy = pool_strides(yt);                                 \
    const int64_t *xd = xt->shape.d, *yd = yt->shape.d;                                    \
    double inv = 1.0 / (double)(g.k[0] * g.k[1]);                                          \
    for (int64_t n = 0; n < yd[0]; n++)                                                    \
      for (int64_t c = 0; c < yd[1]; c++)                                                  \
        for (int64_t oh = 0; oh < yd[2]; oh++)                                             \
          for (int64_t ow = 0; ow < yd[3]; ow++) {                                         \
            int64_t h0 = oh * g.s[0] - g.p[0], w0 = ow * g.s[1] - g.p[1];                  \
            double s = 0;                                                                  \
            for (int64_t h = h0 < 0 ? 0 : h0; h < h0 + g.k[0] && h < xd[2]; h++)           \
              for (int64_t w = w0 < 0 ? 0 : w0; w < w0 + g.k[1] && w < xd[3]; w++)         \
                s += (double)x[POFF(sx, n, c, h, w)];                                      \
            y[POFF(sy, n, c, oh, ow)] = (T)(s * inv);                                      \
          }                                                                                \
    return NULL;                                                                           \
  }                                                                                        \
                                                                                           \
  /* dx[h, w] = sum over the windows holding (h, w) of dy / (kh kw): a gather,             \
   * summed in double */                                                                   \
  static stoke_err *avg_pool_bwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {      \
    pool_geom g;                                                                           \
    CHECK(stoke_check_pool(a, STOKE_OP_AVG_POOL2D, DT, 1, 1, 0, &g));                     \
    T *dx = a->din[0].data;                                                                \
    if (!dx) return NULL;                                                                  \
    const stoke_tensor *dxt = &a->din[0], *dyt = &a->dout[0];                              \
    const T *dy = dyt->data;                                                               \
    pstrides sdx = pool_strides(dxt), sdy = pool_strides(dyt);                             \
    const int64_t *xd = dxt->shape.d, *yd = dyt->shape.d;                                  \
    double inv = 1.0 / (double)(g.k[0] * g.k[1]), beta = stoke_grad_beta(a, 0);                \
    for (int64_t n = 0; n < xd[0]; n++)                                                    \
      for (int64_t c = 0; c < xd[1]; c++)                                                  \
        for (int64_t h = 0; h < xd[2]; h++)                                                \
          for (int64_t w = 0; w < xd[3]; w++) {                                            \
            /* windows oh with oh*s - p <= h <= oh*s - p + k - 1 */                        \
            int64_t hp = h + g.p[0], wp = w + g.p[1];                                      \
            int64_t oh1 = hp / g.s[0], ow1 = wp / g.s[1];                                  \
            int64_t oh0 = hp - g.k[0] + 1 > 0 ? (hp - g.k[0] + g.s[0]) / g.s[0] : 0;       \
            int64_t ow0 = wp - g.k[1] + 1 > 0 ? (wp - g.k[1] + g.s[1]) / g.s[1] : 0;       \
            if (oh1 >= yd[2]) oh1 = yd[2] - 1;                                             \
            if (ow1 >= yd[3]) ow1 = yd[3] - 1;                                             \
            double s = 0;                                                                  \
            for (int64_t oh = oh0; oh <= oh1; oh++)                                        \
              for (int64_t ow = ow0; ow <= ow1; ow++)                                      \
                s += (double)dy[POFF(sdy, n, c, oh, ow)];                                  \
            ACC(T, dx[POFF(sdx, n, c, h, w)], beta, s * inv);                             \
          }                                                                                \
    return NULL;                                                                           \
  }                                                                                        \
                                                                                           \
  /* training: y = x * keep / (1 - p), keep = (draw i >= p) in memory order                \
   * from stoke_uniform_at(seed, i); eval (or p = 0): y = x */                                  \
  static stoke_err *dropout_fwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {       \
    double p;                                                                              \
    CHECK(dropout_check(a, DT, 0, 1, &p));                                                \
    const T *x = a->in[0].data;                                                            \
    T *y = a->out[0].data;                                                                 \
    int64_t nel = stoke_numel(&a->in[0].shape);                                            \
    if (!a->training || p == 0) {                                                          \
      for (int64_t i = 0; i < nel; i++) y[i] = x[i];                                       \
      return NULL;                                                                         \
    }                                                                                      \
    double scale = 1.0 / (1.0 - p);                                                        \
    for (int64_t i = 0; i < nel; i++)                                                      \
      y[i] = (T)((double)x[i] * (stoke_uniform_at(a->seed, (uint64_t)i) >= p ? scale : 0.0));               \
    return NULL;                                                                           \
  }                                                                                        \
                                                                                           \
  /* dx = dy * keep / (1 - p), the mask regenerated from the same seed */                  \
  static stoke_err *dropout_bwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {       \
    double p;                                                                              \
    CHECK(dropout_check(a, DT, 1, 1, &p));                                                \
    T *dx = a->din[0].data;                                                                \
    if (!dx) return NULL;                                                                  \
    const T *dy = a->dout[0].data;                                                         \
    int64_t nel = stoke_numel(&a->in[0].shape);                                            \
    double beta = stoke_grad_beta(a, 0);                                                        \
    if (!a->training || p == 0) {                                                          \
      for (int64_t i = 0; i < nel; i++) ACC(T, dx[i], beta, dy[i]);                       \
      return NULL;                                                                         \
    }                                                                                      \
    double scale = 1.0 / (1.0 - p);                                                        \
    for (int64_t i = 0; i < nel; i++)                                                      \
      ACC(T, dx[i], beta, (double)dy[i] * (stoke_uniform_at(a->seed, (uint64_t)i) >= p ? scale : 0.0));    \
    return NULL;                                                                           \
  }

POOL_KERNELS(float, f32, STOKE_F32)
POOL_KERNELS(double, f64, STOKE_F64)

/* ============================================================ registration */

#define PKERNEL(op, pass, fn, sfx, dt) CPU_KERNEL(op, pass, fn, sfx, dt, stoke_destroy_none)
#define PKERNELS(sfx, dt)                                            \
  PKERNEL(STOKE_OP_MAX_POOL2D, STOKE_FWD, max_pool_fwd, sfx, dt),    \
  PKERNEL(STOKE_OP_MAX_POOL2D, STOKE_BWD, max_pool_bwd, sfx, dt),    \
  PKERNEL(STOKE_OP_MAX_POOL2D_IDX, STOKE_FWD, max_pool_idx_fwd, sfx, dt), \
  PKERNEL(STOKE_OP_MAX_POOL2D_IDX, STOKE_BWD, max_pool_idx_bwd, sfx, dt), \
  PKERNEL(STOKE_OP_AVG_POOL2D, STOKE_FWD, avg_pool_fwd, sfx, dt),    \
  PKERNEL(STOKE_OP_AVG_POOL2D, STOKE_BWD, avg_pool_bwd, sfx, dt),    \
  PKERNEL(STOKE_OP_DROPOUT, STOKE_FWD, dropout_fwd, sfx, dt),        \
  PKERNEL(STOKE_OP_DROPOUT, STOKE_BWD, dropout_bwd, sfx, dt)

static const stoke_kernel_v1 pool_kernels[] = {
    PKERNELS(f32, STOKE_F32),
    PKERNELS(f64, STOKE_F64),
};

stoke_err *cpu_register_pool(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, pool_kernels, sizeof pool_kernels / sizeof *pool_kernels);
}
