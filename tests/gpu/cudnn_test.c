/* tests/gpu/cudnn_test.c: the cudnn engine's conv2d plan cache under many
 * nodes planned at once, and conv2d's unfolded path for few input channels
 * in each of its forms (each against the CPU reference; every kernel's
 * shapes, dtypes, layouts and flags are every_kernel_test's), and autotune
 * with no memory left to time in. Runs on a GPU machine only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/cudnn/stoke_cudnn.h"
#include "gpu_harness.h"
#include "tests/common/log_capture.h"

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

/* conv2d with 1-8 input channels (ResNet's stem and odd ones: padding,
 * strides, odd sizes, a channel count whose unfolding needs zero padding)
 * through each path the engine can take (conv_graph.c): forced direct,
 * width taps unfolded (8- and 32-channel rows), all taps unfolded, and the
 * engine's own choice with and without autotune. Forward y, then backward dW alone (the stem's input
 * needs no gradient: the case that unfolds) overwritten (poisoned first)
 * and accumulated (param_grad_beta 1 onto random values). Each twice: the
 * weight [O, C, kh, kw] in memory, and [O, kh, kw, C] labelled NHWC (what
 * filter_ohwi gives a GPU run's filters: read as it is, dW written so; the
 * test reorders the same values in and its dW back before comparing).
 * Tolerance: g_tol of the dtype and the longest float sum (C R S terms for
 * y, N Ho Wo for dW); the unfolded path only reorders those sums. */
