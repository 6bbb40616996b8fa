/* tests/unit/config_test.c: the strict INI config (core/config.c): typed
 * reads, defaults, overrides, exact error messages with line numbers, dump;
 * the run's keys read once into stoke_run_config (core/run_config.c). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/run_config.h"

/* ----------------------------------------------------------- fixtures */

static const stoke_cfg_key_v1 run_keys[] = {
    {"steps", STOKE_CFG_INT, "100", 1, 1e9, NULL, "training steps"},
    {"seed", STOKE_CFG_INT, "0", 0, 0, NULL, "random seed (unbounded)"},
    {"precision", STOKE_CFG_ENUM, "fp32", 0, 0, "fp32|tf32|bf16|fp16", "number format"},
    {"out", STOKE_CFG_STR, "runs", 0, 0, NULL, "output folder"},
    {"engines", STOKE_CFG_LIST, "cudnn, cuda", 0, 0, NULL, "engines to try, in order"},
    {"verbose", STOKE_CFG_BOOL, "no", 0, 0, NULL, "log more"},
};

static const stoke_cfg_key_v1 opt_keys[] = {
    {"name", STOKE_CFG_ENUM, "sgd", 0, 0, "sgd|adamw", "optimizer"},
    {"lr", STOKE_CFG_FLOAT, "0.1", 0, 1, NULL, "learning rate"},
    {"momentum", STOKE_CFG_FLOAT, "0.9", 0, 1, NULL, "momentum"},
    {"nesterov", STOKE_CFG_BOOL, "false", 0, 0, NULL, "Nesterov momentum"},
    {"weight_decay", STOKE_CFG_FLOAT, "0", 0, 1, NULL, "decoupled weight decay"},
};

static const stoke_cfg_key_v1 data_keys[] = {
    {"shape", STOKE_CFG_INTS, "28, 28", 1, 4096, NULL, "sample shape"},
    {"source", STOKE_CFG_STR, "mnist", 0, 0, NULL, "data source"},
    {"batch", STOKE_CFG_INT, "64", 1, 65536, NULL, "batch size"},
};

#define N(a) ((int)(sizeof(a) / sizeof *(a)))

static stoke_cfg *make_cfg(void) {
  stoke_cfg *c = stoke_cfg_new();
  assert_non_null(c);
  assert_null(stoke_cfg_declare(c, "run", "the run", run_keys, N(run_keys)));
  assert_null(stoke_cfg_declare(c, "optimizer", "the optimizer", opt_keys, N(opt_keys)));
  assert_null(stoke_cfg_declare(c, "data", "the data", data_keys, N(data_keys)));
  return c;
}

/* Assert an error of `code` whose message is exactly `msg`; frees it. */
static void expect_err(stoke_err *e, stoke_code code, const char *msg) {
  assert_non_null(e);
  if (strcmp(e->msg, msg)) print_error("got:  %s\nwant: %s\n", e->msg, msg);
  assert_string_equal(e->msg, msg);
  assert_int_equal(e->code, code);
  stoke_err_free(e);
}

