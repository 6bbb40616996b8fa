/* tests/gpu/cuda_optim_test.c: the cuda backend's update kernels against
 * the CPU reference in f64 (backends/cpu/optim.c), in f32, bf16 and fp16:
 * sgd and adamw with every hook (CUDA graphs' live lr and step, the loss
 * scaler's skip with AdamW's bias corrections counting applied steps only,
 * the clipping factor, weight decay by parameter group), grad_norm (the
 * global norm and its factor, deterministic), and the loss scaler's
 * amp_check and amp_update. Runs on a GPU machine only. */
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

/* g_check does not fit (three inputs updated in place, no outputs): random
 * params, grads and state; three steps (fresh grads each) of the CPU f64
 * kernel and of the GPU kernel. f32 params: params and state compared at
 * rel-norm 1e-6. bf16/fp16 params: the f32 state starts with a master whose
 * rounding is the working copy; the master and the optimizer state
 * compared at 1e-6, the working copy equal to the rounding of the GPU's
 * master and within G_TOL_LOW of the CPU's params. Nothing the kernel
 * reads is poisoned; every element must be finite afterwards, and the
 * gradients unchanged. */
#define OPT_TOL 1e-6

/* The hooks a case turns on (stoke_opt_args_v1): */
enum {
  H_LIVE = 1,   /* lr and step from device memory; wrong ones by value */
  H_AMP = 2,    /* loss scale 1024 (gradients scaled), step 2 skipped: step 3 is t = 2 */
  H_CLIP = 4,   /* a clipping factor of 0.37 */
  H_GROUPS = 8, /* weight decay on the N_RANGES ranges of hooks_on only */
};

/* ||got - want|| / ||want|| over n f32 values against doubles; fails on a
 * non-finite element or past tol. */
static void opt_compare(const char *what, const float *got, const double *want, int64_t n, double tol,
                        const char *label) {
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) fail_msg("%s %s: element %lld is %g", label, what, (long long)i, got[i]);
    double d = (double)got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
    if (fabs(d) > mx) mx = fabs(d);
  }
  double err = den > 0 ? sqrt(num / den) : sqrt(num);
  print_message("  %-36s %-10s rel err %.3g (max abs %.3g)\n", label, what, err, mx);
  if (!(err <= tol))
    fail_msg("%s %s: relative error %.3g > %.3g (seed %llu)", label, what, err, tol, (unsigned long long)g_seed);
}

static double round_to(stoke_dtype dt, double v) {
  double h[1];
  g_set(h, dt, 0, v);
  return g_get(h, dt, 0);
}

/* Weight-decay ranges: enough of them, of mixed lengths, that the GPU's
 * binary search over them takes every turn (cuda's optim.cu, decays()). */
#define N_RANGES 9

/* The device-side words of the hooks, and their host twins for the CPU. */
typedef struct hook_words {
  float amp[4], clip[2];
  int64_t ranges[2 * N_RANGES];
  float *d_amp, *d_clip;
  int64_t *d_ranges;
  double *d_live;
} hook_words;

static void hooks_on(hook_words *w, unsigned hooks, stoke_opt_args_v1 *cpu, stoke_opt_args_v1 *gpu) {
  memset(w, 0, sizeof *w);
  w->amp[0] = 1024;
  w->clip[0] = 3, w->clip[1] = 0.37f;
  int64_t r[2 * N_RANGES] = {0,    64,   128,  132,  256,  1024, 1100, 1104, 2048,
                             2560, 2600, 2700, 3000, 3004, 3500, 4000, 4092, 4096};
  memcpy(w->ranges, r, sizeof r);
  if (hooks & H_AMP) {
    w->d_amp = g_dev_alloc(sizeof w->amp);
    cpu->amp = w->amp, gpu->amp = w->d_amp;
  }
  if (hooks & H_CLIP) {
    w->d_clip = g_dev_alloc(sizeof w->clip);
    g_dev_put(w->d_clip, w->clip, sizeof w->clip);
    cpu->clip = w->clip, gpu->clip = w->d_clip;
  }
  if (hooks & H_GROUPS) {
    w->d_ranges = g_dev_alloc(sizeof w->ranges);
    g_dev_put(w->d_ranges, w->ranges, sizeof w->ranges);
    cpu->decay_ranges = w->ranges, gpu->decay_ranges = w->d_ranges;
    cpu->n_decay_ranges = gpu->n_decay_ranges = N_RANGES;
  }
  if (hooks & H_LIVE) w->d_live = g_dev_alloc(2 * sizeof(double));
}

