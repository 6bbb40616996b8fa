/* core/exec.c: the executor: binds a plan to device memory (allocated once),
 * initializes parameters, prepares every kernel's arguments, and runs
 * forward, backward and the optimizer without allocating. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/check.h"
#include "stoke/core.h"
#include "nvtx.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/rng.h"

typedef struct node_args {
  stoke_kernel_args_v1 a;
  stoke_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO], din[STOKE_MAX_IO], dout[STOKE_MAX_IO];
} node_args;

struct stoke_exec {
  stoke_plan *p;
  const stoke_backend_v1 *dev;
  void *dev_self;
  void *stream; /* the device's compute stream, where every kernel runs */
  void *buf[STOKE_BUF_COUNT];
  int borrowed[STOKE_BUF_COUNT]; /* shared from another exec: not ours to free */
  void *opt_state;
  void *workspace;
  size_t dev_bytes; /* device memory this exec allocated (stoke_exec_device_bytes) */
  float *amp; /* loss scaler state on the device, or NULL */
  void *state_kept; /* the state buffer at the step's start (stoke_exec_state_keep), or NULL */
  /* profile: timers[i] is recorded after node i, timers[n] at the start,
   * timers[n + 1] after the update; ms[] accumulates per node (n: update) */
  void **timers;
  double *ms;
  double *last_ms; /* the last profiled step's, per node and the update (the trace) */
  int64_t profiled_steps;
  int profiling;
  /* [run] detect_anomaly (stoke_exec_anomaly): 0 off; 1 every node's
   * float outputs read back and checked; 2 the same but the backward's
   * gradients, which the loss scaler is there to catch. anom_host: the
   * host copy, anom_cap bytes */
  int anomaly;
  void *anom_host;
  size_t anom_cap;
  node_args amp_check, amp_update, grad_norm;
  stoke_tensor amp_t[4], norm_t[2];
  node_args *args;
  node_args opt;
  stoke_tensor opt_t[3];
  float *clip;     /* grad_norm's [norm, factor] on the device, or NULL */
  int64_t *decay;  /* the plan's weight-decay ranges on the device, or NULL: all */
  stoke_exec_hook hook; /* after each node (data parallel) */
  void *hook_ctx;
  /* whole-step graphs: graph[first_micro][last_micro], each captured on its
   * second use (the first runs eagerly: lazy module loading, first-call
   * setup in libraries); live = device f64 [lr, step] read by the update */
  int graphs_on;
  void *graph[2][2];
  int uses[2][2];
  int64_t kind_ops[2][2]; /* GPU operations of each captured micro-batch kind, [first][last] */
  int64_t replays; /* micro-batches run as a graph launch */
  double *live;
  /* [run] wgrad_stream: the side stream and its workspace; fork, the event
   * the side stream waits on before a side node; per node, done[i], the
   * event after its side work, and join[i], the node before which the
   * compute stream waits for it (the plan's, or earlier where a node
   * between writes what the side work reads: side_checked_join); pend[],
   * the side nodes not waited for yet */
  void *side, *side_ws, *fork;
  void **done;
  int *join, *pend;
  int n_pend;
};

void stoke_exec_set_hook(stoke_exec *x, stoke_exec_hook hook, void *ctx) {
  x->hook = hook;
  x->hook_ctx = ctx;
}

static void *value_ptr(stoke_exec *x, int v) {
  const stoke_value *val = &x->p->g->values[v];
  return (char *)x->buf[val->buffer] + val->offset;
}

stoke_tensor stoke_exec_tensor(stoke_exec *x, int v) {
  const stoke_value *val = &x->p->g->values[v];
  return (stoke_tensor){value_ptr(x, v), val->shape, val->dtype, val->layout, x->dev->device};
}

void *stoke_exec_input(stoke_exec *x) { return value_ptr(x, x->p->g->input); }
void *stoke_exec_labels(stoke_exec *x) { return value_ptr(x, x->p->g->label); }
void *stoke_exec_buffer(stoke_exec *x, stoke_buffer_id b) { return x->buf[b]; }
void *stoke_exec_opt_state(stoke_exec *x) { return x->opt_state; }

/* The state (from its open()) of the engine that serves kernel k. */
static void *engine_self(const stoke_plan *p, const stoke_kernel_v1 *k) {
  for (int i = 0; i < p->opts.n_engines && p->opts.engine_selves; i++)
    if (!strcmp(p->opts.engines[i], k->engine)) return p->opts.engine_selves[i];
  return NULL;
}

/* The next backend in [run] backends, after the one of n's kernel, with a
 * kernel for n that gives what the compiler counted on from the first:
 * adding into the gradients it marked (din_accumulate) and the forward in
 * the backward's call. NULL when none has. */
static const stoke_kernel_v1 *next_kernel(const stoke_plan *p, const stoke_gnode *n) {
  const stoke_graph *g = p->g;
  const stoke_value *x = &g->values[n->in[0]];
  int i = 0;
  while (i < p->opts.n_engines && strcmp(p->opts.engines[i], n->kernel->engine)) i++;
  for (i++; i < p->opts.n_engines; i++) {
    const stoke_kernel_v1 *k = stoke_find_kernel(g->reg, p->opts.engines[i], n->n.op, n->pass, x->dtype, x->layout);
    if (!k || (k->accumulates & n->din_accumulate) != n->din_accumulate) continue;
    if (n->pass == STOKE_BWD && n->with_forward && !(k->caps & STOKE_KCAP_WITH_FORWARD)) continue;
    return k;
  }
  return NULL;
}

/* Whether `share`'s plan (the training plan an evaluation plan shares its
 * parameters with) runs n's namesake on `engine`: it moved there too, and
 * its warning was given. */
static int moved_before(const stoke_exec *share, const stoke_gnode *n, const char *engine) {
  const stoke_graph *g = share ? share->p->g : NULL;
  for (int i = 0; g && i < g->n_nodes; i++) {
    const stoke_gnode *m = &g->nodes[i];
    if (m->pass == n->pass && m->kernel && !strcmp(m->n.name, n->n.name) && !strcmp(m->kernel->engine, engine))
      return 1;
  }
  return 0;
}

/* Plan node n's kernel. A plan() that returns STOKE_E_UNSUPPORTED declines
 * the node (a shape or attribute that backend has no kernel for: cuDNN's
 * flash attention with a head size over 128, say) and the node goes to the
 * next backend in [run] backends with a kernel for it, as PyTorch's SDPA
 * falls back from flash attention to another kernel; a warning says which
 * node, who declined it, why and who runs it, once: an evaluation plan
 * whose training plan moved the same node says it at debug level. Any
 * other error, or no backend left, fails the plan with the decliner's
 * reason. */
