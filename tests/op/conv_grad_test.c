/* tests/op/conv_grad_test.c: the CPU kernels of the convolutional ops
 * (conv2d, bias_add, flatten, global_avg_pool) in both memory layouts:
 * every input gradient against central finite differences in double,
 * forwards against naive loops, NHWC against NCHW,
 * gradient accumulation, and the op types' shape inference and errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#include "opcase.h"

/* ------------------------------------------------------------- layouts */

static const char *layout_str(stoke_layout l) { return l == STOKE_NHWC ? "NHWC" : "NCHW"; }

/* Memory index of logical element (n, c, h, w) of a 4-D tensor. */
static int64_t idx4(const stoke_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t *d = t->shape.d;
  if (t->layout == STOKE_NHWC) return ((n * d[2] + h) * d[3] + w) * d[1] + c;
  return ((n * d[1] + c) * d[2] + h) * d[3] + w;
}

static double get4(const stoke_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
  return h_get(t, idx4(t, n, c, h, w));
}

/* dst (any layout) = src (any layout), logically; same shape. */
static void copy4(stoke_tensor *dst, const stoke_tensor *src) {
  const int64_t *d = src->shape.d;
  for (int64_t n = 0; n < d[0]; n++)
    for (int64_t c = 0; c < d[1]; c++)
      for (int64_t h = 0; h < d[2]; h++)
        for (int64_t w = 0; w < d[3]; w++)
          h_set(dst, idx4(dst, n, c, h, w), get4(src, n, c, h, w));
}

/* Largest |a - b| / max(1, |b|) over the logical elements. */
static double max_diff4(const stoke_tensor *a, const stoke_tensor *b) {
  const int64_t *d = b->shape.d;
  double worst = 0;
  for (int64_t n = 0; n < d[0]; n++)
    for (int64_t c = 0; c < d[1]; c++)
      for (int64_t h = 0; h < d[2]; h++)
        for (int64_t w = 0; w < d[3]; w++) {
          double x = get4(a, n, c, h, w), y = get4(b, n, c, h, w);
          double e = fabs(x - y) / fmax(1, fabs(y));
          if (!(e <= worst)) worst = e; /* NaN wins */
        }
  return worst;
}

static const stoke_layout layouts[] = {STOKE_NCHW, STOKE_NHWC};

/* -------------------------------------------------------------- conv2d */

typedef struct conv_cfg {
  const char *label;
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
} conv_cfg;

static const conv_cfg cfgs[] = {
    {"3x3 s1 p0", 2, 3, 5, 5, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1},
    {"3x3 s2 p1", 2, 3, 7, 6, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1},
    {"3x3 d2 p1", 1, 2, 7, 7, 3, 3, 3, 1, 1, 1, 1, 2, 2, 1},
    {"3x3 groups 2", 2, 4, 5, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2},
    {"3x3 depthwise s2 p1", 2, 4, 6, 6, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4},
    {"3x1 p1x0", 2, 3, 5, 4, 2, 3, 1, 1, 1, 1, 0, 1, 1, 1},
    {"1x1 s2x1", 2, 3, 5, 4, 5, 1, 1, 2, 1, 0, 0, 1, 1, 1},
    {"1x1 s1 groups 2", 2, 4, 3, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2}, /* NHWC: a plain GEMM */
    {"2x3 s2x1 p1x2 d1x2 groups 2", 1, 2, 6, 7, 4, 2, 3, 2, 1, 1, 2, 1, 2, 2},
};
#define N_CFGS ((int)(sizeof cfgs / sizeof *cfgs))

static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

/* An ints attribute: one value when both dims agree ("2"), else "HxW". */
static void set_pair(stoke_attr_v1 *a, int64_t h, int64_t w) {
  memset(a, 0, sizeof *a);
  if (h == w) {
    a->n = 1;
    a->ints[0] = h;
  } else {
    a->n = 2;
    a->ints[0] = h;
    a->ints[1] = w;
  }
  a->i = h;
}

