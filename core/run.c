/* core/run.c: a training run as the INI file says: strict config, plugin
 * loading by name, graph build and compile, the loader, the step loop
 * (loss read back only every log_every steps), metrics and the summary. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/loader.h"
#include "stoke/metrics.h"
#include "stoke/rng.h"
#include "stoke/run.h"

/* ------------------------------------------------------------ the keys */

static const stoke_cfg_key_v1 run_keys[] = {
    {"config_version", STOKE_CFG_INT, "1", 1, 1, NULL, "version of this config format (1)"},
    {"name", STOKE_CFG_STR, "", 0, 0, NULL, "run name (default: the INI file's name)"},
    {"backends", STOKE_CFG_LIST, "cpu", 0, 0, NULL,
     "ordered compute backends; each node runs on the first that has a kernel for it"},
    {"precision", STOKE_CFG_ENUM, "fp32", 0, 0, "fp32|tf32|bf16|fp16",
     "precision policy (the cpu backend runs fp32)"},
    {"comm", STOKE_CFG_STR, "single", 0, 0, NULL, "communication: single (one process)"},
    {"device_index", STOKE_CFG_INT, "0", 0, 1024, NULL, "which device of the backend"},
    {"steps", STOKE_CFG_INT, "0", 0, 1e15, NULL, "optimizer steps to run (0: use epochs)"},
    {"epochs", STOKE_CFG_FLOAT, "1", 0, 1e9, NULL, "passes over the training data when steps = 0"},
    {"accumulate", STOKE_CFG_INT, "1", 1, 1 << 20, NULL,
     "micro-batches per optimizer step (gradient accumulation)"},
    {"seed", STOKE_CFG_INT, "0", 0, 9.2e18, NULL, "seed of every random choice"},
    {"log_every", STOKE_CFG_INT, "10", 1, 1e12, NULL,
     "read the loss back and log every N steps (the only host sync)"},
    {"out_dir", STOKE_CFG_STR, "", 0, 0, NULL,
     "where config.ini, plan.txt and metrics.jsonl go (default runs/<name>)"},
    {"progress", STOKE_CFG_ENUM, "auto", 0, 0, "auto|bar|lines|off",
     "progress display: a bar on a terminal (auto), log lines, or nothing"},
};

static const stoke_cfg_key_v1 plugin_keys[] = {
    {"path", STOKE_CFG_LIST, "", 0, 0, NULL,
     "extra folders searched for libstoke_<name>.so, before STOKE_PLUGIN_PATH and the binary's folder"},
    {"load", STOKE_CFG_LIST, "", 0, 0, NULL, "extra plugins to load by name (e.g. swish: new ops)"},
};

static const stoke_cfg_key_v1 data_keys[] = {
    {"source", STOKE_CFG_STR, "synthetic", 0, 0, NULL, "data source plugin: synthetic, ..."},
    {"batch_size", STOKE_CFG_INT, "128", 1, 1 << 24, NULL, "samples per micro-batch"},
    {"workers", STOKE_CFG_INT, "2", 1, 1024, NULL, "loader worker threads"},
    {"prefetch", STOKE_CFG_INT, "4", 1, 1024, NULL, "batches prepared ahead (ring of pinned buffers)"},
    {"shuffle", STOKE_CFG_BOOL, "true", 0, 0, NULL, "reshuffle every epoch (seeded by seed, epoch)"},
    {"drop_last", STOKE_CFG_BOOL, "true", 0, 0, NULL, "drop the last incomplete batch of an epoch"},
};

static const stoke_cfg_key_v1 model_keys[] = {
    {"name", STOKE_CFG_STR, "mlp", 0, 0, NULL, "model builder plugin: mlp, ..."},
};

static const stoke_cfg_key_v1 loss_keys[] = {
    {"label_smoothing", STOKE_CFG_FLOAT, "0", 0, 0.999, NULL, "as nn.CrossEntropyLoss(label_smoothing)"},
};