static stoke_err *plan_node(stoke_plan *p, const stoke_exec *share, stoke_gnode *n, node_args *na) {
  while (n->kernel->plan) {
    stoke_err *e = n->kernel->plan(&na->a, &n->kstate, &n->workspace);
    if (!e) return NULL;
    const stoke_kernel_v1 *next = e->code == STOKE_E_UNSUPPORTED ? next_kernel(p, n) : NULL;
    if (!next)
      return stoke_err_wrap(e, __FILE__, __LINE__, "planning kernel of node '%s' (%s%s)", n->n.name,
                            n->kernel->engine,
                            e->code == STOKE_E_UNSUPPORTED ? "; no backend after it in [run] backends has a kernel "
                                                             "for the node"
                                                           : "");
    stoke_log(moved_before(share, n, next->engine) ? STOKE_LOG_DEBUG : STOKE_LOG_WARN, "plan",
              "node '%s' (%s %s): %s declined it (%s); %s runs it", n->n.name, n->n.op,
              n->pass == STOKE_BWD ? "backward" : "forward", n->kernel->engine, e->msg, next->engine);
    stoke_err_free(e);
    n->kernel = next, n->kstate = NULL, n->workspace = 0; /* nothing of the decliner's is kept */
    na->a.engine = engine_self(p, next);
  }
  return NULL;
}

/* Parameters (and state) are drawn on the host in f64 from one stream per
 * value, seeded by (seed, index), so any backend starts identically. */
static stoke_err *init_params(stoke_exec *x, uint64_t seed, stoke_buffer_id buf) {
  const stoke_graph *g = x->p->g;
  stoke_value_kind kind = buf == STOKE_BUF_PARAMS ? STOKE_VAL_PARAM : STOKE_VAL_STATE;
  size_t bytes = x->p->bytes[buf];
  if (!bytes) return NULL;
  char *host = stoke_alloc(bytes);
  if (!host) return STOKE_ERR(STOKE_E_OOM, "out of host memory (%zu bytes) for parameters", bytes);
  memset(host, 0, bytes);
  /* parameters in another dtype than the optimizer's: the master copy
   * (state_dtype) leads the optimizer state */
  char *master = NULL;
  stoke_dtype mdt = x->p->state_dtype;
  int with_master = buf == STOKE_BUF_PARAMS && x->p->has_master;
  size_t master_bytes = with_master ? bytes / stoke_dtype_size(g->dtype) * stoke_dtype_size(mdt) : 0;
  if (with_master && !(master = stoke_alloc(master_bytes))) {
    stoke_free(host);
    return STOKE_ERR(STOKE_E_OOM, "out of host memory (%zu bytes) for master weights", master_bytes);
  }
  if (master) memset(master, 0, master_bytes);
  int idx = 0;
  stoke_rng r;
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *val = &g->values[v];
    if (val->kind != kind) continue;
    r = stoke_rng_seed(stoke_hash3(seed, 0x9a7a11ull + (uint64_t)buf, (uint64_t)idx++));
    int64_t n = stoke_numel(&val->shape);
    for (int64_t i = 0; i < n; i++) {
      double w;
      switch (val->init.kind) {
        case STOKE_INIT_ONES: w = 1; break;
        case STOKE_INIT_UNIFORM: w = val->init.a + (val->init.b - val->init.a) * stoke_rng_uniform(&r); break;
        case STOKE_INIT_NORMAL: w = val->init.a + val->init.b * stoke_rng_normal(&r); break;
        default: w = 0;
      }
      char *dst = host + val->offset;
      if (master) stoke_elem_set(master, mdt, (int64_t)(val->offset / stoke_dtype_size(val->dtype)) + i, w);
      if (val->dtype == STOKE_F64 || val->dtype == STOKE_F32 || val->dtype == STOKE_BF16 || val->dtype == STOKE_F16)
        stoke_elem_set(dst, val->dtype, i, w);
      else {
        stoke_free(host);
        stoke_free(master);
        return STOKE_ERR(STOKE_E_UNSUPPORTED, "parameter '%s': initialization of %d-byte dtype",
                         val->name, (int)stoke_dtype_size(val->dtype));
      }
    }
  }
  /* drawn in [O, C, kh, kw] order; filters kept [O, kh, kw, C] are reordered, the master copy (the optimizer
   * state's first tensor) too */
  stoke_err *e = buf == STOKE_BUF_PARAMS ? stoke_plan_filters_permute(x->p, host, master, 1, 1) : NULL;
  if (!e) e = x->dev->copy(x->dev_self, x->buf[buf], host, bytes, STOKE_COPY_H2D, NULL);
  if (!e && master) e = x->dev->copy(x->dev_self, x->opt_state, master, master_bytes, STOKE_COPY_H2D, NULL);
  if (!e && x->dev->stream_sync) e = x->dev->stream_sync(x->dev_self, NULL); /* host buffers go next */
  stoke_free(host);
  stoke_free(master);
  STOKE_TRY(e, "copying initial parameters to the device");
  return NULL;
}

static stoke_err *dev_alloc(stoke_exec *x, size_t bytes, void **ptr, const char *what) {
  *ptr = NULL;
  if (!bytes) return NULL;
  STOKE_TRY(x->dev->alloc(x->dev_self, bytes, ptr), "allocating %s (%zu bytes)", what, bytes);
  x->dev_bytes += bytes;
  return NULL;
}

size_t stoke_exec_device_bytes(const stoke_exec *x) { return x ? x->dev_bytes : 0; }

/* Write `v` into the loss seed (d loss, in the loss's dtype). */
static stoke_err *write_seed(stoke_exec *x, double v) {
  const stoke_graph *g = x->p->g;
  if (g->seed < 0) return NULL;
  char one[8];
  stoke_elem_set(one, g->values[g->seed].dtype, 0, v);
  return stoke_exec_copy(x, value_ptr(x, g->seed), one, stoke_dtype_size(g->values[g->seed].dtype),
                         STOKE_COPY_H2D);
}

/* An update-time (STOKE_OPT) kernel's arguments over `in`, planned once:
 * its plan() may ask for workspace (grad_norm's partial sums). */
static stoke_err *plan_update_kernel(stoke_exec *x, const stoke_kernel_v1 *k, const char *name, stoke_tensor *in,
                                     int n_in, node_args *na) {
  static const stoke_node_v1 nodes[] = {{.op = "optimizer", .name = "optimizer"},
                                        {.op = "loss_scaler", .name = "loss_scaler"},
                                        {.op = "grad_norm", .name = "grad_clip"}};
  const stoke_node_v1 *node = &nodes[!strcmp(name, "loss_scaler") ? 1 : !strcmp(name, "grad_clip") ? 2 : 0];
  na->a = (stoke_kernel_args_v1){.node = node, .n_in = n_in, .in = in, .flags = x->p->opts.flags,
                                 .stream = x->stream, .engine = engine_self(x->p, k), .training = 1};
  if (!k->plan) return NULL;
  void *state = NULL;
  size_t ws = 0;
  STOKE_TRY(k->plan(&na->a, &state, &ws), "planning the %s kernel (%s on %s)", name, k->op, k->engine);
  if (state && k->destroy) k->destroy(state); /* update kernels keep no per-node state */
  if (ws > x->p->workspace_bytes) x->p->workspace_bytes = ws;
  return NULL;
}

/* The loss scaler's state [scale, good, found_inf, skipped] and the seed
 * at the first scale; amp_check reads the gradients, amp_update the state. */
