// backends/cudnn/conv_unfold.cu: the kernels of conv2d's unfolded path
// (conv_graph.c) for inputs with few channels, ResNet's stem above all:
// cuDNN's bf16 kernels for a 7x7/2 convolution over 3 channels run at
// about 17 TFLOP/s on the H100 (BENCHMARKS.md run 7: 1.81 ms forward at
// batch 256, while fp16 takes 0.60), because a 3-channel reduction does not
// fill the tensor cores' 16-wide K. Unfolding the kernel's taps into the
// channels turns the problem into one cuDNN runs fast:
//   full fold:  x'[n, ho, wo, (r, s, c)] = x[n, ho*sh - ph + r, wo*sw - pw + s, c]
//               then a 1x1 convolution (a GEMM) over R*S*C channels;
//   width fold: x'[n, h, wo, (s, c)] = x[n, h, wo*sw - pw + s, c]
//               then an R x 1 convolution, stride (sh, 1), padding (ph, 0),
//               over S*C channels;
// each channel count padded with zeros to a multiple of 8 (16-byte rows for
// the tensor-core kernels). The weight is packed to match, [O][R'][1][C']
// (OHWI), and the weight gradient unpacked back to OIHW.
//
// Unfolding copies 16-bit values (bf16 and fp16 alike, zero is 0x0000 in
// both) without arithmetic, so the unfolded convolution computes exactly
// the products and float sums of the direct one, in another order. Plain C
// entry points (conv_graph.c is C), returning the launch's cudaError_t.
#include <cuda_runtime_api.h>
#include <stdint.h>

#include <type_traits>

#include "backends/cuda/types.cuh"
#include "conv_unfold.h"

namespace {

// 8 unfolded channels of 16-bit values: one 16-byte store
typedef vec<uint16_t, 8> vec8;

// The full fold: one block makes one unfolded row xu[n, ho, :, :]. It
// stages the R input rows that row reads in shared memory with the padding
// columns and rows as zeros, and a table of each unfolded channel's offset
// in that stage (-1: a padding channel); then every thread writes 16-byte
// vectors of 8 channels read from shared memory. Global reads are whole
// rows, writes are contiguous: the kernel moves its bytes near the copy rate
// (the per-element gather below took 3-5x longer: BENCHMARKS.md run 14).
// The width fold takes k_unfold_width, whose shared memory is smaller.
__global__ void k_unfold_rows(const uint16_t *__restrict__ x, vec8 *__restrict__ xu, cu_unfold_geom g) {
  extern __shared__ uint16_t sm[];
  const int wp = g.w + 2 * g.pw, rowlen = wp * g.c;
  int *koff = reinterpret_cast<int *>(sm + ((g.r * rowlen + 1) & ~1));
  const long long row = blockIdx.x;  // n * hu + ho
  const int ho = (int)(row % g.hu);
  const long long n = row / g.hu;
  for (int k = threadIdx.x; k < g.cu; k += blockDim.x) {
    int o = -1;
    if (k < g.r * g.s * g.c) {
      int c = k % g.c, tap = k / g.c;
      o = (tap / g.s) * rowlen + (tap % g.s) * g.c + c;
    }
    koff[k] = o;
  }
  const uint16_t *xn = x + n * g.h * g.w * g.c;
  for (int i = threadIdx.x; i < g.r * rowlen; i += blockDim.x) {
    int rr = i / rowlen, j = i - rr * rowlen;
    int hi = ho * g.sh - g.ph + rr, wi = j / g.c - g.pw;
    uint16_t v = 0;
    if (hi >= 0 && hi < g.h && wi >= 0 && wi < g.w) v = xn[((long long)hi * g.w + wi) * g.c + j % g.c];
    sm[i] = v;
  }
  __syncthreads();
  const int gpr = g.cu / 8, total = g.wu * gpr;
  vec8 *dst = xu + row * total;
  for (int t = threadIdx.x; t < total; t += blockDim.x) {
    int wo = t / gpr, k0 = (t - wo * gpr) * 8;
    const uint16_t *base = sm + wo * g.sw * g.c;
    vec8 out;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      int o = koff[k0 + j];
      out.v[j] = o >= 0 ? base[o] : (uint16_t)0;
    }
    dst[t] = out;
  }
}

