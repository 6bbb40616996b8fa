/* tests/op/optim_test.c: the CPU optimizer kernels (sgd, adamw) against
 * steps computed by hand, as torch.optim.SGD and torch.optim.AdamW take
 * them, in f32 and f64; the gradient buffer must come out unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#define N 3

/* Every test starts from these parameters and first gradients (all exact
 * in f32); two-step tests use G2 for the second step. */
static const double P0[N] = {1.0, -2.0, 0.5};
static const double G1[N] = {0.5, 0.25, -1.0};
static const double G2[N] = {-0.5, 0.5, 0.25};

static const stoke_dtype DTS[] = {STOKE_F32, STOKE_F64};

static stoke_opt_args_v1 hyper(double lr) {
  stoke_opt_args_v1 o;
  memset(&o, 0, sizeof o);
  o.lr = lr;
  o.grad_scale = 1;
  o.step = 1;
  return o;
}

/* One update of `op` in dtype dt over p (N values) with gradients g and
 * state (n_state values, 0 = no state buffer), all read back into the
 * doubles. Fails if the gradient buffer changed. */
static stoke_err *try_step(const char *op, stoke_dtype dt, const stoke_opt_args_v1 *o, double *p,
                           const double *g, double *state, int64_t n_state) {
  stoke_tensor t[3];
  t[0] = h_tensor(dt, 1, (int64_t)N);
  t[1] = h_tensor(dt, 1, (int64_t)N);
  t[2] = h_tensor(dt, 1, n_state);
  h_set_all(&t[0], p);
  h_set_all(&t[1], g);
  if (n_state) h_set_all(&t[2], state);
  stoke_tensor g_before = h_like(&t[1], -1);
  h_convert(&g_before, &t[1]);
  stoke_node_v1 node = h_node(op, "optimizer");
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &node;
  a.n_in = n_state ? 3 : 2;
  a.in = t;
  a.opt = o;
  stoke_err *e = h_run(h_kernel(op, STOKE_OPT, dt), &a);
  H_CHECK(!memcmp(g_before.data, t[1].data, stoke_tensor_bytes(&t[1])),
          "%s changed the gradient buffer", op);
  for (int i = 0; i < N; i++) p[i] = h_get(&t[0], i);
  for (int64_t i = 0; i < n_state; i++) state[i] = h_get(&t[2], i);
  for (int i = 0; i < 3; i++) h_free(&t[i]);
  h_free(&g_before);
  return e;
}

static void step(const char *op, stoke_dtype dt, const stoke_opt_args_v1 *o, double *p,
                 const double *g, double *state, int64_t n_state) {
  H_OK(try_step(op, dt, o, p, g, state, n_state));
}

/* got == want within the precision of dt, relative (absolute below 1e-3). */
static void expect(const char *what, stoke_dtype dt, const double *got, const double *want,
                   int n) {
  double tol = dt == STOKE_F64 ? 1e-12 : 1e-6;
  for (int i = 0; i < n; i++)
    H_CHECK(fabs(got[i] - want[i]) <= tol * fmax(1e-3, fabs(want[i])),
            "%s (%s): element %d is %.15g, want %.15g", what, dt == STOKE_F64 ? "f64" : "f32",
            i, got[i], want[i]);
}

/* lr 0.1, nothing else: p -= 0.1 g
 *   1.0 - 0.1 * 0.5 = 0.95;  -2.0 - 0.1 * 0.25 = -2.025;  0.5 + 0.1 = 0.6 */
static void test_sgd_plain(void **state) {
  static const double want[N] = {0.95, -2.025, 0.6};
  for (int d = 0; d < 2; d++) {
    double p[N];
    memcpy(p, P0, sizeof p);
    stoke_opt_args_v1 o = hyper(0.1);
    step(STOKE_OP_SGD, DTS[d], &o, p, G1, NULL, 0);
    expect("sgd", DTS[d], p, want, N);
  }
}

