/* tests/gpu/cuda_norm_test.c: the cuda backend's batch_norm, max_pool2d and
 * avg_pool2d kernels against the CPU reference in f64 (gpu_harness.h), in
 * f32, bf16 and fp16, NCHW and NHWC (the update's kernels are in
 * cuda_optim_test.c). Runs on a GPU machine only. */
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
static const stoke_layout layouts[] = {STOKE_NCHW, STOKE_NHWC};
static double tol_of(stoke_dtype t) { return t == STOKE_F32 ? G_TOL_F32 : G_TOL_LOW; }

/* ------------------------------------------------------------- batch_norm */

/* x shapes: a small and a larger 4-D (several row partitions, channels not
 * a multiple of 32), ResNet-18's last stage on 32x32 images at batch 8
 * (8x4x4 values per channel; 128 and 512 channels), a 2-D (BatchNorm1d). */
static const stoke_shape bn_shapes[] = {
    {4, {4, 6, 5, 7}},
    {4, {8, 40, 17, 19}},
    {4, {8, 128, 4, 4}},
    {4, {8, 512, 4, 4}},
    {2, {1000, 40}},
};

static g_case bn_case(const stoke_shape *x, stoke_dtype dt, stoke_layout lay, int training) {
  int64_t c = x->d[1];
  g_case k = {.op = STOKE_OP_BATCH_NORM, .attrs = "eps=1e-5, momentum=0.2", .n_in = 5,
              .in_shape = {*x, {1, {c}}, {1, {c}}, {1, {c}}, {1, {c}}},
              .param_mask = (1u << 1) | (1u << 2), .state_mask = (1u << 3) | (1u << 4),
              .layout = lay, .dtype = dt, .tol = tol_of(dt), .training = training, .backward = 1};
  return k;
}

static void test_batch_norm(void **state) {
  for (int d = 0; d < 3; d++)
    for (size_t s = 0; s < sizeof bn_shapes / sizeof *bn_shapes; s++)
      for (int l = 0; l < 2; l++) {
        if (bn_shapes[s].ndim != 4 && l > 0) continue; /* layout means nothing in 2-D */
        for (int training = 1; training >= 0; training--) {
          print_message("batch_norm %s x %dD %s %s\n", stoke_dtype_name(dtypes[d]),
                        bn_shapes[s].ndim, layouts[l] == STOKE_NHWC ? "NHWC" : "NCHW",
                        training ? "training" : "eval");
          g_case c = bn_case(&bn_shapes[s], dtypes[d], layouts[l], training);
          g_check(&c);
        }
      }
}

/* g_check compares outputs and input gradients, not the running statistics
 * the forward updates in place: two training forwards then one eval
 * forward on both sides, the running stats (inputs 3 and 4) compared after
 * each. The statistics are f32 from the same (rounded) x on both sides, so
 * the f32 tolerance applies to every dtype. Eval must leave them alone. */
