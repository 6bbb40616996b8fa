/* backends/cpu/seq.c: CPU reference kernels of the sequence ops (embedding,
 * position_embedding, layer_norm, add_layer_norm, attention, matmul) and
 * of the views (reshape, slice, split, transpose); see stoke/ops.h.
 *
 * The argument checks and the views' forward copies (plain byte moves, for
 * f32, f64 and i32: token ids are sliced too) are here; the arithmetic is
 * in seq_kernels.inc, included once for float and once for double. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_cnn.h"
#include "stoke/ops.h"

/* ------------------------------------------------------------ embeddings */

static stoke_err *embedding_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_EMBEDDING;
  CHECK(stoke_check_counts(a, op, bwd, 2, 1));
  const stoke_tensor *w = &a->in[0], *idx = &a->in[1], *y = &a->out[0];
  const stoke_shape *ws = &w->shape, *is = &idx->shape, *ys = &y->shape;
  int ok = ws->ndim == 2 && ys->ndim == is->ndim + 1 && ys->d[ys->ndim - 1] == ws->d[1];
  for (int i = 0; ok && i < is->ndim; i++) ok = ys->d[i] == is->d[i];
  if (!ok)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects weight[V, C], idx[...] -> out[..., C]; got weight %s, idx %s, out %s",
                      op, stoke_node_name(a), stoke_shape_str(ws).s, stoke_shape_str(is).s, stoke_shape_str(ys).s);
  CHECK(stoke_check_dtype(a, op, "weight", w, dt));
  CHECK(stoke_check_dtype(a, op, "idx", idx, STOKE_I32));
  CHECK(stoke_check_dtype(a, op, "out", y, dt));
  CHECK(stoke_check_data(a, op, "idx", idx, run));
  if (!bwd) {
    CHECK(stoke_check_data(a, op, "weight", w, run));
    return stoke_check_data(a, op, "out", y, run);
  }
  CHECK(stoke_check_grad(a, op, "weight", &a->din[0], w));
  CHECK(stoke_check_grad(a, op, "out", &a->dout[0], y));
  return a->din[0].data ? stoke_check_data(a, op, "dout", &a->dout[0], run) : NULL;
}

/* Every index inside [0, V): one outside would read or write past the table. */
static stoke_err *embedding_indices(const stoke_kernel_args_v1 *a) {
  const int32_t *idx = a->in[1].data;
  int64_t n = stoke_numel(&a->in[1].shape), v = a->in[0].shape.d[0];
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= v)
      return STOKE_PERR(STOKE_E_DATA, "embedding '%s': index %d at position %lld is outside [0, %lld) (the table's rows)",
                        stoke_node_name(a), (int)idx[i], (long long)i, (long long)v);
  return NULL;
}

static stoke_err *pos_embedding_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_POSITION_EMBEDDING;
  CHECK(stoke_check_counts(a, op, bwd, 2, 1));
  const stoke_tensor *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
  const stoke_shape *xs = &x->shape, *ws = &w->shape;
  if (xs->ndim != 3 || ws->ndim != 2 || ws->d[1] != xs->d[2] || ws->d[0] < xs->d[1] || !stoke_same_shape(xs, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x[B, T, C], weight[P >= T, C] -> y of x's shape; got x %s, weight %s, y %s",
                      op, stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ws).s, stoke_shape_str(&y->shape).s);
  CHECK(check_xy(a, op, dt, bwd, run));
  CHECK(stoke_check_dtype(a, op, "weight", w, dt));
  if (!bwd) return stoke_check_data(a, op, "weight", w, run);
  CHECK(stoke_check_grad(a, op, "weight", &a->din[1], w));
  return stoke_check_data(a, op, "dy", &a->dout[0], run);
}

/* ------------------------------------------------------------ layer norm */

typedef struct ln_geom {
  int64_t rows, c;
  double eps;
  int add;   /* 1 add_layer_norm: inputs (a, b, w, bias), outputs (s, y, mean, rstd); 2 add_bias_layer_norm:
              * inputs (a, b, w, bias, c) */
  int x, w;  /* index of the normalized input (or output s) and of the weight */
  int y;     /* index of the output y; mean and rstd follow */
} ln_geom;