/* Same, with the message built printf-style. */
static void expect_errf(stoke_err *e, stoke_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void expect_errf(stoke_err *e, stoke_code code, const char *fmt, ...) {
  char buf[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  expect_err(e, code, buf);
}

/* Assert success; print the message first if not. */
static void ok(stoke_err *e) {
  if (e) print_error("unexpected error: %s\n", e->msg);
  assert_null(e);
}

static const char *tmp_dir(void) {
  const char *d = getenv("TEST_TMPDIR");
  if (!d || !d[0]) d = getenv("TMPDIR");
  return d && d[0] ? d : "/tmp";
}

/* Write text to a new temp file; its path into path (freed by caller). */
static char *write_tmp(const char *text) {
  size_t n = strlen(tmp_dir()) + 32;
  char *path = malloc(n);
  assert_non_null(path);
  snprintf(path, n, "%s/stoke_cfg_XXXXXX", tmp_dir());
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t len = strlen(text);
  assert_int_equal(write(fd, text, len), (ssize_t)len);
  close(fd);
  return path;
}

/* Load INI text from a temp file; returns the error and the path. */
static stoke_err *load_tmp(stoke_cfg *c, const char *text, char **path) {
  *path = write_tmp(text);
  return stoke_cfg_load_file(c, *path);
}

/* Load text under the name "run.ini" (no file) and validate. */
static stoke_err *load_validate(stoke_cfg *c, const char *text) {
  stoke_err *e = stoke_cfg_load_string(c, "run.ini", text);
  return e ? e : stoke_cfg_validate(c);
}

/* ------------------------------------------------------------- tests */

static void good_file_every_type(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  char *path;
  ok(load_tmp(c,
              "; a run\n"
              "[run]\n"
              "steps = 5000\n"
              "seed = -12345678901\n"
              "precision = bf16\n"
              "out = /data/runs/my run\n"
              "engines = cublaslt ,  fused,cpu\n"
              "verbose = YES\n"
              "\n"
              "[optimizer]\n"
              "name = adamw\n"
              "lr = 1e-3\n"
              "nesterov = On\n"
              "[data]\n"
              "shape = 3, 224 ,224\n",
              &path));
  ok(stoke_cfg_validate(c));

  int64_t i;
  double f;
  int b, n;
  const char *s;
  int64_t ints[STOKE_CFG_MAX_LIST];
  const char *list[STOKE_CFG_MAX_LIST];
  ok(stoke_cfg_int(c, "run", "steps", &i));
  assert_int_equal(i, 5000);
  ok(stoke_cfg_int(c, "run", "seed", &i));
  assert_true(i == -12345678901LL);
  ok(stoke_cfg_str(c, "run", "precision", &s));
  assert_string_equal(s, "bf16");
  ok(stoke_cfg_str(c, "run", "out", &s));
  assert_string_equal(s, "/data/runs/my run");
  ok(stoke_cfg_list(c, "run", "engines", list, &n));
  assert_int_equal(n, 3);
  assert_string_equal(list[0], "cublaslt");
  assert_string_equal(list[1], "fused");
  assert_string_equal(list[2], "cpu");
  ok(stoke_cfg_bool(c, "run", "verbose", &b));
  assert_int_equal(b, 1);
  ok(stoke_cfg_str(c, "optimizer", "name", &s));
  assert_string_equal(s, "adamw");
  ok(stoke_cfg_float(c, "optimizer", "lr", &f));
  assert_true(f == 1e-3);
  ok(stoke_cfg_bool(c, "optimizer", "nesterov", &b));
  assert_int_equal(b, 1);
  ok(stoke_cfg_ints(c, "data", "shape", ints, &n));
  assert_int_equal(n, 3);
  assert_int_equal(ints[0], 3);
  assert_int_equal(ints[1], 224);
  assert_int_equal(ints[2], 224);

  char where[4200];
  snprintf(where, sizeof where, "%s:12", path);
  assert_string_equal(stoke_cfg_where(c, "optimizer", "lr"), where);
  assert_string_equal(stoke_cfg_where(c, "optimizer", "momentum"), "default");
  assert_int_equal(stoke_cfg_is_set(c, "optimizer", "lr"), 1);
  assert_int_equal(stoke_cfg_is_set(c, "optimizer", "momentum"), 0);
  free(path);
  stoke_cfg_free(c);
}

static void defaults_when_absent(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  ok(load_validate(c, "[run]\nsteps = 7\n"));
  int64_t i, ints[STOKE_CFG_MAX_LIST];
  double f;
  int b, n;
  const char *s, *list[STOKE_CFG_MAX_LIST];
  ok(stoke_cfg_int(c, "data", "batch", &i));
  assert_int_equal(i, 64);
  ok(stoke_cfg_float(c, "optimizer", "momentum", &f));
  assert_true(f == 0.9);
  ok(stoke_cfg_bool(c, "run", "verbose", &b));
  assert_int_equal(b, 0);
  ok(stoke_cfg_str(c, "run", "precision", &s));
  assert_string_equal(s, "fp32");
  ok(stoke_cfg_str(c, "data", "source", &s));
  assert_string_equal(s, "mnist");
  ok(stoke_cfg_ints(c, "data", "shape", ints, &n));
  assert_int_equal(n, 2);
  assert_int_equal(ints[1], 28);
  ok(stoke_cfg_list(c, "run", "engines", list, &n));
  assert_int_equal(n, 2);
  assert_string_equal(list[1], "cuda");
  assert_string_equal(stoke_cfg_where(c, "data", "batch"), "default");
  assert_string_equal(stoke_cfg_where(c, "run", "steps"), "run.ini:2");
  stoke_cfg_free(c);
}

static void overrides_win(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  ok(stoke_cfg_override(c, "optimizer.lr=0.5"));
  ok(load_validate(c, "[optimizer]\nlr = 0.01\n[data]\nshape = 1, 2\n"));
  ok(stoke_cfg_override(c, " data.shape = 4,5,6 "));
  ok(stoke_cfg_validate(c));
  double f;
  int64_t ints[STOKE_CFG_MAX_LIST];
  int n;
  ok(stoke_cfg_float(c, "optimizer", "lr", &f));
  assert_true(f == 0.5);
  ok(stoke_cfg_ints(c, "data", "shape", ints, &n));
  assert_int_equal(n, 3);
  assert_int_equal(ints[2], 6);
  assert_string_equal(stoke_cfg_where(c, "optimizer", "lr"), "command line");
  /* the later override of the same key wins */
  ok(stoke_cfg_override(c, "optimizer.lr=0.25"));
  ok(stoke_cfg_float(c, "optimizer", "lr", &f));
  assert_true(f == 0.25);
  stoke_cfg_free(c);
}

static void bad_override_form(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(stoke_cfg_override(c, "optimizer.lr"), STOKE_E_INVALID,
             "command line: 'optimizer.lr': expected section.key=value");
  expect_err(stoke_cfg_override(c, "lr=0.1"), STOKE_E_INVALID,
             "command line: 'lr=0.1': expected section.key=value");
  ok(stoke_cfg_override(c, "optimizer.lr=abc"));
  expect_err(stoke_cfg_validate(c), STOKE_E_INVALID,
             "command line: optimizer.lr=abc: [optimizer] lr = 'abc': not a number (float expected)");
  double f;
  expect_err(stoke_cfg_float(c, "optimizer", "lr", &f), STOKE_E_INVALID,
             "command line: optimizer.lr=abc: [optimizer] lr = 'abc': not a number (float expected)");
  stoke_cfg_free(c);

  c = make_cfg();
  ok(stoke_cfg_override(c, "optimizer.momentun=0.5"));
  expect_err(stoke_cfg_validate(c), STOKE_E_INVALID,
             "command line: optimizer.momentun=0.5: [optimizer] unknown key 'momentun' "
             "(did you mean 'momentum'?)");
  stoke_cfg_free(c);

  c = make_cfg();
  ok(stoke_cfg_override(c, "optimiser.lr=0.5"));
  expect_err(stoke_cfg_validate(c), STOKE_E_INVALID,
             "command line: optimiser.lr=0.5: unknown section [optimiser] "
             "(did you mean [optimizer]?)");
  stoke_cfg_free(c);
}

static void unknown_section_suggests(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "; comment\n\n[optimiser]\nlr = 0.1\n"), STOKE_E_INVALID,
             "run.ini:3: unknown section [optimiser] (did you mean [optimizer]?)");
  stoke_cfg_free(c);

  /* an empty unknown section is still reported, at its header */
  c = make_cfg();
  expect_err(load_validate(c, "[run]\nsteps = 1\n[zzzzzzz]\n"), STOKE_E_INVALID,
             "run.ini:3: unknown section [zzzzzzz] (sections: [run], [optimizer], [data])");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "\nsteps = 1\n"), STOKE_E_INVALID,
             "run.ini:2: key 'steps' is outside any [section]");
  stoke_cfg_free(c);
}

