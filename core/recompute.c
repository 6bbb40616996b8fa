/* core/recompute.c: activation recomputation (run.recompute), a planner
 * decision: chosen forward nodes run again in the backward pass, right
 * before the first backward node that reads what they make, so their
 * outputs die at their last forward reader instead of living until
 * backward. Models stay unchanged.
 *
 * The unit is a segment: forward nodes re-run together, in forward order.
 * A value made by a segment's node is dropped (backward reads its
 * recomputed copy) unless another segment's node reads it, which then
 * reads the original (kept alive to its recompute, as a checkpoint's input
 * is). Inside a segment copies read each other's copies; everything else
 * (parameters, kept activations, the batch) is read as it is. Only the
 * copies whose outputs backward reads, directly or through other copies,
 * are made. A copy's state inputs (batch-norm running statistics, updated
 * in place) go to scratch values, so the running statistics are updated
 * once per step, as without recomputation; a copy takes its original's
 * seed (core/exec.c), so dropout draws the same mask. The copies run the
 * same kernels on the same inputs: gradients equal those without
 * recomputation, bit for bit where the kernels are deterministic.
 *
 * Choice:
 *   patterns ("h.*.attn, layer3.*"): every forward node under a module a
 *     pattern matches (the shortest dotted prefix of the node's name that
 *     the pattern, or one of its dotted suffixes, matches: h.*.attn
 *     matches transformer.h.3.attn and so everything named
 *     transformer.h.3.attn.*), one segment per module;
 *   auto: from the plan's numbers alone, no trial runs. Each forward node
 *     is weighed by what it costs to run again (its FLOPs, or its memory
 *     traffic priced at the roofline's ridge where that is more) per byte
 *     it frees (its outputs that live into backward, less the inputs it
 *     would keep alive); groups of equal weight (the same node in every
 *     layer) are tried cheapest first, each kept only when the placed arena
 *     shrinks, until the plan fits memory_budget; of the group that makes
 *     it fit, only as many of its first layers as it takes; where that
 *     does not fit, whole blocks, first blocks first, as few as fit (as
 *     torch.utils.checkpoint on every block). Chosen nodes that follow each
 *     other inside one block (the name up to its first number: h.3,
 *     layer3.1) form one segment, so a product and its activation can be
 *     re-run together.
 * Views (reshape, slice, split, transpose) of a segment's output join its
 * segment: they share its memory. */
#define _GNU_SOURCE
#include <ctype.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

/* core/plan.c, core/graph.c */
stoke_err *stoke_plan_arena(stoke_graph *g, size_t *total);
double stoke_node_bytes(const stoke_graph *g, const stoke_gnode *n);

static int is_op(const stoke_gnode *n, const char *op) { return !strcmp(n->n.op, op); }

static int is_view(const stoke_gnode *n) {
  return is_op(n, STOKE_OP_RESHAPE) || is_op(n, STOKE_OP_SLICE) || is_op(n, STOKE_OP_SPLIT) ||
         is_op(n, STOKE_OP_TRANSPOSE);
}

/* A forward node that may be recomputed: not the loss, not the logits'
 * producer (the loss's backward writes over the logits). */
static int eligible(const stoke_graph *g, int i) {
  const stoke_gnode *n = &g->nodes[i];
  for (int j = 0; j < n->n_out; j++)
    if (n->out[j] == g->loss || n->out[j] == g->logits) return 0;
  return n->kernel != NULL;
}

/* What apply() did. */
typedef struct rc_stats {
  int copies, segments;
  double flops;
} rc_stats;

/* A new arena value like v, named after it. */
static stoke_err *clone_value(stoke_graph *g, int v, const char *suffix, int producer, int *id) {
  char name[sizeof g->values->name];
  snprintf(name, sizeof name, "%.50s%s", g->values[v].name, suffix);
  stoke_shape shape = g->values[v].shape;
  STOKE_PROPAGATE(stoke_graph_new_value(g, name, STOKE_VAL_ACT, &shape, g->values[v].dtype, id));
  stoke_value *c = &g->values[*id];
  c->layout = g->values[v].layout;
  c->buffer = STOKE_BUF_ARENA;
  c->producer = producer;
  return NULL;
}

