/* sources/lmdb: the "lmdb" data source. Reads stoke record databases (made
 * by `bazel run //tools:convert`) and Caffe Datum databases, read-only.
 *
 * One environment opened with MDB_RDONLY | MDB_NOTLS, so the loader's
 * worker threads can read concurrently: each read() takes a read-only
 * transaction from a small pool (reset transactions keep their reader slot
 * under MDB_NOTLS, so renewing one costs no lock on the shared reader
 * table), decodes the value straight into the caller's buffer and gives the
 * transaction back. Raw records are copied; JPEG records are decoded with
 * libjpeg-turbo (its libjpeg API: the TurboJPEG wrapper in Debian's static
 * libturbojpeg.a uses a thread-local that cannot be linked into a shared
 * object, see BUILD). Every damaged record is STOKE_E_DATA naming the path,
 * key and index, which the loader logs, counts and replaces. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>
#include <lmdb.h>

#include "record.h"
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

void stoke_lmdb_stderr_init(void); /* stderr_shim.c */

#define HOWTO                                                                       \
  "make one with `bazel run //tools:convert -- idx --images IMAGES.gz --labels " \
  "LABELS.gz --out DIR` or `bazel run //tools:convert -- folder --root DIR --size HxW --out DIR`"

static const stoke_cfg_key_v1 keys[] = {
    {"path", STOKE_CFG_STR, "", 0, 0, NULL,
     "LMDB data set: a directory holding data.mdb, or the data file itself; stoke records (tools/convert) "
     "or a Caffe Datum database"},
    {"max_readers", STOKE_CFG_INT, "256", 1, 65536, NULL,
     "LMDB reader slots; at least the number of threads reading at once (loader workers)"},
};

typedef struct lmdb_src {
  char *path;
  MDB_env *env;
  MDB_dbi dbi;
  int caffe;        /* 0: stoke records, 1: Caffe Datum */
  int64_t count;
  uint32_t height, width, channels;
  uint8_t encoding; /* stoke records: every record's */
  int64_t classes;
  /* Caffe: index -> key, keys concatenated in `keys`, key i at
   * keys[key_off[i] .. key_off[i + 1]) */
  char *keys;
  size_t *key_off;
  /* reset read-only transactions ready to renew */
  pthread_mutex_t mu;
  MDB_txn **pool;
  int pool_n, pool_cap;
} lmdb_src;

/* ------------------------------------------------------------ helpers */

/* A key as printable text (LMDB keys are bytes; Caffe's are usually text). */
static void show_key(const void *key, size_t n, char *out, size_t cap) {
  const unsigned char *p = key;
  size_t k = 0, i = 0;
  for (; i < n && k + 8 < cap; i++) {
    if (p[i] >= 0x20 && p[i] < 0x7f) out[k++] = (char)p[i];
    else k += (size_t)snprintf(out + k, cap - k, "\\x%02x", p[i]);
  }
  if (i < n) {
    memcpy(out + k, "...", 3);
    k += 3;
  }
  out[k] = 0;
}

/* The key of sample `index` as an MDB_val; `buf` holds a stoke key. */
static MDB_val key_of(const lmdb_src *s, int64_t index, char buf[STOKE_KEY_DIGITS + 1]) {
  MDB_val k;
  if (s->caffe) {
    k.mv_data = s->keys + s->key_off[index];
    k.mv_size = s->key_off[index + 1] - s->key_off[index];
  } else {
    k.mv_size = (size_t)stoke_rec_key(index, buf);
    k.mv_data = buf;
  }
  return k;
}

/* -------------------------------------------------------------- JPEG */

typedef struct jpeg_err {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
  int eof; /* "Premature end of JPEG file": the data was cut short */
} jpeg_err;

static void jpeg_on_error(j_common_ptr c) {
  jpeg_err *e = (jpeg_err *)c->err;
  c->err->format_message(c, e->msg);
  longjmp(e->jb, 1);
}

/* libjpeg reports recoverable problems as warnings (level -1) and goes on.
 * Most (extraneous bytes before a marker) leave a fine image; a premature
 * end of data leaves gray rows, so that one makes the record bad. */
