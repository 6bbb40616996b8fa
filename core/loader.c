/* core/loader.c: the loader engine. Batch b (counted across epochs) goes
 * into ring slot b % K, split into chunks of samples that any worker may
 * claim, so all workers keep busy however deep the ring is; the consumer
 * takes batches strictly in order, so results do not depend on the worker
 * count. Sample order: a Fisher-Yates shuffle seeded by (seed, epoch).
 * stoke_loader_feed hands each batch to the device: the loader owns the
 * copy stream's use, a device staging buffer and the hand-off events. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke/core.h"
#include "stoke/loader.h"
#include "nvtx.h"
#include "stoke/rng.h"

typedef enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_FULL, SLOT_TAKEN } slot_state;

/* Skips of one kind: grouped by the message with its numbers blanked
 * ("sample # is bad"), shown as its title ("label error: label 2 outside
 * [0, 2)", or "source error") and the first example in full. */
#define MAX_REASONS 8
typedef struct skip_reason {
  char key[128];
  char title[128];
  char example[256];
  int64_t n;       /* skips (a sample drawn again counts again) */
  int64_t samples; /* distinct samples, of which the first few are named in the log */
} skip_reason;

/* Samples named one by one per reason; past them, one line says the rest are counted. */
#define SKIPS_NAMED 3

/* The fail-fast rule's defaults: more than 1% of the first 1000 reads. */
#define SKIP_WINDOW 1000
#define SKIP_FRACTION 0.01

typedef struct slot {
  stoke_batch b;
  slot_state state;
  int64_t number;   /* global batch number it holds */
  int remaining;    /* chunks not yet filled */
  stoke_err *err;   /* the first error of any chunk */
} slot;