static stoke_err *ln_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, int add, ln_geom *g) {
  const char *op = add == 2 ? STOKE_OP_ADD_BIAS_LAYER_NORM : add ? STOKE_OP_ADD_LAYER_NORM : STOKE_OP_LAYER_NORM;
  g->add = add;
  g->w = add ? 2 : 1;
  g->y = add ? 1 : 0;
  int nin = add == 2 ? 5 : add ? 4 : 3, nout = add ? 4 : 3;
  CHECK(stoke_check_counts(a, op, bwd, nin, nout));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_LAYER_NORM_EPS)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attribute eps missing", op, stoke_node_name(a));
  g->eps = n->attrs[STOKE_LAYER_NORM_EPS].f;
  const stoke_shape *xs = &a->in[0].shape;
  if (!(g->eps > 0) || xs->ndim < 1)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': eps %g must be > 0, x %s at least 1-D", op, stoke_node_name(a), g->eps,
                      stoke_shape_str(xs).s);
  g->c = xs->d[xs->ndim - 1];
  g->rows = g->c ? stoke_numel(xs) / g->c : 0;
  stoke_dtype st = dt == STOKE_F64 ? STOKE_F64 : STOKE_F32;
  static const char *const add_names[] = {"a", "b", "weight", "bias", "c"}, *const ln_names[] = {"x", "weight", "bias"};
  const char *const *names = add ? add_names : ln_names;
  for (int i = 0; i < (add ? 2 : 1); i++) {
    if (!stoke_same_shape(&a->in[i].shape, xs) || !stoke_same_shape(&a->out[i].shape, xs))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': inputs and outputs must all have x's shape %s", op, stoke_node_name(a),
                        stoke_shape_str(xs).s);
    CHECK(stoke_check_dtype(a, op, names[i], &a->in[i], dt));
    CHECK(stoke_check_dtype(a, op, "y", &a->out[i], dt));
  }
  for (int i = g->w; i < nin; i++) {
    if (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a), names[i],
                        stoke_shape_str(&a->in[i].shape).s, stoke_shape_str(xs).s, (long long)g->c);
    CHECK(stoke_check_dtype(a, op, names[i], &a->in[i], dt));
  }
  for (int j = g->y + 1; j < g->y + 3; j++) {
    if (a->out[j].shape.ndim != 1 || a->out[j].shape.d[0] != g->rows)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': mean and rstd must be [%lld], got %s", op, stoke_node_name(a),
                        (long long)g->rows, stoke_shape_str(&a->out[j].shape).s);
    CHECK(stoke_check_dtype(a, op, "mean/rstd", &a->out[j], st));
  }
  if (!bwd) {
    for (int i = 0; i < nin; i++) CHECK(stoke_check_data(a, op, "input", &a->in[i], run));
    for (int j = 0; j < nout; j++) CHECK(stoke_check_data(a, op, "output", &a->out[j], run));
    return NULL;
  }
  for (int i = 0; i < nin; i++) CHECK(stoke_check_grad(a, op, names[i], &a->din[i], &a->in[i]));
  CHECK(stoke_check_grad(a, op, "y", &a->dout[g->y], &a->out[g->y]));
  if (add) CHECK(stoke_check_grad(a, op, "s", &a->dout[0], &a->out[0]));
  CHECK(stoke_check_data(a, op, "dy", &a->dout[g->y], run));
  const stoke_tensor *x = add ? &a->out[0] : &a->in[0];
  CHECK(stoke_check_data(a, op, add ? "s (the forward's sum)" : "x (the forward input)", x, run));
  CHECK(stoke_check_data(a, op, "weight", &a->in[g->w], run));
  CHECK(stoke_check_data(a, op, "mean", &a->out[g->y + 1], run));
  return stoke_check_data(a, op, "rstd", &a->out[g->y + 2], run);
}

/* ------------------------------------------------------------- attention */

typedef struct att_geom {
  int64_t b, t, c, h, d;
  int causal;
  double scale;
} att_geom;

