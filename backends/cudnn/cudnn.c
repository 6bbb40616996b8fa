/* backends/cudnn/cudnn.c: the "cudnn" engine: kernels only, on the cuda
 * backend's device and stream (one cuDNN handle per opened device), its
 * algorithm cache, the cuDNN error wrapper and the plugin entry. */
#include <stdio.h>
#include <string.h>

#include "graph.h"
#include "stoke_cudnn.h"

const stoke_host_v1 *stoke_host;

stoke_err *stoke_cudnn_register_bn(const stoke_registry_v1 *r); /* bn.c */

void stoke_cudnn_attr_pair(const stoke_node_v1 *n, int idx, int64_t def, int64_t out[2]) {
  out[0] = out[1] = def;
  if (!n || n->n_attrs <= idx) return;
  const stoke_attr_v1 *at = &n->attrs[idx];
  if (at->n == 1) out[0] = out[1] = at->ints[0];
  if (at->n >= 2) out[0] = at->ints[0], out[1] = at->ints[1];
}

stoke_err *stoke_cudnn_check_run(const stoke_kernel_args_v1 *a, const void *state, size_t workspace,
                                 const char *ctx) {
  if (!state)
    return STOKE_PERR(STOKE_E_INTERNAL, "cudnn %s '%s': run() without plan()", a->node ? a->node->op : "?",
                      stoke_node_name(a));
  if (a->workspace_bytes < workspace || (workspace && !a->workspace))
    return STOKE_PERR(STOKE_E_INTERNAL, "cudnn: workspace of %zu B given, plan() asked for %zu B; %s",
                      a->workspace_bytes, workspace, ctx);
  return NULL;
}

const cudnn_algo_choice *stoke_cudnn_cache_get(const cudnn_engine *e, const cudnn_conv_key *k) {
  for (int i = 0; i < e->n_cache; i++)
    if (!memcmp(&e->keys[i], k, sizeof *k)) return &e->vals[i];
  return NULL;
}

void stoke_cudnn_cache_put(cudnn_engine *e, const cudnn_conv_key *k, const cudnn_algo_choice *v) {
  if (e->n_cache >= CUDNN_CACHE_MAX) return; /* full: later shapes are tuned again, still correct */
  e->keys[e->n_cache] = *k;
  e->vals[e->n_cache] = *v;
  e->n_cache++;
}

static stoke_err *cudnn_open(int index, void *device_self, void **self) {
  stoke_cuda_device *d = device_self;
  if (!d || d->version != STOKE_CUDA_DEVICE_VERSION)
    return STOKE_PERR(STOKE_E_INVALID,
                      "cudnn: needs the cuda backend's device (device_self %s, version %u, expected %d); "
                      "list cuda before cudnn in [run] backends",
                      d ? "set" : "NULL", d ? d->version : 0u, STOKE_CUDA_DEVICE_VERSION);
  STOKE_CUDA(cudaSetDevice(d->index));
  cudnn_engine *e = stoke_host->alloc(sizeof *e);
  if (!e) return STOKE_PERR(STOKE_E_OOM, "cudnn: out of host memory");
  memset(e, 0, sizeof *e);
  e->dev = d;
  cudnnStatus_t s = cudnnCreate(&e->handle);
  if (s != CUDNN_STATUS_SUCCESS) {
    stoke_host->free(e);
    char ctx[64];
    snprintf(ctx, sizeof ctx, "device %d", index);
    return stoke_cudnn_err(s, __FILE__, __LINE__, "cudnnCreate", ctx);
  }
  size_t v = cudnnGetVersion();
  stoke_host->log(STOKE_LOG_INFO, "cudnn", "device %d: cuDNN %zu.%zu.%zu (built against %d.%d.%d)", d->index,
                  v / 10000, v / 100 % 100, v % 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
  if (v / 10000 != CUDNN_MAJOR)
    stoke_host->log(STOKE_LOG_WARN, "cudnn",
                    "the cuDNN library found (%zu) is not of the major version this plugin was built "
                    "against (%d): expect failures",
                    v, CUDNN_MAJOR);
  *self = e;
  return NULL;
}

static void cudnn_close(void *self) {
  cudnn_engine *e = self;
  if (!e) return;
  cg_cache_free(e);
  cudnnDestroy(e->handle);
  stoke_host->free(e);
}

static const stoke_backend_v1 backend = {
    STOKE_ABI(stoke_backend_v1),
    .name = "cudnn",
    .help = "NVIDIA cuDNN kernels through its graph API (conv2d, autotuned with conv_autotune like "
            "cudnn.benchmark; 4-D batch_norm) on the cuda device",
    .device = STOKE_DEV_GPU,
    .device_engine = "cuda",
    .open = cudnn_open,
    .close = cudnn_close,
};

/* The classic (v7) convolution API as an engine of its own, for A/B runs
 * (`backends = fused, cudnn_classic, cudnn, ...`: its conv2d first). */
static const stoke_backend_v1 classic = {
    STOKE_ABI(stoke_backend_v1),
    .name = "cudnn_classic",
    .help = "cuDNN's classic convolution API (cudnnConvolutionForward/Backward*, cudnnFind*): conv2d only",
    .device = STOKE_DEV_GPU,
    .device_engine = "cuda",
    .open = cudnn_open,
    .close = cudnn_close,
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_backend(r->self, &backend));
  STOKE_PROPAGATE_P(r->add_backend(r->self, &classic));
  STOKE_PROPAGATE_P(stoke_cudnn_register_conv(r));
  STOKE_PROPAGATE_P(stoke_cudnn_register_conv_classic(r));
  STOKE_PROPAGATE_P(stoke_cudnn_register_bn(r));
  STOKE_PROPAGATE_P(stoke_cudnn_register_sdpa(r));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "cudnn", "cuDNN convolution and batch-norm kernels", reg};
