/* tests/lmdb/record_test.c: the stoke record and metadata formats and the
 * Caffe Datum decoder (sources/lmdb/record.c): round trips, every truncation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sources/lmdb/record.h"

#define EXPECT_WHY(call, sub)                                                 \
  do {                                                                        \
    char why_[STOKE_WHY_BYTES] = "";                                          \
    int rc_ = (call);                                                         \
    if (rc_ != -1 || !strstr(why_, (sub))) {                                  \
      print_error("%s:%d: expected failure with \"%s\", got rc %d: \"%s\"\n", \
                  __FILE__, __LINE__, (sub), rc_, why_);                      \
      fail();                                                                 \
    }                                                                         \
  } while (0)
#define WHY why_, sizeof why_

/* ------------------------------------------------------------ records */

static size_t make_raw(uint8_t *buf, size_t cap, uint8_t *pixels) {
  for (int i = 0; i < 2 * 3 * 3; i++) pixels[i] = (uint8_t)(i * 13 + 1);
  stoke_rec r = {STOKE_ENC_RAW, 7, 2, 3, 3, 18, pixels};
  return stoke_rec_encode(&r, buf, cap);
}

static void test_record_round_trip(void **state) {
  (void)state;
  uint8_t px[18], buf[128];
  size_t n = make_raw(buf, sizeof buf, px);
  assert_int_equal(n, STOKE_REC_HEADER_BYTES + 18);
  /* the documented layout, little-endian */
  assert_memory_equal(buf, "STKR", 4);
  assert_int_equal(buf[4], 1);
  assert_int_equal(buf[5], 0);
  assert_int_equal(buf[6], STOKE_ENC_RAW);
  assert_int_equal(buf[8], 7);
  assert_int_equal(buf[12], 2);
  assert_int_equal(buf[16], 3);
  assert_int_equal(buf[20], 3);
  assert_int_equal(buf[24], 18);
  stoke_rec r;
  char why[STOKE_WHY_BYTES];
  assert_int_equal(stoke_rec_decode(buf, n, &r, why, sizeof why), 0);
  assert_int_equal(r.encoding, STOKE_ENC_RAW);
  assert_int_equal(r.label, 7);
  assert_int_equal(r.height, 2);
  assert_int_equal(r.width, 3);
  assert_int_equal(r.channels, 3);
  assert_int_equal(r.payload_bytes, 18);
  assert_memory_equal(r.payload, px, 18);

  /* JPEG records carry any payload length; negative labels survive */
  const uint8_t jpeg[5] = {0xff, 0xd8, 1, 2, 3};
  stoke_rec j = {STOKE_ENC_JPEG, -3, 100, 200, 1, 5, jpeg};
  assert_int_equal(stoke_rec_encode(&j, buf, 10), 0); /* too small */
  n = stoke_rec_encode(&j, buf, sizeof buf);
  assert_int_equal(n, STOKE_REC_HEADER_BYTES + 5);
  assert_int_equal(stoke_rec_decode(buf, n, &r, why, sizeof why), 0);
  assert_int_equal(r.encoding, STOKE_ENC_JPEG);
  assert_int_equal(r.label, -3);
  assert_int_equal(r.height, 100);
  assert_int_equal(r.width, 200);
  assert_memory_equal(r.payload, jpeg, 5);
}

static void test_record_every_truncation(void **state) {
  (void)state;
  uint8_t px[18], buf[128];
  size_t n = make_raw(buf, sizeof buf, px);
  stoke_rec r;
  for (size_t len = 0; len < n; len++) {
    char why[STOKE_WHY_BYTES] = "";
    if (stoke_rec_decode(buf, len, &r, why, sizeof why) != -1) {
      print_error("a record cut to %zu of %zu bytes was accepted\n", len, n);
      fail();
    }
    const char *want = len < 4 ? "too short" : "truncated";
    if (!strstr(why, want)) {
      print_error("cut to %zu bytes: \"%s\" lacks \"%s\"\n", len, why, want);
      fail();
    }
  }
  EXPECT_WHY(stoke_rec_decode(buf, 10, &r, WHY), "header");
}

