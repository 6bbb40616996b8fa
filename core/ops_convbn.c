/* core/ops_convbn.c: built-in op types of batch norm folded into
 * convolutions (conv_bn, bn_relu_conv_bn, bn_apply, bn_apply_relu,
 * bn_apply_add_relu; stoke/ops.h): shape inference, FLOPs, what backward reads. */
#include <stdio.h>
#include <string.h>

#include "ops_cnn.h"
#include "stoke/core.h"
#include "stoke/ops.h"

/* The statistics' dtype: f64 for f64 values, f32 else. */
static stoke_dtype stat_dtype(stoke_dtype x) { return x == STOKE_F64 ? STOKE_F64 : STOKE_F32; }

/* Input i must be a vector [len] of dtype dt: `what` names it, `why` says
 * where len comes from. */
static stoke_err *check_vec(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, int i, const char *what,
                            int64_t len, stoke_dtype dt, const char *why) {
  const stoke_value_desc_v1 *v = &in[i];
  if (v->shape.ndim == 1 && v->shape.d[0] == len && v->dtype == dt) return NULL;
  return STOKE_ERR(STOKE_E_INVALID, "%s '%s': %s (input %d) is %s %s; it must be [%lld] %s (%s)", n->op, n->name,
                   what, i, stoke_shape_str(&v->shape).s, stoke_dtype_name(v->dtype), (long long)len,
                   stoke_dtype_name(dt), why);
}

/* eps > 0 and momentum in [0, 1], at attributes eps_at and eps_at + 1. */
static stoke_err *check_eps_momentum(const stoke_node_v1 *n, int eps_at) {
  double eps = n->attrs[eps_at].f, mom = n->attrs[eps_at + 1].f;
  if (eps > 0 && mom >= 0 && mom <= 1) return NULL;
  return STOKE_ERR(STOKE_E_INVALID, "%s '%s': eps %g must be > 0 and momentum %g in [0, 1]", n->op, n->name, eps,
                   mom);
}

/* y = conv2d(in[x_at], in[w_at]) and the statistics outputs, with the
 * running statistics at run_at, run_at + 1: [K] of the statistics' dtype. */
static stoke_err *infer_conv_stats(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, int x_at, int w_at,
                                   int run_at, stoke_value_desc_v1 *out) {
  stoke_value_desc_v1 xw[2] = {in[x_at], in[w_at]};
  STOKE_PROPAGATE(stoke_conv2d_infer(n, xw, out));
  if (in[w_at].dtype != in[x_at].dtype)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': the weight is %s, x is %s: they must have one dtype", n->op,
                     n->name, stoke_dtype_name(in[w_at].dtype), stoke_dtype_name(in[x_at].dtype));
  int64_t k = in[w_at].shape.d[0];
  stoke_dtype sd = stat_dtype(in[x_at].dtype);
  const char *why = "one per output channel of the weight";
  STOKE_PROPAGATE(check_vec(n, in, run_at, "running_mean", k, sd, why));
  STOKE_PROPAGATE(check_vec(n, in, run_at + 1, "running_var", k, sd, why));
  STOKE_PROPAGATE(check_eps_momentum(n, STOKE_CONV_BN_EPS));
  out[1] = out[2] = (stoke_value_desc_v1){{1, {k}}, sd};
  return NULL;
}

/* The normalized value's statistics and affine parameters at in[at..at+3]
 * (mean, invstd, weight, bias) for x = in[0] of (N, C, ...). */
static stoke_err *check_affine(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, int at, const char *pre,
                               const char *x_name) {
  const stoke_value_desc_v1 *x = &in[0];
  if (x->shape.ndim < 2)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': %s must be (N, C, ...), got %s", n->op, n->name, x_name,
                     stoke_shape_str(&x->shape).s);
  int64_t c = x->shape.d[1];
  static const char *const names[] = {"mean", "invstd", "weight", "bias"};
  char what[32], why[64];
  snprintf(why, sizeof why, "one per channel of %s", x_name);
  for (int i = 0; i < 4; i++) {
    snprintf(what, sizeof what, "%s%s", pre, names[i]);
    STOKE_PROPAGATE(check_vec(n, in, at + i, what, c, i < 2 ? stat_dtype(x->dtype) : x->dtype, why));
  }
  return NULL;
}

static stoke_err *infer_conv_bn(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  return infer_conv_stats(n, in, 0, 1, STOKE_CONV_BN_RUNNING_MEAN, out);
}

static stoke_err *infer_bn_relu_conv_bn(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                        stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(check_affine(n, in, STOKE_BN_RELU_CONV_BN_P_MEAN, "p_", "p"));
  return infer_conv_stats(n, in, 0, STOKE_BN_RELU_CONV_BN_WEIGHT, STOKE_BN_RELU_CONV_BN_RUNNING_MEAN, out);
}

static stoke_err *infer_apply(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(check_affine(n, in, STOKE_BN_APPLY_MEAN, "", "y"));
  out[0] = in[0];
  return NULL;
}