/* Working arrays of apply(), one allocation. */
typedef struct rc_work {
  int *segv;      /* per value: the segment of its producer, or -1 */
  int *clone;     /* per value: its recomputed copy, or -1 */
  char *drop;     /* per value: backward reads the copy */
  char *need;     /* per value: a copy of it must be made */
  char *copy;     /* per forward node: re-run it */
  int *first_use; /* per segment: the backward node before which it runs */
  int *newidx;    /* per node: its place in the new schedule */
} rc_work;

static void work_free(rc_work *w) {
  free(w->segv);
  free(w->clone);
  free(w->drop);
  free(w->need);
  free(w->copy);
  free(w->first_use);
  free(w->newidx);
}

/* A small side output (batch-norm and layer-norm statistics, attention's
 * log-sum-exp): at most 1/16 of its node's largest output. It is kept:
 * re-running a node only to remake it frees next to nothing. */
static int side_output(const stoke_graph *g, int v) {
  const stoke_gnode *n = &g->nodes[g->values[v].producer];
  int64_t most = 0, mine = stoke_numel(&g->values[v].shape);
  for (int j = 0; j < n->n_out; j++) {
    int64_t k = stoke_numel(&g->values[n->out[j]].shape);
    if (k > most) most = k;
  }
  return mine * 16 <= most;
}

/* Which values backward reads as copies, and which copies that takes. */
static void mark(const stoke_graph *g, const int *seg, int n_seg, rc_work *w) {
  int nf = g->n_fwd, nv = g->n_values;
  for (int v = 0; v < nv; v++) {
    int p = g->values[v].producer;
    w->segv[v] = p >= 0 && p < nf && seg[p] >= 0 && g->values[v].kind == STOKE_VAL_ACT ? seg[p] : -1;
    w->drop[v] = w->segv[v] >= 0 && v != g->logits && v != g->loss && !side_output(g, v);
  }
  for (int i = 0; i < nf; i++)
    for (int k = 0; k < g->nodes[i].n_in && seg[i] >= 0; k++) {
      int u = g->nodes[i].in[k];
      if (w->segv[u] >= 0 && w->segv[u] != seg[i]) w->drop[u] = 0; /* another segment's input: kept */
    }
  for (int s = 0; s < n_seg; s++) w->first_use[s] = g->n_nodes;
  for (int i = nf; i < g->n_nodes; i++) {
    const stoke_gnode *b = &g->nodes[i];
    if (b->pass != STOKE_BWD) continue;
    for (int k = 0; k < b->n_in + b->n_out; k++) {
      int in = k < b->n_in, v = in ? b->in[k] : b->out[k - b->n_in];
      uint32_t bit = in ? STOKE_BWD_NEEDS_INPUT(k) : STOKE_BWD_NEEDS_OUTPUT(k - b->n_in);
      if (!(b->type->bwd_needs & bit) || !w->drop[v]) continue;
      w->need[v] = 1;
      if (i < w->first_use[w->segv[v]]) w->first_use[w->segv[v]] = i;
    }
  }
  for (int i = nf - 1; i >= 0; i--) {
    if (seg[i] < 0) continue;
    const stoke_gnode *n = &g->nodes[i];
    for (int j = 0; j < n->n_out; j++) w->copy[i] |= w->need[n->out[j]];
    for (int k = 0; k < n->n_in && w->copy[i]; k++)
      if (w->drop[n->in[k]] && w->segv[n->in[k]] == seg[i]) w->need[n->in[k]] = 1;
  }
}

