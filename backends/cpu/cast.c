/* backends/cpu/cast.c: the cast op on the CPU (f32/f64 in, f32/f64 out,
 * NCHW to the output's layout for 4-D tensors) and autocast between f32 and
 * f64 (the precision policies' fp32 ops); see stoke/ops.h. */
#include <string.h>

#include "check.h"
#include "cpu_cnn.h"
#include "stoke/ops.h"

static stoke_err *cast_fwd(const stoke_kernel_args_v1 *a, void *state) {
  const char *op = STOKE_OP_CAST;
  CHECK(stoke_check_counts(a, op, 0, 1, 1));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (y->dtype != STOKE_F32 && y->dtype != STOKE_F64)
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "%s '%s': y %s is %s, the cpu backend casts to f32 or f64 only", op,
                      stoke_node_name(a), stoke_shape_str(&y->shape).s, stoke_dtype_name(y->dtype));
  if (stoke_numel(&x->shape) != stoke_numel(&y->shape))
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': x %s and y %s differ in size", op,
                      stoke_node_name(a), stoke_shape_str(&x->shape).s, stoke_shape_str(&y->shape).s);
  int64_t n = stoke_numel(&x->shape);
  int nhwc_in = stoke_is_nhwc(x), nhwc_out = stoke_is_nhwc(y);
  if (nhwc_in == nhwc_out) {
    for (int64_t i = 0; i < n; i++) stoke_elem_set(y->data, y->dtype, i, stoke_elem_get(x->data, x->dtype, i));
    return NULL;
  }
  int64_t N = x->shape.d[0], C = x->shape.d[1], H = x->shape.d[2], W = x->shape.d[3];
  for (int64_t b = 0; b < N; b++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) {
          int64_t nchw = ((b * C + c) * H + h) * W + w, nhwc = ((b * H + h) * W + w) * C + c;
          int64_t src = nhwc_in ? nhwc : nchw, dst = nhwc_out ? nhwc : nchw;
          stoke_elem_set(y->data, y->dtype, dst, stoke_elem_get(x->data, x->dtype, src));
        }
  return NULL;
}

/* ------------------------------------------------------------- autocast */

/* autocast between f32 and f64 (stoke/ops.h): forward y = x in y's dtype;
 * backward dx = dy in x's dtype, accumulated into a parameter's gradient. */
static stoke_err *autocast_check(const stoke_kernel_args_v1 *a, int bwd) {
  const char *op = STOKE_OP_AUTOCAST;
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  int ok = (x->dtype == STOKE_F32 || x->dtype == STOKE_F64) && (y->dtype == STOKE_F32 || y->dtype == STOKE_F64);
  if (!ok)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': %s to %s; the cpu backend casts between f32 and f64", op,
                      stoke_node_name(a), stoke_dtype_name(x->dtype), stoke_dtype_name(y->dtype));
  if (!stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': x %s and y %s differ in shape", op, stoke_node_name(a), stoke_shape_str(&x->shape).s,
                      stoke_shape_str(&y->shape).s);
  if (!bwd) return NULL;
  CHECK(stoke_check_grad(a, op, "x", &a->din[0], x));
  return stoke_check_grad(a, op, "y", &a->dout[0], y);
}

static stoke_err *autocast_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  *state = NULL;
  *ws = 0;
  return autocast_check(a, a->din != NULL);
}

static stoke_err *autocast_fwd(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(autocast_check(a, 0));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  for (int64_t i = 0, n = stoke_numel(&x->shape); i < n; i++)
    stoke_elem_set(y->data, y->dtype, i, stoke_elem_get(x->data, x->dtype, i));
  return NULL;
}

static stoke_err *autocast_bwd(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(autocast_check(a, 1));
  const stoke_tensor *dx = &a->din[0], *dy = &a->dout[0];
  if (!dx->data) return NULL;
  double beta = stoke_grad_beta(a, 0);
  for (int64_t i = 0, n = stoke_numel(&dx->shape); i < n; i++) {
    double v = stoke_elem_get(dy->data, dy->dtype, i);
    stoke_elem_set(dx->data, dx->dtype, i, beta != 0 ? beta * stoke_elem_get(dx->data, dx->dtype, i) + v : v);
  }
  return NULL;
}

static const stoke_kernel_v1 kernels[] = {
    {"cpu", STOKE_OP_CAST, STOKE_FWD, STOKE_F32, STOKE_LAYOUT_ANY, NULL, cast_fwd, NULL},
    {"cpu", STOKE_OP_CAST, STOKE_FWD, STOKE_F64, STOKE_LAYOUT_ANY, NULL, cast_fwd, NULL},
    {"cpu", STOKE_OP_AUTOCAST, STOKE_FWD, STOKE_F32, STOKE_LAYOUT_ANY, autocast_plan, autocast_fwd, NULL},
    {"cpu", STOKE_OP_AUTOCAST, STOKE_FWD, STOKE_F64, STOKE_LAYOUT_ANY, autocast_plan, autocast_fwd, NULL},
    {"cpu", STOKE_OP_AUTOCAST, STOKE_BWD, STOKE_F32, STOKE_LAYOUT_ANY, autocast_plan, autocast_bwd, NULL},
    {"cpu", STOKE_OP_AUTOCAST, STOKE_BWD, STOKE_F64, STOKE_LAYOUT_ANY, autocast_plan, autocast_bwd, NULL},
};

stoke_err *cpu_register_cast(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, kernels, sizeof kernels / sizeof *kernels);
}
