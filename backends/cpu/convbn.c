/* backends/cpu/convbn.c: CPU reference kernels (f32, f64) of the ops that
 * fold batch norm into convolutions: conv_bn, bn_relu_conv_bn, bn_apply,
 * bn_apply_relu, bn_apply_add_relu (stoke/ops.h).
 *
 * They compose conv2d's own kernels (conv.c, called on a conv2d view of the
 * call: x, weight -> y) and the per-channel batch-norm bodies of norm.c
 * (bn.h), so they compute what conv2d -> batch_norm -> [add ->] relu
 * computes, rounding where those nodes round. bn_relu_conv_bn needs one
 * buffer of p's size for x = relu(bn(p)) (and, in backward, the gradient
 * of x): plan() allocates it as the kernel's state, as conv2d's plan does
 * its column buffer, so run() does not allocate (unless run without a plan). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"
#include "bn.h"
#include "check.h"
#include "cpu_cnn.h"

/* ------------------------------------------------------------ state */

/* Per node: conv2d's state (its plan's) and bn_relu_conv_bn's x buffer. */
typedef struct cb_state {
  const stoke_kernel_v1 *conv; /* whose destroy frees conv_state */
  void *conv_state;
  void *buf;
  size_t bytes;
} cb_state;

static void cb_destroy(void *state) {
  cb_state *s = state;
  if (!s) return;
  if (s->conv && s->conv->destroy) s->conv->destroy(s->conv_state);
  stoke_host->free(s->buf);
  stoke_host->free(s);
}

/* ------------------------------------------------------------ checks */

/* Input or output vector t of `what` must be [len] of dtype dt. */
static stoke_err *check_vec(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                            const stoke_tensor *t, int64_t len, stoke_dtype dt) {
  if (t->shape.ndim != 1 || t->shape.d[0] != len)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, expected [%lld]", op, stoke_node_name(a), what,
                      stoke_shape_str(&t->shape).s, (long long)len);
  return stoke_check_dtype(a, op, what, t, dt);
}

/* x (N, C, ...) as logical (N, C, S). */
static bn_geom geom_of(const stoke_tensor *x) {
  bn_geom g = {x->shape.d[0], x->shape.d[1], 1, 0, 0, 0, 0};
  for (int i = 2; i < x->shape.ndim; i++) g.s *= x->shape.d[i];
  return g;
}

/* The statistics (mean, invstd) and affine parameters (weight, bias) of a
 * normalized value x (named `pre` + name), at inputs at .. at + 3, all [C]
 * of dtype dt; with x, holding data when `data`. */
static stoke_err *check_affine(const stoke_kernel_args_v1 *a, const char *op, int at, const char *pre,
                               const stoke_tensor *x, stoke_dtype dt, int data) {
  static const char *const names[] = {"mean", "invstd", "weight", "bias"};
  const char *x_name = pre[0] ? "p" : "y";
  CHECK(stoke_check_layout_known(a, op, x_name, x));
  CHECK(stoke_check_data(a, op, x_name, x, data));
  for (int i = 0; i < 4; i++) {
    char what[32];
    snprintf(what, sizeof what, "%s%s", pre, names[i]);
    CHECK(check_vec(a, op, what, &a->in[at + i], x->shape.d[1], dt));
    CHECK(stoke_check_data(a, op, what, &a->in[at + i], data));
  }
  return NULL;
}

/* Gradients of the statistics are refused: by the contract of stoke/ops.h
 * every reader of them accounts for them in its own backward. */
static stoke_err *check_no_stat_grad(const stoke_kernel_args_v1 *a, const char *op, const stoke_tensor *g,
                                     const char *what) {
  if (g->data)
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': a gradient of %s was asked for; statistics take none (their readers "
                      "account for them, stoke/ops.h): the graph is wrong",
                      op, stoke_node_name(a), what);
  return NULL;
}

/* ------------------------------------------------ conv_bn, bn_relu_conv_bn */

/* The op a conv kernel serves: 0 conv_bn, 1 bn_relu_conv_bn; where its
 * weight and running statistics are. */
