// backends/fused/bn_act.cu: batch_norm, bn_relu, bn_add_relu and
// bn_add_bn_relu (stoke/ops.h), forward and backward, for channels-last
// (NHWC) x in bf16, fp16 and f32: batch norm, the residual add (of a second
// batch norm's output, for bn_add_bn_relu) and the ReLU in two passes over
// the activations per direction, the fewest a batch norm allows.
//
// x is an (M, C) row-major matrix (M = N H W). A thread owns V contiguous
// channels (one 16-byte vector: 8 bf16/fp16, 4 f32; V = 1 when C is not a
// multiple or the data is not 16-byte aligned) and walks rows, so its
// per-channel coefficients stay in registers and every access is a
// coalesced vector load, several in flight per thread. Every pass of a node
// runs on one grid: (channel groups) x (row partitions), one block per
// partition, sized to one wave of blocks (the small
// 7x7 and 14x14 layers fill the 132 SMs too; the forward and the backward
// each have their own grid). Per-channel reductions are
// two-level and deterministic, no atomics: each block writes one partial
// per channel (a fixed tree over its rows), a finalize kernel combines the
// partials of a channel in a fixed order in double (one warp per channel).
// Nothing is allocated (the workspace is the plan's) and every launch is on
// args->stream: capturable in a CUDA graph.
//
// Forward (training): stats (Welford partials of x) -> finalize (saved_*,
// running statistics) -> apply y = act((x - mean) k + b), k = weight
// invstd. Eval: the finalize copies the running statistics. Backward: one
// reduction pass over dy and x (sum dz, sum dz (x - mean), dz the masked
// dy) -> finalize (dweight, dbias with param_grad_beta; the dx
// coefficients) -> one apply pass dx = k dz + B (x - mean) + C0 (and dr =
// dz for bn_add_relu). bn_relu's ReLU mask is recomputed from x, the saved
// statistics, weight and bias (the forward computes k the same way, from
// the saved f32 invstd, so the mask is the forward's y > 0 exactly): its
// backward never reads y (bwd_needs), 4 bytes per element less per bf16
// value. bn_add_relu's mask needs the residual too, so its forward writes it
// as a bitmask (output 3, one bit an element), which the reduction pass reads
// instead of y (2 bytes a bf16 value become 1/8) as it writes dr = dz (the
// residual's gradient, when wanted); the apply pass reads dz back from dr:
// 12.1 bytes per bf16 value (14 when it read y). bn_add_bn_relu runs both
// batch norms' statistics passes and finalizes, then one apply pass over x
// and r; backward, one reduction pass over x, r, dy and the mask gives both
// batch norms' sums (one dz feeds both), then one pass writes dx and dr.
// bn2(r) and the residual's gradient are never written: 13 tensor passes
// (forward 5, backward 8) where batch_norm then bn_add_relu take 18 (7, 11). The reduction passes walk each partition from its end, the
// elementwise passes from its start: the first finds the end of x (dy),
// which the node before wrote last, still in the L2 (50 MB on an H100), the
// second the rows the first read last.
//
// tests/gpu/bn_bench times each on ResNet-50's shapes against the bytes
// floor; tests/gpu/fused_test checks each against the CPU reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdio.h>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "backends/fused/stoke_fused.h"
#include "stoke/ops.h"