/* grad_scale 0.5 (gradient accumulation over 2 micro-batches) first:
 *   g = 0.5 * (0.5, 0.25, -1) = (0.25, 0.125, -0.5)
 *   p = (1 - 0.025, -2 - 0.0125, 0.5 + 0.05) = (0.975, -2.0125, 0.55)
 * Then grad_scale 0.5, weight decay 0.01 and momentum 0.9 together, the
 * scale applying to the gradient only, before the decay term:
 *   g = 0.5 g1 + 0.01 p0 = (0.25 + 0.01, 0.125 - 0.02, -0.5 + 0.005)
 *     = (0.26, 0.105, -0.495);  buf = 0.9 * 0 + g = g
 *   p = p0 - 0.1 buf = (0.974, -2.0105, 0.5495) */
static void test_sgd_grad_scale(void **state) {
  static const double want[N] = {0.975, -2.0125, 0.55};
  static const double want_all[N] = {0.974, -2.0105, 0.5495};
  for (int d = 0; d < 2; d++) {
    double p[N], buf[N] = {0, 0, 0};
    memcpy(p, P0, sizeof p);
    stoke_opt_args_v1 o = hyper(0.1);
    o.grad_scale = 0.5;
    step(STOKE_OP_SGD, DTS[d], &o, p, G1, NULL, 0);
    expect("sgd grad_scale", DTS[d], p, want, N);

    memcpy(p, P0, sizeof p);
    o.weight_decay = 0.01;
    o.momentum = 0.9;
    step(STOKE_OP_SGD, DTS[d], &o, p, G1, buf, N);
    expect("sgd grad_scale+wd+momentum", DTS[d], p, want_all, N);
    static const double want_buf[N] = {0.26, 0.105, -0.495};
    expect("sgd grad_scale+wd+momentum buffer", DTS[d], buf, want_buf, N);
  }
}

/* weight decay 0.01 (L2, added to the gradient as torch's SGD does):
 *   g = g1 + 0.01 p0 = (0.5 + 0.01, 0.25 - 0.02, -1 + 0.005)
 *     = (0.51, 0.23, -0.995)
 *   p = p0 - 0.1 g = (1 - 0.051, -2 - 0.023, 0.5 + 0.0995)
 *     = (0.949, -2.023, 0.5995) */
static void test_sgd_weight_decay(void **state) {
  static const double want[N] = {0.949, -2.023, 0.5995};
  for (int d = 0; d < 2; d++) {
    double p[N];
    memcpy(p, P0, sizeof p);
    stoke_opt_args_v1 o = hyper(0.1);
    o.weight_decay = 0.01;
    step(STOKE_OP_SGD, DTS[d], &o, p, G1, NULL, 0);
    expect("sgd weight decay", DTS[d], p, want, N);
  }
}

/* momentum 0.9, two steps, buffer starting at 0:
 * step 1: buf = 0.9 * 0 + g1 = (0.5, 0.25, -1)      (torch: clone(g1))
 *         p1 = p0 - 0.1 buf = (0.95, -2.025, 0.6)
 * step 2: buf = 0.9 (0.5, 0.25, -1) + (-0.5, 0.5, 0.25)
 *             = (0.45 - 0.5, 0.225 + 0.5, -0.9 + 0.25) = (-0.05, 0.725, -0.65)
 *         p2 = p1 - 0.1 buf = (0.95 + 0.005, -2.025 - 0.0725, 0.6 + 0.065)
 *            = (0.955, -2.0975, 0.665) */
static void test_sgd_momentum(void **state) {
  static const double want1[N] = {0.95, -2.025, 0.6}, want2[N] = {0.955, -2.0975, 0.665};
  static const double buf2[N] = {-0.05, 0.725, -0.65};
  for (int d = 0; d < 2; d++) {
    double p[N], buf[N] = {0, 0, 0};
    memcpy(p, P0, sizeof p);
    stoke_opt_args_v1 o = hyper(0.1);
    o.momentum = 0.9;
    step(STOKE_OP_SGD, DTS[d], &o, p, G1, buf, N);
    expect("sgd momentum step 1", DTS[d], p, want1, N);
    expect("sgd momentum step 1 buffer", DTS[d], buf, G1, N);
    step(STOKE_OP_SGD, DTS[d], &o, p, G2, buf, N);
    expect("sgd momentum step 2", DTS[d], p, want2, N);
    expect("sgd momentum step 2 buffer", DTS[d], buf, buf2, N);
  }
}

