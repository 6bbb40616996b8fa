/* core/run_generate.c: text from a trained language model (stoke/generate.h).
 * The run's own setup parts: the config and plugins (stoke_run_setup),
 * the device (run_open_device), the [data] stream's graph at batch 1 and
 * forward only (run_plan_stream), the checkpoint's weights; then a forward
 * pass per token over the window, the last text position's logits read
 * back and sampled on the host. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/checkpoint.h"
#include "stoke/core.h"
#include "stoke/generate.h"
#include "run_state.h"

static int by_value_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

int32_t stoke_sample_token(const float *row, int64_t n, double temperature, int64_t top_k, stoke_rng *rng,
                           float *scratch) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (row[i] > row[best]) best = i;
  if (temperature <= 0 || top_k == 1) return (int32_t)best;
  float floor = -INFINITY; /* the k-th largest: values below it are left out */
  if (top_k > 0 && top_k < n) {
    memcpy(scratch, row, sizeof(float) * (size_t)n);
    qsort(scratch, (size_t)n, sizeof(float), by_value_desc);
    floor = scratch[top_k - 1];
  }
  /* softmax(row / T) over the kept values, in double, the largest first
   * subtracted (no overflow at any temperature) */
  double sum = 0, top = row[best];
  for (int64_t i = 0; i < n; i++)
    if (row[i] >= floor) sum += exp(((double)row[i] - top) / temperature);
  double u = stoke_rng_uniform(rng) * sum, acc = 0;
  int64_t last = best;
  for (int64_t i = 0; i < n; i++) {
    if (row[i] < floor) continue;
    acc += exp(((double)row[i] - top) / temperature);
    last = i;
    if (u < acc) return (int32_t)i;
  }
  return (int32_t)last; /* u rounded up to the sum */
}

typedef struct gen {
  run_state s;
  float *row, *scratch;
  void *logits;
  int32_t *window, *text;
} gen;

static void gen_close(gen *G) {
  run_state *s = &G->s;
  run_stream_close(s, &s->train);
  run_close_engines(s);
  stoke_nvml_close(s->nvml);
  stoke_registry_free(s->reg);
  stoke_cfg_free(s->cfg);
  free(G->row);
  free(G->scratch);
  free(G->logits);
  free(G->window);
  free(G->text);
}

/* Generation reads no data, only the window's length and the vocabulary:
 * a [data] source of token shards (`tokens`) is replaced by a synthetic
 * token source of the same window (seq_len + 1) and vocabulary, declared
 * in a section of its own, so the training shards need not be there
 * (nanoGPT's sample.py needs only the checkpoint). Other sources (the
 * synthetic tokens of a benchmark) read no files anyway. */
static stoke_err *window_source(run_state *s, stoke_data_config *dc) {
  if (strcmp(dc->source, "tokens")) return NULL;
  int64_t seq_len, vocab;
  STOKE_PROPAGATE(stoke_cfg_int(s->cfg, "data", "seq_len", &seq_len));
  STOKE_PROPAGATE(stoke_cfg_int(s->cfg, "data", "vocab", &vocab));
  if (!stoke_find_source(s->reg, "synthetic"))
    STOKE_TRY(stoke_registry_load(s->reg, "synthetic"), "the synthetic source, for the model's window");
  const stoke_source_v1 *syn = stoke_find_source(s->reg, "synthetic");
  if (!syn) return STOKE_ERR(STOKE_E_NOT_FOUND, "the synthetic plugin registers no 'synthetic' source");
  STOKE_PROPAGATE(stoke_cfg_declare(s->cfg, "generate_window", "the model's window (generate)", syn->keys, syn->n_keys));
  char a[4][64];
  snprintf(a[0], sizeof a[0], "generate_window.tokens=true");
  snprintf(a[1], sizeof a[1], "generate_window.shape=%lld", (long long)seq_len + 1);
  snprintf(a[2], sizeof a[2], "generate_window.classes=%lld", (long long)vocab);
  snprintf(a[3], sizeof a[3], "generate_window.length=1");
  for (int i = 0; i < 4; i++) STOKE_TRY(stoke_cfg_override(s->cfg, a[i]), "the model's window");
  dc->section = "generate_window";
  dc->source = "synthetic";
  return NULL;
}

