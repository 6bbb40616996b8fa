/* core/run_summary.c: the way out of a run: the last checkpoint, the
 * last evaluation, the per-op profile, every rank's data wait, and the
 * summary (printed, in metrics.jsonl and in stoke_summary). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/nvml.h"
#include "run_state.h"

/* Two figures of every rank, a and b, gathered into out (malloc'd: world
 * a's, then world b's). A collective: every rank calls it. */
static stoke_err *gather_pair(run_state *s, double a, double b, double **out, const char *what) {
  double *v = malloc(sizeof(double) * 2 * (size_t)s->world);
  if (!v) return STOKE_ERR(STOKE_E_OOM, "out of memory for %d ranks' %s", s->world, what);
  stoke_err *e = stoke_dp_gather(s->dp, a, v);
  if (!e) e = stoke_dp_gather(s->dp, b, v + s->world);
  if (e) {
    free(v);
    return stoke_err_wrap(e, __FILE__, __LINE__, "gathering every rank's %s", what);
  }
  *out = v;
  return NULL;
}

/* Data parallel, at the end: every rank's data wait and GPU power and
 * clock, and the bus bandwidth of an all-reduce of the whole flat gradient
 * buffer. */
static stoke_err *report_ranks(run_state *s) {
  const stoke_summary *sum = s->sum;
  int quiet = s->o->quiet;
  double ms = 0, bw = 0, *waits, *pc;
  /* after the first step (a rank the loader starves) and in it (the loader's start) */
  STOKE_PROPAGATE(gather_pair(s, sum->data_wait_s - sum->data_wait_first_s, sum->data_wait_first_s, &waits,
                              "data waits"));
  size_t bytes = s->train.plan->bytes[STOKE_BUF_GRADS];
  char line[1024];
  size_t used = 0;
  for (int r = 0; r < s->world && used < sizeof line; r++)
    used += (size_t)snprintf(line + used, sizeof line - used, "%s%d: %.3f s (first step %.3f s)", r ? ", " : "", r,
                             waits[r], waits[s->world + r]);
  free(waits);
  /* each rank's mean GPU power and SM clock (its summary's figures), "" without NVML anywhere: two GPUs at
   * their power cap pay for the all-reduce in clock, each its own (BENCHMARKS.md run 34) */
  char clocks[1024] = "";
  STOKE_PROPAGATE(gather_pair(s, sum->gpu ? sum->gpu_power_w : NAN, sum->gpu ? sum->gpu_sm_clock_mhz : NAN, &pc,
                              "GPU power and clock"));
  stoke_power_by_rank(pc, pc + s->world, s->world, clocks, sizeof clocks);
  free(pc);
  /* gathered: every rank holds the same lines; rank 0 logs them (once on a launcher's shared terminal) */
  if (s->rank == 0) stoke_log(STOKE_LOG_INFO, "dp", "data wait after the first step by rank: %s", line);
  if (clocks[0] && s->rank == 0) stoke_log(STOKE_LOG_INFO, "dp", "GPU power and SM clock by rank: %s", clocks);
  if (s->world == 1) { /* no all-reduce runs (stoke_dp_attach): nothing to time */
    if (!quiet)
      printf("  data parallel over 1 process: data wait %.3f s after the first step (first step %.3f s); no gradient "
             "all-reduce\n",
             sum->data_wait_s - sum->data_wait_first_s, sum->data_wait_first_s);
    return NULL;
  }
  STOKE_TRY(stoke_dp_bench(s->dp, 20, &ms, &bw), "timing the gradient all-reduce");
  /* every rank takes part in the timing; rank 0 logs it, as the gathered lines (each rank printed its own
   * figure to the launcher's terminal, the same to a few microseconds) */
  if (s->rank == 0)
    stoke_log(STOKE_LOG_INFO, "dp",
              "all-reduce of the flat gradient buffer (%.1f MiB): %.3f ms, bus bandwidth %.1f GB/s over %d ranks",
              bytes / 1048576.0, ms, bw, s->world);
  if (!quiet) {
    printf("  data parallel over %d processes: data wait after the first step by rank %s\n", s->world, line);
    if (clocks[0]) printf("  GPU power and SM clock by rank (mean over the logged intervals): %s\n", clocks);
    printf("  gradient all-reduce (%.1f MiB, one call): %.3f ms, bus bandwidth %.1f GB/s\n", bytes / 1048576.0, ms,
           bw);
  }
  return NULL;
}

static void put_ops(const void *x, FILE *f) { stoke_exec_profile_report((stoke_exec *)x, f); }

/* profile_ops: the GPU time per op, printed, in ops.txt and for the bench. */
static stoke_err *report_profile(run_state *s) {
  const stoke_run_opts *o = s->o;
  if (o->op_rows) s->sum->n_op_rows = stoke_exec_profile_rows(s->train.x, o->op_rows, o->op_rows_cap);
  if (!o->quiet) stoke_exec_profile_report(s->train.x, stdout);
  char path[640];
  snprintf(path, sizeof path, "%s/ops.txt", s->dir);
  return run_write_checked(path, put_ops, s->train.x);
}

/* The last evaluation, after the last save; a signal skips it. */
static stoke_err *last_evaluation(run_state *s) {
  stoke_summary *sum = s->sum;
  stoke_err *e = run_evaluate(s, sum);
  if (e && e->code == STOKE_E_INTERRUPTED) {
    stoke_err_free(e);
    e = NULL;
  } else if (!e) {
    e = stoke_metrics_eval(s->metrics, s->step, s->epoch, sum->eval_loss, sum->eval_accuracy);
    if (!e) e = run_keep_best(s, s->step);
  }
  return run_note_saved(s, e);
}

/* Device memory the run's plans allocated (MiB): both streams' execs (the
 * loader's one-batch staging buffers aside); NaN when the device is the
 * host. */
static double device_mib(const run_state *s) {
  if (!s->dev || s->dev->device != STOKE_DEV_GPU) return NAN;
  size_t b = stoke_exec_device_bytes(s->train.x) + stoke_exec_device_bytes(s->eval.x);
  return (double)b / 1048576.0;
}

/* The last state is saved on every way out, then any error is reported;
 * signals are still caught: a save is never cut short by the first two. */
stoke_err *run_finish(run_state *s, stoke_err *e) {
  stoke_summary *sum = s->sum;
  e = run_save_on_exit(s, e);
  if (!e && s->eval.x && !s->stop && !stoke_stop_signal) e = last_evaluation(s);
  s->stop |= stoke_stop_signal != 0;
  sum->interrupted = s->stop;
  if (!e && s->rc.run.profile_ops) e = report_profile(s);
  if (s->metrics && s->steptime && !e) e = stoke_metrics_collect(s->metrics, s->steptime); /* since the last log */
  stoke_metrics_summary(s->metrics, sum);
  sum->dev_alloc_mib = device_mib(s);
  sum->graph_replays = s->train.x ? stoke_exec_graph_replays(s->train.x) : 0;
  sum->steps = s->step;
  sum->samples = (s->step - s->start_step) * s->train.batch * s->rc.run.accumulate * s->world;
  sum->skipped_samples = stoke_loader_skip_reasons(s->train.loader, sum->skip_reasons, sizeof sum->skip_reasons);
  sum->bad_samples = stoke_loader_bad_samples(s->train.loader);
  if (!e && s->dp) e = report_ranks(s);
  if (!e) e = stoke_metrics_close(s->metrics, sum, s->stop ? "interrupted" : "done");
  if (!e) e = run_check_log(s);
  return e;
}
