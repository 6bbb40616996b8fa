// backends/cuda/optim.cu: CUDA update kernels of the cuda backend over the flat
// parameter buffer: the optimizers sgd and adamw (torch.optim semantics) and
// grad_norm, the global gradient norm for clipping; see stoke/ops.h.
//
// One launch per update: a grid-stride loop over 4-element vectors when
// every buffer is 16-byte aligned (and the state's parts too), scalars
// otherwise. The arithmetic is the CPU reference's (backends/cpu/optim.c),
// with the same roundings to the stored type: sgd in double, adamw in
// float (its sqrt and division in double were not free: adamw_chunk). The hooks every
// update honours are read on the device: the loss scaler (skip, unscale,
// and the bias corrections counting applied steps only), the learning rate
// and step under CUDA graphs, the clipping factor, and weight decay by
// parameter group (a cursor over the sorted ranges, per thread).
// Parameters f32: state f32 = the optimizer's state. Parameters bf16/fp16:
// state f32 = the f32 master copy, then the optimizer's state; the master
// is updated and its rounding written to the working copy in the same pass.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "stoke/ops.h"

namespace {

constexpr int kVec = 4;                  // elements per vector access
constexpr int64_t kMaxGrid = 65535 * 8;  // the most blocks of a grid-stride loop here

// ------------------------------------------------------------ arguments

// The hyper-parameters with the per-step constants computed once (double).
struct hyper {
  double lr, momentum, weight_decay, beta1, beta2, eps, grad_scale;
  double step_size, bc2_sqrt, decay; // adamw: lr / (1 - b1^t), sqrt(1 - b2^t), 1 - lr wd
  double t;                          // the step as the host gave it
  int nesterov;
};

// What an update reads on the device besides the buffers.
struct hooks {
  const float *amp;       // loss scaler state, or NULL
  const double *live;     // [lr, step] under CUDA graphs, or NULL
  const float *clip;      // [norm, factor] from grad_norm, or NULL
  const int64_t *ranges;  // weight-decay ranges, or NULL: every element
  int n_ranges;
};

hooks hooks_of(const stoke_opt_args_v1 *o) {
  return hooks{o->amp, o->live, o->clip, o->decay_ranges, o->n_decay_ranges};
}

stoke_err *check_tensor(const stoke_kernel_args_v1 *a, const char *op, const char *what,
                        const stoke_tensor *t, stoke_dtype want, bool run) {
  CHECK(stoke_check_dtype(a, op, what, t, want));
  return stoke_check_data(a, op, what, t, run);
}

// in[0] params (dtype dt), in[1] grads (dt), in[2] state: f32 holding the
// master (low-precision dt) then `per_param` x the params of optimizer
// state, exactly; with neither (sgd without momentum, f32) the state is not
// read. As the CPU: opt present with grad_scale finite and > 0 to run.
stoke_err *opt_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, const char *op,
                     int64_t per_param, bool run) {
  bool master = dt != STOKE_F32;
  bool need_state = per_param > 0 || master;
  int n_in = need_state ? 3 : 2;
  if (a->n_in < n_in || !a->in)
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': needs params, grads and state buffers, got %d inputs", op,
                      stoke_node_name(a), a->n_in);
  const stoke_tensor *p = &a->in[0], *g = &a->in[1];
  int64_t np = stoke_numel(&p->shape);
  if (stoke_numel(&g->shape) != np)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': params %s and grads %s differ in size", op,
                      stoke_node_name(a), stoke_shape_str(&p->shape).s, stoke_shape_str(&g->shape).s);
  CHECK(check_tensor(a, op, "params", p, dt, run));
  CHECK(check_tensor(a, op, "grads", g, dt, run));
  if (need_state) {
    const stoke_tensor *s = &a->in[2];
    int64_t want = (per_param + (master ? 1 : 0)) * np, have = stoke_numel(&s->shape);
    // sgd without momentum on low-precision params reads only the master;
    // the planner sizes the state for momentum anyway
    bool ok = per_param > 0 ? have == want : have >= want;
    if (!ok)
      return STOKE_PERR(STOKE_E_INVALID,
                        "%s '%s': state %s should hold %s%lld x the %lld params", op, stoke_node_name(a),
                        stoke_shape_str(&s->shape).s, per_param > 0 ? "" : "at least ",
                        (long long)(per_param + (master ? 1 : 0)), (long long)np);
    CHECK(check_tensor(a, op, master ? "state (f32 master, then optimizer state)" : "state", s,
                        STOKE_F32, run));
  }
  if (run && !a->opt)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': no hyper-parameters (opt) given", op, stoke_node_name(a));
  if (run && !(a->opt->grad_scale > 0 && isfinite(a->opt->grad_scale)))
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s '%s': grad_scale %g must be finite and > 0 (1 = no scaling)", op,
                      stoke_node_name(a), a->opt->grad_scale);
  return NULL;
}

