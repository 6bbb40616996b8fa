/* tests/gpu/cuda_norm_test.c: the cuda backend's batch_norm, max_pool2d,
 * avg_pool2d, sgd and adamw kernels against the CPU reference in f64
 * (gpu_harness.h), in f32, bf16 and fp16, NCHW and NHWC. Runs on a GPU
 * machine only. */
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

/* ---------------------------------------------------------------- helpers */

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  stoke_err *e = g_dev->alloc(g_dev_self, bytes ? bytes : 16, &p);
  if (e) fail_msg("device alloc: %s", e->msg);
  return p;
}

static void dev_put(void *dst, const void *src, size_t bytes) {
  stoke_err *e = g_dev->copy(g_dev_self, dst, src, bytes, STOKE_COPY_H2D, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("upload: %s", e->msg);
}

static void dev_get(void *dst, const void *src, size_t bytes) {
  stoke_err *e = g_dev->copy(g_dev_self, dst, src, bytes, STOKE_COPY_D2H, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("download: %s", e->msg);
}

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
    for (int i = 0; i < 2; i++) dev_get(before[i], in[3 + i].dev.data, (size_t)nc * sizeof(float));
    g_run(rk, &ra, 0);
    g_run(gk, &ga, 1);
    for (int i = 0; i < 2; i++) dev_get(after[i], in[3 + i].dev.data, (size_t)nc * sizeof(float));
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

/* ------------------------------------------------------------- optimizers */

/* g_check does not fit (three inputs updated in place, no outputs): random
 * params, grads and state; two steps (step 1 and 2, fresh grads each) of
 * the CPU f64 kernel and of the GPU kernel. f32 params: params and state
 * compared at rel-norm 1e-6. bf16/fp16 params: the f32 state starts with a
 * master whose rounding is the working copy; the master and the optimizer
 * state compared at 1e-6, the working copy equal to the rounding of the
 * GPU's master and within G_TOL_LOW of the CPU's params. Nothing the
 * kernel reads is poisoned; every element must be finite afterwards, and
 * the gradients unchanged. */
#define OPT_TOL 1e-6

/* ||got - want|| / ||want|| over n f32 values against doubles; fails on a
 * non-finite element or past tol. */
static void opt_compare(const char *what, const float *got, const double *want, int64_t n,
                        double tol, const char *label) {
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) fail_msg("%s %s: element %lld is %g", label, what, (long long)i, got[i]);
    double d = (double)got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
    if (fabs(d) > mx) mx = fabs(d);
  }
  double err = den > 0 ? sqrt(num / den) : sqrt(num);
  print_message("  %-28s %-10s rel err %.3g (max abs %.3g)\n", label, what, err, mx);
  if (!(err <= tol))
    fail_msg("%s %s: relative error %.3g > %.3g (seed %llu)", label, what, err, tol,
             (unsigned long long)g_seed);
}

static double round_to(stoke_dtype dt, double v) {
  double h[1];
  g_set(h, dt, 0, v);
  return g_get(h, dt, 0);
}

/* live: the GPU kernel gets a wrong lr and step by value and the right
 * ones in device memory (opt->live, as a replayed CUDA graph does); it
 * must follow the device memory. */
