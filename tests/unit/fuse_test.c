/* tests/unit/fuse_test.c: the compiler's fusion pass (core/plan.c) on the
 * CPU, whose reference kernels include the fused ops: batch_norm -> relu
 * and batch_norm -> add -> relu become bn_relu and bn_add_relu (the add's
 * other input made by a node that comes after the batch_norm, as a ResNet
 * shortcut), that shortcut's own batch_norm is joined in (bn_add_bn_relu,
 * unless fuse_shortcut is off), a batch_norm whose output has two readers stays, and the
 * fused graph's loss, every parameter gradient and the running statistics
 * after a step equal the unfused graph's; the loss's forward done by its
 * backward kernel (forward in backward) changes no bit; a training
 * max_pool2d saves its window indices (max_pool2d_idx) with the same bits. */
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

static int setup(void **state) { return cpu_fixture_setup("fuse_test"); }

static int bn(stoke_graph *g, int x, const char *name, int64_t c) {
  stoke_builder_v1 b = stoke_graph_builder(g);
  char w[64], bb[64], rm[64], rv[64];
  snprintf(w, sizeof w, "%s.weight", name);
  snprintf(bb, sizeof bb, "%s.bias", name);
  snprintf(rm, sizeof rm, "%s.running_mean", name);
  snprintf(rv, sizeof rv, "%s.running_var", name);
  stoke_shape s = {1, {c}};
  int in[5], out[3];
  in[0] = x;
  OK(b.param(g, w, &s, (stoke_init_v1){STOKE_INIT_UNIFORM, 0.5, 1.5}, &in[1]));
  OK(b.param(g, bb, &s, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &in[2]));
  OK(b.state(g, rm, &s, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &in[3]));
  OK(b.state(g, rv, &s, (stoke_init_v1){STOKE_INIT_ONES, 0, 0}, &in[4]));
  OK(b.node(g, STOKE_OP_BATCH_NORM, name, in, 5, "", out, 3));
  return out[0];
}

/* x -> bn1 -> relu -> h; bn2(h) + bn3(h) -> relu -> z (bn3, the shortcut,
 * after bn2); z also read by a second relu (its batch_norm stays unfused:
 * bn4 -> {relu, flatten}); flatten -> fc -> loss. */
