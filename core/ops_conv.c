/* core/ops_conv.c: built-in op types (shape inference, FLOPs, what backward
 * reads); see stoke/ops.h. conv2d, bias_add, flatten, global_avg_pool.
 * Shapes are logical (N, C, H, W) whatever the memory layout. */
#include <stdio.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/ops.h"
#include "ops_cnn.h"

/* ---------------------------------------------------------------- conv2d */

/* The (h, w) pair of an ints attribute: "2" is (2, 2), "2x1" is (2, 1); an
 * attribute the node does not carry (or an empty one) takes `def`. */
static stoke_err *conv_pair(const stoke_node_v1 *n, int idx, const char *what, int64_t def,
                            int64_t min, int64_t out[2]) {
  out[0] = out[1] = def;
  if (n->n_attrs > idx) {
    const stoke_attr_v1 *a = &n->attrs[idx];
    if (a->n == 1) {
      out[0] = out[1] = a->ints[0];
    } else if (a->n == 2) {
      out[0] = a->ints[0];
      out[1] = a->ints[1];
    } else if (a->n != 0) {
      return STOKE_ERR(STOKE_E_INVALID,
                       "%s '%s': %s has %d values; give one (both dims) or two (HxW)",
                       n->op, n->name, what, a->n);
    }
  }
  if (out[0] < min || out[1] < min)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': %s %lldx%lld, each must be >= %lld", n->op, n->name,
                     what, (long long)out[0], (long long)out[1], (long long)min);
  return NULL;
}

typedef struct conv_geom {
  int64_t stride[2], pad[2], dil[2], groups;
  int64_t ho, wo;
} conv_geom;

static stoke_err *conv_geometry(const stoke_node_v1 *n, const stoke_shape *x,
                                const stoke_shape *w, conv_geom *g) {
  if (x->ndim != 4 || w->ndim != 4)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s '%s': expects x[N, C, H, W] and weight[O, C/groups, kh, kw]; got "
                     "x %s, weight %s",
                     n->op, n->name, stoke_shape_str(x).s, stoke_shape_str(w).s);
  STOKE_PROPAGATE(conv_pair(n, STOKE_CONV2D_STRIDE, "stride", 1, 1, g->stride));
  STOKE_PROPAGATE(conv_pair(n, STOKE_CONV2D_PADDING, "padding", 0, 0, g->pad));
  STOKE_PROPAGATE(conv_pair(n, STOKE_CONV2D_DILATION, "dilation", 1, 1, g->dil));
  g->groups = n->n_attrs > STOKE_CONV2D_GROUPS ? n->attrs[STOKE_CONV2D_GROUPS].i : 1;
  if (g->groups < 1)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': groups %lld must be >= 1", n->op, n->name,
                     (long long)g->groups);
  for (int i = 0; i < 4; i++)
    if (x->d[i] < 0 || w->d[i] < 1 || (i && x->d[i] < 1))
      return STOKE_ERR(STOKE_E_INVALID, "%s '%s': empty dimension in x %s or weight %s",
                       n->op, n->name, stoke_shape_str(x).s, stoke_shape_str(w).s);
  int64_t c = x->d[1], o = w->d[0];
  if (c % g->groups || o % g->groups)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s '%s': groups %lld must divide both the %lld input channels of x %s "
                     "and the %lld output channels of weight %s",
                     n->op, n->name, (long long)g->groups, (long long)c, stoke_shape_str(x).s, (long long)o,
                     stoke_shape_str(w).s);
  if (w->d[1] != c / g->groups)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s '%s': weight %s should have C/groups = %lld/%lld = %lld input "
                     "channels (x is %s)",
                     n->op, n->name, stoke_shape_str(w).s, (long long)c, (long long)g->groups,
                     (long long)(c / g->groups), stoke_shape_str(x).s);
  int64_t span_h = g->dil[0] * (w->d[2] - 1) + 1, span_w = g->dil[1] * (w->d[3] - 1) + 1;
  int64_t eh = x->d[2] + 2 * g->pad[0] - span_h, ew = x->d[3] + 2 * g->pad[1] - span_w;
  if (eh < 0 || ew < 0)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s '%s': the %lldx%lld kernel (dilation %lldx%lld) does not fit x %s "
                     "padded by %lldx%lld: output size would be < 1",
                     n->op, n->name, (long long)w->d[2], (long long)w->d[3], (long long)g->dil[0],
                     (long long)g->dil[1], stoke_shape_str(x).s, (long long)g->pad[0],
                     (long long)g->pad[1]);
  g->ho = eh / g->stride[0] + 1;
  g->wo = ew / g->stride[1] + 1;
  return NULL;
}

