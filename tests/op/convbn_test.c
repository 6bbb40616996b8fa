/* tests/op/convbn_test.c: the CPU reference kernels of the ops that fold
 * batch norm into convolutions (conv_bn, bn_relu_conv_bn, bn_apply,
 * bn_apply_relu, bn_apply_add_relu; stoke/ops.h). Every gradient against
 * central finite differences in double, training (the statistics made from
 * the normalized value by a batch_norm node, so the differences go through
 * them) and eval, NCHW and NHWC; each fused chain against the unfused nodes
 * it replaces (conv2d -> batch_norm -> [add ->] relu, and conv2d ->
 * batch_norm -> relu -> conv2d -> batch_norm): the output, every gradient
 * and the running statistics, f64 to rounding and f32; parameter gradients
 * accumulated under param_grad_beta; FLOPs; shape inference and errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "stoke/graph.h"
#include "tape.h"

#define BN_ATTRS "eps=1e-3, momentum=0.2" /* not the defaults: the attributes must travel */

typedef struct conv_geo {
  int64_t k, ksize, stride, pad, groups;
} conv_geo;

typedef struct cb_cfg {
  const char *label;
  stoke_layout layout;
  int64_t n, c, h, w;
  conv_geo c1, c2; /* the first convolution, and the second of the two-conv chain */
} cb_cfg;

static const cb_cfg cfgs[] = {
    {"3x3 then 3x3/2 NCHW", STOKE_NCHW, 2, 3, 5, 5, {4, 3, 1, 1, 1}, {6, 3, 2, 1, 1}},
    {"3x3 then 3x3/2 NHWC", STOKE_NHWC, 2, 3, 5, 5, {4, 3, 1, 1, 1}, {6, 3, 2, 1, 1}},
    {"3x3 groups 2 then 1x1 NHWC", STOKE_NHWC, 2, 4, 4, 4, {4, 3, 1, 1, 2}, {4, 1, 1, 0, 1}},
};
#define N_CFGS ((int)(sizeof cfgs / sizeof *cfgs))

static int64_t conv_out(int64_t in, const conv_geo *g) { return (in + 2 * g->pad - g->ksize) / g->stride + 1; }

/* conv2d's attributes (with the batch norm's when `bn`) as text. */
static const char *conv_attrs(char *buf, size_t cap, const conv_geo *g, int bn) {
  snprintf(buf, cap, "stride=%lld, padding=%lld, groups=%lld%s", (long long)g->stride, (long long)g->pad,
           (long long)g->groups, bn ? ", " BN_ATTRS : "");
  return buf;
}

static stoke_shape shape4(int64_t a, int64_t b, int64_t c, int64_t d) { return (stoke_shape){4, {a, b, c, d}}; }

static stoke_shape weight_shape(int64_t cin, const conv_geo *g) {
  return shape4(g->k, cin / g->groups, g->ksize, g->ksize);
}

static const char *train_str(int training) { return training ? "training" : "eval"; }

/* ------------------------------------------------- finite differences */

/* conv_bn alone: the gradients of x and weight (y is conv2d's). */
static void fd_conv_bn(const cb_cfg *f, int training) {
  tape *t = tp_new(STOKE_F64, f->layout, training);
  int x = tp_value(t, TP_INPUT, shape4(f->n, f->c, f->h, f->w), -1, 1);
  int w = tp_value(t, TP_PARAM, weight_shape(f->c, &f->c1), -1, 1);
  int bn[4];
  tp_bn_values(t, f->c1.k, 0, bn); /* only its running statistics */
  char attrs[128], label[128];
  tp_node_add(t, STOKE_OP_CONV_BN, conv_attrs(attrs, sizeof attrs, &f->c1, 1), 4, (int[]){x, w, bn[2], bn[3]},
              NULL);
  snprintf(label, sizeof label, "conv_bn %s %s", f->label, train_str(training));
  tp_grad_check(t, label);
  tp_free(t);
}

