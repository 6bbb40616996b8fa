/* core/plan.c: the compiler: backward derivation, kernel resolution over
 * the ordered engine list, and the memory plan (flat parameter, gradient
 * and optimizer-state buffers; one activation arena placed by liveness). */
#define _GNU_SOURCE /* qsort_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/check.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

stoke_err *stoke_graph_derive_backward(stoke_graph *g); /* core/graph.c */
void stoke_graph_grad_flow(const stoke_graph *g, char *needs); /* core/graph.c */
/* core/autocast.c: the precision policy's fp32_ops in f32 */
stoke_err *stoke_autocast_islands(stoke_graph *g, const char *policy, const char *fp32_ops);
/* core/fuse_act.c: linear -> relu|gelu -> linear epilogue fusion */
stoke_err *stoke_fuse_linear_act(stoke_graph *g, const stoke_plan_opts *o);
stoke_err *stoke_fuse_act_grad(stoke_graph *g);
stoke_err *stoke_fuse_bias_ln(stoke_graph *g, const stoke_plan_opts *o);
void stoke_graph_drop_fwd_node(stoke_graph *g, int r);
/* core/fuse_grad.c: gradient sums accumulated by their producers */
int stoke_fuse_grad_sums(stoke_graph *g);
int stoke_fuse_fwd_in_bwd(stoke_graph *g);
/* core/alias.c: views and in-place gradients share their input's memory */
void stoke_plan_aliases(stoke_graph *g);
void stoke_place_aliases(stoke_graph *g);
/* core/recompute.c: forward nodes re-run in backward (run.recompute) */
stoke_err *stoke_recompute(stoke_graph *g, const stoke_plan_opts *o, stoke_plan *p);
stoke_err *stoke_layout_pass(stoke_graph *g, int filter_ohwi, int *n_ohwi, int *n_converted, int *n_relabelled,
                             char *names, size_t cap);

#define ALIGN 256 /* bytes: every buffer offset, so GPU kernels can vectorize */

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static const char *pass_name(stoke_pass p) {
  return p == STOKE_FWD ? "forward" : p == STOKE_BWD ? "backward" : "update";
}

static const char *node_pass_name(const stoke_gnode *n) {
  return n->recompute ? "recompute" : stoke_node_in_bwd(n) ? "in bwd" : pass_name(n->pass);
}

/* The engines registered (by any loaded plugin) with a kernel of this
 * op and pass for the node's input ("these backends have one: cudnn"),
 * and, for the "no kernel" message when there is none, the kernels of the
 * op and pass whose dtype or layout does not fit ("cpu bf16 NHWC (from
 * libstoke_x.so)"): a plugin that declared the wrong one shows there. */
typedef struct engines_with {
  const char *op;
  stoke_pass pass;
  stoke_dtype dtype;
  stoke_layout layout;
  char text[256], other[512];
  size_t used, other_used;
} engines_with;

static void note_engine(void *ctx, const void *part, const char *origin) {
  engines_with *w = ctx;
  const stoke_kernel_v1 *k = part;
  if (strcmp(k->op, w->op) || k->pass != w->pass) return;
  if (k->dtype != w->dtype || (k->layout != STOKE_LAYOUT_ANY && k->layout != w->layout)) {
    if (w->other_used < sizeof w->other)
      w->other_used += (size_t)snprintf(w->other + w->other_used, sizeof w->other - w->other_used,
                                        "%s%s %s%s%s (from %s)", w->other_used ? ", " : "", k->engine,
                                        stoke_dtype_name(k->dtype), k->layout == STOKE_LAYOUT_ANY ? "" : " ",
                                        k->layout == STOKE_LAYOUT_ANY ? "" : stoke_layout_name(k->layout),
                                        origin ? origin : "?");
    return;
  }
  if (w->used >= sizeof w->text || strstr(w->text, k->engine)) return;
  w->used += (size_t)snprintf(w->text + w->used, sizeof w->text - w->used, "%s%s", w->used ? ", " : "", k->engine);
}

/* [run] wgrad_stream: backward nodes whose kernel may compute their
 * parameter gradients on the side stream; their count. */
static int mark_side(stoke_graph *g, int lag) {
  int count = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    stoke_gnode *n = &g->nodes[i];
    n->side = 0;
    if (n->pass != STOKE_BWD || !n->kernel || !(n->kernel->caps & STOKE_KCAP_SIDE_GRADS)) continue;
    for (int k = 0; k < n->n_in && !n->side; k++)
      if (n->din[k] >= 0 && g->values[n->din[k]].kind == STOKE_VAL_PARAM_GRAD) n->side = lag;
    count += n->side > 0;
  }
  return count;
}

