/* tests/unit/seq_graph_test.c: the compiler on a transformer in miniature
 * (tokens cut from the input on the device, a tied embedding and output
 * head, learned positions, layer norms with the residual add fused,
 * causal attention, GELU MLP): its gradient against finite differences in
 * double, the memory it shares (views, the in-place dlogits, one gradient
 * for both inputs of add_layer_norm), the tied weight's two gradients
 * summed under accumulation, the errors of weight tying, and run.fuse's
 * linear fusions on it (the GELU in c_fc's product, c_proj's and
 * mlp_proj's biases moved into the add_bias_layer_norms after them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "tests/common/cpu_fixture.h"

enum { B = 2, T = 4, C = 6, H = 2, V = 7 };

static int setup(void **state) { return cpu_fixture_setup("seq_graph_test"); }

typedef struct lm {
  stoke_graph *g;
  int tokens_in, logits, targets, wte, emb, qkv3, ln2_node;
} lm;

static int node_out(stoke_graph *g, const char *op, const char *name, const int *in, int n_in, const char *attrs) {
  int out[4];
  stoke_builder_v1 b = stoke_graph_builder(g);
  const stoke_op_type_v1 *t = stoke_find_op(reg, op);
  OK(b.node(g, op, name, in, n_in, attrs, out, t->n_outputs ? t->n_outputs : 1));
  return out[0];
}

/* input[B, T + 1] -> tokens [B, T], targets [B T]; one pre-LN block. */
static lm build_lm(void) {
  lm m = {0};
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_LAYOUT_ANY, &m.g));
  stoke_graph *g = m.g;
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, lab, wpe, l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, mw, mb, lfw, lfb;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {B, T + 1}}, STOKE_I32, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {B}}, STOKE_I32, &lab));
  stoke_init_v1 nrm = {STOKE_INIT_NORMAL, 0, 0.5}, one = {STOKE_INIT_UNIFORM, 0.8, 1.2}, small = {STOKE_INIT_UNIFORM, -0.2, 0.2};
  OK(b.param(g, "wte", &(stoke_shape){2, {V, C}}, nrm, &m.wte));
  OK(b.param(g, "wpe", &(stoke_shape){2, {T + 1, C}}, nrm, &wpe));
  OK(b.param(g, "ln_1.weight", &(stoke_shape){1, {C}}, one, &l1w));
  OK(b.param(g, "ln_1.bias", &(stoke_shape){1, {C}}, small, &l1b));
  OK(b.param(g, "attn.weight", &(stoke_shape){2, {3 * C, C}}, nrm, &aw));
  OK(b.param(g, "attn.bias", &(stoke_shape){1, {3 * C}}, small, &ab));
  OK(b.param(g, "proj.weight", &(stoke_shape){2, {C, C}}, nrm, &pw));
  OK(b.param(g, "proj.bias", &(stoke_shape){1, {C}}, small, &pb));
  OK(b.param(g, "ln_2.weight", &(stoke_shape){1, {C}}, one, &l2w));
  OK(b.param(g, "ln_2.bias", &(stoke_shape){1, {C}}, small, &l2b));
  OK(b.param(g, "fc.weight", &(stoke_shape){2, {2 * C, C}}, nrm, &fw));
  OK(b.param(g, "fc.bias", &(stoke_shape){1, {2 * C}}, small, &fb));
  OK(b.param(g, "mlp.weight", &(stoke_shape){2, {C, 2 * C}}, nrm, &mw));
  OK(b.param(g, "mlp.bias", &(stoke_shape){1, {C}}, small, &mb));
  OK(b.param(g, "ln_f.weight", &(stoke_shape){1, {C}}, one, &lfw));
  OK(b.param(g, "ln_f.bias", &(stoke_shape){1, {C}}, small, &lfb));
  OK(b.param_alias(g, m.wte, "head.weight"));
  m.tokens_in = node_out(g, STOKE_OP_SLICE, "tokens", &x, 1, "dim=1, start=0, length=4");
  int tg = node_out(g, STOKE_OP_SLICE, "next", &x, 1, "dim=1, start=1, length=4");
  m.targets = node_out(g, STOKE_OP_RESHAPE, "targets", &tg, 1, "shape=-1");
  m.emb = node_out(g, STOKE_OP_EMBEDDING, "wte", (int[]){m.wte, m.tokens_in}, 2, "");
  int pos = node_out(g, STOKE_OP_POSITION_EMBEDDING, "wpe", (int[]){m.emb, wpe}, 2, "");
  int x0 = node_out(g, STOKE_OP_RESHAPE, "flat", &pos, 1, "shape=-1x6");
  int h1 = node_out(g, STOKE_OP_LAYER_NORM, "ln_1", (int[]){x0, l1w, l1b}, 3, "");
  int qkv = node_out(g, STOKE_OP_LINEAR, "c_attn", (int[]){h1, aw, ab}, 3, "");
  m.qkv3 = node_out(g, STOKE_OP_RESHAPE, "qkv", &qkv, 1, "shape=2x4x18");
  int att = node_out(g, STOKE_OP_ATTENTION, "attn", &m.qkv3, 1, "n_head=2");
  int a2 = node_out(g, STOKE_OP_RESHAPE, "attn_flat", &att, 1, "shape=8x6");
  int y = node_out(g, STOKE_OP_LINEAR, "c_proj", (int[]){a2, pw, pb}, 3, "");
  int out[4];
  OK(b.node(g, STOKE_OP_ADD_LAYER_NORM, "ln_2", (int[]){x0, y, l2w, l2b}, 4, "", out, 4));
  m.ln2_node = g->n_nodes - 1;
  int f = node_out(g, STOKE_OP_LINEAR, "c_fc", (int[]){out[1], fw, fb}, 3, "");
  int gl = node_out(g, STOKE_OP_GELU, "gelu", &f, 1, "approximate=tanh");
  int mo = node_out(g, STOKE_OP_LINEAR, "mlp_proj", (int[]){gl, mw, mb}, 3, "");
  int fin[4];
  OK(b.node(g, STOKE_OP_ADD_LAYER_NORM, "ln_f", (int[]){out[0], mo, lfw, lfb}, 4, "", fin, 4));
  m.logits = node_out(g, STOKE_OP_MATMUL, "lm_head", (int[]){fin[1], m.wte}, 2, "");
  OK(stoke_graph_loss_on(g, m.logits, m.targets, ""));
  return m;
}

