/* stoke/dist.h: the pure logic of data-parallel training, shared by the
 * core and the nccl plugin and unit-tested without a GPU: who am I (the
 * launcher's variables), which byte ranges of the flat gradient buffer
 * are all-reduced together and when, and where a resumed run's data
 * starts when the number of processes changed. No I/O, no allocation. */
#ifndef STOKE_DIST_H
#define STOKE_DIST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* This process's place in the job. */
typedef struct stoke_dist_env {
  int rank, world, local_rank;
  const char *source; /* "torchrun", "openmpi", "slurm" or "none" (one process) */
  /* where rank 0's NCCL bootstrap listens: NCCL_COMM_ID when given, else
   * MASTER_ADDR:(MASTER_PORT + 1) (torchrun's own store holds MASTER_PORT) */
  char comm_id[300];
} stoke_dist_env;

/* A getenv: returns the variable or NULL. */
typedef const char *(*stoke_dist_getenv)(const char *name, void *ctx);

/* Reads torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
 * MASTER_PORT), else Open MPI's (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK),
 * else Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), in that order
 * (torchrun and mpirun inside a Slurm job set their own). With none, one
 * process (rank 0 of 1). Returns 0, or -1 with what is wrong and what to
 * do in `err`: a missing, non-numeric or out-of-range variable, a rank
 * past the world, no rendezvous address for more than one process. */
int stoke_dist_env_read(stoke_dist_getenv get, void *ctx, stoke_dist_env *out, char *err, size_t cap);

/* One parameter's gradient in the flat buffer, and `ready`: the schedule
 * index of the last backward node that writes it (its value is final
 * once that node ran). */
typedef struct stoke_dist_grad {
  size_t offset, bytes;
  int ready;
} stoke_dist_grad;

/* A contiguous range of the flat gradient buffer all-reduced by one call,
 * launched right after node `ready`. */
typedef struct stoke_dist_bucket {
  size_t offset, bytes;
  int ready;
} stoke_dist_bucket;

/* Split [0, total) into buckets as DDP does: walking down from the end of
 * the buffer (the last layers, whose gradients backward makes first), a
 * bucket closes at the first parameter boundary where it reaches its cap:
 * `first_cap` bytes for the first bucket (small, so communication starts
 * early), `cap` for the rest. A bucket is ready after the latest `ready`
 * of the gradients in it; buckets come back in launch order (by ready,
 * then from the top of the buffer), which every rank computes alike.
 * Returns the number of buckets (<= n_grads, and 1 for an empty list
 * with total > 0), or -1 when `out` (room for `max`) is too small. */
int stoke_dist_plan_buckets(const stoke_dist_grad *grads, int n_grads, size_t total, size_t first_cap,
                            size_t cap, int last_node, stoke_dist_bucket *out, int max);

/* Resume: the checkpoint was saved after `step` optimizer steps of
 * `accumulate` micro-batches of `batch` samples on each of `world`
 * processes; the run goes on with `new_batch` per micro-batch on
 * `new_world`, over a data set of `total` samples (0: unknown) whose
 * epochs drop their remainder. Returns the first per-process micro-batch
 * to read: the same epoch, and in it the same place of the global order
 * (rounded down: at most one global batch is seen again when the global
 * batch changed). */
int64_t stoke_dist_resume_batch(int64_t step, int64_t accumulate, int64_t batch, int64_t world,
                                int64_t new_batch, int64_t new_world, int64_t total);

#ifdef __cplusplus
}
#endif
#endif
