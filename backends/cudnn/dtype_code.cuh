// backends/cudnn/dtype_code.cuh: element access by dtype code (0 f32, 1 bf16,
// 2 f16) for the cudnn plugin's small helper kernels, which C callers
// launch with the dtype as an int.
#ifndef STOKE_CUDNN_DTYPE_CODE_CUH
#define STOKE_CUDNN_DTYPE_CODE_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float load(const void *p, int dt, long long i) {
  if (dt == 1) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (dt == 2) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

__device__ __forceinline__ void store(void *p, int dt, long long i, float v) {
  if (dt == 1) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
  else if (dt == 2) ((__half *)p)[i] = __float2half(v);
  else ((float *)p)[i] = v;
}

// beta 0: overwrite without reading (the destination may hold NaN).
__device__ __forceinline__ void acc(void *p, int dt, long long i, float beta, float v) {
  store(p, dt, i, beta != 0.0f ? beta * load(p, dt, i) + v : v);
}
#endif