/* Before step `step`: the scaler's words (step 2 overflows, step 3 knows
 * one skip) and the live [lr, step] with wrong values by argument. */
static void hooks_step(hook_words *w, unsigned hooks, int step, stoke_opt_args_v1 *gpu) {
  if (hooks & H_AMP) {
    w->amp[2] = step == 2 ? 1.0f : 0.0f;
    w->amp[3] = step == 3 ? 1.0f : 0.0f;
    g_dev_put(w->d_amp, w->amp, sizeof w->amp);
  }
  if (hooks & H_LIVE) {
    double lv[2] = {gpu->lr, (double)step};
    g_dev_put(w->d_live, lv, sizeof lv);
    gpu->lr = 3 * gpu->lr + 1;
    gpu->step = 40 + step;
    gpu->live = w->d_live;
  }
}

static void hooks_off(hook_words *w) {
  void *p[] = {w->d_amp, w->d_clip, w->d_ranges, w->d_live};
  for (int i = 0; i < 4; i++)
    if (p[i]) g_dev->free(g_dev_self, p[i]);
}

/* The case's buffers: host f64 reference and device copies. */
typedef struct opt_bufs {
  int64_t n, per, ns, off; /* elements; state per param; device state length; its optimizer part */
  int master;
  double *rp, *rg, *rs;
  void *hw, *hg, *hg2;
  float *hs;
  void *dw, *dg;
  float *ds;
} opt_bufs;

/* Random params (bf16/fp16: an f32 master whose rounding is the working
 * copy) and state (adamw's v >= 0). */
static void opt_fill(opt_bufs *b, stoke_dtype dt, int adamw, stoke_rng *r) {
  for (int64_t i = 0; i < b->n; i++) {
    double v = -1 + 2 * stoke_rng_uniform(r);
    if (b->master) {
      float m = (float)v;
      b->hs[i] = m;
      g_set(b->hw, dt, i, m);
      b->rp[i] = m;
    } else {
      g_set(b->hw, dt, i, v);
      b->rp[i] = g_get(b->hw, dt, i);
    }
  }
  for (int64_t i = 0; i < b->per * b->n; i++) {
    double v = adamw && i >= b->n ? 0.01 * stoke_rng_uniform(r) : -0.1 + 0.2 * stoke_rng_uniform(r);
    b->hs[b->off + i] = (float)v;
    b->rs[i] = (double)(float)v;
  }
}

static void opt_alloc(opt_bufs *b, stoke_dtype dt, int adamw, int64_t n) {
  size_t es = stoke_dtype_size(dt);
  b->n = n, b->per = adamw ? 2 : 1, b->master = dt != STOKE_F32;
  b->ns = (b->per + b->master) * n, b->off = b->master ? n : 0;
  b->rp = calloc((size_t)n, sizeof(double)), b->rg = calloc((size_t)n, sizeof(double));
  b->rs = calloc((size_t)(b->per * n), sizeof(double));
  b->hw = calloc((size_t)n, es), b->hg = calloc((size_t)n, es), b->hg2 = calloc((size_t)n, es);
  b->hs = calloc((size_t)b->ns, sizeof(float));
  b->dw = g_dev_alloc((size_t)n * es), b->dg = g_dev_alloc((size_t)n * es);
  b->ds = g_dev_alloc((size_t)b->ns * sizeof(float));
}

static void opt_free(opt_bufs *b) {
  g_dev->free(g_dev_self, b->dw);
  g_dev->free(g_dev_self, b->dg);
  g_dev->free(g_dev_self, b->ds);
  free(b->rp), free(b->rg), free(b->rs), free(b->hw), free(b->hg), free(b->hg2), free(b->hs);
}