static stoke_err *prepare_scaler(stoke_exec *x) {
  stoke_plan *p = x->p;
  const stoke_graph *g = p->g;
  float init[4] = {(float)p->opts.init_scale, 0, 0, 0};
  STOKE_PROPAGATE(dev_alloc(x, sizeof init, (void **)&x->amp, "loss scaler"));
  STOKE_PROPAGATE(stoke_exec_copy(x, x->amp, init, sizeof init, STOKE_COPY_H2D));
  STOKE_PROPAGATE(write_seed(x, init[0]));
  stoke_shape flat = {1, {(int64_t)(p->bytes[STOKE_BUF_GRADS] / stoke_dtype_size(g->dtype))}};
  x->amp_t[0] = (stoke_tensor){x->buf[STOKE_BUF_GRADS], flat, g->dtype, STOKE_LAYOUT_ANY, x->dev->device};
  x->amp_t[1] = (stoke_tensor){x->amp, {1, {4}}, STOKE_F32, STOKE_LAYOUT_ANY, x->dev->device};
  x->amp_t[2] = x->amp_t[1];
  x->amp_t[3] = g->seed >= 0 ? stoke_exec_tensor(x, g->seed) : x->amp_t[1];
  STOKE_PROPAGATE(plan_update_kernel(x, p->amp_check, "loss_scaler", &x->amp_t[0], 2, &x->amp_check));
  return plan_update_kernel(x, p->amp_update, "loss_scaler", &x->amp_t[2], 2, &x->amp_update);
}

/* Everything the update reads besides the flat buffers: the loss scaler,
 * the gradient norm's [norm, factor], the weight-decay ranges, and the
 * kernels' arguments. */
static stoke_err *prepare_update(stoke_exec *x) {
  stoke_plan *p = x->p;
  const stoke_graph *g = p->g;
  const stoke_device_kind dk = x->dev->device;
  if (!p->opt_kernel) return NULL;
  if (p->amp_check) STOKE_PROPAGATE(prepare_scaler(x));
  stoke_shape flat = {1, {(int64_t)(p->bytes[STOKE_BUF_PARAMS] / stoke_dtype_size(g->dtype))}};
  stoke_shape flat_state = {1, {(int64_t)(p->opt_state_bytes / stoke_dtype_size(p->state_dtype))}};
  x->opt_t[0] = (stoke_tensor){x->buf[STOKE_BUF_PARAMS], flat, g->dtype, STOKE_LAYOUT_ANY, dk};
  x->opt_t[1] = (stoke_tensor){x->buf[STOKE_BUF_GRADS], flat, g->dtype, STOKE_LAYOUT_ANY, dk};
  x->opt_t[2] = (stoke_tensor){x->opt_state, flat_state, p->state_dtype, STOKE_LAYOUT_ANY, dk};
  if (p->grad_norm) {
    STOKE_PROPAGATE(dev_alloc(x, 2 * sizeof(float), (void **)&x->clip, "the gradient norm"));
    x->norm_t[0] = x->opt_t[1];
    x->norm_t[1] = (stoke_tensor){x->clip, {1, {2}}, STOKE_F32, STOKE_LAYOUT_ANY, dk};
    STOKE_PROPAGATE(plan_update_kernel(x, p->grad_norm, "grad_clip", x->norm_t, 2, &x->grad_norm));
  }
  if (p->n_decay >= 0) {
    size_t bytes = sizeof(int64_t) * 2 * (size_t)(p->n_decay > 0 ? p->n_decay : 1);
    STOKE_PROPAGATE(dev_alloc(x, bytes, (void **)&x->decay, "the weight-decay ranges"));
    if (p->n_decay > 0) STOKE_PROPAGATE(stoke_exec_copy(x, x->decay, p->decay, bytes, STOKE_COPY_H2D));
  }
  return plan_update_kernel(x, p->opt_kernel, "optimizer", x->opt_t, 3, &x->opt);
}

/* Does [a, a + an) overlap [b, b + bn)? */
static int ranges_meet(const char *a, size_t an, const char *b, size_t bn) {
  return a && b && a < b + bn && b < a + an;
}

/* The memory node i touches: `writes` 1 its outputs (a backward's din, a
 * forward's out; a with_forward backward's out too), 0 everything it
 * reads or writes. Does any of it meet [p, p + bytes)? */
static int node_meets(stoke_exec *x, int i, int writes, const char *p, size_t bytes) {
  const stoke_gnode *n = &x->p->g->nodes[i];
  const stoke_value *v = x->p->g->values;
  int bwd = n->pass == STOKE_BWD;
  for (int k = 0; k < n->n_in; k++) {
    if (!writes && ranges_meet(x->args[i].in[k].data, v[n->in[k]].bytes, p, bytes)) return 1;
    if (bwd && n->din[k] >= 0 && ranges_meet(x->args[i].din[k].data, v[n->din[k]].bytes, p, bytes)) return 1;
  }
  for (int j = 0; j < n->n_out; j++) {
    if ((!writes || !bwd || n->with_forward) && ranges_meet(x->args[i].out[j].data, v[n->out[j]].bytes, p, bytes))
      return 1;
    if (!writes && bwd && n->dout[j] >= 0 && ranges_meet(x->args[i].dout[j].data, v[n->dout[j]].bytes, p, bytes))
      return 1;
  }
  return 0;
}

/* The node before which the compute stream must wait for side node i's
 * work: the plan's join, or the first node before it that writes memory
 * the side work reads (its in, out, dout) or touches its parameter
 * gradients. The plan's liveness should leave none; this holds whatever
 * the placement did. */
static int side_checked_join(stoke_exec *x, int i) {
  const stoke_gnode *n = &x->p->g->nodes[i];
  const stoke_value *v = x->p->g->values;
  const node_args *na = &x->args[i];
  for (int j = i + 1; j < n->side_join; j++) {
    if (stoke_node_in_bwd(&x->p->g->nodes[j])) continue; /* its work runs in the next node */
    for (int k = 0; k < n->n_in; k++) {
      if (node_meets(x, j, 1, na->in[k].data, v[n->in[k]].bytes)) return j;
      if (n->din[k] >= 0 && v[n->din[k]].kind == STOKE_VAL_PARAM_GRAD &&
          node_meets(x, j, 0, na->din[k].data, v[n->din[k]].bytes))
        return j;
    }
    for (int q = 0; q < n->n_out; q++) {
      if (node_meets(x, j, 1, na->out[q].data, v[n->out[q]].bytes)) return j;
      if (n->dout[q] >= 0 && node_meets(x, j, 1, na->dout[q].data, v[n->dout[q]].bytes)) return j;
    }
  }
  return n->side_join;
}

/* [run] wgrad_stream on a device with streams and events (not the CPU:
 * its kernels run in order anyway): the side stream, its workspace (as
 * large as the compute stream's: a side kernel never shares it) and the
 * events; each side node's checked join. */
static stoke_err *side_setup(stoke_exec *x) {
  const stoke_backend_v1 *d = x->dev;
  int n = x->p->g->n_nodes;
  if (!x->p->n_side || !x->stream || !d->stream_create || !d->timer_create || !d->timer_record || !d->stream_wait)
    return NULL;
  x->done = calloc((size_t)n, sizeof *x->done);
  x->join = calloc((size_t)n, sizeof *x->join);
  x->pend = calloc((size_t)n, sizeof *x->pend);
  if (!x->done || !x->join || !x->pend) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  STOKE_TRY(d->stream_create(x->dev_self, &x->side), "creating the side stream ([run] wgrad_stream)");
  STOKE_PROPAGATE(dev_alloc(x, x->p->workspace_bytes, &x->side_ws, "the side stream's workspace ([run] wgrad_stream)"));
  STOKE_PROPAGATE(d->timer_create(x->dev_self, &x->fork));
  int early = 0;
  for (int i = 0; i < n; i++) {
    if (!x->p->g->nodes[i].side) continue;
    STOKE_PROPAGATE(d->timer_create(x->dev_self, &x->done[i]));
    x->join[i] = side_checked_join(x, i);
    early += x->join[i] < x->p->g->nodes[i].side_join;
  }
  stoke_log(STOKE_LOG_INFO, "exec",
            "wgrad_stream: %d backward nodes' weight gradients on a second stream (%d waited for earlier than planned: "
            "a node between writes what they read)", x->p->n_side, early);
  return NULL;
}

