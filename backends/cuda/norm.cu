// backends/cuda/norm.cu: CUDA kernels of the cuda backend for batch_norm,
// max_pool2d and avg_pool2d (f32, bf16, fp16; NCHW and NHWC); see stoke/ops.h.
//
// Every kernel is a template over the element type T with float arithmetic
// (double where the CPU reference finalizes per-channel statistics).
// batch_norm statistics are per-channel Welford partials over fixed row
// partitions, combined in a fixed order (Chan's formula): deterministic, no
// atomics. Pool backward passes gather per input element (no atomics); max
// pool recomputes each window's first maximum as the CPU reference does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdio.h>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "stoke/ops.h"

namespace {

// The most blocks of a grid-stride loop here (grid_for).
constexpr int64_t kMaxGrid = 65535 * 8;

// -------------------------------------------------------- argument checks

// ================================================================ batch_norm

// x as logical (N, C, S), S the product of the trailing dimensions; m = N S
// values per channel. `cl`: channels contiguous (NHWC 4-D, or S == 1), so
// x is an (m, C) row-major matrix; otherwise channel-major (N, C, S).
struct bn_geom {
  int64_t n, c, s, m;
  double eps, momentum;
  bool cl;
  int parts;    // row partitions of the statistics pass
  int64_t rows; // rows per partition (the last may hold fewer, or none)
};

// Partitions: enough blocks to fill a large GPU (about 1024 in all), each
// with enough rows to amortize its reduction. A function of the shape only,
// so plan() and run() agree and the result is reproducible.
void bn_partition(bn_geom *g) {
  int64_t groups = g->cl ? (g->c + 31) / 32 : g->c;
  int64_t min_rows = g->cl ? 64 : 1024;
  int64_t p = (g->m + min_rows - 1) / min_rows;
  int64_t cap = 1024 / (groups < 1 ? 1 : groups);
  if (p > cap) p = cap;
  if (p < 1) p = 1;
  g->parts = (int)p;
  g->rows = (g->m + p - 1) / p;
  if (g->rows < 1) g->rows = 1;
}

// Workspace: per (partition, channel) a float2 of partials, then per
// channel a float2 of what the backward's dx pass needs.
size_t bn_workspace(const bn_geom *g) {
  return ((size_t)g->parts * (size_t)g->c + (size_t)g->c) * sizeof(float2);
}

// (x, weight, bias, running_mean, running_var) -> (y, saved_mean,
// saved_invstd); x, weight, bias, y and their gradients of dtype dt, the
// running and saved statistics f32. Backward reads only what bwd_needs keeps.
stoke_err *bn_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, bool bwd, bool run,
                    bn_geom *g) {
  const char *op = STOKE_OP_BATCH_NORM;
  if (a->n_in < 5 || a->n_out < 3 || !a->in || !a->out)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs 5 inputs and 3 outputs, got %d and %d",
                      op, stoke_node_name(a), a->n_in, a->n_out);
  if (bwd && (!a->din || !a->dout))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': backward called without gradient tensors", op,
                      stoke_node_name(a));
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= STOKE_BATCH_NORM_MOMENTUM)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': attributes eps and momentum missing", op,
                      stoke_node_name(a));
  g->eps = n->attrs[STOKE_BATCH_NORM_EPS].f;
  g->momentum = n->attrs[STOKE_BATCH_NORM_MOMENTUM].f;
  if (!(g->eps > 0 && isfinite(g->eps)) || !(g->momentum >= 0 && g->momentum <= 1))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': eps %g must be > 0 and momentum %g in [0, 1]",
                      op, stoke_node_name(a), g->eps, g->momentum);
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape;
  if (xs->ndim < 2 || !stoke_same_shape(xs, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': expects x[N, C, ...] -> y of x's shape, got x %s, y %s", op,
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(&y->shape).s);
  g->n = xs->d[0];
  g->c = xs->d[1];
  g->s = 1;
  for (int i = 2; i < xs->ndim; i++) g->s *= xs->d[i];
  g->m = g->n * g->s;
  g->cl = stoke_is_nhwc(x) || g->s == 1;
  bn_partition(g);
  static const char *const in_names[] = {"x", "weight", "bias", "running_mean", "running_var"};
  static const char *const out_names[] = {"y", "saved_mean", "saved_invstd"};
  for (int i = 1; i < 5; i++)
    if (a->in[i].shape.ndim != 1 || a->in[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a),
                        in_names[i], stoke_shape_str(&a->in[i].shape).s, stoke_shape_str(xs).s, (long long)g->c);
  for (int i = 1; i < 3; i++)
    if (a->out[i].shape.ndim != 1 || a->out[i].shape.d[0] != g->c)
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': %s is %s, x %s needs [%lld]", op, stoke_node_name(a),
                        out_names[i], stoke_shape_str(&a->out[i].shape).s, stoke_shape_str(xs).s, (long long)g->c);
  for (int i = 0; i < 5; i++)
    CHECK(stoke_check_dtype(a, op, in_names[i], &a->in[i], i < 3 ? dt : STOKE_F32));
  for (int i = 0; i < 3; i++)
    CHECK(stoke_check_dtype(a, op, out_names[i], &a->out[i], i < 1 ? dt : STOKE_F32));
  CHECK(stoke_check_layout_known(a, op, "x", x));
  CHECK(stoke_check_layout_known(a, op, "y", y));
  if (stoke_is_nhwc(y) != stoke_is_nhwc(x))
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "%s '%s': x is %s but y is %s; the cuda kernel needs one memory order", op,
                      stoke_node_name(a), stoke_is_nhwc(x) ? "NHWC" : "NCHW", stoke_is_nhwc(y) ? "NHWC" : "NCHW");
  if (!bwd) {
    for (int i = 0; i < 5; i++) CHECK(stoke_check_data(a, op, in_names[i], &a->in[i], run));
    for (int i = 0; i < 3; i++) CHECK(stoke_check_data(a, op, out_names[i], &a->out[i], run));
    // PyTorch: "Expected more than 1 value per channel when training"
    if (run && a->training && g->m < 2)
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': training needs more than 1 value per channel, x is %s", op,
                        stoke_node_name(a), stoke_shape_str(xs).s);
  } else {
    for (int i = 0; i < 3; i++) CHECK(stoke_check_grad(a, op, in_names[i], &a->din[i], &a->in[i]));
    CHECK(stoke_check_grad(a, op, "y", &a->dout[0], y));
    CHECK(stoke_check_layout_known(a, op, "dx", &a->din[0]));
    CHECK(stoke_check_layout_known(a, op, "dy", &a->dout[0]));
    if ((a->din[0].data && stoke_is_nhwc(&a->din[0]) != stoke_is_nhwc(x)) ||
        (a->dout[0].data && stoke_is_nhwc(&a->dout[0]) != stoke_is_nhwc(x)))
      return STOKE_PERR(STOKE_E_UNSUPPORTED,
                        "%s '%s': x, dx and dy must share one memory order for the cuda kernel",
                        op, stoke_node_name(a));
    bool dx = a->din[0].data != NULL, dw = a->din[1].data != NULL, db = a->din[2].data != NULL;
    if (dx || dw || db) CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
    if (dx || dw) {
      CHECK(stoke_check_data(a, op, "x (the forward input)", x, run));
      CHECK(stoke_check_data(a, op, "saved_mean", &a->out[1], run));
      CHECK(stoke_check_data(a, op, "saved_invstd", &a->out[2], run));
    }
    if (dx) CHECK(stoke_check_data(a, op, "weight", &a->in[1], run));
  }
  if (run && (bwd || a->training) && a->workspace_bytes < bn_workspace(g))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': workspace of %zu bytes, the kernel needs %zu",
                      op, stoke_node_name(a), a->workspace_bytes, bn_workspace(g));
  return NULL;
}

