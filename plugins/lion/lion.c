/* plugins/lion: an example out-of-tree optimizer plugin, built from the SDK
 * headers alone. It adds `lion` (Chen et al. 2023, "Symbolic Discovery of
 * Optimization Algorithms"; lion-pytorch's arithmetic) with its keys,
 * state and CPU update kernels in f32 and f64. Use it with
 * `[optimizer] name = lion` (the plugin is loaded by that name). */
#include <math.h>

#include "stoke/optim.h"
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static const stoke_cfg_key_v1 keys[] = {
    {"beta1", STOKE_CFG_FLOAT, "0.9", 0, 1, NULL, "Lion: interpolation of the momentum and the gradient for the sign"},
    {"beta2", STOKE_CFG_FLOAT, "0.99", 0, 1, NULL, "Lion: decay of the momentum"},
};

/* The keys into the update's named fields (Lion's betas are AdamW's). */
static stoke_err *configure(const stoke_cfg *c, const char *sec, stoke_opt_args_v1 *a) {
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "beta1", &a->beta1));
  return stoke_host->cfg_float(c, sec, "beta2", &a->beta2);
}

static const stoke_optimizer_v1 lion = {
    STOKE_ABI(stoke_optimizer_v1),
    .name = "lion",
    .help = "Lion: the sign of an interpolated momentum, decoupled weight decay (use ~10x smaller lr than AdamW)",
    .keys = keys,
    .n_keys = sizeof keys / sizeof *keys,
    .n_state = 1,
    .state_names = {"exp_avg"},
    .configure = configure,
};

/* Parameters and state of one dtype (the cpu backend trains in f32; f64
 * for tests). The core's hooks come from stoke/optim.h. */
static stoke_err *check(const stoke_kernel_args_v1 *a, stoke_dtype dt) {
  if (a->n_in < 3 || a->in[0].dtype != dt || a->in[1].dtype != dt || a->in[2].dtype != dt)
    return STOKE_PERR(STOKE_E_INVALID, "lion: needs params, grads and state, all %s (no master copy)",
                      dt == STOKE_F64 ? "f64" : "f32");
  if (stoke_numel(&a->in[2].shape) != stoke_numel(&a->in[0].shape))
    return STOKE_PERR(STOKE_E_INVALID, "lion: the state holds one momentum per parameter");
  return NULL;
}

/* Per element (lion-pytorch):
 *   c = b1 m + (1 - b1) g;  p = p (1 - lr wd) - lr sign(c);  m = b2 m + (1 - b2) g */
#define LION(T, SFX)                                                                                   \
  static stoke_err *plan_##SFX(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {              \
    *state = NULL;                                                                                      \
    *ws = 0;                                                                                            \
    return check(a, sizeof(T) == 8 ? STOKE_F64 : STOKE_F32);                                            \
  }                                                                                                     \
  static stoke_err *run_##SFX(const stoke_kernel_args_v1 *a, void *state) {                             \
    STOKE_PROPAGATE_P(check(a, sizeof(T) == 8 ? STOKE_F64 : STOKE_F32));                                \
    const stoke_opt_args_v1 *o = a->opt;                                                                \
    stoke_opt_step s;                                                                                   \
    if (!stoke_opt_begin(o, &s)) return NULL;                                                           \
    T *p = a->in[0].data, *m = a->in[2].data;                                                           \
    const T *grad = a->in[1].data;                                                                      \
    int c = 0;                                                                                          \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) {                                 \
      double g = (double)grad[i] * s.scale, mi = (double)m[i];                                          \
      double u = o->beta1 * mi + (1 - o->beta1) * g, sign = (u > 0) - (u < 0);                          \
      double wd = stoke_opt_decays(o, &c, i) ? o->weight_decay : 0;                                     \
      p[i] = (T)((double)p[i] * (1 - s.lr * wd) - s.lr * sign);                                         \
      m[i] = (T)(o->beta2 * mi + (1 - o->beta2) * g);                                                   \
    }                                                                                                   \
    return NULL;                                                                                        \
  }
LION(float, f32)
LION(double, f64)

static const stoke_kernel_v1 kernels[] = {
    {.engine = "cpu", .op = "lion", .pass = STOKE_OPT, .dtype = STOKE_F32, .plan = plan_f32, .run = run_f32},
    {.engine = "cpu", .op = "lion", .pass = STOKE_OPT, .dtype = STOKE_F64, .plan = plan_f64, .run = run_f64},
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_optimizer(r->self, &lion));
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "lion",
                                                            "the Lion optimizer (example optimizer plugin)", reg};
