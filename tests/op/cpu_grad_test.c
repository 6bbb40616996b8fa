/* tests/op/cpu_grad_test.c: the CPU reference kernels: every input gradient
 * against central finite differences in double, gradient accumulation,
 * forwards against naive loops (linear_relu against
 * linear then relu), and the error cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "stoke/graph.h" /* stoke_node_init */

#include "opcase.h"


/* -------------------------------------------------------------- the cases */

static op_case linear_case(int64_t n, int64_t in, int64_t out) {
  op_case c = {.op = STOKE_OP_LINEAR, .node = h_node(STOKE_OP_LINEAR, "fc1"), .n_in = 3};
  c.in[0] = h_tensor(STOKE_F64, 2, n, in);
  c.in[1] = h_tensor(STOKE_F64, 2, out, in);
  c.in[2] = h_tensor(STOKE_F64, 1, out);
  c.out[0] = h_tensor(STOKE_F64, 2, n, out);
  for (int i = 0; i < 3; i++) h_random(&c.in[i], -1, 1);
  c.grads = 7;
  c.params = 6; /* weight, bias */
  return c;
}

/* Pre-activations z = x W^T + b of a linear_relu case at least this far
 * from 0: a finite-difference step moves z by at most |x| or |W| (<= 1)
 * times FD_H = 1e-6, and the f32 rounding of the inputs by ~1e-6, so no
 * step and no rounding crosses the kink and the gradient is well defined. */
#define LR_MARGIN 1e-3

static double lr_pre(const op_case *c, int64_t i, int64_t j) {
  int64_t k = c->in[0].shape.d[1];
  double z = h_get(&c->in[2], j);
  for (int64_t t = 0; t < k; t++) z += h_get(&c->in[0], i * k + t) * h_get(&c->in[1], j * k + t);
  return z;
}

static op_case linear_relu_case(int64_t n, int64_t in, int64_t out) {
  op_case c = linear_case(n, in, out);
  c.op = STOKE_OP_LINEAR_RELU;
  c.node = h_node(STOKE_OP_LINEAR_RELU, "fc1");
  /* Redraw the row of x of any pre-activation within LR_MARGIN of 0 (and,
   * now and then, that output's weights and bias, in case no x would do),
   * then look again from the start. */
  for (int tries = 0;; tries++) {
    int64_t bad_i = -1, bad_j = -1;
    for (int64_t i = 0; i < n && bad_i < 0; i++)
      for (int64_t j = 0; j < out; j++)
        if (fabs(lr_pre(&c, i, j)) < LR_MARGIN) {
          bad_i = i, bad_j = j;
          break;
        }
    if (bad_i < 0) break;
    H_CHECK(tries < 10000, "linear_relu case: no inputs away from the kink after %d draws", tries);
    for (int64_t t = 0; t < in; t++) h_set(&c.in[0], bad_i * in + t, h_uniform(-1, 1));
    if (tries % 10 == 9) {
      for (int64_t t = 0; t < in; t++) h_set(&c.in[1], bad_j * in + t, h_uniform(-1, 1));
      h_set(&c.in[2], bad_j, h_uniform(-1, 1));
    }
  }
  return c;
}

static op_case relu_case(int64_t n, int64_t f) {
  op_case c = {.op = STOKE_OP_RELU, .node = h_node(STOKE_OP_RELU, "act1"), .n_in = 1};
  c.in[0] = h_tensor(STOKE_F64, 2, n, f);
  c.out[0] = h_tensor(STOKE_F64, 2, n, f);
  /* away from the kink at 0, so that x +- h stays on one side */
  for (int64_t i = 0; i < h_numel(&c.in[0]); i++)
    h_set(&c.in[0], i, (h_next() & 1 ? 1 : -1) * h_uniform(0.05, 1));
  c.grads = 1;
  return c;
}

/* gelu with approximate = "none" or "tanh", on inputs over [-4, 4]
 * (both tails and the curved middle). */
