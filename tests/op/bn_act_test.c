/* tests/op/bn_act_test.c: the CPU reference kernels of the fused ops
 * bn_relu and bn_add_relu: forward and backward equal, bit for bit, to the
 * unfused nodes they replace (batch_norm -> [add ->] relu, each the CPU's
 * own kernel; bn_add_bn_relu to batch_norm -> bn_add_relu), training and eval, (N, C) / NCHW / NHWC, f32 and f64, the
 * running statistics too; every gradient (x, weight, bias, residual)
 * against central finite differences in double; bad arguments refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "tests/common/relu_mask.h"

#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_FLOOR 1e-2

typedef struct shape_cfg {
  int ndim;
  int64_t n, c, h, w;
  stoke_layout layout;
  const char *label;
} shape_cfg;

static const shape_cfg cfgs[] = {
    {2, 6, 3, 1, 1, STOKE_LAYOUT_ANY, "(N, C)"},
    {4, 2, 3, 3, 2, STOKE_NCHW, "NCHW"},
    {4, 2, 3, 3, 2, STOKE_NHWC, "NHWC"},
};
#define N_CFGS ((int)(sizeof cfgs / sizeof *cfgs))

/* One fused call: in = x, weight, bias, running_mean, running_var (, r);
 * out = y, saved_mean, saved_invstd (, the ReLU bitmask); rm0/rv0 the
 * running statistics as made, to put back. */
typedef struct act_case {
  stoke_node_v1 node;
  int add, n_out;
  stoke_tensor in[6], out[4], rm0, rv0;
} act_case;

static stoke_tensor x_like(stoke_dtype dt, const shape_cfg *g) {
  stoke_tensor t = g->ndim == 4 ? h_tensor(dt, 4, g->n, g->c, g->h, g->w) : h_tensor(dt, 2, g->n, g->c);
  t.layout = g->layout;
  return t;
}

static act_case make_case(stoke_dtype dt, const shape_cfg *g, int add) {
  act_case b;
  memset(&b, 0, sizeof b);
  b.add = add;
  b.node = h_node(add ? STOKE_OP_BN_ADD_RELU : STOKE_OP_BN_RELU, "tail");
  b.node.n_attrs = 2;
  b.node.attrs[STOKE_BATCH_NORM_EPS].f = 1e-5;
  b.node.attrs[STOKE_BATCH_NORM_MOMENTUM].f = 0.1;
  b.in[0] = x_like(dt, g);
  /* values of either sign after the normalization: the ReLU masks some */
  h_random(&b.in[0], -2, 2);
  for (int i = 1; i < 5; i++) b.in[i] = h_tensor(dt, 1, g->c);
  for (int64_t c = 0; c < g->c; c++) {
    h_set(&b.in[1], c, (h_next() & 1 ? 1 : -1) * h_uniform(0.5, 1.5));
    h_set(&b.in[2], c, h_uniform(-0.5, 0.5));
    h_set(&b.in[3], c, h_uniform(-0.5, 0.5));
    h_set(&b.in[4], c, h_uniform(0.5, 2));
  }
  if (add) {
    b.in[5] = x_like(dt, g);
    h_random(&b.in[5], -1, 1);
  }
  b.out[0] = h_like(&b.in[0], -1);
  b.out[1] = h_tensor(dt, 1, g->c);
  b.out[2] = h_tensor(dt, 1, g->c);
  b.n_out = add ? 4 : 3;
  if (add) b.out[3] = h_tensor(STOKE_U8, 1, stoke_relu_mask_bytes(h_numel(&b.in[0])));
  b.rm0 = h_like(&b.in[3], -1);
  b.rv0 = h_like(&b.in[4], -1);
  h_convert(&b.rm0, &b.in[3]);
  h_convert(&b.rv0, &b.in[4]);
  return b;
}

static void free_case(act_case *b) {
  for (int i = 0; i < 6; i++) h_free(&b->in[i]);
  for (int i = 0; i < b->n_out; i++) h_free(&b->out[i]);
  h_free(&b->rm0);
  h_free(&b->rv0);
}

