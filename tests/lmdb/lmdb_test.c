/* tests/lmdb/lmdb_test.c: tools/convert and the lmdb source plugin end to
 * end: IDX and JPEG-folder conversion, Caffe Datum databases, damaged data
 * (records, files cut short, pages that make LMDB fault), one data set
 * opened twice, the channel count from [data] channels.
 *
 * The convert binary runs as a child process (a data dependency); the
 * database is then read through the core exactly as a run would: registry,
 * plugin load, a [data] config section, the source's open/info/read. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lmdb.h>
#include <turbojpeg.h>
#include <zlib.h>

#include "sources/lmdb/record.h"
#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/loader.h"
#include "stoke/registry.h"
#include "tests/common/expect.h"
#include "tests/common/source_fixture.h"
#include "tests/tools/child.h" /* tmpdir, run_child_env, EXPECT_HAS */

/* Runfiles-relative (Bazel runs tests from the runfiles root). */
#define CONVERT "tools/convert"
#define PLUGIN "sources/lmdb/libstoke_lmdb.so"

/* ----------------------------------------------------------- helpers */

/* A fresh path under the test's temporary folder. */
static char *tmp_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir(), name);
  return buf;
}



/* Runs tools/convert with `args` (NULL-terminated) and, when `env` is not
 * NULL, one extra NAME=VALUE in its environment. Its stdout and stderr
 * together land in `out`. Returns the exit code (-1: killed). */
static int run_convert(const char *const *args, const char *env, char *out, size_t cap) {
  return run_child_env(CONVERT, args, env, out, cap);
}

#define CONVERT_OK(out, ...)                                                          \
  do {                                                                                \
    int rc_ = run_convert((const char *const[]){__VA_ARGS__, NULL}, NULL, out, sizeof out); \
    if (rc_ != 0) {                                                                   \
      print_error("convert exited %d:\n%s\n", rc_, out);                              \
      fail();                                                                         \
    }                                                                                 \
  } while (0)

static void write_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
  p[3] = (unsigned char)v;
}

/* Writes an IDX file, gzipped or plain; `cut` drops that many bytes off
 * the end (a truncated file). */
static void write_idx(const char *path, int gz, uint32_t magic, const uint32_t *dims, int ndims, const uint8_t *data,
                      size_t n, size_t cut) {
  size_t total = 4 + 4 * (size_t)ndims + n;
  unsigned char *b = malloc(total);
  assert_non_null(b);
  write_be32(b, magic);
  for (int i = 0; i < ndims; i++) write_be32(b + 4 + 4 * i, dims[i]);
  memcpy(b + 4 + 4 * ndims, data, n);
  total -= cut;
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, b, (unsigned)total), (int)total);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, total, f), total);
    fclose(f);
  }
  free(b);
}

/* A small IDX data set: image i, pixel (y, x) = (i * 31 + y * 7 + x * 3)
 * mod 256, label i mod classes. */
#define IDX_H 5
#define IDX_W 7
static uint8_t idx_pixel(uint32_t i, int y, int x) { return (uint8_t)(i * 31 + (uint32_t)y * 7 + (uint32_t)x * 3); }

static void make_idx_pair(const char *stem, uint32_t n, int classes, int gz) {
  uint8_t *img = malloc((size_t)n * IDX_H * IDX_W), *lab = malloc(n);
  assert_non_null(img);
  assert_non_null(lab);
  for (uint32_t i = 0; i < n; i++) {
    lab[i] = (uint8_t)(i % (uint32_t)classes);
    for (int y = 0; y < IDX_H; y++)
      for (int x = 0; x < IDX_W; x++) img[(size_t)i * IDX_H * IDX_W + y * IDX_W + x] = idx_pixel(i, y, x);
  }
  char p[4096];
  uint32_t di[3] = {n, IDX_H, IDX_W}, dl[1] = {n};
  snprintf(p, sizeof p, "%s/%s-images%s", tmpdir(), stem, gz ? ".gz" : "");
  write_idx(p, gz, 0x803, di, 3, img, (size_t)n * IDX_H * IDX_W, 0);
  snprintf(p, sizeof p, "%s/%s-labels%s", tmpdir(), stem, gz ? ".gz" : "");
  write_idx(p, gz, 0x801, dl, 1, lab, n, 0);
  free(img);
  free(lab);
}

/* Converts <stem>-images/labels into <tmp>/<out>; returns the path. */
static char *convert_idx(const char *stem, int gz, const char *out, char *path, size_t cap) {
  char im[4096], lb[4096], log[8192];
  snprintf(im, sizeof im, "%s/%s-images%s", tmpdir(), stem, gz ? ".gz" : "");
  snprintf(lb, sizeof lb, "%s/%s-labels%s", tmpdir(), stem, gz ? ".gz" : "");
  tmp_path(path, cap, out);
  CONVERT_OK(log, "idx", "--images", im, "--labels", lb, "--out", path, "--force");
  EXPECT_HAS(log, "convert: wrote");
  return path;
}

/* The lmdb source opened through the core, as a run opens it. */
static stoke_err *open_source(opened *o, const char *path, const char *extra) {
  char keys[8192];
  snprintf(keys, sizeof keys, "path = %s\n%s", path, extra ? extra : "");
  return open_source_from(o, PLUGIN, "lmdb", keys);
}

static void expect_info(opened *o, int64_t c, int64_t h, int64_t w, int64_t classes) {
  stoke_sample_info_v1 info;
  EXPECT_OK(o->src->info(o->self, &info));
  assert_int_equal(info.shape.ndim, 3);
  assert_int_equal(info.shape.d[0], c);
  assert_int_equal(info.shape.d[1], h);
  assert_int_equal(info.shape.d[2], w);
  assert_int_equal(info.dtype, STOKE_U8);
  assert_int_equal(info.layout, STOKE_NHWC);
  assert_int_equal(info.classes, classes);
}