/* Nesterov, momentum 0.9, two steps:
 * step 1: buf = g1; d = g1 + 0.9 buf = 1.9 g1 = (0.95, 0.475, -1.9)
 *         p1 = p0 - 0.1 d = (0.905, -2.0475, 0.69)
 * step 2: buf = 0.9 g1 + g2 = (-0.05, 0.725, -0.65) (as above)
 *         d = g2 + 0.9 buf = (-0.5 - 0.045, 0.5 + 0.6525, 0.25 - 0.585)
 *           = (-0.545, 1.1525, -0.335)
 *         p2 = p1 - 0.1 d = (0.905 + 0.0545, -2.0475 - 0.11525, 0.69 + 0.0335)
 *            = (0.9595, -2.16275, 0.7235) */
static void test_sgd_nesterov(void **state) {
  static const double want1[N] = {0.905, -2.0475, 0.69}, want2[N] = {0.9595, -2.16275, 0.7235};
  for (int d = 0; d < 2; d++) {
    double p[N], buf[N] = {0, 0, 0};
    memcpy(p, P0, sizeof p);
    stoke_opt_args_v1 o = hyper(0.1);
    o.momentum = 0.9;
    o.nesterov = 1;
    step(STOKE_OP_SGD, DTS[d], &o, p, G1, buf, N);
    expect("sgd nesterov step 1", DTS[d], p, want1, N);
    step(STOKE_OP_SGD, DTS[d], &o, p, G2, buf, N);
    expect("sgd nesterov step 2", DTS[d], p, want2, N);
  }
}

/* AdamW, lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; the
 * state is m (3 values) then v (3 values), starting at 0.
 * step 1 (t = 1): p *= 1 - 0.1 * 0.01 = 0.999 -> (0.999, -1.998, 0.4995)
 *   m = 0.1 g1 = (0.05, 0.025, -0.1)
 *   v = 0.001 g1^2 = (0.00025, 0.0000625, 0.001)
 *   bias corrections 1 - 0.9 = 0.1 and 1 - 0.999 = 0.001, so
 *   m^ = g1 and v^ = g1^2: the update is 0.1 * g / (|g| + 1e-8):
 *     0.1 * 0.5 / 0.50000001 = 0.099999998
 *     0.1 * 0.25 / 0.25000001 = 0.099999996
 *     0.1 * -1 / 1.00000001 = -0.099999999
 *   p1 = (0.999 - 0.099999998, -1.998 - 0.099999996, 0.4995 + 0.099999999)
 *      = (0.899000002, -2.097999996, 0.599499999)
 * step 2 (t = 2): p *= 0.999 -> (0.898101001998, -2.095901996004, 0.598900499001)
 *   m = 0.9 m + 0.1 g2 = (0.045 - 0.05, 0.0225 + 0.05, -0.09 + 0.025)
 *     = (-0.005, 0.0725, -0.065)
 *   v = 0.999 v + 0.001 g2^2
 *     = (0.00024975 + 0.00025, 0.0000624375 + 0.00025, 0.000999 + 0.0000625)
 *     = (0.00049975, 0.0003124375, 0.0010615)
 *   bias corrections 1 - 0.81 = 0.19 and 1 - 0.998001 = 0.001999:
 *   m^ = (-0.0263157894736842, 0.381578947368421, -0.342105263157895)
 *   v^ = (0.25, 0.156296898449227, 0.531015507753877)
 *   sqrt(v^) = (0.5, 0.395344025437627, 0.728708108747175)
 *   update = 0.1 m^ / (sqrt(v^) + 1e-8)
 *          = (-0.00526315778947365, 0.0965182001408044, -0.0469468164765416)
 *   p2 = (0.898101001998 + 0.00526315778947365,
 *         -2.095901996004 - 0.0965182001408044,
 *         0.598900499001 + 0.0469468164765416)
 *      = (0.903364159787474, -2.19242019614480, 0.645847315477542) */
