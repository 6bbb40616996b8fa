/* backends/nccl: the `nccl` comm, one process per GPU. The core hands it
 * the process's place in the job (rank, world, local rank and the
 * rendezvous, read once from the launcher's variables); rank 0's NCCL
 * bootstrap listens at the rendezvous, given to NCCL as NCCL_COMM_ID
 * (NCCL's own rendezvous: every rank calls ncclGetUniqueId with it set; no
 * networking of ours).
 *
 * Failures don't hang: a watchdog thread follows every collective through
 * an event recorded after it. When one has not finished comm_timeout
 * seconds after it was issued (a rank died or stalled), or NCCL reports an
 * asynchronous error, it aborts the communicator, which ends the kernels
 * still waiting on the peers; the next call returns an error naming this
 * rank and the operation. Host waits here poll, so they end too. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

#define RING 512 /* collectives in flight the watchdog can follow */

/* The place the core gave open(), kept (the strings copied). */
typedef struct place {
  int rank, world, local_rank;
  char rendezvous[300], launcher[32];
} place;

typedef struct nccl_comm {
  ncclComm_t comm;
  place env;
  int device;
  double timeout;
  cudaStream_t own;  /* barrier */
  float *scratch;    /* barrier's one float */
  pthread_mutex_t mu;
  pthread_t watchdog;
  int watching, stop;
  /* in flight: op k's event, when it was issued and what it is */
  cudaEvent_t ev[RING];
  double issued_at[RING];
  char what[RING][96];
  uint64_t issued, done;
  int failed; /* the communicator was aborted: every call errs with `why` */
  char why[640];
} nccl_comm;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define NCCL_ERR(c, r, ...) nccl_err((c), (r), __FILE__, __LINE__, __VA_ARGS__)

static stoke_err *nccl_err(nccl_comm *c, ncclResult_t r, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static stoke_err *nccl_err(nccl_comm *c, ncclResult_t r, const char *file, int line, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const char *last = ncclGetLastError(c ? c->comm : NULL); /* NULL: this thread's last error */
  return stoke_host->err_new(STOKE_E_DEVICE, file, line, "nccl: rank %d of %d: %s: %s%s%s", c ? c->env.rank : -1,
                             c ? c->env.world : 0, what, ncclGetErrorString(r), last && last[0] ? ": " : "",
                             last ? last : "");
}

/* Abort the communicator (mu held): every rank's pending kernels end. */
static void fail_locked(nccl_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_locked(nccl_comm *c, const char *fmt, ...) {
  if (c->failed) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
  c->failed = 1;
  stoke_host->log(STOKE_LOG_ERROR, "nccl", "%s; aborting the communicator", c->why);
  ncclCommAbort(c->comm);
  c->comm = NULL;
}

/* Retire finished collectives, check NCCL's asynchronous error and the
 * oldest unfinished collective's age. mu held. */
static void check_locked(nccl_comm *c) {
  if (c->failed) return;
  while (c->done < c->issued) {
    cudaError_t ce = cudaEventQuery(c->ev[c->done % RING]);
    if (ce == cudaErrorNotReady) break;
    if (ce != cudaSuccess) {
      fail_locked(c, "rank %d of %d: %s failed on the GPU: %s", c->env.rank, c->env.world,
                  c->what[c->done % RING], cudaGetErrorString(ce));
      return;
    }
    c->done++;
  }
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(c->comm, &async);
  if (async != ncclSuccess && async != ncclInProgress) {
    fail_locked(c, "rank %d of %d: NCCL reports %s (%s) during %s", c->env.rank, c->env.world,
                ncclGetErrorString(async), ncclGetLastError(c->comm),
                c->done < c->issued ? c->what[c->done % RING] : "no collective in flight");
    return;
  }
  if (c->done < c->issued) {
    double age = now_s() - c->issued_at[c->done % RING];
    if (age > c->timeout)
      fail_locked(c,
                  "rank %d of %d: %s did not finish within [run] comm_timeout = %g s (another rank died, "
                  "stalled or left the step loop early; see its output)",
                  c->env.rank, c->env.world, c->what[c->done % RING], c->timeout);
  }
}

static void *watchdog_main(void *arg) {
  nccl_comm *c = arg;
  cudaSetDevice(c->device);
  for (;;) {
    pthread_mutex_lock(&c->mu);
    int stop = c->stop;
    if (!stop) check_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (stop) return NULL;
    usleep(50 * 1000);
  }
}

static void nccl_close(void *self) {
  nccl_comm *c = self;
  if (!c) return;
  if (c->watching) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->watchdog, NULL);
  }
  /* abort, not destroy: destroy flushes collectives in flight, which
   * waits forever when a peer is gone; on a clean exit there are none */
  if (c->comm) ncclCommAbort(c->comm);
  for (int i = 0; i < RING; i++)
    if (c->ev[i]) cudaEventDestroy(c->ev[i]);
  if (c->scratch) cudaFree(c->scratch);
  if (c->own) cudaStreamDestroy(c->own);
  pthread_mutex_destroy(&c->mu);
  stoke_host->free(c);
}

