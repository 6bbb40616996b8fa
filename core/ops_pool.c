/* core/ops_pool.c: built-in op types (shape inference, FLOPs, what backward
 * reads); see stoke/ops.h. */
#include <stdio.h>

#include "stoke/core.h"
#include "stoke/ops.h"
#include "ops_cnn.h"

/* ---------------------------------------------------- max_pool2d, avg_pool2d */

#define OPN(n) ((n)->op ? (n)->op : "pool")

/* Kernel, stride and padding of a pool node, per dimension (h, w). */
typedef struct pool_geom {
  int64_t k[2], s[2], p[2];
} pool_geom;

/* One INTS attribute as (h, w): one value applies to both dims. */
static stoke_err *pool_pair(const stoke_node_v1 *n, int idx, const char *what, int64_t out[2]) {
  if (n->n_attrs <= idx)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': attribute %s missing", OPN(n), n->name, what);
  const stoke_attr_v1 *a = &n->attrs[idx];
  if (a->n != 1 && a->n != 2)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': %s takes 1 or 2 integers (like 3 or 3x2), got %d",
                     OPN(n), n->name, what, a->n);
  out[0] = a->ints[0];
  out[1] = a->n == 2 ? a->ints[1] : a->ints[0];
  return NULL;
}

static stoke_err *pool_geometry(const stoke_node_v1 *n, pool_geom *g) {
  STOKE_PROPAGATE(pool_pair(n, STOKE_POOL_KERNEL, "kernel", g->k));
  STOKE_PROPAGATE(pool_pair(n, STOKE_POOL_STRIDE, "stride", g->s));
  STOKE_PROPAGATE(pool_pair(n, STOKE_POOL_PADDING, "padding", g->p));
  for (int d = 0; d < 2; d++) {
    if (g->k[d] < 1)
      return STOKE_ERR(STOKE_E_INVALID, "%s '%s': kernel %lldx%lld must be >= 1", OPN(n), n->name,
                       (long long)g->k[0], (long long)g->k[1]);
    if (g->s[d] < 0)
      return STOKE_ERR(STOKE_E_INVALID, "%s '%s': stride %lldx%lld must be >= 1 (0 = kernel)",
                       OPN(n), n->name, (long long)g->s[0], (long long)g->s[1]);
    if (g->s[d] == 0) g->s[d] = g->k[d];
    if (g->p[d] < 0 || g->p[d] > g->k[d] / 2)
      return STOKE_ERR(STOKE_E_INVALID,
                       "%s '%s': padding %lldx%lld must be >= 0 and at most half the kernel "
                       "%lldx%lld",
                       OPN(n), n->name, (long long)g->p[0], (long long)g->p[1], (long long)g->k[0],
                       (long long)g->k[1]);
  }
  return NULL;
}

static stoke_err *infer_pool(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                             stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape;
  if (x->ndim != 4)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': expects x[N, C, H, W], got a %d-D input", OPN(n),
                     n->name, x->ndim);
  if (in[0].dtype != STOKE_F32 && in[0].dtype != STOKE_F64 && in[0].dtype != STOKE_F16 &&
      in[0].dtype != STOKE_BF16)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': input dtype %s is not a float type", OPN(n),
                     n->name, stoke_dtype_name(in[0].dtype));
  pool_geom g;
  STOKE_PROPAGATE(pool_geometry(n, &g));
  int64_t o[2];
  for (int d = 0; d < 2; d++) {
    int64_t padded = x->d[2 + d] + 2 * g.p[d];
    if (padded < g.k[d])
      return STOKE_ERR(STOKE_E_INVALID,
                       "%s '%s': kernel %lldx%lld is larger than the padded input %lldx%lld "
                       "(input [%lld, %lld, %lld, %lld], padding %lldx%lld)",
                       OPN(n), n->name, (long long)g.k[0], (long long)g.k[1],
                       (long long)(x->d[2] + 2 * g.p[0]), (long long)(x->d[3] + 2 * g.p[1]),
                       (long long)x->d[0], (long long)x->d[1], (long long)x->d[2],
                       (long long)x->d[3], (long long)g.p[0], (long long)g.p[1]);
    o[d] = (padded - g.k[d]) / g.s[d] + 1;
  }
  out[0].shape = (stoke_shape){4, {x->d[0], x->d[1], o[0], o[1]}};
  out[0].dtype = in[0].dtype;
  return NULL;
}