/* An apply op on y (4-D, or (N, C) when flat) whose statistics a batch_norm
 * node computes from y (training: its batch's; eval: the running ones). */
static void fd_apply(const cb_cfg *f, int act, int flat, int training) {
  static const char *const ops[] = {STOKE_OP_BN_APPLY, STOKE_OP_BN_APPLY_RELU, STOKE_OP_BN_APPLY_ADD_RELU};
  tape *t = tp_new(STOKE_F64, f->layout, training);
  stoke_shape ys = flat ? (stoke_shape){2, {3 * f->n, f->c}} : shape4(f->n, f->c, f->h, f->w);
  int y = tp_value(t, TP_INPUT, ys, -2, 2), stat[4], w, b, r = -1;
  tp_bn_values(t, f->c, 0, stat);
  w = tp_value(t, TP_PARAM, (stoke_shape){1, {f->c}}, 0.5, 1.5);
  b = tp_value(t, TP_PARAM, (stoke_shape){1, {f->c}}, -0.5, 0.5);
  if (act == 2) r = tp_value(t, TP_INPUT, ys, -1, 1);
  int bo[3];
  tp_node_add(t, STOKE_OP_BATCH_NORM, BN_ATTRS, 5, (int[]){y, stat[0], stat[1], stat[2], stat[3]}, bo);
  tp_node_add(t, ops[act], "", act == 2 ? 6 : 5, (int[]){y, bo[1], bo[2], w, b, r}, NULL);
  char label[128];
  snprintf(label, sizeof label, "%s %s %s", ops[act], flat ? "(N, C)" : f->label, train_str(training));
  tp_grad_check(t, label);
  tp_free(t);
}

/* bn_relu_conv_bn on p, p's statistics from a batch_norm node. */
static void fd_bn_relu_conv_bn(const cb_cfg *f, int training) {
  tape *t = tp_new(STOKE_F64, f->layout, training);
  int p = tp_value(t, TP_INPUT, shape4(f->n, f->c, f->h, f->w), -2, 2), stat[4], bn[4];
  tp_bn_values(t, f->c, 0, stat);
  int pw = tp_value(t, TP_PARAM, (stoke_shape){1, {f->c}}, 0.5, 1.5);
  int pb = tp_value(t, TP_PARAM, (stoke_shape){1, {f->c}}, -0.5, 0.5);
  int w = tp_value(t, TP_PARAM, weight_shape(f->c, &f->c1), -1, 1);
  tp_bn_values(t, f->c1.k, 0, bn); /* only its running statistics */
  int po[3];
  tp_node_add(t, STOKE_OP_BATCH_NORM, BN_ATTRS, 5, (int[]){p, stat[0], stat[1], stat[2], stat[3]}, po);
  char attrs[128], label[128];
  tp_node_add(t, STOKE_OP_BN_RELU_CONV_BN, conv_attrs(attrs, sizeof attrs, &f->c1, 1), 8,
              (int[]){p, po[1], po[2], pw, pb, w, bn[2], bn[3]}, NULL);
  snprintf(label, sizeof label, "bn_relu_conv_bn %s %s", f->label, train_str(training));
  tp_grad_check(t, label);
  tp_free(t);
}

static void test_conv_bn_finite_differences(void **state) {
  for (int i = 0; i < N_CFGS; i++)
    for (int tr = 0; tr < 2; tr++) fd_conv_bn(&cfgs[i], tr);
}

static void test_apply_finite_differences(void **state) {
  for (int act = 0; act < 3; act++)
    for (int tr = 0; tr < 2; tr++) {
      for (int i = 0; i < 2; i++) fd_apply(&cfgs[i], act, 0, tr);
      fd_apply(&cfgs[0], act, 1, tr);
    }
}

static void test_bn_relu_conv_bn_finite_differences(void **state) {
  for (int i = 0; i < N_CFGS; i++)
    for (int tr = 0; tr < 2; tr++) fd_bn_relu_conv_bn(&cfgs[i], tr);
}