/* Every pixel and label of an IDX data set made by make_idx_pair. */
static void expect_idx_records(opened *o, uint32_t n, int classes) {
  assert_int_equal(o->src->length(o->self), n);
  expect_info(o, 1, IDX_H, IDX_W, classes);
  uint8_t px[IDX_H * IDX_W];
  for (uint32_t i = 0; i < n; i++) {
    int32_t label = -1;
    memset(px, 0xee, sizeof px);
    EXPECT_OK(o->src->read(o->self, i, 0, px, &label));
    assert_int_equal(label, (int32_t)(i % (uint32_t)classes));
    for (int y = 0; y < IDX_H; y++)
      for (int x = 0; x < IDX_W; x++)
        if (px[y * IDX_W + x] != idx_pixel(i, y, x)) {
          print_error("record %u pixel (%d, %d): %u, expected %u\n", i, y, x, px[y * IDX_W + x], idx_pixel(i, y, x));
          fail();
        }
  }
}

/* Opens the LMDB at `dir` for writing from the test itself. */
static void test_env(const char *dir, MDB_env **env, MDB_txn **txn, MDB_dbi *dbi, int create) {
  if (create) assert_int_equal(mkdir(dir, 0775) == 0 || errno == EEXIST, 1);
  assert_int_equal(mdb_env_create(env), 0);
  assert_int_equal(mdb_env_set_mapsize(*env, (size_t)64 << 20), 0);
  assert_int_equal(mdb_env_open(*env, dir, 0, 0664), 0);
  assert_int_equal(mdb_txn_begin(*env, NULL, 0, txn), 0);
  assert_int_equal(mdb_dbi_open(*txn, NULL, 0, dbi), 0);
}

static void test_put(MDB_txn *txn, MDB_dbi dbi, const void *key, size_t kn, const void *val, size_t vn) {
  MDB_val k = {kn, (void *)key}, v = {vn, (void *)val};
  assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
}

static void test_commit(MDB_env *env, MDB_txn *txn) {
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* ----------------------------------------------------------- IDX */

static void test_idx_round_trip(void **state) {
  (void)state;
  char path[4096];
  opened o;
  /* gzipped, as the files are distributed */
  make_idx_pair("rt", 37, 4, 1);
  EXPECT_OK(open_source(&o, convert_idx("rt", 1, "rt.lmdb", path, sizeof path), NULL));
  expect_idx_records(&o, 37, 4);
  close_source(&o);
  /* plain, uncompressed */
  make_idx_pair("rtplain", 37, 4, 0);
  EXPECT_OK(open_source(&o, convert_idx("rtplain", 0, "rtplain.lmdb", path, sizeof path), NULL));
  expect_idx_records(&o, 37, 4);
  /* the record layout on disk is the documented one */
  close_source(&o);
}

/* A single data file (MDB_NOSUBDIR) reads the same as the folder. */
static void test_single_file_database(void **state) {
  (void)state;
  char dir[4096], file[4096];
  make_idx_pair("single", 9, 3, 1);
  convert_idx("single", 1, "single.lmdb", dir, sizeof dir);
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "cp '%s/data.mdb' '%s'", dir, tmp_path(file, sizeof file, "single.mdb"));
  assert_int_equal(system(cmd), 0);
  opened o;
  EXPECT_OK(open_source(&o, file, NULL));
  expect_idx_records(&o, 9, 3);
  close_source(&o);
}

static void test_idx_errors(void **state) {
  (void)state;
  char log[8192], im[4096], lb[4096], out[4096], bad[4096];
  make_idx_pair("err", 6, 2, 1);
  snprintf(im, sizeof im, "%s/err-images.gz", tmpdir());
  snprintf(lb, sizeof lb, "%s/err-labels.gz", tmpdir());
  tmp_path(out, sizeof out, "err.lmdb");
  /* images and labels swapped: the magic is checked, the file named */
  assert_int_equal(run_convert((const char *const[]){"idx", "--images", lb, "--labels", im, "--out", out, NULL}, NULL,
                               log, sizeof log),
                   1);
  EXPECT_HAS(log, lb);
  EXPECT_HAS(log, "magic 0x00000801, expected 0x00000803");
  /* counts differ */
  make_idx_pair("err7", 7, 2, 1);
  snprintf(bad, sizeof bad, "%s/err7-labels.gz", tmpdir());
  assert_int_equal(run_convert((const char *const[]){"idx", "--images", im, "--labels", bad, "--out", out, NULL}, NULL,
                               log, sizeof log),
                   1);
  EXPECT_HAS(log, "holds 6 images");
  EXPECT_HAS(log, "holds 7 labels");
  /* a truncated image file: its header promises 6 images, it holds 3 */
  uint8_t img[3 * IDX_H * IDX_W] = {0};
  uint32_t di[3] = {6, IDX_H, IDX_W};
  tmp_path(bad, sizeof bad, "short-images.gz");
  write_idx(bad, 1, 0x803, di, 3, img, sizeof img, 0);
  assert_int_equal(run_convert((const char *const[]){"idx", "--images", bad, "--labels", lb, "--out", out, "--force",
                                                     NULL},
                               NULL, log, sizeof log),
                   1);
  EXPECT_HAS(log, bad);
  EXPECT_HAS(log, "truncated");
  EXPECT_HAS(log, "image 3 of 6");
  /* a missing file is named */
  tmp_path(bad, sizeof bad, "absent-images.gz");
  assert_int_equal(run_convert((const char *const[]){"idx", "--images", bad, "--labels", lb, "--out", out, "--force",
                                                     NULL},
                               NULL, log, sizeof log),
                   1);
  EXPECT_HAS(log, bad);
  /* a non-empty output is refused without --force, replaced with it */
  tmp_path(out, sizeof out, "full.lmdb");
  CONVERT_OK(log, "idx", "--images", im, "--labels", lb, "--out", out);
  assert_int_equal(run_convert((const char *const[]){"idx", "--images", im, "--labels", lb, "--out", out, NULL}, NULL,
                               log, sizeof log),
                   1);
  EXPECT_HAS(log, "not empty");
  EXPECT_HAS(log, "--force");
  CONVERT_OK(log, "idx", "--images", im, "--labels", lb, "--out", out, "--force");
  /* usage: exit 2; --help: exit 0 */
  assert_int_equal(run_convert((const char *const[]){"idx", "--images", im, NULL}, NULL, log, sizeof log), 2);
  assert_int_equal(run_convert((const char *const[]){"frobnicate", NULL}, NULL, log, sizeof log), 2);
  assert_int_equal(run_convert((const char *const[]){"idx", "--bogus", "1", NULL}, NULL, log, sizeof log), 2);
  EXPECT_HAS(log, "unknown option '--bogus'");
  assert_int_equal(run_convert((const char *const[]){"folder", "--root", im, "--out", out, "--size", "12", NULL}, NULL,
                               log, sizeof log),
                   2);
  EXPECT_HAS(log, "--size '12'");
  assert_int_equal(run_convert((const char *const[]){"--help", NULL}, NULL, log, sizeof log), 0);
  EXPECT_HAS(log, "usage: convert idx");
}

