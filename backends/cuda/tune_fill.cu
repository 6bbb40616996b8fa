// backends/cuda/tune_fill.cu: random values for the operands an autotune
// times on.
//
// Why: the cuBLASLt, cuDNN convolution and SDPA autotunes timed their
// candidates on scratch operands with every byte 0x3c (a constant). A
// tensor-core product of constant operands draws less power and runs
// faster than one of real data on these boards (BENCHMARKS.md run 21:
// GPT-2's c_fc weight gradient 0.097 ms on the constant, 0.110-0.114 on
// random bf16), and the boards run at their power cap (run 31), so the
// ranking of candidates on constants need not be the ranking in the step.
// Values uniform in [-1, 1) with random mantissas are closer to what the
// step feeds them. The hash (tune_fill.h) is stateless, so a fill needs no
// generator state and the CPU can compute the same values to test it.
#include "backends/cuda/tune_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}

template <typename T>
__global__ void k_tune_fill(T *p, size_t n, uint32_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = from_f<T>(stoke_tune_fill_value(i, seed));
}

template <typename T>
cudaError_t fill(void *p, size_t bytes, uint32_t seed, cudaStream_t s) {
  size_t n = bytes / sizeof(T), tail = bytes - n * sizeof(T);
  if (n) {
    size_t blocks = (n + 255) / 256;
    k_tune_fill<T><<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>((T *)p, n, seed);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return tail ? cudaMemsetAsync((char *)p + n * sizeof(T), 0, tail, s) : cudaSuccess;
}

}  // namespace

extern "C" cudaError_t stoke_cuda_tune_fill(void *p, size_t bytes, stoke_dtype dt, uint32_t seed,
                                            cudaStream_t stream) {
  if (!bytes) return cudaSuccess;
  switch (dt) {
    case STOKE_F32: return fill<float>(p, bytes, seed, stream);
    case STOKE_BF16: return fill<__nv_bfloat16>(p, bytes, seed, stream);
    case STOKE_F16: return fill<__half>(p, bytes, seed, stream);
    default: return cudaMemsetAsync(p, 0x3c, bytes, stream);
  }
}