// Channel-major statistics: block (c, p) reduces rows [p R, (p+1) R) of
// channel c. Per-thread Welford, then a fixed tree over the block.
template <typename T>
__global__ void bn_stats_cm(const T *__restrict__ x, int64_t C, int64_t S, int64_t M, int64_t R,
                            float2 *__restrict__ part) {
  __shared__ float sn[kThreads], sm[kThreads], sq[kThreads];
  int64_t c = blockIdx.x, p = blockIdx.y;
  int64_t r0 = p * R, r1 = r0 + R < M ? r0 + R : M;
  float cnt = 0, mean = 0, m2 = 0;
  for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
    int64_t n = r / S, s = r - n * S;
    float v = to_f(x[(n * C + c) * S + s]);
    cnt += 1.0f;
    float d = v - mean;
    mean += d / cnt;
    m2 += d * (v - mean);
  }
  sn[threadIdx.x] = cnt;
  sm[threadIdx.x] = mean;
  sq[threadIdx.x] = m2;
  __syncthreads();
  for (int off = kThreads / 2; off > 0; off >>= 1) {
    if ((int)threadIdx.x < off) {
      int o = threadIdx.x + off;
      chan_combine(sn[threadIdx.x], sm[threadIdx.x], sq[threadIdx.x], sn[o], sm[o], sq[o]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) part[p * C + c] = make_float2(sm[0], sq[0]);
}

// Channels-last statistics: block (channel group, p), 32 channels across
// x (coalesced), 8 row strides across y, combined in a fixed order.
constexpr int kClRows = 8;

template <typename T>
__global__ void bn_stats_cl(const T *__restrict__ x, int64_t C, int64_t M, int64_t R,
                            float2 *__restrict__ part) {
  __shared__ float sn[kClRows][32], sm[kClRows][32], sq[kClRows][32];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t c = (int64_t)blockIdx.x * 32 + tx, p = blockIdx.y;
  int64_t r0 = p * R, r1 = r0 + R < M ? r0 + R : M;
  float cnt = 0, mean = 0, m2 = 0;
  if (c < C)
    for (int64_t r = r0 + ty; r < r1; r += kClRows) {
      float v = to_f(x[r * C + c]);
      cnt += 1.0f;
      float d = v - mean;
      mean += d / cnt;
      m2 += d * (v - mean);
    }
  sn[ty][tx] = cnt;
  sm[ty][tx] = mean;
  sq[ty][tx] = m2;
  __syncthreads();
  for (int off = kClRows / 2; off > 0; off >>= 1) {
    if (ty < off) chan_combine(sn[ty][tx], sm[ty][tx], sq[ty][tx], sn[ty + off][tx],
                               sm[ty + off][tx], sq[ty + off][tx]);
    __syncthreads();
  }
  if (ty == 0 && c < C) part[p * C + c] = make_float2(sm[0][tx], sq[0][tx]);
}

// Per channel: combine the partitions in order (double), write saved_*,
// update the running statistics (training); eval: saved_* from the running
// statistics, which are left alone.
__global__ void bn_finalize(const float2 *__restrict__ part, int P, int64_t C, int64_t M,
                            int64_t R, double eps, double mom, int training, float *rm, float *rv,
                            float *__restrict__ sm, float *__restrict__ si) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double n = 0, mean = 0, q = 0;
  if (training)
    for (int p = 0; p < P; p++) chan_combine_part(n, mean, q, part, p, C, c, M, R);
  bn_finish_channel(training, mean, q, M, eps, mom, rm, rv, sm, si, c);
}

// y = (x - mean) (invstd weight) + bias, elementwise in memory order.
template <typename T>
__global__ void bn_apply(const T *__restrict__ x, T *__restrict__ y, const T *__restrict__ w,
                         const T *__restrict__ b, const float *__restrict__ sm,
                         const float *__restrict__ si, int64_t total, int64_t C, int64_t S,
                         int cl) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t c = cl ? i % C : (i / S) % C;
    float scale = si[c] * to_f(w[c]);
    y[i] = from_f<T>((to_f(x[i]) - sm[c]) * scale + to_f(b[c]));
  }
}

// Backward partial sums per (partition, channel): (sum dy, sum dy xhat);
// xhat is skipped (x may be absent) when need_x is 0.
template <typename T>
__device__ __forceinline__ void bn_grad_terms(const T *x, const T *dy, int64_t off, float mean,
                                              float invstd, int need_x, float &s1, float &s2) {
  float gy = to_f(dy[off]);
  s1 += gy;
  if (need_x) s2 += gy * ((to_f(x[off]) - mean) * invstd);
}

template <typename T>
__global__ void bn_gsum_cm(const T *__restrict__ x, const T *__restrict__ dy,
                           const float *__restrict__ sm, const float *__restrict__ si, int need_x,
                           int64_t C, int64_t S, int64_t M, int64_t R, float2 *__restrict__ part) {
  __shared__ float s1s[kThreads], s2s[kThreads];
  int64_t c = blockIdx.x, p = blockIdx.y;
  int64_t r0 = p * R, r1 = r0 + R < M ? r0 + R : M;
  float mean = need_x ? sm[c] : 0.0f, invstd = need_x ? si[c] : 0.0f, s1 = 0, s2 = 0;
  for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
    int64_t n = r / S, s = r - n * S;
    bn_grad_terms(x, dy, (n * C + c) * S + s, mean, invstd, need_x, s1, s2);
  }
  s1s[threadIdx.x] = s1;
  s2s[threadIdx.x] = s2;
  __syncthreads();
  for (int off = kThreads / 2; off > 0; off >>= 1) {
    if ((int)threadIdx.x < off) {
      s1s[threadIdx.x] += s1s[threadIdx.x + off];
      s2s[threadIdx.x] += s2s[threadIdx.x + off];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) part[p * C + c] = make_float2(s1s[0], s2s[0]);
}

template <typename T>
__global__ void bn_gsum_cl(const T *__restrict__ x, const T *__restrict__ dy,
                           const float *__restrict__ sm, const float *__restrict__ si, int need_x,
                           int64_t C, int64_t M, int64_t R, float2 *__restrict__ part) {
  __shared__ float s1s[kClRows][32], s2s[kClRows][32];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t c = (int64_t)blockIdx.x * 32 + tx, p = blockIdx.y;
  int64_t r0 = p * R, r1 = r0 + R < M ? r0 + R : M;
  float s1 = 0, s2 = 0;
  if (c < C) {
    float mean = need_x ? sm[c] : 0.0f, invstd = need_x ? si[c] : 0.0f;
    for (int64_t r = r0 + ty; r < r1; r += kClRows)
      bn_grad_terms(x, dy, r * C + c, mean, invstd, need_x, s1, s2);
  }
  s1s[ty][tx] = s1;
  s2s[ty][tx] = s2;
  __syncthreads();
  for (int off = kClRows / 2; off > 0; off >>= 1) {
    if (ty < off) {
      s1s[ty][tx] += s1s[ty + off][tx];
      s2s[ty][tx] += s2s[ty + off][tx];
    }
    __syncthreads();
  }
  if (ty == 0 && c < C) part[p * C + c] = make_float2(s1s[0][tx], s2s[0][tx]);
}

// Per channel: the sums over partitions in order (double); dbias = sum dy,
// dweight = sum dy xhat (param_grad_beta); `mid` gets what dx needs:
// (sum dy / m, sum dy xhat / m) in training, zeros in eval.
template <typename T>
__global__ void bn_gfinalize(const float2 *__restrict__ part, int P, int64_t C, double m,
                             int training, T *dw, float bw, T *db, float bb,
                             float2 *__restrict__ mid) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double s1 = 0, s2 = 0;
  for (int p = 0; p < P; p++) {
    float2 v = part[(int64_t)p * C + c];
    s1 += (double)v.x;
    s2 += (double)v.y;
  }
  if (dw) acc(&dw[c], bw, (float)s2);
  if (db) acc(&db[c], bb, (float)s1);
  mid[c] = training ? make_float2((float)(s1 / m), (float)(s2 / m)) : make_float2(0.0f, 0.0f);
}

// dx = weight invstd (dy - mean(dy) - xhat mean(dy xhat)) (training), or
// weight invstd dy (eval: mid holds zeros).
template <typename T>
__global__ void bn_dx(const T *__restrict__ x, const T *__restrict__ dy, T *dx,
                      const T *__restrict__ w, const float *__restrict__ sm,
                      const float *__restrict__ si, const float2 *__restrict__ mid, float beta,
                      int64_t total, int64_t C, int64_t S, int cl) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t c = cl ? i % C : (i / S) % C;
    float invstd = si[c], xhat = (to_f(x[i]) - sm[c]) * invstd;
    float2 md = mid[c];
    acc(&dx[i], beta, to_f(w[c]) * invstd * (to_f(dy[i]) - md.x - xhat * md.y));
  }
}

template <typename T>
stoke_err *bn_fwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  bn_geom g;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(bn_check(a, dtype_of<T>::value, false, false, &g));
  if (ws) *ws = bn_workspace(&g);
  return NULL;
}

