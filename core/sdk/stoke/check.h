/* stoke/check.h: the argument checks every backend's kernels share (names
 * for messages, shape and layout tests, the typed checks that make an error
 * naming the op, the node and the tensor), and the gradient beta a
 * backward kernel applies. Static inline, C and CUDA C++ alike; the
 * checks that make errors use the plugin's host table (stoke_host). */
#ifndef STOKE_CHECK_H
#define STOKE_CHECK_H

#include <stddef.h>
#include <stdio.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The node's name, or "?" where the call has no node (or it no name). */
static inline const char *stoke_node_name(const stoke_kernel_args_v1 *a) {
  return a && a->node && a->node->name ? a->node->name : "?";
}

static inline int stoke_same_shape(const stoke_shape *x, const stoke_shape *y) {
  if (x->ndim != y->ndim) return 0;
  for (int i = 0; i < x->ndim; i++)
    if (x->d[i] != y->d[i]) return 0;
  return 1;
}

/* "NCHW", "NHWC" or "any". */
static inline const char *stoke_layout_name(stoke_layout l) {
  return l == STOKE_NHWC ? "NHWC" : l == STOKE_NCHW ? "NCHW" : "any";
}

/* A 4-D tensor whose layout says NHWC (channels-last); any other is in
 * NCHW (or plain row-major) order. */
static inline int stoke_is_nhwc(const stoke_tensor *t) {
  return t->shape.ndim == 4 && t->layout == STOKE_NHWC;
}

/* "[3, 4]", usable as a printf argument: stoke_shape_str(&t.shape).s */
typedef struct stoke_shape_text {
  char s[96];
} stoke_shape_text;

static inline stoke_shape_text stoke_shape_str(const stoke_shape *s) {
  stoke_shape_text t;
  size_t n = (size_t)snprintf(t.s, sizeof t.s, "[");
  for (int i = 0; i < s->ndim && i < STOKE_MAX_DIMS && n < sizeof t.s; i++)
    n += (size_t)snprintf(t.s + n, sizeof t.s - n, i ? ", %lld" : "%lld", (long long)s->d[i]);
  if (n < sizeof t.s) snprintf(t.s + n, sizeof t.s - n, "]");
  return t;
}

/* The beta of a backward kernel's gradient of input i, din = beta din +
 * computed: 1 when din_accumulate asks (another path wrote that value's
 * gradient first), param_grad_beta for a parameter's gradient (gradient
 * accumulation over micro-batches), else 0 (overwrite). */
static inline float stoke_grad_beta(const stoke_kernel_args_v1 *a, int i) {
  if ((a->din_accumulate >> i) & 1u) return 1.0f;
  return (a->param_grads >> i) & 1u ? a->param_grad_beta : 0.0f;
}

/* At least n_in inputs and n_out outputs; in backward, gradient tensors. */
static inline stoke_err *stoke_check_counts(const stoke_kernel_args_v1 *a, const char *op, int bwd, int n_in,
                                            int n_out) {
  if (a->n_in < n_in || a->n_out < n_out || !a->in || !a->out)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs %d input%s and %d output%s, got %d and %d", op,
                      stoke_node_name(a), n_in, n_in == 1 ? "" : "s", n_out, n_out == 1 ? "" : "s", a->n_in,
                      a->n_out);
  if (bwd && (!a->din || !a->dout))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': backward called without gradient tensors", op, stoke_node_name(a));
  return NULL;
}

/* The layout field of `what` names ANY, NCHW or NHWC. */
static inline stoke_err *stoke_check_layout_known(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                                                  const stoke_tensor *t) {
  if (t->layout == STOKE_LAYOUT_ANY || t->layout == STOKE_NCHW || t->layout == STOKE_NHWC) return NULL;
  return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': %s has unknown layout %d", op, stoke_node_name(a), what,
                    (int)t->layout);
}

