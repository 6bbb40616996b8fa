/* backends/cpu/norm.c: CPU reference kernels (f32, f64); see stoke/ops.h.
 *
 * batch_norm (forward and backward, training and eval; x is (N, C, ...),
 * 4-D x in NCHW or NHWC memory), its fused forms bn_relu and bn_add_relu
 * (the same bodies with the ReLU, and the residual add, applied per
 * element: the reference the fused GPU kernels are checked against) and
 * normalize (u8 HWC images to f32 in the
 * memory order its `layout` attribute names; forward only). The
 * type-independent parts (argument checks, strides) are plain functions;
 * the batch_norm bodies are written once in BN_KERNELS and instantiated for
 * float and double at the bottom. Statistics and reductions run in double
 * for both types. */
#include <math.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"
#include "check.h"
#include "cpu_cnn.h"

/* ------------------------------------------------------------- batch_norm */

/* x as logical (N, C, S), S the product of the trailing dimensions. */
typedef struct bn_geom {
  int64_t n, c, s;
  double eps, momentum;
  int relu, add; /* bn_relu: relu; bn_add_relu: both */
} bn_geom;

/* The op a batch-norm kernel serves: 0 batch_norm, 1 bn_relu, 2 bn_add_relu. */
static const char *const bn_ops[] = {STOKE_OP_BATCH_NORM, STOKE_OP_BN_RELU, STOKE_OP_BN_ADD_RELU};

/* Element strides of logical (n, c, s): channels last for a 4-D NHWC
 * tensor, channels-major (NCHW, or any tensor of another rank) else. */
typedef struct bn_strides {
  int64_t n, c, s;
} bn_strides;

static bn_strides bn_strides_of(const stoke_tensor *t, const bn_geom *g) {
  if (is_nhwc(t)) return (bn_strides){g->c * g->s, 1, g->c};
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
  CHECK(check_counts(a, op, bwd, g->add ? 6 : 5, 3));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_BATCH_NORM_MOMENTUM)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes eps and momentum missing", op,
                      node_name(a));
  g->eps = n->attrs[STOKE_BATCH_NORM_EPS].f;
  g->momentum = n->attrs[STOKE_BATCH_NORM_MOMENTUM].f;
  if (!(g->eps > 0 && isfinite(g->eps)) || !(g->momentum >= 0 && g->momentum <= 1))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': eps %g must be > 0 and momentum %g in [0, 1]",
                      op, node_name(a), g->eps, g->momentum);
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape;
  if (xs->ndim < 2 || !same_shape(xs, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x[N, C, ...] -> y of x's shape, got x %s, y %s",
                      op, node_name(a), shp(xs).s, shp(&y->shape).s);
  g->n = xs->d[0];
  g->c = xs->d[1];
  g->s = 1;
  for (int i = 2; i < xs->ndim; i++) g->s *= xs->d[i];
  static const char *const in_names[] = {"x", "weight", "bias", "running_mean", "running_var"};
  static const char *const out_names[] = {"y", "saved_mean", "saved_invstd"};
  for (int i = 1; i < 5; i++)
    if (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, node_name(a),
                        in_names[i], shp(&a->in[i].shape).s, shp(xs).s, (long long)g->c);
  for (int i = 1; i < 3; i++)
    if (a->out[i].shape.ndim != 1 || a->out[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, node_name(a),
                        out_names[i], shp(&a->out[i].shape).s, shp(xs).s, (long long)g->c);
  for (int i = 0; i < 5; i++) CHECK(check_dtype(a, op, in_names[i], &a->in[i], dt));
  for (int i = 0; i < 3; i++) CHECK(check_dtype(a, op, out_names[i], &a->out[i], dt));
  CHECK(check_layout_known(a, op, "x", x));
  CHECK(check_layout_known(a, op, "y", y));
  const stoke_tensor *r = g->add ? &a->in[STOKE_BN_ADD_RELU_RESIDUAL] : NULL;
  if (r) {
    if (!same_shape(&r->shape, xs) || is_nhwc(r) != is_nhwc(x))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the residual %s must have x's shape %s and memory order", op,
                        node_name(a), shp(&r->shape).s, shp(xs).s);
    CHECK(check_dtype(a, op, "residual", r, dt));
    if (!bwd) CHECK(check_data(a, op, "residual", r, run));
    else CHECK(check_grad(a, op, "residual", &a->din[STOKE_BN_ADD_RELU_RESIDUAL], r));
  }
  if (!bwd) {
    for (int i = 0; i < 5; i++) CHECK(check_data(a, op, in_names[i], &a->in[i], run));
    for (int i = 0; i < 3; i++) CHECK(check_data(a, op, out_names[i], &a->out[i], run));
    /* PyTorch: "Expected more than 1 value per channel when training" */
    if (run && a->training && g->n * g->s < 2)
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': training needs more than 1 value per channel, x is %s", op,
                        node_name(a), shp(xs).s);
    return NULL;
  }
  for (int i = 0; i < 3; i++) CHECK(check_grad(a, op, in_names[i], &a->din[i], &a->in[i]));
  CHECK(check_grad(a, op, "y", &a->dout[0], y));
  CHECK(check_layout_known(a, op, "dx", &a->din[0]));
  CHECK(check_layout_known(a, op, "dy", &a->dout[0]));
  int dx = a->din[0].data != NULL, dw = a->din[1].data != NULL, db = a->din[2].data != NULL;
  if (dx || dw || db) CHECK(check_data(a, op, "dy", &a->dout[0], run));
  if (dx || dw) {
    CHECK(check_data(a, op, "x (the forward input)", x, run));
    CHECK(check_data(a, op, "saved_mean", &a->out[1], run));
    CHECK(check_data(a, op, "saved_invstd", &a->out[2], run));
  }
  if (dx) CHECK(check_data(a, op, "weight", &a->in[1], run));
  /* the ReLU's mask is y > 0 */
  if (g->relu && (dx || dw || db || (r && a->din[STOKE_BN_ADD_RELU_RESIDUAL].data)))
    CHECK(check_data(a, op, "y (the forward output)", y, run));
  return NULL;
}

