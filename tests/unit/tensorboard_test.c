/* tests/unit/tensorboard_test.c: the TensorBoard event file read back with
 * a decoder written here: TFRecord framing with masked CRC-32C computed bit
 * by bit (not core/crc32c.c), the Event and Summary protobufs field by
 * field; the file version event, steps, tags and float values, NaN left
 * out; a record damaged on disk fails its checksum. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/tensorboard.h"

static uint32_t crc32c_bitwise(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

static uint32_t masked(const unsigned char *p, size_t n) {
  uint32_t c = crc32c_bitwise(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t rd_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static uint64_t rd_varint(const unsigned char **p, const unsigned char *end) {
  uint64_t v = 0;
  for (int s = 0; *p < end; s += 7) {
    unsigned char b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) return v;
  }
  fail_msg("varint runs past its message");
  return 0;
}

typedef struct {
  int64_t step;
  double wall;
  char version[32];
  int n;
  char tag[16][48];
  float value[16];
} event;

/* Summary.Value { tag = 1; simple_value = 2 } */
static void decode_value(const unsigned char *p, const unsigned char *end, event *ev) {
  assert_true(ev->n < 16);
  while (p < end) {
    uint64_t k = rd_varint(&p, end);
    if (k == (1 << 3 | 2)) {
      uint64_t n = rd_varint(&p, end);
      assert_true(n < 48 && p + n <= end);
      memcpy(ev->tag[ev->n], p, n);
      ev->tag[ev->n][n] = 0;
      p += n;
    } else if (k == (2 << 3 | 5)) {
      uint32_t bits = (uint32_t)rd_le(p, 4);
      memcpy(&ev->value[ev->n], &bits, 4);
      p += 4;
    } else {
      fail_msg("unexpected Summary.Value key %llu", (unsigned long long)k);
    }
  }
  ev->n++;
}

static void decode_event(const unsigned char *p, const unsigned char *end, event *ev) {
  memset(ev, 0, sizeof *ev);
  while (p < end) {
    uint64_t k = rd_varint(&p, end);
    if (k == (1 << 3 | 1)) { /* wall_time */
      uint64_t bits = rd_le(p, 8);
      memcpy(&ev->wall, &bits, 8);
      p += 8;
    } else if (k == (2 << 3 | 0)) { /* step */
      ev->step = (int64_t)rd_varint(&p, end);
    } else if (k == (3 << 3 | 2)) { /* file_version */
      uint64_t n = rd_varint(&p, end);
      assert_true(n < 32);
      memcpy(ev->version, p, n);
      p += n;
    } else if (k == (5 << 3 | 2)) { /* summary: repeated Value value = 1 */
      uint64_t n = rd_varint(&p, end);
      const unsigned char *s = p, *se = p + n;
      while (s < se) {
        assert_int_equal(rd_varint(&s, se), 1 << 3 | 2);
        uint64_t m = rd_varint(&s, se);
        decode_value(s, s + m, ev);
        s += m;
      }
      p = se;
    } else {
      fail_msg("unexpected Event key %llu", (unsigned long long)k);
    }
  }
}

/* Every record of the file; returns how many, or -1 at a bad checksum. */
static int read_events(const char *path, event *ev, int cap) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static unsigned char d[1 << 16];
  size_t n = fread(d, 1, sizeof d, f);
  fclose(f);
  int k = 0;
  for (size_t at = 0; at < n; k++) {
    assert_true(at + 12 <= n && k < cap);
    uint64_t len = rd_le(d + at, 8);
    if ((uint32_t)rd_le(d + at + 8, 4) != masked(d + at, 8)) return -1;
    assert_true(at + 16 + len <= n);
    if ((uint32_t)rd_le(d + at + 12 + len, 4) != masked(d + at + 12, len)) return -1;
    decode_event(d + at + 12, d + at + 12 + len, &ev[k]);
    at += 16 + len;
  }
  return k;
}

static void test_roundtrip(void **state) {
  char dir[512];
  const char *t = getenv("TEST_TMPDIR");
  snprintf(dir, sizeof dir, "%s/tb/a/b", t && t[0] ? t : "/tmp");
  stoke_tb *tb;
  stoke_err *e = stoke_tb_open(dir, &tb);
  assert_null(e);
  assert_non_null(strstr(stoke_tb_path(tb), "/events.out.tfevents."));
  const char *tags[] = {"train/loss", "train/lr", "perf/mfu", "gpu/memory_mib"};
  for (int64_t step = 1; step <= 300; step += 100) {
    double v[] = {2.5 / (double)step, 1e-3, NAN, 81920.0 + (double)step};
    assert_null(stoke_tb_scalars(tb, step, tags, v, 4));
  }
  assert_null(stoke_tb_scalars(tb, (int64_t)1 << 40, tags, (double[]){0.125, 0, 0, 0}, 1)); /* a long varint */
  char path[1024];
  snprintf(path, sizeof path, "%s", stoke_tb_path(tb));
  stoke_tb_close(tb);

  event ev[8];
  assert_int_equal(read_events(path, ev, 8), 5);
  assert_string_equal(ev[0].version, "brain.Event:2");
  assert_int_equal(ev[0].n, 0);
  assert_true(ev[0].wall > 1.6e9);
  for (int i = 0; i < 3; i++) {
    int64_t step = 1 + 100 * i;
    event *x = &ev[i + 1];
    assert_int_equal(x->step, step);
    assert_true(x->wall >= ev[0].wall);
    assert_int_equal(x->n, 3); /* the NaN left out */
    assert_string_equal(x->tag[0], "train/loss");
    assert_string_equal(x->tag[1], "train/lr");
    assert_string_equal(x->tag[2], "gpu/memory_mib");
    assert_true(x->value[0] == (float)(2.5 / (double)step));
    assert_true(x->value[1] == (float)1e-3);
    assert_true(x->value[2] == (float)(81920.0 + (double)step));
  }
  assert_int_equal(ev[4].step, (int64_t)1 << 40);
  assert_true(ev[4].n == 1 && ev[4].value[0] == 0.125f);

  /* one byte of the second record's payload flipped: its CRC fails */
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  unsigned char head[8];
  assert_int_equal(fread(head, 1, 8, f), 8);
  long second = 16 + (long)rd_le(head, 8);
  fseek(f, second + 14, SEEK_SET);
  int c = fgetc(f);
  fseek(f, second + 14, SEEK_SET);
  fputc(c ^ 1, f);
  fclose(f);
  assert_int_equal(read_events(path, ev, 8), -1);
}

/* The masked CRC against the bitwise CRC-32C, whose check value is 0xE3069283. */
static void test_masked_crc(void **state) {
  assert_int_equal(stoke_tb_masked_crc("", 0), masked((const unsigned char *)"", 0));
  assert_int_equal(stoke_tb_masked_crc("123456789", 9), masked((const unsigned char *)"123456789", 9));
  assert_int_equal(crc32c_bitwise((const unsigned char *)"123456789", 9), 0xE3069283u); /* the check value */
  assert_int_equal(stoke_tb_masked_crc("", 0), 0xa282ead8u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_masked_crc),
      cmocka_unit_test(test_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
