/* stoke/metrics.h: per-step metrics: JSON lines (always), a progress bar
 * on a terminal or log lines, and the closing summary (samples/s median,
 * step-time percentiles, data wait, final loss). */
#ifndef STOKE_METRICS_H
#define STOKE_METRICS_H

#include "stoke/nvml.h"
#include "stoke/run.h"
#include "stoke/steptime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { STOKE_PROGRESS_OFF = 0, STOKE_PROGRESS_BAR, STOKE_PROGRESS_LINES } stoke_progress;

typedef struct stoke_metrics_opts {
  const char *jsonl_path; /* NULL: no file */
  stoke_progress progress;
  int64_t total_steps;
  int64_t samples_per_step;
  int quiet; /* no summary on stdout */
  int64_t start_step; /* steps already done (resume): ETA and bar count from here */
  double flops_per_step; /* model FLOPs of one optimizer step (3x forward) */
  double peak_flops;     /* the device's peak for the precision; 0 = unknown: MFU n/a */
  stoke_nvml *nvml;      /* GPU sampling, or NULL */
  /* the bench's window (stoke_run_opts.time_warmup, time_steps): the
   * summary's timed_ms sums these steps' device times; 0: none */
  int64_t time_warmup, time_steps;
  const char *tensorboard_dir; /* TensorBoard scalars into this folder; NULL: none */
  /* the HTML report, written by stoke_metrics_close into report_dir/report.html
   * (NULL: none), titled with the run's name; the plan's memory by kind */
  const char *report_dir, *run_name;
  const stoke_plan *plan;
  int64_t trace_first, trace_last; /* run.trace's steps (0: none): what tracing cost, measured */
} stoke_metrics_opts;

typedef struct stoke_metrics stoke_metrics;

stoke_err *stoke_metrics_new(const stoke_metrics_opts *o, stoke_metrics **out);
void stoke_metrics_free(stoke_metrics *m);
/* The device times in ms of the next n steps (stoke/steptime.h), in order:
 * what every step time, samples/s and MFU figure is computed from. They
 * come in at each log step (before stoke_metrics_step) and at the end. */
void stoke_metrics_device(stoke_metrics *m, const double *ms, int64_t n);
/* The last step's device time read so far (ms; NaN: none). */
double stoke_metrics_last_ms(const stoke_metrics *m);
/* The same from the step timers: every step they ended since the last call. */
__attribute__((warn_unused_result)) stoke_err *stoke_metrics_collect(stoke_metrics *m, stoke_steptime *t);
/* Record one step: `host_s` the host's time issuing it (launches, copies;
 * the data wait excluded), `wait_s` its wait for the loader. When `logged`,
 * `loss` holds the step's loss and a JSON line (and a bar update or log
 * line) is written from the interval's device times. The calls that write
 * return an error when the line did not reach the file (a full disk). */
__attribute__((warn_unused_result)) stoke_err *stoke_metrics_step(stoke_metrics *m, int64_t step, int64_t epoch,
                                                                  double host_s, double wait_s, int logged,
                                                                  double loss, double lr);
/* The loss scaler as read at the last log step (fp16 runs). */
void stoke_metrics_scaler(stoke_metrics *m, double scale, double skipped);
/* Record an evaluation: a JSON line and a printed line. */
__attribute__((warn_unused_result)) stoke_err *stoke_metrics_eval(stoke_metrics *m, int64_t step, int64_t epoch,
                                                                  double loss, double acc);
/* A failed run: a last JSON line {"summary": "error", "steps_done", "message"} (steps_done: the steps
 * completed before the error, whose step lines are above it), and report.html with the error above the
 * figures of `base` (the run's summary so far; its statistics filled here) and the curves up to it. */
void stoke_metrics_error(stoke_metrics *m, const stoke_summary *base, int64_t steps_done, const char *msg);
/* Fill the summary's statistics. */
void stoke_metrics_summary(stoke_metrics *m, stoke_summary *s);
/* Write the closing summary line to the JSON file and stdout. */
__attribute__((warn_unused_result)) stoke_err *stoke_metrics_close(stoke_metrics *m, const stoke_summary *s,
                                                                   const char *status);

/* Percentile (0..100) of n values, linear interpolation; sorts `v`. */
double stoke_percentile(double *v, int64_t n, double pct);

#ifdef __cplusplus
}
#endif
#endif