/* Token windows of B sequences, each id below V. */
static void random_tokens(stoke_exec *x, uint64_t s) {
  stoke_rng r = stoke_rng_seed(s);
  int32_t *in = stoke_exec_input(x);
  for (int i = 0; i < B * (T + 1); i++) in[i] = (int32_t)stoke_rng_below(&r, V);
}

static void test_gradient(void **state) {
  lm m = build_lm();
  stoke_plan *p = cpu_compile(m.g, NULL, 0);
  stoke_exec *x;
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &x));
  double *arena = stoke_exec_buffer(x, STOKE_BUF_ARENA);
  for (size_t i = 0; i < p->bytes[STOKE_BUF_ARENA] / sizeof(double); i++) arena[i] = NAN;
  *(double *)stoke_exec_tensor(x, m.g->seed).data = 1.0;
  random_tokens(x, seed);
  int compared;
  double worst = cpu_check_gradients(x, 1e-5, &compared);
  print_message("transformer block: %d parameters, worst relative error %.3g\n", compared, worst);
  assert_int_equal(compared, (int)p->n_params);
  stoke_exec_free(x);
  stoke_plan_free(p);
  stoke_graph_free(m.g);
}

/* What the compiler shares: reshape outputs on their inputs, the last
 * slice copied (B > 1), dlogits over the logits, one gradient for both
 * inputs of add_layer_norm, the tied weight's gradient written by the
 * head first and added onto by the embedding. */