template <typename T>
stoke_err *bn_bwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  bn_geom g;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(bn_check(a, dtype_of<T>::value, true, false, &g));
  if (ws) *ws = bn_workspace(&g);
  return NULL;
}

template <typename T>
stoke_err *bn_fwd(const stoke_kernel_args_v1 *a, void *) {
  bn_geom g;
  CHECK(bn_check(a, dtype_of<T>::value, false, true, &g));
  cudaStream_t st = (cudaStream_t)a->stream;
  const T *x = (const T *)a->in[0].data;
  float *rm = (float *)a->in[3].data, *rv = (float *)a->in[4].data;
  float *sm = (float *)a->out[1].data, *si = (float *)a->out[2].data;
  float2 *part = (float2 *)a->workspace;
  if (g.c == 0) return NULL;
  if (a->training && g.m > 0) {
    if (g.cl)
      bn_stats_cl<T><<<dim3((unsigned)((g.c + 31) / 32), (unsigned)g.parts), dim3(32, kClRows), 0,
                       st>>>(x, g.c, g.m, g.rows, part);
    else
      bn_stats_cm<T><<<dim3((unsigned)g.c, (unsigned)g.parts), kThreads, 0, st>>>(
          x, g.c, g.s, g.m, g.rows, part);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  bn_finalize<<<(unsigned)((g.c + kThreads - 1) / kThreads), kThreads, 0, st>>>(
      part, g.parts, g.c, g.m, g.rows, g.eps, g.momentum, a->training, rm, rv, sm, si);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  int64_t total = g.m * g.c;
  if (total > 0) {
    bn_apply<T><<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, st>>>(
        x, (T *)a->out[0].data, (const T *)a->in[1].data, (const T *)a->in[2].data, sm, si, total,
        g.c, g.s, g.cl ? 1 : 0);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  return NULL;
}

template <typename T>
stoke_err *bn_bwd(const stoke_kernel_args_v1 *a, void *) {
  bn_geom g;
  CHECK(bn_check(a, dtype_of<T>::value, true, true, &g));
  T *dx = (T *)a->din[0].data, *dw = (T *)a->din[1].data, *db = (T *)a->din[2].data;
  if ((!dx && !dw && !db) || g.c == 0) return NULL;
  cudaStream_t st = (cudaStream_t)a->stream;
  const T *x = (const T *)a->in[0].data, *dy = (const T *)a->dout[0].data;
  const float *sm = (const float *)a->out[1].data, *si = (const float *)a->out[2].data;
  int need_x = dx || dw;
  float2 *part = (float2 *)a->workspace, *mid = part + (size_t)g.parts * (size_t)g.c;
  if (g.m > 0) {
    if (g.cl)
      bn_gsum_cl<T><<<dim3((unsigned)((g.c + 31) / 32), (unsigned)g.parts), dim3(32, kClRows), 0,
                      st>>>(x, dy, sm, si, need_x, g.c, g.m, g.rows, part);
    else
      bn_gsum_cm<T><<<dim3((unsigned)g.c, (unsigned)g.parts), kThreads, 0, st>>>(
          x, dy, sm, si, need_x, g.c, g.s, g.m, g.rows, part);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  } else {
    STOKE_CUDA(cudaMemsetAsync(part, 0, (size_t)g.parts * (size_t)g.c * sizeof(float2), st),
               "zeroing the batch_norm partial sums");
  }
  bn_gfinalize<T><<<(unsigned)((g.c + kThreads - 1) / kThreads), kThreads, 0, st>>>(
      part, g.parts, g.c, (double)g.m, a->training, dw, stoke_grad_beta(a, 1), db, stoke_grad_beta(a, 2),
      mid);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  int64_t total = g.m * g.c;
  if (dx && total > 0) {
    bn_dx<T><<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, st>>>(
        x, dy, dx, (const T *)a->in[1].data, sm, si, mid, stoke_grad_beta(a, 0), total, g.c, g.s,
        g.cl ? 1 : 0);
    STOKE_CUDA_LAUNCH(stoke_node_name(a));
  }
  return NULL;
}

// ===================================================================== pools

// Element strides of a logical (N, C, H, W) tensor.
struct pstrides {
  int64_t n, c, h, w;
};

pstrides pool_strides(const stoke_tensor *t) {
  const int64_t *d = t->shape.d;
  if (t->layout == STOKE_NHWC) return pstrides{d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return pstrides{d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// Everything a pool kernel needs, by value.
struct pool_desc {
  int64_t N, C, H, W, Ho, Wo;
  int64_t kh, kw, sh, sw, ph, pw;
  pstrides sx, sy, sdx; // x, y (or dy), dx
};

// x[N, C, H, W] -> y[N, C, Ho, Wo] of dtype dt (stoke_check_pool) and the
// kernels' description; `max`: 0 avg, 1 max_pool2d (backward reads x), 2 max_pool2d_idx.
stoke_err *pool_check(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, bool bwd,
                      bool run, int max, pool_desc *pd) {
  stoke_pool_geom g;
  CHECK(stoke_check_pool(a, op, dt, bwd, run, max, &g));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  const stoke_shape *xs = &x->shape;
  *pd = pool_desc{xs->d[0], xs->d[1], xs->d[2], xs->d[3], g.out[0], g.out[1],
                  g.k[0],   g.k[1],   g.s[0],   g.s[1],   g.p[0],   g.p[1],
                  pool_strides(x), pool_strides(y), pool_strides(x)};
  if (bwd) {
    pd->sy = pool_strides(&a->dout[0]);
    pd->sdx = pool_strides(&a->din[0]);
  }
  return NULL;
}

// Logical (n, c, h, w) of memory index i of a tensor of dims (N, C, H, W)
// in NHWC (nhwc) or NCHW memory order.
template <typename I>
__device__ __forceinline__ void decode(I i, I C, I H, I W, bool nhwc, I &n, I &c, I &h, I &w) {
  if (nhwc) {
    c = i % C;
    i /= C;
    w = i % W;
    i /= W;
    h = i % H;
    n = i / H;
  } else {
    w = i % W;
    i /= W;
    h = i % H;
    i /= H;
    c = i % C;
    n = i / C;
  }
}

// First maximum of window (oh, ow) of channel (n, c) in row-major scan
// order, as the CPU reference: -inf padding never wins; a NaN wins. Returns
// the window-relative index (i kw + j), -1 if the window has no element.
template <typename T>
__device__ __forceinline__ int64_t max_window(const T *x, const pool_desc &d, int64_t n, int64_t c,
                                              int64_t oh, int64_t ow, float *best_out) {
  int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw, arg = -1;
  float best = -INFINITY;
  const T *xc = x + n * d.sx.n + c * d.sx.c;
  for (int64_t i = 0; i < d.kh; i++) {
    int64_t h = h0 + i;
    if (h < 0 || h >= d.H) continue;
    for (int64_t j = 0; j < d.kw; j++) {
      int64_t w = w0 + j;
      if (w < 0 || w >= d.W) continue;
      float v = to_f(xc[h * d.sx.h + w * d.sx.w]);
      if (arg < 0 || v > best || (isnan(v) && !isnan(best))) {
        best = v;
        arg = i * d.kw + j;
      }
    }
  }
  *best_out = best;
  return arg;
}

template <typename T>
__global__ void max_pool_fwd_k(const T *__restrict__ x, T *__restrict__ y, pool_desc d,
                               int y_nhwc, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n, c, oh, ow;
    decode(i, d.C, d.Ho, d.Wo, y_nhwc, n, c, oh, ow);
    float best;
    max_window(x, d, n, c, oh, ow, &best);
    y[i] = from_f<T>(best);
  }
}

template <typename T>
__global__ void avg_pool_fwd_k(const T *__restrict__ x, T *__restrict__ y, pool_desc d,
                               int y_nhwc, int64_t total) {
  float inv = 1.0f / (float)(d.kh * d.kw);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n, c, oh, ow;
    decode(i, d.C, d.Ho, d.Wo, y_nhwc, n, c, oh, ow);
    int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    const T *xc = x + n * d.sx.n + c * d.sx.c;
    float s = 0;
    for (int64_t h = h0 < 0 ? 0 : h0; h < h0 + d.kh && h < d.H; h++)
      for (int64_t w = w0 < 0 ? 0 : w0; w < w0 + d.kw && w < d.W; w++)
        s += to_f(xc[h * d.sx.h + w * d.sx.w]);
    y[i] = from_f<T>(s * inv);
  }
}

// Windows (oh, ow) that hold input row h / column w: oh s - p <= h <= oh s
// - p + k - 1, clipped to the output.
__device__ __forceinline__ void window_range(int64_t h, int64_t k, int64_t s, int64_t p,
                                             int64_t O, int64_t &o0, int64_t &o1) {
  int64_t hp = h + p;
  o1 = hp / s;
  o0 = hp - k + 1 > 0 ? (hp - k + s) / s : 0;
  if (o1 >= O) o1 = O - 1;
}

// dx[h, w] = sum of dy over the windows whose first maximum is (h, w); a
// gather in window order (the CPU's order), no atomics.
template <typename T>
__global__ void max_pool_bwd_k(const T *__restrict__ x, const T *__restrict__ dy, T *dx,
                               pool_desc d, int dx_nhwc, float beta, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n, c, h, w, oh0, oh1, ow0, ow1;
    decode(i, d.C, d.H, d.W, dx_nhwc, n, c, h, w);
    window_range(h, d.kh, d.sh, d.ph, d.Ho, oh0, oh1);
    window_range(w, d.kw, d.sw, d.pw, d.Wo, ow0, ow1);
    float s = 0;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        float best;
        int64_t arg = max_window(x, d, n, c, oh, ow, &best);
        int64_t ah = oh * d.sh - d.ph + arg / d.kw, aw = ow * d.sw - d.pw + arg % d.kw;
        if (arg >= 0 && ah == h && aw == w)
          s += to_f(dy[n * d.sy.n + c * d.sy.c + oh * d.sy.h + ow * d.sy.w]);
      }
    acc(&dx[i], beta, s);
  }
}

// Two passes (when the window has at most 127 elements): first each
// output's first-maximum index (int8, -1 for an empty window) into the
// workspace, then each input element gathers dy from the windows whose
// index points at it. The same sums in the same order as max_pool_bwd_k,
// but each window's maximum is found once instead of once per element.
// I: the index type; 32-bit when every index fits (64-bit division is
// the cost of these kernels: ResNet-50's max-pool backward took 7 ms).
template <typename T, typename I>
__global__ void max_pool_arg_k(const T *__restrict__ x, int8_t *__restrict__ arg, pool_desc d,
                               int y_nhwc, I total) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
    I n, c, oh, ow;
    decode<I>(i, (I)d.C, (I)d.Ho, (I)d.Wo, y_nhwc, n, c, oh, ow);
    I h0 = oh * (I)d.sh - (I)d.ph, w0 = ow * (I)d.sw - (I)d.pw;
    const T *xc = x + (I)(n * (I)d.sx.n + c * (I)d.sx.c);
    float best = -INFINITY;
    int a = -1;
    for (I r = 0; r < (I)d.kh; r++) {
      I h = h0 + r;
      if (h < 0 || h >= (I)d.H) continue;
      for (I q = 0; q < (I)d.kw; q++) {
        I w = w0 + q;
        if (w < 0 || w >= (I)d.W) continue;
        float v = to_f(xc[h * (I)d.sx.h + w * (I)d.sx.w]);
        if (a < 0 || v > best || (isnan(v) && !isnan(best))) {
          best = v;
          a = (int)(r * (I)d.kw + q);
        }
      }
    }
    arg[i] = (int8_t)a;
  }
}