static const char *const conv_ops[] = {STOKE_OP_CONV_BN, STOKE_OP_BN_RELU_CONV_BN};
static const int conv_w[] = {1, STOKE_BN_RELU_CONV_BN_WEIGHT};
static const int conv_run[] = {STOKE_CONV_BN_RUNNING_MEAN, STOKE_BN_RELU_CONV_BN_RUNNING_MEAN};

/* bn_relu_conv_bn's p, its statistics and affine parameters (with data
 * where the call reads them), and their gradients. */
static stoke_err *pre_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = conv_ops[1];
  const int pm = STOKE_BN_RELU_CONV_BN_P_MEAN, pw = STOKE_BN_RELU_CONV_BN_P_WEIGHT, pb = STOKE_BN_RELU_CONV_BN_P_BIAS;
  const stoke_tensor *p = &a->in[0];
  if (p->shape.ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': p is %s, expected [N, C, H, W]", op, stoke_node_name(a), stoke_shape_str(&p->shape).s);
  CHECK(stoke_check_dtype(a, op, "p", p, dt));
  int wanted = !bwd || a->din[0].data || a->din[pw].data || a->din[pb].data ||
               a->din[STOKE_BN_RELU_CONV_BN_WEIGHT].data;
  CHECK(check_affine(a, op, pm, "p_", p, dt, run && wanted));
  if (!bwd) return NULL;
  CHECK(check_no_stat_grad(a, op, &a->din[pm], "p_mean"));
  CHECK(check_no_stat_grad(a, op, &a->din[STOKE_BN_RELU_CONV_BN_P_INVSTD], "p_invstd"));
  CHECK(stoke_check_layout_known(a, op, "dp", &a->din[0]));
  CHECK(stoke_check_grad(a, op, "p", &a->din[0], p));
  CHECK(stoke_check_grad(a, op, "p_weight", &a->din[pw], &a->in[pw]));
  return stoke_check_grad(a, op, "p_bias", &a->din[pb], &a->in[pb]);
}

/* What both check beyond conv2d's own checks (conv.c, on the view): eps
 * and momentum, the statistics [K] of y, p's statistics and affine
 * parameters (bn_relu_conv_bn), no gradient into the statistics. *g is
 * y's geometry with eps and momentum. */
static stoke_err *conv_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, int pre, bn_geom *g) {
  const char *op = conv_ops[pre];
  CHECK(stoke_check_counts(a, op, bwd, pre ? 8 : 4, 3));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_CONV_BN_MOMENTUM)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes eps and momentum missing", op, stoke_node_name(a));
  const stoke_tensor *y = &a->out[0];
  if (y->shape.ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': y is %s, expected [N, K, Ho, Wo]", op, stoke_node_name(a),
                      stoke_shape_str(&y->shape).s);
  *g = geom_of(y);
  g->eps = n->attrs[STOKE_CONV_BN_EPS].f;
  g->momentum = n->attrs[STOKE_CONV_BN_MOMENTUM].f;
  if (!(g->eps > 0 && isfinite(g->eps)) || !(g->momentum >= 0 && g->momentum <= 1))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': eps %g must be > 0 and momentum %g in [0, 1]", op, stoke_node_name(a),
                      g->eps, g->momentum);
  static const char *const stats[] = {"running_mean", "running_var", "saved_mean", "saved_invstd"};
  const stoke_tensor *st[] = {&a->in[conv_run[pre]], &a->in[conv_run[pre] + 1], &a->out[1], &a->out[2]};
  for (int i = 0; i < 4; i++) CHECK(check_vec(a, op, stats[i], st[i], g->c, dt));
  if (pre) CHECK(pre_check(a, dt, bwd, run));
  if (bwd) {
    CHECK(check_no_stat_grad(a, op, &a->dout[1], "saved_mean"));
    return check_no_stat_grad(a, op, &a->dout[2], "saved_invstd");
  }
  for (int i = 0; i < 4; i++) CHECK(stoke_check_data(a, op, stats[i], st[i], run));
  if (run && a->training && g->n * g->s < 2)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': training needs more than 1 value per channel, y is %s", op,
                      stoke_node_name(a), stoke_shape_str(&y->shape).s);
  return NULL;
}

