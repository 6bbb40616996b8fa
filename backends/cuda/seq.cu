// backends/cuda/seq.cu: the cuda backend's kernels of the sequence ops (embedding,
// position_embedding; layer norms are in layer_norm.cu) and of the views (reshape, slice, split,
// transpose); see stoke/ops.h. f32, bf16 and fp16; arithmetic in float, reductions in a fixed
// order (deterministic: no float atomics), the CPU reference's semantics (backends/cpu/seq.c).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "backends/cuda/ew.cuh"
#include "stoke/ops.h"

namespace {

constexpr int64_t kGrid = 65535;

// Token ids are sliced and reshaped too (plain copies only: beta is 0 for them).
template <> struct dtype_of<int32_t> { static constexpr stoke_dtype value = STOKE_I32; };

template <typename T> T *dp(const stoke_tensor &t) { return static_cast<T *>(t.data); }

// d[i] = beta * d[i] for i < n (0 when beta is 0, without reading d).
template <typename T> __global__ void scale_kernel(T *d, int64_t n, float beta) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    d[i] = from_f<T>(beta != 0.f ? beta * to_f(d[i]) : 0.f);
}

// ------------------------------------------------------------- embedding

// After a stable sort of (token, position): each run of one token, summed over its positions in
// order into dweight's row (a block per run start; other blocks exit at once). Deterministic.
template <typename T>
__global__ void embedding_bwd_kernel(const int32_t *__restrict__ keys, const int32_t *__restrict__ pos,
                                     const T *__restrict__ dy, T *__restrict__ dw, int64_t n, int64_t c, int64_t v) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    int32_t t = keys[s];
    if ((s > 0 && keys[s - 1] == t) || t < 0 || t >= v) continue;
    int64_t e = s;
    while (e < n && keys[e] == t) e++;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      float acc_v = to_f(dw[(int64_t)t * c + j]);
      for (int64_t k = s; k < e; k++) acc_v += to_f(dy[(int64_t)pos[k] * c + j]);
      dw[(int64_t)t * c + j] = from_f<T>(acc_v);
    }
  }
}

// The sort's input: each token id, an id outside [0, V) as V (so the sort needs only the bits of V,
// and such ids sort last, in one run the backward skips), and its position.
__global__ void token_keys_kernel(const int32_t *__restrict__ idx, int32_t *__restrict__ keys,
                                  int32_t *__restrict__ pos, int64_t n, int64_t v) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int32_t t = idx[i];
    keys[i] = t >= 0 && t < v ? t : (int32_t)v;
    pos[i] = (int32_t)i;
  }
}

// --------------------------------------------------- position_embedding

// V elements a thread: 1, or a 16-byte vector (8 bf16 / fp16 or 4 f32 elements) where the rows are
// whole vectors and every pointer is 16-byte aligned (vec_ok). One element a thread, with a 64-bit
// division each, moved GPT-2's [16, 1024, 768] at a quarter of the bytes rate (per-op profile,
// BENCHMARKS.md run 21). The same arithmetic per element at either V, so the same bits.

// out row i = weight row idx[i]; an index outside [0, V) gives a NaN row (no host sync to say so).
template <typename T, int V>
__global__ void embedding_fwd_kernel(const T *__restrict__ w, const int32_t *__restrict__ idx, T *__restrict__ y,
                                     int64_t rows, int64_t cv, int64_t v) {
  const vec<T, V> *wv = reinterpret_cast<const vec<T, V> *>(w);
  vec<T, V> *yv = reinterpret_cast<vec<T, V> *>(y);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cv; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cv, j = i - r * cv;
    const int32_t t = idx[r];
    if (t >= 0 && t < v) {
      yv[i] = wv[(int64_t)t * cv + j];
    } else {
      vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; k++) o.v[k] = from_f<T>(NAN);
      yv[i] = o;
    }
  }
}

