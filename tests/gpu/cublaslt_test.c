/* tests/gpu/cublaslt_test.c: the cublaslt engine's linear, linear_relu,
 * linear_act and linear_dact kernels where every_kernel_test (every
 * kernel and dtype on small and odd shapes) does not reach: two
 * backward calls in a row (the first may fuse db into the dW product, the
 * second must accumulate), without dx, the activation kernels' variants
 * (deterministic, no db2),
 * autotuned algorithms on large shapes (split-K), and the autotune cache,
 * against the CPU reference (gpu_harness.h). Runs on a GPU machine only. */
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

/* " (tf32, deterministic, autotune)": the flags set, for the messages. */
static const char *flag_str(uint32_t flags) {
  static const struct {
    uint32_t flag;
    const char *name;
  } names[] = {{STOKE_KFLAG_TF32, "tf32"}, {STOKE_KFLAG_DETERMINISTIC, "deterministic"}, {STOKE_KFLAG_AUTOTUNE, "autotune"}};
  static char buf[64];
  buf[0] = 0;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (flags & names[i].flag)
      snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", buf[0] ? ", " : " (", names[i].name);
  if (buf[0]) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), ")");
  return buf;
}

/* N, in, out: aligned, odd (no multiple of 8: the fallback algorithms and
 * the tensor-core warning), and large enough for split-K and big tiles. */
static const int64_t shapes[][3] = {{64, 128, 256}, {37, 129, 65}, {4096, 1024, 1000}};
#define N_SHAPES (int)(sizeof shapes / sizeof *shapes)

