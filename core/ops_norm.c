/* core/ops_norm.c: built-in op types batch_norm (with running statistics
 * as STATE inputs), its fused forms bn_relu, bn_add_relu and bn_add_bn_relu, and normalize
 * (u8 images to normalized floats); see stoke/ops.h. */
#include <math.h>
#include <string.h>

#include "ops_cnn.h"
#include "stoke/core.h"
#include "stoke/ops.h"

/* eps > 0 and momentum in [0, 1], written so that NaN fails too */
static int eps_momentum_ok(double eps, double momentum) {
  return eps > 0 && isfinite(eps) && momentum >= 0 && momentum <= 1;
}

static stoke_err *infer_bn(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                           stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape;
  if (x->ndim < 2)
    return STOKE_ERR(STOKE_E_INVALID, "batch_norm '%s': input must be (N, C, ...), got %d-D", n->name,
                     x->ndim);
  int64_t c = x->d[1];
  for (int i = 1; i < 5; i++)
    if (in[i].shape.ndim != 1 || in[i].shape.d[0] != c)
      return STOKE_ERR(STOKE_E_INVALID,
                       "batch_norm '%s': weight, bias, running_mean and running_var must be [%lld]",
                       n->name, (long long)c);
  if (!eps_momentum_ok(n->attrs[STOKE_BATCH_NORM_EPS].f, n->attrs[STOKE_BATCH_NORM_MOMENTUM].f))
    return STOKE_ERR(STOKE_E_INVALID, "batch_norm '%s': eps must be > 0 and momentum in [0, 1]",
                     n->name);
  out[0] = in[0];
  stoke_dtype stat = in[0].dtype == STOKE_F64 ? STOKE_F64 : STOKE_F32;
  out[1] = (stoke_value_desc_v1){{1, {c}}, stat};
  out[2] = (stoke_value_desc_v1){{1, {c}}, stat};
  return NULL;
}

static double flops_bn(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                       const stoke_value_desc_v1 *out) {
  return 4.0 * (double)stoke_numel(&in[0].shape); /* statistics, then scale and shift */
}

/* bn_add_relu: batch_norm's inputs, then the residual r of x's shape */
static stoke_err *infer_bn_add_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                    stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(infer_bn(n, in, out));
  const stoke_shape *x = &in[0].shape, *r = &in[STOKE_BN_ADD_RELU_RESIDUAL].shape;
  if (r->ndim != x->ndim || memcmp(r->d, x->d, sizeof(int64_t) * (size_t)x->ndim) ||
      in[STOKE_BN_ADD_RELU_RESIDUAL].dtype != in[0].dtype)
    return STOKE_ERR(STOKE_E_INVALID, "bn_add_relu '%s': the residual must have x's shape and dtype",
                     n->name);
  out[STOKE_BN_ADD_RELU_MASK] = (stoke_value_desc_v1){{1, {stoke_relu_mask_bytes(stoke_numel(x))}}, STOKE_U8};
  return NULL;
}

/* bn_add_bn_relu: bn_add_relu's inputs (r the shortcut's x), then the
 * shortcut batch norm's weight, bias and running statistics [C]; its
 * saved statistics after bn_add_relu's outputs */
static stoke_err *infer_bn_add_bn_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                       stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(infer_bn_add_relu(n, in, out));
  int64_t c = in[0].shape.d[1];
  for (int i = STOKE_BN2_WEIGHT; i < STOKE_BN2_WEIGHT + 4; i++)
    if (in[i].shape.ndim != 1 || in[i].shape.d[0] != c)
      return STOKE_ERR(STOKE_E_INVALID,
                       "bn_add_bn_relu '%s': the shortcut's weight, bias, running_mean and running_var must be [%lld]",
                       n->name, (long long)c);
  if (!eps_momentum_ok(n->attrs[STOKE_BN2_EPS].f, n->attrs[STOKE_BN2_EPS + 1].f))
    return STOKE_ERR(STOKE_E_INVALID, "bn_add_bn_relu '%s': the shortcut's eps must be > 0 and momentum in [0, 1]",
                     n->name);
  out[STOKE_BN2_SAVED_MEAN] = out[1];
  out[STOKE_BN2_SAVED_MEAN + 1] = out[2];
  return NULL;
}

/* batch_norm's FLOPs, one per output for the ReLU (and one for the add) */
static double flops_bn_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                            const stoke_value_desc_v1 *out) {
  return flops_bn(n, in, out) + (double)stoke_numel(&in[0].shape);
}

static double flops_bn_add_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                const stoke_value_desc_v1 *out) {
  return flops_bn(n, in, out) + 2.0 * (double)stoke_numel(&in[0].shape);
}

static double flops_bn_add_bn_relu(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                   const stoke_value_desc_v1 *out) {
  return 2.0 * flops_bn(n, in, out) + 2.0 * (double)stoke_numel(&in[0].shape);
}

/* batch_norm's attributes are the first two; bn_add_bn_relu's all four */
static const stoke_attr_decl_v1 bn_attrs[] = {
    {"eps", STOKE_ATTR_FLOAT, "1e-5", "added to the variance"},
    {"momentum", STOKE_ATTR_FLOAT, "0.1", "running statistics update factor (PyTorch's)"},
    {"shortcut_eps", STOKE_ATTR_FLOAT, "1e-5", "the shortcut batch norm's eps"},
    {"shortcut_momentum", STOKE_ATTR_FLOAT, "0.1", "the shortcut batch norm's momentum"},
};

