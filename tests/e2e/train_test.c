/* tests/e2e/train_test.c: whole runs through stoke_train as `train` does
 * them: an MLP learns learnable synthetic data on the CPU backend (plain,
 * with gradient accumulation, with the swish plugin's activation, with
 * AdamW); two runs with one seed give identical losses; and the messages
 * a new user meets (typo in a key, unknown backend, bad precision). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/common/slurp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stoke/checkpoint.h"
#include "stoke/core.h"
#include "stoke/run.h"

static const char *dirs[] = {"backends/cpu", "sources/synthetic", "models/mlp", "plugins/swish", "backends/cuda",
                             "plugins/lion", "plugins/bf16_fp32norm", "tests/e2e", "tests/plugins/dies"};
static char tmp[512];

static const char *base_ini =
    "[run]\n"
    "backends = cpu\n"
    "steps = 150\n"
    "seed = 3\n"
    "log_every = 25\n"
    "progress = off\n"
    "\n"
    "[data]\n"
    "source = synthetic\n"
    "shape = 32\n"
    "classes = 4\n"
    "length = 8192\n"
    "batch_size = 64\n"
    "\n"
    "[model]\n"
    "name = mlp\n"
    "hidden = 64, 64\n"
    "\n"
    "[optimizer]\n"
    "name = sgd\n"
    "lr = 0.05\n"
    "momentun = 0.9\n";

/* Write `text` (with the deliberate typo fixed unless `keep_typo`). */
static const char *write_ini(const char *name, const char *text) {
  static char path[600];
  snprintf(path, sizeof path, "%s/%s", tmp, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static const char *out_sub = "out";

/* Every run starts over in the same out_dir (run.overwrite: its last
 * checkpoint is this test's own). */
static stoke_err *run(const char *ini, const char **over, int n_over, stoke_summary *s) {
  const char *all[17];
  char out_dir[700];
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/%s", tmp, out_sub);
  all[0] = out_dir;
  all[1] = "run.overwrite=true";
  int n = 2;
  for (int i = 0; i < n_over && n < 17; i++) all[n++] = over[i];
  stoke_run_opts o = {.ini_path = ini, .overrides = all, .n_overrides = n, .plugin_dirs = dirs,
                      .n_plugin_dirs = (int)(sizeof dirs / sizeof *dirs), .quiet = 1};
  return stoke_train(&o, s);
}

/* base_ini with the typo fixed, or, when `over` picks another optimizer
 * than sgd, without the momentum line (a key of sgd's only). */
static stoke_err *train(const char **over, int n_over, stoke_summary *s) {
  static char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  char *typo = strstr(fixed, "momentun");
  memcpy(typo, "momentum", 8);
  for (int i = 0; i < n_over; i++)
    if (!strncmp(over[i], "optimizer.name=", 15) && strcmp(over[i] + 15, "sgd")) *typo = 0;
  return run(write_ini("ok.ini", fixed), over, n_over, s);
}

static void train_ok(const char **over, int n_over, stoke_summary *s) {
  stoke_err *e = train(over, n_over, s);
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    fail();
  }
}

/* train_ok with the results in <tmp>/<sub>. */
static void train_in(const char *sub, const char **over, int n_over, stoke_summary *s) {
  out_sub = sub;
  train_ok(over, n_over, s);
  out_sub = "out";
}

/* train_in, resumed from `from`'s checkpoint (run.resume added to `over`). */
static void resume_in(const char *sub, const stoke_summary *from, const char **over, int n_over, stoke_summary *s) {
  const char *all[16];
  char resume[700];
  snprintf(resume, sizeof resume, "run.resume=%s", from->checkpoint);
  for (int i = 0; i < n_over && i < 15; i++) all[i] = over[i];
  all[n_over < 15 ? n_over : 15] = resume;
  train_in(sub, all, (n_over < 15 ? n_over : 15) + 1, s);
}

static void test_mlp_learns(void **state) {
  stoke_summary s;
  train_ok(NULL, 0, &s);
  print_message("sgd: loss %.4f -> %.4f, %.0f samples/s\n", s.first_loss, s.final_loss, s.samples_per_s);
  assert_int_equal(s.steps, 150);
  assert_true(s.first_loss > 1.2);   /* ~ln 4 at the start */
  assert_true(s.final_loss < 0.45);  /* learned */
  assert_true(s.samples_per_s > 0 && s.step_ms_p50 > 0 && s.step_ms_p95 >= s.step_ms_p50);
}

static void test_accumulate_and_adamw(void **state) {
  stoke_summary s;
  const char *acc[] = {"run.accumulate=2", "data.batch_size=32"};
  train_ok(acc, 2, &s);
  print_message("accumulate 2: loss %.4f -> %.4f\n", s.first_loss, s.final_loss);
  assert_true(s.final_loss < 0.45);
  assert_int_equal(s.samples, 150 * 64);
  const char *adamw[] = {"optimizer.name=adamw", "optimizer.lr=0.002", "optimizer.weight_decay=0.01"};
  train_ok(adamw, 3, &s);
  print_message("adamw: loss %.4f -> %.4f\n", s.first_loss, s.final_loss);
  assert_true(s.final_loss < 0.45);
}

/* AdamW as GPT-2 trains: betas (0.9, 0.95), weight decay 0.1 on matrices
 * only, gradients clipped to norm 1 on the device; and an optimizer from a
 * plugin (plugins/lion), loaded by its name. */
static void test_gpt_adamw_and_lion_plugin(void **state) {
  stoke_summary s;
  const char *gpt[] = {"optimizer.name=adamw", "optimizer.lr=0.002", "optimizer.beta2=0.95",
                       "optimizer.weight_decay=0.1", "optimizer.weight_decay_1d=false", "optimizer.grad_clip=1.0"};
  train_ok(gpt, 6, &s);
  print_message("adamw (GPT-2 groups, clip 1): loss %.4f -> %.4f\n", s.first_loss, s.final_loss);
  assert_true(s.final_loss < 0.45);
  const char *lion[] = {"optimizer.name=lion", "optimizer.lr=0.001", "optimizer.weight_decay=0.1"};
  train_ok(lion, 3, &s);
  print_message("lion (plugin): loss %.4f -> %.4f\n", s.first_loss, s.final_loss);
  assert_true(s.final_loss < 0.45);
}

static void test_swish_plugin(void **state) {
  stoke_summary s;
  const char *sw[] = {"plugins.load=swish", "model.activation=swish"};
  train_ok(sw, 2, &s);
  print_message("swish: loss %.4f -> %.4f\n", s.first_loss, s.final_loss);
  assert_true(s.final_loss < 0.45);
}

static void test_deterministic(void **state) {
  stoke_summary a, b;
  const char *o[] = {"run.steps=40"};
  train_ok(o, 1, &a);
  train_ok(o, 1, &b);
  assert_memory_equal(&a.final_loss, &b.final_loss, sizeof(double));
  const char *o2[] = {"run.steps=40", "run.seed=4"};
  train_ok(o2, 2, &b);
  assert_true(a.final_loss != b.final_loss);
}

/* The cpu device cannot capture graphs: cuda_graph = true warns and the
 * run is the eager one, bit for bit; no GPU operations are counted. */
static void test_cuda_graph_on_cpu(void **state) {
  stoke_summary a, b;
  const char *o[] = {"run.steps=20"};
  const char *g[] = {"run.steps=20", "run.cuda_graph=true"};
  train_ok(o, 1, &a);
  train_ok(g, 2, &b);
  assert_memory_equal(&a.final_loss, &b.final_loss, sizeof(double));
  assert_int_equal(b.gpu_ops_per_step, 0);
  assert_int_equal(b.launches_per_step, 0);
}

/* `text` with `over` fails, its message holding each of `says` (NULL-ended). */
static void refused(const char *text, const char **over, int n_over, const char *const *says) {
  stoke_summary s;
  stoke_err *e = run(write_ini("refused.ini", text), over, n_over, &s);
  if (!e) fail_msg("the run succeeded; expected an error saying '%s'", says[0]);
  print_message("%s\n", e->msg);
  for (int i = 0; says[i]; i++)
    if (!strstr(e->msg, says[i])) fail_msg("the error lacks '%s'", says[i]);
  stoke_err_free(e);
}

static void test_messages(void **state) {
  stoke_summary s;
  /* a typo in a key: line number and suggestion */
  stoke_err *e = run(write_ini("typo.ini", base_ini), NULL, 0, &s);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "typo.ini:22: [optimizer] unknown key 'momentun' (did you mean 'momentum'?)"));
  stoke_err_free(e);
  /* a backend that does not exist: the ones that do are listed (every plugin on the path loaded to see,
   * each in a child process: tests/plugins/dies ends the process that loads it) */
  const char *bad[] = {"optimizer.momentun=", "run.backends=cdua"};
  char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  memcpy(strstr(fixed, "momentun"), "momentum", 8);
  e = run(write_ini("backend.ini", fixed), bad + 1, 1, &s);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "unknown backend 'cdua'"));
  assert_non_null(strstr(e->msg, "backends available: cpu"));
  assert_non_null(strstr(e->msg, "libstoke_cdua.so"));
  stoke_err_free(e);
  /* the same with the dying plugin ending the process with exit code 0: the probe's child must still be seen to
   * die (it once took code 0 for "loaded", loaded the library here and this test process ended) */
  setenv("STOKE_TEST_DIES_CODE", "0", 1);
  refused(fixed, bad + 1, 1, (const char *[]){"unknown backend 'cdua'", "backends available: cpu", NULL});
  unsetenv("STOKE_TEST_DIES_CODE");
  /* a precision the CPU cannot run */
  const char *bf[] = {"run.precision=bf16"};
  e = run(write_ini("prec.ini", fixed), bf, 1, &s);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "precision = bf16 needs a GPU backend"));
  stoke_err_free(e);
  /* an unknown model */
  const char *m[] = {"model.name=resnet9000"};
  e = run(write_ini("model.ini", fixed), m, 1, &s);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "unknown model 'resnet9000'; models available: mlp"));
  stoke_err_free(e);
  /* an engine named base_variant lives in libstoke_base.so (cudnn_classic): when that file is there but does not
   * load, its own error is the one to see, not only "no libstoke_base_variant.so" */
  char junk_dir[700], junk[760], path_over[800];
  snprintf(junk_dir, sizeof junk_dir, "%s/junkplug", tmp);
  mkdir(junk_dir, 0755);
  snprintf(junk, sizeof junk, "%s/libstoke_zzz.so", junk_dir);
  FILE *jf = fopen(junk, "w");
  assert_non_null(jf);
  fputs("not an ELF file", jf);
  fclose(jf);
  snprintf(path_over, sizeof path_over, "plugins.path=%s", junk_dir);
  refused(fixed, (const char *[]){path_over, "run.backends=zzz_fast"}, 2,
          (const char *[]){"unknown backend 'zzz_fast'", "libstoke_zzz.so, which would hold 'zzz_fast', did not load",
                           NULL});
  /* a typo in [plugins] is said before the plugins are looked for (it used to read "plugin 'myspir' not found,
   * add a folder with [plugins] path = ...", the typo never named) */
  char typo_plugins[2400];
  snprintf(typo_plugins, sizeof typo_plugins, "%s\n[plugins]\npaht = somewhere\nload = myspir\n", fixed);
  refused(typo_plugins, NULL, 0, (const char *[]){"[plugins] unknown key 'paht' (did you mean 'path'?)", NULL});
  /* drop_last = false: the fixed batch cannot train a short one (its tail would be the last batch's rows) */
  refused(fixed, (const char *[]){"data.drop_last=false"}, 1,
          (const char *[]){"[data] drop_last = false is not supported for training", NULL});
  /* an empty tensorboard folder (the folder code read past the path's end) */
  refused(fixed, (const char *[]){"run.tensorboard="}, 1, (const char *[]){"[run] tensorboard is empty", NULL});
  /* an out_dir so long that rank N's folder (<out_dir>/rankN) or a file in it would be cut short */
  static char long_dir[1200];
  snprintf(long_dir, sizeof long_dir, "run.out_dir=%s/%0900d", tmp, 7);
  refused(fixed, (const char *[]){long_dir}, 1, (const char *[]){"[run] out_dir", "too long", NULL});
  /* nanoGPT's names: stoke's key, and how its unit differs */
  refused(fixed, (const char *[]){"run.eval_interval=250"}, 1,
          (const char *[]){"[run] unknown key 'eval_interval': stoke's is [run] eval_every (in epochs, not steps)", NULL});
  refused(fixed, (const char *[]){"optimizer.warmup_iters=100"}, 1,
          (const char *[]){"stoke's is [optimizer] warmup_epochs (in epochs, not steps: warmup_iters / steps per epoch)",
                           NULL});
  /* a run name longer than the run's own copy of it (it was cut short without a word) */
  static char long_name[400];
  snprintf(long_name, sizeof long_name, "run.name=%0300d", 7);
  refused(fixed, (const char *[]){long_name}, 1,
          (const char *[]){"command line: [run] name is 300 characters long, at most 255", NULL});
  /* nothing to train (it ran one step) */
  refused(fixed, (const char *[]){"run.steps=0", "run.epochs=0"}, 2,
          (const char *[]){"command line: [run] steps = 0 and epochs = 0: nothing to train", NULL});
}

