/* tests/op/opcase.h: the finite-difference machinery the CPU op tests share:
 * one op call in f64 (op_case), forward and backward runs with outputs
 * poisoned, every gradient against central differences in double, and
 * gradient accumulation (f32 against f64: tests/op/every_kernel_test). Include after harness.h; every
 * helper is static. */
#ifndef STOKE_TESTS_OP_OPCASE_H
#define STOKE_TESTS_OP_OPCASE_H

/* Finite differences: step, and the largest relative error allowed. The
 * relative error is |analytic - numeric| / max(|analytic|, |numeric|,
 * FD_FLOOR): the floor keeps gradients that are ~0 from dividing by ~0
 * (Caffe's gradient checker does the same). */
#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_FLOOR 1e-2

#define OC_MAX 5 /* inputs and outputs of one case */

/* One op call: inputs and outputs in f64, which inputs get a gradient and
 * which of those are parameters (accumulated under param_grad_beta), and
 * which outputs receive one (the others are saved statistics, such as
 * layer_norm's mean: no gradient flows into them). */
typedef struct op_case {
  const char *op;
  stoke_node_v1 node;
  int n_in, n_out;  /* n_out 0 counts as 1 */
  stoke_tensor in[OC_MAX];
  stoke_tensor out[OC_MAX];
  uint32_t grads;
  uint32_t params;
  uint32_t douts;   /* 0 counts as output 0 alone */
} op_case;

static int oc_outs(const op_case *c) { return c->n_out ? c->n_out : 1; }
static uint32_t oc_douts(const op_case *c) { return c->douts ? c->douts : 1u; }

static void case_free(op_case *c) {
  for (int i = 0; i < c->n_in; i++) h_free(&c->in[i]);
  for (int j = 0; j < oc_outs(c); j++) h_free(&c->out[j]);
}

static stoke_kernel_args_v1 args_for(const op_case *c, const stoke_tensor *in,
                                     const stoke_tensor *out) {
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &c->node;
  a.n_in = c->n_in;
  a.n_out = oc_outs(c);
  a.in = in;
  a.out = out;
  a.training = 1;
  return a;
}

/* out = op(in), in the dtype of in[0]; every output is poisoned first and
 * must be fully written. */
static void run_fwd(const op_case *c, const stoke_tensor *in, stoke_tensor *out) {
  const stoke_kernel_v1 *k = h_kernel(c->op, STOKE_FWD, in[0].dtype);
  for (int j = 0; j < oc_outs(c); j++) h_poison(&out[j]);
  stoke_kernel_args_v1 a = args_for(c, in, out);
  H_OK(h_run(k, &a));
  for (int j = 0; j < oc_outs(c); j++) h_check_written(&out[j], c->op);
}

/* din = backward(dout). Only the inputs and outputs that the op's
 * bwd_needs names keep their data: the kernel must not read the others. */
static stoke_err *try_bwd(const op_case *c, const stoke_tensor *in, const stoke_tensor *out,
                          stoke_tensor *din, const stoke_tensor *dout, float beta) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, c->op);
  assert_non_null(t);
  stoke_tensor live_in[OC_MAX], live_out[OC_MAX];
  for (int i = 0; i < c->n_in; i++) {
    live_in[i] = in[i];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) live_in[i].data = NULL;
  }
  for (int j = 0; j < oc_outs(c); j++) {
    live_out[j] = out[j];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j))) live_out[j].data = NULL;
  }
  stoke_kernel_args_v1 a = args_for(c, live_in, live_out);
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

/* Output gradients R: fresh uniform values in [-1, 1) for the outputs in
 * c->douts, in dtype dt (-1: the output's), no data for the others. */
static void make_dout(const op_case *c, stoke_tensor *r, int dt) {
  for (int j = 0; j < oc_outs(c); j++) {
    r[j] = c->out[j];
    r[j].data = NULL;
    if (!(oc_douts(c) & (1u << j))) continue;
    r[j] = h_like(&c->out[j], dt);
    h_random(&r[j], -1, 1);
  }
}

static void free_dout(const op_case *c, stoke_tensor *r) {
  for (int j = 0; j < oc_outs(c); j++) h_free(&r[j]);
}

/* New tensors like `from` (dtype dt, -1: theirs) for the case's outputs. */
static void make_outs(const op_case *c, const stoke_tensor *from, stoke_tensor *out, int dt) {
  for (int j = 0; j < oc_outs(c); j++) out[j] = h_like(&from[j], from[j].dtype == STOKE_F64 ? dt : -1);
}

