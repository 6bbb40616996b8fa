// backends/cuda/attention.cu: the cuda backend's attention (stoke/ops.h): up to head size 128 tiled
// as flash attention (tiles of 64 rows in shared memory, any T), on TF32 tensor cores for bf16, fp16
// and f32 under the TF32 flag, as 3xTF32 for exact f32; past 128 a plain kernel per query
// (forward, dQ) and per key (dK, dV) with a row of scores in shared memory (T at most 4096). It
// serves f32 and tf32 (cuDNN's flash attention has no f32 engine), what cuDNN declines, and any
// precision where cudnn is not listed first in [run] backends; backends/cudnn/sdpa.c is the fast
// path in bf16 and fp16.
// Sums in float in a fixed order: deterministic. The CPU reference's semantics (lse = natural-log
// log-sum-exp of the scaled scores, causal or not).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "stoke/ops.h"

namespace {

constexpr int kAttThreads = 128;
constexpr int64_t kMaxT = 4096;  // two rows of scores in shared memory (32 KiB)

struct att_dims {
  int64_t b, t, h, d, c;
  int causal;
  float scale;
  int vec; /* the tensor-core kernels' 16-byte tile loads (tc_vec) */
};

// (b, h, t) of blockIdx: x = t, y = b * H + h.
__device__ __forceinline__ void bht(const att_dims &g, int64_t &b, int64_t &h, int64_t &t) {
  t = blockIdx.x;
  b = blockIdx.y / g.h;
  h = blockIdx.y % g.h;
}

template <typename T> __device__ __forceinline__ const T *qrow(const T *x, const att_dims &g, int64_t b, int64_t t, int64_t h, int which) {
  return x + (b * g.t + t) * 3 * g.c + which * g.c + h * g.d;
}

// Block-wide max or sum over kAttThreads threads.
template <bool kMax> __device__ float block_reduce(float v, float *sm) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = v;
  __syncthreads();
  float r = sm[0];
  for (int k = 1; k < kAttThreads / 32; k++) r = kMax ? fmaxf(r, sm[k]) : r + sm[k];
  return r;
}

template <typename T> __device__ float dot(const T *a, const T *b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; i++) s += to_f(a[i]) * to_f(b[i]);
  return s;
}

// One query row: scores over s (<= t when causal), lse, y = softmax . V.
template <typename T>
__global__ void __launch_bounds__(kAttThreads) att_fwd_kernel(const T *__restrict__ x, T *__restrict__ y,
                                                              float *__restrict__ lse, att_dims g) {
  extern __shared__ float sc[];
  __shared__ float red[kAttThreads / 32];
  int64_t b, h, t;
  bht(g, b, h, t);
  const int64_t ns = g.causal ? t + 1 : g.t;
  const T *q = qrow(x, g, b, t, h, 0);
  float m = -INFINITY;
  for (int64_t s = threadIdx.x; s < ns; s += kAttThreads) {
    sc[s] = g.scale * dot(q, qrow(x, g, b, s, h, 1), g.d);
    m = fmaxf(m, sc[s]);
  }
  m = block_reduce<true>(m, red);
  float sum = 0.f;
  for (int64_t s = threadIdx.x; s < ns; s += kAttThreads) sum += expf(sc[s] - m);
  sum = block_reduce<false>(sum, red);
  const float l = m + logf(sum);
  for (int64_t s = threadIdx.x; s < ns; s += kAttThreads) sc[s] = expf(sc[s] - l);
  __syncthreads();
  for (int64_t d = threadIdx.x; d < g.d; d += kAttThreads) {
    float acc_v = 0.f;
    for (int64_t s = 0; s < ns; s++) acc_v += sc[s] * to_f(qrow(x, g, b, s, h, 2)[d]);
    y[(b * g.t + t) * g.c + h * g.d + d] = from_f<T>(acc_v);
  }
  if (threadIdx.x == 0) lse[(b * g.h + h) * g.t + t] = l;
}

// dQ of one query row: p = exp(scale q.k - lse), ds = p (dy.v - dy.y), dq = scale sum ds k.
template <typename T>
__global__ void __launch_bounds__(kAttThreads) att_dq_kernel(const T *__restrict__ x, const T *__restrict__ y,
                                                             const float *__restrict__ lse, const T *__restrict__ dy,
                                                             T *__restrict__ dx, att_dims g, float beta) {
  extern __shared__ float ds[];
  __shared__ float red[kAttThreads / 32];
  int64_t b, h, t;
  bht(g, b, h, t);
  const int64_t ns = g.causal ? t + 1 : g.t;
  const T *q = qrow(x, g, b, t, h, 0), *dyt = dy + (b * g.t + t) * g.c + h * g.d, *yt = y + (b * g.t + t) * g.c + h * g.d;
  float dd = 0.f;
  for (int64_t d = threadIdx.x; d < g.d; d += kAttThreads) dd += to_f(dyt[d]) * to_f(yt[d]);
  dd = block_reduce<false>(dd, red);
  const float l = lse[(b * g.h + h) * g.t + t];
  for (int64_t s = threadIdx.x; s < ns; s += kAttThreads) {
    float p = expf(g.scale * dot(q, qrow(x, g, b, s, h, 1), g.d) - l);
    ds[s] = p * (dot(dyt, qrow(x, g, b, s, h, 2), g.d) - dd);
  }
  __syncthreads();
  T *dq = dx + (b * g.t + t) * 3 * g.c + h * g.d;
  for (int64_t d = threadIdx.x; d < g.d; d += kAttThreads) {
    float acc_v = 0.f;
    for (int64_t s = 0; s < ns; s++) acc_v += ds[s] * to_f(qrow(x, g, b, s, h, 1)[d]);
    acc(dq + d, beta, g.scale * acc_v);
  }
}