/* Forward node f's copy, to run at schedule place `at`. */
static stoke_err *make_copy(stoke_graph *g, int f, int at, const int *seg, const rc_work *w, stoke_gnode *c) {
  *c = g->nodes[f];
  snprintf(c->name_buf, sizeof c->name_buf, "%.56s.recomp", g->nodes[f].name_buf);
  c->n.name = c->name_buf;
  c->recompute = 1;
  c->fwd = f;
  c->kstate = NULL;
  c->workspace = 0;
  for (int k = 0; k < c->n_in; k++) {
    int u = c->in[k];
    if (w->drop[u] && w->segv[u] == seg[f]) c->in[k] = w->clone[u];
    /* a state is updated in place: a scratch copy takes it, but a view (a 4-D state's conversion,
     * core/layout.c) writes nothing and reads the state itself (a scratch copy holds nothing) */
    else if (g->values[u].kind == STOKE_VAL_STATE && !is_view(c))
      STOKE_PROPAGATE(clone_value(g, u, ".scratch", at, &c->in[k]));
  }
  for (int j = 0; j < c->n_out; j++) {
    int v = c->out[j];
    if (w->need[v]) {
      c->out[j] = w->clone[v];
      g->values[w->clone[v]].producer = at;
    } else { /* an output nothing reads again */
      STOKE_PROPAGATE(clone_value(g, v, ".scratch", at, &c->out[j]));
    }
  }
  return NULL;
}

/* Insert the copies of the forward nodes with seg[i] >= 0 (segment ids
 * 0..n_seg-1) into g's backward pass, and point backward's reads at them. */
static stoke_err *apply(stoke_graph *g, const int *seg, rc_stats *st) {
  int nf = g->n_fwd, nn = g->n_nodes, nv = g->n_values, n_seg = 0;
  for (int i = 0; i < nf; i++)
    if (seg[i] >= n_seg) n_seg = seg[i] + 1;
  memset(st, 0, sizeof *st);
  if (!n_seg) return NULL;
  rc_work w = {malloc(sizeof(int) * (size_t)nv), malloc(sizeof(int) * (size_t)nv), calloc((size_t)nv, 1),
               calloc((size_t)nv, 1), calloc((size_t)nf, 1), malloc(sizeof(int) * (size_t)n_seg),
               malloc(sizeof(int) * (size_t)nn)};
  stoke_gnode *nodes = NULL;
  stoke_err *e = NULL;
  if (!w.segv || !w.clone || !w.drop || !w.need || !w.copy || !w.first_use || !w.newidx) {
    e = STOKE_ERR(STOKE_E_OOM, "out of memory planning recomputation");
    goto done;
  }
  mark(g, seg, n_seg, &w);
  int n_copies = 0;
  for (int i = 0; i < nf; i++) n_copies += w.copy[i];
  for (int v = 0; v < nv; v++) {
    w.clone[v] = -1;
    if (w.need[v] && (e = clone_value(g, v, ".recomp", -1, &w.clone[v]))) goto done;
  }
  if (!(nodes = malloc(sizeof *nodes * (size_t)(nn + n_copies)))) {
    e = STOKE_ERR(STOKE_E_OOM, "out of memory planning recomputation");
    goto done;
  }
  memcpy(nodes, g->nodes, sizeof *nodes * (size_t)nf);
  for (int i = 0; i < nf; i++) w.newidx[i] = i;
  char *counted = calloc((size_t)n_seg, 1);
  if (!counted) {
    e = STOKE_ERR(STOKE_E_OOM, "out of memory planning recomputation");
    goto done;
  }
  int at = nf;
  for (int i = nf; i < nn && !e; i++) {
    for (int s = 0; s < n_seg && !e; s++) {
      if (w.first_use[s] != i) continue;
      for (int f = 0; f < nf && !e; f++) {
        if (seg[f] != s || !w.copy[f]) continue;
        e = make_copy(g, f, at, seg, &w, &nodes[at]);
        st->flops += g->nodes[f].flops;
        st->copies++;
        st->segments += !counted[s];
        counted[s] = 1;
        at++;
      }
    }
    stoke_gnode *b = &nodes[at];
    *b = g->nodes[i];
    w.newidx[i] = at++;
    if (b->pass != STOKE_BWD) continue;
    for (int k = 0; k < b->n_in; k++)
      if ((b->type->bwd_needs & STOKE_BWD_NEEDS_INPUT(k)) && w.drop[b->in[k]]) b->in[k] = w.clone[b->in[k]];
    for (int j = 0; j < b->n_out; j++)
      if ((b->type->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j)) && w.drop[b->out[j]]) b->out[j] = w.clone[b->out[j]];
  }
  free(counted);
  if (e) goto done;
  for (int v = 0; v < nv; v++)
    if (g->values[v].producer >= nf) g->values[v].producer = w.newidx[g->values[v].producer];
  free(g->nodes);
  g->nodes = nodes;
  nodes = NULL;
  g->n_nodes = g->cap_nodes = at;
  for (int i = 0; i < g->n_nodes; i++) g->nodes[i].n.name = g->nodes[i].name_buf;