static stoke_node_v1 conv_node(const conv_cfg *f) {
  stoke_node_v1 n = h_node(STOKE_OP_CONV2D, "conv1");
  n.n_attrs = 4;
  set_pair(&n.attrs[STOKE_CONV2D_STRIDE], f->sh, f->sw);
  set_pair(&n.attrs[STOKE_CONV2D_PADDING], f->ph, f->pw);
  set_pair(&n.attrs[STOKE_CONV2D_DILATION], f->dh, f->dw);
  n.attrs[STOKE_CONV2D_GROUPS].i = f->groups;
  n.attrs[STOKE_CONV2D_GROUPS].f = (double)f->groups;
  return n;
}

static op_case conv_case(const conv_cfg *f, stoke_layout l) {
  op_case c = {.op = STOKE_OP_CONV2D, .node = conv_node(f), .n_in = 2};
  int64_t ho = conv_out(f->h, f->kh, f->sh, f->ph, f->dh);
  int64_t wo = conv_out(f->w, f->kw, f->sw, f->pw, f->dw);
  c.in[0] = h_tensor(STOKE_F64, 4, f->n, f->c, f->h, f->w);
  c.in[0].layout = l;
  c.in[1] = h_tensor(STOKE_F64, 4, f->o, f->c / f->groups, f->kh, f->kw);
  c.out[0] = h_tensor(STOKE_F64, 4, f->n, f->o, ho, wo);
  c.out[0].layout = l;
  h_random(&c.in[0], -1, 1);
  h_random(&c.in[1], -1, 1);
  c.grads = 3;
  c.params = 2; /* the weight */
  return c;
}

static void conv_label(char *buf, size_t cap, const conv_cfg *f, stoke_layout l) {
  snprintf(buf, cap, "conv2d %s %s", f->label, layout_str(l));
}

static void test_conv2d_grad(void **state) {
  for (int i = 0; i < N_CFGS; i++)
    for (int li = 0; li < 2; li++) {
      op_case c = conv_case(&cfgs[i], layouts[li]);
      char label[96];
      conv_label(label, sizeof label, &cfgs[i], layouts[li]);
      grad_check(&c, label);
      case_free(&c);
    }
}

/* y[n, o, oh, ow] = sum over c in o's group, i, j of
 * x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] w[o, c - group start, i, j] */
static void test_conv2d_forward_naive(void **state) {
  for (int i = 0; i < N_CFGS; i++)
    for (int li = 0; li < 2; li++) {
      const conv_cfg *f = &cfgs[i];
      op_case c = conv_case(f, layouts[li]);
      char label[96];
      conv_label(label, sizeof label, f, layouts[li]);
      run_fwd(&c, c.in, c.out);
      int64_t cg = f->c / f->groups, og = f->o / f->groups;
      int64_t ho = c.out[0].shape.d[2], wo = c.out[0].shape.d[3];
      for (int64_t n = 0; n < f->n; n++)
        for (int64_t o = 0; o < f->o; o++)
          for (int64_t oh = 0; oh < ho; oh++)
            for (int64_t ow = 0; ow < wo; ow++) {
              double want = 0;
              for (int64_t k = 0; k < cg; k++)
                for (int64_t ki = 0; ki < f->kh; ki++)
                  for (int64_t kj = 0; kj < f->kw; kj++) {
                    int64_t ih = oh * f->sh - f->ph + ki * f->dh;
                    int64_t iw = ow * f->sw - f->pw + kj * f->dw;
                    if (ih < 0 || ih >= f->h || iw < 0 || iw >= f->w) continue;
                    double xv = get4(&c.in[0], n, (o / og) * cg + k, ih, iw);
                    double wv = h_get(&c.in[1], ((o * cg + k) * f->kh + ki) * f->kw + kj);
                    want += xv * wv;
                  }
              double got = get4(&c.out[0], n, o, oh, ow);
              H_CHECK(fabs(got - want) <= 1e-12 * fmax(1, fabs(want)),
                      "%s: y[%lld, %lld, %lld, %lld] = %.15g, naive %.15g", label, (long long)n,
                      (long long)o, (long long)oh, (long long)ow, got, want);
            }
      case_free(&c);
    }
}