namespace {

// The activation after the normalization: none (batch_norm), ReLU
// (bn_relu), residual add then ReLU (bn_add_relu).
// bn_add_bn_relu (kDual): the residual is a second batch norm's input.
enum act { kNone = 0, kRelu = 1, kAddRelu = 2, kDual = 3 };

// Blocks of 256 threads; resident per SM: 3 in the forward passes (at most
// 80 registers a thread), 2 in the backward ones, whose threads keep up to
// 5 coefficients x V channels and 2 or 3 tensors' loads in registers (at
// most 128: no spills).
constexpr int kBlock = 256;
constexpr int kFwdBlocksPerSm = 3, kBwdBlocksPerSm = 2;
#define FWD_BOUNDS __launch_bounds__(kBlock, kFwdBlocksPerSm)
#define BWD_BOUNDS __launch_bounds__(kBlock, kBwdBlocksPerSm)

// Rows a thread loads before using them, S tensors each: 64 to 128 bytes in
// flight per thread, 32 to 64 KB per SM, more than the H100's
// latency-bandwidth product (about 20 KB per SM).
template <int V, int S, bool BWD> struct unroll {
  static constexpr int n = V == 1 || S == 1 || (BWD && S == 2) ? 4 : 2;
};

// The launch geometry, a function of the shape, V and the SM count only:
// plan() and run() agree, results are reproducible on one device.
struct geom {
  int64_t m, c;     // rows, channels
  int v;            // channels per vector
  int64_t cv;       // vectors per row
  int bx, by;       // threads: vectors across x, rows across y
  unsigned gx;      // channel-vector blocks
  int parts;        // row partitions (grid y)
  int64_t rows;     // rows per partition (the last may hold fewer)
  double eps, momentum;
  double eps2, momentum2;  // bn_add_bn_relu's shortcut batch norm
  int act;
};

void make_geom(geom *g, int64_t m, int64_t c, int v, int sm_count, int blocks_per_sm) {
  g->m = m;
  g->c = c;
  g->v = v;
  g->cv = c / v;
  g->bx = (int)(g->cv < 32 ? g->cv : 32);
  int by = 1;
  while (by * 2 * g->bx <= kBlock) by *= 2;
  g->by = by;
  g->gx = (unsigned)((g->cv + g->bx - 1) / g->bx);
  // one full wave (never a second, nearly empty one), each thread with at least 4 rows
  int64_t target = (int64_t)blocks_per_sm * (sm_count > 0 ? sm_count : 132);
  int64_t p = target / g->gx;
  int64_t most = (m + (int64_t)by * 4 - 1) / ((int64_t)by * 4);
  if (p > most) p = most;
  if (p > 65535) p = 65535;
  if (p < 1) p = 1;
  g->rows = (m + p - 1) / p;
  g->parts = (int)((m + g->rows - 1) / g->rows);
}

// Workspace: per (channel, partition) a float2, then the backward's two
// per-channel f32 coefficient arrays, each 256-aligned.
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
// bn_add_bn_relu: two partial arrays (the backward's reduction writes both
// in one pass) and four coefficient arrays.
int n_bns(const geom *g) { return g->act == kDual ? 2 : 1; }
size_t part_bytes(const geom *g) { return align256((size_t)g->parts * (size_t)g->c * sizeof(float2)); }
size_t ws_bytes(const geom *g) {
  return n_bns(g) * (part_bytes(g) + 2 * align256((size_t)g->c * sizeof(float)));
}
float2 *ws_part(void *ws, const geom *g, int k) { return (float2 *)((char *)ws + (size_t)k * part_bytes(g)); }
float *ws_coef(void *ws, const geom *g, int k) {
  return (float *)((char *)ws + n_bns(g) * part_bytes(g) + (size_t)k * align256((size_t)g->c * sizeof(float)));
}

// ------------------------------------------------------------ vector access

template <typename T, int V>
__device__ __forceinline__ vec<T, V> ld(const T *p) {
  return *(const vec<T, V> *)p;
}

template <typename T, int V>
__device__ __forceinline__ void store_v(T *p, const float (&f)[V]) {
  vec<T, V> r;
#pragma unroll
  for (int i = 0; i < V; i++) r.v[i] = from_f<T>(f[i]);
  *(vec<T, V> *)p = r;
}

template <int V>
__device__ __forceinline__ void load_coef(const float *p, float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = p[i];
}

template <typename T, int V>
__device__ __forceinline__ void load_param(const T *p, float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = to_f(p[i]);
}

// The per-channel scale k = weight saved_invstd, in f32 from the saved f32
// invstd: the forward and bn_relu's backward compute the same k, so the
// recomputed ReLU mask is the forward's.
template <typename T, int V>
__device__ __forceinline__ void load_scale(const T *w, const float *si, float (&k)[V]) {
#pragma unroll
  for (int i = 0; i < V; i++) k[i] = to_f(w[i]) * si[i];
}

// The normalized value rounded to T, > 0: the forward's y > 0 (bn_relu).
template <typename T>
__device__ __forceinline__ bool positive(float v) {
  return to_f(from_f<T>(v)) > 0.0f;
}

// Rows [r0, r1) of partition blockIdx.y, and the thread's vector index.
struct part_rows {
  int64_t r0, r1, vi;
};
__device__ __forceinline__ part_rows rows_of(int64_t M, int64_t R) {
  part_rows p;
  p.r0 = (int64_t)blockIdx.y * R;
  p.r1 = p.r0 + R < M ? p.r0 + R : M;
  p.vi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  return p;
}

// ----------------------------------------------------------------- forward

// Floats of shared memory row_tree needs for W floats a thread: half the
// block's rows of threads (a third of what one slot per thread took for the
// statistics; bn_bench, H200: the forward at 64@56, 128@28, 1024@14 and
// 2048@7 4-12% faster with it, BENCHMARKS.md run 19).
inline size_t tree_floats(int bx, int by, int w) { return (size_t)(by / 2 > 0 ? by / 2 : 1) * bx * w; }

// The block's fixed tree over its rows of threads: for off = by/2, by/4,
// ..., 1, row ty + off puts its W floats in a slot (put) and row ty takes
// them (take), through half the block's rows of slots, so row 0 ends with
// the block's result. The same sums in the same order on every device.
template <int W, typename Put, typename Take>
__device__ __forceinline__ void row_tree(float *red, Put put, Take take) {
  int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x;
  for (int off = blockDim.y / 2; off > 0; off >>= 1) {
    float *slot = red + (size_t)((ty & (off - 1)) * bx + tx) * W;
    if (ty >= off && ty < 2 * off) put(slot);
    __syncthreads();
    if (ty < off) take(slot);
    __syncthreads();
  }
}

// The statistics' tree (row_tree, Chan's formula, the count shared by the
// V channels): row 0 ends with the block's (mean, M2), written as the
// partition's partial part[c P + blockIdx.y] when `on`.
template <int V>
__device__ __forceinline__ void stats_reduce(float *red, bool on, int64_t vi, int P, float2 *__restrict__ part,
                                             float cnt, float (&mean)[V], float (&m2)[V]) {
  row_tree<2 * V + 1>(
      red,
      [&](float *slot) {
        slot[0] = cnt;
#pragma unroll
        for (int i = 0; i < V; i++) slot[1 + i] = mean[i], slot[1 + V + i] = m2[i];
      },
      [&](const float *slot) {
        if (slot[0] == 0.0f) return;
        float nb = slot[0], n = cnt + nb, f = nb / n;
#pragma unroll
        for (int i = 0; i < V; i++) {
          float d = slot[1 + i] - mean[i];
          mean[i] += d * f;
          m2[i] += slot[1 + V + i] + d * d * cnt * f;
        }
        cnt = n;
      });
  if (threadIdx.y == 0 && on)
#pragma unroll
    for (int i = 0; i < V; i++) part[(vi * V + i) * P + blockIdx.y] = make_float2(mean[i], m2[i]);
}

// Block (channel group, partition p): per-thread Welford over its rows for
// its V channels, a fixed tree over the block's rows (stats_reduce), one
// partial per channel: part[c P + p] = (mean, M2) of rows
// [p R, min((p+1) R, M)).
template <typename T, int V>
__global__ void FWD_BOUNDS k_stats(const T *__restrict__ x, int64_t M, int64_t C, int64_t cv, int64_t R, int P,
                               float2 *__restrict__ part) {
  constexpr int U = unroll<V, 1, false>::n;
  extern __shared__ float sh[];  // tree_floats(bx, by, 2 V + 1)
  int ty = threadIdx.y, by = blockDim.y;
  part_rows pr = rows_of(M, R);
  float cnt = 0, mean[V], m2[V];
#pragma unroll
  for (int i = 0; i < V; i++) mean[i] = m2[i] = 0;
  if (pr.vi < cv) {
    const T *xp = x + pr.vi * V;
    for (int64_t r = pr.r1 - 1 - ty; r >= pr.r0; r -= (int64_t)by * U) {
      vec<T, V> rx[U];
#pragma unroll
      for (int u = 0; u < U; u++)
        if (r - (int64_t)u * by >= pr.r0) rx[u] = ld<T, V>(xp + (r - (int64_t)u * by) * C);
#pragma unroll
      for (int u = 0; u < U; u++)
        if (r - (int64_t)u * by >= pr.r0) {
          cnt += 1.0f;
          float inv = __frcp_rn(cnt);
#pragma unroll
          for (int i = 0; i < V; i++) {
            float f = to_f(rx[u].v[i]), d = f - mean[i];
            mean[i] = fmaf(d, inv, mean[i]);
            m2[i] = fmaf(d, f - mean[i], m2[i]);
          }
        }
    }
  }
  stats_reduce<V>(sh, pr.vi < cv, pr.vi, P, part, cnt, mean, m2);
}

constexpr int kFinWarps = 8;  // channels per finalize block, one warp each
constexpr int kFinChunk = 8;  // partials a lane loads before combining them

// A warp's sum of v in double, the same in every lane (lane 0's: the
// butterfly's order differs per lane).
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return __shfl_sync(0xffffffffu, v, 0);
}