// Values in the width fold's staged row: the input row with pw zero columns each side, then cu values of slack
// (zeros) that the last position's vector may read past the row.
__host__ __device__ __forceinline__ int width_staged(const cu_unfold_geom &g) { return (g.w + 2 * g.pw) * g.c + g.cu; }

// Staged value i of the input row at src: zero in the padding columns and the slack.
__device__ __forceinline__ uint16_t staged_at(const uint16_t *__restrict__ src, const cu_unfold_geom &g, int i) {
  const int j = i - g.pw * g.c;
  return j >= 0 && j < g.w * g.c ? src[j] : (uint16_t)0;
}

// The width fold: unfolded channel k of position wo is x[n, h, wo sw - pw + k / c, k % c], which is
// value wo sw c + k of the input row staged with pw zero columns each side, so a vector of 8 channels
// is 8 consecutive staged values, read as four 32-bit words when sw c is even. A block makes row after
// row (no table, no division per staged value). k_unfold_rows's table lookups (its width-fold form,
// since removed) took 0.22 ms for ResNet-50's stem (77 MB in, 411 MB out: half the copy rate), once in the
// forward and once for the weight gradient; this kernel 0.17 ms with the row loaded after the previous
// row's vectors were written, its DRAM half busy (ncu: 50-58%). PRE > 0: each thread holds its PRE
// staged values of the block's next row in registers, loaded while this row's vectors are written, so a
// block never waits for its row's loads (staged <= PRE x 256); 0.147 ms (BENCHMARKS.md run 24). PRE = 0:
// loaded in place, for rows longer than 1,024 values.
template <int PRE>
__global__ void __launch_bounds__(256)
    k_unfold_width(const uint16_t *__restrict__ x, vec8 *__restrict__ xu, cu_unfold_geom g, long long rows) {
  extern __shared__ uint32_t smw[];  // the staged row, then cu values of slack (zeros)
  uint16_t *sm = reinterpret_cast<uint16_t *>(smw);
  const int inner = g.w * g.c, staged = width_staged(g);
  const int real = g.s * g.c, gpr = g.cu / 8, total = g.wu * gpr, step = g.sw * g.c;
  uint16_t nx[PRE > 0 ? PRE : 1];
  auto fetch = [&](long long row) {
    const uint16_t *src = x + row * inner;
#pragma unroll
    for (int k = 0; k < PRE; k++) {
      const int i = threadIdx.x + k * blockDim.x;
      nx[k] = i < staged ? staged_at(src, g, i) : (uint16_t)0;
    }
  };
  if (PRE > 0 && (long long)blockIdx.x < rows) fetch(blockIdx.x);
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    __syncthreads();                         // the previous row's vectors are read
    if (PRE > 0) {
#pragma unroll
      for (int k = 0; k < PRE; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < staged) sm[i] = nx[k];
      }
    } else {
      const uint16_t *src = x + row * inner;  // row n hu + h is input row (n, h): hu = h
      for (int i = threadIdx.x; i < staged; i += blockDim.x) sm[i] = staged_at(src, g, i);
    }
    __syncthreads();
    if (PRE > 0 && row + gridDim.x < rows) fetch(row + gridDim.x);  // in flight while this row is written
    vec8 *dst = xu + row * total;
    for (int t = threadIdx.x; t < total; t += blockDim.x) {
      const int wo = t / gpr, k0 = (t - wo * gpr) * 8, base = wo * step + k0;
      vec8 out;
      if (step % 2 == 0) {
        const uint32_t *w = smw + base / 2;
        uint32_t *o = reinterpret_cast<uint32_t *>(out.v);
#pragma unroll
        for (int j = 0; j < 4; j++) o[j] = w[j];
      } else {
#pragma unroll
        for (int j = 0; j < 8; j++) out.v[j] = sm[base + j];
      }
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (k0 + j >= real) out.v[j] = 0;
      dst[t] = out;
    }
  }
}

