// backends/cuda/layer_norm.cu: the cuda backend's layer_norm, add_layer_norm (s = x + r rounded
// to the dtype, then normalized) and add_bias_layer_norm (s = x + r + c), forward and backward, f32,
// bf16 and fp16; see stoke/ops.h. add_bias_layer_norm's dc, the column sums of the gradient written
// to x and r, is summed in the same pass as dweight and dbias.
// Rows in whole 16-byte vectors take the register path, up to 256 vectors a row in the forward (2048
// 16-bit columns, 1024 f32) and 48 floats a lane in the backward (1536 16-bit columns, 1024 f32): a
// warp per row held in registers, one read of each input and one write of each output, and the
// backward's weight and bias gradients summed in the same pass (per block, then the blocks in order),
// as llm.c's fused layernorm backward does. Other rows take the plain warp-per-row kernels. Arithmetic in float,
// reductions in a fixed order (no float atomics: the same bits on every run), the CPU reference's
// semantics (backends/cpu/seq.c).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>
#include <initializer_list>
#include <type_traits>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "backends/cuda/ew.cuh"
#include "stoke/ops.h"

namespace {

constexpr int64_t kGrid = 65535;
constexpr int kWarps = kThreads / 32; // rows a block works on at once
constexpr int kLnParts = 64;          // plain path: row partitions of the weight and bias gradients
constexpr int kVecMaxVecs = 256;      // register path: the widest row, in 16-byte vectors (8 slots a lane)
constexpr int kVecMaxBwdC = 1536;     // register path, backward: the widest row (48 floats a lane: GPT-2 large's 1280)
constexpr int kVecParts = 512;        // register path: most blocks of the backward, each one partial
constexpr int kBwdWarps = 4;          // register path, backward: rows a block works on at once
constexpr int kMaxDevices = 64;       // devices whose resident block counts are remembered
constexpr int kParts = kVecParts > kLnParts ? kVecParts : kLnParts; // partial sums the workspace holds

template <typename T> T *dp(const stoke_tensor &t) { return static_cast<T *>(t.data); }

// N elements at p in one load (one store): 16 bytes when N is 16 / sizeof(T) (ld, st: the register path).
template <typename T, int N> __device__ __forceinline__ vec<T, N> ldn(const T *p) {
  return *reinterpret_cast<const vec<T, N> *>(p);
}
template <typename T, int N> __device__ __forceinline__ void stn(T *p, const vec<T, N> &v) {
  *reinterpret_cast<vec<T, N> *>(p) = v;
}
template <typename T> __device__ __forceinline__ row_vec<T> ld(const T *p) { return ldn<T, 16 / sizeof(T)>(p); }
template <typename T> __device__ __forceinline__ void st(T *p, const row_vec<T> &v) { stn<T, 16 / sizeof(T)>(p, v); }

// ------------------------------------------------------ register path

// One warp per row: lane l holds the row's vectors l, l + 32, ... (IT slots; those past C unused).
// s = a + b rounded to T (add_layer_norm) or a, its mean and biased variance in float (two passes
// over the registers), y = (s - mean) rstd w + bias.
template <typename T, int IT>
__global__ void __launch_bounds__(kThreads)
    ln_fwd_vec_kernel(const T *__restrict__ a, const T *__restrict__ b, const T *__restrict__ cb,
                      T *__restrict__ s_out, const T *__restrict__ w, const T *__restrict__ bias, T *__restrict__ y,
                      float *__restrict__ mean, float *__restrict__ rstd, int64_t rows, int c, float eps) {
  constexpr int V = 16 / sizeof(T);
  const int lane = threadIdx.x % 32;
  for (int64_t r = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; r < rows; r += (int64_t)gridDim.x * kWarps) {
    float v[IT][V] = {};
    float sum = 0.f;
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int j = (it * 32 + lane) * V;
      if (j >= c) continue;
      row_vec<T> x = ld(a + r * c + j);
      if (b) {
        const row_vec<T> xb = ld(b + r * c + j);
        if (cb) {
          const row_vec<T> xc = ld(cb + j);
#pragma unroll
          for (int k = 0; k < V; k++) x.v[k] = from_f<T>(to_f(x.v[k]) + to_f(xb.v[k]) + to_f(xc.v[k]));
        } else {
#pragma unroll
          for (int k = 0; k < V; k++) x.v[k] = from_f<T>(to_f(x.v[k]) + to_f(xb.v[k]));
        }
        st(s_out + r * c + j, x);
      }
#pragma unroll
      for (int k = 0; k < V; k++) v[it][k] = to_f(x.v[k]), sum += v[it][k];
    }
    const float m = warp_sum(sum) / (float)c;
    float q = 0.f;
#pragma unroll
    for (int it = 0; it < IT; it++)
      if ((it * 32 + lane) * V < c)
#pragma unroll
        for (int k = 0; k < V; k++) q += (v[it][k] - m) * (v[it][k] - m);
    const float rs = rsqrtf(warp_sum(q) / (float)c + eps);
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int j = (it * 32 + lane) * V;
      if (j >= c) continue;
      const row_vec<T> wv = ld(w + j), bv = ld(bias + j);
      row_vec<T> o;
#pragma unroll
      for (int k = 0; k < V; k++) o.v[k] = from_f<T>((v[it][k] - m) * rs * to_f(wv.v[k]) + to_f(bv.v[k]));
      st(y + r * c + j, o);
    }
    if (lane == 0) mean[r] = m, rstd[r] = rs;
  }
}