/* The LMDB map starts tiny and must double many times: never a failure. */
static void test_map_growth(void **state) {
  (void)state;
  char log[16384], im[4096], lb[4096], out[4096];
  make_idx_pair("grow", 3000, 10, 1); /* ~ 250 KiB of records against a 64 KiB map */
  snprintf(im, sizeof im, "%s/grow-images.gz", tmpdir());
  snprintf(lb, sizeof lb, "%s/grow-labels.gz", tmpdir());
  tmp_path(out, sizeof out, "grow.lmdb");
  int rc = run_convert((const char *const[]){"idx", "--images", im, "--labels", lb, "--out", out, "--force", NULL},
                       "STOKE_LMDB_INITIAL_MAPSIZE=65536", log, sizeof log);
  if (rc) print_error("%s\n", log);
  assert_int_equal(rc, 0);
  EXPECT_HAS(log, "growing it to");
  EXPECT_HAS(log, "map grown");
  opened o;
  EXPECT_OK(open_source(&o, out, NULL));
  expect_idx_records(&o, 3000, 10);
  close_source(&o);
}

/* ----------------------------------------------------- damaged data */

static void test_corrupt_records(void **state) {
  (void)state;
  char path[4096];
  make_idx_pair("bad", 12, 3, 1);
  convert_idx("bad", 1, "bad.lmdb", path, sizeof path);
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  test_env(path, &env, &txn, &dbi, 0);
  uint8_t good[STOKE_REC_HEADER_BYTES + IDX_H * IDX_W];
  {
    MDB_val k = {10, "0000000005"}, v;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(v.mv_size, sizeof good);
    memcpy(good, v.mv_data, sizeof good);
  }
  uint8_t b[sizeof good + IDX_W];
  test_put(txn, dbi, "0000000004", 10, "garbage!garbage!garbage!garbage!", 32); /* not a record */
  test_put(txn, dbi, "0000000006", 10, good, 20);                               /* cut inside the header */
  test_put(txn, dbi, "0000000007", 10, good, sizeof good - 1);                  /* payload one byte short */
  memcpy(b, good, sizeof good);
  memset(b + sizeof good, 1, IDX_W);
  b[12] = 6; /* height 6: consistent record, not the declared shape */
  b[24] = 6 * IDX_W;
  test_put(txn, dbi, "0000000008", 10, b, STOKE_REC_HEADER_BYTES + 6 * IDX_W);
  memcpy(b, good, sizeof good);
  b[8] = 9; /* label 9 of 3 classes */
  test_put(txn, dbi, "0000000009", 10, b, sizeof good);
  MDB_val k = {10, "0000000010"};
  assert_int_equal(mdb_del(txn, dbi, &k, NULL), 0); /* missing */
  test_commit(env, txn);

  opened o;
  EXPECT_OK(open_source(&o, path, NULL)); /* a missing record is a warning at open */
  uint8_t px[IDX_H * IDX_W];
  int32_t label;
  EXPECT_ERR(o.src->read(o.self, 4, 0, px, &label), STOKE_E_DATA, path, "record 0000000004 (index 4)", "bad magic");
  EXPECT_ERR(o.src->read(o.self, 6, 0, px, &label), STOKE_E_DATA, "record 0000000006 (index 6)", "truncated");
  EXPECT_ERR(o.src->read(o.self, 7, 0, px, &label), STOKE_E_DATA, "record 0000000007 (index 7)", "truncated");
  EXPECT_ERR(o.src->read(o.self, 8, 0, px, &label), STOKE_E_DATA, "record 0000000008 (index 8)",
             "6x7x1 (HxWxC) raw, the metadata declares 5x7x1");
  EXPECT_ERR(o.src->read(o.self, 9, 0, px, &label), STOKE_E_DATA, "record 0000000009 (index 9)", "label 9");
  EXPECT_ERR(o.src->read(o.self, 10, 0, px, &label), STOKE_E_DATA, "record 0000000010 (index 10)", "missing");
  EXPECT_ERR(o.src->read(o.self, 12, 0, px, &label), STOKE_E_INVALID, "index 12 outside [0, 12)");
  /* the neighbours still read, pixel for pixel */
  int64_t fine[] = {0, 1, 2, 3, 5, 11};
  for (size_t i = 0; i < sizeof fine / sizeof *fine; i++) {
    EXPECT_OK(o.src->read(o.self, fine[i], 0, px, &label));
    assert_int_equal(label, fine[i] % 3);
    assert_int_equal(px[IDX_W + 2], idx_pixel((uint32_t)fine[i], 1, 2));
  }
  close_source(&o);
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

/* The loader's contract: a record read() calls damaged is logged, counted
 * and replaced; every other sample arrives intact. */
static void test_loader_skips_corrupt_records(void **state) {
  (void)state;
  char path[4096];
  make_idx_pair("skip", 40, 5, 1);
  convert_idx("skip", 1, "skip.lmdb", path, sizeof path);
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  test_env(path, &env, &txn, &dbi, 0);
  test_put(txn, dbi, "0000000013", 10, "\x00\x01", 2);
  test_put(txn, dbi, "0000000027", 10, "STKR", 4);
  test_commit(env, txn);
  opened o;
  EXPECT_OK(open_source(&o, path, NULL));
  stoke_backend_v1 host = {.name = "test-host", .alloc_host = host_alloc, .free_host = host_free};
  /* prefetch 1: no batch of the next epoch is read before the count below */
  stoke_loader_opts lo = {.src = o.src, .src_self = o.self, .dev = &host, .batch = 8, .workers = 2,
                          .prefetch = 1, .shuffle = 1, .drop_last = 1, .seed = 7, .rank = 0, .world = 1};
  stoke_loader *l;
  EXPECT_OK(stoke_loader_new(&lo, &l));
  for (int64_t b = 0; b < stoke_loader_batches_per_epoch(l); b++) {
    stoke_batch *batch;
    EXPECT_OK(stoke_loader_next(l, &batch, NULL));
    for (int64_t i = 0; i < batch->n; i++) {
      const uint8_t *px = (const uint8_t *)batch->x + i * IDX_H * IDX_W;
      /* recover the index from the first pixel (i * 31 mod 256, 40 < 256) */
      int found = -1;
      for (int k = 0; k < 40; k++)
        if (idx_pixel((uint32_t)k, 0, 0) == px[0] && idx_pixel((uint32_t)k, 4, 6) == px[4 * IDX_W + 6]) found = k;
      assert_true(found >= 0 && found != 13 && found != 27);
      assert_int_equal(batch->labels[i], found % 5);
    }
    if (b == stoke_loader_batches_per_epoch(l) - 1) assert_int_equal(stoke_loader_skipped(l), 2);
    stoke_loader_release(l, batch);
  }
  stoke_loader_free(l);
  close_source(&o);
}

/* Concurrent reads from many threads share one environment. */
typedef struct reader_arg {
  opened *o;
  int id;
  int errors;
} reader_arg;

static void *reader(void *p) {
  reader_arg *a = p;
  uint8_t px[IDX_H * IDX_W];
  for (int round = 0; round < 20; round++)
    for (uint32_t i = 0; i < 50; i++) {
      uint32_t k = (i * 7 + (uint32_t)a->id * 13 + (uint32_t)round) % 50;
      int32_t label;
      stoke_err *e = a->o->src->read(a->o->self, k, 0, px, &label);
      if (e) {
        stoke_err_free(e);
        a->errors++;
      } else if (label != (int32_t)(k % 6) || px[3] != idx_pixel(k, 0, 3) || px[34] != idx_pixel(k, 4, 6)) {
        a->errors++;
      }
    }
  return NULL;
}

static void test_concurrent_reads(void **state) {
  (void)state;
  char path[4096];
  make_idx_pair("mt", 50, 6, 1);
  convert_idx("mt", 1, "mt.lmdb", path, sizeof path);
  opened o;
  EXPECT_OK(open_source(&o, path, "max_readers = 16\n"));
  pthread_t t[8];
  reader_arg a[8];
  for (int i = 0; i < 8; i++) {
    a[i] = (reader_arg){&o, i, 0};
    assert_int_equal(pthread_create(&t[i], NULL, reader, &a[i]), 0);
  }
  int errors = 0;
  for (int i = 0; i < 8; i++) {
    pthread_join(t[i], NULL);
    errors += a[i].errors;
  }
  assert_int_equal(errors, 0);
  close_source(&o);
}

static void test_open_errors(void **state) {
  (void)state;
  char p[4096], q[4200];
  opened o;
  /* missing path: named, with how to make one */
  tmp_path(p, sizeof p, "no/such/data.lmdb");
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_NOT_FOUND, p, "bazel run //tools:convert");
  close_source(&o);
  /* empty path: the key is named */
  EXPECT_ERR(open_source(&o, "", NULL), STOKE_E_INVALID, "test.ini:2", "[data] path is empty");
  close_source(&o);
  /* a folder without data.mdb */
  tmp_path(p, sizeof p, "empty.dir");
  mkdir(p, 0775);
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_NOT_FOUND, p, "without data.mdb");
  close_source(&o);
  /* a file that is not LMDB: refused before LMDB leaves a lock file */
  tmp_path(p, sizeof p, "notes.txt");
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs("these are not the records you are looking for\n", f);
  fclose(f);
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_IO, p, "not an LMDB database");
  close_source(&o);
  snprintf(q, sizeof q, "%s-lock", p);
  assert_int_not_equal(access(q, F_OK), 0);
  /* a FIFO as data.mdb: refused, never waited on (issue 19's campaign) */
  tmp_path(p, sizeof p, "fifo.dir");
  mkdir(p, 0775);
  snprintf(q, sizeof q, "%s/data.mdb", p);
  assert_int_equal(mkfifo(q, 0644), 0);
  alarm(60);
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_IO, q, "is not a file");
  alarm(0);
  close_source(&o);
  /* a bad max_readers is a config error with its place */
  make_idx_pair("mr", 3, 2, 1);
  convert_idx("mr", 1, "mr.lmdb", p, sizeof p);
  EXPECT_ERR(open_source(&o, p, "max_readers = 0\n"), STOKE_E_INVALID, "test.ini:3");
  close_source(&o);
  /* stoke records without the metadata entry: an unfinished conversion */
  tmp_path(p, sizeof p, "nometa.lmdb");
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  test_env(p, &env, &txn, &dbi, 1);
  uint8_t px[4] = {1, 2, 3, 4}, rec[64];
  stoke_rec r = {STOKE_ENC_RAW, 0, 2, 2, 1, 4, px};
  size_t n = stoke_rec_encode(&r, rec, sizeof rec);
  test_put(txn, dbi, "0000000000", 10, rec, n);
  test_commit(env, txn);
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_DATA, p, "no __stoke__", "did not finish");
  close_source(&o);
  /* an LMDB of something else entirely */
  tmp_path(p, sizeof p, "other.lmdb");
  test_env(p, &env, &txn, &dbi, 1);
  test_put(txn, dbi, "alpha", 5, "\x07\x07\x07", 3);
  test_commit(env, txn);
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_DATA, p, "nor a Caffe Datum database", "record alpha (index 0)");
  close_source(&o);
  /* a damaged metadata entry */
  tmp_path(p, sizeof p, "badmeta.lmdb");
  test_env(p, &env, &txn, &dbi, 1);
  test_put(txn, dbi, "0000000000", 10, rec, n);
  test_put(txn, dbi, STOKE_META_KEY, strlen(STOKE_META_KEY), "STKM\x01\x00", 6);
  test_commit(env, txn);
  EXPECT_ERR(open_source(&o, p, NULL), STOKE_E_DATA, p, "metadata entry __stoke__", "truncated");
  close_source(&o);
}