static void test_memory_sharing(void **state) {
  lm m = build_lm();
  stoke_plan *p = cpu_compile(m.g, "adamw", 0);
  stoke_graph *g = m.g;
  size_t off;
  assert_int_equal(stoke_alias_root(g, m.qkv3, &off), g->nodes[g->values[m.qkv3].producer].in[0]);
  assert_int_equal(off, 0);
  assert_int_equal(g->values[m.tokens_in].alias, -1); /* [B, T + 1] -> [B, T]: not one dense run */
  assert_int_equal(g->values[m.targets].alias, g->nodes[g->values[m.targets].producer].in[0]);
  int dlogits = g->values[m.logits].grad;
  assert_true(dlogits >= 0);
  assert_int_equal(stoke_alias_root(g, dlogits, NULL), stoke_alias_root(g, m.logits, NULL));
  assert_int_equal(g->values[dlogits].offset, g->values[m.logits].offset);
  int shared = 0;
  for (int i = g->n_fwd; i < g->n_nodes; i++)
    if (g->nodes[i].fwd == m.ln2_node) shared = g->nodes[i].din[0] >= 0 && g->nodes[i].din[0] == g->nodes[i].din[1];
  assert_true(shared);
  int writers = 0, accumulating = 0;
  for (int i = g->n_fwd; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].din[k] == g->values[m.wte].grad) {
        writers++;
        accumulating += g->nodes[i].param_accumulate;
        assert_string_equal(g->nodes[i].n.op, accumulating ? STOKE_OP_EMBEDDING : STOKE_OP_MATMUL);
      }
  assert_int_equal(writers, 2);
  assert_int_equal(accumulating, 1);
  stoke_plan_free(p);
  stoke_graph_free(m.g);
}

/* Gradient accumulation over two micro-batches equals the sum of each
 * one's gradient: the head overwrites the tied gradient on the first
 * micro-batch and the embedding adds onto it, on every micro-batch. */
/* A slice or split part is a view only where it starts on a 16-byte
 * boundary (cuDNN and cuBLASLt refuse other pointers at run time): of a
 * dense [6, 3] f64 value, the rows from 2 (48 bytes in) are a view, the
 * rows from 1 (24 bytes) a copy, and so are a split's parts by the same
 * rule; a view of a view adds the offsets. Values and gradients stay right
 * either way (the plain copies: central differences). */
static void test_views_aligned(void **state) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, w, parts[3], logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {6, 3}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {1}}, STOKE_I32, &y));
  OK(b.param(g, "w", &(stoke_shape){2, {3, 3}}, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &w));
  int h = node_out(g, STOKE_OP_MATMUL, "h", (int[]){x, w}, 2, "");
  int from2 = node_out(g, STOKE_OP_SLICE, "from2", &h, 1, "dim=0, start=2, length=4");   /* 48 B: a view */
  int from1 = node_out(g, STOKE_OP_SLICE, "from1", &h, 1, "dim=0, start=1, length=1");   /* 24 B: a copy */
  int inner = node_out(g, STOKE_OP_SLICE, "inner", &from2, 1, "dim=0, start=2, length=1"); /* 48 + 48 B: a view */
  OK(b.node(g, STOKE_OP_SPLIT, "parts", &from2, 1, "dim=0, sizes=1x1x2", parts, 3)); /* 48, 72, 96 B */
  int last = node_out(g, STOKE_OP_SLICE, "last", &parts[2], 1, "dim=0, start=1, length=1"); /* 120 B: a copy */
  int s1 = node_out(g, STOKE_OP_ADD, "s1", (int[]){from1, inner}, 2, "");
  int s2 = node_out(g, STOKE_OP_ADD, "s2", (int[]){parts[0], parts[1]}, 2, "");
  int s3 = node_out(g, STOKE_OP_ADD, "s3", (int[]){s1, s2}, 2, "");
  int s4 = node_out(g, STOKE_OP_ADD, "s4", (int[]){s3, last}, 2, "");
  OK(b.node(g, STOKE_OP_MATMUL, "head", (int[]){s4, w}, 2, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  stoke_plan *p = cpu_compile(g, NULL, 0);
  size_t off;
  assert_int_equal(stoke_alias_root(g, from2, &off), h);
  assert_int_equal(off, 48);
  assert_int_equal(g->values[from1].alias, -1);
  assert_int_equal(stoke_alias_root(g, inner, &off), h);
  assert_int_equal(off, 96);
  assert_int_equal(stoke_alias_root(g, parts[0], &off), h);
  assert_int_equal(off, 48);
  assert_int_equal(g->values[parts[1]].alias, -1); /* 48 + 24 B */
  assert_int_equal(stoke_alias_root(g, parts[2], &off), h);
  assert_int_equal(off, 96);
  assert_int_equal(g->values[last].alias, -1); /* 96 + 24 B */
  stoke_exec *xe;
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &xe));
  *(double *)stoke_exec_tensor(xe, g->seed).data = 1.0;
  stoke_rng r = stoke_rng_seed(seed);
  double *in = stoke_exec_input(xe);
  for (int i = 0; i < 18; i++) in[i] = stoke_rng_normal(&r);
  *(int32_t *)stoke_exec_labels(xe) = 2;
  int compared;
  double worst = cpu_check_gradients(xe, 1e-6, &compared);
  print_message("aligned views: %d gradients, worst relative error %.3g\n", compared, worst);
  assert_int_equal(compared, 9);
  stoke_exec_free(xe);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

