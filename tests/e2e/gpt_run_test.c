/* tests/e2e/gpt_run_test.c: a small GPT through stoke_train on the CPU.
 * run.recompute: the GPT trained with recompute = none, a pattern list and
 * auto (a tight run.memory_gb) gives the same losses, weights and summary
 * FLOPs; --dry-run (stoke_run_opts.dry_run) plans without training or a
 * run folder, and batch_size = auto finds a larger batch with recompute =
 * auto than without at the same memory; a bad pattern is a clear error.
 * Resume: a checkpoint of a larger GPT (a block more) is refused, as
 * PyTorch's strict load refuses it. Evaluation on a token shard: a batch
 * holding a window the source cannot read is left out of the loss.
 * Generation (stoke_generate) reads no data: with the training shard gone,
 * from the INI or from the checkpoint's own config, it gives the text it
 * gave with the shard there. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/common/log_capture.h"
#include "tests/common/slurp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sources/tokens/shard.h"
#include "stoke/core.h"
#include "stoke/generate.h"
#include "stoke/run.h"

static const char *dirs[] = {"backends/cpu", "sources/synthetic", "sources/tokens", "models/gpt"};
static char tmp[512], ini[600];

static const char *gpt_ini =
    "[run]\n"
    "backends = cpu\n"
    "steps = 6\n"
    "accumulate = 2\n"
    "seed = 5\n"
    "log_every = 1\n"
    "progress = off\n"
    "checkpoint = true\n"
    "\n"
    "[data]\n"
    "source = synthetic\n"
    "tokens = true\n"
    "shape = 17\n"
    "classes = 64\n"
    "length = 256\n"
    "batch_size = 4\n"
    "\n"
    "[model]\n"
    "name = gpt\n"
    "n_layer = 2\n"
    "n_head = 2\n"
    "n_embd = 32\n"
    "context = 16\n"
    "\n"
    "[optimizer]\n"
    "name = adamw\n"
    "lr = 1e-3\n";

static int setup(void **state) {
  snprintf(tmp, sizeof tmp, "%s/gpt_run_XXXXXX", getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp");
  if (!mkdtemp(tmp)) return -1;
  snprintf(ini, sizeof ini, "%s/gpt.ini", tmp);
  FILE *f = fopen(ini, "w");
  if (!f) return -1;
  fputs(gpt_ini, f);
  fclose(f);
  return 0;
}

static stoke_err *run(const char *out, int dry, const char **over, int n_over, stoke_summary *s) {
  const char *all[16];
  char out_dir[700];
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/%s", tmp, out);
  all[0] = out_dir;
  for (int i = 0; i < n_over; i++) all[i + 1] = over[i];
  stoke_run_opts o = {.ini_path = ini, .overrides = all, .n_overrides = n_over + 1, .plugin_dirs = dirs,
                      .n_plugin_dirs = (int)(sizeof dirs / sizeof *dirs), .quiet = 1, .dry_run = dry};
  return stoke_train(&o, s);
}

#define OK(expr)                                   \
  do {                                             \
    stoke_err *e_ = (expr);                        \
    if (e_) fail_msg("%s: %s", #expr, e_->msg);    \
  } while (0)

/* The tensors of two checkpoints (after their JSON headers, which carry
 * the config) are the same bytes. */
static void same_tensors(const char *a, const char *b) {
  char pa[700], pb[700];
  snprintf(pa, sizeof pa, "%s/%s/checkpoint.safetensors", tmp, a);
  snprintf(pb, sizeof pb, "%s/%s/checkpoint.safetensors", tmp, b);
  size_t na, nb;
  char *x = test_slurp(pa, &na), *y = test_slurp(pb, &nb);
  uint64_t ha = 0, hb = 0;
  memcpy(&ha, x, 8); /* little-endian header length */
  memcpy(&hb, y, 8);
  assert_true(8 + ha < na && 8 + hb < nb);
  assert_int_equal(na - ha, nb - hb);
  if (memcmp(x + 8 + ha, y + 8 + hb, na - 8 - ha))
    fail_msg("%s and %s differ: recomputation changed the trained weights", pa, pb);
  free(x);
  free(y);
}

