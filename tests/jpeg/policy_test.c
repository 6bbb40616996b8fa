/* tests/jpeg/policy_test.c: one rule for a JPEG with libjpeg warnings, the
 * same in every stoke reader (sources/jpeg/decode.h): a corrupt scan (the
 * decoder hits a marker inside the entropy-coded data, and the rows below
 * come out gray) is a bad file for the jpeg source, for tools/convert and
 * for the lmdb source's JPEG records alike; extraneous bytes before a
 * marker (a wrapping problem, the pixels intact) are accepted by all three.
 * And CMYK JPEGs (Adobe, inverted as Photoshop writes them) are read by all
 * three, converted to RGB as djpeg and PIL do. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lmdb.h>
#include <turbojpeg.h>

#include "sources/jpeg/decode.h" /* jpeglib.h, whose jconfig.h jerror.h reads */
#include <jerror.h>
#include "sources/lmdb/record.h"
#include "tests/common/expect.h"
#include "tests/common/source_fixture.h"
#include "tests/tools/child.h"

#define H 64
#define W 48

/* A smooth RGB image, as a JPEG (4:4:4, quality 95) of `n` bytes. */
static unsigned char *make_jpeg(unsigned long *n, int cmyk) {
  uint8_t px[H * W * 4];
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      uint8_t *p = px + (y * W + x) * (cmyk ? 4 : 3);
      p[0] = (uint8_t)(40 + 3 * x), p[1] = (uint8_t)(30 + 3 * y), p[2] = (uint8_t)(90 + x + y);
      if (cmyk) p[3] = 255; /* no black: stoke's RGB is C, M, Y as stored */
    }
  tjhandle t = tjInitCompress();
  unsigned char *jpg = NULL;
  assert_int_equal(tjCompress2(t, px, W, 0, H, cmyk ? TJPF_CMYK : TJPF_RGB, &jpg, n, TJSAMP_444, 95, 0), 0);
  tjDestroy(t);
  return jpg;
}

static size_t find_marker(const unsigned char *b, size_t n, unsigned char m) {
  for (size_t i = 0; i + 1 < n; i++)
    if (b[i] == 0xFF && b[i + 1] == m) return i;
  fail_msg("no marker 0x%02x", m);
  return 0;
}

/* The scan cut by an EOI marker 40% of the way in (libjpeg:
 * JWRN_HIT_MARKER, "premature end of data segment"), the file's length
 * kept: what a damaged copy looks like. */
static unsigned char *corrupt_scan(const unsigned char *jpg, unsigned long n) {
  unsigned char *b = malloc(n);
  memcpy(b, jpg, n);
  size_t sos = find_marker(b, n, 0xDA);
  size_t data = sos + 2 + ((size_t)b[sos + 2] << 8 | b[sos + 3]);
  size_t at = data + (n - data) * 2 / 5;
  b[at] = 0xFF, b[at + 1] = 0xD9;
  return b;
}

/* Three stray bytes before the frame header (JWRN_EXTRANEOUS_DATA): the
 * image itself intact. */
static unsigned char *extraneous(const unsigned char *jpg, unsigned long n, unsigned long *out) {
  unsigned char *b = malloc(n + 3);
  size_t sof = find_marker(jpg, n, 0xC0);
  memcpy(b, jpg, sof);
  memcpy(b + sof, "abc", 3);
  memcpy(b + sof + 3, jpg + sof, n - sof);
  *out = n + 3;
  return b;
}

static void write_file(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  fclose(f);
}

static void open_lmdb(opened *o, const char *path) {
  char keys[4300];
  snprintf(keys, sizeof keys, "path = %s\n", path);
  EXPECT_OK(open_source_from(o, "sources/lmdb/libstoke_lmdb.so", "lmdb", keys));
}

/* The pixel the test image has at (y, x), channel c. */
static int want(int y, int x, int c) { return c == 0 ? 40 + 3 * x : c == 1 ? 30 + 3 * y : 90 + x + y; }

