/* tests/op/tape.h: a tape of CPU kernel calls for the op tests: values
 * (inputs, parameters, running statistics, activations), nodes run forward
 * in order with their outputs poisoned first, and backward in reverse the
 * way the compiler derives it (a node's backward runs when an output has a
 * gradient and an input wants one; it sees only what its op's bwd_needs
 * keeps; gradients of a value read twice are summed), plus central finite
 * differences of L = sum(out R) through the whole tape.
 * Include after harness.h (and stoke/graph.h); every helper is static. */
#ifndef STOKE_TESTS_OP_TAPE_H
#define STOKE_TESTS_OP_TAPE_H

#define TP_MAXV 40
#define TP_MAXN 8

typedef enum tp_kind {
  TP_ACT = 0, /* made by a node */
  TP_INPUT,   /* an input that wants its gradient */
  TP_PARAM,   /* a parameter: wants its gradient, accumulated under param_grad_beta */
  TP_STATE,   /* running statistics: updated in place, put back before each finite difference */
  TP_CONST    /* an input without gradient */
} tp_kind;

typedef struct tp_node {
  char name[32];
  stoke_node_v1 node;
  int n_in, n_out;
  int in[STOKE_MAX_IO], out[STOKE_MAX_IO];
} tp_node;

typedef struct tape {
  stoke_dtype dt;
  stoke_layout layout; /* of 4-D values */
  int training;
  int nv, nn;
  stoke_tensor v[TP_MAXV], grad[TP_MAXV], state0[TP_MAXV];
  tp_kind kind[TP_MAXV];
  tp_node n[TP_MAXN];
  int out; /* the value the loss reads: L = sum(v[out] R) */
} tape;

static __attribute__((unused)) tape *tp_new(stoke_dtype dt, stoke_layout layout, int training) {
  tape *t = calloc(1, sizeof *t);
  assert_non_null(t);
  t->dt = dt;
  t->layout = layout;
  t->training = training;
  t->out = -1;
  return t;
}

static void tp_free(tape *t) {
  for (int i = 0; i < t->nv; i++) h_free(&t->v[i]), h_free(&t->grad[i]), h_free(&t->state0[i]);
  free(t);
}

/* A value of `shape` (4-D: the tape's layout; a 4-D parameter row-major, as
 * the compiler keeps parameters: a convolution's [O, C, kh, kw] filter),
 * uniform in [lo, hi). */
static int tp_value(tape *t, tp_kind kind, stoke_shape shape, double lo, double hi) {
  assert_true(t->nv < TP_MAXV);
  int id = t->nv++;
  stoke_layout l = shape.ndim != 4 ? STOKE_LAYOUT_ANY : kind == TP_PARAM ? STOKE_NCHW : t->layout;
  stoke_tensor x = {NULL, shape, t->dt, l, STOKE_DEV_CPU};
  t->v[id] = h_like(&x, -1);
  h_random(&t->v[id], lo, hi);
  t->kind[id] = kind;
  if (kind == TP_STATE) {
    t->state0[id] = h_like(&x, -1);
    h_convert(&t->state0[id], &t->v[id]);
  }
  return id;
}

/* The four values of a batch norm over c channels: weight (of either
 * sign) and bias as parameters (or constants 1 and 0 when !params), then
 * running_mean and running_var as state. ids[0..3]. */
static __attribute__((unused)) void tp_bn_values(tape *t, int64_t c, int params, int ids[4]) {
  stoke_shape s = {1, {c}};
  ids[0] = tp_value(t, params ? TP_PARAM : TP_CONST, s, 0.5, 1.5);
  ids[1] = tp_value(t, params ? TP_PARAM : TP_CONST, s, -0.5, 0.5);
  for (int64_t i = 0; i < c && params; i++)
    if (h_next() & 1) h_set(&t->v[ids[0]], i, -h_get(&t->v[ids[0]], i));
  if (!params)
    for (int64_t i = 0; i < c; i++) h_set(&t->v[ids[0]], i, 1), h_set(&t->v[ids[1]], i, 0);
  ids[2] = tp_value(t, TP_STATE, s, -0.5, 0.5);
  ids[3] = tp_value(t, TP_STATE, s, 0.5, 2);
}

/* A node of `op` with attributes from text; its outputs (shapes from the
 * op's inference) are new values, out[0] the tape's output from now on. */
