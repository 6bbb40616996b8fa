// tests/plugins/newuser/hardswish.cu: the cuda kernels of the new user's
// hardswish plugin, one thread per element, on the stream stoke hands the
// kernel (checked against the cpu's on the GPU by gpu_suite part plugkit).
#include <cstdint>

#include <cuda_runtime.h>

__global__ void hardswish_kernel(int backward, const float *__restrict__ x, const float *__restrict__ dy,
                                 float *__restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i];
    if (backward) out[i] = v < -3.0f ? 0.0f : v > 3.0f ? dy[i] : dy[i] * (2.0f * v + 3.0f) / 6.0f;
    else out[i] = v <= -3.0f ? 0.0f : v >= 3.0f ? v : v * (v + 3.0f) / 6.0f;
  }
}

extern "C" __attribute__((visibility("hidden"))) const char *hardswish_cuda(int backward, const float *x,
                                                                             const float *dy, float *out, int64_t n,
                                                                             void *stream) {
  if (n <= 0) return nullptr;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  hardswish_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(backward, x, dy, out, n);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}
