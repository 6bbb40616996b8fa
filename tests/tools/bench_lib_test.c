/* tests/tools/bench_lib_test.c: tools/bench's library on recorded
 * timings: argument parsing (good and bad input, the messages), median /
 * min-max, the t quantiles, B/A with its interval against hand-computed
 * values, the commit lookup, and the three report formats (the JSON
 * checked by a small parser). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/tools/child.h" /* tmpdir, EXPECT_HAS */
#include "tools/bench_lib.h"

#define ARGV(...) ((char *const[]){"bench", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof ARGV(__VA_ARGS__) / sizeof(char *)) - 1)
#define PARSE(a, err, ...) bench_parse_args(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), (a), (err), sizeof(err))

static void expect_close(double got, double want, double tol, const char *what) {
  if (!(fabs(got - want) <= tol)) {
    print_error("%s: %.9g, want %.9g (tolerance %g)\n", what, got, want, tol);
    fail();
  }
}

/* ------------------------------------------------------------ arguments */

static void test_parse_good(void **state) {
  bench_args a;
  char err[256];
  assert_int_equal(PARSE(&a, err, "run.ini", "data.batch_size=8", "--a", "run.fuse=false", "--b", "run.fuse=true",
                         "model.hidden=8", "--rounds", "3", "--per-op", "optimizer.lr=0.1", "--warmup=2",
                         "--steps=7", "--json", "o.json", "--md=o.md"),
                   0);
  assert_string_equal(a.ini, "run.ini");
  assert_int_equal(a.variants, 2);
  assert_int_equal(a.rounds, 3);
  assert_int_equal(a.warmup, 2);
  assert_int_equal(a.steps, 7);
  assert_int_equal(a.per_op, 1);
  assert_string_equal(a.json, "o.json");
  assert_string_equal(a.md, "o.md");
  /* words outside --a / --b (and after a later option) are for both */
  assert_int_equal(a.n_common, 2);
  assert_string_equal(a.common[0], "data.batch_size=8");
  assert_string_equal(a.common[1], "optimizer.lr=0.1");
  assert_int_equal(a.n_ov[0], 1);
  assert_string_equal(a.ov[0][0], "run.fuse=false");
  assert_int_equal(a.n_ov[1], 2);
  assert_string_equal(a.ov[1][1], "model.hidden=8");
}

static void test_parse_defaults_and_one_variant(void **state) {
  bench_args a;
  char err[256];
  assert_int_equal(PARSE(&a, err, "run.ini"), 0);
  assert_int_equal(a.variants, 1);
  assert_int_equal(a.rounds, 5);
  assert_int_equal(a.warmup, 12);
  assert_int_equal(a.steps, 40);
  assert_int_equal(a.per_op, 0);
  assert_null(a.json);
  assert_null(a.md);
  /* --a alone is still one variant; --b alone is A = the INI as it is */
  assert_int_equal(PARSE(&a, err, "run.ini", "--a", "run.fuse=true"), 0);
  assert_int_equal(a.variants, 1);
  assert_int_equal(a.n_ov[0], 1);
  assert_int_equal(PARSE(&a, err, "--b", "run.fuse=true", "--warmup", "0", "run.ini"), 0);
  assert_int_equal(a.variants, 2);
  assert_int_equal(a.n_ov[0], 0);
  assert_string_equal(a.ini, "run.ini");
  assert_int_equal(a.warmup, 0);
  assert_int_equal(PARSE(&a, err, "run.ini", "--help"), 1);
  assert_int_equal(PARSE(&a, err, "-h"), 1);
}

/* Bad input: -1 and a message that names the problem. */
static void expect_bad(int rc, const char *err, const char *want) {
  assert_int_equal(rc, -1);
  EXPECT_HAS(err, want);
}

