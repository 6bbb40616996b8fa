/* tests/unit/dist_test.c: data parallel without a GPU: the launcher
 * variables (torchrun, Open MPI, Slurm, inconsistent ones), the gradient
 * bucket plan, the resume mapping, the loader's shards across ranks, and
 * that the nccl plugin loads and registers its comm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stoke/core.h"
#include "stoke/dist.h"
#include "stoke/loader.h"
#include "stoke/registry.h"

/* ------------------------------------------------- launcher variables */

/* A fake environment: "NAME=value" strings, NULL-terminated. */
static const char *fake_get(const char *name, void *ctx) {
  size_t n = strlen(name);
  for (const char *const *v = ctx; *v; v++)
    if (!strncmp(*v, name, n) && (*v)[n] == '=') return *v + n + 1;
  return NULL;
}

static int read_env(const char *const *vars, stoke_dist_env *env, char *err) {
  err[0] = 0;
  return stoke_dist_env_read(fake_get, (void *)vars, env, err, 512);
}

#define EXPECT_ENV_ERR(vars, sub)                                            \
  do {                                                                       \
    stoke_dist_env env_;                                                     \
    char err_[512];                                                          \
    assert_int_equal(read_env(vars, &env_, err_), -1);                       \
    if (!strstr(err_, sub)) fail_msg("message '%s' lacks '%s'", err_, sub); \
  } while (0)

static void test_env_none(void **state) {
  (void)state;
  const char *vars[] = {"HOME=/root", NULL};
  stoke_dist_env env;
  char err[512];
  assert_int_equal(read_env(vars, &env, err), 0);
  assert_int_equal(env.rank, 0);
  assert_int_equal(env.world, 1);
  assert_string_equal(env.source, "none");
}

static void test_env_torchrun(void **state) {
  (void)state;
  const char *vars[] = {"RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=3", "LOCAL_WORLD_SIZE=8", "MASTER_ADDR=10.0.0.1",
                        "MASTER_PORT=29500", NULL};
  stoke_dist_env env;
  char err[512];
  assert_int_equal(read_env(vars, &env, err), 0);
  assert_int_equal(env.rank, 3);
  assert_int_equal(env.world, 8);
  assert_int_equal(env.local_rank, 3);
  assert_string_equal(env.source, "torchrun");
  /* torchrun's store holds MASTER_PORT: NCCL's bootstrap takes the next */
  assert_string_equal(env.comm_id, "10.0.0.1:29501");
}

static void test_env_precedence(void **state) {
  (void)state;
  /* mpirun inside a Slurm allocation: Open MPI's variables win */
  const char *vars[] = {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0", "OMPI_COMM_WORLD_RANK=1",
                        "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1", NULL};
  stoke_dist_env env;
  char err[512];
  assert_int_equal(read_env(vars, &env, err), 0);
  assert_string_equal(env.source, "openmpi");
  assert_int_equal(env.rank, 1);
  assert_int_equal(env.world, 2);
  /* one node, no MASTER_ADDR: the loopback address and the default port + 1 */
  assert_string_equal(env.comm_id, "127.0.0.1:29501");
}

static void test_env_slurm(void **state) {
  (void)state;
  const char *vars[] = {"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_NNODES=2",
                        "MASTER_ADDR=node01", "MASTER_PORT=1234", NULL};
  stoke_dist_env env;
  char err[512];
  assert_int_equal(read_env(vars, &env, err), 0);
  assert_string_equal(env.source, "slurm");
  assert_int_equal(env.rank, 5);
  assert_int_equal(env.local_rank, 1);
  assert_string_equal(env.comm_id, "node01:1235");
  /* NCCL_COMM_ID given: used as it is */
  const char *own[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "NCCL_COMM_ID=h:7", NULL};
  assert_int_equal(read_env(own, &env, err), 0);
  assert_string_equal(env.comm_id, "h:7");
}

