// backends/cuda/elementwise.cu: the cuda backend's elementwise, reduction and loss kernels
// (relu, gelu, add, bias_add, flatten, global_avg_pool, softmax_ce, dropout, normalize); see stoke/ops.h.
//
// Every kernel is a template over the element type (float, __nv_bfloat16, __half) and computes
// in float. Reductions are deterministic: each output is summed by a fixed set of threads in a
// fixed order (grid-stride partial sums, then a butterfly shuffle and a fixed-order pass over the
// warps), never with float atomics, so the same inputs give the same bits on every run. The
// semantics follow the CPU reference kernels (backends/cpu) exactly, NCHW and NHWC included.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends/cuda/act.cuh"
#include "backends/cuda/ew.cuh"
#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "stoke/ops.h"
#include "stoke/rng.h"

namespace {

constexpr int64_t kMaxGrid = 65535;  // grid-stride loops cover the rest

// ------------------------------------------------------------ the dropout hash

// stoke_uniform_at of stoke/rng.h, made callable on the device: the header's helpers are plain
// host inline functions and the SDK headers are not ours to edit. Same integer math, bit for bit;
// stoke_cuda_register_elementwise compares it with the header's on the host at load time, so a
// change to rng.h that is not mirrored here fails loudly instead of giving different masks.
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The 53 bits behind stoke_uniform_at(seed, i) = bits53 * 2^-53.
__host__ __device__ __forceinline__ uint64_t uniform_bits53(uint64_t seed, uint64_t i) {
  uint64_t x = seed;
  uint64_t h = mix64(&x);
  x = h ^ i;
  h = mix64(&x);
  x = h ^ 0x6d61736bull;
  return mix64(&x) >> 11;
}

// Element i is kept iff stoke_uniform_at(seed, i) >= p, i.e. bits53 * 2^-53 >= p, i.e.
// bits53 >= ceil(p * 2^53) (p * 2^53 is exact in double): an integer compare, same as the CPU's.
uint64_t keep_threshold(double p) { return (uint64_t)ceil(p * 9007199254740992.0); }

// The functors of launch_ew (backends/cuda/ew.cuh; op_copy is there too).
struct op_relu {  // NaN stays NaN, as on the CPU
  __device__ float operator()(float x, float, int64_t) const { return x < 0.f ? 0.f : x; }
};
struct op_relu_grad {  // x = y (forward output), z = dy
  __device__ float operator()(float y, float dy, int64_t) const { return y > 0.f ? dy : 0.f; }
};
struct op_gelu {
  bool tanh_approx;
  __device__ float operator()(float x, float, int64_t) const { return gelu_f(x, tanh_approx); }
};
struct op_gelu_grad {  // x = forward input, z = dy
  bool tanh_approx;
  __device__ float operator()(float x, float dy, int64_t) const { return dy * gelu_grad_f(x, tanh_approx); }
};
struct op_add {
  __device__ float operator()(float x, float z, int64_t) const { return x + z; }
};
struct op_dropout {  // x * keep(i) / (1 - p)
  uint64_t seed, threshold;
  float scale;
  __device__ float operator()(float x, float, int64_t i) const {
    return uniform_bits53(seed, (uint64_t)i) >= threshold ? x * scale : 0.f;
  }
};
template <typename T> struct op_bias_add {  // x + bias[channel of memory element i]
  const T *bias;
  int64_t c, rest;
  int nhwc;
  __device__ float operator()(float x, float, int64_t i) const {
    int64_t ch = nhwc ? i % c : (i / rest) % c;
    return x + to_f(bias[ch]);
  }
};
template <typename T> struct op_nchw_from_nhwc {  // y[logical l] = x[memory of l]: flatten fwd
  const T *x;
  int64_t c, hw;
  __device__ float operator()(float, float, int64_t l) const {
    int64_t chw = c * hw, n = l / chw, rem = l - n * chw, ch = rem / hw, p = rem - ch * hw;
    return to_f(x[(n * hw + p) * c + ch]);
  }
};
template <typename T> struct op_nhwc_from_nchw {  // dx[memory m] = dy[logical of m]: flatten bwd
  const T *dy;
  int64_t c, hw;
  __device__ float operator()(float, float, int64_t m) const {
    int64_t chw = c * hw, n = m / chw, rem = m - n * chw, p = rem / c, ch = rem - p * c;
    return to_f(dy[(n * c + ch) * hw + p]);
  }
};
template <typename T> struct op_gap_grad {  // dx = dy[n, c] / (H W)
  const T *dy;
  int64_t c, hw;
  int nhwc;
  float inv_hw;
  __device__ float operator()(float, float, int64_t i) const {
    int64_t row = nhwc ? (i / (hw * c)) * c + i % c : i / hw;
    return to_f(dy[row]) * inv_hw;
  }
};

// ------------------------------------------------------------- reductions

// Sum / max of v over the TPR threads of a row group (a warp for TPR 32, the block for TPR 256),
// the same bits in every thread: a butterfly shuffle (each pair adds the same two values) and,
// across warps, a fixed-order pass over the warps' results. `sm` holds kThreads / 32 floats.
template <int TPR, bool kMax> __device__ __forceinline__ float group_reduce(float v, float *sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  if (TPR == 32) return v;
  __syncthreads();  // the previous call's readers are done with sm
  if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = v;
  __syncthreads();
  float r = sm[0];
#pragma unroll
  for (int k = 1; k < TPR / 32; k++) r = kMax ? fmaxf(r, sm[k]) : r + sm[k];
  return r;
}

// y[r] = beta * y[r] + scale * sum_{p < len} x[r * len + p], one row per group of TPR threads.
template <typename Tin, typename Tout, int TPR>
__global__ void __launch_bounds__(kThreads)
    row_sum_kernel(const Tin *__restrict__ x, Tout *__restrict__ y, int64_t rows, int64_t len, float scale,
                   float beta) {
  constexpr int RPB = kThreads / TPR;
  __shared__ float sm[kThreads / 32];
  const int lane = threadIdx.x % TPR, sub = threadIdx.x / TPR;
  for (int64_t r0 = (int64_t)blockIdx.x * RPB; r0 < rows; r0 += (int64_t)gridDim.x * RPB) {
    const int64_t r = r0 + sub;  // uniform across the block when RPB == 1
    float s = 0.f;
    if (r < rows)
      for (int64_t p = lane; p < len; p += TPR) s += to_f(x[r * len + p]);
    s = group_reduce<TPR, false>(s, sm);
    if (r < rows && lane == 0) acc(y + r, beta, s * scale);
  }
}

// y[b * cols + j] = beta * y[...] + scale * sum_{r < rows} x[(b * rows + r) * cols + j]: column
// sums of `batches` row-major matrices. A block is 32 columns x 8 row phases (coalesced reads);
// the 8 partial sums of a column are added in a fixed order.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(kThreads)
    col_sum_kernel(const Tin *__restrict__ x, Tout *__restrict__ y, int64_t batches, int64_t rows, int64_t cols,
                   float scale, float beta) {
  __shared__ float sm[8][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  // the grid is capped (kMaxGrid blocks of 32 columns): blocks step over the columns past it
  for (int64_t j0 = (int64_t)blockIdx.x * 32; j0 < cols; j0 += (int64_t)gridDim.x * 32) {
    const int64_t j = j0 + tx;
    for (int64_t b = blockIdx.y; b < batches; b += gridDim.y) {
      float s = 0.f;
      if (j < cols)
        for (int64_t r = ty; r < rows; r += 8) s += to_f(x[(b * rows + r) * cols + j]);
      __syncthreads();
      sm[ty][tx] = s;
      __syncthreads();
      if (ty == 0 && j < cols) {
        float t = sm[0][tx];
#pragma unroll
        for (int k = 1; k < 8; k++) t += sm[k][tx];
        acc(y + b * cols + j, beta, t * scale);
      }
    }
  }
}

template <typename Tin, typename Tout>
stoke_err *launch_row_sum(const stoke_kernel_args_v1 *a, const Tin *x, Tout *y, int64_t rows, int64_t len,
                          float scale, float beta) {
  if (rows <= 0) return NULL;
  if (len >= 1024)
    row_sum_kernel<Tin, Tout, kThreads>
        <<<grid_for(rows, 1, kMaxGrid), kThreads, 0, stream_of(a)>>>(x, y, rows, len, scale, beta);
  else
    row_sum_kernel<Tin, Tout, 32>
        <<<grid_for(rows, kThreads / 32, kMaxGrid), kThreads, 0, stream_of(a)>>>(x, y, rows, len, scale, beta);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

template <typename Tin, typename Tout>
stoke_err *launch_col_sum(const stoke_kernel_args_v1 *a, const Tin *x, Tout *y, int64_t batches, int64_t rows,
                          int64_t cols, float scale, float beta) {
  if (batches <= 0 || cols <= 0) return NULL;
  dim3 grid(grid_for(cols, 32, kMaxGrid), (unsigned)(batches < kMaxGrid ? batches : kMaxGrid));
  col_sum_kernel<Tin, Tout><<<grid, kThreads, 0, stream_of(a)>>>(x, y, batches, rows, cols, scale, beta);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

// ------------------------------------------------------------- softmax_ce

// Online max and sum of exp for one value: (m, s) absorbs x. A -inf (a masked class) adds nothing:
// exp(x - m) with both -inf would be exp(NaN), and the row's sum NaN.
__device__ __forceinline__ void online_add(float &m, float &s, float x) {
  if (x > m) {
    s = s * __expf(m - x) + 1.f; /* exp(-inf) = 0 on the first value */
    m = x;
  } else if (x != -INFINITY) {
    s += __expf(x - m);
  }
}

// A row's loss, -(1 - ls) log p[label] - ls / C sum_j log p_j, from the label's logit xl, the row's
// lse and the sum of its logits sx; without smoothing the sum's term is left out, not 0 x sx
// (a -inf logit makes sx -inf, and 0 x -inf is NaN; PyTorch's loss stays finite there).
__device__ __forceinline__ float sce_loss(float xl, float lse, float sx, int64_t c, float ls) {
  const float nll = -(xl - lse);
  return ls == 0.f ? nll : (1.f - ls) * nll - ls / (float)c * (sx - (float)c * lse);
}

// Two (max, sum) partials combined.
__device__ __forceinline__ void online_merge(float &m, float &s, float m2, float s2) {
  float mm = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.f : s * __expf(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mm));
  m = mm;
}

// (max, sum) over a group of TPR threads (a warp or the block), every thread gets it.
template <int TPR> __device__ __forceinline__ void group_online(float &m, float &s, float2 *sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (TPR == 32) return;
  __syncthreads();
  if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = make_float2(m, s);
  __syncthreads();
  m = sm[0].x, s = sm[0].y;
#pragma unroll
  for (int k = 1; k < TPR / 32; k++) online_merge(m, s, sm[k].x, sm[k].y);
}

// Row r's log-sum-exp in one pass over the logits (online max and sum; never an f32 copy of the
// row), saved in lse[r], and its loss -(1 - ls) log p[label] - ls / C sum_j log p_j with
// log p_j = x_j - lse, into row_loss[r]. A label outside [0, C) is clamped for the read and makes
// the row's loss NaN: the host cannot be told without a sync, and a NaN loss stops the run.
template <typename T, int TPR>
__global__ void __launch_bounds__(kThreads)
    softmax_ce_fwd_kernel(const T *__restrict__ x, const int32_t *__restrict__ lab, float *__restrict__ row_loss,
                          float *__restrict__ lse_out, int64_t n, int64_t c, float ls) {
  constexpr int RPB = kThreads / TPR;
  __shared__ float sm[kThreads / 32];
  __shared__ float2 sm2[kThreads / 32];
  const int lane = threadIdx.x % TPR, sub = threadIdx.x / TPR;
  for (int64_t r0 = (int64_t)blockIdx.x * RPB; r0 < n; r0 += (int64_t)gridDim.x * RPB) {
    const int64_t r = r0 + sub;
    const bool live = r < n;
    const T *row = x + (live ? r : 0) * c;
    float m = -INFINITY, s = 0.f, sx = 0.f;
    if (live)
      for (int64_t j = lane; j < c; j += TPR) {
        float v = to_f(row[j]);
        online_add(m, s, v);
        sx += v;
      }
    group_online<TPR>(m, s, sm2);
    sx = group_reduce<TPR, false>(sx, sm);
    if (live && lane == 0) {
      int32_t l = lab[r];
      bool bad = l < 0 || (int64_t)l >= c;
      int64_t lc = l < 0 ? 0 : (int64_t)l >= c ? c - 1 : l;
      float lse = m + logf(s);
      float loss = sce_loss(to_f(row[lc]), lse, sx, c, ls);
      row_loss[r] = bad ? NAN : loss;
      lse_out[r] = lse;
    }
  }
}

// loss[0] = mean of row_loss[0..n), one block, fixed order.
__global__ void __launch_bounds__(kThreads)
    loss_mean_kernel(const float *__restrict__ row_loss, float *loss, int64_t n) {
  __shared__ float sm[kThreads / 32];
  float s = 0.f;
  for (int64_t r = threadIdx.x; r < n; r += kThreads) s += row_loss[r];
  s = group_reduce<kThreads, false>(s, sm);
  if (threadIdx.x == 0) loss[0] = s / (float)n;
}

// dlogits = dloss / N * (exp(x - lse) - target), target = (1 - ls) onehot(label) + ls / C: one
// read of the logits with the forward's lse, and dlogits may be the logits' own memory (each
// element read, then written, by one thread). A row whose label is outside [0, C) gets NaN.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_ce_bwd_kernel(const T *x, const int32_t *__restrict__ lab, const float *__restrict__ lse,
                          const float *__restrict__ dloss, T *dx, int64_t n, int64_t c, float ls, float beta) {
  const float g = dloss[0] / (float)n, base = ls / (float)c;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    const int32_t l = lab[r];
    const bool bad = l < 0 || (int64_t)l >= c;
    const float lr = lse[r];
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < c; j += (int64_t)gridDim.x * blockDim.x) {
      float target = base + (j == (int64_t)l ? 1.f - ls : 0.f);
      float v = bad ? NAN : g * (__expf(to_f(x[r * c + j]) - lr) - target);
      acc(dx + r * c + j, beta, v);
    }
  }
}

