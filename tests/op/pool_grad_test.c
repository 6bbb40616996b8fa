/* tests/op/pool_grad_test.c: max_pool2d, avg_pool2d and dropout: the op
 * types (attributes, shape inference and its errors), and the CPU kernels:
 * forwards against naive loops in double, every gradient against central
 * finite differences in double, NHWC against NCHW, max
 * pool ties, max_pool2d_idx against max_pool2d, and the dropout mask
 * (rate, scale, seed, backward). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "stoke/graph.h"
#include "stoke/rng.h"

#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_FLOOR 1e-2

/* ------------------------------------------------------------ geometry */

/* A pool configuration as a node's attributes: kn/sn/pn integers given
 * (1 = the same for h and w); stride 0 = the kernel. */
typedef struct pool_cfg {
  const char *label;
  int kn, sn, pn;
  int64_t k[2], s[2], p[2];
} pool_cfg;

static const pool_cfg cfgs[] = {
    {"kernel 2 stride 2", 1, 1, 1, {2, 2}, {2, 2}, {0, 0}},
    {"kernel 3 stride 2 padding 1", 1, 1, 1, {3, 3}, {2, 2}, {1, 1}},
    {"kernel 3x2 stride 1", 2, 1, 1, {3, 2}, {1, 1}, {0, 0}},
    {"kernel 3x2 stride 0 (= kernel) padding 1x1", 2, 1, 2, {3, 2}, {0, 0}, {1, 1}},
};
#define N_CFGS ((int)(sizeof cfgs / sizeof *cfgs))

static const char *const pool_ops[] = {STOKE_OP_MAX_POOL2D, STOKE_OP_AVG_POOL2D};
static const stoke_layout layouts[] = {STOKE_NCHW, STOKE_NHWC};
static const char *const layout_names[] = {"NCHW", "NHWC"};

/* The geometry the cfg means, per dim. */
typedef struct geo {
  int64_t k[2], s[2], p[2];
} geo;

static geo cfg_geo(const pool_cfg *c) {
  geo g;
  for (int d = 0; d < 2; d++) {
    g.k[d] = c->k[c->kn == 2 ? d : 0];
    g.s[d] = c->s[c->sn == 2 ? d : 0];
    g.p[d] = c->p[c->pn == 2 ? d : 0];
    if (g.s[d] == 0) g.s[d] = g.k[d];
  }
  return g;
}

static void set_ints(stoke_attr_v1 *a, int n, const int64_t *v) {
  memset(a, 0, sizeof *a);
  a->n = n;
  for (int i = 0; i < n; i++) a->ints[i] = v[i];
  a->i = v[0];
  a->f = (double)v[0];
}

static stoke_node_v1 pool_node(const char *op, const pool_cfg *c, const char *name) {
  stoke_node_v1 n = h_node(op, name);
  n.n_attrs = 3;
  set_ints(&n.attrs[STOKE_POOL_KERNEL], c->kn, c->k);
  set_ints(&n.attrs[STOKE_POOL_STRIDE], c->sn, c->s);
  set_ints(&n.attrs[STOKE_POOL_PADDING], c->pn, c->p);
  return n;
}

/* ------------------------------------------------------------- tensors */

static stoke_tensor make4(stoke_dtype dt, stoke_layout l, int64_t n, int64_t c, int64_t h,
                          int64_t w) {
  stoke_tensor t = h_tensor(dt, 4, n, c, h, w);
  t.layout = l;
  return t;
}

/* Memory offset of logical (n, c, h, w). */
static int64_t off4(const stoke_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t *d = t->shape.d;
  if (t->layout == STOKE_NHWC) return ((n * d[2] + h) * d[3] + w) * d[1] + c;
  return ((n * d[1] + c) * d[2] + h) * d[3] + w;
}

static double get4(const stoke_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
  return h_get(t, off4(t, n, c, h, w));
}

/* A copy of src in layout l (and dtype dt if >= 0), same logical values. */
static stoke_tensor relayout(const stoke_tensor *src, stoke_layout l, int dt) {
  stoke_tensor t = h_like(src, dt);
  t.layout = l;
  const int64_t *d = src->shape.d;
  for (int64_t n = 0; n < d[0]; n++)
    for (int64_t c = 0; c < d[1]; c++)
      for (int64_t h = 0; h < d[2]; h++)
        for (int64_t w = 0; w < d[3]; w++) h_set(&t, off4(&t, n, c, h, w), get4(src, n, c, h, w));
  return t;
}

/* Distinct values (a shuffled ramp in [-2, 2), gaps 4/numel >> FD_H) so
 * every window's maximum is unique and stays so under x +- FD_H. */
static void fill_distinct(stoke_tensor *t) {
  int64_t n = h_numel(t);
  int64_t *perm = malloc((size_t)n * sizeof *perm);
  assert_non_null(perm);
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(h_next() % (unsigned long long)(i + 1)), tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  for (int64_t i = 0; i < n; i++) h_set(t, i, 4.0 * (double)(perm[i] - n / 2) / (double)n);
  free(perm);
}

#define XN 2
#define XC 3
#define XH 7
#define XW 6

static stoke_tensor pool_out(const stoke_tensor *x, const pool_cfg *c, int dt) {
  geo g = cfg_geo(c);
  int64_t ho = (x->shape.d[2] + 2 * g.p[0] - g.k[0]) / g.s[0] + 1;
  int64_t wo = (x->shape.d[3] + 2 * g.p[1] - g.k[1]) / g.s[1] + 1;
  return make4(dt >= 0 ? (stoke_dtype)dt : x->dtype, x->layout, x->shape.d[0], x->shape.d[1], ho,
               wo);
}

/* ------------------------------------------------------------- running */

