/* tests/common/log_capture.h: the log lines stoke writes while a piece of
 * a test runs (stoke_log_set_file), as one NUL-terminated string (free
 * it). Include after cmocka.h. */
#ifndef STOKE_TESTS_LOG_CAPTURE_H
#define STOKE_TESTS_LOG_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "stoke/core.h"

static __attribute__((unused)) char *test_log_of(void (*f)(void *), void *ctx) {
  FILE *lf = tmpfile();
  assert_non_null(lf);
  stoke_log_set_file(lf);
  f(ctx);
  stoke_log_set_file(NULL);
  long n = ftell(lf);
  rewind(lf);
  char *text = calloc(1, (size_t)n + 1);
  assert_non_null(text);
  assert_int_equal(fread(text, 1, (size_t)n, lf), (size_t)n);
  fclose(lf);
  return text;
}

#endif
