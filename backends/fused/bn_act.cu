// backends/fused/bn_act.cu: bn_relu and bn_add_relu (stoke/ops.h), forward
// and backward, for channels-last (NHWC) x in bf16, fp16 and f32: batch
// norm, the residual add and the ReLU in one pass over the activations per
// direction, instead of the two or three separate nodes' passes.
//
// x is an (M, C) row-major matrix (M = N H W). A thread owns V contiguous
// channels (one 16-byte vector: 8 bf16/fp16, 4 f32; V = 1 when C is not a
// multiple) and walks rows, so its per-channel coefficients stay in
// registers and every access is a coalesced vector load. Per-channel
// statistics are two-stage, as apex's and cuDNN's: blocks of (channel
// group, row partition) write partials (Welford mean and M2 forward; sums
// of dz and dz (x - mean) backward), and a small kernel combines them in a
// fixed order (double): deterministic, no atomics, no host sync, nothing
// allocated (the workspace is the plan's), every launch on args->stream:
// capturable in a CUDA graph.
//
// Training forward: stats -> finalize (saved_*, running update, per-channel
// scale) -> apply y = max((x - mean) scale + bias (+ r), 0). Eval: the
// finalize reads the running statistics. Backward: dz = dy (y > 0); sums ->
// finalize (dweight, dbias with param_grad_beta; dx coefficients) -> dx =
// A dz + B (x - mean) + C0 and, for bn_add_relu, dr = dz in the same pass.
//
// Measured (ResNet-50 bf16, batch 256, H100, run.profile_ops): the batch
// norm, residual add and ReLU nodes took 36.3 ms per step as cudnn + cuda
// nodes and 26.7 ms with these: 21.5 ms in them (bn_add_relu's backward
// moves its 16 bytes per element at about 2.9 TB/s), the rest the
// gradient-sum adds (2.8 ms) and the four shortcut batch norms (2.5 ms).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdio.h>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "backends/fused/stoke_fused.h"
#include "stoke/ops.h"

