/* core/run.c: a training run as the INI file says: strict config, plugin
 * loading by name, graph build and compile, the loader, the step loop
 * (loss read back only every log_every steps), metrics and the summary. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "stoke/checkpoint.h"
#include "stoke/core.h"
#include "stoke/dist.h"
#include "stoke/eval.h"
#include "stoke/graph.h"
#include "stoke/loader.h"
#include "stoke/metrics.h"
#include "stoke/nvml.h"
#include "stoke/rng.h"
#include "stoke/run.h"
#include "stoke/run_config.h"
#include "stoke/schedule.h"
#include "stoke/steptime.h"
#include "stoke/trace.h"
#include "stoke/ops.h"
#include "dp.h"
#include "nvtx.h"

/* --------------------------------------------------------- plugin setup */

/* Every part of `kind` that any plugin on the search path registers. */
static void list_available(stoke_registry *cur, const char *const *dirs, int n_dirs,
                           const char *kind, char *buf, size_t cap) {
  stoke_registry *r = NULL;
  buf[0] = 0;
  if (stoke_registry_new(&r)) return;
  for (int i = 0; i < n_dirs; i++) stoke_registry_add_path(r, dirs[i]);
  char files[2048];
  stoke_registry_available(cur, files, sizeof files);
  for (char *save = NULL, *t = strtok_r(files, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
    stoke_err_free(stoke_registry_load(r, t));
  stoke_registry_names(r, kind, buf, cap);
  stoke_registry_free(r);
}

/* The registered part of `kind` named `name`, or NULL. */
static const void *find_part(const stoke_registry *reg, const char *kind, const char *name) {
  if (!strcmp(kind, "backend")) return stoke_find_backend(reg, name);
  if (!strcmp(kind, "model")) return stoke_find_model(reg, name);
  if (!strcmp(kind, "source")) return stoke_find_source(reg, name);
  if (!strcmp(kind, "optimizer")) return stoke_find_optimizer(reg, name);
  if (!strcmp(kind, "precision")) return stoke_find_precision(reg, name);
  return NULL;
}

/* The part of `kind` named `name`: registered already (built in, or by a
 * plugin loaded before), or from the plugin of that name. A part named
 * `base_variant` with no libstoke_base_variant.so is looked for in
 * libstoke_base.so (the cudnn plugin's `cudnn_classic` engine). */
static stoke_err *load_part(stoke_registry *reg, const stoke_cfg *c, const char *sec, const char *key,
                            const char *kind, const char *name, const char *const *dirs, int n_dirs) {
  if (find_part(reg, kind, name)) return NULL;
  stoke_err *e = stoke_registry_load(reg, name);
  const char *us = strchr(name, '_');
  if (e && e->code == STOKE_E_NOT_FOUND && us && us > name) {
    char base[64];
    snprintf(base, sizeof base, "%.*s", (int)(us - name), name);
    stoke_err *e2 = stoke_registry_load(reg, base);
    if (!e2 && find_part(reg, kind, name)) {
      stoke_err_free(e);
      return NULL;
    }
    stoke_err_free(e2);
  }
  if (!e && find_part(reg, kind, name)) return NULL;
  char avail[1024];
  list_available(reg, dirs, n_dirs, kind, avail, sizeof avail);
  stoke_err *out = STOKE_ERR(e ? e->code : STOKE_E_NOT_FOUND,
                             "%s: [%s] %s: unknown %s '%s'; %ss available: %s\n  %s",
                             stoke_cfg_where(c, sec, key), sec, key, kind, name, kind,
                             avail[0] ? avail : "none found", e ? e->msg : "the plugin loaded but registers no such part");
  stoke_err_free(e);
  return out;
}

stoke_err *stoke_run_setup(const stoke_run_opts *o, stoke_cfg **cfg_out, stoke_registry **reg_out) {
  stoke_cfg *c = stoke_cfg_new();
  stoke_registry *reg = NULL;
  stoke_err *e = NULL;
  const char *dirs[STOKE_CFG_MAX_LIST + 16];
  int n_dirs = 0;
  if (!c) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  STOKE_TRY_GOTO(e, fail, stoke_declare_core_keys(c), "declaring the core's config keys");
  STOKE_TRY_GOTO(e, fail, stoke_cfg_load_file(c, o->ini_path), "loading the config");
  for (int i = 0; i < o->n_overrides; i++)
    STOKE_TRY_GOTO(e, fail, stoke_cfg_override(c, o->overrides[i]), "applying command-line overrides");
  STOKE_TRY_GOTO(e, fail, stoke_registry_new(&reg), "");
  for (int i = 0; i < o->n_plugin_dirs && n_dirs < 16; i++) dirs[n_dirs++] = o->plugin_dirs[i];
  stoke_run_config rc; /* the names of the parts: all a config may say before their keys are declared */
  STOKE_TRY_GOTO(e, fail, stoke_run_config_names(c, &rc), "");
  for (int i = 0; i < rc.plugins.n_path; i++) dirs[n_dirs++] = rc.plugins.path[i];
  for (int i = 0; i < n_dirs; i++) stoke_registry_add_path(reg, dirs[i]);

  for (int i = 0; i < rc.plugins.n_load; i++)
    STOKE_TRY_GOTO(e, fail, stoke_registry_load(reg, rc.plugins.load[i]), "%s: [plugins] load = %s",
                   stoke_cfg_where(c, "plugins", "load"), rc.plugins.load[i]);
  if (rc.run.n_backends == 0) {
    e = STOKE_ERR(STOKE_E_INVALID, "%s: [run] backends is empty; name at least one, e.g. cpu",
                  stoke_cfg_where(c, "run", "backends"));
    goto fail;
  }
  for (int i = 0; i < rc.run.n_backends; i++)
    STOKE_TRY_GOTO(e, fail, load_part(reg, c, "run", "backends", "backend", rc.run.backends[i], dirs, n_dirs), "");
  const char *name = rc.model.name;
  STOKE_TRY_GOTO(e, fail, load_part(reg, c, "model", "name", "model", name, dirs, n_dirs), "");
  const stoke_model_v1 *m = stoke_find_model(reg, name);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_declare(c, "model", NULL, m->keys, m->n_keys),
                 "declaring the keys of model '%s'", name);
  name = rc.data.source;
  STOKE_TRY_GOTO(e, fail, load_part(reg, c, "data", "source", "source", name, dirs, n_dirs), "");
  const stoke_source_v1 *s = stoke_find_source(reg, name);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_declare(c, "data", NULL, s->keys, s->n_keys),
                 "declaring the keys of source '%s'", name);
  name = rc.eval_data.source;
  if (name[0]) {
    STOKE_TRY_GOTO(e, fail, load_part(reg, c, "eval_data", "source", "source", name, dirs, n_dirs), "");
    s = stoke_find_source(reg, name);
    STOKE_TRY_GOTO(e, fail, stoke_cfg_declare(c, "eval_data", NULL, s->keys, s->n_keys),
                   "declaring the keys of source '%s'", name);
  }
  name = rc.optimizer.name;
  STOKE_TRY_GOTO(e, fail, load_part(reg, c, "optimizer", "name", "optimizer", name, dirs, n_dirs), "");
  const stoke_optimizer_v1 *opt = stoke_find_optimizer(reg, name);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_declare(c, "optimizer", NULL, opt->keys, opt->n_keys),
                 "declaring the keys of optimizer '%s'", name);
  name = rc.run.precision;
  STOKE_TRY_GOTO(e, fail, load_part(reg, c, "run", "precision", "precision", name, dirs, n_dirs), "");
  name = rc.run.comm;
  stoke_err *le = stoke_find_comm(reg, name) ? NULL : stoke_registry_load(reg, name);
  if (!stoke_find_comm(reg, name)) {
    char names[256];
    stoke_registry_names(reg, "comm", names, sizeof names);
    e = STOKE_ERR(STOKE_E_NOT_FOUND, "%s: [run] comm: unknown comm '%s'; comms available: %s (built in), nccl "
                  "(plugin)%s%s", stoke_cfg_where(c, "run", "comm"), name, names, le ? "\n  " : "", le ? le->msg : "");
    stoke_err_free(le);
    goto fail;
  }
  stoke_err_free(le);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_validate(c), "checking the config");
  *cfg_out = c;
  *reg_out = reg;
  return NULL;
fail:
  stoke_registry_free(reg);
  stoke_cfg_free(c);
  return e;
}

/* --------------------------------------------------------------- train */

static const char *dist_getenv(const char *name, void *ctx) {
  (void)ctx;
  return getenv(name);
}

/* Ctrl-C and SIGTERM, from the step loop to the end of the run: the first
 * stops the run at the next micro-batch, loader wait or evaluation batch
 * (a partly accumulated step is dropped; a resume redoes it), which saves
 * and exits 0; the second is told the save is under way; the third ends
 * the process at once (the previous checkpoint, written atomically,
 * stays). SA_RESTART: a signal does not fail the run's file writes. */
static volatile sig_atomic_t stop_signal, n_signals;

static void say(const char *msg, size_t n) {
  ssize_t k = write(2, msg, n);
  (void)k;
}
#define SAY(lit) say(lit, sizeof lit - 1)