static void test_adamw(void **state) {
  static const double want1[N] = {0.899000002, -2.097999996, 0.599499999};
  static const double want2[N] = {0.903364159787474, -2.19242019614480, 0.645847315477542};
  static const double state1[2 * N] = {0.05, 0.025, -0.1, 0.00025, 0.0000625, 0.001};
  static const double state2[2 * N] = {-0.005, 0.0725, -0.065, 0.00049975, 0.0003124375, 0.0010615};
  for (int d = 0; d < 2; d++) {
    double p[N], s[2 * N] = {0};
    memcpy(p, P0, sizeof p);
    stoke_opt_args_v1 o = hyper(0.1);
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.eps = 1e-8;
    o.weight_decay = 0.01;
    o.step = 1;
    step(STOKE_OP_ADAMW, DTS[d], &o, p, G1, s, 2 * N);
    expect("adamw step 1", DTS[d], p, want1, N);
    expect("adamw step 1 state", DTS[d], s, state1, 2 * N);
    o.step = 2;
    step(STOKE_OP_ADAMW, DTS[d], &o, p, G2, s, 2 * N);
    expect("adamw step 2", DTS[d], p, want2, N);
    expect("adamw step 2 state", DTS[d], s, state2, 2 * N);
  }
}

/* grad_scale applies before the moments: gradients 2 g1 with scale 0.5 are
 * the step of g1 (step 1 of test_adamw, without weight decay:
 *   p1 = p0 - (0.099999998, 0.099999996, -0.099999999)
 *      = (0.900000002, -2.099999996, 0.599999999)). */
static void test_adamw_grad_scale(void **state) {
  static const double g2x[N] = {1.0, 0.5, -2.0};
  static const double want[N] = {0.900000002, -2.099999996, 0.599999999};
  for (int d = 0; d < 2; d++) {
    double p[N], s[2 * N] = {0};
    memcpy(p, P0, sizeof p);
    stoke_opt_args_v1 o = hyper(0.1);
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.eps = 1e-8;
    o.grad_scale = 0.5;
    step(STOKE_OP_ADAMW, DTS[d], &o, p, g2x, s, 2 * N);
    expect("adamw grad_scale", DTS[d], p, want, N);
  }
}

/* Bad hyper-parameters and buffers are STOKE_E_INVALID naming the node. */
static void expect_invalid(stoke_err *e, const char *what) {
  H_CHECK(e != NULL, "%s: no error", what);
  H_CHECK(e->code == STOKE_E_INVALID && strstr(e->msg, "'optimizer'"), "%s: %s", what, e->msg);
  stoke_err_free(e);
}

static void test_bad_args(void **state) {
  double p[N], s[2 * N] = {0};
  memcpy(p, P0, sizeof p);
  stoke_opt_args_v1 o = hyper(0.1);
  o.nesterov = 1; /* without momentum: torch refuses it too */
  expect_invalid(try_step(STOKE_OP_SGD, STOKE_F32, &o, p, G1, s, N), "nesterov, momentum 0");
  o = hyper(0.1);
  o.momentum = 0.9; /* momentum without a buffer */
  expect_invalid(try_step(STOKE_OP_SGD, STOKE_F32, &o, p, G1, NULL, 0), "momentum, no state");
  o = hyper(0.1);
  o.grad_scale = 0; /* an unset grad_scale would zero every gradient */
  expect_invalid(try_step(STOKE_OP_SGD, STOKE_F64, &o, p, G1, NULL, 0), "grad_scale 0");
  o = hyper(0.1);
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  expect_invalid(try_step(STOKE_OP_ADAMW, STOKE_F32, &o, p, G1, s, N), "adamw state 1x");
  o.step = 0;
  expect_invalid(try_step(STOKE_OP_ADAMW, STOKE_F64, &o, p, G1, s, 2 * N), "adamw step 0");
  for (int i = 0; i < N; i++) H_CHECK(p[i] == P0[i], "a refused step changed p[%d]", i);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_sgd_plain),     H_TEST(test_sgd_grad_scale), H_TEST(test_sgd_weight_decay),
      H_TEST(test_sgd_momentum),  H_TEST(test_sgd_nesterov),   H_TEST(test_adamw),
      H_TEST(test_adamw_grad_scale), H_TEST(test_bad_args),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