namespace {

// Rows a thread loads before using them (bytes in flight), fewer when it
// reads several tensors (S streams) of wide vectors, so that 3 blocks of 256
// threads fit an SM without spilling (at most 80 registers): 3 x 256 threads
// x 48 B is still more than the ~15 KB per SM the H100 needs in flight.
template <int V, int S> struct unroll {
  static constexpr int n = V * S >= 16 ? 1 : V * S >= 8 ? 2 : 4;
};
#define BOUNDS __launch_bounds__(256, 3)

// The launch geometry and the problem, a function of the shape, V and the
// device's SM count only: plan() and run() agree, results are reproducible.
struct geom {
  int64_t m, c;     // rows, channels
  int v;            // channels per vector
  int64_t cv;       // vectors per row
  int bx, by;       // threads: vectors across x, rows across y
  unsigned gx;      // channel-vector blocks
  int parts;        // row partitions of the reductions
  int64_t rows;     // rows per partition (the last may hold fewer)
  double eps, momentum;
  bool add;
};

void make_geom(geom *g, int64_t m, int64_t c, int v, int sm_count) {
  g->m = m;
  g->c = c;
  g->v = v;
  g->cv = c / v;
  g->bx = (int)(g->cv < 32 ? g->cv : 32);
  int by = 1;
  while (by * 2 * g->bx <= 256) by *= 2;
  g->by = by;
  g->gx = (unsigned)((g->cv + g->bx - 1) / g->bx);
  // about 3 blocks per SM in all (a full wave), each with at least 4 rows per thread
  int64_t target = 3 * (int64_t)(sm_count > 0 ? sm_count : 132);
  int64_t p = (target + g->gx - 1) / g->gx;
  int64_t most = (m + (int64_t)by * 4 - 1) / ((int64_t)by * 4);
  if (p > most) p = most;
  if (p > 65535) p = 65535;
  if (p < 1) p = 1;
  g->rows = (m + p - 1) / p;
  g->parts = (int)((m + g->rows - 1) / g->rows);
}

// Workspace: per (partition, channel) a float2, then 4 per-channel f32
// arrays (forward: scale, shift; backward: A, B, C0), each 256-aligned.
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
size_t ws_bytes(const geom *g) {
  return align256((size_t)g->parts * (size_t)g->c * sizeof(float2)) +
         4 * align256((size_t)g->c * sizeof(float));
}
float *ws_coef(void *ws, const geom *g, int k) {
  return (float *)((char *)ws + align256((size_t)g->parts * (size_t)g->c * sizeof(float2)) +
                   (size_t)k * align256((size_t)g->c * sizeof(float)));
}

// ------------------------------------------------------------ vector access

template <typename T, int V>
__device__ __forceinline__ void load_v(const T *p, float (&f)[V]) {
  vec<T, V> r = *(const vec<T, V> *)p;
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = to_f(r.v[i]);
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

// ----------------------------------------------------------------- forward

// Block (channel group, partition p): per-thread Welford over its rows for
// its V channels, a fixed tree over the block's rows, one partial per
// channel: part[p C + c] = (mean, M2) of rows [p R, min((p+1) R, M)).
template <typename T, int V>
__global__ void BOUNDS k_stats(const T *__restrict__ x, int64_t M, int64_t C, int64_t cv,
                                               int64_t R, float2 *__restrict__ part) {
  constexpr int kUnroll = unroll<V, 1>::n;
  extern __shared__ float sh[];  // [3][by][bx][V]
  int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  int64_t vi = (int64_t)blockIdx.x * bx + tx, p = blockIdx.y;
  int64_t r0 = p * R, r1 = r0 + R < M ? r0 + R : M;
  float cnt = 0, mean[V], m2[V];
#pragma unroll
  for (int i = 0; i < V; i++) mean[i] = m2[i] = 0;
  if (vi < cv) {
    const T *xp = x + vi * V;
    for (int64_t r = r0 + ty; r < r1; r += (int64_t)by * kUnroll) {
      float f[kUnroll][V];
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (r + (int64_t)u * by < r1) load_v<T, V>(xp + (r + (int64_t)u * by) * C, f[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (r + (int64_t)u * by < r1) {
          cnt += 1.0f;
          float inv = 1.0f / cnt;
#pragma unroll
          for (int i = 0; i < V; i++) {
            float d = f[u][i] - mean[i];
            mean[i] += d * inv;
            m2[i] += d * (f[u][i] - mean[i]);
          }
        }
    }
  }
  int stride = by * bx * V, base = (ty * bx + tx) * V;
  float *sn = sh, *sm = sh + stride, *sq = sh + 2 * stride;
#pragma unroll
  for (int i = 0; i < V; i++) sn[base + i] = cnt, sm[base + i] = mean[i], sq[base + i] = m2[i];
  __syncthreads();
  for (int off = by / 2; off > 0; off >>= 1) {
    if (ty < off) {
      int o = base + off * bx * V;
#pragma unroll
      for (int i = 0; i < V; i++) chan_combine(sn[base + i], sm[base + i], sq[base + i], sn[o + i], sm[o + i], sq[o + i]);
    }
    __syncthreads();
  }
  if (ty == 0 && vi < cv)
#pragma unroll
    for (int i = 0; i < V; i++) part[p * C + vi * V + i] = make_float2(sm[base + i], sq[base + i]);
}

constexpr int kFinLanes = 8;  // partitions combined in parallel per channel by the finalizers

// Per channel (32 across x, kFinLanes partition lanes across y): combine the
// partials in a fixed order (double); training: saved_* and the running
// statistics (unbiased variance for running_var); eval: saved_* from the
// running statistics. Then scale = w invstd and shift = b (f32), for the apply.
template <typename T>
__global__ void k_fin_fwd(const float2 *__restrict__ part, int P, int64_t C, int64_t M, int64_t R, double eps,
                          double mom, int training, const T *__restrict__ w, const T *__restrict__ b, float *rm,
                          float *rv, float *__restrict__ sm, float *__restrict__ si, float *__restrict__ scale,
                          float *__restrict__ shift) {
  __shared__ double sn[kFinLanes][32], smn[kFinLanes][32], sq[kFinLanes][32];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t c = (int64_t)blockIdx.x * 32 + tx;
  double n = 0, mean = 0, q = 0;
  if (training && c < C)
    for (int p = ty; p < P; p += kFinLanes) chan_combine_part(n, mean, q, part, p, C, c, M, R);
  sn[ty][tx] = n, smn[ty][tx] = mean, sq[ty][tx] = q;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  for (int l = 1; l < kFinLanes; l++) {
    double nb = sn[l][tx];
    if (nb == 0) continue;
    double tot = n + nb, d = smn[l][tx] - mean;
    mean += d * nb / tot;
    q += sq[l][tx] + d * d * n * nb / tot;
    n = tot;
  }
  double invstd = bn_finish_channel(training, mean, q, M, eps, mom, rm, rv, sm, si, c);
  double k = (double)to_f(w[c]) * invstd;
  scale[c] = (float)k;
  shift[c] = to_f(b[c]);
}

// y = max((x - mean) scale + shift (+ r), 0). The bn value is rounded to T
// before the add, as the unfused batch_norm -> add nodes do.
template <typename T, int V, bool ADD>
__global__ void BOUNDS k_apply(const T *__restrict__ x, const T *__restrict__ res, T *__restrict__ y,
                                               const float *__restrict__ smean, const float *__restrict__ scale,
                                               const float *__restrict__ shift, int64_t M, int64_t C, int64_t cv) {
  constexpr int kUnroll = unroll<V, (ADD ? 2 : 1)>::n;
  int64_t vi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (vi >= cv) return;
  float mean[V], k[V], s[V];
  load_coef<V>(smean + vi * V, mean);
  load_coef<V>(scale + vi * V, k);
  load_coef<V>(shift + vi * V, s);
  int64_t step = (int64_t)gridDim.y * blockDim.y;
  for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < M; r += step * kUnroll) {
    vec<T, V> rx[kUnroll], rr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
      if (r + u * step < M) {
        rx[u] = *(const vec<T, V> *)(x + (r + u * step) * C + vi * V);
        if (ADD) rr[u] = *(const vec<T, V> *)(res + (r + u * step) * C + vi * V);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
      if (r + u * step < M) {
        float f[V];
#pragma unroll
        for (int i = 0; i < V; i++) {
          float v = (to_f(rx[u].v[i]) - mean[i]) * k[i] + s[i];
          if (ADD) v = to_f(from_f<T>(v)) + to_f(rr[u].v[i]);
          f[i] = v > 0.0f ? v : 0.0f;
        }
        store_v<T, V>(y + (r + u * step) * C + vi * V, f);
      }
  }
}

// ----------------------------------------------------------------- backward

// dz = dy where y > 0, else 0 (the ReLU's gradient; NaN y gives 0).
template <typename T>
__device__ __forceinline__ float dz_of(T dy, T y) {
  return to_f(y) > 0.0f ? to_f(dy) : 0.0f;
}

// Block (channel group, partition p): part[p C + c] = (sum dz, sum dz (x - mean)).
template <typename T, int V>
__global__ void BOUNDS k_gsum(const T *__restrict__ x, const T *__restrict__ dy,
                                              const T *__restrict__ y, const float *__restrict__ smean, int64_t M,
                                              int64_t C, int64_t cv, int64_t R, float2 *__restrict__ part) {
  constexpr int kUnroll = unroll<V, 3>::n;
  extern __shared__ float sh[];  // [2][by][bx][V]
  int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  int64_t vi = (int64_t)blockIdx.x * bx + tx, p = blockIdx.y;
  int64_t r0 = p * R, r1 = r0 + R < M ? r0 + R : M;
  float s1[V], s2[V], mean[V];
#pragma unroll
  for (int i = 0; i < V; i++) s1[i] = s2[i] = 0;
  if (vi < cv) {
    load_coef<V>(smean + vi * V, mean);
    int64_t off0 = vi * V;
    for (int64_t r = r0 + ty; r < r1; r += (int64_t)by * kUnroll) {
      vec<T, V> rx[kUnroll], rd[kUnroll], ry[kUnroll];  // packed: fewer registers
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (r + (int64_t)u * by < r1) {
          int64_t o = (r + (int64_t)u * by) * C + off0;
          rx[u] = *(const vec<T, V> *)(x + o);
          rd[u] = *(const vec<T, V> *)(dy + o);
          ry[u] = *(const vec<T, V> *)(y + o);
        }
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (r + (int64_t)u * by < r1) {
#pragma unroll
          for (int i = 0; i < V; i++) {
            float dz = dz_of(rd[u].v[i], ry[u].v[i]);
            s1[i] += dz;
            s2[i] += dz * (to_f(rx[u].v[i]) - mean[i]);
          }
        }
    }
  }
  int stride = by * bx * V, base = (ty * bx + tx) * V;
  float *a = sh, *b = sh + stride;
#pragma unroll
  for (int i = 0; i < V; i++) a[base + i] = s1[i], b[base + i] = s2[i];
  __syncthreads();
  for (int off = by / 2; off > 0; off >>= 1) {
    if (ty < off) {
      int o = base + off * bx * V;
#pragma unroll
      for (int i = 0; i < V; i++) a[base + i] += a[o + i], b[base + i] += b[o + i];
    }
    __syncthreads();
  }
  if (ty == 0 && vi < cv)
#pragma unroll
    for (int i = 0; i < V; i++) part[p * C + vi * V + i] = make_float2(a[base + i], b[base + i]);
}

// Per channel: the partition sums in a fixed order (double); dbias = sum
// dz, dweight = invstd sum dz (x - mean), each with param_grad_beta; the
// dx coefficients, dx = A dz + B (x - mean) + C0: A = w invstd, and in
// training B = -A invstd dweight / m, C0 = -A dbias / m (eval: 0, 0).
template <typename T>
__global__ void k_fin_bwd(const float2 *__restrict__ part, int P, int64_t C, double m, int training,
                          const T *__restrict__ w, const float *__restrict__ si, T *dw, float bw, T *db, float bb,
                          float *__restrict__ ca, float *__restrict__ cb, float *__restrict__ cc) {
  __shared__ double s1s[kFinLanes][32], s2s[kFinLanes][32];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t c = (int64_t)blockIdx.x * 32 + tx;
  double s1 = 0, s2 = 0;
  if (c < C)
    for (int p = ty; p < P; p += kFinLanes) {
      float2 v = part[(int64_t)p * C + c];
      s1 += (double)v.x;
      s2 += (double)v.y;
    }
  s1s[ty][tx] = s1, s2s[ty][tx] = s2;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  for (int l = 1; l < kFinLanes; l++) s1 += s1s[l][tx], s2 += s2s[l][tx];
  double invstd = (double)si[c], dwv = s2 * invstd;
  if (dw) acc(&dw[c], bw, (float)dwv);
  if (db) acc(&db[c], bb, (float)s1);
  if (!ca) return;
  double k = (double)to_f(w[c]) * invstd;
  ca[c] = (float)k;
  cb[c] = training ? (float)(-k * invstd * dwv / m) : 0.0f;
  cc[c] = training ? (float)(-k * s1 / m) : 0.0f;
}

// dx = A dz + B (x - mean) + C0 (when dx is wanted) and dr = dz (ADD, when
// wanted), dz = dy (y > 0), in one pass.
template <typename T, int V, bool ADD>
__global__ void BOUNDS k_dx(const T *__restrict__ x, const T *__restrict__ dy,
                                            const T *__restrict__ y, T *__restrict__ dx, T *__restrict__ dr,
                                            const float *__restrict__ smean, const float *__restrict__ ca,
                                            const float *__restrict__ cb, const float *__restrict__ cc, int64_t M,
                                            int64_t C, int64_t cv) {
  constexpr int kUnroll = unroll<V, 3>::n;
  int64_t vi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (vi >= cv) return;
  float a[V], b[V], c0[V], mean[V];
  if (dx) {
    load_coef<V>(ca + vi * V, a);
    load_coef<V>(cb + vi * V, b);
    load_coef<V>(cc + vi * V, c0);
    load_coef<V>(smean + vi * V, mean);
  }
  int64_t step = (int64_t)gridDim.y * blockDim.y;
  for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < M; r += step * kUnroll) {
    vec<T, V> rx[kUnroll], rd[kUnroll], ry[kUnroll];  // packed: fewer registers
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
      if (r + u * step < M) {
        int64_t o = (r + u * step) * C + vi * V;
        if (dx) rx[u] = *(const vec<T, V> *)(x + o);
        rd[u] = *(const vec<T, V> *)(dy + o);
        ry[u] = *(const vec<T, V> *)(y + o);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
      if (r + u * step < M) {
        int64_t o = (r + u * step) * C + vi * V;
        float dz[V];
#pragma unroll
        for (int i = 0; i < V; i++) dz[i] = dz_of(rd[u].v[i], ry[u].v[i]);
        if (ADD && dr) store_v<T, V>(dr + o, dz);
        if (dx) {
#pragma unroll
          for (int i = 0; i < V; i++) dz[i] = a[i] * dz[i] + b[i] * (to_f(rx[u].v[i]) - mean[i]) + c0[i];
          store_v<T, V>(dx + o, dz);
        }
      }
  }
}

// ------------------------------------------------------------------- checks

const char *op_name(bool add) { return add ? STOKE_OP_BN_ADD_RELU : STOKE_OP_BN_RELU; }

// x, y (and r) NHWC of dtype dt, weight and bias [C] of dt, running and
// saved statistics f32 [C]; backward: the gradients that are wanted match
// their values, and what the wanted ones read holds data.
stoke_err *check(const stoke_kernel_args_v1 *a, stoke_dtype dt, bool add, bool bwd, bool run, int sm_count,
                 geom *g, int *v_out) {
  const char *op = op_name(add);
  int n_in = add ? 6 : 5;
  if (a->n_in < n_in || a->n_out < 3 || !a->in || !a->out || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs %d inputs and 3 outputs (and gradients in backward)", op,
                      stoke_node_name(a), n_in);
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_BATCH_NORM_MOMENTUM)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes eps and momentum missing", op, stoke_node_name(a));
  g->eps = n->attrs[STOKE_BATCH_NORM_EPS].f;
  g->momentum = n->attrs[STOKE_BATCH_NORM_MOMENTUM].f;
  if (!(g->eps > 0 && isfinite(g->eps)) || !(g->momentum >= 0 && g->momentum <= 1))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': eps %g must be > 0 and momentum %g in [0, 1]", op, stoke_node_name(a),
                      g->eps, g->momentum);
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (!stoke_is_nhwc(x) || !stoke_is_nhwc(y) || !stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "%s '%s': the fused kernels take 4-D NHWC x and y of one shape, got x %s, y %s", op,
                      stoke_node_name(a), stoke_shape_str(&x->shape).s, stoke_shape_str(&y->shape).s);
  int64_t c = x->shape.d[1], m = x->shape.d[0] * x->shape.d[2] * x->shape.d[3];
  static const char *const in_names[] = {"x", "weight", "bias", "running_mean", "running_var", "residual"};
  static const char *const out_names[] = {"y", "saved_mean", "saved_invstd"};
  for (int i = 1; i < 5; i++)
    if (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a), in_names[i],
                        stoke_shape_str(&a->in[i].shape).s, stoke_shape_str(&x->shape).s, (long long)c);
  for (int j = 1; j < 3; j++)
    if (a->out[j].shape.ndim != 1 || a->out[j].shape.d[0] != c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a), out_names[j],
                        stoke_shape_str(&a->out[j].shape).s, stoke_shape_str(&x->shape).s, (long long)c);
  for (int i = 0; i < n_in; i++) CHECK(stoke_check_dtype(a, op, in_names[i], &a->in[i], i == 3 || i == 4 ? STOKE_F32 : dt));
  for (int j = 0; j < 3; j++) CHECK(stoke_check_dtype(a, op, out_names[j], &a->out[j], j ? STOKE_F32 : dt));
  if (add && (!stoke_is_nhwc(&a->in[5]) || !stoke_same_shape(&a->in[5].shape, &x->shape)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the residual %s must be NHWC of x's shape %s", op, stoke_node_name(a),
                      stoke_shape_str(&a->in[5].shape).s, stoke_shape_str(&x->shape).s);
  // vectors of 16 bytes when C allows and every activation is aligned
  int v = (int)(16 / stoke_dtype_size(dt));
  if (c % v) v = 1;
  const void *acts[] = {x->data, y->data, add ? a->in[5].data : NULL, bwd ? a->dout[0].data : NULL,
                        bwd ? a->din[0].data : NULL, bwd && add ? a->din[5].data : NULL};
  for (const void *p : acts)
    if (p && !aligned16(p)) v = 1;
  *v_out = v;
  g->add = add;
  make_geom(g, m, c, v, sm_count);
  if (!bwd) {
    for (int i = 0; i < n_in; i++) CHECK(stoke_check_data(a, op, in_names[i], &a->in[i], run));
    for (int j = 0; j < 3; j++) CHECK(stoke_check_data(a, op, out_names[j], &a->out[j], run));
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
    CHECK(stoke_check_data(a, op, "y (the forward output)", y, run));
    CHECK(stoke_check_data(a, op, "x (the forward input)", x, run));
    CHECK(stoke_check_data(a, op, "weight", &a->in[1], run));
    CHECK(stoke_check_data(a, op, "saved_mean", &a->out[1], run));
    CHECK(stoke_check_data(a, op, "saved_invstd", &a->out[2], run));
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

template <typename T, bool ADD, bool BWD>
stoke_err *plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  geom g;
  int v;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(check(a, dtype_of<T>::value, ADD, BWD, false, sm_count_of(a), &g, &v));
  // the plan sees no data pointers: size for the vector geometry and for
  // V = 1 (misaligned data at run time), whichever needs more
  size_t w = ws_bytes(&g);
  geom g1 = g;
  make_geom(&g1, g.m, g.c, 1, sm_count_of(a));
  if (ws_bytes(&g1) > w) w = ws_bytes(&g1);
  if (ws) *ws = w;
  return NULL;
}

dim3 block_of(const geom &g) { return dim3((unsigned)g.bx, (unsigned)g.by); }

// Blocks over rows for the elementwise passes: 3 per SM in all (a full wave).
unsigned row_blocks(const geom &g, int sm_count) {
  int64_t want = 3 * (int64_t)(sm_count > 0 ? sm_count : 132) / (int64_t)g.gx;
  int64_t most = (g.m + g.by - 1) / g.by;
  if (want > most) want = most;
  if (want > 65535) want = 65535;
  return (unsigned)(want < 1 ? 1 : want);
}

template <typename T, int V, bool ADD>
stoke_err *fwd_v(const stoke_kernel_args_v1 *a, const geom &g, int sms) {
  cudaStream_t st = (cudaStream_t)a->stream;
  const T *x = (const T *)a->in[0].data;
  float2 *part = (float2 *)a->workspace;
  float *scale = ws_coef(a->workspace, &g, 0), *shift = ws_coef(a->workspace, &g, 1);
  dim3 blk = block_of(g);
  if (a->training) {
    size_t shm = 3 * (size_t)g.bx * g.by * V * sizeof(float);
    k_stats<T, V><<<dim3(g.gx, (unsigned)g.parts), blk, shm, st>>>(x, g.m, g.c, g.cv, g.rows, part);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  k_fin_fwd<T><<<(unsigned)((g.c + 31) / 32), dim3(32, kFinLanes), 0, st>>>(
      part, g.parts, g.c, g.m, g.rows, g.eps, g.momentum, a->training, (const T *)a->in[1].data,
      (const T *)a->in[2].data, (float *)a->in[3].data, (float *)a->in[4].data, (float *)a->out[1].data,
      (float *)a->out[2].data, scale, shift);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  k_apply<T, V, ADD><<<dim3(g.gx, row_blocks(g, sms)), blk, 0, st>>>(
      x, ADD ? (const T *)a->in[5].data : nullptr, (T *)a->out[0].data, (const float *)a->out[1].data, scale, shift,
      g.m, g.c, g.cv);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

template <typename T, int V, bool ADD>
stoke_err *bwd_v(const stoke_kernel_args_v1 *a, const geom &g, int sms) {
  cudaStream_t st = (cudaStream_t)a->stream;
  T *dx = (T *)a->din[0].data, *dw = (T *)a->din[1].data, *db = (T *)a->din[2].data;
  T *dr = ADD ? (T *)a->din[5].data : nullptr;
  if (!dx && !dw && !db && !dr) return NULL;
  const T *x = (const T *)a->in[0].data, *dy = (const T *)a->dout[0].data, *y = (const T *)a->out[0].data;
  const float *sm = (const float *)a->out[1].data, *si = (const float *)a->out[2].data;
  float2 *part = (float2 *)a->workspace;
  float *ca = ws_coef(a->workspace, &g, 0), *cb = ws_coef(a->workspace, &g, 1), *cc = ws_coef(a->workspace, &g, 2);
  dim3 blk = block_of(g);
  if (dx || dw || db) {
    size_t shm = 2 * (size_t)g.bx * g.by * V * sizeof(float);
    k_gsum<T, V><<<dim3(g.gx, (unsigned)g.parts), blk, shm, st>>>(x, dy, y, sm, g.m, g.c, g.cv, g.rows, part);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
    k_fin_bwd<T><<<(unsigned)((g.c + 31) / 32), dim3(32, kFinLanes), 0, st>>>(
        part, g.parts, g.c, (double)g.m, a->training, (const T *)a->in[1].data, si, dw, stoke_grad_beta(a, 1), db,
        stoke_grad_beta(a, 2), dx ? ca : nullptr, cb, cc);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  if (dx || dr) {
    k_dx<T, V, ADD><<<dim3(g.gx, row_blocks(g, sms)), blk, 0, st>>>(x, dy, y, dx, dr, sm, ca, cb, cc, g.m, g.c,
                                                                     g.cv);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  return NULL;
}

template <typename T, bool ADD>
stoke_err *run_fwd(const stoke_kernel_args_v1 *a, void *) {
  geom g;
  int v, sms = sm_count_of(a);
  CHECK(check(a, dtype_of<T>::value, ADD, false, true, sms, &g, &v));
  constexpr int VV = 16 / sizeof(T);
  return v == VV ? fwd_v<T, VV, ADD>(a, g, sms) : fwd_v<T, 1, ADD>(a, g, sms);
}

template <typename T, bool ADD>
stoke_err *run_bwd(const stoke_kernel_args_v1 *a, void *) {
  geom g;
  int v, sms = sm_count_of(a);
  CHECK(check(a, dtype_of<T>::value, ADD, true, true, sms, &g, &v));
  constexpr int VV = 16 / sizeof(T);
  return v == VV ? bwd_v<T, VV, ADD>(a, g, sms) : bwd_v<T, 1, ADD>(a, g, sms);
}

#define BN_ACT_KERNELS(T, DT)                                                                              \
  {"fused", STOKE_OP_BN_RELU, STOKE_FWD, DT, STOKE_NHWC, plan<T, false, false>, run_fwd<T, false>, stoke_destroy_none}, \
  {"fused", STOKE_OP_BN_RELU, STOKE_BWD, DT, STOKE_NHWC, plan<T, false, true>, run_bwd<T, false>, stoke_destroy_none},  \
  {"fused", STOKE_OP_BN_ADD_RELU, STOKE_FWD, DT, STOKE_NHWC, plan<T, true, false>, run_fwd<T, true>, stoke_destroy_none}, \
  {"fused", STOKE_OP_BN_ADD_RELU, STOKE_BWD, DT, STOKE_NHWC, plan<T, true, true>, run_bwd<T, true>, stoke_destroy_none}

const stoke_kernel_v1 kernels[] = {
    BN_ACT_KERNELS(__nv_bfloat16, STOKE_BF16),
    BN_ACT_KERNELS(__half, STOKE_F16),
    BN_ACT_KERNELS(float, STOKE_F32),
};

}  // namespace

extern "C" stoke_err *stoke_fused_register_bn_act(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, kernels, sizeof kernels / sizeof *kernels);
}
