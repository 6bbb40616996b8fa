/* tools/generate: text from a trained language model, as nanoGPT's
 * sample.py: `generate [RUN.INI] CHECKPOINT [options] [section.key=value ...]`.
 * The config is the run's (its model, its [data] for the window and the
 * vocabulary, its backends): the INI given, or the one the checkpoint
 * carries; no data is read. The prompt is tokenized as the data was:
 * bytes for vocab = 256, GPT-2's BPE for vocab 50257 (with its
 * encoder.json and vocab.bpe). Tokens are printed as they come. main()
 * decides the exit code; the library only returns errors. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/core.h"
#include "stoke/generate.h"
#include "tools/bpe.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: generate [RUN.INI] CHECKPOINT [options] [section.key=value ...]\n"
          "  the run's config from RUN.INI, or, without it, the one the checkpoint carries;\n"
          "  the training data need not be there (only its window and vocabulary are used)\n"
          "  --prompt TEXT        the text to continue (default: a newline)\n"
          "  --prompt-file FILE   the same, from a file\n"
          "  --tokens N           tokens to generate (default 256)\n"
          "  --temperature T      softmax temperature; 0: greedy (default 0.8)\n"
          "  --top-k K            draw among the K most likely tokens; 0: all (default 200)\n"
          "  --seed S             (default 1337)\n"
          "  --encoder FILE --vocab-bpe FILE\n"
          "                       GPT-2's tokenizer files, for a model of vocab 50257\n"
          "  --ids                print token ids, a line each, instead of text\n"
          "  --pad ID             the token after the text in the model's window (default 0); the model is\n"
          "                       causal, so any gives the same text (tests check that)\n"
          "Runs where the INI says ([run] backends, precision); overrides as train's.\n");
}

typedef struct out_ctx {
  const stoke_bpe *bpe;
  int ids;
  const char *prompt; /* printed before the first token: not at all when setting up fails */
  int started;
} out_ctx;

static int put_token(void *ctx, int32_t tok, const float *row, int64_t vocab) {
  (void)row;
  (void)vocab;
  out_ctx *o = ctx;
  if (!o->started++ && !o->ids) fputs(o->prompt, stdout);
  if (o->ids) {
    printf("%d\n", tok);
  } else if (o->bpe) {
    char b[256];
    fwrite(b, 1, stoke_bpe_decode(o->bpe, tok, b, sizeof b), stdout);
  } else {
    putchar(tok);
  }
  fflush(stdout);
  return 0;
}

static int fail(stoke_err *e) {
  fprintf(stderr, "stoke: error: %s\n", e->msg);
  stoke_err_free(e);
  return 1;
}

