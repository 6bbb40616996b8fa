/* tests/op/norm_grad_test.c: the CPU batch_norm and normalize kernels:
 * batch_norm forwards against naive loops (training and eval, (N, C) and
 * (N, C, H, W) in NCHW and NHWC), the running statistics, every gradient
 * against central finite differences in double, NHWC against NCHW and
 * gradient accumulation (f32 against f64: every_kernel_test); normalize against hand-computed
 * values in both output layouts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_FLOOR 1e-2
#define EPS 1e-5
#define MOMENTUM 0.1

/* ------------------------------------------------------------ batch_norm */

/* One batch_norm call: x (2-D, or 4-D in `layout`), weight, bias,
 * running_mean, running_var -> y, saved_mean, saved_invstd; rm0/rv0 hold
 * the running statistics as made, so they can be put back. */
typedef struct bn_case {
  stoke_node_v1 node;
  int ndim;
  int64_t n, c, h, w;
  stoke_layout layout;
  stoke_tensor in[5], out[3], rm0, rv0;
} bn_case;

typedef struct bn_cfg {
  int ndim;
  int64_t n, c, h, w;
  stoke_layout layout;
  const char *label;
} bn_cfg;

static const bn_cfg cfgs[] = {
    {2, 6, 3, 1, 1, STOKE_LAYOUT_ANY, "(N, C)"},
    {4, 2, 3, 3, 2, STOKE_NCHW, "NCHW"},
    {4, 2, 3, 3, 2, STOKE_NHWC, "NHWC"},
};
#define N_CFGS ((int)(sizeof cfgs / sizeof *cfgs))

static int64_t bn_s(const bn_case *b) { return b->h * b->w; }

/* Memory offset of logical (n, c, s), s = h W + w. */
static int64_t bn_off(const bn_case *b, int64_t n, int64_t c, int64_t s) {
  int64_t S = bn_s(b);
  if (b->ndim == 4 && b->layout == STOKE_NHWC) return n * b->c * S + s * b->c + c;
  return n * b->c * S + c * S + s;
}

static bn_case bn_make(stoke_dtype dt, const bn_cfg *g) {
  bn_case b;
  memset(&b, 0, sizeof b);
  b.node = h_node(STOKE_OP_BATCH_NORM, "bn1");
  b.node.n_attrs = 2;
  b.node.attrs[STOKE_BATCH_NORM_EPS].f = EPS;
  b.node.attrs[STOKE_BATCH_NORM_MOMENTUM].f = MOMENTUM;
  b.ndim = g->ndim;
  b.n = g->n;
  b.c = g->c;
  b.h = g->ndim == 4 ? g->h : 1;
  b.w = g->ndim == 4 ? g->w : 1;
  b.layout = g->ndim == 4 ? g->layout : STOKE_LAYOUT_ANY;
  if (g->ndim == 4)
    b.in[0] = h_tensor(dt, 4, b.n, b.c, b.h, b.w);
  else
    b.in[0] = h_tensor(dt, 2, b.n, b.c);
  b.in[0].layout = b.layout;
  for (int i = 1; i < 5; i++) b.in[i] = h_tensor(dt, 1, b.c);
  b.out[0] = h_like(&b.in[0], -1);
  b.out[1] = h_tensor(dt, 1, b.c);
  b.out[2] = h_tensor(dt, 1, b.c);
  /* channels with different means and spreads */
  for (int64_t c = 0; c < b.c; c++) {
    double mu = h_uniform(-1, 1), sd = h_uniform(0.5, 2);
    for (int64_t n = 0; n < b.n; n++)
      for (int64_t s = 0; s < bn_s(&b); s++) h_set(&b.in[0], bn_off(&b, n, c, s), mu + sd * h_uniform(-1, 1));
    h_set(&b.in[1], c, (h_next() & 1 ? 1 : -1) * h_uniform(0.5, 1.5));
    h_set(&b.in[2], c, h_uniform(-1, 1));
    h_set(&b.in[3], c, h_uniform(-0.5, 0.5));
    h_set(&b.in[4], c, h_uniform(0.5, 2));
  }
  b.rm0 = h_like(&b.in[3], -1);
  b.rv0 = h_like(&b.in[4], -1);
  h_convert(&b.rm0, &b.in[3]);
  h_convert(&b.rv0, &b.in[4]);
  return b;
}

