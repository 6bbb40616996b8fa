/* tests/op/seq_grad_test.c: the CPU kernels of the sequence ops (embedding,
 * position_embedding, layer_norm, add_layer_norm, attention, matmul) and
 * the views (reshape, slice, split, transpose): every input gradient
 * against central finite differences in double, forwards against naive
 * loops, gradient accumulation, the kernels' in-place
 * forms (a view's output on its input, add_layer_norm's shared gradient,
 * softmax_ce's dlogits over the logits) and the error cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "stoke/graph.h" /* stoke_node_init */

#include "opcase.h"

/* A case of `op` with attributes parsed as a model's node would be. */
static op_case new_case(const char *op, const char *attrs, int n_in, int n_out) {
  op_case c = {.op = op, .n_in = n_in, .n_out = n_out};
  H_OK(stoke_node_init(h_reg, op, "n1", attrs, &c.node));
  return c;
}

/* --------------------------------------------------------------- the cases */

/* weight[V, C], idx[2, 3] with repeated rows (the scatter-add must sum). */
static op_case embedding_case(int64_t v, int64_t c) {
  op_case k = new_case(STOKE_OP_EMBEDDING, "", 2, 1);
  k.in[0] = h_tensor(STOKE_F64, 2, v, c);
  k.in[1] = h_tensor(STOKE_I32, 2, (int64_t)2, (int64_t)3);
  k.out[0] = h_tensor(STOKE_F64, 3, (int64_t)2, (int64_t)3, c);
  h_random(&k.in[0], -1, 1);
  for (int64_t i = 0; i < 6; i++) h_set(&k.in[1], i, (double)(h_next() % (uint64_t)v));
  h_set(&k.in[1], 5, h_get(&k.in[1], 0));
  k.grads = k.params = 1;
  return k;
}

static op_case pos_case(int64_t b, int64_t t, int64_t c, int64_t p) {
  op_case k = new_case(STOKE_OP_POSITION_EMBEDDING, "", 2, 1);
  k.in[0] = h_tensor(STOKE_F64, 3, b, t, c);
  k.in[1] = h_tensor(STOKE_F64, 2, p, c);
  k.out[0] = h_tensor(STOKE_F64, 3, b, t, c);
  h_random(&k.in[0], -1, 1);
  h_random(&k.in[1], -1, 1);
  k.grads = 3;
  k.params = 2;
  return k;
}

/* layer_norm on x[2, 3, C] (rows of different means and spreads); add 1:
 * add_layer_norm, 2: add_bias_layer_norm (its c last). */
static op_case ln_case(int add, int64_t c) {
  op_case k = new_case(add == 2 ? STOKE_OP_ADD_BIAS_LAYER_NORM : add ? STOKE_OP_ADD_LAYER_NORM : STOKE_OP_LAYER_NORM,
                       "eps=1e-5", add == 2 ? 5 : add ? 4 : 3, add ? 4 : 3);
  int xs = add ? 2 : 1;
  for (int i = 0; i < xs; i++) {
    k.in[i] = h_tensor(STOKE_F64, 3, (int64_t)2, (int64_t)3, c);
    for (int64_t r = 0; r < 6; r++) {
      double mu = h_uniform(-2, 2), sd = h_uniform(0.3, 2);
      for (int64_t j = 0; j < c; j++) h_set(&k.in[i], r * c + j, mu + sd * h_uniform(-1, 1));
    }
  }
  k.in[xs] = h_tensor(STOKE_F64, 1, c);
  k.in[xs + 1] = h_tensor(STOKE_F64, 1, c);
  h_random(&k.in[xs], 0.5, 1.5);
  h_random(&k.in[xs + 1], -1, 1);
  if (add == 2) {
    k.in[4] = h_tensor(STOKE_F64, 1, c);
    h_random(&k.in[4], -1, 1);
  }
  for (int j = 0; j < xs; j++) k.out[j] = h_like(&k.in[0], -1);
  k.out[xs] = h_tensor(STOKE_F64, 1, (int64_t)6);
  k.out[xs + 1] = h_tensor(STOKE_F64, 1, (int64_t)6);
  k.grads = add == 2 ? 31 : add ? 15 : 7;
  k.params = add == 2 ? 28 : add ? 12 : 6;
  k.douts = add ? 3 : 1; /* s and y carry gradients; mean and rstd are saved statistics */
  return k;
}

