/* core/step_loop.c: the run's steps: micro-batches fed and run (gradient
 * accumulation), the loss read back only every log_every steps, the stop
 * agreed between ranks, and the checkpoints and evaluations due between
 * steps. */
#include <math.h>
#include <limits.h>
#include <sys/stat.h>

#include "stoke/core.h"
#include "stoke/rng.h"
#include "nvtx.h"
#include "run_state.h"

/* The optimizer's arguments for this step: lr from the schedule, the
 * loss scaler's policy. */
static void step_args(run_state *s) {
  const stoke_precision_v1 *prec = s->prec;
  int64_t growth = s->rc.run.loss_scale_growth;
  stoke_opt_args_v1 *opt = &s->opt;
  opt->step = s->step + 1 - s->resume.skipped_steps; /* the device subtracts the skips since the start */
  opt->grad_scale = 1.0 / (double)s->rc.run.accumulate;
  opt->lr = stoke_lr_at(&s->sched, s->step + 1);
  opt->growth_interval = prec->loss_scaling == STOKE_SCALING_STATIC ? 0 : growth > 0 ? growth : prec->growth_interval;
  opt->growth_factor = prec->growth_factor;
  opt->backoff_factor = prec->loss_scaling == STOKE_SCALING_STATIC ? 1 : prec->backoff_factor;
}

/* One step's micro-batches: each fed (with data.on_device only the first
 * of the run) and run forward and backward, the last one updating. *wait
 * gets the time spent waiting for data. A signal drops the step (a
 * resume redoes it): STOKE_E_INTERRUPTED. */
static stoke_err *micro_batches(run_state *s, double *wait) {
  int64_t accumulate = s->rc.run.accumulate, micro = 0;
  stoke_err *e = NULL;
  /* a step a signal may drop after some of its micro-batches: their forwards move the running statistics,
   * so the step's start is kept to be put back (the resume redoes the step) */
  if (accumulate > 1) e = stoke_exec_state_keep(s->train.x);
  for (; micro < accumulate && !e; micro++) {
    if (run_stop_now(s)) {
      e = STOKE_ERR(STOKE_E_INTERRUPTED, "interrupted");
      break;
    }
    if (s->dp) stoke_dp_arm(s->dp, micro == accumulate - 1);
    if (!s->rc.data.on_device || s->step == s->start_step) {
      int traced = stoke_trace_has(s->trace, s->step + 1);
      double t0 = traced ? stoke_trace_now(s->trace) : 0, w = 0;
      stoke_fed fed;
      stoke_loader_time_copy(s->train.loader, traced);
      e = run_feed(&s->train, NULL, &fed, &w); /* the loader's hand-off: the host does not wait for the copy */
      *wait += w;
      if (e) break; /* a signal while waiting, or unreadable data */
      if (traced) { /* the wait, the arrow from the batch's making, the hand-off */
        double got = t0 + 1e6 * w;
        stoke_trace_slice(s->trace, STOKE_TRACE_STEP, "data wait", "wait", t0, 1e6 * w, NULL);
        stoke_trace_flow(s->trace, STOKE_TRACE_STEP, (uint64_t)(fed.epoch * s->per_epoch + fed.index), got, 0);
        double now = stoke_trace_now(s->trace), ms = stoke_loader_copy_ms(s->train.loader);
        stoke_trace_slice(s->trace, STOKE_TRACE_STEP, "pinned copy (host to device)", "copy", got, now - got, NULL);
        if (isfinite(ms)) /* on the copy stream, ended when the feed's wait for it returned */
          stoke_trace_slice(s->trace, STOKE_TRACE_COPY, "host to device (pinned batch)", "copy", now - 1e3 * ms,
                            1e3 * ms, NULL);
      }
      s->epoch = fed.epoch;
    }
    if (!e) {
      e = stoke_exec_micro(s->train.x, micro == 0, micro == accumulate - 1,
                           stoke_hash3((uint64_t)s->rc.run.seed, (uint64_t)s->step, (uint64_t)micro), &s->opt);
      if (e && micro == accumulate - 1) s->good = -1; /* the update may be half applied */
    }
  }
  /* a dropped step (a signal, or an error: unreadable data, a kernel's failure) whose micro-batches ran: the
   * save on the way out is of the last whole step, so its running statistics are put back */
  if (e && micro > 0 && accumulate > 1) {
    stoke_err *re = stoke_exec_state_restore(s->train.x);
    if (re) { /* the save would keep statistics that the resume moves again */
      s->good = -1;
      if (e->code != STOKE_E_INTERRUPTED) { /* the step's own error says more */
        stoke_err_free(re);
        return e;
      }
      stoke_err_free(e);
      return re;
    }
  }
  return e;
}