static void test_same_training(void **state) {
  stoke_summary s0, s1, s2;
  OK(run("none", 0, (const char *[]){"run.recompute=none"}, 1, &s0));
  OK(run("attn", 0, (const char *[]){"run.recompute=h.*.attn, h.*.mlp"}, 1, &s1));
  OK(run("auto", 0, (const char *[]){"run.recompute=auto", "run.memory_gb=0.0001"}, 2, &s2));
  assert_memory_equal(&s0.final_loss, &s1.final_loss, sizeof(double));
  assert_memory_equal(&s0.final_loss, &s2.final_loss, sizeof(double));
  /* the model's FLOPs (MFU's), not the recomputed ones */
  assert_true(s0.flops_per_step == s1.flops_per_step && s0.flops_per_step == s2.flops_per_step);
  same_tensors("none", "attn");
  same_tensors("none", "auto");
  /* the plan report says what is recomputed */
  char path[700];
  snprintf(path, sizeof path, "%s/auto/plan.txt", tmp);
  size_t n;
  char *plan = test_slurp(path, &n);
  plan[n] = 0;
  assert_non_null(strstr(plan, "recompute (auto, budget"));
  assert_non_null(strstr(plan, "  segment transformer.h."));
  free(plan);
}

static void test_dry_run(void **state) {
  stoke_summary none, with;
  /* 3 MiB: a few sequences fit with everything kept, more with recomputation */
  OK(run("dry_none", 1, (const char *[]){"data.batch_size=auto", "run.memory_gb=0.003"}, 2, &none));
  OK(run("dry_auto", 1, (const char *[]){"data.batch_size=auto", "run.memory_gb=0.003", "run.recompute=auto"}, 3,
         &with));
  print_message("batch_size = auto with 3 MiB: %lld without recomputation (%.0f bytes), %lld with (%.0f bytes, "
                "+%.3g FLOPs)\n",
                (long long)none.dry_batch, none.dry_plan_bytes, (long long)with.dry_batch, with.dry_plan_bytes,
                with.dry_recompute_flops);
  assert_true(none.dry_batch >= 8);
  assert_true(with.dry_batch > none.dry_batch);
  assert_true(with.dry_plan_bytes <= 0.85 * 0.003 * 1073741824.0);
  assert_true(with.dry_recompute_flops > 0);
  assert_int_equal(none.steps, 0);
  /* nothing trained, no run folder */
  char path[700];
  struct stat st;
  snprintf(path, sizeof path, "%s/dry_auto", tmp);
  assert_int_not_equal(stat(path, &st), 0);
}

static void test_bad_pattern(void **state) {
  stoke_summary s;
  stoke_err *e = run("bad", 1, (const char *[]){"run.recompute=h.*.atn"}, 1, &s);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "'h.*.atn' matches no forward node"));
  stoke_err_free(e);
}

/* A checkpoint of the 2-block GPT resumed by a 1-block one: every tensor
 * the smaller model needs is there with its shape, but the file has a
 * block more. Refused, naming the first tensor the model lacks. */
static void test_larger_model_refused(void **state) {
  stoke_summary s;
  OK(run("larger", 0, (const char *[]){"run.recompute=none"}, 1, &s));
  char resume[700];
  snprintf(resume, sizeof resume, "run.resume=%s", s.checkpoint);
  stoke_err *e = run("larger", 0, (const char *[]){resume, "run.steps=10", "model.n_layer=1"}, 3, &s);
  if (!e) fail_msg("a 2-block checkpoint was loaded into a 1-block model");
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "this model does not have"));
  assert_non_null(strstr(e->msg, "transformer.h.1."));
  stoke_err_free(e);
}

/* A shard of n tokens, i % 64 at position i, but token 100 (outside the
 * vocabulary of 64) at position `bad` (none when negative). */
