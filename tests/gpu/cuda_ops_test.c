/* tests/gpu/cuda_ops_test.c: what the cuda backend's kernels promise
 * beyond matching the CPU reference (that is every_kernel_test's):
 * softmax_ce's loss bitwise the same run to run and NaN for a label out of
 * range, its dlogits the same bits when written over the logits,
 * add_layer_norm's backward the same bits with its gradients in one
 * in-place buffer and its weight gradients accumulated, autocast equal to
 * the host's rounding bit for bit, max_pool2d's first-NaN-wins rule in
 * the row-tile kernels, and a step graph's memset nodes rewritten as
 * kernel nodes (graph_memset.cu) writing the same bytes. Runs on a GPU
 * machine only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "backends/cuda/graph_memset.h"
#include "backends/cuda/tune_fill.h"
#include "gpu_harness.h"

static int setup(void **state) {
  static const char *engines[] = {"cuda"};
  return g_setup_engines(engines, 1);
}

#define SHAPE1(a) {1, {a}}
#define SHAPE2(a, b) {2, {a, b}}

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

/* softmax_ce with masked classes (-inf logits, never the label's) and no
 * smoothing, as PyTorch scores them: a finite loss, zero gradients at the
 * masked classes, the rest against a host computation in double. Every
 * kernel family: 10 classes (a warp a row), 1000 (whole 16-byte vectors,
 * a block a row), 1001 (a block a row, element by element); f32 and bf16.
 * (The loss was NaN: 0 x sum(x) with sum(x) = -inf; the warp kernel's sum
 * was NaN too: exp(-inf - -inf).) Tolerances: the kernel sums C exps in f32
 * with __expf (2 ulp), so lse is within (2C + 8) u32 of exact (u32 = 2^-24),
 * relative; the loss is measured against max(|loss|, 1); the gradient,
 * normwise, adds the output's rounding (2^-8 in bf16). */
