/* tests/jpeg/jpeg_test.c: the "jpeg" image-folder source end to end: folder
 * layout and labels, the eval and train transforms against references made
 * here by full decoding (TurboJPEG), colour modes, bad files, cache, threads.
 *
 * The source is opened through the core exactly as a run opens it:
 * registry, plugin load, a [data] config section, open/info/read. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <turbojpeg.h>

#include "sources/jpeg/crop.h"
#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/loader.h"
#include "stoke/registry.h"
#include "tests/common/expect.h"
#include "tests/common/log_capture.h"
#include "tests/common/source_fixture.h"

/* Runfiles-relative (Bazel runs tests from the runfiles root). */
#define PLUGIN "sources/jpeg/libstoke_jpeg.so"

/* ----------------------------------------------------------- helpers */

static const char *tmpdir(void) {
  const char *t = getenv("TEST_TMPDIR");
  return t && t[0] ? t : "/tmp";
}

/* <tmp>/<fmt...>: a fresh path under the test's temporary folder. */
static char *tmp_path(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *tmp_path(char *buf, size_t cap, const char *fmt, ...) {
  int n = snprintf(buf, cap, "%s/", tmpdir());
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
  va_end(ap);
  return buf;
}

static void mkdirs(const char *path) {
  char p[4096];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      mkdir(p, 0755);
      *s = '/';
    }
  mkdir(p, 0755);
}


/* The jpeg source opened through the core, as a run opens it. */
static stoke_err *open_source(opened *o, const char *root, const char *extra) {
  char keys[8192];
  snprintf(keys, sizeof keys, "root = %s\n%s", root, extra ? extra : "");
  return open_source_from(o, PLUGIN, "jpeg", keys);
}

/* ------------------------------------------------------------ images */

/* A photo-like test image: smooth shading plus texture at several scales
 * (so resampling and DCT scaling have detail to get right), RGB. */
static uint8_t *make_rgb(int h, int w, int seed) {
  uint8_t *px = malloc((size_t)h * w * 3);
  assert_non_null(px);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      double u = (double)x / w, v = (double)y / h;
      double r = 90 + 80 * u + 30 * sin(x / 9.0 + seed) + 15 * sin((x + y) / 3.7);
      double g = 60 + 120 * v + 25 * cos(y / 13.0 - seed) + 10 * sin(x / 2.3);
      double b = 70 + 50 * (u + v) + 30 * sin((x - 2 * y) / 17.0 + seed * 0.7);
      uint8_t *p = px + ((size_t)y * w + x) * 3;
      p[0] = (uint8_t)fmin(255, fmax(0, r));
      p[1] = (uint8_t)fmin(255, fmax(0, g));
      p[2] = (uint8_t)fmin(255, fmax(0, b));
    }
  return px;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

/* Encodes `px` (pixel format pf) and writes it to `path`. */
static void write_jpeg(const char *path, const uint8_t *px, int h, int w, int pf, int samp, int quality, int flags) {
  tjhandle t = tjInitCompress();
  assert_non_null(t);
  unsigned char *jpeg = NULL;
  unsigned long n = 0;
  if (tjCompress2(t, px, w, 0, h, pf, &jpeg, &n, samp, quality, flags)) {
    print_error("tjCompress2: %s\n", tjGetErrorStr2(t));
    fail();
  }
  write_bytes(path, jpeg, n);
  tjFree(jpeg);
  tjDestroy(t);
}

static void write_rgb_jpeg(const char *path, int h, int w, int seed, int samp, int quality, int flags) {
  uint8_t *px = make_rgb(h, w, seed);
  write_jpeg(path, px, h, w, TJPF_RGB, samp, quality, flags);
  free(px);
}

/* Whole file in memory. */
static uint8_t *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)len + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

/* Full decode to RGB with TurboJPEG: the reference. */
static uint8_t *full_decode(const char *path, int *h, int *w) {
  size_t n;
  uint8_t *b = read_all(path, &n);
  tjhandle t = tjInitDecompress();
  assert_non_null(t);
  int ss, cs;
  assert_int_equal(tjDecompressHeader3(t, b, n, w, h, &ss, &cs), 0);
  uint8_t *px = malloc((size_t)*h * *w * 3);
  assert_non_null(px);
  if (tjDecompress2(t, b, n, px, *w, 0, *h, TJPF_RGB, 0)) {
    print_error("tjDecompress2 %s: %s\n", path, tjGetErrorStr2(t));
    fail();
  }
  tjDestroy(t);
  free(b);
  return px;
}

/* The train transform done the plain way: full decode, the same crop from
 * the same seed, the same resampler on the crop at full resolution, the
 * same flip draw. */
static void reference_train(const uint8_t *full, int h, int w, uint64_t seed, int size, uint8_t *out) {
  stoke_rng g = stoke_rng_seed(seed);
  int top, left, ch, cw;
  stoke_jpeg_random_crop(&g, h, w, 0.08, 1.0, 0.75, 4.0 / 3.0, &top, &left, &ch, &cw);
  int flip = stoke_rng_uniform(&g) < 0.5;
  stoke_jpeg_rect r = {0, 0, cw, ch};
  assert_int_equal(stoke_jpeg_resample(full + ((size_t)top * w + left) * 3, cw, ch, w * 3, r, out, size, size, flip),
                   0);
}

/* Mean and max absolute difference over n bytes. */
static void diff(const uint8_t *a, const uint8_t *b, size_t n, double *mean, int *max) {
  double sum = 0;
  int m = 0;
  for (size_t i = 0; i < n; i++) {
    int d = abs((int)a[i] - (int)b[i]);
    sum += d;
    if (d > m) m = d;
  }
  *mean = sum / (double)n;
  *max = m;
}

static void expect_close(const uint8_t *got, const uint8_t *want, size_t n, double max_mean, int max_abs,
                         const char *what) {
  double mean;
  int max;
  diff(got, want, n, &mean, &max);
  if (mean >= max_mean || max >= max_abs) {
    print_error("%s: mean abs diff %.3f (limit %.3f), max %d (limit %d)\n", what, mean, max_mean, max, max_abs);
    fail();
  }
}

