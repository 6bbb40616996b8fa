// backends/cuda/cast.cu: the cast op on the GPU: an f32 batch to f32, bf16
// or f16, and from NCHW to NHWC for 4-D images, in one pass; see stoke/ops.h.
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

static stoke_err *cast_run(const stoke_kernel_args_v1 *a, void *st) {
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  int64_t n = stoke_numel(&y->shape);
  int in_nhwc = is_nhwc(x), out_nhwc = is_nhwc(y);
  if (x->dtype != STOKE_F32 || n != stoke_numel(&x->shape) || (in_nhwc && !out_nhwc))
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cast '%s': takes f32, NCHW or flat, to f32/bf16/f16", a->node->name);
  int to_nhwc = !in_nhwc && out_nhwc;
  int64_t C = y->shape.ndim == 4 ? y->shape.d[1] : 1, HW = y->shape.ndim == 4 ? y->shape.d[2] * y->shape.d[3] : 1;
  unsigned blocks = grid_for(n, kThreads, 65535);
  cudaStream_t s = (cudaStream_t)a->stream;
  switch (y->dtype) {
    case STOKE_F32: cast_kernel<float><<<blocks, kThreads, 0, s>>>((const float *)x->data, (float *)y->data, n, to_nhwc, C, HW); break;
    case STOKE_BF16: cast_kernel<__nv_bfloat16><<<blocks, kThreads, 0, s>>>((const float *)x->data, (__nv_bfloat16 *)y->data, n, to_nhwc, C, HW); break;
    case STOKE_F16: cast_kernel<__half><<<blocks, kThreads, 0, s>>>((const float *)x->data, (__half *)y->data, n, to_nhwc, C, HW); break;
    default: return STOKE_PERR(STOKE_E_UNSUPPORTED, "cast '%s': output dtype %s", a->node->name, stoke_dtype_name(y->dtype));
  }
  STOKE_CUDA_LAUNCH(a->node->name);
  return NULL;
}

static const stoke_kernel_v1 kernels[] = {
    {"cuda", STOKE_OP_CAST, STOKE_FWD, STOKE_F32, STOKE_LAYOUT_ANY, NULL, cast_run, NULL},
};

extern "C" stoke_err *stoke_cuda_register_cast(const stoke_registry_v1 *r) {
  return r->add_kernel(r->self, &kernels[0]);
}
