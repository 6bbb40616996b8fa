/* tests/gpu/resume_gpu_test.c: checkpoints of low-precision runs on the GPU
 * (bf16: parameters in bf16, the optimizer on an f32 master copy that leads
 * the optimizer state). 3 steps, then 3 more resumed from the checkpoint,
 * must end where 6 straight steps end: the master copy and the optimizer
 * state (momentum; AdamW's moments) are saved and restored in f32, and the
 * master rounded to bf16 is the saved parameter. Deterministic kernels, so
 * the difference printed is expected to be 0. Runs with STOKE_PLUGIN_PATH
 * set (tools/gpu_check.sh). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/checkpoint.h"
#include "stoke/core.h"
#include "stoke/run.h"

static char tmp[512];

static const char *ini =
    "[run]\n"
    "backends = cublaslt, cuda\n"
    "precision = bf16\n"
    "seed = 7\n"
    "deterministic = true\n"
    "progress = off\n"
    "log_every = 1\n"
    "[data]\n"
    "source = synthetic\n"
    "shape = 64\n"
    "classes = 16\n"
    "batch_size = 64\n"
    "[model]\n"
    "name = mlp\n"
    "hidden = 128, 128\n"
    "[optimizer]\n"
    "lr = 0.05\n";

static void train(const char *ini_path, const char *sub, const char *opt, int steps, const char *resume,
                  stoke_summary *s) {
  char out[700], st[64], op[64], res[800];
  snprintf(out, sizeof out, "run.out_dir=%s/%s", tmp, sub);
  snprintf(st, sizeof st, "run.steps=%d", steps);
  snprintf(op, sizeof op, "optimizer.name=%s", opt);
  snprintf(res, sizeof res, "run.resume=%s", resume ? resume : "");
  /* run.overwrite: a repeated run of this test (tools/gpu_check.sh) starts over */
  const char *over[] = {out, st, op, res, "run.overwrite=true"};
  stoke_run_opts o = {.ini_path = ini_path, .overrides = over, .n_overrides = 5, .quiet = 1};
  stoke_err *e = stoke_train(&o, s);
  if (e) fail_msg("%s: %s", sub, e->msg);
}

static double bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u; /* round to nearest even */
  float r;
  memcpy(&r, &u, 4);
  return r;
}

static double value(const stoke_st_file *f, const stoke_st_tensor *t, size_t i) {
  const unsigned char *p = f->data + t->begin;
  if (!strcmp(t->dtype, "F32")) {
    float v;
    memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  uint32_t u = (uint32_t)h << 16;
  float v;
  memcpy(&v, &u, 4);
  return v;
}

static void resume_equals_straight(const char *opt) {
  char path[600];
  snprintf(path, sizeof path, "%s/resume.ini", tmp);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(ini, f);
  fclose(f);
  stoke_summary full, half, rest;
  char a[64], b[64], c[64];
  snprintf(a, sizeof a, "%s_full", opt);
  snprintf(b, sizeof b, "%s_half", opt);
  snprintf(c, sizeof c, "%s_rest", opt);
  train(path, a, opt, 6, NULL, &full);
  train(path, b, opt, 3, NULL, &half);
  train(path, c, opt, 6, half.checkpoint, &rest);
  stoke_st_file fa, fc;
  stoke_err *e = stoke_st_read(full.checkpoint, &fa);
  if (!e) e = stoke_st_read(rest.checkpoint, &fc);
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(fa.n_tensors, fc.n_tensors);
  double worst = 0;
  int masters = 0;
  for (int i = 0; i < fa.n_tensors; i++) {
    const stoke_st_tensor *ta = &fa.tensors[i], *tc = stoke_st_find(&fc, ta->name);
    if (!tc) fail_msg("resumed checkpoint lacks '%s'", ta->name);
    if (strcmp(ta->dtype, "F32") && strcmp(ta->dtype, "BF16")) continue;
    size_t n = (ta->end - ta->begin) / (strcmp(ta->dtype, "F32") ? 2 : 4);
    double num = 0, den = 0;
    for (size_t k = 0; k < n; k++) {
      double x = value(&fa, ta, k), y = value(&fc, tc, k);
      if (!isfinite(x) || !isfinite(y)) fail_msg("%s[%zu]: %g vs %g, not finite", ta->name, k, x, y);
      num += (x - y) * (x - y);
      den += x * x;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (rel > worst) worst = rel;
    /* the master copy is f32 and rounds to the saved bf16 parameter */
    size_t len = strlen(ta->name);
    if (len > 17 && !strcmp(ta->name + len - 7, ".master") && !strncmp(ta->name, "optimizer.", 10)) {
      char pname[128];
      snprintf(pname, sizeof pname, "%.*s", (int)(len - 17), ta->name + 10);
      const stoke_st_tensor *tp = stoke_st_find(&fa, pname);
      if (!tp) fail_msg("no parameter '%s' for '%s'", pname, ta->name);
      assert_string_equal(ta->dtype, "F32");
      assert_string_equal(tp->dtype, "BF16");
      for (size_t k = 0; k < n; k++)
        if (bf16_round((float)value(&fa, ta, k)) != value(&fa, tp, k))
          fail_msg("%s[%zu] = %.9g does not round to the parameter %.9g", ta->name, k, value(&fa, ta, k),
                   value(&fa, tp, k));
      masters++;
    }
  }
  print_message("%s bf16: 3 + 3 resumed steps vs 6 straight: worst relative difference %.3g over %d tensors "
                "(%d master copies)\n", opt, worst, fa.n_tensors, masters);
  assert_int_equal(masters, 6); /* 3 linear layers: weight and bias */
  assert_true(worst < 1e-6);
  stoke_st_free(&fa);
  stoke_st_free(&fc);
}

static void test_sgd(void **state) {
  (void)state;
  resume_equals_straight("sgd");
}

static void test_adamw(void **state) {
  (void)state;
  resume_equals_straight("adamw");
}

int main(void) {
  snprintf(tmp, sizeof tmp, "%s/stoke_resume_gpu_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(tmp)) {
    perror(tmp);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sgd), cmocka_unit_test(test_adamw)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