static stoke_kernel_args_v1 args1(const stoke_node_v1 *node, const stoke_tensor *in,
                                  const stoke_tensor *out) {
  stoke_kernel_args_v1 a;
  memset(&a, 0, sizeof a);
  a.node = node;
  a.n_in = 1;
  a.n_out = 1;
  a.in = in;
  a.out = out;
  a.training = 1;
  return a;
}

/* y = op(x); y poisoned first, must be fully written. */
static void run_fwd(const stoke_node_v1 *node, const stoke_tensor *x, stoke_tensor *y,
                    int training, uint64_t seed) {
  h_poison(y);
  stoke_kernel_args_v1 a = args1(node, x, y);
  a.training = training;
  a.seed = seed;
  H_OK(h_run(h_kernel(node->op, STOKE_FWD, x->dtype), &a));
  h_check_written(y, node->name);
}

/* dx = backward(dy), seeing only what the op's bwd_needs keeps; dx is
 * poisoned first (activation gradient: overwritten). */
static void run_bwd(const stoke_node_v1 *node, const stoke_tensor *x, const stoke_tensor *y,
                    stoke_tensor *dx, const stoke_tensor *dy, int training, uint64_t seed) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, node->op);
  assert_non_null(t);
  stoke_tensor lx = *x, ly = *y;
  if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(0))) lx.data = NULL;
  if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(0))) ly.data = NULL;
  h_poison(dx);
  stoke_kernel_args_v1 a = args1(node, &lx, &ly);
  a.din = dx;
  a.dout = dy;
  a.training = training;
  a.seed = seed;
  a.param_grad_beta = 1.0f; /* must be ignored: x is an activation */
  H_OK(h_run(h_kernel(node->op, STOKE_BWD, x->dtype), &a));
  h_check_written(dx, node->name);
}