/* ------------------------------------------------ damaged files, sharing */

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  rewind(f);
  uint8_t *b = malloc(*n ? *n : 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

static void spill(const char *dir, const uint8_t *b, size_t n) {
  char p[4200];
  mkdir(dir, 0775);
  snprintf(p, sizeof p, "%s/data.mdb", dir);
  unlink(p);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(b, 1, n, f), n);
  fclose(f);
}

/* The data.mdb of 3000 converted IDX images: its bytes (free them). */
static uint8_t *converted_bytes(const char *stem, size_t *n) {
  char path[4096], out[4200], file[4300];
  make_idx_pair(stem, 3000, 10, 1);
  snprintf(out, sizeof out, "%s.lmdb", stem);
  convert_idx(stem, 1, out, path, sizeof path);
  snprintf(file, sizeof file, "%s/data.mdb", path);
  return slurp(file, n);
}

/* A data set cut short (a copy interrupted) is refused at open with both
 * sizes; reading it used to die by SIGBUS at the first missing page. */
static void test_cut_short_refused(void **state) {
  (void)state;
  char cut[4096];
  size_t n;
  uint8_t *b = converted_bytes("cut", &n);
  assert_true(n > 16 * 4096);
  const size_t sizes[] = {8191, 8192, 12288, n / 2, n - 4096, n - 1};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    snprintf(cut, sizeof cut, "%s/cut%zu.lmdb", tmpdir(), sizes[i]);
    spill(cut, b, sizes[i]);
    opened o;
    char size[32];
    snprintf(size, sizeof size, "is %zu bytes", sizes[i]);
    EXPECT_ERR(open_source(&o, cut, NULL), STOKE_E_IO, cut, size, "its meta page counts", "cut short");
    close_source(&o);
  }
  free(b);
}

