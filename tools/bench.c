/* tools/bench: the A/B bench. Runs the training step of a run.ini as two
 * variants (A with --a's overrides, B with --b's), interleaved A B A B ...,
 * each round a fresh stoke_train() run timed after its warm-up with the
 * device's timers, and reports samples/s per variant, B/A with a
 * confidence interval and, with --per-op, GPU time per op for both.
 * `bench --loader ...` is the loader-only mode (tools/bench_loader).
 * The statistics and reports are in bench_lib.c. Exit codes: 0 done,
 * 1 error, 2 usage. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stoke/core.h"
#include "stoke/run.h"
#include "tools/bench_lib.h"

/* The folder this binary is in (bench_loader and COMMIT sit there). */
static void exe_dir(char *out, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", out, cap - 1);
  out[n > 0 ? n : 0] = 0;
  char *slash = strrchr(out, '/');
  if (slash) *slash = 0;
  else snprintf(out, cap, ".");
}

/* `bench --loader ARGS`: hand over to bench_loader beside this binary. */
static int run_loader(int argc, char **argv, const char *dir) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/bench_loader", dir);
  argv[1] = path;
  execv(path, argv + 1);
  fprintf(stderr, "stoke: error: bench --loader: cannot run %s: %s (build //tools:bench_loader)\n", path,
          strerror(errno));
  (void)argc;
  return 1;
}

/* "word word ..." of n strings. */
static void join(const char *const *w, int n, char *out, size_t cap) {
  size_t used = 0;
  out[0] = 0;
  for (int i = 0; i < n && used < cap; i++)
    used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? " " : "", w[i]);
}

/* The value of the last "key=value" of w[0..n-1] with this key, or NULL. */
static const char *value_of(const char *const *w, int n, const char *key) {
  const char *v = NULL;
  size_t k = strlen(key);
  for (int i = 0; i < n; i++)
    if (!strncmp(w[i], key, k) && w[i][k] == '=') v = w[i] + k + 1;
  return v;
}

/* One run of variant v: a fresh stoke_train() with the bench's own keys
 * last, timed (or, with profile, the per-op run). */
static stoke_err *run_variant(const bench_args *a, int v, int profile, bench_variant *out, int *gpu) {
  const char *ov[2 * BENCH_MAX_OV + 8];
  int n = 0;
  for (int i = 0; i < a->n_common; i++) ov[n++] = a->common[i];
  for (int i = 0; i < a->n_ov[v]; i++) ov[n++] = a->ov[v][i];
  char steps[64], out_dir[PATH_MAX + 32];
  snprintf(steps, sizeof steps, "run.steps=%d", a->warmup + a->steps);
  ov[n++] = steps;
  ov[n++] = "run.checkpoint=false";
  ov[n++] = "run.progress=off";
  ov[n++] = profile ? "run.profile_ops=true" : "run.profile_ops=false";
  /* each variant writes to its own folder: <run.out_dir or
   * runs/bench_<ini name>>/<A|B>, unless its own overrides name one */
  if (!value_of(a->ov[v], a->n_ov[v], "run.out_dir")) {
    const char *base = value_of(a->common, a->n_common, "run.out_dir");
    if (base) snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/%c", base, 'A' + v);
    else {
      const char *name = strrchr(a->ini, '/');
      name = name ? name + 1 : a->ini;
      snprintf(out_dir, sizeof out_dir, "run.out_dir=runs/bench_%.*s/%c", (int)strcspn(name, "."), name, 'A' + v);
    }
    ov[n++] = out_dir;
  }
  stoke_run_opts o = {.ini_path = a->ini, .overrides = ov, .n_overrides = n, .quiet = 1,
                      .time_warmup = a->warmup, .time_steps = a->steps};
  if (profile) {
    o.op_rows = out->ops;
    o.op_rows_cap = BENCH_MAX_OPS;
  }
  stoke_summary s;
  STOKE_TRY(stoke_train(&o, &s), "bench: variant %c%s", 'A' + v, profile ? " (per-op profile run)" : "");
  if (s.interrupted) return STOKE_ERR(STOKE_E_INVALID, "bench: stopped by a signal");
  if (!(s.timed_ms > 0))
    return STOKE_ERR(STOKE_E_INTERNAL, "bench: variant %c: the timed steps were not timed", 'A' + v);
  snprintf(out->device, sizeof out->device, "%s", s.device);
  snprintf(out->precision, sizeof out->precision, "%s", s.precision);
  *gpu = s.gpu;
  out->batch = s.steps > 0 ? s.samples / s.steps : 0;
  out->first_loss = s.first_loss;
  out->final_loss = s.final_loss;
  if (profile) {
    out->n_ops = s.n_op_rows < BENCH_MAX_OPS ? s.n_op_rows : BENCH_MAX_OPS;
    return NULL;
  }
  out->power_w[out->n] = s.gpu_power_w;
  out->capped[out->n] = s.gpu_power_capped;
  out->rate[out->n++] = bench_rate(out->batch, a->steps, s.timed_ms);
  fprintf(stderr, "stoke bench: round %d/%d %c: %.0f samples/s (%d steps in %.3f ms)\n", out->n, a->rounds, 'A' + v,
          out->rate[out->n - 1], a->steps, s.timed_ms);
  return NULL;
}