static void test_parse_bad(void **state) {
  bench_args a;
  char err[256];
  expect_bad(PARSE(&a, err, "run.ini", "--threads", "2"), err, "unknown option '--threads'");
  expect_bad(PARSE(&a, err, "run.ini", "--rounds", "0"), err, "--rounds '0': a whole number from 1 to 1000");
  expect_bad(PARSE(&a, err, "run.ini", "--rounds", "3x"), err, "--rounds '3x'");
  expect_bad(PARSE(&a, err, "run.ini", "--rounds"), err, "--rounds needs a number");
  expect_bad(PARSE(&a, err, "run.ini", "--steps=0"), err, "--steps '0'");
  expect_bad(PARSE(&a, err, "run.ini", "--warmup", "-1"), err, "--warmup '-1'");
  expect_bad(PARSE(&a, err, "run.ini", "--a", "--b", "run.fuse=true"), err,
             "--a needs at least one section.key=value after it");
  expect_bad(PARSE(&a, err, "run.ini", "--b"), err, "--b needs at least one");
  expect_bad(PARSE(&a, err, "run.ini", "--b", "x.y=1", "--b", "x.y=2"), err, "--b given twice");
  expect_bad(PARSE(&a, err, "run.ini", "fuse"), err, "'fuse' is neither an option nor a section.key=value override");
  expect_bad(PARSE(&a, err, "run.ini", "fuse=true"), err, "'fuse=true' is neither");
  expect_bad(PARSE(&a, err, "run.ini", ".fuse=true"), err, "'.fuse=true' is neither");
  expect_bad(PARSE(&a, err, "run.ini", "--a", "run.steps=5"), err, "the bench sets run.steps itself");
  expect_bad(PARSE(&a, err, "run.ini", "run.profile_ops=true"), err, "the bench sets run.profile_ops itself");
  expect_bad(PARSE(&a, err, "run.ini", "--json"), err, "--json needs a file name");
  expect_bad(PARSE(&a, err, "run.ini", "--md="), err, "--md needs a file name");
  expect_bad(PARSE(&a, err, "run.ini", "--loader"), err, "--loader comes first");
  expect_bad(PARSE(&a, err, "--rounds", "2"), err, "no RUN.INI given");
  /* a key that only starts like one of the bench's is fine */
  assert_int_equal(PARSE(&a, err, "run.ini", "run.steps_x=1"), 0);
}

/* ------------------------------------------------------------ statistics */

static void test_spread(void **state) {
  double odd[] = {5, 1, 4, 2, 3};
  bench_spread s = bench_spread_of(odd, 5);
  assert_int_equal(s.n, 5);
  expect_close(s.median, 3, 0, "median of 5");
  expect_close(s.min, 1, 0, "min");
  expect_close(s.max, 5, 0, "max");
  assert_true(odd[0] == 5 && odd[1] == 1); /* the input is not sorted in place */
  double even[] = {10, 40, 20, 30};
  s = bench_spread_of(even, 4);
  expect_close(s.median, 25, 0, "median of 4");
  s = bench_spread_of(even, 1);
  expect_close(s.median, 10, 0, "median of 1");
  s = bench_spread_of(even, 0);
  assert_true(isnan(s.median) && isnan(s.min) && isnan(s.max));
}

static void test_t975(void **state) {
  expect_close(bench_t975(1), 12.706, 1e-9, "t(1)");
  expect_close(bench_t975(4), 2.776, 1e-9, "t(4)");
  expect_close(bench_t975(30), 2.042, 1e-9, "t(30)");
  /* beyond the table: the expansion, which meets the published values */
  expect_close(bench_t975(31), 2.0395, 5e-4, "t(31)");
  expect_close(bench_t975(60), 2.000, 1e-3, "t(60)");
  expect_close(bench_t975(120), 1.980, 1e-3, "t(120)");
  expect_close(bench_t975(100000), 1.960, 1e-3, "t(inf)");
  assert_true(isnan(bench_t975(0)));
}

