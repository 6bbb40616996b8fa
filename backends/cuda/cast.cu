// backends/cuda/cast.cu: the cast op on the GPU: an f32 batch to f32, bf16
// or f16, and from NCHW to NHWC for 4-D images, in one pass; and autocast
// between f32 and bf16/f16 (the precision policies' fp32 ops); see
// stoke/ops.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "stoke/ops.h"

// i indexes the output; with to_nhwc it is (n, h, w, c) and reads (n, c, h, w)
template <typename T>
__global__ void cast_kernel(const float *__restrict__ x, T *__restrict__ y, int64_t n, int to_nhwc,
                            int64_t C, int64_t HW) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t src = i;
    if (to_nhwc) {
      int64_t c = i % C, p = (i / C) % HW, b = i / (C * HW);
      src = (b * C + c) * HW + p;
    }
    y[i] = from_f<T>(x[src]);
  }
}

// NCHW -> NHWC for a few channels (an image batch's 3): a thread per pixel, its C reads
// coalesced across the warp (consecutive pixels of one plane) and its C writes consecutive. The
// per-element kernel above divides three times in 64 bits per element and reads with a stride of
// H W across a warp: 0.21 ms for ResNet-50's 154 MB batch, four times its bytes' time. 32-bit
// indices (the caller checks the sizes); the same roundings, so the same bits.
template <typename T, int C>
__global__ void __launch_bounds__(kThreads)
    cast_nhwc_small(const float *__restrict__ x, T *__restrict__ y, int32_t pixels, int32_t HW) {
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += gridDim.x * blockDim.x) {
    const int32_t b = i / HW, p = i - b * HW;
    const float *src = x + (int64_t)b * C * HW + p;
    T v[C];
#pragma unroll
    for (int c = 0; c < C; c++) v[c] = from_f<T>(src[(int64_t)c * HW]);
#pragma unroll
    for (int c = 0; c < C; c++) y[(int64_t)i * C + c] = v[c];
  }
}

// y = x in T, NCHW -> NHWC when to_nhwc: the per-pixel kernel for 1, 3 or 4 channels within
// 32-bit indices, else the per-element one.
template <typename T>
void launch_cast(const float *x, T *y, int64_t n, int to_nhwc, int64_t C, int64_t HW, cudaStream_t s) {
  /* i + the grid's stride stays within int32 (65535 x 256 threads) */
  if (to_nhwc && n > 0 && n < INT32_MAX / 2 && (C == 1 || C == 3 || C == 4)) {
    const int32_t pixels = (int32_t)(n / C);
    const unsigned blocks = grid_for(pixels, kThreads, 65535);
    if (C == 1) cast_nhwc_small<T, 1><<<blocks, kThreads, 0, s>>>(x, y, pixels, (int32_t)HW);
    else if (C == 3) cast_nhwc_small<T, 3><<<blocks, kThreads, 0, s>>>(x, y, pixels, (int32_t)HW);
    else cast_nhwc_small<T, 4><<<blocks, kThreads, 0, s>>>(x, y, pixels, (int32_t)HW);
    return;
  }
  cast_kernel<T><<<grid_for(n, kThreads, 65535), kThreads, 0, s>>>(x, y, n, to_nhwc, C, HW);
}

static stoke_err *cast_run(const stoke_kernel_args_v1 *a, void *st) {
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  int64_t n = stoke_numel(&y->shape);
  int in_nhwc = stoke_is_nhwc(x), out_nhwc = stoke_is_nhwc(y);
  if (x->dtype != STOKE_F32 || n != stoke_numel(&x->shape) || (in_nhwc && !out_nhwc))
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cast '%s': takes f32, NCHW or flat, to f32/bf16/f16", a->node->name);
  int to_nhwc = !in_nhwc && out_nhwc;
  int64_t C = y->shape.ndim == 4 ? y->shape.d[1] : 1, HW = y->shape.ndim == 4 ? y->shape.d[2] * y->shape.d[3] : 1;
  cudaStream_t s = (cudaStream_t)a->stream;
  const float *xs = (const float *)x->data;
  switch (y->dtype) {
    case STOKE_F32: launch_cast(xs, (float *)y->data, n, to_nhwc, C, HW, s); break;
    case STOKE_BF16: launch_cast(xs, (__nv_bfloat16 *)y->data, n, to_nhwc, C, HW, s); break;
    case STOKE_F16: launch_cast(xs, (__half *)y->data, n, to_nhwc, C, HW, s); break;
    default: return STOKE_PERR(STOKE_E_UNSUPPORTED, "cast '%s': output dtype %s", a->node->name, stoke_dtype_name(y->dtype));
  }
  STOKE_CUDA_LAUNCH(a->node->name);
  return NULL;
}

// ------------------------------------------------------------- autocast

