/* tests/tools/make_jpeg_bench_test.c: tools/make_jpeg_bench end to end on
 * two small photos the test makes itself with libturbojpeg: the folder
 * layout, every file's size and chroma, determinism, the --force rule. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <turbojpeg.h>

#include "stoke/rng.h"
#include "tests/tools/child.h"

#define TOOL "tools/make_jpeg_bench" /* runfiles-relative */
#define COUNT 30

static const int SIZES[6][2] = {{500, 375}, {500, 333}, {375, 500}, {640, 480}, {500, 500}, {333, 500}};

static char photos[4096];

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmpdir(), name); }

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* A photo-like RGB image: smooth gradients, a few discs, some noise. */
static void make_photo(const char *path, int w, int h, uint64_t seed) {
  uint8_t *px = malloc((size_t)w * h * 3);
  assert_non_null(px);
  stoke_rng r = stoke_rng_seed(seed);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t *p = px + ((size_t)y * w + x) * 3;
      double u = (double)x / w, v = (double)y / h;
      double d = hypot(u - 0.4, v - 0.6);
      for (int c = 0; c < 3; c++) {
        double val = 128 + 80 * sin(6 * u + 2 * c) * cos(5 * v - c) + (d < 0.2 ? 60 : 0) +
                     20 * (stoke_rng_uniform(&r) - 0.5);
        p[c] = (uint8_t)(val < 0 ? 0 : val > 255 ? 255 : val);
      }
    }
  tjhandle t = tjInitCompress();
  assert_non_null(t);
  unsigned char *jpeg = NULL;
  unsigned long n = 0;
  assert_int_equal(tjCompress2(t, px, w, 0, h, TJPF_RGB, &jpeg, &n, TJSAMP_444, 95, 0), 0);
  write_bytes(path, jpeg, n);
  tjFree(jpeg);
  tjDestroy(t);
  free(px);
}

static int setup(void **state) {
  path_of(photos, sizeof photos, "photos");
  if (mkdir(photos, 0775) != 0 && errno != EEXIST) return -1;
  char p[4200];
  snprintf(p, sizeof p, "%s/a.jpg", photos);
  make_photo(p, 320, 240, 1);
  snprintf(p, sizeof p, "%s/b.JPEG", photos);
  make_photo(p, 240, 360, 2);
  snprintf(p, sizeof p, "%s/notes.txt", photos); /* not a photo: ignored */
  write_bytes(p, "not a photo\n", 12);
  return 0;
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
  *n = b ? fread(b, 1, (size_t)len, f) : 0;
  fclose(f);
  return b;
}

/* OUT/c<i mod 10>/img_<i>.jpg */
static void image_path(char *buf, size_t cap, const char *out, int i) {
  snprintf(buf, cap, "%s/c%d/img_%05d.jpg", out, i % 10, i);
}