// One warp per channel, in double: the mean of the M values as the
// partitions' means weighted by their row counts, then M2 as the sum of the
// partitions' M2 plus n_p (mean_p - mean)^2 (the two-pass form of Chan's
// combination: one division, where the pairwise form divides per partial,
// a chain of double divisions that made this kernel 5 us); lane l takes
// partitions l, l + 32, ..., kFinChunk loads in flight, then a butterfly.
// Training: saved_* and the running statistics (unbiased variance for
// running_var); eval: saved_* from the running statistics.
__global__ void k_fin_fwd(const float2 *__restrict__ part, int P, int64_t C, int64_t M, int64_t R, double eps,
                          double mom, int training, float *rm, float *rv, float *__restrict__ sm,
                          float *__restrict__ si) {
  int lane = threadIdx.x & 31;
  int64_t c = (int64_t)blockIdx.x * kFinWarps + (threadIdx.x >> 5);
  if (c >= C) return;
  double mean = 0, q = 0;
  if (training) {
    const float2 *pc = part + c * P;
    for (int pass = 0; pass < 2; pass++) {
      double acc = 0;
      for (int p0 = lane; p0 < P; p0 += 32 * kFinChunk) {
        float2 v[kFinChunk];  // loaded before any is used: one L2 round trip per chunk
#pragma unroll
        for (int j = 0; j < kFinChunk; j++)
          if (p0 + 32 * j < P) v[j] = pc[p0 + 32 * j];
#pragma unroll
        for (int j = 0; j < kFinChunk; j++) {
          int64_t r0 = (int64_t)(p0 + 32 * j) * R;
          if (p0 + 32 * j >= P) break;
          double nb = (double)(r0 + R < M ? R : M - r0), d = (double)v[j].x - mean;
          acc = pass == 0 ? fma(nb, (double)v[j].x, acc) : acc + (double)v[j].y + nb * d * d;
        }
      }
      if (pass == 0) mean = warp_sum_d(acc) / (double)M;
      else q = warp_sum_d(acc);
    }
  }
  if (lane == 0) bn_finish_channel(training, mean, q, M, eps, mom, rm, rv, sm, si, c);
}

// bn_add_relu's ReLU bitmask (stoke/ops.h): bit e of the mask is element e of y > 0, as stored
// (rounded to T). Elements o .. o + V - 1 of a thread's vector: with V = 8 (bf16, fp16) o is a
// multiple of 8 (C is) and the thread owns the byte; otherwise V bits of a 32-bit word shared with
// other threads, set by atomicOr into a mask cleared before the pass.
template <typename T, int V>
__device__ __forceinline__ void store_mask(uint8_t *mask, int64_t o, const float (&f)[V]) {
  unsigned bits = 0;
#pragma unroll
  for (int i = 0; i < V; i++) bits |= (to_f(from_f<T>(f[i])) > 0.0f ? 1u : 0u) << i;
  if (V == 8) mask[o >> 3] = (uint8_t)bits;
  else if (bits) atomicOr(reinterpret_cast<unsigned *>(mask) + (o >> 5), bits << (o & 31));
}

// The V mask bits of elements o .. o + V - 1 (bit i: element o + i).
template <int V> __device__ __forceinline__ unsigned load_mask(const uint8_t *mask, int64_t o) {
  if (V == 8) return mask[o >> 3];
  return (reinterpret_cast<const unsigned *>(mask)[o >> 5] >> (o & 31)) & ((1u << V) - 1u);
}