/* The results: master and working copy, or f32 params; the state. */
static void opt_results(const opt_bufs *b, stoke_dtype dt, int adamw, double momentum, const char *label) {
  if (b->master) {
    opt_compare("master", b->hs, b->rp, b->n, OPT_TOL, label);
    double num = 0, den = 0;
    for (int64_t i = 0; i < b->n; i++) {
      double w = g_get(b->hw, dt, i);
      if (!isfinite(w)) fail_msg("%s: working copy element %lld is %g", label, (long long)i, w);
      if (w != round_to(dt, b->hs[i]))
        fail_msg("%s: working copy %lld is %.9g, the rounded master %.9g", label, (long long)i, w,
                 round_to(dt, b->hs[i]));
      num += (w - b->rp[i]) * (w - b->rp[i]);
      den += b->rp[i] * b->rp[i];
    }
    double err = sqrt(num / den);
    print_message("  %-36s %-10s rel err %.3g\n", label, "working", err);
    if (!(err <= G_TOL_LOW)) fail_msg("%s working copy: relative error %.3g > %.3g", label, err, G_TOL_LOW);
  } else {
    opt_compare("params", b->hw, b->rp, b->n, OPT_TOL, label);
  }
  if (adamw) {
    opt_compare("m", b->hs + b->off, b->rs, b->n, OPT_TOL, label);
    opt_compare("v", b->hs + b->off + b->n, b->rs + b->n, b->n, OPT_TOL, label);
  } else if (momentum != 0) {
    opt_compare("buf", b->hs + b->off, b->rs, b->n, OPT_TOL, label);
  } else {
    for (int64_t i = 0; i < b->n; i++) /* plain SGD leaves the state alone */
      if (b->hs[b->off + i] != (float)b->rs[i])
        fail_msg("%s: plain sgd changed the state at %lld", label, (long long)i);
  }
}

/* The argument checks, as the CPU's: grad_scale > 0; adamw step >= 1. */
static void opt_refusals(const stoke_kernel_v1 *gk, stoke_tensor *gt, void *eself, stoke_opt_args_v1 o,
                         int adamw, const char *label) {
  stoke_node_v1 node = {.op = "optimizer", .name = "optimizer"};
  stoke_opt_args_v1 bad = o;
  bad.grad_scale = 0;
  stoke_kernel_args_v1 ba = {.node = &node, .n_in = 3, .in = gt, .opt = &bad, .engine = eself,
                             .stream = g_dev->default_stream(g_dev_self)};
  stoke_err *e = gk->run(&ba, NULL);
  if (!e) fail_msg("%s: grad_scale 0 accepted", label);
  stoke_err_free(e);
  if (!adamw) return;
  bad = o;
  bad.step = 0;
  e = gk->run(&ba, NULL);
  if (!e) fail_msg("%s: step 0 accepted", label);
  stoke_err_free(e);
}