static op_case gelu_case(int64_t n, int64_t f, const char *approximate) {
  op_case c = {.op = STOKE_OP_GELU, .n_in = 1};
  char attrs[32];
  snprintf(attrs, sizeof attrs, "approximate=%s", approximate);
  H_OK(stoke_node_init(h_reg, STOKE_OP_GELU, "act1", attrs, &c.node));
  c.in[0] = h_tensor(STOKE_F64, 2, n, f);
  c.out[0] = h_tensor(STOKE_F64, 2, n, f);
  h_random(&c.in[0], -4, 4);
  c.grads = 1;
  return c;
}

static op_case add_case(int64_t n, int64_t f) {
  op_case c = {.op = STOKE_OP_ADD, .node = h_node(STOKE_OP_ADD, "res1"), .n_in = 2};
  c.in[0] = h_tensor(STOKE_F64, 2, n, f);
  c.in[1] = h_tensor(STOKE_F64, 2, n, f);
  c.out[0] = h_tensor(STOKE_F64, 2, n, f);
  h_random(&c.in[0], -1, 1);
  h_random(&c.in[1], -1, 1);
  c.grads = 3;
  return c;
}

static op_case softmax_ce_case(int64_t n, int64_t classes, double smoothing) {
  op_case c = {.op = STOKE_OP_SOFTMAX_CE, .node = h_node(STOKE_OP_SOFTMAX_CE, "loss"), .n_in = 2};
  c.node.n_attrs = 1;
  c.node.attrs[STOKE_SOFTMAX_CE_LABEL_SMOOTHING].f = smoothing;
  c.in[0] = h_tensor(STOKE_F64, 2, n, classes);
  c.in[1] = h_tensor(STOKE_I32, 1, n);
  c.out[0] = h_tensor(STOKE_F64, 1, (int64_t)1);
  c.out[1] = h_tensor(STOKE_F64, 1, n); /* each row's log-sum-exp: no gradient */
  c.n_out = 2;
  h_random(&c.in[0], -2, 2);
  for (int64_t i = 0; i < n; i++) h_set(&c.in[1], i, (double)(h_next() % (uint64_t)classes));
  c.grads = 1; /* labels get none */
  return c;
}

/* ------------------------------------------------------------------ tests */

static void test_backend(void **state) {
  const stoke_backend_v1 *b = stoke_find_backend(h_reg, "cpu");
  assert_non_null(b);
  assert_int_equal(b->device, STOKE_DEV_CPU);
  assert_null(b->device_engine);
  void *self = (void *)1;
  H_OK(b->open(0, NULL, &self));
  stoke_device_info_v1 info;
  H_OK(b->info(self, &info));
  assert_true(info.name[0] != '\0');
  assert_true(info.total_bytes > 0);
  assert_true(info.free_bytes <= info.total_bytes);
  for (int i = 0; i < STOKE_DTYPE_COUNT; i++) assert_true(info.peak_flops[i] == 0);
  void *p = NULL, *q = NULL, *s = (void *)1;
  H_OK(b->alloc(self, 1000, &p));
  H_OK(b->alloc_host(self, 1000, &q));
  assert_int_equal((uintptr_t)p % 64, 0);
  assert_int_equal((uintptr_t)q % 64, 0);
  H_OK(b->stream_create(self, &s));
  assert_null(s);
  H_OK(b->fill(self, p, 0x5a, 1000, s));
  H_OK(b->copy(self, q, p, 1000, STOKE_COPY_D2H, s));
  H_OK(b->stream_sync(self, s));
  for (int i = 0; i < 1000; i++) assert_int_equal(((unsigned char *)q)[i], 0x5a);
  b->stream_destroy(self, s);
  b->free(self, p);
  b->free_host(self, q);
  b->close(self);
}

