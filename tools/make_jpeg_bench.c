/* tools/make_jpeg_bench: writes BENCH.md's jpeg-bench folder (ten class
 * folders c0..c9 of JPEGs cut from real photos) with libjpeg-turbo, seeded.
 *
 *   make_jpeg_bench --photos DIR --out DIR [--count 3000] [--seed 1]
 *                   [--quality 90] [--threads N] [--force]
 *
 * Image i draws everything from its own stream, stoke_rng_seed(hash(seed,
 * i)): which photo, a random crop of 20 to 100% of its area with aspect 3/4
 * to 4/3 (RandomResizedCrop's sampling), and one of six output sizes. The
 * crop is resized with an antialiased bilinear (triangle) filter and saved
 * at --quality with 4:2:0 chroma. So the files do not depend on the thread
 * count, and the same seed gives byte-identical files.
 *
 * Classes are round-robin: image i goes to c(i mod 10)/img_<i>.jpg, so every
 * class folder exists and holds count/10 images whatever the number of
 * photos (the labels say nothing about content: this is a loader benchmark,
 * not a task). Exit codes: 0 done, 1 error, 2 usage. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <turbojpeg.h>

#include "stoke/core.h"
#include "stoke/rng.h"

#define CLASSES 10
#define MAX_THREADS 256

/* The six output sizes of BENCH.md, width x height. */
static const int SIZES[6][2] = {{500, 375}, {500, 333}, {375, 500}, {640, 480}, {500, 500}, {333, 500}};

static void usage(FILE *f) {
  fprintf(f,
          "usage: make_jpeg_bench --photos DIR --out DIR [--count 3000] [--seed 1] [--quality 90]\n"
          "                       [--threads N] [--force]\n"
          "       make_jpeg_bench --help\n"
          "\n"
          "Writes the jpeg-bench folder of BENCH.md: --count JPEGs in class folders c0..c9\n"
          "(image i is OUT/c<i mod 10>/img_<i>.jpg), each a random crop of one of the photos\n"
          "(.jpg/.jpeg files in --photos; 20 to 100%% of the area, aspect 3/4 to 4/3), resized\n"
          "to 500x375, 500x333, 375x500, 640x480, 500x500 or 333x500 and saved at --quality\n"
          "(1-100, default 90) with 4:2:0 chroma. The same --seed (default 1) gives\n"
          "byte-identical files, whatever --threads (default: the number of CPUs).\n"
          "--out    created if missing; a non-empty folder is refused unless --force, which\n"
          "         removes the c*/img_*.jpg files in it first.\n"
          "Exit codes: 0 done, 1 error, 2 usage.\n");
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------- photos */

typedef struct photo {
  char *path;
  uint8_t *rgb; /* h x w x 3 */
  int w, h;
} photo;

typedef struct photos {
  photo *v;
  int n;
} photos;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_jpeg_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

static stoke_err *read_whole(const char *path, unsigned char **buf, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return STOKE_ERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || st.st_size <= 0) {
    stoke_err *e = STOKE_ERR(STOKE_E_DATA, "%s: %s", path, st.st_size == 0 ? "empty file" : strerror(errno));
    fclose(f);
    return e;
  }
  *n = (size_t)st.st_size;
  *buf = malloc(*n);
  if (!*buf || fread(*buf, 1, *n, f) != *n) {
    stoke_err *e = STOKE_ERR(STOKE_E_IO, "%s: cannot read: %s", path, *buf ? strerror(errno) : "out of memory");
    free(*buf);
    *buf = NULL;
    fclose(f);
    return e;
  }
  fclose(f);
  return NULL;
}

