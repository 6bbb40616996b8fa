// backends/cublaslt/lt_kernels.cu: the plain CUDA kernels the cublaslt
// linear, linear_relu, linear_act and linear_dact kernels need around cuBLASLt (see lt_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cublaslt/lt_kernels.h"
#include "backends/cuda/act.cuh"
#include "backends/cuda/types.cuh"

namespace {

template <typename T>
__global__ void bias_rows(T *y, const T *b, int64_t rows, int64_t cols) {
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = b[i % cols];
}

template <typename T>
__global__ void scale(T *d, int64_t n, float beta) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    d[i] = from_f<T>(beta != 0.f ? beta * to_f(d[i]) : 0.f);
}

// One block per 32 columns; its 32 x COLSUM_Y threads stride over the rows
// (each thread in a fixed order), then row 0 of the block adds the
// COLSUM_Y partial sums in a fixed order: the same bits on every run.
constexpr int COLSUM_Y = 16;

template <typename T>
__global__ void colsum(T *db, const T *dy, int64_t rows, int64_t cols, float beta) {
  __shared__ float part[COLSUM_Y][33];
  int64_t j = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (j < cols)
    for (int64_t i = threadIdx.y; i < rows; i += COLSUM_Y) s += to_f(dy[i * cols + j]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float t = 0.f;
    for (int r = 0; r < COLSUM_Y; r++) t += part[r][threadIdx.x];
    db[j] = from_f<T>(beta != 0.f ? beta * to_f(db[j]) + t : t);
  }
}

template <typename T>
__global__ void relu_inplace(T *y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = to_f(y[i]);
    if (v < 0.f) y[i] = from_f<T>(0.f); /* NaN and +-0 are left as they are */
  }
}

// dz = dy where y > 0, else 0: the ReLU's gradient read from its output.
// The f32 round trip of a bf16/fp16 dy is exact.
template <typename T>
__global__ void relu_mask(T *dz, const T *dy, const T *y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dz[i] = from_f<T>(to_f(y[i]) > 0.f ? to_f(dy[i]) : 0.f);
}

// ReLU with its bitmask: one thread per mask byte (8 outputs of a row); NaN stays NaN.
template <typename T>
__global__ void relu_aux(T *y, uint8_t *mask, int64_t rows, int64_t cols, int64_t stride) {
  int64_t n = rows * stride;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = t / stride, j0 = (t % stride) * 8;
    unsigned bits = 0;
    for (int b = 0; b < 8 && j0 + b < cols; b++) {
      T *p = y + i * cols + j0 + b;
      float v = to_f(*p);
      if (v > 0.f) bits |= 1u << b;
      else if (v < 0.f) *p = from_f<T>(0.f);
    }
    mask[t] = (uint8_t)bits;
  }
}

template <typename T>
__global__ void gelu_aux(T *y, T *z, int64_t rows, int64_t cols, int64_t ld) {
  int64_t n = rows * cols;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = t / cols, j = t % cols;
    T v = y[t];
    z[i * ld + j] = v;
    y[t] = from_f<T>(gelu_f(to_f(v), true));
  }
}

template <typename T>
__global__ void dact(T *dz, const void *aux, int64_t rows, int64_t cols, int64_t ld, int gelu) {
  int64_t n = rows * cols;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = t / cols, j = t % cols;
    float g;
    if (gelu) g = gelu_grad_f(to_f(((const T *)aux)[i * ld + j]), true);
    else g = (((const uint8_t *)aux)[i * (ld / 8) + j / 8] >> (j % 8)) & 1u ? 1.f : 0.f;
    dz[t] = from_f<T>(g != 0.f ? to_f(dz[t]) * g : 0.f);
  }
}

