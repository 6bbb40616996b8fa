// backends/fused/pool.cu: max_pool2d forward and backward (stoke/ops.h) for
// channels-last (NHWC) bf16, fp16 and f32, vectorized: a thread owns one
// pixel's V contiguous channels (16 bytes; V = 1 when C is not a multiple
// or the data is misaligned), so the window arithmetic is done once per V
// values instead of once per value, and every access is a coalesced vector.
// ResNet-50's stem max-pool (bf16, batch 256, H100): forward 1.59 -> 0.33
// ms, backward 4.34 -> 1.21 ms per step against the cuda engine's scalar
// kernels (run.profile_ops).
//
// Semantics as the CPU reference: each window's first maximum in row-major
// scan order (padding never wins; a NaN wins); dx[h, w] is the sum of dy
// over the windows whose first maximum is (h, w), gathered in window order
// (no atomics, deterministic). Backward: a first pass writes each window's
// int8 argmax into the workspace (kernels of at most 127 elements), a second
// gathers. Nothing allocated in run(), every launch on args->stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdio.h>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "backends/fused/stoke_fused.h"
#include "stoke/ops.h"

namespace {

struct pdesc {
  int64_t n, c, h, w, ho, wo;
  int kh, kw, sh, sw, ph, pw;
  int64_t cv;  // channel vectors per pixel
};

stoke_err *pair(const stoke_kernel_args_v1 *a, int idx, const char *what, int64_t out[2]) {
  const stoke_node_v1 *n = a->node;
  if (!n || n->n_attrs <= idx || (n->attrs[idx].n != 1 && n->attrs[idx].n != 2))
    return STOKE_PERR(STOKE_E_INVALID, "max_pool2d '%s': attribute %s missing or not 1 or 2 integers", nname(a),
                      what);
  out[0] = n->attrs[idx].ints[0];
  out[1] = n->attrs[idx].n == 2 ? n->attrs[idx].ints[1] : out[0];
  return NULL;
}

// x[N, C, H, W] -> y[N, C, Ho, Wo], NHWC, of dtype dt; *v: channels per thread.
stoke_err *check(const stoke_kernel_args_v1 *a, stoke_dtype dt, bool bwd, bool run, pdesc *d, int *v) {
  const char *op = STOKE_OP_MAX_POOL2D;
  if (a->n_in < 1 || a->n_out < 1 || !a->in || !a->out || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs 1 input and 1 output (and gradients in backward)", op,
                      nname(a));
  int64_t k[2], s[2], p[2];
  CHECK(pair(a, STOKE_POOL_KERNEL, "kernel", k));
  CHECK(pair(a, STOKE_POOL_STRIDE, "stride", s));
  CHECK(pair(a, STOKE_POOL_PADDING, "padding", p));
  for (int i = 0; i < 2; i++) {
    if (s[i] == 0) s[i] = k[i];
    if (k[i] < 1 || s[i] < 1 || p[i] < 0 || p[i] > k[i] / 2 || k[i] > 127 || s[i] > 127)
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': kernel %lld, stride %lld, padding %lld: need 1 <= kernel, stride <= 127, "
                        "0 <= padding <= kernel/2",
                        op, nname(a), (long long)k[i], (long long)s[i], (long long)p[i]);
  }
  if (k[0] * k[1] > 127)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': windows of more than 127 values are not served by fused", op,
                      nname(a));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (!is_nhwc(x) || !is_nhwc(y))
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': the fused kernels take NHWC x and y, got x %s, y %s", op,
                      nname(a), shp(&x->shape).s, shp(&y->shape).s);
  const int64_t *xd = x->shape.d, *yd = y->shape.d;
  int64_t ho = (xd[2] + 2 * p[0] - k[0]) / s[0] + 1, wo = (xd[3] + 2 * p[1] - k[1]) / s[1] + 1;
  if (xd[2] + 2 * p[0] < k[0] || xd[3] + 2 * p[1] < k[1] || yd[0] != xd[0] || yd[1] != xd[1] || yd[2] != ho ||
      yd[3] != wo)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': x %s and y %s do not fit the window", op, nname(a),
                      shp(&x->shape).s, shp(&y->shape).s);
  CHECK(check_dtype(a, op, "x", x, dt));
  CHECK(check_dtype(a, op, "y", y, dt));
  *d = pdesc{xd[0], xd[1], xd[2], xd[3], ho, wo, (int)k[0], (int)k[1], (int)s[0], (int)s[1], (int)p[0], (int)p[1], 0};
  int vv = (int)(16 / stoke_dtype_size(dt));
  if (d->c % vv) vv = 1;
  if (!bwd) {
    CHECK(check_data(a, op, "x", x, run));
    CHECK(check_data(a, op, "y", y, run));
    if ((x->data && !aligned16(x->data)) || (y->data && !aligned16(y->data))) vv = 1;
  } else {
    CHECK(check_grad(a, op, "x", &a->din[0], x));
    CHECK(check_grad(a, op, "y", &a->dout[0], y));
    if ((a->din[0].data && !is_nhwc(&a->din[0])) || !is_nhwc(&a->dout[0]))
      return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': dx and dy must be NHWC", op, nname(a));
    if (a->din[0].data) {
      CHECK(check_data(a, op, "dy", &a->dout[0], run));
      CHECK(check_data(a, op, "x (the forward input)", x, run));
    }
    const void *ps[] = {x->data, a->din[0].data, a->dout[0].data};
    for (const void *q : ps)
      if (q && !aligned16(q)) vv = 1;
    if (run && a->workspace_bytes < (size_t)stoke_numel(&y->shape))
      return STOKE_PERR(STOKE_E_INVALID, "%s '%s': workspace of %zu bytes, the kernel needs %lld", op, nname(a),
                        a->workspace_bytes, (long long)stoke_numel(&y->shape));
  }
  d->cv = d->c / vv;
  *v = vv;
  return NULL;
}

