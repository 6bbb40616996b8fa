/* sources/jpeg: the "jpeg" data source. Reads an ImageFolder (ROOT/CLASS/
 * IMAGE.jpg) and decodes each sample with torchvision's ImageNet transforms
 * (RandomResizedCrop + flip for training, Resize + CenterCrop for eval).
 *
 * A read decodes only what the sample shows: the crop is chosen from the
 * JPEG header, the decoder scales in the DCT domain by the smallest M/8
 * (M = 1, 2, 4, 8: the SIMD ones) that keeps the crop at least `size`
 * pixels on both sides, decodes only
 * the crop's columns (jpeg_crop_scanline) and rows (jpeg_skip_scanlines
 * above, nothing below), and crop.c's antialiased bilinear resampler writes
 * the size x size RGB result straight into the batch slot. libjpeg-turbo's
 * libjpeg API is linked statically (see BUILD). Every bad file is
 * STOKE_E_DATA naming its path, which the loader logs, counts and replaces. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jerror.h>

#include "crop.h"
#include "decode.h"
#include "walk.h"
#include "stoke/plugin.h"
#include "stoke/rng.h"

const stoke_host_v1 *stoke_host;

void stoke_jpeg_stderr_init(void); /* stderr_shim.c */

#define LAYOUT "one folder per class holding its .jpg/.jpeg files (ROOT/CLASS/IMAGE.jpg, as torchvision's ImageFolder)"

static const stoke_cfg_key_v1 keys[] = {
    {"root", STOKE_CFG_STR, "", 0, 0, NULL,
     "image folder: " LAYOUT "; sorted class folder names give the labels 0..C-1"},
    {"size", STOKE_CFG_INT, "224", 1, 16384, NULL, "output side: samples are size x size x 3 u8 (HWC)"},
    {"train", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "true: RandomResizedCrop(size) + random horizontal flip; false: resize the shorter side to `resize`, "
     "then the centre size x size"},
    {"resize", STOKE_CFG_INT, "256", 1, 65536, NULL, "eval (train = false): shorter side before the centre crop"},
    {"scale_min", STOKE_CFG_FLOAT, "0.08", 1e-6, 1, NULL, "RandomResizedCrop: smallest fraction of the area"},
    {"scale_max", STOKE_CFG_FLOAT, "1.0", 1e-6, 1, NULL, "RandomResizedCrop: largest fraction of the area"},
    {"ratio_min", STOKE_CFG_FLOAT, "0.75", 1e-3, 1e3, NULL, "RandomResizedCrop: smallest aspect ratio (w/h)"},
    {"ratio_max", STOKE_CFG_FLOAT, "1.3333333333", 1e-3, 1e3, NULL,
     "RandomResizedCrop: largest aspect ratio (w/h); 4/3 as torchvision"},
    {"flip", STOKE_CFG_BOOL, "true", 0, 0, NULL, "train: mirror left-right with probability 0.5"},
    {"cache", STOKE_CFG_ENUM, "none", 0, 0, "none|ram",
     "ram: keep every file's encoded bytes in memory after its first read (the whole data set must fit)"},
};

/* A file's bytes, kept by the RAM cache. */
typedef struct blob {
  size_t n;
  uint8_t d[];
} blob;

typedef struct jpeg_src {
  char *root;
  int64_t count, classes;
  char **paths;    /* [count] */
  int32_t *labels; /* [count] */
  int size, resize, train, flip, cache;
  double scale_min, scale_max, ratio_min, ratio_max;
  blob **cached; /* [count], filled once each, atomically; NULL: no cache */
} jpeg_src;

/* ------------------------------------------------------------- scanning */