/* The same logical inputs in NHWC memory give the NCHW results: y, dx and
 * dW (dy transposed the same way). */
static void test_conv2d_nhwc_matches_nchw(void **state) {
  for (int i = 0; i < N_CFGS; i++) {
    const conv_cfg *f = &cfgs[i];
    op_case a = conv_case(f, STOKE_NCHW);
    op_case b = conv_case(f, STOKE_NHWC);
    copy4(&b.in[0], &a.in[0]);
    h_convert(&b.in[1], &a.in[1]); /* the weight has one layout */
    run_fwd(&a, a.in, a.out);
    run_fwd(&b, b.in, b.out);
    double e = max_diff4(&b.out[0], &a.out[0]);
    H_CHECK(e < 1e-12, "conv2d %s: NHWC y differs from NCHW y by %.3g", f->label, e);
    stoke_tensor ra = h_like(&a.out[0], -1), rb = h_like(&b.out[0], -1), da[2], db[2];
    h_random(&ra, -1, 1);
    copy4(&rb, &ra);
    make_din(&a, da, -1);
    make_din(&b, db, -1);
    H_OK(try_bwd(&a, a.in, a.out, da, &ra, 0.0f));
    H_OK(try_bwd(&b, b.in, b.out, db, &rb, 0.0f));
    e = max_diff4(&db[0], &da[0]);
    H_CHECK(e < 1e-12, "conv2d %s: NHWC dx differs from NCHW dx by %.3g", f->label, e);
    e = h_rel_norm(&db[1], &da[1]);
    H_CHECK(e < 1e-12, "conv2d %s: NHWC dW differs from NCHW dW by %.3g", f->label, e);
    free_din(&a, da);
    free_din(&b, db);
    h_free(&ra);
    h_free(&rb);
    case_free(&a);
    case_free(&b);
  }
}

static void test_conv2d_param_grad_beta(void **state) {
  for (int i = 0; i < N_CFGS; i++)
    for (int li = 0; li < 2; li++) {
      op_case c = conv_case(&cfgs[i], layouts[li]);
      char label[96];
      conv_label(label, sizeof label, &cfgs[i], layouts[li]);
      check_accumulation(&c, label); /* dW accumulated, dx overwritten */
      c.params = 3;                  /* and dx accumulated if it were a parameter */
      check_accumulation(&c, label);
      case_free(&c);
    }
}

/* Only dW (the first layer), only dx: the same values as with both. */
static void test_conv2d_partial_grads(void **state) {
  for (int li = 0; li < 2; li++) {
    op_case c = conv_case(&cfgs[3], layouts[li]);
    run_fwd(&c, c.in, c.out);
    stoke_tensor r = h_like(&c.out[0], -1), all[2], some[2];
    h_random(&r, -1, 1);
    make_din(&c, all, -1);
    H_OK(try_bwd(&c, c.in, c.out, all, &r, 0.0f));
    for (uint32_t g = 1; g <= 2; g++) {
      c.grads = g;
      make_din(&c, some, -1);
      H_OK(try_bwd(&c, c.in, c.out, some, &r, 0.0f));
      for (int i = 0; i < 2; i++) {
        if (!(g & (1u << i))) {
          assert_null(some[i].data);
          continue;
        }
        H_CHECK(h_rel_norm(&some[i], &all[i]) == 0, "%s grads %u: din[%d] differs",
                layout_str(layouts[li]), g, i);
      }
      free_din(&c, some);
    }
    c.grads = 3;
    free_din(&c, all);
    h_free(&r);
    case_free(&c);
  }
}

/* ------------------------------------------------ bias_add, flatten, gap */

/* x of `ndim` dims (2..4) from {N, C, H, W}, in layout l when 4-D. */
static stoke_tensor img(int ndim, stoke_layout l, int64_t n, int64_t c, int64_t h, int64_t w) {
  stoke_tensor t = ndim == 2   ? h_tensor(STOKE_F64, 2, n, c)
                   : ndim == 3 ? h_tensor(STOKE_F64, 3, n, c, h)
                               : h_tensor(STOKE_F64, 4, n, c, h, w);
  if (ndim == 4) t.layout = l;
  h_random(&t, -1, 1);
  return t;
}

