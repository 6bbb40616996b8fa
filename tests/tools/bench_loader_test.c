/* tests/tools/bench_loader_test.c: tools/bench_loader on the synthetic
 * source: a line per worker count, the best count, the JSON lines, and the
 * refusal of batch_size = auto. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/tools/child.h"

#define TOOL "tools/bench_loader" /* runfiles-relative; its plugins/ are beside it */

static char ini[4096];

static int setup(void **state) {
  return write_tmp(ini, sizeof ini, "loader.ini",
                   "[run]\n"
                   "backends = cpu\n"
                   "seed = 3\n"
                   "[data]\n"
                   "source = synthetic\n"
                   "shape = 3, 32, 32\n"
                   "length = 2048\n"
                   "batch_size = 32\n"
                   "prefetch = 2\n");
}

static void test_workers_1_2(void **state) {
  char log[16384], json[4096];
  snprintf(json, sizeof json, "%s/loader.jsonl", tmpdir());
  RUN_OK(TOOL, log, ini, "--workers", "1,2", "--batches", "8", "--warmup", "2", "--json", json);
  EXPECT_HAS(log, "source 'synthetic'");
  EXPECT_HAS(log, "batch 32");
  EXPECT_HAS(log, "workers   1:");
  EXPECT_HAS(log, "workers   2:");
  EXPECT_HAS(log, "images/s per worker");
  EXPECT_HAS(log, "data wait");
  EXPECT_HAS(log, "skipped 0");
  EXPECT_HAS(log, "best: ");
  assert_null(strstr(log, "workers   4:"));
  FILE *f = fopen(json, "r");
  assert_non_null(f);
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    n++;
    char want[32];
    snprintf(want, sizeof want, "\"workers\":%d,", n);
    EXPECT_HAS(line, want);
    EXPECT_HAS(line, "\"images\":256,"); /* 8 batches of 32 */
    EXPECT_HAS(line, "\"images_per_s\":");
  }
  fclose(f);
  assert_int_equal(n, 2);
}

/* Overrides reach the config; auto and bad options are refused. */
static void test_overrides_and_errors(void **state) {
  char log[16384];
  RUN_OK(TOOL, log, ini, "--workers=1", "--batches=2", "--warmup=0", "data.batch_size=16");
  EXPECT_HAS(log, "batch 16");
  assert_int_equal(run_child(TOOL, (const char *const[]){ini, "--workers", "1", "data.batch_size=auto", NULL}, log,
                             sizeof log),
                   1);
  EXPECT_HAS(log, "batch_size = auto");
  assert_int_equal(run_child(TOOL, (const char *const[]){ini, "--workers", "0", NULL}, log, sizeof log), 2);
  EXPECT_HAS(log, "--workers");
  assert_int_equal(run_child(TOOL, (const char *const[]){ini, "--threads", "2", NULL}, log, sizeof log), 2);
  EXPECT_HAS(log, "unknown option '--threads'");
  assert_int_equal(run_child(TOOL, (const char *const[]){ini, "data.sauce=x", NULL}, log, sizeof log), 1);
  EXPECT_HAS(log, "sauce");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_workers_1_2),
      cmocka_unit_test(test_overrides_and_errors),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
