/* tests/tools/steptime_test.c: issue 16's one definition of a step's time.
 * The step timers alone (the cpu backend's timers and the host-clock path:
 * more unread steps than the pool holds, a pause left out), then train's
 * console lines, metrics.jsonl and summary against one another, and
 * tools/bench's rate against the device step times of the same run. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke/steptime.h"
#include "tests/common/cpu_fixture.h"
#include "tests/tools/child.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void busy(double s) {
  double t = now_s();
  while (now_s() - t < s) {
  }
}

/* 200 steps of >= 0.2 ms, read after steps 10, 150 (140 unread: more than
 * the pool of 64 timers) and 200, with a 30 ms pause after step 100: every
 * step comes back once, in order, and the times add up to the span from
 * the first step's start to the last one's end less the pause. */
static void check_timers(const stoke_backend_v1 *dev, void *self) {
  stoke_steptime *t;
  OK(stoke_steptime_new(dev, self, &t));
  double got[200], gap = 0;
  int64_t n_got = 0;
  double t0 = now_s();
  for (int i = 1; i <= 200; i++) {
    OK(stoke_steptime_begin(t));
    busy(2e-4);
    OK(stoke_steptime_end(t));
    if (i == 10 || i == 150 || i == 200) {
      const double *ms;
      int64_t n;
      OK(stoke_steptime_read(t, &ms, &n));
      assert_true(n_got + n <= 200);
      memcpy(got + n_got, ms, sizeof *ms * (size_t)n);
      n_got += n;
      assert_int_equal(n_got, i);
    }
    if (i == 100) {
      double g0 = now_s();
      stoke_steptime_pause(t);
      busy(0.03);
      gap = now_s() - g0;
    }
  }
  double span_ms = 1e3 * (now_s() - t0 - gap), sum = 0;
  for (int i = 0; i < 200; i++) {
    assert_true(got[i] >= 0.2 * 0.999);
    sum += got[i];
  }
  print_message("%s: 200 steps, %.3f ms summed, %.3f ms spanned without the pause\n",
                dev->timer_create ? dev->name : "host clock", sum, span_ms);
  assert_true(sum <= span_ms + 0.05);
  assert_true(sum >= span_ms - 2.0);
  /* nothing unread: an empty read */
  const double *ms;
  int64_t n;
  OK(stoke_steptime_read(t, &ms, &n));
  assert_int_equal(n, 0);
  stoke_steptime_free(t);
}

static void test_timers(void **state) {
  check_timers(cpu, cpu_self);
  /* a device with no timers: the host clock */
  stoke_backend_v1 none = {.name = "none"};
  check_timers(&none, NULL);
}

/* ------------------------------------------------- train's three reports */

static char ini[4096];

static int setup(void **state) {
  if (cpu_fixture_setup("steptime_test")) return -1;
  return write_tmp(ini, sizeof ini, "tiny.ini",
                   "[run]\n"
                   "backends = cpu\n"
                   "seed = 3\n"
                   "checkpoint = false\n"
                   "progress = lines\n" TINY_MLP_INI "hidden = 64\n");
}

/* The number after "key": in a JSON line (NaN: absent or null). */
static double field(const char *line, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\": ", key);
  const char *p = strstr(line, k);
  if (!p || !strncmp(p + strlen(k), "null", 4)) return NAN;
  return strtod(p + strlen(k), NULL);
}

typedef struct {
  double step, rate, ms, p50, p95, max, host, wait;
} row;

/* metrics.jsonl's step lines into r (at most cap); *summary gets the
 * summary line. Returns the number of rows. */
static int read_jsonl(const char *path, row *r, int cap, char *summary, size_t sum_cap) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "\"summary\"")) {
      snprintf(summary, sum_cap, "%s", line);
    } else if (strstr(line, "\"samples_per_s\"") && n < cap) {
      r[n++] = (row){field(line, "step"),        field(line, "samples_per_s"),    field(line, "step_time_ms"),
                     field(line, "step_time_ms_p50"), field(line, "step_time_ms_p95"), field(line, "step_time_ms_max"),
                     field(line, "host_ms"),     field(line, "data_wait_ms")};
    }
  }
  fclose(f);
  return n;
}