// y[b, t, c] = x[b, t, c] + weight[t, c]; nv vectors of x, tcv of a [T, C] slice.
template <typename T, int V>
__global__ void pos_fwd_kernel(const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y, int64_t nv,
                               int64_t tcv) {
  const vec<T, V> *xv = reinterpret_cast<const vec<T, V> *>(x), *wv = reinterpret_cast<const vec<T, V> *>(w);
  vec<T, V> *yv = reinterpret_cast<vec<T, V> *>(y);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
    const vec<T, V> a = xv[i], b = wv[i % tcv];
    vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; k++) o.v[k] = from_f<T>(to_f(a.v[k]) + to_f(b.v[k]));
    yv[i] = o;
  }
}

// dweight[t, c] = beta dweight + sum over b of dy[b, t, c] (rows t >= T: beta dweight).
template <typename T, int V>
__global__ void pos_bwd_w_kernel(const T *__restrict__ dy, T *__restrict__ dw, int64_t b, int64_t tcv, int64_t allv,
                                 float beta) {
  const vec<T, V> *dyv = reinterpret_cast<const vec<T, V> *>(dy);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < allv; i += (int64_t)gridDim.x * blockDim.x) {
    float s[V] = {};
    for (int64_t k = 0; i < tcv && k < b; k++) {
      const vec<T, V> d = dyv[k * tcv + i];
#pragma unroll
      for (int e = 0; e < V; e++) s[e] += to_f(d.v[e]);
    }
#pragma unroll
    for (int e = 0; e < V; e++) acc(dw + i * V + e, beta, s[e]);
  }
}

template <typename T> constexpr int64_t kV = 16 / sizeof(T);

// f(std::integral_constant<int, V>()), V = kV<T> when `vec` (vec_ok), else 1: its result.
template <typename T, typename F> stoke_err *with_v(bool vec, F f) {
  return vec ? f(std::integral_constant<int, (int)kV<T>>()) : f(std::integral_constant<int, 1>());
}

// Rows of c elements are whole 16-byte vectors and every pointer is 16-byte aligned.
template <typename T> bool vec_ok(int64_t c, std::initializer_list<const void *> ps) {
  return c % kV<T> == 0 && all_aligned16(ps);
}

// ----------------------------------------------------------------- views

// dst[o, k] = beta dst + src[o, k] for o < outer, k < len, with row strides (elements).
template <typename T>
__global__ void block_copy_kernel(const T *__restrict__ src, T *dst, int64_t outer, int64_t len, int64_t ss,
                                  int64_t ds, float beta) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < outer * len; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = i / len, k = i - o * len;
    float v = src ? to_f(src[o * ss + k]) : 0.f;
    acc(dst + o * ds + k, beta, v);
  }
}

// (A, P, M, Q, I) -> (A, Q, M, P, I), element by element; y = beta y + x.
template <typename T>
__global__ void transpose_kernel(const T *__restrict__ x, T *y, int64_t A, int64_t P, int64_t M, int64_t Q, int64_t I,
                                 float beta) {
  int64_t n = A * P * M * Q * I;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t e = i % I, t = i / I, q = t % Q;
    t /= Q;
    int64_t m = t % M;
    t /= M;
    int64_t p = t % P, a = t / P;
    acc(y + ((((a * Q + q) * M + m) * P + p) * I + e), beta, to_f(x[i]));
  }
}

// ================================================================ host side

unsigned blocks(int64_t n) { return grid_for(n, kThreads, kGrid); }

#define LAUNCH_OK(a) STOKE_CUDA_LAUNCH(stoke_node_name(a))

// ---------------------------------------------------------------- checks