// Rows of whole 16-byte vectors (C a multiple of 8 for bf16/fp16, of 4 for f32, 16-byte aligned
// logits), the large-vocabulary case: a block of kSceThreads per row, thread t taking vectors t,
// t + kSceThreads, ... in that order. The forward, the backward and the one-kernel forward+backward
// (softmax_ce_fused_kernel) share the per-vector arithmetic below and that order, so the three give
// the same bits: dropping the forward node into the backward ([run] fwd_in_bwd) changes no result.
constexpr int kUnroll = 4;
constexpr int kSceThreads = 512;

// One vector absorbed into a thread's online (max m, sum s) and plain sum sx: the vector's max, then
// its exps against it (exp(f - cm) as one FMA and one ex2), merged.
template <typename T, int V>
__device__ __forceinline__ void sce_absorb(const vec<T, V> &xv, float &m, float &s, float &sx) {
  float cm = -INFINITY, cs = 0.f;
#pragma unroll
  for (int k = 0; k < V; k++) cm = fmaxf(cm, to_f(xv.v[k]));
  const float cm2 = cm * kLog2e;
#pragma unroll
  for (int k = 0; k < V; k++) {
    const float f = to_f(xv.v[k]);
    cs += ex2_ftz(fmaf(f, kLog2e, -cm2));
    sx += f;
  }
  online_merge(m, s, cm, cs);
}

// Row r's lse and loss from the block's (m, s, sx) and the label's logit xl, by thread 0.
__device__ __forceinline__ void sce_row_out(float m, float s, float sx, float xl, bool bad, int64_t c, float ls,
                                            int64_t r, float *row_loss, float *lse_out) {
  const float lr = m + logf(s);
  const float loss = sce_loss(xl, lr, sx, c, ls);
  row_loss[r] = bad ? NAN : loss;
  lse_out[r] = lr;
}

