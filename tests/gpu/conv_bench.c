/* tests/gpu/conv_bench.c: not a test: times every distinct convolution of
 * ResNet-50 (or ResNet-18c) forward, backward-data and backward-filter
 * through the cudnn engine (graph API) and the cudnn_classic engine
 * (classic API), both autotuned, and probes cuDNN's fused convolution +
 * batch-norm graphs (convbn_graph.c) on the same shapes: whether an engine
 * runs each, and how fast. tools/conv_bench_torch.py times the same
 * convolutions through PyTorch in the same device call.
 *
 *   conv_bench rn50|rn18c [batch] [resolution] [bf16|f16|f32]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cudnn/convbn.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "tests/gpu/bench_util.h"

const stoke_host_v1 *stoke_host; /* graph.c's (compiled into this binary for the probe) */

typedef struct shape {
  const char *what;
  int64_t c, h, k, r, stride, count; /* input channels, input size, output channels, kernel, stride, uses */
} shape;

static const shape rn50[] = {
    {"stem 7x7/2", 3, 224, 64, 7, 2, 1},
    {"stem 7x7/2 C=4 (padded)", 4, 224, 64, 7, 2, 0},
    {"stem 7x7/2 C=8 (padded)", 8, 224, 64, 7, 2, 0},
    {"l1 1x1 64-64", 64, 56, 64, 1, 1, 1},
    {"l1 3x3 64", 64, 56, 64, 3, 1, 3},
    {"l1 1x1 64-256", 64, 56, 256, 1, 1, 4},
    {"l1 1x1 256-64", 256, 56, 64, 1, 1, 2},
    {"l2 1x1 256-128", 256, 56, 128, 1, 1, 1},
    {"l2 3x3/2 128", 128, 56, 128, 3, 2, 1},
    {"l2 1x1 128-512", 128, 28, 512, 1, 1, 4},
    {"l2 ds 1x1/2 256-512", 256, 56, 512, 1, 2, 1},
    {"l2 1x1 512-128", 512, 28, 128, 1, 1, 3},
    {"l2 3x3 128", 128, 28, 128, 3, 1, 3},
    {"l3 1x1 512-256", 512, 28, 256, 1, 1, 1},
    {"l3 3x3/2 256", 256, 28, 256, 3, 2, 1},
    {"l3 1x1 256-1024", 256, 14, 1024, 1, 1, 6},
    {"l3 ds 1x1/2 512-1024", 512, 28, 1024, 1, 2, 1},
    {"l3 1x1 1024-256", 1024, 14, 256, 1, 1, 5},
    {"l3 3x3 256", 256, 14, 256, 3, 1, 5},
    {"l4 1x1 1024-512", 1024, 14, 512, 1, 1, 1},
    {"l4 3x3/2 512", 512, 14, 512, 3, 2, 1},
    {"l4 1x1 512-2048", 512, 7, 2048, 1, 1, 3},
    {"l4 ds 1x1/2 1024-2048", 1024, 14, 2048, 1, 2, 1},
    {"l4 1x1 2048-512", 2048, 7, 512, 1, 1, 2},
    {"l4 3x3 512", 512, 7, 512, 3, 1, 2},
};

static const shape rn18c[] = {
    {"stem 3x3 3-64", 3, 32, 64, 3, 1, 1},
    {"stem 3x3 C=4 (padded)", 4, 32, 64, 3, 1, 0},
    {"stem 3x3 C=8 (padded)", 8, 32, 64, 3, 1, 0},
    {"l1 3x3 64", 64, 32, 64, 3, 1, 4},
    {"l2 3x3/2 64-128", 64, 32, 128, 3, 2, 1},
    {"l2 3x3 128", 128, 16, 128, 3, 1, 3},
    {"l2 ds 1x1/2 64-128", 64, 32, 128, 1, 2, 1},
    {"l3 3x3/2 128-256", 128, 16, 256, 3, 2, 1},
    {"l3 3x3 256", 256, 8, 256, 3, 1, 3},
    {"l3 ds 1x1/2 128-256", 128, 16, 256, 1, 2, 1},
    {"l4 3x3/2 256-512", 256, 8, 512, 3, 2, 1},
    {"l4 3x3 512", 512, 4, 512, 3, 1, 3},
    {"l4 ds 1x1/2 256-512", 256, 8, 512, 1, 2, 1},
};