stoke_err *embedding_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, bool run) {
  const char *op = STOKE_OP_EMBEDDING;
  if (a->n_in < 2 || a->n_out < 1 || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects weight, idx -> out", op, stoke_node_name(a));
  const stoke_shape *ws = &a->in[0].shape, *is = &a->in[1].shape, *ys = &a->out[0].shape;
  bool ok = ws->ndim == 2 && ys->ndim == is->ndim + 1 && ys->d[ys->ndim - 1] == ws->d[1] &&
            stoke_numel(is) < ((int64_t)1 << 31) && ws->d[0] < ((int64_t)1 << 31);
  for (int i = 0; ok && i < is->ndim; i++) ok = ys->d[i] == is->d[i];
  if (!ok)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects weight[V, C], idx[...] -> out[..., C]; got %s, %s, %s", op,
                      stoke_node_name(a), stoke_shape_str(ws).s, stoke_shape_str(is).s, stoke_shape_str(ys).s);
  CHECK(stoke_check_dtype(a, op, "weight", &a->in[0], dt));
  CHECK(stoke_check_dtype(a, op, "idx", &a->in[1], STOKE_I32));
  CHECK(stoke_check_dtype(a, op, "out", &a->out[0], dt));
  CHECK(stoke_check_data(a, op, "idx", &a->in[1], run));
  if (!bwd) {
    CHECK(stoke_check_data(a, op, "weight", &a->in[0], run));
    return stoke_check_data(a, op, "out", &a->out[0], run);
  }
  CHECK(stoke_check_grad(a, op, "weight", &a->din[0], &a->in[0]));
  return a->din[0].data ? stoke_check_data(a, op, "dout", &a->dout[0], run) : NULL;
}

// The backward's workspace: the keys and positions sorted from, sorted keys and positions, and
// cub's own temporary storage.
size_t embedding_workspace(const stoke_kernel_args_v1 *a, size_t *cub_bytes) {
  int n = (int)stoke_numel(&a->in[1].shape);
  size_t tmp = 0;
  cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
                                  (int32_t *)NULL, n);
  if (cub_bytes) *cub_bytes = tmp;
  return 4 * (((size_t)n * 4 + 255) / 256 * 256) + tmp;
}

stoke_err *pos_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, bool run) {
  const char *op = STOKE_OP_POSITION_EMBEDDING;
  if (a->n_in < 2 || a->n_out < 1 || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x, weight -> y", op, stoke_node_name(a));
  const stoke_shape *xs = &a->in[0].shape, *ws = &a->in[1].shape;
  if (xs->ndim != 3 || ws->ndim != 2 || ws->d[1] != xs->d[2] || ws->d[0] < xs->d[1] || !stoke_same_shape(xs, &a->out[0].shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x[B, T, C], weight[P >= T, C]; got %s, %s", op, stoke_node_name(a),
                      stoke_shape_str(xs).s, stoke_shape_str(ws).s);
  for (int i = 0; i < 2; i++) CHECK(stoke_check_dtype(a, op, i ? "weight" : "x", &a->in[i], dt));
  CHECK(stoke_check_dtype(a, op, "y", &a->out[0], dt));
  if (!bwd) {
    for (int i = 0; i < 2; i++) CHECK(stoke_check_data(a, op, i ? "weight" : "x", &a->in[i], run));
    return stoke_check_data(a, op, "y", &a->out[0], run);
  }
  CHECK(stoke_check_grad(a, op, "x", &a->din[0], &a->in[0]));
  CHECK(stoke_check_grad(a, op, "weight", &a->din[1], &a->in[1]));
  return stoke_check_data(a, op, "dy", &a->dout[0], run);
}

// ---------------------------------------------------------------- kernels

#define PLAN(name, check, ws)                                                                \
  template <typename T> stoke_err *name##_plan(const stoke_kernel_args_v1 *a, void **state, \
                                               size_t *w) {                                  \
    if (state) *state = NULL;                                                                \
    if (w) *w = 0;                                                                           \
    CHECK(check);                                                                            \
    if (w) *w = (ws);                                                                        \
    return NULL;                                                                             \
  }

PLAN(embedding_fwd, embedding_check(a, dtype_of<T>::value, 0, false), 0)
PLAN(embedding_bwd, embedding_check(a, dtype_of<T>::value, 1, false), embedding_workspace(a, NULL))

template <typename T> stoke_err *embedding_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(embedding_check(a, dtype_of<T>::value, 0, true));
  int64_t rows = stoke_numel(&a->in[1].shape), c = a->in[0].shape.d[1];
  return with_v<T>(vec_ok<T>(c, {a->in[0].data, a->out[0].data}), [&](auto k) -> stoke_err * {
    constexpr int V = decltype(k)::value;
    embedding_fwd_kernel<T, V><<<blocks(rows * c / V), kThreads, 0, stream_of(a)>>>(
        dp<T>(a->in[0]), dp<int32_t>(a->in[1]), dp<T>(a->out[0]), rows, c / V, a->in[0].shape.d[0]);
    LAUNCH_OK(a);
    return NULL;
  });
}

