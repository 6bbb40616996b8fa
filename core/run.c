/* core/run.c: a training run as the INI file says, as a short list of
 * phases: the config and the plugins it names (stoke_run_setup, shared
 * with the bench), then setup (core/run_setup.c: folder, devices, data,
 * plans, metrics), the step loop (core/step_loop.c, with the checkpoints
 * of core/run_ckpt.c and the evaluations of core/run_eval.c between
 * steps) and the way out (core/run_summary.c: last save, last
 * evaluation, summary). What they share: core/run_state.h. */
#include <math.h>
#include <limits.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "stoke/core.h"
#include "stoke/registry.h"
#include "run_state.h"

/* --------------------------------------------------------- plugin setup */

/* Every part of `kind` that any plugin on the search path registers (a
 * plugin that would end the process that loads it is left out). */
static void list_available(stoke_registry *cur, const char *const *dirs, int n_dirs,
                           const char *kind, char *buf, size_t cap) {
  stoke_registry *r = NULL;
  buf[0] = 0;
  if (stoke_registry_new(&r)) return;
  for (int i = 0; i < n_dirs; i++) stoke_registry_add_path(r, dirs[i]);
  stoke_registry_load_every(r, cur, NULL);
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
    /* libstoke_<base>.so is there but would not load: that is the reason to show, not only "no such file" */
    if (e2 && e2->code != STOKE_E_NOT_FOUND)
      e = stoke_err_note(e, "libstoke_%s.so, which would hold '%s', did not load: %s", base, name, e2->msg);
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

/* [eval_data] does not inherit [data]'s keys. With the same source, a key
 * that shapes the samples set in [data] and left at its default in
 * [eval_data] evaluates on data made another way (a plugin source's
 * `spread`, say) without a word: warn. Keys that pick the split or the
 * augmentation (path, offset, order, flip, ...) are meant to differ. */
static void warn_eval_keys(const stoke_cfg *c, const stoke_source_v1 *s) {
  /* the same files in both (a path or a root given twice): evaluation on the training data */
  static const char *files[] = {"path", "root"};
  for (size_t j = 0; j < sizeof files / sizeof *files; j++) {
    const char *a = NULL, *b = NULL;
    for (int i = 0; i < s->n_keys; i++)
      if (!strcmp(s->keys[i].key, files[j]) && s->keys[i].type == STOKE_CFG_STR && !stoke_cfg_str(c, "data", files[j], &a) &&
          !stoke_cfg_str(c, "eval_data", files[j], &b) && a && b && a[0] && !strcmp(a, b))
        stoke_log(STOKE_LOG_WARN, "config",
                  "%s: [eval_data] %s = %s is [data]'s too: the evaluation scores the training data, which measures "
                  "memory, not generalization; point it at held-out data", stoke_cfg_where(c, "eval_data", files[j]),
                  files[j], b);
  }
  static const char *split[] = {"path",      "root",      "train",     "offset",    "length", "order",
                                "data_seed", "seed",      "flip",      "scale_min", "scale_max", "ratio_min",
                                "ratio_max", "resize",    "cache",     "max_readers", "augment", "shuffle"};
  for (int i = 0; i < s->n_keys; i++) {
    const char *k = s->keys[i].key;
    int skip = 0;
    for (size_t j = 0; j < sizeof split / sizeof *split && !skip; j++) skip = !strcmp(k, split[j]);
    if (skip || !stoke_cfg_is_set(c, "data", k) || stoke_cfg_is_set(c, "eval_data", k)) continue;
    stoke_log(STOKE_LOG_WARN, "config",
              "%s: [data] %s is set, [eval_data] (the same source, '%s') leaves it at its default%s%s: sections do "
              "not inherit keys, so evaluation reads samples made another way than training's; set it in "
              "[eval_data] too",
              stoke_cfg_where(c, "data", k), k, s->name, s->keys[i].def ? " " : "", s->keys[i].def ? s->keys[i].def : "");
  }
}

/* A part switched on the command line (optimizer.name=sgd over the INI's
 * adamw; eval_data.source= to turn evaluation off): the INI's keys of the
 * part it replaced (beta1, path) are left out, said, instead of failing as
 * unknown keys that no command line could unset. */
static void drop_switched_keys(stoke_cfg *c) {
  static const char *const parts[][2] = {{"model", "name"}, {"data", "source"}, {"eval_data", "source"},
                                         {"optimizer", "name"}};
  for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
    if (strcmp(stoke_cfg_where(c, parts[i][0], parts[i][1]), "command line")) continue;
    char dropped[1024];
    int n = stoke_cfg_drop_undeclared(c, parts[i][0], dropped, sizeof dropped);
    const char *now = "";
    stoke_err_free(stoke_cfg_str(c, parts[i][0], parts[i][1], &now));
    if (n)
      stoke_log(STOKE_LOG_WARN, "config",
                "command line: %s.%s = %s: the file's [%s] key%s of the part it replaces %s left out: %s",
                parts[i][0], parts[i][1], now[0] ? now : "(none)", parts[i][0], n == 1 ? "" : "s",
                n == 1 ? "is" : "are", dropped);
  }
}