static void test_record_rejects_bad_fields(void **state) {
  (void)state;
  uint8_t px[18], good[128], b[160];
  size_t n = make_raw(good, sizeof good, px);
  stoke_rec r;

  memcpy(b, good, n);
  b[0] = 'X';
  EXPECT_WHY(stoke_rec_decode(b, n, &r, WHY), "bad magic \"XTKR\"");
  memcpy(b, good, n);
  b[4] = 2;
  EXPECT_WHY(stoke_rec_decode(b, n, &r, WHY), "record version 2");
  memcpy(b, good, n);
  b[6] = 9;
  EXPECT_WHY(stoke_rec_decode(b, n, &r, WHY), "unknown encoding 9");
  memcpy(b, good, n);
  b[7] = 1;
  EXPECT_WHY(stoke_rec_decode(b, n, &r, WHY), "reserved");
  memcpy(b, good, n);
  b[16] = 0; /* width 0 */
  EXPECT_WHY(stoke_rec_decode(b, n, &r, WHY), "zero dimension");
  /* trailing bytes after the payload */
  memcpy(b, good, n);
  b[n] = 0;
  EXPECT_WHY(stoke_rec_decode(b, n + 1, &r, WHY), "trailing");
  /* a consistent value whose raw payload is not H*W*C */
  memcpy(b, good, n);
  b[24] = 17;
  EXPECT_WHY(stoke_rec_decode(b, n - 1, &r, WHY), "needs 18 bytes");
  /* a payload length beyond the value, huge */
  memcpy(b, good, n);
  b[27] = 0xff;
  EXPECT_WHY(stoke_rec_decode(b, n, &r, WHY), "truncated");
  /* an empty JPEG */
  stoke_rec j = {STOKE_ENC_JPEG, 0, 4, 4, 3, 0, NULL};
  n = stoke_rec_encode(&j, b, sizeof b);
  EXPECT_WHY(stoke_rec_decode(b, n, &r, WHY), "empty JPEG");
}

/* ----------------------------------------------------------- metadata */

static void test_meta_round_trip_and_truncation(void **state) {
  (void)state;
  stoke_meta m = {60000, 10, 28, 28, 1, STOKE_ENC_RAW}, d;
  uint8_t b[STOKE_META_BYTES + 4];
  stoke_meta_encode(&m, b);
  assert_memory_equal(b, "STKM", 4);
  char why[STOKE_WHY_BYTES];
  assert_int_equal(stoke_meta_decode(b, STOKE_META_BYTES, &d, why, sizeof why), 0);
  assert_int_equal(d.count, 60000);
  assert_int_equal(d.classes, 10);
  assert_int_equal(d.height, 28);
  assert_int_equal(d.width, 28);
  assert_int_equal(d.channels, 1);
  assert_int_equal(d.encoding, STOKE_ENC_RAW);
  for (size_t len = 0; len < STOKE_META_BYTES; len++) {
    char w[STOKE_WHY_BYTES] = "";
    if (stoke_meta_decode(b, len, &d, w, sizeof w) != -1 || !(strstr(w, "short") || strstr(w, "truncated"))) {
      print_error("metadata cut to %zu bytes: \"%s\"\n", len, w);
      fail();
    }
  }
  b[STOKE_META_BYTES] = 0;
  EXPECT_WHY(stoke_meta_decode(b, STOKE_META_BYTES + 1, &d, WHY), "inconsistent");
  uint8_t c[STOKE_META_BYTES];
  memcpy(c, b, sizeof c);
  c[0] = 'S', c[3] = 'R'; /* a record's magic */
  EXPECT_WHY(stoke_meta_decode(c, sizeof c, &d, WHY), "bad metadata magic \"STKR\"");
  memcpy(c, b, sizeof c);
  c[4] = 3;
  EXPECT_WHY(stoke_meta_decode(c, sizeof c, &d, WHY), "metadata version 3");
  memcpy(c, b, sizeof c);
  c[32] = 5;
  EXPECT_WHY(stoke_meta_decode(c, sizeof c, &d, WHY), "unknown encoding 5");
  memcpy(c, b, sizeof c);
  c[16] = 0; /* classes 0 */
  EXPECT_WHY(stoke_meta_decode(c, sizeof c, &d, WHY), "0 classes");
  stoke_meta j = {5, 2, 8, 8, 2, STOKE_ENC_JPEG};
  stoke_meta_encode(&j, c);
  EXPECT_WHY(stoke_meta_decode(c, sizeof c, &d, WHY), "1 or 3");
}

