/* backends/cuda/tune_fill.h: the operands an autotune times its candidates
 * on, filled with values like real data's (tune_fill.cu says why). Plain C,
 * no stoke host: the cublaslt and cudnn plugins and tests/gpu call it. */
#ifndef STOKE_CUDA_TUNE_FILL_H
#define STOKE_CUDA_TUNE_FILL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "stoke/tensor.h"

#ifdef __CUDACC__
#define STOKE_TUNE_FILL_FN static inline __host__ __device__
#else
#define STOKE_TUNE_FILL_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The value element i gets from seed: (h >> 8) * 2^-23 - 1 with h the
 * 32-bit hash below, uniform in [-1, 1) on a grid of 2^-23 (exact in f32),
 * rounded to nearest even for bf16 and f16. The CPU check in
 * tests/gpu/cuda_ops_test.c uses this same function. */
STOKE_TUNE_FILL_FN float stoke_tune_fill_value(uint64_t i, uint32_t seed) {
  uint32_t h = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) * 0x85EBCA77u ^ seed;
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x846CA68Bu;
  h ^= h >> 16;
  return (float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

/* The seed every autotune fills its operands with: the same values every
 * run, so a run's choices do not depend on when it ran. */
#define STOKE_TUNE_FILL_SEED 0x5eedu

/* `bytes` at p: elements of dt (STOKE_F32, STOKE_BF16 or STOKE_F16) with
 * stoke_tune_fill_value, and any bytes after the last whole element zero.
 * Another dtype: every byte 0x3c (the constant the tuners used before).
 * Asynchronous on `stream`; returns the launch's status. */
cudaError_t stoke_cuda_tune_fill(void *p, size_t bytes, stoke_dtype dt, uint32_t seed, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