stoke_err *stoke_run_setup(const stoke_run_opts *o, stoke_cfg **cfg_out, stoke_registry **reg_out) {
  stoke_cfg *c = stoke_cfg_new();
  stoke_registry *reg = NULL;
  stoke_err *e = NULL;
  const char *dirs[STOKE_CFG_MAX_LIST + 16];
  int n_dirs = 0;
  if (!c) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  STOKE_TRY_GOTO(e, fail, stoke_declare_core_keys(c), "declaring the core's config keys");
  STOKE_TRY_GOTO(e, fail, o->ini_text ? stoke_cfg_load_string(c, o->ini_path, o->ini_text) : stoke_cfg_load_file(c, o->ini_path),
                 "loading the config");
  if (!stoke_cfg_file_keys(c)) /* `train empty.ini` trains every default, which is seldom what was meant */
    stoke_log(STOKE_LOG_WARN, "config",
              "%s sets no key: every setting is its default (an mlp on synthetic data, the cpu backend); "
              "examples/quickstart.ini is a whole config to start from", o->ini_path);
  for (int i = 0; i < o->n_overrides; i++)
    STOKE_TRY_GOTO(e, fail, stoke_cfg_override(c, o->overrides[i]), "applying command-line overrides");
  /* [run], [plugins] and the sections' names now: a typo there ("paht = dir") said before it sends the
   * plugin search astray; the parts' sections once their keys are declared (stoke_cfg_validate below) */
  static const char *const part_sections[] = {"model", "data", "eval_data", "optimizer"};
  STOKE_TRY_GOTO(e, fail, stoke_cfg_validate_but(c, part_sections, 4), "checking the config");
  STOKE_TRY_GOTO(e, fail, stoke_registry_new(&reg), "");
  for (int i = 0; i < o->n_plugin_dirs && n_dirs < 16; i++) dirs[n_dirs++] = o->plugin_dirs[i];
  stoke_run_config rc; /* the names of the parts: all a config may say before their keys are declared */
  STOKE_TRY_GOTO(e, fail, stoke_run_config_names(c, &rc), "");
  /* a relative [plugins] path in the INI file is relative to the file's folder */
  static char rel[STOKE_CFG_MAX_LIST][PATH_MAX];
  const char *slash = strrchr(o->ini_path, '/');
  int from_file = strcmp(stoke_cfg_where(c, "plugins", "path"), "command line") != 0;
  for (int i = 0; i < rc.plugins.n_path; i++) {
    const char *p = rc.plugins.path[i];
    if (from_file && p[0] != '/' && slash) {
      snprintf(rel[i], sizeof rel[i], "%.*s/%s", (int)(slash - o->ini_path), o->ini_path, p);
      p = rel[i];
    }
    /* a folder that is not there would be skipped by the search, and a plugin of the same name found
     * elsewhere (the bundled one) used in its place without a word */
    struct stat st;
    int bad = stat(p, &st) ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (bad) {
      e = STOKE_ERR(STOKE_E_NOT_FOUND,
                    "%s: [plugins] path '%s': %s (%s); fix the path (a relative one in the INI file is relative to "
                    "the file's folder) or remove it",
                    stoke_cfg_where(c, "plugins", "path"), rc.plugins.path[i], p, strerror(bad));
      goto fail;
    }
    dirs[n_dirs++] = p;
  }
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
    if (!strcmp(name, rc.data.source)) warn_eval_keys(c, s);
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
  drop_switched_keys(c);
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

static void run_close(run_state *s) {
  stoke_dp_close(s->dp);
  stoke_steptime_free(s->steptime);
  stoke_trace_free(s->trace);
  stoke_metrics_free(s->metrics);
  stoke_nvml_close(s->nvml);
  run_stream_close(s, &s->eval); /* borrows the training executor's weights: first */
  run_stream_close(s, &s->train);
  run_close_engines(s);
  stoke_registry_free(s->reg);
  stoke_cfg_free(s->cfg);
  free(s->config_text);
  if (s->log) {
    stoke_log_set_file(NULL);
    fclose(s->log);
  }
  run_signals_restore(&s->sg);
}

stoke_err *stoke_train(const stoke_run_opts *o, stoke_summary *sum) {
  run_state s = {.opts = *o, .o = &s.opts, .sum = sum, .world = 1};
  run_signals_reset();
  memset(sum, 0, sizeof *sum);
  sum->eval_loss = sum->eval_accuracy = sum->timed_ms = NAN;
  sum->gpu_power_w = sum->gpu_power_capped = sum->gpu_sm_clock_mhz = sum->gpu_power_limit_w = NAN;
  sum->gpu_sm_clock_max_mhz = NAN;
  STOKE_PROPAGATE(stoke_run_setup(o, &s.cfg, &s.reg));
  stoke_err *e = run_read_config(&s);
  if (!e && o->dry_run) {
    e = run_dry(&s); /* the plan alone */
  } else if (!e) {
    e = run_open(&s);
    if (!e) e = run_finish(&s, run_steps(&s));
  }
  if (e && e->code != STOKE_E_INTERRUPTED) {
    /* out_dir keeps why the run failed: under a scheduler the terminal is often lost */
    stoke_metrics_error(s.metrics, s.sum, s.step, e->msg);
    if (s.log) fprintf(s.log, "stoke: error: %s\n", e->msg), fflush(s.log);
  }
  run_close(&s);
  return e;
}