/* ------------------------------------------- fused against unfused */

typedef enum chain { CH_PLAIN = 0, CH_RELU, CH_ADD_RELU, CH_TWO_CONV } chain;
static const char *const chain_names[] = {"conv -> bn", "conv -> bn -> relu", "conv -> bn -> add -> relu",
                                          "conv -> bn -> relu -> conv -> bn"};

/* The leaves (the same values in both tapes, drawn from the same stream):
 * x, conv1's weight, bn1, the residual r, conv2's weight, bn2. */
typedef struct leaves {
  int x, w1, bn1[4], r, w2, bn2[4];
} leaves;

static leaves make_leaves(tape *t, const cb_cfg *f) {
  leaves l;
  int64_t h1 = conv_out(f->h, &f->c1), w1 = conv_out(f->w, &f->c1);
  l.x = tp_value(t, TP_INPUT, shape4(f->n, f->c, f->h, f->w), -1, 1);
  l.w1 = tp_value(t, TP_PARAM, weight_shape(f->c, &f->c1), -1, 1);
  tp_bn_values(t, f->c1.k, 1, l.bn1);
  l.r = tp_value(t, TP_INPUT, shape4(f->n, f->c1.k, h1, w1), -1, 1);
  l.w2 = tp_value(t, TP_PARAM, weight_shape(f->c1.k, &f->c2), -1, 1);
  tp_bn_values(t, f->c2.k, 1, l.bn2);
  return l;
}

/* conv2d -> batch_norm -> ... node by node. */
static void unfused(tape *t, const cb_cfg *f, chain ch, const leaves *l) {
  char attrs[128];
  int y1 = tp_node_add(t, STOKE_OP_CONV2D, conv_attrs(attrs, sizeof attrs, &f->c1, 0), 2, (int[]){l->x, l->w1}, NULL);
  int z = tp_node_add(t, STOKE_OP_BATCH_NORM, BN_ATTRS, 5, (int[]){y1, l->bn1[0], l->bn1[1], l->bn1[2], l->bn1[3]},
                      NULL);
  if (ch == CH_ADD_RELU) z = tp_node_add(t, STOKE_OP_ADD, "", 2, (int[]){z, l->r}, NULL);
  if (ch != CH_PLAIN) z = tp_node_add(t, STOKE_OP_RELU, "", 1, &z, NULL);
  if (ch != CH_TWO_CONV) return;
  int y2 = tp_node_add(t, STOKE_OP_CONV2D, conv_attrs(attrs, sizeof attrs, &f->c2, 0), 2, (int[]){z, l->w2}, NULL);
  tp_node_add(t, STOKE_OP_BATCH_NORM, BN_ATTRS, 5, (int[]){y2, l->bn2[0], l->bn2[1], l->bn2[2], l->bn2[3]}, NULL);
}

/* The same with the folded ops, as the compiler's pass makes them. */
static void fused(tape *t, const cb_cfg *f, chain ch, const leaves *l) {
  static const char *const apply[] = {STOKE_OP_BN_APPLY, STOKE_OP_BN_APPLY_RELU, STOKE_OP_BN_APPLY_ADD_RELU};
  char attrs[128];
  int c1[3];
  tp_node_add(t, STOKE_OP_CONV_BN, conv_attrs(attrs, sizeof attrs, &f->c1, 1), 4,
              (int[]){l->x, l->w1, l->bn1[2], l->bn1[3]}, c1);
  if (ch != CH_TWO_CONV) {
    tp_node_add(t, apply[ch], "", ch == CH_ADD_RELU ? 6 : 5, (int[]){c1[0], c1[1], c1[2], l->bn1[0], l->bn1[1], l->r},
                NULL);
    return;
  }
  int c2[3];
  tp_node_add(t, STOKE_OP_BN_RELU_CONV_BN, conv_attrs(attrs, sizeof attrs, &f->c2, 1), 8,
              (int[]){c1[0], c1[1], c1[2], l->bn1[0], l->bn1[1], l->w2, l->bn2[2], l->bn2[3]}, c2);
  tp_node_add(t, STOKE_OP_BN_APPLY, "", 5, (int[]){c2[0], c2[1], c2[2], l->bn2[0], l->bn2[1]}, NULL);
}