// dweight = beta dweight, then a stable radix sort of (index, position) and each index's rows
// summed in position order: the same bits on every run (STOKE_KFLAG_DETERMINISTIC or not).
template <typename T> stoke_err *embedding_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(embedding_check(a, dtype_of<T>::value, 1, true));
  T *dw = dp<T>(a->din[0]);
  if (!dw) return NULL;
  int64_t n = stoke_numel(&a->in[1].shape), c = a->in[0].shape.d[1], v = a->in[0].shape.d[0];
  size_t cub_bytes, need = embedding_workspace(a, &cub_bytes), slot = ((size_t)n * 4 + 255) / 256 * 256;
  if (a->workspace_bytes < need || !a->workspace)
    return STOKE_PERR(STOKE_E_INTERNAL, "embedding '%s': needs %zu bytes of workspace, got %zu", stoke_node_name(a), need,
                      a->workspace_bytes);
  char *ws = static_cast<char *>(a->workspace);
  int32_t *keys_in = (int32_t *)ws, *pos_in = (int32_t *)(ws + slot), *keys = (int32_t *)(ws + 2 * slot),
          *pos = (int32_t *)(ws + 3 * slot);
  cudaStream_t st = stream_of(a);
  // dweight = beta dweight first: nothing to do at beta 1 (the tied head's gradient, written
  // before, is added to), a memset at 0; a pass over the whole table only for another beta.
  const float beta = stoke_grad_beta(a, 0);
  if (beta == 0.f) {
    STOKE_CUDA(cudaMemsetAsync(dw, 0, (size_t)(v * c) * sizeof(T), st));
  } else if (beta != 1.f) {
    scale_kernel<T><<<blocks(v * c), kThreads, 0, st>>>(dw, v * c, beta);
    LAUNCH_OK(a);
  }
  token_keys_kernel<<<blocks(n), kThreads, 0, st>>>(dp<int32_t>(a->in[1]), keys_in, pos_in, n, v);
  LAUNCH_OK(a);
  int bits = 1;
  while (bits < 31 && ((int64_t)1 << bits) <= v) bits++; /* keys are in [0, V] */
  STOKE_CUDA(cub::DeviceRadixSort::SortPairs(ws + 4 * slot, cub_bytes, keys_in, keys, pos_in, pos, (int)n, 0, bits,
                                             st));
  embedding_bwd_kernel<T><<<grid_for(n, 1, kGrid), kThreads, 0, st>>>(keys, pos, dp<T>(a->dout[0]), dw, n, c, v);
  LAUNCH_OK(a);
  return NULL;
}

PLAN(pos_fwd, pos_check(a, dtype_of<T>::value, 0, false), 0)
PLAN(pos_bwd, pos_check(a, dtype_of<T>::value, 1, false), 0)

template <typename T> stoke_err *pos_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(pos_check(a, dtype_of<T>::value, 0, true));
  const int64_t *d = a->in[0].shape.d;
  int64_t n = d[0] * d[1] * d[2];
  return with_v<T>(vec_ok<T>(d[2], {a->in[0].data, a->in[1].data, a->out[0].data}), [&](auto k) -> stoke_err * {
    constexpr int V = decltype(k)::value;
    pos_fwd_kernel<T, V><<<blocks(n / V), kThreads, 0, stream_of(a)>>>(dp<T>(a->in[0]), dp<T>(a->in[1]),
                                                                       dp<T>(a->out[0]), n / V, d[1] * d[2] / V);
    LAUNCH_OK(a);
    return NULL;
  });
}