/* First engine in the ordered list with a kernel for the node. */
static stoke_err *resolve(const stoke_graph *g, const stoke_plan_opts *o, stoke_gnode *n) {
  const stoke_value *x = &g->values[n->in[0]];
  for (int i = 0; i < o->n_engines; i++) {
    n->kernel = stoke_find_kernel(g->reg, o->engines[i], n->n.op, n->pass, x->dtype, x->layout);
    if (n->kernel) return NULL;
  }
  char list[256] = "";
  size_t used = 0;
  for (int i = 0; i < o->n_engines && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", o->engines[i]);
  engines_with w = {.op = n->n.op, .pass = n->pass, .dtype = x->dtype, .layout = x->layout};
  stoke_registry_each(g->reg, "kernel", note_engine, &w);
  const char *pass = pass_name(n->pass), *dt = stoke_dtype_name(x->dtype);
  if (w.used)
    return STOKE_ERR(STOKE_E_UNSUPPORTED,
                     "node '%s': no kernel for op '%s' (%s, %s) in backends [%s]; these backends have one: %s (add "
                     "one to [run] backends)",
                     n->n.name, n->n.op, pass, dt, list, w.text);
  if (w.other_used)
    return STOKE_ERR(STOKE_E_UNSUPPORTED,
                     "node '%s': no kernel for op '%s' (%s, %s) in backends [%s]; the %s kernels of '%s' registered "
                     "are for other dtypes or layouts: %s; the node's input is %s, layout %s (a kernel serves it "
                     "when its dtype is the input's and its layout the input's or STOKE_LAYOUT_ANY: a plugin's "
                     "kernel table may declare the wrong one, or [run] precision picks a dtype it lacks)",
                     n->n.name, n->n.op, pass, dt, list, pass, n->n.op, w.other, dt, stoke_layout_name(x->layout));
  return STOKE_ERR(STOKE_E_UNSUPPORTED,
                   "node '%s': no kernel for op '%s' (%s, %s) in backends [%s]; no loaded backend has one: load the "
                   "plugin that provides it ([plugins] load) or add its backend to [run] backends",
                   n->n.name, n->n.op, pass, dt, list);
}

/* Does node m read or write one of node n's parameter gradients? */
static int touches_param_grads(const stoke_graph *g, const stoke_gnode *n, const stoke_gnode *m) {
  for (int k = 0; k < n->n_in; k++) {
    int d = n->din[k];
    if (d < 0 || g->values[d].kind != STOKE_VAL_PARAM_GRAD) continue;
    for (int q = 0; q < m->n_in; q++)
      if (m->in[q] == d || m->din[q] == d) return 1;
    for (int q = 0; q < m->n_out; q++)
      if (m->out[q] == d || m->dout[q] == d) return 1;
  }
  return 0;
}

/* [run] wgrad_stream: where the main stream waits for each side node's
 * parameter gradients: before the side-th side node after it, or before
 * the first node that reads or writes one of those gradients (a tied
 * weight's second backward), else at the backward's end. */
static void side_joins(stoke_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    stoke_gnode *n = &g->nodes[i];
    n->side_join = 0;
    if (!n->side) continue;
    int j = i + 1;
    for (int forks = 0; j < g->n_nodes; j++) {
      const stoke_gnode *m = &g->nodes[j];
      if ((m->side && ++forks == n->side) || touches_param_grads(g, n, m)) break;
    }
    n->side_join = j;
  }
}

/* Schedule positions where each arena value is written and read; what a
 * side node reads stays live until the node before its join. */
static void liveness(stoke_graph *g) {
  int end = g->n_nodes;
  side_joins(g);
  for (int v = 0; v < g->n_values; v++) {
    stoke_value *val = &g->values[v];
    int whole = val->kind == STOKE_VAL_INPUT || val->kind == STOKE_VAL_LABEL ||
                val->kind == STOKE_VAL_SEED || v == g->loss;
    val->first = whole ? 0 : val->producer >= 0 ? val->producer : 0;
    val->last = whole ? end : val->first;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    stoke_gnode *n = &g->nodes[i];
    int until = n->side ? n->side_join - 1 : i; /* the side work reads them until its join */
    for (int k = 0; k < n->n_in; k++) {
      int reads = n->pass != STOKE_BWD || (n->type->bwd_needs & STOKE_BWD_NEEDS_INPUT(k));
      if (reads && g->values[n->in[k]].last < until) g->values[n->in[k]].last = until;
    }
    for (int j = 0; j < n->n_out; j++) {
      if (n->pass == STOKE_BWD) {
        if ((n->type->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j)) && g->values[n->out[j]].last < until)
          g->values[n->out[j]].last = until;
        if (n->dout[j] >= 0 && g->values[n->dout[j]].last < until) g->values[n->dout[j]].last = until;
      }
    }
    if (n->pass == STOKE_BWD)
      for (int k = 0; k < n->n_in; k++)
        if (n->din[k] >= 0) {
          stoke_value *d = &g->values[n->din[k]];
          if (d->first > i || d->producer == i) d->first = i;
          if (d->last < i) d->last = i;
        }
  }
}

static int by_size_desc(const void *a, const void *b, void *vals) {
  const stoke_value *v = vals;
  size_t x = v[*(const int *)a].bytes, y = v[*(const int *)b].bytes;
  return x < y ? 1 : x > y ? -1 : *(const int *)a - *(const int *)b;
}

/* Greedy best-fit by size: each value goes to the lowest offset that does
 * not overlap any placed value whose lifetime intersects its own. */
static stoke_err *place_arena(stoke_graph *g, size_t *total) {
  int *order = malloc(sizeof(int) * (size_t)g->n_values), n = 0;
  int *placed = malloc(sizeof(int) * (size_t)g->n_values), n_placed = 0;
  if (!order || !placed) {
    free(order);
    free(placed);
    return STOKE_ERR(STOKE_E_OOM, "out of memory planning the arena");
  }
  for (int v = 0; v < g->n_values; v++)
    if (g->values[v].buffer == STOKE_BUF_ARENA && g->values[v].alias < 0) order[n++] = v;
  qsort_r(order, (size_t)n, sizeof(int), by_size_desc, g->values);
  *total = 0;
  for (int i = 0; i < n; i++) {
    stoke_value *v = &g->values[order[i]];
    size_t off = 0;
    for (int again = 1; again;) {
      again = 0;
      for (int j = 0; j < n_placed; j++) {
        stoke_value *p = &g->values[placed[j]];
        int live = !(p->last < v->first || v->last < p->first);
        int overlap = off < p->offset + p->bytes && p->offset < off + v->bytes;
        if (live && overlap) {
          off = align_up(p->offset + p->bytes);
          again = 1;
        }
      }
    }
    v->offset = off;
    placed[n_placed++] = order[i];
    if (off + v->bytes > *total) *total = off + v->bytes;
  }
  free(order);
  free(placed);
  return NULL;
}

/* The activation arena: each arena value's size, its liveness, the
 * aliases (views, in-place gradients) and the placement; *total its
 * bytes. Run again from scratch on a changed graph (core/recompute.c
 * weighs its choices with it). */
stoke_err *stoke_plan_arena(stoke_graph *g, size_t *total) {
  for (int v = 0; v < g->n_values; v++) {
    stoke_value *val = &g->values[v];
    val->alias = -1;
    if (val->buffer == STOKE_BUF_ARENA) val->bytes = align_up((size_t)stoke_numel(&val->shape) * stoke_dtype_size(val->dtype));
  }
  liveness(g);
  stoke_plan_aliases(g);
  return place_arena(g, total);
}