// The gradient of one vector (elements j .. j + V - 1, vector index v): d = g exp(x - lse) - g target as
// g exp2(x log2e - lse log2e) - g base, the label's element (in vector lv) lowered by g (1 - ls) by the
// thread that holds it; lr2 = lse log2e, NaN for a bad row (NaN throughout); then beta o + d.
template <typename T, int V>
__device__ __forceinline__ vec<T, V> sce_grad(const vec<T, V> &xv, vec<T, V> o, int64_t v, int64_t j, int64_t lv,
                                              int32_t l, float g, float lr2, float gb, float gl, float beta) {
  float d[V];
#pragma unroll
  for (int k = 0; k < V; k++) d[k] = fmaf(g, ex2_ftz(fmaf(to_f(xv.v[k]), kLog2e, -lr2)), -gb);
  if (v == lv) {
#pragma unroll
    for (int k = 0; k < V; k++)
      if (j + k == (int64_t)l) d[k] -= gl;
  }
#pragma unroll
  for (int k = 0; k < V; k++) o.v[k] = from_f<T>(beta != 0.f ? beta * to_f(o.v[k]) + d[k] : d[k]);
  return o;
}

// The forward, a block per row, kUnroll vectors a thread in flight.
template <typename T>
__global__ void __launch_bounds__(kSceThreads)
    softmax_ce_fwd_vec_kernel(const T *__restrict__ x, const int32_t *__restrict__ lab, float *__restrict__ row_loss,
                              float *__restrict__ lse_out, int64_t n, int64_t c, float ls) {
  constexpr int V = 16 / sizeof(T);
  __shared__ float sm[kSceThreads / 32];
  __shared__ float2 sm2[kSceThreads / 32];
  const int64_t nv = c / V;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const vec<T, V> *row = reinterpret_cast<const vec<T, V> *>(x + r * c);
    float m = -INFINITY, s = 0.f, sx = 0.f;
    for (int64_t v0 = threadIdx.x; v0 < nv; v0 += (int64_t)kSceThreads * kUnroll) {
      vec<T, V> xv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (v0 + u * kSceThreads < nv) xv[u] = row[v0 + u * kSceThreads];
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (v0 + u * kSceThreads < nv) sce_absorb<T, V>(xv[u], m, s, sx);
    }
    group_online<kSceThreads>(m, s, sm2);
    sx = group_reduce<kSceThreads, false>(sx, sm);
    if (threadIdx.x == 0) {
      const int32_t l = lab[r];
      const bool bad = l < 0 || (int64_t)l >= c;
      const int64_t lc = l < 0 ? 0 : (int64_t)l >= c ? c - 1 : l;
      sce_row_out(m, s, sx, to_f(x[r * c + lc]), bad, c, ls, r, row_loss, lse_out);
    }
  }
}

// The backward, a block per row reading and writing whole vectors; dx may be the logits' memory
// (each thread reads its vectors before it writes them).
template <typename T>
__global__ void __launch_bounds__(kSceThreads)
    softmax_ce_bwd_vec_kernel(const T *x, const int32_t *__restrict__ lab, const float *__restrict__ lse,
                              const float *__restrict__ dloss, T *dx, int64_t n, int64_t c, float ls, float beta) {
  constexpr int V = 16 / sizeof(T);
  const float g = dloss[0] / (float)n, gb = g * (ls / (float)c), gl = g * (1.f - ls);
  const int64_t nv = c / V;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int32_t l = lab[r];
    const bool bad = l < 0 || (int64_t)l >= c;
    const float lr2 = bad ? NAN : lse[r] * kLog2e;
    const int64_t lv = bad ? -1 : (int64_t)l / V;
    const vec<T, V> *xr = reinterpret_cast<const vec<T, V> *>(x + r * c);
    vec<T, V> *dr = reinterpret_cast<vec<T, V> *>(dx + r * c);
    for (int64_t v0 = threadIdx.x; v0 < nv; v0 += (int64_t)kSceThreads * kUnroll) {
      vec<T, V> xv[kUnroll], o[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (v0 + u * kSceThreads < nv) {
          xv[u] = xr[v0 + u * kSceThreads];
          if (beta != 0.f) o[u] = dr[v0 + u * kSceThreads];
        }
#pragma unroll
      for (int u = 0; u < kUnroll; u++) {
        const int64_t v = v0 + u * kSceThreads;
        if (v < nv) dr[v] = sce_grad<T, V>(xv[u], o[u], v, v * V, lv, l, g, lr2, gb, gl, beta);
      }
    }
  }
}

// softmax_ce's forward and backward as one kernel, when the compiler dropped the forward node
// (args.with_forward; core/fuse_grad.c): a block per row copies the row into shared memory with
// asynchronous copies (cp.async: the whole row's loads in flight at once, no registers held),
// takes the online max and sum from there, then writes dlogits from there. The logits are read
// from memory once instead of twice (GPT-2: 1.65 GB of bf16 logits a step). With loads issued a
// few vectors a thread at a time, two blocks an SM kept too few bytes in flight: 2.41 ms against
// the two kernels' 1.85 (H200). Each thread reads back only the vectors it copied (visible to it
// after its wait); the label's logit, read by thread 0, crosses threads after the reductions'
// barriers, and the barrier at the row's end keeps the next row's copies after every read.
// dx may be the logits' memory (the row is in shared memory before any of it is written).
template <typename T>
__global__ void __launch_bounds__(kSceThreads, 2)
    softmax_ce_fused_kernel(const T *x, const int32_t *__restrict__ lab, float *__restrict__ row_loss,
                            float *__restrict__ lse_out, const float *__restrict__ dloss, T *dx, int64_t n, int64_t c,
                            float ls, float beta) {
  constexpr int V = 16 / sizeof(T);
  extern __shared__ uint4 row_smem[];  // c / V vectors: the row
  vec<T, V> *cache = reinterpret_cast<vec<T, V> *>(row_smem);
  __shared__ float sm[kSceThreads / 32];
  __shared__ float2 sm2[kSceThreads / 32];
  const float g = dloss[0] / (float)n, gb = g * (ls / (float)c), gl = g * (1.f - ls);
  const int64_t nv = c / V;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T *xr = x + r * c;
    vec<T, V> *dr = reinterpret_cast<vec<T, V> *>(dx + r * c);
    for (int64_t v = threadIdx.x; v < nv; v += kSceThreads) cp_async16(&cache[v], xr + v * V);
    cp_async_commit();
    cp_async_wait_all();
    float m = -INFINITY, s = 0.f, sx = 0.f;
    for (int64_t v = threadIdx.x; v < nv; v += kSceThreads) {
      const vec<T, V> xv = cache[v];  // one 16-byte shared load (by reference: one per element)
      sce_absorb<T, V>(xv, m, s, sx);
    }
    group_online<kSceThreads>(m, s, sm2);
    sx = group_reduce<kSceThreads, false>(sx, sm);
    const int32_t l = lab[r];
    const bool bad = l < 0 || (int64_t)l >= c;
    if (threadIdx.x == 0) {
      const int64_t lc = l < 0 ? 0 : (int64_t)l >= c ? c - 1 : l;
      sce_row_out(m, s, sx, to_f(reinterpret_cast<const T *>(cache)[lc]), bad, c, ls, r, row_loss, lse_out);
    }
    // lse as sce_row_out rounds it, so the gradient is the backward kernel's bit for bit
    const float lr2 = bad ? NAN : (m + logf(s)) * kLog2e;
    const int64_t lv = bad ? -1 : (int64_t)l / V;
#pragma unroll 4
    for (int64_t v = threadIdx.x; v < nv; v += kSceThreads) {
      const vec<T, V> xv = cache[v];
      vec<T, V> o;
      if (beta != 0.f) o = dr[v];
      dr[v] = sce_grad<T, V>(xv, o, v, v * V, lv, l, g, lr2, gb, gl, beta);
    }
    __syncthreads();
  }
}

// -------------------------------------------------------------- normalize

struct norm_params {
  float mean[STOKE_ATTR_MAX_INTS], std[STOKE_ATTR_MAX_INTS];
  int n_mean, n_std;
};

