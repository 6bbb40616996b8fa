/* tests/e2e/newcomer_test.c: the mistakes issue 18 made on purpose, each a
 * whole run through stoke_train with a plugin that makes it
 * (tests/e2e/newcomer.c): an op left without a backward is refused by
 * the compiler, naming the op and the fix (it froze the layers before it);
 * an f32 source that writes HWC images and says STOKE_NHWC is read in that
 * order (it was taken as CHW); labels off by one stop the loader with the
 * label error counted (it trained on class 0 alone); a plugin's fusion
 * pattern fuses and trains as the unfused graph, and op attributes given in
 * a plugin model's LIST key reach the kernels (tests/e2e/plugfuse.c). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stoke/core.h"
#include "stoke/run.h"

static const char *dirs[] = {"backends/cpu", "sources/synthetic", "models/mlp", "tests/e2e"};
static char tmp[512];

static const char *base_ini =
    "[run]\n"
    "backends = cpu\n"
    "steps = 4\n"
    "log_every = 2\n"
    "progress = off\n"
    "checkpoint = false\n"
    "[plugins]\n"
    "load = newcomer\n"
    "[data]\n"
    "batch_size = 16\n"
    "[model]\n"
    "name = mlp\n";

static stoke_err *run_in(const char *name, const char *text, const char *out, const char **over, int n_over,
                         stoke_summary *s) {
  char ini[600], out_dir[700];
  snprintf(ini, sizeof ini, "%s/%s", tmp, name);
  FILE *f = fopen(ini, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  const char *all[16];
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/%s", tmp, out);
  all[0] = out_dir;
  for (int i = 0; i < n_over; i++) all[i + 1] = over[i];
  stoke_run_opts o = {.ini_path = ini, .overrides = all, .n_overrides = n_over + 1, .plugin_dirs = dirs,
                      .n_plugin_dirs = (int)(sizeof dirs / sizeof *dirs), .quiet = 1};
  return stoke_train(&o, s);
}

static stoke_err *run_ini(const char *name, const char *text, const char **over, int n_over, stoke_summary *s) {
  return run_in(name, text, "out", over, n_over, s);
}

static stoke_err *run(const char **over, int n_over, stoke_summary *s) {
  return run_ini("newcomer.ini", base_ini, over, n_over, s);
}

/* The run fails and its message holds every one of `subs` (NULL-ended). */
static void expect_error(const char **over, int n_over, const char *const *subs) {
  stoke_summary s;
  stoke_err *e = run(over, n_over, &s);
  if (!e) fail_msg("the run succeeded (final loss %.4f); expected an error", s.final_loss);
  for (int i = 0; subs[i]; i++)
    if (!strstr(e->msg, subs[i])) {
      print_error("message lacks \"%s\":\n%s\n", subs[i], e->msg);
      stoke_err_free(e);
      fail();
    }
  print_message("%s\n", e->msg);
  stoke_err_free(e);
}

static void expect_ok(const char **over, int n_over) {
  stoke_summary s;
  stoke_err *e = run(over, n_over, &s);
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    fail();
  }
}

/* has_backward left 0 on an op between trained layers. */
static void test_op_without_backward_refused(void **state) {
  const char *over[] = {"data.source=synthetic", "data.shape=8", "data.classes=2", "model.hidden=8",
                        "model.activation=frozen"};
  const char *subs[] = {"op 'frozen'", "has no backward", "has_backward = STOKE_HAS_BACKWARD", "STOKE_NO_GRAD",
                        "libstoke_newcomer.so", NULL};
  expect_error(over, 5, subs);
}

/* f32 images written HWC and said STOKE_NHWC: the probe finds every
 * element at its place (on the CPU the core converts them to NCHW). */
static void test_source_layout_honoured(void **state) {
  const char *over[] = {"data.source=hwc", "model.name=probe"};
  expect_ok(over, 2);
}

/* Labels 1 and 2 of 2 classes: the loader stops at once with the label
 * error counted (it replaced half the samples and trained on class 0). */
static void test_labels_off_by_one_stop(void **state) {
  const char *over[] = {"data.source=off_by_one", "model.hidden=8"};
  const char *subs[] = {"source 'off_by_one'", "x label error: label 2 outside [0, 2)",
                        "the source says classes = 2, so labels count 0 to 1", "[data] max_skipped", NULL};
  expect_error(over, 2, subs);
}

/* [plugins] path = p in sub/rel.ini is sub/p, not p in the working folder. */
static void test_plugin_path_relative_to_ini(void **state) {
  char dir[700], link[800], target[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/sub", tmp);
  mkdir(dir, 0755);
  snprintf(dir, sizeof dir, "%s/sub/p", tmp);
  mkdir(dir, 0755);
  snprintf(link, sizeof link, "%s/libstoke_nc_rel.so", dir);
  assert_non_null(realpath("tests/e2e/libstoke_newcomer.so", target));
  unlink(link);
  assert_int_equal(symlink(target, link), 0);
  const char *text = "[run]\nbackends = cpu\nsteps = 2\nprogress = off\ncheckpoint = false\n"
                     "[plugins]\npath = p\nload = nc_rel\n[data]\nsource = hwc\nbatch_size = 16\n"
                     "[model]\nname = probe\n";
  stoke_summary s;
  stoke_err *e = run_ini("sub/rel.ini", text, NULL, 0, &s);
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    fail();
  }
  /* a path that is not a folder is an error naming it (it was skipped, and a plugin of the same name found
   * elsewhere would have run in its place) */
  const char *typo = "[run]\nbackends = cpu\nsteps = 2\nprogress = off\ncheckpoint = false\n"
                     "[plugins]\npath = q\nload = nc_rel\n[data]\nsource = hwc\nbatch_size = 16\n"
                     "[model]\nname = probe\n";
  e = run_ini("sub/typo.ini", typo, NULL, 0, &s);
  if (!e) fail_msg("[plugins] path = q (no such folder) was accepted");
  print_message("%s\n", e->msg);
  char want[800];
  snprintf(want, sizeof want, "[plugins] path 'q': %s/sub/q (No such file or directory)", tmp);
  if (!strstr(e->msg, want) || !strstr(e->msg, "typo.ini:")) fail_msg("the error does not say \"%s\"", want);
  stoke_err_free(e);
}