/* The engine that would serve `op` (pass) for a value, or NULL. */
static const char *engine_for(const stoke_graph *g, const stoke_plan_opts *o, const char *op, stoke_pass pass,
                              const stoke_value *x) {
  for (int i = 0; i < o->n_engines; i++)
    if (stoke_find_kernel(g->reg, o->engines[i], op, pass, x->dtype, x->layout)) return o->engines[i];
  return NULL;
}

/* Fusion patterns (stoke_fusion_v1, registered by the core and by
 * plugins): a chain head -> [add ->] tail of forward nodes, each
 * intermediate value read by the next node alone, becomes one `fused`
 * node when an engine has its forward and backward kernels and comes no
 * later in the backends list than the engine that serves the head (so a
 * fused op never trades a better engine's head kernel for a worse one);
 * the same engine as the head's only with [run] fuse = true, except for
 * patterns marked gpu_own on a GPU engine:
 *   linear -> relu: the ReLU in the matmul's epilogue (cublaslt);
 *   batch_norm -> relu and batch_norm -> add -> relu: one pass per
 *   direction over the activations instead of two or three (fused, which
 *   serves the lone batch_norm too: gpu_own; the cpu reference keeps the
 *   nodes apart unless run.fuse).
 * The fused node takes the head's inputs (then the add's other input) and
 * attributes, its name, and the tail's output; it sits where the tail was,
 * after every node that makes one of its inputs (a ResNet block's
 * shortcut branch comes after its main branch's last batch_norm). */

/* Whether engine `name` runs on the GPU. */
static int engine_on_gpu(const stoke_graph *g, const char *name) {
  const stoke_backend_v1 *b = name ? stoke_find_backend(g->reg, name) : NULL;
  return b && b->device == STOKE_DEV_GPU;
}

/* Index of engine `name` in the list, or n_engines when absent. */
static int engine_rank(const stoke_plan_opts *o, const char *name) {
  int i = 0;
  while (name && i < o->n_engines && strcmp(o->engines[i], name)) i++;
  return name ? i : o->n_engines;
}

/* The forward node that alone reads value v, or -1 (also for the logits and the loss). */
static int only_reader(const stoke_graph *g, int v) {
  if (v == g->logits || v == g->loss) return -1;
  int reader = -1, readers = 0;
  for (int i = 0; i < g->n_fwd; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] == v) reader = i, readers++;
  return readers == 1 ? reader : -1;
}

/* A value no node writes any more takes no memory. */
static void drop_value(stoke_graph *g, int v) {
  g->values[v].producer = -1;
  g->values[v].shape = (stoke_shape){1, {1}};
}

/* Node f (a copy, not yet in the graph's list, or a node of it) as op ft:
 * the outputs ft has beyond f's first n_out become new values, shaped by
 * ft's inference over f's inputs and attributes and named "<node>:<j>" (or
 * "<node>:<suffix>" for a single one), 4-D ones in the layout of f's
 * output 0. 0, with f unchanged, where the inference refuses (a pool window
 * too large for its index) or memory runs out. */
static int add_outputs(stoke_graph *g, stoke_gnode *f, const stoke_op_type_v1 *ft, const char *suffix) {
  if (f->n_out >= ft->n_outputs) return 1;
  stoke_value_desc_v1 in[STOKE_MAX_IO], out[STOKE_MAX_IO];
  memset(out, 0, sizeof out);
  for (int i = 0; i < f->n_in; i++) in[i] = (stoke_value_desc_v1){g->values[f->in[i]].shape, g->values[f->in[i]].dtype};
  stoke_err *e = ft->infer(&f->n, in, out);
  int ids[STOKE_MAX_IO];
  for (int j = f->n_out; j < ft->n_outputs && !e; j++) {
    char vn[96];
    if (suffix) snprintf(vn, sizeof vn, "%s:%s", f->n.name, suffix);
    else snprintf(vn, sizeof vn, "%s:%d", f->n.name, j);
    e = stoke_graph_new_value(g, vn, STOKE_VAL_ACT, &out[j].shape, out[j].dtype, &ids[j]);
    if (!e && out[j].shape.ndim == 4) g->values[ids[j]].layout = g->values[f->out[0]].layout;
  }
  if (e) {
    stoke_err_free(e);
    return 0;
  }
  for (int j = f->n_out; j < ft->n_outputs; j++) f->out[j] = ids[j];
  f->n_out = ft->n_outputs;
  return 1;
}