static void jpeg_on_emit(j_common_ptr c, int level) {
  jpeg_err *e = (jpeg_err *)c->err;
  if (level >= 0) return;
  c->err->num_warnings++;
  if (c->err->msg_code == JWRN_JPEG_EOF && !e->eof) {
    e->eof = 1;
    c->err->format_message(c, e->msg);
  }
}

static void jpeg_on_output(j_common_ptr c) { (void)c; } /* plugins never print */

static void jpeg_setup(struct jpeg_decompress_struct *d, jpeg_err *e) {
  memset(d, 0, sizeof *d);
  memset(e, 0, sizeof *e);
  d->err = jpeg_std_error(&e->pub);
  e->pub.error_exit = jpeg_on_error;
  e->pub.emit_message = jpeg_on_emit;
  e->pub.output_message = jpeg_on_output;
}

/* Size and channel count of a JPEG (3 unless it is grayscale). */
static int jpeg_probe(const uint8_t *buf, size_t n, uint32_t *h, uint32_t *w, uint32_t *c, char *why, size_t cap) {
  struct jpeg_decompress_struct d;
  jpeg_err e;
  jpeg_setup(&d, &e);
  if (setjmp(e.jb)) {
    jpeg_destroy_decompress(&d);
    snprintf(why, cap, "JPEG header: %s", e.msg);
    return -1;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, buf, (unsigned long)n);
  jpeg_read_header(&d, TRUE);
  *h = d.image_height;
  *w = d.image_width;
  *c = d.num_components == 1 ? 1 : 3;
  jpeg_destroy_decompress(&d);
  return 0;
}

/* Decodes into `dst`, h x w x c (c = 1: grayscale, 3: RGB), refusing a
 * JPEG of any other size. */
static int jpeg_decode(const uint8_t *buf, size_t n, uint32_t h, uint32_t w, uint32_t c, uint8_t *dst, char *why,
                       size_t cap) {
  struct jpeg_decompress_struct d;
  jpeg_err e;
  jpeg_setup(&d, &e);
  if (setjmp(e.jb)) {
    jpeg_destroy_decompress(&d);
    snprintf(why, cap, "JPEG: %s", e.msg);
    return -1;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, buf, (unsigned long)n);
  jpeg_read_header(&d, TRUE);
  if (d.image_height != h || d.image_width != w) {
    snprintf(why, cap, "JPEG is %ux%u (HxW), the data set declares %ux%u", d.image_height, d.image_width, h, w);
    jpeg_destroy_decompress(&d);
    return -1;
  }
  d.out_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&d);
  if ((uint32_t)d.output_components != c) {
    snprintf(why, cap, "JPEG decodes to %d channels, the data set declares %u", d.output_components, c);
    jpeg_destroy_decompress(&d);
    return -1;
  }
  size_t row = (size_t)w * c;
  while (d.output_scanline < d.output_height) {
    JSAMPROW r = dst + (size_t)d.output_scanline * row;
    jpeg_read_scanlines(&d, &r, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  if (e.eof) {
    snprintf(why, cap, "JPEG data is truncated (%s)", e.msg);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------- transaction pool */

static stoke_err *txn_get(lmdb_src *s, MDB_txn **out) {
  MDB_txn *t = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->pool_n) t = s->pool[--s->pool_n];
  pthread_mutex_unlock(&s->mu);
  int rc;
  if (t) {
    rc = mdb_txn_renew(t);
    if (rc) mdb_txn_abort(t);
  } else {
    rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &t);
  }
  if (rc == MDB_READERS_FULL)
    return STOKE_PERR(STOKE_E_IO,
                      "lmdb %s: every LMDB reader slot is taken (more threads read at once than there are "
                      "slots): raise [data] max_readers",
                      s->path);
  if (rc) return STOKE_PERR(STOKE_E_IO, "lmdb %s: cannot start a read transaction: %s", s->path, mdb_strerror(rc));
  *out = t;
  return NULL;
}

static void txn_put(lmdb_src *s, MDB_txn *t) {
  mdb_txn_reset(t);
  pthread_mutex_lock(&s->mu);
  if (s->pool_n < s->pool_cap) {
    s->pool[s->pool_n++] = t;
    t = NULL;
  }
  pthread_mutex_unlock(&s->mu);
  if (t) mdb_txn_abort(t);
}

/* ------------------------------------------------------------- open */

static void lm_close(void *self) {
  lmdb_src *s = self;
  if (!s) return;
  for (int i = 0; i < s->pool_n; i++) mdb_txn_abort(s->pool[i]);
  if (s->env) mdb_env_close(s->env);
  pthread_mutex_destroy(&s->mu);
  free(s->pool);
  free(s->keys);
  free(s->key_off);
  free(s->path);
  free(s);
}

/* Checks that `file` starts with an LMDB meta page before LMDB sees it:
 * opening anything else would leave a lock file next to it. */
static stoke_err *check_lmdb_file(const char *path, const char *file) {
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return STOKE_PERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_IO, "lmdb %s: cannot open %s: %s", path, file,
                      strerror(errno));
  unsigned char head[24];
  ssize_t n = pread(fd, head, sizeof head, 0);
  close(fd);
  /* page header (16 bytes), then the meta: magic 0xBEEFC0DE, version 1 */
  uint32_t magic = n == (ssize_t)sizeof head ? (uint32_t)head[16] | (uint32_t)head[17] << 8 |
                                                   (uint32_t)head[18] << 16 | (uint32_t)head[19] << 24
                                             : 0;
  if (magic != 0xBEEFC0DEu)
    return STOKE_PERR(STOKE_E_IO, "lmdb %s: %s is not an LMDB database (%s); " HOWTO, path, file,
                      n < 0 ? strerror(errno) : n < (ssize_t)sizeof head ? "too short" : "no LMDB magic");
  return NULL;
}

