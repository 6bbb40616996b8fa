/* tools/text.h: `convert text`: text files -> llm.c token shards for the
 * tokens source, with a byte-level tokenizer (vocabulary 256) or GPT-2's
 * BPE (tools/bpe.h). */
#ifndef STOKE_TOOLS_TEXT_H
#define STOKE_TOOLS_TEXT_H

#include <stdint.h>

#include "stoke/core.h"

typedef struct text_opts {
  const char *input;     /* comma-separated files, folders (their regular files but *.dat) or globs */
  const char *out;       /* shards: <out>_val_000000.bin, <out>_train_000001.bin, ... */
  const char *tokenizer; /* "byte" or "gpt2" */
  const char *encoder;   /* gpt2: encoder.json */
  const char *bpe;       /* gpt2: vocab.bpe */
  double val;            /* the fraction of every document's tokens (its end) kept for validation */
  int64_t shard_tokens;  /* tokens per training shard (llm.c: 100M) */
  int force;             /* overwrite existing shards */
} text_opts;

stoke_err *convert_text(const text_opts *o);

#endif