/* dL/dx[j] of L = sum(op(x) * r), central differences (x is f64). */
static double numeric_grad(const stoke_node_v1 *node, stoke_tensor *x, const stoke_tensor *y,
                           const stoke_tensor *r, int64_t j, uint64_t seed) {
  stoke_tensor yp = h_like(y, -1), ym = h_like(y, -1);
  double v = h_get(x, j);
  h_set(x, j, v + FD_H);
  run_fwd(node, x, &yp, 1, seed);
  h_set(x, j, v - FD_H);
  run_fwd(node, x, &ym, 1, seed);
  h_set(x, j, v);
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

/* Backward against finite differences for x (f64), output y allocated. */
static void grad_check(const stoke_node_v1 *node, stoke_tensor *x, stoke_tensor *y, uint64_t seed,
                       const char *label) {
  run_fwd(node, x, y, 1, seed);
  stoke_tensor r = h_like(y, -1), dx = h_like(x, -1);
  h_random(&r, -1, 1);
  run_bwd(node, x, y, &dx, &r, 1, seed);
  double worst = 0;
  for (int64_t j = 0; j < h_numel(x); j++) {
    double num = numeric_grad(node, x, y, &r, j, seed), ana = h_get(&dx, j);
    double e = rel_err(ana, num);
    if (e > worst) worst = e;
    H_CHECK(e < FD_TOL, "%s: dx[%lld] = %.12g, finite differences %.12g (rel err %.3g)", label,
            (long long)j, ana, num, e);
  }
  print_message("%s: dx max rel err %.3g\n", label, worst);
  h_free(&r);
  h_free(&dx);
}

/* ---------------------------------------------------------- references */

/* Naive pool of x (any layout) at logical (n, c, oh, ow), in double: max
 * over the real elements (-inf padding), or their sum / (kh kw). */
static double ref_pool(const char *op, const geo *g, const stoke_tensor *x, int64_t n, int64_t c,
                       int64_t oh, int64_t ow, int64_t *argh, int64_t *argw) {
  int is_max = !strcmp(op, STOKE_OP_MAX_POOL2D);
  double acc = is_max ? -INFINITY : 0;
  int found = 0;
  for (int64_t i = 0; i < g->k[0]; i++)
    for (int64_t j = 0; j < g->k[1]; j++) {
      int64_t h = oh * g->s[0] - g->p[0] + i, w = ow * g->s[1] - g->p[1] + j;
      if (h < 0 || h >= x->shape.d[2] || w < 0 || w >= x->shape.d[3]) continue;
      double v = get4(x, n, c, h, w);
      if (is_max) {
        if (!found || v > acc) { /* first maximum in scan order */
          acc = v;
          if (argh) *argh = h;
          if (argw) *argw = w;
        }
        found = 1;
      } else {
        acc += v;
      }
    }
  return is_max ? acc : acc / (double)(g->k[0] * g->k[1]);
}

/* ---------------------------------------------------------------- tests */

static void test_op_types(void **state) {
  for (int o = 0; o < 2; o++) {
    const stoke_op_type_v1 *t = stoke_find_op(h_reg, pool_ops[o]);
    assert_non_null(t);
    assert_int_equal(t->n_inputs, 1);
    assert_int_equal(t->n_outputs, 1);
    assert_int_equal(t->n_attrs, 3);
    assert_true(t->has_backward);
    assert_string_equal(t->attrs[STOKE_POOL_KERNEL].name, "kernel");
    assert_null(t->attrs[STOKE_POOL_KERNEL].def); /* required */
    assert_string_equal(t->attrs[STOKE_POOL_STRIDE].name, "stride");
    assert_string_equal(t->attrs[STOKE_POOL_STRIDE].def, "0");
    assert_string_equal(t->attrs[STOKE_POOL_PADDING].name, "padding");
    assert_string_equal(t->attrs[STOKE_POOL_PADDING].def, "0");
    for (int i = 0; i < 3; i++) assert_int_equal(t->attrs[i].type, STOKE_ATTR_INTS);
  }
  assert_int_equal(stoke_find_op(h_reg, STOKE_OP_MAX_POOL2D)->bwd_needs, STOKE_BWD_NEEDS_INPUT(0));
  assert_int_equal(stoke_find_op(h_reg, STOKE_OP_AVG_POOL2D)->bwd_needs, STOKE_BWD_NEEDS_NOTHING);
  const stoke_op_type_v1 *d = stoke_find_op(h_reg, STOKE_OP_DROPOUT);
  assert_non_null(d);
  assert_int_equal(d->n_attrs, 1);
  assert_string_equal(d->attrs[STOKE_DROPOUT_P].name, "p");
  assert_int_equal(d->attrs[STOKE_DROPOUT_P].type, STOKE_ATTR_FLOAT);
  assert_string_equal(d->attrs[STOKE_DROPOUT_P].def, "0.5");
  assert_int_equal(d->bwd_needs, STOKE_BWD_NEEDS_NOTHING);
  assert_true(d->has_backward);
  static const char *const ops[] = {STOKE_OP_MAX_POOL2D, STOKE_OP_AVG_POOL2D, STOKE_OP_DROPOUT};
  for (int o = 0; o < 3; o++)
    for (int p = 0; p < 2; p++) {
      h_kernel(ops[o], p ? STOKE_BWD : STOKE_FWD, STOKE_F32);
      h_kernel(ops[o], p ? STOKE_BWD : STOKE_FWD, STOKE_F64);
      /* the kernels serve both layouts */
      assert_non_null(stoke_find_kernel(h_reg, "cpu", ops[o], p ? STOKE_BWD : STOKE_FWD,
                                        STOKE_F32, STOKE_NHWC));
      assert_non_null(stoke_find_kernel(h_reg, "cpu", ops[o], p ? STOKE_BWD : STOKE_FWD,
                                        STOKE_F64, STOKE_NCHW));
    }
}

/* infer: output shapes, and the errors name the node. */
static void test_infer(void **state) {
  stoke_value_desc_v1 in = {{4, {XN, XC, XH, XW}}, STOKE_F32}, out;
  static const int64_t want[N_CFGS][2] = {{3, 3}, {4, 3}, {5, 5}, {3, 4}};
  for (int o = 0; o < 2; o++) {
    const stoke_op_type_v1 *t = stoke_find_op(h_reg, pool_ops[o]);
    for (int c = 0; c < N_CFGS; c++) {
      stoke_node_v1 n = pool_node(pool_ops[o], &cfgs[c], "pool1");
      memset(&out, 0, sizeof out);
      H_OK(t->infer(&n, &in, &out));
      assert_int_equal(out.shape.ndim, 4);
      assert_int_equal(out.shape.d[0], XN);
      assert_int_equal(out.shape.d[1], XC);
      H_CHECK(out.shape.d[2] == want[c][0] && out.shape.d[3] == want[c][1],
              "%s %s: out [.., %lld, %lld], want %lld x %lld", pool_ops[o], cfgs[c].label,
              (long long)out.shape.d[2], (long long)out.shape.d[3], (long long)want[c][0],
              (long long)want[c][1]);
      assert_int_equal(out.dtype, STOKE_F32);
      assert_true(t->flops(&n, &in, &out) > 0);
    }
    /* padding more than half the kernel (PyTorch's rule) */
    static const pool_cfg bad_pad = {"k3 p2", 1, 1, 1, {3, 3}, {1, 1}, {2, 2}};
    static const pool_cfg bad_pad_w = {"k3x4 p1x3", 2, 1, 2, {3, 4}, {1, 1}, {1, 3}};
    /* kernel 5 on 2x2 with padding 1 (padded 4x4) */
    static const pool_cfg too_big = {"k5 p1", 1, 1, 1, {5, 5}, {1, 1}, {1, 1}};
    const pool_cfg *bad[] = {&bad_pad, &bad_pad_w, &too_big};
    stoke_value_desc_v1 small = {{4, {1, 2, 2, 2}}, STOKE_F32};
    for (int b = 0; b < 3; b++) {
      stoke_node_v1 n = pool_node(pool_ops[o], bad[b], "pool_bad");
      stoke_err *e = t->infer(&n, b == 2 ? &small : &in, &out);
      assert_non_null(e);
      assert_int_equal(e->code, STOKE_E_INVALID);
      H_CHECK(strstr(e->msg, "'pool_bad'") != NULL, "%s %s: message: %s", pool_ops[o],
              bad[b]->label, e->msg);
      print_message("%s %s: %s\n", pool_ops[o], bad[b]->label, e->msg);
      stoke_err_free(e);
    }
    /* not 4-D */
    stoke_value_desc_v1 flat = {{2, {4, 5}}, STOKE_F32};
    stoke_node_v1 n = pool_node(pool_ops[o], &cfgs[0], "pool_flat");
    stoke_err *e = t->infer(&n, &flat, &out);
    assert_non_null(e);
    assert_int_equal(e->code, STOKE_E_INVALID);
    H_CHECK(strstr(e->msg, "'pool_flat'") != NULL, "message: %s", e->msg);
    stoke_err_free(e);
  }
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, STOKE_OP_DROPOUT);
  stoke_value_desc_v1 x3 = {{3, {2, 3, 4}}, STOKE_F64};
  static const double ps[] = {0, 0.5, 0.99, 1, -0.1, NAN};
  for (int i = 0; i < 6; i++) {
    stoke_node_v1 n = h_node(STOKE_OP_DROPOUT, "drop1");
    n.n_attrs = 1;
    n.attrs[STOKE_DROPOUT_P].f = ps[i];
    memset(&out, 0, sizeof out);
    stoke_err *e = t->infer(&n, &x3, &out);
    if (i < 3) {
      H_OK(e);
      assert_int_equal(out.shape.ndim, 3);
      assert_int_equal(out.shape.d[2], 4);
      assert_int_equal(out.dtype, STOKE_F64);
    } else {
      assert_non_null(e);
      assert_int_equal(e->code, STOKE_E_INVALID);
      H_CHECK(strstr(e->msg, "'drop1'") != NULL, "message: %s", e->msg);
      stoke_err_free(e);
    }
  }
}