// arg is laid out like dy (strides sy)
template <typename T, typename I>
__global__ void max_pool_bwd_arg_k(const int8_t *__restrict__ arg, const T *__restrict__ dy, T *dx,
                                   pool_desc d, int dx_nhwc, float beta, I total) {
  const I kh = (I)d.kh, kw = (I)d.kw, sh = (I)d.sh, sw = (I)d.sw, ph = (I)d.ph, pw = (I)d.pw;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
    I n, c, h, w;
    decode<I>(i, (I)d.C, (I)d.H, (I)d.W, dx_nhwc, n, c, h, w);
    /* windows holding row h: oh s - p <= h <= oh s - p + k - 1 */
    I hp = h + ph, wp = w + pw;
    I oh1 = hp / sh, ow1 = wp / sw;
    I oh0 = hp - kh + 1 > 0 ? (hp - kh + sh) / sh : 0, ow0 = wp - kw + 1 > 0 ? (wp - kw + sw) / sw : 0;
    if (oh1 >= (I)d.Ho) oh1 = (I)d.Ho - 1;
    if (ow1 >= (I)d.Wo) ow1 = (I)d.Wo - 1;
    float s = 0;
    for (I oh = oh0; oh <= oh1; oh++)
      for (I ow = ow0; ow <= ow1; ow++) {
        I o = n * (I)d.sy.n + c * (I)d.sy.c + oh * (I)d.sy.h + ow * (I)d.sy.w;
        int a = arg[o];
        if (a >= 0 && oh * sh - ph + (I)a / kw == h && ow * sw - pw + (I)a % kw == w) s += to_f(dy[o]);
      }
    acc(&dx[i], beta, s);
  }
}

// The window taps: KH x KW when known at compile time (ResNet's 3 x 3: unrolled, no loop
// overhead), else kh x kw.
template <int KH, int KW> struct taps {
  int kh, kw;
  __device__ __forceinline__ int rows() const { return KH ? KH : kh; }
  __device__ __forceinline__ int cols() const { return KW ? KW : kw; }
};

// f(tap, its V lanes) for each tap of the window at (h0, w0) that lies in the image, in row-major
// order (tap = r * kw + q). Vectors of the thread's channel group cg; image row h0 + r at
// (roff + r) * row_vecs in t: a whole NHWC plane (roff = h0) or a tile of the window's rows
// (roff = 0).
template <typename T, int V, int KH, int KW, typename F>
__device__ __forceinline__ void for_each_tap(const vec<T, V> *__restrict__ t, int roff, int row_vecs, int CG, int cg,
                                             int h0, int H, int w0, int W, taps<KH, KW> k, F f) {
#pragma unroll
  for (int r = 0; r < k.rows(); r++) {
    if (h0 + r < 0 || h0 + r >= H) continue;
#pragma unroll
    for (int q = 0; q < k.cols(); q++) {
      if (w0 + q < 0 || w0 + q >= W) continue;
      f(r * k.cols() + q, t[(roff + r) * row_vecs + (w0 + q) * CG + cg]);
    }
  }
}

// Each lane's window maximum (best, in float) and its first index (a; -1 for an empty window) by
// the scan: a NaN wins over any number, the first of equals is kept.
template <typename T, int V, int KH, int KW>
__device__ __forceinline__ void window_scan(const vec<T, V> *__restrict__ t, int roff, int row_vecs, int CG, int cg,
                                            int h0, int H, int w0, int W, taps<KH, KW> k, float best[V], int a[V]) {
#pragma unroll
  for (int j = 0; j < V; j++) best[j] = -INFINITY, a[j] = -1;
  for_each_tap<T, V>(t, roff, row_vecs, CG, cg, h0, H, w0, W, k, [&](int tap, const vec<T, V> &v) {
#pragma unroll
    for (int j = 0; j < V; j++) {
      float f = to_f(v.v[j]);
      if (a[j] < 0 || f > best[j] || (isnan(f) && !isnan(best[j]))) best[j] = f, a[j] = tap;
    }
  });
}

// NHWC with C a multiple of V (16 bytes of channels): one thread takes V
// channels of one position, with 16-byte loads and one index decode for
// all of them, 32-bit indices (the caller checks they fit). The same
// comparisons and sums in the same order as the kernels above, lane by
// lane: ResNet-50's max pool (64 x 112 x 112 -> 56 x 56) took 1.6 ms
// forward and 4.4 ms backward with one element per thread.
// y (when not NULL) gets each window's maximum, arg (when not NULL) its index (window_scan).
template <typename T, int V>
__global__ void max_pool_fwd_v(const T *__restrict__ x, T *__restrict__ y, int8_t *__restrict__ arg,
                               pool_desc d, int total) {
  const int CG = (int)d.C / V, Ho = (int)d.Ho, Wo = (int)d.Wo;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int cg = i % CG, p = i / CG, ow = p % Wo, oh = (p / Wo) % Ho, n = p / Wo / Ho;
    float best[V];
    int a[V];
    const int h0 = oh * (int)d.sh - (int)d.ph;
    window_scan<T, V>(reinterpret_cast<const vec<T, V> *>(x + (int64_t)n * d.H * d.W * d.C), h0, (int)d.W * CG, CG,
                      cg, h0, (int)d.H, ow * (int)d.sw - (int)d.pw, (int)d.W, taps<0, 0>{(int)d.kh, (int)d.kw}, best,
                      a);
    int64_t o = (int64_t)i * V; /* NHWC output: position-major, then channels */
    if (y) {
      vec<T, V> out;
#pragma unroll
      for (int k = 0; k < V; k++) out.v[k] = from_f<T>(best[k]);
      *reinterpret_cast<vec<T, V> *>(y + o) = out;
    }
    if (arg) {
      vec<int8_t, V> av;
#pragma unroll
      for (int k = 0; k < V; k++) av.v[k] = (int8_t)a[k];
      *reinterpret_cast<vec<int8_t, V> *>(arg + o) = av;
    }
  }
}

