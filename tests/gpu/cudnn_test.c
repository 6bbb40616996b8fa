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

/* Many distinct problems planned before any runs: the engine's plan cache
 * grows past its first allocation while earlier nodes hold their plans
 * (a cache that moved its entries left those nodes with freed plans: a
 * crash on ResNet-50's 69 plans, none on ResNet-18c's 30). Every node's
 * output is then checked against the CPU. */
static void test_many_plans_kept(void **state) {
  enum { N = 40 };
  const stoke_kernel_v1 *gk = NULL, *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_CONV2D, STOKE_FWD, STOKE_F64,
                                                             STOKE_NHWC);
  void *es = NULL;
  gk = g_gpu_kernel(STOKE_OP_CONV2D, STOKE_FWD, STOKE_BF16, STOKE_NHWC, &es);
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_CONV2D, "many", "stride=1, padding=0", &node);
  if (e) fail_msg("%s", e->msg);
  g_tensor x[N], w[N], y[N];
  void *st[N], *ws[N];
  size_t wsb[N];
  stoke_kernel_args_v1 ga[N];
  stoke_tensor gin[N][2], gout[N][1];
  stoke_rng r = stoke_rng_seed(g_seed);
  for (int i = 0; i < N; i++) {
    int64_t c = 8 + 8 * (i % 8), k = 8 + 8 * (i / 8);
    g_alloc(&x[i], &(stoke_shape){4, {2, c, 4, 4}}, STOKE_BF16, STOKE_NHWC);
    g_alloc(&w[i], &(stoke_shape){4, {k, c, 1, 1}}, STOKE_BF16, STOKE_LAYOUT_ANY);
    g_alloc(&y[i], &(stoke_shape){4, {2, k, 4, 4}}, STOKE_BF16, STOKE_NHWC);
    g_fill(&x[i], &r, -1, 1, 0);
    g_fill(&w[i], &r, -1, 1, 0);
    g_poison(&y[i]);
    gin[i][0] = x[i].dev, gin[i][1] = w[i].dev, gout[i][0] = y[i].dev;
    ga[i] = (stoke_kernel_args_v1){.node = &node, .n_in = 2, .n_out = 1, .in = gin[i], .out = gout[i],
                                   .training = 1, .engine = es, .stream = g_dev->default_stream(g_dev_self),
                                   .flags = STOKE_KFLAG_AUTOTUNE};
    e = gk->plan(&ga[i], &st[i], &wsb[i]);
    if (e) fail_msg("plan %d: %s", i, e->msg);
  }
  for (int i = 0; i < N; i++) {
    ws[i] = NULL;
    if (wsb[i]) {
      e = g_dev->alloc(g_dev_self, wsb[i], &ws[i]);
      if (e) fail_msg("%s", e->msg);
    }
    ga[i].workspace = ws[i], ga[i].workspace_bytes = wsb[i];
    e = gk->run(&ga[i], st[i]);
    if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
    if (e) fail_msg("run %d: %s", i, e->msg);
    stoke_tensor rin[2] = {x[i].ref, w[i].ref}, rout[1] = {y[i].ref};
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .n_out = 1, .in = rin, .out = rout, .training = 1};
    g_run(rk, &ra, 0);
    double err = g_compare(&y[i], NULL);
    if (!(err <= G_TOL_LOW)) fail_msg("problem %d: relative error %.3g (seed %llu)", i, err, (unsigned long long)g_seed);
  }
  for (int i = 0; i < N; i++) {
    gk->destroy(st[i]);
    if (ws[i]) g_dev->free(g_dev_self, ws[i]);
    g_free(&x[i]), g_free(&w[i]), g_free(&y[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_3x3),      cmocka_unit_test(test_conv_3x3_stride2),
      cmocka_unit_test(test_conv_1x1),      cmocka_unit_test(test_conv_stem_7x7),
      cmocka_unit_test(test_conv_groups2),  cmocka_unit_test(test_conv_dilation2),
      cmocka_unit_test(test_conv_deep),     cmocka_unit_test(test_many_plans_kept),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