/* Decodes one photo to RGB; errors name the file and the libjpeg-turbo call. */
static stoke_err *load_photo(tjhandle dec, photo *p) {
  unsigned char *file = NULL;
  size_t n = 0;
  STOKE_PROPAGATE(read_whole(p->path, &file, &n));
  int subsamp, cs;
  stoke_err *e = NULL;
  p->w = p->h = 0;
  /* a truncated header can come back as success with a warning and no size */
  if (tjDecompressHeader3(dec, file, (unsigned long)n, &p->w, &p->h, &subsamp, &cs) != 0 || p->w < 1 || p->h < 1) {
    e = STOKE_ERR(STOKE_E_DATA, "%s: not a readable JPEG: tjDecompressHeader3: %s", p->path, tjGetErrorStr2(dec));
    p->w = p->h = 0;
    goto done;
  }
  p->rgb = malloc((size_t)p->w * p->h * 3);
  if (!p->rgb) {
    e = STOKE_ERR(STOKE_E_OOM, "%s: out of memory for a %dx%d image", p->path, p->w, p->h);
    goto done;
  }
  if (tjDecompress2(dec, file, (unsigned long)n, p->rgb, p->w, 0, p->h, TJPF_RGB, 0) != 0) {
    /* warnings leave a usable image, except when the data ends early */
    const char *msg = tjGetErrorStr2(dec);
    if (tjGetErrorCode(dec) != TJERR_WARNING || strstr(msg, "Premature end"))
      e = STOKE_ERR(STOKE_E_DATA, "%s: cannot decode: tjDecompress2: %s", p->path, msg);
  }
done:
  free(file);
  return e;
}

static void free_photos(photos *ps) {
  for (int i = 0; i < ps->n; i++) {
    free(ps->v[i].path);
    free(ps->v[i].rgb);
  }
  free(ps->v);
  ps->v = NULL;
  ps->n = 0;
}

/* Every .jpg/.jpeg in dir, sorted by name (the order fixes what a seed
 * means), decoded. */
static stoke_err *load_photos(const char *dir, photos *out) {
  DIR *d = opendir(dir);
  if (!d) return STOKE_ERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_IO, "cannot read the folder %s: %s", dir,
                           strerror(errno));
  char **names = NULL;
  int n = 0, cap = 0;
  stoke_err *e = NULL;
  for (struct dirent *de; (de = readdir(d));) {
    if (de->d_name[0] == '.' || !is_jpeg_name(de->d_name)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 32;
      char **nn = realloc(names, sizeof *nn * (size_t)cap);
      if (!nn) {
        e = STOKE_ERR(STOKE_E_OOM, "out of memory listing %s", dir);
        break;
      }
      names = nn;
    }
    size_t len = strlen(dir) + strlen(de->d_name) + 2;
    if (!(names[n] = malloc(len))) {
      e = STOKE_ERR(STOKE_E_OOM, "out of memory listing %s", dir);
      break;
    }
    snprintf(names[n++], len, "%s/%s", dir, de->d_name);
  }
  closedir(d);
  if (!e && !n) e = STOKE_ERR(STOKE_E_NOT_FOUND, "%s holds no .jpg/.jpeg photos", dir);
  if (!e) {
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    out->v = calloc((size_t)n, sizeof *out->v);
    if (!out->v) e = STOKE_ERR(STOKE_E_OOM, "out of memory");
  }
  if (e) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return e;
  }
  out->n = n;
  for (int i = 0; i < n; i++) out->v[i].path = names[i];
  free(names);
  tjhandle dec = tjInitDecompress();
  if (!dec) return STOKE_ERR(STOKE_E_INTERNAL, "tjInitDecompress: %s", tjGetErrorStr2(NULL));
  for (int i = 0; i < n && !e; i++) e = load_photo(dec, &out->v[i]);
  tjDestroy(dec);
  return e;
}

/* ------------------------------------------------------------ resize */

/* Antialiased bilinear resampling, separable: a triangle filter widened by
 * the scale when shrinking (what PIL's BILINEAR does), pixel centres at
 * +0.5, edges clamped. Plain bilinear would alias when a 1411-pixel photo
 * becomes 333 pixels, and aliasing changes the JPEG sizes. */
typedef struct taps {
  int *first, *count; /* per output pixel */
  float *w;           /* count weights each, max_taps apart */
  int max_taps;
} taps;