static const stoke_cfg_key_v1 optimizer_keys[] = {
    {"name", STOKE_CFG_ENUM, "sgd", 0, 0, "sgd|adamw", "torch.optim.SGD or torch.optim.AdamW"},
    {"lr", STOKE_CFG_FLOAT, "0.01", 0, 1e6, NULL, "learning rate"},
    {"momentum", STOKE_CFG_FLOAT, "0.9", 0, 1, NULL, "SGD momentum (0: plain SGD)"},
    {"nesterov", STOKE_CFG_BOOL, "false", 0, 0, NULL, "SGD Nesterov momentum"},
    {"weight_decay", STOKE_CFG_FLOAT, "0", 0, 1e3, NULL,
     "L2 penalty (SGD) or decoupled weight decay (AdamW)"},
    {"beta1", STOKE_CFG_FLOAT, "0.9", 0, 1, NULL, "AdamW beta1"},
    {"beta2", STOKE_CFG_FLOAT, "0.999", 0, 1, NULL, "AdamW beta2"},
    {"eps", STOKE_CFG_FLOAT, "1e-8", 0, 1, NULL, "AdamW epsilon"},
};

#define DECLARE(c, sec, help, keys) stoke_cfg_declare(c, sec, help, keys, (int)(sizeof keys / sizeof *keys))

stoke_err *stoke_declare_core_keys(stoke_cfg *c) {
  STOKE_PROPAGATE(DECLARE(c, "run", "the run: backends, precision, length, seed, logging", run_keys));
  STOKE_PROPAGATE(DECLARE(c, "plugins", "where plugins are found and extra ones to load", plugin_keys));
  STOKE_PROPAGATE(DECLARE(c, "data", "training data: the source and the loader; the source's own keys go here too", data_keys));
  STOKE_PROPAGATE(DECLARE(c, "model", "the model builder; its own keys go here too", model_keys));
  STOKE_PROPAGATE(DECLARE(c, "loss", "softmax cross-entropy on the model's logits", loss_keys));
  STOKE_PROPAGATE(DECLARE(c, "optimizer", "the optimizer, updating the flat parameter buffer", optimizer_keys));
  return NULL;
}

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

/* Load the plugin `name` for a part of `kind` and check it registered it. */
static stoke_err *load_part(stoke_registry *reg, const stoke_cfg *c, const char *sec, const char *key,
                            const char *kind, const char *name, const char *const *dirs, int n_dirs) {
  stoke_err *e = stoke_registry_load(reg, name);
  const void *found = NULL;
  if (!e) {
    if (!strcmp(kind, "backend")) found = stoke_find_backend(reg, name);
    else if (!strcmp(kind, "model")) found = stoke_find_model(reg, name);
    else if (!strcmp(kind, "source")) found = stoke_find_source(reg, name);
    if (found) return NULL;
  }
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
  const char *list[STOKE_CFG_MAX_LIST];
  int n = 0;
  STOKE_TRY_GOTO(e, fail, stoke_cfg_list(c, "plugins", "path", list, &n), "");
  for (int i = 0; i < n; i++) dirs[n_dirs++] = list[i];
  for (int i = 0; i < n_dirs; i++) stoke_registry_add_path(reg, dirs[i]);

  STOKE_TRY_GOTO(e, fail, stoke_cfg_list(c, "plugins", "load", list, &n), "");
  for (int i = 0; i < n; i++)
    STOKE_TRY_GOTO(e, fail, stoke_registry_load(reg, list[i]), "%s: [plugins] load = %s",
                   stoke_cfg_where(c, "plugins", "load"), list[i]);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_list(c, "run", "backends", list, &n), "");
  if (n == 0) {
    e = STOKE_ERR(STOKE_E_INVALID, "%s: [run] backends is empty; name at least one, e.g. cpu",
                  stoke_cfg_where(c, "run", "backends"));
    goto fail;
  }
  for (int i = 0; i < n; i++)
    STOKE_TRY_GOTO(e, fail, load_part(reg, c, "run", "backends", "backend", list[i], dirs, n_dirs), "");
  const char *name;
  STOKE_TRY_GOTO(e, fail, stoke_cfg_str(c, "model", "name", &name), "");
  STOKE_TRY_GOTO(e, fail, load_part(reg, c, "model", "name", "model", name, dirs, n_dirs), "");
  const stoke_model_v1 *m = stoke_find_model(reg, name);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_declare(c, "model", NULL, m->keys, m->n_keys),
                 "declaring the keys of model '%s'", name);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_str(c, "data", "source", &name), "");
  STOKE_TRY_GOTO(e, fail, load_part(reg, c, "data", "source", "source", name, dirs, n_dirs), "");
  const stoke_source_v1 *s = stoke_find_source(reg, name);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_declare(c, "data", NULL, s->keys, s->n_keys),
                 "declaring the keys of source '%s'", name);
  STOKE_TRY_GOTO(e, fail, stoke_cfg_str(c, "run", "comm", &name), "");
  if (!stoke_find_comm(reg, name)) {
    char names[256];
    stoke_registry_names(reg, "comm", names, sizeof names);
    e = STOKE_ERR(STOKE_E_NOT_FOUND, "%s: [run] comm: unknown comm '%s'; comms available: %s",
                  stoke_cfg_where(c, "run", "comm"), name, names);
    goto fail;
  }
  STOKE_TRY_GOTO(e, fail, stoke_cfg_validate(c), "checking the config");
  *cfg_out = c;
  *reg_out = reg;
  return NULL;