/* GPU operations per step, with and without graphs, once known: with
 * graphs after the capture (the second step), without by recording one
 * step that does not run. */
static stoke_err *report_ops(run_state *s) {
  int graphs = s->cuda_graph;
  int64_t ops = graphs ? stoke_exec_graph_ops(s->train.x, s->rc.run.accumulate) : 0;
  if (!graphs && !ops) STOKE_TRY(stoke_exec_count_ops(s->train.x, &s->opt, &ops), "counting the step's GPU operations");
  if (!graphs || ops) s->ops_reported = 1;
  if (!ops) return NULL;
  s->sum->gpu_ops_per_step = ops;
  s->sum->launches_per_step = graphs ? s->rc.run.accumulate : ops; /* a graph per micro-batch */
  /* (the summary and its JSON line repeat it at the end) */
  if (graphs)
    stoke_log(STOKE_LOG_INFO, "run",
              "one step is %lld GPU operations (kernels, copies, memsets): replayed as %lld CUDA graph launch%s "
              "(cuda_graph = true; one per micro-batch)",
              (long long)ops, (long long)s->rc.run.accumulate, s->rc.run.accumulate == 1 ? "" : "es");
  else
    stoke_log(STOKE_LOG_INFO, "run",
              "one step is %lld GPU operations (kernels, copies, memsets): launched one by one (cuda_graph = true "
              "would make them 1 graph launch per micro-batch)",
              (long long)ops);
  return NULL;
}

/* run.trace: the traced steps time every node (the executor's profile;
 * under cuda_graph that runs them eagerly, outside the graph: the same
 * kernels and arguments, replayed again after the window) and wait for the
 * device at their end, where their device time is read; the loader's
 * workers are recorded from `prefetch` batches before the window. Called
 * before (`end` = 0) and after each step. */
static stoke_err *trace_step(run_state *s, int64_t step, double t0, int end) {
  int graphs = s->cuda_graph, profile_ops = s->rc.run.profile_ops;
  stoke_trace *t = s->trace;
  if (!t) return NULL;
  if (!end) {
    stoke_trace_lead(t, step, (int)s->rc.data.prefetch + 2);
    if (stoke_trace_has(t, step) && (!stoke_trace_has(t, step - 1) || step == s->start_step + 1)) { /* or resumed in it */
      if (!profile_ops) STOKE_PROPAGATE(stoke_exec_profile(s->train.x, 1));
      if (s->dp) STOKE_PROPAGATE(stoke_dp_time_buckets(s->dp, 1));
      if (graphs)
        stoke_log(STOKE_LOG_INFO, "run", "[run] trace: steps %lld-%lld run eagerly, outside the CUDA graph, each kernel "
                  "timed: their per-op and step times are eager times; the other steps replay the graph",
                  (long long)s->trace_first, (long long)s->trace_last);
    }
    return NULL;
  }
  if (!stoke_trace_has(t, step)) return NULL;
  double launched = stoke_trace_now(t);
  STOKE_PROPAGATE(stoke_metrics_collect(s->metrics, s->steptime)); /* the sync */
  double synced = stoke_trace_now(t);
  const double *node_ms = NULL;
  int n = stoke_exec_profile_last(s->train.x, &node_ms);
  char name[64];
  snprintf(name, sizeof name, "step %lld", (long long)step);
  stoke_trace_slice(t, STOKE_TRACE_STEP, name, "step", t0, launched - t0, NULL);
  stoke_trace_slice(t, STOKE_TRACE_STEP, "wait for the GPU (tracing)", "wait", launched, synced - launched, NULL);
  stoke_trace_gpu_step(t, step, s->train.plan, node_ms, n, stoke_metrics_last_ms(s->metrics), synced, graphs);
  if (s->dp) {
    double at[256], ms[256];
    size_t bytes[256];
    int nb = stoke_dp_bucket_times(s->dp, stoke_exec_profile_start(s->train.x), at, ms, bytes, 256);
    stoke_trace_gpu_buckets(t, at, ms, bytes, nb);
  }
  if (stoke_trace_has(t, step + 1)) return NULL;
  if (!profile_ops) STOKE_PROPAGATE(stoke_exec_profile(s->train.x, 0)); /* under cuda_graph: replays from here */
  if (s->dp) STOKE_PROPAGATE(stoke_dp_time_buckets(s->dp, 0));
  stoke_trace_lead(t, step + 1, 0);
  STOKE_TRY(stoke_trace_write(t), "[run] trace");
  stoke_log(STOKE_LOG_INFO, "run", "trace written to %s (open it in ui.perfetto.dev)", stoke_trace_path(t));
  return NULL;
}