static stoke_err *infer_apply_add(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(infer_apply(n, in, out));
  const stoke_value_desc_v1 *y = &in[0], *r = &in[STOKE_BN_APPLY_RESIDUAL];
  if (r->shape.ndim != y->shape.ndim || memcmp(r->shape.d, y->shape.d, sizeof(int64_t) * (size_t)y->shape.ndim) ||
      r->dtype != y->dtype)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': the residual is %s %s; it must have y's shape and dtype, %s %s",
                     n->op, n->name, stoke_shape_str(&r->shape).s, stoke_dtype_name(r->dtype),
                     stoke_shape_str(&y->shape).s, stoke_dtype_name(y->dtype));
  return NULL;
}

/* FLOPs: the convolution's, 2 per output element for the statistics (sum
 * and sum of squares), and per normalized element 2 for scale and shift,
 * 1 for the ReLU, 1 for the add: conv_bn + an apply op count what conv2d +
 * batch_norm (4 per element) [+ relu] [+ add] count. */
static double numel_of(const stoke_value_desc_v1 *v) { return (double)stoke_numel(&v->shape); }

static double flops_conv_bn(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out) {
  return stoke_conv2d_flops(n, in, out) + 2 * numel_of(&out[0]);
}

static double flops_bn_relu_conv_bn(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                    const stoke_value_desc_v1 *out) {
  stoke_value_desc_v1 xw[2] = {in[0], in[STOKE_BN_RELU_CONV_BN_WEIGHT]};
  return stoke_conv2d_flops(n, xw, out) + 3 * numel_of(&in[0]) + 2 * numel_of(&out[0]);
}

static double flops_apply(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out) {
  return 2 * numel_of(&in[0]);
}

static double flops_apply_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                               const stoke_value_desc_v1 *out) {
  return 3 * numel_of(&in[0]);
}

static double flops_apply_add_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                   const stoke_value_desc_v1 *out) {
  return 4 * numel_of(&in[0]);
}

static const stoke_attr_decl_v1 convbn_attrs[] = {
    /* conv2d's, at the STOKE_CONV2D_* indices, then the statistics' */
    {"stride", STOKE_ATTR_INTS, "1", "stride, one value or HxW"},
    {"padding", STOKE_ATTR_INTS, "0", "zero padding on each side, one value or HxW"},
    {"dilation", STOKE_ATTR_INTS, "1", "spacing of the kernel taps, one value or HxW"},
    {"groups", STOKE_ATTR_INT, "1", "channel groups (C for depthwise)"},
    {"eps", STOKE_ATTR_FLOAT, "1e-5", "added to the variance of the output statistics"},
    {"momentum", STOKE_ATTR_FLOAT, "0.1", "running statistics update factor (PyTorch's)"},
};
#define N_CONVBN_ATTRS ((int)(sizeof convbn_attrs / sizeof *convbn_attrs))

#define IN_RANGE(k) ((1u << (k)) - 1u) /* STOKE_BWD_NEEDS_INPUT of inputs 0 .. k-1 */

static const stoke_op_type_v1 ops[] = {
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_CONV_BN, "conv2d and the batch statistics of its output (conv -> batch_norm, folded by the compiler)",
     4, 3, convbn_attrs, N_CONVBN_ATTRS, infer_conv_bn, flops_conv_bn, IN_RANGE(2),
     (1u << STOKE_CONV_BN_RUNNING_MEAN) | (1u << STOKE_CONV_BN_RUNNING_VAR), 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BN_RELU_CONV_BN, "conv_bn of relu(bn(p)), the batch norm applied on the fly (folded by the compiler)",
     8, 3, convbn_attrs, N_CONVBN_ATTRS, infer_bn_relu_conv_bn, flops_bn_relu_conv_bn, IN_RANGE(6),
     (1u << STOKE_BN_RELU_CONV_BN_P_MEAN) | (1u << STOKE_BN_RELU_CONV_BN_P_INVSTD) |
         (1u << STOKE_BN_RELU_CONV_BN_RUNNING_MEAN) | (1u << STOKE_BN_RELU_CONV_BN_RUNNING_VAR),
     1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BN_APPLY, "batch norm with given statistics (folded by the compiler)", 5, 1, NULL, 0, infer_apply,
     flops_apply, IN_RANGE(4), (1u << STOKE_BN_APPLY_MEAN) | (1u << STOKE_BN_APPLY_INVSTD), 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BN_APPLY_RELU, "batch norm with given statistics, then ReLU (folded by the compiler)", 5, 1, NULL, 0,
     infer_apply, flops_apply_relu, IN_RANGE(5), (1u << STOKE_BN_APPLY_MEAN) | (1u << STOKE_BN_APPLY_INVSTD), 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BN_APPLY_ADD_RELU,
     "batch norm with given statistics, residual add, ReLU (a ResNet block's tail, folded by the compiler)", 6, 1,
     NULL, 0, infer_apply_add, flops_apply_add_relu, IN_RANGE(6),
     (1u << STOKE_BN_APPLY_MEAN) | (1u << STOKE_BN_APPLY_INVSTD), 1},
};

stoke_err *stoke_register_convbn_ops(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
    STOKE_TRY(r->add_op(r->self, &ops[i]), "registering op %s", ops[i].name);
  return NULL;
}
