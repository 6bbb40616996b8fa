/* tests/op/optim_hooks_test.c: the update's hooks in the CPU reference
 * kernels, which every GPU update kernel is checked against: the loss
 * scaler's skipped steps (AdamW's bias corrections count applied updates
 * only), the loss scaler's own steps (amp_check, amp_update, dynamic and
 * static), the global gradient norm and its clipping factor (grad_norm),
 * weight decay by parameter group, and an f64 master copy of f32
 * parameters. Values against hand-computed steps or a double reference on
 * fresh random inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>

#include "harness.h"

#define N 3
static const double P0[N] = {1.0, -2.0, 0.5};
static const double G1[N] = {0.5, 0.25, -1.0};
static const double G2[N] = {-0.5, 0.5, 0.25};
static const stoke_dtype DTS[] = {STOKE_F32, STOKE_F64};

/* One kernel call of `op` (pass STOKE_OPT) in dtype dt over `t` (n_in
 * tensors), with `o`. */
static stoke_err *run_opt(const char *op, stoke_dtype dt, stoke_tensor *t, int n_in, const stoke_opt_args_v1 *o) {
  stoke_node_v1 node = h_node(op, "optimizer");
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = &node;
  a.n_in = n_in;
  a.in = t;
  a.opt = o;
  return h_run(h_kernel(op, STOKE_OPT, dt), &a);
}

/* An update of p (n values) with gradients g and state (n_state values,
 * in state dtype sdt) read back into the doubles. */
static void update(const char *op, stoke_dtype dt, stoke_dtype sdt, const stoke_opt_args_v1 *o, double *p,
                   const double *g, double *state, int64_t n, int64_t n_state) {
  stoke_tensor t[3] = {h_tensor(dt, 1, n), h_tensor(dt, 1, n), h_tensor(sdt, 1, n_state)};
  h_set_all(&t[0], p);
  h_set_all(&t[1], g);
  h_set_all(&t[2], state);
  H_OK(run_opt(op, dt, t, 3, o));
  for (int64_t i = 0; i < n; i++) p[i] = h_get(&t[0], i);
  for (int64_t i = 0; i < n_state; i++) state[i] = h_get(&t[2], i);
  for (int i = 0; i < 3; i++) h_free(&t[i]);
}

static void expect(const char *what, stoke_dtype dt, const double *got, const double *want, int64_t n) {
  double tol = dt == STOKE_F64 ? 1e-12 : 1e-6;
  for (int64_t i = 0; i < n; i++)
    H_CHECK(fabs(got[i] - want[i]) <= tol * fmax(1e-3, fabs(want[i])), "%s (%s): element %lld is %.15g, want %.15g",
            what, stoke_dtype_name(dt), (long long)i, got[i], want[i]);
}

static stoke_opt_args_v1 adamw_args(void) {
  stoke_opt_args_v1 o;
  memset(&o, 0, sizeof o);
  o.lr = 0.1, o.beta1 = 0.9, o.beta2 = 0.999, o.eps = 1e-8, o.weight_decay = 0.01, o.grad_scale = 1;
  return o;
}

/* ----------------------------------------------- skipped steps, bias corrections */

/* AdamW under a loss scale of 1024 (gradients 1024 x G): step 1 applied,
 * step 2 skipped (found_inf: nothing changes), step 3 applied as the
 * second update (t = 3 - 1 skipped = 2): the result is optim_test's two
 * plain steps, (0.903364159787474, -2.19242019614480, 0.645847315477542).
 * With t = 3 the bias corrections differ and so does p. */
static void test_adamw_counts_applied_steps(void **state) {
  static const double want2[N] = {0.903364159787474, -2.19242019614480, 0.645847315477542};
  for (int d = 0; d < 2; d++) {
    double p[N], s[2 * N] = {0}, g1[N], g2[N], before[N], s_before[2 * N];
    for (int i = 0; i < N; i++) p[i] = P0[i], g1[i] = 1024 * G1[i], g2[i] = 1024 * G2[i];
    float amp[4] = {1024, 0, 0, 0};
    stoke_opt_args_v1 o = adamw_args();
    o.amp = amp;
    o.step = 1;
    update(STOKE_OP_ADAMW, DTS[d], DTS[d], &o, p, g1, s, N, 2 * N);
    memcpy(before, p, sizeof p);
    memcpy(s_before, s, sizeof s);
    amp[2] = 1; /* step 2: an overflow, skipped */
    o.step = 2;
    update(STOKE_OP_ADAMW, DTS[d], DTS[d], &o, p, g2, s, N, 2 * N);
    expect("adamw skipped step: parameters", DTS[d], p, before, N);
    expect("adamw skipped step: state", DTS[d], s, s_before, 2 * N);
    amp[2] = 0, amp[3] = 1; /* amp_update counted the skip */
    o.step = 3;
    update(STOKE_OP_ADAMW, DTS[d], DTS[d], &o, p, g2, s, N, 2 * N);
    expect("adamw after a skipped step", DTS[d], p, want2, N);
  }
}

