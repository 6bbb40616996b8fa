/* backends/cpu/optim.c: the reference kernels of the update (pass
 * STOKE_OPT) over the flat buffers, in f32 and f64 parameters: the
 * optimizers sgd and adamw (torch.optim's arithmetic, in double), the
 * global gradient norm for clipping (grad_norm) and the loss scaler's two
 * steps (amp_check, amp_update). Every GPU update kernel is checked
 * against these. The state is in the master dtype: the parameters' own, or
 * f64 for f32 parameters (then it starts with the f64 master copy). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/optim.h"
#include "stoke/plugin.h"
#include "check.h"

/* ------------------------------------------------------------- arguments */

/* in[0] params, in[1] grads (dtype dt), in[2] state in the params' dtype
 * or f64: (master, if f64 for f32 params) + per_param x the params; with
 * neither (plain sgd in the params' dtype) the state is not read. */
static stoke_err *opt_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, const char *op, int64_t per_param,
                            int run) {
  const stoke_tensor *p = &a->in[0], *g = &a->in[1], *s = a->n_in >= 3 ? &a->in[2] : NULL;
  int master = s && s->dtype != dt;
  if (a->n_in < (per_param || master ? 3 : 2) || !a->in)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs params, grads and state buffers, got %d inputs", op,
                      stoke_node_name(a), a->n_in);
  int64_t np = stoke_numel(&p->shape);
  if (stoke_numel(&g->shape) != np)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': params %s and grads %s differ in size", op, stoke_node_name(a),
                      stoke_shape_str(&p->shape).s, stoke_shape_str(&g->shape).s);
  CHECK(stoke_check_dtype(a, op, "params", p, dt));
  CHECK(stoke_check_dtype(a, op, "grads", g, dt));
  CHECK(stoke_check_data(a, op, "params", p, run));
  CHECK(stoke_check_data(a, op, "grads", g, run));
  if (per_param || master) {
    if (master && !(dt == STOKE_F32 && s->dtype == STOKE_F64))
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': state %s with %s params; the cpu kernels keep the state in the params' "
                        "dtype or, for f32 params, an f64 master copy",
                        op, stoke_node_name(a), stoke_dtype_name(s->dtype), stoke_dtype_name(dt));
    /* sgd without momentum reads only the master; the planner sizes the
     * state for momentum anyway */
    int64_t want = (per_param + master) * np, have = stoke_numel(&s->shape);
    if (per_param > 0 ? have != want : have < want)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': state %s should hold %s%lld x the %lld params", op, stoke_node_name(a),
                        stoke_shape_str(&s->shape).s, per_param > 0 ? "" : "at least ", (long long)(per_param + master),
                        (long long)np);
    CHECK(stoke_check_data(a, op, "state", s, run));
  }
  if (run && !a->opt)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': no hyper-parameters (opt) given", op, stoke_node_name(a));
  if (run && !(a->opt->grad_scale > 0 && isfinite(a->opt->grad_scale)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': grad_scale %g must be finite and > 0 (1 = no scaling)", op,
                      stoke_node_name(a), a->opt->grad_scale);
  return NULL;
}

static stoke_err *sgd_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int run) {
  /* The state is the momentum buffer, needed only with momentum. In plan
   * the hyper-parameters are absent: the planner sizes it for momentum. */
  int mom = !a->opt || a->opt->momentum != 0;
  CHECK(opt_check(a, dt, STOKE_OP_SGD, mom ? 1 : 0, run));
  if (run && a->opt->nesterov && !(a->opt->momentum > 0))
    return STOKE_PERR(STOKE_E_INVALID, "sgd '%s': nesterov needs momentum > 0 (got %g)", stoke_node_name(a),
                      a->opt->momentum);
  return NULL;
}

static stoke_err *adamw_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int run) {
  CHECK(opt_check(a, dt, STOKE_OP_ADAMW, 2, run));
  if (!run) return NULL;
  const stoke_opt_args_v1 *o = a->opt;
  if (o->step < 1)
    return STOKE_PERR(STOKE_E_INVALID, "adamw '%s': step %lld, the first update is step 1", stoke_node_name(a),
                      (long long)o->step);
  if (!(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1))
    return STOKE_PERR(STOKE_E_INVALID, "adamw '%s': betas (%g, %g) not in [0, 1)", stoke_node_name(a), o->beta1,
                      o->beta2);
  return NULL;
}