/* ------------------------------------------------------------- tests */

/* Uniform-colour image, so a read tells which file it came from. */
static void write_solid(const char *path, uint8_t r, uint8_t g, uint8_t b) {
  int h = 48, w = 40;
  uint8_t *px = malloc((size_t)h * w * 3);
  assert_non_null(px);
  for (int i = 0; i < h * w; i++) px[i * 3] = r, px[i * 3 + 1] = g, px[i * 3 + 2] = b;
  write_jpeg(path, px, h, w, TJPF_RGB, TJSAMP_444, 95, 0);
  free(px);
}

static void test_layout_labels(void **state) {
  (void)state;
  char root[4096], p[4096];
  tmp_path(root, sizeof root, "layout");
  /* created out of order: labels come from the sorted folder names */
  const char *dirs[] = {"layout/cat_b", "layout/cat_a", "layout/cat_c", "layout/cat_b/sub", "layout/empty_d"};
  for (int i = 0; i < 5; i++) mkdirs(tmp_path(p, sizeof p, "%s", dirs[i]));
  /* expected order: cat_a: 1.JPEG, 2.jpg; cat_b: z.jpeg, sub/y.jpg; cat_c: q.Jpg */
  struct {
    const char *name;
    uint8_t rgb[3];
  } files[] = {
      {"cat_a/2.jpg", {200, 30, 30}}, {"cat_a/1.JPEG", {30, 200, 30}},  {"cat_b/z.jpeg", {30, 30, 200}},
      {"cat_b/sub/y.jpg", {200, 200, 30}}, {"cat_c/q.Jpg", {30, 200, 200}},
  };
  for (int i = 0; i < 5; i++)
    write_solid(tmp_path(p, sizeof p, "layout/%s", files[i].name), files[i].rgb[0], files[i].rgb[1], files[i].rgb[2]);
  /* ignored: other extensions, and files at the top level */
  write_bytes(tmp_path(p, sizeof p, "layout/cat_a/notes.txt"), "hello", 5);
  write_bytes(tmp_path(p, sizeof p, "layout/cat_a/pic.png"), "\x89PNG\r\n\x1a\n", 8);
  write_bytes(tmp_path(p, sizeof p, "layout/cat_c/jpg"), "x", 1);
  write_solid(tmp_path(p, sizeof p, "layout/top.jpg"), 1, 2, 3);

  opened o;
  /* the empty folder is a class torchvision's ImageFolder refuses by default; allowed, it keeps its label */
  EXPECT_OK(open_source(&o, root, "size = 16\ntrain = false\nresize = 16\nallow_empty = true\n"));
  assert_int_equal(o.src->length(o.self), 5);
  stoke_sample_info_v1 info;
  EXPECT_OK(o.src->info(o.self, &info));
  assert_int_equal(info.shape.ndim, 3);
  assert_int_equal(info.shape.d[0], 3);
  assert_int_equal(info.shape.d[1], 16);
  assert_int_equal(info.shape.d[2], 16);
  assert_int_equal(info.dtype, STOKE_U8);
  assert_int_equal(info.layout, STOKE_NHWC);
  assert_int_equal(info.classes, 4); /* the empty folder is a class too */
  const int order[5] = {1, 0, 2, 3, 4}, labels[5] = {0, 0, 1, 1, 2};
  uint8_t px[16 * 16 * 3];
  for (int i = 0; i < 5; i++) {
    int32_t label = -1;
    EXPECT_OK(o.src->read(o.self, i, 0, px, &label));
    assert_int_equal(label, labels[i]);
    for (int k = 0; k < 16 * 16; k++)
      for (int c = 0; c < 3; c++)
        if (abs(px[k * 3 + c] - files[order[i]].rgb[c]) > 3) {
          print_error("sample %d pixel %d channel %d: %u, expected %u (%s)\n", i, k, c, px[k * 3 + c],
                      files[order[i]].rgb[c], files[order[i]].name);
          fail();
        }
  }
  EXPECT_ERR(o.src->read(o.self, 5, 0, px, &(int32_t){0}), STOKE_E_INVALID, "index 5");
  close_source(&o);
}

/* Links as torchvision's ImageFolder follows them (os.walk(followlinks=
 * True)): a linked file and a linked folder are read; but a link back to a
 * folder above (c0/up -> .., which made ImageFolder-like walks list every
 * class again under c0) and a link into /proc are never walked. */
static void test_links_and_loops(void **state) {
  (void)state;
  char root[4096], p[4096], q[4096];
  tmp_path(root, sizeof root, "links");
  mkdirs(tmp_path(p, sizeof p, "links/c0"));
  mkdirs(tmp_path(p, sizeof p, "links/c1/deep"));
  mkdirs(tmp_path(p, sizeof p, "elsewhere"));
  write_solid(tmp_path(p, sizeof p, "links/c0/a.jpg"), 200, 30, 30);
  write_solid(tmp_path(p, sizeof p, "links/c1/b.jpg"), 30, 200, 30);
  write_solid(tmp_path(p, sizeof p, "links/c1/deep/c.jpg"), 30, 30, 200);
  write_solid(tmp_path(p, sizeof p, "elsewhere/d.jpg"), 200, 200, 30);
  assert_int_equal(symlink("..", tmp_path(p, sizeof p, "links/c0/up")), 0);
  assert_int_equal(symlink("../..", tmp_path(p, sizeof p, "links/c1/deep/top")), 0);
  assert_int_equal(symlink("/proc", tmp_path(p, sizeof p, "links/c1/proc")), 0);
  assert_int_equal(symlink(tmp_path(q, sizeof q, "elsewhere"), tmp_path(p, sizeof p, "links/c0/more")), 0);
  assert_int_equal(symlink("../c1/b.jpg", tmp_path(p, sizeof p, "links/c0/z.jpg")), 0);
  /* c0: a.jpg, z.jpg (-> c1/b.jpg), more/d.jpg; c1: b.jpg, deep/c.jpg */
  const uint8_t want[5][3] = {{200, 30, 30}, {30, 200, 30}, {200, 200, 30}, {30, 200, 30}, {30, 30, 200}};
  const int labels[5] = {0, 0, 0, 1, 1};
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 16\ntrain = false\nresize = 16\n"));
  assert_int_equal(o.src->length(o.self), 5);
  uint8_t px[16 * 16 * 3];
  for (int i = 0; i < 5; i++) {
    int32_t label = -1;
    EXPECT_OK(o.src->read(o.self, i, 0, px, &label));
    assert_int_equal(label, labels[i]);
    for (int c = 0; c < 3; c++) assert_true(abs(px[c] - want[i][c]) <= 3);
  }
  close_source(&o);
}