static stoke_err *nccl_open(const stoke_cfg *cfg, const stoke_comm_place_v1 *where, void **self) {
  nccl_comm *c = stoke_host->alloc(sizeof *c);
  if (!c) return STOKE_PERR(STOKE_E_OOM, "nccl: out of host memory");
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  stoke_err *e = NULL;
  c->env.rank = where->rank, c->env.world = where->world, c->env.local_rank = where->local_rank;
  snprintf(c->env.rendezvous, sizeof c->env.rendezvous, "%s", where->rendezvous ? where->rendezvous : "");
  snprintf(c->env.launcher, sizeof c->env.launcher, "%s", where->launcher ? where->launcher : "none");
  if (c->env.world > 1 && !c->env.rendezvous[0]) {
    e = STOKE_PERR(STOKE_E_INVALID, "[run] comm = nccl: %d processes but no rendezvous address (MASTER_ADDR)",
                   c->env.world);
    goto fail;
  }
  if ((e = stoke_host->cfg_float(cfg, "run", "comm_timeout", &c->timeout))) goto fail;
  int n = 0;
  cudaError_t ce = cudaGetDeviceCount(&n);
  if (ce == cudaSuccess) ce = cudaGetDevice(&c->device);
  if (ce != cudaSuccess) {
    e = STOKE_PERR(STOKE_E_DEVICE, "[run] comm = nccl needs a CUDA GPU: %s", cudaGetErrorString(ce));
    goto fail;
  }
  if (c->env.local_rank >= n) {
    e = STOKE_PERR(STOKE_E_INVALID,
                   "[run] comm = nccl: local rank %d (%s variables) but this node has %d GPU%s: start at most "
                   "one process per GPU",
                   c->env.local_rank, c->env.launcher, n, n == 1 ? "" : "s");
    goto fail;
  }
  /* NCCL's bootstrap: rank 0 listens at NCCL_COMM_ID, the others connect */
  if (c->env.world > 1 && setenv("NCCL_COMM_ID", c->env.rendezvous, 0)) {
    e = STOKE_PERR(STOKE_E_OOM, "nccl: cannot set NCCL_COMM_ID");
    goto fail;
  }
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r == ncclSuccess) r = ncclCommInitRank(&c->comm, c->env.world, id, c->env.rank);
  if (r != ncclSuccess) {
    e = NCCL_ERR(c, r,
                 "joining the communicator (rendezvous at %s, rank 0 listens there; check that every rank "
                 "was started with the same MASTER_ADDR/MASTER_PORT and that the address is reachable)",
                 c->env.world > 1 ? c->env.rendezvous : "local");
    goto fail;
  }
  for (int i = 0; i < RING && ce == cudaSuccess; i++) ce = cudaEventCreateWithFlags(&c->ev[i], cudaEventDisableTiming);
  if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&c->own, cudaStreamNonBlocking);
  if (ce == cudaSuccess) ce = cudaMalloc((void **)&c->scratch, sizeof(float));
  if (ce != cudaSuccess) {
    e = STOKE_PERR(STOKE_E_DEVICE, "nccl: %s", cudaGetErrorString(ce));
    goto fail;
  }
  if (pthread_create(&c->watchdog, NULL, watchdog_main, c)) {
    e = STOKE_PERR(STOKE_E_INTERNAL, "nccl: cannot start the watchdog thread");
    goto fail;
  }
  c->watching = 1;
  int ver = 0;
  ncclGetVersion(&ver);
  stoke_host->log(STOKE_LOG_INFO, "nccl",
                  "rank %d of %d (local rank %d, GPU %d; %s variables), NCCL %d.%d.%d, rendezvous %s, "
                  "comm_timeout %g s",
                  c->env.rank, c->env.world, c->env.local_rank, c->device, c->env.launcher, ver / 10000,
                  ver / 100 % 100, ver % 100, c->env.world > 1 ? c->env.rendezvous : "local", c->timeout);
  *self = c;
  return NULL;
fail:
  nccl_close(c);
  return e;
}

static int nccl_type(stoke_dtype t, ncclDataType_t *out) {
  switch (t) {
    case STOKE_F32: *out = ncclFloat32; return 1;
    case STOKE_F64: *out = ncclFloat64; return 1;
    case STOKE_F16: *out = ncclFloat16; return 1;
    case STOKE_BF16: *out = ncclBfloat16; return 1;
    case STOKE_I32: *out = ncclInt32; return 1;
    case STOKE_U8: *out = ncclUint8; return 1;
    default: return 0;
  }
}

/* A collective enqueued while `stream` is being captured into a CUDA graph
 * runs only when the graph is replayed: it is not followed here (an event
 * recorded now would be part of the graph); the core calls watch() after
 * each replay instead. */
static int capturing(void *stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return st == cudaStreamCaptureStatusActive;
}

/* Before a collective (mu held): the communicator must be alive and the
 * ring must have room (the watchdog retires finished ones). While its
 * stream is being captured (`captured`) nothing is queried: the capture is
 * thread-local, and cudaEventQuery from the capturing thread is one of the
 * calls that invalidate it ("operation not permitted when stream is
 * capturing"); nothing captured is tracked either, so no room is needed. */