/* No GPU (this machine, CI): a GPU backend with device = gpu is a clear
 * error; device = auto falls back to the cpu backend and trains. */
static void test_no_gpu(void **state) {
  if (getenv("STOKE_TEST_HAS_GPU")) skip();
  stoke_summary s;
  const char *gpu[] = {"run.backends=cuda", "run.device=gpu", "run.precision=bf16"};
  char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  memcpy(strstr(fixed, "momentun"), "momentum", 8);
  stoke_err *e = run(write_ini("gpu.ini", fixed), gpu, 3, &s);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "no CUDA GPU is available"));
  assert_non_null(strstr(e->msg, "backends = cpu"));
  stoke_err_free(e);
  const char *autod[] = {"run.backends=cuda", "run.device=auto", "run.precision=bf16"};
  train_ok(autod, 3, &s);
  assert_true(s.final_loss < 0.45);
  /* config.ini (and the checkpoint's copy) say what ran: the cpu backend in fp32, not the GPU run asked for */
  char path[800];
  snprintf(path, sizeof path, "%s/out/config.ini", tmp);
  size_t n;
  char *text = test_slurp(path, &n);
  if (!text || !strstr(text, "\nbackends = cpu\n") || !strstr(text, "\nprecision = fp32\n"))
    fail_msg("config.ini says another run: %s", text ? text : "(none)");
  free(text);
}

/* [run] device against [run] backends, with or without a GPU: device = gpu
 * with backends that run on the CPU is an error naming the key (it was
 * ignored: a CPU run where a GPU was asked for); device = cpu trains on the
 * cpu backend whatever backends lists. */
static void test_device_choice(void **state) {
  stoke_summary s;
  char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  memcpy(strstr(fixed, "momentun"), "momentum", 8);
  const char *gpu_on_cpu[] = {"run.backends=cpu", "run.device=gpu"};
  stoke_err *e = run(write_ini("device.ini", fixed), gpu_on_cpu, 2, &s);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  if (!strstr(e->msg, "[run] device = gpu, but [run] backends run on the CPU (device backend 'cpu')"))
    fail_msg("unexpected: %s", e->msg);
  stoke_err_free(e);
  const char *cpu_wanted[] = {"run.backends=cuda", "run.device=cpu"};
  train_ok(cpu_wanted, 2, &s);
  assert_true(s.final_loss < 0.45);
}

