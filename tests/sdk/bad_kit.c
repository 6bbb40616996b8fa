/* tests/sdk/bad_kit.c: a plugin with the mistakes plugin_check must find:
 * `mis_relu` reads its output in backward but declares its input;
 * `bad_grad` has a backward off by a factor of 2; `f32_grad` is right in
 * f64 but its f32 backward (the kernel a run trains with) drops the 2;
 * `mul_param`'s f32 backward overwrites its parameter's gradient where
 * param_grad_beta 1 asks to add to it; `lazy_fwd`'s backward declares
 * STOKE_KCAP_WITH_FORWARD but never writes the forward's output;
 * `wide_f32` registers its f64 forward as its f32 kernel too (it writes
 * twice the output's bytes); `no_infer`'s infer sets no output;
 * `bwd_hidden` registers a backward kernel but leaves has_backward 0; `sloppy` is a source
 * whose labels count from 1, whose second value is left unwritten and
 * whose third depends on a counter (not on (index, seed)). */
#include "stoke/plugin.h"
#include "stoke/testkit.h"

const stoke_host_v1 *stoke_host;

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static stoke_err *relu_fwd(const stoke_kernel_args_v1 *a, void *st) {
  const double *x = a->in[0].data;
  double *y = a->out[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) y[i] = x[i] > 0 ? x[i] : 0;
  return NULL;
}
static stoke_err *relu_bwd(const stoke_kernel_args_v1 *a, void *st) { /* reads y: undeclared */
  const double *y = a->out[0].data, *dy = a->dout[0].data;
  double *dx = a->din[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) dx[i] = y[i] > 0 ? dy[i] : 0;
  return NULL;
}
static stoke_err *sq_fwd(const stoke_kernel_args_v1 *a, void *st) {
  const double *x = a->in[0].data;
  double *y = a->out[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) y[i] = x[i] * x[i];
  return NULL;
}
static stoke_err *sq_bwd(const stoke_kernel_args_v1 *a, void *st) { /* d x^2 = 2x dy: this forgets the 2 */
  const double *x = a->in[0].data, *dy = a->dout[0].data;
  double *dx = a->din[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) dx[i] = x[i] * dy[i];
  return NULL;
}

static stoke_err *sq_fwd32(const stoke_kernel_args_v1 *a, void *st) {
  const float *x = a->in[0].data;
  float *y = a->out[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) y[i] = x[i] * x[i];
  return NULL;
}
static stoke_err *sq_bwd32(const stoke_kernel_args_v1 *a, void *st) { /* forgets the 2 in f32 only */
  const float *x = a->in[0].data, *dy = a->dout[0].data;
  float *dx = a->din[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) dx[i] = x[i] * dy[i];
  return NULL;
}
static stoke_err *sq_bwd_right(const stoke_kernel_args_v1 *a, void *st) {
  const double *x = a->in[0].data, *dy = a->dout[0].data;
  double *dx = a->din[0].data;
  for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) dx[i] = 2 * x[i] * dy[i];
  return NULL;
}

/* y = x w (elementwise), w a parameter: dw = beta dw + x dy. */
#define MUL_KERNELS(T, SUFFIX, BETA)                                                       \
  static stoke_err *mul_fwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {          \
    const T *x = a->in[0].data, *w = a->in[1].data;                                       \
    T *y = a->out[0].data;                                                                \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) y[i] = x[i] * w[i]; \
    return NULL;                                                                          \
  }                                                                                       \
  static stoke_err *mul_bwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {          \
    const T *x = a->in[0].data, *w = a->in[1].data, *dy = a->dout[0].data;                \
    T *dx = a->din[0].data, *dw = a->din[1].data;                                         \
    T beta = a->param_grads >> 1 & 1u ? (T)a->param_grad_beta : 0;                        \
    for (int64_t i = 0, n = stoke_numel(&a->in[0].shape); i < n; i++) {                   \
      dx[i] = w[i] * dy[i];                                                               \
      dw[i] = (BETA) && beta != 0 ? beta * dw[i] + x[i] * dy[i] : x[i] * dy[i];           \
    }                                                                                     \
    return NULL;                                                                          \
  }
MUL_KERNELS(double, f64, 1)
MUL_KERNELS(float, f32, 0) /* ignores param_grad_beta */

static stoke_err *no_infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  return NULL; /* forgets out[0] */
}