static int worst_error(const uint8_t *px, int h, int w) {
  int worst = 0;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < 3; c++) {
        int d = abs(px[(y * w + x) * 3 + c] - want(y * H / h, x * W / w, c));
        worst = d > worst ? d : worst;
      }
  return worst;
}

/* The rule itself, by code. */
static void test_rule(void **state) {
  assert_true(stoke_jpeg_damaging(JWRN_JPEG_EOF));
  assert_true(stoke_jpeg_damaging(JWRN_HIT_MARKER));
  assert_true(stoke_jpeg_damaging(JWRN_HUFF_BAD_CODE));
  assert_true(stoke_jpeg_damaging(JWRN_ARITH_BAD_CODE));
  assert_true(stoke_jpeg_damaging(JWRN_MUST_RESYNC));
  assert_false(stoke_jpeg_damaging(JWRN_EXTRANEOUS_DATA));
  assert_false(stoke_jpeg_damaging(JWRN_JFIF_MAJOR));
  assert_false(stoke_jpeg_damaging(JWRN_ADOBE_XFORM));
  assert_false(stoke_jpeg_damaging(JWRN_NOT_SEQUENTIAL));
}

/* The whole-image decode: the corrupt scan refused with libjpeg's own
 * words (lower case "premature end": convert used to look for "Premature
 * end" and stored such images), the stray bytes and CMYK accepted. */
static void test_decode(void **state) {
  unsigned long n, ne;
  unsigned char *jpg = make_jpeg(&n, 0), *bad = corrupt_scan(jpg, n), *odd = extraneous(jpg, n, &ne);
  unsigned long nc;
  unsigned char *cmyk = make_jpeg(&nc, 1);
  uint8_t *px = NULL;
  int h, w;
  char why[256];
  assert_int_equal(stoke_jpeg_decode(bad, n, 3, 8, 0, 0, &px, &h, &w, why, sizeof why), -1);
  print_message("corrupt scan: %s\n", why);
  assert_non_null(strstr(why, "premature end of data segment"));
  assert_int_equal(stoke_jpeg_decode(odd, ne, 3, 8, 0, 0, &px, &h, &w, why, sizeof why), 0);
  assert_true(worst_error(px, h, w) <= 6);
  free(px);
  assert_int_equal(stoke_jpeg_decode(cmyk, nc, 3, 8, 0, 0, &px, &h, &w, why, sizeof why), 0);
  assert_int_equal(h, H);
  assert_true(worst_error(px, h, w) <= 6);
  free(px);
  tjFree(jpg);
  tjFree(cmyk);
  free(bad);
  free(odd);
}

/* A folder c/: good.jpg, bad.jpg (corrupt scan), odd.jpg (stray bytes),
 * cmyk.jpg; its path in `root`. */
static void make_folder(char *root, size_t cap) {
  char p[4200];
  snprintf(root, cap, "%s/policy", tmpdir());
  mkdir(root, 0755);
  snprintf(p, sizeof p, "%s/c", root);
  mkdir(p, 0755);
  unsigned long n, ne, nc;
  unsigned char *jpg = make_jpeg(&n, 0), *bad = corrupt_scan(jpg, n), *odd = extraneous(jpg, n, &ne),
                *cmyk = make_jpeg(&nc, 1);
  snprintf(p, sizeof p, "%s/c/bad.jpg", root);
  write_file(p, bad, n);
  snprintf(p, sizeof p, "%s/c/cmyk.jpg", root);
  write_file(p, cmyk, nc);
  snprintf(p, sizeof p, "%s/c/good.jpg", root);
  write_file(p, jpg, n);
  snprintf(p, sizeof p, "%s/c/odd.jpg", root);
  write_file(p, odd, ne);
  tjFree(jpg);
  tjFree(cmyk);
  free(bad);
  free(odd);
}

