/* core/finite.c: NaN and infinity counts over host copies of float
 * tensors, by their bits (every float dtype alike, bf16 and fp16 with no
 * conversion): the checkpoint's refusal of a diverged run's weights and
 * [run] detect_anomaly's checks. */
#include <string.h>

#include "stoke/core.h"

/* exponent bits all ones: an infinity or a NaN */
#define SCAN(T, MASK)                                    \
  for (int64_t i = 0; i < n; i++) {                      \
    T v;                                                 \
    memcpy(&v, b + sizeof(T) * (size_t)i, sizeof(T));    \
    if ((v & (MASK)) == (MASK) && !bad++ && first) *first = i; \
  }

int64_t stoke_count_nonfinite(const void *p, stoke_dtype dtype, int64_t n, int64_t *first) {
  int64_t bad = 0;
  const char *b = p;
  switch (dtype) {
    case STOKE_F32: SCAN(uint32_t, 0x7f800000u) break;
    case STOKE_F64: SCAN(uint64_t, 0x7ff0000000000000ull) break;
    case STOKE_BF16: SCAN(uint16_t, 0x7f80u) break;
    case STOKE_F16: SCAN(uint16_t, 0x7c00u) break;
    default: break;
  }
  return bad;
}