// Backward, a warp per row as above: dx = rstd (gy - mean(gy) - xhat mean(gy xhat)) (+ ds),
// gy = dy w, into dx (and dx2: add_layer_norm's second input, when it has its own memory); in the
// same pass each lane sums dy xhat and dy (and with DC, add_bias_layer_norm, dx's value itself)
// over its warp's rows into the warp's slice of shared memory (lane-major, so the 32 lanes hit 32
// banks), and the block adds its kBwdWarps slices in order into part[block] (and part3[block])
// when part is given; ln_part_sum_kernel adds the blocks. The sums live in shared memory, not
// registers: in registers (48 floats a lane at 768 bf16 columns) the kernel took 170 registers and
// one 256-thread block an SM, 2.4x its bytes floor (BENCHMARKS.md run 9); here 128-thread blocks at
// <= 128 registers run 4 to an SM. A warp's next row (x, dy, then ds) is copied into its own
// shared memory (cp.async) while it works on the current one, so a warp has a row in flight
// without registers for it: with the loads issued only at each row's start the kernel moved 2.4
// TB/s (ncu: DRAM 50%, BENCHMARKS.md run 20). Each lane copies and reads back only its own
// slots. The shared memory is dynamic (ln_bwd_vec_smem), over 48 KiB with DC or past 768 columns.
// dx may share memory with x, dy or ds: each element is read before it is written, by the same
// thread; the rows in flight are other rows.
template <int IT, int V> __host__ __device__ constexpr int ln_slots() {
  return IT * V < kVecMaxBwdC / 32 ? IT * V : kVecMaxBwdC / 32;
}
// The block's shared memory: the warps' column sums, then their staged rows (x, dy, ds).
template <typename T, int IT, bool DC> __host__ __device__ constexpr size_t ln_bwd_vec_acc_bytes() {
  return (size_t)kBwdWarps * ln_slots<IT, 16 / sizeof(T)>() * 32 * (sizeof(float2) + (DC ? sizeof(float) : 0));
}
template <typename T, int IT, bool DC> __host__ __device__ constexpr size_t ln_bwd_vec_smem() {
  return ln_bwd_vec_acc_bytes<T, IT, DC>() + (size_t)kBwdWarps * 3 * IT * 32 * 16;
}

// One element of the layer norm's input gradient, rstd (gy - mean(gy) - xhat mean(gy xhat)), ds
// not included: every kernel that writes dx or sums it (the plain path's dc) computes it so.
__device__ __forceinline__ float ln_dx(float rs, float gy, float mg, float xh, float mgx) {
  return rs * (gy - mg - xh * mgx);
}

// Blocks an SM the backward is compiled for (registers a thread: 65536 / (128 x this)): 4 up to 3
// slots a lane (768 bf16 columns, 128 registers); with 4 and more slots 3 (168 registers), where at
// 128 the compiler spilled (108-112 bytes of stores, 316-416 of loads at 1024 bf16 columns) and the
// kernel moved 1 TB/s; the shared memory allows 3 such blocks an SM with dc's sums anyway. Past 32
// floats a lane 2 (the 16-bit types' 1032-1536 columns: 110.6 KB of shared memory a block with dc's
// sums, 2 blocks an SM).
template <int IT, int V> constexpr int ln_bwd_min_blocks() { return IT * V > 32 ? 2 : IT >= 4 ? 3 : 4; }