static void check_linear(stoke_dtype dt, uint32_t flags, double tol) {
  for (int i = 0; i < N_SHAPES; i++) {
    int64_t n = shapes[i][0], k = shapes[i][1], o = shapes[i][2];
    print_message("linear N=%lld in=%lld out=%lld %s%s\n", (long long)n, (long long)k, (long long)o,
                  stoke_dtype_name(dt), flag_str(flags));
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

/* op's CPU (f64) kernel on ra and its GPU kernel on ga (ra with the GPU's
 * tensors), once each, or with beta 0 then 1 (twice, as run_twice). */
static void run_both(const char *op, stoke_pass pass, stoke_dtype dt, stoke_kernel_args_v1 *ra,
                     stoke_kernel_args_v1 *ga, int twice) {
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", op, pass, STOKE_F64, STOKE_LAYOUT_ANY);
  if (!rk) fail_msg("no CPU %s kernel for %s", pass == STOKE_FWD ? "forward" : "backward", op);
  const stoke_kernel_v1 *gk = g_gpu_kernel(op, pass, dt, STOKE_LAYOUT_ANY, &ga->engine);
  ga->stream = g_dev->default_stream(g_dev_self);
  if (twice) {
    run_twice(rk, ra, 0);
    run_twice(gk, ga, 1);
  } else {
    g_run(rk, ra, 0);
    g_run(gk, ga, 1);
  }
}

/* dW = dy^T x + dy^T x and db = 2 colsum(dy) after two calls (the first
 * with beta 0 may fuse db into the dW product, the second must
 * accumulate); dx is overwritten both times. */
static void check_accumulate(stoke_dtype dt, uint32_t flags, double tol, int64_t n, int64_t k, int64_t o) {
  print_message("linear accumulate N=%lld in=%lld out=%lld %s%s\n", (long long)n, (long long)k, (long long)o,
                stoke_dtype_name(dt), flag_str(flags));
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
  run_both(STOKE_OP_LINEAR, STOKE_BWD, dt, &ra, &ga, 1);
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
  /* many rows (the column sum's row partitions, GPT-2's 16384 tokens in part) with columns a multiple of 8
   * (16-byte loads) and odd (one column per thread) */
  check_accumulate(STOKE_BF16, 0, G_TOL_LOW, 8191, 16, 776);
  check_accumulate(STOKE_F16, STOKE_KFLAG_AUTOTUNE, G_TOL_LOW, 8191, 16, 776);
  check_accumulate(STOKE_F32, STOKE_KFLAG_AUTOTUNE, G_TOL_F32, 4099, 8, 771); /* f32 dW over 4099 rows: ~u sqrt(n) */
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
                  stoke_dtype_name(dt), flag_str(flags));
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
  print_message("linear_relu backward N=%lld in=%lld out=%lld %s%s%s%s\n", (long long)n, (long long)k,
                (long long)o, stoke_dtype_name(dt), flag_str(flags), twice ? " accumulate" : "",
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
  run_both(STOKE_OP_LINEAR_RELU, STOKE_FWD, dt, &ra, &ga, 0);
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
  run_both(STOKE_OP_LINEAR_RELU, STOKE_BWD, dt, &rb, &gb, twice);
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


static void test_linear_relu_accumulate(void **state) {
  check_linear_relu_bwd(STOKE_F32, 0, G_TOL_F32, 64, 128, 256, 1, 0);
  check_linear_relu_bwd(STOKE_F32, STOKE_KFLAG_DETERMINISTIC, G_TOL_F32, 37, 129, 65, 1, 0);
  check_linear_relu_bwd(STOKE_F32, 0, G_TOL_F32, 37, 129, 65, 0, 1);
  check_linear_relu_bwd(STOKE_BF16, 0, G_TOL_LOW, 64, 128, 256, 1, 0);
  check_linear_relu_bwd(STOKE_F16, 0, G_TOL_LOW, 37, 129, 65, 1, 1);
}

/* --------------------------------------------- linear_act / linear_dact
 *
 * L1 = linear_act (x1[N, K0] -> y1[N, K], aux1) forward, then linear_dact,
 * the backward of an L2 (y1 -> [N, O]) that also takes L1's activation
 * gradient and bias gradient from aux1. The forward's y1 (and, for GELU,
 * aux1 = z1) are compared with the CPU's f64 ones; the ReLU bitmask is
 * checked bit by bit against the GPU's own y1 (bit set iff y1 > 0: this
 * is also the check that cuBLASLt's RELU_AUX layout is the one stoke/ops.h
 * states and the fallback kernels write). The backward then runs on both
 * sides from the GPU's forward (y1, and aux1 made from it: same mask, same
 * z), for the reason given above for linear_relu, so what is compared is
 * dz1, d bias1, dW2 and db2 under the linear's tolerances. Shapes: K = 65
 * is no multiple of 8 (GELU's epilogues refuse such an aux: the fallback
 * kernels run) nor of 128 (the mask's padding bits). */
static const int64_t act_shapes[][4] = {{64, 128, 256, 128}, {37, 129, 65, 33}, {4096, 1024, 1024, 1000}};
#define N_ACT_SHAPES (int)(sizeof act_shapes / sizeof *act_shapes)

static void check_act(stoke_dtype dt, uint32_t flags, double tol, int gelu, const int64_t *shape, int twice,
                      int no_db2) {
  int64_t n = shape[0], k0 = shape[1], k = shape[2], o = shape[3];
  const char *attrs = gelu ? "act=gelu, approximate=tanh" : "act=relu";
  print_message("linear_act %s N=%lld K0=%lld K=%lld O=%lld %s%s%s%s\n", gelu ? "gelu" : "relu", (long long)n,
                (long long)k0, (long long)k, (long long)o, stoke_dtype_name(dt), flag_str(flags),
                twice ? " accumulate" : "", no_db2 ? " no db2" : "");
  stoke_node_v1 n1, n2;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_LINEAR_ACT, "fc1", attrs, &n1);
  if (!e) e = stoke_node_init(g_reg, STOKE_OP_LINEAR_DACT, "fc2.bwd", attrs, &n2);
  if (e) fail_msg("%s", e->msg);
  stoke_shape x1s = {2, {n, k0}}, w1s = {2, {k, k0}}, b1s = {1, {k}}, y1s = {2, {n, k}};
  stoke_shape w2s = {2, {o, k}}, b2s = {1, {o}}, y2s = {2, {n, o}};
  stoke_value_desc_v1 ind[3] = {{x1s, dt}, {w1s, dt}, {b1s, dt}}, outd[2];
  memset(outd, 0, sizeof outd);
  e = stoke_find_op(g_reg, STOKE_OP_LINEAR_ACT)->infer(&n1, ind, outd);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)dt * 2 + (uint64_t)gelu, 4242 + (uint64_t)n));
  g_tensor x1, w1, b1, y1, aux, w2, b2, dy2, dz1, dw2, db2, db1;
  g_alloc(&x1, &x1s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&w1, &w1s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&b1, &b1s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&y1, &y1s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&aux, &outd[1].shape, outd[1].dtype, STOKE_LAYOUT_ANY);
  g_alloc(&w2, &w2s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&b2, &b2s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dy2, &y2s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dz1, &y1s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dw2, &w2s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&db2, &b2s, dt, STOKE_LAYOUT_ANY);
  g_alloc(&db1, &b1s, dt, STOKE_LAYOUT_ANY);
  /* GELU is curved within a few units of 0: scale W1 so z1 mostly lies there */
  double wb = gelu ? 3.0 / sqrt((double)k0) : 1.0;
  g_fill(&x1, &r, -1, 1, 0);
  g_fill(&w1, &r, -wb, wb, 0);
  g_fill(&b1, &r, -1, 1, 0);
  g_fill(&w2, &r, -1, 1, 0);
  g_fill(&b2, &r, -1, 1, 0);
  g_fill(&dy2, &r, -1, 1, 0);
  g_tensor *poisoned[] = {&y1, &aux, &dz1, &dw2, &db2, &db1};
  for (int i = 0; i < 6; i++) g_poison(poisoned[i]);

  /* forward */
  stoke_tensor rin[3] = {x1.ref, w1.ref, b1.ref}, gin[3] = {x1.dev, w1.dev, b1.dev};
  stoke_tensor rout[2] = {y1.ref, aux.ref}, gout[2] = {y1.dev, aux.dev};
  stoke_kernel_args_v1 ra = {.node = &n1, .n_in = 3, .n_out = 2, .in = rin, .out = rout, .training = 1,
                             .flags = flags};
  stoke_kernel_args_v1 ga = ra;
  ga.in = gin, ga.out = gout;
  run_both(STOKE_OP_LINEAR_ACT, STOKE_FWD, dt, &ra, &ga, 0);
  double mx, err = g_compare(&y1, &mx);
  print_message("  linear_act fwd y1 %-5s rel err %.3g (max abs %.3g)\n", stoke_dtype_name(dt), err, mx);
  if (!(err <= tol))
    fail_msg("linear_act forward y1 (%s): relative error %.3g > %.3g (seed %llu)", stoke_dtype_name(dt), err, tol,
             (unsigned long long)g_seed);
  ref_from_device(&y1);
  if (gelu) {
    err = g_compare(&aux, &mx);
    print_message("  linear_act fwd z1 %-5s rel err %.3g (max abs %.3g)\n", stoke_dtype_name(dt), err, mx);
    if (!(err <= tol))
      fail_msg("linear_act forward aux z1 (%s): relative error %.3g > %.3g (seed %llu)", stoke_dtype_name(dt), err,
               tol, (unsigned long long)g_seed);
    ref_from_device(&aux);
  } else {
    /* the GPU's bitmask against its own y1: bit j of row i is bit j % 8 of byte i * stride + j / 8 */
    int64_t stride = outd[1].shape.d[1], bad = 0, zero_set = 0;
    uint8_t *mask = malloc((size_t)(n * stride)), *want = aux.ref.data;
    e = g_dev->copy(g_dev_self, mask, aux.dev.data, (size_t)(n * stride), STOKE_COPY_D2H, NULL);
    if (e) fail_msg("download: %s", e->msg);
    memset(want, 0, (size_t)(n * stride));
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < k; j++) {
        double y = ((double *)y1.ref.data)[i * k + j];
        int bit = (mask[i * stride + j / 8] >> (j % 8)) & 1;
        /* where y1 rounded to exactly 0 the pre-activation was within
         * rounding of 0 and either slope is a valid subgradient: the
         * reference takes the GPU's choice there (split-K products set
         * the bit for a z that rounds to +0), and checks every other bit */
        if (y > 0 || (y == 0 && bit)) want[i * stride + j / 8] |= (uint8_t)(1u << (j % 8));
        if (y != 0 && bit != (y > 0)) bad++;
        zero_set += y == 0 && bit;
      }
    print_message("  linear_act relu mask: %lld bits disagree with y1 > 0 (%lld set where y1 == 0)\n",
                  (long long)bad, (long long)zero_set);
    if (bad) fail_msg("linear_act relu bitmask: %lld of %lld bits disagree with the output's sign", (long long)bad,
                      (long long)(n * k));
    free(mask);
  }

  /* backward of L2 with L1's activation: y1, W2 and aux1 live */
  stoke_tensor rbin[5] = {y1.ref, w2.ref, b2.ref, aux.ref, b1.ref}, gbin[5] = {y1.dev, w2.dev, b2.dev, aux.dev, b1.dev};
  rbin[2].data = gbin[2].data = rbin[4].data = gbin[4].data = NULL;
  stoke_tensor rbout[1] = {{NULL, y2s, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}};
  stoke_tensor gbout[1] = {{NULL, y2s, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_tensor rdin[5] = {dz1.ref, dw2.ref, db2.ref, {0}, db1.ref}, gdin[5] = {dz1.dev, dw2.dev, db2.dev, {0}, db1.dev};
  if (no_db2) rdin[2].data = gdin[2].data = NULL;
  stoke_tensor rdout[1] = {dy2.ref}, gdout[1] = {dy2.dev};
  stoke_kernel_args_v1 rb = {.node = &n2, .n_in = 5, .n_out = 1, .in = rbin, .out = rbout, .din = rdin,
                             .dout = rdout, .param_grads = (1u << 1) | (1u << 2) | (1u << 4), .training = 1,
                             .flags = flags};
  stoke_kernel_args_v1 gb = rb;
  gb.in = gbin, gb.out = gbout, gb.din = gdin, gb.dout = gdout;
  run_both(STOKE_OP_LINEAR_DACT, STOKE_BWD, dt, &rb, &gb, twice);
  const g_tensor *outs[4] = {&dz1, &db1, &dw2, &db2};
  static const char *names[4] = {"dz1", "dbias1", "dW2", "db2"};
  for (int i = 0; i < (no_db2 ? 3 : 4); i++) {
    err = g_compare(outs[i], &mx);
    print_message("  linear_dact %-6s %-5s rel err %.3g (max abs %.3g)\n", names[i], stoke_dtype_name(dt), err, mx);
    if (!(err <= tol))
      fail_msg("linear_dact %s %s (%s%s): relative error %.3g > %.3g (seed %llu)", gelu ? "gelu" : "relu", names[i],
               stoke_dtype_name(dt), twice ? ", accumulated" : "", err, tol, (unsigned long long)g_seed);
  }
  if (no_db2) { /* not asked for: left as it was (poisoned) */
    err = g_compare(&db2, &mx);
    if (!isnan(err)) fail_msg("linear_dact wrote db2, which was not asked for");
  }
  g_tensor *all[] = {&x1, &w1, &b1, &y1, &aux, &w2, &b2, &dy2, &dz1, &dw2, &db2, &db1};
  for (int i = 0; i < 12; i++) g_free(all[i]);
}

static void check_acts(stoke_dtype dt, uint32_t flags, double tol) {
  for (int gelu = 0; gelu < 2; gelu++)
    for (int i = 0; i < N_ACT_SHAPES; i++) check_act(dt, flags, tol, gelu, act_shapes[i], 0, 0);
}


/* accumulation (d bias1 through the column-sum kernel the second time),
 * no db2 (L2 a linear_act itself), deterministic (no BGRAD epilogues) */
static void test_linear_act_variants(void **state) {
  for (int gelu = 0; gelu < 2; gelu++) {
    check_act(STOKE_F32, 0, G_TOL_F32, gelu, act_shapes[0], 1, 0);
    check_act(STOKE_BF16, 0, G_TOL_LOW, gelu, act_shapes[0], 1, 1);
    check_act(STOKE_F16, 0, G_TOL_LOW, gelu, act_shapes[1], 1, 0);
    check_act(STOKE_F32, STOKE_KFLAG_DETERMINISTIC, G_TOL_F32, gelu, act_shapes[0], 0, 1);
    check_act(STOKE_BF16, STOKE_KFLAG_DETERMINISTIC, G_TOL_LOW, gelu, act_shapes[2], 1, 0);
  }
}

/* ------------------------------------------------- GELU accuracy in f32
 *
 * linear_act's GELU alone: x[N, 1] holds a sweep of z over [-8, 8] on the
 * grid of 2^-8 (exact in TF32 too), W[8, 1] ones and the bias 0, so the
 * product is exact (z times 1 plus 0) and every error in y is the
 * activation's. Per range of z, the largest error in units of f32's
 * rounding u: absolute and relative to |z|.
 *
 * f32 (no TF32) must be f32-accurate: 0.5 z (1 + tanh(a)) with tanhf
 * (2 ulp, CUDA's table), a = k0 (z + k1 z^3) rounded in 3 operations
 * (|a| sech^2(a) < 0.45 turns their 3 u into under 1.4 u of tanh), then
 * 1 + t, the two products: |y - gelu(z)| <= 0.5 |z| (2 + 1.4 + 2) u +
 * 2 u |y| <= 5 u |z|; the test allows 8 u |z|. TF32 takes cuBLASLt's
 * epilogue, whose tanh is approximate (89 u at |z| = 1.5 on an H200 with
 * CUDA 13, which is why f32 does not take it): printed, and held to
 * TF32's own rounding, 2^-11 |z|. */
static void gelu_sweep(uint32_t flags, double bound_u) {
  const stoke_dtype dt = STOKE_F32;
  const int64_t n = 4097, o = 8;
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_LINEAR_ACT, "gelu_sweep", "act=gelu, approximate=tanh", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_shape xs = {2, {n, 1}}, ws = {2, {o, 1}}, bs = {1, {o}}, ys = {2, {n, o}};
  float *hx = malloc((size_t)n * sizeof *hx), hw[8], hb[8], *hy = malloc((size_t)(n * o) * sizeof *hy);
  float *hz = malloc((size_t)(n * o) * sizeof *hz);
  for (int64_t i = 0; i < n; i++) hx[i] = (float)(-8.0 + (double)i * 0x1p-8);
  for (int j = 0; j < 8; j++) hw[j] = 1.f, hb[j] = 0.f;
  void *dx = g_dev_alloc((size_t)n * 4), *dw = g_dev_alloc(32), *db = g_dev_alloc(32);
  void *dy = g_dev_alloc((size_t)(n * o) * 4), *dz = g_dev_alloc((size_t)(n * o) * 4);
  g_dev_put(dx, hx, (size_t)n * 4);
  g_dev_put(dw, hw, 32);
  g_dev_put(db, hb, 32);
  stoke_tensor in[3] = {{dx, xs, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, {dw, ws, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {db, bs, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_tensor out[2] = {{dy, ys, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, {dz, ys, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_kernel_args_v1 a = {.node = &node, .n_in = 3, .n_out = 2, .in = in, .out = out, .training = 1,
                            .flags = flags, .stream = g_dev->default_stream(g_dev_self)};
  const stoke_kernel_v1 *k = g_gpu_kernel(STOKE_OP_LINEAR_ACT, STOKE_FWD, dt, STOKE_LAYOUT_ANY, &a.engine);
  g_dev->fill(g_dev_self, dy, 0xff, (size_t)(n * o) * 4, NULL); /* poisoned: NaN unless written */
  g_dev->fill(g_dev_self, dz, 0xff, (size_t)(n * o) * 4, NULL);
  g_run(k, &a, 1);
  g_dev_get(hy, dy, (size_t)(n * o) * 4);
  g_dev_get(hz, dz, (size_t)(n * o) * 4);
  static const double edges[] = {-8, -3, -1, -0.1, 0.1, 1, 3, 8.001};
  enum { R = sizeof edges / sizeof *edges - 1 };
  double abs_u[R] = {0}, rel_u[R] = {0}, worst_z[R] = {0}, worst = 0;
  const double u = 0x1p-24;
  int64_t z_off = 0;
  for (int64_t i = 0; i < n; i++) {
    double z = hx[i];
    double want = 0.5 * z * (1 + tanh(sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
    int r = 0;
    while (r < R - 1 && z >= edges[r + 1]) r++;
    for (int64_t j = 0; j < o; j++) {
      z_off += hz[i * o + j] != hx[i];
      double d = fabs(hy[i * o + j] - want);
      if (!(d <= INFINITY)) d = INFINITY; /* NaN: not written */
      if (d / u > abs_u[r]) abs_u[r] = d / u, worst_z[r] = z;
      if (z != 0 && d / (u * fabs(z)) > rel_u[r]) rel_u[r] = d / (u * fabs(z));
      if (z != 0 && d / (u * fabs(z)) > worst) worst = d / (u * fabs(z));
      if (z == 0 && d != 0) worst = INFINITY;
    }
  }
  print_message("  linear_act GELU f32%s, %lld values of z in [-8, 8]; aux z differs from x in %lld\n", flag_str(flags),
                (long long)n, (long long)z_off);
  for (int r = 0; r < R; r++)
    print_message("    z in [%5.1f, %5.1f): max |y - gelu(z)| %8.1f u (at z = %.6g), relative to |z| %6.2f u\n",
                  edges[r], edges[r + 1], abs_u[r], worst_z[r], rel_u[r]);
  free(hx), free(hy), free(hz);
  void *bufs[] = {dx, dw, db, dy, dz};
  for (int i = 0; i < 5; i++) g_dev->free(g_dev_self, bufs[i]);
  if (z_off) fail_msg("linear_act GELU%s: the aux z differs from the exact product in %lld places", flag_str(flags),
                      (long long)z_off);
  if (!(worst <= bound_u))
    fail_msg("linear_act GELU f32%s: |y - gelu(z)| reaches %.3g u |z|, more than %.3g u |z| (u = 2^-24)",
             flag_str(flags), worst, bound_u);
}

static void test_gelu_accuracy(void **state) {
  gelu_sweep(0, 8);
  gelu_sweep(STOKE_KFLAG_TF32, 0x1p-11 / 0x1p-24);
}

/* --------------------------------------------------------------- autotune
 *
 * With STOKE_KFLAG_AUTOTUNE every product's algorithm is the fastest of
 * the heuristic's candidates, timed in plan(), and an epilogue is kept
 * only when it beats the product without it and our kernel
 * (choose_epilogue): the same checks against the CPU, over the shapes
 * above (aligned, odd, large), every kernel and dtype, accumulation, and
 * with the determinism filter. */
static void test_autotune(void **state) {
  const uint32_t at = STOKE_KFLAG_AUTOTUNE;
  check_linear(STOKE_BF16, at, G_TOL_LOW);
  check_linear(STOKE_F32, at | STOKE_KFLAG_TF32, G_TOL_TF32);
  check_linear(STOKE_F32, at, G_TOL_F32);
  check_accumulate(STOKE_F16, at, G_TOL_LOW, 4096, 1024, 1000);
  check_accumulate(STOKE_F32, at | STOKE_KFLAG_DETERMINISTIC, G_TOL_F32, 37, 129, 65);
  check_linear_relu(STOKE_F16, at, G_TOL_LOW);
  check_acts(STOKE_BF16, at, G_TOL_LOW);
  /* TF32: cuBLASLt runs GELU_AUX_BIAS as the product and a pass of its own, which choose_epilogue times
   * against the bias-only product and lt_kernels.cu's GELU (the log says which it kept): either is checked */
  check_acts(STOKE_F32, at | STOKE_KFLAG_TF32, G_TOL_TF32);
  for (int gelu = 0; gelu < 2; gelu++) {
    check_act(STOKE_F16, at, G_TOL_LOW, gelu, act_shapes[2], 1, 0);
    check_act(STOKE_BF16, at | STOKE_KFLAG_DETERMINISTIC, G_TOL_LOW, gelu, act_shapes[2], 1, 0);
  }
}

/* Lines of the log file f (from its start) that contain both needles. */
static int count_lines(FILE *f, const char *a, const char *b) {
  char line[1024];
  int n = 0;
  rewind(f);
  while (fgets(line, sizeof line, f)) n += strstr(line, a) && strstr(line, b);
  fseek(f, 0, SEEK_END);
  return n;
}

/* The engine's cache: a linear backward planned with the flag times its
 * products (one "autotuned" log line each, with the time), planned again
 * takes them from the cache ("cached"), and without the flag times
 * nothing. The shape is used by no other test (the engine, and its cache,
 * live for the whole binary). */
static void test_autotune_cache(void **state) {
  const stoke_dtype dt = STOKE_BF16;
  const int64_t n = 192, k = 320, o = 448;
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_LINEAR, "tune_cache", "", &node);
  if (e) fail_msg("%s", e->msg);
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
  stoke_tensor in[3] = {x.dev, w.dev, b.dev}, out[1] = {y.dev}, din[3] = {dx.dev, dw.dev, db.dev}, dout[1] = {dy.dev};
  stoke_kernel_args_v1 a = {.node = &node, .n_in = 3, .n_out = 1, .in = in, .out = out, .din = din, .dout = dout,
                            .param_grads = (1u << 1) | (1u << 2), .training = 1,
                            .stream = g_dev->default_stream(g_dev_self)};
  const stoke_kernel_v1 *kern = g_gpu_kernel(STOKE_OP_LINEAR, STOKE_BWD, dt, STOKE_LAYOUT_ANY, &a.engine);
  FILE *f = tmpfile();
  if (!f) fail_msg("tmpfile failed");
  stoke_log_set_file(f);
  int counts[3][2];
  const uint32_t flags[3] = {STOKE_KFLAG_AUTOTUNE, STOKE_KFLAG_AUTOTUNE, 0};
  for (int i = 0; i < 3; i++) {
    a.flags = flags[i];
    void *st = NULL;
    size_t wsb = 0;
    e = kern->plan(&a, &st, &wsb);
    if (kern->destroy && st) kern->destroy(st);
    if (e) {
      stoke_log_set_file(NULL);
      fail_msg("plan %d: %s", i, e->msg);
    }
    counts[i][0] = count_lines(f, "'tune_cache'", "(autotuned)");
    counts[i][1] = count_lines(f, "'tune_cache'", "(cached)");
  }
  stoke_log_set_file(NULL);
  fclose(f);
  print_message("  autotune cache: plan 1 timed %d products, plan 2 took %d from the cache, plan 3 (no flag) %d/%d\n",
                counts[0][0], counts[1][1] - counts[0][1], counts[2][0] - counts[1][0], counts[2][1] - counts[1][1]);
  if (counts[0][0] < 2 || counts[0][1] != 0) /* dx and dW at least (dW+db where BGRADB has an algorithm) */
    fail_msg("first plan: %d products autotuned, %d cached; expected >= 2 and 0", counts[0][0], counts[0][1]);
  if (counts[1][0] != counts[0][0] || counts[1][1] != counts[0][0])
    fail_msg("second plan: %d more autotuned, %d cached; expected 0 and %d", counts[1][0] - counts[0][0],
             counts[1][1], counts[0][0]);
  if (counts[2][0] != counts[1][0] || counts[2][1] != counts[1][1])
    fail_msg("plan without the flag logged autotune lines");
  g_tensor *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) g_free(all[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear_accumulate),
      cmocka_unit_test(test_linear_relu_accumulate),
      cmocka_unit_test(test_linear_act_variants),
      cmocka_unit_test(test_autotune),        cmocka_unit_test(test_autotune_cache),
      cmocka_unit_test(test_gelu_accuracy),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
