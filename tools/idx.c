/* tools/idx.c: MNIST-style IDX files (gzipped or plain) for tools/convert;
 * see idx.h. */
#include "idx.h"

#include <errno.h>
#include <string.h>

stoke_err *stoke_idx_read(gzFile f, const char *path, void *buf, unsigned n, const char *what) {
  int got = gzread(f, buf, n);
  if (got == (int)n) return NULL;
  int zerr = 0;
  const char *msg = gzerror(f, &zerr);
  if (got < 0 || (zerr != Z_OK && zerr != Z_BUF_ERROR))
    return STOKE_ERR(STOKE_E_IO, "%s: cannot read %s: %s", path, what, zerr == Z_ERRNO ? strerror(errno) : msg);
  return STOKE_ERR(STOKE_E_DATA, "%s: truncated: the file ends inside %s", path, what);
}

stoke_err *stoke_idx_open(const char *path, uint32_t magic, int ndims, gzFile *out, uint32_t *dims) {
  gzFile f = gzopen(path, "rb");
  if (!f)
    return STOKE_ERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_IO, "%s: cannot open: %s", path,
                     errno ? strerror(errno) : "out of memory");
  unsigned char h[16];
  stoke_err *e = stoke_idx_read(f, path, h, 4, "the IDX header");
  uint32_t m = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
  if (!e && m != magic)
    e = STOKE_ERR(STOKE_E_DATA, "%s: magic 0x%08x, expected 0x%08x (an IDX %s file)", path, m, magic,
                  magic == 0x803 ? "image" : "label");
  if (!e) e = stoke_idx_read(f, path, h, 4u * (unsigned)ndims, "the IDX header");
  for (int i = 0; !e && i < ndims; i++) {
    dims[i] = (uint32_t)h[4 * i] << 24 | (uint32_t)h[4 * i + 1] << 16 | (uint32_t)h[4 * i + 2] << 8 | h[4 * i + 3];
    if (!dims[i]) e = STOKE_ERR(STOKE_E_DATA, "%s: dimension %d of the IDX header is 0", path, i);
  }
  if (e) {
    gzclose(f);
    return e;
  }
  *out = f;
  return NULL;
}