/* The compute stream waits for the side work due before node `at`
 * (x->p->g->n_nodes: all of it). */
static stoke_err *side_wait(stoke_exec *x, int at) {
  int keep = 0;
  for (int k = 0; k < x->n_pend; k++) {
    int i = x->pend[k];
    if (x->join[i] <= at) STOKE_PROPAGATE(x->dev->stream_wait(x->dev_self, x->stream, x->done[i]));
    else x->pend[keep++] = i;
  }
  x->n_pend = keep;
  return NULL;
}

static stoke_err *exec_new(stoke_plan *p, const stoke_backend_v1 *dev, void *dev_self, uint64_t seed,
                           stoke_exec *share, stoke_exec **out) {
  stoke_graph *g = p->g;
  if (share && (share->p->bytes[STOKE_BUF_PARAMS] != p->bytes[STOKE_BUF_PARAMS] ||
                share->p->bytes[STOKE_BUF_STATE] != p->bytes[STOKE_BUF_STATE]))
    return STOKE_ERR(STOKE_E_INTERNAL, "shared plans differ in parameters (%zu vs %zu bytes)",
                     share->p->bytes[STOKE_BUF_PARAMS], p->bytes[STOKE_BUF_PARAMS]);
  stoke_exec *x = calloc(1, sizeof *x);
  if (!x) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  x->p = p;
  x->dev = dev;
  x->dev_self = dev_self;
  x->stream = dev->default_stream ? dev->default_stream(dev_self) : NULL;
  stoke_err *e = NULL;
  static const char *what[] = {"parameters", "gradients", "activations", "running statistics"};
  for (int b = 0; b < STOKE_BUF_COUNT && !e; b++) {
    if (share && (b == STOKE_BUF_PARAMS || b == STOKE_BUF_STATE)) {
      x->buf[b] = share->buf[b];
      x->borrowed[b] = 1;
    } else {
      e = dev_alloc(x, p->bytes[b], &x->buf[b], what[b]);
    }
  }
  if (!e) e = dev_alloc(x, p->opt_state_bytes, &x->opt_state, "optimizer state");
  if (!e && x->opt_state) e = dev->fill(dev_self, x->opt_state, 0, p->opt_state_bytes, NULL);
  if (!e && x->buf[STOKE_BUF_GRADS]) e = dev->fill(dev_self, x->buf[STOKE_BUF_GRADS], 0, p->bytes[STOKE_BUF_GRADS], NULL);
  if (!e && !share) e = init_params(x, seed, STOKE_BUF_PARAMS);
  if (!e && !share) e = init_params(x, seed, STOKE_BUF_STATE);
  if (!e && g->seed >= 0) {
    double one = 1.0;
    float onef = 1.0f;
    const void *src = g->values[g->seed].dtype == STOKE_F64 ? (const void *)&one : (const void *)&onef;
    e = dev->copy(dev_self, value_ptr(x, g->seed), src, stoke_dtype_size(g->values[g->seed].dtype),
                  STOKE_COPY_H2D, NULL);
  }
  if (!e && !(x->args = calloc((size_t)g->n_nodes, sizeof *x->args)))
    e = STOKE_ERR(STOKE_E_OOM, "out of memory");
  /* kernel arguments, built once; plan() of each kernel sizes workspace */
  const stoke_gnode *ws_node = NULL; /* the node whose plan() asked for the largest workspace */
  for (int i = 0; i < g->n_nodes && !e; i++) {
    stoke_gnode *n = &g->nodes[i];
    node_args *na = &x->args[i];
    for (int k = 0; k < n->n_in; k++) {
      na->in[k] = stoke_exec_tensor(x, n->in[k]);
      if (n->pass == STOKE_BWD && !n->with_forward && !(n->type->bwd_needs & STOKE_BWD_NEEDS_INPUT(k)))
        na->in[k].data = NULL;
      if (n->pass == STOKE_BWD && n->din[k] >= 0) {
        na->din[k] = stoke_exec_tensor(x, n->din[k]);
        if (g->values[n->din[k]].kind == STOKE_VAL_PARAM_GRAD) na->a.param_grads |= 1u << k;
      }
    }
    for (int j = 0; j < n->n_out; j++) {
      na->out[j] = stoke_exec_tensor(x, n->out[j]);
      if (n->pass == STOKE_BWD && !n->with_forward && !(n->type->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j)))
        na->out[j].data = NULL;
      if (n->pass == STOKE_BWD && n->dout[j] >= 0) na->dout[j] = stoke_exec_tensor(x, n->dout[j]);
    }
    na->a = (stoke_kernel_args_v1){
        .node = &n->n, .n_in = n->n_in, .n_out = n->n_out, .in = na->in, .out = na->out,
        .din = n->pass == STOKE_BWD ? na->din : NULL, .dout = n->pass == STOKE_BWD ? na->dout : NULL,
        .param_grads = na->a.param_grads, .training = p->opts.training,
        .engine = engine_self(p, n->kernel), .flags = p->opts.flags, .stream = x->stream,
        .din_accumulate = n->din_accumulate, .with_forward = n->pass == STOKE_BWD && n->with_forward};
    e = plan_node(p, share, n, na);
    if (!e && n->workspace > p->workspace_bytes) p->workspace_bytes = n->workspace, ws_node = n;
  }
  size_t node_ws = p->workspace_bytes;
  if (!e) e = prepare_update(x);
  if (!e) e = dev_alloc(x, p->workspace_bytes, &x->workspace, "kernel workspace");
  if (e && e->code == STOKE_E_OOM && ws_node && node_ws == p->workspace_bytes)
    /* name the kernel that asked for it: a plan() returning a size from a bad computation shows here */
    e = stoke_err_wrap(e, __FILE__, __LINE__,
                       "sizing the kernel workspace: %zu bytes is the most any kernel's plan() asked for, by node '%s' "
                       "(op %s, kernel of engine %s); if that is more than the kernel needs, its plan() is wrong",
                       node_ws, ws_node->n.name, ws_node->n.op, ws_node->kernel ? ws_node->kernel->engine : "?");
  if (!e) e = side_setup(x);
  for (int i = 0; i < g->n_nodes && !e; i++) {
    x->args[i].a.workspace = x->workspace;
    x->args[i].a.workspace_bytes = p->workspace_bytes;
  }
  node_args *upd[] = {&x->amp_check, &x->amp_update, &x->grad_norm, &x->opt};
  for (int i = 0; i < 4; i++) {
    upd[i]->a.workspace = x->workspace;
    upd[i]->a.workspace_bytes = p->workspace_bytes;
  }
  if (e) {
    stoke_exec_free(x);
    return e;
  }
  *out = x;
  return NULL;
}