static void bn_free(bn_case *b) {
  for (int i = 0; i < 5; i++) h_free(&b->in[i]);
  for (int i = 0; i < 3; i++) h_free(&b->out[i]);
  h_free(&b->rm0);
  h_free(&b->rv0);
}

static void bn_restore_running(bn_case *b) {
  h_convert(&b->in[3], &b->rm0);
  h_convert(&b->in[4], &b->rv0);
}

static stoke_kernel_args_v1 bn_args(const bn_case *b, const stoke_tensor *in,
                                    const stoke_tensor *out, int training) {
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &b->node;
  a.n_in = 5;
  a.n_out = 3;
  a.in = in;
  a.out = out;
  a.training = training;
  return a;
}

/* out = batch_norm(in), outputs poisoned first and all written. */
static void bn_fwd(const bn_case *b, const stoke_tensor *in, stoke_tensor *out, int training) {
  for (int i = 0; i < 3; i++) h_poison(&out[i]);
  stoke_kernel_args_v1 a = bn_args(b, in, out, training);
  H_OK(h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_FWD, in[0].dtype), &a));
  for (int i = 0; i < 3; i++) h_check_written(&out[i], "batch_norm forward");
}

/* din = backward(dy); only the inputs and outputs bwd_needs names hold
 * data, the statistics' output gradients hold none. */
static stoke_err *bn_try_bwd(const bn_case *b, const stoke_tensor *in, const stoke_tensor *out,
                             stoke_tensor *din, const stoke_tensor *dy, int training,
                             uint32_t params, float beta) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, STOKE_OP_BATCH_NORM);
  assert_non_null(t);
  stoke_tensor live_in[5], live_out[3], dout[3];
  for (int i = 0; i < 5; i++) {
    live_in[i] = in[i];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) live_in[i].data = NULL;
  }
  for (int i = 0; i < 3; i++) {
    live_out[i] = out[i];
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(i))) live_out[i].data = NULL;
    dout[i] = out[i];
    dout[i].data = NULL;
  }
  dout[0] = *dy;
  stoke_kernel_args_v1 a = bn_args(b, live_in, live_out, training);
  a.din = din;
  a.dout = dout;
  a.param_grads = params;
  a.param_grad_beta = beta;
  return h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_BWD, in[0].dtype), &a);
}

/* din[0..2] for the inputs in `grads` (poisoned, dtype dt or the input's),
 * no data for the others and for the running statistics. */
static void bn_make_din(const bn_case *b, stoke_tensor *din, uint32_t grads, int dt) {
  for (int i = 0; i < 5; i++) {
    din[i] = b->in[i];
    din[i].data = NULL;
    if (i < 3 && (grads & (1u << i))) {
      din[i] = h_like(&b->in[i], dt);
      h_poison(&din[i]);
    }
  }
}

static void bn_free_din(stoke_tensor *din) {
  for (int i = 0; i < 5; i++) h_free(&din[i]);
}

/* The naive reference forward, by logical indices, in double. */
static void bn_reference(const bn_case *b, int training, double *y, double *mean,
                         double *invstd, double *rm, double *rv) {
  int64_t S = bn_s(b);
  double m = (double)(b->n * S);
  for (int64_t c = 0; c < b->c; c++) {
    double r_mean = h_get(&b->rm0, c), r_var = h_get(&b->rv0, c), mu, is;
    if (training) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < b->n; n++)
        for (int64_t s = 0; s < S; s++) sum += h_get(&b->in[0], bn_off(b, n, c, s));
      mu = sum / m;
      for (int64_t n = 0; n < b->n; n++)
        for (int64_t s = 0; s < S; s++) {
          double d = h_get(&b->in[0], bn_off(b, n, c, s)) - mu;
          sq += d * d;
        }
      is = 1 / sqrt(sq / m + EPS);
      rm[c] = (1 - MOMENTUM) * r_mean + MOMENTUM * mu;
      rv[c] = (1 - MOMENTUM) * r_var + MOMENTUM * sq / (m - 1); /* unbiased */
    } else {
      mu = r_mean;
      is = 1 / sqrt(r_var + EPS);
      rm[c] = r_mean;
      rv[c] = r_var;
    }
    mean[c] = mu;
    invstd[c] = is;
    for (int64_t n = 0; n < b->n; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t o = bn_off(b, n, c, s);
        y[o] = (h_get(&b->in[0], o) - mu) * is * h_get(&b->in[1], c) + h_get(&b->in[2], c);
      }
  }
}