/* The model at batch 1, forward only, with the checkpoint's weights. */
static stoke_err *gen_open(gen *G, const stoke_run_opts *o, const char *checkpoint) {
  run_state *s = &G->s;
  STOKE_PROPAGATE(stoke_run_setup(o, &s->cfg, &s->reg));
  STOKE_PROPAGATE(run_read_config(s));
  s->rc.run.comm = "single"; /* one process generates */
  STOKE_PROPAGATE(run_open_device(s));
  stoke_data_config dc = s->rc.data;
  dc.batch = 1;
  STOKE_PROPAGATE(window_source(s, &dc));
  /* the forward plan of one window; as its own "training" stream, so the
   * evaluation's check against [data] compares [data] with itself */
  STOKE_PROPAGATE(run_plan_stream(s, &s->train, &dc, s->prec, 0));
  stream *st = &s->train;
  if (!st->lm)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [data] source '%s' gives no token windows: generation needs a language model (e.g. "
                     "source = tokens, model name = gpt)",
                     stoke_cfg_where(s->cfg, "data", "source"), s->rc.data.source);
  STOKE_TRY(stoke_exec_new(st->plan, s->dev, s->dev_self, (uint64_t)s->rc.run.seed, &st->x),
            "preparing the model's forward plan");
  stoke_ckpt_meta meta = {0};
  STOKE_TRY(stoke_checkpoint_load(st->x, checkpoint, &meta), "loading the weights to generate with");
  if (!o->ini_text) { /* an INI given: its [model] against the checkpoint's run */
    char *now = run_config_text(s->cfg);
    run_config_drift(now, checkpoint, "generating from");
    free(now);
  }
  return NULL;
}

/* The logits row of window position `pos` as f32: that row alone comes
 * back (GPT-2's whole [1024, 50304] bf16 logits would be 103 MB a token). */
static stoke_err *row_at(gen *G, int64_t pos, int64_t vocab, int64_t width) {
  stream *st = &G->s.train;
  stoke_tensor lt = stoke_exec_tensor(st->x, st->g->logits);
  size_t es = stoke_dtype_size(lt.dtype);
  STOKE_PROPAGATE(stoke_exec_copy(st->x, G->logits, (const char *)lt.data + (size_t)(pos * width) * es,
                                  (size_t)vocab * es, STOKE_COPY_D2H));
  for (int64_t c = 0; c < vocab; c++) {
    G->row[c] = (float)stoke_elem_get(G->logits, lt.dtype, c);
    if (!isfinite(G->row[c]))
      return STOKE_ERR(STOKE_E_NUMERIC,
                       "the model's logit %lld at position %lld is %g: the checkpoint's weights give no "
                       "distribution to sample from",
                       (long long)c, (long long)pos, (double)G->row[c]);
  }
  return NULL;
}