static op_case attention_case(int64_t b, int64_t t, int64_t h, int64_t d, int causal) {
  char attrs[64];
  snprintf(attrs, sizeof attrs, "n_head=%lld, causal=%d", (long long)h, causal);
  op_case k = new_case(STOKE_OP_ATTENTION, attrs, 1, 2);
  k.in[0] = h_tensor(STOKE_F64, 3, b, t, 3 * h * d);
  k.out[0] = h_tensor(STOKE_F64, 3, b, t, h * d);
  k.out[1] = h_tensor(STOKE_F64, 3, b, h, t);
  h_random(&k.in[0], -1.5, 1.5);
  k.grads = 1;
  return k;
}

static op_case matmul_case(int64_t n, int64_t in, int64_t out) {
  op_case k = new_case(STOKE_OP_MATMUL, "", 2, 1);
  k.in[0] = h_tensor(STOKE_F64, 2, n, in);
  k.in[1] = h_tensor(STOKE_F64, 2, out, in);
  k.out[0] = h_tensor(STOKE_F64, 2, n, out);
  h_random(&k.in[0], -1, 1);
  h_random(&k.in[1], -1, 1);
  k.grads = 3;
  k.params = 2;
  return k;
}

/* A view op on x[2, 3, 4] with its outputs' shapes given. */
static op_case view_case(const char *op, const char *attrs, int n_out, const int64_t (*shapes)[3]) {
  op_case k = new_case(op, attrs, 1, n_out);
  k.in[0] = h_tensor(STOKE_F64, 3, (int64_t)2, (int64_t)3, (int64_t)4);
  h_random(&k.in[0], -1, 1);
  for (int j = 0; j < n_out; j++) k.out[j] = h_tensor(STOKE_F64, 3, shapes[j][0], shapes[j][1], shapes[j][2]);
  k.grads = 1;
  k.douts = (1u << n_out) - 1;
  return k;
}

static const int64_t reshape_shape[][3] = {{4, 3, 2}};
static const int64_t slice_shape[][3] = {{2, 2, 4}};
static const int64_t split_shapes[][3] = {{2, 3, 1}, {2, 3, 3}};
static const int64_t transpose_shape[][3] = {{4, 3, 2}};

static op_case reshape_c(void) { return view_case(STOKE_OP_RESHAPE, "shape=4x-1x2", 1, reshape_shape); }
static op_case slice_c(void) { return view_case(STOKE_OP_SLICE, "dim=1, start=1, length=2", 1, slice_shape); }
static op_case split_c(void) { return view_case(STOKE_OP_SPLIT, "dim=-1, sizes=1x3", 2, split_shapes); }
static op_case transpose_c(void) { return view_case(STOKE_OP_TRANSPOSE, "dim0=0, dim1=2", 1, transpose_shape); }

static op_case softmax_case(int64_t n, int64_t c) {
  op_case k = new_case(STOKE_OP_SOFTMAX_CE, "label_smoothing=0.1", 2, 2);
  k.in[0] = h_tensor(STOKE_F64, 2, n, c);
  k.in[1] = h_tensor(STOKE_I32, 1, n);
  k.out[0] = h_tensor(STOKE_F64, 1, (int64_t)1);
  k.out[1] = h_tensor(STOKE_F64, 1, n);
  h_random(&k.in[0], -3, 3);
  for (int64_t i = 0; i < n; i++) h_set(&k.in[1], i, (double)(h_next() % (uint64_t)c));
  k.grads = 1;
  return k;
}

/* ------------------------------------------------------ gradients and f32 */

typedef op_case (*case_fn)(void);

static op_case emb_c(void) { return embedding_case(5, 4); }
static op_case pos_c(void) { return pos_case(2, 3, 4, 5); }
static op_case ln_c(void) { return ln_case(0, 7); }
static op_case add_ln_c(void) { return ln_case(1, 7); }
static op_case add_bias_ln_c(void) { return ln_case(2, 7); }
static op_case att_causal_c(void) { return attention_case(2, 5, 2, 3, 1); }
static op_case att_full_c(void) { return attention_case(1, 4, 3, 2, 0); }
static op_case matmul_c(void) { return matmul_case(4, 5, 3); }

