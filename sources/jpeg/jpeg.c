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

#include <jpeglib.h>
#include <jerror.h>

#include "crop.h"
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

typedef struct strv {
  char **v;
  size_t n, cap;
} strv;

static int strv_push(strv *s, char *p) {
  if (!p) return -1;
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 16;
    char **nv = realloc(s->v, nc * sizeof *nv);
    if (!nv) {
      free(p);
      return -1;
    }
    s->v = nv;
    s->cap = nc;
  }
  s->v[s->n++] = p;
  return 0;
}

static void strv_free(strv *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof *s);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

static int is_jpeg_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

/* Entries of `dir` (symbolic links followed): folders into `dirs` (names
 * when `names`, else full paths), regular files into `files` (full paths).
 * -1 with errno when the folder cannot be read or memory runs out. */
static int list_dir(const char *dir, strv *dirs, int names, strv *files) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *de;
  int rc = 0;
  errno = 0;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char *full = join(dir, de->d_name);
    struct stat st;
    if (!full) {
      rc = -1;
      break;
    }
    if (stat(full, &st) != 0) { /* a dangling link: neither */
      free(full);
      continue;
    }
    if (S_ISDIR(st.st_mode) && dirs) {
      if (names) {
        free(full);
        full = strdup(de->d_name);
      }
      if (strv_push(dirs, full)) rc = -1;
    } else if (S_ISREG(st.st_mode) && files) {
      if (strv_push(files, full)) rc = -1;
    } else {
      free(full);
    }
    if (rc) break;
  }
  int saved = errno;
  closedir(d);
  errno = saved;
  return rc;
}

/* Every JPEG of one class in torchvision's order: sorted(os.walk(class))
 * visits folders by path, files sorted within each. Appends to `out`;
 * other files are counted in *other. */
static stoke_err *scan_class(const char *cdir, strv *out, int64_t *other) {
  strv dirs = {0};
  stoke_err *e = NULL;
  if (strv_push(&dirs, strdup(cdir))) return STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
  /* breadth first; the list grows while it is walked */
  for (size_t i = 0; i < dirs.n && !e; i++)
    if (list_dir(dirs.v[i], &dirs, 0, NULL))
      e = STOKE_PERR(errno == ENOMEM ? STOKE_E_OOM : STOKE_E_IO, "jpeg: cannot list %s: %s", dirs.v[i],
                     strerror(errno));
  if (!e) qsort(dirs.v, dirs.n, sizeof *dirs.v, cmp_str);
  for (size_t i = 0; i < dirs.n && !e; i++) {
    strv files = {0};
    if (list_dir(dirs.v[i], NULL, 0, &files)) {
      e = STOKE_PERR(STOKE_E_IO, "jpeg: cannot list %s: %s", dirs.v[i], strerror(errno));
    } else {
      if (files.n) qsort(files.v, files.n, sizeof *files.v, cmp_str);
      for (size_t k = 0; k < files.n && !e; k++) {
        const char *base = strrchr(files.v[k], '/') + 1;
        if (!is_jpeg_name(base)) {
          (*other)++;
          continue;
        }
        if (strv_push(out, files.v[k])) e = STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
        files.v[k] = NULL;
      }
    }
    strv_free(&files);
  }
  strv_free(&dirs);
  return e;
}

