/* tests/unit/autocast_test.c: a precision policy's fp32_ops on the cpu
 * backend: an f64 residual MLP whose linears and loss are kept in f32 gets
 * an autocast node before each of their f64 inputs (weights and biases
 * too) and after each output others read, runs those nodes on f32 kernels,
 * and gives the f64 graph's loss and parameter gradients to f32 precision
 * (not bit for bit: the f32 is real), on fresh random weights and data;
 * and the policy errors (an unknown op, compute_dtype != param_dtype). */
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

static int setup(void **state) { return cpu_fixture_setup("autocast_test"); }

/* x -> fc1 -> relu -> h; (h + fc2(h)) -> fc3 -> loss. */
static stoke_graph *mlp(void) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, w[3], bias[3], a1, h, a2, s, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {NB, F}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {NB}}, STOKE_I32, &y));
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -0.5, 0.5};
  int64_t dims[3][2] = {{HID, F}, {HID, HID}, {C, HID}};
  for (int l = 0; l < 3; l++) {
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "fc%d.weight", l + 1);
    snprintf(bn, sizeof bn, "fc%d.bias", l + 1);
    OK(b.param(g, wn, &(stoke_shape){2, {dims[l][0], dims[l][1]}}, init, &w[l]));
    OK(b.param(g, bn, &(stoke_shape){1, {dims[l][0]}}, init, &bias[l]));
  }
  OK(b.node(g, STOKE_OP_LINEAR, "fc1", (int[]){x, w[0], bias[0]}, 3, "", &a1, 1));
  OK(b.node(g, STOKE_OP_RELU, "act1", &a1, 1, "", &h, 1));
  OK(b.node(g, STOKE_OP_LINEAR, "fc2", (int[]){h, w[1], bias[1]}, 3, "", &a2, 1));
  OK(b.node(g, STOKE_OP_ADD, "res", (int[]){h, a2}, 2, "", &s, 1));
  OK(b.node(g, STOKE_OP_LINEAR, "fc3", (int[]){s, w[2], bias[2]}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  return g;
}

static const stoke_precision_v1 islands = {STOKE_ABI(stoke_precision_v1), .name = "f64_f32islands",
                                           .param_dtype = STOKE_F64, .compute_dtype = STOKE_F64,
                                           .master_dtype = STOKE_F64, .fp32_ops = "linear, softmax_ce"};

/* g compiled for training on the cpu with `p` (NULL: none), run once on
 * the batch of `bseed`: the loss and a copy of the gradient buffer. */
static double run(stoke_graph *g, const stoke_precision_v1 *p, uint64_t bseed, double **grads, size_t *bytes,
                  stoke_plan **plan) {
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .optimizer = "sgd",
                       .training = 1, .precision = p};
  stoke_exec *x;
  OK(stoke_compile(g, &o, plan));
  OK(stoke_exec_new(*plan, cpu, cpu_self, seed, &x));
  cpu_random_batch(x, bseed, NB * F, NB, C);
  double loss = cpu_loss(x);
  *bytes = (*plan)->bytes[STOKE_BUF_GRADS];
  *grads = malloc(*bytes);
  memcpy(*grads, stoke_exec_buffer(x, STOKE_BUF_GRADS), *bytes);
  stoke_exec_free(x);
  return loss;
}

static void test_islands_structure_and_values(void **state) {
  stoke_graph *g64 = mlp(), *gis = mlp();
  stoke_plan *p64, *pis;
  double *gr64, *gris;
  size_t b64, bis;
  double l64 = run(g64, NULL, seed + 1, &gr64, &b64, &p64);
  double lis = run(gis, &islands, seed + 1, &gris, &bis, &pis);
  /* every linear and the loss run on f32 kernels; the casts in: x, h (for
   * fc2; res adds in f64), s and the 6 parameters; out: fc1, fc2, fc3 (the
   * logits, which the loss then reads as they are, in f32) and the loss */
  int casts = 0, f32_nodes = 0;
  for (int i = 0; i < gis->n_fwd; i++) {
    const stoke_gnode *n = &gis->nodes[i];
    casts += !strcmp(n->n.op, STOKE_OP_AUTOCAST);
    if (!strcmp(n->n.op, STOKE_OP_LINEAR) || !strcmp(n->n.op, STOKE_OP_SOFTMAX_CE)) {
      f32_nodes++;
      assert_int_equal(n->kernel->dtype, STOKE_F32);
      for (int k = 0; k < n->n_in; k++)
        if (gis->values[n->in[k]].dtype != STOKE_I32) assert_int_equal(gis->values[n->in[k]].dtype, STOKE_F32);
    }
  }
  assert_int_equal(f32_nodes, 4);
  assert_int_equal(casts, 3 + 6 + 4); /* in: x, h, s, 3 weights and 3 biases; out: 3 linears, the loss */
  assert_int_equal(gis->values[gis->loss].dtype, STOKE_F64);
  assert_int_equal(gis->values[gis->logits].dtype, STOKE_F64);
  /* the same parameters and flat buffers, the f64 graph's values to f32 precision */
  assert_int_equal(b64, bis);
  double num = 0, den = 0;
  for (size_t i = 0; i < b64 / sizeof(double); i++) {
    num += (gris[i] - gr64[i]) * (gris[i] - gr64[i]);
    den += gr64[i] * gr64[i];
  }
  double rel = sqrt(num / den), lrel = fabs(lis - l64) / fabs(l64);
  print_message("loss f64 %.17g, with f32 islands %.17g (rel %.2g); gradients rel. error %.2g; %d casts\n", l64, lis,
                lrel, rel, casts);
  assert_true(lrel < 1e-5 && rel < 1e-4);
  assert_true(lrel > 0 || rel > 0); /* f32 arithmetic happened */
  free(gr64);
  free(gris);
  stoke_plan_free(p64);
  stoke_plan_free(pis);
  stoke_graph_free(g64);
  stoke_graph_free(gis);
}

static void expect_compile_error(const stoke_precision_v1 *p, const char *text) {
  stoke_graph *g = mlp();
  static const char *engines[] = {"cpu"};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .optimizer = "sgd", .training = 1, .precision = p};
  stoke_plan *plan = NULL;
  stoke_err *e = stoke_compile(g, &o, &plan);
  assert_non_null(e);
  if (!strstr(e->msg, text)) fail_msg("expected \"%s\" in:\n%s", text, e->msg);
  stoke_err_free(e);
  stoke_graph_free(g);
}

static void test_policy_errors(void **state) {
  stoke_precision_v1 p = islands;
  p.fp32_ops = "linear, batchnorm";
  expect_compile_error(&p, "precision 'f64_f32islands': fp32_ops names 'batchnorm', which is not an op type");
  p = islands;
  p.compute_dtype = STOKE_F32;
  expect_compile_error(&p, "compute_dtype f32 differs from param_dtype f64");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_islands_structure_and_values),
      cmocka_unit_test(test_policy_errors),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