static void test_ratio(void **state) {
  /* log ratios 0.1, 0.2, 0.3: mean 0.2, sd 0.1, half width
   * 4.303 * 0.1 / sqrt(3) = 0.248434 */
  double a[] = {1000, 2000, 1500}, b[3];
  for (int i = 0; i < 3; i++) b[i] = a[i] * exp(0.1 * (i + 1));
  bench_ratio r = bench_ratio_paired(a, b, 3);
  assert_int_equal(r.n, 3);
  double half = 4.303 * 0.1 / sqrt(3.0);
  expect_close(r.ratio, exp(0.2), 1e-12, "ratio");
  expect_close(r.lo, exp(0.2 - half), 1e-12, "lo");
  expect_close(r.hi, exp(0.2 + half), 1e-12, "hi");
  /* A/B is the inverse, interval mirrored */
  bench_ratio inv = bench_ratio_paired(b, a, 3);
  expect_close(inv.ratio, 1 / r.ratio, 1e-12, "inverse ratio");
  expect_close(inv.lo, 1 / r.hi, 1e-12, "inverse lo");
  /* the same ratio every round: a zero-width interval */
  double c[] = {1100, 2200, 1650};
  r = bench_ratio_paired(a, c, 3);
  expect_close(r.ratio, 1.1, 1e-12, "constant ratio");
  expect_close(r.lo, 1.1, 1e-12, "constant lo");
  expect_close(r.hi, 1.1, 1e-12, "constant hi");
  /* one round: a ratio, no interval */
  r = bench_ratio_paired(a, c, 1);
  expect_close(r.ratio, 1.1, 1e-12, "one round");
  assert_true(isnan(r.lo) && isnan(r.hi));
  assert_true(isnan(bench_ratio_paired(a, c, 0).ratio));
}

static void test_rate(void **state) {
  expect_close(bench_rate(4096, 40, 100.0), 1638400, 1e-6, "4096 x 40 in 100 ms");
  assert_true(isnan(bench_rate(4096, 40, 0)));
  assert_true(isnan(bench_rate(4096, 40, NAN)));
}

static void test_commit(void **state) {
  char out[64], dir[4096];
  snprintf(dir, sizeof dir, "%s/commitdir", tmpdir());
  setenv("STOKE_COMMIT", "abc123", 1);
  bench_commit(dir, out, sizeof out);
  assert_string_equal(out, "abc123");
  unsetenv("STOKE_COMMIT");
  setenv("GIT_DIR", "/nonexistent", 1); /* no repository to ask */
  bench_commit(dir, out, sizeof out);
  assert_string_equal(out, "unknown");
  char cmd[2 * 4096 + 64];
  snprintf(cmd, sizeof cmd, "mkdir -p %s && printf 'def4567-dirty\\n' > %s/COMMIT", dir, dir);
  assert_int_equal(system(cmd), 0);
  bench_commit(dir, out, sizeof out);
  assert_string_equal(out, "def4567-dirty");
  unsetenv("GIT_DIR");
}

/* --------------------------------------------------------------- reports */