fail:
  stoke_registry_free(reg);
  stoke_cfg_free(c);
  return e;
}

stoke_err *stoke_help_config(const char *const *plugin_dirs, int n_plugin_dirs, FILE *f) {
  stoke_cfg *c = stoke_cfg_new();
  if (!c) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  stoke_err *e = stoke_declare_core_keys(c);
  if (e) {
    stoke_cfg_free(c);
    return e;
  }
  fprintf(f, "stoke run configuration: every section and key, with type, default and help.\n"
             "Set keys in the INI file or on the command line as section.key=value.\n\n");
  stoke_cfg_help(c, f);
  stoke_cfg_free(c);
  /* the keys of every model and source plugin on the search path */
  stoke_registry *r = NULL;
  STOKE_PROPAGATE(stoke_registry_new(&r));
  for (int i = 0; i < n_plugin_dirs; i++) stoke_registry_add_path(r, plugin_dirs[i]);
  char files[2048];
  stoke_registry_available(r, files, sizeof files);
  for (char *save = NULL, *t = strtok_r(files, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
    stoke_err_free(stoke_registry_load(r, t));
  static const char *kinds[] = {"model", "source"};
  for (int k = 0; k < 2; k++) {
    char names[1024];
    stoke_registry_names(r, kinds[k], names, sizeof names);
    for (char *save = NULL, *t = strtok_r(names, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
      const stoke_cfg_key_v1 *keys = NULL;
      int n = 0;
      const char *help = "";
      if (k == 0) {
        const stoke_model_v1 *m = stoke_find_model(r, t);
        keys = m->keys, n = m->n_keys, help = m->help;
      } else {
        const stoke_source_v1 *s = stoke_find_source(r, t);
        keys = s->keys, n = s->n_keys, help = s->help;
      }
      stoke_cfg *pc = stoke_cfg_new();
      if (!pc) break;
      const char *sec = k == 0 ? "model" : "data";
      char sh[256];
      snprintf(sh, sizeof sh, "with %s = %s: %s", k == 0 ? "name" : "source", t, help);
      stoke_err_free(stoke_cfg_declare(pc, sec, sh, keys, n));
      fprintf(f, "\n");
      stoke_cfg_help(pc, f);
      stoke_cfg_free(pc);
    }
  }
  stoke_registry_free(r);
  return NULL;
}

/* --------------------------------------------------------------- train */

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { stop_signal = sig; }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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

typedef struct run_state {
  stoke_cfg *cfg;
  stoke_registry *reg;
  const char *engines[STOKE_CFG_MAX_LIST];
  void *selves[STOKE_CFG_MAX_LIST];
  const stoke_backend_v1 *backs[STOKE_CFG_MAX_LIST];
  int n_engines, n_open;
  const stoke_backend_v1 *dev;
  void *dev_self;
  const stoke_source_v1 *src;
  void *src_self;
  stoke_graph *g;
  stoke_plan *plan;
  stoke_exec *x;
  stoke_loader *loader;
  stoke_metrics *metrics;
  FILE *log;
} run_state;

static void run_close(run_state *s) {
  stoke_metrics_free(s->metrics);
  stoke_loader_free(s->loader);
  stoke_exec_free(s->x);
  stoke_plan_free(s->plan);
  stoke_graph_free(s->g);
  if (s->src_self) s->src->close(s->src_self);
  for (int i = s->n_open - 1; i >= 0; i--)
    if (s->backs[i]->close) s->backs[i]->close(s->selves[i]);
  stoke_registry_free(s->reg);
  stoke_cfg_free(s->cfg);
  if (s->log) {
    stoke_log_set_file(NULL);
    fclose(s->log);
  }
}

/* Open the engines in order; the first that owns a device provides memory. */
static stoke_err *open_backends(run_state *s) {
  int64_t dev_index;
  STOKE_PROPAGATE(stoke_cfg_int(s->cfg, "run", "device_index", &dev_index));
  STOKE_PROPAGATE(stoke_cfg_list(s->cfg, "run", "backends", s->engines, &s->n_engines));
  for (int i = 0; i < s->n_engines; i++) {
    s->backs[i] = stoke_find_backend(s->reg, s->engines[i]);
    if (!s->backs[i]->device_engine && !s->dev) s->dev = s->backs[i];
  }
  if (!s->dev)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [run] backends: none of the backends owns a device (cpu or cuda); add one",
                     stoke_cfg_where(s->cfg, "run", "backends"));
  void *dev_self = NULL;
  for (int i = 0; i < s->n_engines; i++) {
    const stoke_backend_v1 *b = s->backs[i];
    if (b->device_engine && strcmp(b->device_engine, s->dev->name))
      return STOKE_ERR(STOKE_E_INVALID, "%s: [run] backends: '%s' runs on '%s', which is not first",
                       stoke_cfg_where(s->cfg, "run", "backends"), b->name, b->device_engine);
    if (b->device != s->dev->device)
      return STOKE_ERR(STOKE_E_INVALID, "[run] backends: '%s' and '%s' are on different devices",
                       b->name, s->dev->name);
    STOKE_TRY(b->open ? b->open((int)dev_index, b == s->dev ? NULL : dev_self, &s->selves[i]) : NULL,
              "opening backend '%s' on device %lld", b->name, (long long)dev_index);
    s->n_open = i + 1;
    if (b == s->dev) dev_self = s->dev_self = s->selves[i];
  }
  return NULL;
}

static stoke_err *build_graph(run_state *s, int64_t batch, stoke_dtype dtype) {
  stoke_sample_info_v1 info;
  STOKE_TRY(s->src->info(s->src_self, &info), "source '%s'", s->src->name);
  if (info.dtype != STOKE_F32)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "source '%s' gives non-float samples; this build feeds f32 only",
                     s->src->name);
  STOKE_PROPAGATE(stoke_graph_new(s->reg, dtype, STOKE_LAYOUT_ANY, &s->g));
  stoke_shape xs = {info.shape.ndim + 1, {batch}};
  for (int i = 0; i < info.shape.ndim; i++) xs.d[i + 1] = info.shape.d[i];
  int x, y, logits;
  STOKE_PROPAGATE(stoke_graph_input(s->g, "input", STOKE_VAL_INPUT, &xs, dtype, &x));
  STOKE_PROPAGATE(stoke_graph_input(s->g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {batch}}, STOKE_I32, &y));
  const char *mname;
  STOKE_PROPAGATE(stoke_cfg_str(s->cfg, "model", "name", &mname));
  const stoke_model_v1 *m = stoke_find_model(s->reg, mname);
  stoke_builder_v1 b = stoke_graph_builder(s->g);
  STOKE_TRY(m->build(s->cfg, "model", &b, x, info.classes, &logits), "building model '%s'", mname);
  stoke_shape ls = s->g->values[logits].shape;
  if (ls.ndim != 2 || ls.d[0] != batch || ls.d[1] != info.classes)
    return STOKE_ERR(STOKE_E_INVALID, "model '%s' must give logits [%lld, %lld]", mname,
                     (long long)batch, (long long)info.classes);
  double smoothing;
  STOKE_PROPAGATE(stoke_cfg_float(s->cfg, "loss", "label_smoothing", &smoothing));
  char attrs[64];
  snprintf(attrs, sizeof attrs, "label_smoothing=%.17g", smoothing);
  STOKE_PROPAGATE(stoke_graph_loss(s->g, logits, attrs));
  return NULL;
}