static void opt_check_case(const char *op, stoke_dtype dt, stoke_opt_args_v1 o, int64_t n, unsigned hooks,
                           const char *label) {
  int adamw = !strcmp(op, STOKE_OP_ADAMW);
  size_t es = stoke_dtype_size(dt);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)n * 7 + (uint64_t)dt, (uint64_t)adamw + 2 * hooks));
  opt_bufs b;
  opt_alloc(&b, dt, adamw, n);
  opt_fill(&b, dt, adamw, &r);
  g_dev_put(b.dw, b.hw, (size_t)n * es);
  g_dev_put(b.ds, b.hs, (size_t)b.ns * sizeof(float));
  stoke_shape np = {1, {n}}, rsh = {1, {b.per * n}}, dsh = {1, {b.ns}};
  stoke_tensor rt[3] = {{b.rp, np, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU},
                        {b.rg, np, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU},
                        {b.rs, rsh, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}};
  stoke_tensor gt[3] = {{b.dw, np, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {b.dg, np, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU},
                        {b.ds, dsh, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_node_v1 node = {.op = "optimizer", .name = "optimizer"};
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", op, STOKE_OPT, STOKE_F64, STOKE_LAYOUT_ANY);
  if (!rk) fail_msg("no CPU %s kernel", op);
  void *eself = NULL;
  const stoke_kernel_v1 *gk = g_gpu_kernel(op, STOKE_OPT, dt, STOKE_LAYOUT_ANY, &eself);
  stoke_opt_args_v1 oc = o, og = o;
  hook_words w;
  hooks_on(&w, hooks, &oc, &og);
  double gscale = hooks & H_AMP ? w.amp[0] : 1;
  for (int step = 1; step <= 3; step++) {
    for (int64_t i = 0; i < n; i++) {
      g_set(b.hg, dt, i, gscale * (-1 + 2 * stoke_rng_uniform(&r)));
      b.rg[i] = g_get(b.hg, dt, i);
    }
    g_dev_put(b.dg, b.hg, (size_t)n * es);
    oc.step = og.step = step, og.lr = o.lr;
    hooks_step(&w, hooks, step, &og);
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 3, .in = rt, .opt = &oc};
    stoke_kernel_args_v1 ga = {.node = &node, .n_in = 3, .in = gt, .opt = &og, .engine = eself,
                               .stream = g_dev->default_stream(g_dev_self)};
    g_run(rk, &ra, 0);
    g_run(gk, &ga, 1);
  }
  g_dev_get(b.hw, b.dw, (size_t)n * es);
  g_dev_get(b.hs, b.ds, (size_t)b.ns * sizeof(float));
  g_dev_get(b.hg2, b.dg, (size_t)n * es);
  if (memcmp(b.hg, b.hg2, (size_t)n * es)) fail_msg("%s: the kernel changed the gradients", label);
  opt_results(&b, dt, adamw, o.momentum, label);
  opt_refusals(gk, gt, eself, o, adamw, label);
  hooks_off(&w);
  opt_free(&b);
}

static const stoke_dtype opt_dtypes[] = {STOKE_F32, STOKE_BF16, STOKE_F16};
static const int64_t opt_sizes[] = {4096, 4099}; /* vectorized; scalar or tail */

/* "sgd bf16 n=4099 nesterov +amp+clip" */
static void case_label(char *out, size_t cap, const char *what, stoke_dtype dt, int64_t n, unsigned hooks) {
  snprintf(out, cap, "%s %s n=%lld%s%s%s%s", what, stoke_dtype_name(dt), (long long)n, hooks & H_LIVE ? " +live" : "",
           hooks & H_AMP ? " +amp" : "", hooks & H_CLIP ? " +clip" : "", hooks & H_GROUPS ? " +groups" : "");
}

static void test_sgd(void **state) {
  static const stoke_opt_args_v1 hp[] = {
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .grad_scale = 0.5},
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = 1, .grad_scale = 0.5},
      {.lr = 0.05, .momentum = 0, .weight_decay = 0, .grad_scale = 1},
  };
  static const char *names[] = {"sgd momentum", "sgd nesterov", "sgd plain"};
  static const unsigned hook_sets[] = {0, H_LIVE, H_AMP | H_CLIP | H_GROUPS, H_LIVE | H_AMP | H_GROUPS};
  char label[96];
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 2; s++)
      for (size_t h = 0; h < sizeof hp / sizeof *hp; h++)
        for (int k = 0; k < 4; k++) {
          if (h > 0 && k > 0 && k != 2) continue; /* every hook set once per dtype and size is enough */
          case_label(label, sizeof label, names[h], opt_dtypes[d], opt_sizes[s], hook_sets[k]);
          opt_check_case(STOKE_OP_SGD, opt_dtypes[d], hp[h], opt_sizes[s], hook_sets[k], label);
        }
}

/* AdamW; +amp is the bias-correction fix: step 3 after a skipped step 2
 * is the second applied update (an earlier kernel used t = 3). */