static int make_taps(int in, int out, taps *t) {
  double scale = (double)in / out, support = scale > 1 ? scale : 1;
  t->max_taps = (int)ceil(support) * 2 + 2;
  t->first = malloc(sizeof(int) * (size_t)out);
  t->count = malloc(sizeof(int) * (size_t)out);
  t->w = malloc(sizeof(float) * (size_t)out * (size_t)t->max_taps);
  if (!t->first || !t->count || !t->w) return -1;
  for (int o = 0; o < out; o++) {
    double c = (o + 0.5) * scale;
    int lo = (int)floor(c - support), hi = (int)ceil(c + support);
    if (lo < 0) lo = 0;
    if (hi > in) hi = in;
    double sum = 0, w[1024];
    int n = 0;
    for (int j = lo; j < hi && n < t->max_taps && n < 1024; j++) {
      double x = fabs((j + 0.5 - c) / support);
      w[n] = x < 1 ? 1 - x : 0;
      sum += w[n++];
    }
    if (sum <= 0) { /* cannot happen with in >= 1, but keep a valid tap */
      lo = (int)c < in ? (int)c : in - 1;
      n = 1;
      w[0] = sum = 1;
    }
    t->first[o] = lo;
    t->count[o] = n;
    for (int k = 0; k < n; k++) t->w[(size_t)o * t->max_taps + k] = (float)(w[k] / sum);
  }
  return 0;
}

static void free_taps(taps *t) {
  free(t->first);
  free(t->count);
  free(t->w);
}

static uint8_t clamp_u8(float v) { return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)(v + 0.5f); }

/* src: the crop (x0, y0, cw, ch) of an RGB image `stride` pixels wide;
 * dst: dw x dh RGB. Returns -1 when out of memory. */
static int resize(const uint8_t *src, int stride, int x0, int y0, int cw, int ch, uint8_t *dst, int dw, int dh) {
  taps tx = {0}, ty = {0};
  float *tmp = malloc(sizeof(float) * (size_t)dw * ch * 3);
  int rc = -1;
  if (!tmp || make_taps(cw, dw, &tx) || make_taps(ch, dh, &ty)) goto done;
  for (int y = 0; y < ch; y++) { /* horizontal: ch rows of dw */
    const uint8_t *row = src + ((size_t)(y0 + y) * stride + x0) * 3;
    float *o = tmp + (size_t)y * dw * 3;
    for (int x = 0; x < dw; x++) {
      const float *w = tx.w + (size_t)x * tx.max_taps;
      const uint8_t *p = row + (size_t)tx.first[x] * 3;
      float r = 0, g = 0, b = 0;
      for (int k = 0; k < tx.count[x]; k++, p += 3) r += w[k] * p[0], g += w[k] * p[1], b += w[k] * p[2];
      o[3 * x] = r, o[3 * x + 1] = g, o[3 * x + 2] = b;
    }
  }
  for (int y = 0; y < dh; y++) { /* vertical */
    const float *w = ty.w + (size_t)y * ty.max_taps;
    uint8_t *o = dst + (size_t)y * dw * 3;
    for (int x = 0; x < dw * 3; x++) {
      const float *p = tmp + (size_t)ty.first[y] * dw * 3 + x;
      float v = 0;
      for (int k = 0; k < ty.count[y]; k++, p += (size_t)dw * 3) v += w[k] * *p;
      o[x] = clamp_u8(v);
    }
  }
  rc = 0;
done:
  free(tmp);
  free_taps(&tx);
  free_taps(&ty);
  return rc;
}

/* ------------------------------------------------------------- images */

typedef struct plan {
  int photo, x, y, cw, ch, w, h;
} plan;

/* RandomResizedCrop's sampling: area in [0.2, 1] of the photo, log-uniform
 * aspect in [3/4, 4/3], ten tries, then the largest centred crop whose
 * aspect is within the range. All from image i's own stream. */
static plan plan_image(uint64_t seed, int64_t i, const photos *ps) {
  stoke_rng r = stoke_rng_seed(stoke_hash3(seed, (uint64_t)i, 0x6a70656762656e63ull));
  plan p = {0};
  p.photo = (int)stoke_rng_below(&r, (uint64_t)ps->n);
  int s = (int)stoke_rng_below(&r, 6);
  p.w = SIZES[s][0];
  p.h = SIZES[s][1];
  const photo *ph = &ps->v[p.photo];
  double area = (double)ph->w * ph->h, lo = log(3.0 / 4), hi = log(4.0 / 3);
  for (int t = 0; t < 10; t++) {
    double a = area * (0.2 + 0.8 * stoke_rng_uniform(&r));
    double ar = exp(lo + (hi - lo) * stoke_rng_uniform(&r));
    int cw = (int)lround(sqrt(a * ar)), ch = (int)lround(sqrt(a / ar));
    if (cw >= 1 && ch >= 1 && cw <= ph->w && ch <= ph->h) {
      p.cw = cw;
      p.ch = ch;
      p.x = (int)stoke_rng_below(&r, (uint64_t)(ph->w - cw + 1));
      p.y = (int)stoke_rng_below(&r, (uint64_t)(ph->h - ch + 1));
      return p;
    }
  }
  double in_ar = (double)ph->w / ph->h;
  p.cw = ph->w;
  p.ch = ph->h;
  if (in_ar < 3.0 / 4) p.ch = (int)lround(p.cw / (3.0 / 4));
  else if (in_ar > 4.0 / 3) p.cw = (int)lround(p.ch * (4.0 / 3));
  p.x = (ph->w - p.cw) / 2;
  p.y = (ph->h - p.ch) / 2;
  return p;
}

