/* tests/op/opcase.h: the finite-difference machinery the CPU op tests share:
 * one op call in f64 (op_case), forward and backward runs with outputs
 * poisoned, and every gradient against central differences in double.
 * Include after harness.h; every helper is static. */
#ifndef STOKE_TESTS_OP_OPCASE_H
#define STOKE_TESTS_OP_OPCASE_H

/* Finite differences: step, and the largest relative error allowed. The
 * relative error is |analytic - numeric| / max(|analytic|, |numeric|,
 * FD_FLOOR): the floor keeps gradients that are ~0 from dividing by ~0
 * (Caffe's gradient checker does the same). */
#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_FLOOR 1e-2
#define F32_TOL 1e-5 /* ||f32 - f64|| / ||f64|| */

/* One op call: inputs and output in f64, which inputs get a gradient and
 * which of those are parameters (accumulated under param_grad_beta). */
typedef struct op_case {
  const char *op;
  stoke_node_v1 node;
  int n_in;
  stoke_tensor in[3];
  stoke_tensor out;
  uint32_t grads;
  uint32_t params;
} op_case;

static void case_free(op_case *c) {
  for (int i = 0; i < c->n_in; i++) h_free(&c->in[i]);
  h_free(&c->out);
}

static stoke_kernel_args_v1 args_for(const op_case *c, const stoke_tensor *in,
                                     const stoke_tensor *out) {
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &c->node;
  a.n_in = c->n_in;
  a.n_out = 1;
  a.in = in;
  a.out = out;
  a.training = 1;
  return a;
}

/* out = op(in), in the dtype of in[0]; out is poisoned first and must be
 * fully written. */
static void run_fwd(const op_case *c, const stoke_tensor *in, stoke_tensor *out) {
  const stoke_kernel_v1 *k = h_kernel(c->op, STOKE_FWD, in[0].dtype);
  h_poison(out);
  stoke_kernel_args_v1 a = args_for(c, in, out);
  H_OK(h_run(k, &a));
  h_check_written(out, c->op);
}

/* din = backward(dout). Only the inputs and outputs that the op's
 * bwd_needs names keep their data: the kernel must not read the others. */
static stoke_err *try_bwd(const op_case *c, const stoke_tensor *in, const stoke_tensor *out,
                          stoke_tensor *din, const stoke_tensor *dout, float beta) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, c->op);
  assert_non_null(t);
  stoke_tensor live_in[3], live_out = *out;
  for (int i = 0; i < c->n_in; i++) {
    live_in[i] = in[i];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) live_in[i].data = NULL;
  }
  if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(0))) live_out.data = NULL;
  stoke_kernel_args_v1 a = args_for(c, live_in, &live_out);
  a.din = din;
  a.dout = dout;
  a.param_grads = c->params;
  a.param_grad_beta = beta;
  return h_run(h_kernel(c->op, STOKE_BWD, in[0].dtype), &a);
}

/* Gradient tensors for the inputs in c->grads (poisoned), data NULL for
 * the others. */
static void make_din(const op_case *c, stoke_tensor *din, int dt) {
  for (int i = 0; i < c->n_in; i++) {
    din[i] = c->in[i];
    din[i].data = NULL;
    if (c->grads & (1u << i)) {
      din[i] = h_like(&c->in[i], dt);
      h_poison(&din[i]);
    }
  }
}

static void free_din(const op_case *c, stoke_tensor *din) {
  for (int i = 0; i < c->n_in; i++) h_free(&din[i]);
}

/* dL/d in[i][j] for L = sum(op(in) * R), by central differences. The sum
 * runs over (y+ - y-) R rather than L+ - L-: outputs the step does not
 * touch cancel exactly, and the rounding of L itself (|L| >> |dL|) stays
 * out of the difference. */
static double numeric_grad(op_case *c, const stoke_tensor *r, int i, int64_t j) {
  stoke_tensor yp = h_like(&c->out, -1), ym = h_like(&c->out, -1);
  double v = h_get(&c->in[i], j);
  h_set(&c->in[i], j, v + FD_H);
  run_fwd(c, c->in, &yp);
  h_set(&c->in[i], j, v - FD_H);
  run_fwd(c, c->in, &ym);
  h_set(&c->in[i], j, v);
  double d = 0;
  for (int64_t k = 0; k < h_numel(&yp); k++) d += (h_get(&yp, k) - h_get(&ym, k)) * h_get(r, k);
  h_free(&yp);
  h_free(&ym);
  return d / (2 * FD_H);
}

static double rel_err(double analytic, double numeric) {
  double den = fmax(fmax(fabs(analytic), fabs(numeric)), FD_FLOOR);
  return fabs(analytic - numeric) / den;
}

/* Every gradient of c (f64) against central differences of L = sum(y R),
 * whose output gradient is R. */
static void grad_check(op_case *c, const char *label) {
  run_fwd(c, c->in, &c->out);
  stoke_tensor r = h_like(&c->out, -1), din[3];
  h_random(&r, -1, 1);
  make_din(c, din, -1);
  H_OK(try_bwd(c, c->in, &c->out, din, &r, 0.0f));
  static const char *names[] = {"in0", "in1", "in2"};
  for (int i = 0; i < c->n_in; i++) {
    if (!(c->grads & (1u << i))) continue;
    h_check_written(&din[i], label);
    double worst = 0;
    for (int64_t j = 0; j < h_numel(&c->in[i]); j++) {
      double num = numeric_grad(c, &r, i, j), ana = h_get(&din[i], j);
      double e = rel_err(ana, num);
      if (e > worst) worst = e;
      H_CHECK(e < FD_TOL, "%s: d%s[%lld] = %.12g, finite differences %.12g (rel err %.3g)", label,
              names[i], (long long)j, ana, num, e);
    }
    print_message("%s: d%s max rel err %.3g\n", label, names[i], worst);
  }
  free_din(c, din);
  h_free(&r);
}

#endif