/* conv2d's view of the call: (x, weight) -> y and their gradients, x the
 * op's own input (conv_bn) or the buffer (bn_relu_conv_bn). */
typedef struct conv_view {
  stoke_kernel_args_v1 a;
  stoke_tensor in[2], din[2];
} conv_view;

static void view_of(conv_view *v, const stoke_kernel_args_v1 *a, int pre, void *buf) {
  int w = conv_w[pre];
  v->a = *a;
  v->a.n_in = 2;
  v->a.n_out = 1;
  v->in[0] = a->in[0];
  if (pre) v->in[0].data = buf;
  v->in[1] = a->in[w];
  v->a.in = v->in;
  v->a.param_grads = (a->param_grads >> w & 1u) << 1;
  if (a->din) {
    v->din[0] = a->din[0];
    if (pre) v->din[0].data = NULL; /* the buffer, when asked for */
    v->din[1] = a->din[w];
    v->a.din = v->din;
  }
}

/* The batch norm on p that makes x (bn_relu_conv_bn), p's statistics
 * given: x and, backward, its gradient in the buffer (p's shape and memory
 * order); the ReLU's mask recomputed from p. */
static bn_job pre_job(const stoke_kernel_args_v1 *a, stoke_dtype dt, void *buf) {
  bn_geom g = geom_of(&a->in[0]);
  g.relu = 1;
  bn_job j = bn_job_from(a, &g, dt, STOKE_BN_RELU_CONV_BN_P_WEIGHT, STOKE_BN_RELU_CONV_BN_P_BIAS, -1);
  j.y = buf, j.sy = j.sx;
  j.dy = buf, j.sdy = j.sx;
  return j;
}

/* buf = x = relu(p_weight (p - p_mean) p_invstd + p_bias). */
static void pre_apply(const stoke_kernel_args_v1 *a, stoke_dtype dt, void *buf) {
  bn_job j = pre_job(a, dt, buf);
  for (int64_t c = 0; c < j.g.c; c++)
    bn_apply_channel(&j, c, bn_stat_at(a->in[STOKE_BN_RELU_CONV_BN_P_MEAN].data, dt, c),
                     bn_stat_at(a->in[STOKE_BN_RELU_CONV_BN_P_INVSTD].data, dt, c));
}

static stoke_err *conv_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws, stoke_dtype dt, stoke_pass pass,
                            int pre) {
  bn_geom g;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(conv_check(a, dt, pass == STOKE_BWD, 0, pre, &g));
  conv_view v;
  view_of(&v, a, pre, NULL);
  const stoke_kernel_v1 *k = cpu_conv2d_kernel(pass, dt);
  void *cs = NULL;
  CHECK(k->plan(&v.a, state ? &cs : NULL, NULL));
  if (!state) return NULL;
  cb_state *s = stoke_host->alloc(sizeof *s);
  if (s) memset(s, 0, sizeof *s);
  if (s && pre) {
    s->bytes = (size_t)stoke_numel(&a->in[0].shape) * stoke_dtype_size(dt);
    s->buf = stoke_host->alloc(s->bytes ? s->bytes : 1);
  }
  if (!s || (pre && !s->buf)) {
    if (k->destroy) k->destroy(cs);
    if (s) stoke_host->free(s);
    return STOKE_PERR(STOKE_E_OOM, "%s '%s': out of host memory for the kernel's buffers", conv_ops[pre],
                      stoke_node_name(a));
  }
  s->conv = k;
  s->conv_state = cs;
  *state = s;
  return NULL;
}

/* bn_relu_conv_bn's buffer: the plan's, or (run without plan) a temporary
 * one that *tmp owns. */