// autocast (stoke/ops.h) between f32 and bf16/f16: forward y = x in y's
// dtype; backward dx = dy in x's dtype, accumulated (beta) into a
// parameter's gradient. Exact up to the one rounding to the narrower type.
template <typename TI, typename TO>
__global__ void convert_kernel(const TI *__restrict__ x, TO *__restrict__ y, int64_t n, float beta) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    acc(&y[i], beta, to_f(x[i]));
}

template <typename TI, typename TO>
static void convert(const void *x, void *y, int64_t n, float beta, cudaStream_t s) {
  convert_kernel<TI, TO><<<grid_for(n, kThreads, 65535), kThreads, 0, s>>>((const TI *)x, (TO *)y, n, beta);
}

// y (dtype to) = x (dtype from): false for a pair the cuda backend lacks.
static bool convert_any(const void *x, stoke_dtype from, void *y, stoke_dtype to, int64_t n, float beta,
                        cudaStream_t s) {
  if (from == STOKE_F32 && to == STOKE_BF16) convert<float, __nv_bfloat16>(x, y, n, beta, s);
  else if (from == STOKE_F32 && to == STOKE_F16) convert<float, __half>(x, y, n, beta, s);
  else if (from == STOKE_BF16 && to == STOKE_F32) convert<__nv_bfloat16, float>(x, y, n, beta, s);
  else if (from == STOKE_F16 && to == STOKE_F32) convert<__half, float>(x, y, n, beta, s);
  else return false;
  return true;
}

static stoke_err *autocast_check(const stoke_kernel_args_v1 *a, bool bwd) {
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (a->n_in < 1 || a->n_out < 1 || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "autocast '%s': needs x and y (and their gradients in backward)", stoke_node_name(a));
  if (!stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "autocast '%s': x %s and y %s differ in shape", stoke_node_name(a), stoke_shape_str(&x->shape).s,
                      stoke_shape_str(&y->shape).s);
  bool f32_in = x->dtype == STOKE_F32, low_out = y->dtype == STOKE_BF16 || y->dtype == STOKE_F16;
  bool low_in = x->dtype == STOKE_BF16 || x->dtype == STOKE_F16;
  if (!((f32_in && low_out) || (low_in && y->dtype == STOKE_F32)))
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "autocast '%s': %s to %s; the cuda backend casts between f32 and bf16/f16",
                      stoke_node_name(a), stoke_dtype_name(x->dtype), stoke_dtype_name(y->dtype));
  if (bwd) CHECK(stoke_check_grad(a, "autocast", "x", &a->din[0], x));
  return NULL;
}

static stoke_err *autocast_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  *state = NULL;
  *ws = 0;
  return autocast_check(a, a->din != NULL);
}

static stoke_err *autocast_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(autocast_check(a, false));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  convert_any(x->data, x->dtype, y->data, y->dtype, stoke_numel(&x->shape), 0.0f, (cudaStream_t)a->stream);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

static stoke_err *autocast_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(autocast_check(a, true));
  const stoke_tensor *dx = &a->din[0], *dy = &a->dout[0];
  if (!dx->data) return NULL;
  convert_any(dy->data, dy->dtype, dx->data, dx->dtype, stoke_numel(&dx->shape), stoke_grad_beta(a, 0),
              (cudaStream_t)a->stream);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

static const stoke_kernel_v1 kernels[] = {
    {"cuda", STOKE_OP_CAST, STOKE_FWD, STOKE_F32, STOKE_LAYOUT_ANY, NULL, cast_run, NULL},
    {"cuda", STOKE_OP_AUTOCAST, STOKE_FWD, STOKE_F32, STOKE_LAYOUT_ANY, autocast_plan, autocast_fwd, NULL},
    {"cuda", STOKE_OP_AUTOCAST, STOKE_FWD, STOKE_BF16, STOKE_LAYOUT_ANY, autocast_plan, autocast_fwd, NULL},
    {"cuda", STOKE_OP_AUTOCAST, STOKE_FWD, STOKE_F16, STOKE_LAYOUT_ANY, autocast_plan, autocast_fwd, NULL},
    {"cuda", STOKE_OP_AUTOCAST, STOKE_BWD, STOKE_F32, STOKE_LAYOUT_ANY, autocast_plan, autocast_bwd, NULL},
    {"cuda", STOKE_OP_AUTOCAST, STOKE_BWD, STOKE_BF16, STOKE_LAYOUT_ANY, autocast_plan, autocast_bwd, NULL},
    {"cuda", STOKE_OP_AUTOCAST, STOKE_BWD, STOKE_F16, STOKE_LAYOUT_ANY, autocast_plan, autocast_bwd, NULL},
};

extern "C" stoke_err *stoke_cuda_register_cast(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, kernels, sizeof kernels / sizeof *kernels);
}
