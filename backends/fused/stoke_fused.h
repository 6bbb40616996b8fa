/* backends/fused/stoke_fused.h: what the files of the fused plugin share:
 * the engine state (the cuda backend's device, whose SM count sizes the
 * grids) and each kernel file's registration. Plain C, for .c and .cu. */
#ifndef STOKE_FUSED_H
#define STOKE_FUSED_H

#include "backends/cuda/stoke_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_fused_engine {
  const stoke_cuda_device *dev;
} stoke_fused_engine;

/* bn_act.cu: bn_relu and bn_add_relu, forward and backward. */
stoke_err *stoke_fused_register_bn_act(const stoke_registry_v1 *r);

#ifdef __cplusplus
}
#endif
#endif