stoke_err *stoke_exec_new(stoke_plan *p, const stoke_backend_v1 *dev, void *dev_self, uint64_t seed,
                          stoke_exec **out) {
  return exec_new(p, dev, dev_self, seed, NULL, out);
}

stoke_err *stoke_exec_new_shared(stoke_plan *p, stoke_exec *share, stoke_exec **out) {
  return exec_new(p, share->dev, share->dev_self, 0, share, out);
}

stoke_plan *stoke_exec_plan(stoke_exec *x) { return x->p; }

stoke_err *stoke_exec_copy(stoke_exec *x, void *dst, const void *src, size_t bytes,
                           stoke_copy_kind kind) {
  if (!bytes) return NULL;
  STOKE_PROPAGATE(x->dev->copy(x->dev_self, dst, src, bytes, kind, NULL));
  return x->dev->stream_sync ? x->dev->stream_sync(x->dev_self, NULL) : NULL;
}

stoke_err *stoke_exec_state_keep(stoke_exec *x) {
  size_t n = x->p->bytes[STOKE_BUF_STATE];
  if (!n || !x->buf[STOKE_BUF_STATE]) return NULL;
  if (!x->state_kept) STOKE_PROPAGATE(dev_alloc(x, n, &x->state_kept, "the running statistics kept at a step's start"));
  STOKE_TRY(x->dev->copy(x->dev_self, x->state_kept, x->buf[STOKE_BUF_STATE], n, STOKE_COPY_D2D, x->stream),
            "keeping the running statistics at the step's start");
  return NULL;
}

stoke_err *stoke_exec_state_restore(stoke_exec *x) {
  size_t n = x->p->bytes[STOKE_BUF_STATE];
  if (!n || !x->state_kept) return NULL;
  STOKE_TRY(x->dev->copy(x->dev_self, x->buf[STOKE_BUF_STATE], x->state_kept, n, STOKE_COPY_D2D, x->stream),
            "putting back the running statistics of the step's start");
  return x->dev->stream_sync ? x->dev->stream_sync(x->dev_self, x->stream) : NULL;
}

stoke_err *stoke_exec_read(stoke_exec *x, int value, void *host, size_t bytes) {
  STOKE_TRY(x->dev->copy(x->dev_self, host, value_ptr(x, value), bytes, STOKE_COPY_D2H, NULL),
            "reading '%s' from the device", x->p->g->values[value].name);
  return NULL;
}

void stoke_exec_free(stoke_exec *x) {
  if (!x) return;
  stoke_graph *g = x->p->g;
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].kstate && g->nodes[i].kernel->destroy) g->nodes[i].kernel->destroy(g->nodes[i].kstate);
    g->nodes[i].kstate = NULL;
  }
  for (int b = 0; b < STOKE_BUF_COUNT; b++)
    if (x->buf[b] && !x->borrowed[b]) x->dev->free(x->dev_self, x->buf[b]);
  if (x->opt_state) x->dev->free(x->dev_self, x->opt_state);
  if (x->workspace) x->dev->free(x->dev_self, x->workspace);
  if (x->side_ws) x->dev->free(x->dev_self, x->side_ws);
  if (x->side) x->dev->stream_destroy(x->dev_self, x->side);
  if (x->fork) x->dev->timer_destroy(x->dev_self, x->fork);
  for (int i = 0; x->done && i < g->n_nodes; i++)
    if (x->done[i]) x->dev->timer_destroy(x->dev_self, x->done[i]);
  free(x->done);
  free(x->join);
  free(x->pend);
  if (x->amp) x->dev->free(x->dev_self, x->amp);
  if (x->state_kept) x->dev->free(x->dev_self, x->state_kept);
  if (x->clip) x->dev->free(x->dev_self, x->clip);
  if (x->decay) x->dev->free(x->dev_self, x->decay);
  if (x->live) x->dev->free(x->dev_self, x->live);
  stoke_err_free(stoke_exec_graphs(x, 0));
  if (x->timers)
    for (int i = 0; i < x->p->g->n_nodes + 2; i++)
      if (x->timers[i]) x->dev->timer_destroy(x->dev_self, x->timers[i]);
  free(x->timers);
  free(x->ms);
  free(x->last_ms);
  free(x->anom_host);
  free(x->args);
  free(x);
}

static stoke_err *tick(stoke_exec *x, int slot) {
  if (!x->profiling) return NULL;
  return x->dev->timer_record(x->dev_self, x->timers[slot], x->stream);
}

stoke_err *stoke_exec_profile(stoke_exec *x, int on) {
  int n = x->p->g->n_nodes;
  if (on && !x->dev->timer_create)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "backend '%s' has no timers: no per-op profile", x->dev->name);
  if (on && !x->timers) {
    x->timers = calloc((size_t)n + 2, sizeof *x->timers);
    x->ms = calloc((size_t)n + 1, sizeof *x->ms);
    x->last_ms = calloc((size_t)n + 1, sizeof *x->last_ms);
    if (!x->timers || !x->ms || !x->last_ms) return STOKE_ERR(STOKE_E_OOM, "out of memory for the profile");
    for (int i = 0; i < n + 2; i++) STOKE_PROPAGATE(x->dev->timer_create(x->dev_self, &x->timers[i]));
  }
  x->profiling = on;
  return NULL;
}

/* After a profiled step: wait for it, add each node's time. */
static stoke_err *profile_collect(stoke_exec *x) {
  int n = x->p->g->n_nodes;
  STOKE_PROPAGATE(tick(x, n + 1));
  if (x->dev->stream_sync) STOKE_PROPAGATE(x->dev->stream_sync(x->dev_self, NULL));
  for (int i = 0; i <= n; i++) {
    void *a = i == 0 ? x->timers[n] : x->timers[i - 1], *b = i == n ? x->timers[n + 1] : x->timers[i];
    if (i == n) a = x->timers[n - 1];
    float ms = 0;
    STOKE_PROPAGATE(x->dev->timer_elapsed_ms(x->dev_self, a, b, &ms));
    x->ms[i] += ms;
    x->last_ms[i] = ms;
  }
  x->profiled_steps++;
  return NULL;
}

typedef struct op_row {
  char key[48];
  double ms;
  int count;
} op_row;

static int by_ms(const void *a, const void *b) {
  double x = ((const op_row *)a)->ms, y = ((const op_row *)b)->ms;
  return x < y ? 1 : x > y ? -1 : 0;
}

