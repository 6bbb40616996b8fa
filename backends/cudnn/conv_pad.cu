// backends/cudnn/conv_pad.cu: channel padding for convolutions whose input
// has fewer than 8 channels (a ResNet stem's 3): cuDNN's tensor-core NHWC
// kernels want C a multiple of 8, and with C = 3 the stem convolution ran
// at about 30 TFLOP/s (2.1 ms forward, 1.2 ms backward of ResNet-50's 64 ms
// step on an H100). conv.c pads x to (N, H, W, Cp) and the filter to OHWI
// (O, kh, kw, Cp) with zeros in the workspace; the extra channels add
// nothing to y, and their filter gradient is dropped when dW is written
// back in OIHW. Plain C entry points; dtype codes: 0 f32, 1 bf16, 2 f16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace {

__device__ __forceinline__ float load(const void *p, int dt, long long i) {
  if (dt == 1) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (dt == 2) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

__device__ __forceinline__ void store(void *p, int dt, long long i, float v) {
  if (dt == 1) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
  else if (dt == 2) ((__half *)p)[i] = __float2half(v);
  else ((float *)p)[i] = v;
}

constexpr int kThreads = 256;

unsigned blocks(long long n) {
  long long b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b > 65535LL * 64 ? 65535LL * 64 : b < 1 ? 1 : b);
}

// xp[r, c] = c < C ? x[r, c] : 0 over rows (pixels) r.
__global__ void k_pad_x(const void *x, void *xp, long long rows, int c, int cp, int dt) {
  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
       r += (long long)gridDim.x * blockDim.x)
    for (int k = 0; k < cp; k++) store(xp, dt, r * cp + k, k < c ? load(x, dt, r * c + k) : 0.0f);
}

// wp[o, i, j, k] (OHWI, k < Cp) = k < C ? w[o, k, i, j] (OIHW) : 0.
__global__ void k_pad_w(const void *w, void *wp, int o, int c, int kh, int kw, int cp, int dt) {
  long long n = (long long)o * kh * kw * cp;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
    int k = (int)(e % cp);
    long long p = e / cp;
    int j = (int)(p % kw), i = (int)(p / kw % kh);
    long long oo = p / kw / kh;
    store(wp, dt, e, k < c ? load(w, dt, ((oo * c + k) * kh + i) * kw + j) : 0.0f);
  }
}

// dw[o, k, i, j] (OIHW) = beta dw + dwp[o, i, j, k] (OHWI, padded); beta 0
// does not read dw.
__global__ void k_unpad_dw(const void *dwp, void *dw, int o, int c, int kh, int kw, int cp, float beta, int dt) {
  long long n = (long long)o * c * kh * kw;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
    int j = (int)(e % kw), i = (int)(e / kw % kh), k = (int)(e / kw / kh % c);
    long long oo = e / kw / kh / c;
    float v = load(dwp, dt, ((oo * kh + i) * kw + j) * cp + k);
    store(dw, dt, e, beta != 0.0f ? beta * load(dw, dt, e) + v : v);
  }
}

}  // namespace

extern "C" cudaError_t stoke_cudnn_pad_x(const void *x, void *xp, long long rows, int c, int cp, int dt,
                                         cudaStream_t s) {
  k_pad_x<<<blocks(rows), kThreads, 0, s>>>(x, xp, rows, c, cp, dt);
  return cudaGetLastError();
}

extern "C" cudaError_t stoke_cudnn_pad_w(const void *w, void *wp, int o, int c, int kh, int kw, int cp, int dt,
                                         cudaStream_t s) {
  k_pad_w<<<blocks((long long)o * kh * kw * cp), kThreads, 0, s>>>(w, wp, o, c, kh, kw, cp, dt);
  return cudaGetLastError();
}

extern "C" cudaError_t stoke_cudnn_unpad_dw(const void *dwp, void *dw, int o, int c, int kh, int kw, int cp,
                                            float beta, int dt, cudaStream_t s) {
  k_unpad_dw<<<blocks((long long)o * c * kh * kw), kThreads, 0, s>>>(dwp, dw, o, c, kh, kw, cp, beta, dt);
  return cudaGetLastError();
}