static void unknown_key_suggests(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  char text[2048] = "[optimizer]\n";
  for (int i = 2; i < 42; i++) strcat(text, i % 3 ? "; padding\n" : "\n");
  strcat(text, "momentun = 0.9\n");
  expect_err(load_validate(c, text), STOKE_E_INVALID,
             "run.ini:42: [optimizer] unknown key 'momentun' (did you mean 'momentum'?)");
  stoke_cfg_free(c);

  /* case-insensitive distance */
  c = make_cfg();
  expect_err(load_validate(c, "[optimizer]\nLR = 0.1\n"), STOKE_E_INVALID,
             "run.ini:2: [optimizer] unknown key 'LR' (did you mean 'lr'?)");
  stoke_cfg_free(c);
}

/* A key of another section says where it is, and PyTorch's names for ours say ours. */
static void unknown_key_elsewhere(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[run]\nlr = 0.1\n"), STOKE_E_INVALID,
             "run.ini:2: [run] unknown key 'lr': it is a key of [optimizer] (optimizer.lr on the command line)");
  stoke_cfg_free(c);
  c = make_cfg();
  expect_err(load_validate(c, "[optimizer]\nmax_steps = 10\n"), STOKE_E_INVALID,
             "run.ini:2: [optimizer] unknown key 'max_steps': stoke's is [run] steps");
  stoke_cfg_free(c);
  /* nanoGPT's names, before any near spelling (block_size is one edit from batch_size) */
  c = make_cfg();
  expect_err(load_validate(c, "[run]\nmax_iters = 10\n"), STOKE_E_INVALID,
             "run.ini:2: [run] unknown key 'max_iters': stoke's is [run] steps");
  stoke_cfg_free(c);
}

static void unknown_key_lists_keys(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[optimizer]\nlr = 0.1\nbeta_sched = 7\n"), STOKE_E_INVALID,
             "run.ini:3: [optimizer] unknown key 'beta_sched' "
             "(keys of [optimizer]: name, lr, momentum, nesterov, weight_decay)");
  stoke_cfg_free(c);
}

static void bad_int(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[data]\nsource = x\nbatch = 12abc\n"), STOKE_E_INVALID,
             "run.ini:3: [data] batch = '12abc': not an integer");
  int64_t i;
  expect_err(stoke_cfg_int(c, "data", "batch", &i), STOKE_E_INVALID,
             "run.ini:3: [data] batch = '12abc': not an integer");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[data]\nbatch = 1.5\n"), STOKE_E_INVALID,
             "run.ini:2: [data] batch = '1.5': not an integer");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[run]\nseed = 99999999999999999999\n"), STOKE_E_INVALID,
             "run.ini:2: [run] seed = '99999999999999999999': out of range for a 64-bit integer");
  stoke_cfg_free(c);
}