/* log.txt takes every log line: a write that failed is an error too. */
stoke_err *run_check_log(const run_state *s) {
  if (!s->log || !ferror(s->log)) return NULL;
  return STOKE_ERR(STOKE_E_IO, "writing '%s/log.txt' failed (is the disk full?)", s->dir);
}

/* A logged step: the loss read back (the only host sync), then the step
 * timers, the loss scaler; a loss that is not finite stops the run. */
static stoke_err *read_loss(run_state *s, double *loss) {
  STOKE_PROPAGATE(stoke_exec_read_loss(s->train.x, loss));
  STOKE_PROPAGATE(stoke_metrics_collect(s->metrics, s->steptime)); /* the step timers, after that sync */
  float amp[4];
  if (stoke_exec_read_scaler(s->train.x, amp)) stoke_metrics_scaler(s->metrics, amp[0], amp[3]);
  if (isfinite(*loss)) return NULL;
  s->good = -1; /* not over the last good checkpoint */
  struct stat st;
  char kept[PATH_MAX + 96];
  if (!s->ckpt[0]) snprintf(kept, sizeof kept, "no checkpoint: checkpoints are off");
  else if (stat(s->ckpt, &st)) snprintf(kept, sizeof kept, "no checkpoint was saved before it");
  else snprintf(kept, sizeof kept, "the last checkpoint is %s", s->ckpt);
  return STOKE_ERR(STOKE_E_NUMERIC,
                   "loss is %s at step %lld: training diverged; lower [optimizer] lr (%g; the schedule's rate at "
                   "this step %g) or check the data; "
                   "a plugin op of your own can produce it too (tools/plugin_check checks its kernels); "
                   "run.detect_anomaly=true names the first node that makes a NaN or inf (%s)",
                   isnan(*loss) ? "NaN" : *loss > 0 ? "+inf" : "-inf", (long long)s->step + 1, s->rc.optimizer.lr,
                   s->opt.lr, kept);
}

/* A signal reaches the ranks at different steps: they agree on when to
 * stop at the next logged step (already a sync), so all stop together. */
static stoke_err *agree_on_stop(run_state *s, int log_now) {
  s->stop = stoke_stop_signal != 0;
  if (!s->dp) return NULL;
  double any = s->stop;
  if (log_now) STOKE_PROPAGATE(stoke_dp_sum(s->dp, &any, 1));
  s->stop = log_now && any > 0;
  return NULL;
}

/* Whole evaluation periods in `batches` (1e-9: an exact epoch's end counts): the k-th evaluation follows
 * the batch that passes k x period. */
static double periods(int64_t batches, double period) { return floor((double)batches / period + 1e-9); }

/* After a step: the per-op profile starts after the warm-up; a
 * checkpoint or an evaluation when one is due (not after the last step:
 * the way out does those). */