/* The image list (walk.h: torchvision's ImageFolder, without its loops). */
static stoke_err *scan(jpeg_src *s, const char *where) {
  stoke_image_list l;
  if (stoke_walk_image_folder(s->root, &l)) {
    if (errno == ENOENT || errno == ENOTDIR)
      return STOKE_PERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_INVALID,
                        "jpeg %s (root, %s): %s; it should hold " LAYOUT, s->root, where,
                        errno == ENOENT ? "no such folder" : "not a folder");
    return STOKE_PERR(errno == ENOMEM ? STOKE_E_OOM : STOKE_E_IO, "jpeg %s: cannot list the folder: %s", s->root,
                      strerror(errno));
  }
  stoke_err *e = NULL;
  if (l.n_classes == 0)
    e = STOKE_PERR(STOKE_E_INVALID, "jpeg %s (root, %s): %s, no class folders; it should hold " LAYOUT, s->root,
                   where, l.other ? "only files" : "an empty folder");
  else if (l.n == 0)
    e = STOKE_PERR(STOKE_E_INVALID, "jpeg %s (root, %s): %zu class folders but no .jpg/.jpeg file in them%s", s->root,
                   where, l.n_classes, l.other ? " (only other files)" : "");
  if (!e) {
    if (l.empty)
      stoke_host->log(STOKE_LOG_WARN, "jpeg", "%s: %zu class folders hold no JPEG; their labels are kept but never drawn",
                      s->root, l.empty);
    if (l.other)
      stoke_host->log(STOKE_LOG_INFO, "jpeg", "%s: ignored %zu files that are not .jpg/.jpeg (first: %s)", s->root,
                      l.other, l.first_other);
    if (l.loops || l.pseudo || l.unreadable)
      stoke_host->log(STOKE_LOG_WARN, "jpeg",
                      "%s: skipped %zu folders that link back to a folder they are in, %zu of kernel file systems and "
                      "%zu that cannot be read; first: %s",
                      s->root, l.loops, l.pseudo, l.unreadable, l.first_skipped);
    s->count = (int64_t)l.n;
    s->classes = (int64_t)l.n_classes;
    s->paths = l.paths;
    s->labels = l.labels;
    l.paths = NULL;
    l.labels = NULL;
    l.n = 0;
  }
  stoke_image_list_free(&l);
  return e;
}

/* --------------------------------------------------------------- decode */

/* Everything one decode allocates, outside the frame that calls setjmp. */
typedef struct dec {
  struct jpeg_decompress_struct d;
  stoke_jpeg_err e;
  int created;
  uint8_t *buf; /* decoded rows, RGB */
  uint8_t *row; /* one row: CMYK before conversion, or discarded */
} dec;

