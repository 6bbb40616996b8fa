/* core/run_state.h: what the phases of a training run share (core/run.c
 * calls them in order): the run's state, one data stream's parts, the
 * signal flag. Private to the core. */
#ifndef STOKE_RUN_STATE_H
#define STOKE_RUN_STATE_H

#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "stoke/checkpoint.h"
#include "stoke/dist.h"
#include "stoke/graph.h"
#include "stoke/loader.h"
#include "stoke/metrics.h"
#include "stoke/nvml.h"
#include "stoke/run.h"
#include "stoke/run_config.h"
#include "stoke/schedule.h"
#include "stoke/steptime.h"
#include "stoke/trace.h"
#include "dp.h"

/* The run's checkpoint in its out_dir (rank 0's): written, claimed, resumed by run.resume = auto. */
#define RUN_CKPT_NAME "checkpoint.safetensors"

/* One data stream (training or evaluation): its source, graph, plan,
 * executor and loader. */
typedef struct stream {
  const char *section;
  const stoke_source_v1 *src;
  void *src_self;
  stoke_graph *g;
  stoke_plan *plan;
  stoke_exec *x;
  stoke_loader *loader;
  int64_t batch;
  int64_t resume_micro;   /* resumed training: the per-rank micro-batch of the file's sample position */
  int lm;                 /* token windows: a language model, its loss against the next tokens */
} stream;

/* The run's signal dispositions, restored when it ends (core/run_signals.c). */
typedef struct sig_guard {
  struct sigaction old[3];
  int on[3];
} sig_guard;

typedef struct run_state {
  stoke_run_opts opts;     /* the caller's; quiet on data parallel ranks > 0 */
  const stoke_run_opts *o; /* &opts */
  stoke_summary *sum;
  stoke_cfg *cfg;
  stoke_run_config rc; /* the config, read once */
  stoke_registry *reg;
  sig_guard sg;
  char dir[512];       /* the run's folder: config.ini, log.txt, plan.txt, metrics.jsonl */
  char resume_auto[560]; /* run.resume = auto: out_dir's checkpoint when there is one (rc.run.resume points here) */
  char run_name[256];
  char metrics_path[640]; /* the metrics keep it for their messages */
  /* the engines of [run] backends, and the one that owns the device */
  const char *engines[STOKE_CFG_MAX_LIST];
  void *selves[STOKE_CFG_MAX_LIST];
  const stoke_backend_v1 *backs[STOKE_CFG_MAX_LIST];
  int n_engines;
  int opened[STOKE_CFG_MAX_LIST];
  const stoke_backend_v1 *dev;
  void *dev_self;
  const stoke_precision_v1 *prec;
  stream train, eval;
  stoke_metrics *metrics;
  FILE *log;
  char *config_text;
  int cpu_fallback; /* the cpu backend (fp32) ran in place of [run] backends (device = auto, cpu) */
  double best_loss;   /* [run] keep_best: the lowest evaluation loss kept so far, of step best_step (0: none yet) */
  int64_t best_step;
  stoke_layout layout;
  stoke_nvml *nvml;
  double peak_flops; /* the device's, for the precision (0: unknown) */
  /* data parallel (NULL with comm = single) */
  stoke_dp *dp;
  stoke_dist_env dist; /* read once from the launcher's variables; handed to the comm */
  int rank, world, local_rank;
  stoke_ckpt_meta resume; /* the checkpoint resumed from (step 0: none) */
  stoke_steptime *steptime; /* each step's device time */
  stoke_trace *trace;       /* run.trace's steps, or NULL */
  int64_t trace_first, trace_last;
  /* what a checkpoint records, and where it goes ("": checkpoints off) */
  int64_t start_step;
  char ckpt[640];
  /* the step loop: its length, the optimizer's per-step arguments */
  int64_t total, per_epoch;
  double eval_period; /* batches between evaluations ([run] eval_every x per_epoch; 0: at the end only) */
  stoke_lr_schedule sched;
  stoke_opt_args_v1 opt;
  int cuda_graph, ops_reported;
  /* where it is: the step being taken, its epoch; the last step whose
   * weights are whole, what a save on the way out writes (-1 when an
   * error may have left them half updated or they diverged, or a save
   * just failed); stop: a signal, the loop ends */
  int64_t step, epoch, good, good_epoch;
  int64_t saved_step; /* the step of this run's last periodic checkpoint (0: none yet) */
  int stop;
} run_state;