void stoke_exec_profile_report(stoke_exec *x, FILE *f) {
  if (!x->profiled_steps) return;
  const stoke_graph *g = x->p->g;
  int n = g->n_nodes;
  double steps = (double)x->profiled_steps, total = 0;
  for (int i = 0; i <= n; i++) total += x->ms[i] / steps;
  op_row *rows = calloc((size_t)n + 2, sizeof *rows);
  stoke_op_time *ops = calloc((size_t)n + 1, sizeof *ops);
  if (!rows || !ops) {
    free(rows);
    free(ops);
    return;
  }
  /* by op type and pass (the engine that served it in brackets) */
  int nr = stoke_exec_profile_rows(x, ops, n + 1);
  fprintf(f, "per-op GPU time over %lld profiled steps: %.3f ms per step\n", (long long)x->profiled_steps, total);
  fprintf(f, "  %-40s %6s %10s %7s\n", "op (pass) [engine]", "nodes", "ms/step", "share");
  for (int k = 0; k < nr; k++) {
    char key[96];
    if (ops[k].engine[0]) snprintf(key, sizeof key, "%s %s [%s]", ops[k].op, ops[k].pass, ops[k].engine);
    else snprintf(key, sizeof key, "%s", ops[k].op);
    fprintf(f, "  %-40s %6d %10.3f %6.1f%%\n", key, ops[k].nodes, ops[k].ms, 100 * ops[k].ms / total);
  }
  free(ops);
  /* the slowest single nodes */
  nr = 0;
  for (int i = 0; i < n; i++) {
    snprintf(rows[nr].key, sizeof rows[0].key, "%.46s", g->nodes[i].n.name);
    rows[nr].ms = x->ms[i] / steps;
    rows[nr++].count = 1;
  }
  qsort(rows, (size_t)nr, sizeof *rows, by_ms);
  fprintf(f, "  slowest nodes:\n");
  for (int k = 0; k < nr && k < 15; k++) fprintf(f, "    %-46s %10.3f ms\n", rows[k].key, rows[k].ms);
  free(rows);
}

/* ------------------------------------------------- [run] detect_anomaly */

stoke_err *stoke_exec_anomaly(stoke_exec *x, int on, int skip_backward) {
  if (on && x->graphs_on)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "[run] detect_anomaly = true reads every node's outputs back between "
                     "kernels, which a replayed graph cannot; set [run] cuda_graph = false");
  x->anomaly = on ? 1 + !!skip_backward : 0;
  return NULL;
}

/* The non-finite values of the float tensor `t` (read back to the host):
 * how many, and the first one's index and value. 0 for other dtypes. */
static stoke_err *nonfinite_in(stoke_exec *x, const stoke_tensor *t, int64_t *bad, int64_t *first, double *v) {
  *bad = 0;
  stoke_dtype dt = t->dtype;
  if (!t->data || (dt != STOKE_F32 && dt != STOKE_F64 && dt != STOKE_F16 && dt != STOKE_BF16)) return NULL;
  int64_t n = stoke_numel(&t->shape);
  size_t bytes = (size_t)n * stoke_dtype_size(dt);
  if (bytes > x->anom_cap) {
    void *h = realloc(x->anom_host, bytes);
    if (!h) return STOKE_ERR(STOKE_E_OOM, "[run] detect_anomaly: no host memory for a %zu-byte copy", bytes);
    x->anom_host = h;
    x->anom_cap = bytes;
  }
  STOKE_TRY(stoke_exec_copy(x, x->anom_host, t->data, bytes, STOKE_COPY_D2H), "[run] detect_anomaly: reading back");
  *bad = stoke_count_nonfinite(x->anom_host, dt, n, first);
  if (*bad) *v = stoke_elem_get(x->anom_host, dt, *first);
  return NULL;
}

/* "NaN" or "+inf" or "-inf" */
static const char *nonfinite_name(double v) { return isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf"; }

/* After node i ran: every float tensor it wrote (a forward node's outputs;
 * a backward node's input gradients, and its outputs when it computed
 * the forward too) must be finite. The nodes before it passed the same
 * check, so this node made the first NaN or inf of the step: named, as
 * PyTorch's detect_anomaly names the backward function. */
static stoke_err *anomaly_node(stoke_exec *x, int i) {
  const stoke_graph *g = x->p->g;
  const stoke_gnode *node = &g->nodes[i];
  const node_args *na = &x->args[i];
  int bwd = node->pass == STOKE_BWD;
  for (int pass = 0; pass < 2; pass++) {
    int grads = pass == 1;
    if (grads && (!bwd || x->anomaly == 2)) continue;
    if (!grads && bwd && !na->a.with_forward) continue;
    int n = grads ? node->n_in : node->n_out;
    for (int j = 0; j < n; j++) {
      const stoke_tensor *t = grads ? &na->din[j] : &na->out[j];
      int vid = grads ? node->din[j] : node->out[j];
      if (vid < 0) continue;
      int64_t bad = 0, first = 0;
      double v = 0;
      STOKE_PROPAGATE(nonfinite_in(x, t, &bad, &first, &v));
      if (!bad) continue;
      return STOKE_ERR(STOKE_E_NUMERIC,
                       "[run] detect_anomaly: node '%s' (%s %s on %s) wrote %lld NaN or inf values into %s %d, "
                       "'%s' %s %s (the first: element %lld, %s); every value it read was finite (checked after "
                       "the nodes that wrote them), so this kernel made them: its inputs overflowed it (lower "
                       "[optimizer] lr or clip gradients with [optimizer] grad_clip%s), or, for a plugin op, its "
                       "kernel is wrong (tools/plugin_check checks it)",
                       node->n.name, node->n.op,
                       bwd ? "backward" : node->recompute ? "recomputed forward" : "forward", node->kernel->engine,
                       (long long)bad, grads ? "the gradient of its input" : "its output", j, g->values[vid].name,
                       stoke_shape_str(&t->shape).s, stoke_dtype_name(t->dtype), (long long)first,
                       nonfinite_name(v), t->dtype == STOKE_F16 ? "; fp16 ends at 65504: bf16 has f32's range" : "");
    }
  }
  return NULL;
}

/* The batch, before the first node: a NaN in the data is the data's. */
static stoke_err *anomaly_input(stoke_exec *x) {
  const stoke_graph *g = x->p->g;
  const stoke_value *in = &g->values[g->input];
  stoke_tensor t = {.data = value_ptr(x, g->input), .shape = in->shape, .dtype = in->dtype};
  int64_t bad = 0, first = 0;
  double v = 0;
  STOKE_PROPAGATE(nonfinite_in(x, &t, &bad, &first, &v));
  if (!bad) return NULL;
  return STOKE_ERR(STOKE_E_NUMERIC,
                   "[run] detect_anomaly: the batch itself ('%s') holds %lld NaN or inf values (the first: element "
                   "%lld of the batch, %s) before any node ran: the [data] source gave them; check the data",
                   in->name, (long long)bad, (long long)first, nonfinite_name(v));
}

/* After the update: every parameter must be finite; one that is not was
 * made so by the optimizer (its gradient was checked finite, unless the
 * loss scaler skipped that check and the step with it). */
static stoke_err *anomaly_params(stoke_exec *x, const stoke_kernel_v1 *opt) {
  const stoke_graph *g = x->p->g;
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *p = &g->values[v];
    if (p->kind != STOKE_VAL_PARAM || p->alias >= 0) continue;
    stoke_tensor t = {.data = value_ptr(x, v), .shape = p->shape, .dtype = p->dtype};
    int64_t bad = 0, first = 0;
    double val = 0;
    STOKE_PROPAGATE(nonfinite_in(x, &t, &bad, &first, &val));
    if (bad)
      return STOKE_ERR(STOKE_E_NUMERIC,
                       "[run] detect_anomaly: the optimizer update (%s on %s) made parameter '%s' hold %lld NaN or "
                       "inf values (the first: element %lld, %s)%s; lower [optimizer] lr or set [optimizer] grad_clip",
                       opt->op, opt->engine, p->name, (long long)bad, (long long)first, nonfinite_name(val),
                       x->anomaly == 1 ? " from finite gradients: the step overflowed it"
                                       : " (the backward's gradients were left to the loss scaler, not checked)");
  }
  return NULL;
}

