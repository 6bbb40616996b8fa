/* tests/common/relu_mask.h: the check each test of a flat ReLU bitmask
 * (stoke/ops.h: bn_add_relu's output 3) makes against the y it was made
 * with: bit e is element e of y, as stored, > 0. */
#ifndef STOKE_TESTS_RELU_MASK_H
#define STOKE_TESTS_RELU_MASK_H

#include <stdint.h>

#include "stoke/tensor.h"

/* Bit e of the mask: bit e % 8 of byte e / 8. */
static inline int relu_mask_bit(const uint8_t *mask, int64_t e) { return (mask[e / 8] >> (e % 8)) & 1; }

/* The first element e of y (n elements of dtype dt, in memory order) whose
 * mask bit is not y[e] > 0; -1 when every bit is right. */
static inline int64_t relu_mask_first_wrong(const uint8_t *mask, const void *y, stoke_dtype dt, int64_t n) {
  for (int64_t e = 0; e < n; e++)
    if (relu_mask_bit(mask, e) != (stoke_elem_get(y, dt, e) > 0)) return e;
  return -1;
}

#endif
