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

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/run.h"

static const char *dirs[] = {"backends/cpu", "sources/synthetic", "models/mlp", "plugins/swish"};
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

static stoke_err *run(const char *ini, const char **over, int n_over, stoke_summary *s) {
  const char *all[16];
  char out_dir[700];
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/out", tmp);
  all[0] = out_dir;
  for (int i = 0; i < n_over; i++) all[i + 1] = over[i];
  stoke_run_opts o = {ini, all, n_over + 1, dirs, 4, 1};
  return stoke_train(&o, s);
}

static void train_ok(const char **over, int n_over, stoke_summary *s) {
  static char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", base_ini);
  char *typo = strstr(fixed, "momentun");
  memcpy(typo, "momentum", 8);
  stoke_err *e = run(write_ini("ok.ini", fixed), over, n_over, s);
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    fail();
  }
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

static void test_messages(void **state) {
  stoke_summary s;
  /* a typo in a key: line number and suggestion */
  stoke_err *e = run(write_ini("typo.ini", base_ini), NULL, 0, &s);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "typo.ini:22: [optimizer] unknown key 'momentun' (did you mean 'momentum'?)"));
  stoke_err_free(e);
  /* a backend that does not exist: the ones that do are listed */
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
}

int main(void) {
  const char *t = getenv("TEST_TMPDIR");
  snprintf(tmp, sizeof tmp, "%s", t ? t : "/tmp");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_learns),
      cmocka_unit_test(test_accumulate_and_adamw),
      cmocka_unit_test(test_swish_plugin),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
