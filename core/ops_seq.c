/* core/ops_seq.c: the built-in op types of sequence models (embedding,
 * position_embedding, layer_norm, add_layer_norm, attention, matmul) and
 * the views (reshape, slice, split, transpose); see stoke/ops.h. */
#include <math.h>
#include <string.h>

#include "ops_cnn.h"
#include "stoke/core.h"
#include "stoke/ops.h"

/* Statistics and saved tensors are f32, f64 for an f64 graph. */
static stoke_dtype stat_dtype(stoke_dtype x) { return x == STOKE_F64 ? STOKE_F64 : STOKE_F32; }

static int64_t rows_of(const stoke_shape *s) { return s->ndim ? stoke_numel(s) / s->d[s->ndim - 1] : 0; }

static int is_float(stoke_dtype t) {
  return t == STOKE_F32 || t == STOKE_F64 || t == STOKE_BF16 || t == STOKE_F16;
}

/* A dimension attribute, negative counting from the end, as PyTorch. */
static stoke_err *dim_attr(const stoke_node_v1 *n, int64_t d, int ndim, const char *what, int *out) {
  if (d < -ndim || d >= ndim)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': %s = %lld is not a dimension of a %d-D input", n->op, n->name, what,
                     (long long)d, ndim);
  *out = (int)(d < 0 ? d + ndim : d);
  return NULL;
}

/* ---------------------------------------------------------- embeddings */

static stoke_err *infer_embedding(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                  stoke_value_desc_v1 *out) {
  const stoke_shape *w = &in[0].shape, *idx = &in[1].shape;
  if (w->ndim != 2 || in[1].dtype != STOKE_I32 || idx->ndim < 1 || idx->ndim >= STOKE_MAX_DIMS ||
      !is_float(in[0].dtype))
    return STOKE_ERR(STOKE_E_INVALID,
                     "embedding '%s': expects weight[V, C] (float) and i32 indices of 1 to %d dimensions; got a "
                     "%d-D %s weight and %d-D %s indices",
                     n->name, STOKE_MAX_DIMS - 1, w->ndim, stoke_dtype_name(in[0].dtype), idx->ndim,
                     stoke_dtype_name(in[1].dtype));
  out[0].shape = *idx;
  out[0].shape.d[out[0].shape.ndim++] = w->d[1];
  out[0].dtype = in[0].dtype;
  return NULL;
}

static double flops_none(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out) {
  return 0; /* data movement only */
}

static stoke_err *infer_position_embedding(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                           stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape, *w = &in[1].shape;
  if (x->ndim != 3 || w->ndim != 2 || w->d[1] != x->d[2] || w->d[0] < x->d[1] || in[1].dtype != in[0].dtype)
    return STOKE_ERR(STOKE_E_INVALID,
                     "position_embedding '%s': expects x[B, T, C] and weight[P, C] of x's dtype with P >= T "
                     "(the model's context); got x %dD [..., %lld, %lld] and weight [%lld, %lld]",
                     n->name, x->ndim, (long long)(x->ndim > 1 ? x->d[1] : 0),
                     (long long)(x->ndim > 2 ? x->d[2] : 0), (long long)(w->ndim > 0 ? w->d[0] : 0),
                     (long long)(w->ndim > 1 ? w->d[1] : 0));
  out[0] = in[0];
  return NULL;
}

static double flops_elementwise(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                const stoke_value_desc_v1 *out) {
  return (double)stoke_numel(&out[0].shape);
}

/* --------------------------------------------------------- layer norms */

/* x[..., C] (from input `xi`) with weight[C], bias[C] at `wi`, `wi` + 1:
 * outputs y at `yo` then mean and rstd. */
static stoke_err *ln_shapes(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, int xi, int wi,
                            stoke_value_desc_v1 *out, int yo) {
  const stoke_shape *x = &in[xi].shape;
  if (x->ndim < 1 || !is_float(in[xi].dtype))
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': the input must be a float tensor [..., C]", n->op, n->name);
  int64_t c = x->d[x->ndim - 1];
  for (int i = wi; i < wi + 2; i++)
    if (in[i].shape.ndim != 1 || in[i].shape.d[0] != c || in[i].dtype != in[xi].dtype)
      return STOKE_ERR(STOKE_E_INVALID, "%s '%s': weight and bias must be [%lld] of the input's dtype", n->op,
                       n->name, (long long)c);
  if (!(n->attrs[STOKE_LAYER_NORM_EPS].f > 0))
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': eps must be > 0", n->op, n->name);
  out[yo] = in[xi];
  stoke_value_desc_v1 st = {{1, {rows_of(x)}}, stat_dtype(in[xi].dtype)};
  out[yo + 1] = st;
  out[yo + 2] = st;
  return NULL;
}

