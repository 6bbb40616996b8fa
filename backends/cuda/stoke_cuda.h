/* backends/cuda/stoke_cuda.h: what the GPU plugins (cuda, cublaslt, cudnn,
 * fused) share: the device state the cuda backend opens and hands to the
 * others as `device_self`, and the CUDA error check that turns a code into
 * a message naming the call. Plain C, usable from .c and .cu files. */
#ifndef STOKE_CUDA_H
#define STOKE_CUDA_H

#include <cuda_runtime_api.h>

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STOKE_CUDA_DEVICE_VERSION 1

/* The cuda backend's state: one per opened device, `device_self` in the
 * other GPU engines' open(). Kernels of every GPU engine run on `stream`
 * (also in stoke_kernel_args_v1.stream); batch copies on `copy_stream`. */
typedef struct stoke_cuda_device {
  uint32_t version; /* STOKE_CUDA_DEVICE_VERSION */
  int index;
  cudaStream_t stream;
  cudaStream_t copy_stream;
  char name[128];
  int sm_count;
  int cc_major, cc_minor;
  size_t total_bytes;
} stoke_cuda_device;

/* Turn a CUDA error into a stoke error naming the call and what to do. */
#define STOKE_CUDA(call, ...)                                                          \
  do {                                                                                 \
    cudaError_t stoke_ce_ = (call);                                                    \
    if (stoke_ce_ != cudaSuccess)                                                      \
      return stoke_host->err_new(stoke_ce_ == cudaErrorMemoryAllocation ? STOKE_E_OOM \
                                                                        : STOKE_E_DEVICE, \
                                 __FILE__, __LINE__, "%s failed: %s (%s)", #call,     \
                                 cudaGetErrorString(stoke_ce_), cudaGetErrorName(stoke_ce_)); \
  } while (0)

/* After a kernel launch: the launch error, if any, naming the node. */
#define STOKE_CUDA_LAUNCH(node_name)                                                    \
  do {                                                                                 \
    cudaError_t stoke_ce_ = cudaGetLastError();                                        \
    if (stoke_ce_ != cudaSuccess)                                                      \
      return stoke_host->err_new(STOKE_E_DEVICE, __FILE__, __LINE__,                  \
                                 "kernel launch for node '%s' failed: %s", (node_name),  \
                                 cudaGetErrorString(stoke_ce_));                       \
  } while (0)

/* The kernels of backends/cuda, registered by cuda.c (each .cu file adds
 * its own table). */
stoke_err *stoke_cuda_register_elementwise(const stoke_registry_v1 *r);
stoke_err *stoke_cuda_register_norm(const stoke_registry_v1 *r);
stoke_err *stoke_cuda_register_optim(const stoke_registry_v1 *r);
stoke_err *stoke_cuda_register_amp(const stoke_registry_v1 *r);
stoke_err *stoke_cuda_register_cast(const stoke_registry_v1 *r);
stoke_err *stoke_cuda_register_seq(const stoke_registry_v1 *r); /* seq.cu: transformer ops, views */
stoke_err *stoke_cuda_register_layer_norm(const stoke_registry_v1 *r); /* layer_norm.cu */
stoke_err *stoke_cuda_register_attention(const stoke_registry_v1 *r); /* attention.cu: the plain kernel */

#ifdef __cplusplus
}
#endif
#endif
