/* core/dp.c: data-parallel training; see dp.h. */
#include "dp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"

#define FIRST_BUCKET_BYTES (1u << 20) /* DDP's first bucket: communication starts early */
#define SCRATCH 64                    /* doubles for host-value reductions, at least (a rank each to gather) */

struct stoke_dp {
  const stoke_comm_v1 *comm;
  void *self;
  int rank, world;
  const stoke_backend_v1 *dev;
  void *dev_self;
  stoke_exec *x;
  char *grads;           /* the flat gradient buffer (device) */
  stoke_dtype dtype;
  stoke_dist_bucket *buckets;
  int n_buckets, next;   /* next: the first bucket not launched this step */
  int armed;
  void *stream;          /* the comm stream */
  void *ev_grads, *ev_done, *ev_a, *ev_b; /* timers used as events */
  void **bucket_t;       /* the trace: each bucket's all-reduce start and end timers (2 per bucket), or NULL */
  int timing;
  double *scratch;       /* device, n_scratch doubles */
  int n_scratch;
};

int stoke_dp_graphs(const stoke_dp *d) { return d->comm->watch != NULL; }

static stoke_err *launch(stoke_dp *d, const stoke_dist_bucket *b) {
  /* the comm stream takes the gradients once the compute stream made them */
  STOKE_PROPAGATE(d->dev->timer_record(d->dev_self, d->ev_grads, NULL));
  STOKE_PROPAGATE(d->dev->stream_wait(d->dev_self, d->stream, d->ev_grads));
  size_t es = stoke_dtype_size(d->dtype);
  int i = (int)(b - d->buckets);
  if (d->timing) STOKE_PROPAGATE(d->dev->timer_record(d->dev_self, d->bucket_t[2 * i], d->stream));
  STOKE_TRY(d->comm->all_reduce(d->self, d->grads + b->offset, b->bytes / es, d->dtype, STOKE_AVG, d->stream),
            "all-reducing gradient bucket %d of %d (bytes %zu..%zu of the flat gradient buffer)",
            i + 1, d->n_buckets, b->offset, b->offset + b->bytes);
  if (d->timing) STOKE_PROPAGATE(d->dev->timer_record(d->dev_self, d->bucket_t[2 * i + 1], d->stream));
  return NULL;
}

/* The executor's hook, after node `node`: launch the buckets it completed;
 * the update comes next: the rest, and the update waits for them; a step
 * graph replayed (the buckets, captured from these calls, run inside it):
 * the comm follows the replay as it follows an eager collective. */
static stoke_err *after_node(void *ctx, int node) {
  stoke_dp *d = ctx;
  if (node == STOKE_EXEC_HOOK_REPLAYED) {
    if (!d->armed) return NULL; /* a micro-batch without the all-reduce */
    d->armed = 0;
    char what[96];
    snprintf(what, sizeof what, "the step's graph with %d all-reduce bucket%s (replay)", d->n_buckets,
             d->n_buckets == 1 ? "" : "s");
    return d->comm->watch(d->self, d->dev->default_stream(d->dev_self), what);
  }
  if (node < 0) return stoke_dp_finish(d);
  while (d->armed && d->next < d->n_buckets && d->buckets[d->next].ready <= node)
    STOKE_PROPAGATE(launch(d, &d->buckets[d->next++]));
  return NULL;
}

void stoke_dp_arm(stoke_dp *d, int last_micro) {
  d->armed = last_micro;
  d->next = 0;
}

stoke_err *stoke_dp_finish(stoke_dp *d) {
  while (d->next < d->n_buckets) STOKE_PROPAGATE(launch(d, &d->buckets[d->next++]));
  d->armed = 0;
  STOKE_PROPAGATE(d->dev->timer_record(d->dev_self, d->ev_done, d->stream));
  return d->dev->stream_wait(d->dev_self, NULL, d->ev_done); /* the optimizer waits on the device */
}

/* The bucket plan from the compiled graph: each parameter gradient's
 * place in the flat buffer and the last backward node that writes it. */
int stoke_graph_param_grads(const stoke_graph *g, struct stoke_dist_grad *out) {
  int *slot = malloc(sizeof *slot * (size_t)(g->n_values ? g->n_values : 1)), n = 0;
  if (!slot) return -1;
  for (int v = 0; v < g->n_values; v++) {
    slot[v] = -1;
    if (g->values[v].kind != STOKE_VAL_PARAM_GRAD) continue;
    slot[v] = n;
    out[n++] = (stoke_dist_grad){g->values[v].offset, g->values[v].bytes, -1};
  }
  for (int i = g->n_fwd; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++) {
      int v = g->nodes[i].din[k];
      if (v >= 0 && slot[v] >= 0) out[slot[v]].ready = i;
    }
  free(slot);
  return n;
}