/* Eval of an image exactly the output size is the identity: the decoded
 * pixels themselves (same libjpeg-turbo decoder; 4:4:4 so there is no
 * chroma upsampling to differ). */
static void test_eval_identity(void **state) {
  (void)state;
  char root[4096], p[4096];
  mkdirs(tmp_path(root, sizeof root, "ident/only"));
  tmp_path(root, sizeof root, "ident");
  write_rgb_jpeg(tmp_path(p, sizeof p, "ident/only/a.jpg"), 64, 64, 3, TJSAMP_444, 92, 0);
  write_rgb_jpeg(tmp_path(p, sizeof p, "ident/only/b.jpg"), 64, 64, 4, TJSAMP_420, 85, 0);
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 64\ntrain = false\nresize = 64\n"));
  uint8_t out[64 * 64 * 3];
  const char *names[2] = {"ident/only/a.jpg", "ident/only/b.jpg"};
  for (int i = 0; i < 2; i++) {
    int h, w;
    uint8_t *ref = full_decode(tmp_path(p, sizeof p, "%s", names[i]), &h, &w);
    int32_t label;
    EXPECT_OK(o.src->read(o.self, i, 99, out, &label));
    assert_int_equal(label, 0);
    expect_close(out, ref, sizeof out, 0.01, 2, names[i]);
    free(ref);
  }
  close_source(&o);
}

/* Eval of larger images against full decode + the same rectangle +
 * resample: the plugin decodes the big one DCT-scaled (1/8: a 700-pixel
 * crop to 56), the reference at full size, hence a tolerance (see
 * test_train_reference). */
static void test_eval_reference(void **state) {
  (void)state;
  char root[4096], p[4096];
  mkdirs(tmp_path(root, sizeof root, "evalref/c"));
  tmp_path(root, sizeof root, "evalref");
  const int sizes[4][2] = {{90, 120}, {160, 96}, {73, 73}, {800, 1000}};
  for (int i = 0; i < 4; i++)
    write_rgb_jpeg(tmp_path(p, sizeof p, "evalref/c/%d.jpg", i), sizes[i][0], sizes[i][1], i, TJSAMP_420, 90, 0);
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 56\ntrain = false\nresize = 64\n"));
  uint8_t out[56 * 56 * 3], ref[56 * 56 * 3];
  for (int i = 0; i < 4; i++) {
    int h, w;
    uint8_t *full = full_decode(tmp_path(p, sizeof p, "evalref/c/%d.jpg", i), &h, &w);
    stoke_jpeg_rect r = stoke_jpeg_center_crop(h, w, 64, 56);
    assert_int_equal(stoke_jpeg_resample(full, w, h, w * 3, r, ref, 56, 56, 0), 0);
    int32_t label;
    EXPECT_OK(o.src->read(o.self, i, 1, out, &label));
    expect_close(out, ref, sizeof out, 2.0, 40, "eval vs full decode");
    free(full);
  }
  close_source(&o);
  /* torchvision's geometry: 120x90 (WxH) -> 85x64 -> centre 56 at (4, 14) */
  stoke_jpeg_rect r = stoke_jpeg_center_crop(90, 120, 64, 56);
  double s = 85.0 / 120.0;
  assert_true(fabs(r.x - 14 / s) < 1e-9 && fabs(r.w - 56 / s) < 1e-9);
  assert_true(fabs(r.y - 4 / (64.0 / 90.0)) < 1e-9);
}

/* RandomResizedCrop + flip against full decode + the same crop + the same
 * resampler. The plugin decodes only the crop and, for crops at least
 * twice the output (here 224 px and up), at a DCT scale M/8 < 1, so its
 * input to the resampler is the IDCT's own downscale rather than the
 * full-size pixels: the two agree on average to about a grey level but
 * differ at strong edges and in fine texture (and 4:2:0 chroma is
 * upsampled at the reduced size), hence mean abs diff < 2 and max < 40;
 * the worst seen is printed below. */
static void test_train_reference(void **state) {
  (void)state;
  char root[4096], p[4096];
  mkdirs(tmp_path(root, sizeof root, "train/c0"));
  tmp_path(root, sizeof root, "train");
  write_rgb_jpeg(tmp_path(p, sizeof p, "train/c0/photo.jpg"), 375, 500, 1, TJSAMP_420, 90, 0);
  write_rgb_jpeg(tmp_path(p, sizeof p, "train/c0/tall.jpg"), 333, 250, 2, TJSAMP_422, 90, 0);
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 112\n"));
  const char *names[2] = {"train/c0/photo.jpg", "train/c0/tall.jpg"};
  uint8_t out[112 * 112 * 3], ref[112 * 112 * 3];
  double worst_mean = 0;
  int worst_max = 0;
  for (int i = 0; i < 2; i++) {
    int h, w;
    uint8_t *full = full_decode(tmp_path(p, sizeof p, "%s", names[i]), &h, &w);
    for (uint64_t seed = 1; seed <= 40; seed++) {
      int32_t label;
      EXPECT_OK(o.src->read(o.self, i, seed * 7919, out, &label));
      reference_train(full, h, w, seed * 7919, 112, ref);
      char what[256];
      snprintf(what, sizeof what, "%s seed %llu", names[i], (unsigned long long)seed * 7919);
      expect_close(out, ref, sizeof out, 2.0, 40, what);
      double mean;
      int max;
      diff(out, ref, sizeof out, &mean, &max);
      if (mean > worst_mean) worst_mean = mean;
      if (max > worst_max) worst_max = max;
    }
    free(full);
  }
  print_message("train vs reference: worst mean abs diff %.3f, worst max %d\n", worst_mean, worst_max);
  close_source(&o);
}