static stoke_err *infer_normalize(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                  stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape;
  if (x->ndim != 4 || in[0].dtype != STOKE_U8)
    return STOKE_ERR(STOKE_E_INVALID, "normalize '%s': input must be u8 images (N, C, H, W)", n->name);
  const stoke_attr_v1 *m = &n->attrs[STOKE_NORMALIZE_MEAN], *s = &n->attrs[STOKE_NORMALIZE_STD];
  if ((m->n != 1 && m->n != x->d[1]) || (s->n != 1 && s->n != x->d[1]))
    return STOKE_ERR(STOKE_E_INVALID,
                     "normalize '%s': the images have %lld channel%s, and mean has %d value%s, std %d: give one "
                     "value for every channel, or one per channel (%lld)", n->name, (long long)x->d[1],
                     x->d[1] == 1 ? "" : "s", m->n, m->n == 1 ? "" : "s", s->n, (long long)x->d[1]);
  for (int i = 0; i < s->n; i++)
    if (s->floats[i] <= 0)
      return STOKE_ERR(STOKE_E_INVALID, "normalize '%s': std must be > 0", n->name);
  const char *l = n->attrs[STOKE_NORMALIZE_LAYOUT].s;
  if (strcmp(l, "nchw") && strcmp(l, "nhwc"))
    return STOKE_ERR(STOKE_E_INVALID, "normalize '%s': layout must be nchw or nhwc", n->name);
  const char *dt = n->attrs[STOKE_NORMALIZE_DTYPE].s;
  out[0].shape = *x;
  out[0].dtype = !strcmp(dt, "bf16") ? STOKE_BF16 : !strcmp(dt, "f16") ? STOKE_F16 : STOKE_F32;
  if (strcmp(dt, "f32") && strcmp(dt, "bf16") && strcmp(dt, "f16"))
    return STOKE_ERR(STOKE_E_INVALID, "normalize '%s': dtype must be f32, bf16 or f16", n->name);
  return NULL;
}

static double flops_normalize(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                              const stoke_value_desc_v1 *out) {
  return 2.0 * (double)stoke_numel(&in[0].shape);
}

static const stoke_attr_decl_v1 normalize_attrs[] = {
    {"mean", STOKE_ATTR_FLOATS, "0", "per-channel mean of x/255"},
    {"std", STOKE_ATTR_FLOATS, "1", "per-channel standard deviation of x/255"},
    {"layout", STOKE_ATTR_STR, "nchw", "memory order of the output"},
    {"dtype", STOKE_ATTR_STR, "f32", "dtype of the output"},
};

static const stoke_op_type_v1 ops[] = {
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BATCH_NORM, "batch normalization with running statistics (nn.BatchNorm2d)", 5, 3,
     bn_attrs, 2, infer_bn, flops_bn,
     STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_OUTPUT(1) |
         STOKE_BWD_NEEDS_OUTPUT(2),
     (1u << 3) | (1u << 4), 1},
    /* backward recomputes the ReLU's mask from x, the saved statistics,
     * weight and bias instead of reading y: one tensor less per pass */
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BN_RELU, "batch_norm then ReLU, fused by the compiler", 5, 3, bn_attrs, 2, infer_bn,
     flops_bn_relu,
     STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_INPUT(2) |
         STOKE_BWD_NEEDS_OUTPUT(1) | STOKE_BWD_NEEDS_OUTPUT(2),
     (1u << 3) | (1u << 4), 1},
    /* backward reads the ReLU's bitmask (output 3), not y */
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BN_ADD_RELU, "batch_norm, residual add, ReLU (a ResNet block's tail), fused by the compiler", 6,
     4, bn_attrs, 2, infer_bn_add_relu, flops_bn_add_relu,
     STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_OUTPUT(1) |
         STOKE_BWD_NEEDS_OUTPUT(2) | STOKE_BWD_NEEDS_OUTPUT(STOKE_BN_ADD_RELU_MASK),
     (1u << 3) | (1u << 4), 1},
    /* backward reads both batch norms' x, weight and saved statistics and the mask */
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BN_ADD_BN_RELU,
     "batch_norm, residual add of a second batch_norm, ReLU (a downsampling ResNet block's tail), joined by the compiler",
     10, 6, bn_attrs, 4, infer_bn_add_bn_relu, flops_bn_add_bn_relu,
     STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1) | STOKE_BWD_NEEDS_INPUT(STOKE_BN_ADD_RELU_RESIDUAL) |
         STOKE_BWD_NEEDS_INPUT(STOKE_BN2_WEIGHT) | STOKE_BWD_NEEDS_OUTPUT(1) | STOKE_BWD_NEEDS_OUTPUT(2) |
         STOKE_BWD_NEEDS_OUTPUT(STOKE_BN_ADD_RELU_MASK) | STOKE_BWD_NEEDS_OUTPUT(STOKE_BN2_SAVED_MEAN) |
         STOKE_BWD_NEEDS_OUTPUT(STOKE_BN2_SAVED_MEAN + 1),
     (1u << 3) | (1u << 4) | (1u << (STOKE_BN2_WEIGHT + 2)) | (1u << (STOKE_BN2_WEIGHT + 3)), 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_NORMALIZE, "u8 image to normalized float (ToTensor + Normalize)", 1, 1,
     normalize_attrs, 4, infer_normalize, flops_normalize, 0, 1u << 0, 0},
};

stoke_err *stoke_register_norm_ops(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) STOKE_PROPAGATE(r->add_op(r->self, &ops[i]));
  return NULL;
}
