/* sources/lmdb: the "lmdb" data source. Reads stoke record databases (made
 * by `bazel run //tools:convert`) and Caffe Datum databases, read-only.
 *
 * One environment opened with MDB_RDONLY | MDB_NOTLS, so the loader's
 * worker threads can read concurrently: each read() takes a read-only
 * transaction from a small pool (reset transactions keep their reader slot
 * under MDB_NOTLS, so renewing one costs no lock on the shared reader
 * table), decodes the value straight into the caller's buffer and gives the
 * transaction back. Raw records are copied; JPEG records are decoded with
 * libjpeg-turbo through sources/jpeg/decode.h (the rule for its warnings
 * that every stoke reader shares; the TurboJPEG wrapper in Debian's static
 * libturbojpeg.a uses a thread-local that cannot be linked into a shared
 * object, see BUILD). Every damaged record is STOKE_E_DATA naming the path,
 * key and index, which the loader logs, counts and replaces.
 *
 * A damaged database must not end the process: at open its meta pages
 * must give a sane page size and the file must hold every page they count
 * (a copy cut short is refused with both sizes), every value LMDB returns
 * must lie inside the file, and LMDB's
 * reading runs under guard.h, which turns a fault (SIGBUS, SIGSEGV) or an
 * LMDB assertion from a damaged page into an error naming the database.
 * One environment per file and process (an LMDB rule): [data] and
 * [eval_data] naming the same data set share it. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <lmdb.h>

#include "guard.h"
#include "record.h"
#include "sources/jpeg/decode.h"
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
    {"channels", STOKE_CFG_INT, "0", 0, 3, NULL,
     "channels of the samples: 1 (gray) or 3 (RGB), JPEG records converted to it; 0: stoke records' own, "
     "3 for encoded Caffe records (as Caffe's is_color = true), a raw Caffe Datum's own"},
};

/* One open environment, shared by every source on the same file. */
typedef struct shared_env {
  dev_t dev;
  ino_t ino;
  MDB_env *env;
  unsigned flags;
  const char *map; /* the file's mapping and its size when opened */
  size_t file_size;
  size_t map_bytes; /* the bytes of the file the mapping covers: LMDB maps the size its meta page asks for,
                     * which a damaged file can set below the file's size */
  int users;
  struct shared_env *next;
} shared_env;

static pthread_mutex_t envs_mu = PTHREAD_MUTEX_INITIALIZER;
static shared_env *envs;

