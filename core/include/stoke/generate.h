/* stoke/generate.h: text from a trained language model (a [data] source of
 * token windows, e.g. the gpt model on the tokens source): the model of a
 * run's INI, its weights from a checkpoint, one token at a time sampled
 * from the last position's logits, as nanoGPT's sample.py and llm.c's
 * generation do (temperature, top-k; no key-value cache: each token runs
 * the forward plan over the window of the last [data] seq_len tokens, the
 * length the model was trained on). */
#ifndef STOKE_GENERATE_H
#define STOKE_GENERATE_H

#include <stdint.h>

#include "stoke/run.h"
#include "stoke/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called with each new token and the logits it was drawn from (row[0 ..
 * vocab), f32, before temperature); nonzero stops the generation. */
typedef int (*stoke_gen_token_fn)(void *ctx, int32_t token, const float *row, int64_t vocab);

typedef struct stoke_gen_opts {
  const int32_t *prompt; /* at least one token; longer than [data] seq_len: its last seq_len tokens */
  int64_t n_prompt;
  int64_t max_new;       /* tokens to generate */
  double temperature;    /* 0: greedy (the first largest logit) */
  int64_t top_k;         /* draw among the k largest logits (0: all) */
  uint64_t seed;
  int32_t pad;           /* fills the window after the text: the model is causal, so it must not matter
                            (tests vary it) */
  int64_t tokenizer_vocab; /* the prompt's tokenizer's vocabulary (256: bytes); it must be [data] vocab
                              (0: not checked) */
  const char *tokenizer;   /* its name (and what to do), for the message when it is not */
  stoke_gen_token_fn on_token;
  void *ctx;
} stoke_gen_opts;

/* Generate from the model of o->ini_path (with o's overrides and plugin
 * folders) with the weights of `checkpoint`. The INI's [data] section
 * says the window (its seq_len is the model's input length) and the
 * vocabulary (its vocab), as nanoGPT reads meta.pkl from the data folder;
 * [run] backends and precision say where it runs. *vocab_out (if not
 * NULL): the vocabulary tokens are drawn from. */
stoke_err *stoke_generate(const stoke_run_opts *o, const char *checkpoint, const stoke_gen_opts *g,
                          int64_t *vocab_out);

/* One token from logits row[0 .. n): greedy at temperature 0, else a draw
 * from softmax(row / temperature) over the top_k largest (0: all; ties at
 * the k-th value all stay in). scratch: n floats. */
int32_t stoke_sample_token(const float *row, int64_t n, double temperature, int64_t top_k, stoke_rng *rng,
                           float *scratch);

#ifdef __cplusplus
}
#endif
#endif