static stoke_graph *block(int64_t n, int64_t c, int64_t hw, int64_t classes) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_NHWC, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, h, a, z, t, q, s, f, w, bias, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){4, {n, c, hw, hw}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {n}}, STOKE_I32, &y));
  OK(b.node(g, STOKE_OP_RELU, "relu1", (int[]){bn(g, x, "bn1", c)}, 1, "", &h, 1));
  int m = bn(g, h, "bn2", c), sc = bn(g, h, "bn3", c);
  OK(b.node(g, STOKE_OP_ADD, "add", (int[]){m, sc}, 2, "", &a, 1));
  OK(b.node(g, STOKE_OP_RELU, "relu2", &a, 1, "", &z, 1));
  t = bn(g, z, "bn4", c);
  OK(b.node(g, STOKE_OP_RELU, "relu3", &t, 1, "", &q, 1));
  OK(b.node(g, STOKE_OP_ADD, "add2", (int[]){q, t}, 2, "", &s, 1));
  OK(b.node(g, STOKE_OP_FLATTEN, "flatten", &s, 1, "", &f, 1));
  OK(b.param(g, "fc.weight", &(stoke_shape){2, {classes, c * hw * hw}},
             (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &w));
  OK(b.param(g, "fc.bias", &(stoke_shape){1, {classes}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &bias));
  OK(b.node(g, STOKE_OP_LINEAR, "fc", (int[]){f, w, bias}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  return g;
}

static int count_fwd(const stoke_graph *g, const char *op) {
  int k = 0;
  for (int i = 0; i < g->n_fwd; i++) k += !strcmp(g->nodes[i].n.op, op);
  return k;
}

/* One forward and backward on a fixed batch; the loss. */
static double step(stoke_exec *x, const stoke_graph *g, int64_t n, int64_t numel, int64_t classes) {
  cpu_random_batch(x, seed, numel, n, classes);
  *(double *)stoke_exec_tensor(x, g->seed).data = 1.0;
  return cpu_loss(x);
}

/* The block both tests build: batch, channels, side, classes. */
enum { BN = 4, BC = 3, BHW = 3, BCLASSES = 5 };

/* Two plans of one block (the test's two variants) and their executors. */
typedef struct pair {
  stoke_graph *g[2];
  stoke_plan *p[2];
  stoke_exec *x[2];
} pair;

static void pair_execs(pair *q) {
  for (int i = 0; i < 2; i++) OK(stoke_exec_new(q->p[i], cpu, cpu_self, seed, &q->x[i]));
}

/* Two copies of the block, to be compiled two ways. */
static pair pair_blocks(void) { return (pair){{block(BN, BC, BHW, BCLASSES), block(BN, BC, BHW, BCLASSES)}}; }

/* One step of each executor on the same batch (step()): the two losses. */
static void pair_steps(pair *q, double loss[2]) {
  for (int i = 0; i < 2; i++) loss[i] = step(q->x[i], q->g[i], BN, BN * BC * BHW * BHW, BCLASSES);
}

static void pair_free(pair *q) {
  for (int i = 0; i < 2; i++) {
    stoke_exec_free(q->x[i]);
    stoke_plan_free(q->p[i]);
    stoke_graph_free(q->g[i]);
  }
}

/* join: the shortcut bn3 joined to the block's bn_add_relu (bn_add_bn_relu,
 * the default), or kept (opts.no_fuse_shortcut, [run] fuse_shortcut = false). */
static void fused_graph_matches(int join) {
  pair q = pair_blocks();
  stoke_graph *gu = q.g[0], *gf = q.g[1];
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .training = 1, .fuse = 1,
                       .no_fuse_shortcut = !join};
  stoke_plan *pu = q.p[0] = cpu_compile(gu, NULL, 0), *pf;
  OK(stoke_compile(gf, &o, &q.p[1]));
  pf = q.p[1];
  assert_int_equal(count_fwd(gu, STOKE_OP_BATCH_NORM), 4);
  assert_int_equal(count_fwd(gf, STOKE_OP_BN_RELU), 1);
  assert_int_equal(count_fwd(gf, STOKE_OP_BN_ADD_RELU), !join);
  assert_int_equal(count_fwd(gf, STOKE_OP_BN_ADD_BN_RELU), join);
  assert_int_equal(pf->n_shortcut_bn, join);
  assert_int_equal(count_fwd(gf, STOKE_OP_BATCH_NORM), 2 - join); /* the shortcut bn3 unless joined, and bn4 (two readers) */
  assert_int_equal(count_fwd(gf, STOKE_OP_RELU), 1);       /* relu3 */
  assert_int_equal(count_fwd(gf, STOKE_OP_ADD), 1);        /* add2 */
  assert_int_equal(gf->n_fwd, gu->n_fwd - 3 - join);
  if (join)
    cpu_expect_report(pf, "shortcut batch norms: 1 joined to their block's bn_add_relu", "the shortcut joined");
  /* bn_add_relu gets its 4th output, the ReLU bitmask its backward reads; bn_add_bn_relu the shortcut's
   * statistics too, and its inputs (r the shortcut's x, then its weight, bias and running statistics) */
  for (int i = 0; i < gf->n_fwd; i++) {
    const stoke_gnode *nd = &gf->nodes[i];
    if (strcmp(nd->n.op, STOKE_OP_BN_ADD_RELU) && strcmp(nd->n.op, STOKE_OP_BN_ADD_BN_RELU)) continue;
    assert_int_equal(nd->n_out, join ? 6 : 4);
    assert_int_equal(nd->n_in, join ? 10 : 6);
    const stoke_value *mk = &gf->values[nd->out[STOKE_BN_ADD_RELU_MASK]];
    assert_int_equal(mk->dtype, STOKE_U8);
    assert_int_equal(mk->producer, i);
    assert_int_equal(stoke_numel(&mk->shape), stoke_relu_mask_bytes(BN * BC * BHW * BHW));
    if (!join) continue;
    assert_string_equal(nd->n.name, "bn2");
    assert_string_equal(gf->values[nd->in[STOKE_BN2_WEIGHT]].name, "bn3.weight");
    assert_string_equal(gf->values[nd->in[STOKE_BN2_WEIGHT + 3]].name, "bn3.running_var");
    assert_string_equal(gf->values[nd->in[STOKE_BN_ADD_RELU_RESIDUAL]].name, gf->values[nd->in[0]].name);
    for (int j = STOKE_BN2_SAVED_MEAN; j < 6; j++) assert_int_equal(gf->values[nd->out[j]].producer, i);
    assert_int_equal(nd->n.n_attrs, 4);
  }
  /* every node after the ones making its inputs */
  for (int i = 0; i < gf->n_nodes; i++)
    for (int k = 0; k < gf->nodes[i].n_in; k++) {
      int pr = gf->values[gf->nodes[i].in[k]].producer;
      if (gf->nodes[i].pass == STOKE_FWD && pr >= i)
        fail_msg("node %d '%s' reads a value made by node %d", i, gf->nodes[i].n.name, pr);
    }
  assert_int_equal(pf->n_params, pu->n_params);
  pair_execs(&q);
  double l[2];
  pair_steps(&q, l);
  print_message("loss unfused %.17g, fused %.17g\n", l[0], l[1]);
  assert_true(isfinite(l[0]));
  assert_true(fabs(l[0] - l[1]) <= 1e-13 * fabs(l[0]));
  stoke_exec *xu = q.x[0], *xf = q.x[1];
  static const stoke_buffer_id bufs[] = {STOKE_BUF_GRADS, STOKE_BUF_STATE};
  for (int b = 0; b < 2; b++) {
    assert_int_equal(pu->bytes[bufs[b]], pf->bytes[bufs[b]]);
    const double *u = stoke_exec_buffer(xu, bufs[b]), *f = stoke_exec_buffer(xf, bufs[b]);
    double worst = 0;
    for (size_t i = 0; i < pu->bytes[bufs[b]] / sizeof(double); i++) {
      double e = fabs(u[i] - f[i]) / fmax(1e-12, fabs(u[i]));
      if (e > worst) worst = e;
      if (e > 1e-10) fail_msg("%s[%zu]: unfused %.17g, fused %.17g (seed %llu)", b ? "state" : "gradient", i, u[i],
                              f[i], (unsigned long long)seed);
    }
    print_message("%s: worst relative difference %.3g\n", b ? "running statistics" : "gradients", worst);
  }
  pair_free(&q);
}

static void test_fused_graph_matches(void **state) { fused_graph_matches(1); }
static void test_fused_graph_matches_shortcut_kept(void **state) { fused_graph_matches(0); }

/* A shortcut batch norm whose output another node reads too stays a
 * batch_norm: joined, its normalized output would not exist for that
 * reader. x -> m = bn(x), s = bn(x); z = relu(m + s); q = z + s. */
static void test_shortcut_with_two_readers_kept(void **state) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_NHWC, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, a, z, q, f, w, bias, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){4, {BN, BC, BHW, BHW}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {BN}}, STOKE_I32, &y));
  int m = bn(g, x, "m", BC), sc = bn(g, x, "s", BC);
  OK(b.node(g, STOKE_OP_ADD, "add", (int[]){m, sc}, 2, "", &a, 1));
  OK(b.node(g, STOKE_OP_RELU, "relu", &a, 1, "", &z, 1));
  OK(b.node(g, STOKE_OP_ADD, "add2", (int[]){z, sc}, 2, "", &q, 1));
  OK(b.node(g, STOKE_OP_FLATTEN, "flatten", &q, 1, "", &f, 1));
  OK(b.param(g, "fc.weight", &(stoke_shape){2, {BCLASSES, BC * BHW * BHW}},
             (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &w));
  OK(b.param(g, "fc.bias", &(stoke_shape){1, {BCLASSES}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &bias));
  OK(b.node(g, STOKE_OP_LINEAR, "fc", (int[]){f, w, bias}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  stoke_plan *p = cpu_compile(g, NULL, 1);
  assert_int_equal(count_fwd(g, STOKE_OP_BN_ADD_RELU), 1);
  assert_int_equal(count_fwd(g, STOKE_OP_BN_ADD_BN_RELU), 0);
  assert_int_equal(count_fwd(g, STOKE_OP_BATCH_NORM), 1);
  assert_int_equal(p->n_shortcut_bn, 0);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

/* Forward in backward (core/fuse_grad.c): the loss's forward node, right
 * before its backward node, is marked and skipped, and the backward kernel
 * (the cpu's softmax_ce has STOKE_KCAP_WITH_FORWARD) writes the loss too:
 * the loss, poisoned before the step, and every gradient equal a plan that
 * keeps the two nodes (opts.no_fwd_in_bwd), bit for bit; the plan says so. */
static void test_fwd_in_bwd(void **state) {
  pair q = pair_blocks();
  stoke_graph *gm = q.g[0], *gk = q.g[1];
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .training = 1};
  OK(stoke_compile(gm, &o, &q.p[0]));
  o.no_fwd_in_bwd = 1;
  OK(stoke_compile(gk, &o, &q.p[1]));
  stoke_plan *pm = q.p[0], *pk = q.p[1];
  assert_int_equal(pm->n_fwd_in_bwd, 1);
  assert_int_equal(pk->n_fwd_in_bwd, 0);
  const stoke_gnode *lf = &gm->nodes[gm->n_fwd - 1], *lb = &gm->nodes[gm->n_fwd];
  assert_string_equal(lf->n.op, STOKE_OP_SOFTMAX_CE);
  assert_true(lf->with_forward && lf->pass == STOKE_FWD);
  assert_true(lb->with_forward && lb->pass == STOKE_BWD && lb->fwd == gm->n_fwd - 1);
  for (int i = 0; i < gk->n_nodes; i++) assert_false(gk->nodes[i].with_forward);
  cpu_expect_report(pm, "forward in backward: softmax_ce 'loss' done by its backward kernel's call (cpu)",
                    "the loss's forward runs in its backward");
  pair_execs(&q);
  stoke_exec *xm = q.x[0], *xk = q.x[1];
  *(double *)stoke_exec_tensor(xm, gm->loss).data = NAN; /* written by the backward node, or the test fails */
  double l[2];
  pair_steps(&q, l);
  print_message("loss with the forward in the backward %.17g, as two nodes %.17g\n", l[0], l[1]);
  assert_true(isfinite(l[0]));
  assert_true(l[0] == l[1]);
  assert_int_equal(pm->bytes[STOKE_BUF_GRADS], pk->bytes[STOKE_BUF_GRADS]);
  assert_memory_equal(stoke_exec_buffer(xm, STOKE_BUF_GRADS), stoke_exec_buffer(xk, STOKE_BUF_GRADS),
                      pm->bytes[STOKE_BUF_GRADS]);
  pair_free(&q);
}

/* x -> bn1 -> relu -> max_pool2d (3x3, stride 2, padding 1) -> flatten -> fc -> loss, and a second
 * max_pool2d on relu(x), no parameter upstream (no gradient flows there), feeding a second fc into
 * the logits. */
static stoke_graph *pool_net(void) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_NHWC, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, h, p, p2, f, f2, w, w2, bias, bias2, l1, l2, logits, rx;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){4, {BN, BC, 5, 5}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {BN}}, STOKE_I32, &y));
  OK(b.node(g, STOKE_OP_RELU, "relu1", (int[]){bn(g, x, "bn1", BC)}, 1, "", &h, 1));
  OK(b.node(g, STOKE_OP_MAX_POOL2D, "pool", &h, 1, "kernel=3, stride=2, padding=1", &p, 1));
  OK(b.node(g, STOKE_OP_RELU, "relu_in", &x, 1, "", &rx, 1));
  OK(b.node(g, STOKE_OP_MAX_POOL2D, "pool_in", &rx, 1, "kernel=3, stride=2, padding=1", &p2, 1));
  OK(b.node(g, STOKE_OP_FLATTEN, "flatten", &p, 1, "", &f, 1));
  OK(b.node(g, STOKE_OP_FLATTEN, "flatten2", &p2, 1, "", &f2, 1));
  OK(b.param(g, "fc.weight", &(stoke_shape){2, {BCLASSES, BC * 9}}, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5},
             &w));
  OK(b.param(g, "fc2.weight", &(stoke_shape){2, {BCLASSES, BC * 9}}, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5},
             &w2));
  OK(b.param(g, "fc.bias", &(stoke_shape){1, {BCLASSES}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &bias));
  OK(b.param(g, "fc2.bias", &(stoke_shape){1, {BCLASSES}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &bias2));
  OK(b.node(g, STOKE_OP_LINEAR, "fc", (int[]){f, w, bias}, 3, "", &l1, 1));
  OK(b.node(g, STOKE_OP_LINEAR, "fc2", (int[]){f2, w2, bias2}, 3, "", &l2, 1));
  OK(b.node(g, STOKE_OP_ADD, "sum", (int[]){l1, l2}, 2, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  return g;
}

/* A gradient sum folded into a backward node (grad_sums_in_place) whose
 * target is also a reshape's gradient, viewed in the memory of the
 * reshape's output gradient: that memory is add's gradient, which add
 * gives to its other input too (b). x -> conv1 -> z and x -> reshape -> y;
 * s = y + flatten(convb(in)); t = s + flatten(z) -> fc -> loss. conv1's
 * dx adds into x.grad; were x.grad a view of y.grad (= s.grad = b.grad),
 * that add would land in b's gradient before convb's backward reads it
 * (seen: wb.grad off by 0.96). Every gradient against central differences. */
static void test_folded_sum_not_in_a_shared_view(void **state) {
  const int64_t n = 2, c = 2, hw = 3, classes = 3;
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_NCHW, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int in, lab, w0, wb, w1, x, bsrc, bb, z, y, s, zf, t, w, bias, logits;
  stoke_shape ws = {4, {c, c, 3, 3}};
  stoke_init_v1 u = {STOKE_INIT_UNIFORM, -0.5, 0.5};
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){4, {n, c, hw, hw}}, STOKE_F64, &in));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {n}}, STOKE_I32, &lab));
  OK(b.param(g, "w0", &ws, u, &w0));
  OK(b.param(g, "wb", &ws, u, &wb));
  OK(b.param(g, "w1", &ws, u, &w1));
  OK(b.node(g, STOKE_OP_CONV2D, "conv0", (int[]){in, w0}, 2, "padding=1", &x, 1));
  OK(b.node(g, STOKE_OP_CONV2D, "convb", (int[]){in, wb}, 2, "padding=1", &bsrc, 1));
  OK(b.node(g, STOKE_OP_FLATTEN, "flatb", &bsrc, 1, "", &bb, 1));
  OK(b.node(g, STOKE_OP_CONV2D, "conv1", (int[]){x, w1}, 2, "padding=1", &z, 1));
  char sh[64];
  snprintf(sh, sizeof sh, "shape=%lldx%lld", (long long)n, (long long)(c * hw * hw));
  OK(b.node(g, STOKE_OP_RESHAPE, "view", &x, 1, sh, &y, 1));
  OK(b.node(g, STOKE_OP_ADD, "add1", (int[]){y, bb}, 2, "", &s, 1));
  OK(b.node(g, STOKE_OP_FLATTEN, "flatz", &z, 1, "", &zf, 1));
  OK(b.node(g, STOKE_OP_ADD, "add2", (int[]){s, zf}, 2, "", &t, 1));
  OK(b.param(g, "fc.weight", &(stoke_shape){2, {classes, c * hw * hw}}, u, &w));
  OK(b.param(g, "fc.bias", &(stoke_shape){1, {classes}}, u, &bias));
  OK(b.node(g, STOKE_OP_LINEAR, "fc", (int[]){t, w, bias}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  stoke_plan *p = cpu_compile(g, NULL, 1);
  if (!p->n_accumulated) fail_msg("no gradient sum was folded: the case is not tested");
  stoke_exec *ex;
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &ex));
  cpu_random_batch(ex, stoke_hash3(seed, 71, 0), n * c * hw * hw, n, classes);
  int compared;
  double worst = cpu_check_gradients(ex, 1e-6, &compared);
  print_message("  %d sums folded; %d gradients within %.2g of central differences\n", p->n_accumulated, compared,
                worst);
  stoke_exec_free(ex);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