/* SGD skips too, and divides by the scale. */
static void test_sgd_skips(void **state) {
  for (int d = 0; d < 2; d++) {
    double p[N], g[N], buf[N] = {0}, want[N];
    for (int i = 0; i < N; i++) p[i] = P0[i], g[i] = 8 * G1[i], want[i] = P0[i] - 0.1 * G1[i];
    float amp[4] = {8, 0, 1, 0};
    stoke_opt_args_v1 o;
    memset(&o, 0, sizeof o);
    o.lr = 0.1, o.momentum = 0.9, o.grad_scale = 1, o.step = 1, o.amp = amp;
    update(STOKE_OP_SGD, DTS[d], DTS[d], &o, p, g, buf, N, N);
    expect("sgd skipped step", DTS[d], p, P0, N);
    amp[2] = 0;
    update(STOKE_OP_SGD, DTS[d], DTS[d], &o, p, g, buf, N, N);
    expect("sgd unscaled step", DTS[d], p, want, N);
  }
}

/* ------------------------------------------------------------ the scaler */

static void scaler(const char *op, stoke_dtype dt, const double *g, int64_t n, float st[4], void *seed,
                   stoke_dtype seed_dt, const stoke_opt_args_v1 *o) {
  stoke_tensor t[2];
  if (!strcmp(op, STOKE_OP_AMP_CHECK)) {
    t[0] = h_tensor(dt, 1, n);
    h_set_all(&t[0], g);
    t[1] = (stoke_tensor){st, {1, {4}}, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_CPU};
    H_OK(run_opt(op, dt, t, 2, o));
    h_free(&t[0]);
  } else {
    t[0] = (stoke_tensor){st, {1, {4}}, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_CPU};
    t[1] = (stoke_tensor){seed, {1, {1}}, seed_dt, STOKE_LAYOUT_ANY, STOKE_DEV_CPU};
    H_OK(run_opt(op, STOKE_F32, t, 2, o));
  }
}

/* amp_check sets found_inf for inf and NaN only; amp_update halves on
 * found_inf (skipped + 1), doubles after growth_interval clean steps,
 * writes the seed in its dtype; a static scaler (growth_interval 0,
 * backoff 1) never moves. */
static void test_loss_scaler(void **state) {
  double g[5] = {1, -2, 3e30, 0, 5};
  for (int d = 0; d < 2; d++) {
    float st[4] = {65536, 0, 0, 0};
    stoke_opt_args_v1 o;
    memset(&o, 0, sizeof o);
    scaler(STOKE_OP_AMP_CHECK, DTS[d], g, 5, st, NULL, 0, &o);
    H_CHECK(st[2] == 0, "finite gradients set found_inf");
    g[3] = d ? NAN : INFINITY;
    scaler(STOKE_OP_AMP_CHECK, DTS[d], g, 5, st, NULL, 0, &o);
    H_CHECK(st[2] == 1, "%s gradient: found_inf not set", d ? "a NaN" : "an inf");
    g[3] = 0;
    double seed64 = 0;
    float seed32 = 0;
    o.growth_interval = 2;
    scaler(STOKE_OP_AMP_UPDATE, 0, NULL, 0, st, &seed64, STOKE_F64, &o);
    H_CHECK(st[0] == 32768 && st[1] == 0 && st[2] == 0 && st[3] == 1 && seed64 == 32768,
            "after an overflow: scale %g good %g found %g skipped %g seed %g", st[0], st[1], st[2], st[3], seed64);
    scaler(STOKE_OP_AMP_UPDATE, 0, NULL, 0, st, &seed32, STOKE_F32, &o);
    H_CHECK(st[0] == 32768 && st[1] == 1, "one clean step: scale %g good %g", st[0], st[1]);
    scaler(STOKE_OP_AMP_UPDATE, 0, NULL, 0, st, &seed32, STOKE_F32, &o);
    H_CHECK(st[0] == 65536 && st[1] == 0 && seed32 == 65536, "two clean steps: scale %g good %g seed %g", st[0],
            st[1], seed32);
    o.growth_interval = 0, o.backoff_factor = 1; /* static */
    st[2] = 1;
    scaler(STOKE_OP_AMP_UPDATE, 0, NULL, 0, st, &seed32, STOKE_F32, &o);
    H_CHECK(st[0] == 65536 && st[3] == 2, "static: scale %g skipped %g", st[0], st[3]);
    /* a growth past float's range keeps the scale (PyTorch's rule; at inf every later step was skipped), and
     * backoffs stop at the smallest normal float, never 0 (a clean step divides the gradients by it) */
    float top[4] = {0x1p127f, 1, 0, 0}, bottom[4] = {0x1p-125f, 0, 1, 0};
    o.growth_interval = 2, o.backoff_factor = 0.5;
    scaler(STOKE_OP_AMP_UPDATE, 0, NULL, 0, top, &seed32, STOKE_F32, &o);
    H_CHECK(top[0] == 0x1p127f && top[1] == 0 && seed32 == 0x1p127f, "growth past float: scale %g good %g", top[0],
            top[1]);
    for (int k = 0; k < 3; k++) {
      bottom[2] = 1;
      scaler(STOKE_OP_AMP_UPDATE, 0, NULL, 0, bottom, &seed32, STOKE_F32, &o);
    }
    H_CHECK(bottom[0] == FLT_MIN && seed32 == FLT_MIN, "backoffs below float's smallest normal: scale %g", bottom[0]);
  }
}