// y = act((x - mean) k + b [rounded to T, + r]): the bn value is rounded to
// T before the add, as the unfused batch_norm -> add nodes do; bn_add_bn_relu
// adds bn2(r) = (r - mean2) k2 + b2, rounded to T as the shortcut's
// batch_norm rounds its y. Walks the partition from its start (the L2 still
// holds what k_stats read last). bn_add_bn_relu's runs 2 blocks an SM (its
// grid made for that, fwd_v): 6 coefficients x V channels in registers
// spilled at the forward's 3 (80 registers).
template <typename T, int V, int ACT>
__global__ void __launch_bounds__(kBlock, ACT == kDual ? kBwdBlocksPerSm : kFwdBlocksPerSm)
    k_apply(const T *__restrict__ x, const T *__restrict__ res, T *__restrict__ y, uint8_t *__restrict__ mask,
            const float *__restrict__ smean, const float *__restrict__ sinv, const T *__restrict__ w,
            const T *__restrict__ b, const float *__restrict__ smean2, const float *__restrict__ sinv2,
            const T *__restrict__ w2, const T *__restrict__ b2, int64_t M, int64_t C, int64_t cv, int64_t R) {
  constexpr bool kRes = ACT == kAddRelu || ACT == kDual;  // a second tensor read, the ReLU's bitmask written
  constexpr int U = unroll<V, (kRes ? 2 : 1), false>::n;
  part_rows pr = rows_of(M, R);
  if (pr.vi >= cv) return;
  int64_t c0 = pr.vi * V;
  float mean[V], k[V], s[V], mean2[V], k2[V], s2[V];
  load_coef<V>(smean + c0, mean);
  load_scale<T, V>(w + c0, sinv + c0, k);
  load_param<T, V>(b + c0, s);
  if constexpr (ACT == kDual) {
    load_coef<V>(smean2 + c0, mean2);
    load_scale<T, V>(w2 + c0, sinv2 + c0, k2);
    load_param<T, V>(b2 + c0, s2);
  }
  int by = blockDim.y;
  for (int64_t r = pr.r0 + threadIdx.y; r < pr.r1; r += (int64_t)by * U) {
    vec<T, V> rx[U], rr[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (r + (int64_t)u * by < pr.r1) {
        int64_t o = (r + (int64_t)u * by) * C + c0;
        rx[u] = ld<T, V>(x + o);
        if (kRes) rr[u] = ld<T, V>(res + o);
      }
#pragma unroll
    for (int u = 0; u < U; u++)
      if (r + (int64_t)u * by < pr.r1) {
        float f[V];
#pragma unroll
        for (int i = 0; i < V; i++) {
          float v = (to_f(rx[u].v[i]) - mean[i]) * k[i] + s[i];
          if (ACT == kAddRelu) v = to_f(from_f<T>(v)) + to_f(rr[u].v[i]);
          if (ACT == kDual) v = to_f(from_f<T>(v)) + to_f(from_f<T>((to_f(rr[u].v[i]) - mean2[i]) * k2[i] + s2[i]));
          f[i] = ACT == kNone || !(v <= 0.0f) ? v : 0.0f;  // NaN stays NaN, as torch.relu
        }
        store_v<T, V>(y + (r + (int64_t)u * by) * C + c0, f);
        if (kRes) store_mask<T, V>(mask, (r + (int64_t)u * by) * C + c0, f);
      }
  }
}

// ----------------------------------------------------------------- backward

// The per-thread pieces of the backward: dz for element i of a row, the
// ReLU's mask applied (bn_relu: recomputed; bn_add_relu, bn_add_bn_relu:
// bit i of the forward's bitmask, y > 0 as stored, so NaN gives 0).
template <typename T, int V, int ACT>
struct dz_of {
  float mean[V], k[V], s[V];  // bn_relu's recomputed mask: (x - mean) k + b > 0
  __device__ __forceinline__ void load(const float *smean, const float *sinv, const T *w, const T *b, int64_t c0) {
    load_coef<V>(smean + c0, mean);
    if (ACT == kRelu) {
      load_scale<T, V>(w + c0, sinv + c0, k);
      load_param<T, V>(b + c0, s);
    }
  }
  __device__ __forceinline__ float operator()(int i, T dy, T x, unsigned bits) const {
    if (ACT == kRelu) return positive<T>((to_f(x) - mean[i]) * k[i] + s[i]) ? to_f(dy) : 0.0f;
    if (ACT == kAddRelu || ACT == kDual) return (bits >> i) & 1u ? to_f(dy) : 0.0f;
    return to_f(dy);
  }
};

// Block (channel group, partition p): part[c P + p] = (sum dz, sum dz (x - mean)).
// bn_add_relu: dr = dz too, when dr is given (the apply pass then reads dz from it). dr may be dy's
// memory: each element is read before it is written, by the same thread. bn_add_bn_relu: also
// part2[c P + p] = (sum dz, sum dz (r - mean2)), the shortcut's sums from the same dz, and dz is not
// written (its apply pass makes it again from dy and the mask, 1/8 byte an element).
template <typename T, int V, int ACT>
__global__ void BWD_BOUNDS k_gsum(const T *__restrict__ x, const T *__restrict__ r, const T *dy,
                                  const uint8_t *__restrict__ mask, const float *__restrict__ smean,
                                  const float *__restrict__ smean2, const float *__restrict__ sinv,
                                  const T *__restrict__ w, const T *__restrict__ b, int64_t M, int64_t C, int64_t cv,
                                  int64_t R, int P, float2 *__restrict__ part, float2 *__restrict__ part2, T *dr) {
  constexpr bool kMask = ACT == kAddRelu || ACT == kDual;
  constexpr int W = ACT == kDual ? 3 : 2;  // sums a channel: dz, dz (x - mean) [, dz (r - mean2)]
  constexpr int U = unroll<V, (kMask ? 3 : 2), true>::n;
  extern __shared__ float sh[];  // tree_floats(bx, by, W V)
  int ty = threadIdx.y, by = blockDim.y;
  part_rows pr = rows_of(M, R);
  float s1[V], s2[V], s3[V];
#pragma unroll
  for (int i = 0; i < V; i++) s1[i] = s2[i] = s3[i] = 0;
  if (pr.vi < cv) {
    int64_t c0 = pr.vi * V;
    dz_of<T, V, ACT> dz;
    dz.load(smean, sinv, w, b, c0);
    float mean2[V];
    if constexpr (ACT == kDual) load_coef<V>(smean2 + c0, mean2);
    for (int64_t rw = pr.r1 - 1 - ty; rw >= pr.r0; rw -= (int64_t)by * U) {
      vec<T, V> rx[U], rd[U], rr[U];
      unsigned rm[U];
#pragma unroll
      for (int u = 0; u < U; u++)
        if (rw - (int64_t)u * by >= pr.r0) {
          int64_t o = (rw - (int64_t)u * by) * C + c0;
          rx[u] = ld<T, V>(x + o);
          if (ACT == kDual) rr[u] = ld<T, V>(r + o);
          rd[u] = ld<T, V>(dy + o);
          rm[u] = kMask ? load_mask<V>(mask, o) : 0u;
        }
#pragma unroll
      for (int u = 0; u < U; u++)
        if (rw - (int64_t)u * by >= pr.r0) {
          float g[V];
#pragma unroll
          for (int i = 0; i < V; i++) {
            g[i] = dz(i, rd[u].v[i], rx[u].v[i], rm[u]);
            s1[i] += g[i];
            s2[i] = fmaf(g[i], to_f(rx[u].v[i]) - dz.mean[i], s2[i]);
            if (ACT == kDual) s3[i] = fmaf(g[i], to_f(rr[u].v[i]) - mean2[i], s3[i]);
          }
          if (ACT == kAddRelu && dr) store_v<T, V>(dr + (rw - (int64_t)u * by) * C + c0, g);
        }
    }
  }
  row_tree<W * V>(
      sh,
      [&](float *slot) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          slot[i] = s1[i], slot[V + i] = s2[i];
          if (ACT == kDual) slot[2 * V + i] = s3[i];
        }
      },
      [&](const float *slot) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          s1[i] += slot[i], s2[i] += slot[V + i];
          if (ACT == kDual) s3[i] += slot[2 * V + i];
        }
      });
  if (ty == 0 && pr.vi < cv)
#pragma unroll
    for (int i = 0; i < V; i++) {
      part[(pr.vi * V + i) * P + blockIdx.y] = make_float2(s1[i], s2[i]);
      if (ACT == kDual) part2[(pr.vi * V + i) * P + blockIdx.y] = make_float2(s1[i], s3[i]);
    }
}

// One warp per channel: the partition sums in a fixed order (double, lanes
// then a butterfly); dbias = sum dz, dweight = invstd sum dz (x - mean),
// each with param_grad_beta; the dx coefficients, dx = k dz + B (x - mean)
// + C0: in training B = -k invstd dweight / m, C0 = -k dbias / m (eval: 0, 0).
template <typename T>
__global__ void k_fin_bwd(const float2 *__restrict__ part, int P, int64_t C, double m, int training,
                          const T *__restrict__ w, const float *__restrict__ si, T *dw, float bw, T *db, float bb,
                          float *__restrict__ cb, float *__restrict__ cc) {
  int lane = threadIdx.x & 31;
  int64_t c = (int64_t)blockIdx.x * kFinWarps + (threadIdx.x >> 5);
  if (c >= C) return;
  double s1 = 0, s2 = 0;
  for (int p0 = lane; p0 < P; p0 += 32 * kFinChunk) {
    float2 v[kFinChunk];
#pragma unroll
    for (int j = 0; j < kFinChunk; j++) v[j] = p0 + 32 * j < P ? part[c * P + p0 + 32 * j] : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kFinChunk; j++) s1 += (double)v[j].x, s2 += (double)v[j].y;
  }
  for (int off = 16; off > 0; off >>= 1) {
    s1 += __shfl_xor_sync(0xffffffffu, s1, off);
    s2 += __shfl_xor_sync(0xffffffffu, s2, off);
  }
  if (lane) return;
  double invstd = (double)si[c], dwv = s2 * invstd;
  if (dw) acc(&dw[c], bw, (float)dwv);
  if (db) acc(&db[c], bb, (float)s1);
  if (!cb) return;
  double k = (double)(to_f(w[c]) * si[c]);
  cb[c] = training ? (float)(-k * invstd * dwv / m) : 0.0f;
  cc[c] = training ? (float)(-k * s1 / m) : 0.0f;
}

