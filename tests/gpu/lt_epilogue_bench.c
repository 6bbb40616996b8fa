/* tests/gpu/lt_epilogue_bench.c: times the cublaslt engine's products with
 * and without the activation epilogues, and the cuda engine's separate
 * activation passes they replace, on the mlp bench's hidden layer (N = K =
 * O = 4096, bf16 unless a dtype is given): what core/fuse_act.c's choices
 * rest on. Each line is the median of 30 timed calls (device timers) after
 * 5 warm-up calls; every cuBLASLt product twice, with the heuristic's first
 * algorithm and autotuned (STOKE_KFLAG_AUTOTUNE: the fastest of its
 * candidates, timed in plan(), logged with the algorithm chosen). A
 * benchmark, not a test (it checks nothing): run it with STOKE_LOG=debug to
 * see which epilogue each plan got. GPU machine only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"

#define WARMUP 5
#define TIMED 30

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Median milliseconds of one kernel call (plan and workspace once). */
static double time_kernel(const stoke_kernel_v1 *k, stoke_kernel_args_v1 *a) {
  void *state = NULL, *ws = NULL, *t0, *t1;
  size_t wsb = 0;
  stoke_err *e = k->plan ? k->plan(a, &state, &wsb) : NULL;
  if (!e && wsb) e = g_dev->alloc(g_dev_self, wsb, &ws);
  a->workspace = ws;
  a->workspace_bytes = wsb;
  if (!e) e = g_dev->timer_create(g_dev_self, &t0);
  if (!e) e = g_dev->timer_create(g_dev_self, &t1);
  float ms[TIMED];
  for (int i = 0; i < WARMUP + TIMED && !e; i++) {
    e = g_dev->timer_record(g_dev_self, t0, a->stream);
    if (!e) e = k->run(a, state);
    if (!e) e = g_dev->timer_record(g_dev_self, t1, a->stream);
    if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
    if (!e && i >= WARMUP) e = g_dev->timer_elapsed_ms(g_dev_self, t0, t1, &ms[i - WARMUP]);
  }
  if (e) fail_msg("%s %s: %s", k->engine, k->op, e->msg);
  g_dev->timer_destroy(g_dev_self, t0);
  g_dev->timer_destroy(g_dev_self, t1);
  if (k->destroy && state) k->destroy(state);
  if (ws) g_dev->free(g_dev_self, ws);
  qsort(ms, TIMED, sizeof *ms, by_value);
  return ms[TIMED / 2];
}

static stoke_node_v1 node(const char *op, const char *attrs) {
  stoke_node_v1 n;
  stoke_err *e = stoke_node_init(g_reg, op, op, attrs, &n);
  if (e) fail_msg("%s", e->msg);
  return n;
}