template <typename T, int IT, bool DC>
__global__ void __launch_bounds__(kBwdWarps * 32, ln_bwd_min_blocks<IT, 16 / sizeof(T)>())
    ln_bwd_vec_kernel(const T *x, const T *__restrict__ w, const T *dy, const T *ds, const float *__restrict__ mean,
                      const float *__restrict__ rstd, T *dx, T *dx2, float2 *__restrict__ part,
                      float *__restrict__ part3, int64_t rows, int c, float b0, float b1) {
  constexpr int V = 16 / sizeof(T);
  // [warp][slot][lane]: the column (it 32 + lane) V + k. bwd_vec_iters keeps IT V <= kVecMaxBwdC / 32 (the
  // 16-bit types never take IT 8 here): the bound only sizes those unused instantiations.
  constexpr int kSlots = ln_slots<IT, V>();
  extern __shared__ float4 ln_smem[];
  float2(*acc)[kSlots][32] = reinterpret_cast<float2(*)[kSlots][32]>(ln_smem);
  float(*acc3)[kSlots][32] = reinterpret_cast<float(*)[kSlots][32]>(&acc[kBwdWarps][0][0]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // this warp's staged row: [0] x, [1] dy, [2] ds, each [IT][32] vectors
  row_vec<T>(*stage)[IT][32] =
      reinterpret_cast<row_vec<T>(*)[IT][32]>((char *)ln_smem + ln_bwd_vec_acc_bytes<T, IT, DC>()) + 3 * warp;
  auto stage_in = [&](int which, const T *src, int64_t row) {
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int j = (it * 32 + lane) * V;
      if (j < c) cp_async16(&stage[which][it][lane], src + row * c + j);
    }
  };
#pragma unroll
  for (int e = 0; e < kSlots; e++) {
    acc[warp][e][lane] = make_float2(0.f, 0.f);
    if (DC) acc3[warp][e][lane] = 0.f;
  }
  row_vec<T> wv[IT];
#pragma unroll
  for (int it = 0; it < IT; it++)
    if ((it * 32 + lane) * V < c) wv[it] = ld(w + (it * 32 + lane) * V);
  const int64_t stride = (int64_t)gridDim.x * kBwdWarps;
  int64_t r = (int64_t)blockIdx.x * kBwdWarps + warp;
  // Two copy groups a row, committed in this order: A (x, dy) and B (ds). A row waits for its A at
  // its start and for its B only before its second loop, so the next row's ds, issued at the end of
  // a row, lands while the next row's first loop runs (with one wait for both, every row waited a
  // full memory latency for its ds). The row's mean and rstd are loaded a row ahead too.
  float m_next = 0.f, rs_next = 0.f;
  if (r < rows) {
    stage_in(0, x, r);
    stage_in(1, dy, r);
    m_next = mean[r], rs_next = rstd[r];
  }
  cp_async_commit(); /* A */
  if (r < rows && ds) stage_in(2, ds, r);
  cp_async_commit(); /* B */
  for (; r < rows; r += stride) {
    const float m = m_next, rs = rs_next;
    row_vec<T> xv[IT], gv[IT];
    float mg = 0.f, mgx = 0.f;
    cp_async_wait_but_last(); /* this row's A */
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int j = (it * 32 + lane) * V;
      if (j >= c) continue;
      xv[it] = stage[0][it][lane];
      gv[it] = stage[1][it][lane];
    }
    if (r + stride < rows) { /* the next row's x and dy, while this one is worked on */
      stage_in(0, x, r + stride);
      stage_in(1, dy, r + stride);
      m_next = mean[r + stride], rs_next = rstd[r + stride];
    }
    cp_async_commit(); /* the next row's A */
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int j = (it * 32 + lane) * V;
      if (j >= c) continue;
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float xh = (to_f(xv[it].v[k]) - m) * rs, d = to_f(gv[it].v[k]), g = d * to_f(wv[it].v[k]);
        mg += g;
        mgx += g * xh;
        if (part) {
          float2 &a = acc[warp][it * V + k][lane];
          a = make_float2(a.x + d * xh, a.y + d);
        }
      }
    }
    mg = warp_sum(mg) / (float)c;
    mgx = warp_sum(mgx) / (float)c;
    cp_async_wait_but_last(); /* this row's B */
    if (dx || DC) {
#pragma unroll
      for (int it = 0; it < IT; it++) {
        const int j = (it * 32 + lane) * V;
        if (j >= c) continue;
        row_vec<T> sv, o, o2;
        if (ds) sv = stage[2][it][lane];
        if (dx && b0 != 0.f) o = ld(dx + r * c + j);
        if (dx2 && b1 != 0.f) o2 = ld(dx2 + r * c + j);
#pragma unroll
        for (int k = 0; k < V; k++) {
          const float xh = (to_f(xv[it].v[k]) - m) * rs, g = to_f(gv[it].v[k]) * to_f(wv[it].v[k]);
          const float v = ln_dx(rs, g, mg, xh, mgx) + (ds ? to_f(sv.v[k]) : 0.f);
          if (DC) acc3[warp][it * V + k][lane] += v;
          if (dx) o.v[k] = from_f<T>(b0 != 0.f ? b0 * to_f(o.v[k]) + v : v);
          if (dx2) o2.v[k] = from_f<T>(b1 != 0.f ? b1 * to_f(o2.v[k]) + v : v);
        }
        if (dx) st(dx + r * c + j, o);
        if (dx2) st(dx2 + r * c + j, o2);
      }
    }
    if (ds && r + stride < rows) stage_in(2, ds, r + stride); /* this row's ds is read */
    cp_async_commit(); /* the next row's B */
  }
  cp_async_wait_all();
  if (!part) return;
  __syncthreads();
  for (int j = threadIdx.x; j < c; j += kBwdWarps * 32) { /* the warps' slices of column j, in order */
    const int e = (j / V / 32) * V + j % V, l = (j / V) % 32;
    float2 t = acc[0][e][l];
#pragma unroll
    for (int q = 1; q < kBwdWarps; q++) t = make_float2(t.x + acc[q][e][l].x, t.y + acc[q][e][l].y);
    part[(int64_t)blockIdx.x * c + j] = t;
    if (DC) {
      float t3 = acc3[0][e][l];
#pragma unroll
      for (int q = 1; q < kBwdWarps; q++) t3 += acc3[q][e][l];
      part3[(int64_t)blockIdx.x * c + j] = t3;
    }
  }
}