static stoke_err *infer_layer_norm(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                   stoke_value_desc_v1 *out) {
  return ln_shapes(n, in, 0, 1, out, 0);
}

static stoke_err *infer_add_layer_norm(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                       stoke_value_desc_v1 *out) {
  const stoke_shape *a = &in[0].shape, *b = &in[1].shape;
  if (a->ndim != b->ndim || memcmp(a->d, b->d, sizeof(int64_t) * (size_t)a->ndim) || in[0].dtype != in[1].dtype)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': a and b differ in shape or dtype", n->op, n->name);
  out[0] = in[0];
  return ln_shapes(n, in, 0, 2, out, 1);
}

static stoke_err *infer_add_bias_layer_norm(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                            stoke_value_desc_v1 *out) {
  STOKE_PROPAGATE(infer_add_layer_norm(n, in, out));
  const stoke_shape *a = &in[0].shape;
  if (in[4].shape.ndim != 1 || in[4].shape.d[0] != a->d[a->ndim - 1] || in[4].dtype != in[0].dtype)
    return STOKE_ERR(STOKE_E_INVALID, "add_bias_layer_norm '%s': c (added to every row) must be [%lld] of the "
                     "input's dtype", n->name, (long long)a->d[a->ndim - 1]);
  return NULL;
}

static double flops_layer_norm(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                               const stoke_value_desc_v1 *out) {
  return 5.0 * (double)stoke_numel(&in[0].shape); /* mean, variance, normalize, scale, shift */
}

static double flops_add_layer_norm(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                   const stoke_value_desc_v1 *out) {
  return 6.0 * (double)stoke_numel(&in[0].shape);
}

static const stoke_attr_decl_v1 ln_attrs[] = {
    {"eps", STOKE_ATTR_FLOAT, "1e-5", "added to the variance (nn.LayerNorm's)"},
};

/* ----------------------------------------------------------- attention */

static stoke_err *infer_attention(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                                  stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape;
  int64_t h = n->attrs[STOKE_ATTENTION_N_HEAD].i;
  if (x->ndim != 3 || x->d[2] % 3 || !is_float(in[0].dtype))
    return STOKE_ERR(STOKE_E_INVALID,
                     "attention '%s': expects the packed q, k, v of one linear, qkv[B, T, 3C] (float); got a %d-D "
                     "input whose last dimension is %lld",
                     n->name, x->ndim, (long long)(x->ndim ? x->d[x->ndim - 1] : 0));
  int64_t c = x->d[2] / 3;
  if (h < 1 || c % h)
    return STOKE_ERR(STOKE_E_INVALID, "attention '%s': n_head = %lld must divide C = %lld", n->name, (long long)h,
                     (long long)c);
  if (n->attrs[STOKE_ATTENTION_CAUSAL].i != 0 && n->attrs[STOKE_ATTENTION_CAUSAL].i != 1)
    return STOKE_ERR(STOKE_E_INVALID, "attention '%s': causal must be 0 or 1", n->name);
  if (!(n->attrs[STOKE_ATTENTION_SCALE].f >= 0 && isfinite(n->attrs[STOKE_ATTENTION_SCALE].f))) /* NaN fails too */
    return STOKE_ERR(STOKE_E_INVALID, "attention '%s': scale must be > 0 (or 0: 1/sqrt(head size))", n->name);
  out[0] = (stoke_value_desc_v1){{3, {x->d[0], x->d[1], c}}, in[0].dtype};
  out[1] = (stoke_value_desc_v1){{3, {x->d[0], h, x->d[1]}}, stat_dtype(in[0].dtype)};
  return NULL;
}

/* q k^T and p v: 2 T^2 D FLOPs each per head and sequence, 4 B T^2 C. */
static double flops_attention(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                              const stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape;
  return 4.0 * (double)x->d[0] * (double)x->d[1] * (double)x->d[1] * (double)(x->d[2] / 3);
}

static const stoke_attr_decl_v1 attention_attrs[] = {
    {"n_head", STOKE_ATTR_INT, NULL, "number of heads; C / n_head is the head size"},
    {"causal", STOKE_ATTR_INT, "1", "1: position t attends to s <= t only (a decoder)"},
    {"scale", STOKE_ATTR_FLOAT, "0", "multiplies q.k (0: 1/sqrt(head size))"},
};

/* -------------------------------------------------------------- matmul */