// dK, dV of one key row s: over the queries t that see it (t >= s when causal).
template <typename T>
__global__ void __launch_bounds__(kAttThreads) att_dkv_kernel(const T *__restrict__ x, const T *__restrict__ y,
                                                              const float *__restrict__ lse, const T *__restrict__ dy,
                                                              T *__restrict__ dx, att_dims g, float beta) {
  extern __shared__ float buf[];
  float *p = buf, *ds = buf + g.t;
  int64_t b, h, s;
  bht(g, b, h, s);
  const int64_t t0 = g.causal ? s : 0;
  const T *k = qrow(x, g, b, s, h, 1), *v = qrow(x, g, b, s, h, 2);
  for (int64_t t = t0 + threadIdx.x; t < g.t; t += kAttThreads) {
    const T *dyt = dy + (b * g.t + t) * g.c + h * g.d, *yt = y + (b * g.t + t) * g.c + h * g.d;
    float pt = expf(g.scale * dot(qrow(x, g, b, t, h, 0), k, g.d) - lse[(b * g.h + h) * g.t + t]);
    p[t] = pt;
    ds[t] = pt * (dot(dyt, v, g.d) - dot(dyt, yt, g.d));
  }
  __syncthreads();
  T *dk = dx + (b * g.t + s) * 3 * g.c + g.c + h * g.d, *dv = dk + g.c;
  for (int64_t d = threadIdx.x; d < g.d; d += kAttThreads) {
    float ak = 0.f, av = 0.f;
    for (int64_t t = t0; t < g.t; t++) {
      ak += ds[t] * to_f(qrow(x, g, b, t, h, 0)[d]);
      av += p[t] * to_f(dy[(b * g.t + t) * g.c + h * g.d + d]);
    }
    acc(dk + d, beta, g.scale * ak);
    acc(dv + d, beta, av);
  }
}

// ------------------------------------------------------------------ tiled path
// Head sizes up to kTileMaxD (any T): flash attention's tiling (tiles of kTile rows), on tensor cores
// below. (Run 38's tiled kernels on f32 FMAs took GPT-2 124M 315 ms a step in tf32; the plain kernels
// above 2.3 s: BENCHMARKS.md runs 38-39.)
constexpr int kTile = 64, kTileMaxD = 128;

// The head's first column of q, k or v (which) in qkv, with qkv's row stride.
template <typename T> __device__ __forceinline__ const T *qkv_head(const T *x, const att_dims &g, int64_t h, int which) {
  return x + which * g.c + h * g.d;
}

// ------------------------------------------------------------------ tensor-core path
// The tiled path on TF32 tensor cores (mma.sync m16n8k8, sm_80 and later), for bf16 and fp16 (exact in
// TF32), for f32 under the TF32 flag (run.precision = tf32), and for exact f32 as 3xTF32 (SPLIT: each
// operand split into two TF32 parts, three products a product, f32's accuracy). A block of kTcWarps warps takes kTile query rows (forward, dQ) or keys (dK, dV),
// a warp 16 of them; a tile of the other side's KN rows sits in shared memory as TF32-rounded floats,
// the head's d columns zero-padded to a multiple of 8 (DT groups of 8), rows ld = 8 DT + 4 floats apart
// (the fragment loads below hit 32 banks). A warp's 16 x KN scores (KN the streamed tile's rows,
// tc_rows) are KN / 8 accumulator tiles of 16 x 8 in registers; PTX's layout gives lane (g = lane / 4,
// t = lane % 4) rows g and g + 8, columns 2t and 2t + 1 of each. The softmax works on them in place,
// and they are the next product's A operand as they are: that product's sum over the tile's rows is
// taken in the order 2t, 2t + 1 of each group of 8 where the A layout reads t, t + 4, so its B rows
// are read from shared memory in the same order.
constexpr int kTcWarps = kTile / 16, kTcThreads = 32 * kTcWarps;
// The streamed side's rows a tile: kTile, 32 past head size 64 (DT 16: half the shared memory, two
// blocks an SM in the backward instead of one, and half the score registers).
template <int DT> __host__ __device__ constexpr int tc_rows() { return DT > 8 ? 32 : kTile; }

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ uint32_t bits(float x) { return __float_as_uint(x); }
// Exact f32 on TF32 tensor cores (3xTF32): x = hi + lo, hi its TF32 rounding and lo that of the rest; a
// product a b is taken as lo_a hi_b + hi_a lo_b + hi_a hi_b (the small terms first), which leaves out
// lo_a lo_b (2^-22 relative): f32's accuracy at three products a product.
struct tf32x2 {
  uint32_t hi, lo;
};
template <bool SPLIT> __device__ __forceinline__ tf32x2 operand(float x) {
  if (!SPLIT) return {bits(x), 0u}; /* already TF32 (the tiles) */
  const uint32_t hi = to_tf32(x);
  return {hi, to_tf32(x - __uint_as_float(hi))};
}
template <bool SPLIT> __device__ __forceinline__ tf32x2 operand_rounded(float x) { /* registers: P, dS */
  return SPLIT ? operand<true>(x) : tf32x2{to_tf32(x), 0u};
}

// c += a b, a 16 x 8 (row-major fragment a0..a3), b 8 x 8 (column fragment b0, b1), TF32 in, f32 out.
__device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += a b on split operands (SPLIT: 3xTF32).
template <bool SPLIT>
__device__ __forceinline__ void mma_x(float (&c)[4], const tf32x2 &a0, const tf32x2 &a1, const tf32x2 &a2,
                                      const tf32x2 &a3, const tf32x2 &b0, const tf32x2 &b1) {
  if (SPLIT) {
    mma_tf32(c, a0.lo, a1.lo, a2.lo, a3.lo, b0.hi, b1.hi);
    mma_tf32(c, a0.hi, a1.hi, a2.hi, a3.hi, b0.lo, b1.lo);
  }
  mma_tf32(c, a0.hi, a1.hi, a2.hi, a3.hi, b0.hi, b1.hi);
}

