/* plugins/leaky_relu: the example op plugin with CPU and CUDA kernels. It
 * adds the op `leaky_relu` (nn.LeakyReLU: x for x > 0, negative_slope x
 * otherwise) with an attribute set from the INI file
 * (`activation = leaky_relu(negative_slope=0.1)`), forward and backward
 * kernels for the cpu engine in f32 and f64 (the test kit's gradient check
 * runs in double) and, built with -DLEAKY_RELU_CUDA and leaky_relu.cu, for
 * the cuda engine in f32. Built from the SDK headers alone; checked by
 * `plugin_check libstoke_leaky_relu.so` (plugins/README.md). */
#include "stoke/plugin.h"
#include "stoke/testkit.h"

const stoke_host_v1 *stoke_host;

#define SLOPE 0 /* the attribute's index: node->attrs[SLOPE].f */

static const stoke_attr_decl_v1 attrs[] = {
    {"negative_slope", STOKE_ATTR_FLOAT, "0.01", "the slope for x <= 0 (nn.LeakyReLU's)"},
};

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  if (in[0].dtype != STOKE_F32 && in[0].dtype != STOKE_F64)
    return STOKE_PERR(STOKE_E_INVALID, "leaky_relu '%s': input must be f32 or f64, got %s", n->name,
                      stoke_dtype_name(in[0].dtype));
  out[0] = in[0];
  return NULL;
}

static double flops(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out) {
  return (double)stoke_numel(&in[0].shape);
}

static const stoke_op_type_v1 leaky_relu_op = {
    STOKE_ABI(stoke_op_type_v1),
    .name = "leaky_relu",
    .help = "x if x > 0 else negative_slope x (nn.LeakyReLU), from the example plugin",
    .n_inputs = 1,
    .n_outputs = 1,
    .attrs = attrs,
    .n_attrs = 1,
    .infer = infer,
    .flops = flops,
    .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), /* the backward reads x's sign */
    .has_backward = STOKE_HAS_BACKWARD,
};

/* y = x > 0 ? x : s x;  dx = dy (x > 0 ? 1 : s). An activation's input is
 * never a parameter: dx is overwritten, never accumulated. */
#define LEAKY_KERNELS(T, SUFFIX)                                                  \
  static stoke_err *fwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {     \
    const T *x = a->in[0].data, s = (T)a->node->attrs[SLOPE].f;                  \
    T *y = a->out[0].data;                                                       \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) y[i] = x[i] > 0 ? x[i] : s * x[i]; \
    return NULL;                                                                 \
  }                                                                              \
  static stoke_err *bwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {     \
    const T *x = a->in[0].data, *dy = a->dout[0].data, s = (T)a->node->attrs[SLOPE].f; \
    T *dx = a->din[0].data;                                                      \
    if (!dx) return NULL;                                                        \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) dx[i] = x[i] > 0 ? dy[i] : s * dy[i]; \
    return NULL;                                                                 \
  }
LEAKY_KERNELS(float, f32)
LEAKY_KERNELS(double, f64)

#ifdef LEAKY_RELU_CUDA
/* leaky_relu.cu: launches on the stream it is given; NULL, or the CUDA
 * error's text. */
const char *leaky_relu_cuda(int backward, const float *x, const float *dy, float *out, int64_t n, float slope,
                            void *stream);

static stoke_err *cuda_run(const stoke_kernel_args_v1 *a, int backward) {
  float *out = backward ? a->din[0].data : a->out[0].data;
  if (!out) return NULL;
  const char *why = leaky_relu_cuda(backward, a->in[0].data, backward ? a->dout[0].data : NULL, out,
                                    stoke_numel(&a->in[0].shape), (float)a->node->attrs[SLOPE].f, a->stream);
  return why ? STOKE_PERR(STOKE_E_INTERNAL, "leaky_relu '%s' (cuda %s): %s", a->node->name,
                          backward ? "backward" : "forward", why)
             : NULL;
}
static stoke_err *cuda_fwd(const stoke_kernel_args_v1 *a, void *st) { return cuda_run(a, 0); }
static stoke_err *cuda_bwd(const stoke_kernel_args_v1 *a, void *st) { return cuda_run(a, 1); }
#endif

#define KERNEL(eng, p, dt, fn) {.engine = eng, .op = "leaky_relu", .pass = p, .dtype = dt, .run = fn}
static const stoke_kernel_v1 kernels[] = {
    KERNEL("cpu", STOKE_FWD, STOKE_F32, fwd_f32), KERNEL("cpu", STOKE_BWD, STOKE_F32, bwd_f32),
    KERNEL("cpu", STOKE_FWD, STOKE_F64, fwd_f64), KERNEL("cpu", STOKE_BWD, STOKE_F64, bwd_f64),
#ifdef LEAKY_RELU_CUDA
    KERNEL("cuda", STOKE_FWD, STOKE_F32, cuda_fwd), KERNEL("cuda", STOKE_BWD, STOKE_F32, cuda_bwd),
#endif
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_op(r->self, &leaky_relu_op));
  for (unsigned i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "leaky_relu", "example op plugin: leaky_relu, cpu and cuda", reg};

/* The test kit's cases (tools/plugin_check): a matrix and an image batch,
 * with a slope other than the default. */
static const stoke_testcase_v1 cases[] = {
    {.op = "leaky_relu", .attrs = "negative_slope=0.1", .n_inputs = 1, .shapes = {{2, {6, 33}}}},
    {.op = "leaky_relu", .attrs = "negative_slope=0.25", .n_inputs = 1, .shapes = {{4, {2, 3, 5, 7}}}},
};
STOKE_EXPORT const stoke_testkit_v1 stoke_testkit_v1_entry = {STOKE_ABI(stoke_testkit_v1), cases,
                                                              sizeof cases / sizeof *cases};