static stoke_registry *reg;
static const stoke_backend_v1 *dev;
static void *dev_self;

#define DIE(e) BENCH_DIE("conv_bench", e)

static void *dalloc(size_t bytes, int byte) {
  void *p;
  DIE(dev->alloc(dev_self, bytes, &p));
  DIE(dev->fill(dev_self, p, byte, bytes, NULL));
  return p;
}

/* Median of `reps` timed runs of one kernel call (after plan and 2 warm-ups), ms. */
static float time_kernel(const stoke_kernel_v1 *k, stoke_kernel_args_v1 *a, int reps) {
  void *state = NULL, *ws = NULL;
  size_t wsb = 0;
  stoke_err *e = k->plan ? k->plan(a, &state, &wsb) : NULL;
  if (e) {
    printf("      (%s: %s)\n", k->engine, e->msg);
    stoke_err_free(e);
    return NAN;
  }
  if (wsb) DIE(dev->alloc(dev_self, wsb, &ws));
  a->workspace = ws, a->workspace_bytes = wsb;
  void *t[2];
  DIE(dev->timer_create(dev_self, &t[0]));
  DIE(dev->timer_create(dev_self, &t[1]));
  float ms[64];
  for (int r = 0; r < reps + 2; r++) {
    DIE(dev->timer_record(dev_self, t[0], a->stream));
    DIE(k->run(a, state));
    DIE(dev->timer_record(dev_self, t[1], a->stream));
    DIE(dev->timer_sync(dev_self, t[1]));
    if (r >= 2) DIE(dev->timer_elapsed_ms(dev_self, t[0], t[1], &ms[r - 2]));
  }
  float m = bench_median(ms, reps);
  dev->timer_destroy(dev_self, t[0]);
  dev->timer_destroy(dev_self, t[1]);
  if (ws) dev->free(dev_self, ws);
  if (k->destroy && state) k->destroy(state);
  return m;
}

typedef struct problem {
  stoke_node_v1 node;
  stoke_tensor x, w, y, dx, dw, dy;
  double flops;
} problem;

