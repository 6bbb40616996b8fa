/* tests/gpu/cudnn_test.c: the cudnn engine's conv2d plan cache under many
 * nodes planned at once (each against the CPU reference; every kernel's
 * shapes, dtypes, layouts and flags are every_kernel_test's). Runs on a
 * GPU machine only. */
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
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_many_plans_kept),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
