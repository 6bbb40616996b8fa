/* tools/idx.h: reading MNIST-style IDX files (gzipped or plain: gzread
 * reads both) for tools/convert and its fuzz target. */
#ifndef STOKE_TOOLS_IDX_H
#define STOKE_TOOLS_IDX_H

#include <stdint.h>

#include <zlib.h>

#include "stoke/core.h"

/* Opens an IDX file and checks its magic (0x803 images, 0x801 labels);
 * dims[] gets its `ndims` sizes, each non-zero. */
stoke_err *stoke_idx_open(const char *path, uint32_t magic, int ndims, gzFile *out, uint32_t *dims);

/* Exactly n bytes of `what` (for the message), or an error saying the file
 * ends inside it or cannot be read. */
stoke_err *stoke_idx_read(gzFile f, const char *path, void *buf, unsigned n, const char *what);

#endif