static void restore_running(act_case *b) {
  h_convert(&b->in[3], &b->rm0);
  h_convert(&b->in[4], &b->rv0);
}

static stoke_kernel_args_v1 args_of(const stoke_node_v1 *node, int n_in, int n_out, const stoke_tensor *in,
                                    const stoke_tensor *out, int training) {
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = node;
  a.n_in = n_in;
  a.n_out = n_out;
  a.in = in;
  a.out = out;
  a.training = training;
  return a;
}

static void fused_fwd(const act_case *b, stoke_tensor *out, int training) {
  for (int i = 0; i < b->n_out; i++) memset(out[i].data, 0xff, stoke_tensor_bytes(&out[i]));
  stoke_kernel_args_v1 a = args_of(&b->node, b->add ? 6 : 5, b->n_out, b->in, out, training);
  H_OK(h_run(h_kernel(b->node.op, STOKE_FWD, b->in[0].dtype), &a));
  for (int i = 0; i < 3; i++) h_check_written(&out[i], "fused forward");
  if (!b->add) return;
  /* the bitmask: bit e exactly y's element e > 0 (memory order) */
  const uint8_t *m = out[3].data;
  int64_t e = relu_mask_first_wrong(m, out[0].data, out[0].dtype, h_numel(&out[0]));
  if (e >= 0) H_FAIL("bn_add_relu ReLU mask bit %lld is %d, y %g", (long long)e, relu_mask_bit(m, e), h_get(&out[0], e));
}

/* din (x, weight, bias, and r for bn_add_relu, poisoned) from dy; only
 * what bwd_needs names holds data. */
static void fused_bwd(const act_case *b, const stoke_tensor *dy, stoke_tensor *din, int training, float beta) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, b->node.op);
  assert_non_null(t);
  int n_in = b->add ? 6 : 5;
  stoke_tensor in[6], out[4], dout[4];
  for (int i = 0; i < n_in; i++) {
    in[i] = b->in[i];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) in[i].data = NULL;
  }
  for (int j = 0; j < b->n_out; j++) {
    out[j] = b->out[j];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j))) out[j].data = NULL;
    dout[j] = b->out[j];
    dout[j].data = NULL;
  }
  dout[0] = *dy;
  stoke_kernel_args_v1 a = args_of(&b->node, n_in, b->n_out, in, out, training);
  a.din = din;
  a.dout = dout;
  a.param_grads = 6;
  a.param_grad_beta = beta;
  H_OK(h_run(h_kernel(b->node.op, STOKE_BWD, b->in[0].dtype), &a));
}

static void make_din(const act_case *b, stoke_tensor *din) {
  for (int i = 0; i < 6; i++) {
    din[i] = b->in[i];
    din[i].data = NULL;
    if (i < 3 || (i == 5 && b->add)) {
      din[i] = h_like(&b->in[i], -1);
      h_poison(&din[i]);
    }
  }
}

static void free_din(stoke_tensor *din) {
  for (int i = 0; i < 6; i++) h_free(&din[i]);
}

static void expect_same(const stoke_tensor *got, const stoke_tensor *want, const char *what, const char *label) {
  H_CHECK(!memcmp(got->data, want->data, stoke_tensor_bytes(want)), "%s %s: fused differs from the unfused nodes "
          "(relative norm %.3g)", label, what, h_rel_norm(got, want));
}

/* The fused kernels against batch_norm -> [add ->] relu run node by node
 * with the CPU's own kernels: the same numbers, bit for bit. */
