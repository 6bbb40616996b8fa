// backends/cuda/types.cuh: the one copy of the helpers the CUDA kernel files share (.cu only):
// element conversions, vectors, dtype traits, grid sizes, batch-norm statistics (the argument
// checks every backend shares are in stoke/check.h).
#ifndef STOKE_CUDA_TYPES_CUH
#define STOKE_CUDA_TYPES_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <initializer_list>

#include "stoke/check.h"
#include "stoke/plugin.h"

namespace {

// ------------------------------------------------------------ element types

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr stoke_dtype value = STOKE_F32; };
template <> struct dtype_of<__nv_bfloat16> { static constexpr stoke_dtype value = STOKE_BF16; };
template <> struct dtype_of<__half> { static constexpr stoke_dtype value = STOKE_F16; };

// An element as float, and a float rounded (to nearest even) to the element type.
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

// d = beta * d + v; d is not read when beta is 0 (it may hold NaN), as the CPU's ACC.
template <typename T> __device__ __forceinline__ void acc(T *d, float beta, float v) {
  *d = from_f<T>(beta != 0.0f ? beta * to_f(*d) + v : v);
}

// The sum (the max) of v over the warp's 32 lanes, or over each group of W lanes (W a power of 2: 4, the
// quads of mma's fragment layouts), every lane getting it; the xor butterfly's order is fixed, so the
// result is the same bits on every run.
template <int W = 32> __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int W = 32> __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.69314718055994531f;

// 2^x by the hardware's approximation, subnormal results flushed to 0 (as __expf does): exps that
// far below the row's largest (e^-87) change neither its sum nor a gradient (the softmax
// cross-entropy's, attention's).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// V elements of T loaded and stored as one access.
template <typename T, int V> struct alignas(sizeof(T) * V) vec {
  T v[V];
};

// 16 bytes of a row: 8 bf16/fp16 or 4 f32 elements.
template <typename T> using row_vec = vec<T, 16 / sizeof(T)>;

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
// Every pointer given (NULL ones skipped) 16-byte aligned.
inline bool all_aligned16(std::initializer_list<const void *> ps) {
  for (const void *p : ps)
    if (p && !aligned16(p)) return false;
  return true;
}

// Asynchronous copies (cp.async): 16 bytes from global to shared memory without passing through
// registers, so a thread can have many in flight at once; a commit closes the thread's group of
// copies issued so far, and the wait returns when all of its committed copies have landed.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(smem)),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// ... and this one when all but the most recent committed group have landed.
__device__ __forceinline__ void cp_async_wait_but_last() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// -------------------------------------------------------------- launch shapes

constexpr int kThreads = 256;  // threads per block, unless a kernel says otherwise

// Blocks of per_block threads for a grid-stride loop over `work` items: at least 1, at most
// max_grid.
inline unsigned grid_for(int64_t work, int per_block, int64_t max_grid) {
  int64_t g = (work + per_block - 1) / per_block;
  if (g > max_grid) g = max_grid;
  return (unsigned)(g < 1 ? 1 : g);
}

// ---------------------------------------------------- batch-norm statistics
// (backends/cuda/norm.cu, backends/fused/bn_act.cu): per-channel Welford partials over row
// partitions, combined in a fixed order.

// Chan's combination of (count, mean, M2) partials: b into a.
__device__ __forceinline__ void chan_combine(float &na, float &ma, float &qa, float nb, float mb,
                                             float qb) {
  if (nb == 0.0f) return;
  float n = na + nb, d = mb - ma, f = nb / n;
  ma += d * f;
  qa += qb + d * d * na * f;
  na = n;
}

// Partition p's partial of channel c, part[p C + c] = (mean, M2) of rows [p R, min((p+1) R, M)),
// into (n, mean, M2) in double (Chan's formula); an empty partition adds nothing.
__device__ __forceinline__ void chan_combine_part(double &n, double &mean, double &q,
                                                  const float2 *__restrict__ part, int p, int64_t C,
                                                  int64_t c, int64_t M, int64_t R) {
  int64_t r0 = (int64_t)p * R, r1 = r0 + R < M ? r0 + R : M;
  double nb = r1 > r0 ? (double)(r1 - r0) : 0.0;
  if (nb == 0) return;
  float2 v = part[(int64_t)p * C + c];
  double tot = n + nb, d = (double)v.x - mean;
  mean += d * nb / tot;
  q += (double)v.y + d * d * n * nb / tot;
  n = tot;
}

// Channel c's saved_mean sm[c] and saved_invstd si[c]: training, from the combined mean and M2 q
// of M values, and the running statistics updated (unbiased variance for running_var); eval, from
// the running statistics, left alone. Returns invstd.
__device__ __forceinline__ double bn_finish_channel(int training, double mean, double q, int64_t M,
                                                    double eps, double mom, float *rm, float *rv,
                                                    float *__restrict__ sm,
                                                    float *__restrict__ si, int64_t c) {
  double invstd;
  if (training) {
    double m = (double)M, var = q / m;
    invstd = 1.0 / sqrt(var + eps);
    rm[c] = (float)((1 - mom) * (double)rm[c] + mom * mean);
    rv[c] = (float)((1 - mom) * (double)rv[c] + mom * var * m / (m - 1));
  } else {
    mean = (double)rm[c];
    invstd = 1.0 / sqrt((double)rv[c] + eps);
  }
  sm[c] = (float)mean;
  si[c] = (float)invstd;
  return invstd;
}

// Argument checks, node and shape text, registration: stoke/check.h.

}  // namespace

// Returns the error of a check, if any, from the calling function.
#define CHECK(...)                       \
  do {                                   \
    stoke_err *check_e_ = (__VA_ARGS__); \
    if (check_e_) return check_e_;       \
  } while (0)

#endif  // STOKE_CUDA_TYPES_CUH