// y = (x / 255 - mean[c]) / std[c] from u8 HWC memory into y in NCHW or NHWC order, one thread per
// output element (coalesced writes), the CPU's float formula.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    normalize_kernel(const uint8_t *__restrict__ x, T *__restrict__ y, int64_t total, int64_t c, int64_t hw, int nhwc,
                     norm_params prm) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    int64_t k, src;
    if (nhwc) {
      k = i % c;
      src = i;
    } else {
      int64_t t = i / hw, p = i - t * hw, nn = t / c;
      k = t - nn * c;
      src = (nn * hw + p) * c + k;
    }
    float mean = prm.mean[prm.n_mean == 1 ? 0 : k], sd = prm.std[prm.n_std == 1 ? 0 : k];
    y[i] = from_f<T>(((float)x[src] / 255.0f - mean) / sd);
  }
}

// ================================================================ checks

// x -> y of x's shape, both dtype dt (relu, dropout, and the x/y part of bias_add, flatten, gap
// with `same` false). Backward: dx (if wanted) like x, dy like y and present.
stoke_err *unary_check(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd, int run, int n_in,
                       bool same) {
  CHECK(stoke_check_counts(a, op, bwd, n_in, 1));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (same && !stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': x is %s but y is %s", op, stoke_node_name(a), stoke_shape_str(&x->shape).s,
                      stoke_shape_str(&y->shape).s);
  CHECK(stoke_check_dtype(a, op, "x", x, dt));
  CHECK(stoke_check_dtype(a, op, "y", y, dt));
  if (!bwd) {
    CHECK(stoke_check_data(a, op, "x", x, run));
    return stoke_check_data(a, op, "y", y, run);
  }
  CHECK(stoke_check_grad(a, op, "x", &a->din[0], x));
  CHECK(stoke_check_grad(a, op, "y", &a->dout[0], y));
  if (a->din[0].data) CHECK(stoke_check_layout(a, op, "dx", &a->din[0], x));
  CHECK(stoke_check_layout(a, op, "dy", &a->dout[0], x));
  return stoke_check_data(a, op, "dy", &a->dout[0], run);
}

stoke_err *relu_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  CHECK(unary_check(a, STOKE_OP_RELU, dt, bwd, run, 1, true));
  if (bwd && a->din[0].data) CHECK(stoke_check_data(a, STOKE_OP_RELU, "y (the forward output)", &a->out[0], run));
  return NULL;
}

stoke_err *gelu_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  CHECK(unary_check(a, STOKE_OP_GELU, dt, bwd, run, 1, true));
  if (bwd && a->din[0].data) CHECK(stoke_check_data(a, STOKE_OP_GELU, "x (the forward input)", &a->in[0], run));
  return NULL;
}

bool gelu_tanh(const stoke_kernel_args_v1 *a) {
  return a->node && a->node->n_attrs > STOKE_GELU_APPROXIMATE &&
         !strcmp(a->node->attrs[STOKE_GELU_APPROXIMATE].s, "tanh");
}


stoke_err *bias_add_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_BIAS_ADD;
  CHECK(stoke_check_counts(a, op, bwd, 2, 1));
  const stoke_tensor *x = &a->in[0], *b = &a->in[1], *y = &a->out[0];
  if (x->shape.ndim < 2 || b->shape.ndim != 1 || b->shape.d[0] != x->shape.d[1] || !stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "bias_add '%s': expects x[N, C, ...], bias[C] -> y like x; got x %s, bias %s, y %s",
                      stoke_node_name(a), stoke_shape_str(&x->shape).s, stoke_shape_str(&b->shape).s, stoke_shape_str(&y->shape).s);
  CHECK(stoke_check_dtype(a, op, "bias", b, dt));
  CHECK(stoke_check_layout(a, op, "y", y, x));
  if (!bwd) CHECK(stoke_check_data(a, op, "bias", b, run));
  else CHECK(stoke_check_grad(a, op, "bias", &a->din[1], b));
  return unary_check(a, op, dt, bwd, run, 2, true);
}

stoke_err *flatten_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_FLATTEN;
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  const stoke_shape *xs = &a->in[0].shape, *ys = &a->out[0].shape;
  int64_t rest = 1;
  for (int i = 1; i < xs->ndim; i++) rest *= xs->d[i];
  if (xs->ndim < 2 || ys->ndim != 2 || ys->d[0] != xs->d[0] || ys->d[1] != rest)
    return STOKE_PERR(STOKE_E_INVALID, "flatten '%s': expects x[N, ...] -> y[N, prod]; got x %s, y %s", stoke_node_name(a),
                      stoke_shape_str(xs).s, stoke_shape_str(ys).s);
  return unary_check(a, op, dt, bwd, run, 1, false);
}

stoke_err *gap_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_GLOBAL_AVG_POOL;
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  const stoke_shape *xs = &a->in[0].shape, *ys = &a->out[0].shape;
  if (xs->ndim != 4 || xs->d[2] < 1 || xs->d[3] < 1 || ys->ndim != 2 || ys->d[0] != xs->d[0] || ys->d[1] != xs->d[1])
    return STOKE_PERR(STOKE_E_INVALID,
                      "global_avg_pool '%s': expects x[N, C, H, W] (H, W >= 1) -> y[N, C]; got x %s, y %s", stoke_node_name(a),
                      stoke_shape_str(xs).s, stoke_shape_str(ys).s);
  return unary_check(a, op, dt, bwd, run, 1, false);
}

stoke_err *dropout_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, double *p) {
  const char *op = STOKE_OP_DROPOUT;
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  if (!a->node || a->node->n_attrs <= STOKE_DROPOUT_P)
    return STOKE_PERR(STOKE_E_INVALID, "dropout '%s': attribute p missing", stoke_node_name(a));
  *p = a->node->attrs[STOKE_DROPOUT_P].f;
  if (!(*p >= 0 && *p < 1))
    return STOKE_PERR(STOKE_E_INVALID, "dropout '%s': p = %g not in [0, 1)", stoke_node_name(a), *p);
  return unary_check(a, op, dt, bwd, run, 1, true);
}

float softmax_ce_smoothing(const stoke_kernel_args_v1 *a) {
  const stoke_node_v1 *n = a->node;
  return n && n->n_attrs > STOKE_SOFTMAX_CE_LABEL_SMOOTHING ? (float)n->attrs[STOKE_SOFTMAX_CE_LABEL_SMOOTHING].f
                                                            : 0.f;
}

// logits[N, C] in dt, labels[N] i32 -> loss[1] f32 (always: the loss is summed in float and
// the run reads it as f32); backward: dloss f32, dlogits like the logits.
stoke_err *softmax_ce_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_SOFTMAX_CE;
  CHECK(stoke_check_counts(a, op, bwd, 2, 2));
  const stoke_tensor *x = &a->in[0], *lab = &a->in[1], *loss = &a->out[0], *lse = &a->out[1];
  const stoke_shape *xs = &x->shape, *ls = &lab->shape;
  if (xs->ndim != 2 || ls->ndim != 1 || ls->d[0] != xs->d[0] || xs->d[0] < 1 || xs->d[1] < 1 ||
      stoke_numel(&loss->shape) != 1 || lse->shape.ndim != 1 || lse->shape.d[0] != xs->d[0])
    return STOKE_PERR(STOKE_E_INVALID,
                      "softmax_ce '%s': expects logits[N, C] (N, C >= 1), labels[N] -> loss[1], lse[N]; got logits "
                      "%s, labels %s, loss %s, lse %s",
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ls).s, stoke_shape_str(&loss->shape).s, stoke_shape_str(&lse->shape).s);
  CHECK(stoke_check_dtype(a, op, "lse", lse, STOKE_F32));
  CHECK(stoke_check_data(a, op, "lse", lse, run));
  float smooth = softmax_ce_smoothing(a);
  if (!(smooth >= 0 && smooth < 1))
    return STOKE_PERR(STOKE_E_INVALID, "softmax_ce '%s': label_smoothing %g not in [0, 1)", stoke_node_name(a), (double)smooth);
  CHECK(stoke_check_dtype(a, op, "logits", x, dt));
  CHECK(stoke_check_dtype(a, op, "labels", lab, STOKE_I32));
  CHECK(stoke_check_data(a, op, "logits", x, run));
  CHECK(stoke_check_data(a, op, "labels", lab, run));
  if (!bwd) {
    CHECK(stoke_check_dtype(a, op, "loss", loss, STOKE_F32));
    return stoke_check_data(a, op, "loss", loss, run);
  }
  CHECK(stoke_check_grad(a, op, "logits", &a->din[0], x));
  const stoke_tensor *dl = &a->dout[0];
  if (stoke_numel(&dl->shape) != 1)
    return STOKE_PERR(STOKE_E_INVALID, "softmax_ce '%s': dloss is %s, expects 1 element", stoke_node_name(a),
                      stoke_shape_str(&dl->shape).s);
  CHECK(stoke_check_dtype(a, op, "dloss", dl, STOKE_F32));
  return stoke_check_data(a, op, "dloss", dl, run);
}

