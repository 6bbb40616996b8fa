/* tests/gpu/bn_bench.c: not a test: times the batch-norm family of
 * ResNet-50's step (bn_relu, bn_add_relu, and bn_add_bn_relu where a block's
 * downsample shortcut's batch norm is joined in, or with BN_SHORTCUT=kept
 * that batch_norm on its own as run.fuse_shortcut = false plans it;
 * training forward and backward) on each of its shapes, through
 * the first engine of (fused, cudnn, cuda) that serves each, and prints the
 * time against the memory floor: the bytes the two-pass algorithm must move
 * (forward: x read by the statistics pass, x (and r) read and y written by
 * the apply pass; backward: dy and x (and y) read by the reduction pass,
 * read again and dx written by the apply pass; bn_add_relu's reduction pass
 * writes dr, its apply pass reads x and dr; bn_add_bn_relu's statistics
 * read x and r, its apply pass x and r, writing y, and its two backward
 * passes each read x, r and dy, the second writing dx and dr) over the H100's
 * 3.35 TB/s, and a device copy's measured rate for scale. Inputs are random
 * (never zeros). Before each timed call the L2 is flushed (a 128 MB fill),
 * then the node's producer is imitated: x (forward) or dy (backward) is
 * written again by a copy, as the convolution before it writes it in the
 * step, so what of it the L2 still holds is there as in the step. Per-step
 * totals count each shape's uses. tools/gpu_suite.sh runs it (part bn).
 *
 *   bn_bench [batch] [bf16|f16] [reps]
 * BN_ENGINES=fused,cudnn,cuda (default) picks the engines, in order;
 * BN_ONLY=<shape name> times that site alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "tests/gpu/bench_util.h"
#include "stoke/rng.h"

#define PEAK_GBS 3350.0 /* H100 SXM datasheet */

typedef struct site {
  const char *op, *what;
  int64_t c, h;         /* channels, spatial size (square) */
  int64_t uses, uses_kept; /* uses per step with the shortcuts joined (the default), and kept apart */
} site;

static const site sites[] = {
    {STOKE_OP_BN_RELU, "stem", 64, 112, 1, 1},
    {STOKE_OP_BN_RELU, "l1 64@56", 64, 56, 6, 6},
    {STOKE_OP_BN_RELU, "l2 128@56", 128, 56, 1, 1},
    {STOKE_OP_BN_RELU, "l2 128@28", 128, 28, 7, 7},
    {STOKE_OP_BN_RELU, "l3 256@28", 256, 28, 1, 1},
    {STOKE_OP_BN_RELU, "l3 256@14", 256, 14, 11, 11},
    {STOKE_OP_BN_RELU, "l4 512@14", 512, 14, 1, 1},
    {STOKE_OP_BN_RELU, "l4 512@7", 512, 7, 5, 5},
    {STOKE_OP_BN_ADD_RELU, "l1 256@56", 256, 56, 2, 3},
    {STOKE_OP_BN_ADD_RELU, "l2 512@28", 512, 28, 3, 4},
    {STOKE_OP_BN_ADD_RELU, "l3 1024@14", 1024, 14, 5, 6},
    {STOKE_OP_BN_ADD_RELU, "l4 2048@7", 2048, 7, 2, 3},
    {STOKE_OP_BN_ADD_BN_RELU, "ds l1 256@56", 256, 56, 1, 0},
    {STOKE_OP_BN_ADD_BN_RELU, "ds l2 512@28", 512, 28, 1, 0},
    {STOKE_OP_BN_ADD_BN_RELU, "ds l3 1024@14", 1024, 14, 1, 0},
    {STOKE_OP_BN_ADD_BN_RELU, "ds l4 2048@7", 2048, 7, 1, 0},
    {STOKE_OP_BATCH_NORM, "ds l1 256@56", 256, 56, 0, 1},
    {STOKE_OP_BATCH_NORM, "ds l2 512@28", 512, 28, 0, 1},
    {STOKE_OP_BATCH_NORM, "ds l3 1024@14", 1024, 14, 0, 1},
    {STOKE_OP_BATCH_NORM, "ds l4 2048@7", 2048, 7, 0, 1},
};
#define N_SITES ((int)(sizeof sites / sizeof *sites))