/* max_pool2d_idx: max_pool2d's y, then the u8 index of y's shape */
static stoke_err *infer_pool_idx(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                 stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(infer_pool(n, in, out));
  pool_geom g;
  STOKE_PROPAGATE(pool_geometry(n, &g));
  if (g.k[0] * g.k[1] > STOKE_POOL_MAX_INDEX)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s '%s': a %lldx%lld window has more than %d positions, too many for a one-byte index; "
                     "use max_pool2d",
                     OPN(n), n->name, (long long)g.k[0], (long long)g.k[1], STOKE_POOL_MAX_INDEX);
  out[1] = (stoke_value_desc_v1){out[0].shape, STOKE_U8};
  return NULL;
}

/* One comparison or add per window element. */
static double flops_pool(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                         const stoke_value_desc_v1 *out) {
  pool_geom g;
  stoke_err *e = pool_geometry(n, &g);
  if (e) {
    stoke_err_free(e);
    return 0;
  }
  return (double)stoke_numel(&out[0].shape) * (double)(g.k[0] * g.k[1]);
}

static const stoke_attr_decl_v1 pool_attrs[] = {
    /* in the order of STOKE_POOL_KERNEL, _STRIDE, _PADDING */
    {"kernel", STOKE_ATTR_INTS, NULL, "window, 3 or 3x2 (h x w); required"},
    {"stride", STOKE_ATTR_INTS, "0", "step, 2 or 2x1; 0 = the kernel"},
    {"padding", STOKE_ATTR_INTS, "0", "implicit padding each side, at most kernel/2"},
};

/* ---------------------------------------------------------------- dropout */

static stoke_err *infer_dropout(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                stoke_value_desc_v1 *out) {
  if (n->n_attrs <= STOKE_DROPOUT_P)
    return STOKE_ERR(STOKE_E_INVALID, "dropout '%s': attribute p missing", n->name);
  double p = n->attrs[STOKE_DROPOUT_P].f;
  if (!(p >= 0 && p < 1))
    return STOKE_ERR(STOKE_E_INVALID, "dropout '%s': p = %g not in [0, 1)", n->name, p);
  out[0] = in[0];
  return NULL;
}

static double flops_dropout(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                            const stoke_value_desc_v1 *out) {
  return (double)stoke_numel(&out[0].shape);
}

static const stoke_attr_decl_v1 dropout_attrs[] = {
    {"p", STOKE_ATTR_FLOAT, "0.5", "probability of zeroing an element in training, [0, 1)"},
};

static const stoke_op_type_v1 pool_ops[] = {
    /* max backward recomputes each window's first maximum from x */
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_MAX_POOL2D, "max pooling (nn.MaxPool2d, floor mode, -inf padding)", 1, 1,
     pool_attrs, 3, infer_pool, flops_pool, STOKE_BWD_NEEDS_INPUT(0), 0, 1},
    /* backward reads the forward's window indices (output 1), not x */
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_MAX_POOL2D_IDX,
     "max pooling that saves each window's argmax for backward (put in place of max_pool2d by the compiler)", 1, 2,
     pool_attrs, 3, infer_pool_idx, flops_pool, STOKE_BWD_NEEDS_OUTPUT(1), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_AVG_POOL2D, "average pooling (nn.AvgPool2d, count_include_pad, floor mode)", 1, 1,
     pool_attrs, 3, infer_pool, flops_pool, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    /* backward regenerates the mask from the seed: reads nothing */
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_DROPOUT, "inverted dropout (nn.Dropout); identity in eval", 1, 1, dropout_attrs, 1,
     infer_dropout, flops_dropout, STOKE_BWD_NEEDS_NOTHING, 0, 1},
};

stoke_err *stoke_register_pool_ops(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof pool_ops / sizeof *pool_ops; i++)
    STOKE_PROPAGATE(r->add_op(r->self, &pool_ops[i]));
  return NULL;
}