static void bad_float(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[optimizer]\n\n\n\n\n\nlr = abc\n"), STOKE_E_INVALID,
             "run.ini:7: [optimizer] lr = 'abc': not a number (float expected)");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[optimizer]\nlr = nan\n"), STOKE_E_INVALID,
             "run.ini:2: [optimizer] lr = 'nan': not a finite number");
  stoke_cfg_free(c);
}

static void out_of_range(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[optimizer]\n;\n;\n;\n;\n;\nlr = 5\n"), STOKE_E_INVALID,
             "run.ini:7: [optimizer] lr = 5: out of range [0, 1]");
  double f;
  expect_err(stoke_cfg_float(c, "optimizer", "lr", &f), STOKE_E_INVALID,
             "run.ini:7: [optimizer] lr = 5: out of range [0, 1]");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[run]\nsteps = 0\n"), STOKE_E_INVALID,
             "run.ini:2: [run] steps = 0: out of range [1, 1000000000]");
  stoke_cfg_free(c);

  /* min == max == 0: unbounded */
  c = make_cfg();
  ok(load_validate(c, "[run]\nseed = -9223372036854775808\n"));
  int64_t i;
  ok(stoke_cfg_int(c, "run", "seed", &i));
  assert_true(i == INT64_MIN);
  stoke_cfg_free(c);
}

static void bad_bool(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[optimizer]\nnesterov = maybe\n"), STOKE_E_INVALID,
             "run.ini:2: [optimizer] nesterov = 'maybe': not a boolean "
             "(true/false, yes/no, on/off, 1/0)");
  stoke_cfg_free(c);
  c = make_cfg();
  ok(load_validate(c, "[optimizer]\nnesterov = OFF\n[run]\nverbose = 1\n"));
  int b;
  ok(stoke_cfg_bool(c, "optimizer", "nesterov", &b));
  assert_int_equal(b, 0);
  ok(stoke_cfg_bool(c, "run", "verbose", &b));
  assert_int_equal(b, 1);
  stoke_cfg_free(c);
}

static void bad_enum(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[run]\n\n\n\n\n\n\n\nprecision = fp33\n"), STOKE_E_INVALID,
             "run.ini:9: [run] precision = 'fp33': not one of fp32|tf32|bf16|fp16 "
             "(did you mean 'fp32'?)");
  const char *s;
  expect_err(stoke_cfg_str(c, "run", "precision", &s), STOKE_E_INVALID,
             "run.ini:9: [run] precision = 'fp33': not one of fp32|tf32|bf16|fp16 "
             "(did you mean 'fp32'?)");
  stoke_cfg_free(c);

  /* case-sensitive, but the suggestion finds it */
  c = make_cfg();
  expect_err(load_validate(c, "[run]\nprecision = BF16\n"), STOKE_E_INVALID,
             "run.ini:2: [run] precision = 'BF16': not one of fp32|tf32|bf16|fp16 "
             "(did you mean 'bf16'?)");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[run]\nprecision = double_precision\n"), STOKE_E_INVALID,
             "run.ini:2: [run] precision = 'double_precision': not one of fp32|tf32|bf16|fp16");
  stoke_cfg_free(c);
}

static void bad_ints_and_lists(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(load_validate(c, "[data]\nshape = 3, x, 4\n"), STOKE_E_INVALID,
             "run.ini:2: [data] shape = '3, x, 4': value 2 'x' is not an integer");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[data]\nshape = 3, 5000\n"), STOKE_E_INVALID,
             "run.ini:2: [data] shape = '3, 5000': value 2 = 5000 is out of range [1, 4096]");
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[data]\nshape = 3,,4\n"), STOKE_E_INVALID,
             "run.ini:2: [data] shape = '3,,4': value 2 is empty");
  stoke_cfg_free(c);

  c = make_cfg();
  char text[512] = "[data]\nshape = 1";
  for (int i = 0; i < STOKE_CFG_MAX_LIST; i++) strcat(text, ",1");
  strcat(text, "\n");
  stoke_err *e = load_validate(c, text);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, ": more than 32 values"));
  stoke_err_free(e);
  stoke_cfg_free(c);

  c = make_cfg();
  expect_err(load_validate(c, "[run]\nengines = cudnn, , cpu\n"), STOKE_E_INVALID,
             "run.ini:2: [run] engines = 'cudnn, , cpu': item 2 is empty");
  stoke_cfg_free(c);

  /* an empty list is allowed */
  c = make_cfg();
  ok(load_validate(c, "[run]\nengines =\n"));
  const char *list[STOKE_CFG_MAX_LIST];
  int n = -1;
  ok(stoke_cfg_list(c, "run", "engines", list, &n));
  assert_int_equal(n, 0);
  stoke_cfg_free(c);
}