/* Training: the max_pool2d whose input gets a gradient becomes max_pool2d_idx, with its index (u8,
 * the pooled output's shape and layout) a second output its backward reads; the one with no
 * parameter upstream stays. The loss and every gradient equal the plan without it ([run]
 * pool_index = false) bit for bit, and the plan says so. An eval plan keeps max_pool2d. */
static void test_max_pool_index(void **state) {
  stoke_graph *g[2] = {pool_net(), pool_net()};
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .training = 1};
  stoke_plan *p[2];
  stoke_exec *x[2];
  OK(stoke_compile(g[0], &o, &p[0]));
  o.no_pool_index = 1;
  OK(stoke_compile(g[1], &o, &p[1]));
  assert_int_equal(p[0]->n_pool_index, 1);
  assert_int_equal(p[1]->n_pool_index, 0);
  assert_int_equal(count_fwd(g[0], STOKE_OP_MAX_POOL2D_IDX), 1);
  assert_int_equal(count_fwd(g[0], STOKE_OP_MAX_POOL2D), 1);
  assert_int_equal(count_fwd(g[1], STOKE_OP_MAX_POOL2D), 2);
  for (int i = 0; i < g[0]->n_fwd; i++) {
    const stoke_gnode *nd = &g[0]->nodes[i];
    if (!strcmp(nd->n.name, "pool_in")) assert_string_equal(nd->n.op, STOKE_OP_MAX_POOL2D);
    if (strcmp(nd->n.op, STOKE_OP_MAX_POOL2D_IDX)) continue;
    assert_string_equal(nd->n.name, "pool");
    assert_int_equal(nd->n_out, 2);
    const stoke_value *ix = &g[0]->values[nd->out[1]], *y = &g[0]->values[nd->out[0]];
    assert_string_equal(ix->name, "pool:index");
    assert_int_equal(ix->dtype, STOKE_U8);
    assert_int_equal(ix->producer, i);
    assert_int_equal(ix->layout, y->layout);
    assert_memory_equal(ix->shape.d, y->shape.d, sizeof(int64_t) * 4);
  }
  cpu_expect_report(p[0], "max pools: 1 save their window indices for backward (max_pool2d_idx)",
                    "which max pools save their indices");
  char *rep = cpu_plan_report(p[1]);
  if (strstr(rep, "max pools:")) fail_msg("pool_index off, yet the plan says:\n%s", rep);
  free(rep);
  for (int i = 0; i < 2; i++) OK(stoke_exec_new(p[i], cpu, cpu_self, seed, &x[i]));
  double l[2];
  for (int i = 0; i < 2; i++) l[i] = step(x[i], g[i], BN, BN * BC * 25, BCLASSES);
  print_message("loss with saved indices %.17g, without %.17g\n", l[0], l[1]);
  assert_true(isfinite(l[0]));
  assert_true(l[0] == l[1]);
  assert_int_equal(p[0]->bytes[STOKE_BUF_GRADS], p[1]->bytes[STOKE_BUF_GRADS]);
  assert_memory_equal(stoke_exec_buffer(x[0], STOKE_BUF_GRADS), stoke_exec_buffer(x[1], STOKE_BUF_GRADS),
                      p[0]->bytes[STOKE_BUF_GRADS]);
  for (int i = 0; i < 2; i++) {
    stoke_exec_free(x[i]);
    stoke_plan_free(p[i]);
    stoke_graph_free(g[i]);
  }
  stoke_graph *ge = pool_net();
  stoke_plan *pe;
  o.no_pool_index = 0, o.training = 0;
  OK(stoke_compile(ge, &o, &pe));
  assert_int_equal(pe->n_pool_index, 0);
  assert_int_equal(count_fwd(ge, STOKE_OP_MAX_POOL2D), 2);
  stoke_plan_free(pe);
  stoke_graph_free(ge);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fused_graph_matches),
      cmocka_unit_test(test_fused_graph_matches_shortcut_kept),
      cmocka_unit_test(test_shortcut_with_two_readers_kept),
      cmocka_unit_test(test_fwd_in_bwd),
      cmocka_unit_test(test_max_pool_index),
      cmocka_unit_test(test_folded_sum_not_in_a_shared_view),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