/* torchvision's get_params: the fallback and the bounds. */
static void test_crop_params(void **state) {
  (void)state;
  /* scale far above 1 never fits: the centre crop, ratio clamped */
  stoke_rng g = stoke_rng_seed(5);
  int top, left, ch, cw;
  stoke_jpeg_random_crop(&g, 100, 400, 2.0, 3.0, 0.75, 4.0 / 3.0, &top, &left, &ch, &cw);
  assert_int_equal(ch, 100);
  assert_int_equal(cw, 133); /* round(100 * 4/3) */
  assert_int_equal(top, 0);
  assert_int_equal(left, 133);
  g = stoke_rng_seed(5);
  stoke_jpeg_random_crop(&g, 400, 100, 2.0, 3.0, 0.75, 4.0 / 3.0, &top, &left, &ch, &cw);
  assert_int_equal(cw, 100);
  assert_int_equal(ch, 133); /* round(100 / 0.75) */
  assert_int_equal(top, 133);
  for (uint64_t s = 0; s < 2000; s++) {
    g = stoke_rng_seed(s);
    stoke_jpeg_random_crop(&g, 375, 500, 0.08, 1.0, 0.75, 4.0 / 3.0, &top, &left, &ch, &cw);
    assert_true(ch >= 1 && cw >= 1 && top >= 0 && left >= 0 && top + ch <= 375 && left + cw <= 500);
    double area = (double)ch * cw / (375.0 * 500.0);
    /* an accepted attempt lies in the ranges (up to rounding); the
     * fallback is the whole image or a clamped centre crop */
    assert_true(area > 0.07 && area <= 1.0);
  }
}

/* Same seed: the same bytes; other seeds: other crops. */
static void test_determinism(void **state) {
  (void)state;
  char root[4096], p[4096];
  mkdirs(tmp_path(root, sizeof root, "det/c"));
  tmp_path(root, sizeof root, "det");
  write_rgb_jpeg(tmp_path(p, sizeof p, "det/c/a.jpg"), 375, 500, 1, TJSAMP_420, 90, 0);
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 64\n"));
  enum { N = 12, S = 64 * 64 * 3 };
  uint8_t *out = malloc((size_t)N * S), again[S];
  assert_non_null(out);
  int32_t label;
  for (int i = 0; i < N; i++) {
    EXPECT_OK(o.src->read(o.self, 0, 1000 + (uint64_t)i, out + (size_t)i * S, &label));
    EXPECT_OK(o.src->read(o.self, 0, 1000 + (uint64_t)i, again, &label));
    assert_memory_equal(out + (size_t)i * S, again, S);
  }
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      if (!memcmp(out + (size_t)i * S, out + (size_t)j * S, S)) {
        print_error("seeds %d and %d gave identical samples\n", 1000 + i, 1000 + j);
        fail();
      }
  free(out);
  close_source(&o);
  /* the crops themselves differ */
  int seen = 0;
  int prev[4] = {-1, -1, -1, -1};
  for (uint64_t s = 0; s < 8; s++) {
    stoke_rng g = stoke_rng_seed(s);
    int c[4];
    stoke_jpeg_random_crop(&g, 375, 500, 0.08, 1.0, 0.75, 4.0 / 3.0, &c[0], &c[1], &c[2], &c[3]);
    if (memcmp(c, prev, sizeof c)) seen++;
    memcpy(prev, c, sizeof c);
  }
  assert_int_equal(seen, 8);
}