static stoke_err *attention_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, att_geom *g) {
  const char *op = STOKE_OP_ATTENTION;
  CHECK(stoke_check_counts(a, op, bwd, 1, 2));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_ATTENTION_SCALE)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes n_head, causal and scale missing", op, stoke_node_name(a));
  const stoke_shape *xs = &a->in[0].shape, *ys = &a->out[0].shape, *ls = &a->out[1].shape;
  g->h = n->attrs[STOKE_ATTENTION_N_HEAD].i;
  g->causal = (int)n->attrs[STOKE_ATTENTION_CAUSAL].i;
  if (xs->ndim != 3 || xs->d[2] % 3 || g->h < 1 || (xs->d[2] / 3) % g->h)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects qkv[B, T, 3C] with C a multiple of n_head %lld; got %s", op,
                      stoke_node_name(a), (long long)g->h, stoke_shape_str(xs).s);
  g->b = xs->d[0];
  g->t = xs->d[1];
  g->c = xs->d[2] / 3;
  g->d = g->c / g->h;
  g->scale = n->attrs[STOKE_ATTENTION_SCALE].f > 0 ? n->attrs[STOKE_ATTENTION_SCALE].f : 1.0 / sqrt((double)g->d);
  if (ys->ndim != 3 || ys->d[0] != g->b || ys->d[1] != g->t || ys->d[2] != g->c || ls->ndim != 3 ||
      ls->d[0] != g->b || ls->d[1] != g->h || ls->d[2] != g->t)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': qkv %s -> y[B, T, C], lse[B, H, T]; got y %s, lse %s", op,
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ys).s, stoke_shape_str(ls).s);
  CHECK(check_xy(a, op, dt, bwd, run));
  CHECK(stoke_check_dtype(a, op, "lse", &a->out[1], dt == STOKE_F64 ? STOKE_F64 : STOKE_F32));
  CHECK(stoke_check_data(a, op, "lse", &a->out[1], run));
  if (!bwd || !a->din[0].data) return NULL;
  CHECK(stoke_check_data(a, op, "qkv (the forward input)", &a->in[0], run));
  CHECK(stoke_check_data(a, op, "y (the forward output)", &a->out[0], run));
  return stoke_check_data(a, op, "dy", &a->dout[0], run);
}

/* ---------------------------------------------------------------- matmul */

static stoke_err *matmul_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_MATMUL;
  CHECK(stoke_check_counts(a, op, bwd, 2, 1));
  const stoke_tensor *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
  const stoke_shape *xs = &x->shape, *ws = &w->shape, *ys = &y->shape;
  if (xs->ndim != 2 || ws->ndim != 2 || ys->ndim != 2 || xs->d[1] != ws->d[1] || ys->d[0] != xs->d[0] ||
      ys->d[1] != ws->d[0] || xs->d[0] > 0x7fffffff || xs->d[1] > 0x7fffffff || ws->d[0] > 0x7fffffff)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x[N, in], weight[out, in] -> y[N, out] (int dimensions); got x %s, weight %s, y %s",
                      op, stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ws).s, stoke_shape_str(ys).s);
  CHECK(stoke_check_dtype(a, op, "x", x, dt));
  CHECK(stoke_check_dtype(a, op, "weight", w, dt));
  CHECK(stoke_check_dtype(a, op, "y", y, dt));
  if (!bwd) {
    CHECK(stoke_check_data(a, op, "x", x, run));
    CHECK(stoke_check_data(a, op, "weight", w, run));
    return stoke_check_data(a, op, "y", y, run);
  }
  CHECK(stoke_check_grad(a, op, "x", &a->din[0], x));
  CHECK(stoke_check_grad(a, op, "weight", &a->din[1], w));
  CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
  if (a->din[0].data) CHECK(stoke_check_data(a, op, "weight", w, run));
  if (a->din[1].data) CHECK(stoke_check_data(a, op, "x", x, run));
  return NULL;
}

/* ----------------------------------------------------------------- views */

/* A dense tensor as (outer, n, inner) around dimension `dim`. */
typedef struct view_geom {
  int64_t outer, n, inner;
  size_t es;
} view_geom;

static view_geom around(const stoke_tensor *t, int dim) {
  view_geom v = {1, t->shape.d[dim], 1, stoke_dtype_size(t->dtype)};
  for (int i = 0; i < dim; i++) v.outer *= t->shape.d[i];
  for (int i = dim + 1; i < t->shape.ndim; i++) v.inner *= t->shape.d[i];
  return v;
}

static int dim_of(const stoke_kernel_args_v1 *a, int attr) {
  int64_t d = a->node->attrs[attr].i, nd = a->in[0].shape.ndim;
  return (int)(d < 0 ? d + nd : d);
}