static void check_close(const char *what, const char *label, double got, double want,
                        double tol, int64_t i) {
  H_CHECK(fabs(got - want) <= tol * fmax(1, fabs(want)), "%s %s[%lld] = %.15g, want %.15g",
          label, what, (long long)i, got, want);
}

/* Forward (training or eval) against the naive loops, and the running
 * statistics afterwards. */
static void check_forward(const bn_cfg *g, int training) {
  bn_case b = bn_make(STOKE_F64, g);
  int64_t nx = h_numel(&b.in[0]);
  double *y = malloc(sizeof(double) * (size_t)nx), mean[8], invstd[8], rm[8], rv[8];
  assert_non_null(y);
  assert_true(b.c <= 8);
  bn_reference(&b, training, y, mean, invstd, rm, rv);
  bn_fwd(&b, b.in, b.out, training);
  char label[64];
  snprintf(label, sizeof label, "%s %s", g->label, training ? "training" : "eval");
  for (int64_t i = 0; i < nx; i++) check_close("y", label, h_get(&b.out[0], i), y[i], 1e-12, i);
  for (int64_t c = 0; c < b.c; c++) {
    check_close("saved_mean", label, h_get(&b.out[1], c), mean[c], 1e-12, c);
    check_close("saved_invstd", label, h_get(&b.out[2], c), invstd[c], 1e-12, c);
    check_close("running_mean", label, h_get(&b.in[3], c), rm[c], 1e-14, c);
    check_close("running_var", label, h_get(&b.in[4], c), rv[c], 1e-14, c);
  }
  if (!training) /* untouched, bit for bit */
    H_CHECK(!memcmp(b.in[3].data, b.rm0.data, stoke_tensor_bytes(&b.rm0)) &&
                !memcmp(b.in[4].data, b.rv0.data, stoke_tensor_bytes(&b.rv0)),
            "%s: eval changed the running statistics", label);
  free(y);
  bn_free(&b);
}

static void test_bn_forward_naive(void **state) {
  for (int i = 0; i < N_CFGS; i++) check_forward(&cfgs[i], 1);
}

static void test_bn_eval_forward(void **state) {
  for (int i = 0; i < N_CFGS; i++) check_forward(&cfgs[i], 0);
}

/* One training step by hand: x = (1, 2, 3, 6) for one channel, m = 4:
 * mean 3, biased var (4 + 1 + 0 + 9)/4 = 3.5, unbiased 14/3;
 * running_mean 0.9 * 0.5 + 0.1 * 3 = 0.75,
 * running_var 0.9 * 2 + 0.1 * 14/3 = 2.2666666666666666. Then a second
 * step on the same batch compounds: 0.9 * 0.75 + 0.3 = 0.975 and
 * 0.9 * 2.2666666666666666 + 0.4666666666666667 = 2.5066666666666666. */
