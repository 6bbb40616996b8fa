/* tests/tokens/tokens_test.c: the tokens source read through the core as a
 * run reads it: llm.c shards from a file, a folder and a glob; sequential
 * windows covering every token in order; random windows that are seeded,
 * whole and inside one shard; the ranks' shards through the loader; and
 * every damaged or foreign file refused with its path. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sources/tokens/shard.h"
#include "stoke/core.h"
#include "stoke/loader.h"
#include "tests/common/expect.h"
#include "tests/common/log_capture.h"
#include "tests/common/source_fixture.h"

#define PLUGIN "sources/tokens/libstoke_tokens.so"

static const char *tmpdir(void) {
  const char *t = getenv("TEST_TMPDIR");
  return t && t[0] ? t : "/tmp";
}

/* Token i of shard `id`: a value that says where it came from. */
static uint16_t tok(int id, int64_t i) { return (uint16_t)(id * 10000 + i); }

/* A shard of n tokens tok(id, 0..n) at dir/name; `cut` bytes dropped from
 * the end (or, negative, that many added), `magic` and `version` written
 * as given. */
static void write_shard_as(const char *dir, const char *name, int id, int64_t n, long cut, int32_t magic,
                           int32_t version) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  unsigned char h[STOKE_SHARD_HEADER_BYTES];
  stoke_shard_header(h, n);
  for (int i = 0; i < 4; i++) h[i] = (unsigned char)((uint32_t)magic >> (8 * i)), h[4 + i] = (unsigned char)((uint32_t)version >> (8 * i));
  size_t bytes = sizeof h + 2 * (size_t)n;
  unsigned char *b = malloc(bytes + 16);
  assert_non_null(b);
  memcpy(b, h, sizeof h);
  for (int64_t i = 0; i < n; i++) b[sizeof h + 2 * i] = (unsigned char)tok(id, i), b[sizeof h + 2 * i + 1] = (unsigned char)(tok(id, i) >> 8);
  memset(b + bytes, 7, 16);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, (size_t)((long)bytes - cut), f), (size_t)((long)bytes - cut));
  fclose(f);
  free(b);
}

static void write_shard(const char *dir, const char *name, int id, int64_t n) {
  write_shard_as(dir, name, id, n, 0, STOKE_SHARD_MAGIC, STOKE_SHARD_VERSION);
}

/* A fresh folder under the test's temporary folder. */
static char *folder(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir(), name);
  mkdir(buf, 0755);
  return buf;
}

static stoke_err *open_tokens(opened *o, const char *path, const char *extra) {
  char keys[8192];
  snprintf(keys, sizeof keys, "path = %s\nseq_len = 8\nvocab = 65536\n%s", path, extra ? extra : "");
  return open_source_from(o, PLUGIN, "tokens", keys);
}

/* Open `path` as [data] and close it (for test_log_of). */
static void open_close(void *path) {
  opened o;
  EXPECT_OK(open_tokens(&o, path, ""));
  close_source(&o);
}

/* Three shards of 41, 30 and 9 tokens: 5 + 3 + 1 windows of 8 (+1). */
static const char *three_shards(char *dir, size_t cap) {
  folder(dir, cap, "three");
  write_shard(dir, "a_train_000.bin", 1, 41);
  write_shard(dir, "a_train_001.bin", 2, 30);
  write_shard(dir, "a_train_002.bin", 3, 9);
  return dir;
}

/* ------------------------------------------------------------- tests */

static void test_info_and_paths(void **state) {
  char dir[1024], p[4096];
  three_shards(dir, sizeof dir);
  const char *paths[3];
  snprintf(p, sizeof p, "%s/a_train_*.bin", dir);
  paths[0] = dir;
  paths[1] = p;
  char one[4096];
  snprintf(one, sizeof one, "%s/a_train_001.bin", dir);
  paths[2] = one;
  static const int64_t want[] = {9, 9, 3};
  for (int i = 0; i < 3; i++) {
    opened o;
    EXPECT_OK(open_tokens(&o, paths[i], "order = sequential"));
    stoke_sample_info_v1 info;
    EXPECT_OK(o.src->info(o.self, &info));
    assert_int_equal(info.shape.ndim, 1);
    assert_int_equal(info.shape.d[0], 9);
    assert_int_equal(info.dtype, STOKE_I32);
    assert_int_equal(info.classes, 65536);
    assert_int_equal(o.src->length(o.self), want[i]);
    close_source(&o);
  }
}

/* Window w of the three shards in order: shard 1's five, shard 2's three,
 * shard 3's one, each 9 consecutive tokens starting at a multiple of 8. */