/* A recorded A/B result: rates and per-op rows as a GPU run gives them. */
static void recorded(bench_result *r, int variants) {
  memset(r, 0, sizeof *r);
  r->ini = "examples/mlp.ini";
  r->common = "run.precision=bf16";
  static const char *common[] = {"run.precision=bf16"};
  r->common_ov = common;
  r->n_common_ov = 1;
  r->warmup = 12;
  r->steps = 40;
  r->rounds = 3;
  r->per_op = 1;
  r->gpu = 1;
  r->n_variants = variants;
  snprintf(r->commit, sizeof r->commit, "0123abcd");
  snprintf(r->date, sizeof r->date, "2026-11-22 12:00 UTC");
  static const double rates[2][3] = {{1000000, 1200000, 1100000}, {1100000, 1320000, 1210000}};
  static const stoke_op_time ops[2][3] = {
      {{"linear", "fwd", "cublaslt", 5, 1.0}, {"relu", "fwd", "cuda", 4, 0.25}, {"optimizer+scaler", "", "", 1, 0.5}},
      {{"linear", "fwd", "cublaslt", 5, 0.9}, {"optimizer+scaler", "", "", 1, 0.5}, {"bias_relu", "fwd", "fused", 4, 0.05}},
  };
  for (int v = 0; v < variants; v++) {
    bench_variant *x = &r->v[v];
    x->name[0] = (char)('A' + v);
    snprintf(x->overrides, sizeof x->overrides, "%s", v ? "run.fuse=true model.x=a|b" : "run.fuse=false");
    x->n_ov = v ? 2 : 1;
    x->ov[0] = v ? "run.fuse=true" : "run.fuse=false";
    x->ov[1] = "model.x=a|b";
    snprintf(x->device, sizeof x->device, "NVIDIA H100 \"80GB\"");
    snprintf(x->precision, sizeof x->precision, "bf16");
    x->batch = 4096;
    x->n = 3;
    memcpy(x->rate, rates[v], sizeof rates[v]);
    /* A measured its power (a GPU with NVML; one round without the counter), B did not (NaN) */
    for (int i = 0; i < 3; i++) x->power_w[i] = v ? NAN : i == 2 ? NAN : 690 + 6 * i;
    for (int i = 0; i < 3; i++) x->capped[i] = v ? NAN : i == 2 ? NAN : 0.85 + 0.1 * i;
    x->first_loss = 6.9;
    x->final_loss = v ? NAN : 6.5;
    memcpy(x->ops, ops[v], sizeof ops[v]);
    x->n_ops = 3;
  }
}

/* The report as text. */
static void render(void (*fn)(const bench_result *, FILE *), const bench_result *r, char *out, size_t cap) {
  FILE *f = fmemopen(out, cap, "w");
  assert_non_null(f);
  fn(r, f);
  fclose(f);
}

static void test_text_report(void **state) {
  bench_result r;
  char out[8192];
  recorded(&r, 2);
  render(bench_print, &r, out, sizeof out);
  EXPECT_HAS(out, "stoke bench: examples/mlp.ini run.precision=bf16, 3 rounds (A B interleaved), 12 warm-up + 40 "
                  "timed steps each, timed with device events");
  EXPECT_HAS(out, "commit 0123abcd");
  EXPECT_HAS(out, "samples/s median 1,100,000  min-max 1,000,000 - 1,200,000");
  EXPECT_HAS(out, "samples/s median 1,210,000  min-max 1,100,000 - 1,320,000");
  /* B = 1.1 x A in every round */
  EXPECT_HAS(out, "B/A 1.100 (95% CI 1.100 - 1.100; t-interval on the log ratios of 3 paired rounds)");
  EXPECT_HAS(out, "per-op GPU time");
  /* biggest change first: relu went (-0.25), linear -0.1, the fused op came (+0.05) */
  const char *relu = strstr(out, "relu fwd [cuda]"), *lin = strstr(out, "linear fwd [cublaslt]"),
             *fused = strstr(out, "bias_relu fwd [fused]"), *opt = strstr(out, "optimizer+scaler");
  assert_true(relu && lin && fused && opt && relu < lin && lin < fused && fused < opt);
  EXPECT_HAS(out, "-0.100 ms (-10.0%)");
  EXPECT_HAS(out, "only A");
  EXPECT_HAS(out, "only B");
  EXPECT_HAS(out, "total");
  EXPECT_HAS(out, "-0.300 ms (-17.1%)"); /* 1.75 -> 1.45 */
  /* A's power over the rounds that measured it, B none: one power line */
  EXPECT_HAS(out, "     GPU power 693 W, the clocks held down by the power limit 90% of the time (mean of the rounds)\n");
  assert_null(strstr(strstr(out, "GPU power") + 1, "GPU power"));
  /* one variant: no ratio, one column */
  recorded(&r, 1);
  render(bench_print, &r, out, sizeof out);
  assert_null(strstr(out, "B/A"));
  assert_null(strstr(out, "interleaved"));
  EXPECT_HAS(out, "linear fwd [cublaslt]");
}