// The forward's workspace: one f32 loss per row, summed in a fixed order by a second kernel.
size_t softmax_ce_workspace(const stoke_kernel_args_v1 *a) { return (size_t)a->in[0].shape.d[0] * sizeof(float); }

// u8 x[N, C, H, W] (HWC memory, whatever its layout field says, as on the CPU) -> y in f32, bf16
// or f16, in the memory order of the layout attribute.
stoke_err *normalize_check(const stoke_kernel_args_v1 *a, int run, int *nhwc) {
  const char *op = STOKE_OP_NORMALIZE;
  CHECK(stoke_check_counts(a, op, 0, 1, 1));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_NORMALIZE_LAYOUT)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes mean, std and layout missing", op, stoke_node_name(a));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape;
  if (xs->ndim != 4 || !stoke_same_shape(xs, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x[N, C, H, W] -> y of x's shape, got x %s, y %s", op,
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(&y->shape).s);
  CHECK(stoke_check_dtype(a, op, "x", x, STOKE_U8));
  if (y->dtype != STOKE_F32 && y->dtype != STOKE_BF16 && y->dtype != STOKE_F16)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': y %s is %s, the cuda kernel writes f32, bf16 or f16", op, stoke_node_name(a),
                      stoke_shape_str(&y->shape).s, stoke_dtype_name(y->dtype));
  const stoke_attr_v1 *m = &n->attrs[STOKE_NORMALIZE_MEAN], *s = &n->attrs[STOKE_NORMALIZE_STD];
  int64_t c = xs->d[1];
  if ((m->n != 1 && m->n != c) || (s->n != 1 && s->n != c) || m->n < 1 || s->n < 1 ||
      m->n > STOKE_ATTR_MAX_INTS || s->n > STOKE_ATTR_MAX_INTS)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': mean (%d values) and std (%d values) need 1 or %lld values", op,
                      stoke_node_name(a), m->n, s->n, (long long)c);
  for (int i = 0; i < s->n; i++)
    if (!(s->floats[i] > 0))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': std %g must be > 0", op, stoke_node_name(a), s->floats[i]);
  const char *l = n->attrs[STOKE_NORMALIZE_LAYOUT].s;
  if (!strcmp(l, "nhwc"))
    *nhwc = 1;
  else if (!strcmp(l, "nchw"))
    *nhwc = 0;
  else
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': layout '%s' must be nchw or nhwc", op, stoke_node_name(a), l);
  if ((y->layout == STOKE_NHWC && !*nhwc) || (y->layout == STOKE_NCHW && *nhwc))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': layout attribute '%s' but the output is %s", op, stoke_node_name(a), l,
                      y->layout == STOKE_NHWC ? "NHWC" : "NCHW");
  CHECK(stoke_check_data(a, op, "x", x, run));
  return stoke_check_data(a, op, "y", y, run);
}

// ================================================================ kernels

// plan(): the checks without data, no state; workspace only where named.
#define PLAN(name, check, ws)                                                                  \
  template <typename T>                                                                        \
  stoke_err *name##_plan(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes) { \
    if (state) *state = NULL;                                                                  \
    if (workspace_bytes) *workspace_bytes = 0;                                                 \
    stoke_err *e_ = (check);                                                                   \
    if (!e_ && workspace_bytes) *workspace_bytes = (ws);                                       \
    return e_;                                                                                 \
  }

template <typename T> T *dp(const stoke_tensor &t) { return static_cast<T *>(t.data); }

// ------------------------------------------------------------------- relu

PLAN(relu_fwd, relu_check(a, dtype_of<T>::value, 0, 0), 0)
PLAN(relu_bwd, relu_check(a, dtype_of<T>::value, 1, 0), 0)

template <typename T> stoke_err *relu_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(relu_check(a, dtype_of<T>::value, 0, 1));
  return launch_ew<T>(a, dp<T>(a->out[0]), dp<T>(a->in[0]), (const T *)NULL, stoke_numel(&a->in[0].shape), 0.f,
                      op_relu{});
}

// dx = dy * (y > 0), from the forward output (what bwd_needs keeps).
template <typename T> stoke_err *relu_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(relu_check(a, dtype_of<T>::value, 1, 1));
  if (!a->din[0].data) return NULL;
  return launch_ew<T>(a, dp<T>(a->din[0]), dp<T>(a->out[0]), dp<T>(a->dout[0]), stoke_numel(&a->out[0].shape),
                      stoke_grad_beta(a, 0), op_relu_grad{});
}

// ------------------------------------------------------------------- gelu

PLAN(gelu_fwd, gelu_check(a, dtype_of<T>::value, 0, 0), 0)
PLAN(gelu_bwd, gelu_check(a, dtype_of<T>::value, 1, 0), 0)

template <typename T> stoke_err *gelu_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(gelu_check(a, dtype_of<T>::value, 0, 1));
  return launch_ew<T>(a, dp<T>(a->out[0]), dp<T>(a->in[0]), (const T *)NULL, stoke_numel(&a->in[0].shape), 0.f,
                      op_gelu{gelu_tanh(a)});
}

// dx = dy * gelu'(x), from the forward input (what bwd_needs keeps).
template <typename T> stoke_err *gelu_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(gelu_check(a, dtype_of<T>::value, 1, 1));
  if (!a->din[0].data) return NULL;
  return launch_ew<T>(a, dp<T>(a->din[0]), dp<T>(a->in[0]), dp<T>(a->dout[0]), stoke_numel(&a->in[0].shape),
                      stoke_grad_beta(a, 0), op_gelu_grad{gelu_tanh(a)});
}

// -------------------------------------------------------------------- add

PLAN(add_fwd, stoke_check_add(a, dtype_of<T>::value, 0, 0), 0)
PLAN(add_bwd, stoke_check_add(a, dtype_of<T>::value, 1, 0), 0)

template <typename T> stoke_err *add_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(stoke_check_add(a, dtype_of<T>::value, 0, 1));
  return launch_ew<T>(a, dp<T>(a->out[0]), dp<T>(a->in[0]), dp<T>(a->in[1]), stoke_numel(&a->in[0].shape), 0.f,
                      op_add{});
}

// da = dout, db = dout (each only if asked for).
template <typename T> stoke_err *add_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(stoke_check_add(a, dtype_of<T>::value, 1, 1));
  int64_t n = stoke_numel(&a->out[0].shape);
  for (int k = 0; k < 2; k++)
    if (a->din[k].data)
      CHECK(launch_ew<T>(a, dp<T>(a->din[k]), dp<T>(a->dout[0]), (const T *)NULL, n, stoke_grad_beta(a, k), op_copy{}));
  return NULL;
}

// --------------------------------------------------------------- bias_add

// x[N, C, rest...]: rest = the product of the dims after C.
int64_t rest_of(const stoke_shape *s) {
  int64_t r = 1;
  for (int k = 2; k < s->ndim; k++) r *= s->d[k];
  return r;
}

// Backward needs N*C f32 of workspace for the per-(sample, channel) partial sums of dbias.
PLAN(bias_add_fwd, bias_add_check(a, dtype_of<T>::value, 0, 0), 0)
PLAN(bias_add_bwd, bias_add_check(a, dtype_of<T>::value, 1, 0),
     rest_of(&a->in[0].shape) > 1 ? (size_t)(a->in[0].shape.d[0] * a->in[0].shape.d[1]) * sizeof(float) : 0)

template <typename T> stoke_err *bias_add_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(bias_add_check(a, dtype_of<T>::value, 0, 1));
  const stoke_shape *s = &a->in[0].shape;
  op_bias_add<T> op{dp<T>(a->in[1]), s->d[1], rest_of(s), stoke_is_nhwc(&a->in[0])};
  return launch_ew<T>(a, dp<T>(a->out[0]), dp<T>(a->in[0]), (const T *)NULL, stoke_numel(s), 0.f, op);
}

