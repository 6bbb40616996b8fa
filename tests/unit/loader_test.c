/* tests/unit/loader_test.c: the loader engine with a source that writes each
 * sample's index: the same seed gives the same batches with 1 and with 4
 * workers, every sample is seen exactly once per epoch across the shards of
 * several ranks, epochs roll over and reshuffle, a bad sample is replaced
 * and counted (or, for evaluation, left out and marked, never duplicated),
 * a cancel flag ends a wait for a batch that does not come, the hand-off
 * (stoke_loader_feed) delivers what next() would, and (run under
 * ThreadSanitizer by tools/test.sh) the ring never hands out a buffer still
 * being filled. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stoke/core.h"
#include "stoke/loader.h"
#include "stoke/rng.h"

#define LEN 1000
#define FEAT 16

/* Sample i: FEAT int32 values i, i+1, ... and a few derived from the
 * augmentation seed, so a half-written sample or a wrong seed shows. */
static stoke_err *idx_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  int *bad = self; /* 1: every 97th sample unreadable; 2: labels 1 to 10 of 10 classes */
  if (bad && *bad == 1 && index % 97 == 13)
    return stoke_err_new(STOKE_E_DATA, __FILE__, __LINE__, "sample %lld is bad", (long long)index);
  int32_t *x = dst;
  for (int i = 0; i < FEAT - 1; i++) x[i] = (int32_t)index + i;
  x[FEAT - 1] = (int32_t)(seed & 0x7fffffff);
  *label = (int32_t)(index % 10) + (bad && *bad == 2);
  return NULL;
}
static int64_t idx_length(void *self) { return LEN; }
static stoke_err *idx_info(void *self, stoke_sample_info_v1 *o) {
  memset(o, 0, sizeof *o);
  o->shape = (stoke_shape){1, {FEAT}};
  o->dtype = STOKE_I32;
  o->classes = 10;
  return NULL;
}
static const stoke_source_v1 idx_source = {STOKE_ABI(stoke_source_v1), "index", "", NULL, 0, NULL, NULL, idx_length, idx_info, idx_read};

/* Plain host memory stands in for pinned buffers. */
static stoke_err *h_alloc(void *self, size_t n, void **p) {
  *p = stoke_alloc(n);
  return *p ? NULL : stoke_err_new(STOKE_E_OOM, __FILE__, __LINE__, "oom");
}
static void h_free(void *self, void *p) { stoke_free(p); }
static const stoke_backend_v1 host = {.name = "host", .alloc_host = h_alloc, .free_host = h_free};

/* A device without a copy stream, as the cpu backend: the hand-off's
 * synchronous path (tests/gpu/loader_feed_test checks the staged one). */
static stoke_err *h_copy(void *self, void *dst, const void *src, size_t n, stoke_copy_kind kind, void *stream) {
  memcpy(dst, src, n);
  return NULL;
}
static const stoke_backend_v1 host_dev = {.name = "host", .alloc_host = h_alloc, .free_host = h_free, .copy = h_copy};

static stoke_loader *open_loader(int workers, int prefetch, int rank, int world, int64_t batch, void *bad) {
  /* 11 bad samples in 1000: more than the default 1% would stop the loader */
  stoke_loader_opts o = {&idx_source, bad, &host, NULL, batch, workers, prefetch, 1, 1, 42, rank, world, 0, NULL, 0, 0.02};
  stoke_loader *l;
  stoke_err *e = stoke_loader_new(&o, &l);
  if (e) fail_msg("%s", e->msg);
  return l;
}

/* Every sample of a batch must be whole: x[i] = index + i. */
static void check_batch(const stoke_batch *b) {
  for (int64_t s = 0; s < b->n; s++) {
    const int32_t *x = (const int32_t *)b->x + s * FEAT;
    for (int i = 1; i < FEAT - 1; i++)
      if (x[i] != x[0] + i) fail_msg("sample %lld of batch %lld is torn", (long long)s, (long long)b->index);
    assert_int_equal(b->labels[s], x[0] % 10);
  }
}

static void test_same_batches_any_worker_count(void **state) {
  stoke_loader *a = open_loader(1, 2, 0, 1, 32, NULL), *b = open_loader(4, 6, 0, 1, 32, NULL);
  for (int k = 0; k < 100; k++) { /* more than 3 epochs of 31 batches */
    stoke_batch *x, *y;
    assert_null(stoke_loader_next(a, &x, NULL));
    assert_null(stoke_loader_next(b, &y, NULL));
    check_batch(x);
    assert_int_equal(x->n, y->n);
    assert_int_equal(x->epoch, y->epoch);
    assert_memory_equal(x->x, y->x, (size_t)x->n * FEAT * sizeof(int32_t));
    stoke_loader_release(a, x);
    stoke_loader_release(b, y);
  }
  stoke_loader_free(a);
  stoke_loader_free(b);
}