static int tp_node_add(tape *t, const char *op, const char *attrs, int n_in, const int *in, int *out) {
  assert_true(t->nn < TP_MAXN);
  tp_node *n = &t->n[t->nn++];
  snprintf(n->name, sizeof n->name, "%s%d", op, t->nn);
  H_OK(stoke_node_init(h_reg, op, n->name, attrs, &n->node));
  n->node.name = n->name;
  const stoke_op_type_v1 *ty = stoke_find_op(h_reg, op);
  assert_non_null(ty);
  assert_int_equal(n_in, ty->n_inputs);
  n->n_in = n_in;
  n->n_out = ty->n_outputs;
  stoke_value_desc_v1 ind[STOKE_MAX_IO], outd[STOKE_MAX_IO];
  memset(outd, 0, sizeof outd);
  for (int k = 0; k < n_in; k++) {
    n->in[k] = in[k];
    ind[k] = (stoke_value_desc_v1){t->v[in[k]].shape, t->v[in[k]].dtype};
  }
  H_OK(ty->infer(&n->node, ind, outd));
  for (int j = 0; j < n->n_out; j++) {
    int id = tp_value(t, TP_ACT, outd[j].shape, 0, 0);
    t->v[id].dtype = outd[j].dtype;
    assert_int_equal(outd[j].dtype, t->dt);
    n->out[j] = id;
    if (out) out[j] = id;
  }
  t->out = n->out[0];
  return n->out[0];
}

static void tp_restore(tape *t) {
  for (int i = 0; i < t->nv; i++)
    if (t->kind[i] == TP_STATE) h_convert(&t->v[i], &t->state0[i]);
}

static stoke_kernel_args_v1 tp_args(const tape *t, const tp_node *n, const stoke_tensor *in, const stoke_tensor *out) {
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &n->node;
  a.n_in = n->n_in;
  a.n_out = n->n_out;
  a.in = in;
  a.out = out;
  a.training = t->training;
  return a;
}

/* Every node forward, outputs poisoned first and all written. */
static void tp_forward(tape *t) {
  for (int i = 0; i < t->nn; i++) {
    tp_node *n = &t->n[i];
    stoke_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO];
    for (int k = 0; k < n->n_in; k++) in[k] = t->v[n->in[k]];
    for (int j = 0; j < n->n_out; j++) h_poison(&t->v[n->out[j]]), out[j] = t->v[n->out[j]];
    stoke_kernel_args_v1 a = tp_args(t, n, in, out);
    H_OK(h_run(h_kernel(n->node.op, STOKE_FWD, t->dt), &a));
    for (int j = 0; j < n->n_out; j++) h_check_written(&t->v[n->out[j]], n->name);
  }
}

/* Which values want a gradient: inputs and parameters, and what a node
 * makes from one through an input that takes gradients. */
static void tp_wants(const tape *t, int *wants) {
  for (int i = 0; i < t->nv; i++) wants[i] = t->kind[i] == TP_INPUT || t->kind[i] == TP_PARAM;
  for (int i = 0; i < t->nn; i++) {
    const tp_node *n = &t->n[i];
    const stoke_op_type_v1 *ty = stoke_find_op(h_reg, n->node.op);
    int any = 0;
    for (int k = 0; k < n->n_in; k++) any |= wants[n->in[k]] && !(ty->no_grad_inputs >> k & 1u);
    for (int j = 0; j < n->n_out; j++) wants[n->out[j]] = any;
  }
}

/* dst += src, elementwise in double. */
static void tp_accumulate(stoke_tensor *dst, const stoke_tensor *src) {
  for (int64_t i = 0; i < h_numel(dst); i++) h_set(dst, i, h_get(dst, i) + h_get(src, i));
}

/* Node i's backward: dout from the tape's gradients, din poisoned; only
 * what bwd_needs names keeps its data. din[k] holds the computed gradient
 * (data NULL where none is wanted). Parameter gradients are accumulated
 * with `beta` onto what din holds when `keep` (else poisoned). */
static void tp_node_backward(tape *t, int i, const int *wants, stoke_tensor *din, float beta, int keep) {
  tp_node *n = &t->n[i];
  const stoke_op_type_v1 *ty = stoke_find_op(h_reg, n->node.op);
  stoke_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO], dout[STOKE_MAX_IO];
  uint32_t params = 0;
  for (int k = 0; k < n->n_in; k++) {
    in[k] = t->v[n->in[k]];
    if (!(ty->bwd_needs & STOKE_BWD_NEEDS_INPUT(k))) in[k].data = NULL;
    int want = wants[n->in[k]] && !(ty->no_grad_inputs >> k & 1u);
    if (!keep) {
      din[k] = t->v[n->in[k]];
      din[k].data = NULL;
      if (want) din[k] = h_like(&t->v[n->in[k]], -1), h_poison(&din[k]);
    }
    if (want && t->kind[n->in[k]] == TP_PARAM) params |= 1u << k;
  }
  for (int j = 0; j < n->n_out; j++) {
    out[j] = t->v[n->out[j]];
    if (!(ty->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j))) out[j].data = NULL;
    dout[j] = t->grad[n->out[j]];
    if (!dout[j].data) dout[j] = t->v[n->out[j]], dout[j].data = NULL;
  }
  stoke_kernel_args_v1 a = tp_args(t, n, in, out);
  a.din = din;
  a.dout = dout;
  a.param_grads = params;
  a.param_grad_beta = beta;
  H_OK(h_run(h_kernel(n->node.op, STOKE_BWD, t->dt), &a));
  for (int k = 0; k < n->n_in; k++)
    if (din[k].data) h_check_written(&din[k], n->name);
}