/* A report written whole or not at all (stoke_write_begin/end: a temporary file renamed over `path`). */
static int write_file(const char *path, void (*fn)(const bench_result *, FILE *), const bench_result *r) {
  char tmp[4200];
  FILE *f;
  stoke_err *e = stoke_write_begin(path, "benchmark report", tmp, sizeof tmp, &f);
  if (!e) {
    fn(r, f);
    e = stoke_write_end(f, tmp, path, "benchmark report", NULL);
  }
  if (!e) return 0;
  fprintf(stderr, "stoke: error: %s\n", e->msg);
  stoke_err_free(e);
  return 1;
}

int main(int argc, char **argv) {
  /* `bazel run` starts us in the runfiles tree; paths the user typed are
   * relative to where they ran bazel. */
  const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
  if (cwd && chdir(cwd) != 0) {
    fprintf(stderr, "stoke: error: cannot enter %s\n", cwd);
    return 1;
  }
  char dir[PATH_MAX];
  exe_dir(dir, sizeof dir);
  if (argc > 1 && !strcmp(argv[1], "--loader")) return run_loader(argc, argv, dir);
  static bench_args a;
  char err[512];
  int rc = bench_parse_args(argc, argv, &a, err, sizeof err);
  if (rc) {
    if (rc < 0) fprintf(stderr, "stoke: error: %s\n", err);
    bench_usage(rc < 0 ? stderr : stdout);
    return rc < 0 ? 2 : 0;
  }
  static bench_result r;
  char common[1024];
  join(a.common, a.n_common, common, sizeof common);
  r.ini = a.ini;
  r.common = common;
  r.common_ov = a.common;
  r.n_common_ov = a.n_common;
  r.warmup = a.warmup;
  r.steps = a.steps;
  r.rounds = a.rounds;
  r.per_op = a.per_op;
  r.n_variants = a.variants;
  bench_commit(dir, r.commit, sizeof r.commit);
  time_t now = time(NULL);
  strftime(r.date, sizeof r.date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
  for (int v = 0; v < a.variants; v++) {
    snprintf(r.v[v].name, sizeof r.v[v].name, "%c", 'A' + v);
    join(a.ov[v], a.n_ov[v], r.v[v].overrides, sizeof r.v[v].overrides);
    memcpy(r.v[v].ov, a.ov[v], sizeof(const char *) * (size_t)a.n_ov[v]);
    r.v[v].n_ov = a.n_ov[v];
  }
  /* the rounds, interleaved; then the profile runs (synchronizing every
   * step, so never counted in the rates) */
  stoke_err *e = NULL;
  for (int i = 0; i < a.rounds && !e; i++) {
    /* the backends' notes once, from the first round (unless STOKE_LOG says) */
    if (i == 1 && !getenv("STOKE_LOG")) stoke_log_set_level(STOKE_LOG_WARN);
    for (int v = 0; v < a.variants && !e; v++) e = run_variant(&a, v, 0, &r.v[v], &r.gpu);
  }
  for (int v = 0; v < a.variants && a.per_op && !e; v++) e = run_variant(&a, v, 1, &r.v[v], &r.gpu);
  if (e) {
    fprintf(stderr, "stoke: error: %s\n", e->msg);
    stoke_err_free(e);
    return 1;
  }
  bench_print(&r, stdout);
  rc = 0;
  if (a.json) rc |= write_file(a.json, bench_write_json, &r);
  if (a.md) rc |= write_file(a.md, bench_write_md, &r);
  if (a.html) rc |= write_file(a.html, bench_write_html, &r);
  return rc;
}