static void check_composition(stoke_dtype dt, const shape_cfg *g, int add, int training) {
  char label[96];
  snprintf(label, sizeof label, "%s %s %s %s", add ? "bn_add_relu" : "bn_relu", g->label, stoke_dtype_name(dt),
           training ? "training" : "eval");
  act_case b = make_case(dt, g, add);
  fused_fwd(&b, b.out, training);
  stoke_tensor frm = h_like(&b.in[3], -1), frv = h_like(&b.in[4], -1);
  h_convert(&frm, &b.in[3]);
  h_convert(&frv, &b.in[4]);
  restore_running(&b);
  /* unfused: batch_norm, add, relu forward */
  stoke_node_v1 bn = h_node(STOKE_OP_BATCH_NORM, "bn"), addn = h_node(STOKE_OP_ADD, "add"),
                relu = h_node(STOKE_OP_RELU, "relu");
  bn.n_attrs = 2;
  bn.attrs[0] = b.node.attrs[0];
  bn.attrs[1] = b.node.attrs[1];
  stoke_tensor u[3] = {h_like(&b.out[0], -1), h_like(&b.out[1], -1), h_like(&b.out[2], -1)};
  stoke_tensor s = h_like(&b.out[0], -1), y = h_like(&b.out[0], -1);
  stoke_kernel_args_v1 a = args_of(&bn, 5, 3, b.in, u, training);
  H_OK(h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_FWD, dt), &a));
  stoke_tensor add_in[2] = {u[0], add ? b.in[5] : u[0]};
  if (add) {
    a = args_of(&addn, 2, 1, add_in, &s, training);
    H_OK(h_run(h_kernel(STOKE_OP_ADD, STOKE_FWD, dt), &a));
  } else {
    h_convert(&s, &u[0]);
  }
  a = args_of(&relu, 1, 1, &s, &y, training);
  H_OK(h_run(h_kernel(STOKE_OP_RELU, STOKE_FWD, dt), &a));
  expect_same(&b.out[0], &y, "y", label);
  expect_same(&b.out[1], &u[1], "saved_mean", label);
  expect_same(&b.out[2], &u[2], "saved_invstd", label);
  expect_same(&frm, &b.in[3], "running_mean", label);
  expect_same(&frv, &b.in[4], "running_var", label);
  int masked = 0;
  for (int64_t i = 0; i < h_numel(&y); i++) masked += h_get(&y, i) == 0;
  H_CHECK(masked > 0 && masked < h_numel(&y), "%s: the ReLU masked %d of %lld values; the case tests nothing",
          label, masked, (long long)h_numel(&y));
  /* backward: relu, add, batch_norm node by node */
  stoke_tensor dy = h_like(&y, -1), ds = h_like(&y, -1), din[6], ref[6];
  h_random(&dy, -1, 1);
  make_din(&b, din);
  fused_bwd(&b, &dy, din, training, 0.0f);
  stoke_tensor relu_out = y, relu_din = ds;
  a = args_of(&relu, 1, 1, &s, &relu_out, training);
  a.din = &relu_din;
  a.dout = &dy;
  H_OK(h_run(h_kernel(STOKE_OP_RELU, STOKE_BWD, dt), &a));
  make_din(&b, ref);
  stoke_tensor bn_dout[3] = {ds, u[1], u[2]};
  bn_dout[1].data = bn_dout[2].data = NULL;
  a = args_of(&bn, 5, 3, b.in, u, training);
  a.din = ref;
  a.dout = bn_dout;
  a.param_grads = 6;
  H_OK(h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_BWD, dt), &a));
  static const char *names[] = {"dx", "dweight", "dbias", "", "", "dr"};
  for (int i = 0; i < 3; i++) expect_same(&din[i], &ref[i], names[i], label);
  if (add) expect_same(&din[5], &ds, "dr (the add's gradient)", label);
  free_din(din);
  free_din(ref);
  for (int i = 0; i < 3; i++) h_free(&u[i]);
  h_free(&s);
  h_free(&y);
  h_free(&dy);
  h_free(&ds);
  h_free(&frm);
  h_free(&frv);
  free_case(&b);
}

static void test_matches_unfused_nodes(void **state) {
  static const stoke_dtype dts[] = {STOKE_F64, STOKE_F32};
  for (int d = 0; d < 2; d++)
    for (int g = 0; g < N_CFGS; g++)
      for (int add = 0; add < 2; add++)
        for (int training = 0; training < 2; training++) check_composition(dts[d], &cfgs[g], add, training);
}