typedef struct lmdb_src {
  char *path;
  shared_env *shared;
  MDB_env *env;
  MDB_dbi dbi;
  int caffe;        /* 0: stoke records, 1: Caffe Datum */
  int64_t count;
  uint32_t height, width, channels; /* the samples' (channels: what JPEG records decode to) */
  uint32_t rec_channels;            /* raw records' and Datums' own */
  int64_t want_channels;            /* [data] channels (0: the data set's) */
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

/* Size of a JPEG from its header. */
static int jpeg_probe(const uint8_t *buf, size_t n, uint32_t *h, uint32_t *w, char *why, size_t cap) {
  int ih, iw;
  char msg[200];
  if (stoke_jpeg_header(buf, n, &ih, &iw, msg, sizeof msg)) {
    snprintf(why, cap, "JPEG header: %s", msg);
    return -1;
  }
  *h = (uint32_t)ih;
  *w = (uint32_t)iw;
  return 0;
}

/* Decodes into `dst`, h x w x c (c = 1: grayscale, 3: RGB, whatever the
 * JPEG's own colour space), refusing a JPEG of any other size. */
static int jpeg_decode(const uint8_t *buf, size_t n, uint32_t h, uint32_t w, uint32_t c, uint8_t *dst, char *why,
                       size_t cap) {
  int oh, ow;
  char msg[256];
  if (!stoke_jpeg_decode(buf, n, (int)c, 8, (int)h, (int)w, &dst, &oh, &ow, msg, sizeof msg)) return 0;
  snprintf(why, cap, "JPEG: %.200s", msg);
  return -1;
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

static void env_put(shared_env *se);

static void lm_close(void *self) {
  lmdb_src *s = self;
  if (!s) return;
  for (int i = 0; i < s->pool_n; i++) mdb_txn_abort(s->pool[i]);
  if (s->shared) env_put(s->shared);
  stoke_lmdb_guard_release();
  pthread_mutex_destroy(&s->mu);
  free(s->pool);
  free(s->keys);
  free(s->key_off);
  free(s->path);
  free(s);
}

/* LMDB's meta pages (mdb.c, data version 1, 64-bit): a 16-byte page
 * header, then MDB_meta: magic, version, fixed address, map size, the
 * free and main databases' MDB_db (48 bytes each; the first one's md_pad
 * is the page size), the last page number, the transaction id. */
enum {
  META_MAGIC = 16,
  META_PSIZE = 16 + 24,
  META_LAST_PG = 16 + 120,
  META_TXNID = 16 + 128,
  META_BYTES = 16 + 136,
};

static uint64_t meta_u64(const unsigned char *m, int at) {
  uint64_t v;
  memcpy(&v, m + at, sizeof v); /* LMDB files are in the writer's byte order; stoke's hosts are little-endian */
  return v;
}

static uint32_t meta_u32(const unsigned char *m, int at) {
  uint32_t v;
  memcpy(&v, m + at, sizeof v);
  return v;
}

/* Checks `file`'s two meta pages before LMDB sees it, and gives its size.
 * Not an LMDB file at all: opening it would leave a lock file next to it.
 * LMDB itself trusts what it reads there: a page size of 0 divides by zero
 * in mdb_env_open, a wrong one on the newer page puts its second meta page
 * outside the mapping (a fault in mdb_env_open, outside any guard), and a
 * file shorter than its last page faults (SIGBUS) on the first read of a
 * page past the end. Pages LMDB reads later are numbered below the last
 * page (mdb_page_get), so inside the file; what lies in them is guard.c's. */
static stoke_err *check_lmdb_file(const char *path, const char *file, size_t *file_size) {
  int fd = open(file, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* never waits on a FIFO swapped in since the stat */
  if (fd < 0)
    return STOKE_PERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_IO, "lmdb %s: cannot open %s: %s", path, file,
                      strerror(errno));
  unsigned char m[2][META_BYTES];
  struct stat fs;
  ssize_t n = fstat(fd, &fs) ? -1 : pread(fd, m[0], META_BYTES, 0);
  int err = errno;
  uint32_t magic = n >= META_MAGIC + 4 ? meta_u32(m[0], META_MAGIC) : 0;
  if (magic != 0xBEEFC0DEu) {
    close(fd);
    return STOKE_PERR(STOKE_E_IO, "lmdb %s: %s is not an LMDB database (%s); " HOWTO, path, file,
                      n < 0 ? strerror(err) : n < META_MAGIC + 4 ? "too short" : "no LMDB magic");
  }
  uint32_t psize = meta_u32(m[0], META_PSIZE);
  int psize_ok = psize >= 512 && psize <= 65536 && !(psize & (psize - 1));
  ssize_t n1 = psize_ok ? pread(fd, m[1], META_BYTES, psize) : 0;
  close(fd);
  if (!psize_ok)
    return STOKE_PERR(STOKE_E_IO,
                      "lmdb %s: %s is damaged: its first meta page gives a page size of %u bytes (LMDB writes a "
                      "power of two from 512 to 65536); copy or convert the data set again",
                      path, file, psize);
  if (n < META_BYTES || n1 < META_BYTES)
    return STOKE_PERR(STOKE_E_IO,
                      "lmdb %s: %s is %lld bytes, too short for its two meta pages of %u bytes: the file was cut "
                      "short (an interrupted copy?) or is damaged; copy or convert the data set again",
                      path, file, (long long)fs.st_size, psize);
  if (meta_u32(m[1], META_MAGIC) != 0xBEEFC0DEu || meta_u32(m[1], META_PSIZE) != psize)
    return STOKE_PERR(STOKE_E_IO,
                      "lmdb %s: %s is damaged: its second meta page %s; copy or convert the data set again", path,
                      file, meta_u32(m[1], META_MAGIC) != 0xBEEFC0DEu ? "has no LMDB magic" : "gives another page size");
  /* the newer meta page is the one LMDB reads (mdb_env_pick_meta) */
  const unsigned char *cur = m[meta_u64(m[0], META_TXNID) < meta_u64(m[1], META_TXNID)];
  uint64_t last = meta_u64(cur, META_LAST_PG), pages = (uint64_t)fs.st_size / psize;
  if (last >= pages)
    return STOKE_PERR(STOKE_E_IO,
                      "lmdb %s: %s is %lld bytes, but its meta page counts pages up to number %llu of %u bytes "
                      "(%llu in the file): the file was cut short (an interrupted copy?) or is damaged; copy or "
                      "convert the data set again",
                      path, file, (long long)fs.st_size, (unsigned long long)last, psize, (unsigned long long)pages);
  *file_size = (size_t)fs.st_size;
  return NULL;
}

/* Where the file (dev, ino) at `file` is mapped in this process, and how
 * many bytes (*bytes): LMDB does not say (mdb_env_info's me_mapaddr is the
 * fixed address a writer asked for), /proc/self/maps does. The device
 * there is not always stat()'s (btrfs subvolumes, overlayfs before Linux
 * 6.8), so a line with the inode and the file's resolved path counts too.
 * NULL when not found: values are then not checked against the file (the
 * caller warns), and the guard alone catches what they fault on. */
static const char *find_map(const char *file, dev_t dev, ino_t ino, size_t *bytes) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return NULL;
  char line[4352], real[4096];
  int have_real = realpath(file, real) != NULL;
  const char *found = NULL;
  while (!found && fgets(line, sizeof line, f)) {
    unsigned long long start, end, off, node;
    unsigned maj, min;
    char perms[8];
    int at = 0;
    if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &off, &maj, &min, &node, &at) < 7 ||
        node != (unsigned long long)ino || off != 0)
      continue;
    line[strcspn(line, "\n")] = 0;
    int same_dev = maj == major(dev) && min == minor(dev);
    if (same_dev || (have_real && at > 0 && !strcmp(line + at, real))) {
      found = (const char *)(uintptr_t)start;
      *bytes = (size_t)(end - start);
    }
  }
  fclose(f);
  return found;
}