static void test_markdown(void **state) {
  bench_result r;
  char out[8192];
  recorded(&r, 2);
  render(bench_write_md, &r, out, sizeof out);
  EXPECT_HAS(out, "| variant | overrides | device | precision | batch | samples/s median | min - max |\n"
                  "|---|---|---|---|---:|---:|---:|\n"
                  "| A | `run.fuse=false` | NVIDIA H100 \"80GB\" | bf16 | 4,096 | 1,100,000 | 1,000,000 - 1,200,000 |\n"
                  "| B | `run.fuse=true model.x=a\\|b` |");
  EXPECT_HAS(out, "B/A = 1.100 (95% CI 1.100 - 1.100; t-interval on the log ratios of 3 paired rounds).");
  EXPECT_HAS(out, "\nA GPU power 693 W, the clocks held down by the power limit 90% of the time (mean of the rounds).\n");
  assert_null(strstr(out, "B GPU power"));
  EXPECT_HAS(out, "`examples/mlp.ini run.precision=bf16`; 3 rounds interleaved A B, 12 warm-up + 40 timed steps "
                  "each, timed with device events; commit 0123abcd, 2026-11-22 12:00 UTC.");
  EXPECT_HAS(out, "| op (pass) [engine] | A | B | B - A |\n|---|---:|---:|---:|\n| relu fwd [cuda] | 0.250 | - | only A |");
  EXPECT_HAS(out, "| **total** | 1.750 | 1.450 | -0.300 ms (-17.1%) |");
  /* every table line has the same number of cells as its header */
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    if (line[0] != '|') continue;
    int cells = 0;
    for (char *p = line; *p; p++) cells += *p == '|' && (p == line || p[-1] != '\\');
    assert_true(cells == 8 || cells == 5);
  }
}

/* The A/B page: both variants' rounds plotted, the ratio with its interval,
 * the per-op change as bars (one per op, pass and engine of A or B). */
static void test_html(void **state) {
  bench_result r;
  static char out[65536];
  recorded(&r, 2);
  render(bench_write_html, &r, out, sizeof out);
  EXPECT_HAS(out, "<!DOCTYPE html>");
  EXPECT_HAS(out, "data-points=\"6\" role=\"img\"><title>samples/s per round</title>");
  EXPECT_HAS(out, "<b>B/A = 1.100</b> (95% CI 1.100 - 1.100; t-interval on the log ratios of 3 paired rounds)");
  EXPECT_HAS(out, "<title>B/A per round</title>");
  EXPECT_HAS(out, "<title>per-op change, B - A</title>");
  EXPECT_HAS(out, ">relu fwd [cuda]</text>");
  EXPECT_HAS(out, ">-0.25</text>"); /* only in A: its whole time gone */
  assert_null(strstr(out, "<script"));
  assert_non_null(strstr(out, "</body></html>"));
}

/* ---- a small JSON parser: the report must be one valid object */
static const char *js_value(const char *p);
static const char *js_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  return p;
}
static const char *js_string(const char *p) {
  if (*p++ != '"') return NULL;
  for (; *p && *p != '"'; p++) {
    if ((unsigned char)*p < 0x20) return NULL;
    if (*p == '\\' && !*++p) return NULL;
  }
  return *p == '"' ? p + 1 : NULL;
}
static const char *js_list(const char *p, char close, int keyed) {
  p = js_ws(p + 1);
  if (*p == close) return p + 1;
  for (;;) {
    if (keyed) {
      if (!(p = js_string(js_ws(p)))) return NULL;
      p = js_ws(p);
      if (*p++ != ':') return NULL;
    }
    if (!(p = js_value(p))) return NULL;
    p = js_ws(p);
    if (*p == close) return p + 1;
    if (*p++ != ',') return NULL;
  }
}
static const char *js_value(const char *p) {
  p = js_ws(p);
  if (*p == '{') return js_list(p, '}', 1);
  if (*p == '[') return js_list(p, ']', 0);
  if (*p == '"') return js_string(p);
  if (!strncmp(p, "null", 4)) return p + 4;
  char *end;
  strtod(p, &end);
  return end > p && (*p == '-' || (*p >= '0' && *p <= '9')) ? end : NULL;
}