// dweight[j] = beta dweight[j] + the .x of column j's parts added in order (dbias likewise from .y,
// dc from part3 when given): a block is 32 columns x kSumPhases phases over the parts, four loads
// in flight a thread, the phase sums added in order. (With kWarps phases and one load at a time, the
// chain of up to 64 dependent L2 reads a thread took ~10 us of GPT-2's ~50 us layer-norm backward.)
constexpr int kSumPhases = 32;
template <typename T>
__global__ void __launch_bounds__(32 * kSumPhases)
    ln_part_sum_kernel(const float2 *__restrict__ part, const float *__restrict__ part3, int parts, T *dw, T *db,
                       T *dc, int64_t c, float bw, float bb, float bc) {
  __shared__ float3 sm[kSumPhases][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t j = (int64_t)blockIdx.x * 32 + tx;
  float sw = 0.f, sb = 0.f, sc = 0.f;
  int p = ty;
  for (; j < c && p + 3 * kSumPhases < parts; p += 4 * kSumPhases) {
    float2 v[4];
    float v3[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < 4; u++) {
      v[u] = part[(int64_t)(p + u * kSumPhases) * c + j];
      if (part3) v3[u] = part3[(int64_t)(p + u * kSumPhases) * c + j];
    }
#pragma unroll
    for (int u = 0; u < 4; u++) sw += v[u].x, sb += v[u].y, sc += v3[u];
  }
  for (; j < c && p < parts; p += kSumPhases) {
    const float2 v = part[(int64_t)p * c + j];
    sw += v.x;
    sb += v.y;
    if (part3) sc += part3[(int64_t)p * c + j];
  }
  sm[ty][tx] = make_float3(sw, sb, sc);
  __syncthreads();
  if (ty || j >= c) return;
  for (int k = 1; k < kSumPhases; k++) sw += sm[k][tx].x, sb += sm[k][tx].y, sc += sm[k][tx].z;
  if (dw) acc(dw + j, bw, sw);
  if (db) acc(db + j, bb, sb);
  if (dc) acc(dc + j, bc, sc);
}

// --------------------------------------------------------- plain path

// Rows past the register path (the backward's past 1536 16-bit columns, GPT-2 XL's 1600; the forward's
// past 2048), or not in whole 16-byte vectors, read from memory. N elements a load: 16 bytes (16 / sizeof(T)) when the
// columns are whole vectors and every pointer 16-byte aligned, else 1. With 2-byte loads GPT-2
// large's add_bias_layer_norm backward took 156 us a call where its bytes take about 8 (BENCHMARKS.md
// run 36).
// d = beta d + v for N elements (d not read when beta is 0, as acc()).
template <typename T, int N> __device__ __forceinline__ void accn(T *d, float beta, const float *v) {
  vec<T, N> o;
  if (beta != 0.f) o = ldn<T, N>(d);
#pragma unroll
  for (int k = 0; k < N; k++) o.v[k] = from_f<T>(beta != 0.f ? beta * to_f(o.v[k]) + v[k] : v[k]);
  stn<T, N>(d, o);
}

// One warp per row, read from memory: s = a + b (+ c) rounded to T (add_layer_norm) or x, its mean and
// biased variance (two passes over the row, in float), y = (s - mean) rstd w + bias.
template <typename T, int N>
__global__ void ln_fwd_kernel(const T *__restrict__ a, const T *__restrict__ b, const T *__restrict__ cb,
                              T *__restrict__ s_out, const T *__restrict__ w, const T *__restrict__ bias,
                              T *__restrict__ y, float *__restrict__ mean, float *__restrict__ rstd, int64_t rows,
                              int64_t c, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const T *ar = a + r * c;
    float sum = 0.f;
    for (int64_t j = (int64_t)lane * N; j < c; j += 32 * N) {
      vec<T, N> v = ldn<T, N>(ar + j);
      if (b) {
        const vec<T, N> vb = ldn<T, N>(b + r * c + j);
        vec<T, N> vc;
        if (cb) vc = ldn<T, N>(cb + j);
#pragma unroll
        for (int k = 0; k < N; k++) v.v[k] = from_f<T>(to_f(v.v[k]) + to_f(vb.v[k]) + (cb ? to_f(vc.v[k]) : 0.f));
        stn<T, N>(s_out + r * c + j, v);
      }
#pragma unroll
      for (int k = 0; k < N; k++) sum += to_f(v.v[k]);
    }
    const T *xr = b ? s_out + r * c : ar;
    __syncwarp();
    float m = warp_sum(sum) / (float)c, q = 0.f;
    for (int64_t j = (int64_t)lane * N; j < c; j += 32 * N) {
      const vec<T, N> v = ldn<T, N>(xr + j);
#pragma unroll
      for (int k = 0; k < N; k++) {
        const float d = to_f(v.v[k]) - m;
        q += d * d;
      }
    }
    float rs = rsqrtf(warp_sum(q) / (float)c + eps);
    for (int64_t j = (int64_t)lane * N; j < c; j += 32 * N) {
      const vec<T, N> v = ldn<T, N>(xr + j), wv = ldn<T, N>(w + j), bv = ldn<T, N>(bias + j);
      vec<T, N> o;
#pragma unroll
      for (int k = 0; k < N; k++) o.v[k] = from_f<T>((to_f(v.v[k]) - m) * rs * to_f(wv.v[k]) + to_f(bv.v[k]));
      stn<T, N>(y + r * c + j, o);
    }
    if (lane == 0) mean[r] = m, rstd[r] = rs;
  }
}

// dx per row (one warp): rstd (gy - mean(gy) - xhat mean(gy xhat)) (+ ds), gy = dy w, into dx and
// dx2 (add_layer_norm's second input, when it has its own memory); the row's (mean(gy),
// mean(gy xhat)) into rowstat when given (add_bias_layer_norm's dc: ln_bwd_w_part_kernel).
template <typename T, int N>
__global__ void ln_bwd_x_kernel(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ dy,
                                const T *__restrict__ ds, const float *__restrict__ mean,
                                const float *__restrict__ rstd, T *dx, T *dx2, float2 *__restrict__ rowstat,
                                int64_t rows, int64_t c, float b0, float b1) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    float m = mean[r], rs = rstd[r], mg = 0.f, mgx = 0.f;
    for (int64_t j = (int64_t)lane * N; j < c; j += 32 * N) {
      const vec<T, N> dv = ldn<T, N>(dy + r * c + j), xv = ldn<T, N>(x + r * c + j), wv = ldn<T, N>(w + j);
#pragma unroll
      for (int k = 0; k < N; k++) {
        const float gy = to_f(dv.v[k]) * to_f(wv.v[k]);
        mg += gy;
        mgx += gy * (to_f(xv.v[k]) - m) * rs;
      }
    }
    mg = warp_sum(mg) / (float)c;
    mgx = warp_sum(mgx) / (float)c;
    if (rowstat && lane == 0) rowstat[r] = make_float2(mg, mgx);
    for (int64_t j = (int64_t)lane * N; dx && j < c; j += 32 * N) {
      const int64_t i = r * c + j;
      const vec<T, N> xv = ldn<T, N>(x + i), dv = ldn<T, N>(dy + i), wv = ldn<T, N>(w + j);
      vec<T, N> sv;
      if (ds) sv = ldn<T, N>(ds + i);
      float v[N];
#pragma unroll
      for (int k = 0; k < N; k++) {
        const float xh = (to_f(xv.v[k]) - m) * rs, gy = to_f(dv.v[k]) * to_f(wv.v[k]);
        v[k] = ln_dx(rs, gy, mg, xh, mgx) + (ds ? to_f(sv.v[k]) : 0.f);
      }
      accn<T, N>(dx + i, b0, v);
      if (dx2) accn<T, N>(dx2 + i, b1, v);
    }
  }
}

