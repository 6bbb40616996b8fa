// backends/cuda/amp.cu: the dynamic loss scaler's two device-side steps
// (amp_check, amp_update; see stoke/ops.h): whether any gradient is inf or
// NaN, and the new scale and loss seed, decided without a host sync.
#include <cfloat>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/types.cuh"
#include "stoke/ops.h"

// found_inf is set (never cleared) by any block that sees a non-finite value:
// the result does not depend on the order, so it is deterministic.
template <typename T>
__global__ void check_kernel(const T *g, int64_t n, float *state) {
  int bad = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    bad |= !isfinite(to_f(g[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) state[2] = 1.0f;
}

__global__ void update_kernel(float *state, float *seed, int64_t growth, float growth_factor, float backoff) {
  float scale = state[0], good = state[1];
  if (state[2] != 0.0f) {
    scale = fmaxf(scale * backoff, FLT_MIN); /* never 0: a clean step would divide the gradients by it */
    good = 0;
    state[3] += 1.0f;
  } else {
    good += 1;
    if (growth > 0 && good >= (float)growth) {
      const float grown = scale * growth_factor;
      if (isfinite(grown)) scale = grown; /* as PyTorch: a growth past float's range keeps the scale (at inf every
                                           * later step overflowed and was skipped, the run stalled) */
      good = 0;
    }
  }
  state[0] = scale;
  state[1] = good;
  state[2] = 0.0f;
  *seed = scale;
}

template <typename T>
static stoke_err *check_run(const stoke_kernel_args_v1 *a, void *st) {
  int64_t n = stoke_numel(&a->in[0].shape);
  check_kernel<T><<<grid_for(n, kThreads, 4096), kThreads, 0, (cudaStream_t)a->stream>>>(
      (const T *)a->in[0].data, n, (float *)a->in[1].data);
  STOKE_CUDA_LAUNCH(a->node->name);
  return NULL;
}

static stoke_err *update_run(const stoke_kernel_args_v1 *a, void *st) {
  if (a->in[1].dtype != STOKE_F32 || stoke_numel(&a->in[0].shape) != 4)
    return STOKE_PERR(STOKE_E_INVALID, "amp_update: needs the f32[4] scaler state and an f32 loss seed");
  const stoke_opt_args_v1 *o = a->opt;
  float growth = o && o->growth_factor > 0 ? (float)o->growth_factor : 2.0f;
  float backoff = o && o->backoff_factor > 0 ? (float)o->backoff_factor : 0.5f;
  update_kernel<<<1, 1, 0, (cudaStream_t)a->stream>>>((float *)a->in[0].data, (float *)a->in[1].data,
                                                      o ? o->growth_interval : 2000, growth, backoff);
  STOKE_CUDA_LAUNCH(a->node->name);
  return NULL;
}

static const stoke_kernel_v1 kernels[] = {
    {"cuda", STOKE_OP_AMP_CHECK, STOKE_OPT, STOKE_F16, STOKE_LAYOUT_ANY, NULL, check_run<__half>, NULL},
    {"cuda", STOKE_OP_AMP_CHECK, STOKE_OPT, STOKE_BF16, STOKE_LAYOUT_ANY, NULL, check_run<__nv_bfloat16>, NULL},
    {"cuda", STOKE_OP_AMP_CHECK, STOKE_OPT, STOKE_F32, STOKE_LAYOUT_ANY, NULL, check_run<float>, NULL},
    {"cuda", STOKE_OP_AMP_UPDATE, STOKE_OPT, STOKE_F32, STOKE_LAYOUT_ANY, NULL, update_run, NULL},
};

extern "C" stoke_err *stoke_cuda_register_amp(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}