/* batch_size = auto picks a power of two that fits; a bad value is named. */
static void test_batch_auto(void **state) {
  stoke_summary s;
  const char *o[] = {"data.batch_size=auto", "run.steps=3", "data.length=2048"};
  train_ok(o, 3, &s);
  int64_t per_step = s.samples / 3;
  print_message("batch_size = auto chose %lld\n", (long long)per_step);
  assert_true(per_step >= 8 && (per_step & (per_step - 1)) == 0);
  assert_true(per_step <= 2048);
  const char *bad[] = {"data.batch_size=12x"};
  char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  memcpy(strstr(fixed, "momentun"), "momentum", 8);
  stoke_err *e = run(write_ini("batch.ini", fixed), bad, 1, &s);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "[data] batch_size = '12x': a number of samples"));
  stoke_err_free(e);
}

/* Precision policies as plugins, selected by name from the INI: the CPU
 * ones of tests/e2e/test_policies.c (built from the SDK alone) and the
 * example plugins/bf16_fp32norm. A loss scale that is a power of two is
 * exact in f32, so static and dynamic scaling end where the unscaled run
 * does, bit for bit (AdamW: the scaler's path through the update, the bias
 * corrections included); f64 with f32 islands and an f64 master copy
 * train; bf16 asks for a GPU. */
static void test_precision_plugins(void **state) {
  stoke_summary plain, s;
  const char *base[] = {"optimizer.name=adamw", "optimizer.lr=0.002", "plugins.load=test_policies", "run.precision=fp32"};
  train_ok(base, 4, &plain);
  static const char *same[] = {"run.precision=test_fp32_static", "run.precision=test_fp32_dynamic"};
  for (int i = 0; i < 2; i++) {
    base[3] = same[i];
    train_ok(base, 4, &s);
    print_message("%s: loss %.9g -> %.9g (unscaled %.9g -> %.9g)\n", same[i], s.first_loss, s.final_loss,
                  plain.first_loss, plain.final_loss);
    assert_true(s.first_loss == plain.first_loss && s.final_loss == plain.final_loss);
  }
  static const char *learn[] = {"run.precision=test_f64_f32islands", "run.precision=test_fp32_master64"};
  for (int i = 0; i < 2; i++) {
    base[3] = learn[i];
    train_ok(base, 4, &s);
    print_message("%s: loss %.4f -> %.4f\n", learn[i], s.first_loss, s.final_loss);
    assert_true(s.final_loss < 0.45);
  }
  /* the f64 master copy is what the checkpoint holds */
  char ckpt[700];
  snprintf(ckpt, sizeof ckpt, "%s/%s/checkpoint.safetensors", tmp, out_sub);
  stoke_st_file f;
  stoke_err *e = stoke_st_read(ckpt, &f);
  if (e) fail_msg("%s", e->msg);
  const stoke_st_tensor *t = stoke_st_find(&f, "optimizer.layers.0.weight.master");
  assert_non_null(t);
  assert_string_equal(t->dtype, "F64");
  assert_string_equal(stoke_st_find(&f, "layers.0.weight")->dtype, "F32");
  stoke_st_free(&f);
  /* the example plugin is found by its name; the cpu backend cannot run bf16 */
  static char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  memcpy(strstr(fixed, "momentun"), "momentum", 8);
  const char *bf16[] = {"run.precision=bf16_fp32norm", "run.device=cpu"};
  e = run(write_ini("bf16.ini", fixed), bf16, 2, &s);
  assert_non_null(e);
  if (!strstr(e->msg, "precision = bf16_fp32norm needs a GPU backend (bf16 parameters)"))
    fail_msg("unexpected: %s", e->msg);
  stoke_err_free(e);
}

/* Evaluation on a held-out part of the same synthetic task. */
static void test_eval(void **state) {
  stoke_summary s;
  const char *o[] = {"eval_data.source=synthetic", "eval_data.shape=32", "eval_data.classes=4",
                     "eval_data.length=1000", "eval_data.offset=100000", "run.eval_every=0.5"};
  train_ok(o, 6, &s);
  print_message("eval: loss %.4f, accuracy %.4f\n", s.eval_loss, s.eval_accuracy);
  assert_true(s.eval_accuracy > 0.85); /* 4 classes: chance is 0.25 */
  assert_true(s.eval_loss < 0.5);
}

/* Evaluation over 10,000 classes (GPT-2's vocabulary is 50,304): a model
 * that has not learned anything (lr 0) scores about ln 10000 = 9.21; labels
 * and winners past class 4096 count (an earlier evaluation kept 4096 logits
 * per row and read past them). */
static void test_eval_many_classes(void **state) {
  stoke_summary s;
  const char *o[] = {"data.classes=10000",          "model.hidden=16",          "optimizer.lr=0",
                     "run.steps=1",                 "eval_data.source=synthetic", "eval_data.shape=32",
                     "eval_data.classes=10000",     "eval_data.length=512",     "eval_data.offset=100000",
                     "run.checkpoint=false"};
  train_ok(o, 10, &s);
  print_message("eval over 10000 classes: loss %.4f (ln 10000 = %.4f), accuracy %.4f\n", s.eval_loss, log(10000.0),
                s.eval_accuracy);
  assert_true(fabs(s.eval_loss - log(10000.0)) < 0.02 * log(10000.0));
  assert_true(s.eval_accuracy < 0.01);
}

/* Compare every tensor of two checkpoints bit for bit. */
static void same_tensors(const char *a, const char *b) {
  stoke_st_file fa, fb;
  stoke_err *e = stoke_st_read(a, &fa);
  if (!e) e = stoke_st_read(b, &fb);
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(fa.n_tensors, fb.n_tensors);
  for (int i = 0; i < fa.n_tensors; i++) {
    const stoke_st_tensor *ta = &fa.tensors[i], *tb = stoke_st_find(&fb, ta->name);
    assert_non_null(tb);
    assert_int_equal(ta->end - ta->begin, tb->end - tb->begin);
    if (memcmp(fa.data + ta->begin, fb.data + tb->begin, ta->end - ta->begin))
      fail_msg("tensor '%s' differs", ta->name);
  }
  stoke_st_free(&fa);
  stoke_st_free(&fb);
}

/* Resume: 20 steps, then 20 more from the checkpoint, equals 40 straight,
 * to the bit, in the loss and in every tensor of the final checkpoint. */
static void test_resume_equals_uninterrupted(void **state) {
  stoke_summary full, half, rest;
  const char *o40[] = {"run.steps=40", "optimizer.name=adamw", "optimizer.lr=0.003", "model.activation=relu",
                       "run.deterministic=true"};
  out_sub = "full";
  train_ok(o40, 5, &full);
  const char *o20[] = {"run.steps=20", "optimizer.name=adamw", "optimizer.lr=0.003", "model.activation=relu",
                       "run.deterministic=true"};
  out_sub = "half";
  train_ok(o20, 5, &half);
  char resume[700];
  snprintf(resume, sizeof resume, "run.resume=%s", half.checkpoint);
  const char *o_rest[] = {"run.steps=40", "optimizer.name=adamw", "optimizer.lr=0.003", "model.activation=relu",
                          "run.deterministic=true", resume};
  out_sub = "rest";
  train_ok(o_rest, 6, &rest);
  out_sub = "out";
  print_message("loss at 40: straight %.9g, resumed %.9g\n", full.final_loss, rest.final_loss);
  assert_int_equal(rest.steps, 40);
  assert_memory_equal(&full.final_loss, &rest.final_loss, sizeof(double));
  same_tensors(full.checkpoint, rest.checkpoint);
  /* and two straight runs give the same checkpoint */
  stoke_summary again;
  out_sub = "again";
  train_ok(o40, 5, &again);
  out_sub = "out";
  same_tensors(full.checkpoint, again.checkpoint);
  /* resumed into a wider model (hidden 96, 64 for 64, 64): the error gives both shapes, as PyTorch's
   * load_state_dict does */
  const char *wider[] = {"run.steps=40", "optimizer.name=adamw", "model.hidden=96,64", resume};
  out_sub = "wider";
  stoke_err *e = train(wider, 4, &again);
  out_sub = "out";
  if (!e) fail_msg("a checkpoint of hidden 32 resumed into hidden 64");
  print_message("%s\n", e->msg);
  if (!strstr(e->msg, "tensor 'layers.0.weight' is F32 [64, ") || !strstr(e->msg, "the model needs F32 [96, "))
    fail_msg("the error does not give both shapes: %s", e->msg);
  stoke_err_free(e);
}

