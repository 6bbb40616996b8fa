/* tests/common/cpu_fixture.h: the fixture of the CPU graph tests: one
 * registry with the cpu plugin loaded and its backend opened, the run's
 * seed (tests/common/seed.h), OK(expr), which fails the test with the
 * error's message and the seed, and helpers to compile and run f64 graphs.
 * Include after cmocka.h; every helper is static. */
#ifndef STOKE_TESTS_CPU_FIXTURE_H
#define STOKE_TESTS_CPU_FIXTURE_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/registry.h"
#include "stoke/rng.h"
#include "tests/common/seed.h"

static stoke_registry *reg;
static const stoke_backend_v1 *cpu;
static void *cpu_self;
static uint64_t seed;

#define OK(expr)                                                                        \
  do {                                                                                  \
    stoke_err *e_ = (expr);                                                             \
    if (e_) {                                                                           \
      print_error("%s\n", e_->msg);                                                     \
      stoke_err_free(e_);                                                               \
      fail_msg("%s failed (seed %llu)", #expr, (unsigned long long)seed);               \
    }                                                                                   \
  } while (0)

/* cmocka group setup (called from the test's own, which names the test in
 * the seed's line). Bazel runs tests at the runfiles root. */
static int cpu_fixture_setup(const char *test_name) {
  stoke_err *e = stoke_registry_new(&reg);
  if (!e) e = stoke_registry_load(reg, "backends/cpu/libstoke_cpu.so");
  if (!e) cpu = stoke_find_backend(reg, "cpu");
  if (!e && cpu->open) e = cpu->open(0, NULL, &cpu_self);
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  seed = test_seed(test_name);
  return 0;
}

static int cpu_fixture_teardown(void **state) {
  if (cpu && cpu->close) cpu->close(cpu_self);
  stoke_registry_free(reg);
  return 0;
}

/* g compiled for training on the cpu engine alone, with `optimizer` (NULL:
 * none) and the fusion passes when `fuse`. */
static __attribute__((unused)) stoke_plan *cpu_compile(stoke_graph *g, const char *optimizer, int fuse) {
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .optimizer = optimizer,
                       .training = 1, .fuse = fuse};
  stoke_plan *p;
  OK(stoke_compile(g, &o, &p));
  return p;
}

/* Compiling g for training on the cpu engine alone must fail with a
 * message that holds `text`; the message is printed. */
static __attribute__((unused)) void cpu_expect_compile_error(stoke_graph *g, const char *text) {
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .training = 1};
  stoke_plan *p = NULL;
  stoke_err *e = stoke_compile(g, &o, &p);
  if (!e) fail_msg("compiled; expected an error holding \"%s\"", text);
  print_message("%s\n", e->msg);
  if (!strstr(e->msg, text)) fail_msg("the error does not say \"%s\"", text);
  stoke_err_free(e);
}

/* The plan report of p as text (malloc'd). */
static __attribute__((unused)) char *cpu_plan_report(const stoke_plan *p) {
  char *rep = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&rep, &len);
  stoke_plan_report(p, f);
  fclose(f);
  return rep;
}

/* Fails unless the plan report of p holds `text`; `what` is the claim. */
static __attribute__((unused)) void cpu_expect_report(const stoke_plan *p, const char *text, const char *what) {
  char *rep = cpu_plan_report(p);
  if (!strstr(rep, text)) fail_msg("the plan does not say %s:\n%s", what, rep);
  free(rep);
}

/* A random batch for an f64 graph, drawn from `rng_seed`: `numel` normal
 * inputs and `n` labels below `classes`. */
static __attribute__((unused)) void cpu_random_batch(stoke_exec *x, uint64_t rng_seed, int64_t numel, int64_t n,
                                                     int64_t classes) {
  stoke_rng r = stoke_rng_seed(rng_seed);
  double *in = stoke_exec_input(x);
  int32_t *lab = stoke_exec_labels(x);
  for (int64_t i = 0; i < numel; i++) in[i] = stoke_rng_normal(&r);
  for (int64_t i = 0; i < n; i++) lab[i] = (int32_t)stoke_rng_below(&r, (uint64_t)classes);
}

/* One forward and backward of the whole compiled graph: the loss, in double. */
static __attribute__((unused)) double cpu_loss(stoke_exec *x) {
  double loss;
  OK(stoke_exec_forward_backward(x, 1, 7));
  OK(stoke_exec_read_loss(x, &loss));
  return loss;
}

/* Every parameter's gradient of the compiled f64 graph (its batch already
 * written) against central differences on the loss, with unwritten
 * gradients poisoned first; fails on a relative error above `tol`, taken
 * against max(|analytic| + |numeric|, 1e-4) after the difference's own
 * rounding (4 eps |loss| / h) is allowed for: a gradient that is 0 (a
 * key's bias under softmax) differs from its differences by that
 * rounding, ~1e-10.
 * Returns the worst error; *compared counts the parameter elements checked. */
static __attribute__((unused)) double cpu_check_gradients(stoke_exec *x, double tol, int *compared) {
  stoke_plan *p = stoke_exec_plan(x);
  const stoke_graph *g = p->g;
  double *params = stoke_exec_buffer(x, STOKE_BUF_PARAMS);
  double *grads = stoke_exec_buffer(x, STOKE_BUF_GRADS);
  int64_t total = (int64_t)(p->bytes[STOKE_BUF_PARAMS] / sizeof(double));
  for (int64_t i = 0; i < total; i++) grads[i] = NAN; /* unwritten gradients fail */
  cpu_loss(x);
  double *analytic = malloc(sizeof(double) * (size_t)total);
  memcpy(analytic, grads, sizeof(double) * (size_t)total);
  double worst = 0;
  *compared = 0;
  for (int v = 0; v < g->n_values; v++) {
    if (g->values[v].kind != STOKE_VAL_PARAM) continue;
    int64_t off = (int64_t)(g->values[v].offset / sizeof(double));
    for (int64_t i = 0; i < stoke_numel(&g->values[v].shape); i++) {
      double keep = params[off + i], an = analytic[off + i], num = 0, err = INFINITY;
      /* a step across a ReLU's kink (a pre-activation within h of 0) moves the difference by the
       * kink's jump (graph_test seed 1795452820: 0.2% off at h = 1e-6): a miss is tried again
       * 100x closer, where the kink is 100x less likely, and the closer of the two counts */
      for (double h = 1e-6; h >= 1e-8 && !(err <= tol); h /= 100) {
        params[off + i] = keep + h;
        double lp = cpu_loss(x);
        params[off + i] = keep - h;
        double lm = cpu_loss(x);
        params[off + i] = keep;
        /* the difference's own rounding: lp and lm each within a few ulps of the loss, divided by 2h
         * (at h = 1e-6 and a loss of 1, 9e-10: above tol x the 1e-4 floor for tol 1e-6, so a small
         * gradient failed on rounding alone, side_test seed 1795976906) */
        double n_h = (lp - lm) / (2 * h), r_h = 4 * DBL_EPSILON * fmax(fabs(lp), fabs(lm)) / h;
        double e_h = fmax(0, fabs(n_h - an) - r_h) / fmax(1e-4, fabs(n_h) + fabs(an));
        if (!(e_h >= err)) num = n_h, err = e_h;
      }
      if (err > worst) worst = err;
      if (!(err <= tol))
        fail_msg("d loss / d %s[%lld]: analytic %.10g, finite difference %.10g (seed %llu)", g->values[v].name,
                 (long long)i, an, num, (unsigned long long)seed);
      (*compared)++;
    }
  }
  free(analytic);
  return worst;
}

#endif
