/* backends/cpu/act.h: the activation math of the CPU kernels (gelu, and the
 * aux of linear_act / linear_dact, stoke/ops.h), in double for both
 * element types. Included by cpu.c before kernels.inc. */
#ifndef STOKE_CPU_ACT_H
#define STOKE_CPU_ACT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define GELU_K0 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_K1 0.044715

/* gelu(x) and its derivative; tanh = 1: the tanh approximation. */
static inline double gelu_of(double x, int tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1 + tanh(GELU_K0 * (x + GELU_K1 * x * x * x)));
  return 0.5 * x * (1 + erf(x * M_SQRT1_2));
}

static inline double gelu_grad_of(double x, int tanh_approx) {
  if (tanh_approx) {
    double t = tanh(GELU_K0 * (x + GELU_K1 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K0 * (1 + 3 * GELU_K1 * x * x);
  }
  return 0.5 * (1 + erf(x * M_SQRT1_2)) + x * exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
}

/* "tanh" in an approximate attribute (infer allows only none and tanh). */
static inline int gelu_is_tanh(const char *approximate) { return !strcmp(approximate, "tanh"); }

/* Bytes per row of linear_act's ReLU bitmask for `cols` outputs. */
static inline int64_t relu_mask_stride(int64_t cols) { return (cols + 127) / 128 * 16; }

static inline int relu_mask_bit(const uint8_t *mask, int64_t stride, int64_t i, int64_t j) {
  return (mask[i * stride + j / 8] >> (j % 8)) & 1;
}

#endif