/* Grayscale, CMYK (Adobe, as TurboJPEG writes it) and progressive files. */
static void test_color_modes(void **state) {
  (void)state;
  char root[4096], p[4096];
  mkdirs(tmp_path(root, sizeof root, "modes/c"));
  tmp_path(root, sizeof root, "modes");
  enum { H = 48, W = 48 };
  uint8_t *rgb = make_rgb(H, W, 2);
  /* grayscale: the green channel as luma */
  uint8_t gray[H * W], cmyk[H * W * 4];
  for (int i = 0; i < H * W; i++) gray[i] = rgb[i * 3 + 1];
  write_jpeg(tmp_path(p, sizeof p, "modes/c/0gray.jpg"), gray, H, W, TJPF_GRAY, TJSAMP_GRAY, 95, 0);
  /* CMYK in libjpeg-turbo's (Adobe, inverted) convention, R = C * K / 255:
   * K = max(R, G, B), C = R * 255 / K */
  for (int i = 0; i < H * W; i++) {
    const uint8_t *q = rgb + i * 3;
    int k = q[0] > q[1] ? q[0] : q[1];
    if (q[2] > k) k = q[2];
    if (k == 0) k = 1;
    for (int c = 0; c < 3; c++) cmyk[i * 4 + c] = (uint8_t)((q[c] * 255 + k / 2) / k);
    cmyk[i * 4 + 3] = (uint8_t)k;
  }
  write_jpeg(tmp_path(p, sizeof p, "modes/c/1cmyk.jpg"), cmyk, H, W, TJPF_CMYK, TJSAMP_444, 98, 0);
  write_jpeg(tmp_path(p, sizeof p, "modes/c/2prog.jpg"), rgb, H, W, TJPF_RGB, TJSAMP_420, 95, TJFLAG_PROGRESSIVE);
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 48\ntrain = false\nresize = 48\n"));
  uint8_t out[H * W * 3], want[H * W * 3];
  int32_t label;
  /* grayscale: R = G = B = the gray level */
  EXPECT_OK(o.src->read(o.self, 0, 0, out, &label));
  for (int i = 0; i < H * W; i++) {
    assert_int_equal(out[i * 3], out[i * 3 + 1]);
    assert_int_equal(out[i * 3], out[i * 3 + 2]);
    want[i * 3] = want[i * 3 + 1] = want[i * 3 + 2] = gray[i];
  }
  expect_close(out, want, sizeof out, 2.0, 24, "grayscale");
  /* CMYK: back to the RGB it was made from */
  EXPECT_OK(o.src->read(o.self, 1, 0, out, &label));
  expect_close(out, rgb, sizeof out, 3.0, 40, "CMYK");
  /* progressive: the same pixels as its full decode */
  int h, w;
  uint8_t *full = full_decode(tmp_path(p, sizeof p, "modes/c/2prog.jpg"), &h, &w);
  EXPECT_OK(o.src->read(o.self, 2, 0, out, &label));
  expect_close(out, full, sizeof out, 0.01, 2, "progressive");
  free(full);
  close_source(&o);

  /* and the train transform (crop + skip) on each mode, larger images */
  mkdirs(tmp_path(root, sizeof root, "modes2/c"));
  tmp_path(root, sizeof root, "modes2");
  uint8_t *big = make_rgb(300, 400, 5);
  uint8_t *bgray = malloc(300 * 400);
  assert_non_null(bgray);
  for (int i = 0; i < 300 * 400; i++) bgray[i] = big[i * 3];
  write_jpeg(tmp_path(p, sizeof p, "modes2/c/0gray.jpg"), bgray, 300, 400, TJPF_GRAY, TJSAMP_GRAY, 90, 0);
  write_jpeg(tmp_path(p, sizeof p, "modes2/c/1prog.jpg"), big, 300, 400, TJPF_RGB, TJSAMP_420, 90,
             TJFLAG_PROGRESSIVE);
  EXPECT_OK(open_source(&o, root, "size = 64\n"));
  uint8_t o64[64 * 64 * 3], r64[64 * 64 * 3];
  const char *names[2] = {"modes2/c/0gray.jpg", "modes2/c/1prog.jpg"};
  for (int i = 0; i < 2; i++) {
    full = full_decode(tmp_path(p, sizeof p, "%s", names[i]), &h, &w);
    for (uint64_t seed = 0; seed < 10; seed++) {
      EXPECT_OK(o.src->read(o.self, i, seed, o64, &label));
      reference_train(full, h, w, seed, 64, r64);
      expect_close(o64, r64, sizeof o64, 2.0, 40, names[i]);
    }
    free(full);
  }
  close_source(&o);
  free(big);
  free(bgray);
  free(rgb);
}

/* Open the folder `root` with `extra` keys in `section` (for test_log_of). */
typedef struct tf_ctx {
  const char *root, *section, *extra;
  stoke_err *e;
} tf_ctx;
static void open_in(void *c) {
  tf_ctx *x = c;
  opened o;
  char keys[4096];
  snprintf(keys, sizeof keys, "root = %s\n%s", x->root, x->extra);
  x->e = open_source_sec(&o, PLUGIN, "jpeg", x->section, keys);
  if (!x->e) close_source(&o);
}


/* One class folder: it opens (a valid folder), with a warning that every label is 0 and nothing is learned. */
static void test_one_class_warned(void **state) {
  char p[4096], root[4096];
  tmp_path(root, sizeof root, "oneclass");
  mkdirs(tmp_path(p, sizeof p, "oneclass/only"));
  write_solid(tmp_path(p, sizeof p, "oneclass/only/a.jpg"), 10, 20, 30);
  write_solid(tmp_path(p, sizeof p, "oneclass/only/b.jpg"), 30, 20, 10);
  tf_ctx c = {root, "data", "size = 16\ntrain = false\nresize = 16\n", NULL};
  char *log = test_log_of(open_in, &c);
  EXPECT_OK(c.e);
  if (!log || !strstr(log, "one class folder: every label is 0")) fail_msg("no warning: %s", log ? log : "");
  free(log);
}

/* A hidden folder (.ipynb_checkpoints) beside the classes stays a class, as
 * in torchvision's ImageFolder (labels stay PyTorch's), with a warning that
 * names it and its label. */
static void test_hidden_class_warned(void **state) {
  char p[4096], root[4096];
  tmp_path(root, sizeof root, "hidden");
  const char *dirs[] = {"hidden/.ipynb_checkpoints", "hidden/cat", "hidden/dog"};
  for (int i = 0; i < 3; i++) {
    mkdirs(tmp_path(p, sizeof p, dirs[i]));
    snprintf(p + strlen(p), sizeof p - strlen(p), "/a.jpg");
    write_solid(p, 10 * i, 20, 30);
  }
  tf_ctx c = {root, "data", "size = 16\ntrain = false\nresize = 16\n", NULL};
  char *log = test_log_of(open_in, &c);
  EXPECT_OK(c.e);
  if (!log || !strstr(log, "class 0 is the hidden folder '.ipynb_checkpoints' (as torchvision's ImageFolder counts it"))
    fail_msg("no warning: %s", log ? log : "");
  /* the labels' names are logged (a PyTorch user's dataset.classes) */
  if (!strstr(log, "labels: 0 .ipynb_checkpoints, 1 cat, 2 dog")) fail_msg("no labels line: %s", log);
  free(log);
}