/* -------------------------------------------------------------- normalize */

/* u8 x[N, C, H, W] in HWC memory -> f32 y in the attribute's memory order.
 * The input is HWC whatever x's layout field says (the graph labels every
 * 4-D value with the graph's layout, the decoded images included). An
 * output whose layout field names an order must match the attribute. */
static stoke_err *normalize_check(const stoke_kernel_args_v1 *a, int run, int *nhwc) {
  const char *op = STOKE_OP_NORMALIZE;
  CHECK(check_counts(a, op, 0, 1, 1));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_NORMALIZE_LAYOUT)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes mean, std and layout missing", op,
                      node_name(a));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape;
  if (xs->ndim != 4 || !same_shape(xs, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': expects x[N, C, H, W] -> y of x's shape, got x %s, y %s", op,
                      node_name(a), shp(xs).s, shp(&y->shape).s);
  CHECK(check_dtype(a, op, "x", x, STOKE_U8));
  CHECK(check_dtype(a, op, "y", y, STOKE_F32));
  const stoke_attr_v1 *m = &n->attrs[STOKE_NORMALIZE_MEAN], *s = &n->attrs[STOKE_NORMALIZE_STD];
  int64_t c = xs->d[1];
  if ((m->n != 1 && m->n != c) || (s->n != 1 && s->n != c))
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': mean (%d values) and std (%d values) need 1 or %lld values", op,
                      node_name(a), m->n, s->n, (long long)c);
  for (int i = 0; i < s->n; i++)
    if (!(s->floats[i] > 0))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': std %g must be > 0", op, node_name(a),
                        s->floats[i]);
  const char *l = n->attrs[STOKE_NORMALIZE_LAYOUT].s;
  if (!strcmp(l, "nhwc"))
    *nhwc = 1;
  else if (!strcmp(l, "nchw"))
    *nhwc = 0;
  else
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': layout '%s' must be nchw or nhwc", op,
                      node_name(a), l);
  CHECK(check_layout_known(a, op, "y", y));
  if ((y->layout == STOKE_NHWC && !*nhwc) || (y->layout == STOKE_NCHW && *nhwc))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': layout attribute '%s' but the output is %s", op,
                      node_name(a), l, y->layout == STOKE_NHWC ? "NHWC" : "NCHW");
  CHECK(check_data(a, op, "x", x, run));
  return check_data(a, op, "y", y, run);
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

/* ================================================================ kernels */

/* Offset of logical (n, c, s) under strides st. */
#define NOFF(st, n, c, s) ((n) * (st).n + (c) * (st).c + (s) * (st).s)

/* In the backward bodies: dy at (n, c, s), masked by the ReLU (y > 0) in
 * the fused forms. */
