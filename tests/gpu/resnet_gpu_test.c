/* tests/gpu/resnet_gpu_test.c: a whole ResNet-18 (CIFAR stem) forward and
 * backward in fp32 on the GPU (cudnn, cublaslt, cuda; NHWC, TF32 off)
 * against the CPU backend (NCHW) from the same initial weights and batch:
 * the loss, every parameter gradient and the running statistics agree; and
 * both against the same network in f64 on the CPU, so a difference can be
 * told apart from the fp32 reference's own rounding. Twice: as built, and
 * with the fused engine first (its bn_relu / bn_add_relu nodes against the
 * CPU's unfused graph). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/registry.h"
#include "stoke/ops.h"
#include "stoke/rng.h"
#include "stoke/run.h"
#include "tests/common/seed.h"

#define N 4 /* a batch of 8 had a ReLU decided otherwise on 1 CPU fp32 forward in 3, 4 on none of 30 */
#define HW 32
#define CLASSES 10
#define MAX_RELUS 24 /* ResNet-18 has 17 */
#define MAX_DRAWS 12 /* batches drawn until one has no ReLU decided otherwise: see check_resnet18 */

static stoke_registry *reg;
static stoke_cfg *cfg;

#define OK(expr)                                  \
  do {                                            \
    stoke_err *e_ = (expr);                       \
    if (e_) fail_msg("%s: %s", #expr, e_->msg);   \
  } while (0)

typedef struct side {
  const char *engines[4];
  int n;
  void *selves[4];
  const stoke_backend_v1 *dev;
  stoke_graph *g;
  stoke_plan *p;
  stoke_exec *x;
} side;

/* the GPU side's convolution filters kept [O, kh, kw, C] (filter_ohwi, the GPU's default in train) */
static int ohwi_gpu;

static void build(side *s, stoke_layout layout, stoke_dtype dt) {
  OK(stoke_graph_new(reg, dt, layout, &s->g));
  int x, y, logits;
  OK(stoke_graph_input(s->g, "input", STOKE_VAL_INPUT, &(stoke_shape){4, {N, 3, HW, HW}}, dt, &x));
  OK(stoke_graph_input(s->g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {N}}, STOKE_I32, &y));
  stoke_builder_v1 b = stoke_graph_builder(s->g);
  OK(stoke_find_model(reg, "resnet")->build(cfg, "model", &b, x, CLASSES, &logits));
  OK(stoke_graph_loss(s->g, logits, ""));
  stoke_plan_opts o = {.engines = s->engines, .n_engines = s->n, .engine_selves = s->selves, .training = 1,
                       .filter_ohwi = layout == STOKE_NHWC && ohwi_gpu};
  OK(stoke_compile(s->g, &o, &s->p));
  OK(stoke_exec_new(s->p, s->dev, s->selves[s->n - 1 == 0 ? 0 : s->n - 1], 42, &s->x));
}

/* Every ReLU's decisions in one forward pass, in the order the forward runs
 * them: per ReLU output (a relu node, or the fused bn_relu / bn_add_relu /
 * bn_add_bn_relu nodes that end in one), which elements are 0, in NCHW order whatever the
 * side's layout. Recorded from the executor's hook, after each node. */
typedef struct relu_masks {
  const stoke_graph *g;
  stoke_exec *x;
  int n;
  int64_t numel[MAX_RELUS];
  unsigned char *zero[MAX_RELUS];
} relu_masks;

