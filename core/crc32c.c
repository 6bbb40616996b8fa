/* core/crc32c.c: CRC-32C with the SSE4.2 crc32 instruction (every x86-64-v2
 * CPU and later), with a table fallback for other CPUs. Written here: the
 * Debian library that has it (libisal) ships only as a shared library, and
 * stoke's binaries must run on machines without it. */
#include "stoke/crc32c.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#include <string.h>

static uint32_t update(uint32_t c, const unsigned char *p, size_t n) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
  }
  c = (uint32_t)c64;
  for (; n; n--, p++) c = _mm_crc32_u8(c, *p);
  return c;
}
#else
static uint32_t table[256];

static void make_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
}

static uint32_t update(uint32_t c, const unsigned char *p, size_t n) {
  static int ready;
  if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) { /* idempotent: racing threads write the same */
    make_table();
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
  }
  for (; n; n--, p++) c = table[(c ^ *p) & 0xff] ^ (c >> 8);
  return c;
}
#endif

uint32_t stoke_crc32c(uint32_t crc, const void *p, size_t n) { return ~update(~crc, p, n); }