/* What every view kernel checks: a node with attributes, x and each output
 * of dtype dt with the element counts the op makes; `op` names it. */
static stoke_err *view_check(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd, int run,
                             int n_attrs) {
  if (!a->node || a->node->n_attrs < n_attrs)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes missing", op, stoke_node_name(a));
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  CHECK(stoke_check_dtype(a, op, "x", &a->in[0], dt));
  for (int j = 0; j < a->n_out; j++) {
    CHECK(stoke_check_dtype(a, op, "output", &a->out[j], dt));
    if (!bwd) CHECK(stoke_check_data(a, op, "output", &a->out[j], run));
    else if (a->dout[j].data) CHECK(stoke_check_grad(a, op, "output", &a->dout[j], &a->out[j]));
  }
  if (!bwd) return stoke_check_data(a, op, "x", &a->in[0], run);
  return stoke_check_grad(a, op, "x", &a->din[0], &a->in[0]);
}

static stoke_err *reshape_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  CHECK(view_check(a, STOKE_OP_RESHAPE, dt, bwd, run, 0));
  if (stoke_numel(&a->in[0].shape) != stoke_numel(&a->out[0].shape))
    return STOKE_PERR(STOKE_E_INVALID, "reshape '%s': x %s and y %s differ in size", stoke_node_name(a),
                      stoke_shape_str(&a->in[0].shape).s, stoke_shape_str(&a->out[0].shape).s);
  return bwd ? stoke_check_data(a, STOKE_OP_RESHAPE, "dy", &a->dout[0], run) : NULL;
}

/* slice and split: outputs are parts of x along `dim` (slice: one, from
 * `start`); every other dimension equal; *first: where part 0 starts. */
static stoke_err *parts_check(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd, int run,
                              int64_t *first) {
  int slice = !strcmp(op, STOKE_OP_SLICE);
  CHECK(view_check(a, op, dt, bwd, run, slice ? 3 : 2));
  int dim = dim_of(a, slice ? STOKE_SLICE_DIM : STOKE_SPLIT_DIM);
  const stoke_shape *xs = &a->in[0].shape;
  *first = slice ? a->node->attrs[STOKE_SLICE_START].i : 0;
  int64_t sum = *first;
  for (int j = 0; j < a->n_out; j++) {
    const stoke_shape *ys = &a->out[j].shape;
    int ok = dim >= 0 && dim < xs->ndim && ys->ndim == xs->ndim;
    for (int i = 0; ok && i < xs->ndim; i++) ok = i == dim || ys->d[i] == xs->d[i];
    if (!ok)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': output %d %s is not a part of x %s along dimension %d", op,
                        stoke_node_name(a), j, stoke_shape_str(ys).s, stoke_shape_str(xs).s, dim);
    if (*first < 0 || ys->d[dim] > xs->d[dim] - sum) { /* past x (sum + the part could wrap) */
      sum = -1;
      break;
    }
    sum += ys->d[dim];
  }
  if (sum < 0 || sum > xs->d[dim] || (!slice && sum != xs->d[dim]))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the parts run to %lld, x %s has %lld along dimension %d", op,
                      stoke_node_name(a), (long long)sum, stoke_shape_str(xs).s, (long long)xs->d[dim], dim);
  return NULL;
}

static stoke_err *transpose_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, int *d0, int *d1) {
  CHECK(view_check(a, STOKE_OP_TRANSPOSE, dt, bwd, run, 2));
  *d0 = dim_of(a, STOKE_TRANSPOSE_DIM0);
  *d1 = dim_of(a, STOKE_TRANSPOSE_DIM1);
  if (*d0 > *d1) {
    int t = *d0;
    *d0 = *d1;
    *d1 = t;
  }
  const stoke_shape *xs = &a->in[0].shape, *ys = &a->out[0].shape;
  int ok = *d0 >= 0 && *d1 < xs->ndim && ys->ndim == xs->ndim;
  for (int i = 0; ok && i < xs->ndim; i++) ok = ys->d[i] == xs->d[i == *d0 ? *d1 : i == *d1 ? *d0 : i];
  if (!ok)
    return STOKE_PERR(STOKE_E_INVALID, "transpose '%s': y %s is not x %s with dimensions %d and %d swapped",
                      stoke_node_name(a), stoke_shape_str(ys).s, stoke_shape_str(xs).s, *d0, *d1);
  return bwd ? stoke_check_data(a, STOKE_OP_TRANSPOSE, "dy", &a->dout[0], run) : NULL;
}

