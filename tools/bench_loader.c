/* tools/bench_loader: the loader-only mode of the bench: how many images a
 * second the [data] source of a run.ini delivers through the loader engine
 * at each worker count, with no model and no training step.
 *
 *   bench_loader run.ini [--workers 1,2,4,8,16] [--batches 40] [--warmup 5]
 *                        [--json FILE] [section.key=value ...]
 *
 * Per worker count: a fresh loader (the run's seed, shuffle, drop_last and
 * prefetch), --warmup batches taken and given back untimed, then --batches
 * timed with the monotonic clock. The consumer does nothing with a batch,
 * so the data wait is the whole cost of a batch that the workers have not
 * filled yet. Exit codes: 0 done, 1 error, 2 usage. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/loader.h"
#include "stoke/registry.h"
#include "stoke/run.h"

#define MAX_COUNTS 64

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_loader RUN.INI [--workers 1,2,4,8,16] [--batches 40] [--warmup 5] [--json FILE]\n"
          "                    [section.key=value ...]\n"
          "\n"
          "Times the loader alone on the run's [data] source (batch_size must be a number,\n"
          "not auto): for each worker count, --warmup batches untimed, then --batches timed.\n"
          "Prints images/s, images/s per worker, the mean data wait per batch (the time\n"
          "stoke_loader_next blocked) and the samples skipped, then the best worker count.\n"
          "--json FILE also writes one JSON object per worker count to FILE.\n"
          "The pinned batch buffers come from the first backend of [run] backends that owns\n"
          "a device (the cpu backend when device = auto and that one cannot open).\n"
          "Exit codes: 0 done, 1 error, 2 usage.\n");
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct result {
  int workers;
  int64_t images;
  double seconds, images_per_s, wait_ms_mean, wait_ms_max;
  int64_t skipped;
} result;

typedef struct bench {
  stoke_cfg *cfg;
  stoke_registry *reg;
  const stoke_source_v1 *src;
  void *src_self;
  const stoke_backend_v1 *dev;
  void *dev_self;
  int64_t batch, prefetch, seed;
  int shuffle, drop_last;
} bench;

/* [data] batch_size: a positive integer ("auto" needs a model plan, which
 * this bench does not make). */
static stoke_err *batch_of(const stoke_cfg *c, int64_t *batch) {
  const char *v;
  STOKE_PROPAGATE(stoke_cfg_str(c, "data", "batch_size", &v));
  if (!strcmp(v, "auto"))
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [data] batch_size = auto: the loader bench has no model to size a batch by; give a number "
                     "(e.g. data.batch_size=256)",
                     stoke_cfg_where(c, "data", "batch_size"));
  char *end;
  errno = 0;
  long long b = strtoll(v, &end, 10);
  if (errno || end == v || *end || b < 1 || b > (1 << 24))
    return STOKE_ERR(STOKE_E_INVALID, "%s: [data] batch_size = '%s': a number of samples (1 to 16777216)",
                     stoke_cfg_where(c, "data", "batch_size"), v);
  *batch = b;
  return NULL;
}

/* The first backend of [run] backends that owns a device; with device =
 * auto, the cpu backend when it cannot open (no GPU here). */
static stoke_err *open_device(bench *b) {
  const char *list[STOKE_CFG_MAX_LIST], *device;
  int n = 0;
  int64_t index;
  STOKE_PROPAGATE(stoke_cfg_list(b->cfg, "run", "backends", list, &n));
  STOKE_PROPAGATE(stoke_cfg_str(b->cfg, "run", "device", &device));
  STOKE_PROPAGATE(stoke_cfg_int(b->cfg, "run", "device_index", &index));
  for (int i = 0; i < n && !b->dev; i++) {
    const stoke_backend_v1 *be = stoke_find_backend(b->reg, list[i]);
    if (be && !be->device_engine) b->dev = be;
  }
  if (!b->dev)
    return STOKE_ERR(STOKE_E_INVALID, "%s: [run] backends: none of the backends owns a device (cpu or cuda); add one",
                     stoke_cfg_where(b->cfg, "run", "backends"));
  stoke_err *e = b->dev->open ? b->dev->open((int)index, NULL, &b->dev_self) : NULL;
  if (!e) return NULL;
  if (strcmp(device, "auto") || !strcmp(b->dev->name, "cpu"))
    return stoke_err_wrap(e, __FILE__, __LINE__, "opening backend '%s' on device %lld", b->dev->name, (long long)index);
  stoke_log(STOKE_LOG_WARN, "bench_loader", "%s; [run] device = auto: using the cpu backend's host memory", e->msg);
  stoke_err_free(e);
  b->dev = NULL;
  b->dev_self = NULL;
  STOKE_TRY(stoke_registry_load(b->reg, "cpu"), "falling back to the cpu backend");
  b->dev = stoke_find_backend(b->reg, "cpu");
  if (!b->dev) return STOKE_ERR(STOKE_E_NOT_FOUND, "the cpu backend plugin registers no backend 'cpu'");
  STOKE_TRY(b->dev->open ? b->dev->open(0, NULL, &b->dev_self) : NULL, "opening backend 'cpu'");
  return NULL;
}