/* The dynamic loss scaler resumes where it was: its scale and its count of
 * clean steps since the last change (test_fp32_dynamic doubles the scale
 * every 4 clean steps). 6 steps, then 3 more from the checkpoint, leave
 * the scale the 9 straight steps leave (doubled at steps 4 and 8); a count
 * restarted at the resume would double it at step 10 instead. */
static void test_resume_keeps_scaler(void **state) {
  stoke_summary full, half, rest;
  const char *o9[] = {"run.steps=9", "optimizer.name=adamw", "optimizer.lr=0.003", "plugins.load=test_policies",
                      "run.precision=test_fp32_dynamic", "run.deterministic=true"};
  out_sub = "sc_full";
  train_ok(o9, 6, &full);
  const char *o6[] = {"run.steps=6", "optimizer.name=adamw", "optimizer.lr=0.003", "plugins.load=test_policies",
                      "run.precision=test_fp32_dynamic", "run.deterministic=true"};
  out_sub = "sc_half";
  train_ok(o6, 6, &half);
  char resume[700];
  snprintf(resume, sizeof resume, "run.resume=%s", half.checkpoint);
  const char *o_rest[] = {"run.steps=9", "optimizer.name=adamw", "optimizer.lr=0.003", "plugins.load=test_policies",
                          "run.precision=test_fp32_dynamic", "run.deterministic=true", resume};
  out_sub = "sc_rest";
  train_ok(o_rest, 7, &rest);
  out_sub = "out";
  stoke_ckpt_meta a, b, h;
  stoke_err *e = stoke_checkpoint_read_meta(full.checkpoint, &a);
  if (!e) e = stoke_checkpoint_read_meta(rest.checkpoint, &b);
  if (!e) e = stoke_checkpoint_read_meta(half.checkpoint, &h);
  if (e) fail_msg("%s", e->msg);
  print_message("loss scale at 6: %g (%lld clean steps); at 9: straight %g (%lld), resumed %g (%lld)\n", h.loss_scale,
                (long long)h.loss_scale_good_steps, a.loss_scale, (long long)a.loss_scale_good_steps, b.loss_scale,
                (long long)b.loss_scale_good_steps);
  assert_true(h.loss_scale_good_steps == 2 && a.loss_scale_good_steps == 1);
  assert_true(a.loss_scale == b.loss_scale && a.loss_scale == 4 * (double)(1 << 20));
  assert_int_equal(a.loss_scale_good_steps, b.loss_scale_good_steps);
  assert_memory_equal(&full.final_loss, &rest.final_loss, sizeof(double));
  same_tensors(full.checkpoint, rest.checkpoint);
}

/* [data] on_device = true trains on the run's first batch every step (the
 * benchmark mode): a run resumed from step 6 trains on that same batch, so
 * 6 + 3 steps give the 9 straight steps' tensors bit for bit (the resume
 * took the batch at step 6 before: the runs parted at step 7). */
static void test_resume_on_device(void **state) {
  stoke_summary full, half, rest;
  const char *o9[] = {"run.steps=9", "data.on_device=true", "run.deterministic=true", "run.log_every=3"};
  train_in("od_full", o9, 4, &full);
  const char *o6[] = {"run.steps=6", "data.on_device=true", "run.deterministic=true", "run.log_every=3"};
  train_in("od_half", o6, 4, &half);
  resume_in("od_rest", &half, o9, 4, &rest);
  print_message("on_device, loss at 9: straight %.9g, resumed %.9g\n", full.final_loss, rest.final_loss);
  assert_memory_equal(&full.final_loss, &rest.final_loss, sizeof(double));
  same_tensors(full.checkpoint, rest.checkpoint);
}

/* Resumed with another batch size: the run goes on from the same sample,
 * so its step is this run's step to that sample. 8 steps of 64 (512
 * samples), then steps = 24 at batch 32: from step 16, 8 steps of 32 (it
 * went on from step 8 and trained 16, the schedule one half behind). */
static void test_resume_other_batch(void **state) {
  stoke_summary a, b;
  const char *o8[] = {"run.steps=8"};
  train_in("ob_a", o8, 1, &a);
  const char *more[] = {"run.steps=24", "data.batch_size=32"};
  resume_in("ob_b", &a, more, 2, &b);
  print_message("resumed at batch 32: %lld samples to step %lld\n", (long long)b.samples, (long long)b.steps);
  assert_int_equal(b.steps, 24);
  assert_int_equal(b.samples, 8 * 32);
}

/* Resumed with another accumulate, from a sample in the middle of a step:
 * the data starts at that step's first micro-batch, so the next checkpoint
 * says where the data is. 3 steps of 1 micro-batch, then accumulate 2 to
 * step 4, then to step 5 from that file: the same tensors as going on from
 * the first file to step 5 in one run (the loader had gone on from batch 3
 * while the file said step 4 x 2 = 8: batch 8 was trained twice). */
static void test_chained_resume_mid_step(void **state) {
  stoke_summary a, b, c, d;
  const char *o3[] = {"run.steps=3", "run.deterministic=true"};
  train_in("cr_a", o3, 2, &a);
  const char *to4[] = {"run.steps=4", "run.accumulate=2", "run.deterministic=true"};
  resume_in("cr_b", &a, to4, 3, &b);
  const char *to5[] = {"run.steps=5", "run.accumulate=2", "run.deterministic=true"};
  resume_in("cr_c", &b, to5, 3, &c);
  resume_in("cr_d", &a, to5, 3, &d);
  print_message("accumulate 1 -> 2 from step 3: loss at 5 in two resumes %.9g, in one %.9g\n", c.final_loss,
                d.final_loss);
  same_tensors(c.checkpoint, d.checkpoint);
}

/* The first element-wise ratio |update| / lr of one AdamW step, median over
 * every weight (a fresh AdamW moves each weight by about lr: m / sqrt(v) =
 * g / |g| at step 1). */
static double median_step_over_lr(const char *before, const char *after, double lr) {
  stoke_st_file fa, fb;
  stoke_err *e = stoke_st_read(before, &fa);
  if (!e) e = stoke_st_read(after, &fb);
  if (e) fail_msg("%s", e->msg);
  double *r = NULL;
  size_t n = 0;
  for (int i = 0; i < fa.n_tensors; i++) {
    const stoke_st_tensor *ta = &fa.tensors[i], *tb = stoke_st_find(&fb, ta->name);
    if (!tb || !strncmp(ta->name, "optimizer.", 10) || strcmp(ta->dtype, "F32")) continue;
    size_t k = (ta->end - ta->begin) / 4;
    r = realloc(r, sizeof *r * (n + k));
    for (size_t j = 0; j < k; j++) {
      float x, y;
      memcpy(&x, fa.data + ta->begin + 4 * j, 4);
      memcpy(&y, fb.data + tb->begin + 4 * j, 4);
      r[n++] = fabs((double)y - (double)x) / lr;
    }
  }
  stoke_st_free(&fa);
  stoke_st_free(&fb);
  if (!n) fail_msg("no f32 weights in %s", before);
  for (size_t i = 1; i < n; i++) /* insertion sort: a few thousand weights */
    for (size_t j = i; j > 0 && r[j - 1] > r[j]; j--) {
      double t = r[j];
      r[j] = r[j - 1], r[j - 1] = t;
    }
  double med = r[n / 2];
  free(r);
  return med;
}

