/* sources/tokens/shard.c: llm.c's token-shard header, written and checked;
 * see shard.h. */
#include "shard.h"

#include <stdio.h>
#include <string.h>

static void put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int32_t get_le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

void stoke_shard_header(unsigned char out[STOKE_SHARD_HEADER_BYTES], int64_t count) {
  memset(out, 0, STOKE_SHARD_HEADER_BYTES);
  put_le32(out, STOKE_SHARD_MAGIC);
  put_le32(out + 4, STOKE_SHARD_VERSION);
  put_le32(out + 8, (uint32_t)count);
}

int stoke_shard_parse(const unsigned char *data, size_t size, int64_t *count, char *why, size_t cap) {
  if (size < STOKE_SHARD_HEADER_BYTES) {
    snprintf(why, cap, "%zu bytes, shorter than the %d-byte header of an llm.c token shard (truncated, or not a shard)",
             size, STOKE_SHARD_HEADER_BYTES);
    return -1;
  }
  int32_t magic = get_le32(data), version = get_le32(data + 4), n = get_le32(data + 8);
  if (magic != STOKE_SHARD_MAGIC) {
    snprintf(why, cap, "not an llm.c token shard: its first int32 is %d, a shard's is the magic %d", magic,
             STOKE_SHARD_MAGIC);
    return -1;
  }
  if (version != STOKE_SHARD_VERSION) {
    snprintf(why, cap, "token shard version %d; only version %d (uint16 tokens, GPT-2's tokenizer) is read%s", version,
             STOKE_SHARD_VERSION, version == 7 ? " (7 is llm.c's Llama 3 format, uint32 tokens)" : "");
    return -1;
  }
  if (n < 0) {
    snprintf(why, cap, "the header's token count is %d: not a count (the header is damaged)", n);
    return -1;
  }
  size_t want = STOKE_SHARD_HEADER_BYTES + 2 * (size_t)(uint32_t)n;
  if (size != want) {
    snprintf(why, cap, "the header says %d tokens (%zu bytes in all) but the file has %zu bytes (%s)", n, want, size,
             size < want ? "truncated" : "trailing bytes");
    return -1;
  }
  *count = n;
  return 0;
}
