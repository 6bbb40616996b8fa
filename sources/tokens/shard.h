/* sources/tokens/shard.h: llm.c's token-shard format, shared by the tokens
 * source, tools/convert text and the tests: a header of 256 little-endian
 * int32 (magic 20240520, version 1, the token count, the rest 0), then the
 * tokens as uint16. Pure byte handling, no stoke errors: the callers say
 * which file. */
#ifndef STOKE_SOURCES_TOKENS_SHARD_H
#define STOKE_SOURCES_TOKENS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define STOKE_SHARD_MAGIC 20240520
#define STOKE_SHARD_VERSION 1 /* uint16 tokens (GPT-2's tokenizer and smaller) */
#define STOKE_SHARD_HEADER_BYTES (256 * 4)
#define STOKE_SHARD_MAX_TOKEN 65535

/* The header of a shard of `count` tokens, in file byte order. */
void stoke_shard_header(unsigned char out[STOKE_SHARD_HEADER_BYTES], int64_t count);

/* Checks a whole shard file's bytes: 0 and *count when it is one, else -1
 * and a sentence in `why` (foreign file, unsupported version, truncated or
 * trailing bytes), which the caller prefixes with the path. */
int stoke_shard_parse(const unsigned char *data, size_t size, int64_t *count, char *why, size_t cap);

#endif