/* bn_add_bn_relu against batch_norm (the shortcut, over r) -> bn_add_relu
 * run node by node with the CPU's own kernels (checked above against the
 * unfused nodes): y, the bitmask, both batch norms' saved and running
 * statistics, and every gradient, bit for bit; the parameters' gradients
 * with param_grad_beta 0 and 1 (accumulated onto random values). */
static void check_dual(stoke_dtype dt, const shape_cfg *g, int training, float beta) {
  char label[96];
  snprintf(label, sizeof label, "bn_add_bn_relu %s %s %s beta %g", g->label, stoke_dtype_name(dt),
           training ? "training" : "eval", beta);
  act_case b = make_case(dt, g, 1); /* in[5], r, is the shortcut's x here */
  h_random(&b.in[5], -2, 2);
  stoke_tensor in[10], out[6], p2[4], p20[2];
  for (int i = 0; i < 4; i++) p2[i] = h_tensor(dt, 1, g->c);
  for (int64_t c = 0; c < g->c; c++) {
    h_set(&p2[0], c, (h_next() & 1 ? 1 : -1) * h_uniform(0.5, 1.5));
    h_set(&p2[1], c, h_uniform(-0.5, 0.5));
    h_set(&p2[2], c, h_uniform(-0.5, 0.5));
    h_set(&p2[3], c, h_uniform(0.5, 2));
  }
  for (int i = 0; i < 2; i++) p20[i] = h_like(&p2[2 + i], -1), h_convert(&p20[i], &p2[2 + i]);
  for (int i = 0; i < 6; i++) in[i] = b.in[i];
  for (int i = 0; i < 4; i++) in[STOKE_BN2_WEIGHT + i] = p2[i];
  for (int j = 0; j < 4; j++) out[j] = b.out[j];
  out[4] = h_like(&b.out[1], -1), out[5] = h_like(&b.out[2], -1);
  for (int j = 0; j < 6; j++) memset(out[j].data, 0xff, stoke_tensor_bytes(&out[j]));
  stoke_node_v1 node = h_node(STOKE_OP_BN_ADD_BN_RELU, "tail");
  node.n_attrs = 4;
  node.attrs[0].f = 1e-5, node.attrs[1].f = 0.1, node.attrs[2].f = 1e-3, node.attrs[3].f = 0.3;
  stoke_kernel_args_v1 a = args_of(&node, 10, 6, in, out, training);
  H_OK(h_run(h_kernel(STOKE_OP_BN_ADD_BN_RELU, STOKE_FWD, dt), &a));
  for (int j = 0; j < 6; j++)
    if (j != STOKE_BN_ADD_RELU_MASK) h_check_written(&out[j], label);
  stoke_tensor run[4]; /* the dual's running statistics, then put back */
  for (int i = 0; i < 2; i++) run[i] = h_like(&b.in[3 + i], -1), h_convert(&run[i], &b.in[3 + i]);
  for (int i = 0; i < 2; i++) run[2 + i] = h_like(&p2[2 + i], -1), h_convert(&run[2 + i], &p2[2 + i]);
  restore_running(&b);
  for (int i = 0; i < 2; i++) h_convert(&p2[2 + i], &p20[i]);
  /* node by node: the shortcut's batch_norm, then bn_add_relu with its output as the residual */
  stoke_node_v1 bn = h_node(STOKE_OP_BATCH_NORM, "shortcut"), tail = h_node(STOKE_OP_BN_ADD_RELU, "tail");
  bn.n_attrs = tail.n_attrs = 2;
  bn.attrs[0] = node.attrs[2], bn.attrs[1] = node.attrs[3];
  tail.attrs[0] = node.attrs[0], tail.attrs[1] = node.attrs[1];
  stoke_tensor bin[5] = {b.in[5], p2[0], p2[1], p2[2], p2[3]};
  stoke_tensor bout[3] = {h_like(&b.in[5], -1), h_like(&b.out[1], -1), h_like(&b.out[2], -1)};
  a = args_of(&bn, 5, 3, bin, bout, training);
  H_OK(h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_FWD, dt), &a));
  stoke_tensor tin[6], tout[4];
  for (int i = 0; i < 5; i++) tin[i] = b.in[i];
  tin[5] = bout[0];
  for (int j = 0; j < 4; j++) tout[j] = h_like(&b.out[j], -1);
  a = args_of(&tail, 6, 4, tin, tout, training);
  H_OK(h_run(h_kernel(STOKE_OP_BN_ADD_RELU, STOKE_FWD, dt), &a));
  static const char *const onames[] = {"y", "saved_mean", "saved_invstd", "mask", "shortcut saved_mean",
                                       "shortcut saved_invstd"};
  for (int j = 0; j < 4; j++) expect_same(&out[j], &tout[j], onames[j], label);
  for (int j = 4; j < 6; j++) expect_same(&out[j], &bout[j - 3], onames[j], label);
  for (int i = 0; i < 2; i++) expect_same(&run[i], &b.in[3 + i], i ? "running_var" : "running_mean", label);
  for (int i = 0; i < 2; i++)
    expect_same(&run[2 + i], &p2[2 + i], i ? "shortcut running_var" : "shortcut running_mean", label);
  /* backward: every gradient from dy; the parameters' onto the same random values on both sides */
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, STOKE_OP_BN_ADD_BN_RELU);
  assert_non_null(t);
  stoke_tensor dy = h_like(&b.out[0], -1), din[10], pre[10], dout[6], bin_b[10], bout_b[6];
  h_random(&dy, -1, 1);
  memset(din, 0, sizeof din), memset(pre, 0, sizeof pre);
  for (int i = 0; i < 10; i++) {
    din[i] = in[i];
    din[i].data = NULL;
    if (i == 3 || i == 4 || i == 8 || i == 9) continue;
    din[i] = h_like(&in[i], -1);
    int param = i == 1 || i == 2 || i == 6 || i == 7;
    if (param && beta != 0) h_random(&din[i], -1, 1);
    else h_poison(&din[i]);
    pre[i] = h_like(&in[i], -1);
    h_convert(&pre[i], &din[i]);
  }
  for (int i = 0; i < 10; i++) {
    bin_b[i] = in[i];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) bin_b[i].data = NULL;
  }
  for (int j = 0; j < 6; j++) {
    bout_b[j] = out[j];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j))) bout_b[j].data = NULL;
    dout[j] = out[j], dout[j].data = NULL;
  }
  dout[0] = dy;
  a = args_of(&node, 10, 6, bin_b, bout_b, training);
  a.din = din, a.dout = dout, a.param_grads = 0xc6u, a.param_grad_beta = beta;
  H_OK(h_run(h_kernel(STOKE_OP_BN_ADD_BN_RELU, STOKE_BWD, dt), &a));
  /* node by node: bn_add_relu (dr, the masked dy), then the shortcut's batch_norm from dr */
  stoke_tensor tdin[6], tdout[4], dr = h_like(&b.in[5], -1);
  for (int i = 0; i < 6; i++) {
    tdin[i] = i == 5 ? dr : pre[i];
    if (i == 3 || i == 4) tdin[i] = in[i], tdin[i].data = NULL;
  }
  for (int j = 0; j < 4; j++) tdout[j] = tout[j], tdout[j].data = NULL;
  tdout[0] = dy;
  a = args_of(&tail, 6, 4, tin, tout, training);
  a.din = tdin, a.dout = tdout, a.param_grads = 6, a.param_grad_beta = beta;
  H_OK(h_run(h_kernel(STOKE_OP_BN_ADD_RELU, STOKE_BWD, dt), &a));
  stoke_tensor bdin[5] = {pre[5], pre[6], pre[7], in[8], in[9]}, bdout[3] = {dr, bout[1], bout[2]};
  bdin[3].data = bdin[4].data = NULL;
  bdout[1].data = bdout[2].data = NULL;
  a = args_of(&bn, 5, 3, bin, bout, training);
  a.din = bdin, a.dout = bdout, a.param_grads = 6, a.param_grad_beta = beta;
  H_OK(h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_BWD, dt), &a));
  static const char *const gnames[] = {"dx", "dweight", "dbias", "", "", "dr", "shortcut dweight", "shortcut dbias"};
  for (int i = 0; i < 8; i++)
    if (din[i].data) expect_same(&din[i], &pre[i], gnames[i], label);
  for (int i = 0; i < 10; i++) h_free(&din[i]), h_free(&pre[i]);
  for (int i = 0; i < 4; i++) h_free(&p2[i]), h_free(&run[i]), h_free(&tout[i]);
  for (int i = 0; i < 3; i++) h_free(&bout[i]);
  for (int i = 0; i < 2; i++) h_free(&p20[i]);
  h_free(&out[4]), h_free(&out[5]), h_free(&dy), h_free(&dr);
  free_case(&b);
}