stoke_err *sgd_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, bool run) {
  // The state is the momentum buffer, needed only with momentum. In plan
  // the hyper-parameters may be absent: require the buffer only if there.
  bool mom = a->opt && a->opt->momentum != 0;
  CHECK(opt_check(a, dt, STOKE_OP_SGD, mom ? 1 : 0, run));
  if (run && a->opt->nesterov && !(a->opt->momentum > 0))
    return STOKE_PERR(STOKE_E_INVALID, "sgd '%s': nesterov needs momentum > 0 (got %g)",
                      stoke_node_name(a), a->opt->momentum);
  return NULL;
}

stoke_err *adamw_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, bool run) {
  CHECK(opt_check(a, dt, STOKE_OP_ADAMW, 2, run));
  if (!run) return NULL;
  const stoke_opt_args_v1 *o = a->opt;
  if (o->step < 1)
    return STOKE_PERR(STOKE_E_INVALID, "adamw '%s': step %lld, the first update is step 1",
                      stoke_node_name(a), (long long)o->step);
  if (!(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1))
    return STOKE_PERR(STOKE_E_INVALID, "adamw '%s': betas (%g, %g) not in [0, 1)", stoke_node_name(a),
                      o->beta1, o->beta2);
  return NULL;
}

// The learning rate and step t, and what follows from them (on the host
// from opt, on the device from opt->live).
__host__ __device__ __forceinline__ void set_step(hyper &h, double lr, double t) {
  h.lr = lr;
  h.step_size = lr / (1 - pow(h.beta1, t));
  h.bc2_sqrt = sqrt(1 - pow(h.beta2, t));
  h.decay = 1 - lr * h.weight_decay;
}

hyper hyper_of(const stoke_opt_args_v1 *o) {
  hyper h;
  h.momentum = o->momentum;
  h.weight_decay = o->weight_decay;
  h.beta1 = o->beta1;
  h.beta2 = o->beta2;
  h.eps = o->eps;
  h.grad_scale = o->grad_scale;
  h.nesterov = o->nesterov;
  h.t = (double)o->step;
  set_step(h, o->lr, h.t);
  return h;
}

// What both optimizers do first. Under a replayed CUDA graph the launch's
// `h` is the captured step's: the learning rate and step come from device
// memory instead (live). Then the loss scaler: false when the step is
// skipped (inf/NaN gradients), else the gradients are unscaled and the
// skipped steps so far do not count for the bias corrections (ADAM: only
// adamw computes them). Then the clipping factor.
template <bool ADAM>
__device__ __forceinline__ bool step_begins(hyper &h, const hooks &k) {
  double lr = k.live ? k.live[0] : h.lr, t = k.live ? k.live[1] : h.t;
  bool moved = k.live != nullptr;
  if (k.amp) {
    if (k.amp[2] != 0.0f) return false;
    h.grad_scale /= (double)k.amp[0];
    if (k.amp[3] != 0.0f) t -= (double)k.amp[3], moved = true;
  }
  if (k.clip) h.grad_scale *= (double)k.clip[1];
  if (moved) {
    if (ADAM) set_step(h, lr, t);
    else h.lr = lr;
  }
  return true;
}