static const struct {
  const char *label;
  case_fn make;
} cases[] = {
    {"embedding", emb_c},           {"position_embedding", pos_c}, {"layer_norm", ln_c},
    {"add_layer_norm", add_ln_c},   {"add_bias_layer_norm", add_bias_ln_c},
    {"attention causal", att_causal_c}, {"attention full", att_full_c},
    {"matmul", matmul_c},           {"reshape", reshape_c},        {"slice", slice_c},
    {"split", split_c},             {"transpose", transpose_c},
};
#define N_CASES ((int)(sizeof cases / sizeof *cases))

static void test_grads(void **state) {
  for (int i = 0; i < N_CASES; i++) {
    op_case c = cases[i].make();
    grad_check(&c, cases[i].label);
    case_free(&c);
  }
}

static void test_param_grad_beta(void **state) {
  for (int i = 0; i < N_CASES; i++) {
    op_case c = cases[i].make();
    check_accumulation(&c, cases[i].label);
    case_free(&c);
  }
}

/* ------------------------------------------------------ naive forwards */

/* y, lse of attention by the textbook formula (softmax of masked scores). */
static void test_attention_forward_naive(void **state) {
  for (int causal = 0; causal < 2; causal++) {
    int64_t B = 2, T = 6, H = 2, D = 4, C = H * D;
    op_case c = attention_case(B, T, H, D, causal);
    run_fwd(&c, c.in, c.out);
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t t = 0; t < T; t++) {
          double w[16], z = 0;
          for (int64_t s = 0; s < T; s++) {
            double dot = 0;
            for (int64_t d = 0; d < D; d++)
              dot += h_get(&c.in[0], (b * T + t) * 3 * C + h * D + d) * h_get(&c.in[0], (b * T + s) * 3 * C + C + h * D + d);
            w[s] = causal && s > t ? 0 : exp(dot / sqrt((double)D));
            z += w[s];
          }
          worst = fmax(worst, fabs(h_get(&c.out[1], (b * H + h) * T + t) - log(z)));
          for (int64_t d = 0; d < D; d++) {
            double want = 0;
            for (int64_t s = 0; s < T; s++) want += w[s] / z * h_get(&c.in[0], (b * T + s) * 3 * C + 2 * C + h * D + d);
            worst = fmax(worst, fabs(h_get(&c.out[0], (b * T + t) * C + h * D + d) - want));
          }
        }
    H_CHECK(worst < 1e-12, "attention (causal %d): largest difference from the naive softmax %.3g", causal, worst);
    case_free(&c);
  }
}

static void test_layer_norm_forward_naive(void **state) {
  op_case c = ln_case(1, 9);
  run_fwd(&c, c.in, c.out);
  for (int64_t r = 0; r < 6; r++) {
    double s[9], m = 0, v = 0;
    for (int j = 0; j < 9; j++) m += (s[j] = h_get(&c.in[0], r * 9 + j) + h_get(&c.in[1], r * 9 + j)) / 9;
    for (int j = 0; j < 9; j++) v += (s[j] - m) * (s[j] - m) / 9;
    for (int j = 0; j < 9; j++) {
      double want = (s[j] - m) / sqrt(v + 1e-5) * h_get(&c.in[2], j) + h_get(&c.in[3], j);
      H_CHECK(fabs(h_get(&c.out[0], r * 9 + j) - s[j]) < 1e-15, "s[%lld, %d]", (long long)r, j);
      H_CHECK(fabs(h_get(&c.out[1], r * 9 + j) - want) < 1e-12, "y[%lld, %d] = %.15g, naive %.15g", (long long)r, j,
              h_get(&c.out[1], r * 9 + j), want);
    }
    H_CHECK(fabs(h_get(&c.out[2], r) - m) < 1e-14 && fabs(h_get(&c.out[3], r) - 1 / sqrt(v + 1e-5)) < 1e-10,
            "mean / rstd of row %lld", (long long)r);
  }
  case_free(&c);
}