static void expect_close(const stoke_tensor *got, const stoke_tensor *want, double tol, const char *what,
                         const char *label, double *worst) {
  H_CHECK(got->data && want->data, "%s: %s missing on one side", label, what);
  double e = h_rel_norm(got, want);
  if (e > *worst) *worst = e;
  H_CHECK(e <= tol, "%s: %s fused differs from unfused: relative norm %.3g > %.3g", label, what, e, tol);
}

/* Both tapes on the same leaves: the output, every leaf's gradient and
 * the running statistics agree. */
static void check_chain(const cb_cfg *f, chain ch, stoke_dtype dt, int training) {
  char label[160];
  snprintf(label, sizeof label, "%s, %s, %s, %s", chain_names[ch], f->label, stoke_dtype_name(dt), train_str(training));
  unsigned long long rng = h_rng;
  tape *u = tp_new(dt, f->layout, training), *z = tp_new(dt, f->layout, training);
  leaves lu = make_leaves(u, f);
  h_rng = rng;
  leaves lz = make_leaves(z, f);
  assert_int_equal(lu.bn2[3], lz.bn2[3]);
  unfused(u, f, ch, &lu);
  fused(z, f, ch, &lz);
  tp_forward(u);
  tp_forward(z);
  stoke_tensor r = h_like(&u->v[u->out], -1);
  h_random(&r, -1, 1);
  tp_backward(u, &r);
  tp_backward(z, &r);
  /* f64: the same arithmetic, up to the order of sums; f32: the apply ops
   * read the statistics rounded to f32, batch_norm its double ones */
  double tol = dt == STOKE_F64 ? 1e-12 : 1e-5, worst = 0;
  expect_close(&z->v[z->out], &u->v[u->out], tol, "output", label, &worst);
  if (ch == CH_RELU || ch == CH_ADD_RELU) {
    int64_t zeros = 0, n = h_numel(&u->v[u->out]);
    for (int64_t i = 0; i < n; i++) zeros += h_get(&u->v[u->out], i) == 0;
    H_CHECK(zeros > 0 && zeros < n, "%s: the ReLU masked %lld of %lld values: the case tests nothing", label,
            (long long)zeros, (long long)n);
  }
  for (int v = 0; v < lu.bn2[3] + 1; v++) {
    char what[48];
    if (u->kind[v] == TP_STATE) {
      snprintf(what, sizeof what, "running statistic (value %d)", v);
      expect_close(&z->v[v], &u->v[v], tol, what, label, &worst);
      H_CHECK(training || !memcmp(z->v[v].data, z->state0[v].data, stoke_tensor_bytes(&z->v[v])),
              "%s: eval changed %s", label, what);
    } else if (u->grad[v].data || z->grad[v].data) {
      snprintf(what, sizeof what, "gradient of value %d", v);
      expect_close(&z->grad[v], &u->grad[v], tol, what, label, &worst);
    }
  }
  print_message("%-60s worst relative norm %.3g\n", label, worst);
  h_free(&r);
  tp_free(u);
  tp_free(z);
}

static void test_fused_matches_unfused(void **state) {
  static const stoke_dtype dts[] = {STOKE_F64, STOKE_F32};
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < N_CFGS; i++)
      for (int ch = 0; ch < 4; ch++)
        for (int tr = 0; tr < 2; tr++) check_chain(&cfgs[i], (chain)ch, dts[d], tr);
}

/* The whole folded two-conv chain against finite differences: the
 * statistics bn_relu_conv_bn reads come from a conv_bn, as in a network. */
