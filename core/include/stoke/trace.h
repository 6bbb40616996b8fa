/* stoke/trace.h: a trace of chosen steps (run.trace = 20-24) in the Chrome
 * trace-event format that Perfetto UI and chrome://tracing open. */
#ifndef STOKE_TRACE_H
#define STOKE_TRACE_H

#include <stdint.h>

#include "stoke/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_trace stoke_trace;

/* "20-24", "7" (one step), "" (none: *first = 0). Steps count from 1. */
stoke_err *stoke_trace_parse(const char *spec, int64_t *first, int64_t *last);
/* A trace of steps first..last, written to `path` by stoke_trace_write;
 * `rank` names the processes (one trace file per rank). */
stoke_err *stoke_trace_new(const char *path, int64_t first, int64_t last, int rank, stoke_trace **out);
void stoke_trace_free(stoke_trace *t);
/* Whether `step` is traced; whether the loader's work is recorded now
 * (from a few steps before the window: the batches it will use). */
int stoke_trace_has(const stoke_trace *t, int64_t step);
int stoke_trace_recording(const stoke_trace *t);
void stoke_trace_lead(stoke_trace *t, int64_t step, int prefetch);
/* Microseconds since the trace began (CLOCK_MONOTONIC). */
double stoke_trace_now(const stoke_trace *t);

/* Lanes: the step loop and the loader's workers on the host process,
 * the compute stream on the GPU process. */
enum { STOKE_TRACE_STEP = 0, STOKE_TRACE_GPU = 1, STOKE_TRACE_COMM = 2, STOKE_TRACE_COPY = 3, STOKE_TRACE_WORKER = 16 };

/* A slice on a lane (worker lanes: STOKE_TRACE_WORKER + worker); `args`
 * is JSON object members ("\"k\": 1, ...") or NULL. Thread safe. */
void stoke_trace_slice(stoke_trace *t, int lane, const char *name, const char *cat, double ts, double dur,
                       const char *args);
/* A flow arrow from the slice around (lane, ts) that makes batch `id` to
 * the one that uses it (start = 1 at the maker). */
void stoke_trace_flow(stoke_trace *t, int lane, uint64_t id, double ts, int start);
/* The loader's hook: batch `number` (counted across epochs), samples
 * [from, to), filled by `worker` between t0 and t1 (host seconds,
 * CLOCK_MONOTONIC). */
void stoke_trace_fill(void *trace, int worker, int64_t number, int64_t from, int64_t to, double t0, double t1);

/* A traced step on the GPU lane: its device time `dev_ms`, ending at host
 * time `end` (just after the sync that ended the step's timing), and when
 * node_ms is given (the step timed per node: stoke_exec_profile_last)
 * each node of the plan as a slice named as in plan.txt, with its op, pass
 * and engine, laid end to end back from the step's end. `graphs`: the run
 * replays a CUDA graph and this step ran eagerly instead (the trace says
 * its times are eager times). */
struct stoke_plan;
void stoke_trace_gpu_step(stoke_trace *t, int64_t step, const struct stoke_plan *p, const double *node_ms, int n,
                          double dev_ms, double end, int graphs);

/* Data parallel: the last traced step's all-reduce buckets on the comm
 * lane, each starting start_ms after that step's first node began (as
 * stoke_dp_bucket_times gives them). */
void stoke_trace_gpu_buckets(stoke_trace *t, const double *start_ms, const double *dur_ms, const size_t *bytes, int n);

/* Writes the file (atomically). */
stoke_err *stoke_trace_write(stoke_trace *t);
const char *stoke_trace_path(const stoke_trace *t);

#ifdef __cplusplus
}
#endif
#endif
