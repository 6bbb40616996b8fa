/* tests/fuzz/idx_fuzz.c: fuzz target of tools/convert's IDX reader (plain
 * or gzipped, through zlib's gzread): the first byte picks an image file
 * (magic 0x803, 3 dimensions) or a label file (0x801, 1); the rest is the
 * file, given to the reader by path (a memfd), and read to its end as
 * convert reads it (at most 4 MiB). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tools/idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int images = !(data[0] & 1);
  int fd = memfd_create("idx", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) {
    close(fd);
    return 0;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  gzFile f;
  uint32_t dims[3];
  stoke_err *e = stoke_idx_open(path, images ? 0x803 : 0x801, images ? 3 : 1, &f, dims);
  if (!e) {
    uint64_t total = dims[0];
    if (images) total *= (uint64_t)dims[1] * dims[2];
    static uint8_t buf[1 << 16];
    for (uint64_t at = 0; !e && at < total && at < (1u << 22); at += sizeof buf) {
      unsigned n = total - at < sizeof buf ? (unsigned)(total - at) : (unsigned)sizeof buf;
      e = stoke_idx_read(f, path, buf, n, "the data");
    }
    gzclose(f);
  }
  if (e) stoke_err_free(e);
  close(fd);
  return 0;
}