/* The main database's root page copied over the file's last page (4096-byte
 * pages), and both meta pages pointing there: the page to damage. */
static uint8_t *root_to_last_page(uint8_t *b, size_t n) {
  const size_t ps = 4096, last = n / ps - 1;
  for (int m = 0; m < 2; m++) { /* MDB_meta after the 16-byte page header */
    uint8_t *meta = b + m * ps + 16;
    size_t root;
    memcpy(&root, meta + 24 + 48 + 40, 8); /* dbs[MAIN_DBI].md_root */
    if (m == 0) memcpy(b + last * ps, b + root * ps, ps);
    memcpy(meta + 24 + 48 + 40, &last, 8);
  }
  uint8_t *page = b + last * ps;
  memcpy(page, &last, 8); /* mp_pgno */
  return page;
}

/* The damaged bytes b[0..n) as the data set `name` in the test's folder
 * (its path in bad); b is freed. */
static void write_damaged(char *bad, size_t cap, const char *name, uint8_t *b, size_t n) {
  tmp_path(bad, cap, name);
  spill(bad, b, n);
  free(b);
}

/* The main database's root moved (meta pages) to the file's last page,
 * whose node offsets all point past the end of the file: LMDB's first key
 * comparison faults. That fault is an error naming the data set. */
static void test_damaged_page_is_an_error(void **state) {
  (void)state;
  char bad[4096];
  size_t n;
  uint8_t *b = converted_bytes("fault", &n);
  uint8_t *page = root_to_last_page(b, n);
  uint16_t lower;
  memcpy(&lower, page + 12, 2);
  for (size_t off = 16; off < lower; off += 2) memcpy(page + off, &(uint16_t){0xfff0}, 2);
  write_damaged(bad, sizeof bad, "fault-bad.lmdb", b, n);
  opened o;
  EXPECT_ERR(open_source(&o, bad, NULL), STOKE_E_IO, bad, "while LMDB read the file", "damaged");
  close_source(&o);
}

/* The root moved to the file's last page as above, whose nodes now stay
 * inside the page but whose keys run 98 bytes past the end of the file:
 * LMDB compares the key it looks for with them and, trusting the page,
 * read beyond the file (tools/fuzz.sh: ASan heap-buffer-overflow in
 * mdb_node_search; tests/fuzz/regress/lmdb/node_key_outside_map). The
 * source's comparator checks a page's key before comparing: the lookup of
 * the metadata entry is refused as damaged, naming the data set, before a
 * byte past the file is read (without the check: a fault, "while LMDB read
 * the file", or a compare of whatever lies beyond). */
static void test_page_key_past_the_file(void **state) {
  (void)state;
  char bad[4096];
  size_t n;
  uint8_t *b = converted_bytes("keypast", &n);
  const size_t ps = 4096, last = n / ps - 1;
  uint8_t *page = root_to_last_page(b, n);
  uint16_t lower, flags;
  memcpy(&flags, page + 10, 2);
  assert_true(flags & 0x01); /* P_BRANCH: the root of 3000 records */
  memcpy(&lower, page + 12, 2);
  /* every node header (8 bytes: child page, flags, key size) at the page's
   * last 10 bytes, its key from byte 4094 on, 100 bytes long */
  const uint16_t at = (uint16_t)(ps - 10), ksize = 100;
  memcpy(page + at + 6, &ksize, 2);
  for (size_t off = 16; off < lower; off += 2) memcpy(page + off, &at, 2);
  assert_true(last * ps + at + 8 + ksize > n); /* the key runs past the file */
  write_damaged(bad, sizeof bad, "keypast-bad.lmdb", b, n);
  opened o;
  EXPECT_ERR(open_source(&o, bad, NULL), STOKE_E_IO, bad, "met a key outside the file", "damaged");
  close_source(&o);
}

/* [data] and [eval_data] on one data set: one environment, shared. With
 * two, closing one dropped the reader slots of the other (LMDB keys them
 * by process): "MDB_BAD_RSLOT: Invalid reuse of reader locktable slot". */
static void test_same_data_set_twice(void **state) {
  (void)state;
  char path[4096];
  make_idx_pair("twice", 60, 5, 1);
  convert_idx("twice", 1, "twice.lmdb", path, sizeof path);
  opened a, b;
  EXPECT_OK(open_source(&a, path, NULL));
  expect_idx_records(&a, 60, 5);
  EXPECT_OK(open_source(&b, path, NULL));
  expect_idx_records(&b, 60, 5);
  expect_idx_records(&a, 60, 5);
  close_source(&b);
  expect_idx_records(&a, 60, 5); /* its pooled transactions still valid */
  close_source(&a);
  EXPECT_OK(open_source(&a, path, NULL)); /* and the last close really closed it */
  expect_idx_records(&a, 60, 5);
  close_source(&a);
}

/* ------------------------------------------------------- Caffe Datum */