size_t width_smem(const cu_unfold_geom &g) { return (size_t)((width_staged(g) + 1) / 2) * 4; }

// The shared memory k_unfold_rows needs for g (the full fold): the staged
// rows, then the channel table.
size_t rows_smem(const cu_unfold_geom &g) {
  size_t vals = (size_t)g.r * (g.w + 2 * g.pw) * g.c;
  return ((vals + 1) & ~(size_t)1) * 2 + (size_t)g.cu * 4;
}

// The fallback for shapes whose rows do not fit in shared memory: one
// thread writes 8 consecutive unfolded channels (16 bytes) of one output
// position, gathering each from x (the L1 and L2 serve the reuse).
__global__ void k_unfold(const uint16_t *__restrict__ x, vec8 *__restrict__ xu, cu_unfold_geom g,
                         long long groups_total) {
  long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= groups_total) return;
  int gpr = g.cu / 8;  // 8-channel groups per unfolded position
  long long pos = t / gpr;
  int k0 = (int)(t - pos * gpr) * 8;
  int wo = (int)(pos % g.wu);
  long long q = pos / g.wu;
  int hu = (int)(q % g.hu);
  long long n = q / g.hu;
  int taps = g.full ? g.r * g.s : g.s;
  int real = taps * g.c;
  // (r, s, c) of channel k0, then stepped: one set of divisions a thread
  int c = k0 % g.c, tap = k0 / g.c;
  int r = g.full ? tap / g.s : 0, s = g.full ? tap % g.s : tap;
  const uint16_t *xn = x + n * g.h * g.w * g.c;
  vec8 out;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    uint16_t val = 0;
    if (k0 + j < real) {
      int hi = g.full ? hu * g.sh - g.ph + r : hu;
      int wi = wo * g.sw - g.pw + s;
      if (hi >= 0 && hi < g.h && wi >= 0 && wi < g.w) val = xn[((long long)hi * g.w + wi) * g.c + c];
    }
    out.v[j] = val;
    if (++c == g.c) {
      c = 0;
      if (++s == g.s) s = 0, r++;
    }
  }
  xu[t] = out;
}

// The unfolded tensor's index (o, r', c') of weight element [o][c][r][s]
// (OIHW), -1 for none; wp is [O][R'][C'] with R' = 1 (full) or R (width).
__device__ __forceinline__ long long packed_index(const cu_unfold_geom &g, int o, int c, int r, int s) {
  int rp = g.full ? 0 : r;
  int kp = (g.full ? r * g.s + s : s) * g.c + c;
  int rows = g.full ? 1 : g.r;
  return ((long long)o * rows + rp) * g.cu + kp;
}

// The index of filter element (o, c, r, s) in memory: [O][C][R][S], or
// [O][R][S][C] with w_ohwi (core/layout.c's filter_ohwi).
__device__ __forceinline__ long long filter_index(const cu_unfold_geom &g, int o, int c, int r, int s) {
  return g.w_ohwi ? (((long long)o * g.r + r) * g.s + s) * g.c + c : (((long long)o * g.c + c) * g.r + r) * g.s + s;
}

// wp = pack(w): every element of wp written, the padding channels 0.
__global__ void k_pack_w(const uint16_t *__restrict__ w, uint16_t *__restrict__ wp, cu_unfold_geom g, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // i over wp: [o][r'][k']
  int kp = (int)(i % g.cu);
  long long q = i / g.cu;
  int rows = g.full ? 1 : g.r;
  int rp = (int)(q % rows);
  int o = (int)(q / rows);
  int taps = g.full ? g.r * g.s : g.s;
  uint16_t val = 0;
  if (kp < taps * g.c) {
    int c = kp % g.c, tap = kp / g.c;
    int r = g.full ? tap / g.s : rp, s = g.full ? tap % g.s : tap;
    val = w[filter_index(g, o, c, r, s)];
  }
  wp[i] = val;
}

