/* tests/gpu/cuda_ops_test.c: the cuda backend's elementwise kernels against
 * the CPU reference (gpu_harness.h), in f32, bf16 and fp16, forward and
 * backward. Runs on a GPU machine only. */
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
static double tol_of(stoke_dtype t) { return t == STOKE_F32 ? G_TOL_F32 : G_TOL_LOW; }

#define SHAPE2(a, b) {2, {a, b}}
#define SHAPE3(a, b, c) {3, {a, b, c}}
#define SHAPE4(a, b, c, d) {4, {a, b, c, d}}

/* Shapes of the same-shape ops: odd sizes (the vectorized kernels' tails),
 * 2-D, 4-D and one long row. */
static const stoke_shape same_shapes[] = {SHAPE2(37, 129), SHAPE4(3, 5, 7, 11), {1, {100003}}, SHAPE2(1, 1)};
#define N_SAME (int)(sizeof same_shapes / sizeof *same_shapes)

static const stoke_layout layouts[] = {STOKE_NCHW, STOKE_NHWC};

static void test_relu(void **state) {
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < N_SAME; s++) {
      g_case c = {.op = STOKE_OP_RELU, .attrs = "", .n_in = 1, .in_shape = {same_shapes[s]}, .dtype = dtypes[d],
                  .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
      g_check(&c);
    }
}

static void test_gelu(void **state) {
  static const char *attrs[] = {"approximate=none", "approximate=tanh"};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < N_SAME; s++)
      for (int a = 0; a < 2; a++) {
        g_case c = {.op = STOKE_OP_GELU, .attrs = attrs[a], .n_in = 1, .in_shape = {same_shapes[s]},
                    .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
        g_check(&c);
      }
}

static void test_add(void **state) {
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < N_SAME; s++) {
      g_case c = {.op = STOKE_OP_ADD, .attrs = "", .n_in = 2, .in_shape = {same_shapes[s], same_shapes[s]},
                  .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
      g_check(&c);
    }
}

/* bias_add: 2-D (a linear's bias), 3-D, 4-D in both layouts, and a large
 * spatial extent (the block-per-row reduction of dbias); the bias is a
 * parameter, so its gradient goes through the accumulate path. */
static void test_bias_add(void **state) {
  static const struct {
    stoke_shape x;
    int four_d;
  } xs[] = {{SHAPE2(37, 129), 0}, {SHAPE3(4, 6, 9), 0}, {SHAPE4(3, 5, 7, 11), 1}, {SHAPE4(2, 3, 40, 41), 1},
            {SHAPE4(5, 70, 1, 1), 1}};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < (int)(sizeof xs / sizeof *xs); s++)
      for (int l = 0; l < (xs[s].four_d ? 2 : 1); l++) {
        g_case c = {.op = STOKE_OP_BIAS_ADD, .attrs = "", .n_in = 2,
                    .in_shape = {xs[s].x, {1, {xs[s].x.d[1]}}}, .param_mask = 1u << 1,
                    .layout = xs[s].four_d ? layouts[l] : STOKE_LAYOUT_ANY, .dtype = dtypes[d],
                    .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
        g_check(&c);
      }
}

static void test_flatten(void **state) {
  for (int d = 0; d < 3; d++) {
    for (int l = 0; l < 2; l++) {
      g_case c = {.op = STOKE_OP_FLATTEN, .attrs = "", .n_in = 1, .in_shape = {SHAPE4(3, 5, 7, 11)},
                  .layout = layouts[l], .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1,
                  .backward = 1};
      g_check(&c);
    }
    g_case c = {.op = STOKE_OP_FLATTEN, .attrs = "", .n_in = 1, .in_shape = {SHAPE3(4, 6, 9)}, .dtype = dtypes[d],
                .tol = tol_of(dtypes[d]), .training = 1, .backward = 1};
    g_check(&c);
  }
}

/* global_avg_pool: small maps (a warp per row) and H W >= 1024 (a block per
 * row), both layouts; C = 70 spans three 32-column tiles for NHWC. */