static stoke_err *bench_open(bench *b, const stoke_run_opts *o) {
  STOKE_PROPAGATE(stoke_run_setup(o, &b->cfg, &b->reg));
  const char *src_name;
  STOKE_PROPAGATE(stoke_cfg_str(b->cfg, "data", "source", &src_name));
  STOKE_PROPAGATE(batch_of(b->cfg, &b->batch));
  STOKE_PROPAGATE(stoke_cfg_int(b->cfg, "data", "prefetch", &b->prefetch));
  STOKE_PROPAGATE(stoke_cfg_bool(b->cfg, "data", "shuffle", &b->shuffle));
  STOKE_PROPAGATE(stoke_cfg_bool(b->cfg, "data", "drop_last", &b->drop_last));
  STOKE_PROPAGATE(stoke_cfg_int(b->cfg, "run", "seed", &b->seed));
  b->src = stoke_find_source(b->reg, src_name);
  if (!b->src) return STOKE_ERR(STOKE_E_NOT_FOUND, "[data] source '%s' is not registered", src_name);
  STOKE_TRY(b->src->open(b->cfg, "data", &b->src_self), "opening [data] source '%s'", src_name);
  STOKE_PROPAGATE(open_device(b));
  return NULL;
}

static void bench_close(bench *b) {
  if (b->src && b->src_self && b->src->close) b->src->close(b->src_self);
  if (b->dev && b->dev_self && b->dev->close) b->dev->close(b->dev_self);
  stoke_registry_free(b->reg);
  stoke_cfg_free(b->cfg);
}

/* One worker count: warm-up, then the timed batches. */
static stoke_err *bench_workers(const bench *b, int workers, int warmup, int batches, result *r) {
  stoke_loader_opts lo = {b->src, b->src_self, b->dev, b->dev_self, b->batch, workers, (int)b->prefetch,
                          b->shuffle, b->drop_last, (uint64_t)b->seed, 0, 1, 0, NULL, 0};
  stoke_loader *l = NULL;
  STOKE_TRY(stoke_loader_new(&lo, &l), "starting the loader with %d workers", workers);
  stoke_err *e = NULL;
  double wait = 0, wait_max = 0, t0 = 0;
  int64_t images = 0;
  for (int i = 0; i < warmup + batches && !e; i++) {
    if (i == warmup) t0 = now_s();
    stoke_batch *bt = NULL;
    double w = 0;
    e = stoke_loader_next(l, &bt, &w);
    if (e) {
      e = stoke_err_wrap(e, __FILE__, __LINE__, "batch %d with %d workers", i, workers);
      break;
    }
    if (i >= warmup) {
      wait += w;
      if (w > wait_max) wait_max = w;
      images += bt->n;
    }
    stoke_loader_release(l, bt);
  }
  double t1 = now_s();
  r->skipped = stoke_loader_skipped(l);
  stoke_loader_free(l);
  if (e) return e;
  r->workers = workers;
  r->images = images;
  r->seconds = t1 - t0;
  r->images_per_s = r->seconds > 0 ? (double)images / r->seconds : 0;
  r->wait_ms_mean = batches ? 1e3 * wait / batches : 0;
  r->wait_ms_max = 1e3 * wait_max;
  return NULL;
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

/* --------------------------------------------------------------- main */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "bench_loader: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nrun `bench_loader --help` for usage\n");
  va_end(ap);
  return 2;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* "1,2,4,8,16" */
static int parse_counts(const char *s, int *out, int *n) {
  char buf[512];
  if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return -1;
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    while (*t == ' ') t++;
    long v;
    if (*n == MAX_COUNTS || parse_int(t, 1, 1024, &v)) return -1;
    out[(*n)++] = (int)v;
  }
  return *n ? 0 : -1;
}

static int report(stoke_err *e) {
  fprintf(stderr, "bench_loader: error: %s\n", e->msg);
  stoke_err_free(e);
  return 1;
}