static void test_unfolded_paths(void **state) {
  static const struct {
    int64_t b, c, h, w, o, k, stride, pad;
  } cs[] = {{2, 3, 23, 21, 16, 7, 2, 3}, {3, 4, 9, 11, 8, 3, 1, 1}, {2, 1, 13, 13, 24, 5, 2, 2},
            {1, 8, 10, 7, 16, 3, 2, 1}, {2, 3, 8, 8, 8, 7, 2, 3},
            /* ResNet-18c's stem (3x3, stride 1, 3 channels): an odd step between positions in the staged row */
            {2, 3, 12, 10, 16, 3, 1, 1},
            /* staged rows of 400, 650 and 950 values: the width unfold's prefetch of 2, 3 and 4 values a
               thread, over 4 rows a block */
            {1, 4, 7, 90, 8, 3, 1, 1}, {2, 3, 10, 200, 8, 7, 2, 3}, {1, 3, 9, 300, 8, 7, 2, 3},
            /* rows too wide for the shared-memory unfold with all taps: the gather kernel (and the width
               unfold's rows of 4,112 values, loaded in place) */
            {1, 8, 9, 500, 8, 7, 2, 3}};
  static const stoke_dtype dts[2] = {STOKE_BF16, STOKE_F16};
  static const char *const how[6] = {"engine's rule", "forced direct", "width taps unfolded", "all taps unfolded",
                                     "width taps unfolded into 32-channel rows", "engine's timed choice"};
  const stoke_kernel_v1 *rf = stoke_find_kernel(g_reg, "cpu", STOKE_OP_CONV2D, STOKE_FWD, STOKE_F64, STOKE_NHWC);
  const stoke_kernel_v1 *rb = stoke_find_kernel(g_reg, "cpu", STOKE_OP_CONV2D, STOKE_BWD, STOKE_F64, STOKE_NHWC);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 77, 0));
  for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++)
    for (int di = 0; di < 2; di++)
      for (int run = 0; run < 12; run++) {
        stoke_dtype dt = dts[di];
        int ohwi = run >= 6, mode = run % 6;
        void *es = NULL;
        const stoke_kernel_v1 *gf = g_gpu_kernel(STOKE_OP_CONV2D, STOKE_FWD, dt, STOKE_NHWC, &es);
        const stoke_kernel_v1 *gb = g_gpu_kernel(STOKE_OP_CONV2D, STOKE_BWD, dt, STOKE_NHWC, &es);
        ((cudnn_engine *)es)->conv_unfold_force = mode < 5 ? mode : 0;
        char attrs[64];
        snprintf(attrs, sizeof attrs, "stride=%lld, padding=%lld", (long long)cs[ci].stride, (long long)cs[ci].pad);
        stoke_node_v1 node;
        stoke_err *e = stoke_node_init(g_reg, STOKE_OP_CONV2D, "stem", attrs, &node);
        if (e) fail_msg("%s", e->msg);
        int64_t ho = (cs[ci].h + 2 * cs[ci].pad - cs[ci].k) / cs[ci].stride + 1;
        int64_t wo = (cs[ci].w + 2 * cs[ci].pad - cs[ci].k) / cs[ci].stride + 1;
        g_tensor x, w, y, dy, dw;
        g_alloc(&x, &(stoke_shape){4, {cs[ci].b, cs[ci].c, cs[ci].h, cs[ci].w}}, dt, STOKE_NHWC);
        g_alloc(&w, &(stoke_shape){4, {cs[ci].o, cs[ci].c, cs[ci].k, cs[ci].k}}, dt, STOKE_LAYOUT_ANY);
        g_alloc(&dw, &w.ref.shape, dt, STOKE_LAYOUT_ANY);
        g_alloc(&y, &(stoke_shape){4, {cs[ci].b, cs[ci].o, ho, wo}}, dt, STOKE_NHWC);
        g_alloc(&dy, &y.ref.shape, dt, STOKE_NHWC);
        g_fill(&x, &r, -1, 1, 0);
        g_fill(&w, &r, -1, 1, 0);
        g_fill(&dy, &r, -1, 1, 0);
        g_poison(&y);
        /* ohwi: the GPU's weight and dW in [O, kh, kw, C] order, labelled NHWC */
        size_t wbytes = (size_t)stoke_numel(&w.ref.shape) * stoke_dtype_size(dt);
        stoke_tensor wdev = w.dev, dwdev = dw.dev;
        void *hw = malloc(wbytes), *tmp = malloc(wbytes);
        if (ohwi) {
          wdev.data = g_dev_alloc(wbytes), dwdev.data = g_dev_alloc(wbytes);
          wdev.layout = dwdev.layout = STOKE_NHWC;
          g_dev_get(hw, w.dev.data, wbytes);
          stoke_permute_nhwc(hw, dt, &w.ref.shape, 1, tmp);
          g_dev_put(wdev.data, hw, wbytes);
        }
        uint32_t flags = mode == 5 ? STOKE_KFLAG_AUTOTUNE : 0;
        char what[160];
        snprintf(what, sizeof what, "x [%lld, %lld, %lld, %lld] %lldx%lld s%lld p%lld %s, %s (seed %llu)",
                 (long long)cs[ci].b, (long long)cs[ci].c, (long long)cs[ci].h, (long long)cs[ci].w,
                 (long long)cs[ci].k, (long long)cs[ci].k, (long long)cs[ci].stride, (long long)cs[ci].pad,
                 stoke_dtype_name(dt), how[mode], (unsigned long long)g_seed);
        if (ohwi) strncat(what, ", weight [O, kh, kw, C]", sizeof what - strlen(what) - 1);
        stoke_tensor gin[2] = {x.dev, wdev}, gout[1] = {y.dev}, rin[2] = {x.ref, w.ref}, rout[1] = {y.ref};
        stoke_kernel_args_v1 ga = {.node = &node, .n_in = 2, .n_out = 1, .in = gin, .out = gout, .training = 1,
                                   .engine = es, .stream = g_dev->default_stream(g_dev_self), .flags = flags};
        stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .n_out = 1, .in = rin, .out = rout, .training = 1};
        g_run(gf, &ga, 1);
        g_run(rf, &ra, 0);
        double tol = g_tol(dt, cs[ci].c * cs[ci].k * cs[ci].k);
        double err = g_compare(&y, NULL);
        if (!(err <= tol)) fail_msg("y: relative error %.3g > %.3g; %s", err, tol, what);
        /* dW alone, overwritten then accumulated onto random values */
        tol = g_tol(dt, cs[ci].b * ho * wo);
        for (int acc = 0; acc < 2; acc++) {
          if (acc) g_fill(&dw, &r, -1, 1, 0);
          else g_poison(&dw);
          if (ohwi) { /* the same start, reordered (the poison is every byte alike) */
            g_dev_get(hw, dw.dev.data, wbytes);
            stoke_permute_nhwc(hw, dt, &w.ref.shape, 1, tmp);
            g_dev_put(dwdev.data, hw, wbytes);
          }
          stoke_tensor gdin[2] = {{0}, dwdev}, gdout[1] = {dy.dev}, rdin[2] = {{0}, dw.ref}, rdout[1] = {dy.ref};
          ga.din = gdin, ga.dout = gdout, ga.param_grads = 2u, ga.param_grad_beta = (float)acc;
          ra.din = rdin, ra.dout = rdout, ra.param_grads = 2u, ra.param_grad_beta = (float)acc;
          g_run(gb, &ga, 1);
          g_run(rb, &ra, 0);
          if (ohwi) { /* back to [O, C, kh, kw], where g_compare reads it */
            g_dev_get(hw, dwdev.data, wbytes);
            stoke_permute_nhwc(hw, dt, &w.ref.shape, 0, tmp);
            g_dev_put(dw.dev.data, hw, wbytes);
          }
          err = g_compare(&dw, NULL);
          if (!(err <= tol)) fail_msg("dW (%s): relative error %.3g > %.3g; %s", acc ? "accumulated" : "overwritten", err,
                                      tol, what);
        }
        ga.din = ga.dout = NULL;
        if (ohwi) g_dev->free(g_dev_self, wdev.data), g_dev->free(g_dev_self, dwdev.data);
        free(hw), free(tmp);
        g_free(&x), g_free(&w), g_free(&y), g_free(&dy), g_free(&dw);
        ((cudnn_engine *)es)->conv_unfold_force = 0;
      }
}

