/* tests/gpu/cublaslt_test.c: the cublaslt engine's linear and linear_relu
 * kernels against the CPU reference (gpu_harness.h) in f32, TF32, bf16 and
 * fp16, forward and backward, and gradient accumulation
 * (param_grad_beta = 1) of dW, db. Runs on a GPU machine only. */
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

/* ------------------------------------------------------------ linear_relu
 *
 * The forward goes through g_check as linear's does: where the GPU's
 * rounding moves a pre-activation z across 0, the two outputs differ by
 * |z|, which is at most the rounding itself, so the relative norm is that
 * of linear.
 *
 * The backward does not. Its mask (y > 0) is a step: a z that the GPU
 * computes with the other sign makes dz differ by a whole |dy| ~ U[-1, 1]
 * at that element, not by a rounding error. With inputs in [-1, 1], z has
 * a standard deviation of sqrt(in / 9) (3.8 for in = 129, 10.7 for 1024),
 * so a density at 0 of about 0.1 and 0.04; the GPU's z is off by ~1e-5 in
 * f32 accumulation (bf16/fp16 products are exact in f32) and by ~4e-3 with
 * TF32 inputs. That gives about one flipped element per run at 4096 x 1000
 * outputs in f32 (relative error ~7e-4 against G_TOL_F32 = 1e-5) and
 * hundreds with TF32 (~1.6e-2 against G_TOL_TF32 = 1e-3); in bf16/fp16 one
 * flip in the 37 x 65 case alone is ~1.8e-2 against G_TOL_LOW (rare, but
 * a flake). So g_check's backward, where each side masks with its own
 * forward output, would be flaky. Instead the CPU reference backward is
 * given the GPU's forward output as y (in f64): the backward only reads
 * the sign of y, so both sides apply the same mask, and what is left is
 * the linear backward on dz, under linear's tolerances. The forward
 * output itself is still compared against the CPU's first. */

static void check_linear_relu_fwd(stoke_dtype dt, uint32_t flags, double tol) {
  for (int i = 0; i < N_SHAPES; i++) {
    int64_t n = shapes[i][0], k = shapes[i][1], o = shapes[i][2];
    print_message("linear_relu N=%lld in=%lld out=%lld %s%s\n", (long long)n, (long long)k, (long long)o,
                  stoke_dtype_name(dt), flags & STOKE_KFLAG_TF32 ? " (tf32)" : "");
    g_case c = {.op = STOKE_OP_LINEAR_RELU,
                .attrs = "",
                .n_in = 3,
                .in_shape = {{2, {n, k}}, {2, {o, k}}, {1, {o}}},
                .param_mask = (1u << 1) | (1u << 2),
                .dtype = dt,
                .tol = tol,
                .training = 1,
                .backward = 0, /* below, on the GPU's mask */
                .flags = flags};
    g_check(&c);
  }
}