static void test_embedding_forward(void **state) {
  op_case c = embedding_case(7, 5);
  run_fwd(&c, c.in, c.out);
  for (int64_t i = 0; i < 6; i++)
    for (int64_t j = 0; j < 5; j++)
      H_CHECK(h_get(&c.out[0], i * 5 + j) == h_get(&c.in[0], (int64_t)h_get(&c.in[1], i) * 5 + j), "out[%lld, %lld]",
              (long long)i, (long long)j);
  case_free(&c);
}

/* The views' outputs against index arithmetic. */
static void test_views_forward(void **state) {
  op_case t = transpose_c();
  run_fwd(&t, t.in, t.out);
  for (int64_t a = 0; a < 2; a++)
    for (int64_t b = 0; b < 3; b++)
      for (int64_t d = 0; d < 4; d++)
        H_CHECK(h_get(&t.out[0], (d * 3 + b) * 2 + a) == h_get(&t.in[0], (a * 3 + b) * 4 + d), "transpose");
  case_free(&t);
  op_case s = split_c();
  run_fwd(&s, s.in, s.out);
  for (int64_t r = 0; r < 6; r++) {
    H_CHECK(h_get(&s.out[0], r) == h_get(&s.in[0], r * 4), "split part 0 row %lld", (long long)r);
    for (int64_t j = 0; j < 3; j++) H_CHECK(h_get(&s.out[1], r * 3 + j) == h_get(&s.in[0], r * 4 + 1 + j), "split part 1");
  }
  case_free(&s);
  op_case l = slice_c();
  run_fwd(&l, l.in, l.out);
  for (int64_t a = 0; a < 2; a++)
    for (int64_t b = 0; b < 2; b++)
      for (int64_t d = 0; d < 4; d++)
        H_CHECK(h_get(&l.out[0], (a * 2 + b) * 4 + d) == h_get(&l.in[0], (a * 3 + b + 1) * 4 + d), "slice");
  case_free(&l);
}

/* ------------------------------------------------------- in-place forms */

/* Kernels given memory the compiler shares: a view's output on its input
 * (nothing moves), add_layer_norm's one gradient for a and b, and
 * softmax_ce's dlogits over the logits; each equal to the separate run. */
static void test_views_in_place(void **state) {
  /* slice of x[1, 6, 2] at rows 2..5: the output starts 4 elements in */
  op_case c = new_case(STOKE_OP_SLICE, "dim=1, start=2, length=3", 1, 1);
  c.in[0] = h_tensor(STOKE_F64, 3, (int64_t)1, (int64_t)6, (int64_t)2);
  h_random(&c.in[0], -1, 1);
  stoke_tensor before = h_like(&c.in[0], -1), view = c.in[0];
  h_convert(&before, &c.in[0]);
  view.shape = (stoke_shape){3, {1, 3, 2}};
  view.data = (double *)c.in[0].data + 4;
  stoke_kernel_args_v1 a = args_for(&c, c.in, &view);
  H_OK(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a));
  H_CHECK(h_rel_norm(&c.in[0], &before) == 0, "a slice in place changed its input");
  /* reshape backward with dx on dy: nothing to do, nothing changed */
  op_case r = reshape_c();
  stoke_tensor dy = h_like(&r.out[0], -1), dx = r.in[0], dy0 = h_like(&r.out[0], -1);
  h_random(&dy, -1, 1);
  h_convert(&dy0, &dy);
  dx.data = dy.data;
  H_OK(try_bwd(&r, r.in, r.out, &dx, &dy, 0.0f));
  H_CHECK(h_rel_norm(&dy, &dy0) == 0, "reshape backward in place changed dy");
  h_free(&dy);
  h_free(&dy0);
  h_free(&before);
  case_free(&r);
  case_free(&c);
}

