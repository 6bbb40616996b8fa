/* tests/common/expect.h: cmocka checks on stoke errors shared by the tests:
 * EXPECT_OK(expr) and EXPECT_ERR(expr, code, "substring", ...), which print
 * the whole message on failure and free the error. Include after cmocka.h. */
#ifndef STOKE_TESTS_EXPECT_H
#define STOKE_TESTS_EXPECT_H

#include <string.h>

#include "stoke/core.h"

static __attribute__((unused)) void check_ok(stoke_err *e, const char *file, int line) {
  if (e) {
    print_error("%s:%d: unexpected error: %s\n", file, line, e->msg);
    stoke_err_free(e);
    _fail(file, line);
  }
}
#define EXPECT_OK(expr) check_ok((expr), __FILE__, __LINE__)

/* Checks code and substrings, then frees the error. */
static __attribute__((unused)) void check_err(stoke_err *e, stoke_code code, const char *const *subs, const char *file,
                                              int line) {
  if (!e) {
    print_error("%s:%d: expected a '%s' error, got success\n", file, line, stoke_code_name(code));
    _fail(file, line);
  }
  if (e->code != code) {
    print_error("%s:%d: expected '%s', got '%s': %s\n", file, line, stoke_code_name(code), stoke_code_name(e->code),
                e->msg);
    _fail(file, line);
  }
  for (int i = 0; subs[i]; i++)
    if (!strstr(e->msg, subs[i])) {
      print_error("%s:%d: message lacks \"%s\":\n%s\n", file, line, subs[i], e->msg);
      _fail(file, line);
    }
  stoke_err_free(e);
}
#define EXPECT_ERR(expr, code, ...) \
  check_err((expr), (code), (const char *const[]){__VA_ARGS__, NULL}, __FILE__, __LINE__)

#endif