/* Transpose as (A, P, M, Q, I) -> (A, Q, M, P, I), P and Q the swapped
 * dimensions; `in` is the (A, P, M, Q, I) side. */
typedef struct tgeom {
  int64_t a, p, m, q, i;
} tgeom;

static tgeom tgeom_of(const stoke_shape *in, int d0, int d1) {
  tgeom g = {1, in->d[d0], 1, in->d[d1], 1};
  for (int k = 0; k < d0; k++) g.a *= in->d[k];
  for (int k = d0 + 1; k < d1; k++) g.m *= in->d[k];
  for (int k = d1 + 1; k < in->ndim; k++) g.i *= in->d[k];
  return g;
}

/* Element offset in (A, Q, M, P, I) of the element at (a, p, m, q) of (A, P, M, Q, I), times I. */
static int64_t tswap(const tgeom *g, int64_t a, int64_t p, int64_t m, int64_t q) {
  return (((a * g->q + q) * g->m + m) * g->p + p) * g->i;
}

static int64_t tplain(const tgeom *g, int64_t a, int64_t p, int64_t m, int64_t q) {
  return (((a * g->p + p) * g->m + m) * g->q + q) * g->i;
}

/* Forward copies: nothing to do when the compiler made the output a view
 * of x (the pointers already agree). */
static stoke_err *reshape_fwd(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(reshape_check(a, a->in[0].dtype, 0, 1));
  if (a->out[0].data != a->in[0].data) memcpy(a->out[0].data, a->in[0].data, stoke_tensor_bytes(&a->in[0]));
  return NULL;
}

static stoke_err *parts_fwd(const stoke_kernel_args_v1 *a, const char *op) {
  int64_t at;
  CHECK(parts_check(a, op, a->in[0].dtype, 0, 1, &at));
  view_geom x = around(&a->in[0], dim_of(a, !strcmp(op, STOKE_OP_SLICE) ? STOKE_SLICE_DIM : STOKE_SPLIT_DIM));
  for (int j = 0; j < a->n_out; j++) {
    int64_t len = a->out[j].shape.d[dim_of(a, !strcmp(op, STOKE_OP_SLICE) ? STOKE_SLICE_DIM : STOKE_SPLIT_DIM)];
    size_t row = (size_t)(len * x.inner) * x.es;
    const char *src = (const char *)a->in[0].data + (size_t)(at * x.inner) * x.es;
    char *dst = a->out[j].data;
    if (dst != src || x.outer != 1)
      for (int64_t o = 0; o < x.outer; o++) memcpy(dst + (size_t)o * row, src + (size_t)(o * x.n * x.inner) * x.es, row);
    at += len;
  }
  return NULL;
}

static stoke_err *slice_fwd(const stoke_kernel_args_v1 *a, void *state) { return parts_fwd(a, STOKE_OP_SLICE); }
static stoke_err *split_fwd(const stoke_kernel_args_v1 *a, void *state) { return parts_fwd(a, STOKE_OP_SPLIT); }

static stoke_err *transpose_fwd(const stoke_kernel_args_v1 *a, void *state) {
  int d0, d1;
  CHECK(transpose_check(a, a->in[0].dtype, 0, 1, &d0, &d1));
  size_t es = stoke_dtype_size(a->in[0].dtype);
  if (a->out[0].data == a->in[0].data) return NULL; /* a view: the order does not change */
  tgeom g = tgeom_of(&a->in[0].shape, d0, d1);
  const char *x = a->in[0].data;
  char *y = a->out[0].data;
  for (int64_t i = 0; i < g.a; i++)
    for (int64_t p = 0; p < g.p; p++)
      for (int64_t m = 0; m < g.m; m++)
        for (int64_t q = 0; q < g.q; q++)
          memcpy(y + (size_t)tswap(&g, i, p, m, q) * es, x + (size_t)tplain(&g, i, p, m, q) * es, (size_t)g.i * es);
  return NULL;
}