static void test_linear_grad(void **state) {
  static const int64_t shapes[][3] = {{3, 4, 5}, {1, 1, 1}, {8, 17, 6}};
  for (int s = 0; s < 3; s++) {
    op_case c = linear_case(shapes[s][0], shapes[s][1], shapes[s][2]);
    char label[64];
    snprintf(label, sizeof label, "linear %lldx%lld->%lld", (long long)shapes[s][0],
             (long long)shapes[s][1], (long long)shapes[s][2]);
    grad_check(&c, label);
    case_free(&c);
  }
}

static void test_linear_relu_grad(void **state) {
  static const int64_t shapes[][3] = {{3, 4, 5}, {1, 1, 1}, {8, 17, 6}};
  for (int s = 0; s < 3; s++) {
    op_case c = linear_relu_case(shapes[s][0], shapes[s][1], shapes[s][2]);
    char label[64];
    snprintf(label, sizeof label, "linear_relu %lldx%lld->%lld", (long long)shapes[s][0],
             (long long)shapes[s][1], (long long)shapes[s][2]);
    grad_check(&c, label);
    case_free(&c);
  }
}

/* linear_relu against the two nodes it replaces: forward = linear then
 * relu, backward = relu backward then linear backward, in f64 and f32,
 * bit for bit (the same arithmetic in the same order). */
static void test_linear_relu_matches_linear_then_relu(void **state) {
  static const stoke_dtype dts[] = {STOKE_F64, STOKE_F32};
  for (int d = 0; d < 2; d++) {
    stoke_dtype dt = dts[d];
    op_case c = linear_relu_case(9, 13, 7);
    stoke_tensor in[3];
    for (int i = 0; i < 3; i++) {
      in[i] = h_like(&c.in[i], dt);
      h_convert(&in[i], &c.in[i]);
    }
    stoke_tensor y = h_like(&c.out[0], dt), z = h_like(&c.out[0], dt), y2 = h_like(&c.out[0], dt);
    run_fwd(&c, in, &y);
    /* linear, then relu */
    op_case lin = {.op = STOKE_OP_LINEAR, .node = h_node(STOKE_OP_LINEAR, "fc1"), .n_in = 3};
    run_fwd(&lin, in, &z);
    op_case act = {.op = STOKE_OP_RELU, .node = h_node(STOKE_OP_RELU, "act1"), .n_in = 1};
    run_fwd(&act, &z, &y2);
    int64_t zeros = 0;
    for (int64_t i = 0; i < h_numel(&y); i++) {
      H_CHECK(h_get(&y, i) == h_get(&y2, i), "%s y[%lld] = %.17g, linear then relu %.17g",
              stoke_dtype_name(dt), (long long)i, h_get(&y, i), h_get(&y2, i));
      zeros += h_get(&y, i) == 0;
    }
    print_message("linear_relu %s: %lld of %lld outputs clamped\n", stoke_dtype_name(dt),
                  (long long)zeros, (long long)h_numel(&y));

    /* backward: relu's dx (dz), then linear's backward on dz */
    stoke_tensor r = h_like(&c.out[0], dt), dz = h_like(&c.out[0], dt), din[3], din2[3];
    h_random(&r, -1, 1);
    make_din(&c, din, dt);
    make_din(&c, din2, dt);
    H_OK(try_bwd(&c, in, &y, din, &r, 0.0f));
    act.grads = 1;
    H_OK(try_bwd(&act, &z, &y2, &dz, &r, 0.0f));
    lin.grads = 7;
    lin.params = 6;
    H_OK(try_bwd(&lin, in, &z, din2, &dz, 0.0f));
    for (int i = 0; i < 3; i++) {
      h_check_written(&din[i], "linear_relu backward");
      for (int64_t j = 0; j < h_numel(&din[i]); j++)
        H_CHECK(h_get(&din[i], j) == h_get(&din2[i], j),
                "%s din[%d][%lld] = %.17g, relu then linear backward %.17g", stoke_dtype_name(dt), i,
                (long long)j, h_get(&din[i], j), h_get(&din2[i], j));
    }
    for (int i = 0; i < 3; i++) {
      h_free(&din[i]);
      h_free(&din2[i]);
      h_free(&in[i]);
    }
    h_free(&r);
    h_free(&dz);
    h_free(&y);
    h_free(&z);
    h_free(&y2);
    case_free(&c);
  }
}