struct stoke_loader {
  stoke_loader_opts o;
  stoke_sample_info_v1 info;
  size_t sample_bytes;
  int64_t shard_len, per_epoch, classes;
  slot *slots;
  pthread_t *threads;
  int n_threads;
  pthread_mutex_t mu;
  pthread_cond_t cv_free, cv_full;
  int64_t next_claim, next_take; /* next_claim counts chunks: batch x chunks + chunk */
  int chunks;                     /* per batch */
  int64_t chunk_size;
  int stop;
  /* unreadable samples (guarded by mu): every read tried, those skipped,
   * and the skips grouped by reason */
  int64_t attempts, skipped;
  skip_reason reasons[MAX_REASONS];
  int n_reasons;
  int64_t other_reasons; /* skips past the table's room */
  /* the samples found unreadable (guarded by mu): a set of index + 1, open
   * addressing, so each is warned about once per run */
  int64_t *bad, n_bad, cap_bad;
  /* the sample orders of two epochs (guarded by mu): epoch e in slot e % 2,
   * so the workers filling the last batches of one epoch and the first of
   * the next do not shuffle the data set again and again; `shuf` is the
   * whole data set's order, the shuffle's scratch (allocated with the
   * loader: an epoch never starts unshuffled for want of memory) */
  int64_t *perm[2];
  int64_t perm_epoch[2];
  int64_t *shuf;
  /* the hand-off (consumer thread only): the device staging buffer
   * (samples, then labels at stage_x), the copy's event, the event after
   * which the staging buffer is free again, and the slot whose copy may
   * still be running (it goes back to the workers at the next feed) */
  void *stage;
  size_t stage_x;
  void *ev_copy, *ev_used;
  int used_pending;
  stoke_batch *held;
  /* the trace's copy lane: time the next copies (the feed then waits for
   * them, as a traced step waits for the device) */
  void *ev_copy0;
  int time_copy;
  double copy_ms;
  /* stoke_loader_on_fill's hook (guarded by mu) and the workers' numbers */
  stoke_fill_hook hook;
  void *hook_ctx;
  int n_started;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The shard's sample order for an epoch. Called with mu held. */
static const int64_t *make_perm(stoke_loader *l, int64_t epoch) {
  int64_t *perm = l->perm[epoch % 2];
  if (l->perm_epoch[epoch % 2] == epoch) return perm;
  int64_t n = l->shard_len;
  for (int64_t i = 0; i < n; i++) perm[i] = i * l->o.world + l->o.rank;
  if (l->o.shuffle) {
    /* shuffle the whole data set, then take this rank's share: every
     * sample once per epoch across ranks */
    int64_t total = l->o.src->length(l->o.src_self), *all = l->shuf;
    stoke_rng r = stoke_rng_seed(stoke_hash3(l->o.seed, (uint64_t)epoch, 0x5f0ff1eull));
    for (int64_t i = 0; i < total; i++) all[i] = i;
    for (int64_t i = total - 1; i > 0; i--) {
      int64_t j = (int64_t)stoke_rng_below(&r, (uint64_t)(i + 1));
      int64_t t = all[i];
      all[i] = all[j];
      all[j] = t;
    }
    for (int64_t i = 0; i < n; i++) perm[i] = all[i * l->o.world + l->o.rank];
  }
  l->perm_epoch[epoch % 2] = epoch;
  return perm;
}

/* The batch's size (smaller only for the last batch without drop_last). */
static int64_t batch_n(const stoke_loader *l, int64_t number) {
  int64_t first = (number % l->per_epoch) * l->o.batch, n = l->o.batch;
  return first + n > l->shard_len ? l->shard_len - first : n;
}

/* Adds key (> 0) to the open-addressing table t of `cap` slots: 1 when new. */
static int set_add(int64_t *t, int64_t cap, int64_t key) {
  for (int64_t h = (int64_t)(stoke_hash3(0, 0, (uint64_t)key) % (uint64_t)cap);; h = (h + 1) % cap) {
    if (t[h] == key) return 0;
    if (!t[h]) {
      t[h] = key;
      return 1;
    }
  }
}

/* Adds sample k to the set of unreadable ones: 1 when it is new. Called
 * with mu held; out of memory, it says new (a warning too many). */
static int bad_insert(stoke_loader *l, int64_t k) {
  if (2 * (l->n_bad + 1) > l->cap_bad) {
    int64_t cap = l->cap_bad ? 2 * l->cap_bad : 64, *nb = calloc((size_t)cap, sizeof *nb);
    if (!nb) return 1;
    for (int64_t i = 0; i < l->cap_bad; i++)
      if (l->bad[i]) set_add(nb, cap, l->bad[i]);
    free(l->bad);
    l->bad = nb;
    l->cap_bad = cap;
  }
  int added = set_add(l->bad, l->cap_bad, k + 1);
  l->n_bad += added;
  return added;
}

/* `msg` with each run of digits replaced by '#': one key per kind of error. */
static void reason_key(const char *msg, char *key, size_t cap) {
  size_t k = 0;
  for (const char *p = msg; *p && *p != '\n' && k + 1 < cap; p++) {
    if (*p >= '0' && *p <= '9') {
      if (k == 0 || key[k - 1] != '#') key[k++] = '#';
      continue;
    }
    key[k++] = *p;
  }
  key[k] = 0;
}

/* Count a skipped read under its reason. Called with mu held. */
static skip_reason *count_skip(stoke_loader *l, const char *key, const char *title, const char *example) {
  l->skipped++;
  for (int i = 0; i < l->n_reasons; i++)
    if (!strcmp(l->reasons[i].key, key)) {
      l->reasons[i].n++;
      return &l->reasons[i];
    }
  if (l->n_reasons == MAX_REASONS) {
    l->other_reasons++;
    return NULL;
  }
  skip_reason *r = &l->reasons[l->n_reasons++];
  snprintf(r->key, sizeof r->key, "%s", key);
  snprintf(r->title, sizeof r->title, "%s", title);
  snprintf(r->example, sizeof r->example, "%s", example);
  r->n = 1;
  r->samples = 0;
  return r;
}

/* "\n    6 x label error: label 2 outside [0, 2), e.g. sample 3 has ..."
 * a line per reason. Called with mu held. */
static void reasons_text(const stoke_loader *l, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < l->n_reasons && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "\n    %lld x %s, e.g. %s", (long long)l->reasons[i].n,
                             l->reasons[i].title, l->reasons[i].example);
  if (l->other_reasons && used < cap)
    snprintf(buf + used, cap - used, "\n    %lld x other reasons", (long long)l->other_reasons);
}

/* A read that failed with a data error, or gave a label outside [0,
 * classes): counted by reason; an error that stops the loader when the
 * skips pass the fail-fast limit within the first reads (a systematic
 * fault of the source or the data, not a few corrupt files), else NULL. */