static void test_env_inconsistent(void **state) {
  (void)state;
  const char *missing[] = {"RANK=0", "LOCAL_RANK=0", NULL};
  EXPECT_ENV_ERR(missing, "WORLD_SIZE is not");
  const char *past[] = {"RANK=2", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL};
  EXPECT_ENV_ERR(past, "must be below the world size");
  const char *text[] = {"RANK=one", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL};
  EXPECT_ENV_ERR(text, "RANK = 'one' is not a non-negative integer");
  const char *zero[] = {"RANK=0", "WORLD_SIZE=0", "LOCAL_RANK=0", NULL};
  EXPECT_ENV_ERR(zero, "WORLD_SIZE = '0' is not a positive integer");
  const char *local[] = {"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=3", NULL};
  EXPECT_ENV_ERR(local, "cannot exceed the global one");
  const char *port[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=a", "MASTER_PORT=99999", NULL};
  EXPECT_ENV_ERR(port, "MASTER_PORT = '99999'");
  /* several nodes without an address: only the user knows it */
  const char *nodes[] = {"SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_LOCALID=0", "SLURM_NNODES=2", NULL};
  EXPECT_ENV_ERR(nodes, "MASTER_ADDR is not set");
  const char *remote[] = {"RANK=4", "WORLD_SIZE=8", "LOCAL_RANK=0", NULL};
  EXPECT_ENV_ERR(remote, "MASTER_ADDR is not set");
}

/* ------------------------------------------------------------ buckets */

#define MIB (1u << 20)

/* Every byte of [0, total) in exactly one bucket, ranges on parameter
 * boundaries, and each bucket ready after the gradients in it. */
static void check_cover(const stoke_dist_grad *g, int n, size_t total, const stoke_dist_bucket *b, int nb) {
  size_t sum = 0;
  for (int i = 0; i < nb; i++) {
    sum += b[i].bytes;
    for (int j = 0; j < nb; j++)
      if (i != j) assert_true(b[i].offset + b[i].bytes <= b[j].offset || b[j].offset + b[j].bytes <= b[i].offset);
    for (int k = 0; k < n; k++) {
      int in = g[k].offset >= b[i].offset && g[k].offset < b[i].offset + b[i].bytes;
      if (in) {
        assert_true(g[k].offset + g[k].bytes <= b[i].offset + b[i].bytes); /* never split */
        assert_true(g[k].ready <= b[i].ready);
      }
    }
    if (i > 0) assert_true(b[i - 1].ready <= b[i].ready); /* launch order */
  }
  assert_int_equal(sum, total);
}

static void test_buckets_resnet_like(void **state) {
  (void)state;
  /* 40 gradients of 2 MiB laid out in forward order; backward writes the
   * last first: gradient k is ready after node 100 - k */
  enum { N = 40 };
  stoke_dist_grad g[N];
  for (int k = 0; k < N; k++) g[k] = (stoke_dist_grad){(size_t)k * 2 * MIB, 2 * MIB, 100 - k};
  stoke_dist_bucket b[N + 1];
  int nb = stoke_dist_plan_buckets(g, N, N * 2 * MIB, 1 * MIB, 25 * MIB, 100, b, N + 1);
  /* the first bucket is the last gradient alone (1 MiB cap), then 13 x 2 MiB
   * = 26 MiB >= 25, twice, and the rest */
  assert_int_equal(nb, 4);
  assert_int_equal(b[0].offset, 39 * 2 * MIB);
  assert_int_equal(b[0].bytes, 2 * MIB);
  assert_int_equal(b[0].ready, 61);
  assert_int_equal(b[1].bytes, 26 * MIB);
  assert_int_equal(b[1].ready, 100 - 26);
  assert_int_equal(b[3].offset, 0);
  assert_int_equal(b[3].ready, 100);
  check_cover(g, N, N * 2 * MIB, b, nb);
}

static void test_buckets_out_of_order(void **state) {
  (void)state;
  /* a parameter used early and late (its gradient final only at the end)
   * keeps its bucket back; buckets still launch in ready order */
  stoke_dist_grad g[] = {{0, 256, 9}, {256, 512, 5}, {768, 256, 3}, {1024, 256, 9}, {1280, 256, 2}};
  stoke_dist_bucket b[8];
  int nb = stoke_dist_plan_buckets(g, 5, 1536, 256, 512, 9, b, 8);
  assert_true(nb >= 3);
  check_cover(g, 5, 1536, b, nb);
  /* a cap above everything: one bucket, ready at the last writer */
  nb = stoke_dist_plan_buckets(g, 5, 1536 + 64 /* padding */, 1 << 30, 1 << 30, 9, b, 8);
  assert_int_equal(nb, 1);
  assert_int_equal(b[0].bytes, 1600);
  assert_int_equal(b[0].ready, 9);
  /* no room: refused, not overrun */
  assert_int_equal(stoke_dist_plan_buckets(g, 5, 1536, 1, 1, 9, b, 2), -1);
  /* a gradient no backward node writes is ready at the last node */
  stoke_dist_grad lone = {0, 256, -1};
  assert_int_equal(stoke_dist_plan_buckets(&lone, 1, 256, 1, 1, 7, b, 8), 1);
  assert_int_equal(b[0].ready, 7);
}

/* ------------------------------------------------------------- resume */

static void test_resume_mapping(void **state) {
  (void)state;
  /* same job: the step times accumulate */
  assert_int_equal(stoke_dist_resume_batch(10, 2, 64, 1, 64, 1, 0), 20);
  /* saved on 2 GPUs at 64 each, resumed on 4 at 64: half the batches */
  assert_int_equal(stoke_dist_resume_batch(10, 1, 64, 2, 64, 4, 0), 5);
  /* saved on 4 at 32, resumed on 1 at 128: the same global batch */
  assert_int_equal(stoke_dist_resume_batch(7, 1, 32, 4, 128, 1, 0), 7);
  /* not a whole batch: rounded down (at most one global batch again) */
  assert_int_equal(stoke_dist_resume_batch(3, 1, 64, 1, 64, 2, 0), 1);
  /* the data set known: in epoch 0 the same as counting samples */
  assert_int_equal(stoke_dist_resume_batch(10, 1, 64, 2, 64, 4, 100000), 5);
  /* past an epoch the dropped remainders differ: 1000 samples, batch 64 -> 32 (15 -> 31 batches an epoch): step 20
   * is epoch 1's batch 5 (its samples 320-383), which is batch 10 of epoch 1 at 32 = 31 + 10, not 20 x 2 = 40 (a
   * batch of epoch 1 again) */
  assert_int_equal(stoke_dist_resume_batch(20, 1, 64, 1, 32, 1, 1000), 41);
  /* 1 -> 3 processes, batch 10 (100 -> 33 batches an epoch): step 100 is the start of epoch 1, batch 33 on 3
   * (counting samples gave 33 as well here); step 150: epoch 1's batch 50, samples 500-509 -> batch 16 of epoch 1 */
  assert_int_equal(stoke_dist_resume_batch(100, 1, 10, 1, 10, 3, 1000), 33);
  assert_int_equal(stoke_dist_resume_batch(150, 1, 10, 1, 10, 3, 1000), 33 + 16);
  /* the helper's case: ImageNet, 256 a GPU, 8 -> 4 GPUs at step 31,250 (the start of epoch 50: 625 steps an
   * epoch on 8, 1,251 on 4): epoch 50's first batch on 4, 62,550, not 62,500 (epoch 49 again) */
  assert_int_equal(stoke_dist_resume_batch(31250, 1, 256, 8, 256, 4, 1281167), 50 * 1251);
}

/* ------------------------------------------------------- loader shards */

/* A source whose sample i is the float i, label i. */
static int64_t idx_length(void *self) { return (int64_t)(intptr_t)self; }
static stoke_err *idx_info(void *self, stoke_sample_info_v1 *out) {
  (void)self;
  *out = (stoke_sample_info_v1){{1, {1}}, STOKE_F32, STOKE_LAYOUT_ANY, 1000000};
  return NULL;
}
static stoke_err *idx_read(void *self, int64_t i, uint64_t seed, void *dst, int32_t *label) {
  (void)self, (void)seed;
  *(float *)dst = (float)i;
  *label = (int32_t)i;
  return NULL;
}
static const stoke_source_v1 idx_src = {STOKE_ABI(stoke_source_v1), "idx", "", NULL, 0, NULL, NULL, idx_length, idx_info, idx_read};

/* Plain host memory stands in for pinned buffers. */
static stoke_err *h_alloc(void *self, size_t n, void **p) {
  (void)self;
  *p = stoke_alloc(n);
  return *p ? NULL : stoke_err_new(STOKE_E_OOM, __FILE__, __LINE__, "oom");
}
static void h_free(void *self, void *p) {
  (void)self;
  stoke_free(p);
}
static const stoke_backend_v1 host = {.name = "host", .alloc_host = h_alloc, .free_host = h_free};

/* The union of every rank's batch k is the one-process batch k of the
 * global batch (world x batch): a 2-GPU run sees the same samples per step
 * as a 1-GPU run with the same global batch. */
static void test_shards_make_the_global_batch(void **state) {
  (void)state;
  enum { LEN = 1000, B = 8, W = 4, STEPS = 6 };
  int32_t global[STEPS][B * W];
  stoke_loader_opts one = {&idx_src, (void *)(intptr_t)LEN, &host, NULL, B * W, 2, 2, 1, 1, 42, 0, 1, 0, NULL, 0};
  stoke_loader *l;
  assert_null(stoke_loader_new(&one, &l));
  for (int k = 0; k < STEPS; k++) {
    stoke_batch *b;
    assert_null(stoke_loader_next(l, &b, NULL));
    memcpy(global[k], b->labels, sizeof global[k]);
    stoke_loader_release(l, b);
  }
  stoke_loader_free(l);
  int seen[STEPS][B * W];
  memset(seen, 0, sizeof seen);
  for (int r = 0; r < W; r++) {
    stoke_loader_opts o = one;
    o.batch = B, o.rank = r, o.world = W;
    assert_null(stoke_loader_new(&o, &l));
    for (int k = 0; k < STEPS; k++) {
      stoke_batch *b;
      assert_null(stoke_loader_next(l, &b, NULL));
      for (int j = 0; j < B; j++) {
        int found = 0;
        for (int i = 0; i < B * W; i++)
          if (global[k][i] == b->labels[j]) seen[k][i]++, found = 1;
        if (!found) fail_msg("rank %d batch %d: sample %d is not in the global batch", r, k, b->labels[j]);
      }
      stoke_loader_release(l, b);
    }
    stoke_loader_free(l);
  }
  for (int k = 0; k < STEPS; k++)
    for (int i = 0; i < B * W; i++) assert_int_equal(seen[k][i], 1);
}

/* ------------------------------------------------------- the plugin */

static void test_nccl_plugin_loads(void **state) {
  (void)state;
  stoke_registry *r = NULL;
  assert_null(stoke_registry_new(&r));
  stoke_registry_add_path(r, "backends/nccl");
  stoke_err *e = stoke_registry_load(r, "nccl");
  if (e) fail_msg("loading libstoke_nccl.so: %s", e->msg);
  const stoke_comm_v1 *c = stoke_find_comm(r, "nccl");
  assert_non_null(c);
  assert_non_null(c->open);
  assert_non_null(c->all_reduce);
  assert_non_null(c->broadcast);
  assert_non_null(c->barrier);
  stoke_registry_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_none),
      cmocka_unit_test(test_env_torchrun),
      cmocka_unit_test(test_env_precedence),
      cmocka_unit_test(test_env_slurm),
      cmocka_unit_test(test_env_inconsistent),
      cmocka_unit_test(test_buckets_resnet_like),
      cmocka_unit_test(test_buckets_out_of_order),
      cmocka_unit_test(test_resume_mapping),
      cmocka_unit_test(test_shards_make_the_global_batch),
      cmocka_unit_test(test_nccl_plugin_loads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