static void on_signal(int sig) {
  stop_signal = sig;
  if (++n_signals == 1)
    SAY("\nstoke: stopping at the next micro-batch to save a checkpoint (twice more quits at once without saving)\n");
  else if (n_signals == 2)
    SAY("\nstoke: still stopping and saving; once more quits at once without saving (the previous checkpoint stays)\n");
  else {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

/* The run's signal dispositions, restored when it ends: SIGINT and
 * SIGTERM as above, and SIGXFSZ ignored, so a write past the file-size
 * limit fails (and is reported) instead of killing the process. */
typedef struct sig_guard {
  struct sigaction old[3];
  int on[3];
} sig_guard;

static const int guarded_signals[3] = {SIGINT, SIGTERM, SIGXFSZ};

static void sig_set(sig_guard *g, int i, void (*handler)(int)) {
  struct sigaction sa = {0};
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigaction(guarded_signals[i], &sa, g->on[i] ? NULL : &g->old[i]);
  g->on[i] = 1;
}

static void signals_catch(sig_guard *g) {
  stop_signal = n_signals = 0;
  sig_set(g, 0, on_signal);
  sig_set(g, 1, on_signal);
}

static void signals_restore(sig_guard *g) {
  for (int i = 0; i < 3; i++)
    if (g->on[i]) sigaction(guarded_signals[i], &g->old[i], NULL);
  memset(g, 0, sizeof *g);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Writes `path` through `put` and checks that every byte reached the file:
 * a full disk or a file-size limit is an error naming the file, never a
 * silently short or empty file. */
static stoke_err *write_checked(const char *path, void (*put)(const void *, FILE *), const void *arg) {
  FILE *f = fopen(path, "w");
  if (!f) return STOKE_ERR(STOKE_E_IO, "cannot write '%s': %s", path, strerror(errno));
  put(arg, f);
  int bad = fflush(f) != 0 || ferror(f), err = errno;
  if (fclose(f) && !bad) bad = 1, err = errno;
  if (bad) return STOKE_ERR(STOKE_E_IO, "writing '%s' failed: %s (is the disk full?)", path, strerror(err));
  return NULL;
}

static void put_config(const void *c, FILE *f) { stoke_cfg_dump(c, f); }
static void put_plan(const void *p, FILE *f) { stoke_plan_report(p, f); }
static void put_ops(const void *x, FILE *f) { stoke_exec_profile_report((stoke_exec *)x, f); }

static stoke_err *mkdir_p(const char *path) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) && errno != EEXIST)
      return STOKE_ERR(STOKE_E_IO, "cannot create folder '%s': %s", buf, strerror(errno));
    *p = '/';
  }
  if (mkdir(buf, 0755) && errno != EEXIST)
    return STOKE_ERR(STOKE_E_IO, "cannot create folder '%s': %s", buf, strerror(errno));
  return NULL;
}

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
  /* overlapped copies (GPU): batches land in a device staging buffer on
   * the copy stream, then move to the input value on the compute stream */
  void *stage;
  size_t stage_x;         /* bytes of samples; the labels follow */
  void *ev_copy, *ev_d2d; /* timers used as events */
  int d2d_pending;
  int lm;                 /* token windows: a language model, its loss against the next tokens */
} stream;

typedef struct run_state {
  stoke_cfg *cfg;
  stoke_run_config rc; /* the config, read once */
  stoke_registry *reg;
  const char *engines[STOKE_CFG_MAX_LIST];
  void *selves[STOKE_CFG_MAX_LIST];
  const stoke_backend_v1 *backs[STOKE_CFG_MAX_LIST];
  int n_engines;
  int opened[STOKE_CFG_MAX_LIST];
  const stoke_backend_v1 *dev;
  void *dev_self;
  stream train, eval;
  stoke_metrics *metrics;
  FILE *log;
  char *config_text;
  stoke_layout layout;
  stoke_nvml *nvml;
  /* data parallel (NULL with comm = single) */
  stoke_dp *dp;
  stoke_dist_env dist; /* read once from the launcher's variables; handed to the comm */
  int rank, world, local_rank;
  stoke_ckpt_meta resume; /* the checkpoint resumed from (step 0: none) */
  stoke_steptime *steptime; /* each step's device time */
  stoke_trace *trace;       /* run.trace's steps, or NULL */
  /* what a checkpoint records, and where it goes ("": checkpoints off) */
  int64_t seed, accumulate, start_step;
  const char *opt_name;
  char ckpt[640];
} run_state;

/* A stop asked for by a signal, where the run may stop mid-step: not with
 * data parallel, whose ranks agree on when to stop (at a logged step). */
static int stop_now(const run_state *s) { return stop_signal && !s->dp; }

/* Close the opened engines, the device's last (the others use it). */
static void close_engines(run_state *s) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = s->n_engines - 1; i >= 0; i--) {
      if (!s->opened[i] || (pass == 0) == (s->backs[i] == s->dev)) continue;
      if (s->backs[i]->close) s->backs[i]->close(s->selves[i]);
      s->opened[i] = 0;
    }
}

static void stream_close(run_state *s, stream *st) {
  if (st->d2d_pending && s->dev->timer_sync) stoke_err_free(s->dev->timer_sync(s->dev_self, st->ev_d2d));
  if (st->stage) s->dev->free(s->dev_self, st->stage);
  if (st->ev_copy) s->dev->timer_destroy(s->dev_self, st->ev_copy);
  if (st->ev_d2d) s->dev->timer_destroy(s->dev_self, st->ev_d2d);
  stoke_loader_free(st->loader);
  stoke_exec_free(st->x);
  stoke_plan_free(st->plan);
  stoke_graph_free(st->g);
  if (st->src_self) st->src->close(st->src_self);
}

static void run_close(run_state *s) {
  stoke_dp_close(s->dp);
  stoke_steptime_free(s->steptime);
  stoke_trace_free(s->trace);
  stoke_metrics_free(s->metrics);
  stoke_nvml_close(s->nvml);
  stream_close(s, &s->eval); /* borrows the training executor's weights: first */
  stream_close(s, &s->train);
  close_engines(s);
  stoke_registry_free(s->reg);
  stoke_cfg_free(s->cfg);
  free(s->config_text);
  if (s->log) {
    stoke_log_set_file(NULL);
    fclose(s->log);
  }
}

static stoke_err *open_engines(run_state *s);

/* Open the engines in order; the first that owns a device provides memory.
 * With device = auto and no GPU, fall back to the cpu backend, saying so. */
static stoke_err *open_backends(run_state *s, const char **prec_name) {
  s->n_engines = s->rc.run.n_backends;
  memcpy(s->engines, s->rc.run.backends, sizeof s->engines);
  stoke_err *e = open_engines(s);
  if (!e || e->code != STOKE_E_NOT_FOUND || s->rc.run.device != STOKE_DEVICE_AUTO || !s->dev || s->dev->device != STOKE_DEV_GPU)
    return e;
  stoke_log(STOKE_LOG_WARN, "run", "%s; [run] device = auto: falling back to the cpu backend (fp32)", e->msg);
  stoke_err_free(e);
  close_engines(s);
  s->dev = NULL;
  s->dev_self = NULL;
  STOKE_TRY(stoke_registry_load(s->reg, "cpu"), "falling back to the cpu backend");
  s->engines[0] = "cpu";
  s->n_engines = 1;
  *prec_name = "fp32";
  return open_engines(s);
}

/* The engines of [run] backends and the first that owns a device, none
 * opened. */
static stoke_err *pick_device(run_state *s) {
  for (int i = 0; i < s->n_engines; i++) {
    s->backs[i] = stoke_find_backend(s->reg, s->engines[i]);
    if (!s->backs[i]->device_engine && !s->dev) s->dev = s->backs[i];
  }
  if (!s->dev)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [run] backends: none of the backends owns a device (cpu or cuda); add one",
                     stoke_cfg_where(s->cfg, "run", "backends"));
  return NULL;
}

static stoke_err *open_engines(run_state *s) {
  int64_t dev_index = s->rc.run.device_index + s->local_rank; /* data parallel: one GPU per process of a node */
  STOKE_PROPAGATE(pick_device(s));
  /* the device engine opens first: the others get its state */
  int order[STOKE_CFG_MAX_LIST], n = 0;
  for (int i = 0; i < s->n_engines; i++)
    if (s->backs[i] == s->dev) order[n++] = i;
  for (int i = 0; i < s->n_engines; i++)
    if (s->backs[i] != s->dev) order[n++] = i;
  for (int k = 0; k < n; k++) {
    int i = order[k];
    const stoke_backend_v1 *b = s->backs[i];
    if (b->device_engine && strcmp(b->device_engine, s->dev->name))
      return STOKE_ERR(STOKE_E_INVALID, "%s: [run] backends: '%s' runs on '%s', which is not in the list",
                       stoke_cfg_where(s->cfg, "run", "backends"), b->name, b->device_engine);
    if (b->device != s->dev->device)
      return STOKE_ERR(STOKE_E_INVALID, "[run] backends: '%s' and '%s' are on different devices",
                       b->name, s->dev->name);
    STOKE_TRY(b->open ? b->open((int)dev_index, b == s->dev ? NULL : s->dev_self, &s->selves[i]) : NULL,
              "opening backend '%s' on device %lld", b->name, (long long)dev_index);
    s->opened[i] = 1;
    if (b == s->dev) s->dev_self = s->selves[i];
  }
  return NULL;
}


/* The model's graph for a stream: inputs (u8 images are normalized by the
 * first node, on the device), the model, and the loss when training. */
/* "[3, 32, 32]" */
static void shape_text(const stoke_shape *sh, char *out, size_t cap) {
  size_t k = (size_t)snprintf(out, cap, "[");
  for (int i = 0; i < sh->ndim && k < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, "%s%lld", i ? ", " : "", (long long)sh->d[i]);
  if (k < cap) snprintf(out + k, cap - k, "]");
}

/* Evaluation runs the training weights: its samples must be of the
 * training data's shape and classes (said here, by section and key,
 * rather than as two plans that differ). */
static stoke_err *eval_matches(run_state *s, const stoke_sample_info_v1 *ev) {
  stoke_sample_info_v1 tr;
  STOKE_PROPAGATE(s->train.src->info(s->train.src_self, &tr));
  if (tr.classes != ev->classes)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [eval_data] has %lld classes and [data] %lld: evaluation runs the model trained on [data]; "
                     "give both the same classes",
                     stoke_cfg_where(s->cfg, "eval_data", "source"), (long long)ev->classes, (long long)tr.classes);
  int same = tr.shape.ndim == ev->shape.ndim;
  for (int i = 0; same && i < tr.shape.ndim; i++) same = tr.shape.d[i] == ev->shape.d[i];
  if (!same) {
    char a[64], b[64];
    shape_text(&ev->shape, a, sizeof a);
    shape_text(&tr.shape, b, sizeof b);
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [eval_data] samples are %s and [data] samples %s: evaluation runs the model trained on "
                     "[data]; give both the same sample shape",
                     stoke_cfg_where(s->cfg, "eval_data", "source"), a, b);
  }
  return NULL;
}