static void test_softmax_ce_masked_classes(void **state) {
  static const int64_t classes[] = {10, 1000, 1001};
  static const stoke_dtype dts[] = {STOKE_F32, STOKE_BF16};
  const int64_t n = 64;
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_SOFTMAX_CE, "softmax_ce_masked", "", &node);
  if (e) fail_msg("%s", e->msg);
  for (int ci = 0; ci < 3; ci++)
    for (int di = 0; di < 2; di++) {
      const int64_t cl = classes[ci];
      const stoke_dtype dt = dts[di];
      const size_t es = stoke_dtype_size(dt);
      stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 995, (uint64_t)(cl * 2 + di)));
      char *hx = malloc((size_t)(n * cl) * es), *hg = malloc((size_t)(n * cl) * es);
      double *xv = malloc(sizeof(double) * (size_t)(n * cl));
      int32_t *lab = malloc(sizeof(int32_t) * (size_t)n);
      int masked = 0;
      for (int64_t i = 0; i < n; i++) lab[i] = (int32_t)stoke_rng_below(&r, (uint64_t)cl);
      for (int64_t i = 0; i < n * cl; i++) {
        double v = -4 + 8 * stoke_rng_uniform(&r);
        if (i % cl != lab[i / cl] && stoke_rng_uniform(&r) < 0.3) v = -INFINITY, masked++;
        g_set(hx, dt, i, v);
        xv[i] = g_get(hx, dt, i); /* rounded */
      }
      float dloss = (float)(0.5 + stoke_rng_uniform(&r)), loss = NAN;
      void *dx_ = g_dev_alloc((size_t)(n * cl) * es), *dlab = g_dev_alloc(sizeof(int32_t) * (size_t)n);
      void *dl = g_dev_alloc(4), *dlse = g_dev_alloc(4 * (size_t)n), *ddl = g_dev_alloc(4),
           *dgx = g_dev_alloc((size_t)(n * cl) * es);
      g_dev_put(dx_, hx, (size_t)(n * cl) * es);
      g_dev_put(dlab, lab, sizeof(int32_t) * (size_t)n);
      g_dev_put(ddl, &dloss, 4);
      e = g_dev->fill(g_dev_self, dl, 0xff, 4, NULL); /* poisoned */
      if (!e) e = g_dev->fill(g_dev_self, dgx, 0xff, (size_t)(n * cl) * es, NULL);
      if (e) fail_msg("poison: %s", e->msg);
      stoke_tensor in[2] = {{dx_, {2, {n, cl}}, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                            {dlab, {1, {n}}, STOKE_I32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
      stoke_tensor out[2] = {{dl, {1, {1}}, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                             {dlse, {1, {n}}, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
      stoke_tensor din[2] = {{dgx, {2, {n, cl}}, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, {0}};
      stoke_tensor dout[2] = {{ddl, {1, {1}}, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, {0}};
      void *es_ = NULL;
      const stoke_kernel_v1 *fk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_FWD, dt, STOKE_LAYOUT_ANY, &es_);
      const stoke_kernel_v1 *bk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_BWD, dt, STOKE_LAYOUT_ANY, &es_);
      stoke_kernel_args_v1 a = {.node = &node, .n_in = 2, .n_out = 2, .in = in, .out = out, .din = din,
                                .dout = dout, .training = 1, .engine = es_,
                                .stream = g_dev->default_stream(g_dev_self)};
      g_run(fk, &a, 1);
      g_run(bk, &a, 1);
      g_dev_get(&loss, dl, 4);
      g_dev_get(hg, dgx, (size_t)(n * cl) * es);
      /* the host's: lse over the finite logits, loss = mean(lse - x[label]), dx = dloss / n (softmax - onehot) */
      double want = 0, num = 0, den = 0;
      int bad = 0;
      for (int64_t row = 0; row < n; row++) {
        const double *x = xv + row * cl;
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < cl; j++) m = fmax(m, x[j]);
        for (int64_t j = 0; j < cl; j++) sum += exp(x[j] - m);
        double lse = m + log(sum);
        want += (lse - x[lab[row]]) / (double)n;
        for (int64_t j = 0; j < cl; j++) {
          double gw = (double)dloss / (double)n * (exp(x[j] - lse) - (j == lab[row])), got = g_get(hg, dt, row * cl + j);
          if (!isfinite(got) || (x[j] == -INFINITY && got != 0)) bad++;
          num += (got - gw) * (got - gw), den += gw * gw;
        }
      }
      const double u = 0x1p-24, tol_l = (2.0 * (double)cl + 8) * u, u_out = dt == STOKE_BF16 ? 0x1p-8 : u;
      const double err_l = fabs(loss - want) / fmax(fabs(want), 1), err_g = sqrt(num / den);
      print_message("  softmax_ce   %s %lldx%lld, %d of %lld logits -inf: loss %.7g (host %.7g, error %.2g of %.2g), "
                    "dlogits error %.2g of %.2g\n", stoke_dtype_name(dt), (long long)n, (long long)cl, masked,
                    (long long)(n * cl), (double)loss, want, err_l, tol_l, err_g, 2 * u_out + tol_l);
      if (!isfinite(loss) || err_l > tol_l)
        fail_msg("softmax_ce %s %lld classes with -inf logits: loss %g, host %g (seed %llu)", stoke_dtype_name(dt),
                 (long long)cl, (double)loss, want, (unsigned long long)g_seed);
      if (bad || !(err_g <= 2 * u_out + tol_l))
        fail_msg("softmax_ce %s %lld classes with -inf logits: %d gradients NaN or nonzero at a masked class, "
                 "normwise error %g (seed %llu)", stoke_dtype_name(dt), (long long)cl, bad, err_g,
                 (unsigned long long)g_seed);
      void *bufs[] = {dx_, dlab, dl, dlse, ddl, dgx};
      for (int i = 0; i < 6; i++) g_dev->free(g_dev_self, bufs[i]);
      free(hx), free(hg), free(xv), free(lab);
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

/* One softmax_ce call on the GPU, bf16 logits [n, cl] in [-4, 4), labels,
 * dloss in [0.5, 1.5) drawn from the run's seed and `salt`; dlogits in
 * their own memory (din[0]) poisoned; args wired as the executor wires a
 * backward node (every input and output live). */
typedef struct sce_call {
  stoke_node_v1 node;
  g_tensor x, lab, loss, lse, dloss, dx;
  stoke_tensor in[2], out[2], din[2], dout[2];
  const stoke_kernel_v1 *fk, *bk;
  stoke_kernel_args_v1 a;
  size_t bytes, lbytes; /* of the logits, of lse */
} sce_call;

static void sce_open(sce_call *c, int64_t n, int64_t cl, uint64_t salt, const char *name) {
  memset(c, 0, sizeof *c);
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_SOFTMAX_CE, name, "label_smoothing=0.1", &c->node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, salt, (uint64_t)cl));
  stoke_shape xs = SHAPE2(n, cl), ls = {1, {n}}, one = {1, {1}};
  g_alloc(&c->x, &xs, STOKE_BF16, STOKE_LAYOUT_ANY);
  g_alloc(&c->lab, &ls, STOKE_I32, STOKE_LAYOUT_ANY);
  g_alloc(&c->loss, &one, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&c->lse, &ls, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&c->dloss, &one, STOKE_F32, STOKE_LAYOUT_ANY);
  g_alloc(&c->dx, &xs, STOKE_BF16, STOKE_LAYOUT_ANY);
  g_fill(&c->x, &r, -4, 4, 0);
  g_fill(&c->lab, &r, 0, (double)cl, 1);
  g_fill(&c->dloss, &r, 0.5, 1.5, 0);
  g_poison(&c->dx);
  c->in[0] = c->x.dev, c->in[1] = c->lab.dev, c->out[0] = c->loss.dev, c->out[1] = c->lse.dev;
  c->din[0] = c->dx.dev, c->dout[0] = c->dloss.dev;
  void *es = NULL;
  c->fk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_FWD, STOKE_BF16, STOKE_LAYOUT_ANY, &es);
  c->bk = g_gpu_kernel(STOKE_OP_SOFTMAX_CE, STOKE_BWD, STOKE_BF16, STOKE_LAYOUT_ANY, &es);
  c->a = (stoke_kernel_args_v1){.node = &c->node, .n_in = 2, .n_out = 2, .in = c->in, .out = c->out, .din = c->din,
                                .dout = c->dout, .training = 1, .engine = es, .stream = g_dev->default_stream(g_dev_self)};
  c->bytes = (size_t)(n * cl) * 2;
  c->lbytes = (size_t)n * 4;
}

static void sce_close(sce_call *c) {
  g_tensor *t[] = {&c->x, &c->lab, &c->loss, &c->lse, &c->dloss, &c->dx};
  for (int i = 0; i < 6; i++) g_free(t[i]);
}

/* softmax_ce's backward with dlogits written over the logits (as the graph
 * may plan it) against dlogits in their own memory: bitwise the same, for
 * the vector kernel (C = 50304) and the plain one (C = 1001), bf16. */
static void check_softmax_ce_in_place(int64_t n, int64_t cl) {
  sce_call c;
  sce_open(&c, n, cl, 993, "softmax_ce_in_place");
  g_run(c.fk, &c.a, 1);
  g_run(c.bk, &c.a, 1);
  size_t bytes = c.bytes;
  void *want = malloc(bytes), *got = malloc(bytes);
  g_dev_get(want, c.dx.dev.data, bytes);
  c.din[0].data = c.x.dev.data; /* over the logits */
  g_run(c.bk, &c.a, 1);
  g_dev_get(got, c.x.dev.data, bytes);
  print_message("  softmax_ce   bf16 %lldx%lld dlogits over the logits: %s\n", (long long)n, (long long)cl,
                memcmp(want, got, bytes) ? "DIFFERENT" : "bitwise the same");
  if (memcmp(want, got, bytes))
    fail_msg("softmax_ce %lldx%lld: dlogits written over the logits differ from their own memory's (seed %llu)",
             (long long)n, (long long)cl, (unsigned long long)g_seed);
  free(want);
  free(got);
  sce_close(&c);
}

/* softmax_ce's backward doing the forward's work too (with_forward, as the
 * compiler runs it when it drops the forward node; bf16): its dlogits, loss
 * and lse bitwise the forward kernel's and the backward kernel's run one
 * after the other (the kernels share their arithmetic and its order, so
 * [run] fwd_in_bwd changes no result); a second run, and dlogits over the
 * logits, bitwise the same again. C = 50304 takes the one-kernel path,
 * C = 1001 the two kernels in turn. Outputs poisoned before each run. */
static void check_softmax_ce_with_forward(int64_t n, int64_t cl) {
  sce_call c;
  sce_open(&c, n, cl, 994, "softmax_ce_with_forward");
  size_t bytes = c.bytes, lbytes = c.lbytes;
  void *want = malloc(bytes), *got = malloc(bytes), *unf = malloc(bytes);
  float *lse_f = malloc(lbytes), *lse_w = malloc(lbytes), *lse_g = malloc(lbytes), loss_f, loss_w, loss_g;
  if (!(c.bk->caps & STOKE_KCAP_WITH_FORWARD)) fail_msg("the GPU softmax_ce backward lost STOKE_KCAP_WITH_FORWARD");
  g_poison(&c.loss), g_poison(&c.lse), g_poison(&c.dx);
  g_run(c.fk, &c.a, 1); /* the forward kernel's loss and lse, then the backward kernel's dlogits */
  g_run(c.bk, &c.a, 1);
  g_dev_get(&loss_f, c.loss.dev.data, 4);
  g_dev_get(lse_f, c.lse.dev.data, lbytes);
  g_dev_get(unf, c.dx.dev.data, bytes);
  c.a.with_forward = 1;
  for (int run = 0; run < 3; run++) {
    g_poison(&c.loss), g_poison(&c.lse);
    if (run < 2) g_poison(&c.dx);
    c.din[0].data = run < 2 ? c.dx.dev.data : c.x.dev.data; /* the third over the logits */
    g_run(c.bk, &c.a, 1);
    g_dev_get(run ? got : want, c.din[0].data, bytes);
    g_dev_get(run ? &loss_g : &loss_w, c.loss.dev.data, 4);
    g_dev_get(run ? lse_g : lse_w, c.lse.dev.data, lbytes);
    int same = !memcmp(want, got, bytes) && !memcmp(lse_w, lse_g, lbytes) && loss_w == loss_g;
    print_message("  softmax_ce   bf16 %lldx%lld with forward, %s: %s (loss %.9g)\n", (long long)n, (long long)cl,
                  run == 0 ? "first" : run == 1 ? "again" : "over the logits", run == 0 ? "-" : same ? "bitwise the same" : "DIFFERENT",
                  (double)(run ? loss_g : loss_w));
    if (run && !same)
      fail_msg("softmax_ce %lldx%lld with forward, %s: dlogits, loss or lse differ from the first run (seed %llu)",
               (long long)n, (long long)cl, run == 1 ? "run again" : "over the logits", (unsigned long long)g_seed);
  }
  int same = !memcmp(want, unf, bytes) && !memcmp(lse_w, lse_f, lbytes) && loss_w == loss_f;
  print_message("  softmax_ce   bf16 %lldx%lld with forward against the forward then the backward kernel: %s "
                "(loss %.9g and %.9g)\n", (long long)n, (long long)cl, same ? "bitwise the same" : "DIFFERENT",
                (double)loss_w, (double)loss_f);
  if (!same)
    fail_msg("softmax_ce %lldx%lld with forward: dlogits, loss or lse differ from the two kernels' (seed %llu)",
             (long long)n, (long long)cl, (unsigned long long)g_seed);
  free(want), free(got), free(unf), free(lse_f), free(lse_w), free(lse_g);
  sce_close(&c);
}

static void test_softmax_ce_in_place(void **state) {
  check_softmax_ce_in_place(24, 50304);
  check_softmax_ce_in_place(24, 1001);
  check_softmax_ce_with_forward(40, 50304);
  check_softmax_ce_with_forward(40, 1001);
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
  static const stoke_dtype dtypes[] = {STOKE_F32, STOKE_BF16, STOKE_F16};
  for (int d = 0; d < 3; d++) {
    check_ln_aliases(dtypes[d], 2100, 768); /* the register path */
    check_ln_aliases(dtypes[d], 600, 1280); /* GPT-2 large: 16-bit register path at 6 slots a lane, f32's plain one in 16-byte loads */
    check_ln_aliases(dtypes[d], 1000, 1600); /* GPT-2 XL: the forward's register path at 8 slots a lane, the plain backward */
    check_ln_aliases(dtypes[d], 37, 129);   /* the plain kernels */
  }
}

/* max_pool2d with NaNs in its windows (NHWC, ResNet's 3x3 window, stride 2, padding 1: the row
 * tiles): y is NaN where the window holds one, else its maximum; each dy goes to the window's
 * first NaN (its first maximum when it has none), the CPU reference's rule, summed over windows in
 * (oh, ow) order in float. Against a host scan, bit for bit: bf16 and fp16 take the packed
 * kernels' NaN path (the window's maximum NaN: its index found by the scan), f32 the scan.
 * `tied`: the other values from {-1, -0, +0, 0.5, 1} and fewer NaNs (1 in 40, not 1 in 9), so
 * most windows take the packed path and hold their maximum more than once (+0 and -0 equal): its
 * one-pass index must pick the first. */
static void check_max_pool_nan(stoke_dtype dt, int tied) {
  static const float levels[5] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f};
  const int64_t N = 2, C = 16, H = 9, W = 9, Ho = 5, Wo = 5, nx = N * C * H * W, ny = N * C * Ho * Wo;
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, STOKE_OP_MAX_POOL2D, "max_pool_nan", "kernel=3, stride=2, padding=1", &node);
  if (e) fail_msg("%s", e->msg);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 5150 + tied, (uint64_t)dt));
  stoke_shape xs = {4, {N, C, H, W}}, ys = {4, {N, C, Ho, Wo}};
  g_tensor x, y, dy, dx;
  g_alloc(&x, &xs, dt, STOKE_NHWC), g_alloc(&dx, &xs, dt, STOKE_NHWC);
  g_alloc(&y, &ys, dt, STOKE_NHWC), g_alloc(&dy, &ys, dt, STOKE_NHWC);
  size_t es = stoke_dtype_size(dt);
  char *hx = malloc((size_t)nx * es), *hdx = malloc((size_t)nx * es), *hy = malloc((size_t)ny * es),
       *hdy = malloc((size_t)ny * es), *tmp = malloc(es);
  float *want_dx = calloc((size_t)nx, sizeof *want_dx);
  for (int64_t i = 0; i < nx; i++)
    stoke_elem_set(hx, dt, i,
                   !stoke_rng_below(&r, tied ? 40 : 9) ? NAN
                   : tied                  ? levels[stoke_rng_below(&r, 5)]
                                           : 2 * stoke_rng_uniform(&r) - 1);
  for (int64_t i = 0; i < ny; i++) stoke_elem_set(hdy, dt, i, 2 * stoke_rng_uniform(&r) - 1);
  g_dev_put(x.dev.data, hx, (size_t)nx * es);
  g_dev_put(dy.dev.data, hdy, (size_t)ny * es);
  g_poison(&y), g_poison(&dx);
  stoke_tensor in[1] = {x.dev}, out[1] = {y.dev}, din[1] = {dx.dev}, dout[1] = {dy.dev};
  void *eng = NULL;
  const stoke_kernel_v1 *fk = g_gpu_kernel(STOKE_OP_MAX_POOL2D, STOKE_FWD, dt, STOKE_NHWC, &eng);
  const stoke_kernel_v1 *bk = g_gpu_kernel(STOKE_OP_MAX_POOL2D, STOKE_BWD, dt, STOKE_NHWC, &eng);
  stoke_kernel_args_v1 a = {.node = &node, .n_in = 1, .n_out = 1, .in = in, .out = out, .din = din, .dout = dout,
                            .training = 1, .engine = eng, .stream = g_dev->default_stream(g_dev_self)};
  g_run(fk, &a, 1);
  g_run(bk, &a, 1);
  g_dev_get(hy, y.dev.data, (size_t)ny * es);
  g_dev_get(hdx, dx.dev.data, (size_t)nx * es);
  int64_t bad_y = 0, nan_windows = 0, bad_dx = 0, tie_windows = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t oh = 0; oh < Ho; oh++)
      for (int64_t ow = 0; ow < Wo; ow++)
        for (int64_t c = 0; c < C; c++) {
          double best = -INFINITY;
          int64_t arg = -1, yi = ((n * Ho + oh) * Wo + ow) * C + c, equal = 0;
          for (int64_t h = 2 * oh - 1; h <= 2 * oh + 1; h++)
            for (int64_t w = 2 * ow - 1; w <= 2 * ow + 1; w++) {
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              int64_t xi = ((n * H + h) * W + w) * C + c;
              double v = stoke_elem_get(hx, dt, xi);
              if (arg < 0 || v > best || (isnan(v) && !isnan(best))) best = v, arg = xi, equal = 1;
              else if (v == best) equal++;
            }
          tie_windows += equal > 1;
          double got = stoke_elem_get(hy, dt, yi);
          nan_windows += isnan(best);
          bad_y += !(isnan(best) ? isnan(got) : got == best);
          want_dx[arg] += (float)stoke_elem_get(hdy, dt, yi);
        }
  for (int64_t i = 0; i < nx; i++) {
    stoke_elem_set(tmp, dt, 0, want_dx[i]);
    bad_dx += memcmp(tmp, hdx + i * (int64_t)es, es) != 0;
  }
  print_message("  max_pool2d   %-4s NHWC %lld windows (%lld with a NaN, %lld with a tied maximum): y %lld wrong, dx "
                "%lld of %lld not bitwise the host's\n", stoke_dtype_name(dt), (long long)ny, (long long)nan_windows,
                (long long)tie_windows, (long long)bad_y, (long long)bad_dx, (long long)nx);
  if (bad_y || bad_dx || !nan_windows || (tied && !tie_windows))
    fail_msg("max_pool2d %s with NaNs%s: %lld outputs and %lld input gradients differ from the first-NaN-wins scan "
             "(%lld windows held a NaN, %lld a tied maximum) (seed %llu)", stoke_dtype_name(dt),
             tied ? " and ties" : "", (long long)bad_y, (long long)bad_dx, (long long)nan_windows,
             (long long)tie_windows, (unsigned long long)g_seed);
  free(hx), free(hdx), free(hy), free(hdy), free(tmp), free(want_dx);
  g_free(&x), g_free(&y), g_free(&dy), g_free(&dx);
}

