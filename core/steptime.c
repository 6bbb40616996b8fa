/* core/steptime.c: per-step device times from a round-robin pool of timers
 * recorded on the compute stream, read back only when the caller asks. */
#include <stdlib.h>
#include <time.h>

#include "stoke/core.h"
#include "stoke/steptime.h"

/* Boundaries are numbered 0, 1, 2, ...; boundary b lives in slot b % POOL.
 * A step starts at a boundary s and ends at s + 1 (begin records nothing
 * when the step before ended the one it starts from, and nothing else
 * records in between), so an unread step is its start boundary alone. */
enum { POOL = 64 };

struct stoke_steptime {
  const stoke_backend_v1 *dev;
  void *dev_self;
  int host_clock;        /* no device timers: the host's monotonic clock */
  void *ev[POOL];        /* created on first use */
  double host_s[POOL];   /* host_clock: the boundaries' times */
  int64_t next;          /* the next boundary's number */
  int64_t open;          /* the boundary the next step starts from (-1: none) */
  int64_t unread[POOL];  /* start boundaries of ended, unread steps, a queue */
  int64_t head, n_unread;
  double *done;          /* times read from the pool, not yet handed out */
  int64_t n_done, cap_done;
  int given;             /* `done` was handed out: the next time read starts it anew */
};

stoke_err *stoke_steptime_new(const stoke_backend_v1 *dev, void *dev_self, stoke_steptime **out) {
  stoke_steptime *t = calloc(1, sizeof *t);
  if (!t) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  t->dev = dev, t->dev_self = dev_self;
  t->host_clock = !dev->timer_create || !dev->timer_record || !dev->timer_elapsed_ms;
  t->open = -1;
  *out = t;
  return NULL;
}

void stoke_steptime_free(stoke_steptime *t) {
  if (!t) return;
  for (int i = 0; i < POOL; i++)
    if (t->ev[i] && t->dev->timer_destroy) t->dev->timer_destroy(t->dev_self, t->ev[i]);
  free(t->done);
  free(t);
}

static stoke_err *keep(stoke_steptime *t, double ms) {
  if (t->given) t->n_done = 0, t->given = 0;
  if (t->n_done == t->cap_done) {
    int64_t cap = t->cap_done ? 2 * t->cap_done : 256;
    double *d = realloc(t->done, sizeof *d * (size_t)cap);
    if (!d) return STOKE_ERR(STOKE_E_OOM, "out of memory for step times");
    t->done = d, t->cap_done = cap;
  }
  t->done[t->n_done++] = ms;
  return NULL;
}

/* The oldest unread step's time, into `done`. Its end timer is waited for:
 * after the loss read-back (which follows it on the stream) it completed. */
static stoke_err *read_oldest(stoke_steptime *t) {
  int64_t s = t->unread[t->head];
  int a = (int)(s % POOL), b = (int)((s + 1) % POOL);
  double ms;
  if (t->host_clock) {
    ms = 1e3 * (t->host_s[b] - t->host_s[a]);
  } else {
    float f = 0;
    if (t->dev->timer_sync) STOKE_TRY(t->dev->timer_sync(t->dev_self, t->ev[b]), "waiting for a step's end timer");
    STOKE_TRY(t->dev->timer_elapsed_ms(t->dev_self, t->ev[a], t->ev[b], &f), "reading a step's device time");
    ms = f;
  }
  t->head = (t->head + 1) % POOL;
  t->n_unread--;
  return keep(t, ms);
}

/* Record the next boundary on the compute stream, first reading the
 * oldest unread step when its start boundary's slot is the one reused. */
static stoke_err *record(stoke_steptime *t, int64_t *b) {
  while (t->n_unread > 0 && t->next - t->unread[t->head] >= POOL) STOKE_PROPAGATE(read_oldest(t));
  int slot = (int)(t->next % POOL);
  if (t->host_clock) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t->host_s[slot] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  } else {
    if (!t->ev[slot]) STOKE_TRY(t->dev->timer_create(t->dev_self, &t->ev[slot]), "creating a step timer");
    STOKE_TRY(t->dev->timer_record(t->dev_self, t->ev[slot], NULL), "recording a step boundary");
  }
  *b = t->next++;
  return NULL;
}

stoke_err *stoke_steptime_begin(stoke_steptime *t) {
  if (t->open >= 0) return NULL;
  return record(t, &t->open);
}

stoke_err *stoke_steptime_end(stoke_steptime *t) {
  if (t->open < 0) return STOKE_ERR(STOKE_E_INTERNAL, "a step ended that never began");
  int64_t start = t->open, end;
  STOKE_PROPAGATE(record(t, &end));
  t->unread[(t->head + t->n_unread) % POOL] = start;
  t->n_unread++;
  t->open = end;
  return NULL;
}

void stoke_steptime_pause(stoke_steptime *t) { t->open = -1; }

stoke_err *stoke_steptime_read(stoke_steptime *t, const double **ms, int64_t *n) {
  if (t->given) t->n_done = 0, t->given = 0;
  while (t->n_unread > 0) STOKE_PROPAGATE(read_oldest(t));
  *ms = t->done;
  *n = t->n_done;
  t->given = 1;
  return NULL;
}