// dx gathers dy from the windows holding its position whose index points
// at it; for a fixed position that index is the same for every lane.
template <typename T, int V>
__global__ void max_pool_bwd_v(const int8_t *__restrict__ arg, const T *__restrict__ dy, T *dx, pool_desc d,
                               float beta, int total) {
  const int CG = (int)d.C / V, H = (int)d.H, W = (int)d.W, C = (int)d.C;
  const int kh = (int)d.kh, kw = (int)d.kw, sh = (int)d.sh, sw = (int)d.sw, ph = (int)d.ph, pw = (int)d.pw;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int cg = i % CG, p = i / CG, w = p % W, h = (p / W) % H, n = p / W / H;
    int hp = h + ph, wp = w + pw;
    int oh1 = min(hp / sh, (int)d.Ho - 1), ow1 = min(wp / sw, (int)d.Wo - 1);
    int oh0 = hp - kh + 1 > 0 ? (hp - kh + sh) / sh : 0, ow0 = wp - kw + 1 > 0 ? (wp - kw + sw) / sw : 0;
    float s[V];
#pragma unroll
    for (int k = 0; k < V; k++) s[k] = 0;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        int64_t o = (((int64_t)n * d.Ho + oh) * d.Wo + ow) * C + cg * V;
        int target = (h - (oh * sh - ph)) * kw + (w - (ow * sw - pw));
        vec<int8_t, V> av = *reinterpret_cast<const vec<int8_t, V> *>(arg + o);
        vec<T, V> dv = *reinterpret_cast<const vec<T, V> *>(dy + o);
#pragma unroll
        for (int k = 0; k < V; k++)
          if (av.v[k] == target) s[k] += to_f(dv.v[k]);
      }
    vec<T, V> *dst = reinterpret_cast<vec<T, V> *>(dx + (int64_t)i * V), out;
    if (beta != 0.0f) out = *dst;
#pragma unroll
    for (int k = 0; k < V; k++) out.v[k] = from_f<T>(beta != 0.0f ? beta * to_f(out.v[k]) + s[k] : s[k]);
    *dst = out;
  }
}

// Row tiles (NHWC, C a multiple of V): a block takes one row of the output (forward, window
// indices) or of dx (backward's gather) at a time. The rows of the input it reads (x; dy and the
// indices) are contiguous in NHWC, so they are copied whole into shared memory first, every
// 16-byte load in flight at once (cp.async), and the windows are read from there: the kernels
// above issue nine dependent-address loads per output from global memory and moved ResNet-50's
// max pool at 1.3-1.8 TB/s. Same comparisons and sums in the same order: the same bits.
constexpr int kPoolTileBytes = 48 * 1024;  // the shared memory a block has without opting in

// Rows [r0, r0 + nr) of a [rows, row_vecs x 16 bytes] plane into shared memory (rows outside
// [0, rows) are skipped: the kernels never read them). Issues the copies; pool_tile_wait waits.
__device__ __forceinline__ void pool_tile_load(uint4 *dst, const void *plane, int r0, int nr, int rows,
                                               int row_vecs) {
  const uint4 *src = static_cast<const uint4 *>(plane);
  for (int k = 0; k < nr; k++) {  // a row at a time: no division per vector
    const int r = r0 + k;
    if (r < 0 || r >= rows) continue;
    const uint4 *sr = src + (int64_t)r * row_vecs;
    for (int i = threadIdx.x; i < row_vecs; i += blockDim.x) cp_async16(dst + k * row_vecs + i, sr + i);
  }
  cp_async_commit();
}

__device__ __forceinline__ void pool_tile_wait() {
  cp_async_wait_all();
  __syncthreads();
}

// 16-bit dtypes two lanes at a time: the per-element scan below (a conversion and a NaN-aware
// comparison per element and tap) made the row-tile kernels instruction-bound, not memory-bound
// (ResNet-50's max pool: 0.30 ms forward, 0.75 ms backward, the same as the per-window kernels).
template <typename T> struct pair2 {};
template <> struct pair2<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ float2 to_f2(uint32_t w) {  // exact: bf16 is f32's top half
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  }
};
template <> struct pair2<__half> {
  using type = __half2;
  static __device__ __forceinline__ float2 to_f2(uint32_t w) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&w));
  }
};

// The window's maximum, V lanes, from the tile t of its rows (row r at r * row_vecs vectors; the
// thread's channel group cg) by packed NaN-propagating max: a NaN wins, as in the scan; -inf for
// an empty window. Where +0 and -0 tie either may come out (the scan keeps the first; they are
// equal values).
template <typename T, int V, int KH, int KW>
__device__ __forceinline__ void window_max2(const vec<T, V> *t, int row_vecs, int CG, int cg, int h0, int H, int w0,
                                            int W, taps<KH, KW> k, typename pair2<T>::type m[V / 2]) {
  using P = typename pair2<T>::type;
  const T ninf = from_f<T>(-INFINITY);
#pragma unroll
  for (int j = 0; j < V / 2; j++) m[j] = P{ninf, ninf};
  for_each_tap<T, V>(t, 0, row_vecs, CG, cg, h0, H, w0, W, k, [&](int, const vec<T, V> &v) {
    const P *pv = reinterpret_cast<const P *>(&v);
#pragma unroll
    for (int j = 0; j < V / 2; j++) m[j] = __hmax2_nan(m[j], pv[j]);
  });
}

// The window's maximum m (as window_max2: the same packed maxima in the same order) and the first tap of
// each lane equal to it (a, row-major scan order, as max_window; -1 where the window is empty), in one
// pass over the taps. A lane's index moves to a tap whose value is strictly greater than the maximum
// so far, so it ends at the first tap equal (==, +0 and -0 alike) to the final maximum. Returns false
// when a lane's maximum is NaN (the caller's scan finds its first NaN). It replaced a second pass
// that looked for the maximum among the taps again (0.187 ms for ResNet-50's max pool forward
// against 0.132 without indices, BENCHMARKS.md run 23).
template <typename T, int V, int KH, int KW>
__device__ __forceinline__ bool window_maxarg2(const vec<T, V> *t, int row_vecs, int CG, int cg, int h0, int H,
                                               int w0, int W, taps<KH, KW> k, typename pair2<T>::type m[V / 2],
                                               int8_t a[V]) {
  using P = typename pair2<T>::type;
  const T ninf = from_f<T>(-INFINITY);
  unsigned idx[V / 2];
  bool any = false;
#pragma unroll
  for (int j = 0; j < V / 2; j++) m[j] = P{ninf, ninf}, idx[j] = 0;
  for_each_tap<T, V>(t, 0, row_vecs, CG, cg, h0, H, w0, W, k, [&](int tap, const vec<T, V> &v) {
    const P *pv = reinterpret_cast<const P *>(&v);
    const unsigned tap2 = (unsigned)tap * 0x00010001u;
#pragma unroll
    for (int j = 0; j < V / 2; j++) {
      const unsigned up = any ? __hgt2_mask(pv[j], m[j]) : 0xffffffffu;
      idx[j] = (idx[j] & ~up) | (tap2 & up);
      m[j] = __hmax2_nan(m[j], pv[j]);
    }
    any = true;
  });
#pragma unroll
  for (int j = 0; j < V / 2; j++) {
    if (__hisnan(m[j].x) || __hisnan(m[j].y)) return false;
    a[2 * j] = any ? (int8_t)(idx[j] & 0xffffu) : (int8_t)-1;
    a[2 * j + 1] = any ? (int8_t)(idx[j] >> 16) : (int8_t)-1;
  }
  return true;
}