/* Apply pattern p at tail node t if it matches; 1 when the graph changed. */
static int fuse_at(stoke_graph *g, const stoke_plan_opts *o, const stoke_fusion_v1 *p, int t) {
  stoke_gnode *tn = &g->nodes[t];
  if (strcmp(tn->n.op, p->tail)) return 0;
  int mid = -1, h = g->values[tn->in[0]].producer, other = -1;
  if (p->add) { /* tail <- add(head's output, other) or add(other, head's output) */
    mid = h;
    if (mid < 0 || strcmp(g->nodes[mid].n.op, STOKE_OP_ADD) || only_reader(g, tn->in[0]) != t) return 0;
    h = -1;
    for (int k = 0; k < 2 && h < 0; k++) {
      int v = g->nodes[mid].in[k], pr = g->values[v].producer;
      if (pr >= 0 && !strcmp(g->nodes[pr].n.op, p->head) && only_reader(g, v) == mid &&
          g->nodes[mid].in[1 - k] != v)
        h = pr, other = g->nodes[mid].in[1 - k];
    }
  }
  if (h < 0 || strcmp(g->nodes[h].n.op, p->head) || g->nodes[h].n_out < 1) return 0;
  int hv = g->nodes[h].out[0];
  if (only_reader(g, hv) != (p->add ? mid : t)) return 0;
  const stoke_value *x = &g->values[g->nodes[h].in[0]];
  int head = engine_rank(o, engine_for(g, o, p->head, STOKE_FWD, x));
  int fwd = engine_rank(o, engine_for(g, o, p->fused, STOKE_FWD, x));
  int bwd = engine_rank(o, engine_for(g, o, p->fused, STOKE_BWD, x));
  if (fwd >= o->n_engines || bwd >= o->n_engines || fwd > head || bwd > head) return 0;
  /* an engine listed before the head's for its fused kernels (backends =
   * fused, ...) asks for them; the head's own engine (cublaslt's ReLU
   * epilogue, the cpu reference) fuses only with [run] fuse = true, but
   * for gpu_own patterns on a GPU engine (fused's batch norms) */
  if (!o->fuse && (fwd == head || bwd == head) && !(p->gpu_own && engine_on_gpu(g, o->engines[head])))
    return 0;
  const stoke_op_type_v1 *ft = stoke_find_op(g->reg, p->fused);
  stoke_gnode f = g->nodes[h];
  if (!ft || f.n_in + (other >= 0) != ft->n_inputs || f.n_out > ft->n_outputs ||
      f.n.n_attrs + tn->n.n_attrs != ft->n_attrs)
    return 0;
  for (int i = 0; i < tn->n.n_attrs; i++) f.n.attrs[f.n.n_attrs++] = tn->n.attrs[i]; /* the head's, then the tail's */
  f.type = ft;
  f.n.op = ft->name;
  f.flops += tn->flops + (mid >= 0 ? g->nodes[mid].flops : 0);
  if (other >= 0) f.in[f.n_in++] = other;
  /* outputs the fused op has beyond the head's (bn_add_relu's ReLU bitmask for its backward) */
  if (!add_outputs(g, &f, ft, NULL)) return 0;
  int y = tn->out[0];
  f.out[0] = y;
  drop_value(g, hv);
  if (mid >= 0) drop_value(g, g->nodes[mid].out[0]);
  g->nodes[t] = f;
  g->nodes[t].n.name = g->nodes[t].name_buf;
  for (int j = 0; j < f.n_out; j++) g->values[f.out[j]].producer = t;
  /* the add and the head go (h < mid < t: the later first, indices stay valid) */
  if (mid >= 0) stoke_graph_drop_fwd_node(g, mid);
  stoke_graph_drop_fwd_node(g, h);
  return 1;
}

typedef struct fusion_list {
  const stoke_fusion_v1 *f[64];
  int n;
} fusion_list;

static void collect_fusion(void *ctx, const void *part, const char *origin) {
  fusion_list *l = ctx;
  if (l->n < 64) l->f[l->n++] = part;
}

/* Every registered pattern, the core's first, in registration order. */
static void fuse_patterns_all(stoke_graph *g, const stoke_plan_opts *o) {
  fusion_list l = {.n = 0};
  stoke_registry_each(g->reg, "fusion", collect_fusion, &l);
  for (int p = 0; p < l.n; p++)
    for (int t = 0; t < g->n_fwd; t++)
      if (fuse_at(g, o, l.f[p], t)) t = -1; /* indices moved: rescan */
}

/* Each bn_add_relu whose residual only a batch_norm's output is (alone
 * read by it: a ResNet block's strided shortcut, torchvision's downsample)
 * takes that batch_norm in: bn_add_bn_relu, when an engine serving it
 * comes no later in the backends list than the one serving the
 * bn_add_relu (fused's kernels: x, r, dy read twice a direction, bn2(r)
 * and the residual's gradient neither written nor read back). The node
 * keeps the bn_add_relu's place, after the shortcut's convolution; the
 * shortcut's saved statistics become its outputs 4 and 5, its attributes
 * follow the main batch norm's. Returns how many it joined. */
static int fuse_shortcut_bns(stoke_graph *g, const stoke_plan_opts *o) {
  const stoke_op_type_v1 *ft = stoke_find_op(g->reg, STOKE_OP_BN_ADD_BN_RELU);
  int n = 0;
  for (int t = 0; ft && t < g->n_fwd; t++) {
    stoke_gnode *tn = &g->nodes[t];
    if (strcmp(tn->n.op, STOKE_OP_BN_ADD_RELU) || tn->n_in != 6 || tn->n_out != 4) continue;
    int rv = tn->in[STOKE_BN_ADD_RELU_RESIDUAL], h = g->values[rv].producer;
    if (h < 0 || h >= t || strcmp(g->nodes[h].n.op, STOKE_OP_BATCH_NORM) || g->nodes[h].n_in != 5 ||
        g->nodes[h].n_out != 3 || g->nodes[h].n.n_attrs != 2 || only_reader(g, rv) != t)
      continue;
    const stoke_gnode *hn = &g->nodes[h];
    const stoke_value *x = &g->values[tn->in[0]], *x2 = &g->values[hn->in[0]];
    if (x2->dtype != x->dtype || x2->layout != x->layout || !stoke_same_shape(&x2->shape, &x->shape)) continue;
    int own = engine_rank(o, engine_for(g, o, STOKE_OP_BN_ADD_RELU, STOKE_FWD, x));
    int fwd = engine_rank(o, engine_for(g, o, ft->name, STOKE_FWD, x));
    int bwd = engine_rank(o, engine_for(g, o, ft->name, STOKE_BWD, x));
    if (fwd >= o->n_engines || bwd >= o->n_engines || fwd > own || bwd > own) continue;
    /* inputs: bn_add_relu's (r becomes the shortcut's x), then the shortcut's weight, bias, running stats */
    tn->in[STOKE_BN_ADD_RELU_RESIDUAL] = hn->in[0];
    for (int i = 1; i < 5; i++) tn->in[STOKE_BN2_WEIGHT + i - 1] = hn->in[i];
    tn->n_in = ft->n_inputs;
    for (int i = 0; i < 2; i++) tn->n.attrs[tn->n.n_attrs++] = hn->n.attrs[i];
    tn->out[STOKE_BN2_SAVED_MEAN] = hn->out[1];
    tn->out[STOKE_BN2_SAVED_MEAN + 1] = hn->out[2];
    tn->n_out = ft->n_outputs;
    tn->type = ft;
    tn->n.op = ft->name;
    tn->flops += hn->flops;
    g->values[hn->out[1]].producer = t;
    g->values[hn->out[2]].producer = t;
    drop_value(g, rv);
    stoke_graph_drop_fwd_node(g, h);
    t--; /* h < t: the node moved down one */
    n++;
  }
  return n;
}