stoke_err *stoke_exec_forward_backward(stoke_exec *x, int first_micro, uint64_t step_seed) {
  stoke_graph *g = x->p->g;
  int n = x->p->opts.training ? g->n_nodes : g->n_fwd;
  /* with accumulate > 1 the profile holds the last micro-batch's nodes */
  STOKE_PROPAGATE(tick(x, g->n_nodes));
  if (x->anomaly && g->input >= 0) STOKE_PROPAGATE(anomaly_input(x));
  /* the side stream: not while profiling (each node's time is its own) nor
   * with a hook (data parallel: a bucket's all-reduce follows the hook) */
  int side = x->side && !x->profiling && !x->hook && !x->anomaly;
  x->n_pend = 0;
  for (int i = 0; i < n; i++) {
    stoke_gnode *node = &g->nodes[i];
    node_args *na = &x->args[i];
    if (side && x->n_pend) STOKE_PROPAGATE(side_wait(x, i));
    if (stoke_node_in_bwd(node)) {
      /* the next node, its backward, computes its outputs too: nothing is
       * enqueued here, so the hook is not called */
      STOKE_PROPAGATE(tick(x, i));
      continue;
    }
    na->a.param_grad_beta = first_micro && !node->param_accumulate ? 0.0f : 1.0f;
    /* a backward node, and a forward node's recomputed copy, get the
     * forward node's seed (dropout regenerates its mask) */
    uint64_t k = node->pass == STOKE_BWD || node->recompute ? (uint64_t)node->fwd : (uint64_t)i;
    na->a.seed = stoke_hash3(step_seed, k, 0x5eedull);
    int fork = side && node->side;
    na->a.side_stream = fork ? x->side : NULL;
    na->a.side_workspace = fork ? x->side_ws : NULL;
    na->a.side_workspace_bytes = fork ? x->p->workspace_bytes : 0;
    if (fork) { /* the side stream starts after everything issued so far */
      STOKE_PROPAGATE(x->dev->timer_record(x->dev_self, x->fork, x->stream));
      STOKE_PROPAGATE(x->dev->stream_wait(x->dev_self, x->side, x->fork));
    }
    stoke_range_push(node->n.name);
    stoke_crash_note_kernel(node->kernel, &na->a);
    stoke_err *e = node->kernel->run(&na->a, node->kstate);
    stoke_crash_note_kernel(NULL, NULL);
    stoke_range_pop();
    if (!e && fork) {
      e = x->dev->timer_record(x->dev_self, x->done[i], x->side);
      x->pend[x->n_pend++] = i;
    }
    if (!e) e = tick(x, i);
    if (e)
      return stoke_err_wrap(e, __FILE__, __LINE__, "running node '%s' (%s %s on %s)", node->n.name, node->n.op,
                            node->pass == STOKE_BWD ? "backward" : node->recompute ? "recomputed forward" : "forward",
                            node->kernel->engine);
    if (x->anomaly) STOKE_PROPAGATE(anomaly_node(x, i));
    if (x->hook) STOKE_PROPAGATE(x->hook(x->hook_ctx, i));
  }
  if (x->n_pend) STOKE_PROPAGATE(side_wait(x, g->n_nodes)); /* before the update, the loss read, a capture's end */
  return NULL;
}

stoke_err *stoke_exec_update(stoke_exec *x, const stoke_opt_args_v1 *opt) {
  if (!x->p->opt_kernel) return STOKE_ERR(STOKE_E_INTERNAL, "update on a plan without optimizer");
  stoke_opt_args_v1 o = *opt;
  o.amp = x->amp;
  o.clip = x->clip;
  o.decay_ranges = x->decay;
  o.n_decay_ranges = x->p->n_decay > 0 ? x->p->n_decay : 0;
  node_args *steps[] = {x->amp ? &x->amp_check : NULL, x->clip ? &x->grad_norm : NULL, &x->opt,
                        x->amp ? &x->amp_update : NULL};
  const stoke_kernel_v1 *kernels[] = {x->p->amp_check, x->p->grad_norm, x->p->opt_kernel, x->p->amp_update};
  static const char *what[] = {"loss scaler: checking the gradients", "clipping: the global gradient norm",
                               "optimizer update", "loss scaler: updating the scale"};
  for (int i = 0; i < 4; i++) {
    if (!steps[i]) continue;
    steps[i]->a.opt = &o;
    STOKE_TRY(kernels[i]->run(&steps[i]->a, NULL), "%s (%s on %s)", what[i], kernels[i]->op, kernels[i]->engine);
  }
  if (x->profiling) STOKE_TRY(profile_collect(x), "collecting the per-op profile");
  if (x->anomaly) STOKE_PROPAGATE(anomaly_params(x, kernels[2]));
  return NULL;
}

stoke_err *stoke_exec_set_scale(stoke_exec *x, float scale, float good_steps) {
  if (!x->amp) return NULL;
  float st[4] = {scale, good_steps, 0, 0};
  STOKE_PROPAGATE(stoke_exec_copy(x, x->amp, st, sizeof st, STOKE_COPY_H2D));
  return write_seed(x, scale);
}

int stoke_exec_read_scaler(stoke_exec *x, float out[4]) {
  if (!x->amp) return 0;
  stoke_err *e = stoke_exec_copy(x, out, x->amp, 4 * sizeof(float), STOKE_COPY_D2H);
  if (e) {
    stoke_err_free(e);
    return 0;
  }
  return 1;
}

stoke_err *stoke_exec_read_loss(stoke_exec *x, double *loss) {
  const stoke_graph *g = x->p->g;
  if (g->loss < 0) return STOKE_ERR(STOKE_E_INTERNAL, "the graph has no loss");
  double d = 0;
  float f = 0;
  int is64 = g->values[g->loss].dtype == STOKE_F64;
  STOKE_TRY(x->dev->copy(x->dev_self, is64 ? (void *)&d : (void *)&f, value_ptr(x, g->loss),
                         is64 ? sizeof d : sizeof f, STOKE_COPY_D2H, NULL),
            "reading the loss");
  *loss = is64 ? d : f;
  return NULL;
}

/* ------------------------------------------------------ whole-step graphs */

stoke_err *stoke_exec_graphs(stoke_exec *x, int on) {
  if (!on) { /* the captured graphs go too (they hold the comm's captured collectives) */
    x->graphs_on = 0;
    for (int i = 0; i < 4; i++) {
      if (x->graph[i / 2][i % 2]) x->dev->graph_destroy(x->dev_self, x->graph[i / 2][i % 2]);
      x->graph[i / 2][i % 2] = NULL;
      x->uses[i / 2][i % 2] = 0;
    }
    return NULL;
  }
  if (!x->dev->capture_begin || !x->dev->capture_end || !x->dev->graph_launch)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "[run] cuda_graph = true: the '%s' device cannot capture graphs",
                     x->dev->name);
  if (x->profiling)
    return STOKE_ERR(STOKE_E_UNSUPPORTED,
                     "[run] cuda_graph = true with profile_ops = true: the profile times each kernel on "
                     "its own; turn one of them off");
  if (x->anomaly)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "[run] cuda_graph = true with detect_anomaly = true: the check reads "
                     "every node's outputs back between kernels; turn one of them off");
  /* a replayed graph keeps the arguments it was captured with: a kernel
   * that draws from the per-step seed would repeat its draw every step */
  const stoke_graph *g = x->p->g;
  for (int i = 0; i < g->n_fwd; i++)
    if (!strcmp(g->nodes[i].n.op, STOKE_OP_DROPOUT) && g->nodes[i].n.attrs[STOKE_DROPOUT_P].f > 0)
      return STOKE_ERR(STOKE_E_UNSUPPORTED,
                       "[run] cuda_graph = true: node '%s' (dropout p=%g) draws a new mask every step, "
                       "which a replayed graph would repeat; set [run] cuda_graph = false for this model",
                       g->nodes[i].n.name, g->nodes[i].n.attrs[STOKE_DROPOUT_P].f);
  if (!x->live) STOKE_PROPAGATE(dev_alloc(x, 2 * sizeof(double), (void **)&x->live, "graph step arguments"));
  x->graphs_on = 1;
  return NULL;
}