static stoke_err *admit_locked(nccl_comm *c, int captured) {
  if (captured) return c->failed ? STOKE_PERR(STOKE_E_DEVICE, "nccl: %s", c->why) : NULL;
  for (;;) {
    check_locked(c);
    if (c->failed) return STOKE_PERR(STOKE_E_DEVICE, "nccl: %s", c->why);
    if (c->issued - c->done < RING) return NULL;
    pthread_mutex_unlock(&c->mu);
    usleep(200);
    pthread_mutex_lock(&c->mu);
  }
}

/* After a collective was enqueued on `stream` (mu held). */
static stoke_err *track_locked(nccl_comm *c, cudaStream_t stream, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static stoke_err *track_locked(nccl_comm *c, cudaStream_t stream, const char *fmt, ...) {
  int k = (int)(c->issued % RING);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->what[k], sizeof c->what[k], fmt, ap);
  va_end(ap);
  cudaError_t ce = cudaEventRecord(c->ev[k], stream);
  if (ce != cudaSuccess) return STOKE_PERR(STOKE_E_DEVICE, "nccl: recording an event: %s", cudaGetErrorString(ce));
  c->issued_at[k] = now_s();
  c->issued++;
  return NULL;
}

static stoke_err *nccl_watch(void *self, void *stream, const char *what) {
  nccl_comm *c = self;
  pthread_mutex_lock(&c->mu);
  stoke_err *e = admit_locked(c, capturing(stream));
  if (!e) e = track_locked(c, (cudaStream_t)stream, "%s", what);
  pthread_mutex_unlock(&c->mu);
  return e;
}

static stoke_err *nccl_all_reduce(void *self, void *buf, size_t count, stoke_dtype dtype, stoke_reduce_op op,
                                  void *stream) {
  nccl_comm *c = self;
  ncclDataType_t t;
  if (!nccl_type(dtype, &t)) return STOKE_PERR(STOKE_E_UNSUPPORTED, "nccl: all_reduce of dtype %d", (int)dtype);
  int captured = capturing(stream);
  pthread_mutex_lock(&c->mu);
  stoke_err *e = admit_locked(c, captured);
  if (!e) {
    ncclResult_t r = ncclAllReduce(buf, buf, count, t, op == STOKE_AVG ? ncclAvg : ncclSum, c->comm,
                                   (cudaStream_t)stream);
    if (r != ncclSuccess) e = NCCL_ERR(c, r, "all_reduce of %zu elements", count);
  }
  if (!e && !captured)
    e = track_locked(c, stream, "all_reduce #%llu (%zu elements, %.1f MiB)", (unsigned long long)c->issued, count,
                     (double)(count * stoke_dtype_size(dtype)) / 1048576.0);
  pthread_mutex_unlock(&c->mu);
  return e;
}

static stoke_err *nccl_broadcast(void *self, void *buf, size_t count, stoke_dtype dtype, int root, void *stream) {
  nccl_comm *c = self;
  ncclDataType_t t;
  if (!nccl_type(dtype, &t)) return STOKE_PERR(STOKE_E_UNSUPPORTED, "nccl: broadcast of dtype %d", (int)dtype);
  pthread_mutex_lock(&c->mu);
  stoke_err *e = admit_locked(c, capturing(stream));
  if (!e) {
    ncclResult_t r = ncclBroadcast(buf, buf, count, t, root, c->comm, (cudaStream_t)stream);
    if (r != ncclSuccess) e = NCCL_ERR(c, r, "broadcast of %zu elements from rank %d", count, root);
  }
  if (!e) e = track_locked(c, stream, "broadcast #%llu (%zu elements from rank %d)", (unsigned long long)c->issued,
                           count, root);
  pthread_mutex_unlock(&c->mu);
  return e;
}

/* Every rank reached this point: a one-float all-reduce, waited for by
 * polling so the watchdog's abort ends the wait. */
static stoke_err *nccl_barrier(void *self) {
  nccl_comm *c = self;
  STOKE_PROPAGATE_P(nccl_all_reduce(c, c->scratch, 1, STOKE_F32, STOKE_SUM, c->own));
  for (;;) {
    pthread_mutex_lock(&c->mu);
    check_locked(c);
    int failed = c->failed, idle = c->done == c->issued;
    pthread_mutex_unlock(&c->mu);
    if (failed) return STOKE_PERR(STOKE_E_DEVICE, "nccl: barrier: %s", c->why);
    if (idle) return NULL;
    usleep(100);
  }
}

static const stoke_comm_v1 nccl = {
    STOKE_ABI(stoke_comm_v1),
    .name = "nccl",
    .help = "NCCL: one process per GPU, started by tools/launch, torchrun, srun or mpirun",
    .open = nccl_open,
    .close = nccl_close,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .watch = nccl_watch,
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_comm(r->self, &nccl);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "nccl",
                                                            "the nccl comm: data-parallel training over GPUs",
                                                            reg};