static void test_tied_accumulation(void **state) {
  lm m = build_lm();
  stoke_plan *p = cpu_compile(m.g, NULL, 0);
  stoke_exec *x;
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &x));
  *(double *)stoke_exec_tensor(x, m.g->seed).data = 1.0;
  size_t n = p->bytes[STOKE_BUF_GRADS] / sizeof(double);
  double *gr = stoke_exec_buffer(x, STOKE_BUF_GRADS), *sum = calloc(n, sizeof(double));
  for (int k = 0; k < 2; k++) {
    random_tokens(x, seed + (uint64_t)k);
    for (size_t i = 0; i < n; i++) gr[i] = NAN;
    OK(stoke_exec_forward_backward(x, 1, 3));
    for (size_t i = 0; i < n; i++) sum[i] += gr[i];
  }
  for (size_t i = 0; i < n; i++) gr[i] = NAN;
  for (int k = 0; k < 2; k++) {
    random_tokens(x, seed + (uint64_t)k);
    OK(stoke_exec_forward_backward(x, k == 0, 3));
  }
  for (int v = 0; v < m.g->n_values; v++) {
    const stoke_value *val = &m.g->values[v];
    if (val->kind != STOKE_VAL_PARAM) continue;
    for (size_t i = val->offset / sizeof(double); i < val->offset / sizeof(double) + (size_t)stoke_numel(&val->shape); i++)
      if (!(fabs(gr[i] - sum[i]) <= 1e-12 * fmax(1, fabs(sum[i]))))
        fail_msg("%s: %.15g accumulated, %.15g summed (seed %llu)", val->name, gr[i], sum[i], (unsigned long long)seed);
  }
  free(sum);
  stoke_exec_free(x);
  stoke_plan_free(p);
  stoke_graph_free(m.g);
}

static int count_op(const stoke_graph *g, const char *op, int bwd) {
  int k = 0;
  for (int i = bwd ? g->n_fwd : 0; i < (bwd ? g->n_nodes : g->n_fwd); i++) k += !strcmp(g->nodes[i].n.op, op);
  return k;
}

/* run.fuse on the block (core/fuse_act.c): c_fc -> gelu -> mlp_proj becomes
 * linear_act and linear_dact, and c_proj and mlp_proj give their biases to
 * ln_2 and ln_f (matmul -> add_bias_layer_norm). The fused graph's
 * gradient against finite differences, and its loss and every parameter
 * gradient against the unfused graph's on the same batch. */