static void dec_free(dec *c) {
  if (c->created) jpeg_destroy_decompress(&c->d);
  free(c->buf);
  free(c->row);
  c->created = 0;
  c->buf = c->row = NULL;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Whether the data ends with the EOI marker: then it was not cut short, and
 * the rows below the crop need no decoding just to find that out. */
static int ends_with_eoi(const uint8_t *p, size_t n) { return n >= 2 && p[n - 2] == 0xFF && p[n - 1] == 0xD9; }

/* Decodes and transforms one JPEG into dst. `partial`: crop and skip in the
 * decoder; 0: decode every row and column, then crop (the fallback). -1 on
 * bad data, with the reason in c->e.msg. */
static int decode(const jpeg_src *s, const uint8_t *data, size_t n, uint64_t seed, uint8_t *dst, dec *c,
                  int partial) {
  stoke_jpeg_err_init(&c->d, &c->e); /* decode.h: one rule for libjpeg's warnings, everywhere */
  if (setjmp(c->e.jb)) return -1;
  jpeg_create_decompress(&c->d);
  c->created = 1;
  jpeg_mem_src(&c->d, data, (unsigned long)n);
  jpeg_read_header(&c->d, TRUE);
  int H = (int)c->d.image_height, W = (int)c->d.image_width, size = s->size;

  /* (3) the crop, in the original image's pixels */
  stoke_jpeg_rect r;
  int flip = 0;
  if (s->train) {
    stoke_rng g = stoke_rng_seed(seed);
    int top, left, ch, cw;
    stoke_jpeg_random_crop(&g, H, W, s->scale_min, s->scale_max, s->ratio_min, s->ratio_max, &top, &left, &ch, &cw);
    r = (stoke_jpeg_rect){left, top, cw, ch};
    flip = s->flip && stoke_rng_uniform(&g) < 0.5;
  } else {
    r = stoke_jpeg_center_crop(H, W, s->resize, size);
  }

  /* (4) the smallest DCT scale M/8 at which the crop still covers `size`
   * pixels both ways: less to decode, and a good antialiased downscale.
   * Only M = 1, 2, 4, 8: libjpeg-turbo has SIMD inverse DCTs for those,
   * while 3/8, 5/8, 6/8, 7/8 run its scalar C ones (and 12x12, 14x14 ones
   * for 4:2:0 chroma); measured on a 500x375 q90 4:2:0 photo to 224, full
   * size + our resampler decoded ~18% more images/s than 6/8 or 7/8. */
  static const int scales[3] = {1, 2, 4};
  int M = 8;
  for (int i = 0; i < 3; i++)
    if (r.w * scales[i] / 8 >= size && r.h * scales[i] / 8 >= size) {
      M = scales[i];
      break;
    }
  c->d.scale_num = (unsigned)M;
  c->d.scale_denom = 8;
  int cmyk = stoke_jpeg_out_space(&c->d, 3, &c->e);
  if (cmyk < 0) return -1;
  jpeg_start_decompress(&c->d);
  int OW = (int)c->d.output_width, OH = (int)c->d.output_height;
  double f = M / 8.0;
  stoke_jpeg_rect rs = {r.x * f, r.y * f, r.w * f, r.h * f};
  /* train: torchvision crops, then resizes, so the filter stops at the
   * crop's edges; eval resizes the whole image, then crops, so the filter
   * may reach a little past the crop: decode that margin too */
  int margin = 0;
  if (!s->train) margin = (int)ceil(rs.w / size > 1 ? rs.w / size : 1) + 1;
  int bx0 = clampi((int)floor(rs.x) - margin, 0, OW - 1), bx1 = clampi((int)ceil(rs.x + rs.w) + margin, bx0 + 1, OW);
  int by0 = clampi((int)floor(rs.y) - margin, 0, OH - 1), by1 = clampi((int)ceil(rs.y + rs.h) + margin, by0 + 1, OH);
  JDIMENSION xoff = 0, wid = (JDIMENSION)OW;
  if (partial && bx1 - bx0 < OW) {
    xoff = (JDIMENSION)bx0;
    wid = (JDIMENSION)(bx1 - bx0);
    jpeg_crop_scanline(&c->d, &xoff, &wid); /* widens to iMCU boundaries */
  }
  size_t stride = (size_t)wid * 3;
  c->buf = malloc(stride * (size_t)(by1 - by0));
  c->row = malloc((size_t)wid * 4); /* CMYK, and the scratch row */
  if (!c->buf || !c->row) {
    snprintf(c->e.msg, sizeof c->e.msg, "out of memory for %ux%d decoded pixels", wid, by1 - by0);
    return -1;
  }
  if (by0 > 0 && partial) jpeg_skip_scanlines(&c->d, (JDIMENSION)by0);
  while ((int)c->d.output_scanline < by1) {
    int y = (int)c->d.output_scanline;
    JSAMPROW out = y >= by0 ? c->buf + (size_t)(y - by0) * stride : c->buf; /* rows above: scratch */
    JSAMPROW target = cmyk ? c->row : out;
    if (jpeg_read_scanlines(&c->d, &target, 1) != 1) break;
    if (cmyk) stoke_jpeg_cmyk_rows(c->row, out, wid, 3);
  }
  if ((int)c->d.output_scanline < by1 && !c->e.bad)
    snprintf(c->e.msg, sizeof c->e.msg, "decoder stopped at row %u of %d", c->d.output_scanline, by1);
  if ((int)c->d.output_scanline < by1) return -1;
  if (!ends_with_eoi(data, n) && !c->e.bad) {
    /* no EOI at the end: truncated, or trailing bytes after the image;
     * decode to the end to tell (skipping to the last row reads nothing,
     * so the rows are read; finish reads up to the EOI marker) */
    while (c->d.output_scanline < c->d.output_height && !c->e.bad) {
      JSAMPROW scratch = c->row;
      if (jpeg_read_scanlines(&c->d, &scratch, 1) != 1) break;
    }
    if (!c->e.bad) jpeg_finish_decompress(&c->d);
  }
  if (c->e.bad) return -1;

  /* (5, 6) resample the crop to size x size, mirrored when flipped */
  stoke_jpeg_rect rel = {rs.x - bx0, rs.y - by0, rs.w, rs.h};
  if (stoke_jpeg_resample(c->buf + (size_t)(bx0 - (int)xoff) * 3, bx1 - bx0, by1 - by0, (int)stride, rel, dst, size,
                          size, flip)) {
    snprintf(c->e.msg, sizeof c->e.msg, "out of memory resampling");
    return -1;
  }
  return 0;
}

/* ----------------------------------------------------------------- read */

static blob *read_file(const char *path, char *why, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, cap, "cannot open: %s", strerror(errno));
    return NULL;
  }
  struct stat st;
  blob *b = NULL;
  if (fstat(fd, &st) != 0) {
    snprintf(why, cap, "cannot stat: %s", strerror(errno));
  } else if (st.st_size == 0) {
    snprintf(why, cap, "empty file, not a JPEG");
  } else if (!(b = malloc(sizeof *b + (size_t)st.st_size))) {
    snprintf(why, cap, "out of memory for %lld bytes", (long long)st.st_size);
  } else {
    size_t got = 0, want = (size_t)st.st_size;
    errno = 0;
    while (got < want) {
      ssize_t k = read(fd, b->d + got, want - got);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got += (size_t)k;
    }
    if (got == 0) {
      snprintf(why, cap, "cannot read: %s", errno ? strerror(errno) : "the file is empty now");
      free(b);
      b = NULL;
    } else {
      b->n = got; /* a file that shrank since: decode what is there */
    }
  }
  close(fd);
  return b;
}

