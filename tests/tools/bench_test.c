/* tests/tools/bench_test.c: tools/bench end to end on the CPU backend with
 * a tiny MLP: an A/B run with --per-op, --json and --md (the report's
 * parts, the files, each variant's own run folder), a plain one-variant
 * run, bad arguments and bad keys, and the --loader hand-over. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/tools/child.h"

#define TOOL "tools/bench" /* runfiles-relative; plugins/ and bench_loader are beside it */

static char ini[4096], out_dir[4200];

static int setup(void **state) {
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/runs", tmpdir());
  return write_tmp(ini, sizeof ini, "tiny.ini",
                   "[run]\n"
                   "backends = cpu\n"
                   "seed = 3\n"
                   "log_every = 2\n" TINY_MLP_INI "hidden = 32\n");
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    print_error("cannot read %s\n", path);
    fail();
  }
  static char buf[65536];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static int count(const char *text, const char *sub) {
  int n = 0;
  for (const char *p = strstr(text, sub); p; p = strstr(p + 1, sub)) n++;
  return n;
}

static void test_ab_per_op(void **state) {
  char log[32768], json[4200], md[4200], plan[4300];
  snprintf(json, sizeof json, "%s/ab.json", tmpdir());
  snprintf(md, sizeof md, "%s/ab.md", tmpdir());
  RUN_OK(TOOL, log, ini, out_dir, "--a", "model.hidden=16", "--b", "model.hidden=64", "--rounds", "2", "--warmup",
         "2", "--steps", "3", "--per-op", "--json", json, "--md", md);
  /* interleaved rounds, A first */
  const char *a1 = strstr(log, "round 1/2 A:"), *b1 = strstr(log, "round 1/2 B:"), *a2 = strstr(log, "round 2/2 A:"),
             *b2 = strstr(log, "round 2/2 B:");
  assert_true(a1 && b1 && a2 && b2 && a1 < b1 && b1 < a2 && a2 < b2);
  EXPECT_HAS(log, "(3 steps in ");
  EXPECT_HAS(log, "2 rounds (A B interleaved), 2 warm-up + 3 timed steps each, timed with the host clock");
  EXPECT_HAS(log, "  A  model.hidden=16");
  EXPECT_HAS(log, "  B  model.hidden=64");
  EXPECT_HAS(log, "fp32  batch 16 ");
  assert_int_equal(count(log, "samples/s median "), 2);
  EXPECT_HAS(log, "B/A ");
  EXPECT_HAS(log, "t-interval on the log ratios of 2 paired rounds");
  EXPECT_HAS(log, "per-op CPU time, ms per step (3 profiled steps after the warm-up");
  EXPECT_HAS(log, "linear fwd [cpu]");
  EXPECT_HAS(log, "linear bwd [cpu]");
  EXPECT_HAS(log, "softmax_ce fwd [cpu]");
  EXPECT_HAS(log, "optimizer+scaler");
  EXPECT_HAS(log, "total");
  /* quiet runs: no config dump, no per-run profile print */
  assert_null(strstr(log, "resolved config"));
  assert_null(strstr(log, "per-op GPU time over"));

  char *j = slurp(json);
  EXPECT_HAS(j, "{\"tool\":\"stoke bench\",\"ini\":\"");
  EXPECT_HAS(j, "\"rounds\":2,\"warmup_steps\":2,\"timed_steps\":3,\"timing\":\"host clock\"");
  EXPECT_HAS(j, "{\"name\":\"A\",\"overrides\":[\"model.hidden=16\"],\"device\":\"");
  EXPECT_HAS(j, "{\"name\":\"B\",\"overrides\":[\"model.hidden=64\"],\"device\":\"");
  EXPECT_HAS(j, "\"precision\":\"fp32\",\"batch\":16,\"samples_per_s\":[");
  EXPECT_HAS(j, "\"ratio\":{\"b_over_a\":");
  EXPECT_HAS(j, "\"paired_rounds\":2,");
  EXPECT_HAS(j, "\"per_op\":[{\"op\":");
  EXPECT_HAS(j, "\"nodes_a\":2,"); /* two linear layers */
  assert_int_equal(count(j, "\"samples_per_s\":["), 2);
  assert_null(strstr(j, "null")); /* every figure measured */

  char *m = slurp(md);
  EXPECT_HAS(m, "| variant | overrides | device | precision | batch | samples/s median | min - max |");
  EXPECT_HAS(m, "| A | `model.hidden=16` |");
  EXPECT_HAS(m, "| B | `model.hidden=64` |");
  EXPECT_HAS(m, "B/A = ");
  EXPECT_HAS(m, "2 rounds interleaved A B, 2 warm-up + 3 timed steps each, timed with the host clock; commit ");
  EXPECT_HAS(m, "| op (pass) [engine] | A | B | B - A |");
  /* each variant ran in its own folder */
  snprintf(plan, sizeof plan, "%s/runs/A/plan.txt", tmpdir());
  assert_int_equal(access(plan, R_OK), 0);
  snprintf(plan, sizeof plan, "%s/runs/B/plan.txt", tmpdir());
  assert_int_equal(access(plan, R_OK), 0);
}

/* No --b: one variant, no ratio; the commit comes from STOKE_COMMIT. */
static void test_plain(void **state) {
  char log[16384];
  setenv("STOKE_COMMIT", "feedbeef", 1);
  RUN_OK(TOOL, log, ini, out_dir, "--rounds", "1", "--warmup", "0", "--steps", "2");
  unsetenv("STOKE_COMMIT");
  EXPECT_HAS(log, "round 1/1 A:");
  EXPECT_HAS(log, "1 round, 0 warm-up + 2 timed steps each");
  EXPECT_HAS(log, "commit feedbeef");
  EXPECT_HAS(log, "  A  (as the INI file)");
  assert_null(strstr(log, "B/A"));
  assert_null(strstr(log, "round 1/1 B"));
}

static void test_errors(void **state) {
  char log[16384];
  assert_int_equal(run_child(TOOL, (const char *const[]){ini, "--rounds", "0", NULL}, log, sizeof log), 2);
  EXPECT_HAS(log, "--rounds '0'");
  EXPECT_HAS(log, "usage: bench");
  assert_int_equal(run_child(TOOL, (const char *const[]){ini, "--b", "run.steps=3", NULL}, log, sizeof log), 2);
  EXPECT_HAS(log, "the bench sets run.steps itself");
  /* a key the config does not know: the run's own message, which variant */
  assert_int_equal(
      run_child(TOOL, (const char *const[]){ini, out_dir, "--b", "model.hiden=8", "--rounds", "1", NULL}, log, sizeof log),
      1);
  EXPECT_HAS(log, "variant B");
  EXPECT_HAS(log, "hiden");
  EXPECT_HAS(log, "did you mean 'hidden'");
  assert_int_equal(run_child(TOOL, (const char *const[]){"--help", NULL}, log, sizeof log), 0);
  EXPECT_HAS(log, "--per-op");
}

static void test_loader(void **state) {
  char log[16384];
  RUN_OK(TOOL, log, "--loader", ini, "--workers", "1", "--batches", "2", "--warmup", "0");
  EXPECT_HAS(log, "workers   1:");
  EXPECT_HAS(log, "best: ");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ab_per_op),
      cmocka_unit_test(test_plain),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_loader),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