/* Training: each max_pool2d with a parameter upstream of its input, whose
 * max_pool2d_idx kernels come no later in the backends list than its own,
 * becomes one, its window indices (u8, y's shape and layout) a new value
 * "<node>:index" that backward reads instead of x (as PyTorch's max_pool2d
 * saves its indices). x then need not live until backward, and the
 * backward does not scan the windows again: in ResNet-50 (bf16, batch 256)
 * that pass read 411 MB of x each step. A window of more than
 * STOKE_POOL_MAX_INDEX positions keeps max_pool2d. */
static int index_max_pools(stoke_graph *g, const stoke_plan_opts *o) {
  const stoke_op_type_v1 *ft = stoke_find_op(g->reg, STOKE_OP_MAX_POOL2D_IDX);
  /* grad[v]: a parameter is upstream of v, so backward may need v's gradient (as
   * stoke_graph_derive_backward decides); a max pool without one keeps max_pool2d: nothing would
   * read its index. Values added below are never a max pool's input. */
  char *grad = ft ? calloc((size_t)g->n_values + 1, 1) : NULL;
  if (!grad) return 0;
  stoke_graph_grad_flow(g, grad);
  int n = 0;
  for (int i = 0; i < g->n_fwd; i++) {
    stoke_gnode *nd = &g->nodes[i];
    if (strcmp(nd->n.op, STOKE_OP_MAX_POOL2D) || nd->n_out != 1 || !grad[nd->in[0]]) continue;
    const stoke_value *x = &g->values[nd->in[0]];
    int own = engine_rank(o, engine_for(g, o, STOKE_OP_MAX_POOL2D, STOKE_FWD, x));
    int fwd = engine_rank(o, engine_for(g, o, ft->name, STOKE_FWD, x));
    int bwd = engine_rank(o, engine_for(g, o, ft->name, STOKE_BWD, x));
    if (fwd >= o->n_engines || bwd >= o->n_engines || fwd > own || bwd > own) continue;
    /* a window too large for the index, or no memory: the node stays max_pool2d */
    if (!add_outputs(g, nd, ft, "index")) continue;
    g->values[nd->out[1]].producer = i;
    nd->type = ft;
    nd->n.op = ft->name;
    n++;
  }
  free(grad);
  return n;
}

/* The least memory traffic of one node run on its own: each value it
 * reads once, each it writes once (a backward node reads only what its
 * op's bwd_needs names, plus the output gradients). The sum over a step is
 * the bytes floor of node-by-node execution; fusion lowers it. */
double stoke_node_bytes(const stoke_graph *g, const stoke_gnode *n) {
  double b = 0;
  int moves = 0; /* a view whose every result shares its input's memory moves nothing */
  for (int j = 0; j < n->n_out && n->pass == STOKE_FWD; j++) moves |= g->values[n->out[j]].alias != n->in[0];
  if (n->pass == STOKE_BWD) moves = n->din[0] < 0 || g->values[n->din[0]].alias < 0 || n->type->n_inputs != 1;
  if (!moves && (!strcmp(n->n.op, STOKE_OP_RESHAPE) || !strcmp(n->n.op, STOKE_OP_SLICE) ||
                 !strcmp(n->n.op, STOKE_OP_SPLIT) || !strcmp(n->n.op, STOKE_OP_TRANSPOSE)))
    return 0;
  for (int k = 0; k < n->n_in; k++) {
    if (n->pass != STOKE_BWD || (n->type->bwd_needs & STOKE_BWD_NEEDS_INPUT(k)))
      b += (double)g->values[n->in[k]].bytes;
    if (n->pass == STOKE_BWD && n->din[k] >= 0) b += (double)g->values[n->din[k]].bytes;
  }
  for (int j = 0; j < n->n_out; j++) {
    if (n->pass != STOKE_BWD || (n->type->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j)))
      b += (double)g->values[n->out[j]].bytes;
    if (n->pass == STOKE_BWD && n->dout[j] >= 0) b += (double)g->values[n->dout[j]].bytes;
  }
  return b;
}

/* The dtype the optimizer updates and keeps its state in: the policy's
 * master_dtype; without a policy f32 for bf16 and fp16 parameters (a master
 * copy), else the parameters'. */
static stoke_dtype master_dtype(const stoke_graph *g, const stoke_plan_opts *o) {
  if (o->precision) return o->precision->master_dtype;
  return g->dtype == STOKE_BF16 || g->dtype == STOKE_F16 ? STOKE_F32 : g->dtype;
}

/* A policy this compiler can follow for graph g. */
static stoke_err *check_precision(const stoke_graph *g, const stoke_precision_v1 *p) {
  static const char *what[] = {"param_dtype", "compute_dtype", "master_dtype"};
  stoke_dtype dts[] = {p->param_dtype, p->compute_dtype, p->master_dtype};
  for (int i = 0; i < 3; i++)
    if (dts[i] != STOKE_F32 && dts[i] != STOKE_BF16 && dts[i] != STOKE_F16 && dts[i] != STOKE_F64)
      return STOKE_ERR(STOKE_E_INVALID, "precision '%s': %s is %s, not a float dtype", p->name, what[i],
                       stoke_dtype_name(dts[i]));
  if (p->compute_dtype != p->param_dtype)
    return STOKE_ERR(STOKE_E_UNSUPPORTED,
                     "precision '%s': compute_dtype %s differs from param_dtype %s; this compiler computes each "
                     "op in its activations' dtype (param_dtype), or in f32 for the ops in fp32_ops",
                     p->name, stoke_dtype_name(p->compute_dtype), stoke_dtype_name(p->param_dtype));
  if (p->param_dtype != g->dtype)
    return STOKE_ERR(STOKE_E_INTERNAL, "precision '%s' has %s parameters, the graph was built in %s", p->name,
                     stoke_dtype_name(p->param_dtype), stoke_dtype_name(g->dtype));
  return NULL;
}