#define BN_GY(n, c, s) (g.relu && !(y[NOFF(sy, n, c, s)] > 0) ? 0.0 : (double)dy[NOFF(sdy, n, c, s)])

#define BN_KERNELS(T, SFX, DT, ACT)                                                         \
  CPU_PLAN(bn_fwd_plan_##SFX, bn_geom g, bn_check(a, DT, 0, 0, &g, ACT))                    \
  CPU_PLAN(bn_bwd_plan_##SFX, bn_geom g, bn_check(a, DT, 1, 0, &g, ACT))                    \
                                                                                            \
  /* Training: batch mean and biased variance per channel over (N, S) (two                  \
   * passes, double), saved_* = (mean, 1/sqrt(var + eps)), running stats                    \
   * updated in place (unbiased variance m/(m-1) for running_var). Eval: the                \
   * running stats normalize and become saved_*; they are left alone.                       \
   * y = (x - mean) invstd weight + bias, rounded to T; then y = max(y + r, 0)              \
   * (bn_add_relu) or max(y, 0) (bn_relu), as the unfused nodes compute it. */              \
  static stoke_err *bn_fwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {              \
    bn_geom g;                                                                              \
    CHECK(bn_check(a, DT, 0, 1, &g, ACT));                                                  \
    const T *x = a->in[0].data, *w = a->in[1].data, *b = a->in[2].data;                     \
    T *rm = a->in[3].data, *rv = a->in[4].data;                                             \
    T *y = a->out[0].data, *sm = a->out[1].data, *si = a->out[2].data;                      \
    const T *r = g.add ? a->in[STOKE_BN_ADD_RELU_RESIDUAL].data : NULL;                     \
    bn_strides sx = bn_strides_of(&a->in[0], &g), sy = bn_strides_of(&a->out[0], &g);       \
    bn_strides sr = g.add ? bn_strides_of(&a->in[STOKE_BN_ADD_RELU_RESIDUAL], &g) : sx;     \
    double m = (double)(g.n * g.s), mom = g.momentum;                                       \
    for (int64_t c = 0; c < g.c; c++) {                                                     \
      double mean, invstd;                                                                  \
      if (a->training) {                                                                    \
        double sum = 0, sq = 0;                                                             \
        for (int64_t n = 0; n < g.n; n++)                                                   \
          for (int64_t s = 0; s < g.s; s++) sum += (double)x[NOFF(sx, n, c, s)];            \
        mean = sum / m;                                                                     \
        for (int64_t n = 0; n < g.n; n++)                                                   \
          for (int64_t s = 0; s < g.s; s++) {                                               \
            double dv = (double)x[NOFF(sx, n, c, s)] - mean;                                \
            sq += dv * dv;                                                                  \
          }                                                                                 \
        double var = sq / m;                                                                \
        invstd = 1.0 / sqrt(var + g.eps);                                                   \
        rm[c] = (T)((1 - mom) * (double)rm[c] + mom * mean);                                \
        rv[c] = (T)((1 - mom) * (double)rv[c] + mom * var * m / (m - 1));                   \
      } else {                                                                              \
        mean = (double)rm[c];                                                               \
        invstd = 1.0 / sqrt((double)rv[c] + g.eps);                                         \
      }                                                                                     \
      sm[c] = (T)mean;                                                                      \
      si[c] = (T)invstd;                                                                    \
      double scale = (double)w[c] * invstd, shift = (double)b[c];                           \
      for (int64_t n = 0; n < g.n; n++)                                                     \
        for (int64_t s = 0; s < g.s; s++) {                                                 \
          T v = (T)(((double)x[NOFF(sx, n, c, s)] - mean) * scale + shift);                 \
          if (r) v = (T)((double)v + (double)r[NOFF(sr, n, c, s)]);                         \
          if (g.relu && !(v > 0)) v = (T)0;                                                 \
          y[NOFF(sy, n, c, s)] = v;                                                         \
        }                                                                                   \
    }                                                                                       \
    return NULL;                                                                            \
  }                                                                                         \
                                                                                            \
  /* From x, weight, saved_mean, saved_invstd (bwd_needs) and dy, with                      \
   * xhat = (x - mean) invstd, per channel over its m = N S values:                         \
   *   dbias = sum dy;  dweight = sum dy xhat                                               \
   *   training: dx = weight invstd (dy - dbias/m - xhat dweight/m)                         \
   *   eval (the statistics are constants): dx = weight invstd dy                           \
   * with dy masked by y > 0 first in the fused forms (the ReLU's gradient);                \
   * bn_add_relu's dr is that masked dy. */                                                 \
  static stoke_err *bn_bwd_##SFX(const stoke_kernel_args_v1 *a, void *state) {              \
    bn_geom g;                                                                              \
    CHECK(bn_check(a, DT, 1, 1, &g, ACT));                                                  \
    T *dx = a->din[0].data, *dw = a->din[1].data, *db = a->din[2].data;                     \
    T *dr = g.add ? a->din[STOKE_BN_ADD_RELU_RESIDUAL].data : NULL;                         \
    if (!dx && !dw && !db && !dr) return NULL;                                              \
    const T *x = a->in[0].data, *w = a->in[1].data, *dy = a->dout[0].data;                  \
    const T *sm = a->out[1].data, *si = a->out[2].data, *y = a->out[0].data;                \
    bn_strides sx = bn_strides_of(&a->in[0], &g), sdy = bn_strides_of(&a->dout[0], &g);     \
    bn_strides sdx = bn_strides_of(&a->din[0], &g), sy = bn_strides_of(&a->out[0], &g);     \
    bn_strides sdr = dr ? bn_strides_of(&a->din[STOKE_BN_ADD_RELU_RESIDUAL], &g) : sdx;     \
    double b5 = dr ? grad_beta(a, STOKE_BN_ADD_RELU_RESIDUAL) : 0;                          \
    double m = (double)(g.n * g.s);                                                         \
    double b0 = grad_beta(a, 0), b1 = grad_beta(a, 1), b2 = grad_beta(a, 2);                \
    int need_x = dx || dw;                                                                  \
    for (int64_t c = 0; c < g.c; c++) {                                                     \
      double mean = need_x ? (double)sm[c] : 0, invstd = need_x ? (double)si[c] : 0;        \
      double sdy_c = 0, sdyx_c = 0;                                                         \
      for (int64_t n = 0; n < g.n; n++)                                                     \
        for (int64_t s = 0; s < g.s; s++) {                                                 \
          double gy = BN_GY(n, c, s);                                                       \
          sdy_c += gy;                                                                      \
          if (dr) ACC(T, dr[NOFF(sdr, n, c, s)], b5, gy);                                   \
          if (need_x) sdyx_c += gy * ((double)x[NOFF(sx, n, c, s)] - mean) * invstd;        \
        }                                                                                   \
      if (dw) ACC(T, dw[c], b1, sdyx_c);                                                    \
      if (db) ACC(T, db[c], b2, sdy_c);                                                     \
      if (!dx) continue;                                                                    \
      double k = (double)w[c] * invstd;                                                     \
      double mdy = a->training ? sdy_c / m : 0, mdyx = a->training ? sdyx_c / m : 0;        \
      for (int64_t n = 0; n < g.n; n++)                                                     \
        for (int64_t s = 0; s < g.s; s++) {                                                 \
          double xhat = ((double)x[NOFF(sx, n, c, s)] - mean) * invstd;                     \
          double gy = BN_GY(n, c, s);                                                       \
          ACC(T, dx[NOFF(sdx, n, c, s)], b0, k * (gy - mdy - xhat * mdyx));                 \
        }                                                                                   \
    }                                                                                       \
    return NULL;                                                                            \
  }

BN_KERNELS(float, f32, STOKE_F32, 0)
BN_KERNELS(double, f64, STOKE_F64, 0)
BN_KERNELS(float, relu_f32, STOKE_F32, 1)
BN_KERNELS(double, relu_f64, STOKE_F64, 1)
BN_KERNELS(float, add_relu_f32, STOKE_F32, 2)
BN_KERNELS(double, add_relu_f64, STOKE_F64, 2)
#undef BN_GY

/* ============================================================ registration */

#define NKERNEL(op, pass, fn, sfx, dt) CPU_KERNEL(op, pass, fn, sfx, dt, destroy_none)

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
    {"cpu", STOKE_OP_NORMALIZE, STOKE_FWD, STOKE_U8, STOKE_LAYOUT_ANY, normalize_fwd_plan,
     normalize_fwd, destroy_none},
};

stoke_err *cpu_register_norm(const stoke_registry_v1 *r) {
  return cpu_add_kernels(r, norm_kernels, sizeof norm_kernels / sizeof *norm_kernels);
}