static void test_relu_grad(void **state) {
  op_case c = relu_case(4, 5);
  grad_check(&c, "relu");
  case_free(&c);
}

static void test_gelu_grad(void **state) {
  static const char *approx[] = {"none", "tanh"};
  for (int i = 0; i < 2; i++) {
    op_case c = gelu_case(4, 9, approx[i]);
    char label[32];
    snprintf(label, sizeof label, "gelu %s", approx[i]);
    grad_check(&c, label);
    case_free(&c);
  }
}

/* gelu's forward against values computed independently in double with
 * Python's math.erf and math.tanh: 0.5 x (1 + erf(x / sqrt 2)) and
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), x = -3 .. 3. */
static void test_gelu_known_values(void **state) {
  static const double x[] = {-3, -1, -0.5, 0, 0.5, 1, 3};
  static const double want[2][7] = {
      {-0.00404969409489031, -0.15865525393145707, -0.15426876936299344, 0.0,
       0.34573123063700656, 0.8413447460685429, 2.99595030590511},
      {-0.0036373920817729943, -0.15880800939172324, -0.15428599017485606, 0.0,
       0.34571400982514394, 0.8411919906082768, 2.996362607918227}};
  static const char *approx[] = {"none", "tanh"};
  for (int a = 0; a < 2; a++) {
    op_case c = gelu_case(1, 7, approx[a]);
    h_set_all(&c.in[0], x);
    run_fwd(&c, c.in, c.out);
    for (int i = 0; i < 7; i++)
      H_CHECK(fabs(h_get(&c.out[0], i) - want[a][i]) < 1e-12, "gelu %s(%g) = %.17g, want %.17g", approx[a], x[i],
              h_get(&c.out[0], i), want[a][i]);
    case_free(&c);
  }
}

static void test_add_grad(void **state) {
  op_case c = add_case(3, 7);
  grad_check(&c, "add");
  case_free(&c);
}

static void test_softmax_ce_grad(void **state) {
  op_case c = softmax_ce_case(5, 7, 0.0);
  grad_check(&c, "softmax_ce");
  case_free(&c);
}

static void test_softmax_ce_grad_label_smoothing(void **state) {
  op_case c = softmax_ce_case(5, 7, 0.1);
  grad_check(&c, "softmax_ce ls=0.1");
  case_free(&c);
}

static void test_param_grad_beta(void **state) {
  op_case c = linear_case(4, 3, 5); /* dx overwritten, dW and db accumulated */
  check_accumulation(&c, c.op);
  case_free(&c);
  c = linear_relu_case(4, 3, 5);
  check_accumulation(&c, c.op);
  case_free(&c);
  c = add_case(2, 5);
  c.params = 2; /* b a parameter (a bias added), a an activation */
  check_accumulation(&c, c.op);
  c.params = 3;
  check_accumulation(&c, c.op);
  case_free(&c);
}

/* linear backward without dx (the first layer's input needs none). */
static void test_linear_no_dx(void **state) {
  op_case c = linear_case(4, 3, 2);
  run_fwd(&c, c.in, c.out);
  stoke_tensor r = h_like(&c.out[0], -1), all[3], some[3];
  h_random(&r, -1, 1);
  make_din(&c, all, -1);
  H_OK(try_bwd(&c, c.in, c.out, all, &r, 0.0f));
  c.grads = 6;
  make_din(&c, some, -1);
  H_OK(try_bwd(&c, c.in, c.out, some, &r, 0.0f));
  assert_null(some[0].data);
  for (int i = 1; i < 3; i++) H_CHECK(h_rel_norm(&some[i], &all[i]) == 0, "din[%d] differs", i);
  c.grads = 7;
  free_din(&c, all);
  free_din(&c, some);
  h_free(&r);
  case_free(&c);
}