/* The first engine's STOKE_OPT kernel of `op` for dtype dt, or NULL. */
static const stoke_kernel_v1 *opt_kernel(const stoke_graph *g, const stoke_plan_opts *o, const char *op,
                                         stoke_dtype dt) {
  const stoke_kernel_v1 *k = NULL;
  for (int i = 0; i < o->n_engines && !k; i++) k = stoke_find_kernel(g->reg, o->engines[i], op, STOKE_OPT, dt, STOKE_LAYOUT_ANY);
  return k;
}

/* The update's parts: the optimizer, its kernel, the loss scaler's and the
 * gradient norm's kernels, each from the first engine that has one. */
static stoke_err *resolve_update(const stoke_graph *g, const stoke_plan_opts *o, stoke_plan *p) {
  p->opt = stoke_find_optimizer(g->reg, o->optimizer);
  if (!p->opt) {
    char names[512];
    stoke_registry_names(g->reg, "optimizer", names, sizeof names);
    return STOKE_ERR(STOKE_E_NOT_FOUND, "unknown optimizer '%s' (registered: %s)", o->optimizer, names);
  }
  p->opt_state_per_param = p->opt->n_state;
  p->opt_kernel = opt_kernel(g, o, p->opt->name, g->dtype);
  if (!p->opt_kernel)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "no '%s' optimizer kernel for %s in the backends given", p->opt->name,
                     stoke_dtype_name(g->dtype));
  if (o->loss_scaling) {
    p->amp_check = opt_kernel(g, o, STOKE_OP_AMP_CHECK, g->dtype);
    p->amp_update = opt_kernel(g, o, STOKE_OP_AMP_UPDATE, STOKE_F32);
    if (!p->amp_check || !p->amp_update)
      return STOKE_ERR(STOKE_E_UNSUPPORTED, "no loss-scaler kernels (amp_check/amp_update) for %s in the backends given",
                       stoke_dtype_name(g->dtype));
  }
  if (o->grad_clip > 0 && !(p->grad_norm = opt_kernel(g, o, STOKE_OP_GRAD_NORM, g->dtype)))
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "[optimizer] grad_clip: no grad_norm kernel for %s in the backends given",
                     stoke_dtype_name(g->dtype));
  return NULL;
}

/* Weight decay by group: the element ranges of the parameters of >= 2
 * dimensions, each with its alignment padding (zeros: decaying them
 * changes nothing, and ranges stay multiples of 4 elements), neighbours
 * merged. Parameters lie in the flat buffer in value order. */
static stoke_err *plan_decay(const stoke_graph *g, const stoke_plan_opts *o, stoke_plan *p) {
  p->n_decay = -1;
  if (!p->opt_kernel || !o->decay_2d_only) return NULL;
  p->n_decay = 0;
  p->decay = malloc(sizeof *p->decay * 2 * (size_t)(g->n_values + 1));
  if (!p->decay) return STOKE_ERR(STOKE_E_OOM, "out of memory planning weight decay");
  size_t es = stoke_dtype_size(g->dtype);
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *val = &g->values[v];
    if (val->kind != STOKE_VAL_PARAM || val->shape.ndim < 2) continue;
    int64_t start = (int64_t)(val->offset / es), end = (int64_t)((val->offset + val->bytes) / es);
    int64_t *last = p->n_decay ? &p->decay[2 * p->n_decay - 2] : NULL;
    if (last && last[1] == start) last[1] = end;
    else p->decay[2 * p->n_decay] = start, p->decay[2 * p->n_decay + 1] = end, p->n_decay++;
  }
  return NULL;
}