// Threads of a row-tile block: a whole number of channel groups, so that each thread keeps its
// group (no division per output); pool_tile_bytes refuses CG > kThreads.
inline int pool_tile_threads(int64_t cg) { return (int)(kThreads / cg * cg); }

// Output row (n, oh) per block: the kh input rows its windows span, then y (when not NULL) and
// the window indices (arg, when not NULL) of every position and channel, as max_pool_fwd_v.
template <typename T, int V, int KH, int KW>
__device__ __forceinline__ void fwd_row(const vec<T, V> *t, T *__restrict__ y, int8_t *__restrict__ arg,
                                        const pool_desc &d, int row, int h0, taps<KH, KW> k) {
  const int H = (int)d.H, W = (int)d.W, C = (int)d.C, Wo = (int)d.Wo, CG = C / V, row_vecs = W * CG;
  const int sw = (int)d.sw, pw = (int)d.pw, cg = threadIdx.x % CG, step = blockDim.x / CG;
  for (int ow = threadIdx.x / CG; ow < Wo; ow += step) {
    const int w0 = ow * sw - pw;
    const int64_t out = ((int64_t)row * Wo + ow) * C + cg * V;  // NHWC: (n, oh) is `row`
    vec<int8_t, V> av;
    if constexpr (sizeof(T) == 2) {
      typename pair2<T>::type m[V / 2];
      if (!arg) {
        window_max2<T, V>(t, row_vecs, CG, cg, h0, H, w0, W, k, m);
        if (y) *reinterpret_cast<vec<T, V> *>(y + out) = *reinterpret_cast<const vec<T, V> *>(m);
        continue;
      }
      const bool ok = window_maxarg2<T, V>(t, row_vecs, CG, cg, h0, H, w0, W, k, m, av.v);
      if (y) *reinterpret_cast<vec<T, V> *>(y + out) = *reinterpret_cast<const vec<T, V> *>(m);
      if (ok) {
        *reinterpret_cast<vec<int8_t, V> *>(arg + out) = av;
        continue;
      }
    }
    float best[V];
    int a[V];
    window_scan<T, V>(t, 0, row_vecs, CG, cg, h0, H, w0, W, k, best, a);
    if (y && sizeof(T) != 2) {
      vec<T, V> ov;
#pragma unroll
      for (int j = 0; j < V; j++) ov.v[j] = from_f<T>(best[j]);
      *reinterpret_cast<vec<T, V> *>(y + out) = ov;
    }
    if (arg) {
#pragma unroll
      for (int j = 0; j < V; j++) av.v[j] = (int8_t)a[j];
      *reinterpret_cast<vec<int8_t, V> *>(arg + out) = av;
    }
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) max_pool_fwd_rows(const T *__restrict__ x, T *__restrict__ y,
                                                              int8_t *__restrict__ arg, pool_desc d) {
  extern __shared__ uint4 pool_tile[];
  const int H = (int)d.H, W = (int)d.W, C = (int)d.C, Ho = (int)d.Ho, kh = (int)d.kh, kw = (int)d.kw;
  const vec<T, V> *t = reinterpret_cast<const vec<T, V> *>(pool_tile);
  for (int row = blockIdx.x; row < (int)d.N * Ho; row += gridDim.x) {
    const int n = row / Ho, h0 = (row % Ho) * (int)d.sh - (int)d.ph;
    pool_tile_load(pool_tile, x + (int64_t)n * H * W * C, h0, kh, H, W * C / V);
    pool_tile_wait();
    if (kh == 3 && kw == 3) fwd_row<T, V>(t, y, arg, d, row, h0, taps<3, 3>{3, 3});
    else fwd_row<T, V>(t, y, arg, d, row, h0, taps<0, 0>{kh, kw});
    __syncthreads();  // the next row's copies overwrite the tile
  }
}

// The V lanes of dy (the words dw) whose window index (the bytes aw) is `target`, added to s:
// byte-equality masks widened to each lane's bits. Adding a masked-off +0 leaves s as it was, so
// the sums are bitwise the per-lane `if (arg == target) s += dy` of max_pool_bwd_v.
template <typename T, int V>
__device__ __forceinline__ void gather_lanes(const uint32_t *aw, const uint4 &dv, int target, float s[V]) {
  const uint32_t tb = (uint32_t)target * 0x01010101u, dw[4] = {dv.x, dv.y, dv.z, dv.w};
  if constexpr (V == 8) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float2 f = pair2<T>::to_f2(dw[j] & __byte_perm(__vcmpeq4(aw[j >> 1], tb), 0, (j & 1) ? 0x3322 : 0x1100));
      s[2 * j] += f.x, s[2 * j + 1] += f.y;
    }
  } else {
    static_assert(V == 4, "f32: four lanes of 16 bytes");
    const uint32_t m = __vcmpeq4(aw[0], tb);
#pragma unroll
    for (int j = 0; j < 4; j++) s[j] += __uint_as_float(dw[j] & __byte_perm(m, 0, 0x1111u * j));
  }
}

// One dx row (n, h): each position and channel gathers from the windows (oh0 .. oh1, and the
// columns' ow0 .. ow1) in the tiles of dy (tdy) and of the indices (targ). KW, SW: the window's
// width and column stride when known at compile time (ResNet's 3 and 2: no division per
// position), else 0 (d's).
template <typename T, int V, int KW, int SW>
__device__ __forceinline__ void bwd_row(const uint4 *tdy, const int8_t *targ, T *dx, const pool_desc &d, int row,
                                        int h, int oh0, int oh1, float beta) {
  const int W = (int)d.W, C = (int)d.C, Wo = (int)d.Wo, CG = C / V, dy_vecs = Wo * CG;
  const int kw = KW ? KW : (int)d.kw, sw = SW ? SW : (int)d.sw, hp = h + (int)d.ph, pw = (int)d.pw;
  const int sh = (int)d.sh, cg = threadIdx.x % CG, step = blockDim.x / CG;
  for (int w = threadIdx.x / CG; w < W; w += step) {
    const int wp = w + pw;
    const int ow1 = min(wp / sw, Wo - 1), ow0 = wp - kw + 1 > 0 ? (wp - kw + sw) / sw : 0;
    float s[V];
#pragma unroll
    for (int j = 0; j < V; j++) s[j] = 0;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        const int target = (hp - oh * sh) * kw + (wp - ow * sw);
        const uint32_t *aw = reinterpret_cast<const uint32_t *>(targ + ((oh - oh0) * Wo + ow) * C + cg * V);
        gather_lanes<T, V>(aw, tdy[(oh - oh0) * dy_vecs + ow * CG + cg], target, s);
      }
    vec<T, V> *dst = reinterpret_cast<vec<T, V> *>(dx + ((int64_t)row * W + w) * C + cg * V), ov;
    if (beta != 0.0f) ov = *dst;
#pragma unroll
    for (int j = 0; j < V; j++) ov.v[j] = from_f<T>(beta != 0.0f ? beta * to_f(ov.v[j]) + s[j] : s[j]);
    *dst = ov;
  }
}

// dx row (n, h) per block: the rows of dy and of the indices of the windows that hold row h
// (at most ceil(kh / sh)), then every position and channel gathers as max_pool_bwd_v.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) max_pool_bwd_rows(const int8_t *__restrict__ arg,
                                                              const T *__restrict__ dy, T *dx, pool_desc d,
                                                              float beta) {
  extern __shared__ uint4 pool_tile[];
  const int H = (int)d.H, C = (int)d.C, Ho = (int)d.Ho, Wo = (int)d.Wo, CG = C / V;
  const int kh = (int)d.kh, kw = (int)d.kw, sh = (int)d.sh, sw = (int)d.sw, ph = (int)d.ph;
  const int nr_max = (kh + sh - 1) / sh, dy_vecs = Wo * CG, arg_vecs = Wo * C / 16;
  const uint4 *tdy = pool_tile;
  const int8_t *targ = reinterpret_cast<const int8_t *>(pool_tile + nr_max * dy_vecs);
  for (int row = blockIdx.x; row < (int)d.N * H; row += gridDim.x) {
    const int n = row / H, h = row % H, hp = h + ph;
    const int oh1 = min(hp / sh, Ho - 1), oh0 = hp - kh + 1 > 0 ? (hp - kh + sh) / sh : 0;
    const int nr = oh1 >= oh0 ? oh1 - oh0 + 1 : 0;
    const int64_t plane = (int64_t)n * Ho * Wo * C;
    pool_tile_load(pool_tile, dy + plane, oh0, nr, Ho, dy_vecs);
    pool_tile_load(pool_tile + nr_max * dy_vecs, arg + plane, oh0, nr, Ho, arg_vecs);
    pool_tile_wait();
    if (kw == 3 && sw == 2) bwd_row<T, V, 3, 2>(tdy, targ, dx, d, row, h, oh0, oh1, beta);
    else bwd_row<T, V, 0, 0>(tdy, targ, dx, d, row, h, oh0, oh1, beta);
    __syncthreads();
  }
}