/* A new environment on `file`, read-only; NULL and an error if it cannot be. */
static stoke_err *env_open(const char *path, unsigned flags, int64_t max_readers, shared_env *se) {
  int rc = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    rc = mdb_env_create(&se->env);
    if (!rc) rc = mdb_env_set_maxreaders(se->env, (unsigned)max_readers);
    if (!rc) rc = mdb_env_set_assert(se->env, stoke_lmdb_on_assert);
    if (!rc) rc = mdb_env_open(se->env, path, flags, 0664);
    if (!rc) break;
    mdb_env_close(se->env);
    se->env = NULL;
    /* a read-only folder where no lock file exists or can be made: read
     * without the lock table (safe while nobody writes the data set) */
    if (attempt == 0 && (rc == EACCES || rc == EROFS)) {
      stoke_host->log(STOKE_LOG_WARN, "lmdb",
                      "%s: cannot create or open its lock file (%s); reading without locks, which is "
                      "safe only while nothing writes to it",
                      path, mdb_strerror(rc));
      flags |= MDB_NOLOCK;
      continue;
    }
    break;
  }
  if (rc) return STOKE_PERR(STOKE_E_IO, "lmdb %s: mdb_env_open failed: %s; " HOWTO, path, mdb_strerror(rc));
  se->flags = flags;
  if (!(flags & MDB_NOLOCK)) {
    int dead = 0;
    rc = mdb_reader_check(se->env, &dead);
    if (!rc && dead > 0)
      stoke_host->log(STOKE_LOG_INFO, "lmdb", "%s: cleared %d reader slots left by processes that died", path, dead);
  }
  return NULL;
}

