/* core/layout.c: the compiler pass that keeps every 4-D value's memory
 * order what its readers assume, in a graph laid out NHWC (the GPU's
 * default, channels_last).
 *
 * Shapes are always logical (N, C, H, W); a value's `layout` says its
 * memory order. The ops that index by channel and pixel (convolutions,
 * batch norms, pools, bias_add, flatten: "aware" below) honour that field
 * and run in NHWC. The ops that index memory as a dense row-major array
 * (reshape, slice, split, transpose, linear, matmul, layer norms,
 * attention, softmax_ce, embeddings, and a plugin's op unless it is purely
 * elementwise: "row-major") see the logical order only when the memory is
 * NCHW. Before this pass every 4-D value was labelled NHWC, so a reshape or
 * transpose of a convolution's output read pixels as channels, and a
 * convolution of a reshaped vector read channels as pixels: silently wrong
 * numbers (a ViT's patch embedding, conv -> reshape -> transpose, is the
 * common case; the built-in models never mix the two kinds).
 *
 * The pass walks the forward nodes in order and labels each 4-D output:
 * an aware op's NHWC, a row-major op's NCHW (row-major), an elementwise
 * op's (relu, gelu, add, dropout, autocast, a plugin op whose inputs and
 * outputs all have one shape) a 4-D state input's order, else NHWC when
 * one of its 4-D activations comes in NHWC, else row-major.
 * Parameters and state are row-major in memory in every graph (a
 * convolution's weight [O, C, kh, kw], staged by the kernels as they need,
 * and what checkpoints hold): they are labelled so, and converted like an
 * activation where a reader wants NHWC (not as a convolution's filter,
 * which every engine reads row-major, whoever made it). The one exception,
 * asked for by filter_ohwi (the GPU's default, [run] filter_layout): a
 * parameter read only as conv2d filters is labelled NHWC, memory [O, kh,
 * kw, C] as channels_last keeps it in PyTorch, and its engines read it so;
 * initial values and checkpoints stay [O, C, kh, kw]
 * (stoke_plan_filters_permute converts at the host copies). Where a reader
 * gets a 4-D activation in the other order, the pass puts a conversion in
 * front of it, as PyTorch's reshape copies a channels_last tensor it cannot
 * view (x.contiguous()): reshape to (N, H W, C) or (N, C, H W), a
 * transpose of the last two dimensions (the one copy), and a reshape back
 * to (N, C, H, W) in the wanted order. The reshapes are views (core/alias.c)
 * and the backward of the three is the conversion back, so gradients need
 * nothing more. When C = 1 or H W = 1 both orders are the same memory: the
 * reader gets a relabelling reshape (a view; kernels are found by, and
 * check, their inputs' labels). Each value is converted at most once per
 * order; the plan report says how many and which. The input batch's cast
 * (f32 to the graph's dtype and layout) writes row-major when only
 * row-major ops read it, and is a view when that leaves it nothing to do
 * (an f32 batch into an f32 graph). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"

typedef enum { ROW_MAJOR, AWARE, ELEMENTWISE, KEEP } layout_class;

static int in_list(const char *op, const char *const *list) {
  for (int i = 0; list[i]; i++)
    if (!strcmp(op, list[i])) return 1;
  return 0;
}

static int same_shape(const stoke_shape *a, const stoke_shape *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->d[i] != b->d[i]) return 0;
  return 1;
}

/* What node f assumes of its 4-D inputs' memory order. */
static layout_class classify(const stoke_graph *g, const stoke_gnode *f) {
  static const char *const aware[] = {STOKE_OP_CONV2D,        STOKE_OP_BIAS_ADD,     STOKE_OP_FLATTEN,
                                      STOKE_OP_GLOBAL_AVG_POOL, STOKE_OP_MAX_POOL2D, STOKE_OP_AVG_POOL2D,
                                      STOKE_OP_MAX_POOL2D_IDX, STOKE_OP_BATCH_NORM,  STOKE_OP_BN_RELU,
                                      STOKE_OP_BN_ADD_RELU,    STOKE_OP_CONV_BN,     STOKE_OP_BN_RELU_CONV_BN,
                                      STOKE_OP_BN_APPLY,       STOKE_OP_BN_APPLY_RELU, STOKE_OP_BN_APPLY_ADD_RELU,
                                      STOKE_OP_BN_ADD_BN_RELU, NULL};
  static const char *const elementwise[] = {STOKE_OP_RELU,    STOKE_OP_GELU,     STOKE_OP_ADD,
                                            STOKE_OP_DROPOUT, STOKE_OP_AUTOCAST, NULL};
  /* the input's conversion: its output's order is its layout attribute, its input the source's */
  static const char *const keep[] = {STOKE_OP_NORMALIZE, STOKE_OP_CAST, NULL};
  const char *op = f->n.op;
  if (in_list(op, aware)) return AWARE;
  if (in_list(op, elementwise)) return ELEMENTWISE;
  if (in_list(op, keep)) return KEEP;
  if (stoke_op_is_builtin(g->reg, op)) return ROW_MAJOR;
  /* a plugin's op: elementwise when every input and output has one shape */
  if (f->n_in < 1 || f->n_out < 1) return ROW_MAJOR;
  const stoke_shape *s = &g->values[f->in[0]].shape;
  for (int k = 1; k < f->n_in; k++)
    if (!same_shape(&g->values[f->in[k]].shape, s)) return ROW_MAJOR;
  for (int j = 0; j < f->n_out; j++)
    if (!same_shape(&g->values[f->out[j]].shape, s)) return ROW_MAJOR;
  return ELEMENTWISE;
}