/* ------------------------------------------------------------ the updates */

/* torch.optim.SGD with dampening 0, per element:
 *   g = grad * scale + wd * p
 *   buf = momentum * buf + g        (buf starts at 0: torch's first-step
 *                                    clone(g), since dampening is 0)
 *   g = nesterov ? g + momentum * buf : buf
 *   p -= lr * g
 * momentum 0 is plain SGD and leaves the state alone. P is the parameter
 * type, M the state's; with a master copy, mst holds the parameters in M
 * and p gets their rounding. The gradient buffer is only read. */
#define SGD_LOOP(P, M)                                                                                          \
  static void sgd_##P##_##M(const stoke_opt_args_v1 *o, const stoke_opt_step *s, P *p, const P *grad,           \
                            M *mst, M *buf, int64_t n) {                                                        \
    int c = 0;                                                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                                           \
      double pi = mst ? (double)mst[i] : (double)p[i];                                                          \
      double g = (double)grad[i] * s->scale;                                                                    \
      if (o->weight_decay != 0 && stoke_opt_decays(o, &c, i)) g += o->weight_decay * pi;                        \
      if (buf) {                                                                                                \
        buf[i] = (M)(o->momentum * (double)buf[i] + g);                                                         \
        g = o->nesterov ? g + o->momentum * (double)buf[i] : (double)buf[i];                                    \
      }                                                                                                         \
      if (mst) {                                                                                                \
        mst[i] = (M)(pi - s->lr * g);                                                                           \
        p[i] = (P)mst[i];                                                                                       \
      } else {                                                                                                  \
        p[i] = (P)(pi - s->lr * g);                                                                             \
      }                                                                                                         \
    }                                                                                                           \
  }

/* torch.optim.AdamW, per element, t = applied updates (1 for the first):
 *   g = grad * scale
 *   p *= 1 - lr * wd                          (decoupled weight decay)
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * m and v are stored rounded to M; the update uses them unrounded. */
#define ADAMW_LOOP(P, M)                                                                                        \
  static void adamw_##P##_##M(const stoke_opt_args_v1 *o, const stoke_opt_step *s, P *p, const P *grad,         \
                              M *mst, M *m, M *v, int64_t n) {                                                  \
    double b1 = o->beta1, b2 = o->beta2;                                                                        \
    double step_size = s->lr / (1 - pow(b1, s->t)), bc2_sqrt = sqrt(1 - pow(b2, s->t));                         \
    double decay = 1 - s->lr * o->weight_decay;                                                                 \
    int c = 0;                                                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                                           \
      double g = (double)grad[i] * s->scale;                                                                    \
      double pi = (mst ? (double)mst[i] : (double)p[i]) * (stoke_opt_decays(o, &c, i) ? decay : 1);             \
      double mi = b1 * (double)m[i] + (1 - b1) * g;                                                             \
      double vi = b2 * (double)v[i] + (1 - b2) * g * g;                                                         \
      m[i] = (M)mi;                                                                                             \
      v[i] = (M)vi;                                                                                             \
      double next = pi - step_size * mi / (sqrt(vi) / bc2_sqrt + o->eps);                                       \
      if (mst) mst[i] = (M)next;                                                                                \
      p[i] = (P)(mst ? (double)mst[i] : next);                                                                  \
    }                                                                                                           \
  }

SGD_LOOP(float, float)
SGD_LOOP(double, double)
SGD_LOOP(float, double)
ADAMW_LOOP(float, float)
ADAMW_LOOP(double, double)
ADAMW_LOOP(float, double)

/* The optimizer's tensors in the state, after the master copy if any. */
#define STATE(T, k) ((T *)a->in[2].data + (size_t)((k) + master) * (size_t)n)

static stoke_err *sgd_run(const stoke_kernel_args_v1 *a, stoke_dtype dt) {
  CHECK(sgd_check(a, dt, 1));
  const stoke_opt_args_v1 *o = a->opt;
  stoke_opt_step s;
  if (!stoke_opt_begin(o, &s)) return NULL;
  int64_t n = stoke_numel(&a->in[0].shape);
  int master = a->n_in >= 3 && a->in[2].dtype != dt, mom = o->momentum != 0;
  void *p = a->in[0].data;
  const void *g = a->in[1].data;
  if (dt == STOKE_F64) sgd_double_double(o, &s, p, g, NULL, mom ? STATE(double, 0) : NULL, n);
  else if (master) sgd_float_double(o, &s, p, g, STATE(double, -1), mom ? STATE(double, 0) : NULL, n);
  else sgd_float_float(o, &s, p, g, NULL, mom ? STATE(float, 0) : NULL, n);
  return NULL;
}

