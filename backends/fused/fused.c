/* backends/fused/fused.c: the "fused" engine: stoke's own CUDA kernels that
 * do in one pass what other engines do in several (batch norm + residual
 * add + ReLU), on the cuda backend's device and stream; listed first
 * (`backends = fused, cudnn, cublaslt, cuda`) with `run.fuse = true`, the
 * compiler rewrites the matching chains into its ops. */
#include <string.h>

#include "stoke_fused.h"

const stoke_host_v1 *stoke_host;

static stoke_err *fused_open(int index, void *device_self, void **self) {
  const stoke_cuda_device *d = device_self;
  if (!d || d->version != STOKE_CUDA_DEVICE_VERSION)
    return STOKE_PERR(STOKE_E_INVALID,
                      "fused: needs the cuda backend's device (device_self %s, version %u, expected %d); "
                      "list cuda among [run] backends",
                      d ? "set" : "NULL", d ? d->version : 0u, STOKE_CUDA_DEVICE_VERSION);
  stoke_fused_engine *e = stoke_host->alloc(sizeof *e);
  if (!e) return STOKE_PERR(STOKE_E_OOM, "fused: out of host memory");
  memset(e, 0, sizeof *e);
  e->dev = d;
  *self = e;
  return NULL;
}

static void fused_close(void *self) {
  if (self) stoke_host->free(self);
}

static const stoke_backend_v1 backend = {
    STOKE_ABI(stoke_backend_v1),
    .name = "fused",
    .help = "stoke's fused CUDA kernels (batch norm + ReLU, batch norm + add + ReLU; NHWC) on the cuda device",
    .device = STOKE_DEV_GPU,
    .device_engine = "cuda",
    .open = fused_open,
    .close = fused_close,
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_backend(r->self, &backend));
  STOKE_PROPAGATE_P(stoke_fused_register_bn_act(r));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "fused", "fused CUDA kernels (batch norm + add + ReLU)", reg};
