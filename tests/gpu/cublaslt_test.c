/* tests/gpu/cublaslt_test.c: the cublaslt engine's linear kernels against
 * the CPU reference (gpu_harness.h) in f32, TF32, bf16 and fp16, forward
 * and backward, and gradient accumulation (param_grad_beta = 1) of dW, db.
 * Runs on a GPU machine only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"

static int setup(void **state) {
  /* the cuda device opens first: cublaslt runs on it */
  return g_setup_engines((const char *[]){"cuda", "cublaslt"}, 2);
}

/* N, in, out: aligned, odd (no multiple of 8: the fallback algorithms and
 * the tensor-core warning), and large enough for split-K and big tiles. */
static const int64_t shapes[][3] = {{64, 128, 256}, {37, 129, 65}, {4096, 1024, 1000}};
#define N_SHAPES (int)(sizeof shapes / sizeof *shapes)

static void check_linear(stoke_dtype dt, uint32_t flags, double tol) {
  for (int i = 0; i < N_SHAPES; i++) {
    int64_t n = shapes[i][0], k = shapes[i][1], o = shapes[i][2];
    print_message("linear N=%lld in=%lld out=%lld %s%s\n", (long long)n, (long long)k, (long long)o,
                  stoke_dtype_name(dt), flags & STOKE_KFLAG_TF32 ? " (tf32)" : "");
    g_case c = {.op = STOKE_OP_LINEAR,
                .attrs = "",
                .n_in = 3,
                .in_shape = {{2, {n, k}}, {2, {o, k}}, {1, {o}}},
                .param_mask = (1u << 1) | (1u << 2),
                .dtype = dt,
                .tol = tol,
                .training = 1,
                .backward = 1,
                .flags = flags};
    g_check(&c);
  }
}

static void test_linear_f32(void **state) { check_linear(STOKE_F32, 0, G_TOL_F32); }
static void test_linear_tf32(void **state) { check_linear(STOKE_F32, STOKE_KFLAG_TF32, G_TOL_TF32); }
static void test_linear_bf16(void **state) { check_linear(STOKE_BF16, 0, G_TOL_LOW); }
static void test_linear_f16(void **state) { check_linear(STOKE_F16, 0, G_TOL_LOW); }

/* plan once, then run the backward kernel with beta 0 and again with beta
 * 1, as the executor does over two micro-batches. */
static void run_twice(const stoke_kernel_v1 *k, stoke_kernel_args_v1 *a, int gpu) {
  void *st = NULL, *ws = NULL;
  size_t wsb = 0;
  stoke_err *e = k->plan ? k->plan(a, &st, &wsb) : NULL;
  if (!e && wsb) {
    if (gpu) e = g_dev->alloc(g_dev_self, wsb, &ws);
    else ws = malloc(wsb);
  }
  a->workspace = ws;
  a->workspace_bytes = wsb;
  for (int pass = 0; pass < 2 && !e; pass++) {
    a->param_grad_beta = (float)pass;
    e = k->run(a, st);
  }
  if (!e && gpu) e = g_dev->stream_sync(g_dev_self, NULL);
  if (k->destroy && st) k->destroy(st);
  if (ws) {
    if (gpu) g_dev->free(g_dev_self, ws);
    else free(ws);
  }
  if (e) fail_msg("%s kernel %s/%s: %s", gpu ? "GPU" : "CPU", k->engine, k->op, e->msg);
}

/* dW = dy^T x + dy^T x and db = 2 colsum(dy) after two calls (the first
 * with beta 0 may fuse db into the dW product, the second must
 * accumulate); dx is overwritten both times. */