/* Truncated, non-JPEG and empty files: STOKE_E_DATA naming the file. */
static void test_bad_files(void **state) {
  (void)state;
  char root[4096], p[4096], good[4096];
  mkdirs(tmp_path(root, sizeof root, "bad/c"));
  tmp_path(root, sizeof root, "bad");
  write_rgb_jpeg(tmp_path(good, sizeof good, "bad/c/0good.jpg"), 375, 500, 1, TJSAMP_420, 90, 0);
  size_t n;
  uint8_t *b = read_all(good, &n);
  write_bytes(tmp_path(p, sizeof p, "bad/c/1half.jpg"), b, n / 2);
  write_bytes(tmp_path(p, sizeof p, "bad/c/2cut.jpg"), b, n - 200); /* only the bottom rows missing */
  uint8_t junk[5000];
  stoke_rng g = stoke_rng_seed(42);
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)stoke_rng_next(&g);
  write_bytes(tmp_path(p, sizeof p, "bad/c/3random.jpg"), junk, sizeof junk);
  write_bytes(tmp_path(p, sizeof p, "bad/c/4empty.jpg"), "", 0);
  write_bytes(tmp_path(p, sizeof p, "bad/c/5header.jpg"), b, 300); /* cut inside the headers */
  /* fine: bytes after the EOI marker (decoded to the end to tell) */
  uint8_t *tail = malloc(n + 64);
  assert_non_null(tail);
  memcpy(tail, b, n);
  memset(tail + n, 0x55, 64);
  write_bytes(tmp_path(p, sizeof p, "bad/c/6trailer.jpg"), tail, n + 64);
  free(tail);
  const char *bad[] = {"1half.jpg", "2cut.jpg", "3random.jpg", "4empty.jpg", "5header.jpg"};
  for (int mode = 0; mode < 2; mode++) {
    opened o;
    EXPECT_OK(open_source(&o, root, mode ? "size = 64\ntrain = false\n" : "size = 64\n"));
    uint8_t out[64 * 64 * 3];
    int32_t label;
    for (uint64_t seed = 0; seed < 6; seed++) {
      EXPECT_OK(o.src->read(o.self, 0, seed, out, &label));
      EXPECT_OK(o.src->read(o.self, 6, seed, out, &label));
      for (int i = 0; i < 5; i++) {
        char path[4096];
        tmp_path(path, sizeof path, "bad/c/%s", bad[i]);
        stoke_err *e = o.src->read(o.self, i + 1, seed, out, &label);
        if (!e) print_error("%s (mode %d, seed %llu) read fine\n", bad[i], mode, (unsigned long long)seed);
        EXPECT_ERR(e, STOKE_E_DATA, path);
      }
    }
    close_source(&o);
  }
  free(b);
}

static void test_open_errors(void **state) {
  (void)state;
  char p[4096], f[4096];
  opened o;
  EXPECT_ERR(open_source(&o, "", NULL), STOKE_E_INVALID, "root is empty");
  close_source(&o);
  tmp_path(p, sizeof p, "no_such_folder");
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_NOT_FOUND, p);
  close_source(&o);
  mkdirs(tmp_path(p, sizeof p, "empty_root"));
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_INVALID, p, "no class folders");
  close_source(&o);
  mkdirs(tmp_path(p, sizeof p, "flat_root"));
  write_solid(tmp_path(f, sizeof f, "flat_root/a.jpg"), 1, 2, 3);
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_INVALID, p, "no class folders");
  close_source(&o);
  mkdirs(tmp_path(p, sizeof p, "nojpeg_root/c1"));
  write_bytes(tmp_path(f, sizeof f, "nojpeg_root/c1/a.png"), "x", 1);
  tmp_path(p, sizeof p, "nojpeg_root");
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_INVALID, p, "no .jpg/.jpeg");
  close_source(&o);
  /* a file as root */
  EXPECT_ERR(open_source(&o, f, NULL), STOKE_E_INVALID, f, "not a folder");
  close_source(&o);
  /* eval crop larger than the resize */
  mkdirs(tmp_path(p, sizeof p, "ok_root/c"));
  write_solid(tmp_path(f, sizeof f, "ok_root/c/a.jpg"), 1, 2, 3);
  tmp_path(p, sizeof p, "ok_root");
  EXPECT_ERR(open_source(&o, p, "train = false\nsize = 300\nresize = 256\n"), STOKE_E_INVALID, "resize");
  close_source(&o);
}

/* [eval_data] evaluates by default (train = auto): no random crop or flip,
 * the shorter side resized to size / 0.875 (torchvision's 256 for 224, 37
 * for 32), then the centre crop; [data] augments. */