/* An SGD checkpoint resumed with AdamW: its moments start at zero, so its
 * bias corrections must count from 1 again, not from the file's step (at
 * step 5 a fresh m and v moved each weight by 0.52 lr instead of lr). */
static void test_other_optimizer_counts_from_one(void **state) {
  stoke_summary a, b;
  const char *o4[] = {"run.steps=4"};
  train_in("oo_a", o4, 1, &a);
  const char *one[] = {"run.steps=5", "optimizer.name=adamw", "optimizer.lr=0.001", "optimizer.weight_decay=0"};
  resume_in("oo_b", &a, one, 4, &b);
  double med = median_step_over_lr(a.checkpoint, b.checkpoint, 0.001);
  print_message("AdamW's first step after SGD's 4: median |update| = %.4f lr (1 from step 1)\n", med);
  assert_true(med > 0.95 && med < 1.05);
}

/* A checkpoint of a run without a loss scaler (fp32) resumed by one with a
 * dynamic scaler starts at the scaler's initial scale (2^20 here), not at
 * 1 (the file said 1 for "no scaler": fp16 gradients would underflow for
 * thousands of steps while the scale grew back). 2 steps: no growth yet. */
static void test_scale_not_from_a_run_without_one(void **state) {
  stoke_summary a, b;
  const char *o3[] = {"run.steps=3"};
  train_in("ns_a", o3, 1, &a);
  const char *dyn[] = {"run.steps=5", "plugins.load=test_policies", "run.precision=test_fp32_dynamic"};
  resume_in("ns_b", &a, dyn, 3, &b);
  stoke_ckpt_meta ma, mb;
  stoke_err *e = stoke_checkpoint_read_meta(a.checkpoint, &ma);
  if (!e) e = stoke_checkpoint_read_meta(b.checkpoint, &mb);
  if (e) fail_msg("%s", e->msg);
  print_message("fp32's file: loss scale %g (0: none); resumed with a dynamic scaler: %g\n", ma.loss_scale,
                mb.loss_scale);
  assert_true(ma.loss_scale == 0);
  assert_true(mb.loss_scale == (double)(1 << 20));
}

/* A resume with nothing left to train (the checkpoint is at the run's last
 * step) logs no step: metrics.jsonl's summary must still be JSON, its loss
 * null, not a bare nan (Python's json.loads refused the line). */
static void test_summary_json_without_steps(void **state) {
  stoke_summary a, b;
  const char *o3[] = {"run.steps=3"};
  train_in("nj_a", o3, 1, &a);
  resume_in("nj_b", &a, o3, 1, &b);
  char path[800];
  snprintf(path, sizeof path, "%s/nj_b/metrics.jsonl", tmp);
  size_t n;
  char *text = test_slurp(path, &n);
  const char *sum = strstr(text, "{\"summary\"");
  if (!sum) fail_msg("no summary line in %s:\n%s", path, text);
  print_message("%s", sum);
  if (strstr(sum, "nan") || strstr(sum, "inf") || !strstr(sum, "\"final_loss\": null"))
    fail_msg("the summary is not JSON (a bare nan or inf), or its loss is not null: %s", sum);
  free(text);
}