typedef struct job_ctx {
  const photos *ps;
  const char *out;
  int64_t count;
  uint64_t seed;
  int quality;
  int64_t next;          /* claimed with atomics */
  int64_t done, bytes;   /* guarded by mu */
  stoke_err *err;        /* the first error; stops everyone */
  pthread_mutex_t mu;
  /* progress */
  int tty;
  double t0, shown;
  int64_t next_line;
} job_ctx;

static stoke_err *write_file(const char *path, const unsigned char *buf, unsigned long n) {
  FILE *f = fopen(path, "wb");
  if (!f) return STOKE_ERR(STOKE_E_IO, "%s: cannot create: %s", path, strerror(errno));
  size_t put = fwrite(buf, 1, n, f);
  int werr = put != n ? errno : 0;
  if (fclose(f) != 0 && !werr) werr = errno ? errno : EIO;
  if (werr) return STOKE_ERR(STOKE_E_IO, "%s: cannot write: %s", path, strerror(werr));
  return NULL;
}

static stoke_err *make_image(job_ctx *c, tjhandle enc, int64_t i, int64_t *bytes) {
  plan p = plan_image(c->seed, i, c->ps);
  const photo *ph = &c->ps->v[p.photo];
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/c%d/img_%05lld.jpg", c->out, (int)(i % CLASSES), (long long)i) >= (int)sizeof path)
    return STOKE_ERR(STOKE_E_INVALID, "%s: path too long", c->out);
  uint8_t *px = malloc((size_t)p.w * p.h * 3);
  if (!px || resize(ph->rgb, ph->w, p.x, p.y, p.cw, p.ch, px, p.w, p.h)) {
    free(px);
    return STOKE_ERR(STOKE_E_OOM, "%s: out of memory resizing a %dx%d crop of %s", path, p.cw, p.ch, ph->path);
  }
  unsigned char *jpeg = NULL;
  unsigned long n = 0;
  stoke_err *e = NULL;
  if (tjCompress2(enc, px, p.w, 0, p.h, TJPF_RGB, &jpeg, &n, TJSAMP_420, c->quality, 0) != 0)
    e = STOKE_ERR(STOKE_E_INTERNAL, "%s: tjCompress2 (a %dx%d crop of %s): %s", path, p.cw, p.ch, ph->path,
                  tjGetErrorStr2(enc));
  else
    e = write_file(path, jpeg, n);
  free(px);
  if (jpeg) tjFree(jpeg);
  *bytes = (int64_t)n;
  return e;
}

static void progress(job_ctx *c, int final) {
  double t = now_s();
  if (c->tty) {
    if (!final && t - c->shown < 0.25) return;
    c->shown = t;
    fprintf(stderr, "\rmake_jpeg_bench: %lld/%lld files (%.0f%%), %.0f files/s   ", (long long)c->done,
            (long long)c->count, 100.0 * (double)c->done / (double)c->count, c->done / (t - c->t0 + 1e-9));
    if (final) fputc('\n', stderr);
    fflush(stderr);
  } else if (!final && c->done >= c->next_line) { /* a log: a line per tenth */
    fprintf(stderr, "make_jpeg_bench: %lld/%lld files, %.0f files/s\n", (long long)c->done, (long long)c->count,
            c->done / (t - c->t0 + 1e-9));
    c->next_line += (c->count + 9) / 10;
  }
}