static stoke_err *open_env(lmdb_src *s, int64_t max_readers) {
  struct stat st;
  if (stat(s->path, &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return STOKE_PERR(STOKE_E_NOT_FOUND, "lmdb %s: no such file or directory; " HOWTO, s->path);
    return STOKE_PERR(STOKE_E_IO, "lmdb %s: %s", s->path, strerror(errno));
  }
  unsigned flags = MDB_RDONLY | MDB_NOTLS;
  /* random access over a data set that may be larger than memory:
   * read-ahead would mostly read pages nobody asked for */
  flags |= MDB_NORDAHEAD;
  char file[4096];
  if (S_ISDIR(st.st_mode)) {
    snprintf(file, sizeof file, "%s/data.mdb", s->path);
    if (access(file, F_OK) != 0)
      return STOKE_PERR(STOKE_E_NOT_FOUND, "lmdb %s: a directory without data.mdb, not an LMDB data set; " HOWTO,
                        s->path);
  } else {
    snprintf(file, sizeof file, "%s", s->path);
    flags |= MDB_NOSUBDIR;
  }
  STOKE_PROPAGATE_P(check_lmdb_file(s->path, file));
  int rc = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    rc = mdb_env_create(&s->env);
    if (!rc) rc = mdb_env_set_maxreaders(s->env, (unsigned)max_readers);
    if (!rc) rc = mdb_env_open(s->env, s->path, flags, 0664);
    if (!rc) break;
    mdb_env_close(s->env);
    s->env = NULL;
    /* a read-only folder where no lock file exists or can be made: read
     * without the lock table (safe while nobody writes the data set) */
    if (attempt == 0 && (rc == EACCES || rc == EROFS)) {
      stoke_host->log(STOKE_LOG_WARN, "lmdb",
                      "%s: cannot create or open its lock file (%s); reading without locks, which is "
                      "safe only while nothing writes to it",
                      s->path, mdb_strerror(rc));
      flags |= MDB_NOLOCK;
      continue;
    }
    break;
  }
  if (rc)
    return STOKE_PERR(STOKE_E_IO, "lmdb %s: mdb_env_open failed: %s; " HOWTO, s->path, mdb_strerror(rc));
  if (!(flags & MDB_NOLOCK)) {
    int dead = 0;
    rc = mdb_reader_check(s->env, &dead);
    if (!rc && dead > 0)
      stoke_host->log(STOKE_LOG_INFO, "lmdb", "%s: cleared %d reader slots left by processes that died", s->path,
                      dead);
  }
  return NULL;
}