static void test_dual_matches_unfused_nodes(void **state) {
  static const stoke_dtype dts[] = {STOKE_F64, STOKE_F32};
  for (int d = 0; d < 2; d++)
    for (int g = 0; g < N_CFGS; g++)
      for (int training = 0; training < 2; training++)
        for (int beta = 0; beta < 2; beta++) check_dual(dts[d], &cfgs[g], training, (float)beta);
}

/* A NaN stays NaN through the fused ReLU, as torch.relu and the CPU's own
 * relu node keep it (eval: each y from its own x; it came out 0, hiding a
 * NaN from an inference); its mask bit is 0 (its gradient 0, as PyTorch's). */
static void test_nan_stays_nan(void **state) {
  for (int add = 0; add < 2; add++) {
    act_case b = make_case(STOKE_F32, &cfgs[1], add);
    h_set(&b.in[0], 3, NAN);
    /* zeros first, not the NaN poison: y[3] must be a NaN the kernel wrote */
    for (int i = 0; i < b.n_out; i++) memset(b.out[i].data, 0, stoke_tensor_bytes(&b.out[i]));
    stoke_kernel_args_v1 a = args_of(&b.node, add ? 6 : 5, b.n_out, b.in, b.out, 0);
    H_OK(h_run(h_kernel(b.node.op, STOKE_FWD, STOKE_F32), &a));
    H_CHECK(isnan(h_get(&b.out[0], 3)), "%s eval: y[3] = %g from x[3] = NaN", add ? "bn_add_relu" : "bn_relu",
            h_get(&b.out[0], 3));
    if (add) H_CHECK(!relu_mask_bit(b.out[3].data, 3), "bn_add_relu: the NaN's mask bit is set");
    free_case(&b);
  }
}

