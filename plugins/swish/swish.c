/* plugins/swish: an example out-of-tree op plugin. It adds the op type
 * `swish` (x * sigmoid(x), PyTorch's nn.SiLU) with forward and backward
 * CPU kernels in f32 and f64, built from the SDK headers alone. Use it
 * with `[plugins] load = swish` and `[model] activation = swish`. */
#include <math.h>

#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

/* Shape inference: the output is shaped and typed like the input. */
static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                        stoke_value_desc_v1 *out) {
  if (in[0].dtype != STOKE_F32 && in[0].dtype != STOKE_F64 && in[0].dtype != STOKE_BF16 &&
      in[0].dtype != STOKE_F16)
    return STOKE_PERR(STOKE_E_INVALID, "swish '%s': input must be a float tensor", n->name);
  out[0] = in[0];
  return NULL;
}

/* exp, add, divide, multiply: about 4 FLOPs an element. */
static double flops(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                    const stoke_value_desc_v1 *out) {
  return 4.0 * (double)stoke_numel(&in[0].shape);
}

static const stoke_op_type_v1 swish_op = {
    STOKE_ABI(stoke_op_type_v1),
    .name = "swish",
    .help = "x * sigmoid(x) (nn.SiLU), from the example plugin",
    .n_inputs = 1,
    .n_outputs = 1,
    .infer = infer,
    .flops = flops,
    .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), /* the derivative needs x */
    .has_backward = STOKE_HAS_BACKWARD,
};

/* y = x s(x); dy/dx = s(x) (1 + x (1 - s(x))) */
#define SWISH_KERNELS(T, SUFFIX)                                               \
  static stoke_err *fwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {  \
    const T *x = a->in[0].data;                                               \
    T *y = a->out[0].data;                                                    \
    int64_t n = stoke_numel(&a->in[0].shape);                                 \
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / ((T)1 + (T)exp(-x[i]));     \
    return NULL;                                                              \
  }                                                                           \
  static stoke_err *bwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {  \
    const T *x = a->in[0].data, *dy = a->dout[0].data;                        \
    T *dx = a->din[0].data;                                                   \
    if (!dx) return NULL;                                                     \
    int64_t n = stoke_numel(&a->in[0].shape);                                 \
    for (int64_t i = 0; i < n; i++) {                                         \
      T s = (T)1 / ((T)1 + (T)exp(-x[i]));                                    \
      dx[i] = dy[i] * s * ((T)1 + x[i] * ((T)1 - s));                         \
    }                                                                         \
    return NULL;                                                              \
  }

/* One body, two instances: f32 for training, f64 for gradient checks. */
SWISH_KERNELS(float, f32)
SWISH_KERNELS(double, f64)

/* Designated initializers: fields the SDK appends later (accumulates, ...)
 * start at zero, and a -Wextra build stays quiet. */
#define SWISH_KERNEL(p, dt, fn) \
  {.engine = "cpu", .op = "swish", .pass = p, .dtype = dt, .layout = STOKE_LAYOUT_ANY, .run = fn}
static const stoke_kernel_v1 kernels[] = {
    SWISH_KERNEL(STOKE_FWD, STOKE_F32, fwd_f32),
    SWISH_KERNEL(STOKE_BWD, STOKE_F32, bwd_f32),
    SWISH_KERNEL(STOKE_FWD, STOKE_F64, fwd_f64),
    SWISH_KERNEL(STOKE_BWD, STOKE_F64, bwd_f64),
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_op(r->self, &swish_op));
  for (unsigned i = 0; i < sizeof kernels / sizeof *kernels; i++)
    STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "swish", "example op plugin: swish (SiLU)", reg};
