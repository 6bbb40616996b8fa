/* backends/cudnn/stoke_cudnn.h: what the files of the cudnn plugin share:
 * the engine state (one cuDNN handle per opened device, the table of tuned
 * algorithms) and the check that turns a cudnnStatus_t into a stoke error. */
#ifndef STOKE_CUDNN_H
#define STOKE_CUDNN_H

/* cuDNN 9 marks the classic convolution API (tensor/filter/convolution
 * descriptors, cudnnFind*AlgorithmEx, cudnnGet*Algorithm_v7,
 * cudnnConvolutionForward/Backward*) deprecated in favour of its graph API,
 * but it is present and supported throughout 9.x and is what this plugin
 * uses. The attributes only bite when CUDNN_WARN_DEPRECATED is defined (and
 * then fire inside cudnn.h itself); silence them for this plugin's files so
 * such a build stays warning-free. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cudnn.h>

#include "backends/cuda/stoke_cuda.h"
#include "stoke/check.h"

/* The largest workspace an algorithm or engine may ask for (autotune and
 * heuristics): 256 MiB, or as many bytes as the tensors the call reads and
 * writes where that is more. Engines' scratch grows with the batch: the
 * fastest fprop of ResNet-50's stem (3 input channels) takes 196 MiB at
 * batch 256 and 4x that at 1024, and a fixed 256 MiB cap sent the stem to
 * engines 6x (fprop) and 56x (backward) slower there (BENCHMARKS.md, issue
 * 14). One workspace region serves every node (core/exec.c: the largest
 * any kernel asked for), and the plan counts it. */
#define CUDNN_WS_CAP ((size_t)256 << 20)
static inline size_t cudnn_ws_cap(size_t tensor_bytes) {
  return tensor_bytes > CUDNN_WS_CAP ? tensor_bytes : CUDNN_WS_CAP;
}
/* Autotune's timing could not allocate its temporaries (*e, out of device
 * memory: the run's arena left no room): says so once per problem, that
 * the heuristic's choice is taken untimed, as cudnn.benchmark falls back,
 * frees *e and returns 1. Any other error: 0, *e left to the caller. */
static inline int cudnn_tune_fallback(stoke_err **e, const char *ctx) {
  if (!*e || (*e)->code != STOKE_E_OOM) return 0;
  stoke_host->log(STOKE_LOG_WARN, "cudnn", "%s%s%s; took cuDNN's heuristic choice untimed", ctx ? ctx : "",
                  ctx ? ": " : "", (*e)->msg);
  stoke_host->err_free(*e);
  *e = NULL;
  return 1;
}
#define CUDNN_CACHE_MAX 256
#define CUDNN_SDPA_CACHE 32 /* attention problems whose timed choice the engine keeps */
#define CUDNN_SDPA_KEY 8

/* Which cuDNN convolution call an algorithm choice is for. */
typedef enum cudnn_dir { CUDNN_DIR_FWD = 0, CUDNN_DIR_BWD_DATA, CUDNN_DIR_BWD_FILTER, CUDNN_DIR_COUNT } cudnn_dir;

/* What identifies a convolution problem for the algorithm cache; compared
 * with memcmp, so always memset to 0 before filling. */
typedef struct cudnn_conv_key {
  int64_t x[4], w[4];
  int64_t stride[2], pad[2], dil[2], groups;
  int32_t dtype, layout, dir;
  uint32_t flags; /* the STOKE_KFLAG_* bits that change the choice */
} cudnn_conv_key;

typedef struct cudnn_algo_choice {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
  float ms;  /* measured time (autotune) or -1 (heuristic) */
} cudnn_algo_choice;

struct cg_cache; /* graph.c: execution plans by problem */

typedef struct cudnn_engine {
  stoke_cuda_device *dev;
  cudnnHandle_t handle;
  int n_cache;
  cudnn_conv_key keys[CUDNN_CACHE_MAX];
  cudnn_algo_choice vals[CUDNN_CACHE_MAX];
  struct cg_cache *plans;
  /* conv2d's unfolded path for few input channels (conv_graph.c): 0 chooses
   * (timed with autotune, else a rule); tests force 1 direct, 2 width taps
   * unfolded, 3 all taps unfolded, 4 width taps unfolded into 32-channel
   * rows, to check each path against the CPU */
  int conv_unfold_force;
  /* attention's timed engine configuration per problem (sdpa.c): identical
   * nodes (every layer's) are timed once */
  int n_sdpa;
  int64_t sdpa_keys[CUDNN_SDPA_CACHE][CUDNN_SDPA_KEY];
  int sdpa_best[CUDNN_SDPA_CACHE];
} cudnn_engine;

/* A cuDNN status as a stoke error: the call, cuDNN's message (and its last
 * detailed error text), and `ctx` (node and shapes). */
stoke_err *stoke_cudnn_err(cudnnStatus_t s, const char *file, int line, const char *call, const char *ctx);

#define CUDNN_CHECK(call, ctx)                                                          \
  do {                                                                                  \
    cudnnStatus_t cudnn_s_ = (call);                                                    \
    if (cudnn_s_ != CUDNN_STATUS_SUCCESS) return stoke_cudnn_err(cudnn_s_, __FILE__, __LINE__, #call, (ctx)); \
  } while (0)

/* Helpers of the conv kernels (cudnn.c): an attribute pair (h, w), one
 * value for both, two for HxW, none = def; and run()'s check that plan()
 * happened and its workspace is given. */
void stoke_cudnn_attr_pair(const stoke_node_v1 *n, int idx, int64_t def, int64_t out[2]);
stoke_err *stoke_cudnn_check_run(const stoke_kernel_args_v1 *a, const void *state, size_t workspace,
                                 const char *ctx);

/* The algorithm cache of an engine: NULL when the key is not there. */
const cudnn_algo_choice *stoke_cudnn_cache_get(const cudnn_engine *e, const cudnn_conv_key *k);
void stoke_cudnn_cache_put(cudnn_engine *e, const cudnn_conv_key *k, const cudnn_algo_choice *v);

/* conv.c: conv2d through the classic API, the "cudnn_classic" engine's
 * kernels and the graph path's fallback (conv_graph.c) for a problem no
 * graph engine runs. */
stoke_err *stoke_cudnn_classic_plan(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes, int bwd);
stoke_err *stoke_cudnn_classic_run_fwd(const stoke_kernel_args_v1 *a, void *state);
stoke_err *stoke_cudnn_classic_run_bwd(const stoke_kernel_args_v1 *a, void *state);
void stoke_cudnn_classic_destroy(void *state);
stoke_err *stoke_cudnn_register_conv_classic(const stoke_registry_v1 *r);
/* conv_graph.c: conv2d through the graph API, the "cudnn" engine's */
stoke_err *stoke_cudnn_register_conv(const stoke_registry_v1 *r);
stoke_err *stoke_cudnn_register_sdpa(const stoke_registry_v1 *r); /* sdpa.c: flash attention */

#endif
