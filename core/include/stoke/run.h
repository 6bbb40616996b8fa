/* stoke/run.h: a training run from an INI file: config, plugins, graph,
 * plan, loader, the step loop, metrics and the closing summary. */
#ifndef STOKE_RUN_H
#define STOKE_RUN_H

#include <stdio.h>

#include "stoke/config.h"
#include "stoke/graph.h"
#include "stoke/registry.h"
#include "stoke/run_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_summary {
  int64_t steps;          /* optimizer steps taken */
  int64_t samples;
  double first_loss, final_loss;
  /* device times (stoke/steptime.h), the first step left out */
  double samples_per_s;   /* median over logged intervals: samples over the interval's device time */
  double step_ms_p50, step_ms_p95, step_ms_max;
  double host_ms_p50;     /* the host's time issuing a step (launches), the data wait excluded */
  double data_wait_s;     /* total time the step waited for data */
  double data_wait_first_s; /* of it, the first step's: the loader's start and its first batch (a GPU run's
                               ResNet-50: about 1 s of synthetic images, then nothing) */
  double flops_per_step;
  int64_t skipped_samples; /* reads of unreadable samples (each time one came up) */
  int64_t bad_samples;     /* the distinct unreadable samples among them */
  int interrupted;        /* stopped by SIGINT/SIGTERM */
  double eval_loss, eval_accuracy; /* the last evaluation (NaN: none) */
  double mfu;             /* model FLOPs utilization at the median rate (NaN: unknown peak) */
  double peak_flops;      /* the peak MFU is taken against (0: unknown) */
  double gpu_util_mean, gpu_mem_max_mib; /* NVML samples (NaN: none) */
  /* NVML's power counters over the logged intervals after the first (NaN: none; stoke/nvml.h): the mean draw,
   * the share of the time the power limit held the clocks down, the mean SM clock (the sampler's readings);
   * the limit and the clock's maximum */
  double gpu_power_w, gpu_power_capped, gpu_sm_clock_mhz, gpu_power_limit_w, gpu_sm_clock_max_mhz;
  double dev_alloc_mib;   /* device memory stoke's plans allocated for the run (buffers, optimizer state,
                             workspace), held through every step: the step's peak, the
                             counterpart of torch.cuda.max_memory_allocated (NaN: not a GPU run) */
  double loss_scale, skipped_steps; /* fp16 loss scaler at the end (NaN: none) */
  int64_t gpu_ops_per_step;  /* GPU operations in one step (0: unknown, e.g. the CPU) */
  int64_t launches_per_step; /* with cuda_graph = true 1 per micro-batch (accumulate), else gpu_ops_per_step */
  int64_t graph_replays;     /* micro-batches run as a CUDA graph launch (not: the first, those traced) */
  char out_dir[512];
  char checkpoint[640];   /* the checkpoint written at the end ("" if none) */
  /* for the bench (stoke_run_opts.time_steps): the device, the precision
   * the run used, and the timed steps' elapsed device time */
  char device[128], precision[32];
  int gpu;                /* timed with device events (1) or the host clock (0) */
  double timed_ms;        /* NaN: not timed */
  int n_op_rows;          /* rows of the per-op profile (profile_ops), maybe > op_rows_cap */
  int64_t eval_samples;   /* samples the last evaluation scored (unreadable ones are skipped) */
  /* --dry-run (stoke_run_opts.dry_run): the batch, the bytes the plan asks
   * of the device, and the FLOPs recomputation adds per micro-batch
   * (flops_per_step: the model's, per micro-batch) */
  int64_t dry_batch;
  double dry_plan_bytes, dry_recompute_flops;
  char skip_reasons[1024]; /* the skipped training samples by reason, a line each ("" if none) */
} stoke_summary;

typedef struct stoke_run_opts {
  const char *ini_path;
  /* the config's text instead of the file at ini_path, which then only
   * names it in messages and anchors relative [plugins] paths (generate's
   * config read from a checkpoint); NULL: the file */
  const char *ini_text;
  const char *const *overrides; /* "section.key=value" */
  int n_overrides;
  const char *const *plugin_dirs; /* extra search folders, before the INI's */
  int n_plugin_dirs;
  int quiet;                    /* no progress bar, no config print, no profile print */
  /* bench: the steps after the first time_warmup ones, time_steps of them,
   * are timed into stoke_summary.timed_ms: the sum of their step times,
   * the same device times train reports (stoke/steptime.h); with
   * [run] profile_ops the profile also starts after the warm-up, and its
   * rows land in op_rows (at most op_rows_cap). 0 / NULL: off. */
  int64_t time_warmup, time_steps;
  stoke_op_time *op_rows;
  int op_rows_cap;
  /* plan only (train --dry-run): the batch, memory and FLOPs the run
   * would have, printed; no training, no run folder (core/run.c dry_run) */
  int dry_run;
} stoke_run_opts;

/* Load the config and every plugin it names, declare their keys and
 * validate: the shared first half of train and bench. */
stoke_err *stoke_run_setup(const stoke_run_opts *o, stoke_cfg **cfg, stoke_registry **reg);

/* Train as the config says. */
stoke_err *stoke_train(const stoke_run_opts *o, stoke_summary *out);

/* `--help-config`: every key of the core and of the models and sources
 * found on the plugin search path. */
stoke_err *stoke_help_config(const char *const *plugin_dirs, int n_plugin_dirs, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