/* A 4-D tensor `t` that states a layout states x's (ANY follows x). */
static inline stoke_err *stoke_check_layout(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                                            const stoke_tensor *t, const stoke_tensor *x) {
  if (t->shape.ndim != 4 || t->layout == STOKE_LAYOUT_ANY) return NULL;
  stoke_layout want = stoke_is_nhwc(x) ? STOKE_NHWC : STOKE_NCHW;
  if (t->layout == want) return NULL;
  return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s %s is %s but x %s is %s", op, stoke_node_name(a), what,
                    stoke_shape_str(&t->shape).s, stoke_layout_name(t->layout), stoke_shape_str(&x->shape).s,
                    stoke_layout_name(x->layout));
}

/* Tensor `what` of op's node has dtype `want`. */
static inline stoke_err *stoke_check_dtype(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                                           const stoke_tensor *t, stoke_dtype want) {
  if (t->dtype == want) return NULL;
  return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s %s is %s, the kernel expects %s", op, stoke_node_name(a), what,
                    stoke_shape_str(&t->shape).s, stoke_dtype_name(t->dtype), stoke_dtype_name(want));
}

/* Tensor `what` holds data when `run` (plan() sees shapes only). */
static inline stoke_err *stoke_check_data(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                                          const stoke_tensor *t, int run) {
  if (!run || t->data) return NULL;
  return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s %s has no data", op, stoke_node_name(a), what,
                    stoke_shape_str(&t->shape).s);
}

/* A requested gradient g (data != NULL) has the shape and dtype of the
 * value `of` it is the gradient of. */
static inline stoke_err *stoke_check_grad(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                                          const stoke_tensor *g, const stoke_tensor *of) {
  if (!g->data) return NULL;
  if (!stoke_same_shape(&g->shape, &of->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': gradient of %s is %s, the value is %s", op, stoke_node_name(a),
                      what, stoke_shape_str(&g->shape).s, stoke_shape_str(&of->shape).s);
  return stoke_check_dtype(a, op, what, g, of->dtype);
}

/* A ReLU bitmask over x's elements (stoke/ops.h, bn_add_relu's output 3):
 * u8 [stoke_relu_mask_bytes(numel of x)], holding data when `run`. */
static inline stoke_err *stoke_check_relu_mask(const stoke_kernel_args_v1 *a, const char *op, const stoke_tensor *mask,
                                               const stoke_tensor *x, int run) {
  int64_t want = stoke_relu_mask_bytes(stoke_numel(&x->shape));
  if (mask->shape.ndim != 1 || mask->shape.d[0] != want)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the ReLU mask is %s, x %s needs [%lld] bytes", op, stoke_node_name(a),
                      stoke_shape_str(&mask->shape).s, stoke_shape_str(&x->shape).s, (long long)want);
  STOKE_PROPAGATE_P(stoke_check_dtype(a, op, "relu_mask", mask, STOKE_U8));
  return stoke_check_data(a, op, "relu_mask (the forward's output 3)", mask, run);
}

/* add: out = a + b, all of one shape and dtype; backward da, db from dout
 * (the cpu and cuda engines' common check). */
static inline stoke_err *stoke_check_add(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_ADD;
  STOKE_PROPAGATE_P(stoke_check_counts(a, op, bwd, 2, 1));
  const stoke_tensor *x = &a->in[0], *z = &a->in[1], *y = &a->out[0];
  if (!stoke_same_shape(&x->shape, &z->shape) || !stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "add '%s': a %s, b %s and out %s differ in shape", stoke_node_name(a),
                      stoke_shape_str(&x->shape).s, stoke_shape_str(&z->shape).s, stoke_shape_str(&y->shape).s);
  STOKE_PROPAGATE_P(stoke_check_dtype(a, op, "a", x, dt));
  STOKE_PROPAGATE_P(stoke_check_dtype(a, op, "b", z, dt));
  STOKE_PROPAGATE_P(stoke_check_dtype(a, op, "out", y, dt));
  if (!bwd) {
    STOKE_PROPAGATE_P(stoke_check_data(a, op, "a", x, run));
    STOKE_PROPAGATE_P(stoke_check_data(a, op, "b", z, run));
    return stoke_check_data(a, op, "out", y, run);
  }
  STOKE_PROPAGATE_P(stoke_check_grad(a, op, "a", &a->din[0], x));
  STOKE_PROPAGATE_P(stoke_check_grad(a, op, "b", &a->din[1], z));
  STOKE_PROPAGATE_P(stoke_check_grad(a, op, "out", &a->dout[0], y));
  return stoke_check_data(a, op, "dout", &a->dout[0], run);
}