static void check_accumulate(stoke_dtype dt, uint32_t flags, double tol, int64_t n, int64_t k, int64_t o) {
  print_message("linear accumulate N=%lld in=%lld out=%lld %s%s\n", (long long)n, (long long)k, (long long)o,
                stoke_dtype_name(dt), flags & STOKE_KFLAG_DETERMINISTIC ? " (deterministic)" : "");
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_LINEAR, "linear_acc", "", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)dt, 991));
  stoke_shape xs = {2, {n, k}}, ws = {2, {o, k}}, bs = {1, {o}}, ys = {2, {n, o}};
  g_tensor x, w, b, dy, dx, dw, db;
  g_alloc(&x, &xs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&w, &ws, dt, STOKE_LAYOUT_ANY);
  g_alloc(&b, &bs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dy, &ys, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dx, &xs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dw, &ws, dt, STOKE_LAYOUT_ANY);
  g_alloc(&db, &bs, dt, STOKE_LAYOUT_ANY);
  g_fill(&x, &r, -1, 1, 0);
  g_fill(&w, &r, -1, 1, 0);
  g_fill(&b, &r, -1, 1, 0);
  g_fill(&dy, &r, -1, 1, 0);
  g_poison(&dx);
  g_poison(&dw); /* the first call has beta 0: must not read these */
  g_poison(&db);
  stoke_tensor rin[3] = {x.ref, w.ref, b.ref}, gin[3] = {x.dev, w.dev, b.dev};
  stoke_tensor rout[1] = {{NULL, ys, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}};
  stoke_tensor gout[1] = {{NULL, ys, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_tensor rdin[3] = {dx.ref, dw.ref, db.ref}, gdin[3] = {dx.dev, dw.dev, db.dev};
  stoke_tensor rdout[1] = {dy.ref}, gdout[1] = {dy.dev};
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = 3, .n_out = 1, .in = rin, .out = rout, .din = rdin,
                             .dout = rdout, .param_grads = (1u << 1) | (1u << 2), .training = 1, .flags = flags};
  stoke_kernel_args_v1 ga = ra;
  ga.in = gin, ga.out = gout, ga.din = gdin, ga.dout = gdout;
  ga.stream = g_dev->default_stream(g_dev_self);
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_LINEAR, STOKE_BWD, STOKE_F64,
                                                STOKE_LAYOUT_ANY);
  if (!rk) fail_msg("no CPU backward kernel for linear");
  const stoke_kernel_v1 *gk = g_gpu_kernel(STOKE_OP_LINEAR, STOKE_BWD, dt, STOKE_LAYOUT_ANY, &ga.engine);
  run_twice(rk, &ra, 0);
  run_twice(gk, &ga, 1);
  const g_tensor *outs[3] = {&dx, &dw, &db};
  static const char *names[3] = {"dx", "dW", "db"};
  for (int i = 0; i < 3; i++) {
    double mx, err = g_compare(outs[i], &mx);
    print_message("  linear accumulate %-2s %-5s rel err %.3g (max abs %.3g)\n", names[i], stoke_dtype_name(dt),
                  err, mx);
    if (!(err <= tol))
      fail_msg("linear accumulate %s (%s): relative error %.3g > %.3g (seed %llu)", names[i], stoke_dtype_name(dt),
               err, tol, (unsigned long long)g_seed);
  }
  g_tensor *all[7] = {&x, &w, &b, &dy, &dx, &dw, &db};
  for (int i = 0; i < 7; i++) g_free(all[i]);
}

static void test_linear_accumulate(void **state) {
  check_accumulate(STOKE_F32, 0, G_TOL_F32, 64, 128, 256);
  check_accumulate(STOKE_F32, 0, G_TOL_F32, 37, 129, 65);
  check_accumulate(STOKE_F32, STOKE_KFLAG_DETERMINISTIC, G_TOL_F32, 37, 129, 65);
  check_accumulate(STOKE_F32, STOKE_KFLAG_TF32, G_TOL_TF32, 4096, 1024, 1000);
  check_accumulate(STOKE_BF16, 0, G_TOL_LOW, 64, 128, 256);
  check_accumulate(STOKE_F16, 0, G_TOL_LOW, 37, 129, 65);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear_f32),  cmocka_unit_test(test_linear_tf32),
      cmocka_unit_test(test_linear_bf16), cmocka_unit_test(test_linear_f16),
      cmocka_unit_test(test_linear_accumulate),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