// ROWS rows [r0, r0 + ROWS) of one head's d columns of a [B, T, stride] tensor into s[i * ld + c] as
// TF32-rounded floats (RAW: as they are, split at the fragment loads), columns d .. 8 DT and rows past T
// as 0.
// With g.vec (the head's columns and the rows 16-byte aligned, d a multiple of 8) in 16-byte loads, a
// batch of kTcBatch (half that at DT 16: registers) a thread in flight before any is stored: a tile's
// loads wait for memory about once, where element-wise loads waited for it many times a tile (the
// kernels' time went to those waits, BENCHMARKS.md run 39).
constexpr int kTcBatch = 8;
template <bool RAW, typename T> __device__ __forceinline__ float tile_value(T x) {
  return RAW ? to_f(x) : __uint_as_float(to_tf32(to_f(x)));
}
template <int DT, int ROWS, bool RAW, typename T>
__device__ void tc_tile_in(float *s, int ld, const T *base, int64_t stride, const att_dims &g, int64_t b, int64_t r0) {
  constexpr int dp = 8 * DT;
  if (g.vec) {
    constexpr int per = 16 / sizeof(T), row = dp / per, n = ROWS * row / kTcThreads;
    static_assert(n % kTcBatch == 0 || kTcBatch % n == 0, "batches of a tile's 16-byte loads");
    constexpr int batch = DT > 8 ? kTcBatch / 2 : kTcBatch, nb = n < batch ? n : batch;
#pragma unroll 1
    for (int k0 = 0; k0 < n; k0 += nb) {
      uint4 v[nb];
#pragma unroll
      for (int k = 0; k < nb; k++) {
        const int e = threadIdx.x + (k0 + k) * kTcThreads, i = e / row, c = (e % row) * per;
        const int64_t r = r0 + i;
        v[k] = r < g.t && c < g.d ? *reinterpret_cast<const uint4 *>(base + (b * g.t + r) * stride + c)
                                  : make_uint4(0u, 0u, 0u, 0u); /* past T, or the padding past d */
      }
#pragma unroll
      for (int k = 0; k < nb; k++) {
        const int e = threadIdx.x + (k0 + k) * kTcThreads, i = e / row;
        const T *x = reinterpret_cast<const T *>(&v[k]);
        float4 *o = reinterpret_cast<float4 *>(s + i * ld + (e % row) * per);
#pragma unroll
        for (int u = 0; u < per; u += 4)
          o[u / 4] = make_float4(tile_value<RAW>(x[u]), tile_value<RAW>(x[u + 1]), tile_value<RAW>(x[u + 2]),
                                 tile_value<RAW>(x[u + 3]));
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < ROWS * dp; e += kTcThreads) {
    const int i = e / dp, c = e % dp;
    const int64_t r = r0 + i;
    s[i * ld + c] = tile_value<RAW>(r < g.t && c < g.d ? to_f(base[(b * g.t + r) * stride + c]) : 0.f);
  }
}

// s = a b^T for a warp: a the warp's 16 rows (at a), b the tile's 8 NJ rows, both dp = 8 DT columns.
template <int DT, int NJ, bool SPLIT>
__device__ __forceinline__ void tc_scores(float (&s)[NJ][4], const float *a, const float *b, int ld, int g, int t) {
#pragma unroll
  for (int j = 0; j < NJ; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int k = 0; k < DT; k++) {
    const float *a0 = a + g * ld + 8 * k + t, *a1 = a0 + 8 * ld;
    const tf32x2 x0 = operand<SPLIT>(a0[0]), x1 = operand<SPLIT>(a1[0]), x2 = operand<SPLIT>(a0[4]),
                 x3 = operand<SPLIT>(a1[4]);
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const float *bj = b + (8 * j + g) * ld + 8 * k + t;
      mma_x<SPLIT>(s[j], x0, x1, x2, x3, operand<SPLIT>(bj[0]), operand<SPLIT>(bj[4]));
    }
  }
}

// acc += p rows, p a warp's 16 x 8 NJ weights (as tc_scores left them), rows the tile's 8 NJ rows of
// dp = 8 DT columns: P V, dS K, P^T dO, dS^T Q.
template <int DT, int NJ, bool SPLIT>
__device__ __forceinline__ void tc_weighted_sum(float (&acc)[DT][4], const float (&p)[NJ][4], const float *rows,
                                                int ld, int g, int t) {
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const tf32x2 x0 = operand_rounded<SPLIT>(p[j][0]), x1 = operand_rounded<SPLIT>(p[j][2]),
                 x2 = operand_rounded<SPLIT>(p[j][1]), x3 = operand_rounded<SPLIT>(p[j][3]);
    const float *r0 = rows + (8 * j + 2 * t) * ld + g, *r1 = r0 + ld;
#pragma unroll
    for (int n = 0; n < DT; n++) mma_x<SPLIT>(acc[n], x0, x1, x2, x3, operand<SPLIT>(r0[8 * n]), operand<SPLIT>(r1[8 * n]));
  }
}

// f(j, c, r, col) for each element c of a lane's NJ accumulator tiles j: r its row (0: g, 1: g + 8),
// col its column within the tile.
template <int NJ, typename F> __device__ __forceinline__ void tc_each(int t, F f) {
#pragma unroll
  for (int j = 0; j < NJ; j++)
#pragma unroll
    for (int c = 0; c < 4; c++) f(j, c, c >> 1, 8 * j + 2 * t + (c & 1));
}