static void test_fused_chain_finite_differences(void **state) {
  for (int i = 0; i < N_CFGS; i++)
    for (int tr = 0; tr < 2; tr++) {
      tape *t = tp_new(STOKE_F64, cfgs[i].layout, tr);
      leaves l = make_leaves(t, &cfgs[i]);
      t->kind[l.r] = TP_CONST; /* unused by this chain */
      fused(t, &cfgs[i], CH_TWO_CONV, &l);
      char label[128];
      snprintf(label, sizeof label, "conv_bn -> bn_relu_conv_bn -> bn_apply %s %s", cfgs[i].label, train_str(tr));
      tp_grad_check(t, label);
      tp_free(t);
    }
}

/* --------------------------------------------------- param_grad_beta */

/* The last node's backward with beta 0, then with beta 1 onto random
 * parameter gradients (activation gradients poisoned): parameters
 * accumulate, activation gradients are overwritten. */
static void check_beta(tape *t, const char *label) {
  tp_rerun(t);
  stoke_tensor r = h_like(&t->v[t->out], -1);
  h_random(&r, -1, 1);
  h_free(&t->grad[t->out]);
  t->grad[t->out] = r;
  int wants[TP_MAXV], last = t->nn - 1;
  tp_wants(t, wants);
  stoke_tensor base[STOKE_MAX_IO], acc[STOKE_MAX_IO], prev[STOKE_MAX_IO];
  tp_node_backward(t, last, wants, base, 0.0f, 0);
  tp_node_backward(t, last, wants, acc, 0.0f, 0); /* the same buffers, refilled below */
  const tp_node *n = &t->n[last];
  int params = 0;
  for (int k = 0; k < n->n_in; k++) {
    prev[k] = acc[k];
    prev[k].data = NULL;
    if (!acc[k].data) continue;
    if (t->kind[n->in[k]] == TP_PARAM) {
      h_random(&acc[k], -1, 1);
      prev[k] = h_like(&acc[k], -1);
      h_convert(&prev[k], &acc[k]);
      params++;
    } else {
      h_poison(&acc[k]);
    }
  }
  H_CHECK(params > 0, "%s: no parameter gradient to accumulate", label);
  tp_node_backward(t, last, wants, acc, 1.0f, 1);
  for (int k = 0; k < n->n_in; k++) {
    if (!acc[k].data) continue;
    for (int64_t j = 0; j < h_numel(&acc[k]); j++) {
      double want = h_get(&base[k], j) + (prev[k].data ? h_get(&prev[k], j) : 0);
      H_CHECK(fabs(h_get(&acc[k], j) - want) <= 1e-12 * fmax(1, fabs(want)), "%s: din[%d][%lld] = %.15g, want %.15g (%s)",
              label, k, (long long)j, h_get(&acc[k], j), want, prev[k].data ? "accumulated" : "overwritten");
    }
    h_free(&base[k]);
    h_free(&acc[k]);
    h_free(&prev[k]);
  }
  tp_free(t);
}

/* A tape of the fused two-conv chain cut after its first `nodes` nodes. */
static tape *two_conv_prefix(int training, int nodes) {
  tape *t = tp_new(STOKE_F64, STOKE_NHWC, training);
  leaves l = make_leaves(t, &cfgs[1]);
  fused(t, &cfgs[1], CH_TWO_CONV, &l);
  t->nn = nodes;
  t->out = t->n[nodes - 1].out[0];
  return t;
}

static void test_param_grad_beta(void **state) {
  for (int tr = 0; tr < 2; tr++) {
    char label[96];
    for (int ch = 0; ch < 3; ch++) {
      tape *t = tp_new(STOKE_F64, STOKE_NHWC, tr);
      leaves l = make_leaves(t, &cfgs[1]);
      fused(t, &cfgs[1], (chain)ch, &l);
      snprintf(label, sizeof label, "%s (the apply op) %s", chain_names[ch], train_str(tr));
      check_beta(t, label);
    }
    snprintf(label, sizeof label, "conv_bn %s", train_str(tr));
    check_beta(two_conv_prefix(tr, 1), label);
    snprintf(label, sizeof label, "bn_relu_conv_bn %s", train_str(tr));
    check_beta(two_conv_prefix(tr, 2), label);
  }
}