/* y.ref = the GPU's y, in f64 (so the CPU backward masks as the GPU does). */
static void ref_from_device(g_tensor *y) {
  int64_t n = stoke_numel(&y->dev.shape);
  size_t bytes = (size_t)n * stoke_dtype_size(y->dev.dtype);
  void *host = malloc(bytes);
  stoke_err *e = g_dev->copy(g_dev_self, host, y->dev.data, bytes, STOKE_COPY_D2H, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("download: %s", e->msg);
  for (int64_t i = 0; i < n; i++) g_set(y->ref.data, y->ref.dtype, i, g_get(host, y->dev.dtype, i));
  free(host);
}

/* Forward on both sides, then the backward on the GPU's forward output:
 * once with beta 0 (twice = 0) or with beta 0 then 1 (twice = 1: dW and db
 * accumulate, dx is overwritten); without dx when no_dx. */
static void check_linear_relu_bwd(stoke_dtype dt, uint32_t flags, double tol, int64_t n, int64_t k, int64_t o,
                                  int twice, int no_dx) {
  print_message("linear_relu backward N=%lld in=%lld out=%lld %s%s%s%s%s\n", (long long)n, (long long)k,
                (long long)o, stoke_dtype_name(dt), flags & STOKE_KFLAG_TF32 ? " (tf32)" : "",
                flags & STOKE_KFLAG_DETERMINISTIC ? " (deterministic)" : "", twice ? " accumulate" : "",
                no_dx ? " no dx" : "");
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_LINEAR_RELU, "linear_relu_bwd", "", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)dt, 1993 + (uint64_t)n));
  stoke_shape xs = {2, {n, k}}, ws = {2, {o, k}}, bs = {1, {o}}, ys = {2, {n, o}};
  g_tensor x, w, b, y, dy, dx, dw, db;
  g_alloc(&x, &xs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&w, &ws, dt, STOKE_LAYOUT_ANY);
  g_alloc(&b, &bs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&y, &ys, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dy, &ys, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dx, &xs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dw, &ws, dt, STOKE_LAYOUT_ANY);
  g_alloc(&db, &bs, dt, STOKE_LAYOUT_ANY);
  g_fill(&x, &r, -1, 1, 0);
  g_fill(&w, &r, -1, 1, 0);
  g_fill(&b, &r, -1, 1, 0);
  g_fill(&dy, &r, -1, 1, 0);
  g_poison(&y);
  g_poison(&dx);
  g_poison(&dw); /* the first call has beta 0: must not read these */
  g_poison(&db);
  stoke_tensor rin[3] = {x.ref, w.ref, b.ref}, gin[3] = {x.dev, w.dev, b.dev};
  stoke_tensor rout[1] = {y.ref}, gout[1] = {y.dev};
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = 3, .n_out = 1, .in = rin, .out = rout, .training = 1,
                             .flags = flags};
  stoke_kernel_args_v1 ga = ra;
  ga.in = gin, ga.out = gout;
  ga.stream = g_dev->default_stream(g_dev_self);
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_LINEAR_RELU, STOKE_FWD, STOKE_F64,
                                                STOKE_LAYOUT_ANY);
  if (!rk) fail_msg("no CPU forward kernel for linear_relu");
  const stoke_kernel_v1 *gk = g_gpu_kernel(STOKE_OP_LINEAR_RELU, STOKE_FWD, dt, STOKE_LAYOUT_ANY, &ga.engine);
  g_run(rk, &ra, 0);
  g_run(gk, &ga, 1);
  double mx, err = g_compare(&y, &mx);
  print_message("  linear_relu fwd y  %-5s rel err %.3g (max abs %.3g)\n", stoke_dtype_name(dt), err, mx);
  if (!(err <= tol))
    fail_msg("linear_relu forward (%s): relative error %.3g > %.3g (seed %llu)", stoke_dtype_name(dt), err, tol,
             (unsigned long long)g_seed);
  /* count the elements whose sign the GPU got differently (information) */
  int64_t ny = n * o, flips = 0;
  double *cpu_y = malloc((size_t)(ny ? ny : 1) * sizeof(double));
  memcpy(cpu_y, y.ref.data, (size_t)ny * sizeof(double));
  ref_from_device(&y);
  for (int64_t i = 0; i < ny; i++) flips += (cpu_y[i] > 0) != (((double *)y.ref.data)[i] > 0);
  free(cpu_y);
  print_message("  linear_relu mask: %lld of %lld elements differ from the f64 forward\n", (long long)flips,
                (long long)ny);

  /* backward: x, W and y live (bwd_needs), the bias not */
  rin[2].data = gin[2].data = NULL;
  stoke_tensor rdin[3] = {dx.ref, dw.ref, db.ref}, gdin[3] = {dx.dev, dw.dev, db.dev};
  if (no_dx) rdin[0].data = gdin[0].data = NULL;
  stoke_tensor rdout[1] = {dy.ref}, gdout[1] = {dy.dev};
  stoke_kernel_args_v1 rb = ra, gb = ga;
  rb.din = rdin, rb.dout = rdout, gb.din = gdin, gb.dout = gdout;
  rb.param_grads = gb.param_grads = (1u << 1) | (1u << 2);
  rb.param_grad_beta = gb.param_grad_beta = 0;
  rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_LINEAR_RELU, STOKE_BWD, STOKE_F64, STOKE_LAYOUT_ANY);
  if (!rk) fail_msg("no CPU backward kernel for linear_relu");
  gk = g_gpu_kernel(STOKE_OP_LINEAR_RELU, STOKE_BWD, dt, STOKE_LAYOUT_ANY, &gb.engine);
  if (twice) {
    run_twice(rk, &rb, 0);
    run_twice(gk, &gb, 1);
  } else {
    g_run(rk, &rb, 0);
    g_run(gk, &gb, 1);
  }
  const g_tensor *outs[3] = {&dx, &dw, &db};
  static const char *names[3] = {"dx", "dW", "db"};
  for (int i = no_dx ? 1 : 0; i < 3; i++) {
    err = g_compare(outs[i], &mx);
    print_message("  linear_relu bwd %-2s %-5s rel err %.3g (max abs %.3g)\n", names[i], stoke_dtype_name(dt), err,
                  mx);
    if (!(err <= tol))
      fail_msg("linear_relu backward %s (%s%s): relative error %.3g > %.3g (seed %llu)", names[i],
               stoke_dtype_name(dt), twice ? ", accumulated" : "", err, tol, (unsigned long long)g_seed);
  }
  g_tensor *all[8] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
  for (int i = 0; i < 8; i++) g_free(all[i]);
}

static void check_linear_relu(stoke_dtype dt, uint32_t flags, double tol) {
  check_linear_relu_fwd(dt, flags, tol);
  for (int i = 0; i < N_SHAPES; i++)
    check_linear_relu_bwd(dt, flags, tol, shapes[i][0], shapes[i][1], shapes[i][2], 0, 0);
}

static void test_linear_relu_f32(void **state) { check_linear_relu(STOKE_F32, 0, G_TOL_F32); }
static void test_linear_relu_tf32(void **state) { check_linear_relu(STOKE_F32, STOKE_KFLAG_TF32, G_TOL_TF32); }
static void test_linear_relu_bf16(void **state) { check_linear_relu(STOKE_BF16, 0, G_TOL_LOW); }
static void test_linear_relu_f16(void **state) { check_linear_relu(STOKE_F16, 0, G_TOL_LOW); }

static void test_linear_relu_accumulate(void **state) {
  check_linear_relu_bwd(STOKE_F32, 0, G_TOL_F32, 64, 128, 256, 1, 0);
  check_linear_relu_bwd(STOKE_F32, STOKE_KFLAG_DETERMINISTIC, G_TOL_F32, 37, 129, 65, 1, 0);
  check_linear_relu_bwd(STOKE_F32, 0, G_TOL_F32, 37, 129, 65, 0, 1);
  check_linear_relu_bwd(STOKE_BF16, 0, G_TOL_LOW, 64, 128, 256, 1, 0);
  check_linear_relu_bwd(STOKE_F16, 0, G_TOL_LOW, 37, 129, 65, 1, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear_f32),  cmocka_unit_test(test_linear_tf32),
      cmocka_unit_test(test_linear_bf16), cmocka_unit_test(test_linear_f16),
      cmocka_unit_test(test_linear_accumulate),
      cmocka_unit_test(test_linear_relu_f32),  cmocka_unit_test(test_linear_relu_tf32),
      cmocka_unit_test(test_linear_relu_bf16), cmocka_unit_test(test_linear_relu_f16),
      cmocka_unit_test(test_linear_relu_accumulate),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