/* The environment of the data set at s->path: the one this process has
 * open already (the same file as [data] and [eval_data]), or a new one. */
static stoke_err *env_get(lmdb_src *s, int64_t max_readers) {
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
  /* a FIFO would block the open below forever, a device would be mapped */
  struct stat fs;
  if (stat(file, &fs) != 0) return STOKE_PERR(STOKE_E_IO, "lmdb %s: cannot stat %s: %s", s->path, file, strerror(errno));
  if (!S_ISREG(fs.st_mode)) return STOKE_PERR(STOKE_E_IO, "lmdb %s: %s is not a file; " HOWTO, s->path, file);
  size_t file_size = 0;
  STOKE_PROPAGATE_P(check_lmdb_file(s->path, file, &file_size));
  stoke_err *e = NULL;
  pthread_mutex_lock(&envs_mu);
  shared_env *se = envs;
  while (se && !(se->dev == fs.st_dev && se->ino == fs.st_ino)) se = se->next;
  if (se) {
    se->users++;
  } else if (!(se = calloc(1, sizeof *se))) {
    e = STOKE_PERR(STOKE_E_OOM, "lmdb: out of memory");
  } else if ((e = env_open(s->path, flags, max_readers, se))) {
    free(se);
    se = NULL;
  } else {
    se->dev = fs.st_dev;
    se->ino = fs.st_ino;
    se->file_size = file_size;
    size_t mapped = 0;
    se->map = find_map(file, fs.st_dev, fs.st_ino, &mapped);
    if (!se->map)
      stoke_host->log(STOKE_LOG_WARN, "lmdb", "%s: its mapping is not in /proc/self/maps, so keys and values are not "
                      "checked against the file's bounds (a damaged file is still caught by the fault guard)", file);
    se->map_bytes = mapped < file_size ? mapped : file_size;
    se->users = 1;
    se->next = envs;
    envs = se;
  }
  pthread_mutex_unlock(&envs_mu);
  if (se) {
    s->shared = se;
    s->env = se->env;
  }
  return e;
}

static void env_put(shared_env *se) {
  pthread_mutex_lock(&envs_mu);
  if (--se->users == 0) {
    shared_env **p = &envs;
    while (*p != se) p = &(*p)->next;
    *p = se->next;
    mdb_env_close(se->env);
    free(se);
  }
  pthread_mutex_unlock(&envs_mu);
}

/* Whether a value (or key) LMDB returned lies inside the mapped part of
 * the file (a damaged node can point anywhere; past the mapping's end lies
 * other memory or none). */
static int in_file(const lmdb_src *s, const MDB_val *v) {
  const char *p = v->mv_data, *m = s->shared->map;
  if (!p) return 0; /* LMDB did not set it (see open_caffe) */
  if (!m) return 1;
  size_t n = s->shared->map_bytes;
  return p >= m && v->mv_size <= n && (size_t)(p - m) <= n - v->mv_size;
}

/* LMDB's key comparison with the page's key checked first. LMDB compares
 * the key it looks for with node keys on branch and leaf pages, which it
 * trusts: on a damaged page a node's key size (up to 64 KiB) or a LEAF2
 * key width runs past the mapping, and LMDB's memcmp reads what lies
 * beyond (tools/fuzz.sh: ASan heap-buffer-overflow, 2048 bytes read in
 * mdb_node_search under mdb_get). LMDB's comparator has no context
 * argument, so the source whose lookup runs is thread-local: set around
 * every LMDB search (get_checked), NULL
 * elsewhere (nothing is then checked). A key outside the mapping marks the
 * lookup damaged; the caller reports it and ignores what LMDB returned.
 * Otherwise the order is LMDB's default (mdb_cmp_memn: bytes, then length),
 * the order stoke's and Caffe's databases are written in. */