/* A line of `len` characters: "out = xxx...". */
static char *long_line(size_t len) {
  char *s = malloc(len + 1);
  assert_non_null(s);
  memcpy(s, "out = ", 6);
  memset(s + 6, 'x', len - 6);
  s[len] = '\0';
  return s;
}

static void over_long_line_rejected(void **state) {
  (void)state;
  char *line = long_line(5000);
  size_t n = strlen(line) + 128;
  char *text = malloc(n);
  assert_non_null(text);

  stoke_cfg *c = make_cfg();
  char *path;
  snprintf(text, n, "[run]\n; note\n%s\nsteps = 3\n", line);
  stoke_err *e = load_tmp(c, text, &path);
  expect_errf(e, STOKE_E_INVALID, "%s:3: line longer than 4096 characters", path);
  /* nothing of the failed file is kept */
  assert_int_equal(stoke_cfg_is_set(c, "run", "out"), 0);
  assert_string_equal(stoke_cfg_where(c, "run", "steps"), "default");
  free(path);
  stoke_cfg_free(c);
  free(line);
  free(text);
}

static void long_line_not_truncated(void **state) {
  (void)state;
  char *line = long_line(STOKE_CFG_MAX_LINE);
  size_t n = strlen(line) + 128;
  char *text = malloc(n);
  assert_non_null(text);
  stoke_cfg *c = make_cfg();
  char *path;
  snprintf(text, n, "[run]\r\n%s\r\n\r\nstepz = 3\r\n", line);
  ok(load_tmp(c, text, &path));
  const char *s;
  ok(stoke_cfg_str(c, "run", "out", &s));
  assert_int_equal(strlen(s), STOKE_CFG_MAX_LINE - 6);
  expect_errf(stoke_cfg_validate(c), STOKE_E_INVALID,
              "%s:4: [run] unknown key 'stepz' (did you mean 'steps'?)", path);
  free(path);
  stoke_cfg_free(c);
  free(line);

  /* one over is refused */
  line = long_line(STOKE_CFG_MAX_LINE + 1);
  c = make_cfg();
  snprintf(text, n, "[run]\n%s", line);
  expect_err(stoke_cfg_load_string(c, "run.ini", text), STOKE_E_INVALID,
             "run.ini:2: line longer than 4096 characters");
  stoke_cfg_free(c);
  free(line);
  free(text);
}

static void duplicate_key(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  expect_err(stoke_cfg_load_string(c, "run.ini",
                                   "[optimizer]\nlr = 0.1\n[run]\nsteps = 2\n[optimizer]\n"
                                   "; again\nlr = 0.2\n"),
             STOKE_E_INVALID, "run.ini:7: [optimizer] key 'lr' given twice (first at line 2)");
  stoke_cfg_free(c);

  /* across files the later one wins */
  c = make_cfg();
  ok(stoke_cfg_load_string(c, "a.ini", "[optimizer]\nlr = 0.1\n"));
  ok(stoke_cfg_load_string(c, "b.ini", "\n[optimizer]\nlr = 0.2\n"));
  double f;
  ok(stoke_cfg_float(c, "optimizer", "lr", &f));
  assert_true(f == 0.2);
  assert_string_equal(stoke_cfg_where(c, "optimizer", "lr"), "b.ini:3");
  stoke_cfg_free(c);
}

static void missing_file(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  char path[4200];
  snprintf(path, sizeof path, "%s/no/such/run.ini", tmp_dir());
  expect_errf(stoke_cfg_load_file(c, path), STOKE_E_NOT_FOUND,
              "cannot open config '%s': No such file or directory", path);
  stoke_cfg_free(c);
}

/* Lines that are neither key = value, a [section] nor a comment. inih drops
 * what follows "]" (a key there would be lost without a word), and lines
 * ended by CR alone are one long line to it (every key after the first
 * header lost): both are errors too. */
static void syntax_errors(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"[run]\n\nsteps 5\n", "run.ini:3: syntax error: 'steps 5' is not 'key = value', a [section] or a comment"},
      {"; x\n[run\nsteps = 5\n", "run.ini:2: syntax error: '[run' has no closing ']'"},
      {"[run]\n= 5\n", "run.ini:2: syntax error: no key name before '='"},
      {"; x\n[run] steps = 5\n",
       "run.ini:2: text after the section header: 'steps = 5' (put each key = value on a line of its own after [run])"},
      {"[run]]\nsteps = 5\n",
       "run.ini:1: text after the section header: ']' (put each key = value on a line of its own after [run])"},
      {"[run]\rsteps = 5\rlr = 99\r", "run.ini:1: a carriage return inside a line (the file's lines end with CR alone, "
                                       "as old Mac files do?): save it with LF (or CR LF) line endings"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    stoke_cfg *c = make_cfg();
    expect_err(stoke_cfg_load_string(c, "run.ini", cases[i].text), STOKE_E_INVALID, cases[i].want);
    stoke_cfg_free(c);
  }
}

