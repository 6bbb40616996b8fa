/* tests/unit/graph_test.c: the graph compiler and executor: backward
 * derivation (with a value used twice), kernel resolution and its errors,
 * the memory plan (parameters one buffer, no two live buffers overlap),
 * and a whole-graph gradient check in double against finite differences. */
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

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "stoke/rng.h"
#include "tests/common/cpu_fixture.h"

static int setup(void **state) { return cpu_fixture_setup("graph_test"); }

/* x[N,F] -> fc1 -> relu -> h; h -> fc2 -> relu -> r; (h + r) -> fc3 -> loss.
 * h is used twice, so its gradient is a sum the compiler must insert. */
static stoke_graph *residual_mlp(stoke_dtype dtype, int64_t n, int64_t f, int64_t hid, int64_t c) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, dtype, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, w1, b1, w2, b2, w3, b3, a1, h, a2, r, s, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {n, f}}, dtype, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {n}}, STOKE_I32, &y));
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -0.5, 0.5};
  OK(b.param(g, "fc1.weight", &(stoke_shape){2, {hid, f}}, init, &w1));
  OK(b.param(g, "fc1.bias", &(stoke_shape){1, {hid}}, init, &b1));
  OK(b.param(g, "fc2.weight", &(stoke_shape){2, {hid, hid}}, init, &w2));
  OK(b.param(g, "fc2.bias", &(stoke_shape){1, {hid}}, init, &b2));
  OK(b.param(g, "fc3.weight", &(stoke_shape){2, {c, hid}}, init, &w3));
  OK(b.param(g, "fc3.bias", &(stoke_shape){1, {c}}, init, &b3));
  OK(b.node(g, STOKE_OP_LINEAR, "fc1", (int[]){x, w1, b1}, 3, "", &a1, 1));
  OK(b.node(g, STOKE_OP_RELU, "act1", &a1, 1, "", &h, 1));
  OK(b.node(g, STOKE_OP_LINEAR, "fc2", (int[]){h, w2, b2}, 3, "", &a2, 1));
  OK(b.node(g, STOKE_OP_RELU, "act2", &a2, 1, "", &r, 1));
  OK(b.node(g, STOKE_OP_ADD, "res", (int[]){h, r}, 2, "", &s, 1));
  OK(b.node(g, STOKE_OP_LINEAR, "fc3", (int[]){s, w3, b3}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, "label_smoothing=0.1"));
  return g;
}