static __thread const lmdb_src *tl_src;
static __thread const void *tl_key; /* the key looked for: ours, not in the file */
static __thread int tl_damaged;

static int page_key_ok(const MDB_val *v) { return v->mv_data == tl_key || v->mv_size == 0 || in_file(tl_src, v); }

/* Clears the lookup's thread-local state; whether it met a damaged key. */
static int lookup_end(void) {
  tl_src = NULL;
  tl_key = NULL;
  return tl_damaged;
}

/* mdb_get with the comparator's state set around it; *damaged: a key on
 * the way lay outside the file (what LMDB returned is then meaningless).
 * A fault inside leaves the state set: the guard's caller calls
 * lookup_end(). */
static int get_checked(const lmdb_src *s, MDB_txn *txn, MDB_val *k, MDB_val *v, int *damaged) {
  tl_src = s;
  tl_key = k->mv_data;
  tl_damaged = 0;
  int rc = mdb_get(txn, s->dbi, k, v);
  *damaged = lookup_end();
  return rc;
}

static int cmp_checked(const MDB_val *a, const MDB_val *b) {
  if (tl_src && (!page_key_ok(a) || !page_key_ok(b))) {
    tl_damaged = 1;
    return -1;
  }
  size_t len = a->mv_size < b->mv_size ? a->mv_size : b->mv_size;
  int d = len ? memcmp(a->mv_data, b->mv_data, len) : 0;
  if (d) return d;
  return a->mv_size < b->mv_size ? -1 : a->mv_size > b->mv_size;
}

/* The samples' channels from the data set's own (`own`) and [data]
 * channels: JPEG data converts to any; raw pixels are what they are. */
static stoke_err *pick_channels(lmdb_src *s, uint32_t own, int jpeg) {
  s->rec_channels = own;
  s->channels = s->want_channels ? (uint32_t)s->want_channels : own;
  if (!jpeg && s->channels != own)
    return STOKE_PERR(STOKE_E_INVALID,
                      "lmdb %s: [data] channels = %u, but the data set holds raw %u-channel images; leave channels "
                      "= 0 or convert the data set again with --channels %u",
                      s->path, s->channels, own, s->channels);
  if (s->channels != 1 && s->channels != 3)
    return STOKE_PERR(STOKE_E_DATA, "lmdb %s: images of %u channels: stoke reads 1 (gray) or 3 (RGB)", s->path,
                      s->channels);
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
  s->encoding = m.encoding;
  return pick_channels(s, m.channels, m.encoding == STOKE_ENC_JPEG);
}

/* A Caffe Datum database: keys are arbitrary, so keep an index -> key
 * table; classes and shape come from one scan (labels, first record). */
/* What reading the layout holds open: freed after a fault too. */
typedef struct layout_job {
  lmdb_src *s;
  MDB_txn *txn;
  MDB_cursor *cur;
  stoke_err *e;
} layout_job;