static void bn_running_stats(const stoke_shape *xs, stoke_dtype dt, stoke_layout lay) {
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_BATCH_NORM, "bn_running", "eps=1e-5, momentum=0.2",
                                 &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 1234 + (uint64_t)dt, (uint64_t)lay));
  int64_t c = xs->d[1];
  stoke_shape cs = {1, {c}};
  stoke_layout xl = xs->ndim == 4 ? lay : STOKE_LAYOUT_ANY;
  g_tensor in[5], out[3];
  g_alloc(&in[0], xs, dt, xl);
  g_alloc(&in[1], &cs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&in[2], &cs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&in[3], &cs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&in[4], &cs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_fill(&in[1], &r, -1, 1, 0);
  g_fill(&in[2], &r, -1, 1, 0);
  g_fill(&in[3], &r, -0.5, 0.5, 0);
  g_fill(&in[4], &r, 0.5, 1.5, 0);
  g_alloc2(&out[0], xs, STOKE_F64, dt, xl);
  g_alloc2(&out[1], &cs, STOKE_F64, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc2(&out[2], &cs, STOKE_F64, STOKE_F32, STOKE_LAYOUT_ANY);
  stoke_tensor ri[5], ro[3], gi[5], go[3];
  for (int i = 0; i < 5; i++) ri[i] = in[i].ref, gi[i] = in[i].dev;
  for (int j = 0; j < 3; j++) ro[j] = out[j].ref, go[j] = out[j].dev;
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_BATCH_NORM, STOKE_FWD, STOKE_F64, lay);
  if (!rk) fail_msg("no CPU batch_norm kernel");
  void *es = NULL;
  const stoke_kernel_v1 *gk = g_gpu_kernel(STOKE_OP_BATCH_NORM, STOKE_FWD, dt, lay, &es);
  for (int step = 0; step < 3; step++) {
    int training = step < 2;
    g_fill(&in[0], &r, -2, 3, 0); /* a mean away from 0 */
    for (int j = 0; j < 3; j++) g_poison(&out[j]);
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 5, .n_out = 3, .in = ri, .out = ro,
                               .training = training};
    stoke_kernel_args_v1 ga = ra;
    ga.in = gi;
    ga.out = go;
    ga.engine = es;
    ga.stream = g_dev->default_stream(g_dev_self);
    float before[2][64], after[2][64];
    int64_t nc = c < 64 ? c : 64;
    for (int i = 0; i < 2; i++) g_dev_get(before[i], in[3 + i].dev.data, (size_t)nc * sizeof(float));
    g_run(rk, &ra, 0);
    g_run(gk, &ga, 1);
    for (int i = 0; i < 2; i++) g_dev_get(after[i], in[3 + i].dev.data, (size_t)nc * sizeof(float));
    static const char *const names[] = {"running_mean", "running_var"};
    for (int i = 3; i < 5; i++) {
      double mx, err = g_compare(&in[i], &mx);
      print_message("  batch_norm %-12s %-5s %-4s %dD %s: rel err %.3g (max abs %.3g)\n",
                    names[i - 3], stoke_dtype_name(dt), lay == STOKE_NHWC ? "NHWC" : "NCHW",
                    xs->ndim, training ? "training" : "eval", err, mx);
      if (!(err <= G_TOL_F32))
        fail_msg("batch_norm %s after %s forward %d: relative error %.3g > %.3g (seed %llu)",
                 names[i - 3], training ? "training" : "eval", step, err, G_TOL_F32,
                 (unsigned long long)g_seed);
      if (!training && memcmp(before[i - 3], after[i - 3], (size_t)nc * sizeof(float)))
        fail_msg("batch_norm eval changed %s", names[i - 3]);
    }
  }
  for (int i = 0; i < 5; i++) g_free(&in[i]);
  for (int j = 0; j < 3; j++) g_free(&out[j]);
}

static void test_batch_norm_running_stats(void **state) {
  for (int d = 0; d < 3; d++)
    for (size_t s = 0; s < sizeof bn_shapes / sizeof *bn_shapes; s++)
      for (int l = 0; l < 2; l++)
        if (bn_shapes[s].ndim == 4 || l == 0) bn_running_stats(&bn_shapes[s], dtypes[d], layouts[l]);
}

/* ------------------------------------------------------------------ pools */

static const char *const pool_attrs[] = {
    "kernel=2, stride=2",
    "kernel=3, stride=2, padding=1",
    "kernel=3x2, stride=1x2, padding=1x0", /* overlapping windows, uneven dims */
};

/* 5 channels: one element per thread; 16 and 64: the NHWC kernels that
 * take 16 bytes of channels per thread (ResNet's stem pool is the last). */
static const stoke_shape pool_shapes[] = {{4, {3, 5, 12, 11}}, {4, {2, 16, 9, 10}}, {4, {2, 64, 28, 28}}};

static void pool_cases(const char *op) {
  for (int d = 0; d < 3; d++)
    for (int l = 0; l < 2; l++)
      for (size_t a = 0; a < sizeof pool_attrs / sizeof *pool_attrs; a++)
        for (size_t s = 0; s < sizeof pool_shapes / sizeof *pool_shapes; s++) {
          const int64_t *dd = pool_shapes[s].d;
          print_message("%s %s %s %s x [%lld, %lld, %lld, %lld]\n", op, pool_attrs[a], stoke_dtype_name(dtypes[d]),
                        layouts[l] == STOKE_NHWC ? "NHWC" : "NCHW", (long long)dd[0], (long long)dd[1],
                        (long long)dd[2], (long long)dd[3]);
          g_case c = {.op = op, .attrs = pool_attrs[a], .n_in = 1, .in_shape = {pool_shapes[s]},
                      .layout = layouts[l], .dtype = dtypes[d], .tol = tol_of(dtypes[d]),
                      .training = 1, .backward = 1};
          g_check(&c);
        }
}

static void test_max_pool2d(void **state) { pool_cases(STOKE_OP_MAX_POOL2D); }
static void test_avg_pool2d(void **state) { pool_cases(STOKE_OP_AVG_POOL2D); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_norm),
      cmocka_unit_test(test_batch_norm_running_stats),
      cmocka_unit_test(test_max_pool2d),
      cmocka_unit_test(test_avg_pool2d),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