static void test_max_pool_nan(void **state) {
  for (int tied = 0; tied < 2; tied++) {
    check_max_pool_nan(STOKE_BF16, tied);
    check_max_pool_nan(STOKE_F16, tied);
    check_max_pool_nan(STOKE_F32, tied);
  }
}

/* ---- graph_memset: a step graph's small memsets as kernel nodes ---- */

typedef struct gm_op {
  size_t off, pitch, width, height;
  unsigned value, esize;
} gm_op;

/* What a memset writes, applied to the host's copy. */
static void gm_apply(uint8_t *buf, const gm_op *o) {
  for (size_t r = 0; r < o->height; r++)
    for (size_t c = 0; c < o->width; c++) {
      uint8_t *p = buf + o->off + r * o->pitch + c * o->esize;
      for (unsigned b = 0; b < o->esize; b++) p[b] = (uint8_t)(o->value >> (8 * b)); /* little-endian */
    }
}

static cudaGraphNode_t gm_only_dep(cudaGraphNode_t n) {
  size_t nd = 0;
  assert_int_equal(cudaGraphNodeGetDependencies(n, NULL, NULL, &nd), cudaSuccess);
  assert_int_equal(nd, 1);
  cudaGraphNode_t d = NULL;
  assert_int_equal(cudaGraphNodeGetDependencies(n, &d, NULL, &nd), cudaSuccess);
  return d;
}