// dx = dy; dbias = beta dbias + sum over N and the spatial dims of dy, in two deterministic
// passes: per (sample, channel) sums into the workspace, then per channel over the samples.
template <typename T> stoke_err *bias_add_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(bias_add_check(a, dtype_of<T>::value, 1, 1));
  const stoke_shape *s = &a->in[0].shape;
  const T *dy = dp<T>(a->dout[0]);
  if (a->din[0].data)
    CHECK(launch_ew<T>(a, dp<T>(a->din[0]), dy, (const T *)NULL, stoke_numel(s), stoke_grad_beta(a, 0), op_copy{}));
  T *db = dp<T>(a->din[1]);
  if (!db) return NULL;
  int64_t n = s->d[0], c = s->d[1], rest = rest_of(s);
  float beta = stoke_grad_beta(a, 1);
  if (rest == 1 || n == 0 || c == 0) return launch_col_sum<T, T>(a, dy, db, 1, n * rest, c, 1.f, beta);
  size_t need = (size_t)(n * c) * sizeof(float);
  if (!a->workspace || a->workspace_bytes < need)
    return STOKE_PERR(STOKE_E_INVALID, "bias_add '%s': backward needs %zu bytes of workspace (plan), got %zu",
                      stoke_node_name(a), need, a->workspace_bytes);
  float *part = static_cast<float *>(a->workspace);
  if (stoke_is_nhwc(&a->in[0])) CHECK(launch_col_sum<T, float>(a, dy, part, n, rest, c, 1.f, 0.f));
  else CHECK(launch_row_sum<T, float>(a, dy, part, n * c, rest, 1.f, 0.f));
  return launch_col_sum<float, T>(a, part, db, 1, n, c, 1.f, beta);
}

// ---------------------------------------------------------------- flatten

PLAN(flatten_fwd, flatten_check(a, dtype_of<T>::value, 0, 0), 0)
PLAN(flatten_bwd, flatten_check(a, dtype_of<T>::value, 1, 0), 0)

// y[n, (c, h, w)] = x[n, c, h, w] in logical order, whatever x's memory.
template <typename T> stoke_err *flatten_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(flatten_check(a, dtype_of<T>::value, 0, 1));
  const stoke_shape *s = &a->in[0].shape;
  int64_t n = stoke_numel(s);
  if (stoke_is_nhwc(&a->in[0]))
    return launch_ew<T>(a, dp<T>(a->out[0]), (const T *)NULL, (const T *)NULL, n, 0.f,
                        op_nchw_from_nhwc<T>{dp<T>(a->in[0]), s->d[1], s->d[2] * s->d[3]});
  if (n > 0)
    STOKE_CUDA(cudaMemcpyAsync(a->out[0].data, a->in[0].data, (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice,
                               stream_of(a)));
  return NULL;
}

template <typename T> stoke_err *flatten_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(flatten_check(a, dtype_of<T>::value, 1, 1));
  if (!a->din[0].data) return NULL;
  const stoke_shape *s = &a->in[0].shape;
  int64_t n = stoke_numel(s);
  float beta = stoke_grad_beta(a, 0);
  if (stoke_is_nhwc(&a->in[0]))
    return launch_ew<T>(a, dp<T>(a->din[0]), (const T *)NULL, (const T *)NULL, n, beta,
                        op_nhwc_from_nchw<T>{dp<T>(a->dout[0]), s->d[1], s->d[2] * s->d[3]});
  if (beta != 0.f) return launch_ew<T>(a, dp<T>(a->din[0]), dp<T>(a->dout[0]), (const T *)NULL, n, beta, op_copy{});
  if (n > 0)
    STOKE_CUDA(cudaMemcpyAsync(a->din[0].data, a->dout[0].data, (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice,
                               stream_of(a)));
  return NULL;
}

// -------------------------------------------------------- global_avg_pool

// NHWC with C a multiple of V (16-byte vectors) and the tensors 16-byte aligned: a thread per
// vector of channels. The forward sums its column down the H W rows of a sample in order; the
// backward writes one vector of dx from one of dy. 32-bit indices (gap_nhwc_vec_ok checks the
// sizes). The generic kernels (col_sum_kernel, ew_kernel with op_gap_grad) read 2 bytes a thread
// and divide in 64 bits per element: 0.04 and 0.08 ms for ResNet-50's last 51 MB, three to six
// times the bytes' time.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    gap_fwd_nhwc_v(const T *__restrict__ x, T *__restrict__ y, int32_t hw, int32_t cv, float inv) {
  const int32_t n = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cv) return;
  const vec<T, V> *src = reinterpret_cast<const vec<T, V> *>(x) + (int64_t)n * hw * cv + j;
  float s[V];
#pragma unroll
  for (int k = 0; k < V; k++) s[k] = 0.f;
#pragma unroll 7
  for (int32_t r = 0; r < hw; r++) {
    const vec<T, V> v = src[(int64_t)r * cv];
#pragma unroll
    for (int k = 0; k < V; k++) s[k] += to_f(v.v[k]);
  }
  vec<T, V> o;
#pragma unroll
  for (int k = 0; k < V; k++) o.v[k] = from_f<T>(s[k] * inv);
  reinterpret_cast<vec<T, V> *>(y)[(int64_t)n * cv + j] = o;
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    gap_bwd_nhwc_v(const T *__restrict__ dy, T *dx, int32_t hw, int32_t cv, float inv, float beta) {
  const int32_t n = blockIdx.y, per = hw * cv;
  for (int32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < per; j += gridDim.x * blockDim.x) {
    const vec<T, V> g = reinterpret_cast<const vec<T, V> *>(dy)[(int64_t)n * cv + j % cv];
    vec<T, V> *d = reinterpret_cast<vec<T, V> *>(dx) + (int64_t)n * per + j;
    vec<T, V> o;
    if (beta != 0.f) o = *d;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float v = to_f(g.v[k]) * inv;
      o.v[k] = from_f<T>(beta != 0.f ? v + beta * to_f(o.v[k]) : v);
    }
    *d = o;
  }
}

// The vector kernels serve an NHWC call: C a multiple of V, the two tensors 16-byte aligned, a
// sample's vectors and the batch within a grid's y (65535).
template <typename T>
bool gap_nhwc_vec_ok(const stoke_kernel_args_v1 *a, const void *big, const void *small) {
  constexpr int V = 16 / sizeof(T);
  const stoke_shape *s = &a->in[0].shape;
  return stoke_is_nhwc(&a->in[0]) && s->d[1] % V == 0 && s->d[0] <= kMaxGrid &&
         s->d[1] * s->d[2] * s->d[3] < INT32_MAX && all_aligned16({big, small});
}

PLAN(gap_fwd, gap_check(a, dtype_of<T>::value, 0, 0), 0)
PLAN(gap_bwd, gap_check(a, dtype_of<T>::value, 1, 0), 0)

// y[n, c] = mean over H W: a row sum per (n, c) for NCHW, column sums per sample for NHWC.
template <typename T> stoke_err *gap_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(gap_check(a, dtype_of<T>::value, 0, 1));
  const stoke_shape *s = &a->in[0].shape;
  int64_t n = s->d[0], c = s->d[1], hw = s->d[2] * s->d[3];
  float inv = 1.f / (float)hw;
  if (n > 0 && gap_nhwc_vec_ok<T>(a, a->in[0].data, a->out[0].data)) {
    constexpr int V = 16 / sizeof(T);
    const int32_t cv = (int32_t)(c / V);
    gap_fwd_nhwc_v<T, V><<<dim3(grid_for(cv, kThreads, kMaxGrid), (unsigned)n), kThreads, 0, stream_of(a)>>>(
        dp<T>(a->in[0]), dp<T>(a->out[0]), (int32_t)hw, cv, inv);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
    return NULL;
  }
  if (stoke_is_nhwc(&a->in[0])) return launch_col_sum<T, T>(a, dp<T>(a->in[0]), dp<T>(a->out[0]), n, hw, c, inv, 0.f);
  return launch_row_sum<T, T>(a, dp<T>(a->in[0]), dp<T>(a->out[0]), n * c, hw, inv, 0.f);
}

