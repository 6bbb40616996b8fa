/* stoke/tensor.h: dtypes, layouts, shapes and the tensor descriptor shared
 * by the core and every plugin. */
#ifndef STOKE_TENSOR_H
#define STOKE_TENSOR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum stoke_dtype {
  STOKE_F32 = 0,
  STOKE_F16,
  STOKE_BF16,
  STOKE_I32,
  STOKE_U8,
  STOKE_F64, /* CPU reference kernels only: gradient checks in double */
  STOKE_DTYPE_COUNT
} stoke_dtype;

/* Memory order of a 4-D image tensor. Shapes are always given logically as
 * (N, C, H, W), as in PyTorch; NHWC is PyTorch's channels_last. Tensors
 * that are not 4-D use STOKE_LAYOUT_ANY. */
typedef enum stoke_layout {
  STOKE_LAYOUT_ANY = 0,
  STOKE_NCHW,
  STOKE_NHWC
} stoke_layout;

typedef enum stoke_device_kind {
  STOKE_DEV_CPU = 0,
  STOKE_DEV_GPU
} stoke_device_kind;

#define STOKE_MAX_DIMS 6

typedef struct stoke_shape {
  int ndim;
  int64_t d[STOKE_MAX_DIMS];
} stoke_shape;

typedef struct stoke_tensor {
  void *data;
  stoke_shape shape;
  stoke_dtype dtype;
  stoke_layout layout;
  stoke_device_kind device;
} stoke_tensor;

/* Small pure helpers (the only definitions in the SDK headers). */
static inline int64_t stoke_numel(const stoke_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->d[i];
  return n;
}

static inline size_t stoke_dtype_size(stoke_dtype t) {
  switch (t) {
    case STOKE_F32: case STOKE_I32: return 4;
    case STOKE_F16: case STOKE_BF16: return 2;
    case STOKE_U8: return 1;
    case STOKE_F64: return 8;
    default: return 0;
  }
}

/* The unit roundoff of a float dtype (half an ulp at 1): 2^-53 f64, 2^-24
 * f32, 2^-11 fp16, 2^-8 bf16; 0 for integers (exact). */
static inline double stoke_dtype_unit_roundoff(stoke_dtype t) {
  switch (t) {
    case STOKE_F64: return 0x1p-53;
    case STOKE_F32: return 0x1p-24;
    case STOKE_F16: return 0x1p-11;
    case STOKE_BF16: return 0x1p-8;
    default: return 0;
  }
}

/* The relative rounding error a sum of k terms gathers in the accumulator
 * of a kernel of dtype t (f32 for every dtype but f64): u(acc) sqrt(k), the
 * random-walk bound the kernel tests (tests/op/every_kernel_test, the
 * plugin kit's tools/plugin_check, tests/gpu) build their tolerances on. */
static inline double stoke_sum_roundoff(stoke_dtype t, double k) {
  return (t == STOKE_F64 ? 0x1p-53 : 0x1p-24) * sqrt(k > 1 ? k : 1);
}

static inline const char *stoke_dtype_name(stoke_dtype t) {
  static const char *const names[] = {"f32", "f16", "bf16", "i32", "u8", "f64"};
  return (unsigned)t < STOKE_DTYPE_COUNT ? names[t] : "?";
}

/* bf16 and fp16 <-> f32, round to nearest even (NaN stays NaN). */
static inline uint16_t stoke_f32_to_bf16(float f) {
  union { float f; uint32_t u; } v = {f};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline float stoke_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v = {(uint32_t)h << 16};
  return v.f;
}

static inline uint16_t stoke_f32_to_f16(float f) {
  union { float f; uint32_t u; } v = {f};
  uint32_t sign = (v.u >> 16) & 0x8000u, x = v.u & 0x7fffffffu;
  if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN */
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* overflow: inf */
  if (x < 0x38800000u) {                                            /* subnormal or zero */
    if (x < 0x33000000u) return (uint16_t)sign;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(x >> 23);                               /* 14..24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = x - 0x38000000u;                                     /* rebias 127 -> 15 */
  uint32_t out = r >> 13, rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) out++;
  return (uint16_t)(sign | out);
}

static inline float stoke_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f) u = sign | 0x7f800000u | (m << 13);
  else if (e) u = sign | ((e + 112u) << 23) | (m << 13);
  else if (!m) u = sign;
  else {
    e = 113;
    while (!(m & 0x400u)) m <<= 1, e--;
    u = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  union { uint32_t u; float f; } v = {u};
  return v.f;
}

/* Element i of host memory p of dtype t, as a double (NaN for no dtype). */
static inline double stoke_elem_get(const void *p, stoke_dtype t, int64_t i) {
  switch (t) {
    case STOKE_F64: return ((const double *)p)[i];
    case STOKE_F32: return ((const float *)p)[i];
    case STOKE_BF16: return stoke_bf16_to_f32(((const uint16_t *)p)[i]);
    case STOKE_F16: return stoke_f16_to_f32(((const uint16_t *)p)[i]);
    case STOKE_I32: return ((const int32_t *)p)[i];
    case STOKE_U8: return ((const uint8_t *)p)[i];
    default: return 0.0 / 0.0;
  }
}

/* Store v as element i of host memory p of dtype t (rounded to nearest). */
static inline void stoke_elem_set(void *p, stoke_dtype t, int64_t i, double v) {
  switch (t) {
    case STOKE_F64: ((double *)p)[i] = v; break;
    case STOKE_F32: ((float *)p)[i] = (float)v; break;
    case STOKE_BF16: ((uint16_t *)p)[i] = stoke_f32_to_bf16((float)v); break;
    case STOKE_F16: ((uint16_t *)p)[i] = stoke_f32_to_f16((float)v); break;
    case STOKE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case STOKE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
  }
}

static inline size_t stoke_tensor_bytes(const stoke_tensor *t) {
  return (size_t)stoke_numel(&t->shape) * stoke_dtype_size(t->dtype);
}

#ifdef __cplusplus
}
#endif
#endif