static stoke_err *adamw_run(const stoke_kernel_args_v1 *a, stoke_dtype dt) {
  CHECK(adamw_check(a, dt, 1));
  const stoke_opt_args_v1 *o = a->opt;
  stoke_opt_step s;
  if (!stoke_opt_begin(o, &s)) return NULL;
  int64_t n = stoke_numel(&a->in[0].shape);
  int master = a->in[2].dtype != dt;
  void *p = a->in[0].data;
  const void *g = a->in[1].data;
  if (dt == STOKE_F64) adamw_double_double(o, &s, p, g, NULL, STATE(double, 0), STATE(double, 1), n);
  else if (master) adamw_float_double(o, &s, p, g, STATE(double, -1), STATE(double, 0), STATE(double, 1), n);
  else adamw_float_float(o, &s, p, g, NULL, STATE(float, 0), STATE(float, 1), n);
  return NULL;
}

/* ------------------------------------------------ clipping and the scaler */

/* in[0] the flat gradients (dt), in[1] an f32 tensor of `words` elements. */
static stoke_err *flat_check(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int64_t words,
                             int run) {
  if (a->n_in < 2 || !a->in)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs the gradients and its state, got %d inputs", op,
                      stoke_node_name(a), a->n_in);
  CHECK(stoke_check_dtype(a, op, "gradients", &a->in[0], dt));
  CHECK(stoke_check_dtype(a, op, "state", &a->in[1], STOKE_F32));
  if (stoke_numel(&a->in[1].shape) != words)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': state %s should be f32[%lld]", op, stoke_node_name(a),
                      stoke_shape_str(&a->in[1].shape).s, (long long)words);
  CHECK(stoke_check_data(a, op, "gradients", &a->in[0], run));
  CHECK(stoke_check_data(a, op, "state", &a->in[1], run));
  if (run && !a->opt) return STOKE_PERR(STOKE_E_INVALID, "%s '%s': no opt arguments given", op, stoke_node_name(a));
  return NULL;
}

/* The L2 norm of the gradients times grad_scale / the loss scale, and the
 * clipping factor min(1, max_norm / (norm + 1e-6)) (NaN stays NaN, as
 * torch's clamp). A step the scaler skips: [inf, 1]. */
static stoke_err *grad_norm_run(const stoke_kernel_args_v1 *a, stoke_dtype dt) {
  CHECK(flat_check(a, STOKE_OP_GRAD_NORM, dt, 2, 1));
  const stoke_opt_args_v1 *o = a->opt;
  float *out = a->in[1].data;
  if (o->amp && o->amp[2] != 0.0f) {
    out[0] = INFINITY, out[1] = 1;
    return NULL;
  }
  int64_t n = stoke_numel(&a->in[0].shape);
  double sum = 0, scale = o->grad_scale / (o->amp ? (double)o->amp[0] : 1.0);
  for (int64_t i = 0; i < n; i++) {
    double g = dt == STOKE_F64 ? ((const double *)a->in[0].data)[i] : (double)((const float *)a->in[0].data)[i];
    sum += g * g;
  }
  double norm = sqrt(sum) * scale, coef = o->max_norm / (norm + 1e-6);
  out[0] = (float)norm;
  out[1] = (float)(isnan(coef) || coef < 1 ? coef : 1);
  return NULL;
}

/* found_inf (state[2]) = 1 when any gradient is not finite. */
static stoke_err *amp_check_run(const stoke_kernel_args_v1 *a, stoke_dtype dt) {
  CHECK(flat_check(a, STOKE_OP_AMP_CHECK, dt, 4, 1));
  float *st = a->in[1].data;
  int64_t n = stoke_numel(&a->in[0].shape);
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(dt == STOKE_F64 ? ((const double *)a->in[0].data)[i] : ((const float *)a->in[0].data)[i])) {
      st[2] = 1.0f;
      break;
    }
  return NULL;
}