// Each output pixel's window, V channels at a time: first maximum (value
// and window index) per channel.
template <typename T, int V>
__device__ __forceinline__ void window_max(const T *__restrict__ x, const pdesc &d, int64_t n, int64_t oh, int64_t ow,
                                           int64_t vi, float (&best)[V], int (&arg)[V]) {
#pragma unroll
  for (int i = 0; i < V; i++) best[i] = -INFINITY, arg[i] = -1;
  int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
  for (int r = 0; r < d.kh; r++) {
    int64_t h = h0 + r;
    if (h < 0 || h >= d.h) continue;
    for (int q = 0; q < d.kw; q++) {
      int64_t w = w0 + q;
      if (w < 0 || w >= d.w) continue;
      vec<T, V> xv = *(const vec<T, V> *)(x + ((n * d.h + h) * d.w + w) * d.c + vi * V);
#pragma unroll
      for (int i = 0; i < V; i++) {
        float v = to_f(xv.v[i]);
        if (arg[i] < 0 || v > best[i] || (isnan(v) && !isnan(best[i]))) best[i] = v, arg[i] = r * d.kw + q;
      }
    }
  }
}

// One thread per (output pixel, channel vector): y, or (ARG) the argmax.
template <typename T, int V, bool ARG>
__global__ void k_pool(const T *__restrict__ x, T *__restrict__ y, int8_t *__restrict__ arg, pdesc d, int64_t total) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    int64_t vi = t % d.cv, pix = t / d.cv, ow = pix % d.wo, oh = (pix / d.wo) % d.ho, n = pix / (d.wo * d.ho);
    float best[V];
    int a[V];
    window_max<T, V>(x, d, n, oh, ow, vi, best, a);
    if (ARG) {
      vec<int8_t, V> av;
#pragma unroll
      for (int i = 0; i < V; i++) av.v[i] = (int8_t)a[i];
      *(vec<int8_t, V> *)(arg + pix * d.c + vi * V) = av;
    } else {
      vec<T, V> yv;
#pragma unroll
      for (int i = 0; i < V; i++) yv.v[i] = from_f<T>(best[i]);
      *(vec<T, V> *)(y + pix * d.c + vi * V) = yv;
    }
  }
}

// One thread per (input pixel, channel vector): dx = sum of dy over the
// windows (in window order) whose argmax is this pixel.
template <typename T, int V>
__global__ void k_gather(const int8_t *__restrict__ arg, const T *__restrict__ dy, T *dx, float beta, pdesc d,
                         int64_t total) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    int64_t vi = t % d.cv, pix = t / d.cv, w = pix % d.w, h = (pix / d.w) % d.h, n = pix / (d.w * d.h);
    int64_t hp = h + d.ph, wp = w + d.pw;
    int64_t oh1 = hp / d.sh, ow1 = wp / d.sw;
    int64_t oh0 = hp - d.kh + 1 > 0 ? (hp - d.kh + d.sh) / d.sh : 0;
    int64_t ow0 = wp - d.kw + 1 > 0 ? (wp - d.kw + d.sw) / d.sw : 0;
    if (oh1 >= d.ho) oh1 = d.ho - 1;
    if (ow1 >= d.wo) ow1 = d.wo - 1;
    float s[V];
#pragma unroll
    for (int i = 0; i < V; i++) s[i] = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        int me = (int)((h - (oh * d.sh - d.ph)) * d.kw + (w - (ow * d.sw - d.pw)));
        int64_t o = ((n * d.ho + oh) * d.wo + ow) * d.c + vi * V;
        vec<int8_t, V> av = *(const vec<int8_t, V> *)(arg + o);
        bool any = false;
