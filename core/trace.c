/* core/trace.c: the trace of chosen steps: slices, flow arrows and lane
 * names collected in memory (a mutex: the loader's workers add theirs),
 * written once as Chrome trace-event JSON ({"traceEvents": [...]}), which
 * Perfetto UI and chrome://tracing open. Outside the window nothing is
 * recorded: the calls return at the first test.
 *
 * The GPU lane's per-node slices come from device events around each node
 * (the executor's profile), and under cuda_graph too: a traced step runs
 * eagerly, outside the graph (core/exec.c stoke_exec_micro), its kernels
 * the graph's with the same buffers and arguments (the update reads lr and
 * step from the device as the replay does), so the weights, the loss
 * scaler, clipping and accumulation come out as the replay's; the graph is
 * not touched and the steps after the window replay it. The trace says so
 * (the step slices' "cuda_graph" arg, the GPU process's label): per-op and
 * step times of traced steps are eager times, which a graph's replay beats
 * by the launch gaps (the summary's "traced steps' median" against the
 * others shows by how much). CUPTI's activity records would time the
 * replay's own kernels, but naming them after plan nodes needs a map from
 * each captured graph node to the node that launched it, built at capture,
 * plus CUPTI's buffer callbacks and libcupti at run time: far more code
 * and another dependency, for launch gaps that the step times show. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke/graph.h"
#include "stoke/trace.h"

/* Under cuda_graph, on each traced step's GPU slice and the trace's label. */
#define EAGER_NOTE "traced steps run eagerly, outside the CUDA graph: their per-op times are eager times"

typedef struct {
  char name[80], cat[16], args[200];
  char ph; /* X slice, s / f flow */
  int lane;
  double ts, dur;
  uint64_t id;
} trace_ev;