// ResNet's window (3x3, stride 2, padding 1) without shared memory: a thread takes a 2x2 tile of dx
// positions (rows 2i, 2i + 1, columns 2j, 2j + 1) of one channel group. Exactly the four windows
// (i or i + 1, j or j + 1) hold its positions, so it loads each window's dy and indices once (16 and
// V bytes, all four in flight) and gathers from them with the taps known at compile time: no
// division per position, no tile to stage and wait for. max_pool_bwd_rows loads a window's vectors
// 2.25 times on average from shared memory and took 0.365 ms for ResNet-50's 565 MB (1.5 TB/s).
// Each dx element sums its windows in (oh, ow) order, as bwd_row: the same bits.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    max_pool_bwd_k3s2(const int8_t *__restrict__ arg, const T *__restrict__ dy, T *dx, pool_desc d, float beta,
                      int total) {
  const int C = (int)d.C, CG = C / V, H = (int)d.H, W = (int)d.W, Ho = (int)d.Ho, Wo = (int)d.Wo;
  const int Ti = (H + 1) / 2, Tj = (W + 1) / 2;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
    const int cg = t % CG, p = t / CG, j = p % Tj, q = p / Tj, i = q % Ti, n = q / Ti;
    uint4 dv[2][2];
    uint32_t aw[2][2][2];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int b = 0; b < 2; b++) {
        const int oh = i + a, ow = j + b;
        dv[a][b] = make_uint4(0, 0, 0, 0);
        aw[a][b][0] = aw[a][b][1] = 0xffffffffu;  // no tap: masks nothing in
        if (oh < Ho && ow < Wo) {
          const int64_t o = (((int64_t)n * Ho + oh) * Wo + ow) * C + cg * V;
          dv[a][b] = *reinterpret_cast<const uint4 *>(dy + o);
          if constexpr (V == 8) {
            const uint2 w = *reinterpret_cast<const uint2 *>(arg + o);
            aw[a][b][0] = w.x, aw[a][b][1] = w.y;
          } else {
            aw[a][b][0] = *reinterpret_cast<const uint32_t *>(arg + o);
          }
        }
      }
    // dx row 2i + r (r = 0, 1) and column 2j + c: window (i, j) at tap (1 + r, 1 + c); window (i, j + 1)
    // at tap (1 + r, 0) for c = 1; window (i + 1, j) at tap (0, 1 + c) for r = 1; window (i + 1, j + 1)
    // at tap (0, 0) for r = c = 1. Windows in (oh, ow) order.
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int h = 2 * i + r, w = 2 * j + c;
        if (h >= H || w >= W) continue;
        float s[V];
#pragma unroll
        for (int k = 0; k < V; k++) s[k] = 0;
        gather_lanes<T, V>(aw[0][0], dv[0][0], (1 + r) * 3 + 1 + c, s);
        if (c) gather_lanes<T, V>(aw[0][1], dv[0][1], (1 + r) * 3, s);
        if (r) gather_lanes<T, V>(aw[1][0], dv[1][0], 1 + c, s);
        if (r && c) gather_lanes<T, V>(aw[1][1], dv[1][1], 0, s);
        vec<T, V> *dst = reinterpret_cast<vec<T, V> *>(dx + (((int64_t)n * H + h) * W + w) * C + cg * V), ov;
        if (beta != 0.0f) ov = *dst;
#pragma unroll
        for (int k = 0; k < V; k++) ov.v[k] = from_f<T>(beta != 0.0f ? beta * to_f(ov.v[k]) + s[k] : s[k]);
        *dst = ov;
      }
  }
}

// The row tiles' shared memory: the forward's kh rows of x, or the backward's rows of dy and of
// the indices; 0 when the call cannot take them (then the kernels above run).
template <typename T>
size_t pool_tile_bytes(const pool_desc &d, bool bwd) {
  constexpr int V = 16 / sizeof(T);
  if (d.C % V || (d.Wo * d.C) % 16 || d.C / V > kThreads) return 0;
  size_t b = bwd ? (size_t)((d.kh + d.sh - 1) / d.sh) * d.Wo * d.C * (sizeof(T) + 1)
                 : (size_t)d.kh * d.W * d.C * sizeof(T);
  return b <= (size_t)kPoolTileBytes ? b : 0;
}

// The vectorized kernels serve this call: every tensor NHWC and 16-byte
// aligned, C a multiple of V, indices in 32 bits.
template <typename T>
bool pool_vec_ok(const stoke_kernel_args_v1 *a, const pool_desc &d, bool bwd) {
  constexpr int V = 16 / sizeof(T);
  const stoke_tensor *t[4] = {&a->in[0], bwd ? &a->dout[0] : &a->out[0], bwd ? &a->din[0] : NULL, NULL};
  for (int i = 0; i < 3 && t[i]; i++)
    if (t[i]->layout != STOKE_NHWC || (t[i]->data && !aligned16(t[i]->data))) return false;
  return d.C % V == 0 && d.N * d.H * d.W * d.C < INT32_MAX && d.N * d.Ho * d.Wo * d.C < INT32_MAX &&
         d.kh * d.kw <= 127;
}

// dx[h, w] = sum over the windows holding (h, w) of dy / (kh kw).
template <typename T>
__global__ void avg_pool_bwd_k(const T *__restrict__ dy, T *dx, pool_desc d, int dx_nhwc,
                               float beta, int64_t total) {
  float inv = 1.0f / (float)(d.kh * d.kw);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n, c, h, w, oh0, oh1, ow0, ow1;
    decode(i, d.C, d.H, d.W, dx_nhwc, n, c, h, w);
    window_range(h, d.kh, d.sh, d.ph, d.Ho, oh0, oh1);
    window_range(w, d.kw, d.sw, d.pw, d.Wo, ow0, ow1);
    float s = 0;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++)
        s += to_f(dy[n * d.sy.n + c * d.sy.c + oh * d.sy.h + ow * d.sy.w]);
    acc(&dx[i], beta, s * inv);
  }
}

// The three pool ops the kernels below serve: KIND 0 avg_pool2d, 1 max_pool2d (backward reads x
// and finds each window's index again), 2 max_pool2d_idx (the forward writes the indices as its
// output 1, the backward reads them).
constexpr const char *pool_op(int kind) {
  return kind == 0 ? STOKE_OP_AVG_POOL2D : kind == 1 ? STOKE_OP_MAX_POOL2D : STOKE_OP_MAX_POOL2D_IDX;
}

template <int KIND, typename T>
stoke_err *pool_fwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  pool_desc d;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  return pool_check(a, pool_op(KIND), dtype_of<T>::value, false, false, KIND, &d);
}

template <int KIND, typename T>
stoke_err *pool_bwd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  pool_desc d;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(pool_check(a, pool_op(KIND), dtype_of<T>::value, true, false, KIND, &d));
  /* max_pool2d: one int8 window index per output, for the two-pass backward */
  if (KIND == 1 && ws && d.kh * d.kw <= 127) *ws = (size_t)stoke_numel(&a->dout[0].shape);
  return NULL;
}