/* dL/d in[i][j] for L = sum(y R), central differences; the running
 * statistics are put back before each forward. */
static double numeric(act_case *b, const stoke_tensor *r, int i, int64_t j, int training) {
  stoke_tensor yp[4], ym[4];
  for (int k = 0; k < b->n_out; k++) yp[k] = h_like(&b->out[k], -1), ym[k] = h_like(&b->out[k], -1);
  double v = h_get(&b->in[i], j);
  h_set(&b->in[i], j, v + FD_H);
  restore_running(b);
  fused_fwd(b, yp, training);
  h_set(&b->in[i], j, v - FD_H);
  restore_running(b);
  fused_fwd(b, ym, training);
  h_set(&b->in[i], j, v);
  restore_running(b);
  double d = 0;
  for (int64_t k = 0; k < h_numel(&yp[0]); k++) d += (h_get(&yp[0], k) - h_get(&ym[0], k)) * h_get(r, k);
  for (int k = 0; k < b->n_out; k++) h_free(&yp[k]), h_free(&ym[k]);
  return d / (2 * FD_H);
}

static void grad_check(const shape_cfg *g, int add, int training) {
  act_case b = make_case(STOKE_F64, g, add);
  char label[96];
  snprintf(label, sizeof label, "%s %s %s", add ? "bn_add_relu" : "bn_relu", g->label,
           training ? "training" : "eval");
  fused_fwd(&b, b.out, training);
  restore_running(&b);
  stoke_tensor r = h_like(&b.out[0], -1), din[6];
  h_random(&r, -1, 1);
  make_din(&b, din);
  fused_bwd(&b, &r, din, training, 0.0f);
  static const char *names[] = {"x", "weight", "bias", "", "", "residual"};
  for (int i = 0; i < 6; i++) {
    if (!din[i].data) continue;
    h_check_written(&din[i], label);
    double worst = 0;
    for (int64_t j = 0; j < h_numel(&b.in[i]); j++) {
      double num = numeric(&b, &r, i, j, training), ana = h_get(&din[i], j);
      double e = fabs(ana - num) / fmax(fmax(fabs(ana), fabs(num)), FD_FLOOR);
      if (e > worst) worst = e;
      H_CHECK(e < FD_TOL, "%s: d%s[%lld] = %.12g, finite differences %.12g (rel err %.3g)", label, names[i],
              (long long)j, ana, num, e);
    }
    print_message("%s: d%s max rel err %.3g\n", label, names[i], worst);
  }
  free_din(din);
  h_free(&r);
  free_case(&b);
}