/* ----------------------------------------------------------- clipping */

/* grad_norm on fresh random gradients: the norm of g x grad_scale / the
 * loss scale against a long-double sum; the factor as torch's
 * clip_grad_norm_; [inf, 1] on a skipped step. */
static void test_grad_norm(void **state) {
  enum { NG = 1000 };
  for (int d = 0; d < 2; d++) {
    double g[NG];
    long double sum = 0;
    for (int i = 0; i < NG; i++) {
      g[i] = h_uniform(-3, 3);
      if (DTS[d] == STOKE_F32) g[i] = (float)g[i];
      sum += (long double)g[i] * g[i];
    }
    double norm = (double)sqrtl(sum) * 0.5 / 4;
    stoke_tensor t[2] = {h_tensor(DTS[d], 1, (int64_t)NG), h_tensor(STOKE_F32, 1, (int64_t)2)};
    h_set_all(&t[0], g);
    float amp[4] = {4, 0, 0, 0};
    stoke_opt_args_v1 o;
    memset(&o, 0, sizeof o);
    o.grad_scale = 0.5, o.amp = amp;
    double limits[] = {norm * 10, norm / 4};
    for (int k = 0; k < 2; k++) {
      o.max_norm = limits[k];
      H_OK(run_opt(STOKE_OP_GRAD_NORM, DTS[d], t, 2, &o));
      double got = h_get(&t[1], 0), factor = h_get(&t[1], 1), want = fmin(1, limits[k] / (norm + 1e-6));
      H_CHECK(fabs(got - norm) <= 1e-6 * norm, "%s norm %.9g, want %.9g", stoke_dtype_name(DTS[d]), got, norm);
      H_CHECK(fabs(factor - want) <= 1e-6 * want, "%s factor %.9g, want %.9g (max_norm %g)", stoke_dtype_name(DTS[d]),
              factor, want, limits[k]);
    }
    amp[2] = 1;
    H_OK(run_opt(STOKE_OP_GRAD_NORM, DTS[d], t, 2, &o));
    H_CHECK(isinf(h_get(&t[1], 0)) && h_get(&t[1], 1) == 1, "skipped step: [%g, %g]", h_get(&t[1], 0),
            h_get(&t[1], 1));
    h_free(&t[0]);
    h_free(&t[1]);
  }
}

/* Updates multiply the gradients by the clipping factor: sgd with factor
 * 0.25 is sgd on g / 4. */
static void test_clip_factor(void **state) {
  for (int d = 0; d < 2; d++) {
    double p[N], buf[N] = {0}, want[N];
    for (int i = 0; i < N; i++) p[i] = P0[i], want[i] = P0[i] - 0.1 * 0.25 * G1[i];
    float clip[2] = {4, 0.25f};
    stoke_opt_args_v1 o;
    memset(&o, 0, sizeof o);
    o.lr = 0.1, o.grad_scale = 1, o.step = 1, o.clip = clip;
    update(STOKE_OP_SGD, DTS[d], DTS[d], &o, p, G1, buf, N, N);
    expect("sgd with a clipping factor", DTS[d], p, want, N);
  }
}