static void test_keys(void **state) {
  (void)state;
  char k[STOKE_KEY_DIGITS + 1];
  assert_int_equal(stoke_rec_key(42, k), 10);
  assert_string_equal(k, "0000000042");
  stoke_rec_key(0, k);
  assert_string_equal(k, "0000000000");
  stoke_rec_key(STOKE_MAX_INDEX, k);
  assert_string_equal(k, "9999999999");
  /* key order is index order, and the metadata key sorts after them all */
  char a[11], b[11];
  stoke_rec_key(9, a);
  stoke_rec_key(10, b);
  assert_true(strcmp(a, b) < 0);
  assert_true(strcmp(k, STOKE_META_KEY) < 0);
}

/* ------------------------------------------------------- Caffe Datum */

static size_t pb_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}
static size_t pb_tag(uint8_t *p, unsigned field, unsigned wt) { return pb_varint(p, (uint64_t)field << 3 | wt); }
static size_t pb_int(uint8_t *p, unsigned field, int64_t v) {
  size_t n = pb_tag(p, field, 0);
  return n + pb_varint(p + n, (uint64_t)v);
}
static size_t pb_bytes(uint8_t *p, unsigned field, const void *b, size_t len) {
  size_t n = pb_tag(p, field, 2);
  n += pb_varint(p + n, len);
  memcpy(p + n, b, len);
  return n + len;
}

/* A 3x2x4 (CxHxW) Datum with label `label`, plus unknown fields. */
static size_t make_datum(uint8_t *p, int64_t label) {
  uint8_t data[24];
  for (int i = 0; i < 24; i++) data[i] = (uint8_t)(200 - i);
  size_t n = 0;
  n += pb_int(p + n, 1, 3);
  n += pb_int(p + n, 2, 2);
  n += pb_int(p + n, 3, 4);
  n += pb_bytes(p + n, 4, data, sizeof data);
  n += pb_int(p + n, 5, label);
  n += pb_int(p + n, 9, 123456789);        /* unknown varint */
  n += pb_tag(p + n, 10, 5);               /* unknown fixed32 */
  memcpy(p + n, "\1\2\3\4", 4), n += 4;
  n += pb_tag(p + n, 11, 1);               /* unknown fixed64 */
  memcpy(p + n, "\1\2\3\4\5\6\7\10", 8), n += 8;
  n += pb_bytes(p + n, 12, "xyz", 3);      /* unknown bytes */
  n += pb_int(p + n, 7, 0);                /* encoded = false */
  return n;
}

static void test_datum_decode_and_hwc(void **state) {
  (void)state;
  uint8_t p[256] = {0};
  size_t n = make_datum(p, 5);
  stoke_datum d;
  char why[STOKE_WHY_BYTES] = "";
  if (stoke_datum_decode(p, n, &d, why, sizeof why)) print_error("%s\n", why);
  assert_int_equal(d.channels, 3);
  assert_int_equal(d.height, 2);
  assert_int_equal(d.width, 4);
  assert_int_equal(d.label, 5);
  assert_int_equal(d.encoded, 0);
  assert_int_equal(d.data_bytes, 24);
  uint8_t hwc[24];
  stoke_datum_chw_to_hwc(&d, hwc);
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < 2; y++)
      for (int x = 0; x < 4; x++) assert_int_equal(hwc[(y * 4 + x) * 3 + c], 200 - (c * 8 + y * 4 + x));
  /* a negative label is a 10-byte sign-extended varint */
  n = make_datum(p, -2);
  assert_int_equal(stoke_datum_decode(p, n, &d, why, sizeof why), 0);
  assert_int_equal(d.label, -2);
  /* encoded: data holds image bytes, no shape needed */
  size_t m = pb_bytes(p, 4, "\xff\xd8\xff", 3);
  m += pb_int(p + m, 5, 1);
  m += pb_int(p + m, 7, 1);
  assert_int_equal(stoke_datum_decode(p, m, &d, why, sizeof why), 0);
  assert_int_equal(d.encoded, 1);
  assert_int_equal(d.data_bytes, 3);
}