static void opt_check_case(const char *op, stoke_dtype dt, stoke_opt_args_v1 o, int64_t n, int live,
                           const char *label) {
  int adamw = !strcmp(op, STOKE_OP_ADAMW);
  int master = dt != STOKE_F32;
  int64_t per = adamw ? 2 : 1;                          /* what the planner sizes */
  int64_t ns = (per + master) * n, off = master ? n : 0;  /* device state, its opt part */
  size_t es = stoke_dtype_size(dt);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)n * 7 + (uint64_t)dt, (uint64_t)adamw));

  double *rp = calloc((size_t)n, sizeof *rp), *rg = calloc((size_t)n, sizeof *rg);
  double *rs = calloc((size_t)(per * n), sizeof *rs);
  void *hw = calloc((size_t)n, es), *hg = calloc((size_t)n, es), *hg2 = calloc((size_t)n, es);
  float *hs = calloc((size_t)ns, sizeof *hs);
  for (int64_t i = 0; i < n; i++) {
    double v = -1 + 2 * stoke_rng_uniform(&r);
    if (master) {
      float m = (float)v;     /* the f32 master ... */
      hs[i] = m;
      g_set(hw, dt, i, m);    /* ... whose rounding is the working copy */
      rp[i] = m;
    } else {
      g_set(hw, dt, i, v);
      rp[i] = g_get(hw, dt, i);
    }
  }
  for (int64_t i = 0; i < per * n; i++) {
    /* sgd: momentum buffer; adamw: m then v (v >= 0) */
    double v = adamw && i >= n ? 0.01 * stoke_rng_uniform(&r) : -0.1 + 0.2 * stoke_rng_uniform(&r);
    hs[off + i] = (float)v;
    rs[i] = (double)(float)v;
  }
  void *dw = dev_alloc((size_t)n * es), *dg = dev_alloc((size_t)n * es);
  float *ds = dev_alloc((size_t)ns * sizeof(float));
  dev_put(dw, hw, (size_t)n * es);
  dev_put(ds, hs, (size_t)ns * sizeof(float));

  stoke_shape np = {1, {n}}, rsh = {1, {per * n}}, dsh = {1, {ns}};
  stoke_tensor rt[3] = {{rp, np, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU},
                        {rg, np, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU},
                        {rs, rsh, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}};
  stoke_tensor gt[3] = {{dw, np, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {dg, np, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {ds, dsh, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_node_v1 node = {.op = "optimizer", .name = "optimizer"};
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", op, STOKE_OPT, STOKE_F64, STOKE_LAYOUT_ANY);
  if (!rk) fail_msg("no CPU %s kernel", op);
  void *eself = NULL;
  const stoke_kernel_v1 *gk = g_gpu_kernel(op, STOKE_OPT, dt, STOKE_LAYOUT_ANY, &eself);
  double *dlive = live ? dev_alloc(2 * sizeof(double)) : NULL;
  for (int step = 1; step <= 2; step++) {
    for (int64_t i = 0; i < n; i++) {
      g_set(hg, dt, i, -1 + 2 * stoke_rng_uniform(&r));
      rg[i] = g_get(hg, dt, i);
    }
    dev_put(dg, hg, (size_t)n * es);
    o.step = step;
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 3, .in = rt, .opt = &o};
    stoke_kernel_args_v1 ga = ra;
    stoke_opt_args_v1 og = o;
    if (live) {
      double lv[2] = {o.lr, (double)step};
      dev_put(dlive, lv, sizeof lv);
      og.lr = 3 * o.lr + 1;
      og.step = 40 + step;
      og.live = dlive;
      ga.opt = &og;
    }
    ga.in = gt;
    ga.engine = eself;
    ga.stream = g_dev->default_stream(g_dev_self);
    g_run(rk, &ra, 0);
    g_run(gk, &ga, 1);
  }
  dev_get(hw, dw, (size_t)n * es);
  dev_get(hs, ds, (size_t)ns * sizeof(float));
  dev_get(hg2, dg, (size_t)n * es);
  if (memcmp(hg, hg2, (size_t)n * es)) fail_msg("%s: the kernel changed the gradients", label);

  if (master) {
    opt_compare("master", hs, rp, n, OPT_TOL, label);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
      double w = g_get(hw, dt, i);
      if (!isfinite(w)) fail_msg("%s: working copy element %lld is %g", label, (long long)i, w);
      if (w != round_to(dt, hs[i]))
        fail_msg("%s: working copy %lld is %.9g, the rounded master %.9g", label, (long long)i, w,
                 round_to(dt, hs[i]));
      num += (w - rp[i]) * (w - rp[i]);
      den += rp[i] * rp[i];
    }
    double err = sqrt(num / den);
    print_message("  %-28s %-10s rel err %.3g\n", label, "working", err);
    if (!(err <= G_TOL_LOW)) fail_msg("%s working copy: relative error %.3g > %.3g", label, err, G_TOL_LOW);
  } else {
    float *pf = hw;
    opt_compare("params", pf, rp, n, OPT_TOL, label);
  }
  if (adamw) {
    opt_compare("m", hs + off, rs, n, OPT_TOL, label);
    opt_compare("v", hs + off + n, rs + n, n, OPT_TOL, label);
  } else if (o.momentum != 0) {
    opt_compare("buf", hs + off, rs, n, OPT_TOL, label);
  } else {
    /* plain SGD leaves the state alone */
    for (int64_t i = 0; i < n; i++)
      if (hs[off + i] != (float)rs[i]) fail_msg("%s: plain sgd changed the state at %lld", label, (long long)i);
  }

  /* argument checks, as the CPU's: grad_scale > 0; adamw step >= 1 */
  stoke_opt_args_v1 bad = o;
  bad.grad_scale = 0;
  stoke_kernel_args_v1 ba = {.node = &node, .n_in = 3, .in = gt, .opt = &bad, .engine = eself,
                             .stream = g_dev->default_stream(g_dev_self)};
  stoke_err *e = gk->run(&ba, NULL);
  if (!e) fail_msg("%s: grad_scale 0 accepted", label);
  stoke_err_free(e);
  if (adamw) {
    bad = o;
    bad.step = 0;
    e = gk->run(&ba, NULL);
    if (!e) fail_msg("%s: step 0 accepted", label);
    stoke_err_free(e);
  }

  g_dev->free(g_dev_self, dw);
  g_dev->free(g_dev_self, dg);
  g_dev->free(g_dev_self, ds);
  if (dlive) g_dev->free(g_dev_self, dlive);
  free(rp), free(rg), free(rs), free(hw), free(hg), free(hg2), free(hs);
}

static const stoke_dtype opt_dtypes[] = {STOKE_F32, STOKE_BF16, STOKE_F16};
static const int64_t opt_sizes[] = {4096, 4099}; /* vectorized; scalar or tail */

static void test_sgd(void **state) {
  static const stoke_opt_args_v1 hp[] = {
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .grad_scale = 0.5},
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = 1, .grad_scale = 0.5},
      {.lr = 0.05, .momentum = 0, .weight_decay = 0, .grad_scale = 1},
  };
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 2; s++)
      for (size_t h = 0; h < sizeof hp / sizeof *hp; h++) {
        char label[64];
        snprintf(label, sizeof label, "sgd %s n=%lld %s", stoke_dtype_name(opt_dtypes[d]),
                 (long long)opt_sizes[s],
                 hp[h].momentum == 0 ? "plain" : hp[h].nesterov ? "nesterov" : "momentum");
        opt_check_case(STOKE_OP_SGD, opt_dtypes[d], hp[h], opt_sizes[s], 0, label);
        if (s == 0 && h == 0) {
          strncat(label, " live", sizeof label - strlen(label) - 1);
          opt_check_case(STOKE_OP_SGD, opt_dtypes[d], hp[h], opt_sizes[s], 1, label);
        }
      }
}

static void test_adamw(void **state) {
  static const stoke_opt_args_v1 hp = {.lr = 1e-2, .weight_decay = 1e-2, .beta1 = 0.9, .beta2 = 0.999,
                                       .eps = 1e-8, .grad_scale = 0.25};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 2; s++) {
      char label[64];
      snprintf(label, sizeof label, "adamw %s n=%lld", stoke_dtype_name(opt_dtypes[d]),
               (long long)opt_sizes[s]);
      opt_check_case(STOKE_OP_ADAMW, opt_dtypes[d], hp, opt_sizes[s], 0, label);
      strncat(label, " live", sizeof label - strlen(label) - 1);
      opt_check_case(STOKE_OP_ADAMW, opt_dtypes[d], hp, opt_sizes[s], 1, label);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_norm),
      cmocka_unit_test(test_batch_norm_running_stats),
      cmocka_unit_test(test_max_pool2d),
      cmocka_unit_test(test_avg_pool2d),
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_adamw),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