static op_case bias_case(int ndim, stoke_layout l) {
  op_case c = {.op = STOKE_OP_BIAS_ADD, .node = h_node(STOKE_OP_BIAS_ADD, "conv1_bias"), .n_in = 2};
  c.in[0] = img(ndim, l, 2, 3, 4, 5);
  c.in[1] = h_tensor(STOKE_F64, 1, (int64_t)3);
  h_random(&c.in[1], -1, 1);
  c.out[0] = h_like(&c.in[0], -1);
  c.grads = 3;
  c.params = 2;
  return c;
}

static op_case flatten_case(int ndim, stoke_layout l) {
  op_case c = {.op = STOKE_OP_FLATTEN, .node = h_node(STOKE_OP_FLATTEN, "flat"), .n_in = 1};
  c.in[0] = img(ndim, l, 2, 3, 4, 5);
  c.out[0] = h_tensor(STOKE_F64, 2, (int64_t)2, h_numel(&c.in[0]) / 2);
  c.grads = 1;
  return c;
}

static op_case gap_case(stoke_layout l) {
  op_case c = {.op = STOKE_OP_GLOBAL_AVG_POOL, .node = h_node(STOKE_OP_GLOBAL_AVG_POOL, "gap"),
               .n_in = 1};
  c.in[0] = img(4, l, 2, 3, 4, 5);
  c.out[0] = h_tensor(STOKE_F64, 2, (int64_t)2, (int64_t)3);
  c.grads = 1;
  return c;
}

/* Each case in 2-D, 3-D, 4-D NCHW and 4-D NHWC (gap: 4-D only). */
typedef op_case (*case_fn)(int ndim, stoke_layout l);
static const struct { int ndim; stoke_layout l; const char *label; } shapes[] = {
    {4, STOKE_NCHW, "4-D NCHW"}, {4, STOKE_NHWC, "4-D NHWC"}, {3, STOKE_LAYOUT_ANY, "3-D"},
    {2, STOKE_LAYOUT_ANY, "2-D"}};

static op_case gap_case2(int ndim, stoke_layout l) { return gap_case(l); }

static void for_cases(case_fn make, int n_shapes, const char *op,
                      void (*check)(op_case *, const char *)) {
  for (int s = 0; s < n_shapes; s++) {
    op_case c = make(shapes[s].ndim, shapes[s].l);
    char label[96];
    snprintf(label, sizeof label, "%s %s", op, shapes[s].label);
    check(&c, label);
    case_free(&c);
  }
}

static void test_bias_add_grad(void **state) { for_cases(bias_case, 4, "bias_add", grad_check); }
static void test_flatten_grad(void **state) { for_cases(flatten_case, 4, "flatten", grad_check); }
static void test_gap_grad(void **state) { for_cases(gap_case2, 2, "global_avg_pool", grad_check); }

static void test_bias_add_param_grad_beta(void **state) {
  for_cases(bias_case, 4, "bias_add", check_accumulation);
}

/* The logical (n, c, rest) element of x: 4-D through the layout. */
static double get_nc(const stoke_tensor *x, int64_t n, int64_t c, int64_t r) {
  const int64_t *d = x->shape.d;
  if (x->shape.ndim == 4) return get4(x, n, c, r / d[3], r % d[3]);
  int64_t rest = x->shape.ndim == 3 ? d[2] : 1;
  return h_get(x, (n * d[1] + c) * rest + r);
}

static int64_t rest_of(const stoke_tensor *x) { return h_numel(x) / (x->shape.d[0] * x->shape.d[1]); }

static void check_bias_fwd(op_case *c, const char *label) {
  run_fwd(c, c->in, c->out);
  int64_t rest = rest_of(&c->in[0]);
  for (int64_t n = 0; n < 2; n++)
    for (int64_t ch = 0; ch < 3; ch++)
      for (int64_t r = 0; r < rest; r++) {
        double want = get_nc(&c->in[0], n, ch, r) + h_get(&c->in[1], ch);
        double got = get_nc(&c->out[0], n, ch, r);
        H_CHECK(got == want, "%s: y[%lld, %lld, %lld] = %.15g, want %.15g", label, (long long)n,
                (long long)ch, (long long)r, got, want);
      }
}