static stoke_err *jp_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  jpeg_src *s = self;
  if (index < 0 || index >= s->count)
    return STOKE_PERR(STOKE_E_INVALID, "jpeg %s: index %lld outside [0, %lld)", s->root, (long long)index,
                      (long long)s->count);
  const char *path = s->paths[index];
  char why[JMSG_LENGTH_MAX + 256];
  blob *b = s->cached ? __atomic_load_n(&s->cached[index], __ATOMIC_ACQUIRE) : NULL;
  int owned = 0;
  if (!b) {
    b = read_file(path, why, sizeof why);
    if (!b) return STOKE_PERR(STOKE_E_DATA, "jpeg %s: %s", path, why);
    owned = 1;
    if (s->cached) {
      blob *expect = NULL;
      if (__atomic_compare_exchange_n(&s->cached[index], &expect, b, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        owned = 0; /* the cache keeps it */
      } else {     /* another thread cached it first: use that one */
        free(b);
        b = expect;
        owned = 0;
      }
    }
  }
  dec c;
  memset(&c, 0, sizeof c);
  int rc = decode(s, b->d, b->n, seed, dst, &c, 1);
  if (rc && !c.e.bad && (c.e.code == JERR_BAD_CROP_SPEC || c.e.code == JERR_NOTIMPL)) {
    /* a mode where cropping in the decoder is refused: decode it all */
    dec_free(&c);
    memset(&c, 0, sizeof c);
    rc = decode(s, b->d, b->n, seed, dst, &c, 0);
  }
  if (rc) snprintf(why, sizeof why, "%s", c.e.msg[0] ? c.e.msg : "undecodable JPEG");
  dec_free(&c);
  if (owned) free(b);
  if (rc) return STOKE_PERR(STOKE_E_DATA, "jpeg %s: %s", path, why);
  *label = s->labels[index];
  return NULL;
}

/* ----------------------------------------------------------------- open */

