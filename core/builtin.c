/* core/builtin.c: the core's own plugin, registered through the same
 * stoke_plugin_v1 mechanism as every .so: the built-in op types (shape
 * inference, FLOPs, what backward needs), the precision policies, the
 * single-process comm and the optimizers (core/optimizers.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/ops.h"
#include "ops_cnn.h"

static stoke_err *infer_linear(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                               stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape, *w = &in[1].shape, *b = &in[2].shape;
  if (x->ndim != 2 || w->ndim != 2 || b->ndim != 1)
    return STOKE_ERR(STOKE_E_INVALID,
                     "linear '%s': expects x[N, in], weight[out, in], bias[out]; got "
                     "%d-D, %d-D, %d-D",
                     n->name, x->ndim, w->ndim, b->ndim);
  if (x->d[1] != w->d[1] || b->d[0] != w->d[0])
    return STOKE_ERR(STOKE_E_INVALID,
                     "linear '%s': x has %lld features, weight is [%lld, %lld], bias "
                     "[%lld]",
                     n->name, (long long)x->d[1], (long long)w->d[0], (long long)w->d[1],
                     (long long)b->d[0]);
  out[0].shape = (stoke_shape){2, {x->d[0], w->d[0]}};
  out[0].dtype = in[0].dtype;
  return NULL;
}

static double flops_linear(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                           const stoke_value_desc_v1 *out) {
  /* 2 per multiply-add; the bias add is counted too (N*out) */
  return 2.0 * (double)in[0].shape.d[0] * (double)in[1].shape.d[0] * (double)in[1].shape.d[1] +
         (double)stoke_numel(&out[0].shape);
}

/* the linear's FLOPs plus one per output for the ReLU, as the two nodes */
static double flops_linear_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                const stoke_value_desc_v1 *out) {
  return flops_linear(n, in, out) + (double)stoke_numel(&out[0].shape);
}

static stoke_err *infer_same(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                             stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static double flops_elementwise(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                const stoke_value_desc_v1 *out) {
  return (double)stoke_numel(&out[0].shape);
}

/* gelu's approximate, and linear_act's activation: checked once here, so
 * kernels only strcmp known values. */
static stoke_err *check_approximate(const stoke_node_v1 *n, const char *s) {
  if (strcmp(s, "none") && strcmp(s, "tanh"))
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': approximate = '%s', expected none or tanh (as nn.GELU)", n->op,
                     n->name, s);
  return NULL;
}

static stoke_err *infer_gelu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(check_approximate(n, n->attrs[STOKE_GELU_APPROXIMATE].s));
  out[0] = in[0];
  return NULL;
}

/* y as linear's; aux as stoke/ops.h says (a bitmask for relu, z for gelu) */
static stoke_err *infer_linear_act(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                   stoke_value_desc_v1 *out) {
  const char *act = n->attrs[STOKE_LINEAR_ACT_ACT].s;
  if (strcmp(act, "relu") && strcmp(act, "gelu"))
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': act = '%s', expected relu or gelu", n->op, n->name, act);
  STOKE_PROPAGATE(check_approximate(n, n->attrs[STOKE_LINEAR_ACT_APPROXIMATE].s));
  STOKE_PROPAGATE(infer_linear(n, in, out));
  int64_t rows = out[0].shape.d[0], cols = out[0].shape.d[1];
  if (!strcmp(act, "relu")) out[1] = (stoke_value_desc_v1){{2, {rows, (cols + 127) / 128 * 16}}, STOKE_U8};
  else out[1] = out[0];
  return NULL;
}

/* The linear's FLOPs plus one per output for the activation, as the
 * elementwise node it replaces counts. */
static double flops_linear_act(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                               const stoke_value_desc_v1 *out) {
  return flops_linear(n, in, out) + (double)stoke_numel(&out[0].shape);
}

/* linear_dact is made by the compiler from nodes already inferred. */
static stoke_err *infer_compiler_only(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                      stoke_value_desc_v1 *out) {
  return STOKE_ERR(STOKE_E_INVALID, "node '%s': op '%s' is made by the compiler, not by models", n->name, n->op);
}

static stoke_err *infer_add(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                            stoke_value_desc_v1 *out) {
  const stoke_shape *a = &in[0].shape, *b = &in[1].shape;
  if (a->ndim != b->ndim || memcmp(a->d, b->d, sizeof(int64_t) * (size_t)a->ndim))
    return STOKE_ERR(STOKE_E_INVALID, "add '%s': the two inputs have different shapes", n->name);
  out[0] = in[0];
  return NULL;
}