static stoke_err *infer_matmul(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                               stoke_value_desc_v1 *out) {
  const stoke_shape *x = &in[0].shape, *w = &in[1].shape;
  if (x->ndim != 2 || w->ndim != 2 || x->d[1] != w->d[1] || in[0].dtype != in[1].dtype)
    return STOKE_ERR(STOKE_E_INVALID,
                     "matmul '%s': expects x[N, in] and weight[out, in] of one dtype; got %d-D x (%lld features) "
                     "and %d-D weight (%lld)",
                     n->name, x->ndim, (long long)(x->ndim == 2 ? x->d[1] : 0), w->ndim,
                     (long long)(w->ndim == 2 ? w->d[1] : 0));
  out[0] = (stoke_value_desc_v1){{2, {x->d[0], w->d[0]}}, in[0].dtype};
  return NULL;
}

static double flops_matmul(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out) {
  return 2.0 * (double)in[0].shape.d[0] * (double)in[1].shape.d[0] * (double)in[1].shape.d[1];
}

/* --------------------------------------------------------------- views */

static stoke_err *infer_reshape(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  const stoke_attr_v1 *s = &n->attrs[STOKE_RESHAPE_SHAPE];
  int64_t known = 1, total = stoke_numel(&in[0].shape);
  int infer = -1;
  if (s->n < 1 || s->n > STOKE_MAX_DIMS)
    return STOKE_ERR(STOKE_E_INVALID, "reshape '%s': shape needs 1 to %d dimensions", n->name, STOKE_MAX_DIMS);
  for (int i = 0; i < s->n; i++) {
    if (s->ints[i] == -1 && infer < 0) infer = i;
    else if (s->ints[i] < 1)
      return STOKE_ERR(STOKE_E_INVALID, "reshape '%s': dimension %d is %lld (one -1 at most, the rest >= 1)",
                       n->name, i, (long long)s->ints[i]);
    else if (s->ints[i] > total || known > total / s->ints[i]) /* more than the elements (the product would wrap) */
      return STOKE_ERR(STOKE_E_INVALID, "reshape '%s': the shape asked for holds more than the %lld elements",
                       n->name, (long long)total);
    else known *= s->ints[i];
  }
  out[0].shape.ndim = s->n;
  for (int i = 0; i < s->n; i++) out[0].shape.d[i] = i == infer ? (known ? total / known : 0) : s->ints[i];
  if (stoke_numel(&out[0].shape) != total)
    return STOKE_ERR(STOKE_E_INVALID, "reshape '%s': %lld elements do not fit the shape asked for", n->name,
                     (long long)total);
  out[0].dtype = in[0].dtype;
  return NULL;
}

static stoke_err *infer_slice(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  int d = 0;
  STOKE_PROPAGATE(dim_attr(n, n->attrs[STOKE_SLICE_DIM].i, in[0].shape.ndim, "dim", &d));
  int64_t start = n->attrs[STOKE_SLICE_START].i, len = n->attrs[STOKE_SLICE_LENGTH].i;
  if (start < 0 || len < 1 || len > in[0].shape.d[d] || start > in[0].shape.d[d] - len) /* (start + len may wrap) */
    return STOKE_ERR(STOKE_E_INVALID, "slice '%s': %lld values from %lld is not inside dimension %d of size %lld",
                     n->name, (long long)len, (long long)start, d, (long long)in[0].shape.d[d]);
  out[0] = in[0];
  out[0].shape.d[d] = len;
  return NULL;
}

static stoke_err *infer_split(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  int d = 0;
  STOKE_PROPAGATE(dim_attr(n, n->attrs[STOKE_SPLIT_DIM].i, in[0].shape.ndim, "dim", &d));
  const stoke_attr_v1 *s = &n->attrs[STOKE_SPLIT_SIZES];
  int64_t sum = 0;
  for (int i = 0; i < s->n; i++) {
    if (s->ints[i] < 1) return STOKE_ERR(STOKE_E_INVALID, "split '%s': sizes must be >= 1", n->name);
    if (s->ints[i] > in[0].shape.d[d] - sum) /* past the dimension (the sum would wrap) */
      return STOKE_ERR(STOKE_E_INVALID, "split '%s': sizes sum past dimension %d of size %lld", n->name, d,
                       (long long)in[0].shape.d[d]);
    sum += s->ints[i];
    out[i] = in[0];
    out[i].shape.d[d] = s->ints[i];
  }
  if (sum != in[0].shape.d[d])
    return STOKE_ERR(STOKE_E_INVALID, "split '%s': sizes sum to %lld, dimension %d is %lld", n->name, (long long)sum,
                     d, (long long)in[0].shape.d[d]);
  return NULL;
}