static void write_tokens(const char *path, int64_t n, int64_t bad) {
  unsigned char h[STOKE_SHARD_HEADER_BYTES];
  stoke_shard_header(h, n);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(h, 1, sizeof h, f), sizeof h);
  for (int64_t i = 0; i < n; i++) {
    uint16_t t = i == bad ? 100 : (uint16_t)(i % 64);
    unsigned char b[2] = {(unsigned char)t, (unsigned char)(t >> 8)};
    assert_int_equal(fwrite(b, 1, 2, f), 2);
  }
  fclose(f);
}

/* [eval_data] on a shard with one token outside the vocabulary: the loader
 * marks that window unreadable (zeros, label -1), and the evaluation leaves
 * its whole batch out of the loss (and says so in log.txt) rather than
 * scoring the zeros as text: a batch fewer than on the clean shard. */
static void test_eval_leaves_out_unreadable(void **state) {
  char clean[700], bad[700], over[760], log[760];
  snprintf(clean, sizeof clean, "%s/clean.bin", tmp);
  snprintf(bad, sizeof bad, "%s/bad.bin", tmp);
  write_tokens(clean, 2048, -1);
  write_tokens(bad, 2048, 1000);
  stoke_summary s[2];
  for (int k = 0; k < 2; k++) {
    snprintf(over, sizeof over, "eval_data.path=%s", k ? bad : clean);
    const char *o[] = {"eval_data.source=tokens", over, "eval_data.seq_len=16", "eval_data.vocab=64",
                       "eval_data.order=sequential", "eval_data.batch_size=4", "run.eval_every=0",
                       "run.recompute=none"};
    OK(run(k ? "eval_bad" : "eval_clean", 0, o, 8, &s[k]));
  }
  print_message("eval: clean shard %lld sequences, loss %.4f; with one bad token %lld, loss %.4f\n",
                (long long)s[0].eval_samples, s[0].eval_loss, (long long)s[1].eval_samples, s[1].eval_loss);
  assert_true(s[0].eval_samples > 0 && isfinite(s[1].eval_loss));
  assert_true(s[1].eval_samples < s[0].eval_samples);
  assert_int_equal((s[0].eval_samples - s[1].eval_samples) % 4, 0);
  snprintf(log, sizeof log, "%s/eval_bad/log.txt", tmp);
  size_t n;
  char *text = test_slurp(log, &n);
  assert_non_null(strstr(text, "left out of the evaluation loss"));
  free(text);
}

typedef struct gen_out {
  int32_t tok[32];
  int n;
} gen_out;

static int keep_token(void *ctx, int32_t token, const float *row, int64_t vocab) {
  gen_out *g = ctx;
  if (g->n < 32) g->tok[g->n++] = token;
  return 0;
}

/* 24 tokens at temperature 1 from `checkpoint`, the config from `ini_path`
 * (NULL: the checkpoint's own). */
static const char *gen_override; /* one section.key=value for generate(), or NULL */

static stoke_err *generate(const char *ini_path, const char *checkpoint, gen_out *out) {
  static const int32_t prompt[] = {1, 2, 3};
  stoke_gen_opts g = {.prompt = prompt, .n_prompt = 3, .max_new = 24, .temperature = 1, .seed = 11,
                      .on_token = keep_token, .ctx = out};
  stoke_run_opts o = {.ini_path = ini_path, .overrides = &gen_override, .n_overrides = gen_override != NULL,
                      .plugin_dirs = dirs, .n_plugin_dirs = (int)(sizeof dirs / sizeof *dirs), .quiet = 1};
  out->n = 0;
  return stoke_generate(&o, checkpoint, &g, NULL);
}

typedef struct gen_ctx {
  const char *ini, *ckpt;
  stoke_err *e;
} gen_ctx;
static void generate_logged(void *ctx) {
  gen_ctx *g = ctx;
  gen_out out;
  g->e = generate(g->ini, g->ckpt, &out);
}

typedef struct train_call {
  const stoke_run_opts *o;
  stoke_err *e;
} train_call;
static void train_logged(void *ctx) {
  train_call *t = ctx;
  stoke_summary sum;
  t->e = stoke_train(t->o, &sum);
}