template <typename T> stoke_err *pos_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(pos_check(a, dtype_of<T>::value, 1, true));
  const int64_t *d = a->in[0].shape.d;
  int64_t n = d[0] * d[1] * d[2], all = stoke_numel(&a->in[1].shape);
  return with_v<T>(vec_ok<T>(d[2], {a->dout[0].data, a->din[0].data, a->din[1].data}), [&](auto k) -> stoke_err * {
    constexpr int V = decltype(k)::value;
    if (a->din[0].data && (a->din[0].data != a->dout[0].data || stoke_grad_beta(a, 0) != 0.f))
      CHECK(launch_ew<T>(a, dp<T>(a->din[0]), dp<T>(a->dout[0]), (const T *)NULL, n, stoke_grad_beta(a, 0),
                         op_copy{}));
    if (a->din[1].data) {
      pos_bwd_w_kernel<T, V><<<blocks(all / V), kThreads, 0, stream_of(a)>>>(
          dp<T>(a->dout[0]), dp<T>(a->din[1]), d[0], d[1] * d[2] / V, all / V, stoke_grad_beta(a, 1));
      LAUNCH_OK(a);
    }
    return NULL;
  });
}

// ---------------------------------------------------------------- views

// The parts of a slice or split along dim: each output o, its start along dim.
stoke_err *view_check(const stoke_kernel_args_v1 *a, const char *op, int bwd, bool run) {
  if (a->n_in < 1 || a->n_out < 1 || !a->node || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': expects x -> outputs", op, stoke_node_name(a));
  for (int j = 0; j < a->n_out; j++)
    if (a->out[j].dtype != a->in[0].dtype)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': output %d is %s, x %s", op, stoke_node_name(a), j,
                        stoke_dtype_name(a->out[j].dtype), stoke_dtype_name(a->in[0].dtype));
  if (!bwd) return stoke_check_data(a, op, "x", &a->in[0], run);
  return NULL;
}

int view_dim(const stoke_kernel_args_v1 *a, int attr) {
  int64_t d = a->node->attrs[attr].i;
  return (int)(d < 0 ? d + a->in[0].shape.ndim : d);
}

void around(const stoke_shape *s, int dim, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < dim; i++) *outer *= s->d[i];
  for (int i = dim + 1; i < s->ndim; i++) *inner *= s->d[i];
}

// dst = src (beta 0: one 2-D copy, any dtype) or dst = beta dst + src (a kernel, float types);
// nothing when the compiler made dst a view of src.
template <typename T>
stoke_err *launch_block_copy(const stoke_kernel_args_v1 *a, const T *src, T *dst, int64_t outer, int64_t len,
                             int64_t ss, int64_t ds, float beta) {
  if (outer * len <= 0 || (src == dst && ss == ds && beta == 0.f)) return NULL;
  if (beta == 0.f && ss == len && ds == len) { /* contiguous: one plain copy (a 2-D copy's pitch is capped, ~2^31) */
    STOKE_CUDA(cudaMemcpyAsync(dst, src, (size_t)(outer * len) * sizeof(T), cudaMemcpyDeviceToDevice, stream_of(a)));
    return NULL;
  }
  if (beta == 0.f) {
    STOKE_CUDA(cudaMemcpy2DAsync(dst, (size_t)ds * sizeof(T), src, (size_t)ss * sizeof(T), (size_t)len * sizeof(T),
                                 (size_t)outer, cudaMemcpyDeviceToDevice, stream_of(a)));
    return NULL;
  }
  if constexpr (dtype_of<T>::value != STOKE_I32) {
    block_copy_kernel<T><<<blocks(outer * len), kThreads, 0, stream_of(a)>>>(src, dst, outer, len, ss, ds, beta);
    LAUNCH_OK(a);
    return NULL;
  }
  return STOKE_PERR(STOKE_E_UNSUPPORTED, "'%s': accumulating into an i32 gradient", stoke_node_name(a));
}

template <typename T> stoke_err *reshape_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(view_check(a, STOKE_OP_RESHAPE, 0, true));
  int64_t n = stoke_numel(&a->in[0].shape);
  return launch_block_copy<T>(a, dp<T>(a->in[0]), dp<T>(a->out[0]), 1, n, n, n, 0.f);
}