static int count_files(const char *out) {
  int n = 0;
  for (int k = 0; k < 10; k++) {
    char d[4200];
    snprintf(d, sizeof d, "%s/c%d", out, k);
    DIR *dir = opendir(d);
    if (!dir) return -1;
    for (struct dirent *de; (de = readdir(dir));) n += de->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}

static void make(const char *name, const char *seed, const char *threads, char *out_dir, size_t cap) {
  path_of(out_dir, cap, name);
  char log[16384], count[16];
  snprintf(count, sizeof count, "%d", COUNT);
  RUN_OK(TOOL, log, "--photos", photos, "--out", out_dir, "--count", count, "--seed", seed, "--threads", threads);
  EXPECT_HAS(log, "wrote 30 files");
  EXPECT_HAS(log, "mean");
}

/* 10 class folders, 30 files, each a JPEG of one of the six sizes, 4:2:0. */
static void test_layout_and_sizes(void **state) {
  char out[4096];
  make("layout", "1", "3", out, sizeof out);
  for (int k = 0; k < 10; k++) {
    char d[4200];
    struct stat st;
    snprintf(d, sizeof d, "%s/c%d", out, k);
    assert_int_equal(stat(d, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
  }
  assert_int_equal(count_files(out), COUNT);
  tjhandle t = tjInitDecompress();
  assert_non_null(t);
  int seen[6] = {0};
  for (int i = 0; i < COUNT; i++) {
    char p[4200];
    image_path(p, sizeof p, out, i);
    size_t n = 0;
    unsigned char *b = read_all(p, &n);
    if (!b || n < 1000) {
      print_error("%s: missing or tiny (%zu bytes)\n", p, n);
      fail();
    }
    int w, h, ss, cs;
    if (tjDecompressHeader3(t, b, (unsigned long)n, &w, &h, &ss, &cs) != 0) {
      print_error("%s: tjDecompressHeader3: %s\n", p, tjGetErrorStr2(t));
      fail();
    }
    assert_int_equal(ss, TJSAMP_420);
    int k = 0;
    while (k < 6 && !(SIZES[k][0] == w && SIZES[k][1] == h)) k++;
    if (k == 6) {
      print_error("%s: %dx%d is none of the six sizes\n", p, w, h);
      fail();
    }
    seen[k]++;
    unsigned char *px = malloc((size_t)w * h * 3);
    assert_non_null(px);
    assert_int_equal(tjDecompress2(t, b, (unsigned long)n, px, w, 0, h, TJPF_RGB, 0), 0);
    free(px);
    free(b);
  }
  int kinds = 0;
  for (int k = 0; k < 6; k++) kinds += seen[k] > 0;
  assert_true(kinds >= 3); /* 30 draws from six sizes */
  tjDestroy(t);
}

/* Files that differ between two output folders. */
static int differing(const char *a, const char *b) {
  int diff = 0;
  for (int i = 0; i < COUNT; i++) {
    char pa[4200], pb[4200];
    image_path(pa, sizeof pa, a, i);
    image_path(pb, sizeof pb, b, i);
    size_t na = 0, nb = 0;
    unsigned char *ba = read_all(pa, &na), *bb = read_all(pb, &nb);
    assert_non_null(ba);
    assert_non_null(bb);
    diff += na != nb || memcmp(ba, bb, na);
    free(ba);
    free(bb);
  }
  return diff;
}

/* Same seed: identical bytes, whatever the thread count. */
static void test_same_seed_identical(void **state) {
  char a[4096], b[4096];
  make("same_a", "1", "1", a, sizeof a);
  make("same_b", "1", "4", b, sizeof b);
  assert_int_equal(differing(a, b), 0);
}

static void test_other_seed_differs(void **state) {
  char a[4096], b[4096];
  make("seed_1", "1", "2", a, sizeof a);
  make("seed_2", "2", "2", b, sizeof b);
  assert_int_equal(differing(a, b), COUNT);
}

/* A non-empty --out needs --force; --force leaves no stale images. */
static void test_force(void **state) {
  char out[4096], log[16384];
  path_of(out, sizeof out, "force");
  RUN_OK(TOOL, log, "--photos", photos, "--out", out, "--count", "45");
  assert_int_equal(count_files(out), 45);
  assert_int_equal(run_child(TOOL, (const char *const[]){"--photos", photos, "--out", out, "--count", "30", NULL}, log,
                             sizeof log),
                   1);
  EXPECT_HAS(log, out);
  EXPECT_HAS(log, "--force");
  RUN_OK(TOOL, log, "--photos", photos, "--out", out, "--count", "30", "--force");
  assert_int_equal(count_files(out), 30);
}

/* An unreadable photo: the error names the file. */
static void test_bad_photo_named(void **state) {
  char dir[4096], p[4200], out[4096], log[16384];
  path_of(dir, sizeof dir, "bad_photos");
  assert_true(mkdir(dir, 0775) == 0 || errno == EEXIST);
  snprintf(p, sizeof p, "%s/broken.jpg", dir);
  write_bytes(p, "\xff\xd8\xff\xe0 this is not a JPEG", 24);
  path_of(out, sizeof out, "bad_out");
  assert_int_equal(run_child(TOOL, (const char *const[]){"--photos", dir, "--out", out, NULL}, log, sizeof log), 1);
  EXPECT_HAS(log, p);
  path_of(dir, sizeof dir, "no_such_folder");
  assert_int_equal(run_child(TOOL, (const char *const[]){"--photos", dir, "--out", out, NULL}, log, sizeof log), 1);
  EXPECT_HAS(log, dir);
}

static void test_usage(void **state) {
  char log[16384], out[4096];
  path_of(out, sizeof out, "usage_out");
  assert_int_equal(run_child(TOOL, (const char *const[]){"--photos", photos, "--out", out, "--quality", "0", NULL}, log,
                             sizeof log),
                   2);
  EXPECT_HAS(log, "--quality");
  assert_int_equal(run_child(TOOL, (const char *const[]){"--photos", photos, NULL}, log, sizeof log), 2);
  assert_int_equal(run_child(TOOL, (const char *const[]){"--help", NULL}, log, sizeof log), 0);
  EXPECT_HAS(log, "usage: make_jpeg_bench");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_and_sizes), cmocka_unit_test(test_same_seed_identical),
      cmocka_unit_test(test_other_seed_differs), cmocka_unit_test(test_force),
      cmocka_unit_test(test_bad_photo_named), cmocka_unit_test(test_usage),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