/* The device filled but for `keep_mib` or a little more (the smallest
 * pieces given back: cuDNN's own planning needs some), checked by probing
 * that `probe_mib` cannot be allocated (cudaMemGetInfo's free figure is no
 * guide: an H200 said 10 GiB free while no 1 MiB allocation succeeded).
 * Memory the libraries release after a fill (seen: 45-53 MiB free where
 * the fill left at most 32) is taken by filling again, up to 4 rounds.
 * What the last piece given back holds beyond `keep_mib` is taken again
 * in 1 MiB pieces.
 * g_unhog frees it. */
enum { MAX_HOG = 1024 };
typedef struct g_hog {
  void *p[MAX_HOG];
  size_t bytes[MAX_HOG];
  int n;
} g_hog;

static void g_fill_device(g_hog *h, size_t keep_mib, size_t probe_mib) {
  h->n = 0;
  for (int round = 0; round < 4; round++) {
    for (size_t b = (size_t)1 << 30; b >= ((size_t)1 << 20) && h->n < MAX_HOG;) {
      stoke_err *he = g_dev->alloc(g_dev_self, b, &h->p[h->n]);
      if (he) {
        stoke_err_free(he);
        b /= 2;
      } else {
        h->bytes[h->n++] = b;
      }
    }
    size_t back = 0;
    while (h->n > 0 && back < (keep_mib << 20)) {
      back += h->bytes[--h->n];
      g_dev->free(g_dev_self, h->p[h->n]);
    }
    /* the last piece given back may overshoot (the pieces are powers of two: 1+2+4+8+16+128 MiB gave 173 MiB
     * back for 48): what is over is taken again in 1 MiB pieces */
    for (size_t over = back > (keep_mib << 20) ? (back - (keep_mib << 20)) >> 20 : 0; over > 0 && h->n < MAX_HOG;
         over--) {
      stoke_err *he = g_dev->alloc(g_dev_self, (size_t)1 << 20, &h->p[h->n]);
      if (he) {
        stoke_err_free(he);
        break;
      }
      h->bytes[h->n++] = (size_t)1 << 20;
    }
    stoke_device_info_v1 info = {0};
    stoke_err *e = g_dev->info(g_dev_self, &info);
    if (e) fail_msg("%s", e->msg);
    void *probe = NULL;
    stoke_err *pe = g_dev->alloc(g_dev_self, probe_mib << 20, &probe);
    print_message("fill round %d: %.1f MiB free by cudaMemGetInfo; a %zu MiB allocation %s\n", round + 1,
                  info.free_bytes / 1048576.0, probe_mib, pe ? "fails" : "succeeds");
    if (pe) {
      stoke_err_free(pe);
      return;
    }
    g_dev->free(g_dev_self, probe);
  }
  fail_msg("the device could not be filled: a %zu MiB allocation still succeeds after 4 rounds", probe_mib);
}

static void g_unhog(g_hog *h) {
  while (h->n > 0) g_dev->free(g_dev_self, h->p[--h->n]);
}