static stoke_err *build_graph(run_state *s, stream *st, stoke_dtype dtype, int training) {
  stoke_sample_info_v1 info;
  STOKE_TRY(st->src->info(st->src_self, &info), "source '%s'", st->src->name);
  if (!training) STOKE_PROPAGATE(eval_matches(s, &info));
  STOKE_PROPAGATE(stoke_graph_new(s->reg, dtype, s->layout, &st->g));
  stoke_graph *g = st->g;
  stoke_shape xs = {info.shape.ndim + 1, {st->batch}};
  for (int i = 0; i < info.shape.ndim; i++) xs.d[i + 1] = info.shape.d[i];
  int x, y, logits, targets = -1;
  if (info.dtype == STOKE_I32 && info.shape.ndim == 1) {
    /* token windows [B, T + 1]: the model reads the first T, the loss the next T */
    STOKE_PROPAGATE(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &xs, STOKE_I32, &x));
    STOKE_PROPAGATE(stoke_lm_inputs(g, x, &x, &targets));
  } else if (info.dtype == STOKE_U8) {
    if (info.shape.ndim != 3)
      return STOKE_ERR(STOKE_E_UNSUPPORTED, "source '%s' gives u8 samples that are not images (C, H, W)",
                       st->src->name);
    if (info.layout == STOKE_NCHW)
      return STOKE_ERR(STOKE_E_UNSUPPORTED,
                       "source '%s' says its u8 images are STOKE_NCHW (CHW memory order); u8 images are read as "
                       "HWC (as decoders write them): write HWC and say STOKE_NHWC, or give f32 samples",
                       st->src->name);
    STOKE_PROPAGATE(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &xs, STOKE_U8, &x));
    g->values[x].layout = STOKE_NHWC; /* sources write HWC */
    char attrs[600];
    snprintf(attrs, sizeof attrs, "mean=%s, std=%s, layout=%s, dtype=%s", s->rc.data.mean, s->rc.data.std,
             s->layout == STOKE_NHWC ? "nhwc" : "nchw", stoke_dtype_name(dtype));
    int n;
    STOKE_TRY(stoke_graph_builder(g).node(g, STOKE_OP_NORMALIZE, "normalize", &x, 1, attrs, &n, 1),
              "%s: [data] mean / std", stoke_cfg_where(s->cfg, "data", "mean"));
    x = n;
  } else if (info.dtype == STOKE_F32) {
    /* the batch arrives as f32; a low-precision graph converts it first */
    STOKE_PROPAGATE(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &xs, STOKE_F32, &x));
    /* images in the memory order the source declares (CHW unless it says STOKE_NHWC) */
    stoke_layout in = info.layout == STOKE_NHWC ? STOKE_NHWC : STOKE_NCHW;
    g->values[x].layout = xs.ndim == 4 ? in : STOKE_LAYOUT_ANY;
    if (dtype != STOKE_F32 || (xs.ndim == 4 && s->layout != in)) {
      char attrs[32];
      snprintf(attrs, sizeof attrs, "dtype=%s", stoke_dtype_name(dtype));
      int c;
      STOKE_PROPAGATE(stoke_graph_builder(g).node(g, STOKE_OP_CAST, "cast", &x, 1, attrs, &c, 1));
      x = c;
    }
  } else {
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "source '%s' gives samples that are neither f32, u8 nor i32 token windows",
                     st->src->name);
  }
  st->lm = targets >= 0;
  STOKE_PROPAGATE(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {st->batch}}, STOKE_I32, &y));
  const char *mname = s->rc.model.name;
  const stoke_model_v1 *m = stoke_find_model(s->reg, mname);
  stoke_builder_v1 b = stoke_graph_builder(g);
  STOKE_TRY(m->build(s->cfg, "model", &b, x, info.classes, &logits), "building model '%s'", mname);
  stoke_shape ls = g->values[logits].shape;
  int64_t rows = st->lm ? stoke_numel(&g->values[targets].shape) : st->batch;
  if (ls.ndim != 2 || ls.d[0] != rows || (st->lm ? ls.d[1] < info.classes : ls.d[1] != info.classes))
    return STOKE_ERR(STOKE_E_INVALID, "model '%s' must give logits [%lld, %s%lld]%s", mname, (long long)rows,
                     st->lm ? ">= " : "", (long long)info.classes,
                     st->lm ? " (a row per token, a column per token id of the data's vocabulary)" : "");
  g->logits = logits;
  if (!training && !st->lm) return NULL; /* a language model's evaluation reads its loss */
  char attrs[64];
  snprintf(attrs, sizeof attrs, "label_smoothing=%.17g", s->rc.loss.label_smoothing);
  STOKE_PROPAGATE(stoke_graph_loss_on(g, logits, st->lm ? targets : y, attrs));
  return NULL;
}


/* workers = auto: 1, 2, 4, ... up to the core count, each timed on a few
 * batches after a warm-up (what users sweep by hand); the fastest count
 * wins, a larger count only when it is at least 5% faster. */
static stoke_err *auto_workers(run_state *s, stoke_loader_opts lo, int64_t *best_out) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  double best_rate = 0;
  int64_t best = 1;
  char line[512] = "";
  size_t used = 0;
  for (int64_t w = 1; w <= cores && w <= 64; w *= 2) {
    lo.workers = (int)w;
    lo.shuffle = 1;
    stoke_loader *l;
    STOKE_TRY(stoke_loader_new(&lo, &l), "workers = auto, trying %lld", (long long)w);
    /* the ring's first `prefetch` batches were made before anyone asked:
     * drain them, then time at least 12 batches and 0.2 s (at most 400) */
    stoke_err *e = NULL;
    double t0 = 0, n = 0;
    int warm = lo.prefetch + 1;
    for (int i = 0; i < warm + 400 && !e; i++) {
      stoke_batch *b;
      e = stoke_loader_next(l, &b, NULL);
      if (!e && i == warm - 1) t0 = now_s();
      if (!e && i >= warm) n += (double)b->n;
      if (!e) stoke_loader_release(l, b);
      if (i >= warm + 12 && now_s() - t0 > 0.2) break;
    }
    double rate = n / (now_s() - t0);
    stoke_loader_free(l);
    if (e) return stoke_err_wrap(e, __FILE__, __LINE__, "workers = auto, trying %lld", (long long)w);
    used += (size_t)snprintf(line + used, used < sizeof line ? sizeof line - used : 0, "%s%lld: %.0f/s",
                             used ? ", " : "", (long long)w, rate);
    if (rate > best_rate * 1.05) best_rate = rate, best = w;
  }
  stoke_log(STOKE_LOG_INFO, "loader", "workers = auto: %lld (samples/s by worker count: %s)", (long long)best, line);
  *best_out = best;
  return NULL;
}

/* The memory a plan may take: 85% of [run] memory_gb, or of the device's
 * free memory (the kernels' workspaces are not known before their plan();
 * the margin covers them); *device: the memory it is 85% of, `name` says
 * where that figure comes from. */
static stoke_err *memory_budget(run_state *s, double *budget, double *device, char *name, size_t cap) {
  double gb = s->rc.run.memory_gb;
  stoke_device_info_v1 info = {0};
  if (gb > 0) snprintf(info.name, sizeof info.name, "[run] memory_gb = %g", gb);
  else if (s->dev && s->dev->info) STOKE_PROPAGATE(s->dev->info(s->dev_self, &info));
  *device = gb > 0 ? gb * 1073741824.0 : (double)info.free_bytes;
  *budget = 0.85 * *device;
  if (name) snprintf(name, cap, "%s", info.name);
  return NULL;
}

/* The compiler's options for a stream, from the run's config. */
static stoke_err *plan_opts(run_state *s, const stoke_precision_v1 *prec, int training, stoke_plan_opts *po) {
  const stoke_run_config *rc = &s->rc;
  int det = rc->run.deterministic;
  uint32_t flags = (prec->tf32 ? STOKE_KFLAG_TF32 : 0) | (det ? STOKE_KFLAG_DETERMINISTIC : 0) |
                   (rc->run.conv_autotune && !det ? STOKE_KFLAG_AUTOTUNE : 0);
  double init_scale = rc->run.loss_scale_init, budget = 0, device;
  if (training && !strcmp(rc->run.recompute, "auto")) STOKE_PROPAGATE(memory_budget(s, &budget, &device, NULL, 0));
  *po = (stoke_plan_opts){s->engines, s->n_engines, s->selves, training ? rc->optimizer.name : NULL, training, flags,
                          training && prec->loss_scaling != STOKE_SCALING_NONE,
                          init_scale > 0 ? init_scale : prec->init_scale, rc->run.fuse, rc->optimizer.grad_clip,
                          !rc->optimizer.weight_decay_1d, !rc->run.grad_sums_in_place, prec,
                          training ? rc->run.recompute : NULL, budget};
  return NULL;
}

/* batch_size = auto: the largest power of two from 8 whose plan fits 85%
 * of the device's free memory (no trial-and-error allocation); with
 * recompute = auto, each batch's plan recomputes what it must to fit. */
static stoke_err *auto_batch(run_state *s, stream *st, const stoke_plan_opts *po, stoke_dtype dtype) {
  double budget, device;
  char device_name[160];
  STOKE_PROPAGATE(memory_budget(s, &budget, &device, device_name, sizeof device_name));
  int64_t best = 0, len = st->src->length(st->src_self);
  double need = 0, best_need = 0;
  for (int64_t b = 8; b <= len && b <= (1 << 20); b *= 2) {
    st->batch = b;
    stoke_err *e = build_graph(s, st, dtype, 1);
    stoke_plan *p = NULL;
    if (!e) e = stoke_compile(st->g, po, &p);
    if (!e) need = stoke_plan_device_bytes(p);
    stoke_plan_free(p);
    stoke_graph_free(st->g);
    st->g = NULL;
    if (e) return stoke_err_wrap(e, __FILE__, __LINE__, "batch_size = auto, trying %lld", (long long)b);
    if (need > budget) break;
    best = b;
    best_need = need;
  }
  if (!best)
    return STOKE_ERR(STOKE_E_OOM,
                     "batch_size = auto: not even 8 samples fit: the plan needs %.1f MiB, %.1f MiB of the "
                     "device's %.1f MiB free is the budget; use a smaller model or precision, or [run] recompute = auto",
                     need / 1048576, budget / 1048576, device / 1048576);
  st->batch = best;
  stoke_log(STOKE_LOG_INFO, "run",
            "batch_size = auto: %lld (the plan needs %.1f MiB; %.1f MiB free on %s, 85%% is the budget%s)",
            (long long)best, best_need / 1048576, device / 1048576, device_name,
            po->recompute && !strcmp(po->recompute, "auto") ? "; recompute = auto" : "");
  return NULL;
}