// dx[n, c, h, w] = dy[n, c] / (H W); reads only shapes of the forward.
template <typename T> stoke_err *gap_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(gap_check(a, dtype_of<T>::value, 1, 1));
  if (!a->din[0].data) return NULL;
  const stoke_shape *s = &a->in[0].shape;
  int64_t hw = s->d[2] * s->d[3];
  if (s->d[0] > 0 && gap_nhwc_vec_ok<T>(a, a->din[0].data, a->dout[0].data)) {
    constexpr int V = 16 / sizeof(T);
    const int32_t cv = (int32_t)(s->d[1] / V), per = (int32_t)(hw * cv);
    gap_bwd_nhwc_v<T, V><<<dim3(grid_for(per, kThreads, 64), (unsigned)s->d[0]), kThreads, 0, stream_of(a)>>>(
        dp<T>(a->dout[0]), dp<T>(a->din[0]), (int32_t)hw, cv, 1.f / (float)hw, stoke_grad_beta(a, 0));
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
    return NULL;
  }
  op_gap_grad<T> op{dp<T>(a->dout[0]), s->d[1], hw, stoke_is_nhwc(&a->in[0]), 1.f / (float)hw};
  return launch_ew<T>(a, dp<T>(a->din[0]), (const T *)NULL, (const T *)NULL, stoke_numel(s), stoke_grad_beta(a, 0), op);
}

// ------------------------------------------------------------- softmax_ce

PLAN(softmax_ce_fwd, softmax_ce_check(a, dtype_of<T>::value, 0, 0), softmax_ce_workspace(a))

// Rows of up to 512 classes take a warp each (8 rows a block), longer rows a block each.
constexpr int64_t kWarpRowMax = 512;

// Longer rows of whole 16-byte vectors, 16-byte aligned, take the vector kernels.
template <typename T> bool softmax_ce_vec(int64_t c, const void *x, const void *dx) {
  return c % (16 / (int64_t)sizeof(T)) == 0 && aligned16(x) && aligned16(dx);
}

// The one-kernel forward and backward (softmax_ce_fused_kernel) takes rows of whole vectors longer
// than a warp's rows whose bytes fit the shared memory a block may opt into (227 KB on an H100:
// 113,000 bf16 classes, 56,000 f32), with the kernel's own 192 bytes of reductions beside them.
template <typename T> bool softmax_ce_fused_fits(int64_t c) {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return c > kWarpRowMax && c % (16 / (int64_t)sizeof(T)) == 0 && c * (int64_t)sizeof(T) + 256 <= optin;
}

// The backward's node state when its plan chose the one-kernel forward and backward
// (softmax_ce_fused_kernel), so run() asks the device nothing: a tag, nothing to free. No state
// (run() without plan, or rows that do not fit): the two kernels in turn.
static int sce_one_kernel_tag;

// The backward; with with_forward also the forward's workspace (the rows' losses), and the fused
// kernel allowed the row's shared memory (once per plan, outside any graph capture).
template <typename T> stoke_err *softmax_ce_bwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(softmax_ce_check(a, dtype_of<T>::value, 1, 0));
  if (!a->with_forward) return NULL;
  CHECK(softmax_ce_check(a, dtype_of<T>::value, 0, 0));
  if (ws) *ws = softmax_ce_workspace(a);
  int64_t c = a->in[0].shape.d[1];
  if (!softmax_ce_fused_fits<T>(c) || !state) return NULL;
  STOKE_CUDA(cudaFuncSetAttribute(softmax_ce_fused_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)(c * (int64_t)sizeof(T))));
  *state = &sce_one_kernel_tag;
  return NULL;
}

// The rows' losses: in the workspace the plan asked for.
static stoke_err *sce_row_losses(const stoke_kernel_args_v1 *a, float **row_loss) {
  size_t need = softmax_ce_workspace(a);
  if (!a->workspace || a->workspace_bytes < need)
    return STOKE_PERR(STOKE_E_INVALID, "softmax_ce '%s': needs %zu bytes of workspace (plan), got %zu", stoke_node_name(a),
                      need, a->workspace_bytes);
  *row_loss = static_cast<float *>(a->workspace);
  return NULL;
}

// loss = the mean of the rows' losses (one block: the same order every call).
static stoke_err *sce_loss_mean(const stoke_kernel_args_v1 *a, const float *row_loss) {
  loss_mean_kernel<<<1, kThreads, 0, stream_of(a)>>>(row_loss, static_cast<float *>(a->out[0].data), a->in[0].shape.d[0]);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

template <typename T> stoke_err *softmax_ce_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(softmax_ce_check(a, dtype_of<T>::value, 0, 1));
  int64_t n = a->in[0].shape.d[0], c = a->in[0].shape.d[1];
  float *row_loss, *lse = static_cast<float *>(a->out[1].data);
  CHECK(sce_row_losses(a, &row_loss));
  const T *x = dp<T>(a->in[0]);
  const int32_t *lab = static_cast<const int32_t *>(a->in[1].data);
  float ls = softmax_ce_smoothing(a);
  if (c > kWarpRowMax && softmax_ce_vec<T>(c, x, x))
    softmax_ce_fwd_vec_kernel<T>
        <<<grid_for(n, 1, kMaxGrid), kSceThreads, 0, stream_of(a)>>>(x, lab, row_loss, lse, n, c, ls);
  else if (c <= kWarpRowMax)
    softmax_ce_fwd_kernel<T, 32>
        <<<grid_for(n, kThreads / 32, kMaxGrid), kThreads, 0, stream_of(a)>>>(x, lab, row_loss, lse, n, c, ls);
  else
    softmax_ce_fwd_kernel<T, kThreads>
        <<<grid_for(n, 1, kMaxGrid), kThreads, 0, stream_of(a)>>>(x, lab, row_loss, lse, n, c, ls);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return sce_loss_mean(a, row_loss);
}

// The forward and the backward at once (with_forward) in one kernel: rows that fit shared memory,
// whole vectors, dx wanted (softmax_ce_bwd runs the two kernels in turn otherwise).
template <typename T> stoke_err *softmax_ce_fwd_bwd(const stoke_kernel_args_v1 *a) {
  CHECK(softmax_ce_check(a, dtype_of<T>::value, 0, 1));
  T *dx = dp<T>(a->din[0]);
  int64_t n = a->in[0].shape.d[0], c = a->in[0].shape.d[1];
  const T *x = dp<T>(a->in[0]);
  float *row_loss, *lse = static_cast<float *>(a->out[1].data);
  CHECK(sce_row_losses(a, &row_loss));
  const int32_t *lab = static_cast<const int32_t *>(a->in[1].data);
  const float *dloss = static_cast<const float *>(a->dout[0].data);
  softmax_ce_fused_kernel<T>
      <<<grid_for(n, 1, kMaxGrid), kSceThreads, (size_t)c * sizeof(T), stream_of(a)>>>(
          x, lab, row_loss, lse, dloss, dx, n, c, softmax_ce_smoothing(a), stoke_grad_beta(a, 0));
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return sce_loss_mean(a, row_loss);
}

// Vector rows: a block per row; others a 2-D grid, columns in blocks of kThreads (x), rows (y):
// coalesced whatever C is. With with_forward, the forward first: in one kernel when the plan chose
// it (state), else the forward kernel.
template <typename T> stoke_err *softmax_ce_bwd(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(softmax_ce_check(a, dtype_of<T>::value, 1, 1));
  if (a->with_forward) {
    T *dxw = dp<T>(a->din[0]);
    if (dxw && state == &sce_one_kernel_tag && softmax_ce_vec<T>(a->in[0].shape.d[1], a->in[0].data, dxw))
      return softmax_ce_fwd_bwd<T>(a);
    CHECK(softmax_ce_fwd<T>(a, NULL));
  }
  T *dx = dp<T>(a->din[0]);
  if (!dx) return NULL;
  int64_t n = a->in[0].shape.d[0], c = a->in[0].shape.d[1];
  const T *x = dp<T>(a->in[0]);
  const int32_t *lab = static_cast<const int32_t *>(a->in[1].data);
  const float *dloss = static_cast<const float *>(a->dout[0].data), *lse = static_cast<const float *>(a->out[1].data);
  float ls = softmax_ce_smoothing(a), beta = stoke_grad_beta(a, 0);
  if (c > kWarpRowMax && softmax_ce_vec<T>(c, x, dx)) {
    softmax_ce_bwd_vec_kernel<T>
        <<<grid_for(n, 1, kMaxGrid), kSceThreads, 0, stream_of(a)>>>(x, lab, lse, dloss, dx, n, c, ls, beta);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
    return NULL;
  }
  dim3 grid(grid_for(c, kThreads, 1024), (unsigned)(n < kMaxGrid ? n : kMaxGrid));
  softmax_ce_bwd_kernel<T><<<grid, kThreads, 0, stream_of(a)>>>(x, lab, lse, dloss, dx, n, c, ls, beta);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

// ---------------------------------------------------------------- dropout

template <typename T> stoke_err *dropout_fwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  double p;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  return dropout_check(a, dtype_of<T>::value, 0, 0, &p);
}