static void test_sequential(void **state) {
  char dir[1024];
  opened o;
  EXPECT_OK(open_tokens(&o, three_shards(dir, sizeof dir), "order = sequential"));
  static const int ids[] = {1, 1, 1, 1, 1, 2, 2, 2, 3};
  static const int starts[] = {0, 8, 16, 24, 32, 0, 8, 16, 0};
  for (int w = 0; w < 9; w++) {
    int32_t x[9], label = -1;
    EXPECT_OK(o.src->read(o.self, w, 12345, x, &label));
    assert_int_equal(label, 0);
    for (int i = 0; i < 9; i++) assert_int_equal(x[i], tok(ids[w], starts[w] + i));
  }
  close_source(&o);
  /* length 3 of the 9 windows: spread over the whole set (windows 0, 3 and 6: one of each shard's), not the
   * first three of the first shard */
  EXPECT_OK(open_tokens(&o, dir, "order = sequential\nlength = 3"));
  assert_int_equal(o.src->length(o.self), 3);
  for (int k = 0; k < 3; k++) {
    int32_t x[9], label = -1;
    EXPECT_OK(o.src->read(o.self, k, 12345, x, &label));
    int w = 3 * k;
    for (int i = 0; i < 9; i++) assert_int_equal(x[i], tok(ids[w], starts[w] + i));
  }
  close_source(&o);
}

/* Random windows: the same seed gives the same window on any call, each
 * window is 9 consecutive tokens of one shard, and over many seeds every
 * start of every shard turns up (41 - 8 + 30 - 8 + 9 - 8 = 56 starts). */
static void test_random(void **state) {
  char dir[1024];
  opened o;
  EXPECT_OK(open_tokens(&o, three_shards(dir, sizeof dir), ""));
  int seen[4][64] = {{0}};
  for (uint64_t sd = 0; sd < 4000; sd++) {
    int32_t x[9], y[9], label;
    EXPECT_OK(o.src->read(o.self, (int64_t)(sd % 9), sd * 0x9e3779b97f4a7c15ull, x, &label));
    EXPECT_OK(o.src->read(o.self, (int64_t)((sd + 3) % 9), sd * 0x9e3779b97f4a7c15ull, y, &label));
    assert_memory_equal(x, y, sizeof x);
    int id = x[0] / 10000, at = x[0] % 10000;
    assert_true(id >= 1 && id <= 3);
    for (int i = 0; i < 9; i++) assert_int_equal(x[i], tok(id, at + i));
    seen[id][at] = 1;
  }
  static const int n[] = {0, 41, 30, 9};
  int starts = 0;
  for (int id = 1; id <= 3; id++)
    for (int at = 0; at + 8 < n[id]; at++) {
      if (!seen[id][at]) fail_msg("start %d of shard %d never drawn in 4000 windows", at, id);
      starts++;
    }
  assert_int_equal(starts, 56);
  close_source(&o);
}

/* Through the loader as a run of two ranks reads it: every window of the
 * sequential order once, across both ranks. */
static stoke_err *h_alloc(void *self, size_t n, void **p) {
  *p = stoke_alloc(n);
  return *p ? NULL : stoke_err_new(STOKE_E_OOM, __FILE__, __LINE__, "oom");
}
static void h_free(void *self, void *p) { stoke_free(p); }
static const stoke_backend_v1 host = {.name = "host", .alloc_host = h_alloc, .free_host = h_free};

static void test_ranks(void **state) {
  char dir[1024];
  folder(dir, sizeof dir, "ranks");
  write_shard(dir, "s0.bin", 1, 8 * 16 + 1);
  write_shard(dir, "s1.bin", 2, 8 * 16 + 1);
  opened o;
  EXPECT_OK(open_tokens(&o, dir, "order = sequential"));
  int hits[3][16] = {{0}};
  for (int rank = 0; rank < 2; rank++) {
    stoke_loader_opts lo = {.src = o.src, .src_self = o.self, .dev = &host, .batch = 4, .workers = 2, .prefetch = 2,
                            .shuffle = 0, .drop_last = 1, .seed = 7, .rank = rank, .world = 2};
    stoke_loader *l;
    EXPECT_OK(stoke_loader_new(&lo, &l));
    assert_int_equal(stoke_loader_batches_per_epoch(l), 4);
    for (int b = 0; b < 4; b++) {
      stoke_batch *batch;
      EXPECT_OK(stoke_loader_next(l, &batch, NULL));
      const int32_t *x = batch->x;
      for (int64_t i = 0; i < batch->n; i++) hits[x[i * 9] / 10000][(x[i * 9] % 10000) / 8]++;
      stoke_loader_release(l, batch);
    }
    stoke_loader_free(l);
  }
  for (int id = 1; id <= 2; id++)
    for (int w = 0; w < 16; w++)
      if (hits[id][w] != 1) fail_msg("window %d of shard %d read %d times by the two ranks", w, id, hits[id][w]);
  close_source(&o);
}

/* Damaged and foreign files: an error naming the file and what is wrong. */
static void expect_open_fails(const char *path, stoke_code code, const char *says) {
  opened o;
  stoke_err *e = open_tokens(&o, path, "");
  if (!e) fail_msg("%s opened", path);
  if (e->code != code || !strstr(e->msg, says) || (strchr(path, '/') && !strstr(e->msg, strrchr(path, '/') + 1)))
    fail_msg("%s: code %d, message: %s (wanted \"%s\")", path, e->code, e->msg, says);
  stoke_err_free(e);
  close_source(&o);
}