done:
  free(nodes);
  work_free(&w);
  return e;
}

/* ------------------------------------------------------------ choosing */

/* A working copy of g for weighing a choice (its tied names borrowed). */
static stoke_err *trial_copy(const stoke_graph *g, stoke_graph *t) {
  *t = *g;
  t->values = malloc(sizeof *t->values * (size_t)g->cap_values);
  t->nodes = malloc(sizeof *t->nodes * (size_t)g->cap_nodes);
  if (!t->values || !t->nodes) {
    free(t->values);
    free(t->nodes);
    return STOKE_ERR(STOKE_E_OOM, "out of memory weighing recomputation");
  }
  memcpy(t->values, g->values, sizeof *t->values * (size_t)g->n_values);
  memcpy(t->nodes, g->nodes, sizeof *t->nodes * (size_t)g->n_nodes);
  for (int i = 0; i < t->n_nodes; i++) t->nodes[i].n.name = t->nodes[i].name_buf;
  return NULL;
}

/* The arena g would need with segments seg. */
static stoke_err *arena_with(const stoke_graph *g, const int *seg, size_t *bytes, rc_stats *st) {
  stoke_graph t;
  STOKE_PROPAGATE(trial_copy(g, &t));
  stoke_err *e = apply(&t, seg, st);
  if (!e) e = stoke_plan_arena(&t, bytes);
  free(t.values);
  free(t.nodes);
  return e;
}

/* Views of a recomputed node's outputs join its segment. */
static void join_views(const stoke_graph *g, int *seg) {
  for (int i = 0; i < g->n_fwd; i++) {
    const stoke_gnode *n = &g->nodes[i];
    int p = g->values[n->in[0]].producer;
    if (seg[i] < 0 && is_view(n) && p >= 0 && p < i && seg[p] >= 0 && eligible(g, i)) seg[i] = seg[p];
  }
}

/* The block a node belongs to: its name up to its first number-only
 * component (transformer.h.3, layer3.1); 0 (the top level) without one. */