static size_t pb_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}
static size_t pb_int(uint8_t *p, unsigned field, int64_t v) {
  size_t n = pb_varint(p, (uint64_t)field << 3);
  return n + pb_varint(p + n, (uint64_t)v);
}
static size_t pb_bytes(uint8_t *p, unsigned field, const void *b, size_t len) {
  size_t n = pb_varint(p, (uint64_t)field << 3 | 2);
  n += pb_varint(p + n, len);
  memcpy(p + n, b, len);
  return n + len;
}

/* Caffe datum k: 3 x 2 x 4 (CxHxW), value at (c, y, x) = k*50 + c*10 + y*4 + x. */
#define CF_C 3
#define CF_H 2
#define CF_W 4
static uint8_t caffe_value(int k, int c, int y, int x) { return (uint8_t)(k * 50 + c * 10 + y * 4 + x); }

static size_t caffe_datum(uint8_t *p, int k, int label) {
  uint8_t chw[CF_C * CF_H * CF_W];
  for (int c = 0; c < CF_C; c++)
    for (int y = 0; y < CF_H; y++)
      for (int x = 0; x < CF_W; x++) chw[(c * CF_H + y) * CF_W + x] = caffe_value(k, c, y, x);
  size_t n = pb_int(p, 1, CF_C);
  n += pb_int(p + n, 2, CF_H);
  n += pb_int(p + n, 3, CF_W);
  n += pb_bytes(p + n, 4, chw, sizeof chw);
  n += pb_int(p + n, 5, label);
  return n;
}

static void test_caffe_datum(void **state) {
  (void)state;
  char p[4096];
  tmp_path(p, sizeof p, "caffe.lmdb");
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  test_env(p, &env, &txn, &dbi, 1);
  /* Caffe's convert_imageset keys: "%08d_%s"; written out of order, LMDB
   * sorts them and index = position in key order */
  const char *keys[] = {"00000002_b/x.png", "00000000_a/z.png", "00000001_c/y.png", "00000003_d/w.png"};
  const int which[] = {2, 0, 1, 3}, labels[] = {0, 5, 2, 1};
  uint8_t buf[256];
  for (int i = 0; i < 4; i++) {
    size_t n = caffe_datum(buf, which[i], labels[which[i]]);
    if (which[i] == 3) n -= 3; /* record 3 cut short */
    test_put(txn, dbi, keys[i], strlen(keys[i]), buf, n);
  }
  test_commit(env, txn);

  opened o;
  EXPECT_OK(open_source(&o, p, NULL));
  assert_int_equal(o.src->length(o.self), 4);
  expect_info(&o, CF_C, CF_H, CF_W, 6); /* max label 5 + 1 */
  uint8_t px[CF_C * CF_H * CF_W];
  for (int k = 0; k < 3; k++) {
    int32_t label = -1;
    EXPECT_OK(o.src->read(o.self, k, 0, px, &label));
    assert_int_equal(label, labels[k]);
    for (int y = 0; y < CF_H; y++)
      for (int x = 0; x < CF_W; x++)
        for (int c = 0; c < CF_C; c++) assert_int_equal(px[(y * CF_W + x) * CF_C + c], caffe_value(k, c, y, x));
  }
  int32_t label;
  EXPECT_ERR(o.src->read(o.self, 3, 0, px, &label), STOKE_E_DATA, p, "record 00000003_d/w.png (index 3)",
             "Datum: truncated");
  close_source(&o);
}

/* ------------------------------------------------------------- JPEG */

/* A smooth test image: RGB at (y, x) of an h x w picture. */
static void smooth_rgb(int y, int x, int h, int w, int seed, uint8_t rgb[3]) {
  rgb[0] = (uint8_t)(40 + 160 * x / (w - 1));
  rgb[1] = (uint8_t)(30 + 180 * y / (h - 1));
  rgb[2] = (uint8_t)(60 + seed * 30 + 40 * (x + y) / (w + h - 2));
}

static void write_jpeg(const char *path, int h, int w, int seed, int gray) {
  uint8_t *px = malloc((size_t)h * w * 3);
  assert_non_null(px);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t c[3];
      smooth_rgb(y, x, h, w, seed, c);
      if (gray) px[y * w + x] = c[1];
      else memcpy(px + ((size_t)y * w + x) * 3, c, 3);
    }
  tjhandle t = tjInitCompress();
  assert_non_null(t);
  unsigned char *jpeg = NULL;
  unsigned long n = 0;
  assert_int_equal(tjCompress2(t, px, w, 0, h, gray ? TJPF_GRAY : TJPF_RGB, &jpeg, &n,
                               gray ? TJSAMP_GRAY : TJSAMP_444, 98, 0),
                   0);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(jpeg, 1, n, f), n);
  fclose(f);
  tjFree(jpeg);
  tjDestroy(t);
  free(px);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

#define SRC_H 40
#define SRC_W 60
#define DST_H 20
#define DST_W 30

/* The expected pixel at (y, x) of the 2x smaller image: the mean of the
 * 2x2 source block, each source pixel from smooth_rgb. */
static void expected(int y, int x, int seed, int gray, uint8_t *out) {
  int sum[3] = {0, 0, 0};
  for (int dy = 0; dy < 2; dy++)
    for (int dx = 0; dx < 2; dx++) {
      uint8_t c[3];
      smooth_rgb(2 * y + dy, 2 * x + dx, SRC_H, SRC_W, seed, c);
      for (int k = 0; k < 3; k++) sum[k] += c[k];
    }
  for (int k = 0; k < 3; k++) out[k] = (uint8_t)((sum[k] + 2) / 4);
  (void)gray;
}