static void make_problem(problem *p, const shape *s, int64_t n, int64_t res_scale_num, int64_t res_scale_den,
                         stoke_dtype dt) {
  int64_t h = s->h * res_scale_num / res_scale_den;
  int64_t pad = s->r / 2, ho = (h + 2 * pad - s->r) / s->stride + 1;
  char attrs[64];
  snprintf(attrs, sizeof attrs, "stride=%lld, padding=%lld", (long long)s->stride, (long long)pad);
  DIE(stoke_node_init(reg, STOKE_OP_CONV2D, s->what, attrs, &p->node));
  stoke_shape xs = {4, {n, s->c, h, h}}, ws = {4, {s->k, s->c, s->r, s->r}}, ys = {4, {n, s->k, ho, ho}};
  size_t es = stoke_dtype_size(dt);
  p->x = (stoke_tensor){dalloc((size_t)stoke_numel(&xs) * es, 0x3c), xs, dt, STOKE_NHWC, STOKE_DEV_GPU};
  p->dx = (stoke_tensor){dalloc((size_t)stoke_numel(&xs) * es, 0), xs, dt, STOKE_NHWC, STOKE_DEV_GPU};
  p->w = (stoke_tensor){dalloc((size_t)stoke_numel(&ws) * es, 0x3c), ws, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
  p->dw = (stoke_tensor){dalloc((size_t)stoke_numel(&ws) * es, 0), ws, dt, STOKE_LAYOUT_ANY, STOKE_DEV_GPU};
  p->y = (stoke_tensor){dalloc((size_t)stoke_numel(&ys) * es, 0), ys, dt, STOKE_NHWC, STOKE_DEV_GPU};
  p->dy = (stoke_tensor){dalloc((size_t)stoke_numel(&ys) * es, 0x3c), ys, dt, STOKE_NHWC, STOKE_DEV_GPU};
  p->flops = 2.0 * (double)stoke_numel(&ys) * (double)(s->c * s->r * s->r);
}

static void free_problem(problem *p) {
  stoke_tensor *t[6] = {&p->x, &p->w, &p->y, &p->dx, &p->dw, &p->dy};
  for (int i = 0; i < 6; i++) dev->free(dev_self, t[i]->data);
}

/* fwd, dgrad, wgrad of one engine on one problem, ms each. */
static void time_engine(const char *engine, void *eself, problem *p, stoke_dtype dt, float out[3]) {
  const stoke_kernel_v1 *kf = stoke_find_kernel(reg, engine, STOKE_OP_CONV2D, STOKE_FWD, dt, STOKE_NHWC);
  const stoke_kernel_v1 *kb = stoke_find_kernel(reg, engine, STOKE_OP_CONV2D, STOKE_BWD, dt, STOKE_NHWC);
  stoke_tensor in[2] = {p->x, p->w}, o[1] = {p->y}, dout[1] = {p->dy};
  stoke_tensor din_d[2] = {p->dx, {0}}, din_w[2] = {{0}, p->dw};
  stoke_kernel_args_v1 a = {.node = &p->node, .n_in = 2, .n_out = 1, .in = in, .out = o, .training = 1,
                            .engine = eself, .stream = dev->default_stream(dev_self),
                            .flags = STOKE_KFLAG_AUTOTUNE};
  out[0] = time_kernel(kf, &a, 9);
  a.dout = dout;
  a.din = din_d;
  out[1] = time_kernel(kb, &a, 9);
  a.din = din_w;
  a.param_grads = 2;
  out[2] = time_kernel(kb, &a, 9);
}

/* ------------------------------------------------------------ fused probe */

static float time_plan(cudnn_engine *eng, const cg_plan *pl, void **ptrs, void *stream) {
  void *ws = pl->workspace ? dalloc((size_t)pl->workspace, 0) : NULL;
  void *t[2];
  DIE(dev->timer_create(dev_self, &t[0]));
  DIE(dev->timer_create(dev_self, &t[1]));
  float ms[9];
  for (int r = 0; r < 11; r++) {
    DIE(dev->timer_record(dev_self, t[0], stream));
    DIE(cg_execute(eng, pl, ptrs, ws, stream, "probe"));
    DIE(dev->timer_record(dev_self, t[1], stream));
    DIE(dev->timer_sync(dev_self, t[1]));
    if (r >= 2) DIE(dev->timer_elapsed_ms(dev_self, t[0], t[1], &ms[r - 2]));
  }
  float m = bench_median(ms, 9);
  dev->timer_destroy(dev_self, t[0]);
  dev->timer_destroy(dev_self, t[1]);
  if (ws) dev->free(dev_self, ws);
  return m;
}

typedef stoke_err *(*probe_fn)(cudnn_engine *, const cg_conv_geom *, cudnnDataType_t, const cg_choice *,
                               const char *, const cg_plan **);

static stoke_err *p_cs(cudnn_engine *e, const cg_conv_geom *g, cudnnDataType_t sb, const cg_choice *c,
                       const char *ctx, const cg_plan **o) {
  return cb_conv_stats(e, g, c, ctx, o);
}
static stoke_err *p_dd(cudnn_engine *e, const cg_conv_geom *g, cudnnDataType_t sb, const cg_choice *c,
                       const char *ctx, const cg_plan **o) {
  return cb_dgrad_drelu_dbn(e, g, c, ctx, o);
}

/* One fused graph on one problem: "ok <ms> (engine)" or why not. */
static void probe_one(cudnn_engine *eng, const char *name, probe_fn f, const cg_conv_geom *g, cudnnDataType_t sb,
                      problem *p, void *stream) {
  cg_choice c = {.autotune = 1, .max_candidates = 4, .stream = stream};
  const cg_plan *pl = NULL;
  char ctx[128];
  snprintf(ctx, sizeof ctx, "probe %s", name);
  cg_conv_geom g2 = *g;
  stoke_err *e = f(eng, &g2, sb, &c, ctx, &pl);
  if (e) { /* the weight as stored failed: staged OHWI? */
    printf("    %-34s OIHW weight: no: %.300s\n", name, e->msg);
    stoke_err_free(e);
    g2.w_krsc = 1;
    e = f(eng, &g2, sb, &c, ctx, &pl);
  }
  if (e) {
    printf("    %-34s OHWI weight: no: %.300s\n", name, e->msg);
    stoke_err_free(e);
    return;
  }
  /* pointers by role: big tensors from the problem, small ones shared */
  size_t cmax = (size_t)(p->x.shape.d[1] > p->y.shape.d[1] ? p->x.shape.d[1] : p->y.shape.d[1]);
  void *small[8];
  for (int i = 0; i < 8; i++) small[i] = dalloc(cmax * 4, 0x3c);
  void *ptrs[CB_DD_COUNT];
  if (f == p_cs) {
    void *q[CB_CS_COUNT] = {p->x.data, p->w.data, p->y.data, small[0], small[1]};
    memcpy(ptrs, q, sizeof q);
  } else if (f == p_dd) {
    void *q[CB_DD_COUNT] = {p->x.data, p->w.data, p->dy.data, small[0], small[1], small[2], small[3], p->dx.data,
                            small[4], small[5], small[6], small[7], small[0]};
    memcpy(ptrs, q, sizeof q);
  } else if (!strncmp(name, "sbr_conv", 8)) {
    void *q[CB_SC_COUNT] = {p->x.data, p->w.data, p->y.data, small[0], small[1], small[2], small[3]};
    memcpy(ptrs, q, sizeof q);
  } else {
    void *q[CB_SW_COUNT] = {p->x.data, p->dw.data, p->dy.data, small[2], small[3]};
    memcpy(ptrs, q, sizeof q);
  }
  float ms = time_plan(eng, pl, ptrs, stream);
  printf("    %-34s ok%s %.3f ms (engine %lld%s, %d candidates, %d built, ws %.1f MiB)\n", name,
         g2.w_krsc ? " (OHWI)" : "", ms,
         (long long)pl->engine_id, pl->runtime_compiled ? " rtc" : "", pl->candidates, pl->built,
         (double)pl->workspace / (1 << 20));
  for (int i = 0; i < 8; i++) dev->free(dev_self, small[i]);
}

static void probe(cudnn_engine *eng, problem *p, const shape *s, stoke_dtype dt, void *stream) {
  cg_conv_geom g;
  memset(&g, 0, sizeof g);
  memcpy(g.x, p->x.shape.d, sizeof g.x);
  memcpy(g.w, p->w.shape.d, sizeof g.w);
  memcpy(g.y, p->y.shape.d, sizeof g.y);
  g.stride[0] = g.stride[1] = s->stride;
  g.pad[0] = g.pad[1] = s->r / 2;
  g.dil[0] = g.dil[1] = 1;
  g.nhwc = 1;
  cudnnDataType_t cdt = dt == STOKE_BF16 ? CUDNN_DATA_BFLOAT16 : dt == STOKE_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  g.dt = cdt;
  probe_one(eng, "conv_stats", p_cs, &g, 0, p, stream);
  probe_one(eng, "sbr_conv_stats (s,b f32)", cb_sbr_conv_stats, &g, CUDNN_DATA_FLOAT, p, stream);
  probe_one(eng, "sbr_conv_stats (s,b io dtype)", cb_sbr_conv_stats, &g, cdt, p, stream);
  probe_one(eng, "sbr_wgrad (s,b f32)", cb_sbr_wgrad, &g, CUDNN_DATA_FLOAT, p, stream);
  probe_one(eng, "sbr_wgrad (s,b io dtype)", cb_sbr_wgrad, &g, cdt, p, stream);
  probe_one(eng, "dgrad_drelu_dbn", p_dd, &g, 0, p, stream);
}

int main(int argc, char **argv) {
  const char *net = argc > 1 ? argv[1] : "rn50";
  int is50 = strcmp(net, "rn18c") != 0;
  int64_t n = argc > 2 ? atoll(argv[2]) : is50 ? 256 : 512;
  int64_t res = argc > 3 ? atoll(argv[3]) : is50 ? 224 : 32;
  stoke_dtype dt = argc > 4 && !strcmp(argv[4], "f16") ? STOKE_F16 : argc > 4 && !strcmp(argv[4], "f32") ? STOKE_F32
                                                                                                           : STOKE_BF16;
  int do_probe = !getenv("NO_PROBE"), do_classic = !getenv("NO_CLASSIC");
  stoke_host = stoke_host_table();
  DIE(stoke_registry_new(&reg));
  DIE(stoke_registry_load(reg, "cuda"));
  DIE(stoke_registry_load(reg, "cudnn"));
  dev = stoke_find_backend(reg, "cuda");
  const stoke_backend_v1 *bg = stoke_find_backend(reg, "cudnn"), *bc = stoke_find_backend(reg, "cudnn_classic");
  void *sg, *sc;
  DIE(dev->open(0, NULL, &dev_self));
  DIE(bg->open(0, dev_self, &sg));
  DIE(bc->open(0, dev_self, &sc));
  cudnn_engine probe_eng;
  memset(&probe_eng, 0, sizeof probe_eng);
  if (cudnnCreate(&probe_eng.handle) != CUDNN_STATUS_SUCCESS) {
    fprintf(stderr, "conv_bench: cudnnCreate failed\n");
    return 1;
  }
  const shape *set = is50 ? rn50 : rn18c;
  int ns = is50 ? (int)(sizeof rn50 / sizeof *rn50) : (int)(sizeof rn18c / sizeof *rn18c);
  int64_t base = is50 ? 224 : 32;
  printf("conv_bench %s batch %lld resolution %lld %s (ms, median of 9 after autotune; x uses per step)\n", net,
         (long long)n, (long long)res, stoke_dtype_name(dt));
  printf("%-24s %4s %9s | %8s %8s %8s | %8s %8s %8s | %6s\n", "conv", "uses", "GFLOP", "cls fwd", "cls dgrd",
         "cls wgrd", "grf fwd", "grf dgrd", "grf wgrd", "gain");
  double tot[2][3] = {{0}};
  for (int i = 0; i < ns; i++) {
    problem p;
    make_problem(&p, &set[i], n, res, base, dt);
    float c[3] = {NAN, NAN, NAN}, g[3];
    if (do_classic) time_engine("cudnn_classic", sc, &p, dt, c);
    time_engine("cudnn", sg, &p, dt, g);
    double cs = 0, gs = 0;
    for (int d = 0; d < 3; d++) {
      if (isfinite(c[d])) tot[0][d] += c[d] * set[i].count, cs += c[d];
      if (isfinite(g[d])) tot[1][d] += g[d] * set[i].count, gs += g[d];
    }
    printf("%-24s %4lld %9.2f | %8.3f %8.3f %8.3f | %8.3f %8.3f %8.3f | %5.2fx\n", set[i].what,
           (long long)set[i].count, p.flops / 1e9, c[0], c[1], c[2], g[0], g[1], g[2], gs > 0 ? cs / gs : NAN);
    fflush(stdout);
    /* the fused-graph probe on the stem and the convolutions used 3+ times */
    if (do_probe && dt != STOKE_F32 && (i == 0 || set[i].count >= 3 || getenv("PROBE_ALL"))) probe(&probe_eng, &p, &set[i], dt, dev->default_stream(dev_self));
    free_problem(&p);
  }
  printf("TOTAL per step (uses counted): classic fwd %.2f dgrad %.2f wgrad %.2f = %.2f ms; graph fwd %.2f dgrad "
         "%.2f wgrad %.2f = %.2f ms\n",
         tot[0][0], tot[0][1], tot[0][2], tot[0][0] + tot[0][1] + tot[0][2], tot[1][0], tot[1][1], tot[1][2],
         tot[1][0] + tot[1][1] + tot[1][2]);
  cg_cache_free(&probe_eng);
  cudnnDestroy(probe_eng.handle);
  bc->close(sc);
  bg->close(sg);
  dev->close(dev_self);
  stoke_registry_free(reg);
  return 0;
}