/* A stoke database: the metadata says everything. */
static stoke_err *open_stoke(lmdb_src *s, MDB_txn *txn, const MDB_val *mv) {
  char why[STOKE_WHY_BYTES];
  stoke_meta m;
  if (stoke_meta_decode(mv->mv_data, mv->mv_size, &m, why, sizeof why))
    return STOKE_PERR(STOKE_E_DATA, "lmdb %s: metadata entry " STOKE_META_KEY ": %s", s->path, why);
  MDB_stat st;
  int rc = mdb_stat(txn, s->dbi, &st);
  if (rc) return STOKE_PERR(STOKE_E_IO, "lmdb %s: mdb_stat failed: %s", s->path, mdb_strerror(rc));
  if (m.count < 1)
    return STOKE_PERR(STOKE_E_DATA, "lmdb %s: the metadata declares 0 records: an empty data set", s->path);
  if ((uint64_t)st.ms_entries != m.count + 1)
    stoke_host->log(STOKE_LOG_WARN, "lmdb",
                    "%s: the metadata declares %llu records but the database holds %llu entries besides "
                    STOKE_META_KEY "; missing records will be skipped when read",
                    s->path, (unsigned long long)m.count, (unsigned long long)(st.ms_entries - 1));
  s->count = (int64_t)m.count;
  s->classes = m.classes;
  s->height = m.height;
  s->width = m.width;
  s->channels = m.channels;
  s->encoding = m.encoding;
  return NULL;
}

/* A Caffe Datum database: keys are arbitrary, so keep an index -> key
 * table; classes and shape come from one scan (labels, first record). */
static stoke_err *open_caffe(lmdb_src *s, MDB_txn *txn) {
  MDB_stat st;
  int rc = mdb_stat(txn, s->dbi, &st);
  if (rc) return STOKE_PERR(STOKE_E_IO, "lmdb %s: mdb_stat failed: %s", s->path, mdb_strerror(rc));
  if (st.ms_entries == 0)
    return STOKE_PERR(STOKE_E_DATA, "lmdb %s: the database is empty; " HOWTO, s->path);
  size_t n = st.ms_entries, keys_cap = n * 16 + 64, keys_len = 0;
  s->key_off = malloc(sizeof(size_t) * (n + 1));
  s->keys = malloc(keys_cap);
  if (!s->key_off || !s->keys)
    return STOKE_PERR(STOKE_E_OOM, "lmdb %s: out of memory for the key table of %zu records", s->path, n);
  MDB_cursor *cur;
  rc = mdb_cursor_open(txn, s->dbi, &cur);
  if (rc) return STOKE_PERR(STOKE_E_IO, "lmdb %s: mdb_cursor_open failed: %s", s->path, mdb_strerror(rc));
  stoke_err *e = NULL;
  size_t i = 0, bad = 0;
  int64_t max_label = -1;
  int have_shape = 0;
  char why[STOKE_WHY_BYTES], first_bad[1024] = "";
  MDB_val k, v;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && i < n; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (i == 0 && v.mv_size >= 4 && !memcmp(v.mv_data, STOKE_REC_MAGIC, 4)) {
      e = STOKE_PERR(STOKE_E_DATA,
                     "lmdb %s: holds stoke records but no " STOKE_META_KEY
                     " metadata entry: the conversion did not finish; run convert again with --force",
                     s->path);
      break;
    }
    if (keys_len + k.mv_size > keys_cap) {
      size_t nc = keys_cap * 2 + k.mv_size;
      char *nk = realloc(s->keys, nc);
      if (!nk) {
        e = STOKE_PERR(STOKE_E_OOM, "lmdb %s: out of memory for the key table", s->path);
        break;
      }
      s->keys = nk;
      keys_cap = nc;
    }
    memcpy(s->keys + keys_len, k.mv_data, k.mv_size);
    s->key_off[i] = keys_len;
    keys_len += k.mv_size;
    stoke_datum d;
    int ok = stoke_datum_decode(v.mv_data, v.mv_size, &d, why, sizeof why) == 0;
    if (ok && !have_shape) {
      if (d.encoded) {
        ok = jpeg_probe(d.data, d.data_bytes, &s->height, &s->width, &s->channels, why, sizeof why) == 0;
      } else {
        s->channels = (uint32_t)d.channels;
        s->height = (uint32_t)d.height;
        s->width = (uint32_t)d.width;
      }
      have_shape = ok;
    }
    if (ok) {
      if (d.label > max_label) max_label = d.label;
    } else if (bad++ == 0) {
      char ks[600];
      show_key(k.mv_data, k.mv_size, ks, sizeof ks);
      snprintf(first_bad, sizeof first_bad, "record %s (index %zu): %s", ks, i, why);
    }
    i++;
  }
  mdb_cursor_close(cur);
  if (e) return e;
  if (rc != 0 && rc != MDB_NOTFOUND)
    return STOKE_PERR(STOKE_E_IO, "lmdb %s: reading the keys failed after %zu records: %s", s->path, i,
                      mdb_strerror(rc));
  s->key_off[i] = keys_len;
  s->count = (int64_t)i;
  if (!have_shape)
    return STOKE_PERR(STOKE_E_DATA,
                      "lmdb %s: neither a stoke data set (no " STOKE_META_KEY
                      " entry) nor a Caffe Datum database: %s; " HOWTO,
                      s->path, first_bad);
  if (max_label < 0)
    return STOKE_PERR(STOKE_E_DATA, "lmdb %s: no Caffe record has a label >= 0", s->path);
  if (bad)
    stoke_host->log(STOKE_LOG_WARN, "lmdb", "%s: %zu of %zu Caffe records cannot be decoded and will be skipped; first: %s",
                    s->path, bad, i, first_bad);
  s->classes = max_label + 1;
  s->caffe = 1;
  return NULL;
}