/* y[n, c*rest + r] is logical x[n, c, r], whatever x's memory order. */
static void check_flatten_fwd(op_case *c, const char *label) {
  run_fwd(c, c->in, c->out);
  int64_t rest = rest_of(&c->in[0]), cc = c->in[0].shape.d[1];
  for (int64_t n = 0; n < 2; n++)
    for (int64_t ch = 0; ch < cc; ch++)
      for (int64_t r = 0; r < rest; r++) {
        double want = get_nc(&c->in[0], n, ch, r);
        double got = h_get(&c->out[0], n * cc * rest + ch * rest + r);
        H_CHECK(got == want, "%s: y[%lld, %lld] = %.15g, want x[%lld, %lld, %lld] = %.15g", label,
                (long long)n, (long long)(ch * rest + r), got, (long long)n, (long long)ch,
                (long long)r, want);
      }
}

static void check_gap_fwd(op_case *c, const char *label) {
  run_fwd(c, c->in, c->out);
  for (int64_t n = 0; n < 2; n++)
    for (int64_t ch = 0; ch < 3; ch++) {
      double want = 0;
      for (int64_t h = 0; h < 4; h++)
        for (int64_t w = 0; w < 5; w++) want += get4(&c->in[0], n, ch, h, w);
      want /= 20;
      double got = h_get(&c->out[0], n * 3 + ch);
      H_CHECK(fabs(got - want) < 1e-14, "%s: y[%lld, %lld] = %.15g, naive %.15g", label,
              (long long)n, (long long)ch, got, want);
    }
}

static void test_bias_add_forward_naive(void **state) {
  for_cases(bias_case, 4, "bias_add", check_bias_fwd);
}
static void test_flatten_forward_order(void **state) {
  for_cases(flatten_case, 4, "flatten", check_flatten_fwd);
}
static void test_gap_forward_naive(void **state) {
  for_cases(gap_case2, 2, "global_avg_pool", check_gap_fwd);
}

/* flatten's backward undoes its forward: dx (NHWC memory) holds dy's
 * values at the logical positions; gap spreads dy / (H W). */
static void test_flatten_gap_backward_values(void **state) {
  for (int li = 0; li < 2; li++) {
    op_case c = flatten_case(4, layouts[li]);
    stoke_tensor r = h_like(&c.out[0], -1), din[1];
    h_random(&r, -1, 1);
    make_din(&c, din, -1);
    H_OK(try_bwd(&c, c.in, c.out, din, &r, 0.0f));
    for (int64_t n = 0; n < 2; n++)
      for (int64_t ch = 0; ch < 3; ch++)
        for (int64_t p = 0; p < 20; p++)
          H_CHECK(get_nc(&din[0], n, ch, p) == h_get(&r, n * 60 + ch * 20 + p),
                  "flatten %s backward: dx[%lld, %lld, %lld]", layout_str(layouts[li]),
                  (long long)n, (long long)ch, (long long)p);
    free_din(&c, din);
    h_free(&r);
    case_free(&c);

    c = gap_case(layouts[li]);
    r = h_like(&c.out[0], -1);
    h_random(&r, -1, 1);
    make_din(&c, din, -1);
    H_OK(try_bwd(&c, c.in, c.out, din, &r, 0.0f));
    for (int64_t n = 0; n < 2; n++)
      for (int64_t ch = 0; ch < 3; ch++)
        for (int64_t p = 0; p < 20; p++)
          H_CHECK(fabs(get_nc(&din[0], n, ch, p) - h_get(&r, n * 3 + ch) / 20) < 1e-15,
                  "gap %s backward: dx[%lld, %lld, %lld]", layout_str(layouts[li]), (long long)n,
                  (long long)ch, (long long)p);
    free_din(&c, din);
    h_free(&r);
    case_free(&c);
  }
}

/* ----------------------------------------------------------- op types */