static void comments_keep_line_numbers(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  ok(load_validate(c,
                   "# header comment\n"
                   "; another\n"
                   "\n"
                   "[run]   ; the run\n"
                   "  steps = 10   ; inline\n"
                   "out = a#b ; '#' inside a word stays\n"
                   "   \t\n"
                   "\n"
                   "[optimizer] # hash comment\n"
                   "    # indented comment\n"
                   "lr = 0.5 # hash inline\n"));
  int64_t i;
  double f;
  const char *s;
  ok(stoke_cfg_int(c, "run", "steps", &i));
  assert_int_equal(i, 10);
  ok(stoke_cfg_str(c, "run", "out", &s));
  assert_string_equal(s, "a#b");
  ok(stoke_cfg_float(c, "optimizer", "lr", &f));
  assert_true(f == 0.5);
  assert_string_equal(stoke_cfg_where(c, "run", "steps"), "run.ini:5");
  assert_string_equal(stoke_cfg_where(c, "run", "out"), "run.ini:6");
  assert_string_equal(stoke_cfg_where(c, "optimizer", "lr"), "run.ini:11");
  stoke_cfg_free(c);

  /* the first problem in file order is the one returned */
  c = make_cfg();
  expect_err(load_validate(c, "[run]\n; x\nsteps = -1\n[optimizer]\nlr = abc\n"),
             STOKE_E_INVALID, "run.ini:3: [run] steps = -1: out of range [1, 1000000000]");
  stoke_cfg_free(c);
}

static void dump_round_trips(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  ok(load_validate(c, "[run]\nsteps = 42\nout = my runs\nengines = a, b\n"
                      "[optimizer]\nname = adamw\nlr = 0.003\n"));
  ok(stoke_cfg_override(c, "data.shape=3,32,32"));
  ok(stoke_cfg_override(c, "run.verbose=on"));

  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  stoke_cfg_dump(c, f);
  fclose(f);
  assert_non_null(strstr(buf, "; learning rate (set at run.ini:7)\nlr = 0.003\n"));
  assert_non_null(strstr(buf, "; Nesterov momentum\nnesterov = false\n"));
  assert_non_null(strstr(buf, "(set at command line)\nshape = 3,32,32\n"));

  char *path = write_tmp(buf);
  stoke_cfg *d = make_cfg();
  ok(stoke_cfg_load_file(d, path));
  ok(stoke_cfg_validate(d));
  for (int s = 0; s < 3; s++) {
    const char *sec = s == 0 ? "run" : s == 1 ? "optimizer" : "data";
    const stoke_cfg_key_v1 *keys = s == 0 ? run_keys : s == 1 ? opt_keys : data_keys;
    int nk = s == 0 ? N(run_keys) : s == 1 ? N(opt_keys) : N(data_keys);
    for (int k = 0; k < nk; k++) {
      assert_int_equal(stoke_cfg_is_set(d, sec, keys[k].key), 1);
      if (keys[k].type == STOKE_CFG_STR || keys[k].type == STOKE_CFG_ENUM) {
        const char *x, *y;
        ok(stoke_cfg_str(c, sec, keys[k].key, &x));
        ok(stoke_cfg_str(d, sec, keys[k].key, &y));
        assert_string_equal(x, y);
      }
    }
  }
  int64_t ints[STOKE_CFG_MAX_LIST];
  int n, b;
  double lr;
  ok(stoke_cfg_ints(d, "data", "shape", ints, &n));
  assert_int_equal(n, 3);
  assert_int_equal(ints[2], 32);
  ok(stoke_cfg_bool(d, "run", "verbose", &b));
  assert_int_equal(b, 1);
  ok(stoke_cfg_float(d, "optimizer", "lr", &lr));
  assert_true(lr == 0.003);

  stoke_cfg_free(d);
  free(path);
  free(buf);
  stoke_cfg_free(c);
}

static void help_lists_every_key(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  stoke_cfg_help(c, f);
  fclose(f);
  const stoke_cfg_key_v1 *all[] = {run_keys, opt_keys, data_keys};
  int counts[] = {N(run_keys), N(opt_keys), N(data_keys)};
  for (int s = 0; s < 3; s++)
    for (int k = 0; k < counts[s]; k++) {
      char needle[128];
      snprintf(needle, sizeof needle, "\n  %s (", all[s][k].key);
      if (!strstr(buf, needle)) print_error("missing %s in:\n%s", all[s][k].key, buf);
      assert_non_null(strstr(buf, needle));
    }
  assert_non_null(strstr(buf, "[optimizer]  the optimizer\n"));
  assert_non_null(strstr(buf, "  lr (float, default: 0.1, range [0, 1]) learning rate\n"));
  assert_non_null(strstr(buf, "  precision (enum, default: fp32, one of fp32|tf32|bf16|fp16) "
                              "number format\n"));
  assert_non_null(strstr(buf, "  shape (ints, default: 28, 28, range [1, 4096]) sample shape\n"));
  free(buf);
  stoke_cfg_free(c);
}