/* Attributes through the graph builder: text parsing, defaults, required. */
static void test_graph_attrs(void **state) {
  stoke_graph *g;
  H_OK(stoke_graph_new(h_reg, STOKE_F32, STOKE_NHWC, &g));
  stoke_shape xs = {4, {XN, XC, XH, XW}};
  int x, y;
  H_OK(stoke_graph_input(g, "x", STOKE_VAL_INPUT, &xs, STOKE_F32, &x));
  stoke_builder_v1 b = stoke_graph_builder(g);
  stoke_shape s;
  H_OK(b.node(g, STOKE_OP_MAX_POOL2D, "pool1", &x, 1, "kernel=3, stride=2, padding=1", &y, 1));
  H_OK(b.shape_of(g, y, &s));
  assert_int_equal(s.d[2], 4);
  assert_int_equal(s.d[3], 3);
  H_OK(b.node(g, STOKE_OP_AVG_POOL2D, "pool2", &x, 1, "kernel=3x2", &y, 1));
  H_OK(b.shape_of(g, y, &s)); /* stride defaults to the kernel */
  assert_int_equal(s.d[2], 2);
  assert_int_equal(s.d[3], 3);
  H_OK(b.node(g, STOKE_OP_DROPOUT, "drop1", &y, 1, "", &y, 1));
  H_OK(b.node(g, STOKE_OP_DROPOUT, "drop2", &y, 1, "p=0.1", &y, 1));
  struct {
    const char *op, *attrs, *want;
  } bad[] = {
      {STOKE_OP_MAX_POOL2D, "", "kernel"}, /* required */
      {STOKE_OP_AVG_POOL2D, "kernel=2, padding=2", "padding"},
      {STOKE_OP_MAX_POOL2D, "kernel=9", "kernel"},
      {STOKE_OP_DROPOUT, "p=1", "p"},
  };
  for (int i = 0; i < 4; i++) {
    stoke_err *e = b.node(g, bad[i].op, "bad_node", &x, 1, bad[i].attrs, &y, 1);
    assert_non_null(e);
    assert_int_equal(e->code, STOKE_E_INVALID);
    H_CHECK(strstr(e->msg, "'bad_node'") && strstr(e->msg, bad[i].want), "%s '%s': %s", bad[i].op,
            bad[i].attrs, e->msg);
    stoke_err_free(e);
  }
  stoke_graph_free(g);
}

/* Forward against a naive double loop, both layouts, f64 and f32. */
static void test_pool_forward_naive(void **state) {
  for (int o = 0; o < 2; o++)
    for (int c = 0; c < N_CFGS; c++)
      for (int l = 0; l < 2; l++)
        for (int d = 0; d < 2; d++) {
          stoke_dtype dt = d ? STOKE_F32 : STOKE_F64;
          stoke_node_v1 node = pool_node(pool_ops[o], &cfgs[c], "pool1");
          stoke_tensor x = make4(dt, layouts[l], XN, XC, XH, XW);
          h_random(&x, -2, 2);
          stoke_tensor y = pool_out(&x, &cfgs[c], -1);
          run_fwd(&node, &x, &y, 1, 0);
          geo g = cfg_geo(&cfgs[c]);
          const int64_t *yd = y.shape.d;
          for (int64_t n = 0; n < yd[0]; n++)
            for (int64_t ch = 0; ch < yd[1]; ch++)
              for (int64_t oh = 0; oh < yd[2]; oh++)
                for (int64_t ow = 0; ow < yd[3]; ow++) {
                  double want = ref_pool(pool_ops[o], &g, &x, n, ch, oh, ow, NULL, NULL);
                  double got = get4(&y, n, ch, oh, ow);
                  double tol = d ? 1e-6 * fmax(1, fabs(want)) : 1e-13;
                  H_CHECK(fabs(got - want) <= tol,
                          "%s %s %s %s: y[%lld, %lld, %lld, %lld] = %.15g, naive %.15g",
                          pool_ops[o], cfgs[c].label, layout_names[l], stoke_dtype_name(dt),
                          (long long)n, (long long)ch, (long long)oh, (long long)ow, got, want);
                }
          h_free(&x);
          h_free(&y);
        }
}

/* Gradients against finite differences in f64, both layouts. */
static void test_pool_grad(void **state) {
  for (int o = 0; o < 2; o++)
    for (int c = 0; c < N_CFGS; c++)
      for (int l = 0; l < 2; l++) {
        stoke_node_v1 node = pool_node(pool_ops[o], &cfgs[c], "pool1");
        stoke_tensor x = make4(STOKE_F64, layouts[l], XN, XC, XH, XW);
        if (o == 0)
          fill_distinct(&x);
        else
          h_random(&x, -1, 1);
        stoke_tensor y = pool_out(&x, &cfgs[c], -1);
        char label[128];
        snprintf(label, sizeof label, "%s %s %s", pool_ops[o], cfgs[c].label, layout_names[l]);
        grad_check(&node, &x, &y, 0, label);
        h_free(&x);
        h_free(&y);
      }
}