static stoke_err *gen_run(gen *G, const stoke_gen_opts *g, int64_t *vocab_out) {
  stream *st = &G->s.train;
  const stoke_graph *gr = st->g;
  int64_t t = gr->values[gr->input].shape.d[1] - 1; /* the model reads T of the T + 1 window */
  int64_t width = gr->values[gr->logits].shape.d[1];
  stoke_sample_info_v1 info;
  STOKE_TRY(st->src->info(st->src_self, &info), "source '%s'", st->src->name);
  int64_t vocab = info.classes;
  if (vocab_out) *vocab_out = vocab;
  if (g->tokenizer_vocab && g->tokenizer_vocab != vocab)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: the model reads [data] vocab = %lld tokens, but the prompt's tokenizer has %lld (%s): "
                     "tokenize as the data was converted",
                     stoke_cfg_where(G->s.cfg, "data", "vocab"), (long long)vocab, (long long)g->tokenizer_vocab,
                     g->tokenizer ? g->tokenizer : "?");
  if (g->n_prompt < 1) return STOKE_ERR(STOKE_E_INVALID, "generate: the prompt is empty: give at least one token");
  for (int64_t i = 0; i < g->n_prompt; i++)
    if (g->prompt[i] < 0 || g->prompt[i] >= vocab)
      return STOKE_ERR(STOKE_E_INVALID, "generate: prompt token %lld is %d, outside the vocabulary [0, %lld) of [data]",
                       (long long)i, g->prompt[i], (long long)vocab);
  if (g->pad < 0 || g->pad >= vocab)
    return STOKE_ERR(STOKE_E_INVALID, "generate: pad token %d outside [0, %lld)", g->pad, (long long)vocab);
  const stoke_value *lv = &gr->values[gr->logits];
  int64_t n = g->n_prompt + g->max_new;
  G->text = malloc(sizeof(int32_t) * (size_t)n);
  G->window = malloc(sizeof(int32_t) * (size_t)(t + 1));
  G->row = malloc(sizeof(float) * (size_t)vocab);
  G->scratch = malloc(sizeof(float) * (size_t)vocab);
  G->logits = malloc((size_t)vocab * stoke_dtype_size(lv->dtype));
  if (!G->text || !G->window || !G->row || !G->scratch || !G->logits)
    return STOKE_ERR(STOKE_E_OOM, "generate: out of memory");
  memcpy(G->text, g->prompt, sizeof(int32_t) * (size_t)g->n_prompt);
  stoke_rng rng = stoke_rng_seed(g->seed);
  for (int64_t len = g->n_prompt; len < n; len++) {
    if (run_stop_now(&G->s)) return STOKE_ERR(STOKE_E_INTERRUPTED, "generation interrupted");
    int64_t from = len > t ? len - t : 0, used = len - from; /* the last T tokens, as nanoGPT crops */
    for (int64_t i = 0; i <= t; i++) G->window[i] = i < used ? G->text[from + i] : g->pad;
    STOKE_PROPAGATE(stoke_exec_copy(st->x, stoke_exec_input(st->x), G->window, sizeof(int32_t) * (size_t)(t + 1),
                                    STOKE_COPY_H2D));
    STOKE_TRY(stoke_exec_forward_backward(st->x, 1, 0), "the model's forward pass at token %lld", (long long)len);
    STOKE_PROPAGATE(row_at(G, used - 1, vocab, width));
    int32_t tok = stoke_sample_token(G->row, vocab, g->temperature, g->top_k, &rng, G->scratch);
    G->text[len] = tok;
    if (g->on_token && g->on_token(g->ctx, tok, G->row, vocab)) break;
  }
  return NULL;
}

stoke_err *stoke_generate(const stoke_run_opts *o, const char *checkpoint, const stoke_gen_opts *g,
                          int64_t *vocab_out) {
  gen G = {.s = {.opts = *o, .world = 1}};
  G.s.o = &G.s.opts;
  char *config = NULL; /* no INI: the run's config from the checkpoint */
  if (!o->ini_path) {
    STOKE_TRY(stoke_checkpoint_config(checkpoint, &config), "reading the run's config from the checkpoint");
    if (!config)
      return STOKE_ERR(STOKE_E_NOT_FOUND,
                       "checkpoint '%s' carries no run config (not written by stoke's train): give the run's INI "
                       "too, `generate RUN.INI CHECKPOINT`", checkpoint);
    G.s.opts.ini_path = checkpoint;
    G.s.opts.ini_text = config;
    o = &G.s.opts;
  }
  stoke_summary sum = {0};
  G.s.sum = &sum;
  run_signals_reset();
  stoke_err *e = gen_open(&G, o, checkpoint);
  if (!e) {
    run_signals_catch(&G.s.sg);
    e = gen_run(&G, g, vocab_out);
    run_signals_restore(&G.s.sg);
  }
  gen_close(&G);
  free(config);
  return e;
}