static stoke_err *record_relu(void *ctx, int node) {
  relu_masks *m = ctx;
  if (node < 0 || node >= m->g->n_fwd) return NULL;
  const stoke_gnode *nd = &m->g->nodes[node];
  if (strcmp(nd->n.op, STOKE_OP_RELU) && strcmp(nd->n.op, STOKE_OP_BN_RELU) && strcmp(nd->n.op, STOKE_OP_BN_ADD_RELU) &&
      strcmp(nd->n.op, STOKE_OP_BN_ADD_BN_RELU))
    return NULL;
  const stoke_value *v = &m->g->values[nd->out[0]];
  assert_true(m->n < MAX_RELUS && v->shape.ndim == 4);
  int64_t n = stoke_numel(&v->shape), C = v->shape.d[1], H = v->shape.d[2], W = v->shape.d[3];
  size_t es = stoke_dtype_size(v->dtype);
  unsigned char *host = malloc((size_t)n * es), *z = malloc((size_t)n);
  stoke_err *e = stoke_exec_read(m->x, nd->out[0], host, (size_t)n * es);
  if (e) return e;
  for (int64_t i = 0; i < n; i++) { /* i: the NCHW index */
    int64_t w = i % W, h = i / W % H, c = i / (W * H) % C, b = i / (W * H * C);
    int64_t at = m->g->layout == STOKE_NHWC ? ((b * H + h) * W + w) * C + c : i;
    z[i] = es == 8 ? ((const double *)host)[at] == 0 : ((const float *)host)[at] == 0;
  }
  free(host);
  m->numel[m->n] = n;
  m->zero[m->n++] = z;
  return NULL;
}

/* How many ReLU decisions `a` took otherwise than `b` (same network). */
static int64_t relu_flips(const relu_masks *a, const relu_masks *b) {
  assert_int_equal(a->n, b->n);
  int64_t flips = 0;
  for (int k = 0; k < a->n; k++) {
    assert_true(a->numel[k] == b->numel[k]);
    for (int64_t i = 0; i < a->numel[k]; i++) flips += a->zero[k][i] != b->zero[k][i];
  }
  return flips;
}

static void relu_masks_clear(relu_masks *m) {
  for (int k = 0; k < m->n; k++) free(m->zero[k]);
  m->n = 0;
}

static double rel(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i])) return NAN;
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

/* fused: the fused engine first (the compiler fuses batch norm + ReLU (+ add)); ohwi: the GPU's filters kept
 * [O, kh, kw, C] in memory, its parameters drawn as the CPU's are and its gradients read back into [O, C, kh, kw]
 * order by stoke_plan_filters_permute, as checkpoints are */