static void test_shards_cover_each_sample_once(void **state) {
  const int world = 3;
  int seen[LEN];
  for (int epoch = 0; epoch < 2; epoch++) {
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < world; r++) {
      stoke_loader *l = open_loader(3, 4, r, world, 10, NULL);
      int64_t per = stoke_loader_batches_per_epoch(l);
      assert_int_equal(per, LEN / world / 10);
      for (int64_t k = 0; k < per * (epoch + 1); k++) {
        stoke_batch *b;
        assert_null(stoke_loader_next(l, &b, NULL));
        check_batch(b);
        if (b->epoch == epoch)
          for (int64_t s = 0; s < b->n; s++) seen[((const int32_t *)b->x)[s * FEAT]]++;
        stoke_loader_release(l, b);
      }
      stoke_loader_free(l);
    }
    /* 1000 samples, 3 shards of 333: one sample is left out each epoch */
    int once = 0, never = 0;
    for (int i = 0; i < LEN; i++) {
      if (seen[i] > 1) fail_msg("sample %d seen %d times in epoch %d", i, seen[i], epoch);
      once += seen[i] == 1;
      never += seen[i] == 0;
    }
    assert_int_equal(once, 990); /* 3 ranks x 33 batches x 10 */
    assert_int_equal(never, 10);
  }
}

/* Evaluation's loader (drop_last = 0, not shuffled, as run_open_stream
 * opens [eval_data]): the shards are uneven so that every sample is scored
 * exactly once across the ranks; 1000 samples over 3 ranks: 334, 333, 333,
 * each rank's last batch short. (Equal shards dropped up to world - 1.) */
static void test_eval_shards_score_every_sample(void **state) {
  const int world = 3;
  int seen[LEN];
  memset(seen, 0, sizeof seen);
  int64_t rows = 0;
  for (int r = 0; r < world; r++) {
    stoke_loader_opts o = {&idx_source, NULL, &host, NULL, 10, 2, 3, 0, 0, 42, r, world, 0, NULL, 1, 0};
    stoke_loader *l;
    stoke_err *e = stoke_loader_new(&o, &l);
    if (e) fail_msg("%s", e->msg);
    int64_t per = stoke_loader_batches_per_epoch(l), mine = (LEN - r + world - 1) / world;
    assert_int_equal(per, (mine + 9) / 10);
    for (int64_t k = 0; k < per; k++) {
      stoke_batch *b;
      assert_null(stoke_loader_next(l, &b, NULL));
      check_batch(b);
      assert_int_equal(b->n, k + 1 < per ? 10 : mine - 10 * (per - 1));
      for (int64_t s = 0; s < b->n; s++) {
        int32_t i = ((const int32_t *)b->x)[s * FEAT];
        assert_int_equal(i % world, r);
        seen[i]++;
      }
      rows += b->n;
      stoke_loader_release(l, b);
    }
    stoke_loader_free(l);
  }
  assert_int_equal(rows, LEN);
  for (int i = 0; i < LEN; i++)
    if (seen[i] != 1) fail_msg("sample %d scored %d times", i, seen[i]);
  /* more ranks than samples: every rank refuses alike (rank 0 had one, so only the others stopped, and rank 0
   * went on into collectives they never joined) */
  for (int r = 0; r < 2; r++) {
    stoke_loader_opts o = {&idx_source, NULL, &host, NULL, 10, 1, 1, 0, 0, 42, r, 1001, 0, NULL, 1, 0};
    stoke_loader *l = NULL;
    stoke_err *e = stoke_loader_new(&o, &l);
    if (!e) fail_msg("rank %d of 1001 over %d samples opened its loader", r, LEN);
    assert_non_null(strstr(e->msg, "fewer than one a rank"));
    stoke_err_free(e);
  }
}

static void test_epochs_reshuffle(void **state) {
  stoke_loader *l = open_loader(2, 3, 0, 1, 100, NULL);
  int32_t first[2] = {-1, -1};
  for (int k = 0; k < 20; k++) { /* two epochs of 10 batches */
    stoke_batch *b;
    assert_null(stoke_loader_next(l, &b, NULL));
    const int32_t *x = b->x;
    if (b->index == 0) first[b->epoch] = x[0];
    /* the augmentation seed depends on (seed, epoch, index) */
    assert_int_equal(x[FEAT - 1], (int32_t)(stoke_hash3(42, (uint64_t)b->epoch, (uint64_t)x[0]) & 0x7fffffff));
    stoke_loader_release(l, b);
  }
  assert_true(first[0] >= 0 && first[1] >= 0);
  assert_true(first[0] != first[1]); /* a new order each epoch (1 in 1000 to collide) */
  stoke_loader_free(l);
}