static void test_bn_running_stats_known(void **state) {
  static const double x[] = {1, 2, 3, 6};
  static const stoke_dtype dts[] = {STOKE_F64, STOKE_F32};
  for (int d = 0; d < 2; d++) {
    bn_cfg g = {2, 4, 1, 1, 1, STOKE_LAYOUT_ANY, "known"};
    bn_case b = bn_make(dts[d], &g);
    h_set_all(&b.in[0], x);
    h_set(&b.in[3], 0, 0.5);
    h_set(&b.in[4], 0, 2.0);
    double tol = dts[d] == STOKE_F64 ? 1e-15 : 1e-6;
    bn_fwd(&b, b.in, b.out, 1);
    check_close("running_mean", "step 1", h_get(&b.in[3], 0), 0.75, tol, 0);
    check_close("running_var", "step 1", h_get(&b.in[4], 0), 0.9 * 2 + 0.1 * 14.0 / 3, tol, 0);
    check_close("saved_mean", "step 1", h_get(&b.out[1], 0), 3, tol, 0);
    check_close("saved_invstd", "step 1", h_get(&b.out[2], 0), 1 / sqrt(3.5 + EPS), tol, 0);
    bn_fwd(&b, b.in, b.out, 1);
    check_close("running_mean", "step 2", h_get(&b.in[3], 0), 0.975, tol, 0);
    check_close("running_var", "step 2", h_get(&b.in[4], 0),
                0.9 * (0.9 * 2 + 0.1 * 14.0 / 3) + 0.1 * 14.0 / 3, tol, 0);
    bn_free(&b);
  }
}

/* dL/d in[i][j] for L = sum(y R), central differences; the running
 * statistics are put back before each forward. */
static double bn_numeric(bn_case *b, const stoke_tensor *r, int i, int64_t j, int training) {
  stoke_tensor yp[3], ym[3];
  for (int k = 0; k < 3; k++) {
    yp[k] = h_like(&b->out[k], -1);
    ym[k] = h_like(&b->out[k], -1);
  }
  double v = h_get(&b->in[i], j);
  h_set(&b->in[i], j, v + FD_H);
  bn_restore_running(b);
  bn_fwd(b, b->in, yp, training);
  h_set(&b->in[i], j, v - FD_H);
  bn_restore_running(b);
  bn_fwd(b, b->in, ym, training);
  h_set(&b->in[i], j, v);
  bn_restore_running(b);
  double d = 0;
  for (int64_t k = 0; k < h_numel(&yp[0]); k++)
    d += (h_get(&yp[0], k) - h_get(&ym[0], k)) * h_get(r, k);
  for (int k = 0; k < 3; k++) {
    h_free(&yp[k]);
    h_free(&ym[k]);
  }
  return d / (2 * FD_H);
}

static void bn_grad_check(const bn_cfg *g, int training) {
  bn_case b = bn_make(STOKE_F64, g);
  char label[64];
  snprintf(label, sizeof label, "%s %s", g->label, training ? "training" : "eval");
  bn_fwd(&b, b.in, b.out, training);
  bn_restore_running(&b);
  stoke_tensor r = h_like(&b.out[0], -1), din[5];
  h_random(&r, -1, 1);
  bn_make_din(&b, din, 7, -1);
  H_OK(bn_try_bwd(&b, b.in, b.out, din, &r, training, 6, 0.0f));
  static const char *names[] = {"x", "weight", "bias"};
  for (int i = 0; i < 3; i++) {
    h_check_written(&din[i], label);
    double worst = 0;
    for (int64_t j = 0; j < h_numel(&b.in[i]); j++) {
      double num = bn_numeric(&b, &r, i, j, training), ana = h_get(&din[i], j);
      double e = fabs(ana - num) / fmax(fmax(fabs(ana), fabs(num)), FD_FLOOR);
      if (e > worst) worst = e;
      H_CHECK(e < FD_TOL, "%s: d%s[%lld] = %.12g, finite differences %.12g (rel err %.3g)",
              label, names[i], (long long)j, ana, num, e);
    }
    print_message("%s: d%s max rel err %.3g\n", label, names[i], worst);
  }
  bn_free_din(din);
  h_free(&r);
  bn_free(&b);
}

static void test_bn_grad_training(void **state) {
  for (int i = 0; i < N_CFGS; i++) bn_grad_check(&cfgs[i], 1);
}

static void test_bn_grad_eval(void **state) {
  for (int i = 0; i < N_CFGS; i++) bn_grad_check(&cfgs[i], 0);
}

/* The same logical data in NHWC and NCHW memory: every output and
 * gradient agrees once transposed (running statistics too). */