static void free_outs(const op_case *c, stoke_tensor *out) {
  for (int j = 0; j < oc_outs(c); j++) h_free(&out[j]);
}

/* dL/d in[i][j] for L = sum_k sum(out_k R_k) over the outputs with a
 * gradient, by central differences. The sum runs over (y+ - y-) R rather
 * than L+ - L-: outputs the step does not touch cancel exactly, and the
 * rounding of L itself (|L| >> |dL|) stays out of the difference. */
static double numeric_grad(op_case *c, const stoke_tensor *r, int i, int64_t j) {
  stoke_tensor yp[OC_MAX], ym[OC_MAX];
  make_outs(c, c->out, yp, -1);
  make_outs(c, c->out, ym, -1);
  double v = h_get(&c->in[i], j);
  h_set(&c->in[i], j, v + FD_H);
  run_fwd(c, c->in, yp);
  h_set(&c->in[i], j, v - FD_H);
  run_fwd(c, c->in, ym);
  h_set(&c->in[i], j, v);
  double d = 0;
  for (int o = 0; o < oc_outs(c); o++)
    if (r[o].data)
      for (int64_t k = 0; k < h_numel(&yp[o]); k++) d += (h_get(&yp[o], k) - h_get(&ym[o], k)) * h_get(&r[o], k);
  free_outs(c, yp);
  free_outs(c, ym);
  return d / (2 * FD_H);
}

static double rel_err(double analytic, double numeric) {
  double den = fmax(fmax(fabs(analytic), fabs(numeric)), FD_FLOOR);
  return fabs(analytic - numeric) / den;
}

/* Every gradient of c (f64) against central differences of
 * L = sum_k sum(out_k R_k), whose output gradients are the R_k. */
static void grad_check(op_case *c, const char *label) {
  run_fwd(c, c->in, c->out);
  stoke_tensor r[OC_MAX], din[OC_MAX];
  make_dout(c, r, -1);
  make_din(c, din, -1);
  H_OK(try_bwd(c, c->in, c->out, din, r, 0.0f));
  for (int i = 0; i < c->n_in; i++) {
    if (!(c->grads & (1u << i))) continue;
    h_check_written(&din[i], label);
    double worst = 0;
    for (int64_t j = 0; j < h_numel(&c->in[i]); j++) {
      double num = numeric_grad(c, r, i, j), ana = h_get(&din[i], j);
      double e = rel_err(ana, num);
      if (e > worst) worst = e;
      H_CHECK(e < FD_TOL, "%s: din[%d][%lld] = %.12g, finite differences %.12g (rel err %.3g)", label, i,
              (long long)j, ana, num, e);
    }
    print_message("%s: din[%d] max rel err %.3g\n", label, i, worst);
  }
  free_din(c, din);
  free_dout(c, r);
}

/* Parameter gradients accumulate under param_grad_beta = 1; activation
 * gradients are overwritten whatever beta says. */
static void check_accumulation(op_case *c, const char *label) {
  run_fwd(c, c->in, c->out);
  stoke_tensor r[OC_MAX], base[OC_MAX], acc[OC_MAX], prev[OC_MAX];
  make_dout(c, r, -1);
  make_din(c, base, -1);
  H_OK(try_bwd(c, c->in, c->out, base, r, 0.0f));
  make_din(c, acc, -1);
  for (int i = 0; i < c->n_in; i++) {
    prev[i] = acc[i];
    if (!acc[i].data) continue;
    prev[i] = h_like(&acc[i], -1);
    if (c->params & (1u << i)) {
      h_random(&acc[i], -1, 1); /* the earlier micro-batches' sum */
      h_convert(&prev[i], &acc[i]);
    } /* else poisoned: must be overwritten */
  }
  H_OK(try_bwd(c, c->in, c->out, acc, r, 1.0f));
  for (int i = 0; i < c->n_in; i++) {
    if (!acc[i].data) continue;
    int is_param = (c->params >> i) & 1;
    for (int64_t j = 0; j < h_numel(&acc[i]); j++) {
      double want = h_get(&base[i], j) + (is_param ? h_get(&prev[i], j) : 0);
      double got = h_get(&acc[i], j);
      H_CHECK(fabs(got - want) <= 1e-12 * fmax(1, fabs(want)), "%s: din[%d][%lld] = %.15g with beta 1, want %.15g (%s)",
              label, i, (long long)j, got, want, is_param ? "accumulated" : "overwritten");
    }
    h_free(&prev[i]);
  }
  free_din(c, base);
  free_din(c, acc);
  free_dout(c, r);
}

#endif