stoke_err *stoke_compile(stoke_graph *g, const stoke_plan_opts *opts, stoke_plan **out) {
  if (opts->n_engines < 1) return STOKE_ERR(STOKE_E_INVALID, "no backend given");
  if (opts->n_engines > STOKE_MAX_ENGINES)
    return STOKE_ERR(STOKE_E_INVALID, "more than %d backends given", STOKE_MAX_ENGINES);
  /* every 4-D value in the memory order its readers assume (NHWC graphs), before anything else reads the graph */
  int n_conv = 0, n_relabel = 0, n_ohwi = 0;
  char conv_names[256];
  STOKE_PROPAGATE(
      stoke_layout_pass(g, opts->filter_ohwi, &n_ohwi, &n_conv, &n_relabel, conv_names, sizeof conv_names));
  /* the policy's fp32 ops first (a fusion must not swallow one), then
   * linear -> relu|gelu -> linear into cuBLASLt's epilogues (run.fuse),
   * then the pattern table (see fuse_at for when each applies) */
  if (opts->precision) {
    STOKE_PROPAGATE(check_precision(g, opts->precision));
    STOKE_PROPAGATE(stoke_autocast_islands(g, opts->precision->name, opts->precision->fp32_ops));
  }
  if (opts->fuse) STOKE_TRY(stoke_fuse_linear_act(g, opts), "fusing activations into linears");
  if (opts->fuse && !opts->no_bias_fold)
    STOKE_TRY(stoke_fuse_bias_ln(g, opts), "moving linears' biases into layer norms");
  fuse_patterns_all(g, opts);
  int n_shortcut_bn = opts->no_fuse_shortcut ? 0 : fuse_shortcut_bns(g, opts);
  int n_pool_index = opts->training && !opts->no_pool_index ? index_max_pools(g, opts) : 0;
  if (opts->training) STOKE_TRY(stoke_graph_derive_backward(g), "deriving the backward pass");
  if (opts->training && opts->fuse) STOKE_TRY(stoke_fuse_act_grad(g), "fusing activation gradients");
  stoke_plan *p = calloc(1, sizeof *p);
  if (!p) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  p->g = g;
  p->opts = *opts;
  p->n_pool_index = n_pool_index;
  p->n_shortcut_bn = n_shortcut_bn;
  p->n_filters_ohwi = n_ohwi;
  p->n_layout_converted = n_conv;
  p->n_layout_relabelled = n_relabel;
  snprintf(p->layout_converted, sizeof p->layout_converted, "%s", conv_names);
  /* the plan keeps its own copy of the engine list: callers' arrays may go */
  for (int i = 0; i < opts->n_engines; i++) {
    p->engines[i] = opts->engines[i];
    p->engine_selves[i] = opts->engine_selves ? opts->engine_selves[i] : NULL;
  }
  p->opts.engines = p->engines;
  p->opts.engine_selves = p->engine_selves;
  stoke_err *e = NULL;
  for (int i = 0; i < g->n_nodes && !e; i++) e = resolve(g, opts, &g->nodes[i]);
  if (!e && opts->training && !opts->no_grad_accumulate) p->n_accumulated = stoke_fuse_grad_sums(g);
  if (!e && opts->training && opts->wgrad_stream > 0) p->n_side = mark_side(g, opts->wgrad_stream);
  p->n_schedule = g->n_nodes;
  if (!e && opts->training && opts->optimizer) e = resolve_update(g, opts, p);
  if (e) {
    free(p);
    return e;
  }
  /* flat buffers: parameters and their gradients at the same offsets */
  for (int v = 0; v < g->n_values; v++) {
    stoke_value *val = &g->values[v];
    val->bytes = align_up((size_t)stoke_numel(&val->shape) * stoke_dtype_size(val->dtype));
    val->buffer = STOKE_BUF_ARENA;
    if (val->kind == STOKE_VAL_PARAM) {
      val->buffer = STOKE_BUF_PARAMS;
      val->offset = p->bytes[STOKE_BUF_PARAMS];
      p->bytes[STOKE_BUF_PARAMS] += val->bytes;
      p->n_params += stoke_numel(&val->shape);
    } else if (val->kind == STOKE_VAL_STATE) {
      val->buffer = STOKE_BUF_STATE;
      val->offset = p->bytes[STOKE_BUF_STATE];
      p->bytes[STOKE_BUF_STATE] += val->bytes;
    }
  }
  for (int v = 0; v < g->n_values; v++) {
    stoke_value *val = &g->values[v];
    if (val->kind == STOKE_VAL_PARAM && val->grad >= 0) {
      stoke_value *gr = &g->values[val->grad];
      gr->buffer = STOKE_BUF_GRADS;
      gr->offset = val->offset;
    }
  }
  if (opts->training) p->bytes[STOKE_BUF_GRADS] = p->bytes[STOKE_BUF_PARAMS];
  /* the optimizer state in the master dtype; the master copy first when
   * that is not the parameters' dtype */
  size_t elems = p->bytes[STOKE_BUF_PARAMS] / stoke_dtype_size(g->dtype);
  p->state_dtype = master_dtype(g, opts);
  p->has_master = p->opt_kernel && p->state_dtype != g->dtype;
  p->opt_state_bytes = p->opt_kernel ? (size_t)(p->opt_state_per_param + p->has_master) * elems *
                                           stoke_dtype_size(p->state_dtype)
                                     : 0;
  if (opts->training && opts->recompute && strcmp(opts->recompute, "none"))
    e = stoke_recompute(g, opts, p);
  if (!e && opts->training && !opts->no_fwd_in_bwd) p->n_fwd_in_bwd = stoke_fuse_fwd_in_bwd(g);
  if (!e) e = stoke_plan_arena(g, &p->bytes[STOKE_BUF_ARENA]);
  if (!e) e = plan_decay(g, opts, p);
  if (e) {
    stoke_plan_free(p);
    return e;
  }
  stoke_place_aliases(g);
  for (int i = 0; i < g->n_nodes; i++) {
    if (i < g->n_fwd) p->fwd_flops += g->nodes[i].flops;
    if (!g->nodes[i].recompute) p->train_flops += g->nodes[i].flops;
    /* a forward done by its backward kernel reads its inputs once, there */
    if ((i < g->n_fwd || opts->training) && !stoke_node_in_bwd(&g->nodes[i]))
      p->step_bytes += stoke_node_bytes(g, &g->nodes[i]);
  }
  if (!opts->training) p->train_flops = p->fwd_flops;
  if (p->opt_kernel) {
    /* the update reads gradients, reads and writes parameters (or the f32
     * master, then writes the working copy) and its state */
    size_t pb = p->bytes[STOKE_BUF_PARAMS];
    p->step_bytes += (double)pb * 3 + 2.0 * (double)p->opt_state_bytes - (p->has_master ? (double)pb : 0);
  }
  *out = p;
  return NULL;
}

double stoke_plan_device_bytes(const stoke_plan *p) {
  double b = (double)p->opt_state_bytes;
  for (int i = 0; i < STOKE_BUF_COUNT; i++) b += (double)p->bytes[i];
  return b;
}

stoke_err *stoke_plan_filters_permute(const stoke_plan *p, void *params, void *opt_state, int opt_regions,
                                      int to_device) {
  const stoke_graph *g = p->g;
  size_t most = 0;
  for (int v = 0; v < g->n_values; v++)
    if (stoke_value_is_ohwi(g, v)) {
      const stoke_shape *s = &g->values[v].shape;
      size_t block = (size_t)(s->d[1] * s->d[2] * s->d[3]);
      if (block > most) most = block;
    }
  if (!most) return NULL;
  void *tmp = malloc(most * 8);
  if (!tmp) return STOKE_ERR(STOKE_E_OOM, "out of host memory (%zu bytes) to reorder convolution filters", most * 8);
  size_t es = stoke_dtype_size(g->dtype), ss = stoke_dtype_size(p->state_dtype);
  size_t flat = p->bytes[STOKE_BUF_PARAMS] / es;
  /* the optimizer state: the master copy (has_master), then each of the optimizer's tensors, each over the flat
   * parameter buffer (element i of a parameter at offset / es + i) */
  int regions = p->opt_kernel && p->opt_state_bytes ? p->opt_state_per_param + p->has_master : 0;
  if (opt_regions >= 0 && opt_regions < regions) regions = opt_regions;
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *val = &g->values[v];
    if (!stoke_value_is_ohwi(g, v)) continue;
    if (params) stoke_permute_nhwc((char *)params + val->offset, val->dtype, &val->shape, to_device, tmp);
    for (int r = 0; opt_state && r < regions; r++)
      stoke_permute_nhwc((char *)opt_state + ((size_t)r * flat + val->offset / es) * ss, p->state_dtype, &val->shape,
                         to_device, tmp);
  }
  free(tmp);
  return NULL;
}