// part[p, j] = (sum dy xhat, sum dy) over partition p of `parts` (its rows: a contiguous share) of
// column j (a thread per N columns); with rowstat (ln_bwd_x_kernel's), part3[p, j] = the sum of the
// gradient dx's values, recomputed in float.
template <typename T, int N>
__global__ void ln_bwd_w_part_kernel(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ w,
                                     const T *__restrict__ ds, const float *__restrict__ mean,
                                     const float *__restrict__ rstd, const float2 *__restrict__ rowstat,
                                     float2 *__restrict__ part, float *__restrict__ part3, int64_t rows, int64_t c,
                                     int parts) {
  const int p = blockIdx.y;
  const int64_t per = (rows + parts - 1) / parts, r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
  for (int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * N; j < c; j += (int64_t)gridDim.x * blockDim.x * N) {
    float sw[N] = {}, sb[N] = {}, sc[N] = {};
    vec<T, N> wv;
    if (rowstat) wv = ldn<T, N>(w + j);
#pragma unroll 4
    for (int64_t r = r0; r < r1; r++) {
      const vec<T, N> dv = ldn<T, N>(dy + r * c + j), xv = ldn<T, N>(x + r * c + j);
      const float m = mean[r], rs = rstd[r];
      vec<T, N> sv;
      if (rowstat && ds) sv = ldn<T, N>(ds + r * c + j);
      const float2 st = rowstat ? rowstat[r] : make_float2(0.f, 0.f);
#pragma unroll
      for (int k = 0; k < N; k++) {
        const float d = to_f(dv.v[k]), xh = (to_f(xv.v[k]) - m) * rs;
        sw[k] += d * xh;
        sb[k] += d;
        if (rowstat) sc[k] += ln_dx(rs, d * to_f(wv.v[k]), st.x, xh, st.y) + (ds ? to_f(sv.v[k]) : 0.f);
      }
    }
#pragma unroll
    for (int k = 0; k < N; k++) {
      part[(int64_t)p * c + j + k] = make_float2(sw[k], sb[k]);
      if (rowstat) part3[(int64_t)p * c + j + k] = sc[k];
    }
  }
}

// ================================================================ host side

#define LAUNCH_OK(a) STOKE_CUDA_LAUNCH(stoke_node_name(a))

struct ln_geom {
  int64_t rows, c;
  float eps;
  int add, w, y;
};

stoke_err *ln_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, bool run, int add, ln_geom *g) {
  const char *op = add == 2 ? STOKE_OP_ADD_BIAS_LAYER_NORM : add ? STOKE_OP_ADD_LAYER_NORM : STOKE_OP_LAYER_NORM;
  g->add = add;
  g->w = add ? 2 : 1;
  g->y = add ? 1 : 0;
  int nin = add == 2 ? 5 : add ? 4 : 3, nout = add ? 4 : 3;
  if (a->n_in < nin || a->n_out < nout || (bwd && (!a->din || !a->dout)) || !a->node ||
      a->node->n_attrs <= STOKE_LAYER_NORM_EPS)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects %d inputs, %d outputs and eps", op, stoke_node_name(a), nin, nout);
  const stoke_shape *xs = &a->in[0].shape;
  g->eps = (float)a->node->attrs[STOKE_LAYER_NORM_EPS].f;
  g->c = xs->ndim ? xs->d[xs->ndim - 1] : 0;
  g->rows = g->c ? stoke_numel(xs) / g->c : 0;
  for (int i = 0; i < (add ? 2 : 1); i++)
    if (!stoke_same_shape(&a->in[i].shape, xs) || !stoke_same_shape(&a->out[i].shape, xs))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': inputs and outputs must have x's shape %s", op, stoke_node_name(a), stoke_shape_str(xs).s);
  for (int i = g->w; i < nin; i++)
    if (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': weight, bias%s must be [%lld]", op, stoke_node_name(a),
                        add == 2 ? " and c" : "", (long long)g->c);
  for (int j = g->y + 1; j < g->y + 3; j++)
    if (a->out[j].shape.ndim != 1 || a->out[j].shape.d[0] != g->rows || a->out[j].dtype != STOKE_F32)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': mean and rstd must be f32 [%lld]", op, stoke_node_name(a), (long long)g->rows);
  for (int i = 0; i < nin; i++) CHECK(stoke_check_dtype(a, op, "input", &a->in[i], dt));
  CHECK(stoke_check_dtype(a, op, "y", &a->out[g->y], dt));
  if (!bwd) {
    for (int i = 0; i < nin; i++) CHECK(stoke_check_data(a, op, "input", &a->in[i], run));
    for (int j = 0; j < nout; j++) CHECK(stoke_check_data(a, op, "output", &a->out[j], run));
    return NULL;
  }
  for (int i = 0; i < nin; i++) CHECK(stoke_check_grad(a, op, "input", &a->din[i], &a->in[i]));
  CHECK(stoke_check_data(a, op, "dy", &a->dout[g->y], run));
  CHECK(stoke_check_data(a, op, add ? "s" : "x", add ? &a->out[0] : &a->in[0], run));
  CHECK(stoke_check_data(a, op, "weight", &a->in[g->w], run));
  CHECK(stoke_check_data(a, op, "mean", &a->out[g->y + 1], run));
  return stoke_check_data(a, op, "rstd", &a->out[g->y + 2], run);
}


