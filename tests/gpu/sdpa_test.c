/* tests/gpu/sdpa_test.c: cudnn's attention (backends/cudnn/sdpa.c, cuDNN's
 * flash-attention operation graphs) against the CPU reference
 * (tests/gpu/gpu_harness.h: fresh random qkv, outputs poisoned): y, the
 * per-row log-sum-exp (cuDNN's stats) and dqkv, causal, bf16 and fp16,
 * GPT-2's head size 64 and others. GPU machine only (tools/gpu_check.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"

static int setup(void **state) { return g_setup_engine_first("cudnn"); }

static void test_attention(void **state) {
  static const stoke_dtype dtypes[] = {STOKE_BF16, STOKE_F16};
  static const int64_t s[][4] = {{2, 128, 4, 64}, {1, 64, 2, 32}, {3, 100, 3, 64}, {2, 256, 12, 64}, {1, 32, 1, 128}};
  for (int d = 0; d < 2; d++)
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
      char attrs[48];
      snprintf(attrs, sizeof attrs, "n_head=%lld, causal=1", (long long)s[i][2]);
      g_case c = {.op = STOKE_OP_ATTENTION, .attrs = attrs, .n_in = 1,
                  .in_shape = {{3, {s[i][0], s[i][1], 3 * s[i][2] * s[i][3]}}}, .out_dtype = {0, STOKE_F32},
                  .dtype = dtypes[d], .tol = G_TOL_LOW, .training = 1, .backward = 1};
      g_check(&c);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_attention)};
  return cmocka_run_group_tests(tests, setup, g_teardown_engine_first);
}
