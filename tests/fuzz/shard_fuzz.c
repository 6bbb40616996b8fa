/* tests/fuzz/shard_fuzz.c: fuzz target of an llm.c token shard as the
 * tokens source reads one: the header against the file's size, then every
 * token against the vocabulary. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sources/tokens/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *v = malloc(size ? size : 1);
  if (!v) return 0;
  memcpy(v, data, size);
  int64_t count;
  char why[256];
  if (stoke_shard_parse(v, size, &count, why, sizeof why) == 0) {
    int64_t over = 0;
    for (int64_t i = 0; i < count; i++) {
      const uint8_t *p = v + STOKE_SHARD_HEADER_BYTES + 2 * i;
      over += (p[0] | p[1] << 8) >= 50257;
    }
    (void)over;
  }
  free(v);
  return 0;
}