template <typename T> stoke_err *reshape_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(view_check(a, STOKE_OP_RESHAPE, 1, true));
  if (!a->din[0].data) return NULL;
  int64_t n = stoke_numel(&a->in[0].shape);
  return launch_block_copy<T>(a, dp<T>(a->dout[0]), dp<T>(a->din[0]), 1, n, n, n, stoke_grad_beta(a, 0));
}

// slice and split forward: part j of x along dim, as an outer x (len inner) block copy.
template <typename T, int SLICE> stoke_err *parts_fwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(view_check(a, SLICE ? STOKE_OP_SLICE : STOKE_OP_SPLIT, 0, true));
  int dim = view_dim(a, SLICE ? STOKE_SLICE_DIM : STOKE_SPLIT_DIM);
  int64_t outer, inner, at = SLICE ? a->node->attrs[STOKE_SLICE_START].i : 0, n = a->in[0].shape.d[dim];
  around(&a->in[0].shape, dim, &outer, &inner);
  for (int j = 0; j < a->n_out; j++) {
    int64_t len = a->out[j].shape.d[dim];
    CHECK(launch_block_copy<T>(a, dp<T>(a->in[0]) + at * inner, dp<T>(a->out[j]), outer, len * inner, n * inner,
                               len * inner, 0.f));
    at += len;
  }
  return NULL;
}

// Backward: dx = beta dx (zero outside the parts), then each part's dout at its place.
template <typename T, int SLICE> stoke_err *parts_bwd(const stoke_kernel_args_v1 *a, void *) {
  CHECK(view_check(a, SLICE ? STOKE_OP_SLICE : STOKE_OP_SPLIT, 1, true));
  T *dx = dp<T>(a->din[0]);
  if (!dx) return NULL;
  int dim = view_dim(a, SLICE ? STOKE_SLICE_DIM : STOKE_SPLIT_DIM);
  int64_t outer, inner, at = SLICE ? a->node->attrs[STOKE_SLICE_START].i : 0, n = a->in[0].shape.d[dim];
  around(&a->in[0].shape, dim, &outer, &inner);
  float beta = stoke_grad_beta(a, 0);
  scale_kernel<T><<<blocks(outer * n * inner), kThreads, 0, stream_of(a)>>>(dx, outer * n * inner, beta);
  LAUNCH_OK(a);
  for (int j = 0; j < a->n_out; j++) {
    int64_t len = a->out[j].shape.d[dim];
    if (a->dout[j].data)
      CHECK(launch_block_copy<T>(a, dp<T>(a->dout[j]), dx + at * inner, outer, len * inner, len * inner, n * inner,
                                 1.f));
    at += len;
  }
  return NULL;
}

template <typename T, int BWD> stoke_err *transpose_run(const stoke_kernel_args_v1 *a, void *) {
  CHECK(view_check(a, STOKE_OP_TRANSPOSE, BWD, true));
  int d0 = view_dim(a, STOKE_TRANSPOSE_DIM0), d1 = view_dim(a, STOKE_TRANSPOSE_DIM1);
  if (d0 > d1) {
    int t = d0;
    d0 = d1;
    d1 = t;
  }
  const stoke_shape *s = BWD ? &a->out[0].shape : &a->in[0].shape;  // the side read, as (A, P, M, Q, I)
  const T *x = BWD ? dp<T>(a->dout[0]) : dp<T>(a->in[0]);
  T *y = BWD ? dp<T>(a->din[0]) : dp<T>(a->out[0]);
  float beta = BWD ? stoke_grad_beta(a, 0) : 0.f;
  if (!y || (x == y && beta == 0.f)) return NULL; /* a view */
  int64_t A = 1, M = 1, I = 1;
  for (int k = 0; k < d0; k++) A *= s->d[k];
  for (int k = d0 + 1; k < d1; k++) M *= s->d[k];
  for (int k = d1 + 1; k < s->ndim; k++) I *= s->d[k];
  int64_t n = stoke_numel(s);
  transpose_kernel<T><<<blocks(n), kThreads, 0, stream_of(a)>>>(x, y, A, s->d[d0], M, s->d[d1], I, beta);
  LAUNCH_OK(a);
  return NULL;
}

