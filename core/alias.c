/* core/alias.c: the compiler's memory sharing between values, decided after
 * liveness and before the arena is placed: views (reshape, slice, split,
 * transpose where the memory order allows, and the gradients of reshape
 * and transpose) take their input's memory, and softmax_ce's backward
 * writes dlogits over the logits when nothing reads them later. An aliased
 * value is not placed: it lives at its root's place plus an offset, and
 * the root stays live as long as any value sharing it. */
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

static int is_op(const stoke_gnode *n, const char *op) { return !strcmp(n->n.op, op); }

/* The value at the bottom of v's alias chain, and v's byte offset in it. */
int stoke_alias_root(const stoke_graph *g, int v, size_t *off) {
  size_t o = 0;
  while (g->values[v].alias >= 0) {
    o += g->values[v].alias_off;
    v = g->values[v].alias;
  }
  if (off) *off = o;
  return v;
}

/* Dimension `d` (negative from the end) of a value's shape. */
static int norm_dim(const stoke_shape *s, int64_t d) { return (int)(d < 0 ? d + s->ndim : d); }

static int64_t prod(const stoke_shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s->d[i];
  return p;
}

/* When output j of forward node n can be its input's memory: 1 and the
 * byte offset in it. reshape always; slice and split when every dimension
 * before `dim` is 1 (each part is one dense run) and the part starts on a
 * 16-byte boundary; transpose when at most
 * one dimension from dim0 to dim1 is larger than 1 (the order is kept). */
static int view_offset(const stoke_graph *g, const stoke_gnode *n, int j, size_t *off) {
  const stoke_value *x = &g->values[n->in[0]];
  size_t es = stoke_dtype_size(x->dtype);
  *off = 0;
  if (is_op(n, STOKE_OP_RESHAPE)) return 1;
  if (is_op(n, STOKE_OP_SLICE) || is_op(n, STOKE_OP_SPLIT)) {
    int slice = is_op(n, STOKE_OP_SLICE);
    int d = norm_dim(&x->shape, n->n.attrs[slice ? STOKE_SLICE_DIM : STOKE_SPLIT_DIM].i);
    if (prod(&x->shape, 0, d) != 1) return 0;
    int64_t at = slice ? n->n.attrs[STOKE_SLICE_START].i : 0;
    for (int k = 0; k < j; k++) at += g->values[n->out[k]].shape.d[d];
    *off = (size_t)(at * prod(&x->shape, d + 1, x->shape.ndim)) * es;
    /* a part that would start off a 16-byte boundary is copied: cuDNN and cuBLASLt refuse such pointers
     * (BAD_PARAM_MISALIGNED_POINTER) at run time, after the plan, and vector kernels take a slower path */
    size_t base = 0;
    stoke_alias_root(g, n->in[0], &base);
    return (base + *off) % 16 == 0;
  }
  if (is_op(n, STOKE_OP_TRANSPOSE)) {
    int a = norm_dim(&x->shape, n->n.attrs[STOKE_TRANSPOSE_DIM0].i);
    int b = norm_dim(&x->shape, n->n.attrs[STOKE_TRANSPOSE_DIM1].i);
    int big = 0;
    for (int k = a < b ? a : b; k <= (a < b ? b : a); k++) big += x->shape.d[k] > 1;
    return big <= 1;
  }
  return 0;
}

/* A gradient value only this backward node writes, in the arena (not a
 * parameter's, which accumulates in the flat buffer), with no alias yet.
 * A folded gradient sum (core/fuse_grad.c) has another node add into the
 * value (din_accumulate): as a view of the node's own input gradient, that
 * add would land in memory other values may share (add gives one gradient
 * to both its inputs), so such a value keeps its own memory. */
static int fresh_grad(const stoke_graph *g, int v, int node) {
  const stoke_value *val = v >= 0 ? &g->values[v] : NULL;
  if (!val || val->kind != STOKE_VAL_GRAD || val->buffer != STOKE_BUF_ARENA || val->producer != node || val->alias >= 0)
    return 0;
  for (int i = g->n_fwd; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].din[k] == v && ((g->nodes[i].din_accumulate >> k) & 1u)) return 0;
  return 1;
}

/* The schedule span of every value sharing root r: [first, last]. */
static void group_span(const stoke_graph *g, int r, int *first, int *last) {
  *first = g->values[r].first;
  *last = g->values[r].last;
  for (int v = 0; v < g->n_values; v++) {
    if (g->values[v].alias < 0 || stoke_alias_root(g, v, NULL) != r) continue;
    if (g->values[v].first < *first) *first = g->values[v].first;
    if (g->values[v].last > *last) *last = g->values[v].last;
  }
}

static void set_alias(stoke_graph *g, int v, int of, size_t off) {
  g->values[v].alias = of;
  g->values[v].alias_off = off;
}

/* Views first (forward outputs, then reshape / transpose gradients), then
 * softmax_ce's in-place dlogits, which needs the spans the views made. */
void stoke_plan_aliases(stoke_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const stoke_gnode *n = &g->nodes[i];
    if (i >= g->n_fwd && !n->recompute) continue; /* forward nodes, and their copies re-run in backward */
    for (int j = 0; j < n->n_out; j++) {
      size_t off;
      const stoke_value *y = &g->values[n->out[j]];
      if (y->buffer == STOKE_BUF_ARENA && y->alias < 0 && view_offset(g, n, j, &off)) set_alias(g, n->out[j], n->in[0], off);
    }
  }
  for (int i = g->n_fwd; i < g->n_nodes; i++) {
    const stoke_gnode *n = &g->nodes[i];
    size_t off;
    if (n->pass != STOKE_BWD || !(is_op(n, STOKE_OP_RESHAPE) || is_op(n, STOKE_OP_TRANSPOSE))) continue;
    if (fresh_grad(g, n->din[0], i) && n->dout[0] >= 0 && view_offset(g, &g->nodes[n->fwd], 0, &off))
      set_alias(g, n->din[0], n->dout[0], 0);
  }
  for (int i = g->n_fwd; i < g->n_nodes; i++) {
    const stoke_gnode *n = &g->nodes[i];
    if (n->pass != STOKE_BWD || !is_op(n, STOKE_OP_SOFTMAX_CE) || !fresh_grad(g, n->din[0], i)) continue;
    const stoke_value *x = &g->values[n->in[0]];
    int first, last, r = stoke_alias_root(g, n->in[0], NULL);
    group_span(g, r, &first, &last);
    if (last <= i && x->buffer == STOKE_BUF_ARENA && x->dtype == g->values[n->din[0]].dtype)
      set_alias(g, n->din[0], n->in[0], 0);
  }
  /* every root lives as long as the values sharing it */
  for (int v = 0; v < g->n_values; v++) {
    if (g->values[v].alias < 0) continue;
    int r = stoke_alias_root(g, v, NULL);
    if (g->values[v].first < g->values[r].first) g->values[r].first = g->values[v].first;
    if (g->values[v].last > g->values[r].last) g->values[r].last = g->values[v].last;
  }
}

/* After the roots are placed: each aliased value at its root's place. */
void stoke_place_aliases(stoke_graph *g) {
  for (int v = 0; v < g->n_values; v++) {
    if (g->values[v].alias < 0) continue;
    size_t off;
    int r = stoke_alias_root(g, v, &off);
    g->values[v].buffer = g->values[r].buffer;
    g->values[v].offset = g->values[r].offset + off;
  }
}
