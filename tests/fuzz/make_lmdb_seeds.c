/* tests/fuzz/make_lmdb_seeds.c: writes the Caffe Datum databases of the
 * lmdb fuzz corpus (tests/fuzz/make_corpus.sh builds and runs it; the
 * stoke-record databases come from tools/convert): raw Datums over two
 * leaf pages, encoded (JPEG) Datums, and a database whose second
 * transaction deleted records, so its free-page list is not empty.
 *
 *   make_lmdb_seeds OUT_DIR JPEG */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lmdb.h>

static void check(int rc, const char *what) {
  if (rc) {
    fprintf(stderr, "make_lmdb_seeds: %s: %s\n", what, mdb_strerror(rc));
    exit(1);
  }
}

static size_t varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    p[n] = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v) p[n] |= 0x80;
    n++;
  } while (v);
  return n;
}

/* A Datum: channels 1, height 2, width 3, data 4, label 5, encoded 7. */
static size_t datum(uint8_t *p, int c, int h, int w, const uint8_t *data, size_t n, int label, int encoded) {
  size_t k = 0;
  k += varint(p + k, 1 << 3), k += varint(p + k, (uint64_t)c);
  k += varint(p + k, 2 << 3), k += varint(p + k, (uint64_t)h);
  k += varint(p + k, 3 << 3), k += varint(p + k, (uint64_t)w);
  k += varint(p + k, 4 << 3 | 2), k += varint(p + k, n);
  memcpy(p + k, data, n);
  k += n;
  k += varint(p + k, 5 << 3), k += varint(p + k, (uint64_t)label);
  if (encoded) k += varint(p + k, 7 << 3), k += varint(p + k, 1);
  return k;
}

typedef struct db {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  char tmp[4096], lock[4200], out[4200];
} db;

/* A fresh single-file database, written where `out` will be. */
static void db_begin(db *d, const char *dir, const char *name) {
  snprintf(d->out, sizeof d->out, "%s/%s", dir, name);
  snprintf(d->tmp, sizeof d->tmp, "%s.tmp", d->out);
  snprintf(d->lock, sizeof d->lock, "%s-lock", d->tmp);
  unlink(d->tmp);
  check(mdb_env_create(&d->env), "mdb_env_create");
  check(mdb_env_set_mapsize(d->env, 1 << 20), "mdb_env_set_mapsize");
  check(mdb_env_open(d->env, d->tmp, MDB_NOSUBDIR, 0644), d->tmp);
  check(mdb_txn_begin(d->env, NULL, 0, &d->txn), "mdb_txn_begin");
  check(mdb_dbi_open(d->txn, NULL, 0, &d->dbi), "mdb_dbi_open");
}

static void db_put(db *d, const char *key, const uint8_t *v, size_t n) {
  MDB_val k = {strlen(key), (void *)key}, val = {n, (void *)v};
  check(mdb_put(d->txn, d->dbi, &k, &val, 0), "mdb_put");
}

static void db_next_txn(db *d) {
  check(mdb_txn_commit(d->txn), "mdb_txn_commit");
  check(mdb_txn_begin(d->env, NULL, 0, &d->txn), "mdb_txn_begin");
}

static void db_end(db *d) {
  check(mdb_txn_commit(d->txn), "mdb_txn_commit");
  mdb_env_close(d->env);
  unlink(d->lock);
  if (rename(d->tmp, d->out)) {
    perror(d->out);
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: make_lmdb_seeds OUT_DIR JPEG\n");
    return 2;
  }
  static uint8_t v[1 << 16], px[64];
  char key[64];
  db d;
  /* 40 raw 3x2x2 Datums, BGR as Caffe stores them: two leaf pages */
  db_begin(&d, argv[1], "caffe_raw");
  for (int i = 0; i < 40; i++) {
    for (int b = 0; b < 12; b++) px[b] = (uint8_t)(i * 12 + b);
    snprintf(key, sizeof key, "%08d_n01440764/img_%d.JPEG", i, i); /* convert_imageset's keys */
    db_put(&d, key, v, datum(v, 3, 2, 2, px, 12, i % 5, 0));
  }
  db_end(&d);
  /* 2 encoded Datums holding a JPEG (shape 0: it comes from the JPEG) */
  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  static uint8_t jpg[1 << 15];
  size_t nj = fread(jpg, 1, sizeof jpg, f);
  fclose(f);
  db_begin(&d, argv[1], "caffe_encoded");
  for (int i = 0; i < 2; i++) {
    snprintf(key, sizeof key, "%08d", i);
    db_put(&d, key, v, datum(v, 0, 0, 0, jpg, nj, i, 1));
  }
  db_end(&d);
  /* 60 gray 1x4x4 Datums, then every other one deleted in a second
   * transaction: the free-page database holds the pages the first used */
  db_begin(&d, argv[1], "caffe_freed");
  for (int i = 0; i < 60; i++) {
    for (int b = 0; b < 16; b++) px[b] = (uint8_t)(i + b * 9);
    snprintf(key, sizeof key, "%08d", i);
    db_put(&d, key, v, datum(v, 1, 4, 4, px, 16, i % 3, 0));
  }
  db_next_txn(&d);
  for (int i = 0; i < 60; i += 2) {
    snprintf(key, sizeof key, "%08d", i);
    MDB_val k = {strlen(key), key};
    check(mdb_del(d.txn, d.dbi, &k, NULL), "mdb_del");
  }
  db_end(&d);
  return 0;
}