static void *worker(void *arg) {
  job_ctx *c = arg;
  tjhandle enc = tjInitCompress();
  if (!enc) {
    pthread_mutex_lock(&c->mu);
    if (!c->err) c->err = STOKE_ERR(STOKE_E_INTERNAL, "tjInitCompress: %s", tjGetErrorStr2(NULL));
    pthread_mutex_unlock(&c->mu);
    return NULL;
  }
  for (;;) {
    int64_t i = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
    if (i >= c->count) break;
    int64_t bytes = 0;
    stoke_err *e = make_image(c, enc, i, &bytes);
    pthread_mutex_lock(&c->mu);
    if (e) {
      if (!c->err) c->err = e;
      else stoke_err_free(e);
      c->next = c->count; /* stop the others */
    } else {
      c->done++;
      c->bytes += bytes;
      progress(c, 0);
    }
    int stop = c->err != NULL;
    pthread_mutex_unlock(&c->mu);
    if (stop) break;
  }
  tjDestroy(enc);
  return NULL;
}

/* ------------------------------------------------------ output folder */

static stoke_err *mkdir_p(const char *dir) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return STOKE_ERR(STOKE_E_INVALID, "%s: path too long", dir);
  for (char *s = p + 1;; s++) {
    if (*s == '/' || !*s) {
      char ch = *s;
      *s = 0;
      if (mkdir(p, 0775) != 0 && errno != EEXIST)
        return STOKE_ERR(STOKE_E_IO, "cannot create the folder %s: %s", p, strerror(errno));
      if (!ch) break;
      *s = ch;
    }
  }
  return NULL;
}

/* c<k>/img_*.jpg files of an earlier run, removed under --force so that a
 * smaller --count leaves no stale images behind. */
static stoke_err *remove_old_images(const char *dir) {
  for (int k = 0; k < CLASSES; k++) {
    char cd[PATH_MAX];
    snprintf(cd, sizeof cd, "%s/c%d", dir, k);
    DIR *d = opendir(cd);
    if (!d) continue;
    stoke_err *e = NULL;
    for (struct dirent *de; !e && (de = readdir(d));) {
      if (strncmp(de->d_name, "img_", 4) || !is_jpeg_name(de->d_name)) continue;
      char p[PATH_MAX];
      if (snprintf(p, sizeof p, "%s/%s", cd, de->d_name) >= (int)sizeof p) continue;
      if (unlink(p) != 0 && errno != ENOENT) e = STOKE_ERR(STOKE_E_IO, "cannot remove %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (e) return e;
  }
  return NULL;
}

static stoke_err *prepare_out(const char *dir, int force) {
  struct stat st;
  if (stat(dir, &st) != 0) {
    if (errno != ENOENT) return STOKE_ERR(STOKE_E_IO, "%s: %s", dir, strerror(errno));
    STOKE_PROPAGATE(mkdir_p(dir));
  } else {
    if (!S_ISDIR(st.st_mode)) return STOKE_ERR(STOKE_E_INVALID, "%s exists and is not a folder", dir);
    DIR *d = opendir(dir);
    if (!d) return STOKE_ERR(STOKE_E_IO, "cannot read the folder %s: %s", dir, strerror(errno));
    int entries = 0;
    for (struct dirent *de; (de = readdir(d));) entries += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    if (entries && !force)
      return STOKE_ERR(STOKE_E_INVALID,
                       "%s is not empty; pass --force to write the bench into it (its c*/img_*.jpg files are "
                       "replaced)",
                       dir);
    if (entries) STOKE_PROPAGATE(remove_old_images(dir));
  }
  for (int k = 0; k < CLASSES; k++) {
    char cd[PATH_MAX];
    if (snprintf(cd, sizeof cd, "%s/c%d", dir, k) >= (int)sizeof cd)
      return STOKE_ERR(STOKE_E_INVALID, "%s: path too long", dir);
    if (mkdir(cd, 0775) != 0 && errno != EEXIST)
      return STOKE_ERR(STOKE_E_IO, "cannot create the folder %s: %s", cd, strerror(errno));
  }
  return NULL;
}

/* --------------------------------------------------------------- run */

typedef struct options {
  const char *photos, *out;
  int64_t count;
  uint64_t seed;
  int quality, threads, force;
} options;

static stoke_err *make_bench(const options *o) {
  double t0 = now_s();
  photos ps = {0};
  stoke_err *e = load_photos(o->photos, &ps);
  if (e) {
    free_photos(&ps);
    return stoke_err_wrap(e, __FILE__, __LINE__, "reading the photos in %s", o->photos);
  }
  e = prepare_out(o->out, o->force);
  if (e) {
    free_photos(&ps);
    return e;
  }
  job_ctx c = {.ps = &ps, .out = o->out, .count = o->count, .seed = o->seed, .quality = o->quality};
  pthread_mutex_init(&c.mu, NULL);
  c.tty = isatty(2);
  c.t0 = now_s();
  c.next_line = (o->count + 9) / 10;
  int threads = o->threads < o->count ? o->threads : (int)o->count;
  pthread_t tid[MAX_THREADS];
  int started = 0;
  for (int t = 0; t < threads; t++) started += pthread_create(&tid[started], NULL, worker, &c) == 0;
  if (!started) worker(&c);
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  if (c.tty) progress(&c, 1);
  pthread_mutex_destroy(&c.mu);
  e = c.err;
  if (!e) {
    double t = now_s() - t0, mean = (double)c.bytes / (double)c.done;
    printf("make_jpeg_bench: wrote %lld files to %s (%d classes, cut from %d photos in %s, seed %llu, quality %d, "
           "4:2:0): %lld bytes (%.1f MiB), mean %.1f KB (%.1f KiB); %.2f s (%.0f files/s, %d threads)\n",
           (long long)c.done, o->out, CLASSES, ps.n, o->photos, (unsigned long long)o->seed, o->quality,
           (long long)c.bytes, (double)c.bytes / 1048576, mean / 1000, mean / 1024, t, (double)c.done / t,
           started ? started : 1);
  }
  free_photos(&ps);
  return e;
}

/* -------------------------------------------------------------- main */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "make_jpeg_bench: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nrun `make_jpeg_bench --help` for usage\n");
  va_end(ap);
  return 2;
}