static void test_global_avg_pool(void **state) {
  static const stoke_shape xs[] = {SHAPE4(3, 5, 7, 11), SHAPE4(2, 3, 40, 41), SHAPE4(4, 70, 1, 1),
                                   SHAPE4(2, 70, 3, 3)};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < (int)(sizeof xs / sizeof *xs); s++)
      for (int l = 0; l < 2; l++) {
        g_case c = {.op = STOKE_OP_GLOBAL_AVG_POOL, .attrs = "", .n_in = 1, .in_shape = {xs[s]},
                    .layout = layouts[l], .dtype = dtypes[d], .tol = tol_of(dtypes[d]), .training = 1,
                    .backward = 1};
        g_check(&c);
      }
}

/* softmax_ce: rows of a warp (C <= 512), of a block (C = 1000, 1001) and
 * of whole 16-byte vectors (C = 520, 2056 and GPT-2's padded 50304: the
 * vector kernels), label smoothing 0 and 0.1. The loss is f32 whatever the
 * logits' dtype. The bound: g_tol over a row (the sums run over C), except
 * fp16's gradients: dloss / N times probabilities near 1 / C fall below
 * fp16's normal range (2^-14) where its spacing is a fixed 2^-24, so fp16
 * keeps the low-precision bound and stays off the widest rows. */
static void test_softmax_ce(void **state) {
  static const int64_t nc[][2] = {{37, 129}, {64, 10}, {5, 1000}, {1, 1},  {300, 3},
                                  {7, 1001}, {9, 520}, {33, 2056}, {16, 50304}};
  static const char *attrs[] = {"label_smoothing=0", "label_smoothing=0.1"};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < (int)(sizeof nc / sizeof *nc); s++)
      for (int a = 0; a < 2; a++) {
        if (dtypes[d] == STOKE_F16 && nc[s][1] > 4096) continue;
        g_case c = {.op = STOKE_OP_SOFTMAX_CE, .attrs = attrs[a], .n_in = 2,
                    .in_shape = {SHAPE2(nc[s][0], nc[s][1]), {1, {nc[s][0]}}}, .is_label = {0, 1},
                    .classes = nc[s][1], .dtype = dtypes[d],
                    .tol = dtypes[d] == STOKE_F16 ? G_TOL_LOW : g_tol(dtypes[d], nc[s][1]), .training = 1,
                    .backward = 1};
        g_check(&c);
      }
}

/* softmax_ce's backward with dlogits written over the logits (as the graph
 * may plan it) against dlogits in their own memory: bitwise the same, for
 * the vector kernel (C = 50304) and the plain one (C = 1001), bf16. */