template <int DT> __device__ __forceinline__ void tc_zero(float (&acc)[DT][4]) {
#pragma unroll
  for (int n = 0; n < DT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// A lane's two rows of an accumulator out to memory: row g's element at out0, row g + 8's at out1
// (nullptr: past T), columns 8 n + 2t (+1) below d, times s, through acc (beta) or a plain store.
template <typename T, int DT>
__device__ __forceinline__ void tc_store(const float (&v)[DT][4], T *out0, T *out1, int d, int t, float s0, float s1,
                                         float beta, bool accumulate) {
#pragma unroll
  for (int n = 0; n < DT; n++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const int col = 8 * n + 2 * t + (c & 1);
      T *o = c < 2 ? out0 : out1;
      if (!o || col >= d) continue;
      const float x = v[n][c] * (c < 2 ? s0 : s1);
      if (accumulate) acc(o + col, beta, x);
      else o[col] = from_f<T>(x);
    }
}

// Where a thread of a tensor-core block is: its (b, h), the first of the block's kTile rows, its warp and
// its lane's (g, t) in the fragment layouts.
struct tc_at {
  int64_t b, h, r0;
  int warp, g, t;
};
__device__ __forceinline__ tc_at tc_where(const att_dims &g) {
  const int lane = threadIdx.x % 32;
  return {blockIdx.y / g.h, blockIdx.y % g.h, (int64_t)blockIdx.x * kTile, (int)threadIdx.x / 32, lane / 4, lane % 4};
}

// Whether a pair of tiles needs the mask: a streamed tile of n rows from s0 against the block's own m rows
// from r0 (queries, or keys when keys_own) has a row past T, or, causal, a key after a query. The
// other tiles take every score as it is.
__device__ __forceinline__ bool tc_edge(const att_dims &g, int64_t s0, int n, int64_t r0, int m, bool keys_own = false) {
  if (s0 + n > g.t || r0 + m > g.t) return true;
  if (!g.causal) return false;
  return keys_own ? s0 < r0 + m - 1 /* the first query before the last key */ : s0 + n - 1 > r0; /* the last key after the first query */
}

template <typename T, int DT, bool SPLIT>
__global__ void __launch_bounds__(kTcThreads) att_fwd_tc(const T *__restrict__ x, T *__restrict__ y,
                                                         float *__restrict__ lse, att_dims g) {
  extern __shared__ float sm[];
  const int dp = 8 * DT, ld = dp + 4;
  constexpr int KN = tc_rows<DT>(), NJ = KN / 8;
  float *qs = sm, *ks = qs + kTile * ld, *vs = ks + KN * ld;
  const tc_at at = tc_where(g);
  const int64_t b = at.b, h = at.h, q0 = at.r0;
  const int warp = at.warp, gg = at.g, t = at.t;
  tc_tile_in<DT, kTile, SPLIT>(qs, ld, qkv_head(x, g, h, 0), 3 * g.c, g, b, q0);
  const int64_t qi[2] = {q0 + 16 * warp + gg, q0 + 16 * warp + gg + 8};
  /* m: a row's base so far, its largest raw score q . k times sl2 (the scale is positive: the largest
   * scaled score too); a p is 2^(s sl2 - m), one FMA and one ex2, and a new base rescales the sums by
   * 2^(m_old - m), exactly 1 where it did not change */
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[DT][4], s[NJ][4];
  tc_zero(o);
  const float sl2 = g.scale * kLog2e;
  const int64_t kend = g.causal ? (q0 + kTile < g.t ? q0 + kTile : g.t) : g.t;
  for (int64_t k0 = 0; k0 < kend; k0 += KN) {
    __syncthreads(); /* the last tile's readers are done (and qs is in) */
    tc_tile_in<DT, KN, SPLIT>(ks, ld, qkv_head(x, g, h, 1), 3 * g.c, g, b, k0);
    tc_tile_in<DT, KN, SPLIT>(vs, ld, qkv_head(x, g, h, 2), 3 * g.c, g, b, k0);
    __syncthreads();
    tc_scores<DT, NJ, SPLIT>(s, qs + 16 * warp * ld, ks, ld, gg, t);
    float mx[2] = {-INFINITY, -INFINITY};
    if (tc_edge(g, k0, KN, q0, kTile)) /* keys past T or past a row's own: masked */
      tc_each<NJ>(t, [&](int j, int c, int r, int col) {
        const int64_t kj = k0 + col;
        if (!(kj < g.t && (!g.causal || kj <= qi[r]))) s[j][c] = -INFINITY;
      });
    tc_each<NJ>(t, [&](int j, int c, int r, int) { mx[r] = fmaxf(mx[r], s[j][c]); });
    float alpha[2], base[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const float mn = fmaxf(m[r], warp_max<4>(mx[r]) * sl2); /* over the row's 4 lanes */
      base[r] = mn == -INFINITY ? 0.f : mn; /* no key of this row yet: every p is 0 */
      alpha[r] = ex2_ftz(m[r] - base[r]);
      m[r] = mn;
    }
    tc_each<NJ>(t, [&](int j, int c, int r, int) {
      s[j][c] = ex2_ftz(fmaf(s[j][c], sl2, -base[r]));
      sum[r] += s[j][c];
    });
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + warp_sum<4>(sum[r]);
#pragma unroll
    for (int n = 0; n < DT; n++) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    tc_weighted_sum<DT, NJ, SPLIT>(o, s, vs, ld, gg, t);
  }
  T *y0 = qi[0] < g.t ? y + (b * g.t + qi[0]) * g.c + h * g.d : nullptr;
  T *y1 = qi[1] < g.t ? y + (b * g.t + qi[1]) * g.c + h * g.d : nullptr;
  tc_store<T, DT>(o, y0, y1, (int)g.d, t, 1.f / l[0], 1.f / l[1], 0.f, false);
  for (int r = 0; r < 2; r++)
    if (t == 0 && qi[r] < g.t) lse[(b * g.h + h) * g.t + qi[r]] = m[r] * kLn2 + logf(l[r]);
}

// The dy . y of kTile rows [r0, r0 + kTile) into dd and ddg (the same [B, H, T] place as lse), a warp a
// row (0 past T), and their lse into ls.
template <typename T>
__device__ void tc_row_stats(float *dd, float *ls, float *ddg, const float *dos, int ld, const T *y,
                             const float *lse, const att_dims &g, int64_t b, int64_t h, int64_t r0) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = warp; i < kTile; i += kTcWarps) {
    const int64_t qi = r0 + i;
    float v = 0.f;
    for (int d = lane; qi < g.t && d < g.d; d += 32) v += dos[i * ld + d] * to_f(y[(b * g.t + qi) * g.c + h * g.d + d]);
    v = warp_sum(v);
    if (lane == 0) {
      dd[i] = v, ls[i] = qi < g.t ? lse[(b * g.h + h) * g.t + qi] : 0.f;
      if (qi < g.t) ddg[(b * g.h + h) * g.t + qi] = v;
    }
  }
}