static void test_backward_derivation(void **state) {
  stoke_graph *g = residual_mlp(STOKE_F32, 8, 5, 6, 3);
  stoke_plan *p = cpu_compile(g, "sgd", 0);
  int n_bwd = 0, n_sum = 0;
  for (int i = g->n_fwd; i < g->n_nodes; i++) {
    n_bwd += g->nodes[i].pass == STOKE_BWD;
    n_sum += g->nodes[i].pass == STOKE_FWD && !strcmp(g->nodes[i].n.op, STOKE_OP_ADD);
    assert_non_null(g->nodes[i].kernel);
  }
  /* every forward node, loss included, but the add: its inputs take the
   * output's gradient as theirs */
  assert_int_equal(n_bwd, 6);
  assert_int_equal(n_sum, 1); /* h feeds fc2 and res */
  int res = -1;
  for (int i = 0; i < g->n_fwd; i++)
    if (!strcmp(g->nodes[i].n.name, "res")) res = i;
  assert_true(res >= 0);
  int dy = g->values[g->nodes[res].out[0]].grad, r = g->nodes[res].in[1];
  assert_int_equal(g->values[r].grad, dy); /* r = act2's output: dy itself */
  for (int v = 0; v < g->n_values; v++)
    if (g->values[v].kind == STOKE_VAL_PARAM) {
      assert_true(g->values[v].grad >= 0);
      assert_int_equal(g->values[g->values[v].grad].kind, STOKE_VAL_PARAM_GRAD);
    }
  /* the input and the labels get no gradient */
  assert_int_equal(g->values[g->input].grad, -1);
  assert_int_equal(g->values[g->label].grad, -1);
  assert_true(p->train_flops > 2.9 * p->fwd_flops && p->train_flops < 3.1 * p->fwd_flops);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

static void test_memory_plan(void **state) {
  stoke_graph *g = residual_mlp(STOKE_F32, 16, 7, 9, 4);
  stoke_plan *p = cpu_compile(g, "adamw", 0);
  size_t param_sum = 0;
  int64_t n_params = 0;
  for (int v = 0; v < g->n_values; v++) {
    stoke_value *a = &g->values[v];
    if (a->kind == STOKE_VAL_PARAM) {
      assert_int_equal(a->buffer, STOKE_BUF_PARAMS);
      assert_true(a->offset + a->bytes <= p->bytes[STOKE_BUF_PARAMS]);
      param_sum += a->bytes;
      n_params += stoke_numel(&a->shape);
      stoke_value *gr = &g->values[a->grad];
      assert_int_equal(gr->buffer, STOKE_BUF_GRADS);
      assert_int_equal(gr->offset, a->offset);
    }
    if (a->buffer == STOKE_BUF_ARENA) assert_true(a->offset + a->bytes <= p->bytes[STOKE_BUF_ARENA]);
  }
  /* one flat buffer, packed: the parameters fill it exactly */
  assert_int_equal(param_sum, p->bytes[STOKE_BUF_PARAMS]);
  assert_int_equal(n_params, p->n_params);
  assert_int_equal(p->opt_state_bytes, 2 * p->bytes[STOKE_BUF_PARAMS]);
  /* no two values of one buffer overlap in memory while both are live */
  int checked = 0;
  for (int i = 0; i < g->n_values; i++)
    for (int j = i + 1; j < g->n_values; j++) {
      stoke_value *a = &g->values[i], *b = &g->values[j];
      if (a->buffer != b->buffer) continue;
      int live = !(a->last < b->first || b->last < a->first);
      int overlap = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
      if (a->buffer != STOKE_BUF_ARENA) live = 1; /* flat buffers: never overlap */
      if (stoke_alias_root(g, i, NULL) == stoke_alias_root(g, j, NULL)) live = 0; /* one memory by design */
      if (live && overlap)
        fail_msg("'%s' [%zu, +%zu) live %d..%d overlaps '%s' [%zu, +%zu) live %d..%d", a->name,
                 a->offset, a->bytes, a->first, a->last, b->name, b->offset, b->bytes, b->first,
                 b->last);
      checked++;
    }
  assert_true(checked > 100);
  /* reuse happened: the arena is smaller than the sum of its values */
  size_t arena_sum = 0;
  for (int v = 0; v < g->n_values; v++)
    if (g->values[v].buffer == STOKE_BUF_ARENA) arena_sum += g->values[v].bytes;
  assert_true(p->bytes[STOKE_BUF_ARENA] < arena_sum);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

static void test_whole_graph_gradient(void **state) {
  const int64_t n = 6, f = 4, hid = 5, c = 3;
  stoke_graph *g = residual_mlp(STOKE_F64, n, f, hid, c);
  stoke_plan *p = cpu_compile(g, NULL, 0);
  stoke_exec *x;
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &x));
  /* poison the whole arena, then write the batch and the loss seed: a
   * kernel reading memory nothing wrote gives NaN and fails */
  double *arena = stoke_exec_buffer(x, STOKE_BUF_ARENA);
  for (size_t i = 0; i < p->bytes[STOKE_BUF_ARENA] / sizeof(double); i++) arena[i] = NAN;
  *(double *)stoke_exec_tensor(x, g->seed).data = 1.0;
  cpu_random_batch(x, seed, n * f, n, c);
  int compared;
  double worst = cpu_check_gradients(x, 1e-5, &compared);
  print_message("whole-graph gradient: %d parameters, worst relative error %.3g\n", compared, worst);
  assert_int_equal(compared, (int)p->n_params);
  stoke_exec_free(x);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

/* x -> fc1 -> gelu(tanh) -> fc2 -> relu -> fc3 -> gelu(none) -> fc4 -> loss:
 * with fuse, fc1 and fc2 become linear_act (erf gelu is not fused). */
static stoke_graph *act_mlp(stoke_dtype dtype, int64_t n, int64_t f, int64_t hid, int64_t c) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, dtype, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, v;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {n, f}}, dtype, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {n}}, STOKE_I32, &y));
  static const char *acts[][2] = {{STOKE_OP_GELU, "approximate=tanh"}, {STOKE_OP_RELU, ""}, {STOKE_OP_GELU, ""}};
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -0.5, 0.5};
  v = x;
  for (int l = 0; l < 4; l++) {
    int64_t in = l ? hid : f, out = l == 3 ? c : hid;
    char wn[32], bn[32], fc[32], an[32];
    snprintf(wn, sizeof wn, "fc%d.weight", l + 1);
    snprintf(bn, sizeof bn, "fc%d.bias", l + 1);
    snprintf(fc, sizeof fc, "fc%d", l + 1);
    snprintf(an, sizeof an, "act%d", l + 1);
    int w, bias, z;
    OK(b.param(g, wn, &(stoke_shape){2, {out, in}}, init, &w));
    OK(b.param(g, bn, &(stoke_shape){1, {out}}, init, &bias));
    OK(b.node(g, STOKE_OP_LINEAR, fc, (int[]){v, w, bias}, 3, "", &z, 1));
    if (l < 3) OK(b.node(g, acts[l][0], an, &z, 1, acts[l][1], &v, 1));
    else v = z;
  }
  OK(stoke_graph_loss(g, v, ""));
  return g;
}

