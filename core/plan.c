/* core/plan.c: the compiler: backward derivation, kernel resolution over
 * the ordered engine list, and the memory plan (flat parameter, gradient
 * and optimizer-state buffers; one activation arena placed by liveness). */
#define _GNU_SOURCE /* qsort_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

stoke_err *stoke_graph_derive_backward(stoke_graph *g); /* core/graph.c */
/* core/fuse_act.c: linear -> relu|gelu -> linear epilogue fusion */
stoke_err *stoke_fuse_linear_act(stoke_graph *g, const stoke_plan_opts *o);
stoke_err *stoke_fuse_act_grad(stoke_graph *g);
void stoke_graph_drop_fwd_node(stoke_graph *g, int r);

#define ALIGN 256 /* bytes: every buffer offset, so GPU kernels can vectorize */

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static const char *pass_name(stoke_pass p) {
  return p == STOKE_FWD ? "forward" : p == STOKE_BWD ? "backward" : "update";
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
  return STOKE_ERR(STOKE_E_UNSUPPORTED,
                   "node '%s': no kernel for op '%s' (%s, %s) in backends [%s]; add a backend "
                   "that has one to [run] backends, or load the plugin that provides it",
                   n->n.name, n->n.op, pass_name(n->pass), stoke_dtype_name(x->dtype), list);
}