static stoke_err *plan_buckets(stoke_dp *d, double bucket_bytes) {
  stoke_plan *p = stoke_exec_plan(d->x);
  const stoke_graph *g = p->g;
  stoke_dist_grad *gr = malloc(sizeof *gr * (size_t)(g->n_values + 1));
  d->buckets = malloc(sizeof *d->buckets * (size_t)(g->n_values + 1));
  int n = gr && d->buckets ? stoke_graph_param_grads(g, gr) : -1;
  if (n < 0) {
    free(gr);
    return STOKE_ERR(STOKE_E_OOM, "out of memory for the bucket plan");
  }
  size_t cap = bucket_bytes < 1 ? 1 : (size_t)bucket_bytes;
  d->n_buckets = stoke_dist_plan_buckets(gr, n, p->bytes[STOKE_BUF_GRADS], cap < FIRST_BUCKET_BYTES ? cap : FIRST_BUCKET_BYTES,
                                         cap, g->n_nodes - 1, d->buckets, g->n_values + 1);
  free(gr);
  if (d->n_buckets < 0) return STOKE_ERR(STOKE_E_INTERNAL, "planning gradient buckets");
  return NULL;
}

void stoke_dp_describe(const stoke_dp *d, char *buf, size_t cap) {
  if (d->world == 1) {
    snprintf(buf, cap, "place (one process: nothing to all-reduce)");
    return;
  }
  size_t used = (size_t)snprintf(buf, cap, "%d bucket%s (MiB, in launch order):", d->n_buckets,
                                 d->n_buckets == 1 ? "" : "s");
  for (int i = 0; i < d->n_buckets && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s %.1f", i ? "," : "", d->buckets[i].bytes / 1048576.0);
}

stoke_err *stoke_dp_open(const stoke_comm_v1 *comm, const stoke_cfg *cfg, const stoke_dist_env *env,
                         const stoke_backend_v1 *dev, void *dev_self, stoke_dp **out) {
  if (dev->device != STOKE_DEV_GPU || !dev->stream_create || !dev->stream_wait || !dev->timer_create)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "[run] comm = %s needs a GPU device backend (cuda); '%s' has no streams",
                     comm->name, dev->name);
  stoke_dp *d = calloc(1, sizeof *d);
  if (!d) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  d->comm = comm;
  d->dev = dev;
  d->dev_self = dev_self;
  d->rank = env->rank;
  d->world = env->world;
  stoke_comm_place_v1 place = {env->rank, env->world, env->local_rank, env->world > 1 ? env->comm_id : "",
                               env->source};
  stoke_err *e = comm->open(cfg, &place, &d->self);
  if (e) {
    free(d);
    return stoke_err_wrap(e, __FILE__, __LINE__, "opening comm '%s'", comm->name);
  }
  e = dev->stream_create(dev_self, &d->stream);
  void **evs[] = {&d->ev_grads, &d->ev_done, &d->ev_a, &d->ev_b};
  for (int i = 0; i < 4 && !e; i++) e = dev->timer_create(dev_self, evs[i]);
  d->n_scratch = env->world > SCRATCH ? env->world : SCRATCH;
  if (!e) e = dev->alloc(dev_self, (size_t)d->n_scratch * sizeof(double), (void **)&d->scratch);
  if (e) {
    stoke_dp_close(d);
    return e;
  }
  *out = d;
  return NULL;
}

stoke_err *stoke_dp_attach(stoke_dp *d, stoke_exec *x, double bucket_bytes) {
  d->x = x;
  d->grads = stoke_exec_buffer(x, STOKE_BUF_GRADS);
  d->dtype = stoke_exec_plan(x)->g->dtype;
  STOKE_PROPAGATE(plan_buckets(d, bucket_bytes));
  /* one process: the average over one rank is the gradient itself. Its all-reduces would still run NCCL's
   * one-rank kernels beside the backward, 1.1% (ResNet-50) to 2.6% (GPT-2) of the step (BENCHMARKS.md run 27) */
  if (d->world > 1) stoke_exec_set_hook(x, after_node, d);
  return NULL;
}

void stoke_dp_close(stoke_dp *d) {
  if (!d) return;
  /* the executor's step graphs hold the buckets' captured all-reduces: they go before the comm, whose
   * abort waits for every graph holding its work (forever: seen on 2 H200s, NCCL 2.28) */
  if (d->x) stoke_err_free(stoke_exec_graphs(d->x, 0));
  if (d->x) stoke_exec_set_hook(d->x, NULL, NULL);
  if (d->stream) stoke_err_free(d->dev->stream_sync(d->dev_self, d->stream));
  if (d->self) d->comm->close(d->self);
  void *evs[] = {d->ev_grads, d->ev_done, d->ev_a, d->ev_b};
  for (int i = 0; i < 4; i++)
    if (evs[i]) d->dev->timer_destroy(d->dev_self, evs[i]);
  for (int i = 0; d->bucket_t && i < 2 * d->n_buckets; i++)
    if (d->bucket_t[i]) d->dev->timer_destroy(d->dev_self, d->bucket_t[i]);
  free(d->bucket_t);
  if (d->stream) d->dev->stream_destroy(d->dev_self, d->stream);
  if (d->scratch) d->dev->free(d->dev_self, d->scratch);
  free(d->buckets);
  free(d);
}