template <typename T>
cudaError_t launch_act_aux(void *y, void *aux, int64_t rows, int64_t cols, int64_t ld, int gelu, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (gelu)
    gelu_aux<T><<<grid_for(rows * cols, kThreads, 65535), kThreads, 0, s>>>((T *)y, (T *)aux, rows, cols, ld);
  else
    relu_aux<T><<<grid_for(rows * (ld / 8), kThreads, 65535), kThreads, 0, s>>>((T *)y, (uint8_t *)aux, rows, cols,
                                                                                ld / 8);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dact(void *dz, const void *aux, int64_t rows, int64_t cols, int64_t ld, int gelu, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  dact<T><<<grid_for(rows * cols, kThreads, 65535), kThreads, 0, s>>>((T *)dz, aux, rows, cols, ld, gelu);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_bias_rows(void *y, const void *b, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  bias_rows<T><<<grid_for(rows * cols, kThreads, 65535), kThreads, 0, s>>>((T *)y, (const T *)b,
                                                                           rows, cols);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_scale(void *d, int64_t n, float beta, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  scale<T><<<grid_for(n, kThreads, 65535), kThreads, 0, s>>>((T *)d, n, beta);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_colsum(void *db, const void *dy, int64_t rows, int64_t cols, float beta, cudaStream_t s) {
  if (cols <= 0) return cudaSuccess;
  dim3 block(32, COLSUM_Y);
  colsum<T><<<(unsigned)((cols + 31) / 32), block, 0, s>>>((T *)db, (const T *)dy, rows, cols, beta);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_relu(void *y, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  relu_inplace<T><<<grid_for(n, kThreads, 65535), kThreads, 0, s>>>((T *)y, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_relu_mask(void *dz, const void *dy, const void *y, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  relu_mask<T>
      <<<grid_for(n, kThreads, 65535), kThreads, 0, s>>>((T *)dz, (const T *)dy, (const T *)y, n);
  return cudaGetLastError();
}

}  // namespace

// An entry point's body: the launch `...` (which names T) for dt's element type T; other dtypes
// are refused.
#define BY_DTYPE(dt, ...)                  \
  switch (dt) {                            \
    case STOKE_F32: {                      \
      using T = float;                     \
      return __VA_ARGS__;                  \
    }                                      \
    case STOKE_F16: {                      \
      using T = __half;                    \
      return __VA_ARGS__;                  \
    }                                      \
    case STOKE_BF16: {                     \
      using T = __nv_bfloat16;             \
      return __VA_ARGS__;                  \
    }                                      \
    default: return cudaErrorInvalidValue; \
  }

extern "C" cudaError_t stoke_lt_bias_rows(void *y, const void *b, int64_t rows, int64_t cols, stoke_dtype dt,
                                          cudaStream_t s) {
  BY_DTYPE(dt, launch_bias_rows<T>(y, b, rows, cols, s));
}

extern "C" cudaError_t stoke_lt_scale(void *d, int64_t n, float beta, stoke_dtype dt, cudaStream_t s) {
  BY_DTYPE(dt, launch_scale<T>(d, n, beta, s));
}

extern "C" cudaError_t stoke_lt_colsum(void *db, const void *dy, int64_t rows, int64_t cols, float beta,
                                       stoke_dtype dt, cudaStream_t s) {
  BY_DTYPE(dt, launch_colsum<T>(db, dy, rows, cols, beta, s));
}

extern "C" cudaError_t stoke_lt_relu(void *y, int64_t n, stoke_dtype dt, cudaStream_t s) {
  BY_DTYPE(dt, launch_relu<T>(y, n, s));
}

extern "C" cudaError_t stoke_lt_relu_mask(void *dz, const void *dy, const void *y, int64_t n, stoke_dtype dt,
                                          cudaStream_t s) {
  BY_DTYPE(dt, launch_relu_mask<T>(dz, dy, y, n, s));
}

extern "C" cudaError_t stoke_lt_act_aux(void *y, void *aux, int64_t rows, int64_t cols, int64_t aux_ld, int gelu,
                                        stoke_dtype dt, cudaStream_t s) {
  BY_DTYPE(dt, launch_act_aux<T>(y, aux, rows, cols, aux_ld, gelu, s));
}

extern "C" cudaError_t stoke_lt_dact(void *dz, const void *aux, int64_t rows, int64_t cols, int64_t aux_ld, int gelu,
                                     stoke_dtype dt, cudaStream_t s) {
  BY_DTYPE(dt, launch_dact<T>(dz, aux, rows, cols, aux_ld, gelu, s));
}
