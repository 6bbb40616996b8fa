/* tests/op/lion_test.c: the example optimizer plugin (plugins/lion) as the
 * core sees it: registered with its keys and state, and its CPU update
 * against two Lion steps computed by hand, with weight decay on one group
 * only, a skipped step of the loss scaler and a clipping factor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

static int setup(void **state) {
  if (h_setup(state)) return -1;
  stoke_err *e = stoke_registry_load(h_reg, "plugins/lion/libstoke_lion.so");
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  return 0;
}

static void test_registered(void **state) {
  const stoke_optimizer_v1 *o = stoke_find_optimizer(h_reg, "lion");
  assert_non_null(o);
  assert_int_equal(o->n_state, 1);
  assert_string_equal(o->state_names[0], "exp_avg");
  assert_int_equal(o->n_keys, 2);
  assert_non_null(h_kernel("lion", STOKE_OPT, STOKE_F32));
}

/* p = (1, -2, 0.5, 3), g1 = (0.5, 0.25, -1, 0), m = 0, lr 0.1, betas
 * (0.9, 0.99), wd 0.5 on [0, 2) only.
 * step 1: u = 0.1 g1 -> sign (1, 1, -1, 0)
 *   p = (1 (1 - 0.05) - 0.1, -2 (0.95) - 0.1, 0.5 + 0.1, 3)
 *     = (0.85, -2.0, 0.6, 3)
 *   m = 0.01 g1 = (0.005, 0.0025, -0.01, 0)
 * step 2 with g2 = (-1, 0.5, 0.25, -4) x 4 under a loss scale of 4 and a
 *   clipping factor 0.5: g = (-0.5, 0.25, 0.125, -2)
 *   u = 0.9 m + 0.1 g = (0.0045 - 0.05, 0.00225 + 0.025, -0.009 + 0.0125, -0.2)
 *     -> sign (-1, 1, 1, -1)
 *   p = (0.85 (0.95) + 0.1, -2 (0.95) - 0.1, 0.6 - 0.1, 3 + 0.1)
 *     = (0.9075, -2.0, 0.5, 3.1)
 *   m = 0.99 m + 0.01 g = (0.00495 - 0.005, 0.002475 + 0.0025, -0.0099 + 0.00125, -0.02)
 * A step the scaler skips in between changes nothing. */
static void test_two_steps(void **state) {
  static const double p0[4] = {1, -2, 0.5, 3}, g1[4] = {0.5, 0.25, -1, 0}, g2[4] = {-4, 2, 1, -16};
  static const double want1[4] = {0.85, -2.0, 0.6, 3}, want2[4] = {0.9075, -2.0, 0.5, 3.1};
  static const double m2[4] = {-0.00005, 0.004975, -0.00865, -0.02};
  static const int64_t ranges[] = {0, 2};
  static const stoke_dtype dts[] = {STOKE_F32, STOKE_F64};
  for (int d = 0; d < 2; d++) {
    stoke_tensor t[3] = {h_tensor(dts[d], 1, (int64_t)4), h_tensor(dts[d], 1, (int64_t)4),
                         h_tensor(dts[d], 1, (int64_t)4)};
    h_set_all(&t[0], p0);
    h_set_all(&t[1], g1);
    stoke_opt_args_v1 o;
    memset(&o, 0, sizeof o);
    o.lr = 0.1, o.beta1 = 0.9, o.beta2 = 0.99, o.weight_decay = 0.5, o.grad_scale = 1, o.step = 1;
    o.decay_ranges = ranges, o.n_decay_ranges = 1;
    stoke_node_v1 node = h_node("lion", "optimizer");
    stoke_kernel_args_v1 a = {.node = &node, .n_in = 3, .in = t, .opt = &o};
    const stoke_kernel_v1 *k = h_kernel("lion", STOKE_OPT, dts[d]);
    H_OK(h_run(k, &a));
    double tol = dts[d] == STOKE_F64 ? 1e-12 : 1e-6;
    for (int i = 0; i < 4; i++) H_CHECK(fabs(h_get(&t[0], i) - want1[i]) < tol, "step 1 p[%d] = %g", i, h_get(&t[0], i));
    float amp[4] = {4, 0, 1, 0}, clip[2] = {9, 0.5f};
    o.amp = amp, o.clip = clip, o.step = 2;
    h_set_all(&t[1], g2);
    H_OK(h_run(k, &a)); /* skipped */
    for (int i = 0; i < 4; i++) H_CHECK(fabs(h_get(&t[0], i) - want1[i]) < tol, "skipped step moved p[%d]", i);
    amp[2] = 0;
    H_OK(h_run(k, &a));
    for (int i = 0; i < 4; i++) {
      H_CHECK(fabs(h_get(&t[0], i) - want2[i]) < tol, "step 2 p[%d] = %.9g, want %.9g", i, h_get(&t[0], i), want2[i]);
      H_CHECK(fabs(h_get(&t[2], i) - m2[i]) < tol, "step 2 m[%d] = %.9g, want %.9g", i, h_get(&t[2], i), m2[i]);
    }
    for (int i = 0; i < 3; i++) h_free(&t[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {H_TEST(test_registered), H_TEST(test_two_steps)};
  return cmocka_run_group_tests(tests, setup, h_teardown);
}