static stoke_registry *reg;
static const stoke_backend_v1 *dev;
static void *dev_self;
static const char *engines[8];
static void *engine_self[8];
static int n_engines;

#define DIE(e) BENCH_DIE("bn_bench", e)

static void *dalloc(size_t bytes) {
  void *p;
  DIE(dev->alloc(dev_self, bytes ? bytes : 16, &p));
  return p;
}

/* Random values in [lo, hi) of dtype dt, n of them: a host block of up to
 * 8M values, uploaded once and copied along the buffer. */
static void fill_random(void *d, stoke_dtype dt, int64_t n, double lo, double hi, stoke_rng *r) {
  size_t es = stoke_dtype_size(dt);
  int64_t blk = n < (1 << 23) ? n : (1 << 23);
  void *h = malloc((size_t)blk * es);
  for (int64_t i = 0; i < blk; i++) stoke_elem_set(h, dt, i, lo + (hi - lo) * stoke_rng_uniform(r));
  DIE(dev->copy(dev_self, d, h, (size_t)blk * es, STOKE_COPY_H2D, NULL));
  for (int64_t o = blk; o < n; o += blk) {
    int64_t k = n - o < blk ? n - o : blk;
    DIE(dev->copy(dev_self, (char *)d + o * es, d, (size_t)k * es, STOKE_COPY_D2D, NULL));
  }
  DIE(dev->stream_sync(dev_self, NULL));
  free(h);
}

static void *flush_buf;
static const size_t flush_bytes = 128u << 20; /* over the H100's 50 MB L2 */

/* What runs before each call: the L2 flushed, then `bytes` of src copied
 * to dst (the producer writing the node's input). */
typedef struct prep {
  void *dst;
  const void *src;
  size_t bytes;
} prep;

/* Median ms of `reps` calls of k (after one untimed), p run before each. */
static float time_kernel(const stoke_kernel_v1 *k, stoke_kernel_args_v1 *a, int reps, const prep *p) {
  void *state = NULL, *ws = NULL;
  size_t wsb = 0;
  DIE(k->plan ? k->plan(a, &state, &wsb) : NULL);
  if (wsb) ws = dalloc(wsb);
  a->workspace = ws, a->workspace_bytes = wsb;
  void *t[2];
  DIE(dev->timer_create(dev_self, &t[0]));
  DIE(dev->timer_create(dev_self, &t[1]));
  float ms[64];
  if (reps > 64) reps = 64;
  for (int r = 0; r < reps + 1; r++) {
    DIE(dev->fill(dev_self, flush_buf, r & 0xff, flush_bytes, a->stream));
    DIE(dev->copy(dev_self, p->dst, p->src, p->bytes, STOKE_COPY_D2D, a->stream));
    DIE(dev->timer_record(dev_self, t[0], a->stream));
    DIE(k->run(a, state));
    DIE(dev->timer_record(dev_self, t[1], a->stream));
    DIE(dev->timer_sync(dev_self, t[1]));
    if (r >= 1) DIE(dev->timer_elapsed_ms(dev_self, t[0], t[1], &ms[r - 1]));
  }
  dev->timer_destroy(dev_self, t[0]);
  dev->timer_destroy(dev_self, t[1]);
  if (ws) dev->free(dev_self, ws);
  if (k->destroy && state) k->destroy(state);
  return bench_median(ms, reps);
}

/* The first engine with a kernel for (op, pass, dt, NHWC). */
static const stoke_kernel_v1 *find(const char *op, stoke_pass pass, stoke_dtype dt, void **self) {
  for (int i = 0; i < n_engines; i++) {
    const stoke_kernel_v1 *k = stoke_find_kernel(reg, engines[i], op, pass, dt, STOKE_NHWC);
    if (k) {
      *self = engine_self[i];
      return k;
    }
  }
  return NULL;
}

/* The floor's bytes per element, in elements of the activation dtype:
 * forward and backward of the two-pass algorithm (see the top).
 * bn_add_relu's forward also writes the ReLU bitmask (1/8 byte an
 * element); its backward: x, dy and the bitmask read and dr written by the
 * reduction pass, x and dr read and dx written by the apply pass
 * (backends/fused/bn_act.cu: the apply pass reads dz back from dr). */