static enum cudaGraphNodeType gm_type(cudaGraphNode_t n) {
  enum cudaGraphNodeType t;
  assert_int_equal(cudaGraphNodeGetType(n, &t), cudaSuccess);
  return t;
}

/* A chain of memsets that overlap (so their order decides the bytes), 1-,
 * 2- and 4-byte elements, a 2-D one with a pitch, one over the size limit,
 * then a copy of the region they wrote: after the rewrite the graph has
 * the limit's memset and three kernel nodes in the same chain, and its
 * replay writes exactly the bytes the memsets would have, over a poisoned
 * buffer. Then the same through a stream capture (cuDNN's path). */
/* The autotunes' operands (backends/cuda/tune_fill.cu): for f32, bf16 and
 * f16, a poisoned buffer of a random length (a byte or three past the last
 * whole element) gets exactly the values the CPU computes from the same
 * hash and seed (the value is exact in f32, and both sides round it to
 * nearest even, so every bit must match), the tail bytes zero, and nothing
 * past `bytes` written; another dtype gets 0x3c in every byte. The values
 * also must span [-1, 1): a fill that wrote one constant would fail. */
static void test_tune_fill(void **state) {
  (void)state;
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 0x7f11, 0));
  const stoke_dtype dts[4] = {STOKE_F32, STOKE_BF16, STOKE_F16, STOKE_I32};
  for (int k = 0; k < 4; k++) {
    const size_t es = stoke_dtype_size(dts[k]);
    const size_t bytes = es * (1000 + stoke_rng_below(&r, 300000)) + stoke_rng_below(&r, (uint32_t)es), pad = 64;
    const uint32_t seed = (uint32_t)stoke_rng_next(&r);
    uint8_t *got = malloc(bytes + pad), *dev = NULL;
    assert_non_null(got);
    assert_int_equal(cudaMalloc((void **)&dev, bytes + pad), cudaSuccess);
    assert_int_equal(cudaMemset(dev, 0xff, bytes + pad), cudaSuccess);
    assert_int_equal(stoke_cuda_tune_fill(dev, bytes, dts[k], seed, 0), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, dev, bytes + pad, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t n = bytes / es, bad = 0;
    float lo = 2.f, hi = -2.f;
    for (size_t i = 0; i < n && dts[k] != STOKE_I32; i++) {
      float v = stoke_tune_fill_value(i, seed);
      lo = v < lo ? v : lo, hi = v > hi ? v : hi;
      if (dts[k] == STOKE_F32) {
        float g;
        memcpy(&g, got + 4 * i, 4);
        bad += memcmp(&g, &v, 4) != 0;
      } else {
        uint16_t g, w = dts[k] == STOKE_BF16 ? stoke_f32_to_bf16(v) : stoke_f32_to_f16(v);
        memcpy(&g, got + 2 * i, 2);
        bad += g != w;
      }
    }
    for (size_t i = n * es; i < bytes; i++) bad += got[i] != (dts[k] == STOKE_I32 ? 0x3c : 0);
    if (dts[k] == STOKE_I32)
      for (size_t i = 0; i < n * es; i++) bad += got[i] != 0x3c;
    for (size_t i = bytes; i < bytes + pad; i++) bad += got[i] != 0xff;
    if (bad)
      fail_msg("tune_fill %s, %zu bytes, seed %u: %zu bytes or elements differ from the CPU's", stoke_dtype_name(dts[k]),
               bytes, seed, bad);
    if (dts[k] != STOKE_I32 && (lo > -0.99f || hi < 0.99f))
      fail_msg("tune_fill %s: values span only [%g, %g] over %zu elements", stoke_dtype_name(dts[k]), lo, hi, n);
    cudaFree(dev);
    free(got);
  }
}