static stoke_err *lm_open(const stoke_cfg *c, const char *sec, void **self) {
  const char *path = NULL;
  int64_t max_readers = 0;
  STOKE_PROPAGATE_P(stoke_host->cfg_str(c, sec, "path", &path));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "max_readers", &max_readers));
  if (!path || !path[0])
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] path is empty: set it to an LMDB data set (%s)",
                      stoke_host->cfg_where(c, sec, "path"), sec, HOWTO);
  lmdb_src *s = calloc(1, sizeof *s);
  if (!s) return STOKE_PERR(STOKE_E_OOM, "lmdb: out of memory");
  pthread_mutex_init(&s->mu, NULL);
  s->path = strdup(path);
  s->pool_cap = (int)max_readers;
  s->pool = calloc((size_t)s->pool_cap, sizeof *s->pool);
  stoke_err *e = NULL;
  if (!s->path || !s->pool) e = STOKE_PERR(STOKE_E_OOM, "lmdb: out of memory");
  if (!e) e = open_env(s, max_readers);
  MDB_txn *txn = NULL;
  if (!e) {
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (!rc) rc = mdb_dbi_open(txn, NULL, 0, &s->dbi);
    if (rc) e = STOKE_PERR(STOKE_E_IO, "lmdb %s: cannot open the database: %s", s->path, mdb_strerror(rc));
  }
  if (!e) {
    MDB_val k = {strlen(STOKE_META_KEY), (void *)STOKE_META_KEY}, v;
    int rc = mdb_get(txn, s->dbi, &k, &v);
    if (rc == 0) e = open_stoke(s, txn, &v);
    else if (rc == MDB_NOTFOUND) e = open_caffe(s, txn);
    else e = STOKE_PERR(STOKE_E_IO, "lmdb %s: reading " STOKE_META_KEY " failed: %s", s->path, mdb_strerror(rc));
  }
  if (txn) {
    /* commit, not abort: the database handle outlives this transaction */
    int rc = mdb_txn_commit(txn);
    if (rc && !e) e = STOKE_PERR(STOKE_E_IO, "lmdb %s: %s", s->path, mdb_strerror(rc));
  }
  if (e) {
    lm_close(s);
    return e;
  }
  stoke_host->log(STOKE_LOG_INFO, "lmdb", "%s: %s, %lld records, %lld classes, %ux%ux%u (HxWxC)", path,
                  s->caffe ? "Caffe Datum" : s->encoding == STOKE_ENC_JPEG ? "stoke JPEG records" : "stoke raw records",
                  (long long)s->count, (long long)s->classes, s->height, s->width, s->channels);
  *self = s;
  return NULL;
}

static int64_t lm_length(void *self) { return ((lmdb_src *)self)->count; }

static stoke_err *lm_info(void *self, stoke_sample_info_v1 *out) {
  lmdb_src *s = self;
  memset(out, 0, sizeof *out);
  out->shape.ndim = 3;
  out->shape.d[0] = s->channels;
  out->shape.d[1] = s->height;
  out->shape.d[2] = s->width;
  out->dtype = STOKE_U8;
  out->layout = STOKE_NHWC;
  out->classes = s->classes;
  return NULL;
}

