/* tests/gpu/layout_gpu_test.c: the memory-order pass (core/layout.c) on
 * the GPU: tests/common/layout_net.h's network (convolutions and reshapes,
 * transposes, a linear per token mixed) in fp32 on cudnn, cublaslt and cuda
 * in NHWC, the order a GPU run uses, against the same network in f64 on the
 * CPU in NCHW (every value row-major), from the same weights and batch. The
 * GPU plan converts 5 values and relabels 3; its loss and every parameter
 * gradient (poisoned first) agree with the CPU's to fp32 rounding. Before
 * the pass the GPU read the convolution's output pixels as channels. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "stoke/rng.h"
#include "tests/common/seed.h"

static stoke_registry *reg;

#define OK(expr)                                \
  do {                                          \
    stoke_err *e_ = (expr);                     \
    if (e_) fail_msg("%s: %s", #expr, e_->msg); \
  } while (0)

#include "tests/common/layout_net.h"

static void test_nhwc_gpu_equals_cpu(void **state) {
  (void)state;
  const stoke_backend_v1 *cpu = stoke_find_backend(reg, "cpu"), *cuda = stoke_find_backend(reg, "cuda");
  void *cpu_self, *gpu_selves[3];
  const char *gpu_engines[] = {"cudnn", "cublaslt", "cuda"}, *cpu_engines[] = {"cpu"};
  OK(cpu->open(0, NULL, &cpu_self));
  OK(cuda->open(0, NULL, &gpu_selves[2]));
  for (int i = 0; i < 2; i++) OK(stoke_find_backend(reg, gpu_engines[i])->open(0, gpu_selves[2], &gpu_selves[i]));
  stoke_graph *gc = layout_net(reg, STOKE_NCHW, STOKE_F64), *gg = layout_net(reg, STOKE_NHWC, STOKE_F32);
  /* TF32 off (no flag): the GPU computes in fp32 */
  stoke_plan_opts oc = {.engines = cpu_engines, .n_engines = 1, .engine_selves = &cpu_self, .training = 1};
  stoke_plan_opts og = {.engines = gpu_engines, .n_engines = 3, .engine_selves = gpu_selves, .training = 1};
  stoke_plan *pc, *pg;
  OK(stoke_compile(gc, &oc, &pc));
  OK(stoke_compile(gg, &og, &pg));
  assert_int_equal(pg->n_layout_converted, 5);
  assert_int_equal(pg->n_layout_relabelled, 3);
  stoke_exec *xc, *xg;
  uint64_t seed = test_seed("layout_gpu_test");
  OK(stoke_exec_new(pc, cpu, cpu_self, seed, &xc));
  OK(stoke_exec_new(pg, cuda, gpu_selves[2], seed, &xg));
  /* the same weights: the GPU's fp32 draws, exactly, in the f64 network (the cpu's and cuda's convolution
   * weights are both [O, C, kh, kw]; parameters share their offsets: the same model, the same order) */
  size_t pbytes = pg->bytes[STOKE_BUF_PARAMS], gbytes = pg->bytes[STOKE_BUF_GRADS];
  float *wg = malloc(pbytes), *dg = malloc(gbytes);
  OK(stoke_exec_copy(xg, wg, stoke_exec_buffer(xg, STOKE_BUF_PARAMS), pbytes, STOKE_COPY_D2H));
  double *wc = stoke_exec_buffer(xc, STOKE_BUF_PARAMS);
  for (int v = 0; v < gg->n_values; v++) {
    const stoke_value *val = &gg->values[v];
    if (val->kind != STOKE_VAL_PARAM) continue;
    assert_string_equal(gc->values[v].name, val->name);
    for (int64_t i = 0; i < stoke_numel(&val->shape); i++)
      wc[gc->values[v].offset / sizeof(double) + i] = wg[val->offset / sizeof(float) + i];
  }
  /* one batch: the input is a matrix (N, C H W), one memory in either graph */
  enum { NUMEL = LN_N * LN_C0 * LN_H * LN_W };
  stoke_rng r = stoke_rng_seed(seed);
  float xf[NUMEL];
  int32_t lab[LN_N];
  double *xd = stoke_exec_input(xc);
  for (int i = 0; i < NUMEL; i++) xd[i] = xf[i] = (float)stoke_rng_normal(&r);
  for (int i = 0; i < LN_N; i++) lab[i] = (int32_t)stoke_rng_below(&r, LN_CLASSES);
  memcpy(stoke_exec_labels(xc), lab, sizeof lab);
  OK(stoke_exec_copy(xg, stoke_exec_input(xg), xf, sizeof xf, STOKE_COPY_H2D));
  OK(stoke_exec_copy(xg, stoke_exec_labels(xg), lab, sizeof lab, STOKE_COPY_H2D));
  OK(cuda->fill(gpu_selves[2], stoke_exec_buffer(xg, STOKE_BUF_GRADS), 0xff, gbytes, NULL)); /* NaN: each written */
  OK(stoke_exec_forward_backward(xc, 1, 7));
  OK(stoke_exec_forward_backward(xg, 1, 7));
  double lc, lg;
  OK(stoke_exec_read_loss(xc, &lc));
  OK(stoke_exec_read_loss(xg, &lg));
  OK(stoke_exec_copy(xg, dg, stoke_exec_buffer(xg, STOKE_BUF_GRADS), gbytes, STOKE_COPY_D2H));
  const double *dc = stoke_exec_buffer(xc, STOKE_BUF_GRADS);
  /* Tolerance: fp32 against f64, each result a sum of at most K = 96 rounded products along its longest
   * path (conv1's 18 taps, the token linear's 3, conv4's 27, fc's 24 inputs, and the weight gradients' sums
   * over N H W = 24 positions): |error| <= K u32 |terms|, with u32 = 2^-24. Norm-wise per tensor, with the
   * terms no larger than the result times 4 (inputs and weights of either sign, |x| <= 3): 4 K u32 = 2.3e-5. */
  const double tol = 4 * 96 * stoke_dtype_unit_roundoff(STOKE_F32);
  print_message("loss: cpu f64 %.9f, gpu fp32 %.9f (seed %llu)\n", lc, lg, (unsigned long long)seed);
  assert_true(fabs(lc - lg) <= tol * fabs(lc));
  double worst = 0;
  for (int v = 0; v < gg->n_values; v++) {
    const stoke_value *val = &gg->values[v];
    if (val->kind != STOKE_VAL_PARAM) continue;
    const float *a = dg + val->offset / sizeof(float);
    const double *b = dc + gc->values[v].offset / sizeof(double);
    double num = 0, den = 0;
    for (int64_t i = 0; i < stoke_numel(&val->shape); i++) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += b[i] * b[i];
    }
    double e = sqrt(num / fmax(den, 1e-300));
    print_message("  %-14s relative error %.3g\n", val->name, e);
    if (!(e <= tol))
      fail_msg("gradient of %s: relative error %.3g from the f64 CPU network, over %.3g (seed %llu)", val->name, e,
               tol, (unsigned long long)seed);
    if (e > worst) worst = e;
  }
  print_message("worst %.3g of %.3g\n", worst, tol);
  free(wg);
  free(dg);
  stoke_exec_free(xc);
  stoke_exec_free(xg);
  stoke_plan_free(pc);
  stoke_plan_free(pg);
  stoke_graph_free(gc);
  stoke_graph_free(gg);
  for (int i = 0; i < 2; i++) stoke_find_backend(reg, gpu_engines[i])->close(gpu_selves[i]);
  cuda->close(gpu_selves[2]);
  cpu->close(cpu_self);
}

int main(void) {
  stoke_err *e = stoke_registry_new(&reg);
  const char *plugins[] = {"cpu", "cuda", "cudnn", "cublaslt"};
  for (int i = 0; i < 4 && !e; i++) e = stoke_registry_load(reg, plugins[i]);
  if (e) {
    fprintf(stderr, "setup: %s\n", e->msg);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_nhwc_gpu_equals_cpu)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  stoke_registry_free(reg);
  return rc;
}