static int persistent(const stoke_value *val) { return val->kind == STOKE_VAL_PARAM || val->kind == STOKE_VAL_STATE; }

/* A 4-D value whose order the pass manages (any kind: an activation, an
 * input, a parameter or state tensor). */
static int managed(const stoke_graph *g, int v) {
  const stoke_value *val = &g->values[v];
  return val->shape.ndim == 4 && (val->layout == STOKE_NCHW || val->layout == STOKE_NHWC);
}

/* Input k of aware node f is a convolution's filter: [O, C, kh, kw] in
 * memory on every engine (the kernels stage it as they need), whatever the
 * graph's layout, so row-major for the pass, whoever made it. */
static int is_filter(const stoke_gnode *f, int k) {
  const char *op = f->n.op;
  if (!strcmp(op, STOKE_OP_CONV2D) || !strcmp(op, STOKE_OP_CONV_BN)) return k == 1;
  if (!strcmp(op, STOKE_OP_BN_RELU_CONV_BN)) return k == STOKE_BN_RELU_CONV_BN_WEIGHT;
  return 0;
}

/* Through the copies and views a compiler pass may put between a
 * parameter and its convolution: an autocast (fp32_ops = conv2d), a
 * reshape (a parameter read twice by one node); `depth` bounds the walk. */
static int feeds_filter(const stoke_graph *g, int v, int depth) {
  for (int i = 0; i < g->n_fwd; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++) {
      const stoke_gnode *f = &g->nodes[i];
      if (f->in[k] != v) continue;
      if (is_filter(f, k)) return 1;
      if (depth > 0 && f->n_out == 1 && (!strcmp(f->n.op, STOKE_OP_AUTOCAST) || !strcmp(f->n.op, STOKE_OP_RESHAPE)) &&
          feeds_filter(g, f->out[0], depth - 1))
        return 1;
    }
  return 0;
}

int stoke_value_is_filter(const stoke_graph *g, int v) { return feeds_filter(g, v, 4); }

/* A parameter that filter_ohwi keeps [O, kh, kw, C]: 4-D, read by forward
 * nodes only as a conv2d's filter (k = 1), directly; a parameter read
 * otherwise too (an autocast, a reshape, a plugin's op) stays row-major. */
static int ohwi_candidate(const stoke_graph *g, int v) {
  const stoke_value *val = &g->values[v];
  if (val->kind != STOKE_VAL_PARAM || val->shape.ndim != 4) return 0;
  int readers = 0;
  for (int i = 0; i < g->n_fwd; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++) {
      if (g->nodes[i].in[k] != v) continue;
      if (strcmp(g->nodes[i].n.op, STOKE_OP_CONV2D) || k != 1) return 0;
      readers++;
    }
  return readers > 0;
}

int stoke_value_is_ohwi(const stoke_graph *g, int v) {
  const stoke_value *val = &g->values[v];
  return g->layout == STOKE_NHWC && val->kind == STOKE_VAL_PARAM && val->shape.ndim == 4 &&
         val->layout == STOKE_NHWC;
}

void stoke_permute_nhwc(void *data, stoke_dtype dt, const stoke_shape *s, int to_nhwc, void *tmp) {
  int64_t a = s->d[0], b = s->d[1], hw = s->d[2] * s->d[3];
  size_t es = stoke_dtype_size(dt);
  char *base = data, *t = tmp;
  for (int64_t i = 0; i < a; i++) {
    char *blk = base + (size_t)(i * b * hw) * es;
    memcpy(t, blk, (size_t)(b * hw) * es);
    for (int64_t c = 0; c < b; c++)
      for (int64_t p = 0; p < hw; p++) {
        size_t row = (size_t)(c * hw + p), nhwc = (size_t)(p * b + c);
        memcpy(blk + (to_nhwc ? nhwc : row) * es, t + (to_nhwc ? row : nhwc) * es, es);
      }
  }
}

