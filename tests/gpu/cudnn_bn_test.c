/* tests/gpu/cudnn_bn_test.c: the cudnn engine's batch_norm kernels
 * (backends/cudnn/bn.c) beyond matching the CPU reference (that is
 * every_kernel_test's): which engine serves which layout, gradient
 * accumulation (param_grad_beta 1) with some gradients unwanted against
 * the cuda engine's kernels, and a timing. Runs on a GPU machine only.
 *
 * g_setup_engine_first opens cuda first (cudnn runs on its device), then
 * reorders the engine list to (cudnn, cuda) so that g_gpu_kernel, like
 * the compiler with `backends = cudnn, ...`, picks the cudnn kernel, and
 * every check asserts that it did. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"

static int setup(void **state) { return g_setup_engine_first("cudnn"); /* (cudnn, cuda) */ }

/* cudnn serves bf16/fp16 batch norm only (see backends/cudnn/bn.c) */
static const stoke_dtype dtypes[] = {STOKE_BF16, STOKE_F16};
#define N_DTYPES ((int)(sizeof dtypes / sizeof *dtypes))
/* cudnn serves NHWC batch norm only (see backends/cudnn/bn.c) */
static const stoke_layout layouts[] = {STOKE_NHWC};
#define N_LAYOUTS ((int)(sizeof layouts / sizeof *layouts))
static double tol_of(stoke_dtype t) { return t == STOKE_F32 ? G_TOL_F32 : G_TOL_LOW; }
static const char *lay_name(stoke_layout l) { return l == STOKE_NHWC ? "NHWC" : "NCHW"; }

static const stoke_shape bn_shapes[] = {
    {4, {8, 40, 17, 19}},
    {4, {16, 64, 14, 14}},
};
#define N_SHAPES (sizeof bn_shapes / sizeof *bn_shapes)

/* The kernel g_check and the running-stats check use must be cudnn's. */
static void expect_cudnn(stoke_pass pass, stoke_dtype dt, stoke_layout lay) {
  void *es = NULL;
  const stoke_kernel_v1 *k = g_gpu_kernel(STOKE_OP_BATCH_NORM, pass, dt, lay, &es);
  if (strcmp(k->engine, "cudnn"))
    fail_msg("batch_norm %s %s %s: picked engine %s, not cudnn", pass == STOKE_FWD ? "fwd" : "bwd",
             stoke_dtype_name(dt), lay_name(lay), k->engine);
}

/* 4-D in both layouts is cudnn's; 2-D (layout any) is not, so that it
 * falls through to the cuda engine. */
static void test_registration(void **state) {
  for (int d = 0; d < N_DTYPES; d++)
    for (int p = 0; p < 2; p++) {
      stoke_pass pass = p ? STOKE_BWD : STOKE_FWD;
      for (int l = 0; l < N_LAYOUTS; l++) {
        if (!stoke_find_kernel(g_reg, "cudnn", STOKE_OP_BATCH_NORM, pass, dtypes[d], layouts[l]))
          fail_msg("no cudnn batch_norm kernel for %s %s", stoke_dtype_name(dtypes[d]), lay_name(layouts[l]));
        expect_cudnn(pass, dtypes[d], layouts[l]);
      }
      if (stoke_find_kernel(g_reg, "cudnn", STOKE_OP_BATCH_NORM, pass, dtypes[d], STOKE_LAYOUT_ANY))
        fail_msg("cudnn serves batch_norm with layout any (2-D); it must fall through to cuda");
      void *es = NULL;
      const stoke_kernel_v1 *k = g_gpu_kernel(STOKE_OP_BATCH_NORM, pass, dtypes[d], STOKE_LAYOUT_ANY, &es);
      if (strcmp(k->engine, "cuda")) fail_msg("2-D batch_norm picked %s, not cuda", k->engine);
    }
}

