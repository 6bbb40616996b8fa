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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_interval),
      cmocka_unit_test(test_not_counted),
      cmocka_unit_test(test_no_nvml),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