/* One forward and backward of g (f64) with or without fusion, the arena
 * poisoned first (an aux freed too early reads NaN): the loss, and the
 * flat gradients in *grads (malloc'd). */
static double fused_run(stoke_graph *g, int fuse, int64_t n, int64_t f, int64_t c, double **grads, size_t *count,
                        int *n_act, int *n_dact) {
  stoke_plan *p = cpu_compile(g, NULL, fuse);
  *n_act = *n_dact = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    *n_act += !strcmp(g->nodes[i].n.op, STOKE_OP_LINEAR_ACT);
    *n_dact += !strcmp(g->nodes[i].n.op, STOKE_OP_LINEAR_DACT);
  }
  stoke_exec *x;
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &x));
  double *arena = stoke_exec_buffer(x, STOKE_BUF_ARENA);
  for (size_t i = 0; i < p->bytes[STOKE_BUF_ARENA] / sizeof(double); i++) arena[i] = NAN;
  *(double *)stoke_exec_tensor(x, g->seed).data = 1.0;
  cpu_random_batch(x, seed + 1, n * f, n, c);
  double loss = cpu_loss(x);
  *count = p->bytes[STOKE_BUF_GRADS] / sizeof(double);
  *grads = malloc(p->bytes[STOKE_BUF_GRADS]);
  memcpy(*grads, stoke_exec_buffer(x, STOKE_BUF_GRADS), p->bytes[STOKE_BUF_GRADS]);
  stoke_exec_free(x);
  stoke_plan_free(p);
  return loss;
}

/* fuse = true gives the loss and gradients of the unfused graph (the CPU's
 * fused kernels do the same arithmetic), with the expected nodes: in
 * act_mlp two linear_act and two linear_dact; in residual_mlp, where h is
 * read twice and r feeds an add, no linear_act (r's relu becomes
 * linear_relu instead). */
static void test_fused_activations(void **state) {
  const int64_t n = 9, f = 7, hid = 11, c = 5; /* 11 outputs: the bitmask's padding bits */
  for (int which = 0; which < 2; which++) {
    double *g0, *g1;
    size_t c0, c1;
    int a0, d0, a1, d1;
    stoke_graph *g = which ? residual_mlp(STOKE_F64, n, f, hid, c) : act_mlp(STOKE_F64, n, f, hid, c);
    double l0 = fused_run(g, 0, n, f, c, &g0, &c0, &a0, &d0);
    stoke_graph_free(g);
    g = which ? residual_mlp(STOKE_F64, n, f, hid, c) : act_mlp(STOKE_F64, n, f, hid, c);
    double l1 = fused_run(g, 1, n, f, c, &g1, &c1, &a1, &d1);
    stoke_graph_free(g);
    print_message("%s: loss %.17g unfused, %.17g fused; %d linear_act, %d linear_dact\n",
                  which ? "residual_mlp" : "act_mlp", l0, l1, a1, d1);
    assert_int_equal(a0 + d0, 0);
    assert_int_equal(a1, which ? 0 : 2);
    assert_int_equal(d1, which ? 0 : 2);
    assert_int_equal(c0, c1);
    assert_true(isfinite(l0) && fabs(l0 - l1) <= 1e-12 * fabs(l0));
    for (size_t i = 0; i < c0; i++)
      if (!(fabs(g0[i] - g1[i]) <= 1e-12 * fmax(1, fabs(g0[i]))))
        fail_msg("gradient %zu: %.17g unfused, %.17g fused (seed %llu)", i, g0[i], g1[i], (unsigned long long)seed);
    free(g0);
    free(g1);
  }
}

/* x[N,4] -> matmul with P = W W^T -> loss: the node making P reads parameter W twice (torch's w @ w.T). The
 * compiler reads it the second time through a reshape (core/graph.c repeated_params): the gradient of W is the
 * sum of both uses (central differences), and equals the graph that writes the reshape itself, bit for bit. */
