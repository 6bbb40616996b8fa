/* tests/gpu/loader_feed_test.c: the loader's hand-off to the GPU
 * (stoke_loader_feed: the pinned slot copied on the copy stream into the
 * loader's staging buffer, the compute stream waiting on the copy's event,
 * the slot going back to the workers one feed later) delivers, on the
 * compute stream, exactly the bytes and labels a host-only loader with the
 * same seed hands out: every batch, partial last batches included, with
 * two batches in flight before either is read back, the device buffers
 * poisoned before each feed. Runs only on a GPU machine. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"
#include "stoke/loader.h"

#define LEN 1000
#define FEAT 48 /* bytes per sample */
#define BATCH 64

/* Sample i: bytes from i and the augmentation seed, so a sample of the
 * wrong index, epoch or seed shows. */
static stoke_err *idx_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  uint8_t *x = dst;
  for (int i = 0; i < FEAT; i++) x[i] = (uint8_t)(index * 7 + i + (seed >> (i % 56)));
  *label = (int32_t)(index % 10);
  return NULL;
}
static int64_t idx_length(void *self) { return LEN; }
static stoke_err *idx_info(void *self, stoke_sample_info_v1 *o) {
  memset(o, 0, sizeof *o);
  o->shape = (stoke_shape){1, {FEAT}};
  o->dtype = STOKE_U8;
  o->classes = 10;
  return NULL;
}
static const stoke_source_v1 idx_source = {STOKE_ABI(stoke_source_v1), "index", "", NULL, 0, NULL, NULL,
                                           idx_length, idx_info, idx_read};

static stoke_loader *open_loader(int feed, uint64_t seed) {
  stoke_loader_opts o = {&idx_source, NULL, g_dev, g_dev_self, BATCH, 3, 2, 1, 0, seed, 0, 1, 0, NULL, 0};
  o.feed = feed;
  stoke_loader *l = NULL;
  stoke_err *e = stoke_loader_new(&o, &l);
  if (e) fail_msg("%s", e->msg);
  return l;
}

static void ok(stoke_err *e) {
  if (e) fail_msg("%s", e->msg);
}

/* Batches fed into two alternating device buffer pairs, read back two at
 * a time, against the host loader's. 3 epochs: 16 batches each, the last
 * of 40 samples (drop_last = 0). */
static void test_feed_matches_host(void **state) {
  stoke_loader *fed_l = open_loader(1, g_seed), *host_l = open_loader(0, g_seed);
  void *x[2], *y[2];
  for (int i = 0; i < 2; i++) {
    ok(g_dev->alloc(g_dev_self, FEAT * BATCH, &x[i]));
    ok(g_dev->alloc(g_dev_self, sizeof(int32_t) * BATCH, &y[i]));
  }
  uint8_t got_x[FEAT * BATCH];
  int32_t got_y[BATCH], host_y[BATCH];
  stoke_fed fed[2];
  int64_t batches = 3 * stoke_loader_batches_per_epoch(host_l), partial = 0;
  for (int64_t k = 0; k < batches; k++) {
    int j = (int)(k % 2);
    ok(g_dev->fill(g_dev_self, x[j], 0xff, FEAT * BATCH, NULL));
    ok(g_dev->fill(g_dev_self, y[j], 0xff, sizeof(int32_t) * BATCH, NULL));
    double wait = -1;
    ok(stoke_loader_feed(fed_l, x[j], y[j], host_y, &fed[j], &wait));
    assert_true(wait >= 0);
    if (j == 0 && k + 1 < batches) continue; /* two in flight before reading */
    for (int i = 0; i <= j; i++) {
      stoke_batch *b;
      ok(stoke_loader_next(host_l, &b, NULL));
      assert_int_equal(fed[i].n, b->n);
      assert_int_equal(fed[i].epoch, b->epoch);
      assert_int_equal(fed[i].index, b->index);
      partial += b->n < BATCH;
      ok(g_dev->copy(g_dev_self, got_x, x[i], FEAT * (size_t)b->n, STOKE_COPY_D2H, NULL));
      ok(g_dev->copy(g_dev_self, got_y, y[i], sizeof(int32_t) * (size_t)b->n, STOKE_COPY_D2H, NULL));
      if (memcmp(got_x, b->x, FEAT * (size_t)b->n))
        fail_msg("batch %lld (buffer %d): the device's samples differ from the host loader's", (long long)b->index, i);
      if (memcmp(got_y, b->labels, sizeof(int32_t) * (size_t)b->n))
        fail_msg("batch %lld: the device's labels differ", (long long)b->index);
      if (i == j && memcmp(host_y, b->labels, sizeof(int32_t) * (size_t)b->n))
        fail_msg("batch %lld: the host copy of the labels differs", (long long)b->index);
      stoke_loader_release(host_l, b);
    }
  }
  assert_int_equal(partial, 3);
  for (int i = 0; i < 2; i++) {
    g_dev->free(g_dev_self, x[i]);
    g_dev->free(g_dev_self, y[i]);
  }
  stoke_loader_free(fed_l); /* waits for its last copy before freeing the slot */
  stoke_loader_free(host_l);
}

static int setup(void **state) {
  static const char *const engines[] = {"cuda"};
  return g_setup_engines(engines, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_feed_matches_host),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