static stoke_err *infer_transpose(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  int a = 0, b = 0;
  STOKE_PROPAGATE(dim_attr(n, n->attrs[STOKE_TRANSPOSE_DIM0].i, in[0].shape.ndim, "dim0", &a));
  STOKE_PROPAGATE(dim_attr(n, n->attrs[STOKE_TRANSPOSE_DIM1].i, in[0].shape.ndim, "dim1", &b));
  out[0] = in[0];
  out[0].shape.d[a] = in[0].shape.d[b];
  out[0].shape.d[b] = in[0].shape.d[a];
  return NULL;
}

static const stoke_attr_decl_v1 reshape_attrs[] = {
    {"shape", STOKE_ATTR_INTS, NULL, "the new shape, e.g. 16x1024x768; one -1 is inferred"},
};
static const stoke_attr_decl_v1 slice_attrs[] = {
    {"dim", STOKE_ATTR_INT, NULL, "the dimension narrowed (negative: from the end)"},
    {"start", STOKE_ATTR_INT, NULL, "first index kept"},
    {"length", STOKE_ATTR_INT, NULL, "indices kept"},
};
static const stoke_attr_decl_v1 split_attrs[] = {
    {"dim", STOKE_ATTR_INT, NULL, "the dimension split (negative: from the end)"},
    {"sizes", STOKE_ATTR_INTS, NULL, "size of each part, e.g. 768x768x768; one output each"},
};
static const stoke_attr_decl_v1 transpose_attrs[] = {
    {"dim0", STOKE_ATTR_INT, NULL, "first dimension swapped"},
    {"dim1", STOKE_ATTR_INT, NULL, "second dimension swapped"},
};

#define IN(i) STOKE_BWD_NEEDS_INPUT(i)
#define OUT(i) STOKE_BWD_NEEDS_OUTPUT(i)

static const stoke_op_type_v1 ops[] = {
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_EMBEDDING, "row lookup weight[idx] (nn.Embedding); scatter-add backward", 2, 1, NULL, 0,
     infer_embedding, flops_none, IN(1), 1u << 1, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_POSITION_EMBEDDING, "x + weight[t] over (b, t): learned positions (GPT-2's wpe)", 2, 1, NULL, 0,
     infer_position_embedding, flops_elementwise, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_LAYER_NORM, "layer normalization over the last dimension (nn.LayerNorm)", 3, 3, ln_attrs, 1,
     infer_layer_norm, flops_layer_norm, IN(0) | IN(1) | OUT(1) | OUT(2), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_ADD_LAYER_NORM, "residual add then layer_norm, one pass (s = a + b, y = layer_norm(s))", 4, 4,
     ln_attrs, 1, infer_add_layer_norm, flops_add_layer_norm, IN(2) | OUT(0) | OUT(2) | OUT(3), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_ADD_BIAS_LAYER_NORM, "add_layer_norm with a per-channel c added to the sum (a linear's bias moved in: s = a + b + c)",
     5, 4, ln_attrs, 1, infer_add_bias_layer_norm, flops_add_layer_norm, IN(2) | OUT(0) | OUT(2) | OUT(3), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_ATTENTION, "causal scaled dot-product attention over packed qkv (flash attention on GPUs)", 1, 2,
     attention_attrs, 3, infer_attention, flops_attention, IN(0) | OUT(0) | OUT(1), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_MATMUL, "x W^T, a linear without bias (nn.Linear(bias=False))", 2, 1, NULL, 0, infer_matmul,
     flops_matmul, IN(0) | IN(1), 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_RESHAPE, "the same elements in another shape (a view)", 1, 1, reshape_attrs, 1, infer_reshape,
     flops_none, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_SLICE, "narrow one dimension (torch.narrow; a view where the memory order allows)", 1, 1,
     slice_attrs, 3, infer_slice, flops_none, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_SPLIT, "parts along one dimension (torch.split; views where the memory order allows)", 1, 0,
     split_attrs, 2, infer_split, flops_none, STOKE_BWD_NEEDS_NOTHING, 0, 1},
    {STOKE_ABI(stoke_op_type_v1), STOKE_OP_TRANSPOSE, "swap two dimensions (a view where the memory order allows, else a copy)", 1, 1,
     transpose_attrs, 2, infer_transpose, flops_none, STOKE_BWD_NEEDS_NOTHING, 0, 1},
};

stoke_err *stoke_register_seq_ops(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) STOKE_PROPAGATE(r->add_op(r->self, &ops[i]));
  return NULL;
}
