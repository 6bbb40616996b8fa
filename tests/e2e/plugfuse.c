/* tests/e2e/plugfuse.c: a test plugin that registers a fusion pattern
 * through stoke_fusion_v1, as plugins/README.md "Config keys, attributes
 * and fusion" tells a plugin author to: the ops `shift` (y = x + by) and
 * `softsign` (y = gain x / (1 + |x|)), the fused op `shift_softsign` (the
 * head's attribute, then the tail's), the pattern shift -> softsign, and
 * the model `plugnet` (linear -> shift -> softsign -> linear) that
 * contains it. The fused kernels compute in the same order as the two
 * apart, so a fused run trains bit for bit as the unfused one.
 * Also the op `elsewhere_act`, whose only kernels are for the engine
 * "elsewhere" (no backend of that name): a run asking for it on the cpu
 * gets the "no kernel" error, naming the engine that has one. */
#include <math.h>
#include <stdio.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static stoke_err *same_shape(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static const stoke_attr_decl_v1 shift_attrs[] = {{"by", STOKE_ATTR_FLOAT, "0.5", "added to every element"}};
static const stoke_attr_decl_v1 softsign_attrs[] = {{"gain", STOKE_ATTR_FLOAT, "1", "the output's scale"}};
static const stoke_attr_decl_v1 fused_attrs[] = {{"by", STOKE_ATTR_FLOAT, "0.5", "shift's"},
                                                 {"gain", STOKE_ATTR_FLOAT, "1", "softsign's"}};

#define OP(NAME, HELP, ATTRS, NEEDS)                                                                        \
  {STOKE_ABI(stoke_op_type_v1), .name = NAME, .help = HELP, .n_inputs = 1, .n_outputs = 1, .attrs = ATTRS, \
   .n_attrs = sizeof ATTRS / sizeof *ATTRS, .infer = same_shape, .bwd_needs = NEEDS, .has_backward = STOKE_HAS_BACKWARD}
static const stoke_op_type_v1 ops[] = {
    OP("shift", "x + by", shift_attrs, STOKE_BWD_NEEDS_NOTHING),
    OP("softsign", "gain x / (1 + |x|)", softsign_attrs, STOKE_BWD_NEEDS_INPUT(0)),
    OP("shift_softsign", "softsign(shift(x)) in one pass (the pattern shift_softsign)", fused_attrs,
       STOKE_BWD_NEEDS_INPUT(0)),
    OP("elsewhere_act", "x, with kernels only for the engine 'elsewhere'", shift_attrs, STOKE_BWD_NEEDS_NOTHING),
};

/* One body per op and dtype; `by` 0 / `gain` 1 where the op lacks one. */
#define SOFTSIGN(T, t, g) ((g) * (t) / ((T)1 + (t < 0 ? -(t) : (t))))
#define KERNELS(T, SFX)                                                                                  \
  static stoke_err *shift_fwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                         \
    const T *x = a->in[0].data, by = (T)a->node->attrs[0].f;                                             \
    T *y = a->out[0].data;                                                                               \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) y[i] = x[i] + by;                  \
    return NULL;                                                                                         \
  }                                                                                                      \
  static stoke_err *shift_bwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                         \
    const T *dy = a->dout[0].data;                                                                       \
    T *dx = a->din[0].data;                                                                              \
    for (int64_t i = 0, n = dx ? stoke_numel(&a->in[0].shape) : 0; i < n; i++) dx[i] = dy[i];          \
    return NULL;                                                                                         \
  }                                                                                                      \
  static void softsign_fwd_##SFX(const T *x, T by, T g, T *y, int64_t n) {                             \
    for (int64_t i = 0; i < n; i++) {                                                                    \
      T t = x[i] + by;                                                                                   \
      y[i] = SOFTSIGN(T, t, g);                                                                          \
    }                                                                                                    \
  }                                                                                                      \
  static void softsign_bwd_##SFX(const T *x, const T *dy, T by, T g, T *dx, int64_t n) {               \
    for (int64_t i = 0; i < n; i++) {                                                                    \
      T t = x[i] + by, d = (T)1 + (t < 0 ? -t : t);                                                      \
      dx[i] = dy[i] * (g / (d * d));                                                                     \
    }                                                                                                    \
  }                                                                                                      \
  static stoke_err *ss_fwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                            \
    softsign_fwd_##SFX(a->in[0].data, 0, (T)a->node->attrs[0].f, a->out[0].data, stoke_numel(&a->in[0].shape)); \
    return NULL;                                                                                         \
  }                                                                                                      \
  static stoke_err *ss_bwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                            \
    if (a->din[0].data)                                                                                  \
      softsign_bwd_##SFX(a->in[0].data, a->dout[0].data, 0, (T)a->node->attrs[0].f, a->din[0].data,    \
                         stoke_numel(&a->in[0].shape));                                                  \
    return NULL;                                                                                         \
  }                                                                                                      \
  static stoke_err *fused_fwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                         \
    softsign_fwd_##SFX(a->in[0].data, (T)a->node->attrs[0].f, (T)a->node->attrs[1].f, a->out[0].data,  \
                       stoke_numel(&a->in[0].shape));                                                    \
    return NULL;                                                                                         \
  }                                                                                                      \
  static stoke_err *fused_bwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                         \
    if (a->din[0].data)                                                                                  \
      softsign_bwd_##SFX(a->in[0].data, a->dout[0].data, (T)a->node->attrs[0].f, (T)a->node->attrs[1].f, \
                         a->din[0].data, stoke_numel(&a->in[0].shape));                                  \
    return NULL;                                                                                         \
  }
