/* tests/gpu/cudnn_test.c: the cudnn engine's conv2d (forward, dx, dW)
 * against the CPU reference (gpu_harness.h) in NCHW and NHWC, f32 (fp32
 * and TF32), bf16 and fp16, with autotune and deterministic algorithms
 * spread over the cases. Runs on a GPU machine only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"

static int setup(void **state) {
  static const char *engines[] = {"cuda", "cudnn"};
  return g_setup_engines(engines, 2);
}

/* One convolution geometry: x [n, c, h, w], weight [o, c/groups, k, k]. */
typedef struct conv_geo {
  const char *what, *attrs;
  int64_t n, c, h, w, o, k, groups;
} conv_geo;

static const conv_geo geos[] = {
    {"3x3 stride 1 pad 1", "stride=1, padding=1", 8, 16, 14, 14, 32, 3, 1},
    {"3x3 stride 2 pad 1", "stride=2, padding=1", 8, 16, 14, 14, 32, 3, 1},
    {"1x1", "stride=1, padding=0", 8, 16, 14, 14, 32, 1, 1},
    {"7x7 stride 2 pad 3 (stem)", "stride=2, padding=3", 4, 3, 32, 32, 32, 7, 1},
    {"3x3 groups 2", "stride=1, padding=1, groups=2", 8, 16, 14, 14, 32, 3, 2},
    {"3x3 dilation 2", "stride=1, padding=2, dilation=2", 8, 16, 14, 14, 32, 3, 1},
    {"3x3 ResNet-18 layer4 (4x4, 512)", "stride=1, padding=1", 8, 512, 4, 4, 512, 3, 1},
    {"3x3 stride 2 ResNet-18c layer4 (8x8 -> 4x4, 128)", "stride=2, padding=1", 8, 64, 8, 8, 128, 3, 1},
};

/* Per dtype variant, the extra flags rotate over the geometries so every
 * dtype meets heuristics, autotune, deterministic and both together. */
static const uint32_t extra_flags[4] = {0, STOKE_KFLAG_AUTOTUNE, STOKE_KFLAG_DETERMINISTIC,
                                        STOKE_KFLAG_AUTOTUNE | STOKE_KFLAG_DETERMINISTIC};

typedef struct variant {
  stoke_dtype dtype;
  uint32_t flags;
  double tol;
} variant;

static const variant variants[4] = {
    {STOKE_F32, 0, G_TOL_F32},
    {STOKE_F32, STOKE_KFLAG_TF32, G_TOL_TF32},
    {STOKE_BF16, 0, G_TOL_LOW},
    {STOKE_F16, 0, G_TOL_LOW},
};

static void check_geo(int gi) {
  const conv_geo *g = &geos[gi];
  static const stoke_layout layouts[2] = {STOKE_NCHW, STOKE_NHWC};
  for (int li = 0; li < 2; li++)
    for (int v = 0; v < 4; v++) {
      uint32_t flags = variants[v].flags | extra_flags[(gi + v) % 4];
      print_message("conv2d %s, %s, %s%s%s%s\n", g->what, layouts[li] == STOKE_NHWC ? "NHWC" : "NCHW",
                    stoke_dtype_name(variants[v].dtype), flags & STOKE_KFLAG_TF32 ? " tf32" : "",
                    flags & STOKE_KFLAG_AUTOTUNE ? " autotune" : "",
                    flags & STOKE_KFLAG_DETERMINISTIC ? " deterministic" : "");
      g_case c = {.op = STOKE_OP_CONV2D,
                  .attrs = g->attrs,
                  .n_in = 2,
                  .in_shape = {{4, {g->n, g->c, g->h, g->w}}, {4, {g->o, g->c / g->groups, g->k, g->k}}},
                  .param_mask = 1u << 1,
                  .layout = layouts[li],
                  .dtype = variants[v].dtype,
                  .tol = variants[v].tol,
                  .training = 1,
                  .backward = 1,
                  .flags = flags};
      g_check(&c);
    }
}

static void test_conv_3x3(void **state) { check_geo(0); }
static void test_conv_3x3_stride2(void **state) { check_geo(1); }
static void test_conv_1x1(void **state) { check_geo(2); }
static void test_conv_stem_7x7(void **state) { check_geo(3); }
static void test_conv_groups2(void **state) { check_geo(4); }
static void test_conv_dilation2(void **state) { check_geo(5); }
static void test_conv_deep(void **state) {
  check_geo(6);
  check_geo(7);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_3x3),      cmocka_unit_test(test_conv_3x3_stride2),
      cmocka_unit_test(test_conv_1x1),      cmocka_unit_test(test_conv_stem_7x7),
      cmocka_unit_test(test_conv_groups2),  cmocka_unit_test(test_conv_dilation2),
      cmocka_unit_test(test_conv_deep),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
