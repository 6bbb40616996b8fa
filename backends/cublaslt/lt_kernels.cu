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

// Column sums db = beta db + sum_i dy[i, :] of a row-major dy[rows, cols]
// (the bias gradient), bitwise reproducible: a fixed partition of the rows
// and fixed orders everywhere, no atomics. A thread owns V contiguous
// columns (one 16-byte load: 8 bf16/fp16, 4 f32; V = 1 when cols or dy's
// address do not allow it), a block 32 x V columns and CS_Y row lanes;
// each of `parts` row partitions writes its block's f32 sums to the
// workspace, and a second kernel adds a column's partials in partition
// order (one partition: the first kernel writes db itself). The grid has
// about CS_BLOCKS blocks, so every SM streams several rows at once: the
// single-pass kernel this replaced (one block per 32 columns, one 2-byte
// load per thread per row) had 24-96 blocks on GPT-2's widths, too few
// loads in flight to approach the memory's bandwidth.
constexpr int CS_Y = 8;          // row lanes per block (blocks of 32 x CS_Y threads)
constexpr int64_t CS_BLOCKS = 1024;  // the grid's target size (about 8 blocks per H100/H200 SM)
constexpr int64_t CS_MIN_ROWS = 128;  // rows per partition at least (16 per row lane)

struct cs_grid {
  int v;                 // columns per thread
  int64_t col_blocks, parts, rows_per_part;
};

static cs_grid cs_shape(int64_t rows, int64_t cols, int v) {
  cs_grid g;
  g.v = v;
  g.col_blocks = (cols + 32 * v - 1) / (32 * v);
  int64_t want = CS_BLOCKS / (g.col_blocks > 0 ? g.col_blocks : 1), most = (rows + CS_MIN_ROWS - 1) / CS_MIN_ROWS;
  g.parts = want < most ? want : most;
  if (g.parts < 1) g.parts = 1;
  g.rows_per_part = (rows + g.parts - 1) / g.parts;
  g.parts = g.rows_per_part ? (rows + g.rows_per_part - 1) / g.rows_per_part : 1;
  return g;
}

static size_t cs_ws(const cs_grid &g, int64_t cols) {
  return g.parts > 1 ? (size_t)g.parts * (size_t)cols * sizeof(float) : 0;
}

template <typename T, int V>
__global__ void __launch_bounds__(32 * CS_Y)
    colsum_part(float *__restrict__ part, T *db, const T *__restrict__ dy, int64_t rows, int64_t cols,
                int64_t rows_per_part, float beta) {
  __shared__ float sm[CS_Y][32 * V + 1];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c0 = ((int64_t)blockIdx.x * 32 + tx) * V;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_part;
  const int64_t r1 = r0 + rows_per_part < rows ? r0 + rows_per_part : rows;
  float s[V];
#pragma unroll
  for (int v = 0; v < V; v++) s[v] = 0.f;
  if (c0 < cols) {
    int64_t i = r0 + ty;
    // four rows in flight per thread, then the rest
    for (; i + 3 * CS_Y < r1; i += 4 * CS_Y) {
      vec<T, V> a[4];
#pragma unroll
      for (int u = 0; u < 4; u++) a[u] = *(const vec<T, V> *)(dy + (i + u * CS_Y) * cols + c0);
#pragma unroll
      for (int u = 0; u < 4; u++)
#pragma unroll
        for (int v = 0; v < V; v++) s[v] += to_f(a[u].v[v]);
    }
    for (; i < r1; i += CS_Y) {
      vec<T, V> a = *(const vec<T, V> *)(dy + i * cols + c0);
#pragma unroll
      for (int v = 0; v < V; v++) s[v] += to_f(a.v[v]);
    }
  }
#pragma unroll
  for (int v = 0; v < V; v++) sm[ty][tx * V + v] = s[v];
  __syncthreads();
  for (int c = threadIdx.x; c < 32 * V; c += 32 * CS_Y) {
    const int64_t j = (int64_t)blockIdx.x * 32 * V + c;
    if (j >= cols) continue;
    float t = sm[0][c];
#pragma unroll
    for (int y = 1; y < CS_Y; y++) t += sm[y][c];
    if (gridDim.y == 1) acc(db + j, beta, t);
    else part[(int64_t)blockIdx.y * cols + j] = t;
  }
}