/* conv_autotune when the run's memory leaves no room for the timing copies
 * (a batch that fills the device, the arena allocated before the kernels
 * are planned): the plan takes cuDNN's heuristic choice untimed, with a
 * warning, instead of failing the run (graph.c choose_plan; conv.c and
 * sdpa.c do the same). The device is filled (then 16 to 31 MiB given
 * back) before the plan, so that the 36 MiB of x, w and y copies the timing
 * needs cannot be allocated; freed before the run, which is checked against
 * the CPU. */
static void test_autotune_without_memory(void **state) {
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_CONV2D, STOKE_FWD, STOKE_F64, STOKE_NHWC);
  void *es = NULL;
  const stoke_kernel_v1 *gk = g_gpu_kernel(STOKE_OP_CONV2D, STOKE_FWD, STOKE_BF16, STOKE_NHWC, &es);
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_CONV2D, "tight", "stride=1, padding=1", &node);
  if (e) fail_msg("%s", e->msg);
  g_tensor x, w, y;
  g_alloc(&x, &(stoke_shape){4, {32, 48, 64, 64}}, STOKE_BF16, STOKE_NHWC);
  g_alloc(&w, &(stoke_shape){4, {48, 48, 3, 3}}, STOKE_BF16, STOKE_LAYOUT_ANY);
  g_alloc(&y, &(stoke_shape){4, {32, 48, 64, 64}}, STOKE_BF16, STOKE_NHWC);
  stoke_rng r = stoke_rng_seed(g_seed);
  g_fill(&x, &r, -1, 1, 0);
  g_fill(&w, &r, -1, 1, 0);
  g_poison(&y);
  g_hog hog;
  g_fill_device(&hog, 16, 36); /* the timing copies (36 MiB) cannot be allocated now */
  stoke_tensor gin[2] = {x.dev, w.dev}, gout[1] = {y.dev};
  stoke_kernel_args_v1 ga = {.node = &node, .n_in = 2, .n_out = 1, .in = gin, .out = gout, .training = 1,
                             .engine = es, .stream = g_dev->default_stream(g_dev_self), .flags = STOKE_KFLAG_AUTOTUNE};
  void *st = NULL, *ws = NULL;
  size_t wsb = 0;
  e = gk->plan(&ga, &st, &wsb);
  g_unhog(&hog);
  if (e) fail_msg("plan with autotune and 16 MiB free: %s", e->msg);
  if (wsb) {
    e = g_dev->alloc(g_dev_self, wsb, &ws);
    if (e) fail_msg("%s", e->msg);
  }
  ga.workspace = ws, ga.workspace_bytes = wsb;
  e = gk->run(&ga, st);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("run: %s", e->msg);
  stoke_tensor rin[2] = {x.ref, w.ref}, rout[1] = {y.ref};
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .n_out = 1, .in = rin, .out = rout, .training = 1};
  g_run(rk, &ra, 0);
  double err = g_compare(&y, NULL);
  print_message("untimed choice: relative error %.3g against the CPU\n", err);
  if (!(err <= G_TOL_LOW)) fail_msg("relative error %.3g (seed %llu)", err, (unsigned long long)g_seed);
  gk->destroy(st);
  if (ws) g_dev->free(g_dev_self, ws);
  g_free(&x), g_free(&w), g_free(&y);
}

typedef struct attn_plan {
  const stoke_kernel_v1 *k;
  stoke_kernel_args_v1 *a;
  void *state;
  size_t ws;
} attn_plan;

static void plan_attention(void *ctx) {
  attn_plan *p = ctx;
  stoke_err *e = p->k->plan(p->a, &p->state, &p->ws);
  if (e) fail_msg("attention plan with autotune: %s", e->msg);
}

/* The same for attention (sdpa.c), on GPT-2's shape: with no memory for
 * the timing's temporaries (72 MiB of qkv alone) the plan takes cuDNN's first
 * configuration untimed, with a warning, and keeps it for the shape: a
 * second node of the same shape plans without timing or warning. Then the
 * untimed choice runs, against the CPU. */