static stoke_err *conv_buf(const stoke_kernel_args_v1 *a, stoke_dtype dt, cb_state *s, void **buf, void **tmp) {
  size_t bytes = (size_t)stoke_numel(&a->in[0].shape) * stoke_dtype_size(dt);
  *tmp = NULL;
  if (s && s->buf && s->bytes >= bytes) {
    *buf = s->buf;
    return NULL;
  }
  *buf = *tmp = stoke_host->alloc(bytes ? bytes : 1);
  if (!*buf)
    return STOKE_PERR(STOKE_E_OOM, "%s '%s': out of host memory for %zu bytes", conv_ops[1], stoke_node_name(a), bytes);
  return NULL;
}

/* y = conv2d(x, weight) (x = relu(bn(p)) first for bn_relu_conv_bn), then
 * per channel of y its statistics: saved_*, the running statistics updated
 * in training (bn_stats). */
static stoke_err *conv_fwd(const stoke_kernel_args_v1 *a, void *state, stoke_dtype dt, int pre) {
  bn_geom g;
  CHECK(conv_check(a, dt, 0, 1, pre, &g));
  cb_state *s = state;
  void *buf = NULL, *tmp = NULL;
  if (pre) {
    CHECK(conv_buf(a, dt, s, &buf, &tmp));
    pre_apply(a, dt, buf);
  }
  conv_view v;
  view_of(&v, a, pre, buf);
  stoke_err *e = cpu_conv2d_kernel(STOKE_FWD, dt)->run(&v.a, s ? s->conv_state : NULL);
  if (!e) {
    const stoke_tensor *y = &a->out[0];
    bn_job j = {.dt = dt, .g = g, .training = a->training, .x = y->data, .sx = bn_strides_of(y, &g)};
    void *rm = a->in[conv_run[pre]].data, *rv = a->in[conv_run[pre] + 1].data;
    for (int64_t c = 0; c < g.c; c++) {
      double mean, invstd;
      bn_stats(&j, c, rm, rv, a->out[1].data, a->out[2].data, &mean, &invstd);
    }
  }
  stoke_host->free(tmp);
  return e;
}

/* conv_bn: conv2d's backward. bn_relu_conv_bn: dweight from x recomputed,
 * then the buffer takes dx = dgrad(dy, weight) and the batch norm on p
 * goes back through the ReLU (its mask recomputed from p) and p's
 * statistics: dp, d p_weight, d p_bias (bn_backward_channel). */
static stoke_err *conv_bwd(const stoke_kernel_args_v1 *a, void *state, stoke_dtype dt, int pre) {
  bn_geom g;
  CHECK(conv_check(a, dt, 1, 1, pre, &g));
  const stoke_kernel_v1 *k = cpu_conv2d_kernel(STOKE_BWD, dt);
  cb_state *s = state;
  void *cs = s ? s->conv_state : NULL;
  conv_view v;
  if (!pre) {
    view_of(&v, a, 0, NULL);
    return k->run(&v.a, cs);
  }
  const int pw = STOKE_BN_RELU_CONV_BN_P_WEIGHT, pb = STOKE_BN_RELU_CONV_BN_P_BIAS;
  int want_w = a->din[STOKE_BN_RELU_CONV_BN_WEIGHT].data != NULL;
  int want_p = a->din[0].data || a->din[pw].data || a->din[pb].data;
  if (!want_w && !want_p) return NULL;
  void *buf, *tmp;
  CHECK(conv_buf(a, dt, s, &buf, &tmp));
  stoke_err *e = NULL;
  if (want_w) {
    pre_apply(a, dt, buf);
    view_of(&v, a, 1, buf);
    e = k->run(&v.a, cs);
  }
  if (!e && want_p) {
    view_of(&v, a, 1, NULL);
    v.din[0].data = buf;
    v.din[1].data = NULL;
    e = k->run(&v.a, cs);
  }
  if (!e && want_p) {
    bn_job j = pre_job(a, dt, buf);
    for (int64_t c = 0; c < j.g.c; c++)
      bn_backward_channel(&j, c, bn_stat_at(a->in[STOKE_BN_RELU_CONV_BN_P_MEAN].data, dt, c),
                          bn_stat_at(a->in[STOKE_BN_RELU_CONV_BN_P_INVSTD].data, dt, c));
  }
  stoke_host->free(tmp);
  return e;
}

/* ------------------------------------------------------ the apply ops */