static void test_bad_samples_replaced_and_counted(void **state) {
  int bad = 1;
  stoke_loader *l = open_loader(4, 4, 0, 1, 50, &bad);
  int64_t n = 0;
  for (int k = 0; k < 20; k++) { /* one epoch: 1000 samples, 11 bad ones */
    stoke_batch *b;
    assert_null(stoke_loader_next(l, &b, NULL));
    check_batch(b);
    for (int64_t s = 0; s < b->n; s++) assert_true(((int32_t *)b->x)[s * FEAT] % 97 != 13);
    n += b->n;
    stoke_loader_release(l, b);
  }
  assert_int_equal(n, LEN);
  /* 11 bad samples in the epoch; workers may already be into the next one */
  assert_true(stoke_loader_skipped(l) >= 11);
  stoke_loader_free(l);
}

/* Fail fast (issue 18): labels off by one make every tenth sample's label
 * 10 of 10 classes; the loader stops within the first batches with the
 * skips by reason, the label error named as one, instead of training on
 * what is left. Below the limit the skips are counted by reason. */
static void test_systematic_bad_data_stops(void **state) {
  int shifted = 2;
  stoke_loader_opts o = {&idx_source, &shifted, &host, NULL, 50, 2, 2, 1, 1, 42, 0, 1, 0, NULL, 0, 0};
  stoke_loader *l;
  if (stoke_loader_new(&o, &l)) fail();
  stoke_err *e = NULL;
  for (int k = 0; k < 20 && !e; k++) {
    stoke_batch *b;
    e = stoke_loader_next(l, &b, NULL);
    if (b) stoke_loader_release(l, b);
  }
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_DATA);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "source 'index'"));
  assert_non_null(strstr(e->msg, "more than 1% of the first 1000"));
  assert_non_null(strstr(e->msg, "x label error: label 10 outside [0, 10)"));
  assert_non_null(strstr(e->msg, "the source says classes = 10, so labels count 0 to 9"));
  stoke_err_free(e);
  stoke_loader_free(l);

  int bad = 1; /* 11 in 1000 under a 2% limit: replaced and counted */
  l = open_loader(2, 2, 0, 1, 100, &bad);
  for (int k = 0; k < 10; k++) {
    stoke_batch *b;
    assert_null(stoke_loader_next(l, &b, NULL));
    stoke_loader_release(l, b);
  }
  char why[1024];
  assert_true(stoke_loader_skip_reasons(l, why, sizeof why) >= 11);
  assert_non_null(strstr(why, "x source error, e.g. sample "));
  stoke_loader_free(l);
}

/* Over three epochs the same 11 bad samples come up again and again: each
 * is counted once among the bad ones, and the log names the first three of
 * their reason once each, then says once that more are counted (a flood
 * of a line a sample was what a data fault of every sample gave). */
static void test_bad_samples_warned_once(void **state) {
  int bad = 1;
  FILE *log = tmpfile();
  assert_non_null(log);
  stoke_log_set_file(log);
  stoke_loader *l = open_loader(4, 4, 0, 1, 50, &bad);
  for (int k = 0; k < 60; k++) { /* three epochs */
    stoke_batch *b;
    assert_null(stoke_loader_next(l, &b, NULL));
    stoke_loader_release(l, b);
  }
  assert_true(stoke_loader_skipped(l) >= 33);
  assert_int_equal(stoke_loader_bad_samples(l), 11);
  stoke_loader_free(l);
  stoke_log_set_file(NULL);
  rewind(log);
  char line[1024];
  int warned = 0, more = 0;
  while (fgets(line, sizeof line, log)) {
    warned += strstr(line, "skipping sample") != NULL;
    more += strstr(line, "more samples are skipped for the same reason") != NULL;
  }
  fclose(log);
  assert_int_equal(warned, 3);
  assert_int_equal(more, 1);
}

/* Evaluation (skip_bad): an unreadable sample is a zeroed row with label
 * -1, and no other sample stands in for it: each index once per epoch. */