static void test_bad_files(void **state) {
  char dir[1024], p[4096];
  folder(dir, sizeof dir, "bad");
  write_shard_as(dir, "truncated.bin", 1, 100, 3, STOKE_SHARD_MAGIC, STOKE_SHARD_VERSION);
  write_shard_as(dir, "trailing.bin", 1, 100, -4, STOKE_SHARD_MAGIC, STOKE_SHARD_VERSION);
  write_shard_as(dir, "foreign.bin", 1, 100, 0, 0x464c457f, STOKE_SHARD_VERSION);
  write_shard_as(dir, "llama.bin", 1, 100, 0, STOKE_SHARD_MAGIC, 7);
  write_shard_as(dir, "short.bin", 1, 100, 2 * 100 + 1000, STOKE_SHARD_MAGIC, STOKE_SHARD_VERSION);
  static const struct {
    const char *file, *says;
  } cases[] = {
      {"truncated.bin", "truncated"},       {"trailing.bin", "trailing bytes"},
      {"foreign.bin", "not an llm.c token shard"}, {"llama.bin", "version 7"},
      {"short.bin", "shorter than the 1024-byte header"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, cases[i].file);
    expect_open_fails(p, STOKE_E_DATA, cases[i].says);
  }
  snprintf(p, sizeof p, "%s/nothing_*.bin", dir);
  expect_open_fails(p, STOKE_E_NOT_FOUND, "no file matches");
  /* a negative token count in the header: damaged, not "truncated" with a size from the count's bits */
  unsigned char h[STOKE_SHARD_HEADER_BYTES + 16];
  stoke_shard_header(h, 8);
  for (int i = 0; i < 4; i++) h[8 + i] = (unsigned char)((uint32_t)-5 >> (8 * i));
  int64_t count;
  char why[256];
  assert_int_equal(stoke_shard_parse(h, sizeof h, &count, why, sizeof why), -1);
  if (!strstr(why, "token count is -5: not a count")) fail_msg("%s", why);
  /* a FIFO among the shards: refused by name (its open waited for a writer forever) */
  char fifo[1024];
  folder(fifo, sizeof fifo, "fifo");
  snprintf(p, sizeof p, "%s/s_000000.bin", fifo);
  unlink(p);
  assert_int_equal(mkfifo(p, 0644), 0);
  expect_open_fails(fifo, STOKE_E_DATA, "s_000000.bin' is not a regular file (a FIFO)");
  /* a folder as tools/convert text writes it, training and validation shards together: reading it all would
   * train on the held-out text */
  char mixed[1024];
  folder(mixed, sizeof mixed, "mixed");
  write_shard(mixed, "f_train_000001.bin", 1, 100);
  write_shard(mixed, "f_val_000000.bin", 2, 100);
  expect_open_fails(mixed, STOKE_E_INVALID, "folder '");
  expect_open_fails(mixed, STOKE_E_INVALID, "takes 1 training (*_train_*) and 1 validation (*_val_*) shards");
  /* the same through a glob that takes both */
  char pattern[1100];
  snprintf(pattern, sizeof pattern, "%s/f_*.bin", mixed);
  expect_open_fails(pattern, STOKE_E_INVALID, "the pattern '");
  expect_open_fails(pattern, STOKE_E_INVALID, "takes 1 training (*_train_*) and 1 validation (*_val_*) shards");
  /* [data] on the validation shards alone: it opens, said */
  snprintf(pattern, sizeof pattern, "%s/f_val_*.bin", mixed);
  char *log = test_log_of(open_close, pattern);
  if (!strstr(log, "reads 1 validation shard (*_val_*) only: the held-out text trains the model"))
    fail_msg("not said: %s", log);
  free(log);
  /* too short for one window: skipped with a warning, none left is an error */
  char tiny[1024];
  folder(tiny, sizeof tiny, "tiny");
  write_shard(tiny, "t.bin", 1, 8);
  opened o;
  stoke_err *e = open_tokens(&o, tiny, "");
  assert_non_null(e);
  assert_true(strstr(e->msg, "no shard holds a window") != NULL);
  stoke_err_free(e);
  close_source(&o);
  /* a token id past the vocabulary: a data error naming the shard and position */
  char big[1024];
  folder(big, sizeof big, "big");
  write_shard(big, "ids.bin", 3, 20); /* ids 30000..30019 */
  EXPECT_OK(open_source_from(&o, PLUGIN, "tokens",
                             (snprintf(p, sizeof p, "path = %s\nseq_len = 8\nvocab = 30005\norder = sequential\n", big), p)));
  int32_t x[9], label;
  e = o.src->read(o.self, 0, 1, x, &label);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_DATA);
  if (!strstr(e->msg, "ids.bin") || !strstr(e->msg, "token 30005 at position 5")) fail_msg("message: %s", e->msg);
  stoke_err_free(e);
  close_source(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_info_and_paths), cmocka_unit_test(test_sequential), cmocka_unit_test(test_random),
      cmocka_unit_test(test_ranks),          cmocka_unit_test(test_bad_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