int main(int argc, char **argv) {
  /* `bazel run` starts us in the runfiles tree; paths the user typed are
   * relative to where they ran bazel. */
  const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
  if (cwd && chdir(cwd) != 0) {
    fprintf(stderr, "bench_loader: error: cannot enter %s: %s\n", cwd, strerror(errno));
    return 1;
  }
  const char *ini = NULL, *workers_s = "1,2,4,8,16", *batches_s = "40", *warmup_s = "5", *json = NULL;
  const char **overrides = calloc((size_t)argc + 1, sizeof *overrides);
  if (!overrides) return 1;
  int n_over = 0;
  struct {
    const char *name;
    const char **value;
  } opts[] = {{"--workers", &workers_s}, {"--batches", &batches_s}, {"--warmup", &warmup_s}, {"--json", &json}};
  const int n_opts = (int)(sizeof opts / sizeof opts[0]);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      free(overrides);
      return 0;
    }
    if (!strncmp(a, "--", 2)) {
      const char *eq = strchr(a, '=');
      size_t len = eq ? (size_t)(eq - a) : strlen(a);
      int k = 0;
      while (k < n_opts && !(strlen(opts[k].name) == len && !strncmp(opts[k].name, a, len))) k++;
      if (k == n_opts) {
        free(overrides);
        return usage_error("unknown option '%.*s'", (int)len, a);
      }
      if (eq) *opts[k].value = eq + 1;
      else if (i + 1 < argc) *opts[k].value = argv[++i];
      else {
        free(overrides);
        return usage_error("%s needs a value", opts[k].name);
      }
    } else if (strchr(a, '=')) {
      overrides[n_over++] = a;
    } else if (!ini) {
      ini = a;
    } else {
      free(overrides);
      return usage_error("unexpected argument '%s' (one RUN.INI; overrides are section.key=value)", a);
    }
  }
  if (!ini) {
    free(overrides);
    usage(stderr);
    return 2;
  }
  int counts[MAX_COUNTS], n_counts = 0;
  long batches, warmup;
  int bad = 0;
  if (parse_counts(workers_s, counts, &n_counts))
    bad = usage_error("--workers '%s': expected a comma-separated list of 1 to 1024", workers_s);
  else if (parse_int(batches_s, 1, 1000000, &batches))
    bad = usage_error("--batches '%s': expected 1 to 1000000", batches_s);
  else if (parse_int(warmup_s, 0, 1000000, &warmup))
    bad = usage_error("--warmup '%s': expected 0 to 1000000", warmup_s);
  if (bad) {
    free(overrides);
    return bad;
  }

  stoke_run_opts o = {.ini_path = ini, .overrides = overrides, .n_overrides = n_over, .quiet = 1};
  bench b = {0};
  stoke_err *e = bench_open(&b, &o);
  /* the report goes to a temporary file, renamed over --json only when every count was measured: a failed or
   * interrupted run leaves the previous report whole (stoke_write_begin/end) */
  FILE *jf = NULL;
  char jtmp[4200] = "";
  if (!e && json) e = stoke_write_begin(json, "--json report", jtmp, sizeof jtmp, &jf);
  if (e) {
    bench_close(&b);
    free(overrides);
    return report(e);
  }
  stoke_sample_info_v1 info = {0};
  e = b.src->info(b.src_self, &info);
  if (e) {
    e = stoke_err_wrap(e, __FILE__, __LINE__, "source '%s'", b.src->name); /* before bench_close frees the source */
    if (jf) e = stoke_write_end(jf, jtmp, json, "--json report", e); /* given e: the temporary file goes */
    bench_close(&b);
    free(overrides);
    return report(e);
  }
  char shape[96] = "";
  for (int i = 0, k = 0; i < info.shape.ndim; i++)
    k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", i ? "x" : "", (long long)info.shape.d[i]);
  printf("bench_loader: source '%s' (%lld samples of %s %s, %lld classes), batch %lld, prefetch %lld, "
         "buffers from '%s'; %ld warm-up + %ld timed batches per worker count\n",
         b.src->name, (long long)b.src->length(b.src_self), shape, stoke_dtype_name(info.dtype),
         (long long)info.classes, (long long)b.batch, (long long)b.prefetch, b.dev->name, warmup, batches);
  fflush(stdout);
  result best = {0};
  for (int i = 0; i < n_counts && !e; i++) {
    result r = {0};
    e = bench_workers(&b, counts[i], (int)warmup, (int)batches, &r);
    if (e) break;
    printf("workers %3d: %10.1f images/s, %8.1f images/s per worker, data wait %8.3f ms/batch (max %.3f), "
           "skipped %lld\n",
           r.workers, r.images_per_s, r.images_per_s / r.workers, r.wait_ms_mean, r.wait_ms_max, (long long)r.skipped);
    fflush(stdout);
    if (jf) {
      fprintf(jf, "{\"tool\":\"bench_loader\",\"source\":");
      json_string(jf, b.src->name);
      fprintf(jf,
              ",\"batch\":%lld,\"prefetch\":%lld,\"workers\":%d,\"warmup_batches\":%ld,\"batches\":%ld,"
              "\"images\":%lld,\"seconds\":%.6f,\"images_per_s\":%.3f,\"images_per_s_per_worker\":%.3f,"
              "\"data_wait_ms_mean\":%.4f,\"data_wait_ms_max\":%.4f,\"skipped\":%lld}\n",
              (long long)b.batch, (long long)b.prefetch, r.workers, warmup, batches, (long long)r.images, r.seconds,
              r.images_per_s, r.images_per_s / r.workers, r.wait_ms_mean, r.wait_ms_max, (long long)r.skipped);
    }
    if (r.images_per_s > best.images_per_s) best = r;
  }
  if (jf) e = stoke_write_end(jf, jtmp, json, "--json report", e);
  if (!e)
    printf("best: %d workers, %.1f images/s (%.1f per worker)\n", best.workers, best.images_per_s,
           best.workers ? best.images_per_s / best.workers : 0);
  bench_close(&b);
  free(overrides);
  return e ? report(e) : 0;
}