static void test_bn_nhwc_matches_nchw(void **state) {
  for (int training = 0; training < 2; training++) {
    bn_case a = bn_make(STOKE_F64, &cfgs[1]), c = bn_make(STOKE_F64, &cfgs[2]);
    int64_t S = bn_s(&a);
    stoke_tensor ra = h_like(&a.out[0], -1), rc = h_like(&c.out[0], -1);
    for (int i = 1; i < 5; i++) h_convert(&c.in[i], &a.in[i]);
    h_convert(&c.rm0, &a.rm0);
    h_convert(&c.rv0, &a.rv0);
    for (int64_t n = 0; n < a.n; n++)
      for (int64_t ch = 0; ch < a.c; ch++)
        for (int64_t s = 0; s < S; s++) {
          h_set(&c.in[0], bn_off(&c, n, ch, s), h_get(&a.in[0], bn_off(&a, n, ch, s)));
          double v = h_uniform(-1, 1);
          h_set(&ra, bn_off(&a, n, ch, s), v);
          h_set(&rc, bn_off(&c, n, ch, s), v);
        }
    bn_fwd(&a, a.in, a.out, training);
    bn_fwd(&c, c.in, c.out, training);
    stoke_tensor da[5], dc[5];
    bn_make_din(&a, da, 7, -1);
    bn_make_din(&c, dc, 7, -1);
    H_OK(bn_try_bwd(&a, a.in, a.out, da, &ra, training, 6, 0.0f));
    H_OK(bn_try_bwd(&c, c.in, c.out, dc, &rc, training, 6, 0.0f));
    for (int64_t n = 0; n < a.n; n++)
      for (int64_t ch = 0; ch < a.c; ch++)
        for (int64_t s = 0; s < S; s++) {
          int64_t oa = bn_off(&a, n, ch, s), oc = bn_off(&c, n, ch, s);
          check_close("y", "NHWC vs NCHW", h_get(&c.out[0], oc), h_get(&a.out[0], oa), 1e-13, oa);
          check_close("dx", "NHWC vs NCHW", h_get(&dc[0], oc), h_get(&da[0], oa), 1e-13, oa);
        }
    for (int64_t ch = 0; ch < a.c; ch++) {
      check_close("saved_mean", "NHWC vs NCHW", h_get(&c.out[1], ch), h_get(&a.out[1], ch), 1e-13, ch);
      check_close("saved_invstd", "NHWC vs NCHW", h_get(&c.out[2], ch), h_get(&a.out[2], ch), 1e-13, ch);
      check_close("running_mean", "NHWC vs NCHW", h_get(&c.in[3], ch), h_get(&a.in[3], ch), 1e-13, ch);
      check_close("running_var", "NHWC vs NCHW", h_get(&c.in[4], ch), h_get(&a.in[4], ch), 1e-13, ch);
      check_close("dweight", "NHWC vs NCHW", h_get(&dc[1], ch), h_get(&da[1], ch), 1e-13, ch);
      check_close("dbias", "NHWC vs NCHW", h_get(&dc[2], ch), h_get(&da[2], ch), 1e-13, ch);
    }
    bn_free_din(da);
    bn_free_din(dc);
    h_free(&ra);
    h_free(&rc);
    bn_free(&a);
    bn_free(&c);
  }
}

/* dweight and dbias accumulate under param_grad_beta, dx is overwritten;
 * without dx the parameter gradients are the same. */