static void check_resnet18(int fused, int ohwi) {
  ohwi_gpu = ohwi;
  side cpu = {.engines = {"cpu"}, .n = 1}, gpu = {.engines = {"cudnn", "cublaslt", "cuda"}, .n = 3};
  if (fused) gpu = (side){.engines = {"fused", "cudnn", "cublaslt", "cuda"}, .n = 4};
  int d = gpu.n - 1; /* the cuda device: last */
  cpu.dev = stoke_find_backend(reg, "cpu");
  OK(cpu.dev->open(0, NULL, &cpu.selves[0]));
  gpu.dev = stoke_find_backend(reg, "cuda");
  OK(gpu.dev->open(0, NULL, &gpu.selves[d]));
  for (int i = 0; i < d; i++) OK(stoke_find_backend(reg, gpu.engines[i])->open(0, gpu.selves[d], &gpu.selves[i]));
  build(&cpu, STOKE_NCHW, STOKE_F32);
  build(&gpu, STOKE_NHWC, STOKE_F32);
  int n_fused = 0, n_dual = 0;
  for (int i = 0; i < gpu.g->n_fwd; i++) {
    const char *op = gpu.g->nodes[i].n.op;
    n_dual += !strcmp(op, STOKE_OP_BN_ADD_BN_RELU);
    n_fused += !strcmp(op, STOKE_OP_BN_RELU) || !strcmp(op, STOKE_OP_BN_ADD_RELU) || !strcmp(op, STOKE_OP_BN_ADD_BN_RELU);
  }
  print_message("%s: %d fused batch-norm nodes, %d with the shortcut's batch norm\n", fused ? "fused" : "unfused",
                n_fused, n_dual);
  int n_conv = 0;
  for (int i = 0; i < gpu.g->n_fwd; i++) n_conv += !strcmp(gpu.g->nodes[i].n.op, STOKE_OP_CONV2D);
  print_message("filters kept [O, kh, kw, C]: %d of %d convolutions'\n", gpu.p->n_filters_ohwi, n_conv);
  assert_int_equal(gpu.p->n_filters_ohwi, ohwi ? n_conv : 0);
  assert_int_equal(n_conv, 20); /* the stem, 8 blocks x 2, three strided shortcuts */
  assert_int_equal(n_fused, fused ? 17 : 0); /* the stem's, 8 blocks x 2 */
  assert_int_equal(n_dual, fused ? 3 : 0);   /* layer2-4's first blocks: a strided shortcut */
  /* the same network in f64 on the CPU: how far each fp32 side is from the
   * exact gradients (an fp32 reference is itself off by its own rounding) */
  side ref = {.engines = {"cpu"}, .n = 1, .dev = cpu.dev, .selves = {cpu.selves[0]}};
  build(&ref, STOKE_NCHW, STOKE_F64);
  /* The comparison below holds each gradient to what fp32 rounding can do.
   * But a ReLU whose input lies within fp32 rounding of 0 decides the other
   * way in fp32 than in f64, and then every gradient behind it in the
   * backward moves at once, by up to 1e-2 in a tensor (the element's own
   * gradient passes or not): a discrete decision, not a rounding error a
   * tolerance could be derived for. It happened on about 1 fresh batch in 3
   * (either fp32 side) and made this test fail now and then (seeds
   * 1795419123, 4200015146, 4206687155, 2917710208). So each side's ReLU
   * decisions are recorded in the forward (the executor's hook reads every
   * ReLU output) and compared with the f64 network's; a batch on which any
   * one differs is drawn again, and the gradients are judged only on a
   * batch where all three networks took the same decisions, under the
   * rounding bounds alone. */
  relu_masks m64 = {.g = ref.g, .x = ref.x}, mp = {.g = ref.g, .x = ref.x};
  relu_masks mc = {.g = cpu.g, .x = cpu.x}, mg = {.g = gpu.g, .x = gpu.x};
  /* the fused test draws another batch than the unfused one in the same second */
  uint64_t seed = test_seed(ohwi ? "resnet18 ohwi" : fused ? "resnet18 fused" : "resnet18") + (uint64_t)fused +
                  2 * (uint64_t)ohwi;
  stoke_rng r = stoke_rng_seed(seed);
  const int n_in = N * 3 * HW * HW;
  float *xc = stoke_exec_input(cpu.x), *xg = malloc(sizeof(float) * n_in);
  int32_t *yc = stoke_exec_labels(cpu.x);
  double *xr = stoke_exec_input(ref.x);
  /* f64 parameters: the f32 ones, exactly (not the f64 draws they were rounded from) */
  for (int v = 0; v < ref.g->n_values; v++) {
    const stoke_value *val = &ref.g->values[v];
    if (val->kind != STOKE_VAL_PARAM) continue;
    const float *pf =
        (const float *)stoke_exec_buffer(cpu.x, STOKE_BUF_PARAMS) + cpu.g->values[v].offset / sizeof(float);
    double *pd = (double *)stoke_exec_buffer(ref.x, STOKE_BUF_PARAMS) + val->offset / sizeof(double);
    for (int64_t i = 0; i < stoke_numel(&val->shape); i++) pd[i] = pf[i];
  }
  size_t gbytes = gpu.p->bytes[STOKE_BUF_GRADS];
  /* How much fp32 rounding can move each gradient for this batch, measured:
   * the f64 network again with its input and parameters moved by up to one
   * fp32 unit roundoff each (PERTURBED draws), the largest change kept per
   * tensor (sens below). A perturbation that flips a ReLU measures a flip,
   * not rounding: it is drawn again. */
  size_t n64 = ref.p->bytes[STOKE_BUF_GRADS] / sizeof(double);
  double *pd0 = malloc(ref.p->bytes[STOKE_BUF_PARAMS]), *g64p = calloc(n64, sizeof(double));
  double *gr = malloc(ref.p->bytes[STOKE_BUF_GRADS]), *sens_num = calloc(n64, sizeof(double));
  double *pd = stoke_exec_buffer(ref.x, STOKE_BUF_PARAMS);
  memcpy(pd0, pd, ref.p->bytes[STOKE_BUF_PARAMS]);
  const double u32 = stoke_dtype_unit_roundoff(STOKE_F32);
  enum { PERTURBED = 2, PERTURB_TRIES = 8 };
  for (int draw = 1;; draw++) {
    /* one batch: NCHW for the CPU, the same values transposed to NHWC for the GPU */
    for (int i = 0; i < n_in; i++) xc[i] = (float)stoke_rng_normal(&r);
    for (int n = 0; n < N; n++)
      for (int c = 0; c < 3; c++)
        for (int h = 0; h < HW; h++)
          for (int w = 0; w < HW; w++) xg[((n * HW + h) * HW + w) * 3 + c] = xc[((n * 3 + c) * HW + h) * HW + w];
    for (int i = 0; i < N; i++) yc[i] = (int32_t)stoke_rng_below(&r, CLASSES);
    memcpy(stoke_exec_labels(ref.x), yc, sizeof(int32_t) * N);
    OK(stoke_exec_copy(gpu.x, stoke_exec_input(gpu.x), xg, sizeof(float) * n_in, STOKE_COPY_H2D));
    OK(stoke_exec_copy(gpu.x, stoke_exec_labels(gpu.x), yc, sizeof(int32_t) * N, STOKE_COPY_H2D));
    /* the GPU's gradients are poisoned: every one must be written */
    OK(gpu.dev->fill(gpu.selves[d], stoke_exec_buffer(gpu.x, STOKE_BUF_GRADS), 0xff, gbytes, NULL));
    memset(sens_num, 0, n64 * sizeof(double));
    int64_t p_flips = 0;
    int tries = 0;
    for (int k = 0; k <= PERTURBED; k++) { /* k = 0: the exact f32 values */
      for (size_t i = 0; k && i < ref.p->bytes[STOKE_BUF_PARAMS] / sizeof(double); i++)
        pd[i] = pd0[i] * (1 + u32 * (2 * stoke_rng_uniform(&r) - 1));
      for (int i = 0; i < n_in; i++) xr[i] = xc[i] * (k ? 1 + u32 * (2 * stoke_rng_uniform(&r) - 1) : 1);
      stoke_exec_set_hook(ref.x, record_relu, k ? &mp : &m64);
      OK(stoke_exec_forward_backward(ref.x, 1, 7));
      if (k) {
        int64_t f = relu_flips(&mp, &m64);
        relu_masks_clear(&mp);
        p_flips += f;
        if (f && ++tries < PERTURB_TRIES) {
          k--;
          continue;
        }
      }
      memcpy(k ? g64p : gr, stoke_exec_buffer(ref.x, STOKE_BUF_GRADS), ref.p->bytes[STOKE_BUF_GRADS]);
      for (size_t i = 0; k && i < n64; i++) sens_num[i] = fmax(sens_num[i], fabs(g64p[i] - gr[i]));
    }
    stoke_exec_set_hook(ref.x, NULL, NULL);
    memcpy(pd, pd0, ref.p->bytes[STOKE_BUF_PARAMS]);
    stoke_exec_set_hook(cpu.x, record_relu, &mc);
    stoke_exec_set_hook(gpu.x, record_relu, &mg);
    OK(stoke_exec_forward_backward(cpu.x, 1, 7));
    OK(stoke_exec_forward_backward(gpu.x, 1, 7));
    stoke_exec_set_hook(cpu.x, NULL, NULL);
    stoke_exec_set_hook(gpu.x, NULL, NULL);
    assert_int_equal(m64.n, 17); /* the stem's ReLU, 8 blocks x 2 */
    int64_t c_flips = relu_flips(&mc, &m64), g_flips = relu_flips(&mg, &m64), relus = 0;
    for (int k = 0; k < m64.n; k++) relus += m64.numel[k];
    relu_masks_clear(&m64), relu_masks_clear(&mc), relu_masks_clear(&mg);
    print_message("batch %d: of %lld ReLU decisions, unlike the f64 network's: cpu fp32 %lld, gpu fp32 %lld; "
                  "perturbed f64 %lld (in %d draws)\n",
                  draw, (long long)relus, (long long)c_flips, (long long)g_flips, (long long)p_flips,
                  PERTURBED + tries);
    if (!c_flips && !g_flips && tries < PERTURB_TRIES) break;
    if (draw == MAX_DRAWS)
      fail_msg("no batch of %d drawn (seed %llu) on which the fp32 networks took the f64 network's ReLU decisions: "
               "if the GPU's count is large, its forward is wrong; if small on every draw, the network is too large "
               "for its rounding (lower N or HW)",
               MAX_DRAWS, (unsigned long long)seed);
  }
  double lc, lg;
  OK(stoke_exec_read_loss(cpu.x, &lc));
  OK(stoke_exec_read_loss(gpu.x, &lg));
  print_message("loss: cpu %.7f gpu %.7f\n", lc, lg);
  assert_true(fabs(lc - lg) <= 1e-4 * fabs(lc));
  /* parameters and their gradients share offsets: same model, same order */
  assert_int_equal(gbytes, cpu.p->bytes[STOKE_BUF_GRADS]);
  float *gc = stoke_exec_buffer(cpu.x, STOKE_BUF_GRADS), *gg = malloc(gbytes);
  OK(stoke_exec_copy(gpu.x, gg, stoke_exec_buffer(gpu.x, STOKE_BUF_GRADS), gbytes, STOKE_COPY_D2H));
  /* gradients share the parameters' offsets and memory order: back to [O, C, kh, kw] (no-op without ohwi) */
  OK(stoke_plan_filters_permute(gpu.p, gg, NULL, 0, 0));
  double worst = 0, num = 0, den = 0, num_c64 = 0, num_g64 = 0, den64 = 0;
  int n_checked = 0, head_checked = 0;
  const stoke_graph *g = cpu.g;
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *val = &g->values[v];
    if (val->kind != STOKE_VAL_PARAM) continue;
    size_t off = val->offset / sizeof(float), n = (size_t)stoke_numel(&val->shape);
    /* fp32 with other summation orders (and cuDNN's FMA algorithms) through
     * 20 layers whose batch norms see as few as 4x4x4 values. Typically
     * (H100, batch 8) the worst tensor differed from the CPU's by 3.6e-6
     * and all gradients together by 1.7e-6, the CPU's own fp32 gradients
     * being 8e-7 from the f64 ones and the GPU's 1.5e-6. Each tensor's bound is
     * 10x the larger of two measures of what fp32 can do for this batch:
     * the CPU fp32's own error against f64, and the f64 network's change
     * when its input and weights move by one fp32 rounding (sens; 4e-7 in
     * all). Floor 1e-5. (The batch has no ReLU decided otherwise than in
     * f64: see above.) Kernel by kernel, the per-op GPU tests (cuda_ops_test,
     * cudnn_bn_test, cudnn_test, fused_test) hold each backward to tolerances
     * from its reduction length. */
    double e = rel(gg + off, gc + off, n);
    if (e > worst) worst = e;
    /* against f64: the same value id in the f64 plan (same build), at its own offset */
    const double *g64 = gr + ref.g->values[v].offset / sizeof(double);
    const double *s64 = sens_num + ref.g->values[v].offset / sizeof(double);
    double tc = 0, tg = 0, t64 = 0, ts = 0;
    for (size_t i = 0; i < n; i++) {
      ts += s64[i] * s64[i];
      double d = (double)gg[off + i] - gc[off + i];
      num += d * d;
      den += (double)gc[off + i] * gc[off + i];
      tc += ((double)gc[off + i] - g64[i]) * ((double)gc[off + i] - g64[i]);
      tg += ((double)gg[off + i] - g64[i]) * ((double)gg[off + i] - g64[i]);
      t64 += g64[i] * g64[i];
    }
    num_c64 += tc, num_g64 += tg, den64 += t64;
    double ec = sqrt(tc / t64), eg = sqrt(tg / t64), sens = sqrt(ts / t64), bound = fmax(10 * fmax(ec, sens), 1e-5);
    /* A convolution before a training batch norm is scale invariant: the
     * loss does not change along its weight, so each output filter's
     * gradient is orthogonal to the filter, exactly. In fp32 the part
     * along the filter is the residue of batch norm's backward sums
     * (mean(dy), mean(dy xhat)): the CPU accumulates them in f64
     * (backends/cpu/bn.h), the GPU kernels in f32 partial sums, and where the gradient is small against that
     * residue (the stem's, some batches) the two differ by far more than
     * 10x. So 4-D weights are judged on the part that carries information,
     * orthogonal to each filter, under the same 10x bound; the part along
     * it only within 1% of the gradient (a TF32 or bf16 error shows in both). */
    double oc = 0, og = 0, o64 = 0, along = 0;
    if (val->shape.ndim == 4) {
      const float *w = (const float *)stoke_exec_buffer(cpu.x, STOKE_BUF_PARAMS) + off;
      size_t per = n / (size_t)val->shape.d[0];
      for (size_t f = 0; f < (size_t)val->shape.d[0]; f++) {
        const float *wf = w + f * per;
        double ww = 0, pc = 0, pg = 0, p64 = 0;
        for (size_t i = 0; i < per; i++) {
          ww += (double)wf[i] * wf[i];
          pc += (double)gc[off + f * per + i] * wf[i];
          pg += (double)gg[off + f * per + i] * wf[i];
          p64 += g64[f * per + i] * wf[i];
        }
        if (ww == 0) ww = 1;
        for (size_t i = 0; i < per; i++) {
          double r64 = g64[f * per + i] - p64 / ww * wf[i];
          double rc = gc[off + f * per + i] - pc / ww * wf[i] - r64, rg = gg[off + f * per + i] - pg / ww * wf[i] - r64;
          oc += rc * rc, og += rg * rg, o64 += r64 * r64;
        }
        along += (pg - p64) * (pg - p64) / ww;
      }
      oc = sqrt(oc / fmax(o64, 1e-300)), og = sqrt(og / fmax(o64, 1e-300)), along = sqrt(along / t64);
    }
    int ok = eg <= bound || (val->shape.ndim == 4 && og <= fmax(10 * fmax(oc, sens), 1e-5) && along <= 1e-2);
    head_checked += !strncmp(val->name, "fc.", 3);
    if (e > 1e-5 || eg > bound)
      print_message("  %-28s gpu vs cpu %.3g; vs f64: cpu %.3g, gpu %.3g, sens %.3g (bound %.3g); orthogonal to the "
                    "filters: cpu %.3g, gpu %.3g; along them: gpu %.3g\n",
                    val->name, e, ec, eg, sens, bound, oc, og, along);
    if (!ok)
      fail_msg("gradient of %s: relative error against f64 %.3g, more than 10x both the CPU fp32's %.3g and the "
               "f64 network's change under fp32-sized perturbations %.3g (orthogonal to the filters: gpu %.3g, cpu "
               "%.3g; along them %.3g)",
               val->name, eg, ec, sens, og, oc, along);
    n_checked++;
  }
  /* (the padding between parameters stays poisoned: only parameters count) */
  double all = sqrt(num / den);
  print_message("all parameter gradients: relative error %.3g; against f64: cpu fp32 %.3g, gpu fp32 %.3g\n", all,
                sqrt(num_c64 / den64), sqrt(num_g64 / den64));
  /* all gradients together: dominated by the large, well-conditioned tensors */
  assert_true(n_checked > 0 && head_checked == 2);
  double all_sens = 0;
  for (size_t i = 0; i < n64; i++) all_sens += sens_num[i] * sens_num[i];
  all_sens = sqrt(all_sens / den64);
  print_message("all parameter gradients' change under fp32-sized perturbations (f64): %.3g\n", all_sens);
  double all_bound = fmax(10 * fmax(sqrt(num_c64 / den64), all_sens), 1e-5);
  assert_true(sqrt(num_g64 / den64) <= all_bound);
  print_message("worst parameter-gradient relative error %.3g over %lld parameters\n", worst,
                (long long)cpu.p->n_params);
  size_t sbytes = cpu.p->bytes[STOKE_BUF_STATE];
  float *sg = malloc(sbytes);
  OK(stoke_exec_copy(gpu.x, sg, stoke_exec_buffer(gpu.x, STOKE_BUF_STATE), sbytes, STOKE_COPY_D2H));
  double se = rel(sg, stoke_exec_buffer(cpu.x, STOKE_BUF_STATE), sbytes / sizeof(float));
  print_message("running statistics relative error %.3g\n", se);
  assert_true(se <= 1e-4);
  free(xg);
  free(gg);
  free(sg);
  free(pd0);
  free(g64p);
  free(gr);
  free(sens_num);
  stoke_exec_free(gpu.x);
  stoke_exec_free(cpu.x);
  stoke_exec_free(ref.x);
  stoke_plan_free(ref.p);
  stoke_graph_free(ref.g);
  stoke_plan_free(gpu.p);
  stoke_plan_free(cpu.p);
  stoke_graph_free(gpu.g);
  stoke_graph_free(cpu.g);
  for (int i = d - 1; i >= 0; i--) stoke_find_backend(reg, gpu.engines[i])->close(gpu.selves[i]);
  gpu.dev->close(gpu.selves[d]);
  cpu.dev->close(cpu.selves[0]);
}