static void test_finite_differences(void **state) {
  for (int g = 0; g < N_CFGS; g++)
    for (int add = 0; add < 2; add++)
      for (int training = 0; training < 2; training++) grad_check(&cfgs[g], add, training);
}

/* dweight, dbias accumulate under param_grad_beta; dx and dr are overwritten. */
static void test_param_grad_beta(void **state) {
  act_case b = make_case(STOKE_F64, &cfgs[2], 1);
  fused_fwd(&b, b.out, 1);
  stoke_tensor dy = h_like(&b.out[0], -1), base[6], acc[6];
  h_random(&dy, -1, 1);
  make_din(&b, base);
  fused_bwd(&b, &dy, base, 1, 0.0f);
  make_din(&b, acc);
  for (int i = 1; i < 3; i++) h_set_all(&acc[i], (double[]){1, 2, 3});
  fused_bwd(&b, &dy, acc, 1, 0.5f);
  for (int i = 0; i < 6; i++) {
    if (!acc[i].data) continue;
    for (int64_t j = 0; j < h_numel(&acc[i]); j++) {
      double want = h_get(&base[i], j) + (i == 1 || i == 2 ? 0.5 * (double)(j + 1) : 0);
      H_CHECK(fabs(h_get(&acc[i], j) - want) <= 1e-12 * fmax(1, fabs(want)), "din[%d][%lld] = %.15g, want %.15g", i,
              (long long)j, h_get(&acc[i], j), want);
    }
  }
  free_din(base);
  free_din(acc);
  h_free(&dy);
  free_case(&b);
}

/* A residual of another shape is STOKE_E_INVALID naming the node. */
static void test_errors(void **state) {
  act_case b = make_case(STOKE_F64, &cfgs[1], 1);
  b.in[5].shape.d[3] += 1;
  stoke_kernel_args_v1 a = args_of(&b.node, 6, 4, b.in, b.out, 1);
  stoke_err *e = h_run(h_kernel(STOKE_OP_BN_ADD_RELU, STOKE_FWD, STOKE_F64), &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  H_CHECK(strstr(e->msg, "'tail'") && strstr(e->msg, "residual"), "message: %s", e->msg);
  stoke_err_free(e);
  b.in[5].shape.d[3] -= 1;
  free_case(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_matches_unfused_nodes),
      H_TEST(test_dual_matches_unfused_nodes),
      H_TEST(test_finite_differences),
      H_TEST(test_nan_stays_nan),
      H_TEST(test_param_grad_beta),
      H_TEST(test_errors),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