static void check_softmax_ce_in_place(int64_t n, int64_t cl) {
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_SOFTMAX_CE, "softmax_ce_in_place", "label_smoothing=0.1", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 993, (uint64_t)cl));
  stoke_shape xs = SHAPE2(n, cl), ls = {1, {n}}, one = {1, {1}};
  g_tensor x, lab, loss, lse, dloss, dx;
  g_alloc(&x, &xs, STOKE_BF16, STOKE_LAYOUT_ANY);
  g_alloc(&lab, &ls, STOKE_I32, STOKE_LAYOUT_ANY);
  g_alloc(&loss, &one, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&lse, &ls, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&dloss, &one, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&dx, &xs, STOKE_BF16, STOKE_LAYOUT_ANY);
  g_fill(&x, &r, -4, 4, 0);
  g_fill(&lab, &r, 0, (double)cl, 1);
  g_fill(&dloss, &r, 0.5, 1.5, 0);
  g_poison(&dx);
  stoke_tensor in[2] = {x.dev, lab.dev}, out[2] = {loss.dev, lse.dev}, din[2] = {dx.dev, {0}},
               dout[2] = {dloss.dev, {0}};
  void *es = NULL;
  const stoke_kernel_v1 *fk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_FWD, STOKE_BF16, STOKE_LAYOUT_ANY, &es);
  const stoke_kernel_v1 *bk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_BWD, STOKE_BF16, STOKE_LAYOUT_ANY, &es);
  stoke_kernel_args_v1 a = {.node = &node, .n_in = 2, .n_out = 2, .in = in, .out = out, .din = din, .dout = dout,
                            .training = 1, .engine = es, .stream = g_dev->default_stream(g_dev_self)};
  g_run(fk, &a, 1);
  g_run(bk, &a, 1);
  size_t bytes = (size_t)(n * cl) * 2;
  void *want = malloc(bytes), *got = malloc(bytes);
  g_dev_get(want, dx.dev.data, bytes);
  din[0].data = x.dev.data; /* over the logits */
  g_run(bk, &a, 1);
  g_dev_get(got, x.dev.data, bytes);
  print_message("  softmax_ce   bf16 %lldx%lld dlogits over the logits: %s\n", (long long)n, (long long)cl,
                memcmp(want, got, bytes) ? "DIFFERENT" : "bitwise the same");
  if (memcmp(want, got, bytes))
    fail_msg("softmax_ce %lldx%lld: dlogits written over the logits differ from their own memory's (seed %llu)",
             (long long)n, (long long)cl, (unsigned long long)g_seed);
  free(want);
  free(got);
  g_free(&x);
  g_free(&lab);
  g_free(&loss);
  g_free(&lse);
  g_free(&dloss);
  g_free(&dx);
}

static void test_softmax_ce_in_place(void **state) {
  check_softmax_ce_in_place(24, 50304);
  check_softmax_ce_in_place(24, 1001);
}

/* dropout p = 0.3 in training (the GPU regenerates the CPU's mask from the
 * same seed, so any mask difference fails) and in eval (identity), p = 0. */
static void test_dropout(void **state) {
  static const char *attrs[] = {"p=0.3", "p=0"};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < N_SAME; s++)
      for (int a = 0; a < 2; a++)
        for (int training = 0; training < 2; training++) {
          g_case c = {.op = STOKE_OP_DROPOUT, .attrs = attrs[a], .n_in = 1, .in_shape = {same_shapes[s]},
                      .layout = same_shapes[s].ndim == 4 ? STOKE_NHWC : STOKE_LAYOUT_ANY, .dtype = dtypes[d],
                      .tol = tol_of(dtypes[d]), .training = training, .backward = 1};
          g_check(&c);
        }
}

/* normalize: u8 HWC images, C = 1 and C = 3, output NCHW and NHWC, written
 * in f32, bf16 and f16 (the tested dtype is the output's). */
static void test_normalize(void **state) {
  static const struct {
    stoke_shape x;
    const char *mean_std;
  } xs[] = {{SHAPE4(2, 1, 7, 9), "mean=0.5, std=0.25"},
            {SHAPE4(3, 3, 13, 11), "mean=0.485:0.456:0.406, std=0.229:0.224:0.225"},
            {SHAPE4(2, 3, 5, 5), "mean=0.5, std=0.5"}};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < (int)(sizeof xs / sizeof *xs); s++)
      for (int l = 0; l < 2; l++) {
        char attrs[128];
        snprintf(attrs, sizeof attrs, "%s, layout=%s", xs[s].mean_std, l ? "nhwc" : "nchw");
        g_case c = {.op = STOKE_OP_NORMALIZE, .attrs = attrs, .n_in = 1, .in_shape = {xs[s].x},
                    .in_dtype = {STOKE_U8}, .layout = layouts[l], .dtype = dtypes[d], .tol = tol_of(dtypes[d]),
                    .training = 1, .backward = 0};
        g_check(&c);
      }
}

/* softmax_ce on the GPU alone: the loss is bitwise the same on a second run
 * (deterministic reductions), and a label outside [0, C) gives a NaN loss
 * and NaN gradients for its row instead of reading out of the row. */