/* Backward with param_grad_beta 1 (gradient accumulation onto nonzero dw,
 * db) and with some gradients not wanted (dx NULL: cuDNN writes a scratch
 * dx; dw or db NULL), cudnn against the cuda engine on the same device
 * data (the cuda kernel is checked against the CPU by every_kernel_test). */
static void bn_accumulate(const stoke_shape *xs, stoke_dtype dt, stoke_layout lay, int training, int want) {
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_BATCH_NORM, "bn_acc", "eps=1e-5, momentum=0.2", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 99 + (uint64_t)dt, (uint64_t)(lay * 8 + want)));
  int64_t c = xs->d[1];
  stoke_shape cs = {1, {c}};
  g_tensor in[5], out[3], dy, din[2][3];
  g_alloc(&in[0], xs, dt, lay);
  g_alloc(&in[1], &cs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&in[2], &cs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&in[3], &cs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&in[4], &cs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_fill(&in[0], &r, -2, 3, 0);
  for (int i = 1; i < 3; i++) g_fill(&in[i], &r, -1, 1, 0);
  g_fill(&in[3], &r, -0.5, 0.5, 0);
  g_fill(&in[4], &r, 0.5, 1.5, 0);
  g_alloc(&out[0], xs, dt, lay);
  g_alloc(&out[1], &cs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&out[2], &cs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&dy, xs, dt, lay);
  g_fill(&dy, &r, -1, 1, 0);
  /* the saved statistics, from the cuda forward */
  stoke_tensor gi[5], go[3];
  for (int i = 0; i < 5; i++) gi[i] = in[i].dev;
  for (int j = 0; j < 3; j++) go[j] = out[j].dev;
  void *cuda_self = g_engine_self_of("cuda"), *cudnn_self = g_engine_self_of("cudnn");
  const stoke_kernel_v1 *fk = stoke_find_kernel(g_reg, "cuda", STOKE_OP_BATCH_NORM, STOKE_FWD, dt, lay);
  stoke_kernel_args_v1 fa = {.node = &node, .n_in = 5, .n_out = 3, .in = gi, .out = go, .training = training,
                             .engine = cuda_self, .stream = g_dev->default_stream(g_dev_self)};
  g_run(fk, &fa, 1);
  /* the same starting dw, db on both sides (dx: poisoned, overwritten) */
  stoke_tensor gd[2][3], gdy[3] = {dy.dev};
  for (int side = 0; side < 2; side++) {
    stoke_rng r2 = stoke_rng_seed(stoke_hash3(g_seed, 7, (uint64_t)want));
    for (int i = 0; i < 3; i++) {
      g_alloc(&din[side][i], i ? &cs : xs, dt, i ? STOKE_LAYOUT_ANY : lay);
      if (i) g_fill(&din[side][i], &r2, -1, 1, 0);
      else g_poison(&din[side][i]);
      gd[side][i] = din[side][i].dev;
      if (!(want >> i & 1)) gd[side][i].data = NULL;
    }
  }
  const char *eng[2] = {"cuda", "cudnn"};
  for (int side = 0; side < 2; side++) {
    const stoke_kernel_v1 *bk = stoke_find_kernel(g_reg, eng[side], STOKE_OP_BATCH_NORM, STOKE_BWD, dt, lay);
    if (!bk) fail_msg("no %s batch_norm backward", eng[side]);
    stoke_tensor bi[5], bo[3];
    memcpy(bi, gi, sizeof bi);
    memcpy(bo, go, sizeof bo);
    bi[2].data = bi[3].data = bi[4].data = NULL; /* only what bwd_needs keeps */
    bo[0].data = NULL;
    stoke_kernel_args_v1 ba = {.node = &node, .n_in = 5, .n_out = 3, .in = bi, .out = bo, .din = gd[side],
                               .dout = gdy, .param_grads = 6, .param_grad_beta = 1, .training = training,
                               .engine = side ? cudnn_self : cuda_self,
                               .stream = g_dev->default_stream(g_dev_self)};
    g_run(bk, &ba, 1);
  }
  static const char *const names[] = {"dx", "dw (accumulated)", "db (accumulated)"};
  for (int i = 0; i < 3; i++) {
    if (!(want >> i & 1)) continue;
    /* the cuda result as the reference: download it into din[1][i].ref */
    int64_t n = stoke_numel(&din[0][i].dev.shape);
    size_t bytes = (size_t)n * stoke_dtype_size(dt);
    void *h = malloc(bytes);
    g_dev_get(h, din[0][i].dev.data, bytes);
    for (int64_t k = 0; k < n; k++) g_set(din[1][i].ref.data, din[1][i].ref.dtype, k, g_get(h, dt, k));
    free(h);
    double mx, err = g_compare(&din[1][i], &mx);
    print_message("  batch_norm bwd %-5s %-4s %s want=%d %-17s cudnn vs cuda: rel err %.3g (max abs %.3g)\n",
                  stoke_dtype_name(dt), lay_name(lay), training ? "training" : "eval", want, names[i], err, mx);
    if (!(err <= tol_of(dt)))
      fail_msg("batch_norm %s (want %d): cudnn vs cuda relative error %.3g > %.3g (seed %llu)", names[i], want, err,
               tol_of(dt), (unsigned long long)g_seed);
  }
  for (int i = 0; i < 5; i++) g_free(&in[i]);
  for (int j = 0; j < 3; j++) g_free(&out[j]);
  g_free(&dy);
  for (int side = 0; side < 2; side++)
    for (int i = 0; i < 3; i++) g_free(&din[side][i]);
}

