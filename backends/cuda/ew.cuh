// backends/cuda/ew.cuh: the cuda backend's elementwise launch, shared by its kernel files
// (elementwise.cu's ops, seq.cu's copies): out[i] = op(x[i], z[i], i) (+ beta out[i]) in one
// grid-stride pass, and the copy functor. Functors are device code and plain values, passed to the
// kernel by value.
#pragma once

#include <stdint.h>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"

inline cudaStream_t stream_of(const stoke_kernel_args_v1 *a) { return (cudaStream_t)a->stream; }

// out[i] = op(x[i], z[i], i) (+ beta * out[i]); x or z may be NULL (then 0 is passed and the
// functor reads what it needs itself, e.g. a gather). V elements per thread and step: 16-byte
// loads and stores when every pointer is 16-byte aligned (V = 16 / sizeof(T)), else V = 1.
template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kThreads)
    ew_kernel(T *__restrict__ out, const T *__restrict__ x, const T *__restrict__ z, int64_t n, float beta,
              Op op) {
  const int64_t nv = n / V;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t v = tid; v < nv; v += stride) {
    vec<T, V> px, pz, po;
    if (x) px = reinterpret_cast<const vec<T, V> *>(x)[v];
    if (z) pz = reinterpret_cast<const vec<T, V> *>(z)[v];
    if (beta != 0.f) po = reinterpret_cast<const vec<T, V> *>(out)[v];
#pragma unroll
    for (int k = 0; k < V; k++) {
      float r = op(x ? to_f(px.v[k]) : 0.f, z ? to_f(pz.v[k]) : 0.f, v * V + k);
      if (beta != 0.f) r += beta * to_f(po.v[k]);
      po.v[k] = from_f<T>(r);
    }
    reinterpret_cast<vec<T, V> *>(out)[v] = po;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride)
    acc(out + i, beta, op(x ? to_f(x[i]) : 0.f, z ? to_f(z[i]) : 0.f, i));
}

template <typename T, typename Op>
inline stoke_err *launch_ew(const stoke_kernel_args_v1 *a, T *out, const T *x, const T *z, int64_t n,
                            float beta, Op op) {
  if (n <= 0) return NULL;
  constexpr int V = 16 / sizeof(T);
  if (aligned16(out) && aligned16(x) && aligned16(z) && n >= V)
    ew_kernel<T, V, Op><<<grid_for(n / V, kThreads, 65535), kThreads, 0, stream_of(a)>>>(out, x, z, n, beta, op);
  else
    ew_kernel<T, 1, Op><<<grid_for(n, kThreads, 65535), kThreads, 0, stream_of(a)>>>(out, x, z, n, beta, op);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

struct op_copy {
  __device__ float operator()(float x, float, int64_t) const { return x; }
};