static size_t block_len(const char *name) {
  const char *p = name;
  while (*p) {
    const char *end = strchr(p, '.');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    int digits = len > 0;
    for (size_t i = 0; i < len; i++) digits &= isdigit((unsigned char)p[i]) != 0;
    if (digits) return (size_t)(p - name) + len;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

static int same_block(const stoke_graph *g, int i, int j) {
  const char *a = g->nodes[i].name_buf, *b = g->nodes[j].name_buf;
  size_t la = block_len(a);
  return la == block_len(b) && !strncmp(a, b, la);
}

/* Chosen nodes that follow each other in one block join one segment (a
 * batch norm and its ReLU, a product and its activation). */
static void merge_runs(const stoke_graph *g, int *seg) {
  for (int i = 1; i < g->n_fwd; i++) {
    int a = seg[i - 1], b = seg[i];
    if (a < 0 || b < 0 || a == b || !same_block(g, i - 1, i)) continue;
    for (int k = 0; k < g->n_fwd; k++)
      if (seg[k] == b) seg[k] = a;
  }
  /* ids 0..n-1 again, in forward order */
  int n = 0, *map = malloc(sizeof *map * (size_t)(g->n_fwd + 1));
  if (!map) return; /* the ids stay valid, only sparse */
  for (int k = 0; k < g->n_fwd; k++) map[k] = -1;
  for (int k = 0; k < g->n_fwd; k++)
    if (seg[k] >= 0) {
      if (map[seg[k]] < 0) map[seg[k]] = n++;
      seg[k] = map[seg[k]];
    }
  free(map);
}

/* Segments from the chosen nodes: runs of consecutive chosen nodes in one
 * block. */
static void runs_to_segments(const stoke_graph *g, const char *chosen, int *seg) {
  for (int i = 0; i < g->n_fwd; i++) seg[i] = chosen[i] ? i : -1;
  merge_runs(g, seg);
  join_views(g, seg);
}

/* What re-running a node costs, in FLOPs: its FLOPs, or the FLOPs its
 * memory traffic is worth where that is more (a GELU is bound by its
 * bytes, a product by its FLOPs): the roofline's ridge, about 250 FLOPs
 * per byte on current GPUs (H100 bf16: 989 TFLOP/s over 3.35 TB/s = 295;
 * A100: 312 / 1.55 = 200). */
#define RIDGE_FLOPS_PER_BYTE 250.0

static double rerun_cost(const stoke_graph *g, int i) {
  double traffic = RIDGE_FLOPS_PER_BYTE * stoke_node_bytes(g, &g->nodes[i]);
  return g->nodes[i].flops > traffic ? g->nodes[i].flops : traffic;
}

/* One candidate: a forward node, its cost per byte freed. */
typedef struct rc_cand {
  int node;
  double ratio;
} rc_cand;

static int by_ratio(const void *a, const void *b) {
  const rc_cand *x = a, *y = b;
  return x->ratio < y->ratio ? -1 : x->ratio > y->ratio ? 1 : x->node - y->node;
}

/* Bytes node i frees if re-run, from the plan's liveness: its outputs
 * that live into backward, less the inputs it would keep alive that die
 * in forward now. */
static double freed_bytes(const stoke_graph *g, int i) {
  const stoke_gnode *n = &g->nodes[i];
  double b = 0;
  for (int j = 0; j < n->n_out; j++) {
    const stoke_value *v = &g->values[n->out[j]];
    if (v->alias < 0 && v->last >= g->n_fwd) b += (double)v->bytes;
  }
  for (int k = 0; k < n->n_in; k++) {
    const stoke_value *u = &g->values[stoke_alias_root(g, n->in[k], NULL)];
    if (u->kind == STOKE_VAL_ACT && u->last < g->n_fwd) b -= (double)u->bytes;
  }
  return b;
}

static int by_index(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* The whole plan's bytes with `chosen` and the first k of `order` re-run
 * (the choice in trial[], its segments in tseg[]). */
static stoke_err *weigh_prefix(const stoke_graph *g, double fixed, const char *chosen, const int *order, int k,
                               char *trial, int *tseg, double *total) {
  memcpy(trial, chosen, (size_t)g->n_fwd);
  for (int i = 0; i < k; i++) trial[order[i]] = 1;
  runs_to_segments(g, trial, tseg);
  size_t bytes;
  rc_stats st;
  STOKE_PROPAGATE(arena_with(g, tseg, &bytes, &st));
  *total = fixed + (double)bytes;
  return NULL;
}

/* Adds to `chosen` the nodes of `order` up to one of the unit ends[] (one
 * past each unit's last node: a block; NULL: each node its own unit), if
 * all of them shrink the plan below *best: the fewest leading units that
 * make it fit the budget (stop as soon as the plan fits, not a layer
 * later), or all where none does; *best becomes the plan's bytes. */
static stoke_err *take_prefix(const stoke_graph *g, double fixed, double budget, char *chosen, const int *order,
                              const int *ends, int units, char *trial, int *tseg, double *best) {
#define END(u) (ends ? ends[(u) - 1] : (u)) /* nodes in the first u units */
  double total;
  stoke_err *e = weigh_prefix(g, fixed, chosen, order, END(units), trial, tseg, &total);
  if (e || total >= *best) return e;
  int lo = 1, hi = units;
  while (!e && total <= budget && lo < hi) {
    int mid = (lo + hi) / 2;
    double t;
    e = weigh_prefix(g, fixed, chosen, order, END(mid), trial, tseg, &t);
    if (!e && t <= budget) hi = mid;
    else lo = mid + 1;
  }
  if (!e) e = weigh_prefix(g, fixed, chosen, order, END(total <= budget ? hi : units), trial, tseg, &total);
#undef END
  if (!e) {
    *best = total;
    memcpy(chosen, trial, (size_t)g->n_fwd);
  }
  return e;
}

/* When node by node does not fit (each group alone must shrink the
 * arena, and some only pay together: a product's output is freed only when
 * the layer norm before it is re-run too), whole blocks, as a
 * torch.utils.checkpoint on every block would: the first blocks first
 * (they free the most), as few as make the plan fit, or all of them where
 * that is smaller than the node-by-node choice. chosen[] is updated. */
static stoke_err *whole_blocks(const stoke_graph *g, double fixed, double budget, char *chosen, char *trial, int *tseg,
                               int *order, double *best) {
  int nf = g->n_fwd, nb = 0;
  /* order[b]: the first node of the b-th block, in forward order */
  for (int i = 0; i < nf; i++) {
    if (!block_len(g->nodes[i].name_buf) || !eligible(g, i) || is_view(&g->nodes[i])) continue;
    int seen = 0;
    for (int b = 0; b < nb && !seen; b++) seen = same_block(g, order[b], i);
    if (!seen) order[nb++] = i;
  }
  if (!nb) return NULL;
  /* the blocks' nodes, block by block; ends[b]: one past block b's last */
  int *nodes = malloc(sizeof *nodes * 2 * (size_t)nf), *ends = nodes + nf, n = 0;
  if (!nodes) return STOKE_ERR(STOKE_E_OOM, "out of memory weighing recomputation");
  for (int b = 0; b < nb; b++) {
    /* views too: a block is one run of chosen nodes, so one segment (a view
     * between two chosen nodes would split it, and the split keeps the
     * first part's outputs alive for the second) */
    for (int i = 0; i < nf; i++)
      if (eligible(g, i) && same_block(g, order[b], i)) nodes[n++] = i;
    ends[b] = n;
  }
  stoke_err *e = take_prefix(g, fixed, budget, chosen, nodes, ends, nb, trial, tseg, best);
  free(nodes);
  return e;
}

static stoke_err *choose_auto(stoke_graph *g, double fixed, double budget, int *seg) {
  int nf = g->n_fwd;
  for (int i = 0; i < nf; i++) seg[i] = -1;
  size_t arena;
  STOKE_PROPAGATE(stoke_plan_arena(g, &arena)); /* the liveness freed_bytes reads */
  if (budget <= 0 || fixed + (double)arena <= budget) return NULL;
  rc_cand *c = malloc(sizeof *c * (size_t)nf);
  char *chosen = calloc((size_t)nf, 1), *trial = calloc((size_t)nf, 1);
  int *tseg = malloc(sizeof *tseg * (size_t)nf), *order = malloc(sizeof *order * (size_t)nf), n = 0;
  stoke_err *e = NULL;
  if (!c || !chosen || !trial || !tseg || !order) {
    e = STOKE_ERR(STOKE_E_OOM, "out of memory weighing recomputation");
    goto done;
  }
  for (int i = 0; i < nf; i++) {
    double freed = freed_bytes(g, i);
    if (eligible(g, i) && !is_view(&g->nodes[i]) && freed > 0)
      c[n++] = (rc_cand){i, (rerun_cost(g, i) + 1) / freed};
  }
  qsort(c, (size_t)n, sizeof *c, by_ratio);
  double best = fixed + (double)arena;
  for (int a = 0; a < n && best > budget && !e;) {
    /* a group: the same op at the same weight (one node of every layer) */
    int z = a + 1;
    while (z < n && !strcmp(g->nodes[c[z].node].n.op, g->nodes[c[a].node].n.op) &&
           fabs(c[z].ratio - c[a].ratio) <= 1e-9 * c[a].ratio)
      z++;
    /* the group's nodes in forward order: the first layers' free the
     * most (their copies are made last in backward) */
    for (int k = a; k < z; k++) order[k - a] = c[k].node;
    qsort(order, (size_t)(z - a), sizeof *order, by_index);
    e = take_prefix(g, fixed, budget, chosen, order, NULL, z - a, trial, tseg, &best);
    a = z;
  }
  if (!e && best > budget) e = whole_blocks(g, fixed, budget, chosen, trial, tseg, order, &best);
  if (!e) runs_to_segments(g, chosen, seg);
done:
  free(c);
  free(chosen);
  free(trial);
  free(tseg);
  free(order);
  return e;
}

/* The module of `name` that pattern p selects: the shortest dotted
 * prefix that p, or one of its dotted suffixes, matches; its length, or
 * 0. */
static size_t match_module(const char *p, const char *name) {
  char buf[sizeof ((stoke_gnode *)0)->name_buf];
  size_t len = strlen(name);
  for (size_t end = 1; end <= len; end++) {
    if (end < len && name[end] != '.') continue;
    snprintf(buf, sizeof buf, "%.*s", (int)end, name);
    for (size_t s = 0; s < end; s++)
      if ((s == 0 || buf[s - 1] == '.') && !fnmatch(p, buf + s, 0)) return end;
  }
  return 0;
}

/* Segments from "pattern, pattern, ...": one per matched module. */
static stoke_err *choose_patterns(const stoke_graph *g, const char *list, int *seg) {
  char buf[1024], *pats[64];
  int np = 0, nf = g->n_fwd, ids = 0;
  if (strlen(list) >= sizeof buf) return STOKE_ERR(STOKE_E_INVALID, "recompute: the pattern list is too long");
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    while (isspace((unsigned char)*t)) t++;
    char *z = t + strlen(t);
    while (z > t && isspace((unsigned char)z[-1])) *--z = 0;
    if (!*t) continue;
    if (np == 64) return STOKE_ERR(STOKE_E_INVALID, "recompute: more than 64 patterns");
    pats[np++] = t;
  }
  if (!np) return STOKE_ERR(STOKE_E_INVALID, "recompute = '%s': no pattern given (none, auto, or node-name patterns)", list);
  int *matched = calloc((size_t)np, sizeof *matched);
  size_t *mlen = malloc(sizeof *mlen * (size_t)nf);
  if (!matched || !mlen) {
    free(matched);
    free(mlen);
    return STOKE_ERR(STOKE_E_OOM, "out of memory");
  }
  for (int i = 0; i < nf; i++) {
    seg[i] = -1;
    mlen[i] = 0;
    const char *name = g->nodes[i].name_buf;
    for (int k = 0; k < np && !mlen[i]; k++)
      if (eligible(g, i) && (mlen[i] = match_module(pats[k], name))) matched[k]++;
    if (!mlen[i]) continue;
    /* the same module as an earlier node: its segment */
    for (int j = 0; j < i && seg[i] < 0; j++)
      if (seg[j] >= 0 && mlen[j] == mlen[i] && !strncmp(g->nodes[j].name_buf, name, mlen[i])) seg[i] = seg[j];
    if (seg[i] < 0) seg[i] = ids++;
  }
  stoke_err *e = NULL;
  for (int k = 0; k < np && !e; k++)
    if (!matched[k])
      e = STOKE_ERR(STOKE_E_INVALID,
                    "recompute: pattern '%s' matches no forward node (patterns match node names or their dotted "
                    "parts, e.g. h.*.attn or layer3.*; the plan report lists the names)",
                    pats[k]);
  free(matched);
  free(mlen);
  if (!e) merge_runs(g, seg);
  if (!e) join_views(g, seg);
  return e;
}

static void fmt_mib(double b, char *buf, size_t cap) {
  if (b >= 1073741824.0) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
  else if (b >= 1048576.0) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
  else snprintf(buf, cap, "%.1f KiB", b / 1024.0);
}

/* The plan report's lines: the totals, then each segment's nodes. */
static stoke_err *describe(const stoke_graph *g, const int *seg, const stoke_plan_opts *o, stoke_plan *p,
                           size_t after) {
  size_t cap = 4096 + (size_t)g->n_nodes * 96, used = 0;
  char *r = malloc(cap);
  if (!r) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  char before_s[32], after_s[32], saved_s[32], budget_s[64] = "";
  fmt_mib((double)p->arena_without_recompute, before_s, sizeof before_s);
  fmt_mib((double)after, after_s, sizeof after_s);
  int grew = after > p->arena_without_recompute; /* recomputing costs memory here: said below */
  fmt_mib(fabs((double)p->arena_without_recompute - (double)after), saved_s, sizeof saved_s);
  if (!strcmp(o->recompute, "auto")) {
    char b[32];
    fmt_mib(o->memory_budget, b, sizeof b);
    snprintf(budget_s, sizeof budget_s, ", budget %s", o->memory_budget > 0 ? b : "none");
  }
  double step = 0; /* the model's forward and backward FLOPs (stoke_compile sums them later) */
  for (int i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].recompute) step += g->nodes[i].flops;
  used += (size_t)snprintf(r + used, cap - used,
                           "recompute (%s%s): %d forward nodes re-run in backward in %d segments; activations %s -> "
                           "%s (%s %s); +%.4g FLOPs per step (+%.1f%% of forward+backward)\n",
                           !strcmp(o->recompute, "auto") ? "auto" : o->recompute, budget_s, p->n_recomputed,
                           p->n_recompute_segments, before_s, after_s, saved_s, grew ? "more" : "saved", p->recompute_flops,
                           step > 0 ? 100 * p->recompute_flops / step : 0.0);
  if (p->n_recomputed && grew && strcmp(o->recompute, "auto")) {
    /* e.g. examples/mlp.ini with layers.*: only the last ReLU is a node of its own, and its input is kept
     * for the backward anyway, so the re-run output is one more buffer (auto never picks such a segment) */
    used += (size_t)snprintf(r + used, cap - used,
                             "  this costs %s of memory instead of saving it: the re-run outputs live beside "
                             "inputs the backward keeps anyway; recompute other nodes, or use auto\n",
                             saved_s);
    stoke_log(STOKE_LOG_WARN, "plan",
              "[run] recompute = %s costs %s of activation memory instead of saving it (the plan report says "
              "which segments re-run); recompute other nodes, or use auto",
              o->recompute, saved_s);
  }
  if (!p->n_recomputed)
    used += (size_t)snprintf(r + used, cap - used, "  nothing recomputed: %s\n",
                             !strcmp(o->recompute, "auto") ? "the plan fits the budget without it"
                                                           : "backward reads nothing the matched nodes make");
  /* each segment: its first node, how many re-run */
  for (int i = g->n_fwd; i < g->n_nodes && used < cap - 200; i++) {
    const stoke_gnode *n = &g->nodes[i];
    if (!n->recompute || (i > g->n_fwd && g->nodes[i - 1].recompute && seg[g->nodes[i - 1].fwd] == seg[n->fwd]))
      continue;
    int k = 0;
    double fl = 0;
    while (i + k < g->n_nodes && g->nodes[i + k].recompute && seg[g->nodes[i + k].fwd] == seg[n->fwd])
      fl += g->nodes[i + k].flops, k++;
    used += (size_t)snprintf(r + used, cap - used, "  segment %-32s %2d node%s (%s%s), %.4g FLOPs, before '%s'\n",
                             g->nodes[n->fwd].name_buf, k, k == 1 ? " " : "s", g->nodes[n->fwd].n.op,
                             k > 1 ? ", ..." : "", fl, i + k < g->n_nodes ? g->nodes[i + k].name_buf : "?");
  }
  p->recompute_report = r;
  return NULL;
}

stoke_err *stoke_recompute(stoke_graph *g, const stoke_plan_opts *o, stoke_plan *p) {
  int nf = g->n_fwd;
  int *seg = malloc(sizeof *seg * (size_t)(nf + 1));
  if (!seg) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  double fixed = (double)p->opt_state_bytes;
  for (int b = 0; b < STOKE_BUF_COUNT; b++)
    if (b != STOKE_BUF_ARENA) fixed += (double)p->bytes[b];
  size_t before = 0, after = 0;
  stoke_err *e = stoke_plan_arena(g, &before);
  if (!e) e = !strcmp(o->recompute, "auto") ? choose_auto(g, fixed, o->memory_budget, seg)
                                            : choose_patterns(g, o->recompute, seg);
  rc_stats st = {0};
  if (!e) e = apply(g, seg, &st);
  if (!e) e = stoke_plan_arena(g, &after);
  if (!e) {
    p->arena_without_recompute = before;
    p->n_recomputed = st.copies;
    p->n_recompute_segments = st.segments;
    p->recompute_flops = st.flops;
    e = describe(g, seg, o, p, after);
  }
  free(seg);
  return e;
}