static void floor_elems(const char *op, double *fwd, double *bwd, stoke_dtype dt) {
  int add = !strcmp(op, STOKE_OP_BN_ADD_RELU), dual = !strcmp(op, STOKE_OP_BN_ADD_BN_RELU);
  double bit = 0.125 / (double)stoke_dtype_size(dt); /* a mask bit in elements */
  *fwd = dual ? 5 + bit : add ? 4 + bit : 3;
  *bwd = dual ? 8 + 2 * bit : add ? 6 + bit : 5;
}

/* Forward and backward ms of one site; 0 when no engine serves it. */
static void run_site(const site *s, int64_t batch, stoke_dtype dt, int reps, stoke_rng *rng, float out[2],
                     const char **eng) {
  int dual = !strcmp(s->op, STOKE_OP_BN_ADD_BN_RELU), add = !strcmp(s->op, STOKE_OP_BN_ADD_RELU) || dual;
  int n_in = dual ? 10 : add ? 6 : 5, n_out = dual ? 6 : add ? 4 : 3;
  void *fself = NULL, *bself = NULL;
  const stoke_kernel_v1 *kf = find(s->op, STOKE_FWD, dt, &fself), *kb = find(s->op, STOKE_BWD, dt, &bself);
  out[0] = out[1] = 0;
  *eng = kf ? kf->engine : "-";
  if (!kf || !kb) return;
  stoke_node_v1 node;
  DIE(stoke_node_init(reg, s->op, s->what,
                      dual ? "eps=1e-5, momentum=0.1, shortcut_eps=1e-5, shortcut_momentum=0.1" : "eps=1e-5, momentum=0.1",
                      &node));
  stoke_shape xs = {4, {batch, s->c, s->h, s->h}}, cs = {1, {s->c}};
  int64_t n = stoke_numel(&xs);
  size_t es = stoke_dtype_size(dt);
  stoke_tensor in[10], o[6], din[10], dout[6];
  memset(in, 0, sizeof in), memset(o, 0, sizeof o), memset(din, 0, sizeof din), memset(dout, 0, sizeof dout);
  for (int i = 0; i < n_in; i++) {
    int act = i == 0 || i == 5, stat = i == 3 || i == 4 || i == 8 || i == 9, pos = i == 1 || i == 4 || i == 6 || i == 9;
    stoke_dtype t = stat ? STOKE_F32 : dt;
    in[i] = (stoke_tensor){dalloc((size_t)(act ? n : s->c) * stoke_dtype_size(t)), act ? xs : cs, t,
                           act ? STOKE_NHWC : STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
    double lo = pos ? 0.5 : -1, hi = pos ? 1.5 : 1; /* weights and running variances positive */
    fill_random(in[i].data, t, act ? n : s->c, act ? -2 : lo, act ? 3 : hi, rng);
  }
  o[0] = (stoke_tensor){dalloc((size_t)n * es), xs, dt, STOKE_NHWC, STOKE_DEV_GPU};
  for (int j = 1; j < n_out; j++)
    if (j != 3) o[j] = (stoke_tensor){dalloc((size_t)s->c * 4), cs, STOKE_F32, STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
  if (add) {
    stoke_shape ms = {1, {stoke_relu_mask_bytes(n)}};
    o[3] = (stoke_tensor){dalloc((size_t)ms.d[0]), ms, STOKE_U8, STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
  }
  dout[0] = (stoke_tensor){dalloc((size_t)n * es), xs, dt, STOKE_NHWC, STOKE_DEV_GPU};
  fill_random(dout[0].data, dt, n, -1, 1, rng);
  for (int i = 0; i < n_in; i++) {
    if (i == 3 || i == 4 || i == 8 || i == 9) continue;
    int act = i == 0 || i == 5;
    din[i] = (stoke_tensor){dalloc((size_t)(act ? n : s->c) * es), act ? xs : cs, dt,
                            act ? STOKE_NHWC : STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
  }
  /* the producers' data: x and dy as first drawn, copied in before each call */
  void *x0 = dalloc((size_t)n * es), *dy0 = dalloc((size_t)n * es);
  DIE(dev->copy(dev_self, x0, in[0].data, (size_t)n * es, STOKE_COPY_D2D, NULL));
  DIE(dev->copy(dev_self, dy0, dout[0].data, (size_t)n * es, STOKE_COPY_D2D, NULL));
  prep px = {in[0].data, x0, (size_t)n * es}, pdy = {dout[0].data, dy0, (size_t)n * es};
  void *stream = dev->default_stream(dev_self);
  stoke_kernel_args_v1 a = {.node = &node, .n_in = n_in, .n_out = n_out, .in = in, .out = o, .training = 1,
                            .engine = fself, .stream = stream};
  out[0] = time_kernel(kf, &a, reps, &px);
  /* backward: every input's gradient (the parameters' overwritten) */
  stoke_kernel_args_v1 b = a;
  b.engine = bself, b.din = din, b.dout = dout, b.param_grads = dual ? 0xc6u : 6u, b.param_grad_beta = 0;
  out[1] = time_kernel(kb, &b, reps, &pdy);
  dev->free(dev_self, x0);
  dev->free(dev_self, dy0);
  for (int i = 0; i < n_in; i++) dev->free(dev_self, in[i].data), dev->free(dev_self, din[i].data);
  for (int j = 0; j < n_out; j++) dev->free(dev_self, o[j].data);
  dev->free(dev_self, dout[0].data);
}

/* A device-to-device copy of 1 GiB: GB/s counting bytes read and written. */
static double copy_rate(void) {
  size_t bytes = 1u << 30;
  void *a = dalloc(bytes), *b = dalloc(bytes);
  DIE(dev->fill(dev_self, a, 0x3c, bytes, NULL));
  void *t[2];
  DIE(dev->timer_create(dev_self, &t[0]));
  DIE(dev->timer_create(dev_self, &t[1]));
  float ms[7];
  for (int r = 0; r < 8; r++) {
    DIE(dev->timer_record(dev_self, t[0], NULL));
    DIE(dev->copy(dev_self, b, a, bytes, STOKE_COPY_D2D, NULL));
    DIE(dev->timer_record(dev_self, t[1], NULL));
    DIE(dev->timer_sync(dev_self, t[1]));
    if (r) DIE(dev->timer_elapsed_ms(dev_self, t[0], t[1], &ms[r - 1]));
  }
  dev->timer_destroy(dev_self, t[0]);
  dev->timer_destroy(dev_self, t[1]);
  dev->free(dev_self, a);
  dev->free(dev_self, b);
  return 2.0 * (double)bytes / (bench_median(ms, 7) * 1e-3) / 1e9;
}

int main(int argc, char **argv) {
  int64_t batch = argc > 1 ? atoll(argv[1]) : 256;
  stoke_dtype dt = argc > 2 && !strcmp(argv[2], "f16") ? STOKE_F16 : STOKE_BF16;
  int reps = argc > 3 ? atoi(argv[3]) : 15;
  if (reps < 1) reps = 1;
  char list[256];
  snprintf(list, sizeof list, "%s", getenv("BN_ENGINES") ? getenv("BN_ENGINES") : "fused,cudnn,cuda");
  DIE(stoke_registry_new(&reg));
  DIE(stoke_registry_load(reg, "cuda"));
  for (char *tok = strtok(list, ","); tok && n_engines < 8; tok = strtok(NULL, ","))
    if (strcmp(tok, "cuda")) {
      DIE(stoke_registry_load(reg, tok));
      engines[n_engines++] = tok;
    }
  engines[n_engines++] = "cuda";
  dev = stoke_find_backend(reg, "cuda");
  DIE(dev->open(0, NULL, &dev_self));
  for (int i = 0; i < n_engines; i++) {
    const stoke_backend_v1 *b = stoke_find_backend(reg, engines[i]);
    if (!b) DIE(STOKE_ERR(STOKE_E_NOT_FOUND, "no backend %s", engines[i]));
    if (b == dev) engine_self[i] = dev_self;
    else DIE(b->open(0, dev_self, &engine_self[i]));
  }
  flush_buf = dalloc(flush_bytes);
  double copy_gbs = copy_rate();
  stoke_rng rng = stoke_rng_seed(12345);
  printf("bn_bench batch %lld %s, %d reps (median), L2 flushed and x (dy) rewritten before each call; engines %s\n", (long long)batch,
         stoke_dtype_name(dt), reps, getenv("BN_ENGINES") ? getenv("BN_ENGINES") : "fused,cudnn,cuda");
  printf("device copy: %.0f GB/s (read + write); floor = the two-pass bytes at %.0f GB/s\n", copy_gbs, PEAK_GBS);
  printf("%-14s %-14s %4s %7s | %8s %8s %6s %4s | %8s %8s %6s %4s\n", "op", "shape", "uses", "engine", "fwd ms",
         "floor", "GB/s", "%", "bwd ms", "floor", "GB/s", "%");
  double tot[4][4] = {{0}}; /* per op kind: fwd ms, fwd floor, bwd ms, bwd floor (uses counted) */
  const char *kinds[4] = {STOKE_OP_BN_RELU, STOKE_OP_BN_ADD_RELU, STOKE_OP_BN_ADD_BN_RELU, STOKE_OP_BATCH_NORM};
  int kept = getenv("BN_SHORTCUT") && !strcmp(getenv("BN_SHORTCUT"), "kept");
  size_t es = stoke_dtype_size(dt);
  const char *only = getenv("BN_ONLY"); /* a site's name: that one alone (under ncu) */
  for (int i = 0; i < N_SITES; i++) {
    const site *s = &sites[i];
    int64_t uses = kept ? s->uses_kept : s->uses;
    if (!uses || (only && strcmp(only, s->what))) continue;
    float ms[2];
    const char *eng;
    run_site(s, batch, dt, reps, &rng, ms, &eng);
    double n = (double)batch * (double)(s->c * s->h * s->h), ef, eb;
    floor_elems(s->op, &ef, &eb, dt);
    double bf = ef * n * (double)es, bb = eb * n * (double)es;
    double ff = bf / PEAK_GBS / 1e6, fb = bb / PEAK_GBS / 1e6; /* ms */
    printf("%-14s %-14s %4lld %7s | %8.3f %8.3f %6.0f %3.0f%% | %8.3f %8.3f %6.0f %3.0f%%\n", s->op, s->what,
           (long long)uses, eng, ms[0], ff, bf / (ms[0] * 1e6), 100 * ff / ms[0], ms[1], fb, bb / (ms[1] * 1e6),
           100 * fb / ms[1]);
    fflush(stdout);
    int k = 0;
    while (k < 3 && strcmp(kinds[k], s->op)) k++;
    tot[k][0] += ms[0] * uses, tot[k][1] += ff * uses, tot[k][2] += ms[1] * uses, tot[k][3] += fb * uses;
  }
  double all[4] = {0};
  printf("per step (uses counted):\n");
  for (int k = 0; k < 4; k++) {
    if (!tot[k][0]) continue;
    printf("  %-14s fwd %7.3f ms (floor %6.3f, %3.0f%%)  bwd %7.3f ms (floor %6.3f, %3.0f%%)\n", kinds[k],
           tot[k][0], tot[k][1], 100 * tot[k][1] / tot[k][0], tot[k][2], tot[k][3], 100 * tot[k][3] / tot[k][2]);
    for (int j = 0; j < 4; j++) all[j] += tot[k][j];
  }
  printf("  %-14s fwd %7.3f ms (floor %6.3f)  bwd %7.3f ms (floor %6.3f); total %.3f ms, floor %.3f ms (%.0f%%)\n",
         "all", all[0], all[1], all[2], all[3], all[0] + all[2], all[1] + all[3],
         100 * (all[1] + all[3]) / (all[0] + all[2]));
  dev->free(dev_self, flush_buf);
  for (int i = n_engines - 1; i >= 0; i--) {
    const stoke_backend_v1 *b = stoke_find_backend(reg, engines[i]);
    if (b != dev && b->close) b->close(engine_self[i]);
  }
  dev->close(dev_self);
  stoke_registry_free(reg);
  return 0;
}