static void test_adamw(void **state) {
  static const stoke_opt_args_v1 hp = {.lr = 1e-2, .weight_decay = 1e-2, .beta1 = 0.9, .beta2 = 0.95,
                                       .eps = 1e-8, .grad_scale = 0.25};
  static const unsigned hook_sets[] = {0, H_LIVE, H_AMP, H_AMP | H_LIVE, H_CLIP | H_GROUPS,
                                       H_LIVE | H_AMP | H_CLIP | H_GROUPS};
  char label[96];
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 2; s++)
      for (size_t k = 0; k < sizeof hook_sets / sizeof *hook_sets; k++) {
        case_label(label, sizeof label, "adamw", opt_dtypes[d], opt_sizes[s], hook_sets[k]);
        opt_check_case(STOKE_OP_ADAMW, opt_dtypes[d], hp, opt_sizes[s], hook_sets[k], label);
      }
}

/* ------------------------------------------------------------ grad_norm */

/* grad_norm of fresh random gradients (the GPU's in dt, the CPU's in f64
 * of the same rounded values) under grad_scale 0.5 and a loss scale of 8,
 * with a max_norm that clips and one that does not: norm and factor within
 * 1e-6; the GPU result bitwise equal on a second run (a fixed summation
 * order); a skipped step writes [inf, 1]. Sizes: below one vector, a tail,
 * more than the 1024 partial blocks cover in one pass. */
static void norm_case(stoke_dtype dt, int64_t n) {
  size_t es = stoke_dtype_size(dt);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)n, (uint64_t)dt + 99));
  double *rg = malloc(sizeof(double) * (size_t)n);
  void *hg = malloc(es * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    g_set(hg, dt, i, -3 + 6 * stoke_rng_uniform(&r));
    rg[i] = g_get(hg, dt, i);
  }
  void *dg = g_dev_alloc(es * (size_t)n);
  float *dout = g_dev_alloc(2 * sizeof(float)), *damp = g_dev_alloc(4 * sizeof(float));
  g_dev_put(dg, hg, es * (size_t)n);
  float amp[4] = {8, 0, 0, 0}, rout[2], gout[2], again[2];
  g_dev_put(damp, amp, sizeof amp);
  stoke_shape sh = {1, {n}}, two = {1, {2}};
  stoke_tensor rt[2] = {{rg, sh, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}, {rout, two, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}};
  stoke_tensor gt[2] = {{dg, sh, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, {dout, two, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_node_v1 node = {.op = STOKE_OP_GRAD_NORM, .name = "grad_clip"};
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_GRAD_NORM, STOKE_OPT, STOKE_F64, STOKE_LAYOUT_ANY);
  void *eself = NULL;
  const stoke_kernel_v1 *gk = g_gpu_kernel(STOKE_OP_GRAD_NORM, STOKE_OPT, dt, STOKE_LAYOUT_ANY, &eself);
  double clip = 1e9; /* k = 1 clips at half the norm k = 0 measured: a fixed max_norm of 1 did not clip a small
                       * random gradient (norm 0.19 with seed 2557831660) */
  for (int k = 0; k < 3; k++) {
    stoke_opt_args_v1 oc = {.grad_scale = 0.5, .amp = amp, .max_norm = k == 0 ? 1e9 : clip};
    stoke_opt_args_v1 og = oc;
    og.amp = damp;
    if (k == 2) {
      amp[2] = 1;
      g_dev_put(damp, amp, sizeof amp);
    }
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .in = rt, .opt = &oc};
    stoke_kernel_args_v1 ga = {.node = &node, .n_in = 2, .in = gt, .opt = &og, .engine = eself,
                               .stream = g_dev->default_stream(g_dev_self)};
    g_run(rk, &ra, 0);
    g_run(gk, &ga, 1);
    g_dev_get(gout, dout, sizeof gout);
    g_run(gk, &ga, 1);
    g_dev_get(again, dout, sizeof again);
    print_message("  grad_norm %s n=%lld max_norm %g%s: cpu [%.9g, %.9g], gpu [%.9g, %.9g]\n", stoke_dtype_name(dt),
                  (long long)n, oc.max_norm, k == 2 ? " skipped" : "", rout[0], rout[1], gout[0], gout[1]);
    if (memcmp(gout, again, sizeof gout)) fail_msg("grad_norm %s n=%lld: two runs differ", stoke_dtype_name(dt), (long long)n);
    if (k == 2) {
      if (!isinf(gout[0]) || gout[1] != 1) fail_msg("grad_norm: a skipped step wrote [%g, %g]", gout[0], gout[1]);
      continue;
    }
    for (int i = 0; i < 2; i++)
      if (!(fabs(gout[i] - rout[i]) <= 1e-6 * fabs(rout[i])))
        fail_msg("grad_norm %s n=%lld: %s %.9g, the CPU's %.9g (seed %llu)", stoke_dtype_name(dt), (long long)n,
                 i ? "factor" : "norm", gout[i], rout[i], (unsigned long long)g_seed);
    if (k == 0) clip = 0.5 * rout[0];
    if (k == 1 && !(gout[1] < 1)) fail_msg("grad_norm: max_norm %g should clip a norm of %g", clip, gout[0]);
  }
  g_dev->free(g_dev_self, dg);
  g_dev->free(g_dev_self, dout);
  g_dev->free(g_dev_self, damp);
  free(rg);
  free(hg);
}