static int count(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

/* 10 good steps saved; then the same run resumed at a learning rate that
 * blows the weights up, saving every 2 steps and reading the loss only at
 * step 40. The saves before the blow-up go through; the first after it is
 * refused by the weights themselves (no loss was read there) and stops the
 * run, so the file left is a whole checkpoint whose every float is finite,
 * of a step before the refused one. */
static void test_nan_weights_not_saved(void **state) {
  stoke_summary s;
  out_sub = "nan";
  train_ok((const char *[]){"run.steps=10"}, 1, &s);
  char resume[700];
  snprintf(resume, sizeof resume, "run.resume=%s", s.checkpoint);
  const char *over[] = {resume, "run.steps=40", "run.log_every=40", "run.checkpoint_every=2", "optimizer.lr=1e6"};
  stoke_err *e = train(over, 5, &s);
  out_sub = "out";
  if (!e) fail_msg("training at lr 1e6 did not fail");
  print_message("the diverged run: %s\n", e->msg);
  assert_non_null(strstr(e->msg, "not saved"));
  assert_non_null(strstr(e->msg, "NaN or infinite"));
  const char *at = strstr(e->msg, "after step ");
  assert_non_null(at);
  long long refused = atoll(at + 11);
  stoke_err_free(e);
  char path[760];
  snprintf(path, sizeof path, "%s/nan/checkpoint.safetensors", tmp);
  stoke_st_file f;
  stoke_err *le = stoke_st_read(path, &f);
  if (le) fail_msg("%s", le->msg);
  long long kept = atoll(stoke_st_meta(&f, "step"));
  int64_t floats = 0;
  for (int t = 0; t < f.n_tensors; t++) {
    const stoke_st_tensor *x = &f.tensors[t];
    if (strcmp(x->dtype, "F32")) continue;
    for (size_t b = x->begin; b < x->end; b += 4, floats++) {
      float v;
      memcpy(&v, f.data + b, 4);
      if (!isfinite(v)) fail_msg("the kept checkpoint (step %lld) has a non-finite value in '%s'", kept, x->name);
    }
  }
  print_message("kept: step %lld, %lld floats all finite; refused: step %lld\n", kept, (long long)floats, refused);
  assert_true(kept >= 10 && kept < refused);
  stoke_st_free(&f);
  /* out_dir says why the run failed: log.txt ends with the error, metrics.jsonl with an error line; the error
   * names the periodic checkpoint the failed save left whole */
  size_t n;
  snprintf(path, sizeof path, "%s/nan/log.txt", tmp);
  char *log = test_slurp(path, &n);
  if (!log || !strstr(log, "stoke: error: ") || !strstr(log, "NaN or infinite")) fail_msg("log.txt: %s", log);
  free(log);
  snprintf(path, sizeof path, "%s/nan/metrics.jsonl", tmp);
  char *jl = test_slurp(path, &n);
  assert_non_null(jl);
  char *last = n > 1 ? jl + n - 2 : jl;
  while (last > jl && last[-1] != '\n') last--;
  const char *head = "{\"summary\": \"error\", \"steps_done\": ";
  char intact[64];
  snprintf(intact, sizeof intact, "the checkpoint of step %lld is intact", kept);
  if (strncmp(last, head, strlen(head)) || !strstr(last, "NaN or infinite") || !strstr(last, intact))
    fail_msg("metrics.jsonl's last line: %s", last);
  free(jl);
  /* and report.html says it failed, and why, over the curves up to the failure (it said "done" for the first
   * part's 10 steps) */
  snprintf(path, sizeof path, "%s/nan/report.html", tmp);
  char *html = test_slurp(path, &n);
  if (!html || !strstr(html, "<p>failed: ") || !strstr(html, "<b>The run failed:</b> ") || !strstr(html, "NaN or infinite"))
    fail_msg("report.html does not say the run failed");
  free(html);
}

/* A loss that goes to NaN at a logged step stops the run with what to do and where the weights are: here,
 * nowhere (no checkpoint was due yet), not "the last checkpoint, if any, is <a file that is not there>". */
static void test_diverged_loss_message(void **state) {
  stoke_summary s;
  out_sub = "diverged";
  const char *over[] = {"run.steps=60", "run.log_every=10", "optimizer.lr=1e5"};
  stoke_err *e = train(over, 3, &s);
  out_sub = "out";
  if (!e) fail_msg("training at lr 1e5 did not fail");
  print_message("%s\n", e->msg);
  if (e->code != STOKE_E_NUMERIC || !strstr(e->msg, "training diverged; lower [optimizer] lr (100000; the schedule's rate at this step 100000)") ||
      !strstr(e->msg, "no checkpoint was saved before it") || strstr(e->msg, "-nan"))
    fail_msg("unexpected: %s", e->msg);
  stoke_err_free(e);
}

/* The same divergence with [run] detect_anomaly: the run stops at the
 * first NaN or inf, named where it starts (a node or the update), no later
 * than the step whose loss the run above read as non-finite; the NaN
 * message itself points at the key. */
static void test_detect_anomaly_run(void **state) {
  stoke_summary s;
  out_sub = "anomaly";
  const char *plain[] = {"run.steps=60", "run.log_every=1", "optimizer.lr=1e5"};
  stoke_err *e = train(plain, 3, &s);
  if (!e || !strstr(e->msg, "run.detect_anomaly=true names the first node")) fail_msg("%s", e ? e->msg : "no error");
  const char *at = strstr(e->msg, "at step ");
  assert_non_null(at);
  long long nan_step = atoll(at + 8);
  stoke_err_free(e);
  const char *over[] = {"run.steps=60", "run.log_every=1", "optimizer.lr=1e5", "run.detect_anomaly=true"};
  e = train(over, 4, &s);
  out_sub = "out";
  if (!e) fail_msg("training at lr 1e5 did not fail");
  print_message("%s\n(the loss was read NaN at step %lld)\n", e->msg, nan_step);
  if (e->code != STOKE_E_NUMERIC || !strstr(e->msg, "[run] detect_anomaly: ") ||
      !(strstr(e->msg, "(linear forward on cpu) wrote") || strstr(e->msg, "the optimizer update (sgd on cpu) made")))
    fail_msg("unexpected: %s", e->msg);
  at = strstr(e->msg, "while step ");
  assert_non_null(at);
  assert_true(atoll(at + 11) <= nan_step);
  stoke_err_free(e);
}

/* Resumed with a longer run under a cosine schedule: the rate from there
 * follows the new curve, which log.txt says (nanoGPT keeps the decay's
 * length apart; stoke has no such key). */
static void test_resume_reshapes_cosine(void **state) {
  stoke_summary a, b;
  const char *o6[] = {"run.steps=6", "optimizer.schedule=cosine", "optimizer.min_lr=0.005"};
  train_in("cos_a", o6, 3, &a);
  const char *o10[] = {"run.steps=10", "optimizer.schedule=cosine", "optimizer.min_lr=0.005"};
  resume_in("cos_b", &a, o10, 3, &b);
  char path[800];
  snprintf(path, sizeof path, "%s/cos_b/log.txt", tmp);
  size_t n;
  char *log = test_slurp(path, &n);
  if (!log || !strstr(log, "[run] steps = 10, its run had 6: the cosine schedule now reaches min_lr at step 10"))
    fail_msg("not said: %s", log ? log : "(no log.txt)");
  free(log);
}

/* A run that went on past its last save (then crashed) and was resumed
 * from that save does those steps again: metrics.jsonl keeps one line a
 * step, the redone ones from the resumed part. */
static void test_metrics_redone_steps_once(void **state) {
  stoke_summary a;
  train_in("redo", (const char *[]){"run.steps=4", "run.log_every=1"}, 2, &a);
  char ck[800], kept[800], path[800];
  snprintf(ck, sizeof ck, "%s/redo/checkpoint.safetensors", tmp);
  snprintf(kept, sizeof kept, "%s/redo_step4.safetensors", tmp);
  size_t n;
  char *bytes = test_slurp(ck, &n);
  FILE *f = fopen(kept, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
  free(bytes);
  char resume[900];
  snprintf(resume, sizeof resume, "run.resume=%s", ck);
  train_in("redo", (const char *[]){"run.steps=8", "run.log_every=1", resume}, 3, &a); /* steps 5-8 logged */
  rename(kept, ck); /* as if it had crashed after logging step 8, its last save at step 4 */
  train_in("redo", (const char *[]){"run.steps=10", "run.log_every=1", "run.resume=auto"}, 3, &a);
  snprintf(path, sizeof path, "%s/redo/metrics.jsonl", tmp);
  char *text = test_slurp(path, &n);
  for (int step = 1; step <= 10; step++) {
    char line[32];
    snprintf(line, sizeof line, "{\"step\": %d, ", step);
    if (count(text, line) != 1) fail_msg("step %d has %d lines:\n%s", step, count(text, line), text);
  }
  free(text);
}

/* run.resume names a run's folder: its checkpoint; a folder without one is
 * an error saying so. */
static void test_resume_from_folder(void **state) {
  stoke_summary a, b;
  train_in("rfold", (const char *[]){"run.steps=3"}, 1, &a);
  char resume[800];
  snprintf(resume, sizeof resume, "run.resume=%s/rfold", tmp);
  train_in("rfold2", (const char *[]){"run.steps=5", resume}, 2, &b);
  assert_int_equal(b.steps, 5);
  snprintf(resume, sizeof resume, "run.resume=%s", tmp); /* the test's folder: runs, no checkpoint of its own */
  out_sub = "rfold3";
  stoke_err *e = train((const char *[]){"run.steps=5", resume}, 2, &b);
  out_sub = "out";
  if (!e || !strstr(e->msg, "is a folder without a checkpoint.safetensors: name the checkpoint file"))
    fail_msg("%s", e ? e->msg : "no error");
  stoke_err_free(e);
}

/* eval_every = 0.5 of a 25-step epoch evaluates at steps 13, 25, 38 and
 * the end (50): each epoch's end on time, where a period rounded to 13
 * drifted to 26 and 39. */
static void test_eval_every_fraction(void **state) {
  stoke_summary s;
  const char *o[] = {"run.steps=50", "data.length=1600", "run.eval_every=0.5", "eval_data.source=synthetic",
                     "eval_data.shape=32", "eval_data.classes=4", "eval_data.length=64", "eval_data.offset=100000"};
  train_in("evalfrac", o, 8, &s);
  char path[800];
  snprintf(path, sizeof path, "%s/evalfrac/metrics.jsonl", tmp);
  size_t n;
  char *text = test_slurp(path, &n);
  static const int at[] = {13, 25, 38, 50};
  for (int i = 0; i < 4; i++) {
    char key[48];
    snprintf(key, sizeof key, "{\"step\": %d, \"epoch\": ", at[i]);
    int found = 0; /* a line of that step holding an evaluation */
    for (const char *p = text; (p = strstr(p, key)); p++) {
      const char *eol = strchr(p, '\n'), *ev = strstr(p, "eval_loss");
      found |= ev && (!eol || ev < eol);
    }
    if (!found) fail_msg("no evaluation at step %d:\n%s", at[i], text);
  }
  int evals = count(text, "\"eval_loss\"") - count(text, "{\"summary\""); /* the summary has the last one too */
  if (evals != 4) fail_msg("%d evaluations, not 4:\n%s", evals, text);
  free(text);
}

/* The bytes of tensor `name` in a checkpoint (malloc'd; *n its size), or NULL. */
static unsigned char *tensor_bytes(const char *path, const char *name, size_t *n, int64_t *rows) {
  stoke_st_file f;
  stoke_err *e = stoke_st_read(path, &f);
  if (e) fail_msg("%s", e->msg);
  const stoke_st_tensor *t = stoke_st_find(&f, name);
  unsigned char *b = NULL;
  if (t) {
    *n = t->end - t->begin;
    *rows = t->shape[0];
    b = malloc(*n);
    memcpy(b, f.data + t->begin, *n);
  }
  stoke_st_free(&f);
  return b;
}

/* [run] init_from: a 4-class run's weights fine-tune a 6-class model. The
 * layers that fit load (bit for bit: at lr 0 the one step leaves them), the
 * new head keeps its initialization and the log lists it; a PyTorch-style
 * file (one tensor, no stoke metadata) loads what it has; a file with no
 * tensor that fits, and init_from beside a resume of a file, are errors. */
static void test_init_from(void **state) {
  stoke_summary a, b;
  train_in("ft_src", (const char *[]){"run.steps=10"}, 1, &a);
  char init[800], path[800];
  snprintf(init, sizeof init, "run.init_from=%s", a.checkpoint);
  train_in("ft", (const char *[]){"run.steps=1", "optimizer.lr=0", "data.classes=6", init}, 4, &b);
  assert_int_equal(b.steps, 1);
  size_t na, nb;
  int64_t ra, rb;
  snprintf(path, sizeof path, "%s/ft/checkpoint.safetensors", tmp);
  unsigned char *wa = tensor_bytes(a.checkpoint, "layers.0.weight", &na, &ra), *wb = tensor_bytes(path, "layers.0.weight", &nb, &rb);
  assert_non_null(wa);
  assert_non_null(wb);
  assert_int_equal(na, nb);
  assert_memory_equal(wa, wb, na);
  free(wa);
  free(wb);
  wb = tensor_bytes(path, "layers.4.weight", &nb, &rb);
  assert_int_equal(rb, 6); /* the new head */
  free(wb);
  snprintf(path, sizeof path, "%s/ft/log.txt", tmp);
  size_t n;
  char *log = test_slurp(path, &n);
  if (!log || !strstr(log, "4 tensors loaded; 2 kept their initialization: 'layers.4.weight' ([6, 64] here, F32 [4, 64] "
                           "in the file), 'layers.4.bias' ([6] here, F32 [4] in the file); 0 of the file's unused") ||
      !strstr(log, "training starts at step 0 with a fresh optimizer"))
    fail_msg("log.txt: %s", log ? log : "(none)");
  free(log);
  /* the fine-tuning job restarted (resume = auto beside init_from): its own checkpoint, init_from not read */
  snprintf(init, sizeof init, "run.init_from=%s", a.checkpoint);
  train_in("ft", (const char *[]){"run.steps=2", "optimizer.lr=0", "data.classes=6", init, "run.resume=auto"}, 5, &b);
  assert_int_equal(b.steps, 2);
  snprintf(path, sizeof path, "%s/ft/log.txt", tmp);
  log = test_slurp(path, &n);
  if (!strstr(log, "is not read: the run continues its own checkpoint")) fail_msg("log.txt: %s", log);
  free(log);
  /* a PyTorch state_dict: no stoke metadata, one tensor of the model's */
  wa = tensor_bytes(a.checkpoint, "layers.0.weight", &na, &ra);
  char hdr[256], pt[800];
  int hl = snprintf(hdr, sizeof hdr, "{\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[%lld,32],\"data_offsets\":[0,%zu]}}",
                    (long long)ra, na);
  snprintf(pt, sizeof pt, "%s/torch.safetensors", tmp);
  FILE *f = fopen(pt, "wb");
  uint64_t hl64 = (uint64_t)hl;
  fwrite(&hl64, 8, 1, f);
  fwrite(hdr, 1, (size_t)hl, f);
  fwrite(wa, 1, na, f);
  fclose(f);
  free(wa);
  snprintf(init, sizeof init, "run.init_from=%s", pt);
  train_in("ft_pt", (const char *[]){"run.steps=1", init}, 2, &b);
  snprintf(path, sizeof path, "%s/ft_pt/log.txt", tmp);
  log = test_slurp(path, &n);
  if (!log || !strstr(log, "1 tensors loaded; 5 kept their initialization")) fail_msg("log.txt: %s", log ? log : "");
  free(log);
  /* nothing fits: the error says so; beside a resume of a file: refused */
  out_sub = "ft_none";
  stoke_err *e = train((const char *[]){"run.steps=1", init, "model.hidden=48,48"}, 3, &b);
  if (!e || !strstr(e->msg, "no tensor of the file fits this model")) fail_msg("%s", e ? e->msg : "no error");
  stoke_err_free(e);
  char resume[900];
  snprintf(resume, sizeof resume, "run.resume=%s", a.checkpoint);
  e = train((const char *[]){"run.steps=12", init, resume}, 3, &b);
  out_sub = "out";
  if (!e || !strstr(e->msg, "[run] init_from and resume both given")) fail_msg("%s", e ? e->msg : "no error");
  stoke_err_free(e);
}

/* The lowest evaluation loss in out_dir `sub`'s metrics.jsonl and its
 * step; *evals_after: how many evaluations came after step `after`, and
 * *worse_after how many of those were above the lowest before it. */
static double lowest_eval(const char *sub, long long *at, long long after, int *evals_after, int *worse_after) {
  char path[800];
  snprintf(path, sizeof path, "%s/%s/metrics.jsonl", tmp, sub);
  size_t n;
  char *text = test_slurp(path, &n);
  double lowest = INFINITY, before = INFINITY;
  *at = 0, *evals_after = 0, *worse_after = 0;
  for (const char *p = text; (p = strstr(p, "{\"step\": ")); p++) {
    long long st;
    int ep;
    double l;
    if (sscanf(p, "{\"step\": %lld, \"epoch\": %d, \"eval_loss\": %lf", &st, &ep, &l) != 3) continue;
    if (st <= after && l < before) before = l;
    if (st > after) *evals_after += 1, *worse_after += l > before;
    if (l < lowest) lowest = l, *at = st;
  }
  free(text);
  return lowest;
}

static int64_t best_step(const char *sub) {
  char path[800];
  snprintf(path, sizeof path, "%s/%s/best.safetensors", tmp, sub);
  stoke_ckpt_meta m;
  stoke_err *e = stoke_checkpoint_read_meta(path, &m);
  if (e) fail_msg("%s", e->msg);
  return m.step;
}

/* [run] keep_best: best.safetensors holds the step of the lowest
 * evaluation loss in metrics.jsonl, and best.json says it; resumed in place
 * at a rate that makes the evaluations worse, the run compares with that
 * best (read back from best.json) and keeps it. */
static void test_keep_best(void **state) {
  stoke_summary a;
  const char *o[] = {"run.steps=40", "data.length=640", "data.batch_size=16", "run.eval_every=0.25",
                     "run.keep_best=true", "eval_data.source=synthetic", "eval_data.shape=32", "eval_data.classes=4",
                     "eval_data.length=64", "eval_data.offset=100000", "run.resume=auto", "optimizer.lr=0.05"};
  train_in("best", o, 12, &a);
  long long at;
  int after, worse;
  double lowest = lowest_eval("best", &at, 0, &after, &worse);
  print_message("lowest evaluation loss %.6g at step %lld; best.safetensors is of step %lld\n", lowest, at,
                (long long)best_step("best"));
  assert_int_equal(best_step("best"), at);
  char path[800];
  snprintf(path, sizeof path, "%s/best/best.json", tmp);
  size_t n;
  char *text = test_slurp(path, &n), want[64];
  snprintf(want, sizeof want, "\"step\": %lld}", at);
  if (!strstr(text, want)) fail_msg("best.json: %s", text);
  free(text);
  /* resumed in place at a rate that worsens the evaluations */
  const char *o2[] = {"run.steps=60", "data.length=640", "data.batch_size=16", "run.eval_every=0.25",
                      "run.keep_best=true", "eval_data.source=synthetic", "eval_data.shape=32", "eval_data.classes=4",
                      "eval_data.length=64", "eval_data.offset=100000", "run.resume=auto", "optimizer.lr=1.5"};
  train_in("best", o2, 12, &a);
  lowest = lowest_eval("best", &at, 40, &after, &worse);
  print_message("after the resume: %d evaluations, %d of them above the first part's best; lowest %.6g at step %lld\n",
                after, worse, lowest, at);
  assert_true(worse > 0); /* else nothing here tests the comparison with the kept best */
  assert_int_equal(best_step("best"), at);
}

/* Resumed in the same folder, metrics.jsonl keeps the first part's lines
 * and gets the rest after them. */
static void test_metrics_appended(void **state) {
  stoke_summary s;
  out_sub = "metrics";
  train_ok((const char *[]){"run.steps=6", "run.log_every=1"}, 2, &s);
  char resume[700], path[760];
  snprintf(resume, sizeof resume, "run.resume=%s", s.checkpoint);
  train_ok((const char *[]){resume, "run.steps=10", "run.log_every=1"}, 3, &s);
  out_sub = "out";
  snprintf(path, sizeof path, "%s/metrics/metrics.jsonl", tmp);
  size_t n;
  char *text = test_slurp(path, &n);
  print_message("metrics.jsonl after the resume: %d step lines, %d summaries\n", count(text, "\"step\": "),
                count(text, "\"summary\""));
  assert_non_null(strstr(text, "\"step\": 1,"));  /* the first part's */
  assert_non_null(strstr(text, "\"step\": 10,")); /* the resumed part's */
  assert_int_equal(count(text, "\"summary\""), 2);
  free(text);
}

/* SGD's checkpoint resumed with AdamW: the weights load, and log.txt says
 * the optimizer's state starts fresh. */
static void test_other_optimizer_said(void **state) {
  stoke_summary s;
  out_sub = "optim";
  train_ok((const char *[]){"run.steps=6"}, 1, &s);
  char resume[700], path[760];
  snprintf(resume, sizeof resume, "run.resume=%s", s.checkpoint);
  train_ok((const char *[]){resume, "run.steps=8", "optimizer.name=adamw", "optimizer.lr=0.002"}, 4, &s);
  out_sub = "out";
  assert_int_equal(s.steps, 8);
  snprintf(path, sizeof path, "%s/optim/log.txt", tmp);
  size_t n;
  char *text = test_slurp(path, &n);
  assert_non_null(strstr(text, "written by optimizer 'sgd', this run uses 'adamw'"));
  assert_non_null(strstr(text, "starts fresh"));
  free(text);
}

/* A checkpoint cut short anywhere is refused, never taken for a good one. */
static void test_truncated_checkpoint_refused(void **state) {
  stoke_summary s;
  const char *o[] = {"run.steps=5"};
  out_sub = "trunc";
  train_ok(o, 1, &s);
  out_sub = "out";
  FILE *f = fopen(s.checkpoint, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  char *bytes = malloc((size_t)size);
  assert_int_equal(fread(bytes, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  char cut[700];
  snprintf(cut, sizeof cut, "%s/cut.safetensors", tmp);
  long sizes[] = {0, 4, 8, 100, size / 2, size - 1};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    f = fopen(cut, "wb");
    fwrite(bytes, 1, (size_t)sizes[i], f);
    fclose(f);
    stoke_st_file st;
    stoke_err *e = stoke_st_read(cut, &st);
    if (!e) fail_msg("a checkpoint cut to %ld of %ld bytes was accepted", sizes[i], size);
    assert_non_null(strstr(e->msg, "cut.safetensors"));
    stoke_err_free(e);
  }
  /* resuming from it says which file and why */
  char resume[760];
  snprintf(resume, sizeof resume, "run.resume=%s", cut);
  const char *r[] = {resume};
  char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  memcpy(strstr(fixed, "momentun"), "momentum", 8);
  stoke_err *e = run(write_ini("resume.ini", fixed), r, 1, &s);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "cut.safetensors"));
  assert_non_null(strstr(e->msg, "[run] resume"));
  stoke_err_free(e);
  free(bytes);
}

/* Ctrl-C: the train binary finishes the step, saves, says where, exits 0. */
static void test_sigint_saves(void **state) {
  char fixed[2048], outdir[700], over[760];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  memcpy(strstr(fixed, "momentun"), "momentum", 8);
  const char *ini = write_ini("sigint.ini", fixed);
  snprintf(outdir, sizeof outdir, "%s/sigint", tmp);
  snprintf(over, sizeof over, "run.out_dir=%s", outdir);
  char log[760];
  snprintf(log, sizeof log, "%s/sigint.log", tmp);
  pid_t pid = fork();
  if (pid == 0) {
    freopen(log, "w", stdout);
    execl("tools/train", "train", ini, over, "run.steps=100000000", "run.progress=off", (char *)NULL);
    _exit(127);
  }
  /* wait until it is training (metrics file has lines), then interrupt */
  char metrics[800];
  snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", outdir);
  struct stat st;
  for (int i = 0; i < 600 && (stat(metrics, &st) || st.st_size == 0); i++) usleep(50000);
  kill(pid, SIGINT);
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  char ckpt[800];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", outdir);
  stoke_st_file f;
  stoke_err *e = stoke_st_read(ckpt, &f);
  if (e) fail_msg("%s", e->msg);
  assert_true(atoll(stoke_st_meta(&f, "step")) > 0);
  stoke_st_free(&f);
  FILE *lf = fopen(log, "r");
  char text[8192] = "";
  fseek(lf, 0, SEEK_END);
  if (ftell(lf) > 4000) fseek(lf, -4000, SEEK_END); /* the closing lines */
  else rewind(lf);
  size_t n = fread(text, 1, sizeof text - 1, lf);
  text[n] = 0;
  fclose(lf);
  assert_non_null(strstr(text, "stopped by a signal"));
  assert_non_null(strstr(text, "checkpoint.safetensors"));
}

int main(void) {
  const char *t = getenv("TEST_TMPDIR");
  snprintf(tmp, sizeof tmp, "%s", t ? t : "/tmp");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_learns),
      cmocka_unit_test(test_accumulate_and_adamw),
      cmocka_unit_test(test_swish_plugin),
      cmocka_unit_test(test_gpt_adamw_and_lion_plugin),
      cmocka_unit_test(test_precision_plugins),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_cuda_graph_on_cpu),
      cmocka_unit_test(test_messages),
      cmocka_unit_test(test_eval),
      cmocka_unit_test(test_eval_many_classes),
      cmocka_unit_test(test_no_gpu),
      cmocka_unit_test(test_device_choice),
      cmocka_unit_test(test_batch_auto),
      cmocka_unit_test(test_resume_equals_uninterrupted),
      cmocka_unit_test(test_resume_keeps_scaler),
      cmocka_unit_test(test_resume_on_device),
      cmocka_unit_test(test_resume_other_batch),
      cmocka_unit_test(test_chained_resume_mid_step),
      cmocka_unit_test(test_other_optimizer_counts_from_one),
      cmocka_unit_test(test_scale_not_from_a_run_without_one),
      cmocka_unit_test(test_summary_json_without_steps),
      cmocka_unit_test(test_nan_weights_not_saved),
      cmocka_unit_test(test_diverged_loss_message),
      cmocka_unit_test(test_detect_anomaly_run),
      cmocka_unit_test(test_resume_reshapes_cosine),
      cmocka_unit_test(test_metrics_redone_steps_once),
      cmocka_unit_test(test_eval_every_fraction),
      cmocka_unit_test(test_resume_from_folder),
      cmocka_unit_test(test_init_from),
      cmocka_unit_test(test_keep_best),
      cmocka_unit_test(test_metrics_appended),
      cmocka_unit_test(test_other_optimizer_said),
      cmocka_unit_test(test_truncated_checkpoint_refused),
      cmocka_unit_test(test_sigint_saves),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