static void test_bn_param_grad_beta(void **state) {
  static const float betas[] = {1.0f, 0.5f};
  for (int g = 0; g < N_CFGS; g++)
    for (int training = 0; training < 2; training++)
      for (int bi = 0; bi < 2; bi++) {
        bn_case b = bn_make(STOKE_F64, &cfgs[g]);
        bn_fwd(&b, b.in, b.out, training);
        stoke_tensor r = h_like(&b.out[0], -1), base[5], acc[5], prev[3], only[5];
        h_random(&r, -1, 1);
        bn_make_din(&b, base, 7, -1);
        H_OK(bn_try_bwd(&b, b.in, b.out, base, &r, training, 6, 0.0f));
        bn_make_din(&b, acc, 7, -1); /* dx poisoned: must be overwritten */
        for (int i = 1; i < 3; i++) {
          h_random(&acc[i], -1, 1);
          prev[i] = h_like(&acc[i], -1);
          h_convert(&prev[i], &acc[i]);
        }
        H_OK(bn_try_bwd(&b, b.in, b.out, acc, &r, training, 6, betas[bi]));
        for (int i = 0; i < 3; i++)
          for (int64_t j = 0; j < h_numel(&acc[i]); j++) {
            double want = h_get(&base[i], j) + (i ? betas[bi] * h_get(&prev[i], j) : 0);
            check_close(i == 0 ? "dx" : i == 1 ? "dweight" : "dbias", cfgs[g].label,
                        h_get(&acc[i], j), want, 1e-12, j);
          }
        bn_make_din(&b, only, 6, -1); /* no dx wanted */
        H_OK(bn_try_bwd(&b, b.in, b.out, only, &r, training, 6, 0.0f));
        assert_null(only[0].data);
        for (int i = 1; i < 3; i++)
          H_CHECK(h_rel_norm(&only[i], &base[i]) == 0, "%s: din[%d] differs without dx",
                  cfgs[g].label, i);
        for (int i = 1; i < 3; i++) h_free(&prev[i]);
        bn_free_din(base);
        bn_free_din(acc);
        bn_free_din(only);
        h_free(&r);
        bn_free(&b);
      }
}

/* Bad arguments are STOKE_E_INVALID naming the node. */
static void test_bn_errors(void **state) {
  bn_case b = bn_make(STOKE_F64, &cfgs[0]);
  b.in[1].shape.d[0] = b.c + 1; /* weight of the wrong size */
  stoke_kernel_args_v1 a = bn_args(&b, b.in, b.out, 1);
  stoke_err *e = h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_FWD, STOKE_F64), &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  H_CHECK(strstr(e->msg, "'bn1'") && strstr(e->msg, "weight"), "message: %s", e->msg);
  stoke_err_free(e);
  b.in[1].shape.d[0] = b.c;
  bn_free(&b);

  /* one value per channel: training is refused (as PyTorch), eval works */
  bn_cfg one = {2, 1, 3, 1, 1, STOKE_LAYOUT_ANY, "N=1"};
  b = bn_make(STOKE_F64, &one);
  a = bn_args(&b, b.in, b.out, 1);
  e = h_run(h_kernel(STOKE_OP_BATCH_NORM, STOKE_FWD, STOKE_F64), &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  stoke_err_free(e);
  bn_fwd(&b, b.in, b.out, 0);
  bn_free(&b);
}

/* -------------------------------------------------------------- normalize */

static void check_normalize(int64_t n, int64_t c, int64_t h, int64_t w, const double *mean,
                            int n_mean, const double *sd, int n_sd, const char *layout) {
  stoke_node_v1 node = h_node(STOKE_OP_NORMALIZE, "norm");
  node.n_attrs = 3;
  node.attrs[STOKE_NORMALIZE_MEAN].n = n_mean;
  for (int i = 0; i < n_mean; i++) node.attrs[STOKE_NORMALIZE_MEAN].floats[i] = mean[i];
  node.attrs[STOKE_NORMALIZE_STD].n = n_sd;
  for (int i = 0; i < n_sd; i++) node.attrs[STOKE_NORMALIZE_STD].floats[i] = sd[i];
  snprintf(node.attrs[STOKE_NORMALIZE_LAYOUT].s, STOKE_ATTR_MAX_STR, "%s", layout);
  int nhwc = !strcmp(layout, "nhwc");
  stoke_tensor x = h_tensor(STOKE_U8, 4, n, c, h, w), y = h_tensor(STOKE_F32, 4, n, c, h, w);
  x.layout = STOKE_NHWC;
  y.layout = nhwc ? STOKE_NHWC : STOKE_NCHW;
  uint8_t *px = x.data;
  for (int64_t i = 0; i < h_numel(&x); i++) px[i] = (uint8_t)(h_next() & 0xff);
  px[0] = 0;
  px[h_numel(&x) - 1] = 255;
  h_poison(&y);
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &node;
  a.n_in = 1;
  a.n_out = 1;
  a.in = &x;
  a.out = &y;
  a.training = 1;
  H_OK(h_run(h_kernel(STOKE_OP_NORMALIZE, STOKE_FWD, STOKE_U8), &a));
  h_check_written(&y, "normalize");
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < c; k++)
      for (int64_t r = 0; r < h; r++)
        for (int64_t q = 0; q < w; q++) {
          double v = px[((i * h + r) * w + q) * c + k];
          double want = (v / 255 - mean[n_mean == 1 ? 0 : k]) / sd[n_sd == 1 ? 0 : k];
          int64_t o = nhwc ? ((i * h + r) * w + q) * c + k : ((i * c + k) * h + r) * w + q;
          double got = h_get(&y, o);
          H_CHECK(fabs(got - want) <= 1e-6 * fmax(1, fabs(want)),
                  "normalize C=%lld %s: y[%lld, %lld, %lld, %lld] (x %g) = %.9g, want %.9g",
                  (long long)c, layout, (long long)i, (long long)k, (long long)r, (long long)q,
                  v, got, want);
        }
  h_free(&x);
  h_free(&y);
}