// Whether element i gets weight decay: c, the thread's cursor into the
// sorted ranges (its i only grow), moves to the first range ending past i
// by a binary search over the ranges from c on. A grid-stride loop gives a
// thread one or two vectors of a large model, so a linear walk from the
// first range cost every thread about half of them: GPT-2 large's 145
// ranges, 72 dependent loads before a thread's first update (its AdamW
// moved 2.2 TB/s against GPT-2 small's 3.3 with 49; BENCHMARKS.md run 36).
// Ranges start and end at multiples of 4 elements, so a vector is wholly
// in or out.
__device__ __forceinline__ bool decays(const hooks &k, int &c, int64_t i) {
  int hi = k.n_ranges;
  while (c < hi) {
    const int mid = c + (hi - c) / 2;
    if (k.ranges[2 * mid + 1] <= i) c = mid + 1;
    else hi = mid;
  }
  return c < k.n_ranges && k.ranges[2 * c] <= i;
}

// -------------------------------------------------------------------- sgd

// torch.optim.SGD with dampening 0 on V elements at vector index j (element
// j V), exactly the CPU's per-element arithmetic:
//   g = grad grad_scale + wd p;  buf = momentum buf + g (stored, then read
//   back rounded);  g = nesterov ? g + momentum buf : buf;  p -= lr g.
// MASTER: p is master[] (f32) and its rounding goes to w[] (T); else p is
// w[] itself (T = float). buf is NULL without momentum.
template <typename T, bool MASTER, int V>
__device__ __forceinline__ void sgd_chunk(T *__restrict__ w, const T *__restrict__ grad,
                                          float *__restrict__ master, float *__restrict__ buf,
                                          int64_t j, const hyper &h, bool dec) {
  vec<T, V> gv = reinterpret_cast<const vec<T, V> *>(grad)[j];
  vec<float, V> pv, bv;
  if (MASTER) {
    pv = reinterpret_cast<const vec<float, V> *>(master)[j];
  } else {
    vec<T, V> wv = reinterpret_cast<const vec<T, V> *>(w)[j];
#pragma unroll
    for (int k = 0; k < V; k++) pv.v[k] = to_f(wv.v[k]);
  }
  if (buf) bv = reinterpret_cast<const vec<float, V> *>(buf)[j];
#pragma unroll
  for (int k = 0; k < V; k++) {
    double g = (double)to_f(gv.v[k]) * h.grad_scale;
    if (h.weight_decay != 0 && dec) g += h.weight_decay * (double)pv.v[k];
    if (buf) {
      bv.v[k] = (float)(h.momentum * (double)bv.v[k] + g);
      g = h.nesterov ? g + h.momentum * (double)bv.v[k] : (double)bv.v[k];
    }
    pv.v[k] = (float)((double)pv.v[k] - h.lr * g);
  }
  if (buf) reinterpret_cast<vec<float, V> *>(buf)[j] = bv;
  if (MASTER) reinterpret_cast<vec<float, V> *>(master)[j] = pv;
  vec<T, V> out;
#pragma unroll
  for (int k = 0; k < V; k++) out.v[k] = from_f<T>(pv.v[k]);
  reinterpret_cast<vec<T, V> *>(w)[j] = out;
}

// Vectors [0, n / V) then the scalar tail, one grid-stride loop each;
// GROUPS: weight decay by range (else on every element).
template <typename T, bool MASTER, int V, bool GROUPS>
__global__ void sgd_kernel(T *__restrict__ w, const T *__restrict__ grad,
                           float *__restrict__ master, float *__restrict__ buf, int64_t n,
                           hyper h, hooks k) {
  if (!step_begins<false>(h, k)) return;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x, nv = n / V;
  int c = 0;
  for (int64_t j = tid; j < nv; j += stride)
    sgd_chunk<T, MASTER, V>(w, grad, master, buf, j, h, !GROUPS || decays(k, c, j * V));
  c = 0;
  for (int64_t i = nv * V + tid; i < n; i += stride)
    sgd_chunk<T, MASTER, 1>(w, grad, master, buf, i, h, !GROUPS || decays(k, c, i));
}

// ------------------------------------------------------------------ adamw