template <typename T> stoke_err *dropout_bwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  double p;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  return dropout_check(a, dtype_of<T>::value, 1, 0, &p);
}

// y = x * keep / (1 - p) in training, keep(i) = stoke_uniform_at(seed, i) >= p as on the CPU;
// y = x in eval or for p = 0.
template <typename T> stoke_err *dropout_fwd(const stoke_kernel_args_v1 *a, void *) {
  double p;
  CHECK(dropout_check(a, dtype_of<T>::value, 0, 1, &p));
  int64_t n = stoke_numel(&a->in[0].shape);
  if (!a->training || p == 0) {
    if (n > 0 && a->out[0].data != a->in[0].data)
      STOKE_CUDA(cudaMemcpyAsync(a->out[0].data, a->in[0].data, (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice,
                                 stream_of(a)));
    return NULL;
  }
  op_dropout op{a->seed, keep_threshold(p), (float)(1.0 / (1.0 - p))};
  return launch_ew<T>(a, dp<T>(a->out[0]), dp<T>(a->in[0]), (const T *)NULL, n, 0.f, op);
}

// dx = dy * keep / (1 - p), the mask regenerated from the same seed.
template <typename T> stoke_err *dropout_bwd(const stoke_kernel_args_v1 *a, void *) {
  double p;
  CHECK(dropout_check(a, dtype_of<T>::value, 1, 1, &p));
  if (!a->din[0].data) return NULL;
  int64_t n = stoke_numel(&a->in[0].shape);
  float beta = stoke_grad_beta(a, 0);
  if (!a->training || p == 0)
    return launch_ew<T>(a, dp<T>(a->din[0]), dp<T>(a->dout[0]), (const T *)NULL, n, beta, op_copy{});
  op_dropout op{a->seed, keep_threshold(p), (float)(1.0 / (1.0 - p))};
  return launch_ew<T>(a, dp<T>(a->din[0]), dp<T>(a->dout[0]), (const T *)NULL, n, beta, op);
}

// -------------------------------------------------------------- normalize

stoke_err *normalize_fwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  int nhwc;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  return normalize_check(a, 0, &nhwc);
}

template <typename T> stoke_err *normalize_launch(const stoke_kernel_args_v1 *a, int nhwc, const norm_params &prm) {
  const int64_t *d = a->in[0].shape.d;
  int64_t total = stoke_numel(&a->in[0].shape);
  if (total <= 0) return NULL;
  normalize_kernel<T><<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, stream_of(a)>>>(
      static_cast<const uint8_t *>(a->in[0].data), dp<T>(a->out[0]), total, d[1], d[2] * d[3], nhwc, prm);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

// Registered for the input dtype (u8); writes out[0] in its own dtype (f32, bf16 or f16).
stoke_err *normalize_fwd(const stoke_kernel_args_v1 *a, void *) {
  int nhwc;
  CHECK(normalize_check(a, 1, &nhwc));
  const stoke_attr_v1 *m = &a->node->attrs[STOKE_NORMALIZE_MEAN], *sd = &a->node->attrs[STOKE_NORMALIZE_STD];
  norm_params prm;
  memset(&prm, 0, sizeof prm);
  prm.n_mean = m->n;
  prm.n_std = sd->n;
  for (int i = 0; i < m->n; i++) prm.mean[i] = (float)m->floats[i];
  for (int i = 0; i < sd->n; i++) prm.std[i] = (float)sd->floats[i];
  switch (a->out[0].dtype) {
    case STOKE_BF16: return normalize_launch<__nv_bfloat16>(a, nhwc, prm);
    case STOKE_F16: return normalize_launch<__half>(a, nhwc, prm);
    default: return normalize_launch<float>(a, nhwc, prm);
  }
}

// ================================================================ the table

#define KERNEL(op, pass, fn, T) \
  {"cuda", op, pass, dtype_of<T>::value, STOKE_LAYOUT_ANY, fn##_plan<T>, fn<T>, stoke_destroy_none}
#define KERNELS(T)                                                    \
  KERNEL(STOKE_OP_RELU, STOKE_FWD, relu_fwd, T),                      \
      KERNEL(STOKE_OP_RELU, STOKE_BWD, relu_bwd, T),                  \
      KERNEL(STOKE_OP_GELU, STOKE_FWD, gelu_fwd, T),                  \
      KERNEL(STOKE_OP_GELU, STOKE_BWD, gelu_bwd, T),                  \
      KERNEL(STOKE_OP_ADD, STOKE_FWD, add_fwd, T),                    \
      KERNEL(STOKE_OP_ADD, STOKE_BWD, add_bwd, T),                    \
      KERNEL(STOKE_OP_BIAS_ADD, STOKE_FWD, bias_add_fwd, T),          \
      KERNEL(STOKE_OP_BIAS_ADD, STOKE_BWD, bias_add_bwd, T),          \
      KERNEL(STOKE_OP_FLATTEN, STOKE_FWD, flatten_fwd, T),            \
      KERNEL(STOKE_OP_FLATTEN, STOKE_BWD, flatten_bwd, T),            \
      KERNEL(STOKE_OP_GLOBAL_AVG_POOL, STOKE_FWD, gap_fwd, T),        \
      KERNEL(STOKE_OP_GLOBAL_AVG_POOL, STOKE_BWD, gap_bwd, T),        \
      KERNEL(STOKE_OP_SOFTMAX_CE, STOKE_FWD, softmax_ce_fwd, T),      \
      {"cuda", STOKE_OP_SOFTMAX_CE, STOKE_BWD, dtype_of<T>::value, STOKE_LAYOUT_ANY, softmax_ce_bwd_plan<T>, \
       softmax_ce_bwd<T>, stoke_destroy_none, 0, STOKE_KCAP_WITH_FORWARD}, \
      KERNEL(STOKE_OP_DROPOUT, STOKE_FWD, dropout_fwd, T),            \
      KERNEL(STOKE_OP_DROPOUT, STOKE_BWD, dropout_bwd, T)

const stoke_kernel_v1 elementwise_kernels[] = {
    KERNELS(float),
    KERNELS(__nv_bfloat16),
    KERNELS(__half),
    {"cuda", STOKE_OP_NORMALIZE, STOKE_FWD, STOKE_U8, STOKE_LAYOUT_ANY, normalize_fwd_plan, normalize_fwd,
     stoke_destroy_none},
};

#undef KERNELS
#undef KERNEL
#undef PLAN
#undef CHECK

}  // namespace

extern "C" stoke_err *stoke_cuda_register_elementwise(const stoke_registry_v1 *r) {
  // The device copy of the dropout hash must agree with stoke/rng.h (see uniform_bits53).
  static const uint64_t probe_seed[] = {0, 1, 0x123456789abcdefull, ~0ull};
  for (uint64_t s : probe_seed)
    for (uint64_t i = 0; i < 64; i += 7)
      if ((double)uniform_bits53(s, i) * (1.0 / 9007199254740992.0) != stoke_uniform_at(s, i))
        return STOKE_PERR(STOKE_E_INTERNAL,
                          "backends/cuda/elementwise.cu: the device copy of stoke_uniform_at differs from "
                          "stoke/rng.h; update uniform_bits53 to match (dropout masks would differ from the CPU's)");
  for (const stoke_kernel_v1 &k : elementwise_kernels)
    STOKE_PTRY(r->add_kernel(r->self, &k), "registering cuda kernel %s %s (%s)", k.op,
               k.pass == STOKE_FWD ? "forward" : "backward", stoke_dtype_name(k.dtype));
  return NULL;
}