static stoke_err *infer_softmax_ce(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                   stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape, *y = &in[1].shape;
  if (x->ndim != 2 || y->ndim != 1 || y->d[0] != x->d[0] || in[1].dtype != STOKE_I32)
    return STOKE_ERR(STOKE_E_INVALID,
                     "softmax_ce '%s': expects logits[N, C] and i32 labels[N]", n->name);
  double ls = n->attrs[STOKE_SOFTMAX_CE_LABEL_SMOOTHING].f;
  if (!(ls >= 0 && ls < 1)) /* NaN fails too */
    return STOKE_ERR(STOKE_E_INVALID, "softmax_ce '%s': label_smoothing %g not in [0, 1)",
                     n->name, ls);
  out[0].shape = (stoke_shape){1, {1}};
  out[0].dtype = in[0].dtype == STOKE_F64 ? STOKE_F64 : STOKE_F32;
  out[1].shape = (stoke_shape){1, {x->d[0]}}; /* each row's log-sum-exp, for the backward */
  out[1].dtype = out[0].dtype;
  return NULL;
}

static double flops_softmax_ce(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                               const stoke_value_desc_v1 *out) {
  return 5.0 * (double)stoke_numel(&in[0].shape); /* max, sub, exp, sum, log */
}

static stoke_err *infer_cast(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                             stoke_value_desc_v1 *out) {
  const char *t = n->attrs[STOKE_CAST_DTYPE].s;
  out[0].shape = in[0].shape;
  out[0].dtype = !strcmp(t, "bf16") ? STOKE_BF16 : !strcmp(t, "f16") ? STOKE_F16 : !strcmp(t, "f64") ? STOKE_F64 : STOKE_F32;
  if (strcmp(t, "f32") && strcmp(t, "bf16") && strcmp(t, "f16") && strcmp(t, "f64"))
    return STOKE_ERR(STOKE_E_INVALID, "cast '%s': dtype must be f32, bf16, f16 or f64", n->name);
  if (in[0].dtype != STOKE_F32 && in[0].dtype != STOKE_F64)
    return STOKE_ERR(STOKE_E_INVALID, "cast '%s': the input must be f32 or f64", n->name);
  return NULL;
}

/* autocast: a float to another float dtype, same shape (its layout is
 * the input's; the compiler sets it). */
static stoke_err *infer_autocast(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  static const stoke_dtype floats[] = {STOKE_F32, STOKE_BF16, STOKE_F16, STOKE_F64};
  const char *t = n->attrs[STOKE_AUTOCAST_DTYPE].s;
  int to = -1, from = 0;
  for (int i = 0; i < 4; i++) {
    if (!strcmp(t, stoke_dtype_name(floats[i]))) to = i;
    from |= in[0].dtype == floats[i];
  }
  if (to < 0 || !from)
    return STOKE_ERR(STOKE_E_INVALID, "autocast '%s': %s to '%s'; both must be f32, bf16, f16 or f64", n->name,
                     stoke_dtype_name(in[0].dtype), t);
  out[0].shape = in[0].shape;
  out[0].dtype = floats[to];
  return NULL;
}

static const stoke_attr_decl_v1 autocast_attrs[] = {
    {"dtype", STOKE_ATTR_STR, "f32", "the output's dtype"},
};

static const stoke_attr_decl_v1 cast_attrs[] = {
    {"dtype", STOKE_ATTR_STR, "f32", "the output's dtype"},
};

static const stoke_attr_decl_v1 gelu_attrs[] = {
    {"approximate", STOKE_ATTR_STR, "none", "none: exact (erf); tanh: the tanh approximation (nn.GELU's)"},
};

static const stoke_attr_decl_v1 linear_act_attrs[] = {
    {"act", STOKE_ATTR_STR, "relu", "the activation: relu or gelu"},
    {"approximate", STOKE_ATTR_STR, "none", "gelu's: none or tanh"},
};

static const stoke_attr_decl_v1 softmax_ce_attrs[] = {
    {"label_smoothing", STOKE_ATTR_FLOAT, "0", "mix the one-hot target with uniform (0 = off)"},
};

static const stoke_op_type_v1 ops[] = {
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_LINEAR, "fully connected layer, y = x W^T + b (nn.Linear)", 3, 1, NULL, 0,
     infer_linear, flops_linear, STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_LINEAR_RELU, "linear then ReLU, fused by the compiler", 3, 1, NULL, 0, infer_linear,
     flops_linear_relu, STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_OUTPUT(0), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_RELU, "max(x, 0)", 1, 1, NULL, 0, infer_same, flops_elementwise,
     STOKE_BWD_NEEDS_OUTPUT(0), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_GELU, "x Phi(x) (nn.GELU)", 1, 1, gelu_attrs, 1, infer_gelu, flops_elementwise,
     STOKE_BWD_NEEDS_INPUT(0), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_LINEAR_ACT, "linear then relu/gelu, fused by the compiler (aux output for the gradient)", 3, 2,
     linear_act_attrs, 2, infer_linear_act, flops_linear_act,
     STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_OUTPUT(1), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_LINEAR_DACT, "linear backward with the previous activation's gradient (compiler-made)", 5, 1,
     linear_act_attrs, 2, infer_compiler_only, NULL,
     STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_INPUT(3), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_ADD, "a + b (residual)", 2, 1, NULL, 0, infer_add, flops_elementwise, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_CAST, "float conversion of the input batch", 1, 1, cast_attrs, 1, infer_cast, NULL, 0, 1u, 0},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_SOFTMAX_CE, "softmax cross-entropy, mean over the batch (nn.CrossEntropyLoss)", 2,
     2, softmax_ce_attrs, 1, infer_softmax_ce, flops_softmax_ce,
     STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_OUTPUT(1), 1u << 1, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_AUTOCAST, "a float in another dtype, around ops kept in fp32 (compiler-made)",
     1, 1, autocast_attrs, 1, infer_autocast, NULL, STOKE_BWD_NEEDS_NOTHING, 0, 1},
};