/* NHWC gives what NCHW gives, after transposing (forward and backward). */
static void test_pool_nhwc_matches_nchw(void **state) {
  for (int o = 0; o < 2; o++)
    for (int c = 0; c < N_CFGS; c++)
      for (int d = 0; d < 2; d++) {
        stoke_dtype dt = d ? STOKE_F32 : STOKE_F64;
        stoke_node_v1 node = pool_node(pool_ops[o], &cfgs[c], "pool1");
        stoke_tensor xc = make4(dt, STOKE_NCHW, XN, XC, XH, XW);
        h_random(&xc, -1, 1);
        stoke_tensor xh = relayout(&xc, STOKE_NHWC, -1);
        stoke_tensor yc = pool_out(&xc, &cfgs[c], -1), yh = pool_out(&xh, &cfgs[c], -1);
        run_fwd(&node, &xc, &yc, 1, 0);
        run_fwd(&node, &xh, &yh, 1, 0);
        stoke_tensor yh_c = relayout(&yh, STOKE_NCHW, -1);
        double e = h_rel_norm(&yh_c, &yc);
        H_CHECK(e < 1e-14, "%s %s %s: forward NHWC vs NCHW relative norm %.3g", pool_ops[o],
                cfgs[c].label, stoke_dtype_name(dt), e);
        stoke_tensor rc = h_like(&yc, -1);
        h_random(&rc, -1, 1);
        stoke_tensor rh = relayout(&rc, STOKE_NHWC, -1);
        stoke_tensor dxc = h_like(&xc, -1), dxh = h_like(&xh, -1);
        run_bwd(&node, &xc, &yc, &dxc, &rc, 1, 0);
        run_bwd(&node, &xh, &yh, &dxh, &rh, 1, 0);
        stoke_tensor dxh_c = relayout(&dxh, STOKE_NCHW, -1);
        e = h_rel_norm(&dxh_c, &dxc);
        H_CHECK(e < 1e-14, "%s %s %s: backward NHWC vs NCHW relative norm %.3g", pool_ops[o],
                cfgs[c].label, stoke_dtype_name(dt), e);
        stoke_tensor *all[] = {&xc, &xh, &yc, &yh, &yh_c, &rc, &rh, &dxc, &dxh, &dxh_c};
        for (int i = 0; i < 10; i++) h_free(all[i]);
      }
}

/* Ties: the gradient goes to the first maximum of each window in
 * row-major scan order, as in PyTorch; values from {0, 1, 2} (many ties)
 * and all equal. */
static void test_max_pool_ties(void **state) {
  for (int c = 0; c < N_CFGS; c++)
    for (int l = 0; l < 2; l++)
      for (int v = 0; v < 2; v++) {
        stoke_node_v1 node = pool_node(STOKE_OP_MAX_POOL2D, &cfgs[c], "pool1");
        stoke_tensor x = make4(STOKE_F64, layouts[l], XN, XC, XH, XW);
        for (int64_t i = 0; i < h_numel(&x); i++) h_set(&x, i, v ? 1.0 : (double)(h_next() % 3));
        stoke_tensor y = pool_out(&x, &cfgs[c], -1), r = h_like(&y, -1), dx = h_like(&x, -1);
        run_fwd(&node, &x, &y, 1, 0);
        h_random(&r, -1, 1);
        run_bwd(&node, &x, &y, &dx, &r, 1, 0);
        double *want = calloc((size_t)h_numel(&x), sizeof *want);
        assert_non_null(want);
        geo g = cfg_geo(&cfgs[c]);
        const int64_t *yd = y.shape.d;
        for (int64_t n = 0; n < yd[0]; n++)
          for (int64_t ch = 0; ch < yd[1]; ch++)
            for (int64_t oh = 0; oh < yd[2]; oh++)
              for (int64_t ow = 0; ow < yd[3]; ow++) {
                int64_t ah = -1, aw = -1;
                ref_pool(STOKE_OP_MAX_POOL2D, &g, &x, n, ch, oh, ow, &ah, &aw);
                assert_true(ah >= 0 && aw >= 0);
                want[off4(&x, n, ch, ah, aw)] += get4(&r, n, ch, oh, ow);
              }
        for (int64_t i = 0; i < h_numel(&x); i++)
          H_CHECK(fabs(h_get(&dx, i) - want[i]) < 1e-12,
                  "%s %s (%s): dx[%lld] = %.15g, want %.15g (first maximum)", cfgs[c].label,
                  layout_names[l], v ? "all equal" : "values 0..2", (long long)i, h_get(&dx, i),
                  want[i]);
        free(want);
        h_free(&x);
        h_free(&y);
        h_free(&r);
        h_free(&dx);
      }
}

/* max_pool2d_idx, the op the compiler puts in place of a training graph's
 * max_pool2d: its y is max_pool2d's bit for bit, its index (output 1, u8,
 * y's layout) names each window's first maximum (ref_pool's, in scan
 * order), and its backward, given the index and not x, gives max_pool2d's
 * dx bit for bit (whose gradient test_pool_grad checks against finite
 * differences), overwritten and accumulated; distinct values and ties,
 * both layouts, f32 and f64. */