static void test_add_layer_norm_shared_grad(void **state) {
  op_case c = ln_case(1, 8);
  c.params = 12;
  run_fwd(&c, c.in, c.out);
  stoke_tensor r[OC_MAX], din[OC_MAX], shared[OC_MAX];
  make_dout(&c, r, -1);
  make_din(&c, din, -1);
  make_din(&c, shared, -1);
  H_OK(try_bwd(&c, c.in, c.out, din, r, 0.0f));
  stoke_tensor keep = shared[1];
  shared[1].data = shared[0].data; /* one gradient value for a and b */
  H_OK(try_bwd(&c, c.in, c.out, shared, r, 0.0f));
  for (int i = 0; i < 4; i++) {
    int k = i == 1 ? 0 : i;
    H_CHECK(h_rel_norm(&shared[k], &din[i]) == 0, "din[%d] with a shared gradient differs", i);
  }
  shared[1] = keep;
  free_din(&c, din);
  free_din(&c, shared);
  free_dout(&c, r);
  case_free(&c);
}

static void test_softmax_ce_in_place(void **state) {
  op_case c = softmax_case(6, 11);
  run_fwd(&c, c.in, c.out);
  stoke_tensor r[OC_MAX], din[OC_MAX], logits = h_like(&c.in[0], -1), in[2] = {logits, c.in[1]};
  h_convert(&logits, &c.in[0]);
  make_dout(&c, r, -1);
  make_din(&c, din, -1);
  H_OK(try_bwd(&c, c.in, c.out, din, r, 0.0f));
  stoke_tensor over[2] = {logits, din[1]}; /* dlogits written over the logits; labels get none */
  H_OK(try_bwd(&c, in, c.out, over, r, 0.0f));
  H_CHECK(h_rel_norm(&logits, &din[0]) == 0, "softmax_ce backward in place differs: %.3g", h_rel_norm(&logits, &din[0]));
  h_free(&logits);
  free_din(&c, din);
  free_dout(&c, r);
  case_free(&c);
}

/* ---------------------------------------------------------------- errors */

static void test_embedding_bad_index(void **state) {
  op_case c = embedding_case(5, 3);
  h_set(&c.in[1], 4, 5);
  stoke_kernel_args_v1 a = args_for(&c, c.in, c.out);
  stoke_err *e = h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_DATA);
  H_CHECK(strstr(e->msg, "index 5 at position 4") && strstr(e->msg, "'n1'"), "message: %s", e->msg);
  stoke_err_free(e);
  case_free(&c);
}

/* Shape inference: each op's bad shapes are refused with the node's name. */
static void test_infer_errors(void **state) {
  static const struct {
    const char *op, *attrs;
  } bad[] = {
      {STOKE_OP_ATTENTION, "n_head=5"},          /* 5 does not divide C = 4 */
      {STOKE_OP_RESHAPE, "shape=5x-1"},          /* 24 elements */
      {STOKE_OP_SLICE, "dim=1, start=2, length=2"},
      {STOKE_OP_SPLIT, "dim=2, sizes=1x2"},      /* sums to 3, not 4 */
      {STOKE_OP_TRANSPOSE, "dim0=0, dim1=3"},
  };
  const stoke_op_type_v1 *t;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    stoke_node_v1 n;
    H_OK(stoke_node_init(h_reg, bad[i].op, "bad1", bad[i].attrs, &n));
    t = stoke_find_op(h_reg, bad[i].op);
    stoke_value_desc_v1 in[1] = {{{3, {2, 3, 4}}, STOKE_F32}}, out[STOKE_MAX_IO];
    if (!strcmp(bad[i].op, STOKE_OP_ATTENTION)) in[0].shape.d[2] = 12;
    memset(out, 0, sizeof out);
    stoke_err *e = t->infer(&n, in, out);
    H_CHECK(e && e->code == STOKE_E_INVALID && strstr(e->msg, "'bad1'"), "%s %s: %s", bad[i].op, bad[i].attrs,
            e ? e->msg : "accepted");
    stoke_err_free(e);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_grads),
      H_TEST(test_param_grad_beta),
      H_TEST(test_attention_forward_naive),
      H_TEST(test_layer_norm_forward_naive),
      H_TEST(test_embedding_forward),
      H_TEST(test_views_forward),
      H_TEST(test_views_in_place),
      H_TEST(test_add_layer_norm_shared_grad),
      H_TEST(test_softmax_ce_in_place),
      H_TEST(test_embedding_bad_index),
      H_TEST(test_infer_errors),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