static stoke_err *note_skip(stoke_loader *l, int64_t k, const stoke_err *re, int32_t label) {
  char key[128], example[256];
  const char *title = key;
  if (!re) {
    snprintf(key, sizeof key, "label error: label %d outside [0, %lld)", label, (long long)l->classes);
    snprintf(example, sizeof example, "sample %lld has label %d; the source says classes = %lld, so labels count "
             "0 to %lld", (long long)k, label, (long long)l->classes, (long long)l->classes - 1);
  } else {
    reason_key(re->msg, key, sizeof key);
    title = "source error";
    snprintf(example, sizeof example, "sample %lld: %s", (long long)k, re->msg);
  }
  pthread_mutex_lock(&l->mu);
  skip_reason *r = count_skip(l, key, title, example);
  int first = bad_insert(l, k);
  int64_t nth = first && r ? ++r->samples : 0; /* this reason's distinct samples so far */
  int64_t skipped = l->skipped, attempts = l->attempts;
  double frac = l->o.max_skipped > 0 ? l->o.max_skipped : SKIP_FRACTION;
  char why[2048] = "";
  /* evaluation (skip_bad) scores what it can read and says how many */
  int stop = !l->o.skip_bad && attempts <= SKIP_WINDOW && (double)skipped > frac * SKIP_WINDOW;
  if (stop) reasons_text(l, why, sizeof why);
  pthread_mutex_unlock(&l->mu);
  /* the first few samples of a reason by name (each once, skipped every time it is drawn); then one line, so a
   * fault of every sample (a vocabulary too small) is not a flood; the summary counts them all */
  if (first && (!r || nth <= SKIPS_NAMED))
    stoke_log(STOKE_LOG_WARN, "loader", "skipping %s (said once, skipped every time it is drawn)", example);
  else if (first && nth == SKIPS_NAMED + 1)
    stoke_log(STOKE_LOG_WARN, "loader", "more samples are skipped for the same reason (%s): counted, not named one "
              "by one; the summary gives the count", key);
  if (!stop) return NULL;
  return STOKE_ERR(STOKE_E_DATA,
                   "source '%s': %lld of the first %lld samples read were skipped, more than %g%% of the first %d: "
                   "the data or the source is wrong throughout, not a few damaged samples, so the run stops. "
                   "By reason:%s\n  fix the source or the data (labels count from 0), or raise [data] max_skipped",
                   l->o.src->name, (long long)skipped, (long long)attempts, 100 * frac, SKIP_WINDOW, why);
}

/* Fill samples [from, to) of batch `number` into slot s. */
static stoke_err *fill(stoke_loader *l, slot *s, int64_t number, int64_t from, int64_t to) {
  int64_t epoch = number / l->per_epoch, index = number % l->per_epoch;
  int64_t first = index * l->o.batch + from;
  int64_t n = to - from;
  int64_t ids[4096];
  int64_t *idx = n <= 4096 ? ids : malloc(sizeof(int64_t) * (size_t)n);
  if (!idx) return STOKE_ERR(STOKE_E_OOM, "loader: out of memory");
  pthread_mutex_lock(&l->mu);
  memcpy(idx, make_perm(l, epoch) + first, sizeof(int64_t) * (size_t)n);
  pthread_mutex_unlock(&l->mu);
  stoke_err *e = NULL;
  int64_t total = l->o.src->length(l->o.src_self);
  for (int64_t i = 0; i < n && !e; i++) {
    char *dst = (char *)s->b.x + (size_t)(from + i) * l->sample_bytes;
    int64_t k = idx[i];
    for (int tries = 0;; tries++) {
      int32_t label = -1;
      uint64_t seed = stoke_hash3(l->o.seed, (uint64_t)epoch, (uint64_t)k);
      stoke_err *re = l->o.src->read(l->o.src_self, k, seed, dst, &label);
      pthread_mutex_lock(&l->mu);
      l->attempts++;
      pthread_mutex_unlock(&l->mu);
      int bad_label = !re && (label < 0 || label >= l->classes);
      if (!re && !bad_label) {
        s->b.labels[from + i] = label;
        break;
      }
      if (re && re->code != STOKE_E_DATA) {
        e = stoke_err_wrap(re, __FILE__, __LINE__, "reading sample %lld from source '%s'",
                           (long long)k, l->o.src->name);
        break;
      }
      e = note_skip(l, k, re, label);
      stoke_err_free(re);
      if (!e && tries >= 16)
        e = STOKE_ERR(STOKE_E_DATA, "source '%s': 17 samples in a row from %lld on could not be used (see the "
                      "warnings above)", l->o.src->name, (long long)idx[i]);
      if (e) break;
      if (l->o.skip_bad) { /* a hole, never a duplicate */
        memset(dst, 0, l->sample_bytes);
        s->b.labels[from + i] = -1;
        break;
      }
      k = (k + 1) % total; /* replaced by the next sample */
    }
  }
  if (idx != ids) free(idx);
  return e;
}