static void test_bias_fold(void **state) {
  lm m[2] = {build_lm(), build_lm()};
  stoke_plan *p[2] = {cpu_compile(m[0].g, NULL, 0), cpu_compile(m[1].g, NULL, 1)};
  stoke_graph *gf = m[1].g;
  assert_int_equal(count_op(m[0].g, STOKE_OP_ADD_BIAS_LAYER_NORM, 0), 0);
  assert_int_equal(count_op(gf, STOKE_OP_ADD_BIAS_LAYER_NORM, 0), 2);
  assert_int_equal(count_op(gf, STOKE_OP_ADD_LAYER_NORM, 0), 0);
  assert_int_equal(count_op(gf, STOKE_OP_MATMUL, 0), 3); /* c_proj, mlp_proj, lm_head */
  assert_int_equal(count_op(gf, STOKE_OP_LINEAR_ACT, 0), 1);
  assert_int_equal(count_op(gf, STOKE_OP_LINEAR_DACT, 1), 1);
  assert_int_equal(count_op(gf, STOKE_OP_ADD_BIAS_LAYER_NORM, 1), 2);
  for (int i = gf->n_fwd; i < gf->n_nodes; i++) { /* each folded bias's gradient: one writer, the layer norm */
    const stoke_gnode *n = &gf->nodes[i];
    if (!strcmp(n->n.op, STOKE_OP_LINEAR_DACT)) {
      assert_int_equal(n->din[2], -1);
      assert_string_equal(gf->values[n->in[2]].name, "mlp.bias");
    }
    if (!strcmp(n->n.op, STOKE_OP_ADD_BIAS_LAYER_NORM)) {
      assert_true(n->din[4] >= 0);
      assert_int_equal(gf->values[n->din[4]].producer, i);
    }
  }
  stoke_exec *x[2];
  double loss[2];
  for (int k = 0; k < 2; k++) {
    OK(stoke_exec_new(p[k], cpu, cpu_self, seed, &x[k]));
    *(double *)stoke_exec_tensor(x[k], m[k].g->seed).data = 1.0;
    random_tokens(x[k], seed);
    loss[k] = cpu_loss(x[k]);
  }
  print_message("loss unfused %.17g, fused %.17g\n", loss[0], loss[1]);
  assert_true(isfinite(loss[0]) && fabs(loss[0] - loss[1]) <= 1e-13 * fabs(loss[0]));
  assert_int_equal(p[0]->bytes[STOKE_BUF_GRADS], p[1]->bytes[STOKE_BUF_GRADS]);
  const double *gu = stoke_exec_buffer(x[0], STOKE_BUF_GRADS), *gfb = stoke_exec_buffer(x[1], STOKE_BUF_GRADS);
  for (int v = 0; v < gf->n_values; v++) {
    const stoke_value *val = &gf->values[v];
    if (val->kind != STOKE_VAL_PARAM) continue;
    for (size_t i = val->offset / sizeof(double); i < val->offset / sizeof(double) + (size_t)stoke_numel(&val->shape); i++)
      if (!(fabs(gu[i] - gfb[i]) <= 1e-11 * fmax(1e-3, fabs(gu[i]))))
        fail_msg("%s: gradient %.15g unfused, %.15g fused (seed %llu)", val->name, gu[i], gfb[i],
                 (unsigned long long)seed);
  }
  int compared;
  double worst = cpu_check_gradients(x[1], 1e-5, &compared);
  print_message("fused block: %d parameters against finite differences, worst relative error %.3g\n", compared,
                worst);
  assert_int_equal(compared, (int)p[1]->n_params);
  for (int k = 0; k < 2; k++) {
    stoke_exec_free(x[k]);
    stoke_plan_free(p[k]);
    stoke_graph_free(m[k].g);
  }
  /* run.fuse_bias_norm = false (opts.no_bias_fold): the activation fusion alone */
  lm k = build_lm();
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .training = 1, .fuse = 1,
                       .no_bias_fold = 1};
  stoke_plan *pk;
  OK(stoke_compile(k.g, &o, &pk));
  assert_int_equal(count_op(k.g, STOKE_OP_ADD_BIAS_LAYER_NORM, 0), 0);
  assert_int_equal(count_op(k.g, STOKE_OP_ADD_LAYER_NORM, 0), 2);
  assert_int_equal(count_op(k.g, STOKE_OP_LINEAR_ACT, 0), 1);
  assert_int_equal(count_op(k.g, STOKE_OP_MATMUL, 0), 1);
  stoke_plan_free(pk);
  stoke_graph_free(k.g);
}