/* The console's step lines, as metrics.c prints them. */
static int read_console(const char *out, row *r, int cap) {
  int n = 0;
  for (const char *p = strstr(out, "\nstep "); p && n < cap; p = strstr(p + 1, "\nstep ")) {
    long long step, total, epoch;
    double loss, lr;
    row x;
    if (sscanf(p + 1,
               "step %lld/%lld  epoch %lld  loss %lf  lr %lf  %lf samples/s  step %lf ms (p50 %lf, p95 %lf, max "
               "%lf)  host %lf ms  data-wait %lf ms",
               &step, &total, &epoch, &loss, &lr, &x.rate, &x.ms, &x.p50, &x.p95, &x.max, &x.host, &x.wait) == 12) {
      x.step = (double)step;
      r[n++] = x;
    }
  }
  return n;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* numpy's default percentile (linear), written again here */
static double pct(const double *v, int n, double p) {
  double s[256];
  memcpy(s, v, sizeof *v * (size_t)n);
  qsort(s, (size_t)n, sizeof *s, cmp);
  double pos = p / 100 * (n - 1);
  int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
  return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

#define NEAR(a, b, tol)                                                                            \
  do {                                                                                             \
    double a_ = (a), b_ = (b);                                                                     \
    if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.6f, %s = %.6f (tolerance %g)", #a, a_, #b, b_, (double)(tol)); \
  } while (0)

static void train(const char *sub, const char *log_every, const char *steps, char *out, size_t cap, char *jsonl,
                  size_t jcap) {
  char dir[4200];
  snprintf(dir, sizeof dir, "run.out_dir=%s/%s", tmpdir(), sub);
  run_ok("tools/train", (const char *const[]){ini, dir, log_every, steps, NULL}, out, cap);
  snprintf(jsonl, jcap, "%s/%s/metrics.jsonl", tmpdir(), sub);
}

/* Each console line says what its JSON line says, to the digits it prints;
 * samples/s is the batch over the interval's mean device step time. */
static void same_rows(const row *c, const row *j, int n) {
  for (int i = 0; i < n; i++) {
    assert_true(c[i].step == j[i].step);
    NEAR(c[i].rate, j[i].rate, 0.55);
    NEAR(c[i].ms, j[i].ms, 6e-4);
    NEAR(c[i].p50, j[i].p50, 6e-4);
    NEAR(c[i].p95, j[i].p95, 6e-4);
    NEAR(c[i].max, j[i].max, 6e-4);
    NEAR(c[i].host, j[i].host, 6e-4);
    NEAR(c[i].wait, j[i].wait, 6e-4);
    NEAR(j[i].rate, 16 * 1e3 / j[i].ms, 0.05 + j[i].rate * 1e-4 / j[i].ms);
    assert_true(j[i].p50 <= j[i].max + 1e-4 && j[i].p95 <= j[i].max + 1e-4 && j[i].ms <= j[i].max + 1e-4);
  }
}

/* The summary's printed line, against its JSON line. */
static void same_summary(const char *out, const char *sum) {
  const char *p = strstr(out, "  samples/s median ");
  assert_non_null(p);
  double rate, p50, p95, mx;
  assert_int_equal(sscanf(p, "  samples/s median %lf, step time p50 %lf ms, p95 %lf ms, max %lf ms (device)", &rate,
                          &p50, &p95, &mx),
                   4);
  NEAR(rate, field(sum, "samples_per_s_median"), 0.55);
  NEAR(p50, field(sum, "step_time_ms_p50"), 6e-4);
  NEAR(p95, field(sum, "step_time_ms_p95"), 6e-4);
  NEAR(mx, field(sum, "step_time_ms_max"), 6e-4);
}

/* log_every = 1: every step has its line, so the summary's percentiles
 * and median can be computed again from metrics.jsonl (the first step
 * left out, as the summary says). */
static void test_every_step(void **state) {
  static char out[65536], jsonl[4300], sum[4096];
  row c[64], j[64];
  train("every", "run.log_every=1", "run.steps=14", out, sizeof out, jsonl, sizeof jsonl);
  int nj = read_jsonl(jsonl, j, 64, sum, sizeof sum), nc = read_console(out, c, 64);
  assert_int_equal(nj, 14);
  assert_int_equal(nc, 14);
  same_rows(c, j, nj);
  same_summary(out, sum);
  double ms[64], rates[64];
  for (int i = 1; i < nj; i++) {
    ms[i - 1] = j[i].ms;
    rates[i - 1] = j[i].rate;
    NEAR(j[i].p50, j[i].ms, 1e-4); /* an interval of one step */
    NEAR(j[i].max, j[i].ms, 1e-4);
  }
  NEAR(field(sum, "step_time_ms_p50"), pct(ms, nj - 1, 50), 2e-4);
  NEAR(field(sum, "step_time_ms_p95"), pct(ms, nj - 1, 95), 2e-4);
  NEAR(field(sum, "step_time_ms_max"), pct(ms, nj - 1, 100), 2e-4);
  NEAR(field(sum, "samples_per_s_median"), pct(rates, nj - 1, 50), 0.11);
}

/* log_every = 4: the lines are intervals; the summary's median is the
 * intervals' (the first step's own interval left out), its max theirs. */
static void test_intervals(void **state) {
  static char out[65536], jsonl[4300], sum[4096];
  row c[64], j[64];
  train("intervals", "run.log_every=4", "run.steps=17", out, sizeof out, jsonl, sizeof jsonl);
  int nj = read_jsonl(jsonl, j, 64, sum, sizeof sum), nc = read_console(out, c, 64);
  assert_int_equal(nj, 6); /* 1, 4, 8, 12, 16, 17 */
  assert_int_equal(nc, nj);
  same_rows(c, j, nj);
  same_summary(out, sum);
  double rates[64], mx = 0;
  for (int i = 1; i < nj; i++) {
    rates[i - 1] = j[i].rate;
    if (j[i].max > mx) mx = j[i].max;
  }
  NEAR(field(sum, "step_time_ms_max"), mx, 2e-4);
  NEAR(field(sum, "samples_per_s_median"), pct(rates, nj - 1, 50), 0.11);
  /* no NVML on the cpu backend: the power figures are there, null, and no power line is printed */
  assert_non_null(strstr(sum, "\"gpu_power_w_mean\": null"));
  assert_non_null(strstr(sum, "\"gpu_power_capped\": null"));
  assert_null(strstr(out, "GPU power"));
}

/* tools/bench's rate of a round is the batch over the mean device time of
 * its timed steps, the very times train's metrics.jsonl holds for them. */
static void test_bench_same_times(void **state) {
  static char out[65536], json[4300], dir[4300], jsonl[4400], sum[4096];
  snprintf(json, sizeof json, "%s/bench.json", tmpdir());
  snprintf(dir, sizeof dir, "run.out_dir=%s/bench", tmpdir());
  RUN_OK("tools/bench", out, ini, dir, "run.log_every=1", "--rounds", "1", "--warmup", "3", "--steps", "6", "--json",
         json);
  FILE *f = fopen(json, "r");
  assert_non_null(f);
  static char text[65536];
  text[fread(text, 1, sizeof text - 1, f)] = 0;
  fclose(f);
  const char *p = strstr(text, "\"samples_per_s\":[");
  assert_non_null(p);
  double rate = strtod(p + strlen("\"samples_per_s\":["), NULL);
  row j[64];
  snprintf(jsonl, sizeof jsonl, "%s/bench/A/metrics.jsonl", tmpdir());
  int nj = read_jsonl(jsonl, j, 64, sum, sizeof sum);
  assert_int_equal(nj, 9);
  double ms = 0;
  for (int i = 3; i < 9; i++) ms += j[i].ms; /* steps 4..9 */
  print_message("bench: %.1f samples/s; metrics.jsonl's steps 4-9: %.4f ms, %.1f samples/s\n", rate, ms,
                16 * 6 / (ms * 1e-3));
  NEAR(rate, 16 * 6 / (ms * 1e-3), rate * 6 * 6e-5 / ms + 1e-6);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_timers),
      cmocka_unit_test(test_every_step),
      cmocka_unit_test(test_intervals),
      cmocka_unit_test(test_bench_same_times),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