static stoke_err *open_caffe(lmdb_src *s, MDB_txn *txn, MDB_cursor **curp) {
  MDB_stat st;
  int rc = mdb_stat(txn, s->dbi, &st);
  if (rc) return STOKE_PERR(STOKE_E_IO, "lmdb %s: mdb_stat failed: %s", s->path, mdb_strerror(rc));
  if (st.ms_entries == 0)
    return STOKE_PERR(STOKE_E_DATA, "lmdb %s: the database is empty; " HOWTO, s->path);
  /* a leaf node takes at least 10 bytes (header, a key byte, its index) */
  if (st.ms_entries > s->shared->file_size / 10)
    return STOKE_PERR(STOKE_E_IO,
                      "lmdb %s: its meta page counts %llu entries, more than a file of %zu bytes can hold: the file "
                      "is damaged; copy or convert the data set again",
                      s->path, (unsigned long long)st.ms_entries, s->shared->file_size);
  size_t n = st.ms_entries, keys_cap = n * 16 + 64, keys_len = 0;
  s->key_off = malloc(sizeof(size_t) * (n + 1));
  s->keys = malloc(keys_cap);
  if (!s->key_off || !s->keys)
    return STOKE_PERR(STOKE_E_OOM, "lmdb %s: out of memory for the key table of %zu records", s->path, n);
  MDB_cursor *cur;
  rc = mdb_cursor_open(txn, s->dbi, curp);
  cur = *curp;
  if (rc) return STOKE_PERR(STOKE_E_IO, "lmdb %s: mdb_cursor_open failed: %s", s->path, mdb_strerror(rc));
  stoke_err *e = NULL;
  size_t i = 0, bad = 0, lost = 0; /* lost: records skipped for their key (also in bad) */
  int64_t max_label = -1;
  int have_shape = 0;
  char why[STOKE_WHY_BYTES], first_bad[1024] = "";
  /* k and v are cleared before each call: on a page whose damaged header
   * says LEAF2 LMDB returns success without setting v (found by
   * tests/fuzz:lmdb), and a cleared value is not in the file. A key is
   * checked as a value is: on a damaged page it can point, or run, past the
   * mapping (tests/fuzz/regress/lmdb/key_outside_file: 12,288 of the file's
   * 23,164 bytes mapped, a 2048-byte key read from the heap beyond them);
   * such a record cannot be kept in the key table, so it is skipped and
   * counted with the undecodable ones. */
  MDB_val k = {0, NULL}, v = {0, NULL};
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && i < n;
       k = (MDB_val){0, NULL}, v = (MDB_val){0, NULL}, rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (!in_file(s, &k)) {
      lost++;
      if (bad++ == 0)
        snprintf(first_bad, sizeof first_bad, "the record after index %zu: its key lies outside the file (a damaged "
                 "page)", i);
      continue;
    }
    int inside = in_file(s, &v);
    if (i == 0 && inside && v.mv_size >= 4 && !memcmp(v.mv_data, STOKE_REC_MAGIC, 4)) {
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
    int ok = inside;
    if (!ok) snprintf(why, sizeof why, "its value lies outside the file (a damaged page)");
    else ok = stoke_datum_decode(v.mv_data, v.mv_size, &d, why, sizeof why) == 0;
    if (ok && !have_shape) {
      /* the shape from the first record; the channels from [data] channels
       * (encoded: 3 unless set, as Caffe's is_color = true) */
      if (d.encoded) {
        ok = jpeg_probe(d.data, d.data_bytes, &s->height, &s->width, why, sizeof why) == 0;
        if (ok && !s->want_channels) s->want_channels = 3;
        if (ok) e = pick_channels(s, 3, 1);
      } else {
        s->height = (uint32_t)d.height;
        s->width = (uint32_t)d.width;
        e = pick_channels(s, (uint32_t)d.channels, 0);
      }
      if (e) break;
      have_shape = ok;
      s->encoding = d.encoded ? STOKE_ENC_JPEG : STOKE_ENC_RAW;
    }
    stoke_lmdb_guard_progress(); /* a record done: the CPU limit is per record, not for the whole scan */
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
  *curp = NULL;
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
                    s->path, bad, i + lost, first_bad);
  s->classes = max_label + 1;
  s->caffe = 1;
  return NULL;
}

/* The database's layout: stoke metadata or Caffe records, read under the
 * guard (a damaged file can fault anywhere in here). */