static void test_datum_every_truncation(void **state) {
  (void)state;
  uint8_t p[256] = {0};
  size_t n = make_datum(p, 1);
  stoke_datum d;
  /* cutting anywhere inside a field, or dropping the data field, fails;
   * cuts exactly between fields after the data and the checks still pass */
  int rejected = 0;
  for (size_t len = 0; len < n; len++) {
    char why[STOKE_WHY_BYTES] = "";
    int rc = stoke_datum_decode(p, len, &d, why, sizeof why);
    if (rc == 0) {
      /* only at a field boundary after the data, with the full data */
      assert_int_equal(d.data_bytes, 24);
    } else {
      rejected++;
      assert_true(strlen(why) > 0);
    }
  }
  assert_true(rejected > (int)n - 8);
  /* inside the data bytes */
  EXPECT_WHY(stoke_datum_decode(p, 15, &d, WHY), "truncated");
}

static void test_datum_rejects(void **state) {
  (void)state;
  uint8_t p[256] = {0};
  stoke_datum d;
  size_t n;
  EXPECT_WHY(stoke_datum_decode(p, 0, &d, WHY), "empty");
  /* float_data only */
  n = pb_int(p, 1, 1);
  n += pb_int(p + n, 2, 1);
  n += pb_int(p + n, 3, 1);
  n += pb_tag(p + n, 6, 5);
  memcpy(p + n, "\0\0\x80\x3f", 4), n += 4;
  EXPECT_WHY(stoke_datum_decode(p, n, &d, WHY), "float_data");
  /* data size against the shape */
  n = pb_int(p, 1, 3);
  n += pb_int(p + n, 2, 2);
  n += pb_int(p + n, 3, 2);
  n += pb_bytes(p + n, 4, "abcdef", 6);
  EXPECT_WHY(stoke_datum_decode(p, n, &d, WHY), "data holds 6 bytes");
  /* no shape, not encoded */
  n = pb_bytes(p, 4, "abcdef", 6);
  EXPECT_WHY(stoke_datum_decode(p, n, &d, WHY), "must be positive");
  /* a known field with the wrong wire type */
  n = pb_bytes(p, 5, "ab", 2);
  EXPECT_WHY(stoke_datum_decode(p, n, &d, WHY), "field 5 (label) has wire type 2");
  /* group wire types are not Datum */
  n = pb_tag(p, 4, 3);
  EXPECT_WHY(stoke_datum_decode(p, n, &d, WHY), "wire type 3");
  /* an over-long varint */
  memset(p, 0xff, 12);
  p[0] = 0x08;
  EXPECT_WHY(stoke_datum_decode(p, 12, &d, WHY), "varint");
  /* a length beyond the value */
  n = pb_tag(p, 4, 2);
  n += pb_varint(p + n, 1000);
  EXPECT_WHY(stoke_datum_decode(p, n + 10, &d, WHY), "claims 1000 bytes");
  /* a stoke record is not a Datum */
  uint8_t px[18], rec[128];
  n = make_raw(rec, sizeof rec, px);
  char why[STOKE_WHY_BYTES] = "";
  assert_int_equal(stoke_datum_decode(rec, n, &d, why, sizeof why), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_record_round_trip),
      cmocka_unit_test(test_record_every_truncation),
      cmocka_unit_test(test_record_rejects_bad_fields),
      cmocka_unit_test(test_meta_round_trip_and_truncation),
      cmocka_unit_test(test_keys),
      cmocka_unit_test(test_datum_decode_and_hwc),
      cmocka_unit_test(test_datum_every_truncation),
      cmocka_unit_test(test_datum_rejects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