static stoke_value_desc_v1 desc(int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
  stoke_value_desc_v1 v = {{ndim, {a, b, c, d}}, STOKE_F32};
  return v;
}

static stoke_err *infer(const char *op, const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                        stoke_value_desc_v1 *out) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, op);
  if (!t) fail_msg("op %s not registered", op);
  memset(out, 0, sizeof *out);
  return t->infer(n, in, out);
}

/* An error of code INVALID whose message names the node and holds `frag`. */
static void expect_invalid(stoke_err *e, const char *node, const char *frag) {
  assert_non_null(e);
  char quoted[80];
  snprintf(quoted, sizeof quoted, "'%s'", node);
  H_CHECK(e->code == STOKE_E_INVALID && strstr(e->msg, quoted) && (!frag || strstr(e->msg, frag)),
          "code %s, message: %s (want '%s' and '%s')", stoke_code_name(e->code), e->msg, quoted,
          frag ? frag : "");
  stoke_err_free(e);
}

static void test_op_types(void **state) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, STOKE_OP_CONV2D);
  assert_non_null(t);
  assert_int_equal(t->n_inputs, 2);
  assert_int_equal(t->n_outputs, 1);
  assert_int_equal(t->n_attrs, 4);
  assert_string_equal(t->attrs[STOKE_CONV2D_STRIDE].name, "stride");
  assert_string_equal(t->attrs[STOKE_CONV2D_PADDING].name, "padding");
  assert_string_equal(t->attrs[STOKE_CONV2D_DILATION].name, "dilation");
  assert_string_equal(t->attrs[STOKE_CONV2D_GROUPS].name, "groups");
  assert_int_equal(t->attrs[STOKE_CONV2D_STRIDE].type, STOKE_ATTR_INTS);
  assert_int_equal(t->attrs[STOKE_CONV2D_GROUPS].type, STOKE_ATTR_INT);
  assert_string_equal(t->attrs[STOKE_CONV2D_STRIDE].def, "1");
  assert_string_equal(t->attrs[STOKE_CONV2D_PADDING].def, "0");
  assert_string_equal(t->attrs[STOKE_CONV2D_DILATION].def, "1");
  assert_string_equal(t->attrs[STOKE_CONV2D_GROUPS].def, "1");
  assert_int_equal(t->bwd_needs, STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1));
  assert_int_equal(t->no_grad_inputs, 0);
  assert_true(t->has_backward);
  static const char *others[] = {STOKE_OP_BIAS_ADD, STOKE_OP_FLATTEN, STOKE_OP_GLOBAL_AVG_POOL};
  static const int n_in[] = {2, 1, 1};
  for (int i = 0; i < 3; i++) {
    t = stoke_find_op(h_reg, others[i]);
    assert_non_null(t);
    assert_int_equal(t->n_inputs, n_in[i]);
    assert_int_equal(t->bwd_needs, STOKE_BWD_NEEDS_NOTHING);
    assert_int_equal(t->no_grad_inputs, 0);
    assert_true(t->has_backward);
  }
  /* a kernel for every op, pass and dtype */
  static const char *all[] = {STOKE_OP_CONV2D, STOKE_OP_BIAS_ADD, STOKE_OP_FLATTEN,
                              STOKE_OP_GLOBAL_AVG_POOL};
  for (int i = 0; i < 4; i++)
    for (int p = 0; p < 2; p++) {
      assert_non_null(h_kernel(all[i], (stoke_pass)p, STOKE_F32));
      assert_non_null(h_kernel(all[i], (stoke_pass)p, STOKE_F64));
      assert_non_null(stoke_find_kernel(h_reg, "cpu", all[i], (stoke_pass)p, STOKE_F32, STOKE_NHWC));
    }
}

