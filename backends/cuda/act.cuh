// backends/cuda/act.cuh: the activation math on the device (.cu only), one copy for the cuda
// backend's gelu kernels and the cublaslt engine's epilogue fallbacks: gelu and its derivative
// in float, exact (erf) or with the tanh approximation, as nn.GELU and backends/cpu/act.h.
#ifndef STOKE_CUDA_ACT_CUH
#define STOKE_CUDA_ACT_CUH

namespace {

constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK1 = 0.044715f;

__device__ __forceinline__ float gelu_f(float x, bool tanh_approx) {
  if (tanh_approx) return 0.5f * x * (1.f + tanhf(kGeluK0 * (x + kGeluK1 * x * x * x)));
  return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}

__device__ __forceinline__ float gelu_grad_f(float x, bool tanh_approx) {
  if (tanh_approx) {
    float t = tanhf(kGeluK0 * (x + kGeluK1 * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluK0 * (1.f + 3.f * kGeluK1 * x * x);
  }
  // Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
  return 0.5f * (1.f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.3989422804014327f;
}

}  // namespace

#endif