/* max_pool2d, avg_pool2d: kernel, stride and padding as (h, w), and the
 * output's (Ho, Wo) they give. */
typedef struct stoke_pool_geom {
  int64_t k[2], s[2], p[2];
  int64_t out[2];
} stoke_pool_geom;

/* A pool attribute: 1 integer (both sides) or 2 (h, w). */
static inline stoke_err *stoke_pool_pair(const stoke_kernel_args_v1 *a, const char *op, int idx, const char *what,
                                         int64_t out[2]) {
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= idx)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attribute %s missing", op, stoke_node_name(a), what);
  const stoke_attr_v1 *at = &n->attrs[idx];
  if (at->n != 1 && at->n != 2)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s takes 1 or 2 integers, got %d", op, stoke_node_name(a), what,
                      at->n);
  out[0] = at->ints[0];
  out[1] = at->n == 2 ? at->ints[1] : at->ints[0];
  return NULL;
}

/* max_pool2d / avg_pool2d / max_pool2d_idx: x[N, C, H, W] -> y[N, C, Ho, Wo]
 * of dtype dt, the geometry into *g (stride 0: the kernel's). `max`: 0 for
 * avg_pool2d; 1 for max_pool2d, whose backward reads x; 2 for
 * max_pool2d_idx, whose output 1 is the u8 window index of y's shape and
 * layout, read by its backward instead of x (the cpu and cuda engines'
 * common check). */