typedef struct pass {
  stoke_graph *g;
  int *done;   /* per original value and order: its converted value, or -1 */
  int n_orig;
  int count;   /* values converted (a copy each) */
  int relabel; /* values relabelled (C = 1 or H W = 1: no copy) */
  char names[256];
} pass;

/* Value v in order `want`, the conversion appended once. */
static stoke_err *convert(pass *ps, int v, stoke_layout want, int *out) {
  stoke_graph *g = ps->g;
  int slot = 2 * v + (want == STOKE_NHWC);
  /* a state's copy is made again for each reader: a plugin's op may update the state in between */
  int keep = v < ps->n_orig && g->values[v].kind != STOKE_VAL_STATE;
  if (keep && ps->done[slot] >= 0) {
    *out = ps->done[slot];
    return NULL;
  }
  const stoke_value *val = &g->values[v];
  int64_t n = val->shape.d[0], c = val->shape.d[1], h = val->shape.d[2], w = val->shape.d[3];
  char name[96], base[72];
  snprintf(base, sizeof base, "%.60s.%s", val->name, want == STOKE_NHWC ? "nhwc" : "nchw");
  stoke_shape s4 = val->shape;
  if (c == 1 || h * w == 1) { /* the same memory either way: a view with the wanted label (kernels are found
                                * by, and check, their inputs' labels; a gradient shared by two inputs takes one) */
    STOKE_PROPAGATE(stoke_graph_append_reshape(g, base, v, &s4, want, out));
    ps->relabel++;
  } else {
    /* NHWC memory is row-major (N, H W, C); NCHW memory is row-major (N, C, H W) */
    stoke_shape from = want == STOKE_NCHW ? (stoke_shape){3, {n, h * w, c}} : (stoke_shape){3, {n, c, h * w}};
    stoke_shape swapped = {3, {n, from.d[2], from.d[1]}};
    int a, t;
    snprintf(name, sizeof name, "%s.view", base);
    STOKE_PROPAGATE(stoke_graph_append_reshape(g, name, v, &from, STOKE_LAYOUT_ANY, &a));
    snprintf(name, sizeof name, "%s.transpose", base);
    STOKE_PROPAGATE(stoke_graph_new_value(g, name, STOKE_VAL_ACT, &swapped, g->values[v].dtype, &t));
    STOKE_PROPAGATE(stoke_graph_append_unary(g, STOKE_OP_TRANSPOSE, name, "dim0=1, dim1=2", a, t));
    STOKE_PROPAGATE(stoke_graph_append_reshape(g, base, t, &s4, want, out));
    size_t used = strlen(ps->names);
    if (used + 2 < sizeof ps->names)
      snprintf(ps->names + used, sizeof ps->names - used, "%s'%s' to %s", ps->count ? ", " : "",
               g->values[v].name, want == STOKE_NHWC ? "NHWC" : "row-major");
    ps->count++;
  }
  if (keep) ps->done[slot] = *out;
  return NULL;
}

/* Whether every forward node after i that reads value v reads memory
 * row-major (and one does): the input batch's cast then writes it so. */
static int read_row_major(const stoke_graph *g, const stoke_gnode *old, int n_old, int i, int v) {
  int readers = 0;
  for (int j = i + 1; j < n_old; j++)
    for (int k = 0; k < old[j].n_in; k++)
      if (old[j].in[k] == v) {
        if (classify(g, &old[j]) != ROW_MAJOR) return 0;
        readers++;
      }
  return readers > 0;
}

/* Node f with its 4-D inputs in the order it assumes, its 4-D outputs
 * labelled with the order it writes. */