// The register path's vector slots per lane for rows of c elements, or 0 (the plain path): c whole
// 16-byte vectors, at most kVecMaxVecs of them and at most max_c columns, every given pointer 16-byte
// aligned. 5 and 7 round up.
template <typename T> int vec_iters(int64_t c, int64_t max_c, std::initializer_list<const void *> ptrs) {
  constexpr int V = 16 / sizeof(T);
  if (c % V || c / V > kVecMaxVecs || c > max_c || !all_aligned16(ptrs)) return 0;
  int it = (int)((c / V + 31) / 32);
  return it <= 4 ? it : it <= 6 ? 6 : 8;
}
// The forward holds a row in registers (8 slots a lane: 64 floats at most); the backward's column sums
// take shared memory by the float a lane (ln_slots), so its rows stop at kVecMaxBwdC. With the plain
// path's three reads of a row, GPT-2 large's add_bias_layer_norm forward took 67.8 us a call at 1280
// columns (BENCHMARKS.md run 37). The backward past 1536 in blocks of 2 warps (64 floats a lane, 72 KB
// of shared memory, 3 blocks an SM) took 47.0 us a call at GPT-2 XL's 1600 columns against the plain
// path's 40.2 over three kernels (run 38): too few warps an SM for a row's latency; not kept.
template <typename T> int fwd_vec_iters(int64_t c, std::initializer_list<const void *> ptrs) {
  return vec_iters<T>(c, INT64_MAX, ptrs);
}
template <typename T> int bwd_vec_iters(int64_t c, std::initializer_list<const void *> ptrs) {
  return vec_iters<T>(c, kVecMaxBwdC, ptrs);
}

// The plain path in 16-byte loads: c whole 16-byte vectors, every given pointer 16-byte aligned.
template <typename T> bool plain_vec(int64_t c, std::initializer_list<const void *> ptrs) {
  return c % (int64_t)(16 / sizeof(T)) == 0 && all_aligned16(ptrs);
}

// f(std::integral_constant<int, N>()), N the plain path's elements a load: 16 bytes when `vec`
// (plain_vec), else 1.
template <typename T, typename F> auto with_plain_width(bool vec, F f) {
  return vec ? f(std::integral_constant<int, 16 / sizeof(T)>()) : f(std::integral_constant<int, 1>());
}

// The plain path's partitions of the rows for the weight gradients' partial sums in 16-byte loads:
// about 16 rows each, at most kParts (GPT-2 large's 8192 rows: 512; with kLnParts' 64 a thread's 128
// rows of 16-byte loads left too few loads in flight), the rows alone decide it.
int plain_vec_parts(int64_t rows) {
  int64_t p = (rows + 15) / 16;
  return (int)(p < 1 ? 1 : p < kParts ? p : kParts);
}

// f(std::integral_constant<int, it>()) for the slot counts vec_iters gives.
template <typename F> void with_iters(int it, F f) {
  switch (it) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 6: f(std::integral_constant<int, 6>()); break;
    default: f(std::integral_constant<int, 8>()); break;
  }
}

// The register path's backward blocks (each one partial of dweight and dbias): a block per
// kBwdWarps rows, at most kVecParts and at most `slots`, the blocks the device holds at once (one
// wave: each block loops over its rows). With more blocks than that the last wave ran a few blocks
// on a mostly idle device: GPT-2 medium's 1024 columns (3 blocks an SM by shared memory, 396 on an
// H200) took 2 waves for 512 blocks, 83.6 us a call against 41.8 for GPT-2 small's larger 768-column
// rows in one (BENCHMARKS.md run 36). The rows and the device decide it, so the sums' order is the
// same on every run of one device model.
int vec_parts(int64_t rows, int slots) {
  int64_t p = (rows + kBwdWarps - 1) / kBwdWarps, cap = slots > 0 && slots < kVecParts ? slots : kVecParts;
  return (int)(p < cap ? p : cap);
}

// The backward's workspace: the blocks' float2 partials of dweight and dbias, then for
// add_bias_layer_norm (ADD 2) the float partials of dc and the plain path's per-row statistics.
size_t ln_bwd_workspace(const ln_geom &g) {
  size_t b = (size_t)kParts * (size_t)g.c * sizeof(float2);
  if (g.add == 2) b += (size_t)kParts * (size_t)g.c * sizeof(float) + (size_t)g.rows * sizeof(float2);
  return b;
}

template <int ADD> stoke_err *ln_plan_any(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, size_t *w) {
  ln_geom g;
  CHECK(ln_check(a, dt, bwd, false, ADD, &g));
  if (w) *w = bwd ? ln_bwd_workspace(g) : 0;
  return NULL;
}

template <typename T> cudaError_t ln_bwd_smem_limit(const stoke_cuda_device *d, int64_t c);

template <typename T, int ADD, int BWD> stoke_err *ln_plan(const stoke_kernel_args_v1 *a, void **state, size_t *w) {
  if (state) *state = NULL;
  if (w) *w = 0;
  CHECK(ln_plan_any<ADD>(a, dtype_of<T>::value, BWD, w));
  const stoke_shape *xs = &a->in[0].shape;
  cudaError_t e = BWD && xs->ndim ? ln_bwd_smem_limit<T>(static_cast<const stoke_cuda_device *>(a->engine), xs->d[xs->ndim - 1]) : cudaSuccess;
  if (e != cudaSuccess)
    return STOKE_PERR(STOKE_E_DEVICE, "%s '%s': raising the backward kernel's shared-memory limit failed: %s",
                      a->node->op, stoke_node_name(a), cudaGetErrorString(e));
  return NULL;
}

