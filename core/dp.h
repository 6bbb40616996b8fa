/* core/dp.h (private to the core): data-parallel training over a comm
 * plugin. Gradients are all-reduced in buckets of the flat gradient
 * buffer on a comm stream, each launched from the executor's node hook
 * right after backward produced its last gradient; the optimizer's stream
 * waits on an event, never the host. The logic that needs no GPU (who is
 * which rank, the bucket plan) is in stoke/dist.h. */
#ifndef STOKE_CORE_DP_H
#define STOKE_CORE_DP_H

#include "stoke/dist.h"
#include "stoke/graph.h"

typedef struct stoke_dp stoke_dp;

/* Open `comm` on device `dev` as process `env` of the job (read once from
 * the launcher's variables by the caller; the plugin meets the other ranks
 * at env->comm_id): done early, before the slow graph compile, so that
 * ranks starting at different speeds still meet. */
stoke_err *stoke_dp_open(const stoke_comm_v1 *comm, const stoke_cfg *cfg, const stoke_dist_env *env,
                         const stoke_backend_v1 *dev, void *dev_self, stoke_dp **out);
/* Plan the buckets of the training executor `x` (`bucket_bytes`, the
 * first one at most 1 MiB as in DDP) and hook it. */
stoke_err *stoke_dp_attach(stoke_dp *d, stoke_exec *x, double bucket_bytes);
/* Closes the comm; the attached executor's step graphs (which hold captured
 * all-reduces) are destroyed first and the executor unhooked. */
void stoke_dp_close(stoke_dp *d);
/* How the buckets came out, for the log: "7 buckets: 1.0, 25.3, ... MiB". */
void stoke_dp_describe(const stoke_dp *d, char *buf, size_t cap);

/* Parameters, running statistics and optimizer state (the f32 master
 * copy) from rank 0, so every rank starts alike. Synchronizes. */
stoke_err *stoke_dp_broadcast_state(stoke_dp *d);
/* Whether steps may be CUDA graphs: the comm follows collectives inside a
 * replayed graph (stoke_comm_v1.watch). */
int stoke_dp_graphs(const stoke_dp *d);
/* Before each micro-batch: only the last one of a step all-reduces. */
void stoke_dp_arm(stoke_dp *d, int last_micro);
/* After backward, before the update (the executor's hook calls it):
 * launch what is left, then make the compute stream wait for the comm
 * stream. */
stoke_err *stoke_dp_finish(stoke_dp *d);
/* Element-wise sum of `n` doubles over the ranks (host values; syncs). */
stoke_err *stoke_dp_sum(stoke_dp *d, double *v, int n);
/* Every rank's `v`, in rank order, into all[world] (syncs). */
stoke_err *stoke_dp_gather(stoke_dp *d, double v, double *all);

/* Time the all-reduce of the whole flat gradient buffer in one call:
 * ms per call and the bus bandwidth (nccl-tests' 2(n-1)/n convention). */
stoke_err *stoke_dp_bench(stoke_dp *d, int iters, double *ms, double *busbw_gbs);
/* The trace (run.trace): time each bucket's all-reduce on the comm stream
 * from now on (on) or stop. After a timed step has finished on the device:
 * each bucket's start after the timer `ref` (recorded on the compute stream
 * before the step's first node) and its duration, in ms, and its bytes; the
 * count (0: none timed). */
stoke_err *stoke_dp_time_buckets(stoke_dp *d, int on);
int stoke_dp_bucket_times(stoke_dp *d, void *ref, double *start_ms, double *dur_ms, size_t *bytes, int cap);

#endif
