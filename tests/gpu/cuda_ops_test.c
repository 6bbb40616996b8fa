/* tests/gpu/cuda_ops_test.c: the cuda backend's elementwise kernels against
 * the CPU reference (gpu_harness.h), in f32, bf16 and fp16, forward and
 * backward. Runs on a GPU machine only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"

static int setup(void **state) {
  static const char *engines[] = {"cuda"};
  return g_setup_engines(engines, 1);
}

static const stoke_dtype dtypes[] = {STOKE_F32, STOKE_BF16, STOKE_F16};
static double tol_of(stoke_dtype t) { return t == STOKE_F32 ? G_TOL_F32 : G_TOL_LOW; }

static void test_relu(void **state) {
  for (int d = 0; d < 3; d++) {
    g_case c = {.op = STOKE_OP_RELU, .attrs = "", .n_in = 1, .in_shape = {{2, {37, 129}}}, .dtype = dtypes[d],
                .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
    g_check(&c);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relu),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