static void test_max_pool_idx(void **state) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, STOKE_OP_MAX_POOL2D_IDX);
  assert_non_null(t);
  assert_int_equal(t->n_inputs, 1);
  assert_int_equal(t->n_outputs, 2);
  assert_int_equal(t->bwd_needs, STOKE_BWD_NEEDS_OUTPUT(1));
  for (int c = 0; c < N_CFGS; c++)
    for (int l = 0; l < 2; l++)
      for (int v = 0; v < 2; v++)
        for (int d = 0; d < 2; d++) {
          stoke_dtype dt = d ? STOKE_F64 : STOKE_F32;
          stoke_node_v1 mp = pool_node(STOKE_OP_MAX_POOL2D, &cfgs[c], "pool1");
          stoke_node_v1 mi = pool_node(STOKE_OP_MAX_POOL2D_IDX, &cfgs[c], "pool1");
          stoke_tensor x = make4(dt, layouts[l], XN, XC, XH, XW);
          if (v) fill_distinct(&x);
          else
            for (int64_t i = 0; i < h_numel(&x); i++) h_set(&x, i, (double)(h_next() % 3));
          stoke_tensor y1 = pool_out(&x, &cfgs[c], -1), y2 = h_like(&y1, -1), ix = h_like(&y1, STOKE_U8);
          stoke_value_desc_v1 in = {x.shape, dt}, out[2];
          H_OK(t->infer(&mi, &in, out));
          H_CHECK(out[1].shape.ndim == 4 && !memcmp(out[1].shape.d, y1.shape.d, 4 * sizeof(int64_t)) &&
                      out[1].dtype == STOKE_U8,
                  "%s: the index is not y's shape in u8 (%d dims, %s)", cfgs[c].label, out[1].shape.ndim,
                  stoke_dtype_name(out[1].dtype));
          run_fwd(&mp, &x, &y1, 1, 0);
          stoke_tensor outs[2] = {y2, ix};
          h_poison(&outs[0]);
          memset(outs[1].data, 0xff, (size_t)h_numel(&outs[1])); /* 255: no position, so every index must be written */
          stoke_kernel_args_v1 a = args1(&mi, &x, outs);
          a.n_out = 2;
          H_OK(h_run(h_kernel(STOKE_OP_MAX_POOL2D_IDX, STOKE_FWD, dt), &a));
          assert_memory_equal(y1.data, outs[0].data, (size_t)h_numel(&y1) * stoke_dtype_size(dt));
          geo g = cfg_geo(&cfgs[c]);
          const int64_t *yd = y1.shape.d;
          const uint8_t *iv = outs[1].data;
          for (int64_t n = 0; n < yd[0]; n++)
            for (int64_t ch = 0; ch < yd[1]; ch++)
              for (int64_t oh = 0; oh < yd[2]; oh++)
                for (int64_t ow = 0; ow < yd[3]; ow++) {
                  int64_t ah = -1, aw = -1;
                  ref_pool(STOKE_OP_MAX_POOL2D, &g, &x, n, ch, oh, ow, &ah, &aw);
                  int64_t want = (ah - (oh * g.s[0] - g.p[0])) * g.k[1] + (aw - (ow * g.s[1] - g.p[1]));
                  int64_t got = iv[off4(&y1, n, ch, oh, ow)];
                  H_CHECK(got == want, "%s %s %s: index at (%lld, %lld, %lld, %lld) is %lld, want %lld", cfgs[c].label,
                          layout_names[l], stoke_dtype_name(dt), (long long)n, (long long)ch, (long long)oh,
                          (long long)ow, (long long)got, (long long)want);
                }
          /* backward: overwritten, then accumulated onto the same random start */
          stoke_tensor dy = h_like(&y1, -1), dx1 = h_like(&x, -1), dx2 = h_like(&x, -1), start = h_like(&x, -1);
          h_random(&dy, -1, 1);
          stoke_tensor dys[2] = {dy, outs[1]}; /* the index gets no gradient */
          dys[1].data = NULL;
          h_random(&start, -1, 1);
          for (int accumulate = 0; accumulate < 2; accumulate++) {
            run_bwd(&mp, &x, &y1, &dx1, &dy, 1, 0);
            if (accumulate) { /* dx1 = start + max_pool2d's dx, in the kernel's rounding */
              stoke_kernel_args_v1 b = args1(&mp, &x, &y1);
              memcpy(dx1.data, start.data, (size_t)h_numel(&x) * stoke_dtype_size(dt));
              b.din = &dx1, b.dout = &dy, b.din_accumulate = 1;
              H_OK(h_run(h_kernel(STOKE_OP_MAX_POOL2D, STOKE_BWD, dt), &b));
            }
            stoke_tensor nx = x, bo[2] = {y2, outs[1]};
            nx.data = NULL, bo[0].data = NULL; /* bwd_needs: the index alone */
            if (accumulate) memcpy(dx2.data, start.data, (size_t)h_numel(&x) * stoke_dtype_size(dt));
            else h_poison(&dx2);
            stoke_kernel_args_v1 b = args1(&mi, &nx, bo);
            b.n_out = 2, b.din = &dx2, b.dout = dys, b.din_accumulate = (uint32_t)accumulate;
            H_OK(h_run(h_kernel(STOKE_OP_MAX_POOL2D_IDX, STOKE_BWD, dt), &b));
            H_CHECK(!memcmp(dx1.data, dx2.data, (size_t)h_numel(&x) * stoke_dtype_size(dt)),
                    "%s %s %s %s: max_pool2d_idx's dx differs from max_pool2d's", cfgs[c].label, layout_names[l],
                    stoke_dtype_name(dt), accumulate ? "accumulated" : "overwritten");
          }
          /* an index that names no position of the window: an error naming the node */
          ((uint8_t *)outs[1].data)[0] = 200;
          stoke_tensor nx = x, bo[2] = {y2, outs[1]};
          nx.data = NULL;
          stoke_kernel_args_v1 b = args1(&mi, &nx, bo);
          b.n_out = 2, b.din = &dx2, b.dout = dys;
          stoke_err *e = h_run(h_kernel(STOKE_OP_MAX_POOL2D_IDX, STOKE_BWD, dt), &b);
          assert_non_null(e);
          H_CHECK(strstr(e->msg, "max_pool2d_idx 'pool1': index 200") != NULL, "message: %s", e->msg);
          stoke_err_free(e);
          h_free(&x), h_free(&y1), h_free(&y2), h_free(&ix), h_free(&dy), h_free(&dx1), h_free(&dx2),
              h_free(&start);
        }
  /* a window of more positions than a byte index names: refused by infer, naming the node */
  static const pool_cfg big = {"k12", 1, 1, 1, {12, 12}, {1, 1}, {0, 0}};
  stoke_node_v1 mi = pool_node(STOKE_OP_MAX_POOL2D_IDX, &big, "pool_big");
  stoke_value_desc_v1 in = {{4, {1, 1, 12, 12}}, STOKE_F32}, out[2];
  stoke_err *e = t->infer(&mi, &in, out);
  assert_non_null(e);
  H_CHECK(strstr(e->msg, "max_pool2d_idx 'pool_big': a 12x12 window has more than 127 positions") != NULL,
          "message: %s", e->msg);
  stoke_err_free(e);
}

