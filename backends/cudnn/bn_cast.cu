// backends/cudnn/bn_cast.cu: the per-channel helpers of the cudnn
// batch_norm kernels (backends/cudnn/bn.c). cuDNN wants scale, bias and
// their gradients in f32 whatever x's dtype; stoke keeps weight and bias in
// x's dtype. These tiny kernels (C threads) convert them, fill the eval
// statistics and accumulate the parameter gradients with param_grad_beta.
// Plain C entry points (bn.c is C); dtype codes: 0 f32, 1 bf16, 2 f16.
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

// beta 0: overwrite without reading (the destination may hold NaN).
__device__ __forceinline__ void acc(void *p, int dt, long long i, float beta, float v) {
  store(p, dt, i, beta != 0.0f ? beta * load(p, dt, i) + v : v);
}

constexpr int kThreads = 256;

unsigned blocks(long long c) { return (unsigned)((c + kThreads - 1) / kThreads); }

// scale = w, bias = b as f32 (b may be NULL: zeros).
__global__ void k_params(const void *w, const void *b, int dt, long long c, float *scale,
                         float *bias) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  scale[i] = load(w, dt, i);
  bias[i] = b ? load(b, dt, i) : 0.0f;
}

// eval forward: saved_mean = running_mean, saved_invstd = 1/sqrt(rv + eps).
__global__ void k_eval_stats(const float *rm, const float *rv, double eps, long long c, float *sm,
                             float *si) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  sm[i] = rm[i];
  si[i] = (float)(1.0 / sqrt((double)rv[i] + eps));
}

// eval backward: scale = w invstd, zeros (mean, bias) and ones (variance),
// so that cuDNN's inference forward on dy gives dx = w invstd dy.
__global__ void k_eval_dx_params(const void *w, int dt, const float *si, long long c, float *scale,
                                 float *zeros, float *ones) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  scale[i] = load(w, dt, i) * si[i];
  zeros[i] = 0.0f;
  ones[i] = 1.0f;
}

// dw = bw dw + dscale, db = bb db + dbias (each only when not NULL).
__global__ void k_param_grads(const float *dscale, const float *dbias, int dt, long long c, void *dw,
                              float bw, void *db, float bb) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  if (dw) acc(dw, dt, i, bw, dscale[i]);
  if (db) acc(db, dt, i, bb, dbias[i]);
}

}  // namespace

extern "C" {

cudaError_t stoke_cudnn_bn_params(const void *w, const void *b, int dt, long long c, float *scale,
                                  float *bias, cudaStream_t s) {
  if (c <= 0) return cudaSuccess;
  k_params<<<blocks(c), kThreads, 0, s>>>(w, b, dt, c, scale, bias);
  return cudaGetLastError();
}

cudaError_t stoke_cudnn_bn_eval_stats(const float *rm, const float *rv, double eps, long long c,
                                      float *sm, float *si, cudaStream_t s) {
  if (c <= 0) return cudaSuccess;
  k_eval_stats<<<blocks(c), kThreads, 0, s>>>(rm, rv, eps, c, sm, si);
  return cudaGetLastError();
}

cudaError_t stoke_cudnn_bn_eval_dx_params(const void *w, int dt, const float *si, long long c,
                                          float *scale, float *zeros, float *ones, cudaStream_t s) {
  if (c <= 0) return cudaSuccess;
  k_eval_dx_params<<<blocks(c), kThreads, 0, s>>>(w, dt, si, c, scale, zeros, ones);
  return cudaGetLastError();
}

cudaError_t stoke_cudnn_bn_param_grads(const float *dscale, const float *dbias, int dt, long long c,
                                       void *dw, float bw, void *db, float bb, cudaStream_t s) {
  if (c <= 0 || (!dw && !db)) return cudaSuccess;
  k_param_grads<<<blocks(c), kThreads, 0, s>>>(dscale, dbias, dt, c, dw, bw, db, bb);
  return cudaGetLastError();
}

}  // extern "C"