static stoke_err *between_steps(run_state *s) {
  const stoke_run_opts *o = s->o;
  int64_t step = s->step, accumulate = s->rc.run.accumulate, ckpt_every = s->rc.run.checkpoint_every;
  if (s->rc.run.profile_ops && step == s->start_step + (o->time_warmup > 1 ? o->time_warmup - 1 : 0))
    STOKE_PROPAGATE(stoke_exec_profile(s->train.x, 1));
  if (s->ckpt[0] && ckpt_every > 0 && (step + 1) % ckpt_every == 0 && step + 1 < s->total && !s->stop) {
    stoke_err *e = run_save(s, step + 1, s->epoch);
    if (e) s->good = -1; /* the same save again on the way out would fail the same way */
    if (e && s->saved_step > 0) /* the save writes a new file and renames it over the last: that one is whole */
      e = stoke_err_note(e, "the checkpoint of step %lld is intact: %s (continue with run.resume=%s)",
                         (long long)s->saved_step, s->ckpt, s->ckpt);
    if (e) return e;
    s->saved_step = step + 1;
  }
  if (s->ckpt[0] && ckpt_every > 0 && (step + 1) % ckpt_every == 0) stoke_steptime_pause(s->steptime);
  int64_t done = (step + 1) * accumulate;
  if (!s->eval.x || s->eval_period <= 0 || periods(done, s->eval_period) == periods(done - accumulate, s->eval_period) ||
      step + 1 >= s->total || s->stop)
    return NULL;
  stoke_err *e = run_evaluate(s, s->sum);
  stoke_steptime_pause(s->steptime);
  if (e && e->code == STOKE_E_INTERRUPTED) {
    stoke_err_free(e);
    s->stop = 1;
    return NULL;
  }
  if (!e) e = stoke_metrics_eval(s->metrics, step + 1, s->epoch, s->sum->eval_loss, s->sum->eval_accuracy);
  return e ? e : run_keep_best(s, step + 1);
}

/* One step: its micro-batches between the step timers, inside an NVTX
 * range, traced when in run.trace's window; *host gets the host's time
 * issuing it (the data wait left out). */
static stoke_err *take_step(run_state *s, double *host, double *wait) {
  double t0 = now_s(), trace_t0 = s->trace ? stoke_trace_now(s->trace) : 0;
  STOKE_PROPAGATE(trace_step(s, s->step + 1, trace_t0, 0));
  char range[32];
  if (stoke_nvtx_on()) snprintf(range, sizeof range, "step %lld", (long long)s->step + 1);
  stoke_range_push(range);
  STOKE_PROPAGATE(stoke_steptime_begin(s->steptime));
  step_args(s);
  stoke_err *e = micro_batches(s, wait);
  if (e && e->code == STOKE_E_INTERRUPTED) return e;
  if (!e) s->good = s->step + 1, s->good_epoch = s->epoch;
  if (!e) e = stoke_steptime_end(s->steptime);
  *host = now_s() - t0 - *wait;
  stoke_range_pop();
  if (!e) e = trace_step(s, s->step + 1, trace_t0, 1);
  if (!e && !s->ops_reported && s->step > s->start_step) {
    e = report_ops(s);
    stoke_steptime_pause(s->steptime); /* the count captured a step: not the next step's time */
  }
  return e ? stoke_err_wrap(e, __FILE__, __LINE__, "step %lld", (long long)s->step + 1) : NULL;
}

stoke_err *run_steps(run_state *s) {
  stoke_err *e = NULL;
  for (s->step = s->start_step; s->step < s->total && !s->stop; s->step++) {
    double host = 0, wait = 0;
    if ((e = take_step(s, &host, &wait))) {
      if (e->code != STOKE_E_INTERRUPTED) return e;
      stoke_err_free(e); /* a signal: the step is dropped, a resume redoes it */
      s->stop = 1;
      break;
    }
    int64_t step = s->step;
    int log_now = (step + 1) % s->rc.run.log_every == 0 || step + 1 == s->total || step == s->start_step;
    double loss = NAN;
    if (log_now && (e = read_loss(s, &loss))) return e;
    if ((e = stoke_metrics_step(s->metrics, step + 1, s->epoch, host, wait, log_now, loss, s->opt.lr))) return e;
    if ((e = run_check_log(s)) || (e = agree_on_stop(s, log_now)) || (e = between_steps(s))) return e;
  }
  if (s->trace && s->step >= s->trace_first && s->step < s->trace_last) /* the run ended inside the window */
    return stoke_trace_write(s->trace);
  return NULL;
}