struct stoke_trace {
  char path[PATH_MAX];
  int64_t first, last;
  int rank;
  double t0;           /* CLOCK_MONOTONIC seconds at creation */
  volatile int recording;
  double ops_start;    /* the last traced step's first node, on the GPU lane */
  int comm_used, copy_used;
  int eager_of_graph;  /* the run replays a CUDA graph; its traced steps ran eagerly */
  int lanes_used[64];  /* worker lanes seen */
  pthread_mutex_t mu;
  trace_ev *ev;
  size_t n, cap;
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

stoke_err *stoke_trace_parse(const char *spec, int64_t *first, int64_t *last) {
  *first = *last = 0;
  if (!spec || !spec[0]) return NULL;
  char *end;
  long long a = strtoll(spec, &end, 10), b = a;
  if (*end == '-') b = strtoll(end + 1, &end, 10);
  if (*end || a < 1 || b < a)
    return STOKE_ERR(STOKE_E_INVALID, "[run] trace = '%s': give the steps to trace as FIRST-LAST (e.g. 20-24) or one "
                                      "step, counting from 1", spec);
  *first = a, *last = b;
  return NULL;
}

stoke_err *stoke_trace_new(const char *path, int64_t first, int64_t last, int rank, stoke_trace **out) {
  stoke_trace *t = calloc(1, sizeof *t);
  if (!t) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  snprintf(t->path, sizeof t->path, "%s", path);
  t->first = first, t->last = last, t->rank = rank;
  t->t0 = mono_s();
  pthread_mutex_init(&t->mu, NULL);
  *out = t;
  return NULL;
}

void stoke_trace_free(stoke_trace *t) {
  if (!t) return;
  pthread_mutex_destroy(&t->mu);
  free(t->ev);
  free(t);
}

int stoke_trace_has(const stoke_trace *t, int64_t step) { return t && step >= t->first && step <= t->last; }

int stoke_trace_recording(const stoke_trace *t) { return t && t->recording; }

void stoke_trace_lead(stoke_trace *t, int64_t step, int prefetch) {
  if (t) t->recording = step + prefetch + 1 >= t->first && step <= t->last;
}

double stoke_trace_now(const stoke_trace *t) { return 1e6 * (mono_s() - t->t0); }

static void add(stoke_trace *t, const trace_ev *e) {
  pthread_mutex_lock(&t->mu);
  if (t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 1024;
    trace_ev *ev = realloc(t->ev, cap * sizeof *ev);
    if (!ev) { /* the trace loses an event, training goes on */
      pthread_mutex_unlock(&t->mu);
      return;
    }
    t->ev = ev, t->cap = cap;
  }
  t->ev[t->n++] = *e;
  if (e->lane >= STOKE_TRACE_WORKER && e->lane < STOKE_TRACE_WORKER + 64) t->lanes_used[e->lane - STOKE_TRACE_WORKER] = 1;
  if (e->lane == STOKE_TRACE_COPY) t->copy_used = 1;
  pthread_mutex_unlock(&t->mu);
}

void stoke_trace_slice(stoke_trace *t, int lane, const char *name, const char *cat, double ts, double dur,
                       const char *args) {
  if (!t) return;
  trace_ev e = {.ph = 'X', .lane = lane, .ts = ts, .dur = dur > 0 ? dur : 0};
  snprintf(e.name, sizeof e.name, "%s", name);
  snprintf(e.cat, sizeof e.cat, "%s", cat);
  snprintf(e.args, sizeof e.args, "%s", args ? args : "");
  add(t, &e);
}

void stoke_trace_flow(stoke_trace *t, int lane, uint64_t id, double ts, int start) {
  if (!t) return;
  trace_ev e = {.ph = start ? 's' : 'f', .lane = lane, .ts = ts, .id = id};
  snprintf(e.name, sizeof e.name, "batch");
  snprintf(e.cat, sizeof e.cat, "batch");
  add(t, &e);
}

void stoke_trace_fill(void *trace, int worker, int64_t number, int64_t from, int64_t to, double t0, double t1) {
  stoke_trace *t = trace;
  if (!t || !t->recording) return;
  char name[80], args[200];
  snprintf(name, sizeof name, "decode + augment batch %lld", (long long)number);
  snprintf(args, sizeof args, "\"batch\": %lld, \"samples\": \"%lld-%lld\"", (long long)number, (long long)from,
           (long long)to - 1);
  int lane = STOKE_TRACE_WORKER + (worker < 64 ? worker : 63);
  double a = 1e6 * (t0 - t->t0), b = 1e6 * (t1 - t->t0);
  stoke_trace_slice(t, lane, name, "loader", a, b - a, args);
  if (from == 0) stoke_trace_flow(t, lane, (uint64_t)number, a + 0.5 * (b - a), 1); /* one arrow per batch */
}

void stoke_trace_gpu_step(stoke_trace *t, int64_t step, const struct stoke_plan *p, const double *node_ms, int n,
                          double dev_ms, double end, int graphs) {
  char name[80], args[200];
  snprintf(name, sizeof name, "step %lld", (long long)step);
  t->eager_of_graph |= graphs;
  if (graphs) snprintf(args, sizeof args, "\"device_ms\": %.4f, \"cuda_graph\": \"%s\"", dev_ms, EAGER_NOTE);
  else snprintf(args, sizeof args, "\"device_ms\": %.4f", dev_ms);
  stoke_trace_slice(t, STOKE_TRACE_GPU, name, "step", end - 1e3 * dev_ms, 1e3 * dev_ms, args);
  if (!node_ms || !p) return;
  const stoke_graph *g = p->g;
  double total = 0;
  for (int i = 0; i < n; i++) total += node_ms[i];
  double at = end - 1e3 * total;
  t->ops_start = at;
  for (int i = 0; i < n; i++) {
    const char *what = "optimizer + scaler", *op = "update", *engine = "";
    const char *pass = "update";
    if (i < g->n_nodes) {
      const stoke_gnode *node = &g->nodes[i];
      what = node->n.name, op = node->n.op, engine = node->kernel ? node->kernel->engine : "";
      pass = node->pass == STOKE_BWD ? "backward" : node->recompute ? "recompute" : "forward";
    } else if (p->opt_kernel) {
      engine = p->opt_kernel->engine;
    }
    snprintf(args, sizeof args, "\"op\": \"%s\", \"pass\": \"%s\", \"engine\": \"%s\", \"ms\": %.4f", op, pass,
             engine, node_ms[i]);
    stoke_trace_slice(t, STOKE_TRACE_GPU, what, "op", at, 1e3 * node_ms[i], args);
    at += 1e3 * node_ms[i];
  }
}

void stoke_trace_gpu_buckets(stoke_trace *t, const double *start_ms, const double *dur_ms, const size_t *bytes, int n) {
  for (int i = 0; i < n; i++) {
    char name[80], args[200];
    snprintf(name, sizeof name, "all-reduce bucket %d", i + 1);
    snprintf(args, sizeof args, "\"bytes\": %zu, \"ms\": %.4f, \"GB_per_s\": %.1f", bytes[i], dur_ms[i],
             dur_ms[i] > 0 ? (double)bytes[i] / (dur_ms[i] * 1e6) : 0.0);
    stoke_trace_slice(t, STOKE_TRACE_COMM, name, "comm", t->ops_start + 1e3 * start_ms[i], 1e3 * dur_ms[i], args);
    t->comm_used = 1;
  }
}

const char *stoke_trace_path(const stoke_trace *t) { return t->path; }

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s >= 0x20) fputc(*s, f);
  }
  fputc('"', f);
}