static void test_conv2d_infer(void **state) {
  const stoke_op_type_v1 *t = stoke_find_op(h_reg, STOKE_OP_CONV2D);
  assert_non_null(t);
  stoke_value_desc_v1 in[2], out[1];
  for (int i = 0; i < N_CFGS; i++) {
    const conv_cfg *f = &cfgs[i];
    stoke_node_v1 n = conv_node(f);
    in[0] = desc(4, f->n, f->c, f->h, f->w);
    in[1] = desc(4, f->o, f->c / f->groups, f->kh, f->kw);
    H_OK(infer(STOKE_OP_CONV2D, &n, in, out));
    int64_t ho = conv_out(f->h, f->kh, f->sh, f->ph, f->dh);
    int64_t wo = conv_out(f->w, f->kw, f->sw, f->pw, f->dw);
    H_CHECK(out[0].shape.ndim == 4 && out[0].shape.d[0] == f->n && out[0].shape.d[1] == f->o &&
                out[0].shape.d[2] == ho && out[0].shape.d[3] == wo && out[0].dtype == STOKE_F32,
            "conv2d %s: inferred [%lld, %lld, %lld, %lld]", f->label,
            (long long)out[0].shape.d[0], (long long)out[0].shape.d[1],
            (long long)out[0].shape.d[2], (long long)out[0].shape.d[3]);
    double want = 2.0 * f->n * f->o * ho * wo * (f->c / f->groups) * f->kh * f->kw;
    H_CHECK(t->flops(&n, in, out) == want, "conv2d %s: flops %g, want %g", f->label,
            t->flops(&n, in, out), want);
  }
  /* no attributes given: stride 1, padding 0, dilation 1, groups 1 */
  stoke_node_v1 n = h_node(STOKE_OP_CONV2D, "conv1");
  in[0] = desc(4, 2, 3, 8, 8);
  in[1] = desc(4, 5, 3, 3, 3);
  H_OK(infer(STOKE_OP_CONV2D, &n, in, out));
  assert_int_equal(out[0].shape.d[2], 6);
  assert_int_equal(out[0].shape.d[3], 6);

  /* channel / group mismatches and the rest */
  conv_cfg f = {"", 2, 4, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 3};
  n = conv_node(&f);
  in[0] = desc(4, 2, 4, 8, 8);
  in[1] = desc(4, 6, 1, 3, 3);
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", "groups 3"); /* C 4 % 3 */
  f.groups = 2;
  n = conv_node(&f);
  in[1] = desc(4, 6, 4, 3, 3); /* weight has C, not C/groups, channels */
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", "[6, 4, 3, 3]");
  in[1] = desc(4, 5, 2, 3, 3); /* O 5 % 2 */
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", "[5, 2, 3, 3]");
  f.groups = 1;
  n = conv_node(&f);
  in[1] = desc(4, 6, 3, 3, 3); /* C 4 against weight's 3 */
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", "[2, 4, 8, 8]");
  in[1] = desc(4, 6, 4, 11, 3); /* 11 > 8 + 2 */
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", NULL);
  in[0] = desc(3, 2, 4, 8, 0);
  in[1] = desc(4, 6, 4, 3, 3);
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", NULL);
  in[0] = desc(4, 2, 4, 8, 8);
  f.groups = 0;
  n = conv_node(&f);
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", NULL);
  f.groups = 1, f.sh = 0;
  n = conv_node(&f);
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", "stride");
  f.sh = 1, f.ph = -1;
  n = conv_node(&f);
  expect_invalid(infer(STOKE_OP_CONV2D, &n, in, out), "conv1", "padding");
}