/* The jpeg source: samples 0 bad, 1 cmyk, 2 good, 3 odd. */
static void test_jpeg_source(void **state) {
  char root[4096], keys[4300];
  make_folder(root, sizeof root);
  opened o;
  snprintf(keys, sizeof keys, "root = %s\nsize = 24\ntrain = false\nresize = 24\n", root);
  EXPECT_OK(open_source_from(&o, "sources/jpeg/libstoke_jpeg.so", "jpeg", keys));
  uint8_t px[24 * 24 * 3];
  int32_t label;
  EXPECT_ERR(o.src->read(o.self, 0, 0, px, &label), STOKE_E_DATA, "bad.jpg", "premature end of data segment");
  for (int i = 1; i < 4; i++) EXPECT_OK(o.src->read(o.self, i, 0, px, &label));
  close_source(&o);
}

/* tools/convert: the corrupt scan skipped and said why; the others kept,
 * the CMYK one as RGB. */
static void test_convert(void **state) {
  char root[4096], out[4200], log[8192];
  make_folder(root, sizeof root);
  snprintf(out, sizeof out, "%s/policy.lmdb", tmpdir());
  RUN_OK("tools/convert", log, "folder", "--root", root, "--out", out, "--size", "64x48", "--force");
  EXPECT_HAS(log, "bad.jpg");
  EXPECT_HAS(log, "premature end of data segment");
  EXPECT_HAS(log, "wrote 3 records");
  opened o;
  open_lmdb(&o, out);
  uint8_t px[H * W * 3];
  int32_t label;
  for (int i = 0; i < 3; i++) {
    EXPECT_OK(o.src->read(o.self, i, 0, px, &label));
    assert_true(worst_error(px, H, W) <= 6); /* cmyk (0), good (1), odd (2): the same picture */
  }
  close_source(&o);
}

/* The lmdb source's JPEG records (Caffe encoded datums hold the files as
 * they are): the corrupt scan a bad record, the others read. */
static void test_lmdb_records(void **state) {
  char path[4096];
  snprintf(path, sizeof path, "%s/policy-caffe.lmdb", tmpdir());
  mkdir(path, 0755);
  unsigned long n, ne, nc;
  unsigned char *jpg = make_jpeg(&n, 0), *bad = corrupt_scan(jpg, n), *odd = extraneous(jpg, n, &ne),
                *cmyk = make_jpeg(&nc, 1);
  const unsigned char *files[4] = {jpg, bad, odd, cmyk};
  const unsigned long sizes[4] = {n, n, ne, nc};
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_mapsize(env, 16 << 20), 0);
  assert_int_equal(mdb_env_open(env, path, 0, 0664), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  for (int i = 0; i < 4; i++) { /* a Datum: data = 4 (the file), label = 5, encoded = 7 */
    uint8_t *d = malloc(sizes[i] + 16);
    size_t k = 0;
    d[k++] = 4 << 3 | 2;
    for (unsigned long v = sizes[i]; ; v >>= 7) {
      d[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      if (v <= 0x7f) break;
    }
    memcpy(d + k, files[i], sizes[i]);
    k += sizes[i];
    d[k++] = 5 << 3, d[k++] = 0, d[k++] = 7 << 3, d[k++] = 1;
    char key[16];
    snprintf(key, sizeof key, "%08d", i);
    MDB_val kv = {strlen(key), key}, vv = {k, d};
    assert_int_equal(mdb_put(txn, dbi, &kv, &vv, 0), 0);
    free(d);
  }
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  opened o;
  open_lmdb(&o, path);
  uint8_t px[H * W * 3];
  int32_t label;
  EXPECT_OK(o.src->read(o.self, 0, 0, px, &label));
  EXPECT_ERR(o.src->read(o.self, 1, 0, px, &label), STOKE_E_DATA, "index 1", "premature end of data segment");
  EXPECT_OK(o.src->read(o.self, 2, 0, px, &label));
  EXPECT_OK(o.src->read(o.self, 3, 0, px, &label));
  assert_true(worst_error(px, H, W) <= 6);
  close_source(&o);
  tjFree(jpg);
  tjFree(cmyk);
  free(bad);
  free(odd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rule),
      cmocka_unit_test(test_decode),
      cmocka_unit_test(test_jpeg_source),
      cmocka_unit_test(test_convert),
      cmocka_unit_test(test_lmdb_records),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