/* The built-in precision policies, registered like a plugin's. No fp32
 * islands: their kernels accumulate statistics, norms and the loss in f32
 * inside (a policy from a plugin can keep whole ops in f32: fp32_ops). */
static const stoke_precision_v1 precisions[] = {
    {STOKE_ABI(stoke_precision_v1), "fp32", "float32 everywhere, TF32 off", STOKE_F32, STOKE_F32, STOKE_F32, 0,
     STOKE_SCALING_NONE, 1, 0, "", 0, 0},
    {STOKE_ABI(stoke_precision_v1), "tf32", "float32 tensors, TF32 tensor-core matmul/conv", STOKE_F32, STOKE_F32,
     STOKE_F32, 1, STOKE_SCALING_NONE, 1, 0, "", 0, 0},
    {STOKE_ABI(stoke_precision_v1), "bf16", "bf16 compute, fp32 master weights (autocast-like)", STOKE_BF16,
     STOKE_BF16, STOKE_F32, 1, STOKE_SCALING_NONE, 1, 0, "", 0, 0},
    {STOKE_ABI(stoke_precision_v1), "fp16", "fp16 compute, fp32 master weights, dynamic loss scaler", STOKE_F16,
     STOKE_F16, STOKE_F32, 1, STOKE_SCALING_DYNAMIC, 65536.0, 2000, "", 2, 0.5},
};

/* The single-process comm: world of one, every collective a no-op. */
static stoke_err *single_open(const stoke_cfg *c, const stoke_comm_place_v1 *place, void **self) {
  *self = NULL;
  return NULL;
}
static void single_close(void *self) {}
static stoke_err *single_all_reduce(void *self, void *buf, size_t count, stoke_dtype t,
                                    stoke_reduce_op op, void *stream) {
  return NULL;
}
static stoke_err *single_broadcast(void *self, void *buf, size_t count, stoke_dtype t, int root,
                                   void *stream) {
  return NULL;
}
static stoke_err *single_barrier(void *self) { return NULL; }

static const stoke_comm_v1 single_comm = {
    STOKE_ABI(stoke_comm_v1), "single", "one process, one device (the default)", single_open, single_close,
    single_all_reduce, single_broadcast, single_barrier};

stoke_err *stoke_register_optimizers(const stoke_registry_v1 *r); /* core/optimizers.c */

/* The compiler's fusion patterns (core/plan.c applies every registered
 * one, these and plugins' alike; see stoke_fusion_v1). */
#define FUSION(NAME, HELP, HEAD, TAIL, FUSED, ADD, GPU_OWN) \
  {STOKE_ABI(stoke_fusion_v1), NAME, HELP, HEAD, TAIL, FUSED, ADD, GPU_OWN}
static const stoke_fusion_v1 fusions[] = {
    FUSION("linear_relu", "the ReLU in the matmul's epilogue (cublaslt)", STOKE_OP_LINEAR, STOKE_OP_RELU,
           STOKE_OP_LINEAR_RELU, 0, 0),
    FUSION("bn_relu", "batch norm and ReLU in one pass each way (fused)", STOKE_OP_BATCH_NORM, STOKE_OP_RELU,
           STOKE_OP_BN_RELU, 0, 1),
    FUSION("bn_add_relu", "a ResNet block's tail in one pass each way (fused)", STOKE_OP_BATCH_NORM, STOKE_OP_RELU,
           STOKE_OP_BN_ADD_RELU, 1, 1),
};

static stoke_err *builtin_register(const stoke_host_v1 *host, const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) STOKE_PROPAGATE(r->add_op(r->self, &ops[i]));
  for (size_t i = 0; i < sizeof precisions / sizeof *precisions; i++) {
    STOKE_PROPAGATE(r->add_precision(r->self, &precisions[i]));
  }
  STOKE_PROPAGATE(r->add_comm(r->self, &single_comm));
  STOKE_PROPAGATE(stoke_register_conv_ops(r));
  STOKE_PROPAGATE(stoke_register_pool_ops(r));
  STOKE_PROPAGATE(stoke_register_norm_ops(r));
  STOKE_PROPAGATE(stoke_register_optimizers(r));
  STOKE_PROPAGATE(stoke_register_seq_ops(r));
  STOKE_PROPAGATE(stoke_register_convbn_ops(r));
  for (size_t i = 0; i < sizeof fusions / sizeof *fusions; i++) STOKE_PROPAGATE(r->add_fusion(r->self, &fusions[i]));
  return NULL;
}

const stoke_plugin_v1 stoke_builtin_plugin = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1),
                                              "core", "built-in op types, precisions, comm",
                                              builtin_register};