static void declare_and_getter_misuse(void **state) {
  (void)state;
  stoke_cfg *c = make_cfg();
  static const stoke_cfg_key_v1 dup[] = {{"lr", STOKE_CFG_FLOAT, "0.1", 0, 0, NULL, "again"}};
  expect_err(stoke_cfg_declare(c, "optimizer", NULL, dup, 1), STOKE_E_DUPLICATE,
             "config key [optimizer] lr is declared already, by the core or a part loaded before (`train "
             "--help-config` lists [optimizer]'s keys): a part may not declare it again; give the part's key another "
             "name, or read the existing one (stoke_host->cfg_int and the like)");
  static const stoke_cfg_key_v1 twice[] = {{"rho", STOKE_CFG_FLOAT, "0.1", 0, 1, NULL, "one"},
                                           {"rho", STOKE_CFG_FLOAT, "0.2", 0, 1, NULL, "two"}};
  expect_err(stoke_cfg_declare(c, "optimizer", NULL, twice, 2), STOKE_E_DUPLICATE,
             "config key [optimizer] rho declared twice in one key table");
  static const stoke_cfg_key_v1 bad_def[] = {
      {"beta1", STOKE_CFG_FLOAT, "0.9", 0, 1, NULL, "fine"},
      {"beta2", STOKE_CFG_FLOAT, "high", 0, 1, NULL, "default does not parse"}};
  expect_err(stoke_cfg_declare(c, "optimizer", NULL, bad_def, 2), STOKE_E_INTERNAL,
             "default of [optimizer] beta2 = 'high': not a number (float expected)");
  /* all or nothing: beta1 was not declared either */
  double f;
  expect_err(stoke_cfg_float(c, "optimizer", "beta1", &f), STOKE_E_INTERNAL,
             "config key [optimizer] beta1 is not declared (read with stoke_cfg_float)");
  int64_t i;
  expect_err(stoke_cfg_int(c, "optimizer", "lr", &i), STOKE_E_INTERNAL,
             "config key [optimizer] lr is float, read with stoke_cfg_int");
  expect_err(stoke_cfg_int(c, "nosuch", "x", &i), STOKE_E_INTERNAL,
             "config key [nosuch] x is not declared (read with stoke_cfg_int)");
  int b;
  expect_err(stoke_cfg_bool(c, "run", "precision", &b), STOKE_E_INTERNAL,
             "config key [run] precision is enum, read with stoke_cfg_bool");

  /* a plugin's keys added to a section later */
  static const stoke_cfg_key_v1 more[] = {
      {"hidden", STOKE_CFG_INTS, "", 1, 65536, NULL, "hidden sizes"}};
  ok(stoke_cfg_declare(c, "model", "the model", NULL, 0));
  ok(stoke_cfg_declare(c, "model", NULL, more, 1));
  int64_t ints[STOKE_CFG_MAX_LIST];
  int n = -1;
  ok(stoke_cfg_ints(c, "model", "hidden", ints, &n));
  assert_int_equal(n, 0);
  stoke_cfg_free(c);
}

/* ------------------------------------------------ the run's typed config */

static stoke_cfg *run_cfg(const char *text) {
  stoke_cfg *c = stoke_cfg_new();
  ok(stoke_declare_core_keys(c));
  ok(stoke_cfg_load_string(c, "r.ini", text));
  return c;
}

/* Every kind of key lands in its typed field: given values, defaults,
 * enums as enums, auto as 0, lists of numbers as op attributes. */