static void test_linear_forward_naive(void **state) {
  op_case c = linear_case(5, 7, 3);
  run_fwd(&c, c.in, c.out);
  for (int64_t i = 0; i < 5; i++)
    for (int64_t j = 0; j < 3; j++) {
      double want = h_get(&c.in[2], j);
      for (int64_t k = 0; k < 7; k++) want += h_get(&c.in[0], i * 7 + k) * h_get(&c.in[1], j * 7 + k);
      double got = h_get(&c.out[0], i * 3 + j);
      H_CHECK(fabs(got - want) < 1e-12, "y[%lld, %lld] = %.15g, naive %.15g", (long long)i,
              (long long)j, got, want);
    }
  case_free(&c);
}

static void test_softmax_ce_forward_naive(void **state) {
  for (int s = 0; s < 2; s++) {
    double ls = s ? 0.25 : 0.0;
    op_case c = softmax_ce_case(6, 4, ls);
    run_fwd(&c, c.in, c.out);
    double want = 0;
    for (int64_t i = 0; i < 6; i++) {
      double z = 0;
      for (int64_t j = 0; j < 4; j++) z += exp(h_get(&c.in[0], i * 4 + j));
      int64_t y = (int64_t)h_get(&c.in[1], i);
      for (int64_t j = 0; j < 4; j++) {
        double target = (j == y ? 1 - ls : 0) + ls / 4;
        want -= target * log(exp(h_get(&c.in[0], i * 4 + j)) / z);
      }
    }
    want /= 6;
    double got = h_get(&c.out[0], 0);
    H_CHECK(fabs(got - want) < 1e-12, "loss %.15g (ls %g), naive %.15g", got, ls, want);
    case_free(&c);
  }
}

/* Two rows of three classes:
 *   row 0: logits (1000, 1001, 1002), label 2. Stable form: subtract the
 *          max 1002 -> (-2, -1, 0); loss = log(e^-2 + e^-1 + e^0) - 0
 *          = log(1.5032147244080551) = 0.4076059644443804
 *          (exp(1000) itself would overflow).
 *   row 1: logits (0, 0, 0), label 1: loss = log 3 = 1.0986122886681098
 *   mean = (0.4076059644443804 + 1.0986122886681098) / 2 = 0.7531091265562451
 * With label smoothing 0.1 the target is 0.9 onehot + 0.1/3; with
 * logp = (-2 - a, -1 - a, -a), a = 0.4076059644443804:
 *   row 0: 0.9 a + (0.1/3)(3 + 3a) = a + 0.1 = 0.5076059644443804
 *   row 1: every logp is -log 3, the targets sum to 1: log 3
 *   mean = 0.7531091265562451 + 0.1 / 2 = 0.8031091265562451 */
static void test_softmax_ce_known_value(void **state) {
  static const double logits[] = {1000, 1001, 1002, 0, 0, 0}, labels[] = {2, 1};
  static const double ls[] = {0.0, 0.1}, want[] = {0.7531091265562451, 0.8031091265562451};
  static const stoke_dtype dts[] = {STOKE_F64, STOKE_F32};
  for (int d = 0; d < 2; d++)
    for (int s = 0; s < 2; s++) {
      op_case c = {.op = STOKE_OP_SOFTMAX_CE, .node = h_node(STOKE_OP_SOFTMAX_CE, "loss"), .n_in = 2};
      c.node.n_attrs = 1;
      c.node.attrs[STOKE_SOFTMAX_CE_LABEL_SMOOTHING].f = ls[s];
      c.in[0] = h_tensor(dts[d], 2, (int64_t)2, (int64_t)3);
      c.in[1] = h_tensor(STOKE_I32, 1, (int64_t)2);
      c.out[0] = h_tensor(dts[d], 1, (int64_t)1);
      c.out[1] = h_tensor(dts[d], 1, (int64_t)2);
      c.n_out = 2;
      h_set_all(&c.in[0], logits);
      h_set_all(&c.in[1], labels);
      run_fwd(&c, c.in, c.out);
      double got = h_get(&c.out[0], 0), tol = dts[d] == STOKE_F64 ? 1e-14 : 1e-6;
      H_CHECK(fabs(got - want[s]) < tol, "loss %.16g, want %.16g (ls %g, %s)", got, want[s],
              ls[s], d ? "f32" : "f64");
      case_free(&c);
    }
}