KERNELS(float, f32)
KERNELS(double, f64)

#define K(ENG, OPN, PASS, DT, FN) {.engine = ENG, .op = OPN, .pass = PASS, .dtype = DT, .run = FN}
#define BOTH(OPN, FWD, BWD)                                                                               \
  K("cpu", OPN, STOKE_FWD, STOKE_F32, FWD##_f32), K("cpu", OPN, STOKE_BWD, STOKE_F32, BWD##_f32),         \
      K("cpu", OPN, STOKE_FWD, STOKE_F64, FWD##_f64), K("cpu", OPN, STOKE_BWD, STOKE_F64, BWD##_f64)
static const stoke_kernel_v1 kernels[] = {
    BOTH("shift", shift_fwd, shift_bwd),
    BOTH("softsign", ss_fwd, ss_bwd),
    BOTH("shift_softsign", fused_fwd, fused_bwd),
    K("elsewhere", "elsewhere_act", STOKE_FWD, STOKE_F32, shift_fwd_f32),
    K("elsewhere", "elsewhere_act", STOKE_BWD, STOKE_F32, shift_bwd_f32),
};

static const stoke_fusion_v1 pattern = {STOKE_ABI(stoke_fusion_v1), "shift_softsign",
                                        "softsign(x + by) in one pass each way", "shift", "softsign",
                                        "shift_softsign", 0, 0};

/* ------------------------------------------------ the model: plugnet */

static const stoke_cfg_key_v1 keys[] = {
    {"hidden", STOKE_CFG_INT, "24", 1, 1 << 16, NULL, "the hidden layer's width"},
    {"between", STOKE_CFG_LIST, "shift(by=0.25), softsign(gain=1.5)", 0, 0, NULL,
     "the one-input ops between the two linear layers, in order, each with its attributes"},
};

static stoke_err *linear(const stoke_builder_v1 *b, int x, int64_t in, int64_t out, const char *name, int *y) {
  char w[64], bias[64];
  snprintf(w, sizeof w, "%s.weight", name);
  snprintf(bias, sizeof bias, "%s.bias", name);
  double bound = 1.0 / sqrt((double)in);
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -bound, bound};
  int ins[3] = {x};
  STOKE_PROPAGATE_P(b->param(b->g, w, &(stoke_shape){2, {out, in}}, init, &ins[1]));
  STOKE_PROPAGATE_P(b->param(b->g, bias, &(stoke_shape){1, {out}}, init, &ins[2]));
  return b->node(b->g, STOKE_OP_LINEAR, name, ins, 3, "", y, 1);
}

static stoke_err *build(const stoke_cfg *c, const char *sec, const stoke_builder_v1 *b, int input, int64_t classes,
                        int *logits) {
  int64_t hidden;
  const char *between[STOKE_CFG_MAX_LIST];
  int n_between = 0;
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "hidden", &hidden));
  STOKE_PROPAGATE_P(stoke_host->cfg_list(c, sec, "between", between, &n_between));
  stoke_shape s;
  STOKE_PROPAGATE_P(b->shape_of(b->g, input, &s));
  int x = input, h;
  if (s.ndim > 2) STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_FLATTEN, "flatten", &input, 1, "", &x, 1));
  STOKE_PROPAGATE_P(b->shape_of(b->g, x, &s));
  STOKE_PROPAGATE_P(linear(b, x, s.d[1], hidden, "fc1", &h));
  for (int i = 0; i < n_between; i++) { /* "softsign(gain=1.5)": the op and its attributes */
    char name[32];
    snprintf(name, sizeof name, "between.%d", i);
    int y;
    STOKE_PTRY(b->node(b->g, between[i], name, &h, 1, "", &y, 1), "%s: [%s] between", stoke_host->cfg_where(c, sec, "between"), sec);
    h = y;
  }
  return linear(b, h, hidden, classes, "fc2", logits);
}

static const stoke_model_v1 model = {STOKE_ABI(stoke_model_v1), "plugnet",
                                     "linear -> shift -> softsign -> linear (the fusion pattern's test)", keys,
                                     sizeof keys / sizeof *keys, build};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  for (unsigned i = 0; i < sizeof ops / sizeof *ops; i++) STOKE_PROPAGATE_P(r->add_op(r->self, &ops[i]));
  for (unsigned i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  STOKE_PROPAGATE_P(r->add_fusion(r->self, &pattern));
  return r->add_model(r->self, &model);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "plugfuse", "a fusion pattern from a plugin (tests)", reg};