static stoke_err *place(void *ctx, const stoke_gnode *old, int n_old, int i) {
  pass *ps = ctx;
  stoke_graph *g = ps->g;
  stoke_gnode f = old[i];
  layout_class cls = classify(g, &f);
  /* an elementwise op's order: a 4-D state's (a plugin's op may update it in place: never a copy), else NHWC
   * when an activation comes in NHWC (the convolutions' order: fewer copies where they follow), else its first
   * activation's (a parameter is converted, not the activation), else its first 4-D input's. Only an aware op's
   * image input copies a state, and none of those writes its image. */
  stoke_layout along = STOKE_LAYOUT_ANY;
  for (int pass = 0; pass < 4 && cls == ELEMENTWISE && along == STOKE_LAYOUT_ANY; pass++)
    for (int k = 0; k < f.n_in && along == STOKE_LAYOUT_ANY; k++) {
      const stoke_value *val = &g->values[f.in[k]];
      int state = val->kind == STOKE_VAL_STATE, act = !persistent(val);
      if (managed(g, f.in[k]) && (pass == 0   ? state
                                  : pass == 1 ? act && val->layout == STOKE_NHWC
                                  : pass == 2 ? act
                                              : 1))
        along = val->layout;
    }
  for (int k = 0; k < f.n_in && cls != KEEP; k++) {
    int v = f.in[k], filter = cls == AWARE && is_filter(&f, k);
    if (!managed(g, v)) continue;
    /* a filter in its parameter's order: row-major, or [O, kh, kw, C] (filter_ohwi) */
    stoke_layout want = filter && stoke_value_is_ohwi(g, v) ? STOKE_NHWC
                        : cls == ROW_MAJOR || filter      ? STOKE_NCHW
                        : cls == AWARE                    ? STOKE_NHWC
                                                          : along;
    if (g->values[v].layout == want) continue;
    STOKE_TRY(convert(ps, v, want, &f.in[k]), "node '%s' (%s): its input %d in %s order",
              f.name_buf, f.n.op, k, want == STOKE_NHWC ? "NHWC" : "row-major");
  }
  stoke_layout out = cls == ROW_MAJOR ? STOKE_NCHW : cls == AWARE ? STOKE_NHWC : along;
  /* normalize: its layout attribute; cast: the graph's, but row-major from a row-major batch when only row-major
   * ops read it (a ViT's patchify: no transposition there and back) */
  int is_cast = cls == KEEP && !strcmp(f.n.op, STOKE_OP_CAST);
  int row_major_batch = is_cast && managed(g, f.in[0]) && g->values[f.in[0]].layout == STOKE_NCHW;
  if (cls == KEEP)
    out = !is_cast ? (!strcmp(f.n.attrs[STOKE_NORMALIZE_LAYOUT].s, "nchw") ? STOKE_NCHW : g->layout)
          : row_major_batch && read_row_major(g, old, n_old, i, f.out[0]) ? STOKE_NCHW
                                                                          : g->layout;
  if (out == STOKE_LAYOUT_ANY) out = g->layout;
  for (int j = 0; j < f.n_out; j++) {
    stoke_value *y = &g->values[f.out[j]];
    if (y->shape.ndim == 4 && y->layout != STOKE_LAYOUT_ANY) y->layout = out;
  }
  /* a cast of an f32 batch into an f32 graph exists to transpose it into NHWC: kept row-major it would copy the
   * batch as it is, so a view takes its place */
  if (row_major_batch && out == STOKE_NCHW && g->values[f.out[0]].dtype == g->values[f.in[0]].dtype)
    return stoke_graph_append_view_into(g, f.name_buf, f.in[0], f.out[0]);
  return stoke_graph_append_fwd(g, &f);
}

stoke_err *stoke_layout_pass(stoke_graph *g, int filter_ohwi, int *n_ohwi, int *n_converted, int *n_relabelled,
                             char *names, size_t cap) {
  *n_ohwi = 0;
  *n_converted = *n_relabelled = 0;
  if (names && cap) names[0] = 0;
  if (g->layout != STOKE_NHWC) return NULL; /* every 4-D value is row-major already */
  pass ps = {g, malloc(sizeof(int) * 2 * (size_t)(g->n_values + 1)), g->n_values, 0, 0, {0}};
  if (!ps.done) return STOKE_ERR(STOKE_E_OOM, "out of memory for the layout pass");
  for (int i = 0; i < 2 * g->n_values; i++) ps.done[i] = -1;
  /* parameters and state are row-major in memory (and in checkpoints) in every graph */
  for (int v = 0; v < g->n_values; v++)
    if (persistent(&g->values[v]) && g->values[v].shape.ndim == 4) g->values[v].layout = STOKE_NCHW;
  /* but a parameter read only as convolutions' filters [O, kh, kw, C] when asked: cuDNN's NHWC kernels read it
   * as it is (each call transposed a row-major one) */
  for (int v = 0; filter_ohwi && v < g->n_values; v++)
    if (ohwi_candidate(g, v)) g->values[v].layout = STOKE_NHWC, (*n_ohwi)++;
  stoke_err *e = stoke_graph_rewrite_fwd(g, place, &ps);
  free(ps.done);
  *n_converted = ps.count;
  *n_relabelled = ps.relabel;
  if (names && cap) snprintf(names, cap, "%s", ps.names);
  return e ? stoke_err_wrap(e, __FILE__, __LINE__, "keeping 4-D values in the memory order their readers assume")
           : NULL;
}