static void run_config_typed(void **state) {
  stoke_cfg *c = run_cfg("[run]\nsteps = 7\nlayout = nhwc\nprogress = off\nbackends = cuda, cpu\ncuda_graph = true\n"
                         "[data]\nbatch_size = auto\nworkers = 3\nmean = 0.5, 0.25\non_device = true\n"
                         "[eval_data]\nsource = synthetic\nbatch_size = 64\n"
                         "[optimizer]\nname = adamw\nlr = 0.003\nschedule = step\nbase_batch = 512\n");
  stoke_run_config rc;
  ok(stoke_run_config_read(c, &rc));
  assert_ptr_equal(rc.cfg, c);
  assert_int_equal(rc.run.steps, 7);
  assert_int_equal(rc.run.layout, STOKE_NHWC);
  assert_int_equal(rc.run.progress, STOKE_SHOW_OFF);
  assert_int_equal(rc.run.device, STOKE_DEVICE_AUTO);
  assert_int_equal(rc.run.n_backends, 2);
  assert_string_equal(rc.run.backends[0], "cuda");
  assert_int_equal(rc.run.cuda_graph, 1);
  assert_int_equal(rc.run.accumulate, 1);   /* defaults */
  assert_int_equal(rc.run.log_every, 10);
  assert_int_equal(rc.run.checkpoint, 1);
  assert_string_equal(rc.run.precision, "fp32");
  assert_string_equal(rc.data.section, "data");
  assert_string_equal(rc.data.source, "synthetic");
  assert_int_equal(rc.data.batch, 0); /* auto */
  assert_int_equal(rc.data.workers, 3);
  assert_int_equal(rc.data.prefetch, 4);
  assert_int_equal(rc.data.shuffle, 1);
  assert_int_equal(rc.data.on_device, 1);
  assert_string_equal(rc.data.mean, "0.5:0.25");
  assert_string_equal(rc.data.std, "1");
  assert_string_equal(rc.eval_data.section, "eval_data");
  assert_int_equal(rc.eval_data.batch, 64);
  assert_int_equal(rc.eval_data.shuffle, 0);
  assert_string_equal(rc.optimizer.name, "adamw");
  assert_true(rc.optimizer.lr == 0.003);
  assert_int_equal(rc.optimizer.schedule, STOKE_LR_STEP);
  assert_int_equal(rc.optimizer.base_batch, 512);
  assert_true(rc.loss.label_smoothing == 0);
  stoke_cfg_free(c);
}

/* A bad value still names its file:line, read once at the start. */
static void run_config_errors_say_where(void **state) {
  stoke_run_config rc;
  stoke_cfg *c = run_cfg("[run]\nsteps = 7\n[data]\nbatch_size = lots\n");
  expect_err(stoke_run_config_read(c, &rc), STOKE_E_INVALID,
             "r.ini:4: [data] batch_size = 'lots': a number of samples (1 to 16777216) or auto");
  stoke_cfg_free(c);
  c = run_cfg("[data]\nmean = 0.5, half\n");
  expect_err(stoke_run_config_read(c, &rc), STOKE_E_INVALID, "r.ini:2: [data] mean: 'half' is not a finite number");
  stoke_cfg_free(c);
  c = run_cfg("[data]\nstd = 0.2, nan\n");
  expect_err(stoke_run_config_read(c, &rc), STOKE_E_INVALID, "r.ini:2: [data] std: 'nan' is not a finite number");
  stoke_cfg_free(c);
  c = run_cfg("[data]\n\nstd = 0.2, 0\n");
  expect_err(stoke_run_config_read(c, &rc), STOKE_E_INVALID,
             "r.ini:3: [data] std: 0 must be > 0 (the inputs are divided by it)");
  stoke_cfg_free(c);
  /* a list longer than its 255 characters: refused, never written past them */
  char long_mean[1200] = "[data]\nmean = ";
  for (int i = 0; i < 6; i++) {
    size_t at = strlen(long_mean);
    memset(long_mean + at, '1', 150);
    strcpy(long_mean + at + 150, i < 5 ? ", " : "\n");
    long_mean[at] = '0', long_mean[at + 1] = '.';
  }
  c = run_cfg(long_mean);
  expect_err(stoke_run_config_read(c, &rc), STOKE_E_INVALID,
             "r.ini:2: [data] mean: the list is longer than 255 characters (one value a channel, e.g. 0.485, 0.456, "
             "0.406)");
  stoke_cfg_free(c);
  /* [eval_data] is read only when it names a source */
  c = run_cfg("[eval_data]\nworkers = many\n");
  ok(stoke_run_config_read(c, &rc));
  assert_string_equal(rc.eval_data.source, "");
  stoke_cfg_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(good_file_every_type),
      cmocka_unit_test(defaults_when_absent),
      cmocka_unit_test(overrides_win),
      cmocka_unit_test(bad_override_form),
      cmocka_unit_test(unknown_section_suggests),
      cmocka_unit_test(unknown_key_suggests),
      cmocka_unit_test(unknown_key_elsewhere),
      cmocka_unit_test(unknown_key_lists_keys),
      cmocka_unit_test(bad_int),
      cmocka_unit_test(bad_float),
      cmocka_unit_test(out_of_range),
      cmocka_unit_test(bad_bool),
      cmocka_unit_test(bad_enum),
      cmocka_unit_test(bad_ints_and_lists),
      cmocka_unit_test(over_long_line_rejected),
      cmocka_unit_test(long_line_not_truncated),
      cmocka_unit_test(duplicate_key),
      cmocka_unit_test(missing_file),
      cmocka_unit_test(syntax_errors),
      cmocka_unit_test(comments_keep_line_numbers),
      cmocka_unit_test(dump_round_trips),
      cmocka_unit_test(help_lists_every_key),
      cmocka_unit_test(declare_and_getter_misuse),
      cmocka_unit_test(run_config_typed),
      cmocka_unit_test(run_config_errors_say_where),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
