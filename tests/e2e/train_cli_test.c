/* tests/e2e/train_cli_test.c: what the `train` binary prints for a
 * plugin author (issue 18's smaller points), run as a child process:
 * `--help-config run.ini` finds the plugins of the INI's [plugins] path
 * (relative to the INI's folder) and lists their ops with attributes and
 * their models' keys; an error found before training (here the compiler's
 * "no kernel", which names the engine that has one) is printed with no
 * resolved config above it, while a run that starts prints the config; a
 * plugin on the path that ends the process loading it is left out of the
 * listing, not the end of it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/tools/child.h"

static char out[1 << 20];
static char ini[PATH_MAX];

/* tmp/cli/run.ini with `text`, and in tmp/cli/plug (found only through the
 * INI's `[plugins] path = plug`) libstoke_plugfuse.so and libstoke_dies.so,
 * which ends the process that loads it. */
static void write_ini(const char *text) {
  char dir[PATH_MAX], link[PATH_MAX + 32], target[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/cli", tmpdir());
  mkdir(dir, 0755);
  snprintf(dir, sizeof dir, "%s/cli/plug", tmpdir());
  mkdir(dir, 0755);
  const char *libs[] = {"tests/e2e/libstoke_plugfuse.so", "tests/plugins/dies/libstoke_dies.so"};
  for (int i = 0; i < 2; i++) {
    snprintf(link, sizeof link, "%s/%s", dir, strrchr(libs[i], '/') + 1);
    assert_non_null(realpath(libs[i], target));
    unlink(link);
    assert_int_equal(symlink(target, link), 0);
  }
  assert_int_equal(write_tmp(ini, sizeof ini, "cli/run.ini", text), 0);
}

static void test_help_config_reads_the_ini_plugin_path(void **state) {
  write_ini("[plugins]\npath = plug\n");
  /* --help-config loads every plugin it finds, the GPU ones too: under
   * ASan their CUDA libraries' load-time allocations (72,704 bytes, an
   * unloaded module's) read as leaks, as tests/tools/plugins_list_test says */
  const char *asan = getenv("ASAN_OPTIONS");
  char opts[512], asan_was[400];
  snprintf(asan_was, sizeof asan_was, "%s", asan ? asan : "");
  snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", asan ? asan : "", asan ? ":" : "");
  setenv("ASAN_OPTIONS", opts, 1);
  const char *args[] = {"--help-config", ini, NULL};
  assert_int_equal(run_child("tools/train", args, out, sizeof out), 0);
  EXPECT_HAS(out, "shift_softsign: softsign(shift(x)) in one pass");
  EXPECT_HAS(out, "      by (float, default 0.5): shift's\n      gain (float, default 1): softsign's\n");
  EXPECT_HAS(out, "with name = plugnet: linear -> shift -> softsign -> linear");
  EXPECT_HAS(out, "leaky_relu: "); /* the plugins beside train too */
  EXPECT_HAS(out, "      negative_slope (float, default 0.01)");
  /* loaded in a child first: the one that would end the process is left out, said */
  EXPECT_HAS(out, "(plugin 'dies' on the search path ends the process that loads it: left out)");
  const char *none[] = {"--help-config", NULL};
  assert_int_equal(run_child("tools/train", none, out, sizeof out), 0);
  if (asan) setenv("ASAN_OPTIONS", asan_was, 1);
  else unsetenv("ASAN_OPTIONS");
  if (strstr(out, "shift_softsign")) fail_msg("without the INI file its plugin path was read anyway");
}

static const char *run_ini_fmt = "[run]\nbackends = cpu\nsteps = 2\nprogress = off\ncheckpoint = false\n"
                                 "out_dir = %s/cli/out\n[plugins]\npath = plug\nload = plugfuse\n"
                                 "[data]\nsource = synthetic\nshape = 8\nclasses = 2\nbatch_size = 8\n"
                                 "[model]\nname = mlp\nhidden = 8\nactivation = %s\n";

static int train_with(const char *activation) {
  char text[1024];
  snprintf(text, sizeof text, run_ini_fmt, tmpdir(), activation);
  write_ini(text);
  const char *args[] = {ini, NULL};
  return run_child("tools/train", args, out, sizeof out);
}

/* [eval_data] with [data]'s source leaves a sample-shaping key [data] sets at its default: a warning names it
 * (sections do not inherit keys); keys that pick the split (offset, length, ...) are meant to differ. */
static void test_eval_key_not_inherited(void **state) {
  char text[1024];
  snprintf(text, sizeof text,
           "[run]\nbackends = cpu\nsteps = 2\nprogress = off\ncheckpoint = false\nout_dir = %s/cli/ev\n"
           "[data]\nsource = synthetic\nshape = 8\nclasses = 3\nnoise = 0.5\nlength = 64\nbatch_size = 16\n"
           "[eval_data]\nsource = synthetic\nshape = 8\nclasses = 3\nlength = 32\noffset = 1000\n"
           "[model]\nname = mlp\nhidden = 8\n",
           tmpdir());
  write_ini(text);
  const char *args[] = {ini, NULL};
  assert_int_equal(run_child("tools/train", args, out, sizeof out), 0);
  EXPECT_HAS(out, "run.ini:11: [data] noise is set, [eval_data] (the same source, 'synthetic') leaves it at its default");
  if (strstr(out, "[data] length is set")) fail_msg("warned about a split key:\n%s", out);
  /* eval_every without an [eval_data]: said, not ignored */
  snprintf(text, sizeof text,
           "[run]\nbackends = cpu\nsteps = 2\nprogress = off\ncheckpoint = false\neval_every = 0.5\n"
           "out_dir = %s/cli/ev2\n[data]\nsource = synthetic\nshape = 8\nclasses = 3\nbatch_size = 16\n"
           "[model]\nname = mlp\nhidden = 8\n",
           tmpdir());
  write_ini(text);
  assert_int_equal(run_child("tools/train", args, out, sizeof out), 0);
  EXPECT_HAS(out, "run.ini:6: [run] eval_every is set, but there is no [eval_data] section: nothing is evaluated");
  /* an mlp with no hidden layer trains, said to be a linear model */
  snprintf(text, sizeof text,
           "[run]\nbackends = cpu\nsteps = 2\nprogress = off\ncheckpoint = false\nout_dir = %s/cli/ev3\n"
           "[data]\nsource = synthetic\nshape = 8\nclasses = 3\nbatch_size = 16\n[model]\nname = mlp\nhidden =\n",
           tmpdir());
  write_ini(text);
  assert_int_equal(run_child("tools/train", args, out, sizeof out), 0);
  EXPECT_HAS(out, "[model] hidden is empty: no hidden layer, a linear model");
}

/* [data] mean on a source of f32 samples is warned about, not ignored; a
 * resume with nothing left to train prints a summary without a NaN; an
 * empty INI is said to train every default. */
static void test_nothing_silent(void **state) {
  char text[1024], dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/cli/nothing", tmpdir());
  snprintf(text, sizeof text,
           "[run]\nbackends = cpu\nsteps = 2\nprogress = off\nout_dir = %s\noverwrite = true\n"
           "[data]\nsource = synthetic\nshape = 8\nclasses = 3\nbatch_size = 16\nmean = 0.5\n"
           "[model]\nname = mlp\nhidden = 8\n",
           dir);
  write_ini(text);
  const char *args[] = {ini, NULL};
  assert_int_equal(run_child("tools/train", args, out, sizeof out), 0);
  EXPECT_HAS(out, "run.ini:12: [data] mean is set, but source 'synthetic' gives f32 samples");
  char resume[PATH_MAX + 64];
  snprintf(resume, sizeof resume, "run.resume=%s/checkpoint.safetensors", dir);
  const char *again[] = {ini, resume, NULL};
  assert_int_equal(run_child("tools/train", again, out, sizeof out), 0);
  EXPECT_HAS(out, "summary (done): 2 steps, none of them run now (the checkpoint's step is the run's last");
  const char *sum = strstr(out, "summary (");
  assert_non_null(sum);
  if (strstr(sum, " nan")) fail_msg("a NaN in the summary:\n%s", sum);
  /* a resume that trains: the steps count from the start, the samples are this run's, and it says so */
  const char *more[] = {ini, resume, "run.steps=3", NULL};
  assert_int_equal(run_child("tools/train", more, out, sizeof out), 0);
  EXPECT_HAS(out, "summary (done): 3 steps (1 of them in this run), 16 samples");
  /* the command line switching a part: the INI's keys of the part it replaced are left out, said (they were
   * unknown-key errors no command line could unset) */
  snprintf(text, sizeof text,
           "[run]\nbackends = cpu\nsteps = 2\nprogress = off\ncheckpoint = false\nout_dir = %s/cli/switch\n"
           "[data]\nsource = synthetic\nshape = 8\nclasses = 3\nbatch_size = 16\n"
           "[eval_data]\nsource = synthetic\nshape = 8\nclasses = 3\nlength = 32\noffset = 1000\n"
           "[model]\nname = mlp\nhidden = 8\n[optimizer]\nname = adamw\nbeta1 = 0.8\nlr = 0.001\n",
           tmpdir());
  write_ini(text);
  const char *sw[] = {ini, "eval_data.source=", "optimizer.name=sgd", NULL};
  assert_int_equal(run_child("tools/train", sw, out, sizeof out), 0);
  EXPECT_HAS(out, "command line: eval_data.source = (none): the file's [eval_data] keys of the part it replaces are "
                  "left out: shape (");
  EXPECT_HAS(out, "run.ini:14), classes (");
  EXPECT_HAS(out, "run.ini:17)\n");
  EXPECT_HAS(out, "command line: optimizer.name = sgd: the file's [optimizer] key of the part it replaces is left "
                  "out: beta1 (");
  EXPECT_HAS(out, "run.ini:23)\n");
  if (strstr(out, "evaluation:")) fail_msg("evaluated:\n%s", out);
  /* an empty INI trains every default: said */
  write_ini("");
  snprintf(resume, sizeof resume, "run.out_dir=%s/cli/empty", tmpdir());
  const char *empty[] = {ini, "run.steps=1", resume, NULL};
  assert_int_equal(run_child("tools/train", empty, out, sizeof out), 0);
  EXPECT_HAS(out, "run.ini sets no key: every setting is its default (an mlp on synthetic data, the cpu backend)");
}

static void test_error_before_the_config_dump(void **state) {
  assert_int_equal(train_with("elsewhere_act"), 1);
  EXPECT_HAS(out, "stoke: error: node 'layers.1': no kernel for op 'elsewhere_act' (forward, f32) in backends [cpu]; "
             "these backends have one: elsewhere (add one to [run] backends)");
  if (strstr(out, "resolved config")) fail_msg("the config was printed before the error:\n%s", out);
  /* the same run with an op the cpu serves starts, and prints its config first */
  assert_int_equal(train_with("softsign(gain=2)"), 0);
  EXPECT_HAS(out, "stoke: run 'run', resolved config (saved to ");
  EXPECT_HAS(out, "activation = softsign(gain=2)");
  char *cfg = strstr(out, "resolved config"), *plan = strstr(out, "plan: ");
  assert_non_null(plan);
  assert_true(cfg < plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_config_reads_the_ini_plugin_path),
      cmocka_unit_test(test_error_before_the_config_dump),
      cmocka_unit_test(test_eval_key_not_inherited),
      cmocka_unit_test(test_nothing_silent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