/* A metadata event: the name of a process or thread and its place. */
static void meta(FILE *f, int pid, int tid, const char *what, const char *name, int sort) {
  fprintf(f, "{\"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"name\": \"%s_name\", \"args\": {\"name\": ", pid, tid, what);
  json_str(f, name);
  fputs("}},\n", f);
  fprintf(f, "{\"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"name\": \"%s_sort_index\", \"args\": {\"sort_index\": %d}},\n",
          pid, tid, what, sort);
}

stoke_err *stoke_trace_write(stoke_trace *t) {
  char tmp[PATH_MAX + 8];
  FILE *f;
  STOKE_PROPAGATE(stoke_write_begin(t->path, "trace", tmp, sizeof tmp, &f));
  int host = 2 * t->rank, gpu = 2 * t->rank + 1;
  char name[64];
  fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
  snprintf(name, sizeof name, "rank %d host", t->rank);
  meta(f, host, 0, "process", name, 2 * t->rank);
  snprintf(name, sizeof name, "rank %d GPU", t->rank);
  meta(f, gpu, 0, "process", name, 2 * t->rank + 1);
  meta(f, host, STOKE_TRACE_STEP, "thread", "step loop", 0);
  meta(f, gpu, STOKE_TRACE_GPU, "thread", "compute stream", 0);
  if (t->eager_of_graph)
    fprintf(f, "{\"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"name\": \"process_labels\", \"args\": {\"labels\": "
               "\"%s\"}},\n", gpu, EAGER_NOTE);
  if (t->comm_used) meta(f, gpu, STOKE_TRACE_COMM, "thread", "comm stream (all-reduce buckets)", 1);
  if (t->copy_used) meta(f, gpu, STOKE_TRACE_COPY, "thread", "copy stream (host to device)", 2);
  for (int w = 0; w < 64; w++)
    if (t->lanes_used[w]) {
      snprintf(name, sizeof name, "loader worker %d", w);
      meta(f, host, STOKE_TRACE_WORKER + w, "thread", name, 1 + w);
    }
  pthread_mutex_lock(&t->mu);
  for (size_t i = 0; i < t->n; i++) {
    const trace_ev *e = &t->ev[i];
    int pid = e->lane == STOKE_TRACE_GPU || e->lane == STOKE_TRACE_COMM || e->lane == STOKE_TRACE_COPY ? gpu : host;
    fprintf(f, "{\"ph\": \"%c\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, ", e->ph, pid, e->lane, e->ts);
    if (e->ph == 'X') fprintf(f, "\"dur\": %.3f, ", e->dur);
    else fprintf(f, "\"id\": %llu, %s", (unsigned long long)e->id, e->ph == 'f' ? "\"bp\": \"e\", " : "");
    fputs("\"name\": ", f);
    json_str(f, e->name);
    fputs(", \"cat\": ", f);
    json_str(f, e->cat);
    fprintf(f, ", \"args\": {%s}},\n", e->args);
  }
  pthread_mutex_unlock(&t->mu);
  /* the list ends with the trace's own span, so no comma dangles */
  fprintf(f, "{\"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"name\": \"process_labels\", \"args\": {\"labels\": "
             "\"stoke steps %lld-%lld%s%s\"}}\n]}\n", host, (long long)t->first, (long long)t->last,
          t->eager_of_graph ? "; " : "", t->eager_of_graph ? EAGER_NOTE : "");
  return stoke_write_end(f, tmp, t->path, "trace", NULL);
}