/* The op an apply kernel serves: 0 bn_apply, 1 bn_apply_relu, 2 bn_apply_add_relu. */
static const char *const apply_ops[] = {STOKE_OP_BN_APPLY, STOKE_OP_BN_APPLY_RELU, STOKE_OP_BN_APPLY_ADD_RELU};

/* (y, mean, invstd, weight, bias [, r]) -> out of y's shape; backward: the
 * gradients of y, weight, bias (and r) that are wanted, none of the
 * statistics; what the wanted ones read holds data. */
static stoke_err *apply_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, int act, bn_geom *g) {
  const char *op = apply_ops[act];
  const int ri = STOKE_BN_APPLY_RESIDUAL;
  CHECK(stoke_check_counts(a, op, bwd, act == 2 ? 6 : 5, 1));
  const stoke_tensor *y = &a->in[0], *out = &a->out[0];
  if (y->shape.ndim < 2 || !stoke_same_shape(&y->shape, &out->shape) || (y->shape.ndim == 4 && stoke_is_nhwc(y) != stoke_is_nhwc(out)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects y[N, C, ...] -> out of y's shape and memory order, got y %s, out %s",
                      op, stoke_node_name(a), stoke_shape_str(&y->shape).s, stoke_shape_str(&out->shape).s);
  *g = geom_of(y);
  g->relu = act >= 1;
  g->add = act == 2;
  CHECK(check_xy(a, op, dt, bwd, run));
  CHECK(stoke_check_layout_known(a, op, "out", out));
  CHECK(check_affine(a, op, STOKE_BN_APPLY_MEAN, "", y, dt, run && !bwd));
  const stoke_tensor *r = g->add ? &a->in[ri] : NULL;
  if (r && (!stoke_same_shape(&r->shape, &y->shape) || stoke_is_nhwc(r) != stoke_is_nhwc(y)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the residual %s must have y's shape %s and memory order", op,
                      stoke_node_name(a), stoke_shape_str(&r->shape).s, stoke_shape_str(&y->shape).s);
  if (r) CHECK(stoke_check_dtype(a, op, "residual", r, dt));
  if (!bwd) return r ? stoke_check_data(a, op, "residual", r, run) : NULL;
  const int wi = STOKE_BN_APPLY_WEIGHT, bi = STOKE_BN_APPLY_BIAS;
  CHECK(check_no_stat_grad(a, op, &a->din[STOKE_BN_APPLY_MEAN], "mean"));
  CHECK(check_no_stat_grad(a, op, &a->din[STOKE_BN_APPLY_INVSTD], "invstd"));
  CHECK(stoke_check_grad(a, op, "weight", &a->din[wi], &a->in[wi]));
  CHECK(stoke_check_grad(a, op, "bias", &a->din[bi], &a->in[bi]));
  if (r) CHECK(stoke_check_grad(a, op, "residual", &a->din[ri], r));
  int any = a->din[0].data || a->din[wi].data || a->din[bi].data || (r && a->din[ri].data);
  if (!any) return NULL;
  CHECK(stoke_check_data(a, op, "dout", &a->dout[0], run));
  static const char *const reads[] = {"y", "mean", "invstd", "weight", "bias", "residual"};
  for (int i = 0; i < (g->relu ? (r ? 6 : 5) : 4); i++) CHECK(stoke_check_data(a, op, reads[i], &a->in[i], run));
  return NULL;
}

/* The job of an apply call: y normalized by the given statistics; the
 * ReLU's mask recomputed from the inputs. */
static bn_job apply_job(const stoke_kernel_args_v1 *a, const bn_geom *g, stoke_dtype dt) {
  return bn_job_from(a, g, dt, STOKE_BN_APPLY_WEIGHT, STOKE_BN_APPLY_BIAS, g->add ? STOKE_BN_APPLY_RESIDUAL : -1);
}

static stoke_err *apply_run(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int act) {
  bn_geom g;
  CHECK(apply_check(a, dt, bwd, 1, act, &g));
  bn_job j = apply_job(a, &g, dt);
  if (bwd && !j.dx && !j.dw && !j.db && !j.dr) return NULL;
  const void *mean = a->in[STOKE_BN_APPLY_MEAN].data, *invstd = a->in[STOKE_BN_APPLY_INVSTD].data;
  for (int64_t c = 0; c < g.c; c++) {
    double m = bn_stat_at(mean, dt, c), is = bn_stat_at(invstd, dt, c);
    if (bwd) bn_backward_channel(&j, c, m, is);
    else bn_apply_channel(&j, c, m, is);
  }
  return NULL;
}

/* ============================================================ registration */

/* The per-dtype entry points of op `name` (conv op `pre` or apply op `act`). */
#define CONV_KERNELS(name, pre, SFX, DT)                                                                   \
  static stoke_err *name##_fwd_plan_##SFX(const stoke_kernel_args_v1 *a, void **s, size_t *ws) {         \
    return conv_plan(a, s, ws, DT, STOKE_FWD, pre);                                                       \
  }                                                                                                       \
  static stoke_err *name##_bwd_plan_##SFX(const stoke_kernel_args_v1 *a, void **s, size_t *ws) {         \
    return conv_plan(a, s, ws, DT, STOKE_BWD, pre);                                                       \
  }                                                                                                       \
  static stoke_err *name##_fwd_##SFX(const stoke_kernel_args_v1 *a, void *s) { return conv_fwd(a, s, DT, pre); } \
  static stoke_err *name##_bwd_##SFX(const stoke_kernel_args_v1 *a, void *s) { return conv_bwd(a, s, DT, pre); }