static void test_other_infer(void **state) {
  stoke_value_desc_v1 in[2], out[1];
  stoke_node_v1 n = h_node(STOKE_OP_BIAS_ADD, "b1");
  in[0] = desc(4, 2, 3, 4, 5);
  in[1] = desc(1, 3, 0, 0, 0);
  H_OK(infer(STOKE_OP_BIAS_ADD, &n, in, out));
  assert_int_equal(out[0].shape.ndim, 4);
  assert_int_equal(out[0].shape.d[3], 5);
  in[1] = desc(1, 4, 0, 0, 0);
  expect_invalid(infer(STOKE_OP_BIAS_ADD, &n, in, out), "b1", "[4]");
  in[0] = desc(1, 3, 0, 0, 0);
  in[1] = desc(1, 3, 0, 0, 0);
  expect_invalid(infer(STOKE_OP_BIAS_ADD, &n, in, out), "b1", NULL);

  n = h_node(STOKE_OP_FLATTEN, "f1");
  in[0] = desc(4, 2, 3, 4, 5);
  H_OK(infer(STOKE_OP_FLATTEN, &n, in, out));
  H_CHECK(out[0].shape.ndim == 2 && out[0].shape.d[0] == 2 && out[0].shape.d[1] == 60,
          "flatten shape");
  in[0] = desc(1, 3, 0, 0, 0);
  expect_invalid(infer(STOKE_OP_FLATTEN, &n, in, out), "f1", NULL);

  n = h_node(STOKE_OP_GLOBAL_AVG_POOL, "g1");
  in[0] = desc(4, 2, 3, 4, 5);
  H_OK(infer(STOKE_OP_GLOBAL_AVG_POOL, &n, in, out));
  H_CHECK(out[0].shape.ndim == 2 && out[0].shape.d[0] == 2 && out[0].shape.d[1] == 3, "gap shape");
  in[0] = desc(3, 2, 3, 4, 0);
  expect_invalid(infer(STOKE_OP_GLOBAL_AVG_POOL, &n, in, out), "g1", NULL);
}

/* The kernels check what they are given, naming the node. */
static void test_kernel_errors(void **state) {
  op_case c = conv_case(&cfgs[3], STOKE_NCHW); /* groups 2, C 4, O 6 */
  stoke_kernel_args_v1 a = args_for(&c, c.in, c.out);
  c.node.attrs[STOKE_CONV2D_GROUPS].i = 3;
  expect_invalid(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a), "conv1", NULL);
  c.node.attrs[STOKE_CONV2D_GROUPS].i = 2;
  c.out[0].shape.d[2]++; /* y of the wrong size */
  expect_invalid(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a), "conv1", NULL);
  c.out[0].shape.d[2]--;
  c.out[0].layout = STOKE_NHWC; /* y's layout against x's */
  expect_invalid(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a), "conv1", "NHWC");
  c.out[0].layout = STOKE_NCHW;
  c.in[1].dtype = STOKE_F32;
  expect_invalid(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a), "conv1", NULL);
  c.in[1].dtype = STOKE_F64;
  H_OK(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a));
  case_free(&c);

  c = bias_case(4, STOKE_NCHW);
  c.in[1].shape.d[0] = 4;
  a = args_for(&c, c.in, c.out);
  expect_invalid(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a), "conv1_bias", "[4]");
  c.in[1].shape.d[0] = 3;
  case_free(&c);

  c = flatten_case(4, STOKE_NHWC);
  c.out[0].shape.d[1]--;
  a = args_for(&c, c.in, c.out);
  expect_invalid(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a), "flat", NULL);
  c.out[0].shape.d[1]++;
  case_free(&c);

  c = gap_case(STOKE_NCHW);
  c.out[0].shape.d[1] = 4;
  a = args_for(&c, c.in, c.out);
  expect_invalid(h_run(h_kernel(c.op, STOKE_FWD, STOKE_F64), &a), "gap", NULL);
  c.out[0].shape.d[1] = 3;
  case_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      H_TEST(test_op_types),
      H_TEST(test_conv2d_infer),
      H_TEST(test_other_infer),
      H_TEST(test_conv2d_grad),
      H_TEST(test_conv2d_forward_naive),
      H_TEST(test_conv2d_nhwc_matches_nchw),
      H_TEST(test_conv2d_param_grad_beta),
      H_TEST(test_conv2d_partial_grads),
      H_TEST(test_bias_add_grad),
      H_TEST(test_bias_add_forward_naive),
      H_TEST(test_bias_add_param_grad_beta),
      H_TEST(test_flatten_grad),
      H_TEST(test_flatten_forward_order),
      H_TEST(test_gap_grad),
      H_TEST(test_gap_forward_naive),
      H_TEST(test_flatten_gap_backward_values),
      H_TEST(test_kernel_errors),
  };
  return cmocka_run_group_tests(tests, h_setup, h_teardown);
}