static int parse_int(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  /* `bazel run` starts us in the runfiles tree; paths the user typed are
   * relative to where they ran bazel. */
  const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
  if (cwd && chdir(cwd) != 0) {
    fprintf(stderr, "make_jpeg_bench: error: cannot enter %s: %s\n", cwd, strerror(errno));
    return 1;
  }
  const char *count = "3000", *seed = "1", *quality = "90", *threads = NULL;
  options o = {0};
  struct {
    const char *name;
    const char **value; /* NULL: the flag --force */
  } opts[] = {{"--photos", &o.photos}, {"--out", &o.out},         {"--count", &count}, {"--seed", &seed},
              {"--quality", &quality}, {"--threads", &threads}, {"--force", NULL}};
  const int n_opts = (int)(sizeof opts / sizeof opts[0]);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    int k = 0;
    while (k < n_opts && !(strlen(opts[k].name) == len && !strncmp(opts[k].name, a, len))) k++;
    if (k == n_opts) return usage_error("unknown %s '%s'", strncmp(a, "--", 2) ? "argument" : "option", a);
    if (!opts[k].value) {
      if (eq) return usage_error("%s takes no value", opts[k].name);
      o.force = 1;
    } else if (eq) {
      *opts[k].value = eq + 1;
    } else if (i + 1 < argc) {
      *opts[k].value = argv[++i];
    } else {
      return usage_error("%s needs a value", opts[k].name);
    }
  }
  if (!o.photos || !o.out) return usage_error("%s", "--photos and --out are required");
  long long v;
  if (parse_int(count, 1, 99999, &v)) return usage_error("--count '%s': expected 1 to 99999", count);
  o.count = v;
  if (parse_int(seed, 0, LLONG_MAX, &v)) return usage_error("--seed '%s': expected a non-negative integer", seed);
  o.seed = (uint64_t)v;
  if (parse_int(quality, 1, 100, &v)) return usage_error("--quality '%s': expected 1 to 100", quality);
  o.quality = (int)v;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  o.threads = cpus > 0 ? (int)(cpus > MAX_THREADS ? MAX_THREADS : cpus) : 1;
  if (threads) {
    if (parse_int(threads, 1, MAX_THREADS, &v)) return usage_error("--threads '%s': expected 1 to %d", threads, MAX_THREADS);
    o.threads = (int)v;
  }
  stoke_err *e = make_bench(&o);
  if (e) {
    fprintf(stderr, "make_jpeg_bench: error: %s\n", e->msg);
    stoke_err_free(e);
    return 1;
  }
  return 0;
}