// The partials of 32 columns a block: lane y adds partitions y, y + CS_Y, ... in order, then the
// CS_Y lane sums are added in order.
template <typename T>
__global__ void __launch_bounds__(32 * CS_Y)
    colsum_final(T *db, const float *__restrict__ part, int64_t parts, int64_t cols, float beta) {
  __shared__ float sm[CS_Y][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t j = (int64_t)blockIdx.x * 32 + tx;
  float t = 0.f;
  if (j < cols)
    for (int64_t p = ty; p < parts; p += CS_Y) t += part[p * cols + j];
  sm[ty][tx] = t;
  __syncthreads();
  if (ty == 0 && j < cols) {
#pragma unroll
    for (int y = 1; y < CS_Y; y++) t += sm[y][tx];
    acc(db + j, beta, t);
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

// GELU's aux and gradient over contiguous rows (aux_ld = cols, as linear_act's aux always is) in
// 16-byte accesses, V elements a thread and step: the scalar kernels above took an int64 division
// an element, and GPT-2's c_fc in tf32 spends 100-400 us a call here when the epilogue does not
// serve (autotune's choose_act). n elements of y/dz and z from 16-byte aligned pointers.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) gelu_aux_vec(T *__restrict__ y, T *__restrict__ z, int64_t n) {
  const int64_t nv = n / V, tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t v = tid; v < nv; v += stride) {
    vec<T, V> p = reinterpret_cast<const vec<T, V> *>(y)[v], g;
    reinterpret_cast<vec<T, V> *>(z)[v] = p;
#pragma unroll
    for (int k = 0; k < V; k++) g.v[k] = from_f<T>(gelu_f(to_f(p.v[k]), true));
    reinterpret_cast<vec<T, V> *>(y)[v] = g;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) {
    T v = y[i];
    z[i] = v;
    y[i] = from_f<T>(gelu_f(to_f(v), true));
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) dgelu_vec(T *__restrict__ dz, const T *__restrict__ z, int64_t n) {
  const int64_t nv = n / V, tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t v = tid; v < nv; v += stride) {
    vec<T, V> d = reinterpret_cast<const vec<T, V> *>(dz)[v], pz = reinterpret_cast<const vec<T, V> *>(z)[v];
#pragma unroll
    for (int k = 0; k < V; k++) {
      float g = gelu_grad_f(to_f(pz.v[k]), true);
      d.v[k] = from_f<T>(g != 0.f ? to_f(d.v[k]) * g : 0.f);
    }
    reinterpret_cast<vec<T, V> *>(dz)[v] = d;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) {
    float g = gelu_grad_f(to_f(z[i]), true);
    dz[i] = from_f<T>(g != 0.f ? to_f(dz[i]) * g : 0.f);
  }
}

// The 16-byte kernels serve GELU when the aux rows are y's (ld = cols) and both start aligned.
inline bool gelu_vec_ok(const void *y, const void *aux, int64_t cols, int64_t ld) {
  return ld == cols && aligned16(y) && aligned16(aux);
}

template <typename T>
cudaError_t launch_act_aux(void *y, void *aux, int64_t rows, int64_t cols, int64_t ld, int gelu, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  if (gelu && gelu_vec_ok(y, aux, cols, ld))
    gelu_aux_vec<T, V><<<grid_for(rows * cols / V + 1, kThreads, 65535), kThreads, 0, s>>>((T *)y, (T *)aux,
                                                                                            rows * cols);
  else if (gelu)
    gelu_aux<T><<<grid_for(rows * cols, kThreads, 65535), kThreads, 0, s>>>((T *)y, (T *)aux, rows, cols, ld);
  else
    relu_aux<T><<<grid_for(rows * (ld / 8), kThreads, 65535), kThreads, 0, s>>>((T *)y, (uint8_t *)aux, rows, cols,
                                                                                ld / 8);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dact(void *dz, const void *aux, int64_t rows, int64_t cols, int64_t ld, int gelu, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  if (gelu && gelu_vec_ok(dz, aux, cols, ld)) {
    dgelu_vec<T, V><<<grid_for(rows * cols / V + 1, kThreads, 65535), kThreads, 0, s>>>((T *)dz, (const T *)aux,
                                                                                        rows * cols);
    return cudaGetLastError();
  }
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

// The vector width dy allows: 16 bytes per load when every row starts 16-byte aligned.
template <typename T>
int cs_width(const void *dy, int64_t cols) {
  constexpr int V = 16 / sizeof(T);
  return cols % V == 0 && aligned16(dy) ? V : 1;
}

template <typename T>
size_t colsum_workspace(int64_t rows, int64_t cols) {
  size_t a = cs_ws(cs_shape(rows, cols, 1), cols), b = cs_ws(cs_shape(rows, cols, 16 / sizeof(T)), cols);
  return a > b ? a : b;
}

template <typename T>
cudaError_t launch_colsum(void *db, const void *dy, int64_t rows, int64_t cols, float beta, void *ws,
                          size_t ws_bytes, cudaStream_t s) {
  if (cols <= 0) return cudaSuccess;
  constexpr int VV = 16 / sizeof(T);
  cs_grid g = cs_shape(rows, cols, cs_width<T>(dy, cols));
  if (cs_ws(g, cols) > ws_bytes || !ws) { /* no room for partials: one partition (slower, still exact order) */
    g.parts = 1;
    g.rows_per_part = rows;
  }
  dim3 grid((unsigned)g.col_blocks, (unsigned)g.parts);
  if (g.v == VV)
    colsum_part<T, VV><<<grid, 32 * CS_Y, 0, s>>>((float *)ws, (T *)db, (const T *)dy, rows, cols,
                                                   g.rows_per_part, beta);
  else
    colsum_part<T, 1><<<grid, 32 * CS_Y, 0, s>>>((float *)ws, (T *)db, (const T *)dy, rows, cols,
                                                  g.rows_per_part, beta);
  if (g.parts > 1)
    colsum_final<T><<<(unsigned)((cols + 31) / 32), 32 * CS_Y, 0, s>>>((T *)db, (const float *)ws, g.parts, cols,
                                                                     beta);
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
                                       stoke_dtype dt, void *ws, size_t ws_bytes, cudaStream_t s) {
  BY_DTYPE(dt, launch_colsum<T>(db, dy, rows, cols, beta, ws, ws_bytes, s));
}

extern "C" size_t stoke_lt_colsum_workspace(int64_t rows, int64_t cols, stoke_dtype dt) {
  switch (dt) {
    case STOKE_F32: return colsum_workspace<float>(rows, cols);
    case STOKE_F16: return colsum_workspace<__half>(rows, cols);
    case STOKE_BF16: return colsum_workspace<__nv_bfloat16>(rows, cols);
    default: return 0;
  }
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