static int read_layout(void *arg) {
  layout_job *j = arg;
  lmdb_src *s = j->s;
  int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &j->txn);
  if (!rc) rc = mdb_dbi_open(j->txn, NULL, 0, &s->dbi);
  if (!rc) rc = mdb_set_compare(j->txn, s->dbi, cmp_checked);
  /* a damaged meta page can flag the database MDB_DUPSORT: its value
   * comparisons go through the same check */
  if (!rc) rc = mdb_set_dupsort(j->txn, s->dbi, cmp_checked);
  if (rc) j->e = STOKE_PERR(STOKE_E_IO, "lmdb %s: cannot open the database: %s", s->path, mdb_strerror(rc));
  if (!j->e) {
    MDB_val k = {strlen(STOKE_META_KEY), (void *)STOKE_META_KEY}, v = {0, NULL}; /* not set on a LEAF2 page */
    int damaged;
    rc = get_checked(s, j->txn, &k, &v, &damaged);
    if (damaged)
      j->e = STOKE_PERR(STOKE_E_IO, "lmdb %s: looking up " STOKE_META_KEY " met a key outside the file: it is "
                        "damaged", s->path);
    else if (rc == 0 && !in_file(s, &v))
      j->e = STOKE_PERR(STOKE_E_IO, "lmdb %s: its " STOKE_META_KEY " entry lies outside the file: it is damaged",
                        s->path);
    else if (rc == 0) j->e = open_stoke(s, j->txn, &v);
    else if (rc == MDB_NOTFOUND) j->e = open_caffe(s, j->txn, &j->cur);
    else j->e = STOKE_PERR(STOKE_E_IO, "lmdb %s: reading " STOKE_META_KEY " failed: %s", s->path, mdb_strerror(rc));
  }
  if (j->txn) {
    /* commit, not abort: the database handle outlives this transaction */
    rc = mdb_txn_commit(j->txn);
    j->txn = NULL;
    if (rc && !j->e) j->e = STOKE_PERR(STOKE_E_IO, "lmdb %s: %s", s->path, mdb_strerror(rc));
  }
  return 0;
}

static stoke_err *lm_open(const stoke_cfg *c, const char *sec, void **self) {
  const char *path = NULL;
  int64_t max_readers = 0, channels = 0;
  STOKE_PROPAGATE_P(stoke_host->cfg_str(c, sec, "path", &path));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "max_readers", &max_readers));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "channels", &channels));
  if (!path || !path[0])
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] path is empty: set it to an LMDB data set (%s)",
                      stoke_host->cfg_where(c, sec, "path"), sec, HOWTO);
  if (channels == 2)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] channels = 2: use 1 (gray), 3 (RGB) or 0 (the data set's)",
                      stoke_host->cfg_where(c, sec, "channels"), sec);
  lmdb_src *s = calloc(1, sizeof *s);
  if (!s) return STOKE_PERR(STOKE_E_OOM, "lmdb: out of memory");
  stoke_lmdb_guard_retain();
  pthread_mutex_init(&s->mu, NULL);
  s->path = strdup(path);
  s->want_channels = channels;
  s->pool_cap = (int)max_readers;
  s->pool = calloc((size_t)s->pool_cap, sizeof *s->pool);
  stoke_err *e = NULL;
  if (!s->path || !s->pool) e = STOKE_PERR(STOKE_E_OOM, "lmdb: out of memory");
  if (!e) e = env_get(s, max_readers);
  char why[STOKE_WHY_BYTES];
  layout_job j = {s, NULL, NULL, NULL};
  if (!e && stoke_lmdb_guarded(read_layout, &j, why, sizeof why)) {
    lookup_end(); /* a fault mid-lookup leaves it set */
    if (j.cur) mdb_cursor_close(j.cur); /* LMDB was left mid-call: let go of what it held */
    if (j.txn) mdb_txn_abort(j.txn);
    if (j.e) stoke_host->err_free(j.e);
    e = STOKE_PERR(STOKE_E_IO, "lmdb %s: %s; copy or convert the data set again", s->path, why);
  } else if (!e) {
    e = j.e;
  }
  if (e) {
    lm_close(s);
    return e;
  }
  stoke_host->log(STOKE_LOG_INFO, "lmdb", "%s: %s, %lld records, %lld classes, %ux%ux%u (HxWxC)%s", path,
                  s->caffe ? "Caffe Datum" : s->encoding == STOKE_ENC_JPEG ? "stoke JPEG records" : "stoke raw records",
                  (long long)s->count, (long long)s->classes, s->height, s->width, s->channels,
                  s->shared->users > 1 ? ", sharing the environment opened before on the same file" : "");
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
      if ((uint32_t)d.channels != s->channels || (uint32_t)d.height != s->height || (uint32_t)d.width != s->width ||
          s->encoding != STOKE_ENC_RAW) {
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
  if (r.height != s->height || r.width != s->width || r.channels != s->rec_channels || r.encoding != s->encoding) {
    snprintf(why, cap, "record is %ux%ux%u (HxWxC) %s, the metadata declares %ux%ux%u %s", r.height, r.width,
             r.channels, stoke_rec_encoding_name(r.encoding), s->height, s->width, s->rec_channels,
             stoke_rec_encoding_name(s->encoding));
    return -1;
  }
  if (r.label < 0 || r.label >= s->classes) {
    snprintf(why, cap, "label %d outside [0, %lld)", r.label, (long long)s->classes);
    return -1;
  }
  if (r.encoding == STOKE_ENC_RAW) memcpy(dst, r.payload, r.payload_bytes);
  else if (jpeg_decode(r.payload, r.payload_bytes, r.height, r.width, s->channels, dst, why, cap)) return -1;
  *label = r.label;
  return 0;
}