int main(int argc, char **argv) {
  const char *cwd = getenv("BUILD_WORKING_DIRECTORY"); /* `bazel run`: the user's paths */
  if (cwd && chdir(cwd) != 0) {
    fprintf(stderr, "stoke: error: cannot enter %s\n", cwd);
    return 1;
  }
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    usage(stdout);
    return 0;
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *prompt = "\n", *prompt_file = NULL, *encoder = NULL, *merges = NULL;
  stoke_gen_opts g = {.max_new = 256, .temperature = 0.8, .top_k = 200, .seed = 1337};
  out_ctx oc = {0};
  const char *overrides[256], *pos[2] = {NULL, NULL};
  int n_over = 0, n_pos = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    int takes = 1;
    errno = 0;
    if (!strcmp(a, "--prompt") && v) prompt = v;
    else if (!strcmp(a, "--prompt-file") && v) prompt_file = v;
    else if (!strcmp(a, "--encoder") && v) encoder = v;
    else if (!strcmp(a, "--vocab-bpe") && v) merges = v;
    else if (!strcmp(a, "--tokens") && v) g.max_new = strtoll(v, &end, 10);
    else if (!strcmp(a, "--temperature") && v) g.temperature = strtod(v, &end);
    else if (!strcmp(a, "--top-k") && v) g.top_k = strtoll(v, &end, 10);
    else if (!strcmp(a, "--seed") && v) g.seed = strtoull(v, &end, 10);
    else if (!strcmp(a, "--pad") && v) g.pad = (int32_t)strtol(v, &end, 10);
    else if (!strcmp(a, "--ids")) oc.ids = 1, takes = 0;
    else if (a[0] != '-' && strchr(a, '=') && access(a, F_OK) && n_over < 256) overrides[n_over++] = a, takes = 0;
    else if (a[0] != '-' && n_pos < 2) pos[n_pos++] = a, takes = 0; /* overrides may come before it, as train's */
    else {
      fprintf(stderr, "stoke: error: generate: unknown option or missing value: '%s'\n", a);
      usage(stderr);
      return 2;
    }
    /* out of range (ERANGE), not a number, or more new tokens than a buffer of them could hold */
    if (end && (*end || end == v || errno == ERANGE || g.max_new < 0 || g.max_new > 1000000000 ||
                !(g.temperature >= 0) || isinf(g.temperature) || g.top_k < 0)) {
      fprintf(stderr, "stoke: error: generate: %s wants a number >= 0%s, not '%s'\n", a,
              !strcmp(a, "--tokens") ? " and at most 1000000000" : "", v);
      return 2;
    }
    i += takes;
  }
  /* one file: the checkpoint, its own config; two: the INI, then the checkpoint */
  const char *ini = n_pos == 2 ? pos[0] : NULL, *checkpoint = n_pos == 2 ? pos[1] : pos[0];
  if (!checkpoint) {
    fprintf(stderr, "stoke: error: generate: no CHECKPOINT given (the .safetensors file a run saved)\n");
    usage(stderr);
    return 2;
  }
  if (prompt_file && strcmp(prompt, "\n")) {
    fprintf(stderr, "stoke: error: generate: --prompt and --prompt-file both given; give one\n");
    return 2;
  }
  char *text = NULL;
  size_t text_len = 0;
  stoke_err *re = prompt_file ? stoke_read_file(prompt_file, "--prompt-file", &text, &text_len) : NULL;
  if (re) {
    fprintf(stderr, "stoke: error: generate: %s\n", re->msg);
    stoke_err_free(re);
    return 1;
  }
  if (text) prompt = text;
  stoke_bpe *bpe = NULL;
  if (encoder || merges) {
    if (!encoder || !merges) {
      fprintf(stderr, "stoke: error: generate: give both --encoder and --vocab-bpe (GPT-2's encoder.json and "
                      "vocab.bpe)\n");
      return 2;
    }
    stoke_err *e = stoke_bpe_load(encoder, merges, &bpe);
    if (e) return fail(e);
  }
  /* the prompt as the data was tokenized (bytes without the files) */
  int32_t *ids = NULL;
  int64_t n = 0;
  stoke_err *e = stoke_bpe_encode(bpe, prompt, strlen(prompt), &ids, &n);
  oc.bpe = bpe;
  g.prompt = ids, g.n_prompt = n, g.on_token = put_token, g.ctx = &oc;
  g.tokenizer_vocab = bpe ? STOKE_BPE_VOCAB : 256;
  g.tokenizer = bpe ? "GPT-2's BPE" : "bytes; for GPT-2's BPE give --encoder encoder.json --vocab-bpe vocab.bpe";
  stoke_run_opts o = {.ini_path = ini, .overrides = overrides, .n_overrides = n_over, .quiet = 1};
  oc.prompt = prompt;
  if (!e) e = stoke_generate(&o, checkpoint, &g, NULL);
  if (!e && !oc.started && !oc.ids && g.max_new == 0) fputs(prompt, stdout); /* --tokens 0: the prompt, as it is */
  if ((oc.started || g.max_new == 0) && !oc.ids) putchar('\n');
  free(ids);
  free(text);
  stoke_bpe_free(bpe);
  return e ? fail(e) : 0;
}