static void *worker(void *arg) {
  stoke_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  int id = l->n_started++;
  for (;;) {
    /* the next chunk, of a batch within the ring's reach */
    while (!l->stop && l->next_claim / l->chunks >= l->next_take + l->o.prefetch)
      pthread_cond_wait(&l->cv_free, &l->mu);
    if (l->stop) break;
    int64_t item = l->next_claim++, number = item / l->chunks;
    int chunk = (int)(item % l->chunks);
    slot *s = &l->slots[number % l->o.prefetch];
    if (chunk == 0) {
      /* the slot's last batch was released: number < next_take + K */
      while (!l->stop && s->state != SLOT_FREE) pthread_cond_wait(&l->cv_free, &l->mu);
      if (l->stop) break;
      s->state = SLOT_FILLING;
      s->number = number;
      s->remaining = l->chunks;
      s->b.n = batch_n(l, number);
      s->b.epoch = number / l->per_epoch;
      s->b.index = number % l->per_epoch;
      pthread_cond_broadcast(&l->cv_free); /* workers waiting for this batch's set-up */
    } else {
      while (!l->stop && !(s->state == SLOT_FILLING && s->number == number)) pthread_cond_wait(&l->cv_free, &l->mu);
      if (l->stop) break;
    }
    int64_t from = chunk * l->chunk_size, to = from + l->chunk_size;
    if (to > s->b.n) to = s->b.n;
    stoke_fill_hook hook = l->hook;
    void *hook_ctx = l->hook_ctx;
    pthread_mutex_unlock(&l->mu);
    double t0 = hook ? now_s() : 0;
    int nvtx = stoke_nvtx_on(); /* read once: push and pop agree */
    char range[48];
    if (nvtx) {
      snprintf(range, sizeof range, "decode batch %lld", (long long)number);
      nvtxRangePushA(range);
    }
    stoke_err *e = from < to ? fill(l, s, number, from, to) : NULL;
    if (nvtx) nvtxRangePop();
    if (hook) hook(hook_ctx, id, number, from, to, t0, now_s());
    pthread_mutex_lock(&l->mu);
    if (e && !s->err) s->err = e;
    else if (e) stoke_err_free(e);
    if (--s->remaining == 0) {
      s->state = SLOT_FULL;
      pthread_cond_broadcast(&l->cv_full);
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

static stoke_err *stage_open(stoke_loader *l);
static void stage_close(stoke_loader *l);

stoke_err *stoke_loader_new(const stoke_loader_opts *o, stoke_loader **out) {
  if (o->batch < 1 || o->workers < 1 || o->prefetch < 1 || o->world < 1 || o->rank < 0 || o->rank >= o->world)
    return STOKE_ERR(STOKE_E_INVALID, "loader: batch, workers, prefetch must be >= 1 and rank < world");
  stoke_loader *l = calloc(1, sizeof *l);
  if (!l) return STOKE_ERR(STOKE_E_OOM, "loader: out of memory");
  l->o = *o;
  l->perm_epoch[0] = l->perm_epoch[1] = -1;
  /* chunks: enough that every worker has work with the ring's batches in
   * flight, at least 4 samples each */
  int64_t want = (2 * (int64_t)o->workers + o->prefetch - 1) / o->prefetch;
  if (want > o->batch / 4) want = o->batch / 4;
  if (want < 1) want = 1;
  l->chunk_size = (o->batch + want - 1) / want;
  l->chunks = (int)((o->batch + l->chunk_size - 1) / l->chunk_size);
  l->next_take = o->start_batch;
  l->next_claim = o->start_batch * l->chunks;
  stoke_err *e = o->src->info(o->src_self, &l->info);
  if (e) {
    free(l);
    return stoke_err_wrap(e, __FILE__, __LINE__, "asking source '%s' for its sample shape", o->src->name);
  }
  l->classes = l->info.classes;
  l->sample_bytes = (size_t)stoke_numel(&l->info.shape) * stoke_dtype_size(l->info.dtype);
  int64_t total = o->src->length(o->src_self);
  /* Training (drop_last): equal shards, so that every rank runs the same
   * number of steps (each ends in an all-reduce); the remainder is dropped.
   * Evaluation (drop_last = 0): rank r takes samples r, r + world, ...,
   * so that every sample is scored once across the ranks (the first
   * total % world ranks one more each); the ranks share only the sums. */
  l->shard_len = o->drop_last ? total / o->world : (total - o->rank + o->world - 1) / o->world;
  l->per_epoch = o->drop_last ? l->shard_len / o->batch : (l->shard_len + o->batch - 1) / o->batch;
  /* decided alike on every rank (uneven shards: a rank has none exactly when total < world), so that no rank
   * goes on into collectives the failed ones never join */
  if (o->drop_last ? l->per_epoch < 1 : total < o->world) {
    int64_t mine = l->shard_len;
    free(l);
    return STOKE_ERR(STOKE_E_INVALID,
                     "loader: source '%s' has %lld samples (%lld for this rank of %d), fewer than %s",
                     o->src->name, (long long)total, (long long)mine, o->world,
                     o->drop_last ? "one batch a rank; lower batch_size" : "one a rank; use more data or fewer ranks");
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv_free, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the cancel poll's timed waits */
  pthread_cond_init(&l->cv_full, &ca);
  pthread_condattr_destroy(&ca);
  l->perm[0] = malloc(sizeof(int64_t) * (size_t)l->shard_len);
  l->perm[1] = malloc(sizeof(int64_t) * (size_t)l->shard_len);
  l->shuf = o->shuffle ? malloc(sizeof(int64_t) * (size_t)total) : NULL;
  l->slots = calloc((size_t)o->prefetch, sizeof *l->slots);
  l->threads = calloc((size_t)o->workers, sizeof *l->threads);
  if (!l->perm[0] || !l->perm[1] || (o->shuffle && !l->shuf) || !l->slots || !l->threads)
    e = STOKE_ERR(STOKE_E_OOM, "loader: out of memory for %lld samples' order and the batch ring",
                  (long long)total);
  for (int i = 0; i < o->prefetch && !e; i++) {
    slot *s = &l->slots[i];
    s->b.slot = i;
    e = o->dev->alloc_host(o->dev_self, l->sample_bytes * (size_t)o->batch, &s->b.x);
    if (!e) e = o->dev->alloc_host(o->dev_self, sizeof(int32_t) * (size_t)o->batch, (void **)&s->b.labels);
    if (e) e = stoke_err_wrap(e, __FILE__, __LINE__, "allocating %d pinned batch buffers of %zu bytes",
                              o->prefetch, l->sample_bytes * (size_t)o->batch);
  }
  if (!e) e = stage_open(l);
  for (int i = 0; i < o->workers && !e; i++) {
    int rc = pthread_create(&l->threads[i], NULL, worker, l);
    if (rc) e = STOKE_ERR(STOKE_E_INTERNAL, "loader: cannot start worker thread: %s", strerror(rc));
    else l->n_threads++;
  }
  if (e) {
    stoke_loader_free(l);
    return e;
  }
  *out = l;
  return NULL;
}

void stoke_loader_free(stoke_loader *l) {
  if (!l) return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->cv_free);
  pthread_cond_broadcast(&l->cv_full);
  pthread_mutex_unlock(&l->mu);
  for (int i = 0; i < l->n_threads; i++) pthread_join(l->threads[i], NULL);
  stage_close(l);
  if (l->slots)
    for (int i = 0; i < l->o.prefetch; i++) {
      if (l->slots[i].b.x) l->o.dev->free_host(l->o.dev_self, l->slots[i].b.x);
      if (l->slots[i].b.labels) l->o.dev->free_host(l->o.dev_self, l->slots[i].b.labels);
      stoke_err_free(l->slots[i].err);
    }
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv_free);
  pthread_cond_destroy(&l->cv_full);
  free(l->perm[0]);
  free(l->perm[1]);
  free(l->shuf);
  free(l->bad);
  free(l->slots);
  free(l->threads);
  free(l);
}

/* Waits on cv_full; with a cancel flag, in 20 ms slices that look at it. */
static void wait_full(stoke_loader *l) {
  if (!l->o.cancel) {
    pthread_cond_wait(&l->cv_full, &l->mu);
    return;
  }
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_nsec += 20000000;
  if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
  pthread_cond_timedwait(&l->cv_full, &l->mu, &t);
}

stoke_err *stoke_loader_next(stoke_loader *l, stoke_batch **b, double *wait_s) {
  double t0 = now_s();
  *b = NULL;
  pthread_mutex_lock(&l->mu);
  slot *s = &l->slots[l->next_take % l->o.prefetch];
  while (!(s->state == SLOT_FULL && s->number == l->next_take)) {
    if (l->o.cancel && *l->o.cancel) {
      pthread_mutex_unlock(&l->mu);
      if (wait_s) *wait_s = now_s() - t0;
      return STOKE_ERR(STOKE_E_INTERRUPTED, "loader: interrupted while waiting for batch %lld",
                       (long long)l->next_take);
    }
    wait_full(l);
  }
  stoke_err *e = s->err;
  s->err = NULL;
  s->state = SLOT_TAKEN;
  l->next_take++; /* the slot goes back by stoke_loader_release, maybe later */
  pthread_mutex_unlock(&l->mu);
  if (wait_s) *wait_s = now_s() - t0;
  *b = &s->b;
  return e;
}

void stoke_loader_release(stoke_loader *l, stoke_batch *b) {
  pthread_mutex_lock(&l->mu);
  l->slots[b->slot].state = SLOT_FREE;
  pthread_cond_broadcast(&l->cv_free);
  pthread_mutex_unlock(&l->mu);
}

int64_t stoke_loader_batches_per_epoch(const stoke_loader *l) { return l->per_epoch; }
size_t stoke_loader_sample_bytes(const stoke_loader *l) { return l->sample_bytes; }
void stoke_loader_on_fill(stoke_loader *l, stoke_fill_hook hook, void *ctx) {
  pthread_mutex_lock(&l->mu);
  l->hook = hook, l->hook_ctx = ctx;
  pthread_mutex_unlock(&l->mu);
}

int64_t stoke_loader_skipped(const stoke_loader *l) {
  pthread_mutex_lock((pthread_mutex_t *)&l->mu);
  int64_t n = l->skipped;
  pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
  return n;
}

int64_t stoke_loader_bad_samples(const stoke_loader *l) {
  pthread_mutex_lock((pthread_mutex_t *)&l->mu);
  int64_t n = l->n_bad;
  pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
  return n;
}

int64_t stoke_loader_skip_reasons(const stoke_loader *l, char *buf, size_t cap) {
  pthread_mutex_lock((pthread_mutex_t *)&l->mu);
  int64_t n = l->skipped;
  reasons_text(l, buf, cap);
  pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
  return n;
}

/* ------------------------------------------------- the hand-off to the device */

/* The hand-off's device side (opts.feed on a device with a copy stream):
 * the staging buffer batches land in, the events that order it. */
static stoke_err *stage_open(stoke_loader *l) {
  const stoke_backend_v1 *d = l->o.dev;
  if (!l->o.feed || !d->copy_stream || !d->stream_wait || !d->timer_sync || !d->timer_create) return NULL;
  l->stage_x = (l->sample_bytes * (size_t)l->o.batch + 255) / 256 * 256;
  STOKE_TRY(d->alloc(l->o.dev_self, l->stage_x + sizeof(int32_t) * (size_t)l->o.batch, &l->stage),
            "allocating the loader's device staging buffer (%zu bytes)", l->stage_x);
  STOKE_PROPAGATE(d->timer_create(l->o.dev_self, &l->ev_copy));
  return d->timer_create(l->o.dev_self, &l->ev_used);
}

static void stage_close(stoke_loader *l) {
  const stoke_backend_v1 *d = l->o.dev;
  /* the device is done with the pinned slot and the staging buffer first */
  if (l->held) stoke_err_free(d->timer_sync(l->o.dev_self, l->ev_copy));
  if (l->used_pending) stoke_err_free(d->timer_sync(l->o.dev_self, l->ev_used));
  if (l->stage) d->free(l->o.dev_self, l->stage);
  if (l->ev_copy) d->timer_destroy(l->o.dev_self, l->ev_copy);
  if (l->ev_used) d->timer_destroy(l->o.dev_self, l->ev_used);
  if (l->ev_copy0) d->timer_destroy(l->o.dev_self, l->ev_copy0);
}

/* The slot fed last goes back to the workers once its copy is done (it
 * was issued a step ago: normally done by now). */
static stoke_err *give_back_held(stoke_loader *l) {
  if (!l->held) return NULL;
  stoke_err *e = l->o.dev->timer_sync(l->o.dev_self, l->ev_copy);
  stoke_loader_release(l, l->held);
  l->held = NULL;
  return e;
}

/* Host slot -> staging buffer on the copy stream; the compute stream
 * waits for that copy (the host does not), then moves the batch into x and
 * labels, and marks the staging buffer free again. */
static stoke_err *copy_staged(stoke_loader *l, const stoke_batch *b, void *x, void *labels) {
  const stoke_backend_v1 *d = l->o.dev;
  void *self = l->o.dev_self, *cs = d->copy_stream(self), *stage_y = (char *)l->stage + l->stage_x;
  size_t xb = l->sample_bytes * (size_t)b->n, yb = sizeof(int32_t) * (size_t)b->n;
  /* the staging buffer is free once the previous batch moved on */
  if (l->used_pending) STOKE_PROPAGATE(d->stream_wait(self, cs, l->ev_used));
  if (l->time_copy) {
    if (!l->ev_copy0) STOKE_PROPAGATE(d->timer_create(self, &l->ev_copy0));
    STOKE_PROPAGATE(d->timer_record(self, l->ev_copy0, cs));
  }
  STOKE_PROPAGATE(d->copy(self, l->stage, b->x, xb, STOKE_COPY_H2D, cs));
  STOKE_PROPAGATE(d->copy(self, stage_y, b->labels, yb, STOKE_COPY_H2D, cs));
  STOKE_PROPAGATE(d->timer_record(self, l->ev_copy, cs));
  if (l->time_copy) {
    float ms = 0;
    STOKE_PROPAGATE(d->timer_sync(self, l->ev_copy));
    STOKE_PROPAGATE(d->timer_elapsed_ms(self, l->ev_copy0, l->ev_copy, &ms));
    l->copy_ms = ms;
  }
  STOKE_PROPAGATE(d->stream_wait(self, NULL, l->ev_copy));
  STOKE_PROPAGATE(d->copy(self, x, l->stage, xb, STOKE_COPY_D2D, NULL));
  STOKE_PROPAGATE(d->copy(self, labels, stage_y, yb, STOKE_COPY_D2D, NULL));
  STOKE_PROPAGATE(d->timer_record(self, l->ev_used, NULL));
  l->used_pending = 1;
  return NULL;
}

/* No copy stream (the CPU): a copy the host waits for. */
static stoke_err *copy_now(stoke_loader *l, const stoke_batch *b, void *x, void *labels) {
  const stoke_backend_v1 *d = l->o.dev;
  size_t xb = l->sample_bytes * (size_t)b->n, yb = sizeof(int32_t) * (size_t)b->n;
  STOKE_PROPAGATE(d->copy(l->o.dev_self, x, b->x, xb, STOKE_COPY_H2D, NULL));
  STOKE_PROPAGATE(d->copy(l->o.dev_self, labels, b->labels, yb, STOKE_COPY_H2D, NULL));
  return d->stream_sync ? d->stream_sync(l->o.dev_self, NULL) : NULL;
}

stoke_err *stoke_loader_feed(stoke_loader *l, void *x, void *labels, int32_t *host_labels, stoke_fed *fed,
                             double *wait_s) {
  if (wait_s) *wait_s = 0;
  l->copy_ms = NAN;
  STOKE_TRY(give_back_held(l), "loader: waiting for the last batch's copy");
  stoke_batch *b;
  stoke_err *e = stoke_loader_next(l, &b, wait_s);
  if (!b) return e; /* cancelled */
  if (!e) {
    *fed = (stoke_fed){b->n, b->epoch, b->index};
    if (host_labels) memcpy(host_labels, b->labels, sizeof(int32_t) * (size_t)b->n);
    e = l->stage ? copy_staged(l, b, x, labels) : copy_now(l, b, x, labels);
  }
  /* staged, the device may still read the slot: it goes back next time */
  if (l->stage) l->held = b;
  else stoke_loader_release(l, b);
  return e;
}

void stoke_loader_time_copy(stoke_loader *l, int on) { l->time_copy = on; }
double stoke_loader_copy_ms(const stoke_loader *l) { return l->copy_ms; }
