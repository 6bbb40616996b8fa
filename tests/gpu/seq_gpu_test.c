/* tests/gpu/seq_gpu_test.c: the GPU kernels of the sequence ops against the
 * CPU reference (tests/gpu/gpu_harness.h: fresh random inputs, outputs
 * poisoned, relative-norm error by dtype): cuda's embedding (the sorted,
 * deterministic scatter-add backward), position_embedding, layer_norm,
 * add_layer_norm (both gradients flowing in; both paths of layer_norm.cu;
 * the backward with its gradients aliased and accumulated), the views (reshape, slice,
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

/* rows x C: the register path (whole 16-byte vectors, C <= 1024: GPT-2's
 * 768, 1024, one vector, a partial last slot, more rows than its 256
 * backward blocks take at once) and the plain kernels (odd widths, one row,
 * C > 1024). The bound: g_tol over the longer reduction (columns for x,
 * rows for the weight and bias). */
static void test_layer_norm(void **state) {
  static const int64_t s[][2] = {{37, 129}, {1, 7},   {300, 768}, {5, 33},   {2100, 1024},
                                 {64, 8},   {130, 520}, {3, 1032}, {4097, 24}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < (int)(sizeof s / sizeof *s); i++)
      for (int add = 0; add < 2; add++) {
        stoke_shape x = SHAPE2(s[i][0], s[i][1]), w = SHAPE1(s[i][1]);
        g_case c = {.op = add ? STOKE_OP_ADD_LAYER_NORM : STOKE_OP_LAYER_NORM, .attrs = "eps=1e-5",
                    .n_in = add ? 4 : 3, .in_shape = {x, add ? x : w, w, w}, .param_mask = add ? 12 : 6,
                    .out_dtype = {0, add ? 0 : STOKE_F32, STOKE_F32, STOKE_F32}, .douts = add ? 3 : 1,
                    .dtype = dtypes[d], .tol = g_tol(dtypes[d], s[i][0] > s[i][1] ? s[i][0] : s[i][1]),
                    .training = 1, .backward = 1};
        g_check(&c);
      }
}

