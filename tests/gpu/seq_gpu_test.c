/* tests/gpu/seq_gpu_test.c: the GPU kernels of the sequence ops against the
 * CPU reference (tests/gpu/gpu_harness.h: fresh random inputs, outputs
 * poisoned, relative-norm error by dtype): cuda's embedding (the sorted,
 * deterministic scatter-add backward), position_embedding, layer_norm,
 * add_layer_norm (both gradients flowing in), the views (reshape, slice,
 * split, transpose, i32 slices of token windows) and cublaslt's matmul
 * (the tied output head) and cuda's plain attention, in f32, bf16 and
 * fp16, on odd shapes too.
 * GPU machine only (tools/gpu_check.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"

static int setup(void **state) {
  static const char *engines[] = {"cuda", "cublaslt"};
  return g_setup_engines(engines, 2);
}

static const stoke_dtype dtypes[] = {STOKE_F32, STOKE_BF16, STOKE_F16};
static double tol_of(stoke_dtype t) { return t == STOKE_F32 ? G_TOL_F32 : G_TOL_LOW; }

#define SHAPE1(a) {1, {a}}
#define SHAPE2(a, b) {2, {a, b}}
#define SHAPE3(a, b, c) {3, {a, b, c}}

/* weight[V, C], idx[B, T] with ids below V (repeats: the scatter-add sums). */
static void test_embedding(void **state) {
  static const int64_t s[][4] = {{50, 16, 4, 33}, {7, 129, 3, 5}, {1, 1, 1, 1}, {1000, 64, 8, 64}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 4; i++) {
      g_case c = {.op = STOKE_OP_EMBEDDING, .attrs = "", .n_in = 2,
                  .in_shape = {SHAPE2(s[i][0], s[i][1]), SHAPE2(s[i][2], s[i][3])}, .is_label = {0, 1},
                  .classes = s[i][0], .param_mask = 1, .dtype = dtypes[d], .tol = tol_of(dtypes[d]),
                  .training = 1, .backward = 1};
      g_check(&c);
    }
}

static void test_position_embedding(void **state) {
  static const int64_t s[][4] = {{2, 5, 7, 9}, {4, 64, 48, 64}, {1, 1, 1, 1}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 3; i++) {
      g_case c = {.op = STOKE_OP_POSITION_EMBEDDING, .attrs = "", .n_in = 2,
                  .in_shape = {SHAPE3(s[i][0], s[i][1], s[i][2]), SHAPE2(s[i][3], s[i][2])}, .param_mask = 2,
                  .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
      g_check(&c);
    }
}

/* rows x C: odd widths, one row, GPT-2's 768 */
static void test_layer_norm(void **state) {
  static const int64_t s[][2] = {{37, 129}, {1, 7}, {300, 768}, {5, 33}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 4; i++)
      for (int add = 0; add < 2; add++) {
        stoke_shape x = SHAPE2(s[i][0], s[i][1]), w = SHAPE1(s[i][1]);
        g_case c = {.op = add ? STOKE_OP_ADD_LAYER_NORM : STOKE_OP_LAYER_NORM, .attrs = "eps=1e-5",
                    .n_in = add ? 4 : 3, .in_shape = {x, add ? x : w, w, w}, .param_mask = add ? 12 : 6,
                    .out_dtype = {0, add ? 0 : STOKE_F32, STOKE_F32, STOKE_F32}, .douts = add ? 3 : 1,
                    .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
        g_check(&c);
      }
}

static void test_views(void **state) {
  static const struct {
    const char *op, *attrs;
    stoke_shape x;
    uint32_t douts;
  } v[] = {
      {STOKE_OP_RESHAPE, "shape=4x-1", SHAPE3(2, 6, 5), 1},
      {STOKE_OP_SLICE, "dim=1, start=2, length=3", SHAPE3(3, 7, 5), 1},
      {STOKE_OP_SLICE, "dim=-1, start=1, length=4", SHAPE2(9, 6), 1},
      {STOKE_OP_SPLIT, "dim=2, sizes=5x5x5", SHAPE3(2, 3, 15), 7},
      {STOKE_OP_SPLIT, "dim=0, sizes=1x2", SHAPE2(3, 11), 2},
      {STOKE_OP_TRANSPOSE, "dim0=0, dim1=2", SHAPE3(3, 4, 5), 1},
      {STOKE_OP_TRANSPOSE, "dim0=1, dim1=2", SHAPE3(2, 33, 17), 1},
  };
  for (int d = 0; d < 3; d++)
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
      g_case c = {.op = v[i].op, .attrs = v[i].attrs, .n_in = 1, .in_shape = {v[i].x}, .douts = v[i].douts,
                  .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
      g_check(&c);
    }
  /* token windows [B, T + 1] -> tokens [B, T] (i32, forward only) */
  g_case c = {.op = STOKE_OP_SLICE, .attrs = "dim=1, start=1, length=16", .n_in = 1, .in_shape = {SHAPE2(4, 17)},
              .is_label = {1}, .classes = 50257, .dtype = STOKE_I32, .tol = 0, .training = 1, .backward = 0};
  g_check(&c);
}

/* matmul (cublaslt): x[N, in] W[out, in]^T, the tied head's shape among them */
static void test_matmul(void **state) {
  static const int64_t s[][3] = {{64, 32, 48}, {37, 129, 65}, {128, 768, 1024}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 3; i++) {
      g_case c = {.op = STOKE_OP_MATMUL, .attrs = "", .n_in = 2,
                  .in_shape = {SHAPE2(s[i][0], s[i][1]), SHAPE2(s[i][2], s[i][1])}, .param_mask = 2,
                  .dtype = dtypes[d], .tol = d ? G_TOL_LOW : G_TOL_TF32, .training = 1, .backward = 1};
      g_check(&c);
    }
}

/* cuda's plain attention (f32 too; cudnn's flash attention is in sdpa_test) */
static void test_attention(void **state) {
  static const int64_t s[][4] = {{2, 33, 3, 8}, {1, 64, 2, 32}, {2, 128, 4, 64}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 3; i++)
      for (int causal = 0; causal < 2; causal++) {
        char attrs[48];
        snprintf(attrs, sizeof attrs, "n_head=%lld, causal=%d", (long long)s[i][2], causal);
        g_case c = {.op = STOKE_OP_ATTENTION, .attrs = attrs, .n_in = 1,
                    .in_shape = {SHAPE3(s[i][0], s[i][1], 3 * s[i][2] * s[i][3])}, .out_dtype = {0, STOKE_F32},
                    .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
        g_check(&c);
      }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embedding), cmocka_unit_test(test_position_embedding), cmocka_unit_test(test_layer_norm),
      cmocka_unit_test(test_views),     cmocka_unit_test(test_matmul),            cmocka_unit_test(test_attention),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