/* Reads every record and compares with the source within JPEG tolerance. */
static void expect_folder_records(opened *o, int channels, const int *seeds, const int *grays, const int *labels,
                                  int n, double max_mean, int max_abs) {
  assert_int_equal(o->src->length(o->self), n);
  expect_info(o, channels, DST_H, DST_W, 3);
  uint8_t px[DST_H * DST_W * 3];
  for (int i = 0; i < n; i++) {
    int32_t label = -1;
    EXPECT_OK(o->src->read(o->self, i, 0, px, &label));
    assert_int_equal(label, labels[i]);
    double sum = 0;
    int worst = 0;
    for (int y = 0; y < DST_H; y++)
      for (int x = 0; x < DST_W; x++) {
        uint8_t e[3];
        expected(y, x, seeds[i], grays[i], e);
        for (int c = 0; c < channels; c++) {
          int want;
          if (grays[i]) want = e[1]; /* a grayscale source holds the green ramp */
          else if (channels == 1) want = (int)(0.299 * e[0] + 0.587 * e[1] + 0.114 * e[2] + 0.5);
          else want = e[c];
          int d = abs((int)px[(y * DST_W + x) * channels + c] - want);
          sum += d;
          worst = d > worst ? d : worst;
        }
      }
    double mean = sum / (DST_H * DST_W * channels);
    if (mean > max_mean || worst > max_abs) {
      print_error("record %d: mean abs error %.2f (limit %.1f), max %d (limit %d)\n", i, mean, max_mean, worst,
                  max_abs);
      fail();
    }
  }
}

static void test_jpeg_folder(void **state) {
  (void)state;
  char root[4096], d[4200], f[4400], out[4096], log[16384];
  tmp_path(root, sizeof root, "images");
  mkdir(root, 0775);
  snprintf(d, sizeof d, "%s/cat", root);
  mkdir(d, 0775);
  snprintf(d, sizeof d, "%s/dog", root);
  mkdir(d, 0775);
  snprintf(d, sizeof d, "%s/.cache", root); /* hidden, but a folder: class 0, as in torchvision */
  mkdir(d, 0775);
  snprintf(d, sizeof d, "%s/cat/sub", root); /* images in sub-folders count (os.walk) */
  mkdir(d, 0775);
  snprintf(d, sizeof d, "%s/cat/up", root); /* a loop: never followed */
  assert_int_equal(symlink("..", d), 0);
  /* sorted by name: cat (1): a, b, c, sub/f; dog (2): d (gray), e, link (-> a) */
  snprintf(f, sizeof f, "%s/cat/a.jpg", root);
  write_jpeg(f, SRC_H, SRC_W, 0, 0);
  snprintf(f, sizeof f, "%s/cat/b.JPG", root);
  write_jpeg(f, SRC_H, SRC_W, 1, 0);
  snprintf(f, sizeof f, "%s/cat/c.jpeg", root);
  write_jpeg(f, SRC_H, SRC_W, 2, 0);
  snprintf(f, sizeof f, "%s/dog/d.JPEG", root);
  write_jpeg(f, SRC_H, SRC_W, 3, 1);
  snprintf(f, sizeof f, "%s/dog/e.jpg", root);
  write_jpeg(f, SRC_H, SRC_W, 4, 0);
  snprintf(f, sizeof f, "%s/dog/broken.jpg", root);
  write_text(f, "a text file wearing a .jpg name\n");
  snprintf(f, sizeof f, "%s/dog/notes.txt", root);
  write_text(f, "not an image\n");
  snprintf(f, sizeof f, "%s/cat/sub/f.jpg", root);
  write_jpeg(f, SRC_H, SRC_W, 5, 0);
  snprintf(f, sizeof f, "%s/dog/link.jpg", root); /* a linked file is read */
  assert_int_equal(symlink("../cat/a.jpg", f), 0);
  const int seeds[] = {0, 1, 2, 5, 3, 4, 0}, grays[] = {0, 0, 0, 0, 1, 0, 0}, labels[] = {1, 1, 1, 1, 2, 2, 2};

  /* RGB, re-encoded JPEG */
  tmp_path(out, sizeof out, "images-jpeg.lmdb");
  CONVERT_OK(log, "folder", "--root", root, "--out", out, "--size", "20x30", "--encoding", "jpeg", "--quality", "95",
             "--threads", "3", "--allow-empty");
  EXPECT_HAS(log, "1 class folders hold no JPEG ('.cache' (0)); their labels are kept (--allow-empty)");
  snprintf(f, sizeof f, "%s/dog/broken.jpg", root);
  EXPECT_HAS(log, f); /* the unreadable file is reported with its path */
  EXPECT_HAS(log, "skipping");
  snprintf(f, sizeof f, "%s/dog/notes.txt", root);
  EXPECT_HAS(log, f);
  EXPECT_HAS(log, "wrote 7 records");
  EXPECT_HAS(log, "3 classes");
  EXPECT_HAS(log, "skipped 1");
  EXPECT_HAS(log, "ignored 1");
  EXPECT_HAS(log, "link back to a folder they are in");
  EXPECT_HAS(log, "cat/up");
  opened o;
  EXPECT_OK(open_source(&o, out, NULL));
  expect_folder_records(&o, 3, seeds, grays, labels, 7, 3.0, 16);
  close_source(&o);

  /* grayscale, raw */
  tmp_path(out, sizeof out, "images-gray.lmdb");
  /* without --allow-empty the class without an image is refused, named */
  assert_int_not_equal(run_convert((const char *const[]){"folder", "--root", root, "--out", out, "--size", "20x30",
                                                          "--channels", "1", NULL},
                                   NULL, log, sizeof log),
                       0);
  EXPECT_HAS(log, "1 class folder hold no readable JPEG: '.cache' (0); fix or remove them, or pass --allow-empty");
  CONVERT_OK(log, "folder", "--root", root, "--out", out, "--size", "20x30", "--channels", "1", "--allow-empty");
  EXPECT_OK(open_source(&o, out, NULL));
  expect_folder_records(&o, 1, seeds, grays, labels, 7, 1.0, 4);
  close_source(&o);
  /* raw pixels cannot change their channel count: [data] channels says so */
  EXPECT_ERR(open_source(&o, out, "channels = 3\n"), STOKE_E_INVALID, out, "channels = 3",
             "raw 1-channel images", "--channels 3");
  close_source(&o);

  /* a JPEG record whose image is not the declared size, and a cut one */
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  tmp_path(out, sizeof out, "images-jpeg.lmdb");
  test_env(out, &env, &txn, &dbi, 0);
  {
    MDB_val k = {10, "0000000001"}, v;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    uint8_t *copy = malloc(v.mv_size);
    assert_non_null(copy);
    memcpy(copy, v.mv_data, v.mv_size);
    /* the same JPEG, its header saying 21 rows: payload and record intact */
    size_t half = STOKE_REC_HEADER_BYTES + (v.mv_size - STOKE_REC_HEADER_BYTES) / 2;
    uint8_t *cut = malloc(half);
    assert_non_null(cut);
    memcpy(cut, copy, half);
    uint32_t pl = (uint32_t)(half - STOKE_REC_HEADER_BYTES);
    cut[24] = (uint8_t)pl, cut[25] = (uint8_t)(pl >> 8), cut[26] = 0, cut[27] = 0;
    test_put(txn, dbi, "0000000002", 10, cut, half);
    free(cut);
    /* a JPEG of another size in a well-formed record */
    tjhandle t = tjInitCompress();
    uint8_t img[12 * 10 * 3];
    memset(img, 100, sizeof img);
    unsigned char *jpeg = NULL;
    unsigned long jn = 0;
    assert_int_equal(tjCompress2(t, img, 10, 0, 12, TJPF_RGB, &jpeg, &jn, TJSAMP_444, 90, 0), 0);
    stoke_rec r = {STOKE_ENC_JPEG, 0, DST_H, DST_W, 3, (uint32_t)jn, jpeg};
    uint8_t *rec = malloc(stoke_rec_size(&r));
    assert_non_null(rec);
    size_t rn = stoke_rec_encode(&r, rec, stoke_rec_size(&r));
    test_put(txn, dbi, "0000000003", 10, rec, rn);
    free(rec);
    tjFree(jpeg);
    tjDestroy(t);
    free(copy);
  }
  test_commit(env, txn);
  EXPECT_OK(open_source(&o, out, NULL));
  uint8_t px[DST_H * DST_W * 3];
  int32_t label;
  EXPECT_ERR(o.src->read(o.self, 2, 0, px, &label), STOKE_E_DATA, "record 0000000002 (index 2)", "JPEG");
  EXPECT_ERR(o.src->read(o.self, 3, 0, px, &label), STOKE_E_DATA, out, "record 0000000003 (index 3)",
             "JPEG is 12x10 (HxW), expected 20x30");
  EXPECT_OK(o.src->read(o.self, 4, 0, px, &label));
  close_source(&o);
}