static void bench(void **state) {
  const char *dt_env = getenv("BENCH_DTYPE");
  stoke_dtype dt = dt_env && !strcmp(dt_env, "f16") ? STOKE_F16 : dt_env && !strcmp(dt_env, "f32") ? STOKE_F32
                                                                                                   : STOKE_BF16;
  const int64_t n = 4096, k = 4096, o = 4096; /* K = O: y1 and y share shapes, and so do their aux */
  stoke_shape xs = {2, {n, k}}, ws = {2, {o, k}}, bs = {1, {o}}, ys = {2, {n, o}};
  stoke_shape ms = {2, {n, (o + 127) / 128 * 16}};
  g_tensor x, w, b, y, mask, z, dy, dx, dw, db, db1;
  g_alloc(&x, &xs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&w, &ws, dt, STOKE_LAYOUT_ANY);
  g_alloc(&b, &bs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&y, &ys, dt, STOKE_LAYOUT_ANY);
  g_alloc(&mask, &ms, STOKE_U8, STOKE_LAYOUT_ANY);
  g_alloc(&z, &ys, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dy, &ys, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dx, &xs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&dw, &ws, dt, STOKE_LAYOUT_ANY);
  g_alloc(&db, &bs, dt, STOKE_LAYOUT_ANY);
  g_alloc(&db1, &bs, dt, STOKE_LAYOUT_ANY);
  stoke_rng r = stoke_rng_seed(g_seed);
  g_fill(&x, &r, -1, 1, 0);
  g_fill(&w, &r, -0.03, 0.03, 0);
  g_fill(&b, &r, -1, 1, 0);
  g_fill(&dy, &r, -1, 1, 0);
  g_fill(&z, &r, -3, 3, 0);
  g_fill(&mask, &r, 0, 256, 1);
  void *stream = g_dev->default_stream(g_dev_self);
  stoke_node_v1 lin = node(STOKE_OP_LINEAR, ""), relu_fwd = node(STOKE_OP_LINEAR_ACT, "act=relu"),
                gelu_fwd = node(STOKE_OP_LINEAR_ACT, "act=gelu, approximate=tanh"),
                drelu = node(STOKE_OP_LINEAR_DACT, "act=relu"),
                dgelu = node(STOKE_OP_LINEAR_DACT, "act=gelu, approximate=tanh"), relu = node(STOKE_OP_RELU, ""),
                gelu = node(STOKE_OP_GELU, "approximate=tanh");
  const stoke_tensor none = {0};
  struct row {
    const char *what;
    const stoke_node_v1 *nd;
    stoke_pass pass;
    stoke_tensor in[5], out[2], din[5], dout[1];
    int n_in, n_out;
  } rows[] = {
      {"linear fwd (EPILOGUE_BIAS)", &lin, STOKE_FWD, {x.dev, w.dev, b.dev}, {y.dev}, {none}, {none}, 3, 1},
      {"linear_act relu fwd (RELU_AUX_BIAS)", &relu_fwd, STOKE_FWD, {x.dev, w.dev, b.dev}, {y.dev, mask.dev},
       {none}, {none}, 3, 2},
      {"linear_act gelu fwd (GELU_AUX_BIAS)", &gelu_fwd, STOKE_FWD, {x.dev, w.dev, b.dev}, {y.dev, z.dev},
       {none}, {none}, 3, 2},
      {"relu fwd [cuda]", &relu, STOKE_FWD, {y.dev}, {dx.dev}, {none}, {none}, 1, 1},
      {"gelu fwd [cuda]", &gelu, STOKE_FWD, {y.dev}, {dx.dev}, {none}, {none}, 1, 1},
      {"linear bwd dx (plain)", &lin, STOKE_BWD, {x.dev, w.dev, b.dev}, {y.dev}, {dx.dev, none, none},
       {dy.dev}, 3, 1},
      {"linear_dact relu dz (DRELU)", &drelu, STOKE_BWD, {x.dev, w.dev, b.dev, mask.dev, db1.dev}, {y.dev},
       {dx.dev, none, none, none, none}, {dy.dev}, 5, 1},
      {"linear_dact relu dz+dbias (DRELU_BGRAD)", &drelu, STOKE_BWD, {x.dev, w.dev, b.dev, mask.dev, db1.dev},
       {y.dev}, {dx.dev, none, none, none, db1.dev}, {dy.dev}, 5, 1},
      {"linear_dact gelu dz (DGELU)", &dgelu, STOKE_BWD, {x.dev, w.dev, b.dev, z.dev, db1.dev}, {y.dev},
       {dx.dev, none, none, none, none}, {dy.dev}, 5, 1},
      {"linear_dact gelu dz+dbias (DGELU_BGRAD)", &dgelu, STOKE_BWD, {x.dev, w.dev, b.dev, z.dev, db1.dev},
       {y.dev}, {dx.dev, none, none, none, db1.dev}, {dy.dev}, 5, 1},
      {"relu bwd [cuda]", &relu, STOKE_BWD, {y.dev}, {y.dev}, {dx.dev}, {dy.dev}, 1, 1},
      {"gelu bwd [cuda]", &gelu, STOKE_BWD, {y.dev}, {y.dev}, {dx.dev}, {dy.dev}, 1, 1},
      {"linear bwd dW (plain)", &lin, STOKE_BWD, {x.dev, w.dev, b.dev}, {y.dev}, {none, dw.dev, none}, {dy.dev},
       3, 1},
      {"linear bwd dW+db (BGRADB)", &lin, STOKE_BWD, {x.dev, w.dev, b.dev}, {y.dev}, {none, dw.dev, db.dev},
       {dy.dev}, 3, 1},
      {"linear bwd dx+dW+db", &lin, STOKE_BWD, {x.dev, w.dev, b.dev}, {y.dev}, {dx.dev, dw.dev, db.dev}, {dy.dev},
       3, 1},
  };
  print_message("cublaslt epilogues, N = K = O = %lld, %s (median of %d calls, ms): heuristic's first algorithm, "
                "then autotuned\n",
                (long long)n, stoke_dtype_name(dt), TIMED);
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    struct row *rw = &rows[i];
    stoke_kernel_args_v1 a = {.node = rw->nd, .n_in = rw->n_in, .n_out = rw->n_out, .in = rw->in, .out = rw->out,
                              .training = 1, .stream = stream};
    if (rw->pass == STOKE_BWD) {
      a.din = rw->din;
      a.dout = rw->dout;
      a.param_grads = (1u << 1) | (1u << 2) | (1u << 4);
    }
    const stoke_kernel_v1 *kern = g_gpu_kernel(rw->nd->op, rw->pass, dt, STOKE_LAYOUT_ANY, &a.engine);
    double flops = !strcmp(rw->nd->op, STOKE_OP_RELU) || !strcmp(rw->nd->op, STOKE_OP_GELU) ? 0 : 2.0 * n * k * o;
    if (strstr(rw->what, "dx+dW")) flops *= 2;
    double t = time_kernel(kern, &a);
    print_message("  %-42s %8.4f ms", rw->what, t);
    if (flops) { /* a cuBLASLt product: again, autotuned */
      a.flags = STOKE_KFLAG_AUTOTUNE;
      double tt = time_kernel(kern, &a);
      print_message(" (%3.0f TFLOP/s)  autotuned %8.4f ms (%3.0f TFLOP/s, %+5.1f%%)", flops / t / 1e9, tt,
                    flops / tt / 1e9, 100.0 * (tt - t) / t);
    }
    print_message("\n");
  }
  g_tensor *all[] = {&x, &w, &b, &y, &mask, &z, &dy, &dx, &dw, &db, &db1};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) g_free(all[i]);
}

static int setup(void **state) { return g_setup_engines((const char *[]){"cuda", "cublaslt"}, 2); }

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(bench)};
  return cmocka_run_group_tests(tests, setup, g_teardown);
}