/* Gradients of every value from grad[out] = R, nodes in reverse. */
static void tp_backward(tape *t, const stoke_tensor *r) {
  int wants[TP_MAXV];
  tp_wants(t, wants);
  for (int i = 0; i < t->nv; i++) h_free(&t->grad[i]);
  t->grad[t->out] = h_like(r, -1);
  h_convert(&t->grad[t->out], r);
  for (int i = t->nn - 1; i >= 0; i--) {
    tp_node *n = &t->n[i];
    int has_dout = 0, wanted = 0;
    for (int j = 0; j < n->n_out; j++) has_dout |= t->grad[n->out[j]].data != NULL;
    stoke_tensor din[STOKE_MAX_IO];
    const stoke_op_type_v1 *ty = stoke_find_op(h_reg, n->node.op);
    for (int k = 0; k < n->n_in; k++) wanted |= wants[n->in[k]] && !(ty->no_grad_inputs >> k & 1u);
    if (!has_dout || !wanted) continue;
    tp_node_backward(t, i, wants, din, 0.0f, 0);
    for (int k = 0; k < n->n_in; k++) {
      if (!din[k].data) continue;
      stoke_tensor *g = &t->grad[n->in[k]];
      if (!g->data) {
        *g = din[k];
      } else {
        tp_accumulate(g, &din[k]);
        h_free(&din[k]);
      }
    }
  }
}

/* The forward with the running statistics as made. */
static void tp_rerun(tape *t) {
  tp_restore(t);
  tp_forward(t);
}

#define TP_FD_H 1e-6
#define TP_FD_TOL 1e-6
#define TP_FD_FLOOR 1e-2

/* dL/dv[j] for L = sum(v[out] R) by central differences of step h, summed
 * as (out+ - out-) R so that the rounding of L stays out of the difference. */
static double tp_numeric(tape *t, const stoke_tensor *r, int v, int64_t j, double h) {
  double x = h_get(&t->v[v], j);
  h_set(&t->v[v], j, x + h);
  tp_rerun(t);
  stoke_tensor yp = h_like(&t->v[t->out], -1);
  h_convert(&yp, &t->v[t->out]);
  h_set(&t->v[v], j, x - h);
  tp_rerun(t);
  h_set(&t->v[v], j, x);
  double d = 0;
  for (int64_t i = 0; i < h_numel(r); i++) d += (h_get(&yp, i) - h_get(&t->v[t->out], i)) * h_get(r, i);
  h_free(&yp);
  return d / (2 * h);
}

static double tp_rel_err(double a, double b) { return fabs(a - b) / fmax(fmax(fabs(a), fabs(b)), TP_FD_FLOOR); }

/* Every input's and parameter's gradient (f64 tapes) against central
 * differences: |analytic - numeric| / max(|analytic|, |numeric|, floor).
 * A ReLU whose input lies within the step of 0 puts a kink inside the
 * difference; such a point shows as differences of step h and h/2 that
 * disagree (they agree to ~h^2 where L is smooth), and is skipped: at most
 * 1% of a value's elements, else the check fails. */
static __attribute__((unused)) void tp_grad_check(tape *t, const char *label) {
  stoke_tensor r = h_like(&t->v[t->out], -1);
  h_random(&r, -1, 1);
  tp_rerun(t);
  tp_backward(t, &r);
  for (int v = 0; v < t->nv; v++) {
    if (t->kind[v] != TP_INPUT && t->kind[v] != TP_PARAM) continue;
    H_CHECK(t->grad[v].data != NULL, "%s: value %d got no gradient", label, v);
    double worst = 0;
    int64_t n = h_numel(&t->v[v]), kinks = 0;
    for (int64_t j = 0; j < n; j++) {
      double num = tp_numeric(t, &r, v, j, TP_FD_H), ana = h_get(&t->grad[v], j);
      double e = tp_rel_err(ana, num);
      if (e >= TP_FD_TOL && tp_rel_err(num, tp_numeric(t, &r, v, j, TP_FD_H / 2)) >= TP_FD_TOL) {
        kinks++;
        continue;
      }
      if (e > worst) worst = e;
      H_CHECK(e < TP_FD_TOL, "%s: d(value %d)[%lld] = %.12g, finite differences %.12g (rel err %.3g)", label, v,
              (long long)j, ana, num, e);
    }
    H_CHECK(kinks <= n / 100, "%s: value %d: %lld of %lld points sit on a kink", label, v, (long long)kinks,
            (long long)n);
    print_message("%s: value %d (%s) max rel err %.3g%s\n", label, v, t->kind[v] == TP_PARAM ? "parameter" : "input",
                  worst, kinks ? " (a point on a ReLU kink skipped)" : "");
  }
  h_free(&r);
}

#endif