// The backward kernels' shared memory: the block's own two tiles of kTile rows, the two streamed tiles of
// KN rows, then dy . y and lse of kTile rows (the dQ pass: its own; the dK, dV pass: a streamed tile's).
struct tc_bwd_smem_at {
  float *own0, *own1, *in0, *in1, *dd, *ls;
};
template <int DT> __device__ __forceinline__ tc_bwd_smem_at tc_bwd_carve(float *sm) {
  constexpr int ld = 8 * DT + 4, kn = tc_rows<DT>();
  float *in0 = sm + 2 * kTile * ld, *dd = in0 + 2 * kn * ld;
  return {sm, sm + kTile * ld, in0, in0 + kn * ld, dd, dd + kTile};
}

// dQ of kTile query rows (att_dq_kernel's pass, tiled, on tensor cores), and the rows' dy . y into ddg
// for the dK, dV pass after it. dy . y is taken from the TF32-rounded dy tile, as dP is. At head sizes
// up to 64 (not split) the shared memory holds 3 blocks an SM, so the registers are held to 3 blocks'
// share (168, no spills; left free the masked-tile branch took 252 and 2 blocks, BENCHMARKS.md run 40).
template <typename T, int DT, bool SPLIT>
__global__ void __launch_bounds__(kTcThreads, !SPLIT && DT == 8 ? 3 : 1) att_dq_tc(const T *__restrict__ x, const T *__restrict__ y,
                                                        const float *__restrict__ lse, const T *__restrict__ dy,
                                                        T *__restrict__ dx, float *__restrict__ ddg, att_dims g,
                                                        float beta) {
  extern __shared__ float sm[];
  const int dp = 8 * DT, ld = dp + 4;
  constexpr int KN = tc_rows<DT>(), NJ = KN / 8;
  const tc_bwd_smem_at at_sm = tc_bwd_carve<DT>(sm);
  float *qs = at_sm.own0, *dos = at_sm.own1, *ks = at_sm.in0, *vs = at_sm.in1, *dds = at_sm.dd, *lss = at_sm.ls;
  const tc_at at = tc_where(g);
  const int64_t b = at.b, h = at.h, q0 = at.r0;
  const int warp = at.warp, gg = at.g, t = at.t;
  tc_tile_in<DT, kTile, SPLIT>(qs, ld, qkv_head(x, g, h, 0), 3 * g.c, g, b, q0);
  tc_tile_in<DT, kTile, SPLIT>(dos, ld, dy + h * g.d, g.c, g, b, q0);
  __syncthreads();
  tc_row_stats(dds, lss, ddg, dos, ld, y, lse, g, b, h, q0);
  __syncthreads();
  const int r0 = 16 * warp + gg;
  const int64_t qi[2] = {q0 + r0, q0 + r0 + 8};
  const float sl2 = g.scale * kLog2e; /* p = exp(scale s - lse) = 2^(s sl2 - lse log2e) */
  const float dd[2] = {dds[r0], dds[r0 + 8]}, ls2[2] = {lss[r0] * kLog2e, lss[r0 + 8] * kLog2e};
  float acc_q[DT][4], s[NJ][4], dpv[NJ][4];
  tc_zero(acc_q);
  const int64_t kend = g.causal ? (q0 + kTile < g.t ? q0 + kTile : g.t) : g.t;
  for (int64_t k0 = 0; k0 < kend; k0 += KN) {
    __syncthreads();
    tc_tile_in<DT, KN, SPLIT>(ks, ld, qkv_head(x, g, h, 1), 3 * g.c, g, b, k0);
    tc_tile_in<DT, KN, SPLIT>(vs, ld, qkv_head(x, g, h, 2), 3 * g.c, g, b, k0);
    __syncthreads();
    tc_scores<DT, NJ, SPLIT>(s, qs + 16 * warp * ld, ks, ld, gg, t);
    tc_scores<DT, NJ, SPLIT>(dpv, dos + 16 * warp * ld, vs, ld, gg, t);
    const bool edge = tc_edge(g, k0, KN, q0, kTile);
    tc_each<NJ>(t, [&](int j, int c, int r, int col) {
      const int64_t kj = k0 + col;
      const float p = !edge || (kj < g.t && qi[r] < g.t && (!g.causal || kj <= qi[r]))
                          ? ex2_ftz(fmaf(s[j][c], sl2, -ls2[r]))
                          : 0.f;
      s[j][c] = p * (dpv[j][c] - dd[r]); /* dS */
    });
    tc_weighted_sum<DT, NJ, SPLIT>(acc_q, s, ks, ld, gg, t);
  }
  T *d0 = qi[0] < g.t ? dx + (b * g.t + qi[0]) * 3 * g.c + h * g.d : nullptr;
  T *d1 = qi[1] < g.t ? dx + (b * g.t + qi[1]) * 3 * g.c + h * g.d : nullptr;
  tc_store<T, DT>(acc_q, d0, d1, (int)g.d, t, g.scale, g.scale, beta, true);
}

