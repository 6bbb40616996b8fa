/* tests/unit/readfile_test.c: stoke_read_file, the one whole-file reader
 * (config, tokenizer files, prompt files, images): a file's bytes whole
 * and NUL-terminated, a pipe read to its end, and each failure a message
 * that names what and where. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stoke/core.h"

static char dir[256];

static int setup(void **state) {
  snprintf(dir, sizeof dir, "/tmp/stoke_readfile_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Bytes with NULs and every value, over several of the reader's 4 KiB growth steps. */
static void test_whole_file(void **state) {
  char path[300];
  snprintf(path, sizeof path, "%s/data.bin", dir);
  size_t want = 3 * 4096 + 17;
  unsigned char *src = malloc(want);
  for (size_t i = 0; i < want; i++) src[i] = (unsigned char)(i * 131 + 7);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(src, 1, want, f), want);
  fclose(f);
  char *buf = NULL;
  size_t n = 0;
  stoke_err *e = stoke_read_file(path, "test file", &buf, &n);
  assert_null(e);
  assert_int_equal(n, want);
  assert_memory_equal(buf, src, want);
  assert_int_equal(buf[n], 0); /* NUL after the bytes */
  free(buf);
  /* an empty file: no bytes, still a buffer */
  snprintf(path, sizeof path, "%s/empty", dir);
  f = fopen(path, "wb");
  fclose(f);
  assert_null(stoke_read_file(path, "test file", &buf, &n));
  assert_int_equal(n, 0);
  assert_int_equal(buf[0], 0);
  free(buf);
  free(src);
}

typedef struct writer {
  const char *path;
  size_t bytes;
} writer;

static void *write_fifo(void *arg) {
  writer *w = arg;
  FILE *f = fopen(w->path, "wb");
  for (size_t i = 0; f && i < w->bytes; i++) fputc('a' + (int)(i % 26), f);
  if (f) fclose(f);
  return NULL;
}

/* A FIFO has no size to ask for: the reader reads to its end. */
static void test_pipe(void **state) {
  char path[300];
  snprintf(path, sizeof path, "%s/fifo", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  writer w = {path, 100000};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, write_fifo, &w), 0);
  char *buf = NULL;
  size_t n = 0;
  stoke_err *e = stoke_read_file(path, "prompt file", &buf, &n);
  pthread_join(t, NULL);
  assert_null(e);
  assert_int_equal(n, w.bytes);
  for (size_t i = 0; i < n; i++)
    if (buf[i] != 'a' + (int)(i % 26)) fail_msg("byte %zu is '%c'", i, buf[i]);
  free(buf);
}

static void test_errors_name_what_and_where(void **state) {
  char path[300], want[400];
  char *buf = (char *)1;
  size_t n = 7;
  snprintf(path, sizeof path, "%s/missing.ini", dir);
  stoke_err *e = stoke_read_file(path, "config", &buf, &n);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_NOT_FOUND);
  snprintf(want, sizeof want, "cannot open config '%s': No such file or directory", path);
  assert_non_null(strstr(e->msg, want));
  assert_null(buf); /* nothing to free on an error */
  assert_int_equal(n, 0);
  stoke_err_free(e);
  /* a directory opens on Linux but does not read */
  e = stoke_read_file(dir, "--prompt-file", &buf, &n);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_IO);
  snprintf(want, sizeof want, "cannot read --prompt-file '%s': Is a directory", dir);
  if (!strstr(e->msg, want)) fail_msg("message '%s' lacks '%s'", e->msg, want);
  assert_null(buf);
  stoke_err_free(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_whole_file), cmocka_unit_test(test_pipe),
                                     cmocka_unit_test(test_errors_name_what_and_where)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