template <typename T> stoke_err *view_plan(const stoke_kernel_args_v1 *a, void **state, size_t *w) {
  if (state) *state = NULL;
  if (w) *w = 0;
  return view_check(a, a->node ? a->node->op : "view", 0, false);
}

template <typename T> stoke_err *transpose_fwd(const stoke_kernel_args_v1 *a, void *s) { return transpose_run<T, 0>(a, s); }
template <typename T> stoke_err *transpose_bwd(const stoke_kernel_args_v1 *a, void *s) { return transpose_run<T, 1>(a, s); }
template <typename T> stoke_err *slice_fwd(const stoke_kernel_args_v1 *a, void *s) { return parts_fwd<T, 1>(a, s); }
template <typename T> stoke_err *slice_bwd(const stoke_kernel_args_v1 *a, void *s) { return parts_bwd<T, 1>(a, s); }
template <typename T> stoke_err *split_fwd(const stoke_kernel_args_v1 *a, void *s) { return parts_fwd<T, 0>(a, s); }
template <typename T> stoke_err *split_bwd(const stoke_kernel_args_v1 *a, void *s) { return parts_bwd<T, 0>(a, s); }

// ------------------------------------------------------------- the table

#define K(op, pass, plan, run, T) {"cuda", op, pass, dtype_of<T>::value, STOKE_LAYOUT_ANY, plan, run, stoke_destroy_none}
#define SEQ_KERNELS(T)                                                                                    \
  K(STOKE_OP_EMBEDDING, STOKE_FWD, embedding_fwd_plan<T>, embedding_fwd<T>, T),                           \
  K(STOKE_OP_EMBEDDING, STOKE_BWD, embedding_bwd_plan<T>, embedding_bwd<T>, T),                           \
  K(STOKE_OP_POSITION_EMBEDDING, STOKE_FWD, pos_fwd_plan<T>, pos_fwd<T>, T),                              \
  K(STOKE_OP_POSITION_EMBEDDING, STOKE_BWD, pos_bwd_plan<T>, pos_bwd<T>, T),                              \
  K(STOKE_OP_RESHAPE, STOKE_FWD, view_plan<T>, reshape_fwd<T>, T),                                        \
  K(STOKE_OP_RESHAPE, STOKE_BWD, view_plan<T>, reshape_bwd<T>, T),                                        \
  K(STOKE_OP_SLICE, STOKE_BWD, view_plan<T>, slice_bwd<T>, T),                                            \
  K(STOKE_OP_SPLIT, STOKE_FWD, view_plan<T>, split_fwd<T>, T),                                            \
  K(STOKE_OP_SPLIT, STOKE_BWD, view_plan<T>, split_bwd<T>, T),                                            \
  K(STOKE_OP_TRANSPOSE, STOKE_FWD, view_plan<T>, transpose_fwd<T>, T),                                    \
  K(STOKE_OP_TRANSPOSE, STOKE_BWD, view_plan<T>, transpose_bwd<T>, T),                                    \
  K(STOKE_OP_SLICE, STOKE_FWD, view_plan<T>, slice_fwd<T>, T)

const stoke_kernel_v1 seq_kernels[] = {
    SEQ_KERNELS(float), SEQ_KERNELS(__nv_bfloat16), SEQ_KERNELS(__half),
    /* token ids: the language model's tokens and targets are cut from its input */
    K(STOKE_OP_SLICE, STOKE_FWD, view_plan<int32_t>, (parts_fwd<int32_t, 1>), int32_t),
    K(STOKE_OP_RESHAPE, STOKE_FWD, view_plan<int32_t>, reshape_fwd<int32_t>, int32_t),
};

}  // namespace

extern "C" stoke_err *stoke_cuda_register_seq(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, seq_kernels, sizeof seq_kernels / sizeof *seq_kernels);
}
