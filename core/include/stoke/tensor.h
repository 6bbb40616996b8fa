/* stoke/tensor.h: dtypes, layouts, shapes and the tensor descriptor shared
 * by the core and every plugin. */
#ifndef STOKE_TENSOR_H
#define STOKE_TENSOR_H

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

static inline const char *stoke_dtype_name(stoke_dtype t) {
  static const char *const names[] = {"f32", "f16", "bf16", "i32", "u8", "f64"};
  return (unsigned)t < STOKE_DTYPE_COUNT ? names[t] : "?";
}

static inline size_t stoke_tensor_bytes(const stoke_tensor *t) {
  return (size_t)stoke_numel(&t->shape) * stoke_dtype_size(t->dtype);
}

#ifdef __cplusplus
}
#endif
#endif