#pragma unroll
        for (int i = 0; i < V; i++) any |= av.v[i] == me;
        if (!any) continue;
        vec<T, V> g = *(const vec<T, V> *)(dy + o);
#pragma unroll
        for (int i = 0; i < V; i++)
          if (av.v[i] == me) s[i] += to_f(g.v[i]);
      }
    T *p = dx + pix * d.c + vi * V;
    vec<T, V> out;
    if (beta != 0.0f) out = *(const vec<T, V> *)p;
#pragma unroll
    for (int i = 0; i < V; i++) out.v[i] = from_f<T>(beta != 0.0f ? beta * to_f(out.v[i]) + s[i] : s[i]);
    *(vec<T, V> *)p = out;
  }
}

unsigned grid(int64_t work, const stoke_kernel_args_v1 *a) {
  const stoke_fused_engine *e = (const stoke_fused_engine *)a->engine;
  int sms = e && e->dev && e->dev->sm_count > 0 ? e->dev->sm_count : 132;
  return grid_for(work, kThreads, (int64_t)sms * 16);
}

template <typename T, bool BWD>
stoke_err *plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  pdesc d;
  int v;
  if (state) *state = NULL;
  if (ws) *ws = 0;
  CHECK(check(a, dtype_of<T>::value, BWD, false, &d, &v));
  if (BWD && ws) *ws = (size_t)stoke_numel(&a->out[0].shape); /* one int8 argmax per output */
  return NULL;
}

template <typename T, int V>
stoke_err *fwd_v(const stoke_kernel_args_v1 *a, const pdesc &d) {
  int64_t total = d.n * d.ho * d.wo * d.cv;
  if (total == 0) return NULL;
  k_pool<T, V, false><<<grid(total, a), kThreads, 0, (cudaStream_t)a->stream>>>(
      (const T *)a->in[0].data, (T *)a->out[0].data, nullptr, d, total);
  STOKE_CUDA_LAUNCH(nname(a));
  return NULL;
}

template <typename T, int V>
stoke_err *bwd_v(const stoke_kernel_args_v1 *a, const pdesc &d) {
  T *dx = (T *)a->din[0].data;
  int64_t outs = d.n * d.ho * d.wo * d.cv, ins = d.n * d.h * d.w * d.cv;
  if (!dx || ins == 0) return NULL;
  cudaStream_t st = (cudaStream_t)a->stream;
  int8_t *arg = (int8_t *)a->workspace;
  if (outs > 0) {
    k_pool<T, V, true><<<grid(outs, a), kThreads, 0, st>>>((const T *)a->in[0].data, nullptr, arg, d, outs);
    STOKE_CUDA_LAUNCH(nname(a));
  }
  k_gather<T, V><<<grid(ins, a), kThreads, 0, st>>>(arg, (const T *)a->dout[0].data, dx, grad_beta(a, 0), d, ins);
  STOKE_CUDA_LAUNCH(nname(a));
  return NULL;
}

template <typename T>
stoke_err *run_fwd(const stoke_kernel_args_v1 *a, void *) {
  pdesc d;
  int v;
  CHECK(check(a, dtype_of<T>::value, false, true, &d, &v));
  constexpr int VV = 16 / sizeof(T);
  return v == VV ? fwd_v<T, VV>(a, d) : fwd_v<T, 1>(a, d);
}

template <typename T>
stoke_err *run_bwd(const stoke_kernel_args_v1 *a, void *) {
  pdesc d;
  int v;
  CHECK(check(a, dtype_of<T>::value, true, true, &d, &v));
  constexpr int VV = 16 / sizeof(T);
  return v == VV ? bwd_v<T, VV>(a, d) : bwd_v<T, 1>(a, d);
}

#define POOL_KERNELS(T, DT)                                                                                      \
  {"fused", STOKE_OP_MAX_POOL2D, STOKE_FWD, DT, STOKE_NHWC, plan<T, false>, run_fwd<T>, destroy_none},          \
  {"fused", STOKE_OP_MAX_POOL2D, STOKE_BWD, DT, STOKE_NHWC, plan<T, true>, run_bwd<T>, destroy_none}

const stoke_kernel_v1 kernels[] = {
    POOL_KERNELS(__nv_bfloat16, STOKE_BF16),
    POOL_KERNELS(__half, STOKE_F16),
    POOL_KERNELS(float, STOKE_F32),
};

}  // namespace

extern "C" stoke_err *stoke_fused_register_pool(const stoke_registry_v1 *r) {
  return add_kernels(r, kernels, sizeof kernels / sizeof *kernels);
}
