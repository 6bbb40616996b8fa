/* backends/cpu/check.c: the argument-check helpers shared by the CPU
 * kernels; see check.h. */
#include "check.h"

#include <stdio.h>

shape_text shp(const stoke_shape *s) {
  shape_text t;
  size_t n = (size_t)snprintf(t.s, sizeof t.s, "[");
  for (int i = 0; i < s->ndim && i < STOKE_MAX_DIMS && n < sizeof t.s; i++)
    n += (size_t)snprintf(t.s + n, sizeof t.s - n, i ? ", %lld" : "%lld", (long long)s->d[i]);
  if (n < sizeof t.s) snprintf(t.s + n, sizeof t.s - n, "]");
  return t;
}

const char *node_name(const stoke_kernel_args_v1 *a) {
  return a->node && a->node->name ? a->node->name : "?";
}

int same_shape(const stoke_shape *x, const stoke_shape *y) {
  if (x->ndim != y->ndim) return 0;
  for (int i = 0; i < x->ndim; i++)
    if (x->d[i] != y->d[i]) return 0;
  return 1;
}

int is_nhwc(const stoke_tensor *t) { return t->shape.ndim == 4 && t->layout == STOKE_NHWC; }

stoke_err *check_counts(const stoke_kernel_args_v1 *a, const char *op, int bwd, int n_in,
                        int n_out) {
  if (a->n_in < n_in || a->n_out < n_out || !a->in || !a->out)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs %d input%s and %d output%s, got %d and %d",
                      op, node_name(a), n_in, n_in == 1 ? "" : "s", n_out, n_out == 1 ? "" : "s",
                      a->n_in, a->n_out);
  if (bwd && (!a->din || !a->dout))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': backward called without gradient tensors", op,
                      node_name(a));
  return NULL;
}

stoke_err *check_dtype(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                       const stoke_tensor *t, stoke_dtype want) {
  if (t->dtype != want)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s %s is %s, the kernel expects %s", op,
                      node_name(a), what, shp(&t->shape).s, stoke_dtype_name(t->dtype),
                      stoke_dtype_name(want));
  return NULL;
}

stoke_err *check_data(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                      const stoke_tensor *t, int run) {
  if (run && !t->data)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s %s has no data", op, node_name(a), what,
                      shp(&t->shape).s);
  return NULL;
}

stoke_err *check_grad(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                      const stoke_tensor *g, const stoke_tensor *of) {
  if (!g->data) return NULL;
  if (!same_shape(&g->shape, &of->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': gradient of %s is %s, the value is %s", op,
                      node_name(a), what, shp(&g->shape).s, shp(&of->shape).s);
  return check_dtype(a, op, what, g, of->dtype);
}

stoke_err *check_xy(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd,
                    int run) {
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  CHECK(check_dtype(a, op, "x", x, dt));
  CHECK(check_dtype(a, op, "y", y, dt));
  if (!bwd) {
    CHECK(check_data(a, op, "x", x, run));
    return check_data(a, op, "y", y, run);
  }
  CHECK(check_grad(a, op, "x", &a->din[0], x));
  return check_grad(a, op, "y", &a->dout[0], y);
}

stoke_err *check_layout_known(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                              const stoke_tensor *t) {
  if (t->layout != STOKE_LAYOUT_ANY && t->layout != STOKE_NCHW && t->layout != STOKE_NHWC)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': %s has unknown layout %d", op,
                      node_name(a), what, (int)t->layout);
  return NULL;
}

double grad_beta(const stoke_kernel_args_v1 *a, int i) {
  if ((a->din_accumulate >> i) & 1u) return 1.0; /* a second path's gradient of the same value */
  return (a->param_grads >> i) & 1u ? (double)a->param_grad_beta : 0.0;
}

void destroy_none(void *state) {}

stoke_err *cpu_add_kernels(const stoke_registry_v1 *r, const stoke_kernel_v1 *k, size_t n) {
  for (size_t i = 0; i < n; i++)
    STOKE_PTRY(r->add_kernel(r->self, &k[i]), "registering cpu kernel %s (%s)", k[i].op,
               stoke_dtype_name(k[i].dtype));
  return NULL;
}