void stoke_plan_free(stoke_plan *p) {
  if (!p) return;
  free(p->decay);
  free(p->recompute_report);
  free(p);
}

static void fmt_shape(const stoke_shape *s, char *buf, size_t cap) {
  size_t used = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < s->ndim && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)s->d[i]);
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

static void fmt_bytes(size_t b, char *buf, size_t cap) {
  if (b >= (1u << 30)) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
  else if (b >= (1u << 20)) snprintf(buf, cap, "%.2f MiB", b / 1048576.0);
  else snprintf(buf, cap, "%.1f KiB", b / 1024.0);
}

void stoke_plan_report(const stoke_plan *p, FILE *f) {
  const stoke_graph *g = p->g;
  fprintf(f, "plan: %d nodes (%d forward), %lld parameters\n", g->n_nodes, g->n_fwd,
          (long long)p->n_params);
  fprintf(f, "  %-24s %-10s %-9s %-7s %-20s %12s\n", "node", "op", "pass", "engine", "output",
          "MFLOP");
  for (int i = 0; i < g->n_nodes; i++) {
    const stoke_gnode *n = &g->nodes[i];
    char shape[64] = "-";
    int o = n->pass == STOKE_BWD ? n->din[0] >= 0 ? n->din[0] : n->din[1] : n->out[0];
    if (o >= 0) fmt_shape(&g->values[o].shape, shape, sizeof shape);
    fprintf(f, "  %-24s %-10s %-9s %-7s %-20s %12.2f\n", n->n.name, n->n.op, node_pass_name(n),
            n->kernel ? n->kernel->engine : "?", shape, n->flops / 1e6);
  }
  if (p->grad_norm)
    fprintf(f, "  %-24s %-10s %-9s %-7s\n", "grad_clip", p->grad_norm->op, "update", p->grad_norm->engine);
  if (p->opt_kernel)
    fprintf(f, "  %-24s %-10s %-9s %-7s\n", "optimizer", p->opt_kernel->op, "update",
            p->opt_kernel->engine);
  char a[32], b[32], c[32], d[32], e[32];
  fmt_bytes(p->bytes[STOKE_BUF_PARAMS], a, sizeof a);
  fmt_bytes(p->bytes[STOKE_BUF_GRADS], b, sizeof b);
  fmt_bytes(p->opt_state_bytes, c, sizeof c);
  fmt_bytes(p->bytes[STOKE_BUF_ARENA], d, sizeof d);
  fmt_bytes(p->bytes[STOKE_BUF_STATE], e, sizeof e);
  fprintf(f,
          "memory: parameters %s, gradients %s, optimizer state %s, activations %s, "
          "buffers (running stats) %s, workspace %zu bytes\n",
          a, b, c, d, e, p->workspace_bytes);
  fprintf(f, "FLOPs per step: forward %.4g, forward+backward %.4g\n", p->fwd_flops,
          p->train_flops);
  if (p->recompute_report) fputs(p->recompute_report, f);
  if (p->n_accumulated)
    fprintf(f, "gradient sums: %d accumulated in place by their producers (din_accumulate), no add node\n",
            p->n_accumulated);
  if (p->n_side)
    fprintf(f, "weight gradients: %d backward nodes may compute theirs on a second stream (wgrad_stream = %d), "
            "with a second workspace as large as the first; the compute stream waits for each at most %d such nodes "
            "later (sooner before a node touching its gradients)\n",
            p->n_side, p->opts.wgrad_stream, p->opts.wgrad_stream);
  if (p->n_layout_converted)
    fprintf(f, "memory order: %d 4-D value%s copied between NHWC and row-major order for readers that assume the "
            "other (a transpose each, as torch's .contiguous()): %s%s\n",
            p->n_layout_converted, p->n_layout_converted == 1 ? "" : "s", p->layout_converted,
            strlen(p->layout_converted) >= sizeof p->layout_converted - 1 ? " ..." : "");
  if (p->n_layout_relabelled)
    fprintf(f, "memory order: %d 4-D value%s relabelled between NHWC and row-major, no copy (C or H W is 1: one "
            "memory either way)\n", p->n_layout_relabelled, p->n_layout_relabelled == 1 ? "" : "s");
  if (p->n_filters_ohwi)
    fprintf(f, "convolution filters: %d kept [O, kh, kw, C] in memory (channels_last, as cuDNN's NHWC kernels read "
            "them; checkpoints hold [O, C, kh, kw]; run.filter_layout = oihw keeps them row-major)\n",
            p->n_filters_ohwi);
  if (p->n_pool_index)
    fprintf(f, "max pools: %d save their window indices for backward (max_pool2d_idx), which reads them instead of "
            "the input\n", p->n_pool_index);
  if (p->n_shortcut_bn)
    fprintf(f, "shortcut batch norms: %d joined to their block's bn_add_relu (bn_add_bn_relu: the shortcut's "
            "normalized output and the residual's gradient are neither written nor read back)\n", p->n_shortcut_bn);
  for (int i = 0; i < g->n_nodes; i++)
    if (stoke_node_in_bwd(&g->nodes[i]))
      fprintf(f, "forward in backward: %s '%s' done by its backward kernel's call (%s)\n",
              g->nodes[i].n.op, g->nodes[i].n.name, g->nodes[i + 1].kernel->engine);
  fprintf(f, "memory traffic per step, each node reading its inputs and writing its outputs once: %.4g bytes\n",
          p->step_bytes);
}