// y and the window indices of every output (arg, y's layout) from x, each when given, by the
// fastest kernel the call allows: max_pool2d's forward (no arg), max_pool2d_idx's (both) and
// max_pool2d's backward without saved indices (no y).
template <typename T>
void max_pool_index(const stoke_kernel_args_v1 *a, const pool_desc &d, T *y, int8_t *arg, cudaStream_t st) {
  constexpr int V = 16 / sizeof(T);
  const T *x = (const T *)a->in[0].data;
  const int64_t n_out = d.N * d.C * d.Ho * d.Wo;
  const int y_nhwc = a->out[0].layout == STOKE_NHWC;
  const bool vec_ok = pool_vec_ok<T>(a, d, false) && aligned16(arg);
  const size_t tile = vec_ok ? pool_tile_bytes<T>(d, false) : 0;
  if (tile)
    max_pool_fwd_rows<T, V><<<grid_for(d.N * d.Ho, 1, kMaxGrid), pool_tile_threads(d.C / V), tile, st>>>(x, y, arg, d);
  else if (vec_ok)
    max_pool_fwd_v<T, V><<<grid_for(n_out / V, kThreads, kMaxGrid), kThreads, 0, st>>>(x, y, arg, d, (int)(n_out / V));
  else {
    if (y) max_pool_fwd_k<T><<<grid_for(n_out, kThreads, kMaxGrid), kThreads, 0, st>>>(x, y, d, y_nhwc, n_out);
    if (!arg) return;
    /* 32-bit indices only when x's offsets fit too (x is about 4x y for a stride-2 pool), with room for the
     * grid stride past the end */
    if (n_out < INT32_MAX / 2 && d.N * d.C * d.H * d.W < INT32_MAX / 2)
      max_pool_arg_k<T, int32_t>
          <<<grid_for(n_out, kThreads, kMaxGrid), kThreads, 0, st>>>(x, arg, d, y_nhwc, (int32_t)n_out);
    else
      max_pool_arg_k<T, int64_t><<<grid_for(n_out, kThreads, kMaxGrid), kThreads, 0, st>>>(x, arg, d, y_nhwc, n_out);
  }
}

// dx from dy and the window indices arg (dy's layout), by the fastest kernel the call allows.
template <typename T>
void max_pool_gather(const stoke_kernel_args_v1 *a, const pool_desc &d, const int8_t *arg, float beta,
                     cudaStream_t st) {
  constexpr int V = 16 / sizeof(T);
  const T *dy = (const T *)a->dout[0].data;
  T *dx = (T *)a->din[0].data;
  const int64_t total = d.N * d.C * d.H * d.W;
  const bool vec_ok = pool_vec_ok<T>(a, d, true) && aligned16(arg);
  const size_t tile = vec_ok ? pool_tile_bytes<T>(d, true) : 0;
  const int64_t tiles = d.N * ((d.H + 1) / 2) * ((d.W + 1) / 2) * (d.C / V);
  if (vec_ok && d.kh == 3 && d.kw == 3 && d.sh == 2 && d.sw == 2 && d.ph == 1 && d.pw == 1 && tiles < INT32_MAX)
    max_pool_bwd_k3s2<T, V><<<grid_for(tiles, kThreads, kMaxGrid), kThreads, 0, st>>>(arg, dy, dx, d, beta, (int)tiles);
  else if (tile)
    max_pool_bwd_rows<T, V><<<grid_for(d.N * d.H, 1, kMaxGrid), pool_tile_threads(d.C / V), tile, st>>>(arg, dy, dx, d,
                                                                                                    beta);
  else if (vec_ok)
    max_pool_bwd_v<T, V><<<grid_for(total / V, kThreads, kMaxGrid), kThreads, 0, st>>>(arg, dy, dx, d, beta,
                                                                                     (int)(total / V));
  else if (total < INT32_MAX && d.N * d.C * d.Ho * d.Wo < INT32_MAX)
    max_pool_bwd_arg_k<T, int32_t><<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, st>>>(
        arg, dy, dx, d, a->din[0].layout == STOKE_NHWC, beta, (int32_t)total);
  else
    max_pool_bwd_arg_k<T, int64_t><<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, st>>>(
        arg, dy, dx, d, a->din[0].layout == STOKE_NHWC, beta, total);
}

template <int KIND, typename T>
stoke_err *pool_fwd(const stoke_kernel_args_v1 *a, void *) {
  pool_desc d;
  CHECK(pool_check(a, pool_op(KIND), dtype_of<T>::value, false, true, KIND, &d));
  int64_t total = stoke_numel(&a->out[0].shape);
  if (total == 0) return NULL;
  cudaStream_t st = (cudaStream_t)a->stream;
  T *y = (T *)a->out[0].data;
  if (KIND == 0)
    avg_pool_fwd_k<T><<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, st>>>(
        (const T *)a->in[0].data, y, d, a->out[0].layout == STOKE_NHWC, total);
  else  // max_pool2d_idx writes the indices too
    max_pool_index<T>(a, d, y, KIND == 2 ? (int8_t *)a->out[1].data : (int8_t *)NULL, st);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

template <int KIND, typename T>
stoke_err *pool_bwd(const stoke_kernel_args_v1 *a, void *) {
  pool_desc d;
  CHECK(pool_check(a, pool_op(KIND), dtype_of<T>::value, true, true, KIND, &d));
  T *dx = (T *)a->din[0].data;
  int64_t total = stoke_numel(&a->din[0].shape);
  if (!dx || total == 0) return NULL;
  cudaStream_t st = (cudaStream_t)a->stream;
  const T *dy = (const T *)a->dout[0].data;
  int nhwc = a->din[0].layout == STOKE_NHWC;
  float beta = stoke_grad_beta(a, 0);
  int64_t n_out = stoke_numel(&a->dout[0].shape);
  if (KIND == 2)  // the forward's indices
    max_pool_gather<T>(a, d, (const int8_t *)a->out[1].data, beta, st);
  else if (KIND == 1 && d.kh * d.kw <= 127 && a->workspace && a->workspace_bytes >= (size_t)n_out) {
    int8_t *arg = (int8_t *)a->workspace;  // found again from x, then gathered
    max_pool_index<T>(a, d, (T *)NULL, arg, st);
    max_pool_gather<T>(a, d, arg, beta, st);
  } else if (KIND == 1)
    max_pool_bwd_k<T><<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, st>>>(
        (const T *)a->in[0].data, dy, dx, d, nhwc, beta, total);
  else
    avg_pool_bwd_k<T>
        <<<grid_for(total, kThreads, kMaxGrid), kThreads, 0, st>>>(dy, dx, d, nhwc, beta, total);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

// ============================================================= registration

#define NORM_KERNELS(T, DT)                                                                     \
  {"cuda", STOKE_OP_BATCH_NORM, STOKE_FWD, DT, STOKE_LAYOUT_ANY, bn_fwd_plan<T>, bn_fwd<T>,     \
   stoke_destroy_none},                                                                               \
  {"cuda", STOKE_OP_BATCH_NORM, STOKE_BWD, DT, STOKE_LAYOUT_ANY, bn_bwd_plan<T>, bn_bwd<T>,     \
   stoke_destroy_none},                                                                               \
  {"cuda", STOKE_OP_MAX_POOL2D, STOKE_FWD, DT, STOKE_LAYOUT_ANY, pool_fwd_plan<1, T>,           \
   pool_fwd<1, T>, stoke_destroy_none},                                                               \
  {"cuda", STOKE_OP_MAX_POOL2D, STOKE_BWD, DT, STOKE_LAYOUT_ANY, pool_bwd_plan<1, T>,           \
   pool_bwd<1, T>, stoke_destroy_none},                                                               \
  {"cuda", STOKE_OP_MAX_POOL2D_IDX, STOKE_FWD, DT, STOKE_LAYOUT_ANY, pool_fwd_plan<2, T>,       \
   pool_fwd<2, T>, stoke_destroy_none},                                                               \
  {"cuda", STOKE_OP_MAX_POOL2D_IDX, STOKE_BWD, DT, STOKE_LAYOUT_ANY, pool_bwd_plan<2, T>,       \
   pool_bwd<2, T>, stoke_destroy_none},                                                               \
  {"cuda", STOKE_OP_AVG_POOL2D, STOKE_FWD, DT, STOKE_LAYOUT_ANY, pool_fwd_plan<0, T>,           \
   pool_fwd<0, T>, stoke_destroy_none},                                                               \
  {"cuda", STOKE_OP_AVG_POOL2D, STOKE_BWD, DT, STOKE_LAYOUT_ANY, pool_bwd_plan<0, T>,           \
   pool_bwd<0, T>, stoke_destroy_none}

const stoke_kernel_v1 norm_kernels[] = {
    NORM_KERNELS(float, STOKE_F32),
    NORM_KERNELS(__nv_bfloat16, STOKE_BF16),
    NORM_KERNELS(__half, STOKE_F16),
};

}  // namespace

extern "C" stoke_err *stoke_cuda_register_norm(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, norm_kernels, sizeof norm_kernels / sizeof *norm_kernels);
}