static void test_json(void **state) {
  bench_result r;
  char out[8192];
  recorded(&r, 2);
  /* a value with a space is one string (it was split in two) */
  static const char *common[] = {"run.precision=bf16", "run.backends=fused, cudnn"};
  r.common_ov = common;
  r.n_common_ov = 2;
  render(bench_write_json, &r, out, sizeof out);
  const char *end = js_value(out);
  if (!end || *js_ws(end)) {
    print_error("not one JSON object (stops at %s):\n%s\n", end ? end : "?", out);
    fail();
  }
  EXPECT_HAS(out, "{\"tool\":\"stoke bench\",\"ini\":\"examples/mlp.ini\",\"overrides\":[\"run.precision=bf16\","
                  "\"run.backends=fused, cudnn\"],"
                  "\"commit\":\"0123abcd\",\"date\":\"2026-11-22 12:00 UTC\",\"rounds\":3,\"warmup_steps\":12,"
                  "\"timed_steps\":40,\"timing\":\"device events\"");
  EXPECT_HAS(out, "{\"name\":\"B\",\"overrides\":[\"run.fuse=true\",\"model.x=a|b\"],\"device\":\"NVIDIA H100 "
                  "\\\"80GB\\\"\",\"precision\":\"bf16\",\"batch\":4096,\"samples_per_s\":[1100000,1320000,1210000],"
                  "\"median\":1210000,\"min\":1100000,\"max\":1320000,\"first_loss\":6.9,\"final_loss\":null}");
  EXPECT_HAS(out, "\"gpu_power_w\":[690,696,null],\"gpu_power_capped\":[0.85,0.95,null]");
  EXPECT_HAS(out, "\"ratio\":{\"b_over_a\":1.1,\"ci95\":[1.1,1.1],\"paired_rounds\":3,");
  EXPECT_HAS(out, "{\"op\":\"bias_relu\",\"pass\":\"fwd\",\"engine\":\"fused\",\"nodes_a\":0,\"ms_a\":null,"
                  "\"nodes_b\":4,\"ms_b\":0.05}");
  /* one variant: no ratio, no B columns */
  recorded(&r, 1);
  r.per_op = 0;
  render(bench_write_json, &r, out, sizeof out);
  end = js_value(out);
  assert_true(end && !*js_ws(end));
  assert_null(strstr(out, "ratio"));
  assert_null(strstr(out, "per_op"));
  assert_null(strstr(out, "\"name\":\"B\""));
}

/* Recorded rates for A and B, 3 rounds of 40 steps of 64 samples on the host clock. */
static void rounds_of(bench_result *r, const double a[3], const double b[3]) {
  recorded(r, 2);
  r->gpu = 0;
  r->per_op = 0;
  for (int v = 0; v < 2; v++) {
    r->v[v].batch = 64;
    memcpy(r->v[v].rate, v ? b : a, 3 * sizeof(double));
  }
}

static void expect_verdict(const bench_result *r, const char *line, int n_warn) {
  bench_verdict v;
  bench_verdict_of(r, &v);
  if (!strstr(v.line, line)) {
    print_error("verdict \"%s\" lacks \"%s\"\n", v.line, line);
    fail();
  }
  if (v.n_warn != n_warn) {
    print_error("%d warnings, want %d:\n", v.n_warn, n_warn);
    for (int i = 0; i < v.n_warn; i++) print_error("  %s\n", v.warn[i]);
    fail();
  }
}