// dx = k dz + B (x - mean) + C0 (when dx is wanted) and dr = dz
// (bn_add_relu, when wanted) in one pass, from the partition's start.
// DZ (bn_add_relu): dz is read from dr, which the reduction pass wrote,
// instead of being made from dy and y.
template <typename T, int V, int ACT, bool DZ = false>
__global__ void BWD_BOUNDS k_dx(const T *__restrict__ x, const T *__restrict__ dy, const uint8_t *__restrict__ mask,
                            T *__restrict__ dx, T *__restrict__ dr, const float *__restrict__ smean,
                            const float *__restrict__ sinv, const T *__restrict__ w, const T *__restrict__ b,
                            const float *__restrict__ cb, const float *__restrict__ cc, int64_t M, int64_t C,
                            int64_t cv, int64_t R) {
  constexpr int U = unroll<V, (ACT == kAddRelu && !DZ ? 3 : 2), true>::n;
  part_rows pr = rows_of(M, R);
  if (pr.vi >= cv) return;
  int64_t c0 = pr.vi * V;
  dz_of<T, V, ACT> dz;
  dz.load(smean, sinv, w, b, c0);
  float a[V], bb[V], c00[V];
  bool want_x = dx != nullptr || ACT == kRelu;
  if (dx) {
    if (ACT == kRelu) {
#pragma unroll
      for (int i = 0; i < V; i++) a[i] = dz.k[i];
    } else {
      load_scale<T, V>(w + c0, sinv + c0, a);
    }
    load_coef<V>(cb + c0, bb);
    load_coef<V>(cc + c0, c00);
  }
  int by = blockDim.y;
  for (int64_t r = pr.r0 + threadIdx.y; r < pr.r1; r += (int64_t)by * U) {
    vec<T, V> rx[U], rd[U];
    unsigned rm[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (r + (int64_t)u * by < pr.r1) {
        int64_t o = (r + (int64_t)u * by) * C + c0;
        if (want_x) rx[u] = ld<T, V>(x + o);
        rd[u] = ld<T, V>((DZ ? dr : dy) + o);
        rm[u] = ACT == kAddRelu && !DZ ? load_mask<V>(mask, o) : 0u;
      }
#pragma unroll
    for (int u = 0; u < U; u++)
      if (r + (int64_t)u * by < pr.r1) {
        int64_t o = (r + (int64_t)u * by) * C + c0;
        float g[V];
#pragma unroll
        for (int i = 0; i < V; i++)
          g[i] = DZ ? to_f(rd[u].v[i]) : dz(i, rd[u].v[i], rx[u].v[i], rm[u]);
        if (ACT == kAddRelu && dr && !DZ) store_v<T, V>(dr + o, g);
        if (dx) {
#pragma unroll
          for (int i = 0; i < V; i++) g[i] = a[i] * g[i] + bb[i] * (to_f(rx[u].v[i]) - dz.mean[i]) + c00[i];
          store_v<T, V>(dx + o, g);
        }
      }
  }
}

// bn_add_bn_relu's gradients in one pass: dx = k dz + B (x - mean) + C0 and
// dr = k2 dz + B2 (r - mean2) + C02, dz = dy masked (each when wanted). dx
// or dr may share the memory of x, r or dy (the planner's in-place
// gradients): each element is read before it is written, by one thread, so
// none of them is __restrict__. Not k_dx with one more case: two outputs
// with their own coefficients, 8 arrays of V, allow one row a thread in
// flight (k_dx keeps 2 to 4), and k_dx's DZ path (dz read back) has no
// counterpart here.
template <typename T, int V>
__global__ void BWD_BOUNDS k_dx2(const T *x, const T *r, const T *dy, const uint8_t *__restrict__ mask, T *dx, T *dr,
                                 const float *__restrict__ smean, const float *__restrict__ sinv,
                                 const T *__restrict__ w, const float *__restrict__ cb, const float *__restrict__ cc,
                                 const float *__restrict__ smean2, const float *__restrict__ sinv2,
                                 const T *__restrict__ w2, const float *__restrict__ cb2,
                                 const float *__restrict__ cc2, int64_t M, int64_t C, int64_t cv, int64_t R) {
  // 8 coefficients x V channels in registers: with 16-byte vectors of 2-byte values (V = 8) one row
  // at a time (two spilled at 128 registers), 24 KB in flight an SM
  constexpr int U = V == 8 ? 1 : unroll<V, 3, true>::n;
  part_rows pr = rows_of(M, R);
  if (pr.vi >= cv) return;
  int64_t c0 = pr.vi * V;
  float a[V], bb[V], c00[V], mean[V], a2[V], bb2[V], c02[V], mean2[V];
  load_coef<V>(smean + c0, mean);
  load_coef<V>(smean2 + c0, mean2);
  if (dx) {
    load_scale<T, V>(w + c0, sinv + c0, a);
    load_coef<V>(cb + c0, bb);
    load_coef<V>(cc + c0, c00);
  }
  if (dr) {
    load_scale<T, V>(w2 + c0, sinv2 + c0, a2);
    load_coef<V>(cb2 + c0, bb2);
    load_coef<V>(cc2 + c0, c02);
  }
  int by = blockDim.y;
  for (int64_t rw = pr.r0 + threadIdx.y; rw < pr.r1; rw += (int64_t)by * U) {
    vec<T, V> rx[U], rr[U], rd[U];
    unsigned rm[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (rw + (int64_t)u * by < pr.r1) {
        int64_t o = (rw + (int64_t)u * by) * C + c0;
        if (dx) rx[u] = ld<T, V>(x + o);
        if (dr) rr[u] = ld<T, V>(r + o);
        rd[u] = ld<T, V>(dy + o);
        rm[u] = load_mask<V>(mask, o);
      }
#pragma unroll
    for (int u = 0; u < U; u++)
      if (rw + (int64_t)u * by < pr.r1) {
        int64_t o = (rw + (int64_t)u * by) * C + c0;
        float g[V], f[V];
#pragma unroll
        for (int i = 0; i < V; i++) g[i] = (rm[u] >> i) & 1u ? to_f(rd[u].v[i]) : 0.0f;
        if (dx) {
#pragma unroll
          for (int i = 0; i < V; i++) f[i] = a[i] * g[i] + bb[i] * (to_f(rx[u].v[i]) - mean[i]) + c00[i];
          store_v<T, V>(dx + o, f);
        }
        if (dr) {
#pragma unroll
          for (int i = 0; i < V; i++) f[i] = a2[i] * g[i] + bb2[i] * (to_f(rr[u].v[i]) - mean2[i]) + c02[i];
          store_v<T, V>(dr + o, f);
        }
      }
  }
}

// ------------------------------------------------------------------- checks

const char *op_name(int act) {
  return act == kDual      ? STOKE_OP_BN_ADD_BN_RELU
         : act == kAddRelu ? STOKE_OP_BN_ADD_RELU
         : act == kRelu    ? STOKE_OP_BN_RELU
                           : STOKE_OP_BATCH_NORM;
}

// An attribute pair (eps, momentum) from index i: eps > 0, momentum in [0, 1].
stoke_err *eps_momentum(const stoke_kernel_args_v1 *a, const char *op, int i, double *eps, double *mom) {
  *eps = a->node->attrs[i].f;
  *mom = a->node->attrs[i + 1].f;
  if (!(*eps > 0 && isfinite(*eps)) || !(*mom >= 0 && *mom <= 1))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %seps %g must be > 0 and %smomentum %g in [0, 1]", op,
                      stoke_node_name(a), i ? "shortcut_" : "", *eps, i ? "shortcut_" : "", *mom);
  return NULL;
}

// x, y (and r) NHWC of dtype dt, weight and bias [C] of dt, running and
// saved statistics f32 [C]; backward: the gradients that are wanted match
// their values, and what the backward reads (bwd_needs) holds data.
stoke_err *check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int act, bool bwd, bool run, int sm_count,
                 geom *g, int *v_out) {
  const char *op = op_name(act);
  bool dual = act == kDual, add = act == kAddRelu || dual;
  int n_in = dual ? 10 : add ? 6 : 5;
  int n_out = dual ? 6 : add ? 4 : 3;
  if (a->n_in < n_in || a->n_out < n_out || !a->in || !a->out || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs %d inputs and %d outputs (and gradients in backward)", op,
                      stoke_node_name(a), n_in, n_out);
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs < (dual ? 4 : 2))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes eps and momentum missing", op, stoke_node_name(a));
  CHECK(eps_momentum(a, op, STOKE_BATCH_NORM_EPS, &g->eps, &g->momentum));
  g->eps2 = g->momentum2 = 0;
  if (dual) CHECK(eps_momentum(a, op, STOKE_BN2_EPS, &g->eps2, &g->momentum2));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (!stoke_is_nhwc(x) || !stoke_is_nhwc(y) || !stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "%s '%s': the fused kernels take 4-D NHWC x and y of one shape, got x %s, y %s", op,
                      stoke_node_name(a), stoke_shape_str(&x->shape).s, stoke_shape_str(&y->shape).s);
  int64_t c = x->shape.d[1], m = x->shape.d[0] * x->shape.d[2] * x->shape.d[3];
  const char *const in_names[] = {"x", "weight", "bias", "running_mean", "running_var", dual ? "r" : "residual",
                                  "shortcut weight", "shortcut bias", "shortcut running_mean", "shortcut running_var"};
  static const char *const out_names[] = {"y", "saved_mean", "saved_invstd", "mask", "shortcut saved_mean",
                                          "shortcut saved_invstd"};
  for (int i = 1; i < n_in; i++)
    if (i != 5 && (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != c))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a), in_names[i],
                        stoke_shape_str(&a->in[i].shape).s, stoke_shape_str(&x->shape).s, (long long)c);
  for (int j = 1; j < n_out; j++)
    if (j != 3 && (a->out[j].shape.ndim != 1 || a->out[j].shape.d[0] != c))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a), out_names[j],
                        stoke_shape_str(&a->out[j].shape).s, stoke_shape_str(&x->shape).s, (long long)c);
  /* running statistics (inputs 3, 4, 8, 9) and saved ones (outputs 1, 2, 4, 5) are f32 */
  for (int i = 0; i < n_in; i++)
    CHECK(stoke_check_dtype(a, op, in_names[i], &a->in[i], i == 3 || i == 4 || i == 8 || i == 9 ? STOKE_F32 : dt));
  for (int j = 0; j < n_out; j++)
    if (j != 3) CHECK(stoke_check_dtype(a, op, out_names[j], &a->out[j], j ? STOKE_F32 : dt));
  if (add && (!stoke_is_nhwc(&a->in[5]) || !stoke_same_shape(&a->in[5].shape, &x->shape)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the residual %s must be NHWC of x's shape %s", op, stoke_node_name(a),
                      stoke_shape_str(&a->in[5].shape).s, stoke_shape_str(&x->shape).s);
  const stoke_tensor *mk = add ? &a->out[STOKE_BN_ADD_RELU_MASK] : nullptr;
  if (mk) {
    CHECK(stoke_check_relu_mask(a, op, mk, x, run));
    if (mk->data && ((uintptr_t)mk->data & 3u))  // atomicOr sets its bits a word at a time (store_mask)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the ReLU mask must be 4-byte aligned", op, stoke_node_name(a));
  }
  // vectors of 16 bytes when C allows and every activation is aligned
  int v = (int)(16 / stoke_dtype_size(dt));
  if (c % v) v = 1;
  const void *acts[] = {x->data, y->data, add ? a->in[5].data : NULL, bwd ? a->dout[0].data : NULL,
                        bwd ? a->din[0].data : NULL, bwd && add ? a->din[5].data : NULL};
  for (const void *p : acts)
    if (p && !aligned16(p)) v = 1;
  *v_out = v;
  g->act = act;
  if (m < 1 || c < 1) /* make_geom divides by the rows and loops on the channels */
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': x is %s, empty: no batch norm to run", op, stoke_node_name(a),
                      stoke_shape_str(&x->shape).s);
  make_geom(g, m, c, v, sm_count, bwd ? kBwdBlocksPerSm : kFwdBlocksPerSm);
  if (!bwd) {
    for (int i = 0; i < n_in; i++) CHECK(stoke_check_data(a, op, in_names[i], &a->in[i], run));
    for (int j = 0; j < n_out; j++)
      if (j != 3) CHECK(stoke_check_data(a, op, out_names[j], &a->out[j], run));
    if (run && a->training && m < 2)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': training needs more than 1 value per channel, x is %s", op,
                        stoke_node_name(a), stoke_shape_str(&x->shape).s);
  } else {
    for (int i = 0; i < 3; i++) CHECK(stoke_check_grad(a, op, in_names[i], &a->din[i], &a->in[i]));
    if (add) CHECK(stoke_check_grad(a, op, "residual", &a->din[5], &a->in[5]));
    CHECK(stoke_check_grad(a, op, "y", &a->dout[0], y));
    if ((a->din[0].data && !stoke_is_nhwc(&a->din[0])) || (a->dout[0].data && !stoke_is_nhwc(&a->dout[0])) ||
        (add && a->din[5].data && !stoke_is_nhwc(&a->din[5])))
      return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': dx, dy (and dr) must be NHWC as x", op, stoke_node_name(a));
    CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
    if (act == kRelu) CHECK(stoke_check_data(a, op, "bias (the ReLU's mask is recomputed)", &a->in[2], run));
    CHECK(stoke_check_data(a, op, "x (the forward input)", x, run));
    CHECK(stoke_check_data(a, op, "weight", &a->in[1], run));
    CHECK(stoke_check_data(a, op, "saved_mean", &a->out[1], run));
    CHECK(stoke_check_data(a, op, "saved_invstd", &a->out[2], run));
    if (dual) {
      /* both batch norms' gradients come from the one masked dy: everything is read */
      for (int i = 6; i < 8; i++) CHECK(stoke_check_grad(a, op, in_names[i], &a->din[i], &a->in[i]));
      CHECK(stoke_check_data(a, op, "r (the shortcut's forward input)", &a->in[5], run));
      CHECK(stoke_check_data(a, op, "shortcut weight", &a->in[6], run));
      CHECK(stoke_check_data(a, op, "shortcut saved_mean", &a->out[4], run));
      CHECK(stoke_check_data(a, op, "shortcut saved_invstd", &a->out[5], run));
      CHECK(stoke_check_data(a, op, "mask", &a->out[3], run));
    }
  }
  if (run && a->workspace_bytes < ws_bytes(g))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': workspace of %zu bytes, the kernel needs %zu", op, stoke_node_name(a),
                      a->workspace_bytes, ws_bytes(g));
  return NULL;
}