/* An op whose infer is wrong: case 0 sets out[0] only (out[1] left unset), case 1 gives out[1] a negative
 * size. */
static int bad_infer_kind;
static stoke_err *bad_infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  if (bad_infer_kind == 1) out[1] = (stoke_value_desc_v1){{2, {3, -4}}, in[0].dtype};
  return NULL;
}
static const stoke_op_type_v1 bad_infer_op = {STOKE_ABI(stoke_op_type_v1), .name = "bad_infer", .n_inputs = 1,
                                              .n_outputs = 2, .infer = bad_infer};
static stoke_err *reg_bad_infer(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  return r->add_op(r->self, &bad_infer_op);
}

static void test_errors(void **state) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, w, bias, out;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {3, 4}}, STOKE_F64, &x));
  OK(b.param(g, "w", &(stoke_shape){2, {4, 4}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &w));
  OK(b.param(g, "b", &(stoke_shape){1, {4}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &bias));
  stoke_err *e = b.param_alias(g, w, "b");
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_DUPLICATE);
  stoke_err_free(e);
  e = b.param_alias(g, x, "x2");
  assert_non_null(e);
  assert_true(strstr(e->msg, "not a parameter") != NULL);
  stoke_err_free(e);
  /* split takes as many outputs as its sizes */
  int parts[3];
  e = b.node(g, STOKE_OP_SPLIT, "sp", &x, 1, "dim=1, sizes=1x3", parts, 3);
  assert_non_null(e);
  assert_true(strstr(e->msg, "given 3 outputs") != NULL);
  stoke_err_free(e);
  OK(b.node(g, STOKE_OP_SPLIT, "sp", &x, 1, "dim=1, sizes=1x3", parts, 2));
  /* sizes whose sums wrap past int64 are refused, not taken for the dimension (a slice at 2^63 - 1 read before
   * x's memory; a reshape to 2^60 + 1 x 16 of 12 elements, and split sizes of 2^62, were accepted) */
  static const struct {
    const char *op, *attrs, *says;
    int n_out;
  } wraps[] = {
      {STOKE_OP_SLICE, "dim=1, start=9223372036854775807, length=1", "is not inside dimension 1", 1},
      {STOKE_OP_RESHAPE, "shape=1152921504606846977x16", "holds more than the 12 elements", 1},
      {STOKE_OP_SPLIT, "dim=1, sizes=4611686018427387904x4611686018427387904x4611686018427387904x"
                       "4611686018427387904x4", "sum past dimension 1", 5},
  };
  for (int i = 0; i < 3; i++) {
    int outs[5];
    e = b.node(g, wraps[i].op, "wrap", &x, 1, wraps[i].attrs, outs, wraps[i].n_out);
    if (!e) fail_msg("%s %s was accepted", wraps[i].op, wraps[i].attrs);
    if (!strstr(e->msg, wraps[i].says)) fail_msg("%s: %s", wraps[i].op, e->msg);
    stoke_err_free(e);
  }
  /* an op whose infer leaves an output unset, or gives a negative size: refused, naming the node */
  static const stoke_plugin_v1 bad = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "bad_infer", "", reg_bad_infer};
  OK(stoke_registry_add_plugin(reg, &bad, "seq_graph_test.c"));
  for (int k = 0; k < 2; k++) {
    bad_infer_kind = k;
    int outs[2];
    e = b.node(g, "bad_infer", "bi", &x, 1, "", outs, 2);
    if (!e) fail_msg("bad_infer case %d was accepted", k);
    if (!strstr(e->msg, "node 'bi' (bad_infer): its infer() gave output")) fail_msg("%s", e->msg);
    stoke_err_free(e);
  }
  (void)out;
  stoke_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gradient),
      cmocka_unit_test(test_memory_sharing),
      cmocka_unit_test(test_views_aligned),
      cmocka_unit_test(test_tied_accumulation),
      cmocka_unit_test(test_bias_fold),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