static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* core/run_signals.c: Ctrl-C and SIGTERM. The flag a signal sets (the
 * loaders stop waiting on it); run_stop_now: stop mid-step (not with data
 * parallel, whose ranks agree on when to stop, at a logged step). */
extern volatile sig_atomic_t stoke_stop_signal;
void run_signals_reset(void);
void run_signals_ignore_xfsz(sig_guard *g);
void run_signals_catch(sig_guard *g);
void run_signals_restore(sig_guard *g);
int run_stop_now(const run_state *s);

/* core/run_setup.c: the config read and the optimizer configured; the
 * run's folder, devices, data, plans, metrics (or --dry-run's plan alone);
 * and the checked writes every phase uses. */
stoke_err *run_read_config(run_state *s);
stoke_err *run_open(run_state *s);
stoke_err *run_dry(run_state *s);
/* the engines, precision, comm and layout (run_open's part, alone for
 * core/run_generate.c) */
stoke_err *run_open_device(run_state *s);
stoke_err *run_write_checked(const char *path, void (*put)(const void *, FILE *), const void *arg);
void run_close_engines(run_state *s);

/* core/run_stream.c: a stream's source, graph, plan, executor and loader;
 * the next batch into its input (the loader's hand-off). */
/* A checkpoint's run against this one (`now`: this run's resolved config
 * as text): [model] keys that differ with the same shapes, and a cosine
 * schedule over another [run] steps, warned about; `what` starts the line
 * ("resuming from"). */
void run_config_drift(const char *now, const char *ckpt, const char *what);
/* The resolved config as text (stoke_cfg_dump; free it), NULL when out of memory. */
char *run_config_text(const stoke_cfg *c);
stoke_err *run_plan_stream(run_state *s, stream *st, const stoke_data_config *dc, const stoke_precision_v1 *prec,
                          int training);
stoke_err *run_open_stream(run_state *s, stream *st, const stoke_data_config *dc, int training, int64_t start_batch);
stoke_err *run_memory_budget(run_state *s, double *budget, double *device, char *name, size_t cap);
void run_stream_close(run_state *s, stream *st);
void run_report_precision(const stoke_precision_v1 *p, const stoke_graph *g, int quiet);
stoke_err *run_feed(stream *st, int32_t *host_labels, stoke_fed *fed, double *wait_s);

/* core/step_loop.c: the steps, with the checkpoints and evaluations due
 * between them. */
stoke_err *run_steps(run_state *s);
stoke_err *run_check_log(const run_state *s);

/* core/run_eval.c: one pass over [eval_data] into sum->eval_*. */
stoke_err *run_evaluate(run_state *s, stoke_summary *sum);

/* core/run_ckpt.c: checkpoints: room for one before any compute, a save,
 * the save on every way out. */
stoke_err *run_claim_out_dir(const run_state *s);
stoke_err *run_check_room(const run_state *s);
stoke_err *run_save(run_state *s, int64_t step, int64_t epoch);
/* [run] keep_best: after an evaluation, the checkpoint of a new lowest
 * evaluation loss to out_dir/best.safetensors (and best.json). */
stoke_err *run_keep_best(run_state *s, int64_t step);
/* A run resumed in place goes on comparing with the best its out_dir's
 * best.json kept (of a step at or before the resumed one). */
void run_best_resumed(run_state *s);
stoke_err *run_save_on_exit(run_state *s, stoke_err *e);
stoke_err *run_note_saved(const run_state *s, stoke_err *e);

/* core/run_summary.c: the way out: the last save and evaluation, the
 * profile, the summary. */
stoke_err *run_finish(run_state *s, stoke_err *e);

#endif