// torch.optim.AdamW on V elements, the CPU's arithmetic:
//   g = grad grad_scale;  p *= 1 - lr wd;
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2  (stored rounded; the
//   update uses the unrounded values, as the CPU)
//   p -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <typename T, bool MASTER, int V>
__device__ __forceinline__ void adamw_chunk(T *__restrict__ w, const T *__restrict__ grad,
                                            float *__restrict__ master, float *__restrict__ m,
                                            float *__restrict__ v, int64_t j, const hyper &h,
                                            bool dec) {
  vec<T, V> gv = reinterpret_cast<const vec<T, V> *>(grad)[j];
  vec<float, V> pv, mv = reinterpret_cast<const vec<float, V> *>(m)[j],
                    vv = reinterpret_cast<const vec<float, V> *>(v)[j];
  if (MASTER) {
    pv = reinterpret_cast<const vec<float, V> *>(master)[j];
  } else {
    vec<T, V> wv = reinterpret_cast<const vec<T, V> *>(w)[j];
#pragma unroll
    for (int k = 0; k < V; k++) pv.v[k] = to_f(wv.v[k]);
  }
  // float arithmetic (the per-step constants rounded once from double):
  // AdamW's per-element sqrt and division in double made the update 1.28x
  // its bytes floor on the H100 (GPT-2 124M: 1.49 ms against 1.16); in
  // float the results stay within a few float roundings of the CPU's
  // double (tests/gpu/cuda_optim_test's 1e-6)
  const float gs = (float)h.grad_scale, b1 = (float)h.beta1, b2 = (float)h.beta2, ob1 = (float)(1 - h.beta1),
              ob2 = (float)(1 - h.beta2), decay = (float)h.decay, step = (float)h.step_size,
              ibc2 = (float)(1 / h.bc2_sqrt), eps = (float)h.eps;
#pragma unroll
  for (int k = 0; k < V; k++) {
    float g = to_f(gv.v[k]) * gs;
    float pi = dec ? pv.v[k] * decay : pv.v[k];
    float mi = fmaf(b1, mv.v[k], ob1 * g);
    float vi = fmaf(b2, vv.v[k], ob2 * g * g);
    mv.v[k] = mi;
    vv.v[k] = vi;
    pv.v[k] = pi - step * mi / fmaf(sqrtf(vi), ibc2, eps);
  }
  reinterpret_cast<vec<float, V> *>(m)[j] = mv;
  reinterpret_cast<vec<float, V> *>(v)[j] = vv;
  if (MASTER) reinterpret_cast<vec<float, V> *>(master)[j] = pv;
  vec<T, V> out;
#pragma unroll
  for (int k = 0; k < V; k++) out.v[k] = from_f<T>(pv.v[k]);
  reinterpret_cast<vec<T, V> *>(w)[j] = out;
}

template <typename T, bool MASTER, int V, bool GROUPS>
__global__ void adamw_kernel(T *__restrict__ w, const T *__restrict__ grad,
                             float *__restrict__ master, float *__restrict__ m,
                             float *__restrict__ v, int64_t n, hyper h, hooks k) {
  if (!step_begins<true>(h, k)) return;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x, nv = n / V;
  int c = 0;
  for (int64_t j = tid; j < nv; j += stride)
    adamw_chunk<T, MASTER, V>(w, grad, master, m, v, j, h, !GROUPS || decays(k, c, j * V));
  c = 0;
  for (int64_t i = nv * V + tid; i < n; i += stride)
    adamw_chunk<T, MASTER, 1>(w, grad, master, m, v, i, h, !GROUPS || decays(k, c, i));
}

// ------------------------------------------------------------- grad_norm

constexpr int kNormBlocks = 1024;  // partial sums: a fixed count, so a fixed summation order

// Block b's sum of squares of g x scale over its grid-stride share, in
// double, reduced in a fixed tree order: part[b].
template <typename T, int V>
__global__ void norm_partial(const T *__restrict__ g, int64_t n, double *__restrict__ part) {
  __shared__ double sh[kThreads];
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x, nv = n / V;
  double s = 0;
  for (int64_t j = tid; j < nv; j += stride) {
    vec<T, V> gv = reinterpret_cast<const vec<T, V> *>(g)[j];
#pragma unroll
    for (int k = 0; k < V; k++) s += (double)to_f(gv.v[k]) * (double)to_f(gv.v[k]);
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) s += (double)to_f(g[i]) * (double)to_f(g[i]);
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

// One block of kNormBlocks threads: the partials summed in a fixed tree
// order, the norm scaled to the unscaled gradients, and the factor as
// torch's clip_grad_norm_ (NaN stays NaN); [inf, 1] on a skipped step.
__global__ void norm_finish(const double *__restrict__ part, int nb, float *__restrict__ out,
                            double grad_scale, const float *__restrict__ amp, double max_norm) {
  __shared__ double sh[kNormBlocks];
  sh[threadIdx.x] = (int)threadIdx.x < nb ? part[threadIdx.x] : 0.0;
  __syncthreads();
  for (int w = kNormBlocks / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  if (amp && amp[2] != 0.0f) {
    out[0] = INFINITY;
    out[1] = 1.0f;
    return;
  }
  double norm = sqrt(sh[0]) * grad_scale / (amp ? (double)amp[0] : 1.0);
  double coef = max_norm / (norm + 1e-6);
  out[0] = (float)norm;
  out[1] = (float)(isnan(coef) || coef < 1 ? coef : 1.0);
}

// ------------------------------------------------------------ entry points

template <typename T>
stoke_err *sgd_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  if (state) *state = NULL;
  if (ws) *ws = 0;
  return sgd_check(a, dtype_of<T>::value, false);
}

template <typename T>
stoke_err *adamw_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  if (state) *state = NULL;
  if (ws) *ws = 0;
  return adamw_check(a, dtype_of<T>::value, false);
}

// Calls launch(vtag<V>, gtag<GROUPS>, grid): 4-element vectors when the
// buffers allow, weight decay by range when there are ranges.
template <int V> using vtag = std::integral_constant<int, V>;
template <bool G> using gtag = std::integral_constant<bool, G>;

template <typename F>
void by_shape(int64_t n, bool vec_ok, bool groups, F launch) {
  unsigned gv = grid_for((n + kVec - 1) / kVec, kThreads, kMaxGrid), g1 = grid_for(n, kThreads, kMaxGrid);
  if (vec_ok && groups) launch(vtag<kVec>(), gtag<true>(), gv);
  else if (vec_ok) launch(vtag<kVec>(), gtag<false>(), gv);
  else if (groups) launch(vtag<1>(), gtag<true>(), g1);
  else launch(vtag<1>(), gtag<false>(), g1);
}

template <typename T>
stoke_err *sgd_run(const stoke_kernel_args_v1 *a, void *) {
  constexpr bool kMaster = dtype_of<T>::value != STOKE_F32;
  CHECK(sgd_check(a, dtype_of<T>::value, true));
  int64_t n = stoke_numel(&a->in[0].shape);
  if (n == 0) return NULL;
  hyper h = hyper_of(a->opt);
  hooks k = hooks_of(a->opt);
  T *w = (T *)a->in[0].data;
  const T *grad = (const T *)a->in[1].data;
  float *state = kMaster || h.momentum != 0 ? (float *)a->in[2].data : NULL;
  float *master = kMaster ? state : NULL;
  float *buf = h.momentum != 0 ? state + (kMaster ? n : 0) : NULL;
  bool vec_ok = aligned16(w) && aligned16(grad) && (!master || aligned16(master)) &&
                (!buf || aligned16(buf));
  cudaStream_t st = (cudaStream_t)a->stream;
  by_shape(n, vec_ok, k.ranges != nullptr, [&](auto v, auto g, unsigned grid) {
    sgd_kernel<T, kMaster, decltype(v)::value, decltype(g)::value>
        <<<grid, kThreads, 0, st>>>(w, grad, master, buf, n, h, k);
  });
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

template <typename T>
stoke_err *adamw_run(const stoke_kernel_args_v1 *a, void *) {
  constexpr bool kMaster = dtype_of<T>::value != STOKE_F32;
  CHECK(adamw_check(a, dtype_of<T>::value, true));
  int64_t n = stoke_numel(&a->in[0].shape);
  if (n == 0) return NULL;
  hyper h = hyper_of(a->opt);
  hooks k = hooks_of(a->opt);
  T *w = (T *)a->in[0].data;
  const T *grad = (const T *)a->in[1].data;
  float *state = (float *)a->in[2].data;
  float *master = kMaster ? state : NULL;
  float *m = state + (kMaster ? n : 0), *v = m + n;
  bool vec_ok = aligned16(w) && aligned16(grad) && (!master || aligned16(master)) &&
                aligned16(m) && aligned16(v);
  cudaStream_t st = (cudaStream_t)a->stream;
  by_shape(n, vec_ok, k.ranges != nullptr, [&](auto vt, auto g, unsigned grid) {
    adamw_kernel<T, kMaster, decltype(vt)::value, decltype(g)::value>
        <<<grid, kThreads, 0, st>>>(w, grad, master, m, v, n, h, k);
  });
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

// grad_norm: in[0] the flat gradients (T), in[1] f32[2]; the partial sums
// in the workspace.
stoke_err *norm_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, bool run) {
  const char *op = STOKE_OP_GRAD_NORM;
  if (a->n_in < 2 || !a->in)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs the gradients and f32[2], got %d inputs", op, stoke_node_name(a),
                      a->n_in);
  CHECK(check_tensor(a, op, "gradients", &a->in[0], dt, run));
  CHECK(check_tensor(a, op, "[norm, factor]", &a->in[1], STOKE_F32, run));
  if (stoke_numel(&a->in[1].shape) != 2)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': the output %s should be f32[2]", op, stoke_node_name(a),
                      stoke_shape_str(&a->in[1].shape).s);
  if (run && !a->opt) return STOKE_PERR(STOKE_E_INVALID, "%s '%s': no opt arguments given", op, stoke_node_name(a));
  if (run && a->workspace_bytes < kNormBlocks * sizeof(double))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': workspace of %zu bytes, plan() asked for %zu", op, stoke_node_name(a),
                      a->workspace_bytes, kNormBlocks * sizeof(double));
  return NULL;
}