// dK, dV of kTile keys, over the query rows that see them, a tile at a time.
template <typename T, int DT, bool SPLIT>
__global__ void __launch_bounds__(kTcThreads) att_dkv_tc(const T *__restrict__ x, const float *__restrict__ ddg,
                                                         const float *__restrict__ lse, const T *__restrict__ dy,
                                                         T *__restrict__ dx, att_dims g, float beta) {
  extern __shared__ float sm[];
  const int dp = 8 * DT, ld = dp + 4;
  constexpr int KN = tc_rows<DT>(), NJ = KN / 8;
  const tc_bwd_smem_at at_sm = tc_bwd_carve<DT>(sm);
  float *ks = at_sm.own0, *vs = at_sm.own1, *qs = at_sm.in0, *dos = at_sm.in1, *dds = at_sm.dd, *lss = at_sm.ls;
  const tc_at at = tc_where(g);
  const int64_t b = at.b, h = at.h, k0 = at.r0;
  const int warp = at.warp, gg = at.g, t = at.t;
  tc_tile_in<DT, kTile, SPLIT>(ks, ld, qkv_head(x, g, h, 1), 3 * g.c, g, b, k0);
  tc_tile_in<DT, kTile, SPLIT>(vs, ld, qkv_head(x, g, h, 2), 3 * g.c, g, b, k0);
  const int64_t kj[2] = {k0 + 16 * warp + gg, k0 + 16 * warp + gg + 8};
  float ak[DT][4], av[DT][4], s[NJ][4], dpv[NJ][4];
  tc_zero(ak);
  tc_zero(av);
  const float sl2 = g.scale * kLog2e; /* p = exp(scale s - lse) = 2^(s sl2 - lse log2e) */
  const int64_t qstart = g.causal ? k0 : 0;
  for (int64_t q0 = qstart - qstart % KN; q0 < g.t; q0 += KN) {
    __syncthreads();
    tc_tile_in<DT, KN, SPLIT>(qs, ld, qkv_head(x, g, h, 0), 3 * g.c, g, b, q0);
    tc_tile_in<DT, KN, SPLIT>(dos, ld, dy + h * g.d, g.c, g, b, q0);
    for (int i = threadIdx.x; i < KN; i += kTcThreads) { /* the dQ pass's dy . y and the forward's lse */
      const int64_t r = (b * g.h + h) * g.t + q0 + i;
      dds[i] = q0 + i < g.t ? ddg[r] : 0.f, lss[i] = q0 + i < g.t ? lse[r] * kLog2e : 0.f;
    }
    __syncthreads();
    tc_scores<DT, NJ, SPLIT>(s, ks + 16 * warp * ld, qs, ld, gg, t);    /* S^T: keys x queries */
    tc_scores<DT, NJ, SPLIT>(dpv, vs + 16 * warp * ld, dos, ld, gg, t); /* dP^T = V dO^T */
    const bool edge = tc_edge(g, q0, KN, k0, kTile, true);
    tc_each<NJ>(t, [&](int j, int c, int r, int qq) {
      const int64_t qi = q0 + qq;
      const float p = !edge || (qi < g.t && kj[r] < g.t && (!g.causal || kj[r] <= qi))
                          ? ex2_ftz(fmaf(s[j][c], sl2, -lss[qq]))
                          : 0.f;
      s[j][c] = p;
      dpv[j][c] = p * (dpv[j][c] - dds[qq]); /* dS^T */
    });
    tc_weighted_sum<DT, NJ, SPLIT>(av, s, dos, ld, gg, t);
    tc_weighted_sum<DT, NJ, SPLIT>(ak, dpv, qs, ld, gg, t);
  }
  T *k0p = kj[0] < g.t ? dx + (b * g.t + kj[0]) * 3 * g.c + g.c + h * g.d : nullptr;
  T *k1p = kj[1] < g.t ? dx + (b * g.t + kj[1]) * 3 * g.c + g.c + h * g.d : nullptr;
  tc_store<T, DT>(ak, k0p, k1p, (int)g.d, t, g.scale, g.scale, beta, true);
  tc_store<T, DT>(av, k0p ? k0p + g.c : nullptr, k1p ? k1p + g.c : nullptr, (int)g.d, t, 1.f, 1.f, beta, true);
}

// Dynamic shared memory of the tensor-core kernels at DT groups of 8 columns.
template <int DT> constexpr size_t fwd_tc_smem() {
  return (size_t)(kTile + 2 * tc_rows<DT>()) * (8 * DT + 4) * sizeof(float);
}
template <int DT> constexpr size_t bwd_tc_smem() {
  return ((size_t)(2 * kTile + 2 * tc_rows<DT>()) * (8 * DT + 4) + 2 * kTile) * sizeof(float);
}
// The tensor-core kernels take head sizes up to kTileMaxD; exact f32 (no TF32 flag) as 3xTF32.
inline bool use_tc(const att_dims &g) { return g.d <= kTileMaxD; }
template <typename T> bool split_tf32(const stoke_kernel_args_v1 *a) {
  return sizeof(T) == 4 && !(a->flags & STOKE_KFLAG_TF32);
}
// The tensor-core kernels' tiles in 16-byte loads: each head's d columns start 16-byte aligned, and a
// 16-byte vector (4 or 8 elements) never straddles d.
template <typename T> int tc_vec(const att_dims &g, const void *x, const void *dy) {
  const size_t bytes = (size_t)g.c * sizeof(T) | (size_t)g.d * sizeof(T);
  return g.d % 8 == 0 && ((uintptr_t)x | (uintptr_t)dy | bytes) % 16 == 0;
}
// The tensor-core backward's workspace: a float a (b, h, t).
inline size_t tc_bwd_ws(const att_dims &g) { return (size_t)(g.b * g.h * g.t) * sizeof(float); }