static void test_batch_norm_accumulate(void **state) {
  static const int wants[] = {7, 6, 3, 4}; /* bits: dx, dw, db */
  for (int d = 0; d < N_DTYPES; d++)
    for (int l = 0; l < N_LAYOUTS; l++)
      for (int training = 1; training >= 0; training--)
        for (size_t w = 0; w < sizeof wants / sizeof *wants; w++)
          bn_accumulate(&bn_shapes[0], dtypes[d], layouts[l], training, wants[w]);
}

/* STOKE_BN_BENCH=1: time training forward + backward of the cudnn and the
 * cuda kernels on ResNet-50's batch-norm shapes (batch 256, bf16, NHWC and
 * NCHW); informative only, nothing is checked. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *bench_alloc(size_t bytes, int byte) {
  void *p = NULL;
  stoke_err *e = g_dev->alloc(g_dev_self, bytes ? bytes : 16, &p);
  if (!e) e = g_dev->fill(g_dev_self, p, byte, bytes ? bytes : 16, NULL);
  if (e) fail_msg("bench alloc: %s", e->msg);
  return p;
}

static double bench_one(const char *engine, const stoke_shape *xs, stoke_dtype dt, stoke_layout lay) {
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_BATCH_NORM, "bn_bench", "eps=1e-5, momentum=0.1", &node);
  if (e) fail_msg("%s", e->msg);
  int64_t c = xs->d[1];
  stoke_shape cs = {1, {c}};
  size_t xb = (size_t)stoke_numel(xs) * stoke_dtype_size(dt), cb = (size_t)c * 4;
  stoke_tensor in[5] = {{bench_alloc(xb, 0x3c), *xs, dt, lay, STOKE_DEV_GPU},
                        {bench_alloc(cb, 0x3c), cs, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {bench_alloc(cb, 0), cs, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {bench_alloc(cb, 0), cs, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {bench_alloc(cb, 0x3c), cs, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_tensor out[3] = {{bench_alloc(xb, 0), *xs, dt, lay, STOKE_DEV_GPU},
                         {bench_alloc(cb, 0), cs, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                         {bench_alloc(cb, 0), cs, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_tensor din[5] = {{bench_alloc(xb, 0), *xs, dt, lay, STOKE_DEV_GPU},
                         {bench_alloc(cb, 0), cs, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                         {bench_alloc(cb, 0), cs, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_tensor dout[3] = {{bench_alloc(xb, 0x3c), *xs, dt, lay, STOKE_DEV_GPU}};
  void *es = g_engine_self_of(engine);
  const stoke_kernel_v1 *fk = stoke_find_kernel(g_reg, engine, STOKE_OP_BATCH_NORM, STOKE_FWD, dt, lay);
  const stoke_kernel_v1 *bk = stoke_find_kernel(g_reg, engine, STOKE_OP_BATCH_NORM, STOKE_BWD, dt, lay);
  stoke_kernel_args_v1 fa = {.node = &node, .n_in = 5, .n_out = 3, .in = in, .out = out, .training = 1,
                             .engine = es, .stream = g_dev->default_stream(g_dev_self)};
  stoke_kernel_args_v1 ba = fa;
  ba.din = din, ba.dout = dout, ba.param_grads = 6, ba.param_grad_beta = 1;
  void *fs = NULL, *bs = NULL;
  size_t fw = 0, bw = 0;
  if ((e = fk->plan(&fa, &fs, &fw)) || (e = bk->plan(&ba, &bs, &bw))) fail_msg("bench plan: %s", e->msg);
  size_t wb = fw > bw ? fw : bw;
  void *ws = bench_alloc(wb, 0);
  fa.workspace = ba.workspace = ws;
  fa.workspace_bytes = ba.workspace_bytes = wb;
  double best = 1e30;
  for (int rep = 0; rep < 4; rep++) {
    int iters = 10;
    double t0 = now_s();
    for (int i = 0; i < iters && !e; i++) {
      e = fk->run(&fa, fs);
      if (!e) e = bk->run(&ba, bs);
    }
    if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
    if (e) fail_msg("bench run: %s", e->msg);
    double t = (now_s() - t0) / iters;
    if (rep > 0 && t < best) best = t;
  }
  if (fk->destroy) fk->destroy(fs);
  if (bk->destroy) bk->destroy(bs);
  for (int i = 0; i < 5; i++) g_dev->free(g_dev_self, in[i].data);
  for (int j = 0; j < 3; j++) g_dev->free(g_dev_self, out[j].data);
  for (int i = 0; i < 3; i++) g_dev->free(g_dev_self, din[i].data);
  g_dev->free(g_dev_self, dout[0].data);
  g_dev->free(g_dev_self, ws);
  return best;
}

static void test_batch_norm_bench(void **state) {
  const char *env = getenv("STOKE_BN_BENCH");
  if (!env || !atoi(env)) {
    print_message("batch_norm bench skipped (STOKE_BN_BENCH=1 runs it)\n");
    return;
  }
  static const stoke_shape shapes[] = {
      {4, {256, 64, 112, 112}}, {4, {256, 64, 56, 56}},  {4, {256, 256, 56, 56}},
      {4, {256, 128, 28, 28}},  {4, {256, 512, 28, 28}}, {4, {256, 256, 14, 14}},
      {4, {256, 1024, 14, 14}}, {4, {256, 512, 7, 7}},   {4, {256, 2048, 7, 7}},
  };
  for (int l = 1; l >= 0; l--)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      const stoke_shape *x = &shapes[s];
      double tn = bench_one("cudnn", x, STOKE_BF16, layouts[l]), tc = bench_one("cuda", x, STOKE_BF16, layouts[l]);
      double gb = 5.0 * (double)stoke_numel(x) * 2 / 1e9; /* x, y; x, dy, dx: bytes at least moved */
      print_message("  bench bf16 %s (%lld, %lld, %lld, %lld) fwd+bwd: cudnn %.3f ms (%.0f GB/s), cuda %.3f ms "
                    "(%.0f GB/s)\n",
                    lay_name(layouts[l]), (long long)x->d[0], (long long)x->d[1], (long long)x->d[2],
                    (long long)x->d[3], tn * 1e3, gb / tn, tc * 1e3, gb / tc);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registration),
      cmocka_unit_test(test_batch_norm_accumulate),
      cmocka_unit_test(test_batch_norm_bench),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown_engine_first);
}