stoke_err *stoke_dp_broadcast_state(stoke_dp *d) {
  stoke_plan *p = stoke_exec_plan(d->x);
  void *cs = d->dev->default_stream(d->dev_self);
  struct {
    void *buf;
    size_t bytes;
    const char *what;
  } parts[] = {
      /* bytes: a copy, whatever the types inside (f32 master weights lead the optimizer state) */
      {stoke_exec_buffer(d->x, STOKE_BUF_PARAMS), p->bytes[STOKE_BUF_PARAMS], "parameters"},
      {stoke_exec_buffer(d->x, STOKE_BUF_STATE), p->bytes[STOKE_BUF_STATE], "running statistics"},
      {stoke_exec_opt_state(d->x), p->opt_state_bytes, "optimizer state"},
  };
  for (int i = 0; i < 3; i++) {
    if (!parts[i].buf || !parts[i].bytes) continue;
    STOKE_TRY(d->comm->broadcast(d->self, parts[i].buf, parts[i].bytes, STOKE_U8, 0, cs),
              "broadcasting the %s from rank 0", parts[i].what);
  }
  STOKE_TRY(d->dev->stream_sync(d->dev_self, NULL), "broadcasting the initial state from rank 0");
  return NULL;
}

stoke_err *stoke_dp_sum(stoke_dp *d, double *v, int n) {
  if (n > d->n_scratch) return STOKE_ERR(STOKE_E_INTERNAL, "stoke_dp_sum: %d values, at most %d", n, d->n_scratch);
  size_t bytes = sizeof(double) * (size_t)n;
  STOKE_PROPAGATE(d->dev->copy(d->dev_self, d->scratch, v, bytes, STOKE_COPY_H2D, NULL));
  STOKE_PROPAGATE(d->comm->all_reduce(d->self, d->scratch, (size_t)n, STOKE_F64, STOKE_SUM,
                                      d->dev->default_stream(d->dev_self)));
  STOKE_PROPAGATE(d->dev->copy(d->dev_self, v, d->scratch, bytes, STOKE_COPY_D2H, NULL));
  return d->dev->stream_sync(d->dev_self, NULL);
}

stoke_err *stoke_dp_gather(stoke_dp *d, double v, double *all) {
  for (int r = 0; r < d->world; r++) all[r] = r == d->rank ? v : 0;
  return stoke_dp_sum(d, all, d->world);
}

stoke_err *stoke_dp_bench(stoke_dp *d, int iters, double *ms, double *busbw_gbs) {
  size_t bytes = stoke_exec_plan(d->x)->bytes[STOKE_BUF_GRADS], es = stoke_dtype_size(d->dtype);
  STOKE_PROPAGATE(d->dev->stream_sync(d->dev_self, NULL));
  for (int i = 0; i < iters + 3; i++) {
    if (i == 3) STOKE_PROPAGATE(d->dev->timer_record(d->dev_self, d->ev_a, d->stream));
    STOKE_PROPAGATE(d->comm->all_reduce(d->self, d->grads, bytes / es, d->dtype, STOKE_AVG, d->stream));
  }
  STOKE_PROPAGATE(d->dev->timer_record(d->dev_self, d->ev_b, d->stream));
  STOKE_PROPAGATE(d->dev->timer_sync(d->dev_self, d->ev_b));
  float t = 0;
  STOKE_PROPAGATE(d->dev->timer_elapsed_ms(d->dev_self, d->ev_a, d->ev_b, &t));
  *ms = t / iters;
  *busbw_gbs = (double)bytes / (*ms * 1e-3) * 2.0 * (d->world - 1) / d->world / 1e9;
  return NULL;
}

stoke_err *stoke_dp_time_buckets(stoke_dp *d, int on) {
  if (d->world == 1) return NULL; /* no bucket is launched (stoke_dp_attach): nothing to time */
  if (on && !d->bucket_t) {
    d->bucket_t = calloc((size_t)(2 * d->n_buckets), sizeof *d->bucket_t);
    if (!d->bucket_t) return STOKE_ERR(STOKE_E_OOM, "out of memory for the buckets' timers");
    for (int i = 0; i < 2 * d->n_buckets; i++) STOKE_PROPAGATE(d->dev->timer_create(d->dev_self, &d->bucket_t[i]));
  }
  d->timing = on;
  return NULL;
}

int stoke_dp_bucket_times(stoke_dp *d, void *ref, double *start_ms, double *dur_ms, size_t *bytes, int cap) {
  if (!d->bucket_t || !ref) return 0;
  int n = 0;
  for (int i = 0; i < d->n_buckets && n < cap; i++, n++) {
    float a = 0, b = 0;
    /* the reference (recorded first, on the compute stream) to the start: never negative */
    stoke_err *e = d->dev->timer_elapsed_ms(d->dev_self, ref, d->bucket_t[2 * i], &a);
    if (!e) e = d->dev->timer_elapsed_ms(d->dev_self, d->bucket_t[2 * i], d->bucket_t[2 * i + 1], &b);
    if (e) { /* not recorded in this step (e.g. a micro-batch without the all-reduce) */
      stoke_err_free(e);
      return n;
    }
    start_ms[n] = a, dur_ms[n] = b, bytes[n] = d->buckets[i].bytes;
  }
  return n;
}