/* Open a stream's source, find its batch, build and compile its graph. */
static stoke_err *plan_stream(run_state *s, stream *st, const stoke_data_config *dc, const stoke_precision_v1 *prec,
                              int training) {
  stoke_dtype dtype = prec->param_dtype;
  st->section = dc->section;
  st->batch = dc->batch;
  if (!st->batch && !training) st->batch = s->train.batch;
  st->src = stoke_find_source(s->reg, dc->source);
  STOKE_TRY(st->src->open(s->cfg, dc->section, &st->src_self), "opening [%s] source '%s'", dc->section, dc->source);
  stoke_plan_opts po;
  STOKE_PROPAGATE(plan_opts(s, prec, training, &po));
  if (!st->batch) STOKE_PROPAGATE(auto_batch(s, st, &po, dtype));
  STOKE_PROPAGATE(build_graph(s, st, dtype, training));
  STOKE_TRY(stoke_compile(st->g, &po, &st->plan), "compiling the %s graph", training ? "training" : "evaluation");
  return NULL;
}

/* Plan a stream (plan_stream), bind its plan to the device, start its loader. */
static stoke_err *open_stream(run_state *s, stream *st, const stoke_data_config *dc,
                              const stoke_precision_v1 *prec, int training, int64_t start_batch) {
  const char *section = dc->section;
  uint64_t seed = (uint64_t)s->rc.run.seed;
  int64_t workers = dc->workers;
  STOKE_PROPAGATE(plan_stream(s, st, dc, prec, training));
  if (training)
    STOKE_TRY(stoke_exec_new(st->plan, s->dev, s->dev_self, seed, &st->x),
              "preparing the plan: parameters %.1f MiB, gradients %.1f MiB, optimizer state %.1f MiB, "
              "activations %.1f MiB at batch %lld (halving [data] batch_size about halves the activations)",
              st->plan->bytes[STOKE_BUF_PARAMS] / 1048576.0, st->plan->bytes[STOKE_BUF_GRADS] / 1048576.0,
              st->plan->opt_state_bytes / 1048576.0, st->plan->bytes[STOKE_BUF_ARENA] / 1048576.0,
              (long long)st->batch);
  else
    STOKE_TRY(stoke_exec_new_shared(st->plan, s->train.x, &st->x), "preparing the evaluation plan");
  /* resumed: the same place in the global sample order, whatever the
   * number of processes or the batch size it was saved with */
  if (training && s->resume.step > 0)
    start_batch = stoke_dist_resume_batch(s->resume.step, s->resume.accumulate,
                                          s->resume.batch > 0 ? s->resume.batch : st->batch,
                                          s->resume.world, st->batch, s->world);
  stoke_loader_opts lo = {st->src, st->src_self, s->dev, s->dev_self, st->batch, (int)workers,
                          (int)dc->prefetch, dc->shuffle, dc->drop_last, seed, s->rank, s->world, start_batch,
                          s->dp ? NULL : &stop_signal, !training, dc->max_skipped};
  if (!workers) STOKE_PROPAGATE(auto_workers(s, lo, &workers));
  lo.workers = (int)workers;
  STOKE_TRY(stoke_loader_new(&lo, &st->loader), "starting the [%s] loader", section);
  if (s->dev->copy_stream && s->dev->stream_wait && s->dev->timer_sync && s->dev->timer_create) {
    st->stage_x = (stoke_loader_sample_bytes(st->loader) * (size_t)st->batch + 255) / 256 * 256;
    STOKE_TRY(s->dev->alloc(s->dev_self, st->stage_x + sizeof(int32_t) * (size_t)st->batch, &st->stage),
              "allocating the [%s] batch staging buffer", section);
    STOKE_PROPAGATE(s->dev->timer_create(s->dev_self, &st->ev_copy));
    STOKE_PROPAGATE(s->dev->timer_create(s->dev_self, &st->ev_d2d));
  }
  return NULL;
}

/* [run] layout: auto is NHWC on a GPU (channels_last), NCHW on the CPU. */
static void pick_layout(run_state *s) {
  s->layout = s->rc.run.layout != STOKE_LAYOUT_ANY ? s->rc.run.layout
              : s->dev->device == STOKE_DEV_GPU    ? STOKE_NHWC
                                                   : STOKE_NCHW;
}

/* --dry-run: the training plan as the run would make it (batch_size =
 * auto and recompute = auto included), its memory and FLOPs, and no
 * training and no run folder: the answer before renting the GPU. With
 * [run] memory_gb no device is opened (the backends' kernel tables come
 * from their plugins; nothing is allocated or planned on a device);
 * without it, the device is asked for its free memory. */
static stoke_err *dry_run(run_state *s, const stoke_run_opts *o, const char *prec_name, stoke_summary *sum) {
  double budget, device;
  char device_name[160];
  s->n_engines = s->rc.run.n_backends;
  memcpy(s->engines, s->rc.run.backends, sizeof s->engines);
  if (s->rc.run.memory_gb > 0) STOKE_PROPAGATE(pick_device(s));
  else STOKE_PROPAGATE(open_backends(s, &prec_name));
  pick_layout(s);
  STOKE_PROPAGATE(memory_budget(s, &budget, &device, device_name, sizeof device_name));
  const stoke_precision_v1 *prec = stoke_find_precision(s->reg, prec_name);
  STOKE_PROPAGATE(plan_stream(s, &s->train, &s->rc.data, prec, 1));
  const stoke_plan *p = s->train.plan;
  if (!o->quiet) stoke_plan_report(p, stdout);
  double need = stoke_plan_device_bytes(p), act = (double)p->bytes[STOKE_BUF_ARENA];
  double without = p->recompute_report ? (double)p->arena_without_recompute : act;
  sum->flops_per_step = p->train_flops;
  sum->dry_batch = s->train.batch;
  sum->dry_plan_bytes = need;
  sum->dry_recompute_flops = p->recompute_flops;
  double unit = device >= 4 * 1073741824.0 ? 1073741824.0 : 1048576.0;
  const char *u = unit > 1048576.0 ? "GiB" : "MiB";
  printf("dry run (%s, %s): batch %lld; the plan needs %.2f %s of the %.2f %s budget (85%% of %.2f %s, %s)%s: "
         "activations %.2f %s (%.2f %s without recomputation), parameters, gradients and optimizer state %.2f %s; "
         "%.4g FLOPs per micro-batch, +%.1f%% recomputed\n",
         prec_name, s->dev->name, (long long)s->train.batch, need / unit, u, budget / unit, u, device / unit, u,
         device_name, need > budget ? " (DOES NOT FIT)" : "", act / unit, u, without / unit, u, (need - act) / unit, u,
         p->train_flops, p->train_flops > 0 ? 100 * p->recompute_flops / p->train_flops : 0.0);
  return NULL;
}

/* The precision policy's table, and a warning for each matmul or conv
 * whose dimensions keep tensor cores from full speed in fp16/bf16. */
static void report_precision(const stoke_precision_v1 *p, const stoke_graph *g, int quiet) {
  static const char *scaling[] = {"off", "static", "dynamic"};
  if (!quiet)
    printf("precision %s: parameters %s (the optimizer on %s%s), activations %s, TF32 %s, loss scaling %s; "
           "ops in fp32: %s\n",
           p->name, stoke_dtype_name(p->param_dtype), stoke_dtype_name(p->master_dtype),
           p->master_dtype != p->param_dtype ? " master weights" : "", stoke_dtype_name(p->compute_dtype),
           p->tf32 ? "on" : "off", (unsigned)p->loss_scaling < 3 ? scaling[p->loss_scaling] : "?",
           p->fp32_ops && p->fp32_ops[0] ? p->fp32_ops
                                         : "none (statistics, norms and the loss accumulate in fp32 inside the kernels)");
  if (p->compute_dtype != STOKE_BF16 && p->compute_dtype != STOKE_F16) return;
  for (int i = 0; i < g->n_fwd; i++) {
    const stoke_gnode *n = &g->nodes[i];
    int conv = !strcmp(n->n.op, STOKE_OP_CONV2D), lin = !strcmp(n->n.op, STOKE_OP_LINEAR);
    if (!conv && !lin) continue;
    int64_t in = g->values[n->in[0]].shape.d[1], out = g->values[n->in[1]].shape.d[0];
    if (in % 8 || out % 8)
      stoke_log(STOKE_LOG_WARN, "run",
                "%s '%s': %s %lld -> %lld, not multiples of 8: tensor cores run it below full speed in %s",
                n->n.op, n->n.name, conv ? "channels" : "features", (long long)in, (long long)out, p->name);
  }
}

/* Copy a batch into the stream's input and label values; when it returns,
 * the host batch buffer may go back to the loader. On a GPU the copy runs
 * on the copy stream into a staging buffer while the compute stream is
 * still busy with the previous step, and the compute stream picks it up
 * (device-to-device, after an event) right before this step's kernels. */
static stoke_err *feed(run_state *s, stream *st, const stoke_batch *b) {
  const stoke_backend_v1 *d = s->dev;
  size_t xb = stoke_loader_sample_bytes(st->loader) * (size_t)b->n, yb = sizeof(int32_t) * (size_t)b->n;
  if (!st->stage) {
    STOKE_PROPAGATE(d->copy(s->dev_self, stoke_exec_input(st->x), b->x, xb, STOKE_COPY_H2D, NULL));
    STOKE_PROPAGATE(d->copy(s->dev_self, stoke_exec_labels(st->x), b->labels, yb, STOKE_COPY_H2D, NULL));
    return d->stream_sync ? d->stream_sync(s->dev_self, NULL) : NULL;
  }
  void *cs = d->copy_stream(s->dev_self), *stage_y = (char *)st->stage + st->stage_x;
  /* the staging buffer is free once the previous step's pick-up ran */
  if (st->d2d_pending) STOKE_PROPAGATE(d->stream_wait(s->dev_self, cs, st->ev_d2d));
  STOKE_PROPAGATE(d->copy(s->dev_self, st->stage, b->x, xb, STOKE_COPY_H2D, cs));
  STOKE_PROPAGATE(d->copy(s->dev_self, stage_y, b->labels, yb, STOKE_COPY_H2D, cs));
  STOKE_PROPAGATE(d->timer_record(s->dev_self, st->ev_copy, cs));
  STOKE_PROPAGATE(d->timer_sync(s->dev_self, st->ev_copy)); /* the host buffer is read */
  STOKE_PROPAGATE(d->stream_wait(s->dev_self, NULL, st->ev_copy));
  STOKE_PROPAGATE(d->copy(s->dev_self, stoke_exec_input(st->x), st->stage, xb, STOKE_COPY_D2D, NULL));
  STOKE_PROPAGATE(d->copy(s->dev_self, stoke_exec_labels(st->x), stage_y, yb, STOKE_COPY_D2D, NULL));
  STOKE_PROPAGATE(d->timer_record(s->dev_self, st->ev_d2d, NULL));
  st->d2d_pending = 1;
  return NULL;
}