/* ------------------------------------------------------------- read */

/* Decodes one value into dst; -1 with `why` when the record is bad. */
static int decode(const lmdb_src *s, const MDB_val *v, uint8_t *dst, int32_t *label, char *why, size_t cap) {
  if (s->caffe) {
    stoke_datum d;
    if (stoke_datum_decode(v->mv_data, v->mv_size, &d, why, cap)) return -1;
    if (d.encoded) {
      if (jpeg_decode(d.data, d.data_bytes, s->height, s->width, s->channels, dst, why, cap)) return -1;
    } else {
      if ((uint32_t)d.channels != s->channels || (uint32_t)d.height != s->height || (uint32_t)d.width != s->width) {
        snprintf(why, cap, "Datum is %dx%dx%d (CxHxW), the data set is %ux%ux%u (its first record's)", d.channels,
                 d.height, d.width, s->channels, s->height, s->width);
        return -1;
      }
      stoke_datum_chw_to_hwc(&d, dst);
    }
    *label = d.label;
    return 0;
  }
  stoke_rec r;
  if (stoke_rec_decode(v->mv_data, v->mv_size, &r, why, cap)) return -1;
  if (r.height != s->height || r.width != s->width || r.channels != s->channels || r.encoding != s->encoding) {
    snprintf(why, cap, "record is %ux%ux%u (HxWxC) %s, the metadata declares %ux%ux%u %s", r.height, r.width,
             r.channels, stoke_rec_encoding_name(r.encoding), s->height, s->width, s->channels,
             stoke_rec_encoding_name(s->encoding));
    return -1;
  }
  if (r.label < 0 || r.label >= s->classes) {
    snprintf(why, cap, "label %d outside [0, %lld)", r.label, (long long)s->classes);
    return -1;
  }
  if (r.encoding == STOKE_ENC_RAW) memcpy(dst, r.payload, r.payload_bytes);
  else if (jpeg_decode(r.payload, r.payload_bytes, r.height, r.width, r.channels, dst, why, cap)) return -1;
  *label = r.label;
  return 0;
}

static stoke_err *lm_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  (void)seed; /* no augmentation: the stored image as it is */
  lmdb_src *s = self;
  if (index < 0 || index >= s->count)
    return STOKE_PERR(STOKE_E_INVALID, "lmdb %s: index %lld outside [0, %lld)", s->path, (long long)index,
                      (long long)s->count);
  MDB_txn *txn = NULL;
  STOKE_PROPAGATE_P(txn_get(s, &txn));
  char kb[STOKE_KEY_DIGITS + 1], why[STOKE_WHY_BYTES];
  MDB_val k = key_of(s, index, kb), v;
  stoke_err *e = NULL;
  int rc = mdb_get(txn, s->dbi, &k, &v);
  if (rc == 0 && decode(s, &v, dst, label, why, sizeof why) == 0) {
    txn_put(s, txn);
    return NULL;
  }
  char ks[600];
  show_key(k.mv_data, k.mv_size, ks, sizeof ks);
  if (rc == MDB_NOTFOUND)
    e = STOKE_PERR(STOKE_E_DATA, "lmdb %s: record %s (index %lld): missing from the database", s->path, ks,
                   (long long)index);
  else if (rc)
    e = STOKE_PERR(STOKE_E_IO, "lmdb %s: record %s (index %lld): mdb_get failed: %s", s->path, ks, (long long)index,
                   mdb_strerror(rc));
  else
    e = STOKE_PERR(STOKE_E_DATA, "lmdb %s: record %s (index %lld): %s", s->path, ks, (long long)index, why);
  txn_put(s, txn);
  return e;
}

static const stoke_source_v1 source = {
    STOKE_ABI(stoke_source_v1),
    "lmdb",
    "LMDB data set of stoke records (tools/convert: raw or JPEG) or Caffe Datum records; u8 images, HWC",
    keys,
    sizeof keys / sizeof *keys,
    lm_open,
    lm_close,
    lm_length,
    lm_info,
    lm_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  stoke_lmdb_stderr_init();
  return r->add_source(r->self, &source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "lmdb", "LMDB data source (stoke records, Caffe Datum)", reg};