/* One record, fetched and decoded under the guard. */
typedef struct read_job {
  lmdb_src *s;
  MDB_txn *txn;
  MDB_val k, v;
  uint8_t *dst;
  int32_t *label;
  int rc, bad;
  char why[STOKE_WHY_BYTES];
} read_job;

static int read_guarded(void *arg) {
  read_job *j = arg;
  int damaged;
  j->rc = get_checked(j->s, j->txn, &j->k, &j->v, &damaged);
  if (damaged) {
    snprintf(j->why, sizeof j->why, "a key on the way to it lies outside the file (a damaged page)");
    j->rc = 0;
    j->bad = 1;
    return 0;
  }
  if (j->rc) return 0;
  if (!in_file(j->s, &j->v)) {
    snprintf(j->why, sizeof j->why, "its value lies outside the file (a damaged page)");
    j->bad = 1;
    return 0;
  }
  j->bad = decode(j->s, &j->v, j->dst, j->label, j->why, sizeof j->why) != 0;
  return 0;
}

static stoke_err *lm_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  (void)seed; /* no augmentation: the stored image as it is */
  lmdb_src *s = self;
  if (index < 0 || index >= s->count)
    return STOKE_PERR(STOKE_E_INVALID, "lmdb %s: index %lld outside [0, %lld)", s->path, (long long)index,
                      (long long)s->count);
  char kb[STOKE_KEY_DIGITS + 1], ks[600], fault[STOKE_WHY_BYTES];
  read_job j = {s, NULL, key_of(s, index, kb), {0, NULL}, dst, label, 0, 0, ""};
  STOKE_PROPAGATE_P(txn_get(s, &j.txn));
  if (stoke_lmdb_guarded(read_guarded, &j, fault, sizeof fault)) {
    lookup_end(); /* a fault mid-lookup leaves it set */
    mdb_txn_abort(j.txn); /* not back to the pool: LMDB was left mid-call */
    show_key(j.k.mv_data, j.k.mv_size, ks, sizeof ks);
    return STOKE_PERR(STOKE_E_IO, "lmdb %s: record %s (index %lld): %s; copy or convert the data set again", s->path,
                      ks, (long long)index, fault);
  }
  txn_put(s, j.txn);
  if (j.rc == 0 && !j.bad) return NULL;
  show_key(j.k.mv_data, j.k.mv_size, ks, sizeof ks);
  if (j.rc == MDB_NOTFOUND)
    return STOKE_PERR(STOKE_E_DATA, "lmdb %s: record %s (index %lld): missing from the database", s->path, ks,
                      (long long)index);
  if (j.rc)
    return STOKE_PERR(STOKE_E_IO, "lmdb %s: record %s (index %lld): mdb_get failed: %s", s->path, ks,
                      (long long)index, mdb_strerror(j.rc));
  return STOKE_PERR(STOKE_E_DATA, "lmdb %s: record %s (index %lld): %s", s->path, ks, (long long)index, j.why);
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