stoke_err *stoke_conv2d_infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  conv_geom g;
  STOKE_PROPAGATE(conv_geometry(n, &in[0].shape, &in[1].shape, &g));
  out[0].shape = (stoke_shape){4, {in[0].shape.d[0], in[1].shape.d[0], g.ho, g.wo}};
  out[0].dtype = in[0].dtype;
  return NULL;
}

double stoke_conv2d_flops(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out) {
  const stoke_shape *w = &in[1].shape, *y = &out[0].shape;
  /* 2 N O Ho Wo (C/groups) kh kw; weight's d[1] is C/groups */
  return 2.0 * (double)y->d[0] * (double)y->d[1] * (double)y->d[2] * (double)y->d[3] *
         (double)w->d[1] * (double)w->d[2] * (double)w->d[3];
}

static const stoke_attr_decl_v1 conv2d_attrs[] = {
    /* in the order of the STOKE_CONV2D_* indices */
    {"stride", STOKE_ATTR_INTS, "1", "stride, one value or HxW"},
    {"padding", STOKE_ATTR_INTS, "0", "zero padding on each side, one value or HxW"},
    {"dilation", STOKE_ATTR_INTS, "1", "spacing of the kernel taps, one value or HxW"},
    {"groups", STOKE_ATTR_INT, "1", "channel groups (C for depthwise)"},
};

/* -------------------------------------------------------------- bias_add */

static stoke_err *infer_bias_add(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                 stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape, *b = &in[1].shape;
  if (x->ndim < 2 || b->ndim != 1 || b->d[0] != x->d[1])
    return STOKE_ERR(STOKE_E_INVALID,
                     "bias_add '%s': expects x[N, C, ...] and bias[C]; got x %s, bias %s",
                     n->name, stoke_shape_str(x).s, stoke_shape_str(b).s);
  out[0] = in[0];
  return NULL;
}

static double flops_numel_in(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                             const stoke_value_desc_v1 *out) {
  return (double)stoke_numel(&in[0].shape);
}

/* --------------------------------------------------------------- flatten */

static stoke_err *infer_flatten(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape;
  if (x->ndim < 2)
    return STOKE_ERR(STOKE_E_INVALID, "flatten '%s': expects x[N, ...] of 2 or more dims, got %s",
                     n->name, stoke_shape_str(x).s);
  int64_t rest = 1;
  for (int i = 1; i < x->ndim; i++) rest *= x->d[i];
  out[0].shape = (stoke_shape){2, {x->d[0], rest}};
  out[0].dtype = in[0].dtype;
  return NULL;
}

static double flops_none(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                         const stoke_value_desc_v1 *out) {
  return 0;
}

/* ------------------------------------------------------- global_avg_pool */

static stoke_err *infer_global_avg_pool(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                        stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape;
  if (x->ndim != 4 || x->d[2] < 1 || x->d[3] < 1)
    return STOKE_ERR(STOKE_E_INVALID,
                     "global_avg_pool '%s': expects x[N, C, H, W] with H, W >= 1, got %s",
                     n->name, stoke_shape_str(x).s);
  out[0].shape = (stoke_shape){2, {x->d[0], x->d[1]}};
  out[0].dtype = in[0].dtype;
  return NULL;
}

/* ----------------------------------------------------------------- table */

static const stoke_op_type_v1 conv_ops[] = {
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_CONV2D, "2-D convolution without bias (nn.Conv2d(bias=False))", 2, 1,
     conv2d_attrs, (int)(sizeof conv2d_attrs / sizeof *conv2d_attrs), stoke_conv2d_infer,
     stoke_conv2d_flops, STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_BIAS_ADD, "x + bias per channel (dim 1), the conv bias", 2, 1, NULL, 0,
     infer_bias_add, flops_numel_in, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_FLATTEN, "[N, ...] -> [N, prod(...)] in logical (C, H, W) order", 1, 1, NULL, 0,
     infer_flatten, flops_none, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_GLOBAL_AVG_POOL, "mean over H and W: [N, C, H, W] -> [N, C]", 1, 1, NULL, 0,
     infer_global_avg_pool, flops_numel_in, STOKE_BWD_NEEDS_NOTHING, 0, 1},
};

stoke_err *stoke_register_conv_ops(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof conv_ops / sizeof *conv_ops; i++)
    STOKE_TRY(r->add_op(r->self, &conv_ops[i]), "registering op %s", conv_ops[i].name);
  return NULL;
}