/* stoke_eval_rows over the rows the loader could read: a row it could not
 * read has label -1 and is left out, never counted. */
static stoke_err *eval_readable_rows(const void *logits, stoke_dtype dt, int64_t rows, int64_t classes,
                                     const int32_t *labels, stoke_eval_sums *sums) {
  size_t row_bytes = (size_t)classes * stoke_dtype_size(dt);
  for (int64_t r = 0; r < rows;) {
    int64_t end = r;
    while (end < rows && labels[end] >= 0) end++;
    if (end > r)
      STOKE_PROPAGATE(stoke_eval_rows((const char *)logits + (size_t)r * row_bytes, dt, end - r, classes,
                                      labels + r, sums));
    r = end + 1; /* past the unreadable row */
  }
  return NULL;
}

static stoke_err *evaluate_lm(run_state *s, stoke_summary *sum);

/* One pass over the evaluation data with the forward-only plan: mean
 * cross-entropy and top-1 accuracy over every sample that could be read
 * (a last partial batch counts only its real rows; the loader marks an
 * unreadable sample with label -1 instead of replacing it). A signal
 * stops it (STOKE_E_INTERRUPTED). A language model: evaluate_lm. */
static stoke_err *evaluate(run_state *s, stoke_summary *sum) {
  stream *st = &s->eval;
  if (st->lm) return evaluate_lm(s, sum);
  const stoke_value *lv = &st->g->values[st->g->logits];
  int64_t classes = lv->shape.d[1];
  size_t lbytes = (size_t)stoke_numel(&lv->shape) * stoke_dtype_size(lv->dtype);
  void *logits = malloc(lbytes);
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)st->batch);
  if (!logits || !labels) {
    free(logits);
    free(labels);
    return STOKE_ERR(STOKE_E_OOM, "out of memory for evaluation");
  }
  stoke_eval_sums sums = {0};
  stoke_err *e = NULL;
  int64_t nb = stoke_loader_batches_per_epoch(st->loader);
  for (int64_t i = 0; i < nb && !e; i++) {
    stoke_batch *b;
    if (stop_now(s)) {
      e = STOKE_ERR(STOKE_E_INTERRUPTED, "evaluation interrupted");
      break;
    }
    e = stoke_loader_next(st->loader, &b, NULL);
    if (!b) break; /* interrupted while waiting */
    int64_t n = b->n;
    if (!e) {
      memcpy(labels, b->labels, sizeof(int32_t) * (size_t)n);
      e = feed(s, st, b);
    }
    stoke_loader_release(st->loader, b);
    if (!e) e = stoke_exec_forward_backward(st->x, 1, 0);
    if (!e) e = stoke_exec_read(st->x, st->g->logits, logits, lbytes);
    if (!e) e = eval_readable_rows(logits, lv->dtype, n, classes, labels, &sums); /* the graph's dtype */
  }
  free(logits);
  free(labels);
  if (!e && s->dp) { /* each rank evaluated its shard */
    double v[3] = {sums.loss, (double)sums.correct, (double)sums.count};
    e = stoke_dp_sum(s->dp, v, 3);
    sums.loss = v[0], sums.correct = (int64_t)v[1], sums.count = (int64_t)v[2];
  }
  if (!e && !sums.count)
    e = STOKE_ERR(STOKE_E_DATA, "%s: no sample of [eval_data] could be read (each is in the log with its reason)",
                  stoke_cfg_where(s->cfg, "eval_data", "source"));
  if (e) return e->code == STOKE_E_INTERRUPTED ? e : stoke_err_wrap(e, __FILE__, __LINE__, "evaluating on [eval_data]");
  sum->eval_loss = sums.loss / (double)sums.count;
  sum->eval_accuracy = (double)sums.correct / (double)sums.count;
  sum->eval_samples = sums.count;
  return NULL;
}

/* A language model's evaluation: the mean next-token cross-entropy over
 * every whole batch, computed on the device by the loss node (the logits
 * of a GPT-2 batch, 1.6 GB, never travel); a last partial batch is left
 * out. No accuracy (NaN), as nanoGPT's estimate_loss. */
static stoke_err *evaluate_lm(run_state *s, stoke_summary *sum) {
  stream *st = &s->eval;
  double total = 0, count = 0, l;
  int64_t nb = stoke_loader_batches_per_epoch(st->loader), left_out = 0;
  stoke_err *e = NULL;
  for (int64_t i = 0; i < nb && !e; i++) {
    stoke_batch *b;
    if (stop_now(s)) {
      e = STOKE_ERR(STOKE_E_INTERRUPTED, "evaluation interrupted");
      break;
    }
    e = stoke_loader_next(st->loader, &b, NULL);
    if (!b) break; /* interrupted while waiting */
    int whole = !e && b->n == st->batch;
    left_out += whole ? 0 : b->n;
    if (whole) e = feed(s, st, b);
    stoke_loader_release(st->loader, b);
    if (whole && !e) e = stoke_exec_forward_backward(st->x, 1, 0);
    if (whole && !e) e = stoke_exec_read_loss(st->x, &l);
    if (whole && !e) total += l, count += 1;
  }
  if (!e && s->dp) { /* each rank evaluated its shard */
    double v[2] = {total, count};
    e = stoke_dp_sum(s->dp, v, 2);
    total = v[0], count = v[1];
  }
  if (!e && !count)
    e = STOKE_ERR(STOKE_E_DATA, "%s: [eval_data] gave no whole batch of %lld sequences to evaluate",
                  stoke_cfg_where(s->cfg, "eval_data", "batch_size"), (long long)st->batch);
  if (e) return e->code == STOKE_E_INTERRUPTED ? e : stoke_err_wrap(e, __FILE__, __LINE__, "evaluating on [eval_data]");
  if (left_out) stoke_log(STOKE_LOG_DEBUG, "eval", "a last partial batch of %lld sequences left out", (long long)left_out);
  sum->eval_loss = total / count;
  sum->eval_accuracy = NAN;
  sum->eval_samples = (int64_t)count * st->batch;
  return NULL;
}

static stoke_err *save(run_state *s, int64_t step, int64_t epoch) {
  if (s->rank > 0) return NULL; /* data parallel: the weights are the same everywhere */
  float amp[4] = {1, 0, 0, 0};
  int scaled = stoke_exec_read_scaler(s->train.x, amp);
  /* skipped before the resume, and since (the scaler counts from it) */
  stoke_ckpt_meta m = {.step = step, .epoch = epoch, .seed = s->seed, .accumulate = s->accumulate,
                       .loss_scale = scaled ? amp[0] : 1.0, .world = s->world, .batch = s->train.batch,
                       .skipped_steps = s->resume.skipped_steps + (int64_t)amp[3]};
  snprintf(m.optimizer, sizeof m.optimizer, "%s", s->opt_name);
  STOKE_TRY(stoke_checkpoint_save(s->train.x, s->ckpt, &m, s->config_text), "saving the checkpoint at step %lld",
            (long long)step);
  return NULL;
}

/* An error after the weights of step `good` were saved says where they are. */
static stoke_err *note_saved(const run_state *s, stoke_err *e, int64_t good, const stoke_summary *sum) {
  if (e && sum->checkpoint[0] && s->rank == 0)
    e = stoke_err_note(e, "the weights after step %lld were saved first: %s (continue with run.resume=%s)",
                       (long long)good, sum->checkpoint, sum->checkpoint);
  return e;
}

/* On the way out, after an error too: save the weights of the last whole
 * step `good` (nothing when checkpoints are off, nothing was trained since
 * the start, or `good` is -1: an error may have left the weights half
 * updated, or they diverged), then return the error, which says where the
 * weights went. */
static stoke_err *save_on_exit(run_state *s, stoke_err *e, int64_t good, int64_t epoch, stoke_summary *sum) {
  if (!s->ckpt[0] || good <= s->start_step) return e;
  stoke_err *se = save(s, good, epoch);
  if (!se) snprintf(sum->checkpoint, sizeof sum->checkpoint, "%s", s->ckpt);
  if (!e) return se;
  if (se) {
    e = stoke_err_note(e, "the weights after step %lld could not be saved either: %s", (long long)good, se->msg);
    stoke_err_free(se);
  }
  return note_saved(s, e, good, sum);
}

/* Before anything is written to out_dir: checkpoint files of processes
 * killed mid-save (checkpoint.safetensors.tmp.PID, that PID gone from this
 * machine) are removed, and another run's checkpoint there is kept: the
 * run is refused unless it continues that checkpoint (run.resume names
 * it) or run.overwrite = true says to start over. */