static void test_softmax_ce_determinism_and_bad_label(void **state) {
  const int64_t n = 300, cl = 1000;
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_SOFTMAX_CE, "softmax_ce_bad_label", "label_smoothing=0.1", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 991, 0));
  stoke_shape xs = SHAPE2(n, cl), ls = {1, {n}}, one = {1, {1}};
  g_tensor x, lab, loss, lse, dloss, dx;
  g_alloc(&x, &xs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&lab, &ls, STOKE_I32, STOKE_LAYOUT_ANY);
  g_alloc(&loss, &one, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&lse, &ls, STOKE_F32, STOKE_LAYOUT_ANY); /* each row's log-sum-exp, for the backward */
  g_alloc(&dloss, &one, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&dx, &xs, STOKE_F32, STOKE_LAYOUT_ANY);
  g_fill(&x, &r, -4, 4, 0);
  g_fill(&lab, &r, 0, (double)cl, 1);
  g_fill(&dloss, &r, 0.5, 1.5, 0);
  stoke_tensor in[2] = {x.dev, lab.dev}, out[2] = {loss.dev, lse.dev}, din[2] = {dx.dev, {0}},
               dout[2] = {dloss.dev, {0}};
  void *es = NULL;
  const stoke_kernel_v1 *fk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_FWD, STOKE_F32, STOKE_LAYOUT_ANY, &es);
  const stoke_kernel_v1 *bk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_BWD, STOKE_F32, STOKE_LAYOUT_ANY, &es);
  stoke_kernel_args_v1 a = {.node = &node, .n_in = 2, .n_out = 2, .in = in, .out = out, .din = din, .dout = dout,
                            .training = 1, .engine = es, .stream = g_dev->default_stream(g_dev_self)};
  float first, again;
  g_run(fk, &a, 1);
  e = g_dev->copy(g_dev_self, &first, loss.dev.data, sizeof first, STOKE_COPY_D2H, NULL);
  if (e) fail_msg("download: %s", e->msg);
  g_poison(&loss);
  g_run(fk, &a, 1);
  e = g_dev->copy(g_dev_self, &again, loss.dev.data, sizeof again, STOKE_COPY_D2H, NULL);
  if (e) fail_msg("download: %s", e->msg);
  print_message("  softmax_ce   loss %.9g, again %.9g\n", first, again);
  if (!isfinite(first) || memcmp(&first, &again, sizeof first))
    fail_msg("softmax_ce loss not reproducible: %.9g then %.9g", first, again);
  /* row 7 gets label C, row 8 label -1 */
  int32_t bad[2] = {(int32_t)cl, -1};
  e = g_dev->copy(g_dev_self, (int32_t *)lab.dev.data + 7, bad, sizeof bad, STOKE_COPY_H2D, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("upload: %s", e->msg);
  g_run(fk, &a, 1);
  e = g_dev->copy(g_dev_self, &again, loss.dev.data, sizeof again, STOKE_COPY_D2H, NULL);
  if (e) fail_msg("download: %s", e->msg);
  if (!isnan(again)) fail_msg("softmax_ce with an out-of-range label: loss %.9g, expected NaN", again);
  g_poison(&dx);
  g_run(bk, &a, 1);
  float *g = malloc((size_t)(n * cl) * sizeof(float));
  e = g_dev->copy(g_dev_self, g, dx.dev.data, (size_t)(n * cl) * sizeof(float), STOKE_COPY_D2H, NULL);
  if (e) fail_msg("download: %s", e->msg);
  for (int64_t i = 0; i < n * cl; i++) {
    int64_t row = i / cl;
    int want_nan = row == 7 || row == 8;
    if (want_nan != !!isnan(g[i]))
      fail_msg("softmax_ce backward, row %lld: gradient %g (NaN expected only in the bad rows)", (long long)row,
               (double)g[i]);
  }
  free(g);
  g_free(&x);
  g_free(&lab);
  g_free(&loss);
  g_free(&lse);
  g_free(&dloss);
  g_free(&dx);
}