static void test_softmax_ce_bad_label(void **state) {
  static const int bad[] = {3, -1};
  for (int b = 0; b < 2; b++) {
    op_case c = softmax_ce_case(2, 3, 0.0);
    h_set(&c.in[1], 0, 0);
    h_set(&c.in[1], 1, bad[b]);
    stoke_kernel_args_v1 a = args_for(&c, c.in, c.out);
    stoke_err *e = h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a);
    assert_non_null(e);
    assert_int_equal(e->code, STOKE_E_DATA);
    char want[64];
    snprintf(want, sizeof want, "row 1 has label %d", bad[b]);
    H_CHECK(strstr(e->msg, want) && strstr(e->msg, "'loss'"), "message: %s", e->msg);
    stoke_err_free(e);
    stoke_tensor r[OC_MAX], din[2];
    make_dout(&c, r, -1);
    h_set(&r[0], 0, 1);
    make_din(&c, din, -1);
    e = try_bwd(&c, c.in, c.out, din, r, 0.0f);
    assert_non_null(e);
    assert_int_equal(e->code, STOKE_E_DATA);
    stoke_err_free(e);
    free_din(&c, din);
    free_dout(&c, r);
    case_free(&c);
  }
}

/* Shape mismatches are STOKE_E_INVALID naming the node and the shapes. */
static void test_bad_shapes(void **state) {
  op_case c = linear_case(3, 4, 5);
  c.in[1].shape.d[1] = 6; /* weight [5, 6] against x [3, 4] */
  stoke_kernel_args_v1 a = args_for(&c, c.in, c.out);
  stoke_err *e = h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  H_CHECK(strstr(e->msg, "'fc1'") && strstr(e->msg, "[5, 6]") && strstr(e->msg, "[3, 4]"),
          "message: %s", e->msg);
  stoke_err_free(e);
  c.in[1].shape.d[1] = 4;
  c.in[0].dtype = STOKE_F32; /* an f32 tensor given to the f64 kernel */
  e = h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  stoke_err_free(e);
  c.in[0].dtype = STOKE_F64;
  case_free(&c);

  c = add_case(2, 3);
  c.in[1].shape.d[1] = 4;
  a = args_for(&c, c.in, c.out);
  e = h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  H_CHECK(strstr(e->msg, "'res1'") != NULL, "message: %s", e->msg);
  stoke_err_free(e);
  c.in[1].shape.d[1] = 3;
  case_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_backend),
      H_TEST(test_linear_grad),
      H_TEST(test_linear_relu_grad),
      H_TEST(test_linear_relu_matches_linear_then_relu),
      H_TEST(test_relu_grad),
      H_TEST(test_gelu_grad),
      H_TEST(test_gelu_known_values),
      H_TEST(test_add_grad),
      H_TEST(test_softmax_ce_grad),
      H_TEST(test_softmax_ce_grad_label_smoothing),
      H_TEST(test_param_grad_beta),
      H_TEST(test_linear_no_dx),
      H_TEST(test_linear_forward_naive),
      H_TEST(test_softmax_ce_forward_naive),
      H_TEST(test_softmax_ce_known_value),
      H_TEST(test_softmax_ce_bad_label),
      H_TEST(test_bad_shapes),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
