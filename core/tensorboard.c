/* core/tensorboard.c: TensorBoard event files in C: each record is TFRecord
 * framing (length, masked CRC-32C of the length, an Event protobuf, masked
 * CRC-32C of it), each Event a wall time, a step and a Summary of scalars.
 *
 * The protobufs are encoded by hand, not with protobuf-c: stoke writes
 * three messages and five fields (Event.wall_time, .step, .file_version,
 * .summary; Summary.Value.tag, .simple_value), about forty lines, where
 * protobuf-c would add protoc-c generated code to the build and a library
 * every binary must find at run time. The field numbers are those of
 * tensorflow/core/util/event.proto and framework/summary.proto; the tests
 * read the file back with a decoder of their own and a Python reader. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stoke/crc32c.h"
#include "stoke/tensorboard.h"

struct stoke_tb {
  FILE *f;
  char path[PATH_MAX];
};

uint32_t stoke_tb_masked_crc(const void *p, size_t n) {
  uint32_t c = stoke_crc32c(0, p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ------------------------------------------------ protobuf wire format */

typedef struct {
  unsigned char *p;
  size_t n, cap;
  int oom;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 256;
    while (cap < b->n + n) cap *= 2;
    unsigned char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void varint(buf *b, uint64_t v) {
  unsigned char x[10];
  int n = 0;
  do {
    x[n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  put(b, x, (size_t)n);
}

/* field number and wire type: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
static void key(buf *b, int field, int wire) { varint(b, (uint64_t)(field << 3 | wire)); }

static void bytes_field(buf *b, int field, const void *p, size_t n) {
  key(b, field, 2);
  varint(b, n);
  put(b, p, n);
}

static void le(buf *b, uint64_t v, int n) {
  unsigned char x[8];
  for (int i = 0; i < n; i++) x[i] = (unsigned char)(v >> (8 * i));
  put(b, x, (size_t)n);
}

/* Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; } */
static void event_head(buf *b, int64_t step) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double wall = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  uint64_t bits;
  memcpy(&bits, &wall, 8);
  key(b, 1, 1);
  le(b, bits, 8);
  key(b, 2, 0);
  varint(b, (uint64_t)step);
}

static stoke_err *write_record(stoke_tb *tb, const buf *ev) {
  if (ev->oom) return STOKE_ERR(STOKE_E_OOM, "out of memory for a TensorBoard event");
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)ev->n >> (8 * i));
  uint32_t c_len = stoke_tb_masked_crc(len, 8), c_data = stoke_tb_masked_crc(ev->p, ev->n);
  unsigned char c[8];
  for (int i = 0; i < 4; i++) c[i] = (unsigned char)(c_len >> (8 * i)), c[4 + i] = (unsigned char)(c_data >> (8 * i));
  fwrite(len, 1, 8, tb->f);
  fwrite(c, 1, 4, tb->f);
  fwrite(ev->p, 1, ev->n, tb->f);
  fwrite(c + 4, 1, 4, tb->f);
  if (fflush(tb->f) || ferror(tb->f))
    return STOKE_ERR(STOKE_E_IO, "writing '%s' failed: %s (is the disk full?)", tb->path, strerror(errno));
  return NULL;
}

/* --------------------------------------------------------------- files */

static stoke_err *mkdirs(const char *path) {
  char b[PATH_MAX];
  snprintf(b, sizeof b, "%s", path);
  for (char *p = b + 1;; p++) {
    if (*p && *p != '/') continue;
    char c = *p;
    *p = 0;
    if (mkdir(b, 0755) && errno != EEXIST)
      return STOKE_ERR(STOKE_E_IO, "cannot create the TensorBoard folder '%s': %s", b, strerror(errno));
    if (!c) return NULL;
    *p = c;
  }
}

stoke_err *stoke_tb_open(const char *dir, stoke_tb **out) {
  STOKE_PROPAGATE(mkdirs(dir));
  stoke_tb *tb = calloc(1, sizeof *tb);
  if (!tb) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  /* TensorFlow's name: events.out.tfevents.<seconds>.<host>; the pid keeps
   * two runs started in one second (ranks of one job) apart */
  snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%ld", dir, (long long)time(NULL), host,
           (long)getpid());
  if (!(tb->f = fopen(tb->path, "wb"))) {
    stoke_err *e = STOKE_ERR(STOKE_E_IO, "cannot write the TensorBoard file '%s': %s", tb->path, strerror(errno));
    free(tb);
    return e;
  }
  buf ev = {0};
  event_head(&ev, 0);
  bytes_field(&ev, 3, "brain.Event:2", 13);
  stoke_err *e = write_record(tb, &ev);
  free(ev.p);
  if (e) {
    stoke_tb_close(tb);
    return e;
  }
  *out = tb;
  return NULL;
}

/* Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; } */
stoke_err *stoke_tb_scalars(stoke_tb *tb, int64_t step, const char *const *tags, const double *values, int n) {
  buf sum = {0}, val = {0}, ev = {0};
  for (int i = 0; i < n; i++) {
    if (!isfinite(values[i])) continue;
    float v = (float)values[i];
    uint32_t bits;
    memcpy(&bits, &v, 4);
    val.n = 0;
    bytes_field(&val, 1, tags[i], strlen(tags[i]));
    key(&val, 2, 5);
    le(&val, bits, 4);
    if (val.oom) break;
    bytes_field(&sum, 1, val.p, val.n);
  }
  event_head(&ev, step);
  if (!sum.oom) bytes_field(&ev, 5, sum.p, sum.n);
  ev.oom |= sum.oom | val.oom;
  stoke_err *e = write_record(tb, &ev);
  free(sum.p);
  free(val.p);
  free(ev.p);
  return e;
}

const char *stoke_tb_path(const stoke_tb *tb) { return tb->path; }

void stoke_tb_close(stoke_tb *tb) {
  if (!tb) return;
  if (tb->f) fclose(tb->f);
  free(tb);
}