/* cast: f32 NCHW in, f32/bf16/f16 NHWC (or flat) out, against the CPU's
 * cast in f64 with the same layouts. */
static void test_cast(void **state) {
  stoke_node_v1 node;
  for (int d = 0; d < 3; d++)
    for (int four = 0; four < 2; four++) {
      char attrs[32];
      snprintf(attrs, sizeof attrs, "dtype=%s", stoke_dtype_name(dtypes[d]));
      stoke_err *e = stoke_node_init(g_reg, STOKE_OP_CAST, "cast_test", attrs, &node);
      if (e) fail_msg("%s", e->msg);
      stoke_shape sh = four ? (stoke_shape){4, {3, 5, 7, 11}} : (stoke_shape){2, {37, 129}};
      stoke_layout lin = four ? STOKE_NCHW : STOKE_LAYOUT_ANY, lout = four ? STOKE_NHWC : STOKE_LAYOUT_ANY;
      g_tensor x, y;
      g_alloc(&x, &sh, STOKE_F32, lin);
      g_alloc2(&y, &sh, STOKE_F64, dtypes[d], lout);
      stoke_rng r = stoke_rng_seed(g_seed + (uint64_t)d);
      g_fill(&x, &r, -3, 3, 0);
      g_poison(&y);
      stoke_kernel_args_v1 ra = {.node = &node, .n_in = 1, .n_out = 1, .in = &x.ref, .out = &y.ref};
      stoke_kernel_args_v1 ga = {.node = &node, .n_in = 1, .n_out = 1, .in = &x.dev, .out = &y.dev,
                                 .stream = g_dev->default_stream(g_dev_self)};
      g_run(stoke_find_kernel(g_reg, "cpu", STOKE_OP_CAST, STOKE_FWD, STOKE_F64, lin), &ra, 0);
      void *es;
      const stoke_kernel_v1 *k = g_gpu_kernel(STOKE_OP_CAST, STOKE_FWD, STOKE_F32, lin, &es);
      ga.engine = es;
      g_run(k, &ga, 1);
      double mx, err = g_compare(&y, &mx);
      print_message("  cast to %s %s rel err %.3g\n", stoke_dtype_name(dtypes[d]), four ? "NCHW->NHWC" : "flat", err);
      /* f32 is exact; bf16/f16 rounding alone: about 2^-9 / 2^-12 per element */
      if (!(err <= (dtypes[d] == STOKE_F32 ? 1e-12 : 5e-3))) fail_msg("cast: relative error %.3g", err);
      g_free(&x);
      g_free(&y);
    }
}

/* autocast (the precision policies' fp32 ops) between f32 and bf16/f16:
 * a cast has one right answer, so the GPU's must equal the host's rounding
 * bit for bit; backward into a parameter's gradient (beta 1) adds in f32
 * before rounding, into an activation's (beta 0) overwrites. */