/* -------------------------------------------------- op types, errors */

/* A fused pair counts the FLOPs of the nodes it replaces. */
static void test_flops(void **state) {
  const cb_cfg *f = &cfgs[0];
  tape *u = tp_new(STOKE_F64, f->layout, 1), *z = tp_new(STOKE_F64, f->layout, 1);
  leaves lu = make_leaves(u, f), lz = make_leaves(z, f);
  unfused(u, f, CH_TWO_CONV, &lu);
  fused(z, f, CH_TWO_CONV, &lz);
  double fl[2] = {0, 0};
  tape *tt[2] = {u, z};
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < tt[s]->nn; i++) {
      const tp_node *n = &tt[s]->n[i];
      const stoke_op_type_v1 *ty = stoke_find_op(h_reg, n->node.op);
      stoke_value_desc_v1 in[STOKE_MAX_IO], out[STOKE_MAX_IO];
      for (int k = 0; k < n->n_in; k++) in[k] = (stoke_value_desc_v1){tt[s]->v[n->in[k]].shape, STOKE_F64};
      for (int j = 0; j < n->n_out; j++) out[j] = (stoke_value_desc_v1){tt[s]->v[n->out[j]].shape, STOKE_F64};
      fl[s] += ty->flops(&n->node, in, out);
    }
  print_message("two-conv chain: unfused %.0f FLOPs, fused %.0f\n", fl[0], fl[1]);
  assert_true(fl[0] > 0 && fl[0] == fl[1]);
  tp_free(u);
  tp_free(z);
}

/* infer() of op with these input shapes (dtype f32, statistics f32) must
 * fail naming the node and `want`. */
static void expect_infer_error(const char *op, const char *attrs, int n_in, const stoke_shape *shapes,
                               const char *want) {
  stoke_node_v1 node;
  H_OK(stoke_node_init(h_reg, op, "bad", attrs, &node));
  stoke_value_desc_v1 in[STOKE_MAX_IO], out[STOKE_MAX_IO];
  for (int i = 0; i < n_in; i++) in[i] = (stoke_value_desc_v1){shapes[i], STOKE_F32};
  stoke_err *e = stoke_find_op(h_reg, op)->infer(&node, in, out);
  H_CHECK(e != NULL, "%s: infer accepted a bad shape (%s)", op, want);
  print_message("%s\n", e->msg);
  H_CHECK(e->code == STOKE_E_INVALID && strstr(e->msg, op) && strstr(e->msg, "'bad'") && strstr(e->msg, want),
          "%s: message '%s' should name the op, the node and '%s'", op, e->msg, want);
  stoke_err_free(e);
}