static void test_eval_transform_by_default(void **state) {
  char p[4096], root[4096];
  tmp_path(root, sizeof root, "evaldefault");
  mkdirs(tmp_path(p, sizeof p, "evaldefault/a"));
  write_solid(tmp_path(p, sizeof p, "evaldefault/a/x.jpg"), 10, 20, 30);
  mkdirs(tmp_path(p, sizeof p, "evaldefault/b"));
  write_solid(tmp_path(p, sizeof p, "evaldefault/b/y.jpg"), 30, 20, 10);
  const struct { const char *section, *extra, *says; } cases[] = {
      {"eval_data", "size = 32\n", "shorter side resized to 37, centre 32x32 crop"},
      {"eval_data", "size = 224\n", "shorter side resized to 256, centre 224x224 crop"},
      {"data", "size = 32\n", "RandomResizedCrop + flip"},
      {"eval_data", "size = 32\ntrain = true\n", "RandomResizedCrop + flip"},
      {"data", "size = 32\ntrain = false\nresize = 40\n", "shorter side resized to 40, centre 32x32 crop"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    tf_ctx c = {root, cases[i].section, cases[i].extra, NULL};
    char *log = test_log_of(open_in, &c);
    EXPECT_OK(c.e);
    if (!strstr(log, cases[i].says)) fail_msg("[%s] %s: %s", cases[i].section, cases[i].extra, log);
    free(log);
  }
}

/* A class folder holding no readable JPEG (here only a link to nothing, as
 * behind an unmounted disk) fails the open naming the class and the link,
 * as torchvision's ImageFolder refuses it; allow_empty = true keeps the
 * label with a warning. */
static void test_empty_class_refused(void **state) {
  char p[4096], root[4096], link[4096];
  tmp_path(root, sizeof root, "emptyclass");
  mkdirs(tmp_path(p, sizeof p, "emptyclass/a"));
  write_solid(tmp_path(p, sizeof p, "emptyclass/a/x.jpg"), 10, 20, 30);
  mkdirs(tmp_path(p, sizeof p, "emptyclass/b"));
  tmp_path(link, sizeof link, "emptyclass/b/gone.jpg");
  unlink(link);
  assert_int_equal(symlink("/nonexistent/mnt/gone.jpg", link), 0);
  opened o;
  EXPECT_ERR(open_source(&o, root, "size = 16\n"), STOKE_E_DATA, "1 class folder hold no readable JPEG: 'b' (1)",
             "1 links point at nothing (the first: ", "allow_empty = true");
  close_source(&o);
  tf_ctx c = {root, "data", "size = 16\nallow_empty = true\n", NULL};
  char *log = test_log_of(open_in, &c);
  EXPECT_OK(c.e);
  if (!strstr(log, "1 class folders hold no JPEG ('b' (1); 1 links point at nothing")) fail_msg("%s", log);
  free(log);
}

/* [eval_data]'s class folders must be [data]'s: a name at another position
 * would score its images against another class. Opened as a run opens
 * them: [data] a jpeg source, [eval_data] its own root. */
static stoke_err *open_eval_beside(opened *o, const char *data_root, const char *eval_root) {
  memset(o, 0, sizeof *o);
  STOKE_PROPAGATE(stoke_registry_new(&o->reg));
  STOKE_PROPAGATE(stoke_registry_load(o->reg, PLUGIN));
  o->src = stoke_find_source(o->reg, "jpeg");
  o->cfg = stoke_cfg_new();
  static const stoke_cfg_key_v1 source_key[] = {{"source", STOKE_CFG_STR, "", 0, 0, NULL, "the source"}};
  STOKE_PROPAGATE(stoke_cfg_declare(o->cfg, "data", NULL, source_key, 1));
  STOKE_PROPAGATE(stoke_cfg_declare(o->cfg, "data", NULL, o->src->keys, o->src->n_keys));
  STOKE_PROPAGATE(stoke_cfg_declare(o->cfg, "eval_data", NULL, o->src->keys, o->src->n_keys));
  char ini[9000];
  snprintf(ini, sizeof ini, "[data]\nsource = jpeg\nroot = %s\nsize = 16\n[eval_data]\nroot = %s\nsize = 16\n",
           data_root, eval_root);
  STOKE_PROPAGATE(stoke_cfg_load_string(o->cfg, "test.ini", ini));
  return o->src->open(o->cfg, "eval_data", &o->self);
}

static void test_eval_classes_match(void **state) {
  char p[4096], tr[4096], same[4096], swapped[4096];
  static const char *const sets[][3] = {{"cls_train", "cat", "dog"}, {"cls_same", "cat", "dog"},
                                        {"cls_swapped", "cat", "dingo"}};
  for (int k = 0; k < 3; k++)
    for (int j = 1; j < 3; j++) {
      char sub[256];
      snprintf(sub, sizeof sub, "%s/%s", sets[k][0], sets[k][j]);
      mkdirs(tmp_path(p, sizeof p, sub));
      snprintf(sub, sizeof sub, "%s/%s/x.jpg", sets[k][0], sets[k][j]);
      write_solid(tmp_path(p, sizeof p, sub), 10 * j, 20, 30);
    }
  tmp_path(tr, sizeof tr, "cls_train");
  tmp_path(same, sizeof same, "cls_same");
  tmp_path(swapped, sizeof swapped, "cls_swapped");
  opened o;
  EXPECT_OK(open_eval_beside(&o, tr, same));
  close_source(&o);
  EXPECT_ERR(open_eval_beside(&o, tr, swapped), STOKE_E_INVALID, "[eval_data] class 1 is 'dingo', [data]'s",
             "is 'dog'");
  close_source(&o);
}

/* A folder of a few different images for the cache and thread tests. */
static void make_mixed(const char *name) {
  char p[4096];
  for (int c = 0; c < 3; c++) mkdirs(tmp_path(p, sizeof p, "%s/class%d", name, c));
  const int dims[6][2] = {{375, 500}, {500, 333}, {240, 320}, {200, 200}, {100, 150}, {480, 640}};
  for (int i = 0; i < 12; i++)
    write_rgb_jpeg(tmp_path(p, sizeof p, "%s/class%d/img%02d.jpg", name, i % 3, i), dims[i % 6][0], dims[i % 6][1], i,
                   i % 4 == 3 ? TJSAMP_444 : TJSAMP_420, 90, i % 5 == 4 ? TJFLAG_PROGRESSIVE : 0);
}

enum { MIX_N = 12, MIX_SEEDS = 3, MIX_S = 96 * 96 * 3 };

static uint8_t *read_everything(opened *o, int32_t *labels) {
  uint8_t *all = malloc((size_t)MIX_N * MIX_SEEDS * MIX_S);
  assert_non_null(all);
  for (int i = 0; i < MIX_N; i++)
    for (int s = 0; s < MIX_SEEDS; s++) {
      int32_t label;
      EXPECT_OK(o->src->read(o->self, i, (uint64_t)(s * 1000 + i), all + ((size_t)i * MIX_SEEDS + s) * MIX_S,
                             &label));
      if (labels) labels[i] = label;
    }
  return all;
}

static void test_cache(void **state) {
  (void)state;
  char root[4096];
  make_mixed("mixed_cache");
  tmp_path(root, sizeof root, "mixed_cache");
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 96\n"));
  int32_t labels[MIX_N];
  uint8_t *plain = read_everything(&o, labels);
  close_source(&o);
  EXPECT_OK(open_source(&o, root, "size = 96\ncache = ram\n"));
  uint8_t *first = read_everything(&o, NULL); /* fills the cache */
  uint8_t *second = read_everything(&o, NULL); /* from the cache */
  assert_memory_equal(plain, first, (size_t)MIX_N * MIX_SEEDS * MIX_S);
  assert_memory_equal(plain, second, (size_t)MIX_N * MIX_SEEDS * MIX_S);
  for (int i = 0; i < MIX_N; i++) assert_int_equal(labels[i], i / 4); /* 4 files per class */
  close_source(&o);
  free(plain);
  free(first);
  free(second);
}

typedef struct worker {
  opened *o;
  int id;
  uint8_t *out; /* [MIX_N * MIX_SEEDS] samples */
  int errors;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  for (int round = 0; round < 3; round++)
    for (int k = 0; k < MIX_N * MIX_SEEDS; k++) {
      int j = (k * 7 + w->id * 5 + round) % (MIX_N * MIX_SEEDS); /* each thread its own order */
      int i = j / MIX_SEEDS, s = j % MIX_SEEDS;
      int32_t label;
      stoke_err *e = w->o->src->read(w->o->self, i, (uint64_t)(s * 1000 + i), w->out + (size_t)j * MIX_S, &label);
      if (e) {
        stoke_err_free(e);
        w->errors++;
      } else if (label != i / 4) {
        w->errors++;
      }
    }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  char root[4096];
  make_mixed("mixed_mt");
  tmp_path(root, sizeof root, "mixed_mt");
  for (int cached = 0; cached < 2; cached++) {
    opened o;
    EXPECT_OK(open_source(&o, root, cached ? "size = 96\ncache = ram\n" : "size = 96\n"));
    uint8_t *single = read_everything(&o, NULL);
    close_source(&o);
    /* a fresh source, so with the cache the threads race to fill it */
    EXPECT_OK(open_source(&o, root, cached ? "size = 96\ncache = ram\n" : "size = 96\n"));
    pthread_t t[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
      w[i] = (worker){&o, i, malloc((size_t)MIX_N * MIX_SEEDS * MIX_S), 0};
      assert_non_null(w[i].out);
      assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
      pthread_join(t[i], NULL);
      assert_int_equal(w[i].errors, 0);
      assert_memory_equal(w[i].out, single, (size_t)MIX_N * MIX_SEEDS * MIX_S);
      free(w[i].out);
    }
    free(single);
    close_source(&o);
  }
}

/* Host memory for the loader's batch buffers: just malloc. */
static stoke_err *host_alloc(void *self, size_t bytes, void **ptr) {
  (void)self;
  *ptr = malloc(bytes);
  return *ptr ? NULL : STOKE_ERR(STOKE_E_OOM, "test: out of memory");
}
static void host_free(void *self, void *ptr) {
  (void)self;
  free(ptr);
}

/* Through the core's loader: a bad file is logged, counted and replaced;
 * every other sample arrives with its label. */
static void test_loader(void **state) {
  (void)state;
  char root[4096], p[4096];
  for (int c = 0; c < 2; c++) mkdirs(tmp_path(p, sizeof p, "loader/c%d", c));
  tmp_path(root, sizeof root, "loader");
  /* file k: colour (20 + 25 k, 200 - 20 k, 90), in class k / 4 */
  for (int k = 0; k < 8; k++) {
    tmp_path(p, sizeof p, "loader/c%d/f%d.jpg", k / 4, k);
    if (k == 5) write_bytes(p, "not a jpeg at all", 17);
    else write_solid(p, (uint8_t)(20 + 25 * k), (uint8_t)(200 - 20 * k), 90);
  }
  opened o;
  EXPECT_OK(open_source(&o, root, "size = 16\n"));
  stoke_backend_v1 host = {.name = "test-host", .alloc_host = host_alloc, .free_host = host_free};
  /* prefetch 1: no batch of the next epoch is read before the count below */
  stoke_loader_opts lo = {.src = o.src, .src_self = o.self, .dev = &host, .batch = 4, .workers = 2,
                          .prefetch = 1, .shuffle = 1, .drop_last = 1, .seed = 3, .rank = 0, .world = 1};
  stoke_loader *l;
  EXPECT_OK(stoke_loader_new(&lo, &l));
  assert_int_equal(stoke_loader_sample_bytes(l), 16 * 16 * 3);
  for (int64_t b = 0; b < stoke_loader_batches_per_epoch(l); b++) {
    stoke_batch *batch;
    EXPECT_OK(stoke_loader_next(l, &batch, NULL));
    for (int64_t i = 0; i < batch->n; i++) {
      const uint8_t *px = (const uint8_t *)batch->x + i * 16 * 16 * 3 + (8 * 16 + 8) * 3;
      int found = -1;
      for (int k = 0; k < 8; k++)
        if (abs(px[0] - (20 + 25 * k)) <= 4 && abs(px[1] - (200 - 20 * k)) <= 4) found = k;
      assert_true(found >= 0 && found != 5);
      assert_int_equal(batch->labels[i], found / 4);
    }
    if (b == stoke_loader_batches_per_epoch(l) - 1) assert_int_equal(stoke_loader_skipped(l), 1);
    stoke_loader_release(l, batch);
  }
  stoke_loader_free(l);
  close_source(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_labels),  cmocka_unit_test(test_one_class_warned), cmocka_unit_test(test_hidden_class_warned),
      cmocka_unit_test(test_eval_transform_by_default),
      cmocka_unit_test(test_empty_class_refused),
      cmocka_unit_test(test_eval_classes_match),
      cmocka_unit_test(test_links_and_loops),  cmocka_unit_test(test_eval_identity),
      cmocka_unit_test(test_eval_reference), cmocka_unit_test(test_train_reference),
      cmocka_unit_test(test_crop_params),    cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_color_modes),    cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_open_errors),    cmocka_unit_test(test_cache),
      cmocka_unit_test(test_threads),        cmocka_unit_test(test_loader),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