static void jp_close(void *self) {
  jpeg_src *s = self;
  if (!s) return;
  for (int64_t i = 0; i < s->count; i++) {
    if (s->paths) free(s->paths[i]);
    if (s->cached) free(s->cached[i]);
  }
  free(s->paths);
  free(s->labels);
  free(s->cached);
  free(s->root);
  free(s);
}

static stoke_err *jp_open(const stoke_cfg *c, const char *sec, void **self) {
  const char *root = NULL, *cache = NULL;
  int64_t size = 0, resize = 0;
  int train = 0, flip = 0;
  double smin = 0, smax = 0, rmin = 0, rmax = 0;
  STOKE_PROPAGATE_P(stoke_host->cfg_str(c, sec, "root", &root));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "size", &size));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "resize", &resize));
  STOKE_PROPAGATE_P(stoke_host->cfg_bool(c, sec, "train", &train));
  STOKE_PROPAGATE_P(stoke_host->cfg_bool(c, sec, "flip", &flip));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "scale_min", &smin));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "scale_max", &smax));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "ratio_min", &rmin));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "ratio_max", &rmax));
  STOKE_PROPAGATE_P(stoke_host->cfg_str(c, sec, "cache", &cache));
  if (!root || !root[0])
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] root is empty: set it to a folder with " LAYOUT,
                      stoke_host->cfg_where(c, sec, "root"), sec);
  if (smin > smax)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] scale_min = %g is above scale_max = %g",
                      stoke_host->cfg_where(c, sec, "scale_min"), sec, smin, smax);
  if (rmin > rmax)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] ratio_min = %g is above ratio_max = %g",
                      stoke_host->cfg_where(c, sec, "ratio_min"), sec, rmin, rmax);
  if (!train && resize < size)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] resize = %lld is below size = %lld: the centre crop would not fit",
                      stoke_host->cfg_where(c, sec, "resize"), sec, (long long)resize, (long long)size);
  jpeg_src *s = calloc(1, sizeof *s);
  if (!s || !(s->root = strdup(root))) {
    free(s);
    return STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
  }
  s->size = (int)size;
  s->resize = (int)resize;
  s->train = train;
  s->flip = flip;
  s->scale_min = smin;
  s->scale_max = smax;
  s->ratio_min = rmin;
  s->ratio_max = rmax;
  s->cache = cache && !strcmp(cache, "ram");
  stoke_err *e = scan(s, stoke_host->cfg_where(c, sec, "root"));
  if (!e && s->cache && !(s->cached = calloc((size_t)s->count, sizeof *s->cached)))
    e = STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
  if (e) {
    jp_close(s);
    return e;
  }
  stoke_host->log(STOKE_LOG_INFO, "jpeg", "%s: %lld images in %lld classes -> %dx%dx3, %s%s", s->root,
                  (long long)s->count, (long long)s->classes, s->size, s->size,
                  s->train ? (s->flip ? "RandomResizedCrop + flip" : "RandomResizedCrop") : "resize + centre crop",
                  s->cache ? ", RAM cache" : "");
  *self = s;
  return NULL;
}

static int64_t jp_length(void *self) { return ((jpeg_src *)self)->count; }

static stoke_err *jp_info(void *self, stoke_sample_info_v1 *out) {
  jpeg_src *s = self;
  memset(out, 0, sizeof *out);
  out->shape.ndim = 3;
  out->shape.d[0] = 3;
  out->shape.d[1] = s->size;
  out->shape.d[2] = s->size;
  out->dtype = STOKE_U8;
  out->layout = STOKE_NHWC;
  out->classes = s->classes;
  return NULL;
}

static const stoke_source_v1 source = {
    STOKE_ABI(stoke_source_v1),
    "jpeg",
    "JPEG image folder (ROOT/CLASS/IMAGE.jpg): RandomResizedCrop + flip or resize + centre crop, u8 RGB, HWC",
    keys,
    sizeof keys / sizeof *keys,
    jp_open,
    jp_close,
    jp_length,
    jp_info,
    jp_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  stoke_jpeg_stderr_init();
  return r->add_source(r->self, &source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "jpeg", "JPEG image-folder data source", reg};