int sm_count_of(const stoke_kernel_args_v1 *a) {
  const stoke_fused_engine *e = (const stoke_fused_engine *)a->engine;
  return e && e->dev ? e->dev->sm_count : 0;
}

template <typename T, int ACT, bool BWD>
stoke_err *plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  geom g;
  int v;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(check(a, dtype_of<T>::value, ACT, BWD, false, sm_count_of(a), &g, &v));
  // the plan sees no data pointers: size for the vector geometry and for
  // V = 1 (misaligned data at run time), whichever needs more
  size_t w = ws_bytes(&g);
  geom g1 = g;
  make_geom(&g1, g.m, g.c, 1, sm_count_of(a), BWD ? kBwdBlocksPerSm : kFwdBlocksPerSm);
  if (ws_bytes(&g1) > w) w = ws_bytes(&g1);
  if (ws) *ws = w;
  return NULL;
}

dim3 block_of(const geom &g) { return dim3((unsigned)g.bx, (unsigned)g.by); }
dim3 grid_of(const geom &g) { return dim3(g.gx, (unsigned)g.parts); }
unsigned fin_blocks(const geom &g) { return (unsigned)((g.c + kFinWarps - 1) / kFinWarps); }

// Each batch norm's statistics and finalize (bn_add_bn_relu's shortcut
// second, the one partial array used in turn), then one apply pass.
template <typename T, int V, int ACT>
stoke_err *fwd_v(const stoke_kernel_args_v1 *a, const geom &g) {
  cudaStream_t st = (cudaStream_t)a->stream;
  float2 *part = ws_part(a->workspace, &g, 0);
  /* per batch norm: x, running mean and variance, saved mean and invstd */
  static const int io[2][5] = {{0, 3, 4, 1, 2}, {5, 8, 9, STOKE_BN2_SAVED_MEAN, STOKE_BN2_SAVED_MEAN + 1}};
  for (int k = 0; k < n_bns(&g); k++) {
    if (a->training) {
      size_t shm = tree_floats(g.bx, g.by, 2 * V + 1) * sizeof(float);
      k_stats<T, V><<<grid_of(g), block_of(g), shm, st>>>((const T *)a->in[io[k][0]].data, g.m, g.c, g.cv, g.rows,
                                                          g.parts, part);
      STOKE_CUDA_LAUNCH(stoke_node_name(a));
    }
    k_fin_fwd<<<fin_blocks(g), 32 * kFinWarps, 0, st>>>(
        part, g.parts, g.c, g.m, g.rows, k ? g.eps2 : g.eps, k ? g.momentum2 : g.momentum, a->training,
        (float *)a->in[io[k][1]].data, (float *)a->in[io[k][2]].data, (float *)a->out[io[k][3]].data,
        (float *)a->out[io[k][4]].data);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  constexpr bool kRes = ACT == kAddRelu || ACT == kDual, kTwo = ACT == kDual;
  uint8_t *mask = kRes ? (uint8_t *)a->out[STOKE_BN_ADD_RELU_MASK].data : nullptr;
  if (kRes && V != 8)  // bits set by atomicOr (store_mask)
    STOKE_CUDA(cudaMemsetAsync(mask, 0, (size_t)a->out[STOKE_BN_ADD_RELU_MASK].shape.d[0], st));
  geom ga = g;  // bn_add_bn_relu's apply pass runs 2 blocks an SM
  if (kTwo) make_geom(&ga, g.m, g.c, V, sm_count_of(a), kBwdBlocksPerSm);
  k_apply<T, V, ACT><<<grid_of(ga), block_of(ga), 0, st>>>(
      (const T *)a->in[0].data, kRes ? (const T *)a->in[5].data : nullptr, (T *)a->out[0].data, mask,
      (const float *)a->out[1].data, (const float *)a->out[2].data, (const T *)a->in[1].data,
      (const T *)a->in[2].data, kTwo ? (const float *)a->out[STOKE_BN2_SAVED_MEAN].data : nullptr,
      kTwo ? (const float *)a->out[STOKE_BN2_SAVED_MEAN + 1].data : nullptr,
      kTwo ? (const T *)a->in[STOKE_BN2_WEIGHT].data : nullptr,
      kTwo ? (const T *)a->in[STOKE_BN2_WEIGHT + 1].data : nullptr, ga.m, ga.c, ga.cv, ga.rows);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

template <typename T, int V, int ACT>
stoke_err *bwd_v(const stoke_kernel_args_v1 *a, const geom &g) {
  cudaStream_t st = (cudaStream_t)a->stream;
  T *dx = (T *)a->din[0].data, *dw = (T *)a->din[1].data, *db = (T *)a->din[2].data;
  T *dr = ACT == kAddRelu ? (T *)a->din[5].data : nullptr;
  if (!dx && !dw && !db && !dr) return NULL;
  const T *x = (const T *)a->in[0].data, *dy = (const T *)a->dout[0].data;
  const uint8_t *mask = ACT == kAddRelu ? (const uint8_t *)a->out[STOKE_BN_ADD_RELU_MASK].data : nullptr;
  const T *w = (const T *)a->in[1].data, *b = ACT == kRelu ? (const T *)a->in[2].data : nullptr;
  const float *sm = (const float *)a->out[1].data, *si = (const float *)a->out[2].data;
  float2 *part = (float2 *)a->workspace;
  float *cb = ws_coef(a->workspace, &g, 0), *cc = ws_coef(a->workspace, &g, 1);
  /* bn_add_relu with both passes: the first writes dr = dz, the second reads it back (not when dr
   * is x's memory, which the passes still read) */
  const bool dz_in_dr = ACT == kAddRelu && dr && (dx || dw || db) && (const T *)dr != x;
  if (dx || dw || db) {
    size_t shm = tree_floats(g.bx, g.by, 2 * V) * sizeof(float);
    k_gsum<T, V, ACT><<<grid_of(g), block_of(g), shm, st>>>(x, nullptr, dy, mask, sm, nullptr, si, w, b, g.m, g.c,
                                                            g.cv, g.rows, g.parts, part, nullptr,
                                                            dz_in_dr ? dr : nullptr);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
    k_fin_bwd<T><<<fin_blocks(g), 32 * kFinWarps, 0, st>>>(part, g.parts, g.c, (double)g.m, a->training, w, si,
                                                           dw, stoke_grad_beta(a, 1), db, stoke_grad_beta(a, 2),
                                                           dx ? cb : nullptr, cc);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  if (dz_in_dr && dx) {
    k_dx<T, V, ACT, true><<<grid_of(g), block_of(g), 0, st>>>(x, dy, mask, dx, dr, sm, si, w, b, cb, cc, g.m, g.c,
                                                              g.cv, g.rows);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  } else if (!dz_in_dr && (dx || dr)) {
    k_dx<T, V, ACT><<<grid_of(g), block_of(g), 0, st>>>(x, dy, mask, dx, dr, sm, si, w, b, cb, cc, g.m, g.c, g.cv,
                                                        g.rows);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  return NULL;
}

// bn_add_bn_relu backward: one reduction pass over x, r, dy and the mask
// (both batch norms' sums), the two finalizes, one pass writing dx and dr.
template <typename T, int V>
stoke_err *bwd2_v(const stoke_kernel_args_v1 *a, const geom &g) {
  cudaStream_t st = (cudaStream_t)a->stream;
  T *dx = (T *)a->din[0].data, *dw = (T *)a->din[1].data, *db = (T *)a->din[2].data;
  T *dr = (T *)a->din[5].data, *dw2 = (T *)a->din[6].data, *db2 = (T *)a->din[7].data;
  if (!dx && !dw && !db && !dr && !dw2 && !db2) return NULL;
  const T *x = (const T *)a->in[0].data, *r = (const T *)a->in[5].data, *dy = (const T *)a->dout[0].data;
  const uint8_t *mask = (const uint8_t *)a->out[STOKE_BN_ADD_RELU_MASK].data;
  const T *w = (const T *)a->in[1].data, *w2 = (const T *)a->in[STOKE_BN2_WEIGHT].data;
  const float *sm = (const float *)a->out[1].data, *si = (const float *)a->out[2].data;
  const float *sm2 = (const float *)a->out[STOKE_BN2_SAVED_MEAN].data;
  const float *si2 = (const float *)a->out[STOKE_BN2_SAVED_MEAN + 1].data;
  float2 *part = ws_part(a->workspace, &g, 0), *part2 = ws_part(a->workspace, &g, 1);
  float *cb = ws_coef(a->workspace, &g, 0), *cc = ws_coef(a->workspace, &g, 1);
  float *cb2 = ws_coef(a->workspace, &g, 2), *cc2 = ws_coef(a->workspace, &g, 3);
  size_t shm = tree_floats(g.bx, g.by, 3 * V) * sizeof(float);
  k_gsum<T, V, kDual><<<grid_of(g), block_of(g), shm, st>>>(x, r, dy, mask, sm, sm2, si, w, nullptr, g.m, g.c, g.cv,
                                                             g.rows, g.parts, part, part2, nullptr);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  k_fin_bwd<T><<<fin_blocks(g), 32 * kFinWarps, 0, st>>>(part, g.parts, g.c, (double)g.m, a->training, w, si, dw,
                                                         stoke_grad_beta(a, 1), db, stoke_grad_beta(a, 2),
                                                         dx ? cb : nullptr, cc);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  k_fin_bwd<T><<<fin_blocks(g), 32 * kFinWarps, 0, st>>>(part2, g.parts, g.c, (double)g.m, a->training, w2, si2, dw2,
                                                         stoke_grad_beta(a, 6), db2, stoke_grad_beta(a, 7),
                                                         dr ? cb2 : nullptr, cc2);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  if (dx || dr) {
    k_dx2<T, V><<<grid_of(g), block_of(g), 0, st>>>(x, r, dy, mask, dx, dr, sm, si, w, cb, cc, sm2, si2, w2, cb2, cc2,
                                                    g.m, g.c, g.cv, g.rows);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  return NULL;
}

template <typename T, int ACT>
stoke_err *run_fwd(const stoke_kernel_args_v1 *a, void *) {
  geom g;
  int v;
  CHECK(check(a, dtype_of<T>::value, ACT, false, true, sm_count_of(a), &g, &v));
  constexpr int VV = 16 / sizeof(T);
  return v == VV ? fwd_v<T, VV, ACT>(a, g) : fwd_v<T, 1, ACT>(a, g);
}

template <typename T, int ACT>
stoke_err *run_bwd(const stoke_kernel_args_v1 *a, void *) {
  geom g;
  int v;
  CHECK(check(a, dtype_of<T>::value, ACT, true, true, sm_count_of(a), &g, &v));
  constexpr int VV = 16 / sizeof(T);
  if constexpr (ACT == kDual) return v == VV ? bwd2_v<T, VV>(a, g) : bwd2_v<T, 1>(a, g);
  else return v == VV ? bwd_v<T, VV, ACT>(a, g) : bwd_v<T, 1, ACT>(a, g);
}

#define BN_ACT_KERNELS(T, DT)                                                                                 \
  {"fused", STOKE_OP_BATCH_NORM, STOKE_FWD, DT, STOKE_NHWC, plan<T, kNone, false>, run_fwd<T, kNone>,           \
   stoke_destroy_none},                                                                                       \
  {"fused", STOKE_OP_BATCH_NORM, STOKE_BWD, DT, STOKE_NHWC, plan<T, kNone, true>, run_bwd<T, kNone>,            \
   stoke_destroy_none},                                                                                       \
  {"fused", STOKE_OP_BN_RELU, STOKE_FWD, DT, STOKE_NHWC, plan<T, kRelu, false>, run_fwd<T, kRelu>, stoke_destroy_none}, \
  {"fused", STOKE_OP_BN_RELU, STOKE_BWD, DT, STOKE_NHWC, plan<T, kRelu, true>, run_bwd<T, kRelu>, stoke_destroy_none},  \
  {"fused", STOKE_OP_BN_ADD_RELU, STOKE_FWD, DT, STOKE_NHWC, plan<T, kAddRelu, false>, run_fwd<T, kAddRelu>,    \
   stoke_destroy_none},                                                                                             \
  {"fused", STOKE_OP_BN_ADD_RELU, STOKE_BWD, DT, STOKE_NHWC, plan<T, kAddRelu, true>, run_bwd<T, kAddRelu>,     \
   stoke_destroy_none},                                                                                             \
  {"fused", STOKE_OP_BN_ADD_BN_RELU, STOKE_FWD, DT, STOKE_NHWC, plan<T, kDual, false>, run_fwd<T, kDual>,          \
   stoke_destroy_none},                                                                                             \
  {"fused", STOKE_OP_BN_ADD_BN_RELU, STOKE_BWD, DT, STOKE_NHWC, plan<T, kDual, true>, run_bwd<T, kDual>,           \
   stoke_destroy_none}

const stoke_kernel_v1 kernels[] = {
    BN_ACT_KERNELS(__nv_bfloat16, STOKE_BF16),
    BN_ACT_KERNELS(__half, STOKE_F16),
    BN_ACT_KERNELS(float, STOKE_F32),
};

}  // namespace

extern "C" stoke_err *stoke_fused_register_bn_act(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, kernels, sizeof kernels / sizeof *kernels);
}
