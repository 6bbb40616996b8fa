/* stoke/run_config.h: the core's sections of the run's INI file ([run],
 * [plugins], [data], [eval_data], [model], [loss], [optimizer]) declared,
 * and read once into a typed struct that the run uses from then on. */
#ifndef STOKE_RUN_CONFIG_H
#define STOKE_RUN_CONFIG_H

#include "stoke/config.h"
#include "stoke/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { STOKE_DEVICE_AUTO = 0, STOKE_DEVICE_GPU, STOKE_DEVICE_CPU } stoke_device_choice;
typedef enum { STOKE_SHOW_AUTO = 0, STOKE_SHOW_BAR, STOKE_SHOW_LINES, STOKE_SHOW_OFF } stoke_show;

/* [data] or [eval_data]: a source and its loader. */
typedef struct stoke_data_config {
  const char *section;   /* "data" or "eval_data" */
  const char *source;    /* "": none ([eval_data] only) */
  int64_t batch;         /* 0: auto */
  int64_t workers;       /* 0: auto */
  int64_t prefetch;
  int shuffle, drop_last, on_device; /* [data] only (0 for [eval_data]) */
  double max_skipped;    /* [data] only: the loader's fail-fast fraction (0 for [eval_data]: the default) */
  /* [data] only: u8 images' per-channel mean and std as op attributes ("0.485:0.456") */
  char mean[256], std[256];
} stoke_data_config;

typedef struct stoke_run_config {
  /* file:line of a key for later messages: stoke_cfg_where(cfg, ...) */
  const stoke_cfg *cfg;
  struct {
    const char *name, *precision, *comm, *out_dir, *resume, *init_from;
    const char *backends[STOKE_CFG_MAX_LIST];
    int n_backends;
    stoke_device_choice device;
    stoke_layout layout;   /* STOKE_LAYOUT_ANY: auto */
    int filter_layout;     /* 0 auto (ohwi on a GPU), 1 oihw, 2 ohwi: convolution filters in an NHWC graph */
    stoke_show progress;
    int64_t device_index, steps, accumulate, seed, log_every, checkpoint_every, loss_scale_growth;
    double bucket_mb, comm_timeout, epochs, eval_every, loss_scale_init;
    int profile_ops, detect_anomaly, keep_best, checkpoint, overwrite, deterministic, fuse, grad_sums_in_place, fwd_in_bwd, pool_index, cuda_graph,
        conv_autotune, fuse_shortcut;
    int fuse_bias_norm;    /* with fuse: linear biases into the add_layer_norms after them */
    int64_t wgrad_stream;  /* > 0: weight gradients on a second stream, joined k such nodes later */
    const char *recompute; /* none, auto or node-name patterns (core/recompute.c) */
    double memory_gb;      /* the device memory to plan for (0: ask the device) */
    const char *tensorboard; /* "false", "true" (out_dir) or a folder */
    const char *trace;       /* "" or steps, "20-24" */
    int nvtx;
  } run;
  struct {
    const char *path[STOKE_CFG_MAX_LIST], *load[STOKE_CFG_MAX_LIST];
    int n_path, n_load;
  } plugins;
  stoke_data_config data, eval_data;
  struct {
    const char *name;
  } model;
  struct {
    double label_smoothing;
  } loss;
  struct {
    const char *name;
    double lr, weight_decay, grad_clip, warmup_epochs, min_lr, step_epochs, gamma;
    int weight_decay_1d, lr_scale_with_batch;
    int64_t base_batch;
    stoke_lr_kind schedule;
  } optimizer;
} stoke_run_config;

/* Declare the core's sections and keys ([run], [plugins], [data],
 * [eval_data], [model], [loss], [optimizer]). */
stoke_err *stoke_declare_core_keys(stoke_cfg *c);

/* Only the keys that name parts (plugins, backends, model, sources,
 * optimizer, precision, comm): what the run needs to load the plugins
 * that declare the other keys. */
stoke_err *stoke_run_config_names(const stoke_cfg *c, stoke_run_config *rc);

/* Read every core key into *rc (strings live as long as the config). A
 * bad value is an error with its file:line, as stoke_cfg_int's. [eval_data]
 * is read only when it names a source. */
stoke_err *stoke_run_config_read(const stoke_cfg *c, stoke_run_config *rc);

#ifdef __cplusplus
}
#endif
#endif