/* The largest difference between the decoded record k and smooth_rgb's
 * image k, seen as `channels` (1: its ITU-R 601 luma; 3: RGB; a gray JPEG
 * holds smooth_rgb's green as its gray). */
static int caffe_jpeg_error(opened *o, int k, int channels, int gray_jpeg) {
  uint8_t px[DST_H * DST_W * 3];
  int32_t label;
  EXPECT_OK(o->src->read(o->self, k, 0, px, &label));
  assert_int_equal(label, k);
  int worst = 0;
  for (int y = 0; y < DST_H; y++)
    for (int x = 0; x < DST_W; x++) {
      uint8_t c[3];
      smooth_rgb(y, x, DST_H, DST_W, k, c);
      if (gray_jpeg) c[0] = c[2] = c[1];
      int want[3] = {c[0], c[1], c[2]};
      if (channels == 1) want[0] = (int)(0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] + 0.5);
      for (int ch = 0; ch < channels; ch++) {
        int d = abs((int)px[(y * DST_W + x) * channels + ch] - want[ch]);
        worst = d > worst ? d : worst;
      }
    }
  return worst;
}

/* A Caffe database of encoded (JPEG) datums, the first one grayscale: the
 * channel count comes from [data] channels (3 unless set, as Caffe's
 * is_color = true), never from the first record, and every record is
 * decoded to it. */
static void test_caffe_encoded(void **state) {
  (void)state;
  char p[4096];
  tmp_path(p, sizeof p, "caffe-jpeg.lmdb");
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  test_env(p, &env, &txn, &dbi, 1);
  tjhandle t = tjInitCompress();
  for (int k = 0; k < 3; k++) {
    uint8_t img[DST_H * DST_W * 3];
    for (int y = 0; y < DST_H; y++)
      for (int x = 0; x < DST_W; x++) smooth_rgb(y, x, DST_H, DST_W, k, img + (y * DST_W + x) * 3);
    if (k == 0) /* grayscale: its green channel */
      for (int i = 0; i < DST_H * DST_W; i++) img[i] = img[3 * i + 1];
    unsigned char *jpeg = NULL;
    unsigned long jn = 0;
    assert_int_equal(tjCompress2(t, img, DST_W, 0, DST_H, k ? TJPF_RGB : TJPF_GRAY, &jpeg, &jn,
                                 k ? TJSAMP_444 : TJSAMP_GRAY, 98, 0),
                     0);
    uint8_t *buf = malloc(jn + 32);
    assert_non_null(buf);
    size_t n = pb_bytes(buf, 4, jpeg, jn);
    n += pb_int(buf + n, 5, k);
    n += pb_int(buf + n, 7, 1);
    char key[32];
    snprintf(key, sizeof key, "%08d_img%d.jpg", k, k);
    test_put(txn, dbi, key, strlen(key), buf, n);
    free(buf);
    tjFree(jpeg);
  }
  tjDestroy(t);
  test_commit(env, txn);
  opened o;
  EXPECT_OK(open_source(&o, p, NULL));
  expect_info(&o, 3, DST_H, DST_W, 3); /* H, W from the first JPEG's header; 3 channels */
  for (int k = 0; k < 3; k++) assert_true(caffe_jpeg_error(&o, k, 3, k == 0) <= 12);
  close_source(&o);
  EXPECT_OK(open_source(&o, p, "channels = 1\n"));
  expect_info(&o, 1, DST_H, DST_W, 3);
  for (int k = 0; k < 3; k++) assert_true(caffe_jpeg_error(&o, k, 1, k == 0) <= 12);
  close_source(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_idx_round_trip),
      cmocka_unit_test(test_single_file_database),
      cmocka_unit_test(test_idx_errors),
      cmocka_unit_test(test_map_growth),
      cmocka_unit_test(test_corrupt_records),
      cmocka_unit_test(test_loader_skips_corrupt_records),
      cmocka_unit_test(test_concurrent_reads),
      cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_cut_short_refused),
      cmocka_unit_test(test_damaged_page_is_an_error),
      cmocka_unit_test(test_page_key_past_the_file),
      cmocka_unit_test(test_same_data_set_twice),
      cmocka_unit_test(test_caffe_datum),
      cmocka_unit_test(test_caffe_encoded),
      cmocka_unit_test(test_jpeg_folder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