static void test_normalize(void **state) {
  static const double m1[] = {0.5}, s1[] = {0.25};
  static const double m3[] = {0.485, 0.456, 0.406}, s3[] = {0.229, 0.224, 0.225};
  static const char *layouts[] = {"nchw", "nhwc"};
  for (int l = 0; l < 2; l++) {
    check_normalize(2, 1, 3, 5, m1, 1, s1, 1, layouts[l]);
    check_normalize(2, 3, 4, 5, m3, 3, s3, 3, layouts[l]);
    check_normalize(1, 3, 2, 7, m1, 1, s3, 3, layouts[l]); /* one mean for all channels */
    check_normalize(3, 3, 1, 1, m3, 3, s1, 1, layouts[l]);
  }
}

/* The output's layout field must agree with the attribute; std > 0. */
static void test_normalize_errors(void **state) {
  stoke_node_v1 node = h_node(STOKE_OP_NORMALIZE, "norm");
  node.n_attrs = 3;
  node.attrs[STOKE_NORMALIZE_MEAN].n = 1;
  node.attrs[STOKE_NORMALIZE_STD].n = 1;
  node.attrs[STOKE_NORMALIZE_STD].floats[0] = 1;
  snprintf(node.attrs[STOKE_NORMALIZE_LAYOUT].s, STOKE_ATTR_MAX_STR, "nchw");
  stoke_tensor x = h_tensor(STOKE_U8, 4, (int64_t)1, (int64_t)3, (int64_t)2, (int64_t)2);
  stoke_tensor y = h_tensor(STOKE_F32, 4, (int64_t)1, (int64_t)3, (int64_t)2, (int64_t)2);
  y.layout = STOKE_NHWC;
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &node;
  a.n_in = 1;
  a.n_out = 1;
  a.in = &x;
  a.out = &y;
  const stoke_kernel_v1 *k = h_kernel(STOKE_OP_NORMALIZE, STOKE_FWD, STOKE_U8);
  stoke_err *e = h_run(k, &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  H_CHECK(strstr(e->msg, "'norm'") != NULL, "message: %s", e->msg);
  stoke_err_free(e);
  y.layout = STOKE_NCHW;
  H_OK(h_run(k, &a));
  node.attrs[STOKE_NORMALIZE_STD].floats[0] = 0;
  e = h_run(k, &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  stoke_err_free(e);
  h_free(&x);
  h_free(&y);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_bn_forward_naive),
      H_TEST(test_bn_eval_forward),
      H_TEST(test_bn_running_stats_known),
      H_TEST(test_bn_grad_training),
      H_TEST(test_bn_grad_eval),
      H_TEST(test_bn_nhwc_matches_nchw),
      H_TEST(test_bn_param_grad_beta),
      H_TEST(test_bn_errors),
      H_TEST(test_normalize),
      H_TEST(test_normalize_errors),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
