/* stoke/loader.h: the loader engine: persistent worker threads fill a ring
 * of K pinned batch buffers from a source, in a seeded shuffled order; the
 * training loop has each batch handed to the device (stoke_loader_feed:
 * the loader's copy stream, staging buffer and hand-off event, as Caffe's
 * prefetching data layer), or takes host batches and gives them back. */
#ifndef STOKE_LOADER_H
#define STOKE_LOADER_H

#include <signal.h>

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_loader stoke_loader;

typedef struct stoke_loader_opts {
  const stoke_source_v1 *src;
  void *src_self;
  const stoke_backend_v1 *dev; /* allocates the pinned batch buffers */
  void *dev_self;
  int64_t batch;
  int workers;      /* >= 1 */
  int prefetch;     /* K: batches in the ring, >= 1 */
  int shuffle;
  int drop_last;
  uint64_t seed;
  int rank, world;  /* shard: rank takes every world-th sample (drop_last: equal shards, the
                     * remainder dropped; else the first total % world ranks one more) */
  int64_t start_batch; /* resume: the first batch to deliver (counted across epochs) */
  /* a flag (set by a signal handler) that makes stoke_loader_next stop
   * waiting: it returns STOKE_E_INTERRUPTED with *b = NULL; NULL: none */
  const volatile sig_atomic_t *cancel;
  /* evaluation: an unreadable sample leaves its row zeroed with label -1
   * instead of being replaced by the next one (0: replaced, for training) */
  int skip_bad;
  /* Fail fast: when more than this fraction of the first 1000 samples read
   * is skipped (unreadable, or a label outside [0, classes)), the loader
   * stops with the counts by reason: the data or the source is wrong
   * throughout. 0: 0.01. Not for evaluation (skip_bad): it reports the
   * samples it scored. */
  double max_skipped;
  /* 1: batches go to the device through stoke_loader_feed; on a device
   * with a copy stream the loader allocates its staging buffer (a batch)
   * and events at start */
  int feed;
} stoke_loader_opts;

typedef struct stoke_batch {
  void *x;           /* batch x sample bytes, host (pinned) */
  int32_t *labels;   /* batch labels */
  int64_t n;         /* samples in this batch (< batch only when !drop_last) */
  int64_t epoch, index; /* index within the epoch */
  int slot;
} stoke_batch;

stoke_err *stoke_loader_new(const stoke_loader_opts *o, stoke_loader **out);
/* Stops the workers and frees the ring. */
void stoke_loader_free(stoke_loader *l);
/* The next batch in order (blocks until filled, or until opts.cancel is
 * set: then *b is NULL). *wait_s gets the time it blocked: the data-wait
 * metric. A sample the source cannot read (STOKE_E_DATA) or that has a
 * label outside [0, classes) is counted by reason and replaced by the next
 * index (or marked, with skip_bad); past opts.max_skipped it is an error.
 * On any error *b is still the batch, to be released. */
stoke_err *stoke_loader_next(stoke_loader *l, stoke_batch **b, double *wait_s);
/* Give the batch's buffer back to the workers. */
void stoke_loader_release(stoke_loader *l, stoke_batch *b);

/* What stoke_loader_feed handed over. */
typedef struct stoke_fed {
  int64_t n;            /* samples (< batch only when !drop_last) */
  int64_t epoch, index; /* index within the epoch */
} stoke_fed;

/* The next batch in order (opts.feed), handed to the device: its samples
 * into x (batch x sample bytes) and its labels into `labels` (int32), both
 * device memory, in order on the compute stream, so the kernels issued
 * after this call read it; host_labels (may be NULL) gets a host copy of
 * the labels. On a device with a copy stream the pinned slot is copied on
 * that stream into the loader's staging buffer, the compute stream waits
 * for the copy's event and moves the batch into x and labels: the host
 * never waits for this batch's copy (the slot goes back to the workers at
 * the next feed, when the copy, issued a step earlier, is done). Without
 * one (the CPU) the copy is synchronous. Waiting, cancel and unreadable
 * samples as stoke_loader_next; *wait_s: the time blocked waiting for the
 * workers. Use either this or next/release on one loader. */
stoke_err *stoke_loader_feed(stoke_loader *l, void *x, void *labels, int32_t *host_labels, stoke_fed *fed,
                             double *wait_s);
/* The trace's copy lane: with `on`, the next feeds time their copy on the
 * copy stream (and wait for it, as a traced step waits for the device);
 * stoke_loader_copy_ms: the last feed's copy in ms (NaN: not timed). */
void stoke_loader_time_copy(stoke_loader *l, int on);
double stoke_loader_copy_ms(const stoke_loader *l);
int64_t stoke_loader_batches_per_epoch(const stoke_loader *l);
size_t stoke_loader_sample_bytes(const stoke_loader *l);
/* A hook each worker calls after filling samples [from, to) of batch
 * `number` (counted across epochs) between t0 and t1 (CLOCK_MONOTONIC
 * seconds): the trace's loader lanes. NULL: none. */
typedef void (*stoke_fill_hook)(void *ctx, int worker, int64_t number, int64_t from, int64_t to, double t0,
                                double t1);
void stoke_loader_on_fill(stoke_loader *l, stoke_fill_hook hook, void *ctx);
/* Samples skipped so far because the source could not read them. */
int64_t stoke_loader_skipped(const stoke_loader *l);
/* The distinct samples among them (each warned about once per run). */
int64_t stoke_loader_bad_samples(const stoke_loader *l);
/* The same count, and in `buf` one line per reason ("\n    6 x label
 * error: label 2 outside [0, 2) (e.g. sample 3 ...)"). */
int64_t stoke_loader_skip_reasons(const stoke_loader *l, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
