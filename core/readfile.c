/* core/readfile.c: a whole file read into memory, for the config (INI),
 * GPT-2's tokenizer files, a prompt file and the images tools/convert
 * reads: one reader instead of one per caller; and a file written whole
 * through a temporary name (the report, the trace, the benchmarks' JSON). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"

stoke_err *stoke_read_file(const char *path, const char *what, char **buf, size_t *n) {
  *buf = NULL, *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f)
    return STOKE_ERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_IO, "cannot open %s '%s': %s", what, path,
                     strerror(errno));
  /* read until EOF, growing the buffer (a pipe or a FIFO has no size to ask for) */
  size_t len = 0, cap = 4096;
  char *b = malloc(cap + 1);
  stoke_err *err = NULL;
  while (b) {
    if (len == cap) {
      char *nb = cap <= (size_t)-1 / 4 ? realloc(b, 2 * cap + 1) : NULL;
      if (!nb) {
        free(b), b = NULL;
        break;
      }
      b = nb, cap *= 2;
    }
    size_t got = fread(b + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  if (!b) err = STOKE_ERR(STOKE_E_OOM, "out of memory reading %s '%s' (%zu bytes so far)", what, path, len);
  else if (ferror(f)) err = STOKE_ERR(STOKE_E_IO, "cannot read %s '%s': %s", what, path, strerror(errno));
  fclose(f);
  if (err) {
    free(b);
    return err;
  }
  b[len] = 0;
  *buf = b, *n = len;
  return NULL;
}

stoke_err *stoke_write_begin(const char *path, const char *what, char *tmp, size_t cap, FILE **f) {
  *f = NULL;
  if ((size_t)snprintf(tmp, cap, "%s.tmp", path) >= cap)
    return STOKE_ERR(STOKE_E_INVALID, "the %s's path '%s' is too long", what, path);
  if (!(*f = fopen(tmp, "w"))) return STOKE_ERR(STOKE_E_IO, "cannot write the %s '%s': %s", what, tmp, strerror(errno));
  return NULL;
}

stoke_err *stoke_write_end(FILE *f, const char *tmp, const char *path, const char *what, stoke_err *e) {
  int bad = ferror(f);
  if ((fclose(f) || bad) && !e)
    e = STOKE_ERR(STOKE_E_IO, "writing the %s '%s' failed: %s (is the disk full?)", what, tmp, strerror(errno));
  if (!e && rename(tmp, path)) e = STOKE_ERR(STOKE_E_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
  if (e) remove(tmp);
  return e;
}