/* Device buffer of `like`'s size holding a copy of it. */
static void *dev_copy(const g_tensor *like) {
  size_t bytes = (size_t)stoke_numel(&like->dev.shape) * stoke_dtype_size(like->dev.dtype);
  void *p = g_dev_alloc(bytes);
  stoke_err *e = g_dev->copy(g_dev_self, p, like->dev.data, bytes, STOKE_COPY_D2D, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("device copy: %s", e->msg);
  return p;
}

static void *host_copy(const void *dev, size_t bytes) {
  void *h = malloc(bytes);
  g_dev_get(h, dev, bytes);
  return h;
}

/* add_layer_norm's backward as the graph may run it: both inputs'
 * gradients in one buffer, that buffer the sum's gradient (ds, in place),
 * and dweight, dbias accumulated (param_grad_beta 1) onto the first run's.
 * Against a first run with separate memory and beta 0: dx bitwise the same
 * (one kernel, the same arithmetic); dweight and dbias twice the first
 * run's, bitwise in f32 (v + v is exact), within the format's rounding in
 * bf16 and fp16. */
static void check_ln_aliases(stoke_dtype dt, int64_t rows, int64_t cols) {
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_ADD_LAYER_NORM, "ln_alias_test", "eps=1e-5", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 4242, (uint64_t)dt));
  stoke_shape xs = SHAPE2(rows, cols), ws = SHAPE1(cols), rs = SHAPE1(rows);
  g_tensor in[4], out[4], dy, ds, dx[2], dw[2];
  for (int i = 0; i < 4; i++) {
    g_alloc(&in[i], i < 2 ? &xs : &ws, dt, STOKE_LAYOUT_ANY);
    g_fill(&in[i], &r, -1, 1, 0);
    g_alloc(&out[i], i < 2 ? &xs : &rs, i < 2 ? dt : STOKE_F32, STOKE_LAYOUT_ANY);
  }
  g_alloc(&dy, &xs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&ds, &xs, dt, STOKE_LAYOUT_ANY);
  g_fill(&dy, &r, -1, 1, 0);
  g_fill(&ds, &r, -1, 1, 0);
  for (int i = 0; i < 2; i++) {
    g_alloc(&dx[i], &xs, dt, STOKE_LAYOUT_ANY);
    g_alloc(&dw[i], &ws, dt, STOKE_LAYOUT_ANY);
    g_poison(&dx[i]);
    g_poison(&dw[i]);
  }
  stoke_tensor ti[4], to[4], tdin[4], tdout[4];
  for (int i = 0; i < 4; i++) ti[i] = in[i].dev, to[i] = out[i].dev;
  tdin[0] = dx[0].dev, tdin[1] = dx[1].dev, tdin[2] = dw[0].dev, tdin[3] = dw[1].dev;
  tdout[0] = ds.dev, tdout[1] = dy.dev, tdout[2] = tdout[3] = (stoke_tensor){0};
  void *es = NULL;
  const stoke_kernel_v1 *fk = g_gpu_kernel(STOKE_OP_ADD_LAYER_NORM, STOKE_FWD, dt, STOKE_LAYOUT_ANY, &es);
  const stoke_kernel_v1 *bk = g_gpu_kernel(STOKE_OP_ADD_LAYER_NORM, STOKE_BWD, dt, STOKE_LAYOUT_ANY, &es);
  stoke_kernel_args_v1 a = {.node = &node, .n_in = 4, .n_out = 4, .in = ti, .out = to, .din = tdin, .dout = tdout,
                            .training = 1, .engine = es, .stream = g_dev->default_stream(g_dev_self),
                            .param_grads = 12, .param_grad_beta = 0};
  g_run(fk, &a, 1);
  g_run(bk, &a, 1);
  size_t xb = (size_t)(rows * cols) * stoke_dtype_size(dt), wb = (size_t)cols * stoke_dtype_size(dt);
  void *want_dx = host_copy(dx[0].dev.data, xb), *want_dx2 = host_copy(dx[1].dev.data, xb);
  void *want_dw = host_copy(dw[0].dev.data, wb), *want_db = host_copy(dw[1].dev.data, wb);
  if (memcmp(want_dx, want_dx2, xb)) fail_msg("add_layer_norm %s: the two inputs' gradients differ", stoke_dtype_name(dt));
  void *shared = dev_copy(&ds); /* ds, then both inputs' gradients */
  tdout[0].data = tdin[0].data = tdin[1].data = shared;
  a.param_grad_beta = 1;
  g_run(bk, &a, 1);
  void *got_dx = host_copy(shared, xb), *got_dw = host_copy(dw[0].dev.data, wb), *got_db = host_copy(dw[1].dev.data, wb);
  if (memcmp(want_dx, got_dx, xb))
    fail_msg("add_layer_norm %s %lldx%lld: dx in the shared, in-place buffer differs from dx in its own (seed %llu)",
             stoke_dtype_name(dt), (long long)rows, (long long)cols, (unsigned long long)g_seed);
  double num = 0, den = 0;
  for (int64_t j = 0; j < 2 * cols; j++) {
    const void *w = j < cols ? want_dw : want_db, *g = j < cols ? got_dw : got_db;
    double want = 2 * g_get(w, dt, j % cols), got = g_get(g, dt, j % cols);
    num += (got - want) * (got - want);
    den += want * want;
  }
  double err = sqrt(num / den), tol = dt == STOKE_F32 ? 0 : g_tol(dt, 1);
  print_message("  add_layer_norm %-5s %lldx%lld aliased dx bitwise, accumulated dweight/dbias rel err %.3g\n",
                stoke_dtype_name(dt), (long long)rows, (long long)cols, err);
  if (!(err <= tol)) fail_msg("add_layer_norm %s: accumulated dweight, dbias rel err %.3g > %.3g (seed %llu)",
                              stoke_dtype_name(dt), err, tol, (unsigned long long)g_seed);
  free(want_dx), free(want_dx2), free(want_dw), free(want_db), free(got_dx), free(got_dw), free(got_db);
  g_dev->free(g_dev_self, shared);
  for (int i = 0; i < 4; i++) g_free(&in[i]), g_free(&out[i]);
  for (int i = 0; i < 2; i++) g_free(&dx[i]), g_free(&dw[i]);
  g_free(&dy);
  g_free(&ds);
}

static void test_layer_norm_aliases(void **state) {
  for (int d = 0; d < 3; d++) {
    check_ln_aliases(dtypes[d], 2100, 768); /* the register path */
    check_ln_aliases(dtypes[d], 37, 129);   /* the plain kernels */
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
      cmocka_unit_test(test_layer_norm_aliases), cmocka_unit_test(test_views),     cmocka_unit_test(test_matmul),            cmocka_unit_test(test_attention),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