// ================================================================ host side

stoke_err *att_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, bool run, att_dims *g) {
  const char *op = STOKE_OP_ATTENTION;
  if (a->n_in < 1 || a->n_out < 2 || !a->node || a->node->n_attrs <= STOKE_ATTENTION_SCALE || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "cuda %s '%s': expects qkv -> y, lse and the attributes", op, stoke_node_name(a));
  const stoke_shape *x = &a->in[0].shape;
  g->h = a->node->attrs[STOKE_ATTENTION_N_HEAD].i;
  if (x->ndim != 3 || x->d[2] % 3 || g->h < 1 || (x->d[2] / 3) % g->h)
    return STOKE_PERR(STOKE_E_INVALID, "cuda %s '%s': qkv %s must be [B, T, 3C], C a multiple of n_head", op, stoke_node_name(a),
                      stoke_shape_str(x).s);
  g->b = x->d[0], g->t = x->d[1], g->c = x->d[2] / 3, g->d = g->c / g->h;
  g->causal = (int)a->node->attrs[STOKE_ATTENTION_CAUSAL].i;
  double sc = a->node->attrs[STOKE_ATTENTION_SCALE].f;
  g->scale = (float)(sc > 0 ? sc : 1.0 / sqrt((double)g->d));
  if ((g->d > kTileMaxD && g->t > kMaxT) || g->b * g->h > 65535)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cuda %s '%s': T = %lld (at most %lld past head size %d: a row of scores in "
                      "shared memory) or B H = %lld (at most 65535); list cudnn before cuda in [run] backends with "
                      "run.precision = bf16 or fp16 (cuDNN's flash attention has no f32 engine), or shorten the context",
                      op, stoke_node_name(a), (long long)g->t, (long long)kMaxT, kTileMaxD, (long long)(g->b * g->h));
  CHECK(stoke_check_dtype(a, op, "qkv", &a->in[0], dt));
  CHECK(stoke_check_dtype(a, op, "y", &a->out[0], dt));
  CHECK(stoke_check_dtype(a, op, "lse", &a->out[1], STOKE_F32));
  CHECK(stoke_check_data(a, op, "qkv", &a->in[0], run));
  CHECK(stoke_check_data(a, op, "y", &a->out[0], run));
  CHECK(stoke_check_data(a, op, "lse", &a->out[1], run));
  if (bwd) CHECK(stoke_check_grad(a, op, "qkv", &a->din[0], &a->in[0]));
  if (bwd && a->din[0].data) CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
  return NULL;
}

// Once a process (not per layer, direction or type): the cuda kernels at a GPT context are the slow path.
std::atomic<int> g_said_slow(0);
void warn_slow_once(const stoke_kernel_args_v1 *a, const att_dims &g, stoke_dtype dt, bool split) {
  if (g_said_slow.exchange(1)) return;
  stoke_host->log(STOKE_LOG_WARN, "cuda", "attention '%s' (T = %lld, head size %lld, %s) runs on the cuda backend's "
                  "%s kernel: at GPT contexts cuDNN's flash attention (bf16 or fp16, head sizes a multiple of 8 up to "
                  "256, cudnn listed before cuda in [run] backends) is the fast path (BENCHMARKS.md runs 38-39)",
                  stoke_node_name(a), (long long)g.t, (long long)g.d, stoke_dtype_name(dt),
                  !use_tc(g) ? "plain" : split ? "3xTF32 tensor-core (exact f32: run.precision = tf32 is about three "
                  "times faster)" : "TF32 tensor-core");
}

// The tensor-core kernels' shared-memory limit past 48 KiB, both head-size tiers of a direction.
template <typename T, bool SPLIT, int BWD> cudaError_t tc_raise() {
  constexpr int D2 = kTileMaxD / 8;
  const cudaFuncAttribute lim = cudaFuncAttributeMaxDynamicSharedMemorySize;
  if (!BWD) {
    cudaError_t e = cudaFuncSetAttribute(att_fwd_tc<T, 8, SPLIT>, lim, (int)fwd_tc_smem<8>());
    return e == cudaSuccess ? cudaFuncSetAttribute(att_fwd_tc<T, D2, SPLIT>, lim, (int)fwd_tc_smem<D2>()) : e;
  }
  cudaError_t e = cudaFuncSetAttribute(att_dq_tc<T, 8, SPLIT>, lim, (int)bwd_tc_smem<8>());
  if (e == cudaSuccess) e = cudaFuncSetAttribute(att_dq_tc<T, D2, SPLIT>, lim, (int)bwd_tc_smem<D2>());
  if (e == cudaSuccess) e = cudaFuncSetAttribute(att_dkv_tc<T, 8, SPLIT>, lim, (int)bwd_tc_smem<8>());
  return e == cudaSuccess ? cudaFuncSetAttribute(att_dkv_tc<T, D2, SPLIT>, lim, (int)bwd_tc_smem<D2>()) : e;
}

// The tensor-core forward at head size d's tier (DT 8 up to 64, 16 up to kTileMaxD).
template <typename T, bool SPLIT> void tc_fwd(const att_dims &g, const T *x, T *y, float *lse, cudaStream_t st) {
  dim3 grid((unsigned)((g.t + kTile - 1) / kTile), (unsigned)(g.b * g.h));
  constexpr int D2 = kTileMaxD / 8;
  if (g.d <= 64) att_fwd_tc<T, 8, SPLIT><<<grid, kTcThreads, fwd_tc_smem<8>(), st>>>(x, y, lse, g);
  else att_fwd_tc<T, D2, SPLIT><<<grid, kTcThreads, fwd_tc_smem<D2>(), st>>>(x, y, lse, g);
}