static void test_attention_autotune_without_memory(void **state) {
  enum { B = 16, T = 1024, H = 12, D = 64 };
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_ATTENTION, STOKE_FWD, STOKE_F64, STOKE_LAYOUT_ANY);
  /* cuDNN's SDPA itself (the cuda engine, listed first, has an attention kernel of its own) */
  void *es = NULL;
  const stoke_kernel_v1 *gk = stoke_find_kernel(g_reg, "cudnn", STOKE_OP_ATTENTION, STOKE_FWD, STOKE_BF16, STOKE_LAYOUT_ANY);
  for (int i = 0; i < g_n_engines; i++)
    if (!strcmp(g_engines[i], "cudnn")) es = g_engine_self[i];
  if (!rk || !gk || !es) fail_msg("no cpu attention kernel, or no cudnn one");
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_ATTENTION, "tight_attn", "n_head=12, causal=1", &node);
  if (e) fail_msg("%s", e->msg);
  g_tensor qkv, y, lse;
  g_alloc(&qkv, &(stoke_shape){3, {B, T, 3 * H * D}}, STOKE_BF16, STOKE_LAYOUT_ANY);
  g_alloc(&y, &(stoke_shape){3, {B, T, H * D}}, STOKE_BF16, STOKE_LAYOUT_ANY);
  g_alloc(&lse, &(stoke_shape){3, {B, H, T}}, STOKE_F32, STOKE_LAYOUT_ANY);
  stoke_rng r = stoke_rng_seed(g_seed);
  g_fill(&qkv, &r, -1, 1, 0);
  g_poison(&y);
  g_poison(&lse);
  stoke_tensor gin[1] = {qkv.dev}, gout[2] = {y.dev, lse.dev};
  stoke_kernel_args_v1 ga = {.node = &node, .n_in = 1, .n_out = 2, .in = gin, .out = gout, .training = 1,
                             .engine = es, .stream = g_dev->default_stream(g_dev_self), .flags = STOKE_KFLAG_AUTOTUNE};
  /* the same problem first, with memory: the premise, that cuDNN offers this shape several configurations to
   * time (else a full device would change nothing), and every configuration's kernels loaded; then the engine's
   * record of that choice is cleared, so the planning below must choose again */
  attn_plan warm = {gk, &ga, NULL, 0};
  char *said0 = test_log_of(plan_attention, &warm);
  print_message("the plan with memory said: %s", said0);
  if (!strstr(said0, "timed, ms")) fail_msg("with memory, the plan timed nothing: %s", said0);
  free(said0);
  gk->destroy(warm.state);
  ((cudnn_engine *)es)->n_sdpa = 0;
  g_hog hog;
  g_fill_device(&hog, 48, 72); /* room to build the plans, none for the 72 MiB of qkv's timing copy */
  attn_plan first = {gk, &ga, NULL, 0}, again = {gk, &ga, NULL, 0};
  char *said1 = test_log_of(plan_attention, &first), *said2 = test_log_of(plan_attention, &again);
  g_unhog(&hog);
  print_message("first plan said: %s", said1);
  print_message("second plan said: %s", said2[0] ? said2 : "(nothing)\n");
  if (!strstr(said1, "took cuDNN's heuristic choice untimed"))
    fail_msg("the first plan did not say it took the untimed choice: %s", said1);
  if (strstr(said2, "untimed") || strstr(said2, "timed, ms"))
    fail_msg("the second plan of the same shape timed or warned again: %s", said2);
  free(said1);
  free(said2);
  gk->destroy(again.state);
  void *ws = NULL;
  if (first.ws) {
    e = g_dev->alloc(g_dev_self, first.ws, &ws);
    if (e) fail_msg("%s", e->msg);
  }
  ga.workspace = ws, ga.workspace_bytes = first.ws;
  e = gk->run(&ga, first.state);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("run: %s", e->msg);
  stoke_tensor rin[1] = {qkv.ref}, rout[2] = {y.ref, lse.ref};
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = 1, .n_out = 2, .in = rin, .out = rout, .training = 1};
  g_run(rk, &ra, 0);
  double err = g_compare(&y, NULL), tol = g_tol(STOKE_BF16, T);
  print_message("untimed attention: relative error %.3g against the CPU (bound %.3g from bf16 and T = %d)\n", err,
                tol, T);
  if (!(err <= tol)) fail_msg("relative error %.3g > %.3g (seed %llu)", err, tol, (unsigned long long)g_seed);
  gk->destroy(first.state);
  if (ws) g_dev->free(g_dev_self, ws);
  g_free(&qkv), g_free(&y), g_free(&lse);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_many_plans_kept), cmocka_unit_test(test_unfolded_paths),
                                     cmocka_unit_test(test_autotune_without_memory),
                                     cmocka_unit_test(test_attention_autotune_without_memory),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
