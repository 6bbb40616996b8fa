/* tests/plugins/newuser/hardswish.c: the op a new user wrote from
 * plugins/README.md and the SDK headers alone (issue 18's trial):
 * nn.Hardswish, x * relu6(x + 3) / 6, with cpu kernels (f32, f64) and,
 * with -DHARDSWISH_CUDA and hardswish.cu, cuda kernels (f32). build.sh
 * builds it out of tree with the README's commands; BUILD with Bazel. */
#include "stoke/plugin.h"
#include "stoke/testkit.h"

const stoke_host_v1 *stoke_host;

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  if (in[0].dtype != STOKE_F32 && in[0].dtype != STOKE_F64)
    return STOKE_PERR(STOKE_E_INVALID, "hardswish '%s': input must be f32 or f64, got %s", n->name,
                      stoke_dtype_name(in[0].dtype));
  out[0] = in[0];
  return NULL;
}

static double flops(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out) {
  return 4.0 * (double)stoke_numel(&in[0].shape);
}

static const stoke_op_type_v1 hardswish_op = {
    STOKE_ABI(stoke_op_type_v1),
    .name = "hardswish",
    .help = "x * relu6(x + 3) / 6 (nn.Hardswish)",
    .n_inputs = 1,
    .n_outputs = 1,
    .infer = infer,
    .flops = flops,
    .bwd_needs = STOKE_BWD_NEEDS_INPUT(0),
    .has_backward = STOKE_HAS_BACKWARD,
};

/* y = 0 (x <= -3), x (x >= 3), x (x + 3) / 6 between;
 * dy/dx = 0, 1, (2x + 3) / 6 (PyTorch's: x = -3 gives 0, x = 3 gives 1). */
#define HS_KERNELS(T, SFX)                                                                 \
  static stoke_err *fwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                 \
    const T *x = a->in[0].data;                                                            \
    T *y = a->out[0].data;                                                                 \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++)                      \
      y[i] = x[i] <= -3 ? 0 : x[i] >= 3 ? x[i] : x[i] * (x[i] + 3) / 6;                    \
    return NULL;                                                                           \
  }                                                                                        \
  static stoke_err *bwd_##SFX(const stoke_kernel_args_v1 *a, void *st) {                 \
    const T *x = a->in[0].data, *dy = a->dout[0].data;                                     \
    T *dx = a->din[0].data;                                                                \
    if (!dx) return NULL;                                                                  \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++)                      \
      dx[i] = x[i] < -3 ? 0 : x[i] > 3 ? dy[i] : dy[i] * (2 * x[i] + 3) / 6;               \
    return NULL;                                                                           \
  }
HS_KERNELS(float, f32)
HS_KERNELS(double, f64)

#ifdef HARDSWISH_CUDA
const char *hardswish_cuda(int backward, const float *x, const float *dy, float *out, int64_t n, void *stream);

static stoke_err *cuda_run(const stoke_kernel_args_v1 *a, int backward) {
  float *out = backward ? a->din[0].data : a->out[0].data;
  if (!out) return NULL;
  const char *why = hardswish_cuda(backward, a->in[0].data, backward ? a->dout[0].data : NULL, out,
                                   stoke_numel(&a->in[0].shape), a->stream);
  return why ? STOKE_PERR(STOKE_E_INTERNAL, "hardswish '%s' (cuda): %s", a->node->name, why) : NULL;
}
static stoke_err *cuda_fwd(const stoke_kernel_args_v1 *a, void *st) { return cuda_run(a, 0); }
static stoke_err *cuda_bwd(const stoke_kernel_args_v1 *a, void *st) { return cuda_run(a, 1); }
#endif

#define KERNEL(eng, p, dt, fn) {.engine = eng, .op = "hardswish", .pass = p, .dtype = dt, .run = fn}
static const stoke_kernel_v1 kernels[] = {
    KERNEL("cpu", STOKE_FWD, STOKE_F32, fwd_f32), KERNEL("cpu", STOKE_BWD, STOKE_F32, bwd_f32),
    KERNEL("cpu", STOKE_FWD, STOKE_F64, fwd_f64), KERNEL("cpu", STOKE_BWD, STOKE_F64, bwd_f64),
#ifdef HARDSWISH_CUDA
    KERNEL("cuda", STOKE_FWD, STOKE_F32, cuda_fwd), KERNEL("cuda", STOKE_BWD, STOKE_F32, cuda_bwd),
#endif
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_op(r->self, &hardswish_op));
  for (unsigned i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "hardswish",
                                                            "nn.Hardswish, cpu and cuda", reg};

/* inputs in [-5, 5): all three pieces */
static const stoke_testcase_v1 cases[] = {
    {.op = "hardswish", .n_inputs = 1, .shapes = {{2, {8, 37}}}, .lo = -5, .hi = 5},
};
STOKE_EXPORT const stoke_testkit_v1 stoke_testkit_v1_entry = {STOKE_ABI(stoke_testkit_v1), cases,
                                                              sizeof cases / sizeof *cases};