template <typename T, int ADD> stoke_err *ln_fwd(const stoke_kernel_args_v1 *a, void *) {
  ln_geom g;
  CHECK(ln_check(a, dtype_of<T>::value, 0, true, ADD, &g));
  if (!g.rows) return NULL;
  const T *x = dp<T>(a->in[0]), *r = ADD ? dp<T>(a->in[1]) : (const T *)NULL;
  const T *w = dp<T>(a->in[g.w]), *bias = dp<T>(a->in[g.w + 1]), *cb = ADD == 2 ? dp<T>(a->in[4]) : (const T *)NULL;
  T *s = ADD ? dp<T>(a->out[0]) : (T *)NULL, *y = dp<T>(a->out[g.y]);
  float *mean = dp<float>(a->out[g.y + 1]), *rstd = dp<float>(a->out[g.y + 2]);
  const unsigned grid = grid_for(g.rows, kWarps, kGrid);
  int it = fwd_vec_iters<T>(g.c, {x, r, w, bias, cb, s, y});
  if (it)
    with_iters(it, [&](auto k) {
      ln_fwd_vec_kernel<T, decltype(k)::value>
          <<<grid, kThreads, 0, stream_of(a)>>>(x, r, cb, s, w, bias, y, mean, rstd, g.rows, (int)g.c, g.eps);
    });
  else
    with_plain_width<T>(plain_vec<T>(g.c, {x, r, w, bias, cb, s, y}), [&](auto n) {
      ln_fwd_kernel<T, decltype(n)::value>
          <<<grid, kThreads, 0, stream_of(a)>>>(x, r, cb, s, w, bias, y, mean, rstd, g.rows, g.c, g.eps);
    });
  LAUNCH_OK(a);
  return NULL;
}

// How many blocks of ln_bwd_vec_kernel<T, IT, DC> device d (the engine's, a->engine) holds at
// once: its SMs (stoke_cuda_device.sm_count) times the blocks an SM by the kernel's registers and
// shared memory, asked of the runtime once per device (at plan time, ln_bwd_smem_limit); 0 when
// unknown (then kVecParts blocks).
template <typename T, int IT, bool DC> int bwd_vec_slots(const stoke_cuda_device *d) {
  static std::atomic<int> per_sm[kMaxDevices]; /* 0: not yet asked, -1: the runtime could not say */
  if (!d || d->version != STOKE_CUDA_DEVICE_VERSION || d->index < 0 || d->index >= kMaxDevices || d->sm_count <= 0)
    return 0;
  int per = per_sm[d->index].load(std::memory_order_relaxed);
  if (!per) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, ln_bwd_vec_kernel<T, IT, DC>, kBwdWarps * 32,
                                                      ln_bwd_vec_smem<T, IT, DC>()) != cudaSuccess || per < 1)
      per = -1;
    per_sm[d->index].store(per, std::memory_order_relaxed);
  }
  return per > 0 ? d->sm_count * per : 0;
}

// The register path's backward, with its dynamic shared memory (over 48 KiB with DC at GPT-2's 768
// columns, and past 768 without: ln_bwd_smem_limit raised it in plan()).
template <typename T, int IT, bool DC>
cudaError_t launch_bwd_vec(const stoke_cuda_device *d, int *parts_out, cudaStream_t st, const T *x, const T *w, const T *dy, const T *ds,
                           const float *mean, const float *rstd, T *dx, T *dx2, float2 *part, float *part3,
                           int64_t rows, int c, float b0, float b1) {
  const int parts = *parts_out = vec_parts(rows, bwd_vec_slots<T, IT, DC>(d));
  ln_bwd_vec_kernel<T, IT, DC><<<parts, kBwdWarps * 32, ln_bwd_vec_smem<T, IT, DC>(), st>>>(
      x, w, dy, ds, mean, rstd, dx, dx2, part, part3, rows, c, b0, b1);
  return cudaGetLastError();
}

// The register path's backward kernels for rows of c elements allowed the dynamic shared memory
// they take past 48 KiB, on the current device: once, at plan time, not at every launch.
template <typename T> cudaError_t ln_bwd_smem_limit(const stoke_cuda_device *d, int64_t c) {
  const int it = bwd_vec_iters<T>(c, {});
  cudaError_t e = cudaSuccess;
  auto raise = [&](const void *kernel, size_t bytes) {
    if (e == cudaSuccess && bytes > 48 * 1024)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  };
  if (it)
    with_iters(it, [&](auto k) {
      constexpr int IT = decltype(k)::value;
      raise((const void *)ln_bwd_vec_kernel<T, IT, false>, ln_bwd_vec_smem<T, IT, false>());
      raise((const void *)ln_bwd_vec_kernel<T, IT, true>, ln_bwd_vec_smem<T, IT, true>());
      if (e == cudaSuccess) /* the resident block counts, asked now (with the limit raised), not during a capture */
        bwd_vec_slots<T, IT, false>(d), bwd_vec_slots<T, IT, true>(d);
    });
  return e;
}