/* The kernel's error is `want`, word for word (E_INVALID). */
static void expect_pool_error(const char *op, stoke_kernel_args_v1 *a, const char *want) {
  stoke_err *e = h_run(h_kernel(op, STOKE_FWD, STOKE_F64), a);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INVALID);
  H_CHECK(!strcmp(e->msg, want), "message: %s\nwanted:  %s", e->msg, want);
  stoke_err_free(e);
}

/* Kernel-side errors (stoke_check_pool, which the cuda engine shares) name
 * the op and the node: bad geometry, attributes, wrong output shape. */
static void test_pool_kernel_errors(void **state) {
  char want[512];
  for (int o = 0; o < 2; o++) {
    const char *op = pool_ops[o];
    static const pool_cfg bad_pad = {"k2 p2", 1, 1, 1, {2, 2}, {1, 1}, {2, 2}};
    stoke_node_v1 node = pool_node(op, &bad_pad, "pool_k");
    stoke_tensor x = make4(STOKE_F64, STOKE_NCHW, 1, 2, 4, 4), y = make4(STOKE_F64, STOKE_NCHW, 1, 2, 7, 7);
    stoke_kernel_args_v1 a = args1(&node, &x, &y);
    snprintf(want, sizeof want,
             "%s 'pool_k': kernel 2x2, stride 1x1, padding 2x2: need kernel >= 1, stride >= 1, 0 <= padding <= "
             "kernel/2",
             op);
    expect_pool_error(op, &a, want);
    node = pool_node(op, &cfgs[0], "pool_k"); /* 4x4 -> 2x2, not 7x7 */
    snprintf(want, sizeof want, "%s 'pool_k': x [1, 2, 4, 4] gives y [1, 2, 2, 2], got y [1, 2, 7, 7]", op);
    expect_pool_error(op, &a, want);
    static const pool_cfg big = {"k5", 1, 1, 1, {5, 5}, {1, 1}, {0, 0}};
    node = pool_node(op, &big, "pool_k");
    snprintf(want, sizeof want,
             "%s 'pool_k': kernel 5x5 is larger than the padded input (x [1, 2, 4, 4], padding 0x0)", op);
    expect_pool_error(op, &a, want);
    node = pool_node(op, &cfgs[0], "pool_k");
    node.attrs[STOKE_POOL_STRIDE].n = 3;
    snprintf(want, sizeof want, "%s 'pool_k': stride takes 1 or 2 integers, got 3", op);
    expect_pool_error(op, &a, want);
    node.attrs[STOKE_POOL_STRIDE].n = 1;
    node.n_attrs = 2;
    snprintf(want, sizeof want, "%s 'pool_k': attribute padding missing", op);
    expect_pool_error(op, &a, want);
    h_free(&x);
    h_free(&y);
  }
}

/* ------------------------------------------------------------- dropout */

static stoke_node_v1 drop_node(double p) {
  stoke_node_v1 n = h_node(STOKE_OP_DROPOUT, "drop1");
  n.n_attrs = 1;
  n.attrs[STOKE_DROPOUT_P].f = p;
  return n;
}

/* x with no zeros: |x| in [0.25, 1). */
static void fill_nonzero(stoke_tensor *t) {
  for (int64_t i = 0; i < h_numel(t); i++)
    h_set(t, i, (h_next() & 1 ? 1 : -1) * h_uniform(0.25, 1));
}

static void test_dropout_eval_identity(void **state) {
  for (int d = 0; d < 2; d++) {
    stoke_dtype dt = d ? STOKE_F32 : STOKE_F64;
    stoke_node_v1 node = drop_node(0.5);
    stoke_tensor x = h_tensor(dt, 3, (int64_t)4, (int64_t)5, (int64_t)6);
    fill_nonzero(&x);
    stoke_tensor y = h_like(&x, -1), dy = h_like(&x, -1), dx = h_like(&x, -1);
    run_fwd(&node, &x, &y, 0, 1234);
    for (int64_t i = 0; i < h_numel(&x); i++)
      H_CHECK(h_get(&y, i) == h_get(&x, i), "eval: y[%lld] = %g, x %g", (long long)i,
              h_get(&y, i), h_get(&x, i));
    h_random(&dy, -1, 1);
    run_bwd(&node, &x, &y, &dx, &dy, 0, 1234);
    for (int64_t i = 0; i < h_numel(&x); i++)
      H_CHECK(h_get(&dx, i) == h_get(&dy, i), "eval: dx[%lld] = %g, dy %g", (long long)i,
              h_get(&dx, i), h_get(&dy, i));
    /* p = 0 in training is the identity too */
    node = drop_node(0.0);
    run_fwd(&node, &x, &y, 1, 1234);
    for (int64_t i = 0; i < h_numel(&x); i++) assert_true(h_get(&y, i) == h_get(&x, i));
    h_free(&x);
    h_free(&y);
    h_free(&dy);
    h_free(&dx);
  }
}

/* Training: the rate of zeros (within 5 sigma), the kept elements scaled
 * by 1/(1-p), the mask stoke_uniform_at(seed, i) >= p per element. */
static void test_dropout_mask(void **state) {
  static const double ps[] = {0.1, 0.5, 0.8};
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < 3; k++) {
      stoke_dtype dt = d ? STOKE_F32 : STOKE_F64;
      double p = ps[k], scale = 1.0 / (1.0 - p);
      stoke_node_v1 node = drop_node(p);
      stoke_tensor x = h_tensor(dt, 2, (int64_t)100, (int64_t)200);
      fill_nonzero(&x);
      stoke_tensor y = h_like(&x, -1);
      uint64_t seed = h_next();
      run_fwd(&node, &x, &y, 1, seed);
      int64_t n = h_numel(&x), zeros = 0;
      for (int64_t i = 0; i < n; i++) {
        int keep = stoke_uniform_at(seed, (uint64_t)i) >= p;
        double got = h_get(&y, i), xi = h_get(&x, i);
        if (got == 0) zeros++;
        double want = keep ? xi * scale : 0;
        if (dt == STOKE_F32) want = (double)(float)want;
        H_CHECK(keep ? fabs(got - want) <= 1e-15 * fabs(want) : got == 0,
                "p %g %s: y[%lld] = %.9g, want %.9g (keep %d)", p, stoke_dtype_name(dt),
                (long long)i, got, want, keep);
      }
      double mean = (double)n * p, sigma = sqrt((double)n * p * (1 - p));
      H_CHECK(fabs((double)zeros - mean) < 5 * sigma, "p %g: %lld of %lld zeroed, expected %g +- %g",
              p, (long long)zeros, (long long)n, mean, 5 * sigma);
      h_free(&x);
      h_free(&y);
    }
}

