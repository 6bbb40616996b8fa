/* tests/unit/nvml_test.c: the power figures' arithmetic (core/nvml.c): mean
 * power from the energy counter's difference, the share of the time the
 * power limit held the clocks down from the violation counter's, and what
 * a machine without NVML (this one, CI's) gets: NaN, reported as null. The
 * counters themselves are the driver's: BENCHMARKS.md's run 31 checks
 * them on an H200 against nvidia-smi. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "stoke/nvml.h"

static void test_interval(void **state) {
  (void)state;
  double w, capped;
  stoke_power_interval(2.0, 1380000.0, 1.5e9, &w, &capped); /* 1,380 J over 2 s, capped 1.5 s of them */
  assert_float_equal(w, 690.0, 1e-9);
  assert_float_equal(capped, 0.75, 1e-12);
  stoke_power_interval(0.5, 0.0, 0.0, &w, &capped); /* idle counters: 0 W, never capped */
  assert_float_equal(w, 0.0, 0.0);
  assert_float_equal(capped, 0.0, 0.0);
  /* the driver's violation clock runs a hair ahead of ours: all of the time, not more */
  stoke_power_interval(1.0, 700000.0, 1.0002e9, &w, &capped);
  assert_float_equal(capped, 1.0, 0.0);
}

static void test_not_counted(void **state) {
  (void)state;
  double w, capped;
  stoke_power_interval(1.0, -1, 2e8, &w, &capped); /* no energy counter */
  assert_true(isnan(w));
  assert_float_equal(capped, 0.2, 1e-12);
  stoke_power_interval(1.0, 5000.0, -1, &w, &capped); /* no violation counter */
  assert_float_equal(w, 5.0, 1e-12);
  assert_true(isnan(capped));
  stoke_power_interval(0.0, 5000.0, 1e6, &w, &capped); /* no time passed: nothing to divide by */
  assert_true(isnan(w) && isnan(capped));
  stoke_power_interval(NAN, 5000.0, 1e6, &w, &capped);
  assert_true(isnan(w) && isnan(capped));
}

static void test_no_nvml(void **state) {
  (void)state;
  stoke_power_sample p = {1, 2, 3, 4};
  assert_int_equal(stoke_nvml_power(NULL, &p), -1);
  assert_true(isnan(p.power_w) && isnan(p.capped) && isnan(p.sm_mhz) && p.span_s == 0);
  double limit = 0, clock = 0;
  stoke_nvml_power_limits(NULL, &limit, &clock);
  assert_true(isnan(limit) && isnan(clock));
}

/* CUDA's device index to NVML's (core/nvml.c reads the GPU the run is on,
 * not NVML's GPU 0: an H200 run under CUDA_VISIBLE_DEVICES=1 reported the
 * idle GPU 0's 81 W and 345 MHz before, BENCHMARKS.md run 34). */
static void test_visible(void **state) {
  (void)state;
  char id[32] = "unchanged";
  assert_int_equal(stoke_nvml_visible(NULL, 3, id, sizeof id), 3); /* unset: CUDA's order is NVML's */
  assert_int_equal(stoke_nvml_visible("2,0", 0, id, sizeof id), 2);
  assert_int_equal(stoke_nvml_visible("2,0", 1, id, sizeof id), 0);
  assert_int_equal(stoke_nvml_visible("2,0", 2, id, sizeof id), -1); /* no third device */
  assert_int_equal(stoke_nvml_visible(" 1 , 3 ", 1, id, sizeof id), 3);
  assert_string_equal(id, "unchanged");
  assert_int_equal(stoke_nvml_visible("GPU-5e1f,1", 0, id, sizeof id), -2);
  assert_string_equal(id, "GPU-5e1f");
  assert_int_equal(stoke_nvml_visible("GPU-5e1f,1", 1, id, sizeof id), 1);
  /* CUDA reads up to the first invalid entry */
  assert_int_equal(stoke_nvml_visible("1,x,2", 0, id, sizeof id), 1);
  assert_int_equal(stoke_nvml_visible("1,x,2", 2, id, sizeof id), -1);
  assert_int_equal(stoke_nvml_visible("0,,1", 1, id, sizeof id), -1);
  assert_int_equal(stoke_nvml_visible("", 0, id, sizeof id), -1);
  assert_int_equal(stoke_nvml_visible("-1", 0, id, sizeof id), -1);
  assert_int_equal(stoke_nvml_visible("MIG-0b2c", 0, id, sizeof id), -1);
  assert_int_equal(stoke_nvml_visible("0", -1, id, sizeof id), -1);
  /* a UUID longer than the caller's buffer is refused, not cut */
  assert_int_equal(stoke_nvml_visible("GPU-0123456789abcdef0123456789abcdef", 0, id, sizeof id), -1);
}

/* The data-parallel report's line of every rank's power and clock. */
static void test_power_by_rank(void **state) {
  (void)state;
  char out[128];
  const double w[3] = {687.4, 689.0, NAN}, mhz[3] = {1816.2, 1892.0, 1900.0};
  stoke_power_by_rank(w, mhz, 3, out, sizeof out);
  assert_string_equal(out, "0: 687 W, 1816 MHz; 1: 689 W, 1892 MHz; 2: n/a, 1900 MHz");
  const double none[2] = {NAN, NAN};
  strcpy(out, "poison");
  stoke_power_by_rank(none, none, 2, out, sizeof out);
  assert_string_equal(out, ""); /* no NVML anywhere: no line */
  char small[12];
  stoke_power_by_rank(w, mhz, 3, small, sizeof small); /* cut, still a string */
  assert_int_equal(strlen(small), sizeof small - 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_interval),
      cmocka_unit_test(test_not_counted),
      cmocka_unit_test(test_no_nvml),
      cmocka_unit_test(test_visible),
      cmocka_unit_test(test_power_by_rank),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