static void test_generate_without_data(void **state) {
  char shard[700], tini[700], ck[760], over[760];
  snprintf(shard, sizeof shard, "%s/gen_train.bin", tmp);
  snprintf(tini, sizeof tini, "%s/gen.ini", tmp);
  write_tokens(shard, 4096, -1);
  FILE *f = fopen(tini, "w");
  assert_non_null(f);
  fprintf(f, "[run]\nbackends = cpu\nsteps = 4\nseed = 5\nprogress = off\n\n[data]\nsource = tokens\npath = %s\n"
             "seq_len = 16\nvocab = 64\nbatch_size = 4\n\n[model]\nname = gpt\nn_layer = 1\nn_head = 2\n"
             "n_embd = 32\ncontext = 16\n\n[optimizer]\nname = adamw\nlr = 1e-3\n", shard);
  fclose(f);
  snprintf(over, sizeof over, "run.out_dir=%s/gen_run", tmp);
  char eval_path[760];
  snprintf(eval_path, sizeof eval_path, "eval_data.path=%s", shard);
  const char *ov[] = {over, "eval_data.source=tokens", eval_path, "eval_data.seq_len=16", "eval_data.vocab=64",
                      "eval_data.order=sequential", "eval_data.batch_size=4"};
  stoke_run_opts o = {.ini_path = tini, .overrides = ov, .n_overrides = 7, .plugin_dirs = dirs,
                      .n_plugin_dirs = (int)(sizeof dirs / sizeof *dirs), .quiet = 1};
  /* [eval_data] on [data]'s own shard: said (the evaluation scores the training text) */
  train_call t = {&o, NULL};
  char *log = test_log_of(train_logged, &t);
  OK(t.e);
  if (!strstr(log, "is [data]'s too: the evaluation scores the training data")) fail_msg("not said: %s", log);
  free(log);
  snprintf(ck, sizeof ck, "%s/gen_run/checkpoint.safetensors", tmp);
  gen_out with_data, no_data, own_config;
  OK(generate(tini, ck, &with_data));
  assert_int_equal(unlink(shard), 0);
  OK(generate(tini, ck, &no_data));
  OK(generate(NULL, ck, &own_config));
  assert_int_equal(with_data.n, 24);
  assert_memory_equal(with_data.tok, no_data.tok, sizeof with_data.tok[0] * 24);
  assert_memory_equal(with_data.tok, own_config.tok, sizeof with_data.tok[0] * 24);
  /* an INI whose [model] differs from the checkpoint's run with the same shapes (n_head): said */
  gen_ctx gc = {tini, ck, NULL};
  gen_override = "model.n_head=1";
  char *glog = test_log_of(generate_logged, &gc);
  gen_override = NULL;
  OK(gc.e);
  if (!strstr(glog, "with [model] n_head = 1 (its run had 2): the weights load (the shapes agree), but as another model"))
    fail_msg("not said: %s", glog);
  free(glog);
  /* a safetensors file another program wrote carries no config: the INI is asked for */
  char bare[700];
  snprintf(bare, sizeof bare, "%s/bare.safetensors", tmp);
  const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  uint64_t hl = strlen(h);
  f = fopen(bare, "wb");
  assert_non_null(f);
  fwrite(&hl, 8, 1, f); /* little-endian, as this machine */
  fwrite(h, 1, hl, f);
  fwrite("\0\0\0\0", 1, 4, f);
  fclose(f);
  stoke_err *e = generate(NULL, bare, &no_data);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "carries no run config"));
  assert_non_null(strstr(e->msg, "generate RUN.INI CHECKPOINT"));
  stoke_err_free(e);
  e = generate(NULL, tini, &no_data); /* an INI where the checkpoint goes */
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "is not a checkpoint (a safetensors file): it starts with text, as an INI file does"));
  stoke_err_free(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_training),
      cmocka_unit_test(test_dry_run),
      cmocka_unit_test(test_bad_pattern),
      cmocka_unit_test(test_larger_model_refused),
      cmocka_unit_test(test_eval_leaves_out_unreadable),
      cmocka_unit_test(test_generate_without_data),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