static void test_grad_norm(void **state) {
  static const int64_t sizes[] = {3, 4099, (1 << 22) + 5};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 3; s++) norm_case(opt_dtypes[d], sizes[s]);
}

/* ------------------------------------------------------------ the scaler */

/* One amp_update on the CPU (state rs, seed *rseed) and on the GPU (dst,
 * dseed), the GPU's state and seed read back into gs and *gseed. */
static void amp_update_both(const stoke_kernel_v1 *gu, const stoke_kernel_v1 *ru, void *eself, stoke_opt_args_v1 *o,
                            float *rs, float *rseed, float *dst, float *dseed, float *gs, float *gseed) {
  stoke_shape four = {1, {4}}, one = {1, {1}};
  stoke_tensor rt[2] = {{rs, four, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}, {rseed, one, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}};
  stoke_tensor gt[2] = {{dst, four, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, {dseed, one, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
  stoke_node_v1 node = {.op = "loss_scaler", .name = "loss_scaler"};
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .in = rt, .opt = o};
  stoke_kernel_args_v1 ga = {.node = &node, .n_in = 2, .in = gt, .opt = o, .engine = eself,
                             .stream = g_dev->default_stream(g_dev_self)};
  g_run(ru, &ra, 0);
  g_run(gu, &ga, 1);
  g_dev_get(gs, dst, 4 * sizeof(float));
  g_dev_get(gseed, dseed, sizeof *gseed);
}

/* amp_check: found_inf from a gradient buffer with nothing, an inf, a NaN
 * (at the tail); amp_update: a sequence of overflows and clean steps,
 * dynamic (growth 2) and static, against the CPU's state and seed. */
static void test_loss_scaler(void **state) {
  enum { NG = 4099 };
  void *eself = NULL;
  for (int d = 0; d < 3; d++) {
    stoke_dtype dt = opt_dtypes[d];
    size_t es = stoke_dtype_size(dt);
    void *hg = calloc(NG, es), *dg = g_dev_alloc(NG * es);
    double *rg = calloc(NG, sizeof(double));
    float *dst = g_dev_alloc(4 * sizeof(float));
    const stoke_kernel_v1 *gk = g_gpu_kernel(STOKE_OP_AMP_CHECK, STOKE_OPT, dt, STOKE_LAYOUT_ANY, &eself);
    const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", STOKE_OP_AMP_CHECK, STOKE_OPT, STOKE_F64, STOKE_LAYOUT_ANY);
    for (int k = 0; k < 3; k++) {
      for (int64_t i = 0; i < NG; i++) g_set(hg, dt, i, 0.001 * (double)(i % 17)), rg[i] = g_get(hg, dt, i);
      if (k) g_set(hg, dt, NG - 1, k == 1 ? INFINITY : NAN), rg[NG - 1] = k == 1 ? INFINITY : NAN;
      g_dev_put(dg, hg, NG * es);
      float rs[4] = {1024, 0, 0, 0}, gs[4];
      g_dev_put(dst, rs, sizeof rs);
      stoke_shape sh = {1, {NG}}, four = {1, {4}};
      stoke_tensor rt[2] = {{rg, sh, STOKE_F64, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}, {rs, four, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_CPU}};
      stoke_tensor gt[2] = {{dg, sh, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}, {dst, four, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU}};
      stoke_node_v1 node = {.op = "loss_scaler", .name = "loss_scaler"};
      stoke_opt_args_v1 o = {.grad_scale = 1};
      stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .in = rt, .opt = &o};
      stoke_kernel_args_v1 ga = {.node = &node, .n_in = 2, .in = gt, .opt = &o, .engine = eself,
                                 .stream = g_dev->default_stream(g_dev_self)};
      g_run(rk, &ra, 0);
      g_run(gk, &ga, 1);
      g_dev_get(gs, dst, sizeof gs);
      if (gs[2] != rs[2] || gs[2] != (k ? 1 : 0))
        fail_msg("amp_check %s case %d: found_inf %g, the CPU's %g", stoke_dtype_name(dt), k, gs[2], rs[2]);
    }
    g_dev->free(g_dev_self, dg);
    g_dev->free(g_dev_self, dst);
    free(hg);
    free(rg);
  }
  /* amp_update: found flags 1 0 0 0 1 0 with growth every 2 clean steps, then static */
  const stoke_kernel_v1 *gu = g_gpu_kernel(STOKE_OP_AMP_UPDATE, STOKE_OPT, STOKE_F32, STOKE_LAYOUT_ANY, &eself);
  const stoke_kernel_v1 *ru = stoke_find_kernel(g_reg, "cpu", STOKE_OP_AMP_UPDATE, STOKE_OPT, STOKE_F32, STOKE_LAYOUT_ANY);
  float rs[4] = {65536, 0, 0, 0}, gs[4], rseed = 0, gseed;
  float *dst = g_dev_alloc(sizeof rs), *dseed = g_dev_alloc(sizeof(float));
  g_dev_put(dst, rs, sizeof rs);
  static const int found[] = {1, 0, 0, 0, 1, 0, 1, 1};
  for (int k = 0; k < 8; k++) {
    stoke_opt_args_v1 o = {.growth_interval = k < 6 ? 2 : 0, .backoff_factor = k < 6 ? 0 : 1};
    rs[2] = (float)found[k];
    g_dev_get(gs, dst, sizeof gs);
    gs[2] = (float)found[k];
    g_dev_put(dst, gs, sizeof gs);
    amp_update_both(gu, ru, eself, &o, rs, &rseed, dst, dseed, gs, &gseed);
    if (memcmp(gs, rs, sizeof gs) || gseed != rseed)
      fail_msg("amp_update step %d: gpu [%g %g %g %g] seed %g, cpu [%g %g %g %g] seed %g", k, gs[0], gs[1], gs[2], gs[3],
               gseed, rs[0], rs[1], rs[2], rs[3], rseed);
  }
  print_message("  amp_update: 8 steps equal, scale %g, %g skipped\n", rs[0], rs[3]);
  /* the range's ends, as the CPU's: a growth past float keeps the scale, backoffs stop at FLT_MIN */
  float ends[2][4] = {{0x1p127f, 1, 0, 0}, {0x1p-126f, 0, 1, 0}};
  for (int k = 0; k < 2; k++) {
    stoke_opt_args_v1 o = {.growth_interval = 2, .backoff_factor = 0.5};
    memcpy(rs, ends[k], sizeof rs);
    g_dev_put(dst, ends[k], sizeof rs);
    amp_update_both(gu, ru, eself, &o, rs, &rseed, dst, dseed, gs, &gseed);
    if (memcmp(gs, rs, sizeof gs) || !isfinite(gs[0]) || gs[0] <= 0)
      fail_msg("amp_update at float's %s: gpu scale %g, cpu %g", k ? "bottom" : "top", gs[0], rs[0]);
  }
  g_dev->free(g_dev_self, dst);
  g_dev->free(g_dev_self, dseed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_grad_norm),
      cmocka_unit_test(test_loss_scaler),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