/* The scale's next value (stoke/ops.h), and the loss seed = the scale. */
static stoke_err *amp_update_run(const stoke_kernel_args_v1 *a, void *state) {
  const char *op = STOKE_OP_AMP_UPDATE;
  if (a->n_in < 2 || !a->in || a->in[0].dtype != STOKE_F32 || stoke_numel(&a->in[0].shape) != 4 ||
      stoke_numel(&a->in[1].shape) != 1 || (a->in[1].dtype != STOKE_F32 && a->in[1].dtype != STOKE_F64))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs the f32[4] scaler state and a one-element f32/f64 loss seed",
                      op, stoke_node_name(a));
  float *st = a->in[0].data;
  const stoke_opt_args_v1 *o = a->opt;
  double growth = o && o->growth_factor > 0 ? o->growth_factor : 2, back = o && o->backoff_factor > 0 ? o->backoff_factor : 0.5;
  int64_t interval = o ? o->growth_interval : 2000;
  if (st[2] != 0.0f) {
    st[0] = fmaxf(st[0] * (float)back, FLT_MIN); /* in float, as the GPU kernel; never 0 */
    st[1] = 0;
    st[3] += 1.0f;
  } else if (interval > 0 && st[1] + 1 >= (float)interval) {
    float grown = st[0] * (float)growth;
    if (isfinite(grown)) st[0] = grown; /* as PyTorch: a growth past float's range keeps the scale */
    st[1] = 0;
  } else {
    st[1] += 1;
  }
  st[2] = 0.0f;
  if (a->in[1].dtype == STOKE_F64) *(double *)a->in[1].data = st[0];
  else *(float *)a->in[1].data = st[0];
  return NULL;
}

/* ----------------------------------------------------------- registration */

#define RUN_AS(fn, sfx, dt) \
  static stoke_err *fn##_##sfx(const stoke_kernel_args_v1 *a, void *state) { return fn(a, dt); }
#define PLAN_AS(fn, sfx, check)                                                         \
  static stoke_err *fn##_plan_##sfx(const stoke_kernel_args_v1 *a, void **state, size_t *ws) { \
    if (state) *state = NULL;                                                             \
    if (ws) *ws = 0;                                                                      \
    return check;                                                                         \
  }
#define BOTH(sfx, dt)                                                            \
  RUN_AS(sgd_run, sfx, dt)                                                       \
  RUN_AS(adamw_run, sfx, dt)                                                     \
  RUN_AS(grad_norm_run, sfx, dt)                                                 \
  RUN_AS(amp_check_run, sfx, dt)                                                 \
  PLAN_AS(sgd, sfx, sgd_check(a, dt, 0))                                         \
  PLAN_AS(adamw, sfx, adamw_check(a, dt, 0))                                     \
  PLAN_AS(grad_norm, sfx, flat_check(a, STOKE_OP_GRAD_NORM, dt, 2, 0))           \
  PLAN_AS(amp_check, sfx, flat_check(a, STOKE_OP_AMP_CHECK, dt, 4, 0))
BOTH(f32, STOKE_F32)
BOTH(f64, STOKE_F64)

#define OPT_KERNELS(sfx, dt)                                                                                  \
  {"cpu", STOKE_OP_SGD, STOKE_OPT, dt, STOKE_LAYOUT_ANY, sgd_plan_##sfx, sgd_run_##sfx, stoke_destroy_none},          \
  {"cpu", STOKE_OP_ADAMW, STOKE_OPT, dt, STOKE_LAYOUT_ANY, adamw_plan_##sfx, adamw_run_##sfx, stoke_destroy_none},    \
  {"cpu", STOKE_OP_GRAD_NORM, STOKE_OPT, dt, STOKE_LAYOUT_ANY, grad_norm_plan_##sfx, grad_norm_run_##sfx,       \
   stoke_destroy_none},                                                                                             \
  {"cpu", STOKE_OP_AMP_CHECK, STOKE_OPT, dt, STOKE_LAYOUT_ANY, amp_check_plan_##sfx, amp_check_run_##sfx,       \
   stoke_destroy_none}

static const stoke_kernel_v1 kernels[] = {
    OPT_KERNELS(f32, STOKE_F32),
    OPT_KERNELS(f64, STOKE_F64),
    {"cpu", STOKE_OP_AMP_UPDATE, STOKE_OPT, STOKE_F32, STOKE_LAYOUT_ANY, NULL, amp_update_run, stoke_destroy_none},
};

stoke_err *cpu_register_optim(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, kernels, sizeof kernels / sizeof *kernels);
}