/* The same seed gives the same mask, another seed another one. */
static void test_dropout_seed(void **state) {
  stoke_node_v1 node = drop_node(0.5);
  stoke_tensor x = h_tensor(STOKE_F32, 4, (int64_t)2, (int64_t)3, (int64_t)8, (int64_t)8);
  fill_nonzero(&x);
  stoke_tensor y1 = h_like(&x, -1), y2 = h_like(&x, -1), y3 = h_like(&x, -1);
  uint64_t seed = h_next();
  run_fwd(&node, &x, &y1, 1, seed);
  run_fwd(&node, &x, &y2, 1, seed);
  run_fwd(&node, &x, &y3, 1, seed + 1);
  int64_t differ = 0;
  for (int64_t i = 0; i < h_numel(&x); i++) {
    H_CHECK(h_get(&y1, i) == h_get(&y2, i), "same seed: y[%lld] %g vs %g", (long long)i,
            h_get(&y1, i), h_get(&y2, i));
    differ += (h_get(&y1, i) == 0) != (h_get(&y3, i) == 0);
  }
  /* 384 elements, each differs with probability 1/2 */
  H_CHECK(differ > 100, "seeds %llu and %llu: masks differ in only %lld of %lld",
          (unsigned long long)seed, (unsigned long long)(seed + 1), (long long)differ,
          (long long)h_numel(&x));
  h_free(&x);
  h_free(&y1);
  h_free(&y2);
  h_free(&y3);
}

/* Backward regenerates the forward's mask from the same seed:
 * dx = dy * mask / (1 - p). */
static void test_dropout_backward_mask(void **state) {
  for (int d = 0; d < 2; d++) {
    stoke_dtype dt = d ? STOKE_F32 : STOKE_F64;
    double p = 0.3, scale = 1.0 / (1.0 - p);
    stoke_node_v1 node = drop_node(p);
    stoke_tensor x = h_tensor(dt, 2, (int64_t)50, (int64_t)40);
    fill_nonzero(&x);
    stoke_tensor y = h_like(&x, -1), dy = h_like(&x, -1), dx = h_like(&x, -1);
    uint64_t seed = h_next();
    run_fwd(&node, &x, &y, 1, seed);
    h_random(&dy, -1, 1);
    run_bwd(&node, &x, &y, &dx, &dy, 1, seed); /* sees neither x nor y */
    for (int64_t i = 0; i < h_numel(&x); i++) {
      int kept = h_get(&y, i) != 0;
      double want = kept ? h_get(&dy, i) * scale : 0;
      if (dt == STOKE_F32) want = (double)(float)want;
      H_CHECK(fabs(h_get(&dx, i) - want) <= 1e-15 * fabs(want),
              "%s: dx[%lld] = %.9g, want dy * mask / (1 - p) = %.9g", stoke_dtype_name(dt),
              (long long)i, h_get(&dx, i), want);
    }
    h_free(&x);
    h_free(&y);
    h_free(&dy);
    h_free(&dx);
  }
}

static void test_dropout_grad(void **state) {
  static const double ps[] = {0.25, 0.6};
  for (int k = 0; k < 2; k++) {
    stoke_node_v1 node = drop_node(ps[k]);
    stoke_tensor x = h_tensor(STOKE_F64, 3, (int64_t)3, (int64_t)4, (int64_t)5);
    h_random(&x, -1, 1);
    stoke_tensor y = h_like(&x, -1);
    char label[64];
    snprintf(label, sizeof label, "dropout p=%g", ps[k]);
    grad_check(&node, &x, &y, 0xd50u + (uint64_t)k, label);
    h_free(&x);
    h_free(&y);
  }
}

static void test_dropout_kernel_errors(void **state) {
  static const double bad[] = {1.0, -0.5};
  for (int b = 0; b < 2; b++) {
    stoke_node_v1 node = drop_node(bad[b]);
    stoke_tensor x = h_tensor(STOKE_F64, 1, (int64_t)8), y = h_like(&x, -1);
    stoke_kernel_args_v1 a = args1(&node, &x, &y);
    stoke_err *e = h_run(h_kernel(STOKE_OP_DROPOUT, STOKE_FWD, STOKE_F64), &a);
    assert_non_null(e);
    assert_int_equal(e->code, STOKE_E_INVALID);
    H_CHECK(strstr(e->msg, "'drop1'") != NULL, "message: %s", e->msg);
    stoke_err_free(e);
    h_free(&x);
    h_free(&y);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_op_types),
      H_TEST(test_infer),
      H_TEST(test_graph_attrs),
      H_TEST(test_pool_forward_naive),
      H_TEST(test_pool_grad),
      H_TEST(test_pool_nhwc_matches_nchw),
      H_TEST(test_max_pool_ties),
      H_TEST(test_max_pool_idx),
      H_TEST(test_pool_kernel_errors),
      H_TEST(test_dropout_eval_identity),
      H_TEST(test_dropout_mask),
      H_TEST(test_dropout_seed),
      H_TEST(test_dropout_backward_mask),
      H_TEST(test_dropout_grad),
      H_TEST(test_dropout_kernel_errors),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