template <typename T, int ADD> stoke_err *ln_bwd(const stoke_kernel_args_v1 *a, void *) {
  ln_geom g;
  CHECK(ln_check(a, dtype_of<T>::value, 1, true, ADD, &g));
  if (!g.rows) return NULL;
  cudaStream_t st = stream_of(a);
  const stoke_cuda_device *dev = static_cast<const stoke_cuda_device *>(a->engine);
  const T *x = ADD ? dp<T>(a->out[0]) : dp<T>(a->in[0]), *dy = dp<T>(a->dout[g.y]), *w = dp<T>(a->in[g.w]);
  const T *ds = ADD ? dp<T>(a->dout[0]) : (const T *)NULL;
  const float *mean = dp<float>(a->out[g.y + 1]), *rstd = dp<float>(a->out[g.y + 2]);
  T *dx = dp<T>(a->din[0]), *dx2 = ADD && a->din[1].data != a->din[0].data ? dp<T>(a->din[1]) : (T *)NULL;
  float b0 = stoke_grad_beta(a, 0), b1 = ADD ? stoke_grad_beta(a, 1) : 0.f;
  if (!dx && dx2) dx = dx2, dx2 = NULL, b0 = b1;
  T *dw = dp<T>(a->din[g.w]), *db = dp<T>(a->din[g.w + 1]), *dc = ADD == 2 ? dp<T>(a->din[4]) : (T *)NULL;
  const bool want_w = dw || db || dc;
  size_t need = ln_bwd_workspace(g);
  if (want_w && (a->workspace_bytes < need || !a->workspace))
    return STOKE_PERR(STOKE_E_INTERNAL, "layer_norm '%s': needs %zu bytes of workspace, got %zu", stoke_node_name(a), need,
                      a->workspace_bytes);
  float2 *part = want_w ? static_cast<float2 *>(a->workspace) : (float2 *)NULL;
  float *part3 = dc ? reinterpret_cast<float *>(part + (size_t)kParts * g.c) : (float *)NULL;
  float2 *rowstat = dc ? reinterpret_cast<float2 *>(part3 + (size_t)kParts * g.c) : (float2 *)NULL;
  int parts = kLnParts, it = bwd_vec_iters<T>(g.c, {x, w, dy, ds, dx, dx2});
  if (it) {
    cudaError_t e = cudaSuccess;
    with_iters(it, [&](auto k) {
      e = dc ? launch_bwd_vec<T, decltype(k)::value, true>(dev, &parts, st, x, w, dy, ds, mean, rstd, dx, dx2, part, part3,
                                                            g.rows, (int)g.c, b0, b1)
             : launch_bwd_vec<T, decltype(k)::value, false>(dev, &parts, st, x, w, dy, ds, mean, rstd, dx, dx2, part,
                                                             NULL, g.rows, (int)g.c, b0, b1);
    });
    if (e != cudaSuccess)
      return STOKE_PERR(STOKE_E_DEVICE, "%s '%s': backward launch failed: %s", a->node->op, stoke_node_name(a),
                        cudaGetErrorString(e));
    LAUNCH_OK(a);
  } else {
    CHECK(with_plain_width<T>(plain_vec<T>(g.c, {x, w, dy, ds, dx, dx2}), [&](auto n) -> stoke_err * {
      constexpr int N = decltype(n)::value;
      if (N > 1) parts = plain_vec_parts(g.rows);
      if (dx || dc) {
        ln_bwd_x_kernel<T, N><<<grid_for(g.rows, kWarps, kGrid), kThreads, 0, st>>>(x, w, dy, ds, mean, rstd, dx,
                                                                                     dx2, rowstat, g.rows, g.c, b0, b1);
        LAUNCH_OK(a);
      }
      if (want_w) {
        dim3 grid(grid_for(g.c / N, kThreads, 64), parts);
        ln_bwd_w_part_kernel<T, N>
            <<<grid, kThreads, 0, st>>>(x, dy, w, ds, mean, rstd, rowstat, part, part3, g.rows, g.c, parts);
        LAUNCH_OK(a);
      }
      return NULL;
    }));
  }
  if (!want_w) return NULL;
  if (g.c > kGrid * 32) /* a block per 32 columns, no loop over more: columns past the grid would keep stale sums */
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': %lld columns, at most %lld for the weight gradients' sums",
                      a->node->op, stoke_node_name(a), (long long)g.c, (long long)(kGrid * 32));
  ln_part_sum_kernel<T><<<grid_for(g.c, 32, kGrid), 32 * kSumPhases, 0, st>>>(
      part, part3, parts, dw, db, dc, g.c, stoke_grad_beta(a, g.w), stoke_grad_beta(a, g.w + 1),
      ADD == 2 ? stoke_grad_beta(a, 4) : 0.f);
  LAUNCH_OK(a);
  return NULL;
}

// ------------------------------------------------------------- the table

// layer_norm's backward adds its input gradient into din[0] when the compiler asks (accumulates bit 0,
// din_accumulate, through stoke_grad_beta): GPT-2's embedding output feeds ln_1 and the residual,
// and its gradient sum then needs no add node. The add forms declare none: their two input
// gradients may share memory (dx2 NULL), where accumulating one would add into the other.
#define K(op, pass, plan, run, T, acc) \
  {"cuda", op, pass, dtype_of<T>::value, STOKE_LAYOUT_ANY, plan, run, stoke_destroy_none, acc}
#define LN_KERNELS(T)                                                                                     \
  K(STOKE_OP_LAYER_NORM, STOKE_FWD, (ln_plan<T, 0, 0>), (ln_fwd<T, 0>), T, 0),                            \
  K(STOKE_OP_LAYER_NORM, STOKE_BWD, (ln_plan<T, 0, 1>), (ln_bwd<T, 0>), T, 1u),                           \
  K(STOKE_OP_ADD_LAYER_NORM, STOKE_FWD, (ln_plan<T, 1, 0>), (ln_fwd<T, 1>), T, 0),                        \
  K(STOKE_OP_ADD_LAYER_NORM, STOKE_BWD, (ln_plan<T, 1, 1>), (ln_bwd<T, 1>), T, 0),                       \
  K(STOKE_OP_ADD_BIAS_LAYER_NORM, STOKE_FWD, (ln_plan<T, 2, 0>), (ln_fwd<T, 2>), T, 0),                   \
  K(STOKE_OP_ADD_BIAS_LAYER_NORM, STOKE_BWD, (ln_plan<T, 2, 1>), (ln_bwd<T, 2>), T, 0)

const stoke_kernel_v1 ln_kernels[] = {LN_KERNELS(float), LN_KERNELS(__nv_bfloat16), LN_KERNELS(__half)};

}  // namespace

extern "C" stoke_err *stoke_cuda_register_layer_norm(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, ln_kernels, sizeof ln_kernels / sizeof *ln_kernels);
}