CPU_PLAN(reshape_fwd_plan, , reshape_check(a, a->in[0].dtype, 0, 0))
CPU_PLAN(slice_fwd_plan, int64_t at, parts_check(a, STOKE_OP_SLICE, a->in[0].dtype, 0, 0, &at))
CPU_PLAN(split_fwd_plan, int64_t at, parts_check(a, STOKE_OP_SPLIT, a->in[0].dtype, 0, 0, &at))
CPU_PLAN(transpose_fwd_plan, int d[2], transpose_check(a, a->in[0].dtype, 0, 0, &d[0], &d[1]))

/* ====================================================== the instantiations */

#define PER_TYPE_FILE "seq_kernels.inc"
#include "per_type.h"

/* ========================================================== registration */

#define K(op, pass, fn, sfx, dt) CPU_KERNEL(op, pass, fn, sfx, dt, stoke_destroy_none)
#define VIEW_FWD(dt)                                                                              \
  {"cpu", STOKE_OP_RESHAPE, STOKE_FWD, dt, STOKE_LAYOUT_ANY, reshape_fwd_plan, reshape_fwd, stoke_destroy_none},     \
  {"cpu", STOKE_OP_SLICE, STOKE_FWD, dt, STOKE_LAYOUT_ANY, slice_fwd_plan, slice_fwd, stoke_destroy_none},         \
  {"cpu", STOKE_OP_SPLIT, STOKE_FWD, dt, STOKE_LAYOUT_ANY, split_fwd_plan, split_fwd, stoke_destroy_none},         \
  {"cpu", STOKE_OP_TRANSPOSE, STOKE_FWD, dt, STOKE_LAYOUT_ANY, transpose_fwd_plan, transpose_fwd, stoke_destroy_none}
#define SEQ_KERNELS(sfx, dt)                                                    \
  K(STOKE_OP_EMBEDDING, STOKE_FWD, embedding_fwd, sfx, dt),                    \
  K(STOKE_OP_EMBEDDING, STOKE_BWD, embedding_bwd, sfx, dt),                    \
  K(STOKE_OP_POSITION_EMBEDDING, STOKE_FWD, pos_embedding_fwd, sfx, dt),       \
  K(STOKE_OP_POSITION_EMBEDDING, STOKE_BWD, pos_embedding_bwd, sfx, dt),       \
  K(STOKE_OP_LAYER_NORM, STOKE_FWD, layer_norm_fwd, sfx, dt),                  \
  K(STOKE_OP_LAYER_NORM, STOKE_BWD, layer_norm_bwd, sfx, dt),                  \
  K(STOKE_OP_ADD_LAYER_NORM, STOKE_FWD, add_layer_norm_fwd, sfx, dt),          \
  K(STOKE_OP_ADD_LAYER_NORM, STOKE_BWD, add_layer_norm_bwd, sfx, dt),          \
  K(STOKE_OP_ADD_BIAS_LAYER_NORM, STOKE_FWD, add_bias_layer_norm_fwd, sfx, dt), \
  K(STOKE_OP_ADD_BIAS_LAYER_NORM, STOKE_BWD, add_bias_layer_norm_bwd, sfx, dt), \
  CPU_KERNEL(STOKE_OP_ATTENTION, STOKE_FWD, attention_fwd, sfx, dt, CAT(attention_destroy, sfx)), \
  CPU_KERNEL(STOKE_OP_ATTENTION, STOKE_BWD, attention_bwd, sfx, dt, CAT(attention_destroy, sfx)), \
  K(STOKE_OP_MATMUL, STOKE_FWD, matmul_fwd, sfx, dt),                          \
  K(STOKE_OP_MATMUL, STOKE_BWD, matmul_bwd, sfx, dt),                          \
  K(STOKE_OP_RESHAPE, STOKE_BWD, reshape_bwd, sfx, dt),                        \
  K(STOKE_OP_SLICE, STOKE_BWD, slice_bwd, sfx, dt),                            \
  K(STOKE_OP_SPLIT, STOKE_BWD, split_bwd, sfx, dt),                            \
  K(STOKE_OP_TRANSPOSE, STOKE_BWD, transpose_bwd, sfx, dt),                    \
  VIEW_FWD(dt)

static const stoke_kernel_v1 seq_kernels[] = {
    SEQ_KERNELS(f32, STOKE_F32),
    SEQ_KERNELS(f64, STOKE_F64),
    VIEW_FWD(STOKE_I32),
};

stoke_err *cpu_register_seq(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, seq_kernels, sizeof seq_kernels / sizeof *seq_kernels);
}