static stoke_err *claim_out_dir(const stoke_cfg *c, const char *dir, const char *resume, int want_ckpt,
                                int overwrite) {
  DIR *d = opendir(dir);
  for (struct dirent *de; d && (de = readdir(d));) {
    static const char tmp[] = "checkpoint.safetensors.tmp.";
    char *end;
    if (strncmp(de->d_name, tmp, sizeof tmp - 1)) continue;
    long pid = strtol(de->d_name + sizeof tmp - 1, &end, 10);
    if (end == de->d_name + sizeof tmp - 1 || *end || pid <= 0 || pid > INT_MAX) continue;
    if (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue; /* still saving */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (!unlink(path))
      stoke_log(STOKE_LOG_INFO, "run", "removed %s, left by process %ld, which was killed while saving", path, pid);
  }
  if (d) closedir(d);
  char ckpt[PATH_MAX];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", dir);
  struct stat have, named;
  if (!want_ckpt || overwrite || stat(ckpt, &have)) return NULL;
  if (resume[0] && !stat(resume, &named) && named.st_dev == have.st_dev && named.st_ino == have.st_ino) return NULL;
  stoke_ckpt_meta m;
  char what[64] = "unreadable";
  stoke_err *e = stoke_checkpoint_read_meta(ckpt, &m);
  if (e) stoke_err_free(e);
  else snprintf(what, sizeof what, "step %lld", (long long)m.step);
  return STOKE_ERR(STOKE_E_INVALID,
                   "%s: [run] out_dir '%s' holds another run's checkpoint (%s, %s): continue it with run.resume=%s, "
                   "start over with run.overwrite=true (it is replaced at the first save), or choose another out_dir",
                   stoke_cfg_where(c, "run", "out_dir"), dir, ckpt, what, ckpt);
}

/* Before any compute: room for a checkpoint in out_dir, on its disk and
 * under the file-size limit, so that a run never trains for hours to fail
 * at its first save. */
static stoke_err *check_room(const run_state *s, const char *dir) {
  if (!s->ckpt[0] || s->rank > 0) return NULL;
  size_t need = stoke_checkpoint_bytes(s->train.plan, s->opt_name, s->config_text ? strlen(s->config_text) : 0);
  size_t logs = (size_t)1 << 20; /* metrics.jsonl, log.txt, plan.txt */
  struct statvfs v;
  if (statvfs(dir, &v) == 0 && (double)v.f_bavail * (double)v.f_frsize < (double)(need + logs))
    return STOKE_ERR(STOKE_E_IO,
                     "%s: [run] out_dir '%s' has %.1f MiB free, and this run's checkpoint needs %.1f MiB (plus its "
                     "logs): free some space, set run.out_dir to another disk, or set run.checkpoint = false",
                     stoke_cfg_where(s->cfg, "run", "out_dir"), dir,
                     (double)v.f_bavail * (double)v.f_frsize / 1048576.0, need / 1048576.0);
  struct rlimit r;
  if (getrlimit(RLIMIT_FSIZE, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur < need)
    return STOKE_ERR(STOKE_E_IO,
                     "the file-size limit (ulimit -f) is %.1f MiB, and this run's checkpoint is %.1f MiB: raise the "
                     "limit or set run.checkpoint = false",
                     (double)r.rlim_cur / 1048576.0, need / 1048576.0);
  return NULL;
}

/* Data parallel, at the end: every rank's data wait, and the bus
 * bandwidth of an all-reduce of the whole flat gradient buffer. */
static stoke_err *report_ranks(run_state *s, const stoke_summary *sum, int quiet) {
  double waits[64], ms = 0, bw = 0;
  STOKE_TRY(stoke_dp_gather(s->dp, sum->data_wait_s, waits), "gathering every rank's data wait");
  STOKE_TRY(stoke_dp_bench(s->dp, 20, &ms, &bw), "timing the gradient all-reduce");
  size_t bytes = s->train.plan->bytes[STOKE_BUF_GRADS];
  char line[1024];
  size_t used = 0;
  for (int r = 0; r < s->world && used < sizeof line; r++)
    used += (size_t)snprintf(line + used, sizeof line - used, "%s%d: %.3f s", r ? ", " : "", r, waits[r]);
  stoke_log(STOKE_LOG_INFO, "dp", "data wait by rank: %s", line);
  stoke_log(STOKE_LOG_INFO, "dp",
            "all-reduce of the flat gradient buffer (%.1f MiB): %.3f ms, bus bandwidth %.1f GB/s over %d ranks",
            bytes / 1048576.0, ms, bw, s->world);
  if (!quiet) {
    printf("  data parallel over %d processes: data wait by rank %s\n", s->world, line);
    printf("  gradient all-reduce (%.1f MiB, one call): %.3f ms, bus bandwidth %.1f GB/s\n", bytes / 1048576.0, ms,
           bw);
  }
  return NULL;
}

/* The resolved config as text (saved with the run and in checkpoints). */
static char *config_text(const stoke_cfg *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  stoke_cfg_dump(c, f);
  fclose(f);
  return buf;
}

/* Device memory the run allocated (MiB): both streams' execs and batch
 * staging buffers; NaN when the device is the host. */
static double device_mib(const run_state *s) {
  if (s->dev->device != STOKE_DEV_GPU) return NAN;
  size_t b = stoke_exec_device_bytes(s->train.x) + stoke_exec_device_bytes(s->eval.x);
  for (const stream *st = &s->train; st; st = st == &s->train ? &s->eval : NULL)
    if (st->stage) b += st->stage_x + sizeof(int32_t) * (size_t)st->batch;
  return (double)b / 1048576.0;
}

/* GPU operations per step, with and without graphs, once known: with
 * graphs after the capture (the second step), without by recording one
 * step that does not run. */
static stoke_err *report_ops(run_state *s, int graphs, const stoke_opt_args_v1 *opt, stoke_summary *sum,
                             int *reported) {
  int64_t ops = stoke_exec_graph_ops(s->train.x);
  if (!graphs && !ops) STOKE_TRY(stoke_exec_count_ops(s->train.x, opt, &ops), "counting the step's GPU operations");
  if (!graphs || ops) *reported = 1;
  if (!ops) return NULL;
  sum->gpu_ops_per_step = ops;
  sum->launches_per_step = graphs ? 1 : ops;
  /* (the summary and its JSON line repeat it at the end) */
  stoke_log(STOKE_LOG_INFO, "run", "one step is %lld GPU operations (kernels, copies, memsets): %s", (long long)ops,
            graphs ? "replayed as 1 CUDA graph launch (cuda_graph = true)"
                   : "launched one by one (cuda_graph = true would make them 1 graph launch)");
  return NULL;
}

/* run.trace: the traced steps time every node (eager: the executor's
 * profile) and wait for the device at their end, where their device time
 * is read; the loader's workers are recorded from `prefetch` batches
 * before the window. Called before (`end` = 0) and after each step. */
static stoke_err *trace_step(run_state *s, int64_t step, int graphs, int profile_ops, double t0, int end) {
  stoke_trace *t = s->trace;
  if (!t) return NULL;
  if (!end) {
    stoke_trace_lead(t, step, (int)s->rc.data.prefetch + 2);
    if (stoke_trace_has(t, step) && !stoke_trace_has(t, step - 1) && !graphs) {
      if (!profile_ops) STOKE_PROPAGATE(stoke_exec_profile(s->train.x, 1));
      if (s->dp) STOKE_PROPAGATE(stoke_dp_time_buckets(s->dp, 1));
    }
    return NULL;
  }
  if (!stoke_trace_has(t, step)) return NULL;
  double launched = stoke_trace_now(t);
  STOKE_PROPAGATE(stoke_metrics_collect(s->metrics, s->steptime)); /* the sync */
  double synced = stoke_trace_now(t);
  const double *node_ms = NULL;
  int n = graphs ? 0 : stoke_exec_profile_last(s->train.x, &node_ms);
  char name[64];
  snprintf(name, sizeof name, "step %lld", (long long)step);
  stoke_trace_slice(t, STOKE_TRACE_STEP, name, "step", t0, launched - t0, NULL);
  stoke_trace_slice(t, STOKE_TRACE_STEP, "wait for the GPU (tracing)", "wait", launched, synced - launched, NULL);
  stoke_trace_gpu_step(t, step, s->train.plan, node_ms, n, stoke_metrics_last_ms(s->metrics), synced,
                       graphs ? (int)stoke_exec_graph_ops(s->train.x) : 0);
  if (s->dp && !graphs) {
    double at[256], ms[256];
    size_t bytes[256];
    int nb = stoke_dp_bucket_times(s->dp, stoke_exec_profile_start(s->train.x), at, ms, bytes, 256);
    stoke_trace_gpu_buckets(t, at, ms, bytes, nb);
  }
  if (stoke_trace_has(t, step + 1)) return NULL;
  if (!graphs && !profile_ops) STOKE_PROPAGATE(stoke_exec_profile(s->train.x, 0));
  if (!graphs && s->dp) STOKE_PROPAGATE(stoke_dp_time_buckets(s->dp, 0));
  stoke_trace_lead(t, step + 1, 0);
  STOKE_TRY(stoke_trace_write(t), "[run] trace");
  stoke_log(STOKE_LOG_INFO, "run", "trace written to %s (open it in ui.perfetto.dev)", stoke_trace_path(t));
  return NULL;
}

/* log.txt takes every log line: a write that failed is an error too. */
static stoke_err *check_log(const run_state *s, const char *dir) {
  if (!s->log || !ferror(s->log)) return NULL;
  return STOKE_ERR(STOKE_E_IO, "writing '%s/log.txt' failed (is the disk full?)", dir);
}

stoke_err *stoke_train(const stoke_run_opts *o, stoke_summary *sum) {
  run_state s = {0};
  s.world = 1;
  stoke_err *e = NULL;
  sig_guard sg = {0};
  stop_signal = n_signals = 0; /* a signal from an earlier run in this process is not for this one */
  memset(sum, 0, sizeof *sum);
  sum->eval_loss = sum->eval_accuracy = sum->timed_ms = NAN;
  STOKE_PROPAGATE(stoke_run_setup(o, &s.cfg, &s.reg));
  stoke_cfg *c = s.cfg;
  STOKE_TRY_GOTO(e, done, stoke_run_config_read(c, &s.rc), "");
  const stoke_run_config *rc = &s.rc;

  /* -- the run's folder, its resolved config and log */
  const char *name = rc->run.name, *out_dir = rc->run.out_dir, *prec_name = rc->run.precision;
  const char *opt_name = rc->optimizer.name, *resume = rc->run.resume, *comm_name = rc->run.comm;
  int64_t seed = rc->run.seed, steps = rc->run.steps, accumulate = rc->run.accumulate;
  int64_t log_every = rc->run.log_every, ckpt_every = rc->run.checkpoint_every;
  double epochs = rc->run.epochs, eval_every = rc->run.eval_every;
  stoke_opt_args_v1 opt = {0};
  opt.weight_decay = rc->optimizer.weight_decay;
  opt.max_norm = rc->optimizer.grad_clip;
  const stoke_optimizer_v1 *optimizer = stoke_find_optimizer(s.reg, opt_name);
  if (optimizer->configure)
    STOKE_TRY_GOTO(e, done, optimizer->configure(c, "optimizer", &opt), "configuring optimizer '%s'", opt_name);
  if (o->dry_run) {
    e = dry_run(&s, o, prec_name, sum);
    goto done;
  }
  /* data parallel: which process this is (the comm plugin reads the same
   * variables); the GPU is device_index + the local rank */
  stoke_run_opts rank_opts = *o;
  if (strcmp(comm_name, "single")) {
    stoke_dist_env *env = &s.dist;
    char msg[512];
    if (stoke_dist_env_read(dist_getenv, NULL, env, msg, sizeof msg)) {
      e = STOKE_ERR(STOKE_E_INVALID, "%s: [run] comm = %s: %s", stoke_cfg_where(c, "run", "comm"), comm_name, msg);
      goto done;
    }
    s.rank = env->rank, s.world = env->world, s.local_rank = env->local_rank;
    rank_opts.quiet |= s.rank > 0; /* rank 0 speaks for the job */
    o = &rank_opts;
  }
  char run_name[256], dir[512];
  if (name[0]) snprintf(run_name, sizeof run_name, "%s", name);
  else {
    const char *base = strrchr(o->ini_path, '/');
    snprintf(run_name, sizeof run_name, "%s", base ? base + 1 : o->ini_path);
    char *dot = strrchr(run_name, '.');
    if (dot) *dot = 0;
  }
  if (out_dir[0]) snprintf(dir, sizeof dir, "%s", out_dir);
  else snprintf(dir, sizeof dir, "runs/%s", run_name);
  if (s.rank > 0) { /* the other ranks' logs and metrics go beside rank 0's */
    size_t len = strlen(dir);
    snprintf(dir + len, sizeof dir - len, "/rank%d", s.rank);
  }
  snprintf(sum->out_dir, sizeof sum->out_dir, "%s", dir);
  sig_set(&sg, 2, SIG_IGN); /* SIGXFSZ: see sig_guard */
  STOKE_TRY_GOTO(e, done, mkdir_p(dir), "[run] out_dir");
  int want_ckpt = rc->run.checkpoint;
  if (s.rank == 0) STOKE_TRY_GOTO(e, done, claim_out_dir(c, dir, resume, want_ckpt, rc->run.overwrite), "");
  s.config_text = config_text(c);
  char path[640];
  snprintf(path, sizeof path, "%s/config.ini", dir);
  STOKE_TRY_GOTO(e, done, write_checked(path, put_config, c), "[run] out_dir");
  snprintf(path, sizeof path, "%s/log.txt", dir);
  s.log = fopen(path, "a");
  if (s.log) stoke_log_set_file(s.log);
  if (!o->quiet) {
    printf("stoke: run '%s', resolved config (saved to %s/config.ini):\n", run_name, dir);
    stoke_cfg_dump(c, stdout);
  }

  /* -- devices, precision, the checkpoint to resume, data, graphs, plans */
  STOKE_TRY_GOTO(e, done, open_backends(&s, &prec_name), "");
  const stoke_precision_v1 *prec = stoke_find_precision(s.reg, prec_name);
  if (strcmp(comm_name, "single")) {
    STOKE_TRY_GOTO(e, done, stoke_dp_open(stoke_find_comm(s.reg, comm_name), c, &s.dist, s.dev, s.dev_self, &s.dp),
                   "");
  }
  pick_layout(&s);
  stoke_device_info_v1 info = {0};
  if (s.dev->info) STOKE_TRY_GOTO(e, done, s.dev->info(s.dev_self, &info), "asking the device for its peak");
  snprintf(sum->device, sizeof sum->device, "%s", info.name[0] ? info.name : s.dev->name);
  snprintf(sum->precision, sizeof sum->precision, "%s", prec->name);
  sum->gpu = s.dev->device == STOKE_DEV_GPU;
  double peak = prec->compute_dtype == STOKE_F32 ? (prec->tf32 ? info.peak_tf32 : info.peak_flops[STOKE_F32])
                                                 : info.peak_flops[prec->compute_dtype];
  if (s.dev->device == STOKE_DEV_GPU) s.nvml = stoke_nvml_open((int)rc->run.device_index + s.local_rank);
  if (s.dev->device == STOKE_DEV_CPU && prec->param_dtype != STOKE_F32 && prec->param_dtype != STOKE_F64) {
    e = STOKE_ERR(STOKE_E_UNSUPPORTED,
                  "%s: [run] precision = %s needs a GPU backend (%s parameters); the cpu backend runs fp32 (or f64)",
                  stoke_cfg_where(c, "run", "precision"), prec_name, stoke_dtype_name(prec->param_dtype));
    goto done;
  }
  /* the training loader starts where the checkpoint stopped: read its
   * step first; where the data continues also depends on how it was cut
   * (accumulate, world, batch: open_stream) */
  int64_t start_step = 0;
  stoke_ckpt_meta meta = {0};
  if (resume[0]) {
    STOKE_TRY_GOTO(e, done, stoke_checkpoint_read_meta(resume, &s.resume), "%s: [run] resume",
                   stoke_cfg_where(c, "run", "resume"));
    start_step = s.resume.step;
  }
  STOKE_TRY_GOTO(e, done, open_stream(&s, &s.train, &rc->data, prec, 1, start_step * accumulate), "");
  if (resume[0]) {
    STOKE_TRY_GOTO(e, done, stoke_checkpoint_load(s.train.x, resume, &meta), "%s: [run] resume",
                   stoke_cfg_where(c, "run", "resume"));
    if (meta.loss_scale > 0)
      STOKE_TRY_GOTO(e, done, stoke_exec_set_scale(s.train.x, (float)meta.loss_scale), "restoring the loss scale");
    s.resume.skipped_steps = meta.skipped_steps;
    if (meta.seed != seed || meta.accumulate != accumulate)
      stoke_log(STOKE_LOG_WARN, "run",
                "resuming from %s, saved with seed %lld and accumulate %lld, now %lld and %lld: the run "
                "will not repeat the original",
                resume, (long long)meta.seed, (long long)meta.accumulate, (long long)seed, (long long)accumulate);
    if (!o->quiet) printf("stoke: resumed from %s at step %lld\n", resume, (long long)start_step);
  }
  if (strcmp(comm_name, "single")) {
    STOKE_TRY_GOTO(e, done, stoke_dp_attach(s.dp, s.train.x, rc->run.bucket_mb * 1048576.0), "");
    STOKE_TRY_GOTO(e, done, stoke_dp_broadcast_state(s.dp), "");
    char buckets[1024];
    stoke_dp_describe(s.dp, buckets, sizeof buckets);
    if (!o->quiet)
      printf("data parallel: %d processes (comm %s), %lld samples per step (%lld per process), gradients in %s\n",
             s.world, comm_name, (long long)(s.train.batch * accumulate * s.world),
             (long long)(s.train.batch * accumulate), buckets);
  }
  if (rc->eval_data.source[0]) STOKE_TRY_GOTO(e, done, open_stream(&s, &s.eval, &rc->eval_data, prec, 0, 0), "");
  report_precision(prec, s.train.g, o->quiet);
  snprintf(path, sizeof path, "%s/plan.txt", dir);
  STOKE_TRY_GOTO(e, done, write_checked(path, put_plan, s.train.plan), "[run] out_dir");
  if (!o->quiet) stoke_plan_report(s.train.plan, stdout);

  int64_t per_epoch = stoke_loader_batches_per_epoch(s.train.loader);
  int64_t steps_per_epoch = per_epoch / accumulate > 0 ? per_epoch / accumulate : 1;
  int64_t total = steps > 0 ? steps : (int64_t)ceil(epochs * (double)per_epoch / (double)accumulate);
  if (total < 1) total = 1;
  if (start_step >= total)
    stoke_log(STOKE_LOG_WARN, "run", "%s is at step %lld, and this run ends at step %lld: nothing to train; raise "
              "[run] steps or epochs to continue", resume, (long long)start_step, (long long)total);
  int64_t batch = s.train.batch;
  stoke_lr_schedule sched;
  STOKE_TRY_GOTO(e, done, stoke_lr_schedule_make(rc, total, steps_per_epoch, batch * accumulate * s.world, &sched), "");
  sum->flops_per_step = s.train.plan->train_flops * (double)accumulate;

  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  stoke_show show = rc->run.progress;
  stoke_metrics_opts mo = {path, show == STOKE_SHOW_OFF || o->quiet ? STOKE_PROGRESS_OFF
                                 : show == STOKE_SHOW_BAR            ? STOKE_PROGRESS_BAR
                                 : show == STOKE_SHOW_LINES          ? STOKE_PROGRESS_LINES
                                 : isatty(2)                         ? STOKE_PROGRESS_BAR
                                                                     : STOKE_PROGRESS_LINES,
                           total, batch * accumulate * s.world, o->quiet, start_step,
                           s.train.plan->train_flops * (double)accumulate, peak, s.nvml,
                           o->time_warmup, o->time_steps};
  if (!strcmp(rc->run.tensorboard, "true")) mo.tensorboard_dir = dir; /* rank N's: in rank N's folder */
  else if (strcmp(rc->run.tensorboard, "false") && s.rank == 0) mo.tensorboard_dir = rc->run.tensorboard;
  mo.report_dir = dir, mo.run_name = run_name, mo.plan = s.train.plan;
  STOKE_TRY_GOTO(e, done, stoke_trace_parse(rc->run.trace, &mo.trace_first, &mo.trace_last), "%s",
                 stoke_cfg_where(c, "run", "trace"));
  STOKE_TRY_GOTO(e, done, stoke_metrics_new(&mo, &s.metrics), "");
  STOKE_TRY_GOTO(e, done, stoke_steptime_new(s.dev, s.dev_self, &s.steptime), "");
  if (mo.trace_first) {
    snprintf(path, sizeof path, "%s/trace.json", dir);
    STOKE_TRY_GOTO(e, done, stoke_trace_new(path, mo.trace_first, mo.trace_last, s.rank, &s.trace), "");
    stoke_loader_on_fill(s.train.loader, stoke_trace_fill, s.trace);
  }

  /* -- the step loop */
  int64_t step, epoch = 0;
  int64_t eval_period = eval_every > 0 ? (int64_t)llround(eval_every * (double)per_epoch) : 0;
  int on_device = rc->data.on_device, profile_ops = rc->run.profile_ops;
  int cuda_graph = rc->run.cuda_graph;
  stoke_nvtx_enable(rc->run.nvtx);
  int64_t growth = rc->run.loss_scale_growth;
  if (cuda_graph && profile_ops) {
    stoke_log(STOKE_LOG_WARN, "run", "%s: cuda_graph = true with profile_ops = true: the profile times each "
              "kernel on its own, so this run does not use graphs", stoke_cfg_where(c, "run", "cuda_graph"));
    cuda_graph = 0;
  } else if (cuda_graph && !s.dev->capture_begin) {
    stoke_log(STOKE_LOG_WARN, "run", "%s: cuda_graph = true, but the '%s' device has no graphs: running without",
              stoke_cfg_where(c, "run", "cuda_graph"), s.dev->name);
    cuda_graph = 0;
  }
  if (cuda_graph && s.dp && !stoke_dp_graphs(s.dp)) {
    e = STOKE_ERR(STOKE_E_UNSUPPORTED,
                  "%s: cuda_graph = true with comm = %s: this comm cannot follow collectives inside a replayed "
                  "graph (no watch()); set [run] cuda_graph = false",
                  stoke_cfg_where(c, "run", "cuda_graph"), comm_name);
    goto done;
  }
  if (cuda_graph) STOKE_TRY_GOTO(e, done, stoke_exec_graphs(s.train.x, 1), "%s", stoke_cfg_where(c, "run", "cuda_graph"));
  int ops_reported = s.dp != NULL; /* counting records a step: no collectives in a capture */
  s.seed = seed, s.accumulate = accumulate, s.start_step = start_step, s.opt_name = opt_name;
  if (want_ckpt) snprintf(s.ckpt, sizeof s.ckpt, "%s/checkpoint.safetensors", dir);
  STOKE_TRY_GOTO(e, done, check_room(&s, dir), "");
  int stop = 0;
  /* the last step whose weights are whole, what a save on the way out
   * writes: -1 when an error may have left them half updated or they
   * diverged, or a save just failed */
  int64_t good = start_step, good_epoch = s.resume.epoch;
  signals_catch(&sg);
  for (step = start_step; step < total && !stop; step++) {
    double t0 = now_s(), wait = 0, trace_t0 = s.trace ? stoke_trace_now(s.trace) : 0;
    if ((e = trace_step(&s, step + 1, cuda_graph, profile_ops, trace_t0, 0))) break;
    char range[32];
    if (stoke_nvtx_on()) snprintf(range, sizeof range, "step %lld", (long long)step + 1);
    stoke_range_push(range);
    if ((e = stoke_steptime_begin(s.steptime))) break;
    opt.step = step + 1 - s.resume.skipped_steps; /* the device subtracts the skips since the start */
    opt.grad_scale = 1.0 / (double)accumulate;
    opt.lr = stoke_lr_at(&sched, step + 1);
    opt.growth_interval = prec->loss_scaling == STOKE_SCALING_STATIC ? 0 : growth > 0 ? growth : prec->growth_interval;
    opt.growth_factor = prec->growth_factor;
    opt.backoff_factor = prec->loss_scaling == STOKE_SCALING_STATIC ? 1 : prec->backoff_factor;
    for (int64_t micro = 0; micro < accumulate && !e; micro++) {
      if (stop_now(&s)) { /* a signal: the step is dropped, a resume redoes it */
        e = STOKE_ERR(STOKE_E_INTERRUPTED, "interrupted");
        break;
      }
      if (s.dp) stoke_dp_arm(s.dp, micro == accumulate - 1);
      if (!on_device || step == start_step) {
        stoke_batch *b;
        double w = 0;
        e = stoke_loader_next(s.train.loader, &b, &w);
        wait += w;
        if (!b) break; /* a signal while waiting */
        int traced = stoke_trace_has(s.trace, step + 1);
        double fed = traced ? stoke_trace_now(s.trace) : 0;
        if (traced) { /* the wait, and the arrow from the batch's making */
          stoke_trace_slice(s.trace, STOKE_TRACE_STEP, "data wait", "wait", fed - 1e6 * w, 1e6 * w, NULL);
          stoke_trace_flow(s.trace, STOKE_TRACE_STEP, (uint64_t)(b->epoch * per_epoch + b->index), fed, 0);
        }
        if (!e) e = feed(&s, &s.train, b); /* then the host buffer may go back */
        if (traced)
          stoke_trace_slice(s.trace, STOKE_TRACE_STEP, "pinned copy (host to device)", "copy", fed,
                            stoke_trace_now(s.trace) - fed, NULL);
        epoch = b->epoch;
        stoke_loader_release(s.train.loader, b);
      }
      if (!e) {
        e = stoke_exec_micro(s.train.x, micro == 0, micro == accumulate - 1,
                             stoke_hash3((uint64_t)seed, (uint64_t)step, (uint64_t)micro), &opt);
        if (e && micro == accumulate - 1) good = -1; /* the update may be half applied */
      }
    }
    if (e && e->code == STOKE_E_INTERRUPTED) {
      stoke_err_free(e);
      e = NULL;
      stop = 1;
      break;
    }
    if (!e) good = step + 1, good_epoch = epoch;
    if (!e) e = stoke_steptime_end(s.steptime);
    double host = now_s() - t0 - wait;
    stoke_range_pop();
    if (!e) e = trace_step(&s, step + 1, cuda_graph, profile_ops, trace_t0, 1);
    if (!e && !ops_reported && step > start_step) {
      e = report_ops(&s, cuda_graph, &opt, sum, &ops_reported);
      stoke_steptime_pause(s.steptime); /* the count captured a step: not the next step's time */
    }
    if (e) {
      e = stoke_err_wrap(e, __FILE__, __LINE__, "step %lld", (long long)step + 1);
      break;
    }
    int log_now = (step + 1) % log_every == 0 || step + 1 == total || step == start_step;
    double loss = NAN;
    if (log_now) {
      if ((e = stoke_exec_read_loss(s.train.x, &loss))) break;
      if ((e = stoke_metrics_collect(s.metrics, s.steptime))) break; /* the step timers, after that sync */
      float amp[4];
      if (stoke_exec_read_scaler(s.train.x, amp)) stoke_metrics_scaler(s.metrics, amp[0], amp[3]);
      if (!isfinite(loss)) {
        e = STOKE_ERR(STOKE_E_NUMERIC,
                      "loss is %g at step %lld: training diverged; lower [optimizer] lr (now %g) "
                      "or check the data (the last checkpoint, if any, is %s)",
                      loss, (long long)step + 1, opt.lr, s.ckpt[0] ? s.ckpt : "none: checkpoints are off");
        good = -1; /* not over the last good checkpoint */
        break;
      }
    }
    if ((e = stoke_metrics_step(s.metrics, step + 1, epoch, host, wait, log_now, loss, opt.lr))) break;
    if ((e = check_log(&s, dir))) break;
    /* a signal reaches the ranks at different steps: they agree on when to
     * stop at the next logged step (already a sync), so all stop together */
    stop = stop_signal != 0;
    if (s.dp) {
      double any = stop;
      if (log_now && (e = stoke_dp_sum(s.dp, &any, 1))) break;
      stop = log_now && any > 0;
    }
    if (profile_ops && step == start_step + (o->time_warmup > 1 ? o->time_warmup - 1 : 0) &&
        (e = stoke_exec_profile(s.train.x, 1)))
      break;
    if (s.ckpt[0] && ckpt_every > 0 && (step + 1) % ckpt_every == 0 && step + 1 < total && !stop &&
        (e = save(&s, step + 1, epoch))) {
      good = -1; /* the same save again on the way out would fail the same way */
      break;
    }
    if (s.ckpt[0] && ckpt_every > 0 && (step + 1) % ckpt_every == 0) stoke_steptime_pause(s.steptime);
    int64_t done_batches = (step + 1) * accumulate;
    if (s.eval.x && eval_period > 0 && done_batches / eval_period != (done_batches - accumulate) / eval_period &&
        step + 1 < total && !stop) {
      e = evaluate(&s, sum);
      stoke_steptime_pause(s.steptime);
      if (e && e->code == STOKE_E_INTERRUPTED) {
        stoke_err_free(e);
        e = NULL;
        stop = 1;
      } else if (e || (e = stoke_metrics_eval(s.metrics, step + 1, epoch, sum->eval_loss, sum->eval_accuracy))) {
        break;
      }
    }
  }
  if (!e && s.trace && step >= mo.trace_first && step < mo.trace_last) /* the run ended inside the window */
    e = stoke_trace_write(s.trace);
  /* the last state is saved on every way out, then any error is reported;
   * signals are still caught: a save is never cut short by the first two */
  e = save_on_exit(&s, e, good, good_epoch, sum);
  if (!e && s.eval.x && !stop && !stop_signal) {
    e = evaluate(&s, sum);
    if (e && e->code == STOKE_E_INTERRUPTED) {
      stoke_err_free(e);
      e = NULL;
    } else if (!e) {
      e = stoke_metrics_eval(s.metrics, step, epoch, sum->eval_loss, sum->eval_accuracy);
    }
    e = note_saved(&s, e, good, sum);
  }
  stop |= stop_signal != 0;
  sum->interrupted = stop;
  if (!e && profile_ops) {
    if (o->op_rows) sum->n_op_rows = stoke_exec_profile_rows(s.train.x, o->op_rows, o->op_rows_cap);
    if (!o->quiet) stoke_exec_profile_report(s.train.x, stdout);
    snprintf(path, sizeof path, "%s/ops.txt", dir);
    e = write_checked(path, put_ops, s.train.x);
  }
  if (s.metrics && s.steptime && !e) e = stoke_metrics_collect(s.metrics, s.steptime); /* steps since the last log */
  stoke_metrics_summary(s.metrics, sum);
  sum->dev_alloc_mib = device_mib(&s);
  sum->steps = step;
  sum->samples = (step - start_step) * batch * accumulate * s.world;
  sum->skipped_samples = stoke_loader_skip_reasons(s.train.loader, sum->skip_reasons, sizeof sum->skip_reasons);
  sum->bad_samples = stoke_loader_bad_samples(s.train.loader);
  if (!e && s.dp) e = report_ranks(&s, sum, o->quiet);
  if (!e) e = stoke_metrics_close(s.metrics, sum, stop ? "interrupted" : "done");
  if (!e) e = check_log(&s, dir);
done:
  run_close(&s);
  signals_restore(&sg);
  return e;
}