stoke_err *stoke_train(const stoke_run_opts *o, stoke_summary *sum) {
  run_state s = {0};
  stoke_err *e = NULL;
  memset(sum, 0, sizeof *sum);
  STOKE_PROPAGATE(stoke_run_setup(o, &s.cfg, &s.reg));
  stoke_cfg *c = s.cfg;

  /* -- the run's folder, its resolved config and log */
  const char *name, *out_dir, *progress, *prec_name, *opt_name;
  int64_t seed, steps, accumulate, log_every, batch, workers, prefetch;
  double epochs;
  int shuffle, drop_last;
  stoke_opt_args_v1 opt = {0};
#define GET(fn, sec, key, out) STOKE_TRY_GOTO(e, done, fn(c, sec, key, out), "")
  GET(stoke_cfg_str, "run", "name", &name);
  GET(stoke_cfg_str, "run", "out_dir", &out_dir);
  GET(stoke_cfg_str, "run", "progress", &progress);
  GET(stoke_cfg_str, "run", "precision", &prec_name);
  GET(stoke_cfg_int, "run", "seed", &seed);
  GET(stoke_cfg_int, "run", "steps", &steps);
  GET(stoke_cfg_float, "run", "epochs", &epochs);
  GET(stoke_cfg_int, "run", "accumulate", &accumulate);
  GET(stoke_cfg_int, "run", "log_every", &log_every);
  GET(stoke_cfg_int, "data", "batch_size", &batch);
  GET(stoke_cfg_int, "data", "workers", &workers);
  GET(stoke_cfg_int, "data", "prefetch", &prefetch);
  GET(stoke_cfg_bool, "data", "shuffle", &shuffle);
  GET(stoke_cfg_bool, "data", "drop_last", &drop_last);
  GET(stoke_cfg_str, "optimizer", "name", &opt_name);
  GET(stoke_cfg_float, "optimizer", "lr", &opt.lr);
  GET(stoke_cfg_float, "optimizer", "momentum", &opt.momentum);
  GET(stoke_cfg_bool, "optimizer", "nesterov", &opt.nesterov);
  GET(stoke_cfg_float, "optimizer", "weight_decay", &opt.weight_decay);
  GET(stoke_cfg_float, "optimizer", "beta1", &opt.beta1);
  GET(stoke_cfg_float, "optimizer", "beta2", &opt.beta2);
  GET(stoke_cfg_float, "optimizer", "eps", &opt.eps);
#undef GET
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
  snprintf(sum->out_dir, sizeof sum->out_dir, "%s", dir);
  STOKE_TRY_GOTO(e, done, mkdir_p(dir), "[run] out_dir");
  char path[640];
  snprintf(path, sizeof path, "%s/config.ini", dir);
  FILE *f = fopen(path, "w");
  if (!f) {
    e = STOKE_ERR(STOKE_E_IO, "cannot write '%s': %s", path, strerror(errno));
    goto done;
  }
  stoke_cfg_dump(c, f);
  fclose(f);
  snprintf(path, sizeof path, "%s/log.txt", dir);
  s.log = fopen(path, "w");
  if (s.log) stoke_log_set_file(s.log);
  if (!o->quiet) {
    printf("stoke: run '%s', resolved config (saved to %s/config.ini):\n", run_name, dir);
    stoke_cfg_dump(c, stdout);
  }

  /* -- devices, precision, data, graph, plan */
  STOKE_TRY_GOTO(e, done, open_backends(&s), "");
  const stoke_precision_v1 *prec = stoke_find_precision(s.reg, prec_name);
  if (s.dev->device == STOKE_DEV_CPU && prec->param_dtype != STOKE_F32) {
    e = STOKE_ERR(STOKE_E_UNSUPPORTED, "%s: [run] precision = %s needs a GPU backend; the cpu backend runs fp32",
                  stoke_cfg_where(c, "run", "precision"), prec_name);
    goto done;
  }
  const char *src_name;
  STOKE_TRY_GOTO(e, done, stoke_cfg_str(c, "data", "source", &src_name), "");
  s.src = stoke_find_source(s.reg, src_name);
  STOKE_TRY_GOTO(e, done, s.src->open(c, "data", &s.src_self), "opening data source '%s'", src_name);
  STOKE_TRY_GOTO(e, done, build_graph(&s, batch, prec->param_dtype), "");
  stoke_plan_opts po = {s.engines, s.n_engines, s.selves, opt_name, 1};
  STOKE_TRY_GOTO(e, done, stoke_compile(s.g, &po, &s.plan), "compiling the graph");
  STOKE_TRY_GOTO(e, done, stoke_exec_new(s.plan, s.dev, s.dev_self, (uint64_t)seed, &s.x), "preparing the plan");
  snprintf(path, sizeof path, "%s/plan.txt", dir);
  if ((f = fopen(path, "w"))) {
    stoke_plan_report(s.plan, f);
    fclose(f);
  }
  if (!o->quiet) stoke_plan_report(s.plan, stdout);

  stoke_loader_opts lo = {s.src, s.src_self, s.dev, s.dev_self, batch, (int)workers, (int)prefetch,
                          shuffle, drop_last, (uint64_t)seed, 0, 1};
  STOKE_TRY_GOTO(e, done, stoke_loader_new(&lo, &s.loader), "starting the loader");
  int64_t per_epoch = stoke_loader_batches_per_epoch(s.loader);
  int64_t total = steps > 0 ? steps : (int64_t)ceil(epochs * (double)per_epoch / (double)accumulate);
  if (total < 1) total = 1;
  sum->flops_per_step = s.plan->train_flops * (double)accumulate;

  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  stoke_metrics_opts mo = {path, !strcmp(progress, "off") || o->quiet ? STOKE_PROGRESS_OFF
                                 : !strcmp(progress, "bar")            ? STOKE_PROGRESS_BAR
                                 : !strcmp(progress, "lines")          ? STOKE_PROGRESS_LINES
                                 : isatty(2)                           ? STOKE_PROGRESS_BAR
                                                                       : STOKE_PROGRESS_LINES,
                           total, batch * accumulate, o->quiet};
  STOKE_TRY_GOTO(e, done, stoke_metrics_new(&mo, &s.metrics), "");

  /* -- the step loop */
  stop_signal = 0;
  struct sigaction sa = {0}, old_int, old_term;
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  size_t xbytes = stoke_loader_sample_bytes(s.loader) * (size_t)batch;
  int64_t step;
  for (step = 0; step < total && !stop_signal; step++) {
    double t0 = now_s(), wait = 0;
    int64_t epoch = 0;
    for (int64_t micro = 0; micro < accumulate && !e; micro++) {
      stoke_batch *b;
      double w;
      e = stoke_loader_next(s.loader, &b, &w);
      wait += w;
      if (!e) e = s.dev->copy(s.dev_self, stoke_exec_input(s.x), b->x, xbytes, STOKE_COPY_H2D, NULL);
      if (!e) e = s.dev->copy(s.dev_self, stoke_exec_labels(s.x), b->labels, sizeof(int32_t) * (size_t)batch,
                              STOKE_COPY_H2D, NULL);
      epoch = b->epoch;
      stoke_loader_release(s.loader, b);
      if (!e) e = stoke_exec_forward_backward(s.x, micro == 0, stoke_hash3((uint64_t)seed, (uint64_t)step, (uint64_t)micro));
    }
    opt.step = step + 1;
    opt.grad_scale = 1.0 / (double)accumulate;
    if (!e) e = stoke_exec_update(s.x, &opt);
    if (e) {
      e = stoke_err_wrap(e, __FILE__, __LINE__, "step %lld", (long long)step + 1);
      break;
    }
    int log_now = (step + 1) % log_every == 0 || step + 1 == total || step == 0;
    double loss = NAN;
    if (log_now) {
      e = stoke_exec_read_loss(s.x, &loss);
      if (e) break;
      if (!isfinite(loss)) {
        e = STOKE_ERR(STOKE_E_NUMERIC,
                      "loss is %g at step %lld: training diverged; lower [optimizer] lr (now %g) "
                      "or check the data",
                      loss, (long long)step + 1, opt.lr);
        break;
      }
    }
    stoke_metrics_step(s.metrics, step + 1, epoch, now_s() - t0, wait, log_now, loss, opt.lr);
  }
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  stoke_metrics_summary(s.metrics, sum);
  sum->steps = step;
  sum->samples = step * batch * accumulate;
  sum->flops_per_step = s.plan->train_flops * (double)accumulate;
  sum->skipped_samples = stoke_loader_skipped(s.loader);
  sum->interrupted = stop_signal != 0;
  if (!e) stoke_metrics_close(s.metrics, sum, stop_signal ? "interrupted" : "done");
done:
  run_close(&s);
  return e;
}