static void test_infer(void **state) {
  stoke_shape x = shape4(2, 3, 5, 5), w = shape4(4, 3, 3, 3), k4 = {1, {4}}, k5 = {1, {5}}, c3 = {1, {3}};
  /* a good conv_bn: y and the statistics */
  stoke_node_v1 node;
  H_OK(stoke_node_init(h_reg, STOKE_OP_CONV_BN, "cb", "stride=2, padding=1, eps=1e-3, momentum=0.3", &node));
  assert_int_equal(node.n_attrs, 6);
  assert_true(node.attrs[STOKE_CONV_BN_EPS].f == 1e-3 && node.attrs[STOKE_CONV_BN_MOMENTUM].f == 0.3);
  stoke_value_desc_v1 in[8] = {{x, STOKE_BF16}, {w, STOKE_BF16}, {k4, STOKE_F32}, {k4, STOKE_F32}}, out[3];
  H_OK(stoke_find_op(h_reg, STOKE_OP_CONV_BN)->infer(&node, in, out));
  assert_int_equal(out[0].shape.d[1], 4);
  assert_int_equal(out[0].shape.d[2], 3);
  assert_int_equal(out[0].dtype, STOKE_BF16);
  assert_int_equal(out[1].dtype, STOKE_F32);
  assert_int_equal(out[2].shape.d[0], 4);
  /* bad ones */
  expect_infer_error(STOKE_OP_CONV_BN, "", 4, (stoke_shape[]){x, w, k5, k4}, "running_mean");
  expect_infer_error(STOKE_OP_CONV_BN, "", 4, (stoke_shape[]){x, shape4(4, 2, 3, 3), k4, k4}, "C/groups");
  expect_infer_error(STOKE_OP_CONV_BN, "eps=0", 4, (stoke_shape[]){x, w, k4, k4}, "eps");
  expect_infer_error(STOKE_OP_BN_RELU_CONV_BN, "", 8, (stoke_shape[]){x, c3, c3, k4, c3, w, k4, k4}, "p_weight");
  expect_infer_error(STOKE_OP_BN_RELU_CONV_BN, "", 8, (stoke_shape[]){x, c3, c3, c3, c3, w, k4, k5}, "running_var");
  expect_infer_error(STOKE_OP_BN_APPLY, "", 5, (stoke_shape[]){x, c3, k4, c3, c3}, "invstd");
  expect_infer_error(STOKE_OP_BN_APPLY_ADD_RELU, "", 6, (stoke_shape[]){x, c3, c3, c3, c3, shape4(2, 3, 5, 4)},
                     "residual");
}

/* Kernel-level errors name the node and what is wrong. */
static void test_kernel_errors(void **state) {
  /* a gradient asked for a statistic */
  tape *t = tp_new(STOKE_F64, STOKE_NCHW, 1);
  leaves l = make_leaves(t, &cfgs[0]);
  fused(t, &cfgs[0], CH_PLAIN, &l);
  tp_rerun(t);
  const tp_node *cb = &t->n[0];
  stoke_tensor in[4], out[3], din[4], dout[3];
  for (int k = 0; k < 4; k++) in[k] = t->v[cb->in[k]], din[k] = in[k], din[k].data = NULL;
  for (int j = 0; j < 3; j++) out[j] = t->v[cb->out[j]], dout[j] = out[j];
  stoke_kernel_args_v1 a = tp_args(t, cb, in, out);
  a.din = din;
  a.dout = dout;
  stoke_err *e = h_run(h_kernel(STOKE_OP_CONV_BN, STOKE_BWD, STOKE_F64), &a);
  H_CHECK(e && e->code == STOKE_E_INVALID && strstr(e->msg, cb->name) && strstr(e->msg, "saved_mean"),
          "conv_bn with a gradient of saved_mean: %s", e ? e->msg : "accepted");
  stoke_err_free(e);
  /* an apply op whose statistics do not match y's channels */
  const tp_node *ap = &t->n[1];
  stoke_tensor ain[5], aout = t->v[ap->out[0]];
  for (int k = 0; k < 5; k++) ain[k] = t->v[ap->in[k]];
  ain[STOKE_BN_APPLY_MEAN].shape.d[0]--;
  a = tp_args(t, ap, ain, &aout);
  e = h_run(h_kernel(STOKE_OP_BN_APPLY, STOKE_FWD, STOKE_F64), &a);
  H_CHECK(e && e->code == STOKE_E_INVALID && strstr(e->msg, ap->name) && strstr(e->msg, "mean"),
          "bn_apply with a short mean: %s", e ? e->msg : "accepted");
  stoke_err_free(e);
  tp_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_conv_bn_finite_differences),
      H_TEST(test_apply_finite_differences),
      H_TEST(test_bn_relu_conv_bn_finite_differences),
      H_TEST(test_fused_matches_unfused),
      H_TEST(test_fused_chain_finite_differences),
      H_TEST(test_param_grad_beta),
      H_TEST(test_flops),
      H_TEST(test_infer),
      H_TEST(test_kernel_errors),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