/* ------------------------------------------------------ weight decay groups */

/* Weight decay only inside [4, 8) and [12, 16) of 16 elements (the matrix
 * parameters of a flat buffer): random p and g, sgd and adamw against the
 * per-element formulas with and without decay. */
static void test_decay_groups(void **state) {
  enum { NE = 16 };
  static const int64_t ranges[] = {4, 8, 12, 16};
  for (int d = 0; d < 2; d++)
    for (int adam = 0; adam < 2; adam++) {
      double p[NE], g[NE], s[2 * NE] = {0}, want[NE];
      for (int i = 0; i < NE; i++) {
        p[i] = h_uniform(-1, 1), g[i] = h_uniform(-1, 1);
        if (DTS[d] == STOKE_F32) p[i] = (float)p[i], g[i] = (float)g[i];
        int dec = (i >= 4 && i < 8) || i >= 12;
        /* first step from zero state: adamw's update is lr g / (|g| + eps) */
        want[i] = adam ? p[i] * (1 - 0.1 * (dec ? 0.01 : 0)) - 0.1 * g[i] / (fabs(g[i]) + 1e-8)
                       : p[i] - 0.1 * (g[i] + (dec ? 0.01 * p[i] : 0));
      }
      stoke_opt_args_v1 o = adamw_args();
      o.step = 1, o.decay_ranges = ranges, o.n_decay_ranges = 2;
      update(adam ? STOKE_OP_ADAMW : STOKE_OP_SGD, DTS[d], DTS[d], &o, p, g, s, NE, adam ? 2 * NE : NE);
      expect(adam ? "adamw decay groups" : "sgd decay groups", DTS[d], p, want, NE);
    }
}

/* -------------------------------------------------------- the master copy */

/* f32 parameters with an f64 master copy (a precision policy's
 * master_dtype = f64): 1000 plain sgd steps of 1e-9 move the master by
 * 1e-6, and the f32 parameter with it; f32 alone rounds each step away. */
static void test_f64_master(void **state) {
  enum { STEPS = 1000 };
  double p[1] = {1}, g[1] = {1}, st[2] = {1, 0}; /* master, momentum buffer */
  double q[1] = {1}, qs[1] = {0};
  stoke_opt_args_v1 o;
  memset(&o, 0, sizeof o);
  o.lr = 1e-9, o.grad_scale = 1, o.step = 1;
  for (int i = 0; i < STEPS; i++) {
    update(STOKE_OP_SGD, STOKE_F32, STOKE_F64, &o, p, g, st, 1, 2);
    update(STOKE_OP_SGD, STOKE_F32, STOKE_F32, &o, q, g, qs, 1, 1);
  }
  /* 1000 roundings of the f64 sum: within 1000 ulp */
  H_CHECK(fabs(st[0] - (1 - STEPS * 1e-9)) < 1e-12, "master %.17g, want %.17g", st[0], 1 - STEPS * 1e-9);
  H_CHECK(p[0] == (double)(float)st[0] && p[0] < 1, "f32 copy %.9g, want the master's rounding %.9g", p[0],
          (double)(float)st[0]);
  H_CHECK(q[0] == 1, "plain f32 moved to %.9g: each 1e-9 step should round away", q[0]);
  /* adamw keeps its moments in f64 after the master */
  double a[N], as[3 * N] = {0};
  memcpy(a, P0, sizeof a);
  for (int i = 0; i < N; i++) as[i] = P0[i];
  stoke_opt_args_v1 ao = adamw_args();
  ao.step = 1;
  update(STOKE_OP_ADAMW, STOKE_F32, STOKE_F64, &ao, a, G1, as, N, 3 * N);
  static const double want1[N] = {0.899000002, -2.097999996, 0.599499999};
  expect("adamw with an f64 master", STOKE_F64, as, want1, N);
  for (int i = 0; i < N; i++) H_CHECK(a[i] == (double)(float)as[i], "f32 copy %d is not the master's rounding", i);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_adamw_counts_applied_steps), H_TEST(test_sgd_skips), H_TEST(test_loss_scaler),
      H_TEST(test_grad_norm), H_TEST(test_clip_factor), H_TEST(test_decay_groups), H_TEST(test_f64_master),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
