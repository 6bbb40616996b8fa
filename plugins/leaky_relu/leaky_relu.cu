// plugins/leaky_relu/leaky_relu.cu: the example plugin's CUDA kernels, one
// thread per element, launched on the stream stoke hands the kernel
// (args->stream: whole steps are captured into CUDA graphs, so no other
// stream, no allocation, no synchronization here).
#include <cstdint>

#include <cuda_runtime.h>

__global__ void leaky_relu_kernel(int backward, const float *__restrict__ x, const float *__restrict__ dy,
                                  float *__restrict__ out, int64_t n, float slope) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = backward ? dy[i] : x[i];
    out[i] = x[i] > 0.0f ? v : slope * v;
  }
}

// NULL when the launch was accepted, else the CUDA error's text.
extern "C" __attribute__((visibility("hidden"))) const char *leaky_relu_cuda(int backward, const float *x,
                                                                              const float *dy, float *out, int64_t n,
                                                                              float slope, void *stream) {
  if (n <= 0) return nullptr;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  leaky_relu_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(backward, x, dy, out, n, slope);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}