// The dQ pass, then the dK, dV pass (ddg: the workspace, dy . y from the first to the second).
template <typename T, bool SPLIT>
void tc_bwd(const att_dims &g, const T *x, const T *y, const float *lse, const T *dy, T *dx, float *ddg, float beta,
            cudaStream_t st) {
  dim3 grid((unsigned)((g.t + kTile - 1) / kTile), (unsigned)(g.b * g.h));
  constexpr int D2 = kTileMaxD / 8;
  if (g.d <= 64) {
    att_dq_tc<T, 8, SPLIT><<<grid, kTcThreads, bwd_tc_smem<8>(), st>>>(x, y, lse, dy, dx, ddg, g, beta);
    att_dkv_tc<T, 8, SPLIT><<<grid, kTcThreads, bwd_tc_smem<8>(), st>>>(x, ddg, lse, dy, dx, g, beta);
  } else {
    att_dq_tc<T, D2, SPLIT><<<grid, kTcThreads, bwd_tc_smem<D2>(), st>>>(x, y, lse, dy, dx, ddg, g, beta);
    att_dkv_tc<T, D2, SPLIT><<<grid, kTcThreads, bwd_tc_smem<D2>(), st>>>(x, ddg, lse, dy, dx, g, beta);
  }
}

template <typename T, int BWD> stoke_err *att_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  att_dims g;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(att_check(a, dtype_of<T>::value, BWD, false, &g));
  if (g.t >= 256) warn_slow_once(a, g, dtype_of<T>::value, split_tf32<T>(a));
  if (BWD && ws && use_tc(g)) *ws = tc_bwd_ws(g);
  if (!use_tc(g)) return NULL;
  /* the tensor-core kernels' shared memory past 48 KiB, allowed once (at plan time, not during a capture) */
  static std::atomic<int> raised(0);
  if (raised.load()) return NULL;
  cudaError_t e = tc_raise<T, false, BWD>();
  if (e == cudaSuccess) e = tc_raise<T, sizeof(T) == 4, BWD>(); /* f32: the 3xTF32 kernels too */
  if (e != cudaSuccess)
    return STOKE_PERR(STOKE_E_DEVICE, "cuda attention '%s': raising the tiled kernel's shared-memory limit: %s",
                      stoke_node_name(a), cudaGetErrorString(e));
  raised.store(1);
  return NULL;
}

template <typename T> stoke_err *att_fwd(const stoke_kernel_args_v1 *a, void *) {
  att_dims g;
  CHECK(att_check(a, dtype_of<T>::value, 0, true, &g));
  const T *x = static_cast<const T *>(a->in[0].data);
  T *y = static_cast<T *>(a->out[0].data);
  float *lse = static_cast<float *>(a->out[1].data);
  if (use_tc(g)) {
    g.vec = tc_vec<T>(g, x, nullptr);
    if (split_tf32<T>(a)) tc_fwd<T, sizeof(T) == 4>(g, x, y, lse, (cudaStream_t)a->stream);
    else tc_fwd<T, false>(g, x, y, lse, (cudaStream_t)a->stream);
  } else {
    dim3 grid((unsigned)g.t, (unsigned)(g.b * g.h));
    att_fwd_kernel<T><<<grid, kAttThreads, (size_t)g.t * sizeof(float), (cudaStream_t)a->stream>>>(x, y, lse, g);
  }
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

template <typename T> stoke_err *att_bwd(const stoke_kernel_args_v1 *a, void *) {
  att_dims g;
  CHECK(att_check(a, dtype_of<T>::value, 1, true, &g));
  T *dx = static_cast<T *>(a->din[0].data);
  if (!dx) return NULL;
  const T *x = static_cast<const T *>(a->in[0].data), *y = static_cast<const T *>(a->out[0].data);
  const T *dy = static_cast<const T *>(a->dout[0].data);
  const float *lse = static_cast<const float *>(a->out[1].data);
  float beta = stoke_grad_beta(a, 0);
  cudaStream_t st = (cudaStream_t)a->stream;
  if (use_tc(g)) {
    float *ddg = static_cast<float *>(a->workspace); /* [B, H, T]: dy . y, from the dQ pass to the dK, dV pass */
    g.vec = tc_vec<T>(g, x, dy);
    if (a->workspace_bytes < tc_bwd_ws(g))
      return STOKE_PERR(STOKE_E_INTERNAL, "cuda attention '%s': workspace %zu B, needs %zu", stoke_node_name(a),
                        a->workspace_bytes, tc_bwd_ws(g));
    if (split_tf32<T>(a)) tc_bwd<T, sizeof(T) == 4>(g, x, y, lse, dy, dx, ddg, beta, st);
    else tc_bwd<T, false>(g, x, y, lse, dy, dx, ddg, beta, st);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
    return NULL;
  }
  dim3 grid((unsigned)g.t, (unsigned)(g.b * g.h));
  att_dq_kernel<T><<<grid, kAttThreads, (size_t)g.t * sizeof(float), st>>>(x, y, lse, dy, dx, g, beta);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  att_dkv_kernel<T><<<grid, kAttThreads, 2 * (size_t)g.t * sizeof(float), st>>>(x, y, lse, dy, dx, g, beta);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

#define ATT(T)                                                                                                  \
  {"cuda", STOKE_OP_ATTENTION, STOKE_FWD, dtype_of<T>::value, STOKE_LAYOUT_ANY, att_plan<T, 0>, att_fwd<T>, stoke_destroy_none}, \
  {"cuda", STOKE_OP_ATTENTION, STOKE_BWD, dtype_of<T>::value, STOKE_LAYOUT_ANY, att_plan<T, 1>, att_bwd<T>, stoke_destroy_none}

const stoke_kernel_v1 att_kernels[] = {ATT(float), ATT(__nv_bfloat16), ATT(__half)};

}  // namespace

extern "C" stoke_err *stoke_cuda_register_attention(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, att_kernels, sizeof att_kernels / sizeof *att_kernels);
}
