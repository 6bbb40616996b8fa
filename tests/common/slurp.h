/* tests/common/slurp.h: a whole file's bytes, NUL-terminated (malloc'd;
 * its size in *n when n is not NULL). Fails the test when the file cannot
 * be read. Include after cmocka.h. */
#ifndef STOKE_TESTS_SLURP_H
#define STOKE_TESTS_SLURP_H

#include <stdio.h>
#include <stdlib.h>

static __attribute__((unused)) char *test_slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  size_t size = (size_t)ftell(f);
  rewind(f);
  char *b = malloc(size + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, size, f), size);
  b[size] = 0;
  fclose(f);
  if (n) *n = size;
  return b;
}

#endif