static inline stoke_err *stoke_check_pool(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd,
                                          int run, int max, stoke_pool_geom *g) {
  STOKE_PROPAGATE_P(stoke_check_counts(a, op, bwd, 1, max == 2 ? 2 : 1));
  STOKE_PROPAGATE_P(stoke_pool_pair(a, op, STOKE_POOL_KERNEL, "kernel", g->k));
  STOKE_PROPAGATE_P(stoke_pool_pair(a, op, STOKE_POOL_STRIDE, "stride", g->s));
  STOKE_PROPAGATE_P(stoke_pool_pair(a, op, STOKE_POOL_PADDING, "padding", g->p));
  for (int d = 0; d < 2; d++) {
    if (g->s[d] == 0) g->s[d] = g->k[d];
    if (g->k[d] < 1 || g->s[d] < 1 || g->p[d] < 0 || g->p[d] > g->k[d] / 2)
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': kernel %lldx%lld, stride %lldx%lld, padding %lldx%lld: need "
                        "kernel >= 1, stride >= 1, 0 <= padding <= kernel/2",
                        op, stoke_node_name(a), (long long)g->k[0], (long long)g->k[1], (long long)g->s[0],
                        (long long)g->s[1], (long long)g->p[0], (long long)g->p[1]);
  }
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape, *ys = &y->shape;
  if (xs->ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x[N, C, H, W], got x %s", op, stoke_node_name(a),
                      stoke_shape_str(xs).s);
  for (int d = 0; d < 2; d++) {
    int64_t padded = xs->d[2 + d] + 2 * g->p[d];
    if (padded < g->k[d])
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': kernel %lldx%lld is larger than the padded input (x %s, "
                        "padding %lldx%lld)",
                        op, stoke_node_name(a), (long long)g->k[0], (long long)g->k[1], stoke_shape_str(xs).s,
                        (long long)g->p[0], (long long)g->p[1]);
    g->out[d] = (padded - g->k[d]) / g->s[d] + 1;
  }
  if (ys->ndim != 4 || ys->d[0] != xs->d[0] || ys->d[1] != xs->d[1] || ys->d[2] != g->out[0] ||
      ys->d[3] != g->out[1])
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': x %s gives y [%lld, %lld, %lld, %lld], got y %s", op,
                      stoke_node_name(a), stoke_shape_str(xs).s, (long long)xs->d[0], (long long)xs->d[1],
                      (long long)g->out[0], (long long)g->out[1], stoke_shape_str(ys).s);
  STOKE_PROPAGATE_P(stoke_check_dtype(a, op, "x", x, dt));
  STOKE_PROPAGATE_P(stoke_check_dtype(a, op, "y", y, dt));
  STOKE_PROPAGATE_P(stoke_check_layout_known(a, op, "x", x));
  STOKE_PROPAGATE_P(stoke_check_layout_known(a, op, "y", y));
  const stoke_tensor *ix = max == 2 ? &a->out[1] : NULL;
  if (ix) {
    if (g->k[0] * g->k[1] > STOKE_POOL_MAX_INDEX)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': a %lldx%lld window has more than %d positions for its u8 index", op,
                        stoke_node_name(a), (long long)g->k[0], (long long)g->k[1], STOKE_POOL_MAX_INDEX);
    STOKE_PROPAGATE_P(stoke_check_dtype(a, op, "index", ix, STOKE_U8));
    if (!stoke_same_shape(&ix->shape, ys) || stoke_is_nhwc(ix) != stoke_is_nhwc(y))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': index %s (%s) must have y's shape %s and layout (%s)", op,
                        stoke_node_name(a), stoke_shape_str(&ix->shape).s, stoke_layout_name(ix->layout),
                        stoke_shape_str(ys).s, stoke_layout_name(y->layout));
  }
  if (!bwd) {
    STOKE_PROPAGATE_P(stoke_check_data(a, op, "x", x, run));
    if (ix) STOKE_PROPAGATE_P(stoke_check_data(a, op, "index", ix, run));
    return stoke_check_data(a, op, "y", y, run);
  }
  STOKE_PROPAGATE_P(stoke_check_grad(a, op, "x", &a->din[0], x));
  STOKE_PROPAGATE_P(stoke_check_grad(a, op, "y", &a->dout[0], y));
  STOKE_PROPAGATE_P(stoke_check_layout_known(a, op, "dx", &a->din[0]));
  STOKE_PROPAGATE_P(stoke_check_layout_known(a, op, "dy", &a->dout[0]));
  STOKE_PROPAGATE_P(stoke_check_data(a, op, "dy", &a->dout[0], run));
  if (max == 1 && a->din[0].data) STOKE_PROPAGATE_P(stoke_check_data(a, op, "x (the forward input)", x, run));
  if (ix && a->din[0].data) STOKE_PROPAGATE_P(stoke_check_data(a, op, "index (the forward's output 1)", ix, run));
  return NULL;
}

/* The destroy() of kernels that keep no state. */
static inline void stoke_destroy_none(void *state) { (void)state; }

/* Adds kernels[0, n) to the registry; a failure names the engine, the op,
 * the pass and the dtype. */
static inline stoke_err *stoke_add_kernels(const stoke_registry_v1 *r, const stoke_kernel_v1 *kernels, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const stoke_kernel_v1 *k = &kernels[i];
    STOKE_PTRY(r->add_kernel(r->self, k), "registering %s kernel %s (%s %s)", k->engine, k->op,
               k->pass == STOKE_FWD ? "forward" : k->pass == STOKE_BWD ? "backward" : "update",
               stoke_dtype_name(k->dtype));
  }
  return NULL;
}

#ifdef __cplusplus
}
#endif
#endif