static void test_eval_skips_bad_samples(void **state) {
  int bad = 1;
  stoke_loader_opts o = {&idx_source, &bad, &host, NULL, 64, 3, 2, 0, 0, 42, 0, 1, 0, NULL, 1, 0.02};
  stoke_loader *l;
  if (stoke_loader_new(&o, &l)) fail();
  int seen[LEN] = {0}, marked = 0, good = 0;
  for (int64_t k = 0; k < stoke_loader_batches_per_epoch(l); k++) {
    stoke_batch *b;
    assert_null(stoke_loader_next(l, &b, NULL));
    for (int64_t r = 0; r < b->n; r++) {
      const int32_t *x = (const int32_t *)b->x + r * FEAT;
      if (b->labels[r] < 0) {
        for (int i = 0; i < FEAT; i++) assert_int_equal(x[i], 0);
        marked++;
        continue;
      }
      assert_true(x[0] >= 0 && x[0] < LEN);
      assert_int_equal(seen[x[0]]++, 0); /* never twice */
      assert_true(x[0] % 97 != 13);
      good++;
    }
    stoke_loader_release(l, b);
  }
  assert_int_equal(marked, 11); /* 13, 110, ..., 983 */
  assert_int_equal(good, LEN - 11);
  stoke_loader_free(l);
}

/* A source that takes "forever": a read waits until `released`. */
static int released;
static stoke_err *slow_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  while (!__atomic_load_n(&released, __ATOMIC_ACQUIRE)) usleep(1000);
  return idx_read(NULL, index, seed, dst, label);
}
static const stoke_source_v1 slow_source = {STOKE_ABI(stoke_source_v1), "slow", "", NULL, 0, NULL, NULL, idx_length, idx_info, slow_read};

/* With a cancel flag (a signal handler's), a wait for a batch ends when the
 * flag is set: STOKE_E_INTERRUPTED, no batch. */
static void test_cancel_ends_a_wait(void **state) {
  static volatile sig_atomic_t cancel;
  cancel = 0;
  __atomic_store_n(&released, 0, __ATOMIC_RELEASE);
  stoke_loader_opts o = {&slow_source, NULL, &host, NULL, 8, 2, 2, 0, 0, 42, 0, 1, 0, &cancel, 0};
  stoke_loader *l;
  if (stoke_loader_new(&o, &l)) fail();
  cancel = 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  stoke_batch *b = (stoke_batch *)&o; /* must come back NULL */
  stoke_err *e = stoke_loader_next(l, &b, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  assert_non_null(e);
  assert_int_equal(e->code, STOKE_E_INTERRUPTED);
  assert_null(b);
  stoke_err_free(e);
  assert_true((t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 5);
  __atomic_store_n(&released, 1, __ATOMIC_RELEASE); /* the workers finish, free joins them */
  stoke_loader_free(l);
}

/* stoke_loader_feed hands over, into "device" buffers, the samples,
 * labels and place of the batches a host loader with the same seed gives,
 * a last partial batch of each epoch included (drop_last = 0). */
static void test_feed_matches_next(void **state) {
  stoke_loader_opts o = {&idx_source, NULL, &host_dev, NULL, 64, 3, 2, 1, 0, 7, 0, 1, 0, NULL, 0};
  o.feed = 1;
  stoke_loader *fed_l, *next_l;
  assert_null(stoke_loader_new(&o, &fed_l));
  o.feed = 0;
  assert_null(stoke_loader_new(&o, &next_l));
  int32_t x[64 * FEAT], y[64], host_y[64];
  int64_t partial = 0;
  for (int k = 0; k < 3 * 16; k++) { /* 3 epochs of 15 whole batches and one of 40 */
    memset(x, 0xff, sizeof x), memset(y, 0xff, sizeof y);
    stoke_fed f;
    double wait = -1;
    stoke_batch *b;
    assert_null(stoke_loader_feed(fed_l, x, y, host_y, &f, &wait));
    assert_null(stoke_loader_next(next_l, &b, NULL));
    assert_true(wait >= 0);
    assert_int_equal(f.n, b->n);
    assert_int_equal(f.epoch, b->epoch);
    assert_int_equal(f.index, b->index);
    partial += b->n < 64;
    assert_memory_equal(x, b->x, sizeof(int32_t) * FEAT * (size_t)b->n);
    assert_memory_equal(y, b->labels, sizeof(int32_t) * (size_t)b->n);
    assert_memory_equal(host_y, b->labels, sizeof(int32_t) * (size_t)b->n);
    stoke_loader_release(next_l, b);
  }
  assert_int_equal(partial, 3);
  stoke_loader_free(fed_l);
  stoke_loader_free(next_l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_batches_any_worker_count),
      cmocka_unit_test(test_shards_cover_each_sample_once),
      cmocka_unit_test(test_eval_shards_score_every_sample),
      cmocka_unit_test(test_epochs_reshuffle),
      cmocka_unit_test(test_bad_samples_replaced_and_counted),
      cmocka_unit_test(test_bad_samples_warned_once),
      cmocka_unit_test(test_eval_skips_bad_samples),
      cmocka_unit_test(test_systematic_bad_data_stops),
      cmocka_unit_test(test_cancel_ends_a_wait),
      cmocka_unit_test(test_feed_matches_next),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
