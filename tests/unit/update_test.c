/* tests/unit/update_test.c: the update through the executor on the cpu
 * backend, as a run does it: weight decay by parameter group (the planned
 * ranges are exactly the >= 2-D parameters) and clipping by the global
 * gradient norm (grad_norm before the optimizer), for sgd and adamw, on an
 * f64 MLP with fresh random weights and data; every parameter element is
 * checked against the update computed here from the gradient buffer.
 * Then the executor's [run] detect_anomaly checks on the same MLP: a NaN
 * or inf put in the batch, a weight, the loss's seed or made by the
 * update is named where it starts, and the checks change no result. */
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

/* ------------------------------------------------------ detect_anomaly */

typedef struct anom {
  stoke_graph *g;
  stoke_plan *p;
  stoke_exec *x;
} anom;

/* The MLP compiled with sgd, a fresh random batch written, the checks on. */
static anom anom_open(int skip_backward) {
  anom a = {.g = mlp()};
  a.p = cpu_compile(a.g, STOKE_OP_SGD, 0);
  OK(stoke_exec_new(a.p, cpu, cpu_self, seed, &a.x));
  cpu_random_batch(a.x, seed + 1, NB * F, NB, C);
  OK(stoke_exec_anomaly(a.x, 1, skip_backward));
  return a;
}

static void anom_close(anom *a) {
  stoke_exec_free(a->x);
  stoke_plan_free(a->p);
  stoke_graph_free(a->g);
}

/* the f64 element `k` of value `v` in its buffer */
static double *anom_at(anom *a, int v, int64_t k) {
  const stoke_value *val = &a->g->values[v];
  return (double *)((char *)stoke_exec_buffer(a->x, val->buffer) + val->offset) + k;
}

static int value_named(const stoke_graph *g, const char *name) {
  for (int v = 0; v < g->n_values; v++)
    if (!strcmp(g->values[v].name, name)) return v;
  fail_msg("no value '%s'", name);
  return -1;
}

/* The error must be the anomaly check's and hold every one of `subs`. */
static void expect_anomaly(stoke_err *e, const char *const *subs, int n) {
  if (!e) fail_msg("no error (seed %llu)", (unsigned long long)seed);
  print_message("%s\n", e->msg);
  assert_int_equal(e->code, STOKE_E_NUMERIC);
  for (int i = 0; i < n; i++)
    if (!strstr(e->msg, subs[i])) fail_msg("the message lacks \"%s\" (seed %llu)", subs[i], (unsigned long long)seed);
  stoke_err_free(e);
}

static const stoke_opt_args_v1 anom_sgd = {.lr = 0.1, .grad_scale = 1, .step = 1, .momentum = 0.9};

/* Checked and unchecked, two steps give the same parameters, bit for bit:
 * the checks only read. */
static void test_anomaly_changes_nothing(void **state) {
  anom a = anom_open(0), b = anom_open(0);
  OK(stoke_exec_anomaly(b.x, 0, 0));
  for (int step = 0; step < 2; step++) {
    OK(stoke_exec_forward_backward(a.x, 1, 5));
    OK(stoke_exec_update(a.x, &anom_sgd));
    OK(stoke_exec_forward_backward(b.x, 1, 5));
    OK(stoke_exec_update(b.x, &anom_sgd));
  }
  size_t bytes = a.p->bytes[STOKE_BUF_PARAMS];
  assert_memory_equal(stoke_exec_buffer(a.x, STOKE_BUF_PARAMS), stoke_exec_buffer(b.x, STOKE_BUF_PARAMS), bytes);
  anom_close(&a);
  anom_close(&b);
}

/* A NaN in the batch is the data's, found before any node runs. */
static void test_anomaly_in_batch(void **state) {
  anom a = anom_open(0);
  stoke_rng r = stoke_rng_seed(seed + 2);
  int64_t k = (int64_t)stoke_rng_below(&r, NB * F);
  ((double *)stoke_exec_input(a.x))[k] = NAN;
  char at[64];
  snprintf(at, sizeof at, "(the first: element %lld of the batch, NaN)", (long long)k);
  expect_anomaly(stoke_exec_forward_backward(a.x, 1, 5), (const char *[]){"the batch itself ('input') holds 1 NaN", at}, 2);
  anom_close(&a);
}

/* A NaN in fc2.weight[c][j] makes column c of fc2's output NaN in every
 * row (0 x NaN is NaN): fc2's forward is named, with NB values, the first
 * at element c; fc1 and act1 before it are finite. */
static void test_anomaly_in_forward(void **state) {
  anom a = anom_open(0);
  stoke_rng r = stoke_rng_seed(seed + 3);
  int64_t c = (int64_t)stoke_rng_below(&r, C), j = (int64_t)stoke_rng_below(&r, HID);
  *anom_at(&a, value_named(a.g, "fc2.weight"), c * HID + j) = seed % 2 ? INFINITY : NAN;
  char what[128], at[64];
  snprintf(what, sizeof what, "wrote %d NaN or inf values into its output 0", NB);
  snprintf(at, sizeof at, "(the first: element %lld, ", (long long)c);
  expect_anomaly(stoke_exec_forward_backward(a.x, 1, 5),
                 (const char *[]){"node 'fc2' (linear forward on cpu)", what, at, "[8, 3] f64"}, 4);
  anom_close(&a);
}

/* The loss's seed (d loss / d loss, 1) made NaN: the forward is finite,
 * and the loss's backward is the first node to write a NaN; with the
 * backward left to a loss scaler, the pass goes through, and the update
 * that then makes the weights NaN is named as such. */
static void test_anomaly_in_backward(void **state) {
  for (int skip = 0; skip < 2; skip++) {
    anom a = anom_open(skip);
    *anom_at(&a, a.g->seed, 0) = NAN;
    stoke_err *e = stoke_exec_forward_backward(a.x, 1, 5);
    if (!skip) {
      expect_anomaly(e, (const char *[]){"node 'loss.bwd' (softmax_ce backward on cpu)",
                                         "into the gradient of its input 0, 'fc2.grad' [8, 3] f64"}, 2);
    } else {
      OK(e);
      expect_anomaly(stoke_exec_update(a.x, &anom_sgd),
                     (const char *[]){"the optimizer update (sgd on cpu) made parameter", "left to the loss scaler"}, 2);
    }
    anom_close(&a);
  }
}

/* A finite step that overflows the weights: inputs near 1e150 give
 * gradients near 1e149 (finite in f64), and a learning rate of 1e200 an
 * update of 1e349: inf. The update is named, not a node. */
static void test_anomaly_in_update(void **state) {
  anom a = anom_open(0);
  double *in = stoke_exec_input(a.x);
  for (int i = 0; i < NB * F; i++) in[i] = (1 + fabs(in[i])) * 1e150;
  OK(stoke_exec_forward_backward(a.x, 1, 5));
  stoke_opt_args_v1 o = anom_sgd;
  o.lr = 1e200;
  expect_anomaly(stoke_exec_update(a.x, &o),
                 (const char *[]){"the optimizer update (sgd on cpu) made parameter 'fc1.weight'", "from finite gradients"}, 2);
  anom_close(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_groups),
      cmocka_unit_test(test_sgd_groups_clipped),
      cmocka_unit_test(test_adamw_groups_clipped),
      cmocka_unit_test(test_unknown_optimizer),
      cmocka_unit_test(test_anomaly_changes_nothing),
      cmocka_unit_test(test_anomaly_in_batch),
      cmocka_unit_test(test_anomaly_in_forward),
      cmocka_unit_test(test_anomaly_in_backward),
      cmocka_unit_test(test_anomaly_in_update),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