static void test_graph_memsets_as_kernels(void **state) {
  enum { N = 8192 };
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, 0x6e5e, 0));
  gm_op big = {1 + stoke_rng_below(&r, 64), 0, 600 + stoke_rng_below(&r, 300), 1, (unsigned)stoke_rng_next(&r), 1};
  gm_op ops[3] = {
      /* 1-byte elements at an odd address, inside big's bytes */
      {(big.off + 1 + stoke_rng_below(&r, 50)) | 1, 0, 1 + stoke_rng_below(&r, 300), 1, (unsigned)stoke_rng_next(&r), 1},
      /* 4-byte elements over part of both */
      {4 * (1 + stoke_rng_below(&r, 30)), 0, 1 + stoke_rng_below(&r, 100), 1, (unsigned)stoke_rng_next(&r), 4},
      /* 2-D, 2-byte elements */
      {2 * (1 + stoke_rng_below(&r, 60)), 64 + 2 * stoke_rng_below(&r, 40), 1 + stoke_rng_below(&r, 16),
       2 + stoke_rng_below(&r, 7), (unsigned)stoke_rng_next(&r), 2},
  };
  const size_t limit = 512; /* big (600+ bytes) stays a memset */
  uint8_t *want = malloc(N), *got = malloc(N);
  assert_non_null(want);
  assert_non_null(got);
  for (size_t i = 0; i < N; i++) want[i] = (uint8_t)stoke_rng_next(&r); /* the poison */
  uint8_t *dev = NULL;
  assert_int_equal(cudaMalloc((void **)&dev, N), cudaSuccess);
  assert_int_equal(cudaMemcpy(dev, want, N, cudaMemcpyHostToDevice), cudaSuccess);
  const size_t copy_from = 0, copy_to = N / 2, copy_len = N / 2 - 128; /* the last 128 bytes: the lone memset's */

  cudaGraph_t g;
  assert_int_equal(cudaGraphCreate(&g, 0), cudaSuccess);
  cudaGraphNode_t prev = NULL, nodes[4];
  for (int i = 0; i < 4; i++) {
    gm_op *o = i == 0 ? &big : &ops[i - 1];
    if (o->esize < 4) o->value &= (1u << (8 * o->esize)) - 1; /* a value wider than its element is undefined */
    struct cudaMemsetParams m = {.dst = dev + o->off, .pitch = o->pitch, .value = o->value,
                                 .elementSize = o->esize, .width = o->width, .height = o->height};
    assert_int_equal(cudaGraphAddMemsetNode(&nodes[i], g, prev ? &prev : NULL, prev ? 1 : 0, &m), cudaSuccess);
    prev = nodes[i];
    gm_apply(want, o);
  }
  cudaGraphNode_t cp;
  assert_int_equal(cudaGraphAddMemcpyNode1D(&cp, g, &prev, 1, dev + copy_to, dev + copy_from, copy_len,
                                            cudaMemcpyDeviceToDevice),
                   cudaSuccess);
  memmove(want + copy_to, want + copy_from, copy_len);

  /* a lone memset (a root and a leaf), in bytes the copy neither reads nor writes */
  gm_op lone = {N - 64 + stoke_rng_below(&r, 32), 0, 1 + stoke_rng_below(&r, 32), 1, stoke_rng_below(&r, 256), 1};
  struct cudaMemsetParams lm = {.dst = dev + lone.off, .value = lone.value, .elementSize = 1, .width = lone.width,
                                .height = 1};
  cudaGraphNode_t lone_node;
  assert_int_equal(cudaGraphAddMemsetNode(&lone_node, g, NULL, 0, &lm), cudaSuccess);
  gm_apply(want, &lone); /* after the copy or not: the copy reads none of its bytes */

  int found = -1, done = -1;
  cudaError_t ce = stoke_cuda_graph_memsets_to_kernels(g, limit, &found, &done);
  if (ce != cudaSuccess) fail_msg("graph_memset: %s", cudaGetErrorString(ce));
  assert_int_equal(found, 5);
  assert_int_equal(done, 4);
  cudaGraphNode_t n3 = gm_only_dep(cp), n2 = gm_only_dep(n3), n1 = gm_only_dep(n2);
  assert_int_equal(gm_type(n3), cudaGraphNodeTypeKernel);
  assert_int_equal(gm_type(n2), cudaGraphNodeTypeKernel);
  assert_int_equal(gm_type(n1), cudaGraphNodeTypeKernel);
  assert_true(gm_only_dep(n1) == nodes[0]);
  assert_int_equal(gm_type(nodes[0]), cudaGraphNodeTypeMemset);
  size_t nn = 0;
  assert_int_equal(cudaGraphGetNodes(g, NULL, &nn), cudaSuccess);
  assert_int_equal(nn, 6);

  cudaGraphExec_t ge;
  assert_int_equal(cudaGraphInstantiateWithFlags(&ge, g, 0), cudaSuccess);
  assert_int_equal(cudaGraphLaunch(ge, 0), cudaSuccess);
  assert_int_equal(cudaMemcpy(got, dev, N, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < N; i++)
    if (got[i] != want[i])
      fail_msg("graph_memset: byte %zu is 0x%02x, the memsets write 0x%02x (seed %llu)", i, got[i], want[i],
               (unsigned long long)g_seed);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);

  /* captured from a stream, as cuDNN's cudaMemsetAsync is */
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (size_t i = 0; i < N; i++) want[i] = (uint8_t)stoke_rng_next(&r);
  assert_int_equal(cudaMemcpy(dev, want, N, cudaMemcpyHostToDevice), cudaSuccess);
  size_t off = stoke_rng_below(&r, N / 2), len = 1 + stoke_rng_below(&r, N / 2);
  int v = (int)stoke_rng_below(&r, 256);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  assert_int_equal(cudaMemsetAsync(dev + off, v, len, s), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
  memset(want + off, v, len);
  ce = stoke_cuda_graph_memsets_to_kernels(g, STOKE_GRAPH_MEMSET_MAX_BYTES, &found, &done);
  if (ce != cudaSuccess) fail_msg("graph_memset (captured): %s", cudaGetErrorString(ce));
  assert_int_equal(found, 1);
  assert_int_equal(done, 1);
  assert_int_equal(cudaGraphInstantiateWithFlags(&ge, g, 0), cudaSuccess);
  assert_int_equal(cudaGraphLaunch(ge, s), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaMemcpy(got, dev, N, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < N; i++)
    if (got[i] != want[i])
      fail_msg("graph_memset (captured): byte %zu is 0x%02x, the memset writes 0x%02x (seed %llu)", i, got[i],
               want[i], (unsigned long long)g_seed);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(dev);
  free(want);
  free(got);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_softmax_ce_determinism_and_bad_label),
      cmocka_unit_test(test_softmax_ce_masked_classes),
      cmocka_unit_test(test_softmax_ce_in_place),
      cmocka_unit_test(test_layer_norm_aliases),
      cmocka_unit_test(test_autocast),
      cmocka_unit_test(test_max_pool_nan),
      cmocka_unit_test(test_graph_memsets_as_kernels),
      cmocka_unit_test(test_tune_fill),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