static const stoke_op_type_v1 ops[] = {
    {STOKE_ABI(stoke_op_type_v1), .name = "wide_f32", .n_inputs = 1, .n_outputs = 1, .infer = infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), .has_backward = STOKE_HAS_BACKWARD},
    {STOKE_ABI(stoke_op_type_v1), .name = "no_infer", .n_inputs = 1, .n_outputs = 1, .infer = no_infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), .has_backward = STOKE_HAS_BACKWARD},
    {STOKE_ABI(stoke_op_type_v1), .name = "bwd_hidden", .n_inputs = 1, .n_outputs = 1, .infer = infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0)},
    {STOKE_ABI(stoke_op_type_v1), .name = "mis_relu", .n_inputs = 1, .n_outputs = 1, .infer = infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), .has_backward = STOKE_HAS_BACKWARD},
    {STOKE_ABI(stoke_op_type_v1), .name = "bad_grad", .n_inputs = 1, .n_outputs = 1, .infer = infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), .has_backward = STOKE_HAS_BACKWARD},
    {STOKE_ABI(stoke_op_type_v1), .name = "f32_grad", .n_inputs = 1, .n_outputs = 1, .infer = infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), .has_backward = STOKE_HAS_BACKWARD},
    {STOKE_ABI(stoke_op_type_v1), .name = "mul_param", .n_inputs = 2, .n_outputs = 1, .infer = infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1), .has_backward = STOKE_HAS_BACKWARD},
    {STOKE_ABI(stoke_op_type_v1), .name = "lazy_fwd", .n_inputs = 1, .n_outputs = 1, .infer = infer,
     .bwd_needs = STOKE_BWD_NEEDS_INPUT(0), .has_backward = STOKE_HAS_BACKWARD},
};
static const stoke_kernel_v1 kernels[] = {
    {.engine = "cpu", .op = "wide_f32", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = sq_fwd},
    {.engine = "cpu", .op = "wide_f32", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = sq_bwd_right},
    {.engine = "cpu", .op = "wide_f32", .pass = STOKE_FWD, .dtype = STOKE_F32, .run = sq_fwd}, /* f64 code */
    {.engine = "cpu", .op = "no_infer", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = sq_fwd},
    {.engine = "cpu", .op = "no_infer", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = sq_bwd_right},
    {.engine = "cpu", .op = "bwd_hidden", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = sq_fwd},
    {.engine = "cpu", .op = "bwd_hidden", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = sq_bwd_right},
    {.engine = "cpu", .op = "f32_grad", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = sq_fwd},
    {.engine = "cpu", .op = "f32_grad", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = sq_bwd_right},
    {.engine = "cpu", .op = "f32_grad", .pass = STOKE_FWD, .dtype = STOKE_F32, .run = sq_fwd32},
    {.engine = "cpu", .op = "f32_grad", .pass = STOKE_BWD, .dtype = STOKE_F32, .run = sq_bwd32},
    {.engine = "cpu", .op = "mul_param", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = mul_fwd_f64},
    {.engine = "cpu", .op = "mul_param", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = mul_bwd_f64},
    {.engine = "cpu", .op = "mul_param", .pass = STOKE_FWD, .dtype = STOKE_F32, .run = mul_fwd_f32},
    {.engine = "cpu", .op = "mul_param", .pass = STOKE_BWD, .dtype = STOKE_F32, .run = mul_bwd_f32},
    {.engine = "cpu", .op = "mis_relu", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = relu_fwd},
    {.engine = "cpu", .op = "mis_relu", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = relu_bwd},
    {.engine = "cpu", .op = "bad_grad", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = sq_fwd},
    {.engine = "CPU", .op = "bad_grad", .pass = STOKE_FWD, .dtype = STOKE_F32, .run = sq_fwd32}, /* misspelt engine */
    {.engine = "cpu", .op = "bad_grad", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = sq_bwd},
    {.engine = "cpu", .op = "lazy_fwd", .pass = STOKE_FWD, .dtype = STOKE_F64, .run = sq_fwd},
    /* says it can do the forward's work too, and ignores with_forward */
    {.engine = "cpu", .op = "lazy_fwd", .pass = STOKE_BWD, .dtype = STOKE_F64, .run = sq_bwd_right,
     .caps = STOKE_KCAP_WITH_FORWARD},
};

static int dummy;
static stoke_err *s_open(const stoke_cfg *c, const char *sec, void **self) {
  *self = &dummy;
  return NULL;
}
static int64_t s_length(void *self) { return 100; }
static stoke_err *s_info(void *self, stoke_sample_info_v1 *o) {
  *o = (stoke_sample_info_v1){.shape = {1, {3}}, .dtype = STOKE_F32, .classes = 2};
  return NULL;
}
static int counter;
static stoke_err *s_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  float *x = dst;
  x[0] = (float)index;
  x[2] = (float)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  *label = (int32_t)(index % 2) + 1;
  return NULL;
}
static const stoke_source_v1 sloppy = {STOKE_ABI(stoke_source_v1), "sloppy", "", NULL, 0, s_open, NULL, s_length,
                                       s_info, s_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  for (unsigned i = 0; i < sizeof ops / sizeof *ops; i++) STOKE_PROPAGATE_P(r->add_op(r->self, &ops[i]));
  for (unsigned i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return r->add_source(r->self, &sloppy);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "bad_kit",
                                                            "plugin_check's mistakes", reg};

static const stoke_testcase_v1 cases[] = {
    {.op = "mul_param", .n_inputs = 2, .shapes = {{2, {3, 5}}, {2, {3, 5}}}, .param_inputs = 2},
};
STOKE_EXPORT const stoke_testkit_v1 stoke_testkit_v1_entry = {STOKE_ABI(stoke_testkit_v1), cases,
                                                              sizeof cases / sizeof *cases};