#define APPLY_KERNELS(name, act, SFX, DT)                                                                  \
  CPU_PLAN(name##_fwd_plan_##SFX, bn_geom g, apply_check(a, DT, 0, 0, act, &g))                           \
  CPU_PLAN(name##_bwd_plan_##SFX, bn_geom g, apply_check(a, DT, 1, 0, act, &g))                           \
  static stoke_err *name##_fwd_##SFX(const stoke_kernel_args_v1 *a, void *s) { return apply_run(a, DT, 0, act); } \
  static stoke_err *name##_bwd_##SFX(const stoke_kernel_args_v1 *a, void *s) { return apply_run(a, DT, 1, act); }

#define ALL_KERNELS(SFX, DT)                  \
  CONV_KERNELS(conv_bn, 0, SFX, DT)           \
  CONV_KERNELS(bn_relu_conv_bn, 1, SFX, DT)   \
  APPLY_KERNELS(bn_apply, 0, SFX, DT)         \
  APPLY_KERNELS(bn_apply_relu, 1, SFX, DT)    \
  APPLY_KERNELS(bn_apply_add_relu, 2, SFX, DT)

ALL_KERNELS(f32, STOKE_F32)
ALL_KERNELS(f64, STOKE_F64)

#define ENTRIES(op, name, sfx, dt, destroy)                      \
  CPU_KERNEL(op, STOKE_FWD, name##_fwd, sfx, dt, destroy),       \
  CPU_KERNEL(op, STOKE_BWD, name##_bwd, sfx, dt, destroy)

#define TABLE(sfx, dt)                                                              \
  ENTRIES(STOKE_OP_CONV_BN, conv_bn, sfx, dt, cb_destroy),                          \
  ENTRIES(STOKE_OP_BN_RELU_CONV_BN, bn_relu_conv_bn, sfx, dt, cb_destroy),          \
  ENTRIES(STOKE_OP_BN_APPLY, bn_apply, sfx, dt, stoke_destroy_none),                      \
  ENTRIES(STOKE_OP_BN_APPLY_RELU, bn_apply_relu, sfx, dt, stoke_destroy_none),            \
  ENTRIES(STOKE_OP_BN_APPLY_ADD_RELU, bn_apply_add_relu, sfx, dt, stoke_destroy_none)

static const stoke_kernel_v1 convbn_kernels[] = {
    TABLE(f32, STOKE_F32),
    TABLE(f64, STOKE_F64),
};

stoke_err *cpu_register_convbn(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, convbn_kernels, sizeof convbn_kernels / sizeof *convbn_kernels);
}