static void test_autocast(void **state) {
  static const stoke_dtype pairs[][2] = {{STOKE_BF16, STOKE_F32}, {STOKE_F16, STOKE_F32},
                                         {STOKE_F32, STOKE_BF16}, {STOKE_F32, STOKE_F16}};
  enum { N = 100003 };
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 0xa0c, 0));
  for (int p = 0; p < 4; p++)
    for (int param = 0; param < 2; param++) {
      stoke_dtype from = pairs[p][0], to = pairs[p][1];
      size_t fb = stoke_dtype_size(from) * N, tb = stoke_dtype_size(to) * N;
      void *hx = malloc(fb), *hy = malloc(tb), *hdx = malloc(fb), *hdy = malloc(tb), *got = malloc(fb > tb ? fb : tb);
      for (int64_t i = 0; i < N; i++) {
        g_set(hx, from, i, -4 + 8 * stoke_rng_uniform(&r));
        g_set(hdy, to, i, -2 + 4 * stoke_rng_uniform(&r));
        g_set(hdx, from, i, -1 + 2 * stoke_rng_uniform(&r));
      }
      void *dx = g_dev_alloc(fb), *dy = g_dev_alloc(tb), *ddx = g_dev_alloc(fb), *ddy = g_dev_alloc(tb);
      g_dev_put(dx, hx, fb);
      g_dev_put(ddy, hdy, tb);
      g_dev_put(ddx, hdx, fb);
      stoke_err *e = g_dev->fill(g_dev_self, dy, 0xff, tb, NULL); /* poisoned */
      if (e) fail_msg("poison: %s", e->msg);
      char attrs[32];
      snprintf(attrs, sizeof attrs, "dtype=%s", stoke_dtype_name(to));
      stoke_node_v1 node;
      e = stoke_node_init(g_reg, STOKE_OP_AUTOCAST, "autocast_test", attrs, &node);
      if (e) fail_msg("%s", e->msg);
      stoke_shape sh = {1, {N}};
      stoke_tensor in = {dx, sh, from, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, out = {dy, sh, to, STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
      stoke_tensor din = {ddx, sh, from, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, dout = {ddy, sh, to, STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
      void *eself = NULL;
      const stoke_kernel_v1 *fk = g_gpu_kernel(STOKE_OP_AUTOCAST, STOKE_FWD, from, STOKE_LAYOUT_ANY, &eself);
      const stoke_kernel_v1 *bk = g_gpu_kernel(STOKE_OP_AUTOCAST, STOKE_BWD, from, STOKE_LAYOUT_ANY, &eself);
      stoke_kernel_args_v1 a = {.node = &node, .n_in = 1, .n_out = 1, .in = &in, .out = &out, .training = 1,
                                .engine = eself, .stream = g_dev->default_stream(g_dev_self)};
      g_run(fk, &a, 1);
      g_dev_get(got, dy, tb);
      for (int64_t i = 0; i < N; i++) {
        double want = g_get(hx, from, i), v = g_get(got, to, i);
        g_set(hy, to, 0, want);
        if (v != g_get(hy, to, 0))
          fail_msg("autocast %s -> %s: element %lld is %.9g, want %.9g", stoke_dtype_name(from), stoke_dtype_name(to),
                   (long long)i, v, g_get(hy, to, 0));
      }
      a.din = &din, a.dout = &dout, a.param_grads = param ? 1u : 0u, a.param_grad_beta = 1.0f;
      g_run(bk, &a, 1);
      g_dev_get(got, ddx, fb);
      for (int64_t i = 0; i < N; i++) {
        float sum = param ? (float)g_get(hdx, from, i) + (float)g_get(hdy, to, i) : (float)g_get(hdy, to, i);
        g_set(hy, from, 0, sum);
        if (g_get(got, from, i) != g_get(hy, from, 0))
          fail_msg("autocast %s -> %s backward (%s): element %lld is %.9g, want %.9g", stoke_dtype_name(from),
                   stoke_dtype_name(to), param ? "accumulated" : "overwritten", (long long)i, g_get(got, from, i),
                   g_get(hy, from, 0));
      }
      print_message("  autocast %s -> %s and back (%s): %d elements exact\n", stoke_dtype_name(from),
                    stoke_dtype_name(to), param ? "accumulated" : "overwritten", N);
      void *d[] = {dx, dy, ddx, ddy};
      for (int i = 0; i < 4; i++) g_dev->free(g_dev_self, d[i]);
      free(hx), free(hy), free(hdx), free(hdy), free(got);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relu),
      cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_cast),
      cmocka_unit_test(test_add),
      cmocka_unit_test(test_bias_add),
      cmocka_unit_test(test_flatten),
      cmocka_unit_test(test_global_avg_pool),
      cmocka_unit_test(test_softmax_ce),
      cmocka_unit_test(test_dropout),
      cmocka_unit_test(test_normalize),
      cmocka_unit_test(test_softmax_ce_determinism_and_bad_label),
      cmocka_unit_test(test_softmax_ce_in_place),
      cmocka_unit_test(test_autocast),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