/* The whole of a small file, or fail. */
static char *slurp(const char *dir, const char *name) {
  char path[800];
  snprintf(path, sizeof path, "%s/%s/%s", tmp, dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  static char buf[2][1 << 16];
  static int which;
  char *b = buf[which ^= 1];
  size_t n = fread(b, 1, sizeof buf[0] - 1, f);
  b[n] = 0;
  fclose(f);
  return b;
}

/* A plugin's fusion pattern (tests/e2e/plugfuse.c: shift -> softsign,
 * registered through stoke_fusion_v1) fuses in the compiled graph of a
 * model that contains it once run.fuse asks the head's engine to (the cpu
 * here), and the fused run trains bit for bit as the unfused one: every
 * logged loss and the final one equal. */
static void test_plugin_fusion_pattern(void **state) {
  const char *text = "[run]\nbackends = cpu\nsteps = 12\nlog_every = 1\nprogress = off\ncheckpoint = false\n"
                     "[plugins]\nload = plugfuse\n[data]\nsource = synthetic\nshape = 12\nclasses = 3\n"
                     "batch_size = 16\n[model]\nname = plugnet\n";
  const char *fuse[] = {"run.fuse=true"}, *apart[] = {"run.fuse=false"};
  stoke_summary a, b;
  stoke_err *e = run_in("plugfuse.ini", text, "apart", apart, 1, &a);
  if (!e) e = run_in("plugfuse.ini", text, "fused", fuse, 1, &b);
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    fail();
  }
  const char *plan_apart = slurp("apart", "plan.txt"), *plan_fused = slurp("fused", "plan.txt");
  if (!strstr(plan_fused, "shift_softsign"))
    fail_msg("the fused plan has no shift_softsign node:\n%s", plan_fused);
  if (!strstr(plan_apart, "softsign") || strstr(plan_apart, "shift_softsign")) fail_msg("the unfused plan fused:\n%s", plan_apart);
  print_message("fused plan:\n%s", plan_fused);
  char *ma = strdup(slurp("apart", "metrics.jsonl")), *mb = strdup(slurp("fused", "metrics.jsonl"));
  int steps = 0;
  for (char *pa = ma, *pb = mb; (pa = strstr(pa, "\"loss\":")) && (pb = strstr(pb, "\"loss\":")); pa++, pb++, steps++) {
    double la = strtod(pa + 7, NULL), lb = strtod(pb + 7, NULL);
    if (la != lb) fail_msg("step %d: loss %.17g unfused, %.17g fused", steps + 1, la, lb);
  }
  free(ma);
  free(mb);
  assert_int_equal(steps, 12);
  assert_true(a.final_loss == b.final_loss);
  print_message("12 steps, every loss equal (final %.9g)\n", b.final_loss);
}

/* Op attributes from the INI reach the kernels: plugnet's LIST key
 * `between` (the host table's cfg_list) names its ops with attributes;
 * softsign(gain=1) trains as softsign (the default) bit for bit, and
 * softsign(gain=2) does not. */
static void test_op_attributes_from_the_ini(void **state) {
  const char *text = "[run]\nbackends = cpu\nsteps = 6\nprogress = off\ncheckpoint = false\n"
                     "[plugins]\nload = plugfuse\n[data]\nsource = synthetic\nshape = 12\nclasses = 3\n"
                     "batch_size = 16\n[model]\nname = plugnet\n";
  const char *runs[][1] = {{"model.between=shift(by=0.25), softsign"},
                           {"model.between=shift(by=0.25), softsign(gain=1)"},
                           {"model.between=shift(by=0.25), softsign(gain=2)"}};
  stoke_summary s[3];
  for (int i = 0; i < 3; i++) {
    char out[16];
    snprintf(out, sizeof out, "attrs%d", i);
    stoke_err *e = run_in("attrs.ini", text, out, runs[i], 1, &s[i]);
    if (e) {
      print_error("%s: %s\n", runs[i][0], e->msg);
      stoke_err_free(e);
      fail();
    }
  }
  print_message("final losses: default gain %.17g, gain=1 %.17g, gain=2 %.17g\n", s[0].final_loss, s[1].final_loss,
                s[2].final_loss);
  assert_true(s[0].final_loss == s[1].final_loss);
  assert_true(s[0].final_loss != s[2].final_loss);
  const char *plan = slurp("attrs2", "plan.txt");
  if (!strstr(plan, "between.1 ") || !strstr(plan, "softsign")) fail_msg("plugnet's between ops are not in the plan:\n%s", plan);
}

int main(void) {
  const char *t = getenv("TEST_TMPDIR");
  snprintf(tmp, sizeof tmp, "%s", t ? t : "/tmp");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op_without_backward_refused),
      cmocka_unit_test(test_source_layout_honoured),
      cmocka_unit_test(test_labels_off_by_one_stop),
      cmocka_unit_test(test_plugin_path_relative_to_ini),
      cmocka_unit_test(test_plugin_fusion_pattern),
      cmocka_unit_test(test_op_attributes_from_the_ini),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