// dw[o][c][r][s] (or dw[o][r][s][c], w_ohwi) = dwp[packed] + beta dw (beta
// 0: dw not read; it may hold NaN). The padding channels of dwp are never read.
template <typename T>
__global__ void k_unpack_dw(const T *__restrict__ dwp, T *__restrict__ dw, cu_unfold_geom g, float beta, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // i over (o, c, r, s); a stem's filter is a few thousand elements, so
  // the strided writes of the OHWI order cost nothing that shows
  int s = (int)(i % g.s);
  long long q = i / g.s;
  int r = (int)(q % g.r);
  q /= g.r;
  int c = (int)(q % g.c), o = (int)(q / g.c);
  long long d = filter_index(g, o, c, r, s);
  acc(&dw[d], beta, to_f(dwp[packed_index(g, o, c, r, s)]));
}

unsigned blocks(long long n) { return (unsigned)((n + kThreads - 1) / kThreads); }

cudaError_t launched(void) { return cudaGetLastError(); }

}  // namespace

extern "C" long long stoke_cudnn_unfold_numel(const cu_unfold_geom *g) {
  return (long long)g->n * g->hu * g->wu * g->cu;
}

extern "C" cudaError_t stoke_cudnn_unfold(const void *x, void *xu, const cu_unfold_geom *g, cudaStream_t stream) {
  long long groups = stoke_cudnn_unfold_numel(g) / 8;
  if (groups <= 0 || g->cu % 8) return cudaErrorInvalidValue;
  if (!g->full && width_smem(*g) <= 48 * 1024) {
    const long long rows = (long long)g->n * g->hu;
    const unsigned grid = (unsigned)(rows < 4 * 65535LL ? (rows + 3) / 4 : 65535);
    const int staged = width_staged(*g);
    auto launch = [&](auto pre) {
      k_unfold_width<decltype(pre)::value><<<grid, 256, width_smem(*g), stream>>>((const uint16_t *)x, (vec8 *)xu, *g, rows);
    };
    if (staged <= 256) launch(std::integral_constant<int, 1>());
    else if (staged <= 512) launch(std::integral_constant<int, 2>());
    else if (staged <= 768) launch(std::integral_constant<int, 3>());
    else if (staged <= 1024) launch(std::integral_constant<int, 4>());
    else launch(std::integral_constant<int, 0>());
    return launched();
  }
  size_t smem = g->full ? rows_smem(*g) : SIZE_MAX;
  if (smem <= 48 * 1024) {
    k_unfold_rows<<<(unsigned)((long long)g->n * g->hu), 128, smem, stream>>>((const uint16_t *)x,
                                                                                          (vec8 *)xu, *g);
    return launched();
  }
  k_unfold<<<blocks(groups), kThreads, 0, stream>>>((const uint16_t *)x, (vec8 *)xu, *g, groups);
  return launched();
}

extern "C" cudaError_t stoke_cudnn_unfold_pack_w(const void *w, void *wp, const cu_unfold_geom *g,
                                                 cudaStream_t stream) {
  long long n = (long long)g->o * (g->full ? 1 : g->r) * g->cu;
  k_pack_w<<<blocks(n), kThreads, 0, stream>>>((const uint16_t *)w, (uint16_t *)wp, *g, n);
  return launched();
}

extern "C" cudaError_t stoke_cudnn_unfold_unpack_dw(const void *dwp, void *dw, const cu_unfold_geom *g,
                                                    stoke_dtype dt, float beta, cudaStream_t s) {
  long long n = (long long)g->o * g->c * g->r * g->s;
  if (dt == STOKE_BF16)
    k_unpack_dw<<<blocks(n), kThreads, 0, s>>>((const __nv_bfloat16 *)dwp, (__nv_bfloat16 *)dw, *g, beta, n);
  else if (dt == STOKE_F16)
    k_unpack_dw<<<blocks(n), kThreads, 0, s>>>((const __half *)dwp, (__half *)dw, *g, beta, n);
  else
    return cudaErrorInvalidValue;
  return launched();
}
