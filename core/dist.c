/* core/dist.c: see stoke/dist.h. Also linked into the nccl plugin. */
#include "stoke/dist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The launchers whose variables name this process's place, in order of
 * precedence: rank, world size, local rank. */
typedef struct launcher {
  const char *name, *rank, *world, *local;
  const char *nodes;    /* a variable that says the job spans several nodes */
  int nodes_is_count;   /* 1: it counts nodes; 0: it counts this node's processes */
} launcher;

static const launcher launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", 0},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", 0},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NNODES", 1},
};

/* A whole non-negative decimal integer below 2^31, or -1. */
static int parse_int(const char *s) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > 0x7fffffffL || end == s) return -1;
  return (int)v;
}

int stoke_dist_env_read(stoke_dist_getenv get, void *ctx, stoke_dist_env *out, char *err, size_t cap) {
  memset(out, 0, sizeof *out);
  out->world = 1;
  out->source = "none";
  const launcher *l = NULL;
  for (size_t i = 0; i < sizeof launchers / sizeof *launchers && !l; i++)
    if (get(launchers[i].rank, ctx) || get(launchers[i].world, ctx)) l = &launchers[i];
  if (!l) return 0;
  out->source = l->name;
  const char *names[3] = {l->rank, l->world, l->local};
  int vals[3];
  for (int k = 0; k < 3; k++) {
    const char *v = get(names[k], ctx);
    vals[k] = parse_int(v);
    if (!v) {
      snprintf(err, cap, "%s is set but %s is not: the %s variables %s, %s and %s go together; set all three "
                         "(or start through tools/launch, torchrun, srun or mpirun)",
               get(l->rank, ctx) ? l->rank : l->world, names[k], l->name, l->rank, l->world, l->local);
      return -1;
    }
    if (vals[k] < 0 || (k == 1 && vals[k] < 1)) {
      snprintf(err, cap, "%s = '%s' is not a %s integer", names[k], v, k == 1 ? "positive" : "non-negative");
      return -1;
    }
  }
  out->rank = vals[0], out->world = vals[1], out->local_rank = vals[2];
  if (out->rank >= out->world) {
    snprintf(err, cap, "%s = %d but %s = %d: a rank must be below the world size; the variables are inconsistent",
             l->rank, out->rank, l->world, out->world);
    return -1;
  }
  if (out->local_rank > out->rank) {
    /* ranks count every node's processes, local ranks this node's */
    snprintf(err, cap, "%s = %d is above %s = %d: a local rank cannot exceed the global one; the variables are "
                       "inconsistent", l->local, out->local_rank, l->rank, out->rank);
    return -1;
  }
  const char *id = get("NCCL_COMM_ID", ctx);
  if (id && *id) {
    snprintf(out->comm_id, sizeof out->comm_id, "%s", id);
    return 0;
  }
  const char *addr = get("MASTER_ADDR", ctx), *port_s = get("MASTER_PORT", ctx);
  int port = port_s ? parse_int(port_s) : 29500;
  if (port < 1 || port > 65534) {
    snprintf(err, cap, "MASTER_PORT = '%s' is not a port number (1 to 65534)", port_s);
    return -1;
  }
  if (!addr || !*addr) {
    /* one node needs no address; several do, and only the user knows it */
    int nodes = parse_int(get(l->nodes, ctx));
    int multi = out->local_rank != out->rank ||
                (l->nodes_is_count ? nodes > 1 : nodes >= 1 && nodes < out->world);
    if (multi) {
      snprintf(err, cap, "%d processes over several nodes (%s variables) but MASTER_ADDR is not set: export "
                         "MASTER_ADDR=<the first node's host name or address> (and MASTER_PORT) on every node",
               out->world, l->name);
      return -1;
    }
    addr = "127.0.0.1";
  }
  snprintf(out->comm_id, sizeof out->comm_id, "%s:%d", addr, port + 1);
  return 0;
}

/* Gradients by offset, highest first. */
static int by_offset_desc(const void *a, const void *b) {
  size_t x = ((const stoke_dist_grad *)a)->offset, y = ((const stoke_dist_grad *)b)->offset;
  return x < y ? 1 : x > y ? -1 : 0;
}

int stoke_dist_plan_buckets(const stoke_dist_grad *grads, int n_grads, size_t total, size_t first_cap,
                            size_t cap, int last_node, stoke_dist_bucket *out, int max) {
  if (total == 0) return 0;
  if (max < 1) return -1;
  stoke_dist_grad *g = malloc(sizeof *g * (size_t)(n_grads > 0 ? n_grads : 1));
  if (!g) return -1;
  memcpy(g, grads, sizeof *g * (size_t)n_grads);
  qsort(g, (size_t)n_grads, sizeof *g, by_offset_desc);
  int nb = 0;
  size_t hi = total;
  int ready = -1;
  for (int i = 0; i < n_grads; i++) {
    if (g[i].ready > ready) ready = g[i].ready;
    size_t lim = nb == 0 ? first_cap : cap;
    int last = i == n_grads - 1;
    if (hi - g[i].offset >= lim || last) {
      if (nb == max) {
        free(g);
        return -1;
      }
      size_t lo = last ? 0 : g[i].offset;
      out[nb++] = (stoke_dist_bucket){lo, hi - lo, ready < 0 ? last_node : ready};
      hi = lo;
      ready = -1;
    }
  }
  free(g);
  if (nb == 0) out[nb++] = (stoke_dist_bucket){0, total, last_node};
  /* launch order: by ready (stable insertion sort keeps top-down order) */
  for (int i = 1; i < nb; i++) {
    stoke_dist_bucket b = out[i];
    int j = i - 1;
    while (j >= 0 && out[j].ready > b.ready) out[j + 1] = out[j], j--;
    out[j + 1] = b;
  }
  return nb;
}

int64_t stoke_dist_resume_batch(int64_t step, int64_t accumulate, int64_t batch, int64_t world,
                                int64_t new_batch, int64_t new_world, int64_t total) {
  if (new_batch < 1 || new_world < 1) return 0;
  int64_t n = step * accumulate; /* micro-batches each process read */
  int64_t per = total > 0 && batch > 0 && world > 0 ? total / world / batch : 0;
  int64_t new_per = total > 0 ? total / new_world / new_batch : 0;
  if (per < 1 || new_per < 1) return n * batch * world / (new_batch * new_world);
  /* an epoch drops its remainder, which depends on the batch and the world: the same epoch, then the same
   * place in its global order (the next epoch's start when the new epoch is shorter) */
  int64_t epoch = n / per, at = (n % per) * batch * world / (new_batch * new_world);
  return epoch * new_per + (at < new_per ? at : new_per);
}