static stoke_err *scan(jpeg_src *s, const char *where) {
  struct stat st;
  if (stat(s->root, &st) != 0)
    return STOKE_PERR(errno == ENOENT || errno == ENOTDIR ? STOKE_E_NOT_FOUND : STOKE_E_IO,
                      "jpeg %s (root, %s): %s; it should hold " LAYOUT, s->root, where, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return STOKE_PERR(STOKE_E_INVALID, "jpeg %s (root, %s): not a folder; it should hold " LAYOUT, s->root, where);
  strv classes = {0}, files = {0}, top = {0};
  stoke_err *e = NULL;
  if (list_dir(s->root, &classes, 1, &top))
    e = STOKE_PERR(STOKE_E_IO, "jpeg %s: cannot list the folder: %s", s->root, strerror(errno));
  if (!e && classes.n == 0)
    e = STOKE_PERR(STOKE_E_INVALID, "jpeg %s (root, %s): %s, no class folders; it should hold " LAYOUT, s->root,
                   where, top.n ? "only files" : "an empty folder");
  int64_t other = 0, empty = 0;
  const char *first_empty = NULL;
  int32_t *labels = NULL;
  size_t labels_cap = 0;
  if (!e && classes.n) qsort(classes.v, classes.n, sizeof *classes.v, cmp_str);
  for (size_t c = 0; c < classes.n && !e; c++) {
    char *cdir = join(s->root, classes.v[c]);
    size_t before = files.n;
    e = cdir ? scan_class(cdir, &files, &other) : STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
    free(cdir);
    if (e) break;
    if (files.n == before && empty++ == 0) first_empty = classes.v[c];
    if (files.n > labels_cap) {
      size_t nc = files.cap;
      int32_t *nl = realloc(labels, nc * sizeof *nl);
      if (!nl) {
        e = STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
        break;
      }
      labels = nl;
      labels_cap = nc;
    }
    for (size_t k = before; k < files.n; k++) labels[k] = (int32_t)c;
  }
  if (!e && files.n == 0)
    e = STOKE_PERR(STOKE_E_INVALID, "jpeg %s (root, %s): %zu class folders but no .jpg/.jpeg file in them%s", s->root,
                   where, classes.n, other ? " (only other files)" : "");
  if (!e) {
    if (empty)
      stoke_host->log(STOKE_LOG_WARN, "jpeg",
                      "%s: %lld class folders hold no JPEG (first: %s); their labels are kept but never drawn",
                      s->root, (long long)empty, first_empty);
    if (other)
      stoke_host->log(STOKE_LOG_INFO, "jpeg", "%s: ignored %lld files that are not .jpg/.jpeg", s->root,
                      (long long)other);
    s->count = (int64_t)files.n;
    s->classes = (int64_t)classes.n;
    s->paths = files.v;
    s->labels = labels;
    files.v = NULL;
    files.n = 0;
    labels = NULL;
  }
  free(labels);
  strv_free(&files);
  strv_free(&classes);
  strv_free(&top);
  return e;
}

/* --------------------------------------------------------------- decode */

typedef struct jpeg_err {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
  int bad;  /* a warning that means damaged data */
  int code; /* the error's message code */
} jpeg_err;

static void on_error(j_common_ptr c) {
  jpeg_err *e = (jpeg_err *)c->err;
  e->code = c->err->msg_code;
  c->err->format_message(c, e->msg);
  longjmp(e->jb, 1);
}

/* libjpeg goes on after warnings (level -1). Extraneous bytes before a
 * marker and the like leave a fine image; running out of data ("Premature
 * end of JPEG file") or undecodable entropy data leave gray or garbled
 * blocks, so those make the sample bad. */
static void on_emit(j_common_ptr c, int level) {
  jpeg_err *e = (jpeg_err *)c->err;
  if (level >= 0) return;
  c->err->num_warnings++;
  int code = c->err->msg_code;
  if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_HUFF_BAD_CODE || code == JWRN_MUST_RESYNC) {
    if (!e->bad) c->err->format_message(c, e->msg);
    e->bad = 1;
  }
}

static void on_output(j_common_ptr c) { (void)c; } /* plugins never print */

/* Everything one decode allocates, outside the frame that calls setjmp. */
typedef struct dec {
  struct jpeg_decompress_struct d;
  jpeg_err e;
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

/* Adobe CMYK as libjpeg returns it (inverted, as Photoshop writes it) to
 * RGB: R = C * K / 255, the conversion of libjpeg-turbo's djpeg and of PIL
 * (which reads every CMYK JPEG as "CMYK;I", assuming Adobe's convention). */
static void cmyk_to_rgb(const uint8_t *in, uint8_t *out, size_t n) {
  for (size_t i = 0; i < n; i++, in += 4, out += 3) {
    unsigned k = in[3];
    out[0] = (uint8_t)((in[0] * k + 127) / 255);
    out[1] = (uint8_t)((in[1] * k + 127) / 255);
    out[2] = (uint8_t)((in[2] * k + 127) / 255);
  }
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
  memset(&c->e, 0, sizeof c->e);
  c->d.err = jpeg_std_error(&c->e.pub);
  c->e.pub.error_exit = on_error;
  c->e.pub.emit_message = on_emit;
  c->e.pub.output_message = on_output;
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
  int cmyk = 0;
  switch (c->d.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
      c->d.out_color_space = JCS_RGB;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      c->d.out_color_space = JCS_CMYK;
      cmyk = 1;
      break;
    default:
      snprintf(c->e.msg, sizeof c->e.msg, "unsupported JPEG color space %d with %d components",
               (int)c->d.jpeg_color_space, c->d.num_components);
      return -1;
  }
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
    if (cmyk) cmyk_to_rgb(c->row, out, wid);
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