static stoke_graph *gram(int via_reshape) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, w, w2, pm, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {3, 4}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {3}}, STOKE_I32, &y));
  OK(b.param(g, "w", &(stoke_shape){2, {4, 4}}, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &w));
  w2 = w;
  if (via_reshape) OK(b.node(g, STOKE_OP_RESHAPE, "w_again", &w, 1, "shape=4x4", &w2, 1));
  OK(b.node(g, STOKE_OP_MATMUL, "gram", (int[]){w, w2}, 2, "", &pm, 1));
  OK(b.node(g, STOKE_OP_MATMUL, "head", (int[]){x, pm}, 2, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  return g;
}

static void test_parameter_twice_in_one_node(void **state) {
  stoke_graph *g[2];
  stoke_plan *p[2];
  stoke_exec *x[2];
  double *grad[2];
  for (int i = 0; i < 2; i++) {
    g[i] = gram(i);
    p[i] = cpu_compile(g[i], NULL, 0);
    OK(stoke_exec_new(p[i], cpu, cpu_self, seed, &x[i]));
    *(double *)stoke_exec_tensor(x[i], g[i]->seed).data = 1.0;
    cpu_random_batch(x[i], seed, 3 * 4, 3, 4);
    grad[i] = stoke_exec_buffer(x[i], STOKE_BUF_GRADS);
  }
  int compared;
  double worst = cpu_check_gradients(x[0], 1e-6, &compared);
  print_message("W W^T: %d gradients, worst relative error %.3g against central differences\n", compared, worst);
  assert_int_equal(compared, 16);
  cpu_loss(x[1]);
  cpu_loss(x[0]);
  assert_memory_equal(grad[0], grad[1], 16 * sizeof(double));
  for (int i = 0; i < 2; i++) {
    stoke_exec_free(x[i]);
    stoke_plan_free(p[i]);
    stoke_graph_free(g[i]);
  }
}

static void test_errors(void **state) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F32, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, w, bias, out;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {4, 3}}, STOKE_F32, &x));
  /* unknown op: names it and lists the registered ones */
  stoke_err *e = b.node(g, "reluu", "a", &x, 1, "", &out, 1);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_NOT_FOUND);
  assert_non_null(strstr(e->msg, "node 'a': unknown op 'reluu'"));
  assert_non_null(strstr(e->msg, "relu"));
  stoke_err_free(e);
  /* a wrong input count and a value of no graph: the node named too */
  e = b.node(g, STOKE_OP_RELU, "two", (int[]){x, x}, 2, "", &out, 1);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "node 'two': op 'relu' takes 1 inputs"));
  stoke_err_free(e);
  e = b.node(g, STOKE_OP_RELU, "stray", (int[]){999}, 1, "", &out, 1);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "node 'stray' (relu): input 0 is not a value of this graph"));
  stoke_err_free(e);
  /* shape mismatch: names the node */
  OK(b.param(g, "w", &(stoke_shape){2, {2, 5}}, (stoke_init_v1){0}, &w));
  OK(b.param(g, "b", &(stoke_shape){1, {2}}, (stoke_init_v1){0}, &bias));
  e = b.node(g, STOKE_OP_LINEAR, "fc", (int[]){x, w, bias}, 3, "", &out, 1);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "linear 'fc'"));
  stoke_err_free(e);
  /* unknown attribute */
  e = b.node(g, STOKE_OP_RELU, "r", &x, 1, "alpha=2", &out, 1);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "unknown attribute 'alpha'"));
  stoke_err_free(e);
  /* no kernel in the given backends: names node, op and the list */
  OK(b.node(g, STOKE_OP_RELU, "r", &x, 1, "", &out, 1));
  static const char *engines[] = {"cudnn"};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1};
  stoke_plan *p = NULL;
  e = stoke_compile(g, &o, &p);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_UNSUPPORTED);
  assert_non_null(strstr(e->msg, "node 'r': no kernel for op 'relu'"));
  assert_non_null(strstr(e->msg, "[cudnn]"));
  /* and the backends that have one (issue 18: the cpu plugin is loaded) */
  assert_non_null(strstr(e->msg, "these backends have one: cpu"));
  stoke_err_free(e);
  stoke_graph_free(g);
  OK(stoke_graph_new(reg, STOKE_F32, STOKE_LAYOUT_ANY, &g));
  b = stoke_graph_builder(g);
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {4, 3}}, STOKE_F32, &x));
  /* an op's attributes in parentheses, as an INI key names it; given twice: refused */
  OK(b.node(g, "dropout(p=0.25)", "d", &x, 1, "", &out, 1));
  assert_true(g->nodes[g->n_nodes - 1].n.attrs[STOKE_DROPOUT_P].f == 0.25);
  e = b.node(g, "dropout(p=0.25)", "d2", &x, 1, "p=0.5", &out, 1);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "attribute 'p' given twice"));
  stoke_err_free(e);
  e = b.node(g, "dropout(p=0.25", "d3", &x, 1, "", &out, 1);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "name(attr=value, ...)"));
  stoke_err_free(e);
  stoke_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backward_derivation),
      cmocka_unit_test(test_memory_plan),
      cmocka_unit_test(test_whole_graph_gradient),
      cmocka_unit_test(test_fused_activations),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_parameter_twice_in_one_node),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