static void test_resnet18_gpu_matches_cpu(void **state) { check_resnet18(0, 0); }
static void test_resnet18_fused_gpu_matches_cpu(void **state) { check_resnet18(1, 0); }
static void test_resnet18_fused_ohwi_gpu_matches_cpu(void **state) { check_resnet18(1, 1); }

int main(void) {
  stoke_err *e = stoke_registry_new(&reg);
  const char *plugins[] = {"cpu", "cuda", "cudnn", "cublaslt", "fused", "resnet"};
  for (int i = 0; i < 6 && !e; i++) e = stoke_registry_load(reg, plugins[i]);
  cfg = stoke_cfg_new();
  if (!e) e = stoke_declare_core_keys(cfg);
  const stoke_model_v1 *m = e ? NULL : stoke_find_model(reg, "resnet");
  if (!e) e = stoke_cfg_declare(cfg, "model", NULL, m->keys, m->n_keys);
  if (!e) e = stoke_cfg_load_string(cfg, "resnet.ini", "[model]\nname = resnet\ndepth = 18\nstem = cifar\nwidth = 16\n");
  if (e) {
    fprintf(stderr, "setup: %s\n", e->msg);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_resnet18_gpu_matches_cpu),
                                     cmocka_unit_test(test_resnet18_fused_gpu_matches_cpu),
                                     cmocka_unit_test(test_resnet18_fused_ohwi_gpu_matches_cpu)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  stoke_cfg_free(cfg);
  stoke_registry_free(reg);
  return rc;
}
