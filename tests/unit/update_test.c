/* tests/unit/update_test.c: the update through the executor on the cpu
 * backend, as a run does it: weight decay by parameter group (the planned
 * ranges are exactly the >= 2-D parameters) and clipping by the global
 * gradient norm (grad_norm before the optimizer), for sgd and adamw, on an
 * f64 MLP with fresh random weights and data; every parameter element is
 * checked against the update computed here from the gradient buffer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "tests/common/cpu_fixture.h"

enum { NB = 8, F = 5, HID = 6, C = 3 };

static int setup(void **state) { return cpu_fixture_setup("update_test"); }

/* x[NB, F] -> fc1 -> relu -> fc2 -> loss, weights from `init_seed`. */
static stoke_graph *mlp(void) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, w1, b1, w2, b2, a1, h, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {NB, F}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {NB}}, STOKE_I32, &y));
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -0.5, 0.5};
  OK(b.param(g, "fc1.weight", &(stoke_shape){2, {HID, F}}, init, &w1));
  OK(b.param(g, "fc1.bias", &(stoke_shape){1, {HID}}, init, &b1));
  OK(b.param(g, "fc2.weight", &(stoke_shape){2, {C, HID}}, init, &w2));
  OK(b.param(g, "fc2.bias", &(stoke_shape){1, {C}}, init, &b2));
  OK(b.node(g, STOKE_OP_LINEAR, "fc1", (int[]){x, w1, b1}, 3, "", &a1, 1));
  OK(b.node(g, STOKE_OP_RELU, "act1", &a1, 1, "", &h, 1));
  OK(b.node(g, STOKE_OP_LINEAR, "fc2", (int[]){h, w2, b2}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  return g;
}

/* One step of `opt` with weight decay on >= 2-D parameters only and the
 * gradients clipped to a norm of max_norm (0: no clipping). */
static void check_step(const char *opt, double max_norm) {
  stoke_graph *g = mlp();
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .optimizer = opt,
                       .training = 1, .grad_clip = max_norm, .decay_2d_only = 1};
  stoke_plan *p;
  stoke_exec *x;
  OK(stoke_compile(g, &o, &p));
  assert_int_equal(p->n_decay, 2); /* fc1.weight and fc2.weight, fc1.bias between them */
  assert_true((max_norm > 0) == (p->grad_norm != NULL));
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &x));
  cpu_random_batch(x, seed + 1, NB * F, NB, C);
  OK(stoke_exec_forward_backward(x, 1, 0));
  size_t bytes = p->bytes[STOKE_BUF_PARAMS];
  int64_t n = (int64_t)(bytes / sizeof(double));
  double *w0 = malloc(bytes), *gr = malloc(bytes), *w1 = malloc(bytes);
  memcpy(w0, stoke_exec_buffer(x, STOKE_BUF_PARAMS), bytes);
  memcpy(gr, stoke_exec_buffer(x, STOKE_BUF_GRADS), bytes);
  double sq = 0;
  for (int64_t i = 0; i < n; i++) sq += gr[i] * gr[i];
  /* grad_norm hands the factor over as f32 */
  double norm = sqrt(sq), factor = max_norm > 0 ? (float)fmin(1, max_norm / (norm + 1e-6)) : 1;
  stoke_opt_args_v1 a = {.lr = 0.1, .weight_decay = 0.05, .grad_scale = 1, .step = 1, .momentum = 0.9,
                         .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .max_norm = max_norm};
  OK(stoke_exec_update(x, &a));
  memcpy(w1, stoke_exec_buffer(x, STOKE_BUF_PARAMS), bytes);
  int adam = !strcmp(opt, STOKE_OP_ADAMW), decayed = 0, plain = 0;
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *val = &g->values[v];
    if (val->kind != STOKE_VAL_PARAM) continue;
    int dec = val->shape.ndim >= 2;
    for (int64_t k = 0; k < stoke_numel(&val->shape); k++) {
      int64_t i = (int64_t)(val->offset / sizeof(double)) + k;
      double gi = gr[i] * factor, wd = dec ? 0.05 : 0;
      /* first step from zero state: sgd's buffer is g; adamw's step is lr g / (|g| + eps) */
      double want = adam ? w0[i] * (1 - 0.1 * wd) - 0.1 * gi / (fabs(gi) + 1e-8) : w0[i] - 0.1 * (gi + wd * w0[i]);
      if (fabs(w1[i] - want) > 1e-12 * fmax(1, fabs(want)))
        fail_msg("%s %s[%lld]: %.17g, want %.17g (decay %d, clip factor %g; seed %llu)", opt, val->name, (long long)k,
                 w1[i], want, dec, factor, (unsigned long long)seed);
      decayed += dec, plain += !dec;
    }
  }
  assert_int_equal(decayed, HID * F + C * HID);
  assert_int_equal(plain, HID + C);
  if (max_norm > 0) assert_true(factor < 1); /* the limit below was small enough to clip */
  print_message("%s: gradient norm %.6g, clip factor %.6g, %d decayed and %d plain parameters checked\n", opt, norm,
                factor, decayed, plain);
  free(w0);
  free(gr);
  free(w1);
  stoke_exec_free(x);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

static void test_sgd_groups(void **state) { check_step(STOKE_OP_SGD, 0); }
static void test_sgd_groups_clipped(void **state) { check_step(STOKE_OP_SGD, 0.05); }
static void test_adamw_groups_clipped(void **state) { check_step(STOKE_OP_ADAMW, 0.05); }

/* An optimizer nobody registered is an error naming the registered ones. */
static void test_unknown_optimizer(void **state) {
  stoke_graph *g = mlp();
  static const char *engines[] = {"cpu"};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .optimizer = "lamb", .training = 1};
  stoke_plan *p = NULL;
  stoke_err *e = stoke_compile(g, &o, &p);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "unknown optimizer 'lamb' (registered: sgd, adamw)"));
  stoke_err_free(e);
  stoke_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_groups),
      cmocka_unit_test(test_sgd_groups_clipped),
      cmocka_unit_test(test_adamw_groups_clipped),
      cmocka_unit_test(test_unknown_optimizer),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