int64_t stoke_exec_graph_ops(const stoke_exec *x, int64_t accumulate) {
  if (accumulate <= 1) return x->kind_ops[1][1];
  int64_t first = x->kind_ops[1][0], middle = x->kind_ops[0][0], last = x->kind_ops[0][1];
  if (!first || !last || (accumulate > 2 && !middle)) return 0;
  return first + (accumulate - 2) * middle + last;
}
int64_t stoke_exec_graph_replays(const stoke_exec *x) { return x->replays; }

/* Eager: forward and backward, then the update on the last micro-batch. */
static stoke_err *micro_eager(stoke_exec *x, int first, int last, uint64_t seed, const stoke_opt_args_v1 *opt) {
  STOKE_PROPAGATE(stoke_exec_forward_backward(x, first, seed));
  if (last && x->hook) STOKE_PROPAGATE(x->hook(x->hook_ctx, STOKE_EXEC_HOOK_UPDATE));
  return last ? stoke_exec_update(x, opt) : NULL;
}

/* Record one micro-batch into a graph (nothing runs); *graph NULL: only
 * count its operations. */
static stoke_err *capture(stoke_exec *x, int first, int last, uint64_t seed, const stoke_opt_args_v1 *opt,
                          void **graph) {
  void *gr = NULL;
  int64_t ops = 0;
  STOKE_TRY(x->dev->capture_begin(x->dev_self, x->stream), "starting the step's graph capture");
  stoke_err *e = micro_eager(x, first, last, seed, opt);
  stoke_err *e2 = x->dev->capture_end(x->dev_self, x->stream, &gr, &ops);
  if (e) {
    stoke_err_free(e2);
    if (gr) x->dev->graph_destroy(x->dev_self, gr);
    return stoke_err_wrap(e, __FILE__, __LINE__, "capturing the step into a graph ([run] cuda_graph = false avoids it)");
  }
  STOKE_PROPAGATE(e2);
  x->kind_ops[first][last] = ops; /* [1][1]: one whole step */
  if (graph) *graph = gr;
  else x->dev->graph_destroy(x->dev_self, gr);
  return NULL;
}

stoke_err *stoke_exec_micro(stoke_exec *x, int first_micro, int last_micro, uint64_t step_seed,
                            const stoke_opt_args_v1 *opt) {
  first_micro = !!first_micro;
  last_micro = !!last_micro;
  if (!x->graphs_on) return micro_eager(x, first_micro, last_micro, step_seed, opt);
  stoke_opt_args_v1 o = *opt;
  o.live = x->live;
  if (last_micro) {
    double live[2] = {opt->lr, (double)opt->step};
    STOKE_TRY(x->dev->copy(x->dev_self, x->live, live, sizeof live, STOKE_COPY_H2D, x->stream),
              "writing the step's learning rate for the graph");
  }
  void **gr = &x->graph[first_micro][last_micro];
  /* profiled (run.trace's window): eagerly, each kernel timed on its own;
   * the same launches with the same arguments as the capture (the update
   * reads lr and step from `live`), so the graph, untouched, replays after */
  if (x->profiling) {
    if (!*gr) x->uses[first_micro][last_micro] = 1; /* as good as the first, eager use */
    return micro_eager(x, first_micro, last_micro, step_seed, &o);
  }
  if (!*gr && x->uses[first_micro][last_micro]++ == 0) return micro_eager(x, first_micro, last_micro, step_seed, &o);
  if (!*gr) STOKE_PROPAGATE(capture(x, first_micro, last_micro, step_seed, &o, gr));
  STOKE_TRY(x->dev->graph_launch(x->dev_self, *gr, x->stream), "replaying the step's graph");
  x->replays++;
  if (x->hook) STOKE_PROPAGATE(x->hook(x->hook_ctx, STOKE_EXEC_HOOK_REPLAYED));
  return NULL;
}

stoke_err *stoke_exec_count_ops(stoke_exec *x, const stoke_opt_args_v1 *opt, int64_t *ops) {
  *ops = 0;
  if (!x->dev->capture_begin || !x->p->opt_kernel || x->profiling || x->anomaly) return NULL; /* both read back between kernels */
  if (!x->kind_ops[1][1]) STOKE_PROPAGATE(capture(x, 1, 1, 0, opt, NULL));
  *ops = x->kind_ops[1][1];
  return NULL;
}

static int by_op_ms(const void *a, const void *b) {
  double x = ((const stoke_op_time *)a)->ms, y = ((const stoke_op_time *)b)->ms;
  return x < y ? 1 : x > y ? -1 : 0;
}

void *stoke_exec_profile_start(const stoke_exec *x) {
  return x->timers && x->profiled_steps ? x->timers[x->p->g->n_nodes] : NULL;
}

int stoke_exec_profile_last(const stoke_exec *x, const double **ms) {
  *ms = x->last_ms;
  return x->profiled_steps ? x->p->g->n_nodes + 1 : 0;
}

int stoke_exec_profile_rows(stoke_exec *x, stoke_op_time *out, int cap) {
  if (!x->profiled_steps) return 0;
  const stoke_graph *g = x->p->g;
  int n = g->n_nodes, nr = 0;
  double steps = (double)x->profiled_steps;
  stoke_op_time *rows = calloc((size_t)n + 1, sizeof *rows);
  if (!rows) return 0;
  for (int i = 0; i <= n; i++) {
    stoke_op_time r = {.op = "optimizer+scaler"}; /* slot n: the update */
    if (i < n) {
      snprintf(r.op, sizeof r.op, "%s", g->nodes[i].n.op);
      snprintf(r.pass, sizeof r.pass, "%s", g->nodes[i].pass == STOKE_BWD ? "bwd" : g->nodes[i].recompute ? "rec" : "fwd");
      snprintf(r.engine, sizeof r.engine, "%s", g->nodes[i].kernel->engine);
    }
    int k = 0;
    while (k < nr && (strcmp(rows[k].op, r.op) || strcmp(rows[k].pass, r.pass) || strcmp(rows[k].engine, r.engine)))
      k++;
    if (k == nr) rows[nr++] = r;
    rows[k].ms += x->ms[i] / steps;
    rows[k].nodes++;
  }
  qsort(rows, (size_t)nr, sizeof *rows, by_op_ms);
  memcpy(out, rows, sizeof *rows * (size_t)(nr < cap ? nr : cap));
  free(rows);
  return nr;
}