/* Schedule positions where each arena value is written and read. */
static void liveness(stoke_graph *g) {
  int end = g->n_nodes;
  for (int v = 0; v < g->n_values; v++) {
    stoke_value *val = &g->values[v];
    int whole = val->kind == STOKE_VAL_INPUT || val->kind == STOKE_VAL_LABEL ||
                val->kind == STOKE_VAL_SEED || v == g->loss;
    val->first = whole ? 0 : val->producer >= 0 ? val->producer : 0;
    val->last = whole ? end : val->first;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    stoke_gnode *n = &g->nodes[i];
    for (int k = 0; k < n->n_in; k++) {
      int reads = n->pass != STOKE_BWD || (n->type->bwd_needs & STOKE_BWD_NEEDS_INPUT(k));
      if (reads && g->values[n->in[k]].last < i) g->values[n->in[k]].last = i;
    }
    for (int j = 0; j < n->n_out; j++) {
      if (n->pass == STOKE_BWD) {
        if ((n->type->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j)) && g->values[n->out[j]].last < i)
          g->values[n->out[j]].last = i;
        if (n->dout[j] >= 0 && g->values[n->dout[j]].last < i) g->values[n->dout[j]].last = i;
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
    if (g->values[v].buffer == STOKE_BUF_ARENA) order[n++] = v;
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

/* The engine that would serve `op` (pass) for a value, or NULL. */
static const char *engine_for(const stoke_graph *g, const stoke_plan_opts *o, const char *op, stoke_pass pass,
                              const stoke_value *x) {
  for (int i = 0; i < o->n_engines; i++)
    if (stoke_find_kernel(g->reg, o->engines[i], op, pass, x->dtype, x->layout)) return o->engines[i];
  return NULL;
}

/* linear -> relu, where only the relu reads the linear's output, becomes
 * one linear_relu node when the engine that serves the linear also has the
 * fused kernels (forward and backward): the GPU then applies the ReLU in
 * the matmul's epilogue instead of another pass over the activations. */
static void fuse_linear_relu(stoke_graph *g, const stoke_plan_opts *o) {
  for (int r = 0; r < g->n_fwd; r++) {
    stoke_gnode *rn = &g->nodes[r];
    if (strcmp(rn->n.op, STOKE_OP_RELU)) continue;
    int v = rn->in[0], l = g->values[v].producer;
    if (l < 0 || strcmp(g->nodes[l].n.op, STOKE_OP_LINEAR) || v == g->logits || v == g->loss) continue;
    int readers = 0;
    for (int i = 0; i < g->n_fwd; i++)
      for (int k = 0; k < g->nodes[i].n_in; k++) readers += g->nodes[i].in[k] == v;
    if (readers != 1) continue;
    const stoke_value *x = &g->values[g->nodes[l].in[0]];
    const char *lin = engine_for(g, o, STOKE_OP_LINEAR, STOKE_FWD, x);
    const char *fwd = engine_for(g, o, STOKE_OP_LINEAR_RELU, STOKE_FWD, x);
    const char *bwd = engine_for(g, o, STOKE_OP_LINEAR_RELU, STOKE_BWD, x);
    if (!lin || !fwd || !bwd || strcmp(lin, fwd) || strcmp(lin, bwd)) continue;
    stoke_gnode *ln = &g->nodes[l];
    ln->type = stoke_find_op(g->reg, STOKE_OP_LINEAR_RELU);
    ln->n.op = ln->type->name;
    ln->flops += rn->flops;
    int y = rn->out[0];
    ln->out[0] = y;
    g->values[y].producer = l;
    g->values[v].producer = -1; /* the pre-activation is no longer a value anyone writes */
    g->values[v].shape = (stoke_shape){1, {1}};
    stoke_graph_drop_fwd_node(g, r); /* the relu */
    r--;
  }
}

/* The least memory traffic of one node run on its own: each value it
 * reads once, each it writes once (a backward node reads only what its
 * op's bwd_needs names, plus the output gradients). The sum over a step is
 * the bytes floor of node-by-node execution; fusion lowers it. */
static double node_bytes(const stoke_graph *g, const stoke_gnode *n) {
  double b = 0;
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

stoke_err *stoke_compile(stoke_graph *g, const stoke_plan_opts *opts, stoke_plan **out) {
  if (opts->n_engines < 1) return STOKE_ERR(STOKE_E_INVALID, "no backend given");
  if (opts->n_engines > STOKE_MAX_ENGINES)
    return STOKE_ERR(STOKE_E_INVALID, "more than %d backends given", STOKE_MAX_ENGINES);
  if (opts->fuse) STOKE_TRY(stoke_fuse_linear_act(g, opts), "fusing activations into linears");
  if (opts->fuse) fuse_linear_relu(g, opts);
  if (opts->training) STOKE_TRY(stoke_graph_derive_backward(g), "deriving the backward pass");
  if (opts->training && opts->fuse) STOKE_TRY(stoke_fuse_act_grad(g), "fusing activation gradients");
  stoke_plan *p = calloc(1, sizeof *p);
  if (!p) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  p->g = g;
  p->opts = *opts;
  /* the plan keeps its own copy of the engine list: callers' arrays may go */
  for (int i = 0; i < opts->n_engines; i++) {
    p->engines[i] = opts->engines[i];
    p->engine_selves[i] = opts->engine_selves ? opts->engine_selves[i] : NULL;
  }
  p->opts.engines = p->engines;
  p->opts.engine_selves = p->engine_selves;
  p->n_schedule = g->n_nodes;
  stoke_err *e = NULL;
  for (int i = 0; i < g->n_nodes && !e; i++) e = resolve(g, opts, &g->nodes[i]);
  if (!e && opts->training && opts->optimizer) {
    const char *op = !strcmp(opts->optimizer, "adamw") ? STOKE_OP_ADAMW : STOKE_OP_SGD;
    for (int i = 0; i < opts->n_engines && !p->opt_kernel; i++)
      p->opt_kernel = stoke_find_kernel(g->reg, opts->engines[i], op, STOKE_OPT, g->dtype,
                                        STOKE_LAYOUT_ANY);
    if (!p->opt_kernel)
      e = STOKE_ERR(STOKE_E_UNSUPPORTED, "no '%s' optimizer kernel for %s in the backends given",
                    op, stoke_dtype_name(g->dtype));
    p->opt_state_per_param = !strcmp(op, STOKE_OP_ADAMW) ? 2 : 1;
    for (int i = 0; i < opts->n_engines && opts->loss_scaling && !p->amp_check; i++) {
      p->amp_check = stoke_find_kernel(g->reg, opts->engines[i], STOKE_OP_AMP_CHECK, STOKE_OPT, g->dtype,
                                       STOKE_LAYOUT_ANY);
      p->amp_update = stoke_find_kernel(g->reg, opts->engines[i], STOKE_OP_AMP_UPDATE, STOKE_OPT, STOKE_F32,
                                        STOKE_LAYOUT_ANY);
    }
    if (!e && opts->loss_scaling && (!p->amp_check || !p->amp_update))
      e = STOKE_ERR(STOKE_E_UNSUPPORTED, "no loss-scaler kernels (amp_check/amp_update) for %s in the backends given",
                    stoke_dtype_name(g->dtype));
  }
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
  /* low-precision parameters: the state is f32, master copy first */
  size_t elems = p->bytes[STOKE_BUF_PARAMS] / stoke_dtype_size(g->dtype);
  p->has_master = p->opt_kernel && (g->dtype == STOKE_BF16 || g->dtype == STOKE_F16);
  if (p->has_master) p->opt_state_bytes = (size_t)(p->opt_state_per_param + 1) * elems * sizeof(float);
  else if (p->opt_kernel) p->opt_state_bytes = (size_t)p->opt_state_per_param * p->bytes[STOKE_BUF_PARAMS];
  else p->opt_state_bytes = 0;
  liveness(g);
  e = place_arena(g, &p->bytes[STOKE_BUF_ARENA]);
  if (e) {
    free(p);
    return e;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    if (i < g->n_fwd) p->fwd_flops += g->nodes[i].flops;
    p->train_flops += g->nodes[i].flops;
    if (i < g->n_fwd || opts->training) p->step_bytes += node_bytes(g, &g->nodes[i]);
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

void stoke_plan_free(stoke_plan *p) { free(p); }

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
    fprintf(f, "  %-24s %-10s %-9s %-7s %-20s %12.2f\n", n->n.name, n->n.op, pass_name(n->pass),
            n->kernel ? n->kernel->engine : "?", shape, n->flops / 1e6);
  }
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
  fprintf(f, "memory traffic per step, each node reading its inputs and writing its outputs once: %.4g bytes\n",
          p->step_bytes);
}