template <typename T>
stoke_err *grad_norm_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  if (state) *state = NULL;
  if (ws) *ws = kNormBlocks * sizeof(double);
  return norm_check(a, dtype_of<T>::value, false);
}

template <typename T>
stoke_err *grad_norm_run(const stoke_kernel_args_v1 *a, void *) {
  CHECK(norm_check(a, dtype_of<T>::value, true));
  int64_t n = stoke_numel(&a->in[0].shape);
  const T *g = (const T *)a->in[0].data;
  double *part = (double *)a->workspace;
  cudaStream_t st = (cudaStream_t)a->stream;
  unsigned nb;
  if (aligned16(g)) {
    nb = grid_for((n + kVec - 1) / kVec, kThreads, kNormBlocks);
    norm_partial<T, kVec><<<nb, kThreads, 0, st>>>(g, n, part);
  } else {
    nb = grid_for(n, kThreads, kNormBlocks);
    norm_partial<T, 1><<<nb, kThreads, 0, st>>>(g, n, part);
  }
  norm_finish<<<1, kNormBlocks, 0, st>>>(part, (int)nb, (float *)a->in[1].data, a->opt->grad_scale, a->opt->amp,
                                         a->opt->max_norm);
  STOKE_CUDA_LAUNCH(stoke_node_name(a));
  return NULL;
}

#define OPT_KERNELS(T, DT)                                                                   \
  {"cuda", STOKE_OP_SGD, STOKE_OPT, DT, STOKE_LAYOUT_ANY, sgd_plan<T>, sgd_run<T>,           \
   stoke_destroy_none},                                                                            \
  {"cuda", STOKE_OP_ADAMW, STOKE_OPT, DT, STOKE_LAYOUT_ANY, adamw_plan<T>, adamw_run<T>,     \
   stoke_destroy_none},                                                                            \
  {"cuda", STOKE_OP_GRAD_NORM, STOKE_OPT, DT, STOKE_LAYOUT_ANY, grad_norm_plan<T>,           \
   grad_norm_run<T>, stoke_destroy_none}

const stoke_kernel_v1 optim_kernels[] = {
    OPT_KERNELS(float, STOKE_F32),
    OPT_KERNELS(__nv_bfloat16, STOKE_BF16),
    OPT_KERNELS(__half, STOKE_F16),
};

}  // namespace

extern "C" stoke_err *stoke_cuda_register_optim(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, optim_kernels, sizeof optim_kernels / sizeof *optim_kernels);
}