/* The verdict in words (issue 18): a newcomer's three rounds of 40-250 ms
 * on the host clock gave "B/A 1.310 (95% CI 0.138 - 12.409)", which read
 * as 31% faster; it is inconclusive, with the window and the --steps that
 * would do. Clear differences, none, and wide rounds say so. */
static void test_verdict(void **state) {
  bench_result r;
  /* 64 x 40 samples in 40 to 250 ms: 64,000 to 10,240 samples/s */
  rounds_of(&r, (const double[]){64000, 10240, 30000}, (const double[]){10240, 64000, 90000});
  expect_verdict(&r, "inconclusive: the interval spans", 3);
  bench_verdict v;
  bench_verdict_of(&r, &v);
  EXPECT_HAS(v.line, "x to ");
  EXPECT_HAS(v.line, "; each round timed only 40 ms of the host clock; try --steps 1000");
  EXPECT_HAS(v.warn[0], "each round timed only 40 ms of the host clock (under 1000 ms");
  EXPECT_HAS(v.warn[1], "A's rounds spread over");
  /* 2 s rounds, B 12% faster each time, give or take 1% */
  rounds_of(&r, (const double[]){1280, 1300, 1270}, (const double[]){1280 * 1.12, 1300 * 1.11, 1270 * 1.13});
  expect_verdict(&r, "B is faster by 12.0% (95% CI ", 0);
  rounds_of(&r, (const double[]){1280, 1300, 1270}, (const double[]){1280 * 0.9, 1300 * 0.91, 1270 * 0.89});
  expect_verdict(&r, "B is slower by 10.0% (95% CI ", 0);
  /* an A/A control: ratios around 1 */
  rounds_of(&r, (const double[]){1280, 1300, 1270}, (const double[]){1290, 1295, 1265});
  expect_verdict(&r, "no difference detected (the interval ", 0);
  /* one variant: no verdict, the warnings still */
  recorded(&r, 1);
  bench_verdict_of(&r, &v);
  assert_string_equal(v.line, "");
  assert_int_equal(v.n_warn, 1); /* 1.0 - 1.2 M: 18% spread */
  /* the reports carry it; an unknown commit is explained once */
  rounds_of(&r, (const double[]){1280, 1300, 1270}, (const double[]){1290, 1295, 1265});
  snprintf(r.commit, sizeof r.commit, "unknown");
  static char out[65536];
  render(bench_print, &r, out, sizeof out);
  EXPECT_HAS(out, "  verdict: no difference detected");
  EXPECT_HAS(out, "commit unknown (not a git checkout; set STOKE_COMMIT to name it)");
  assert_null(strstr(strstr(out, "not a git checkout") + 1, "not a git checkout"));
  render(bench_write_md, &r, out, sizeof out);
  EXPECT_HAS(out, "Verdict: no difference detected");
  render(bench_write_json, &r, out, sizeof out);
  EXPECT_HAS(out, "\"verdict\":\"no difference detected");
  EXPECT_HAS(out, "\"warnings\":[]");
  render(bench_write_html, &r, out, sizeof out);
  EXPECT_HAS(out, "<p><b>Verdict:</b> no difference detected");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_good),   cmocka_unit_test(test_parse_defaults_and_one_variant),
      cmocka_unit_test(test_parse_bad),    cmocka_unit_test(test_spread),
      cmocka_unit_test(test_t975),         cmocka_unit_test(test_ratio),
      cmocka_unit_test(test_rate),         cmocka_unit_test(test_commit),
      cmocka_unit_test(test_text_report),  cmocka_unit_test(test_markdown), cmocka_unit_test(test_html),
      cmocka_unit_test(test_json),         cmocka_unit_test(test_verdict),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
