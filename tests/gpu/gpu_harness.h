/* tests/gpu/gpu_harness.h: checks one GPU kernel against the CPU reference
 * kernel: fresh random inputs (drawn in double), the CPU kernel in f64, the
 * GPU kernel in the dtype under test, outputs poisoned (all bits set: NaN
 * for floats) before the GPU runs so unwritten elements fail, and the
 * relative-norm error ||gpu - ref|| / ||ref|| printed and bounded by the
 * dtype's tolerance. Forward and backward. Runs only on a GPU machine.
 * Include after cmocka.h; every helper is static. */
#ifndef STOKE_TESTS_GPU_HARNESS_H
#define STOKE_TESTS_GPU_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "stoke/rng.h"
#include "tests/common/seed.h"

#define G_FN static __attribute__((unused))

static stoke_registry *g_reg;
static const stoke_backend_v1 *g_dev;
static void *g_dev_self;
static void *g_engine_self[8];
static const char *g_engines[8];
static int g_n_engines;
static uint64_t g_seed;

/* Tolerances on the relative-norm error, by what the GPU computes in. */
#define G_TOL_F32 1e-5
#define G_TOL_TF32 1e-3
#define G_TOL_LOW 1e-2 /* bf16, fp16 */

/* A bound derived from the number format and the reduction length: the
 * output rounded to `t` (unit roundoff u: 2^-8 bf16, 2^-11 fp16, 2^-24
 * f32) after float arithmetic whose sums run over n terms (error growing
 * as sqrt(n) float roundoffs); 3 u covers the output's rounding and that
 * of a rounded intermediate (add_layer_norm's sum), 8 sqrt(n) 2^-24 the
 * float sums with margin. */
G_FN double g_tol(stoke_dtype t, int64_t n) {
  double u = t == STOKE_BF16 ? 0x1p-8 : t == STOKE_F16 ? 0x1p-11 : 0x1p-24;
  return 3 * u + 8 * stoke_sum_roundoff(STOKE_F32, (double)n);
}

G_FN stoke_err *g_load(const char *name) {
  char path[256];
  snprintf(path, sizeof path, "%s", name);
  return stoke_registry_load(g_reg, path);
}

/* Load the cpu plugin and the GPU engines (their plugins are found on
 * STOKE_PLUGIN_PATH or next to the binary), open the cuda device first. */
G_FN int g_setup_engines(const char *const *engines, int n) {
  stoke_err *e = stoke_registry_new(&g_reg);
  if (!e) e = stoke_registry_load(g_reg, "cpu");
  for (int i = 0; i < n && !e; i++) e = stoke_registry_load(g_reg, engines[i]);
  g_dev = e ? NULL : stoke_find_backend(g_reg, "cuda");
  if (!e && !g_dev) e = STOKE_ERR(STOKE_E_NOT_FOUND, "no cuda backend");
  for (int i = 0; i < n && !e; i++) {
    const stoke_backend_v1 *b = stoke_find_backend(g_reg, engines[i]);
    if (!b) {
      e = STOKE_ERR(STOKE_E_NOT_FOUND, "no backend '%s'", engines[i]);
      break;
    }
    e = b->open(0, b == g_dev ? NULL : g_dev_self, &g_engine_self[i]);
    if (!e && b == g_dev) g_dev_self = g_engine_self[i];
    g_engines[i] = engines[i];
    g_n_engines = i + 1;
  }
  if (e) {
    print_error("GPU setup: %s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  g_seed = test_seed("gpu test");
  return 0;
}

G_FN int g_teardown(void **state) {
  for (int i = g_n_engines - 1; i >= 0; i--) {
    const stoke_backend_v1 *b = stoke_find_backend(g_reg, g_engines[i]);
    if (b && b->close) b->close(g_engine_self[i]);
  }
  stoke_registry_free(g_reg);
  return 0;
}

/* Tests of one engine that runs on the cuda device (cudnn, fused):
 * g_setup_engines opens cuda first, then the list is reordered to
 * (engine, cuda), as `backends = engine, ...` orders it, so that
 * g_gpu_kernel finds the engine's kernels first. */
G_FN void g_swap_first_two(void) {
  const char *n = g_engines[0];
  void *s = g_engine_self[0];
  g_engines[0] = g_engines[1], g_engine_self[0] = g_engine_self[1];
  g_engines[1] = n, g_engine_self[1] = s;
}

G_FN int g_setup_engine_first(const char *engine) {
  if (g_setup_engines((const char *[]){"cuda", engine}, 2)) return -1;
  g_swap_first_two();
  return 0;
}

G_FN int g_teardown_engine_first(void **state) {
  g_swap_first_two(); /* close in the order g_setup_engines expects */
  return g_teardown(state);
}

/* The open engine `name`'s self. */
G_FN void *g_engine_self_of(const char *name) {
  for (int i = 0; i < g_n_engines; i++)
    if (!strcmp(g_engines[i], name)) return g_engine_self[i];
  fail_msg("engine %s not open", name);
  return NULL;
}

/* ------------------------------------------------------------- buffers */

#define g_get stoke_elem_get
#define g_set stoke_elem_set


/* One tensor on both sides: `ref` (host, f64 or its own integer dtype)
 * for the CPU kernel and `dev` (device, the tested dtype). */
typedef struct g_tensor {
  stoke_tensor ref, dev;
  double *vals; /* the values, as drawn (before rounding to the dtype) */
} g_tensor;

G_FN stoke_dtype g_ref_dtype(stoke_dtype t) { return t == STOKE_I32 || t == STOKE_U8 ? t : STOKE_F64; }

/* Allocate both sides of a tensor of `shape`: host `ref_dtype` memory for
 * the CPU reference and device `dtype` memory. */
G_FN void g_alloc2(g_tensor *t, const stoke_shape *shape, stoke_dtype ref_dtype, stoke_dtype dtype,
                   stoke_layout layout) {
  int64_t n = stoke_numel(shape);
  memset(t, 0, sizeof *t);
  t->ref = (stoke_tensor){calloc((size_t)n, stoke_dtype_size(ref_dtype)), *shape, ref_dtype, layout,
                          STOKE_DEV_CPU};
  t->dev = (stoke_tensor){NULL, *shape, dtype, layout, STOKE_DEV_GPU};
  stoke_err *e = g_dev->alloc(g_dev_self, (size_t)n * stoke_dtype_size(dtype) + 16, &t->dev.data);
  if (e) fail_msg("device alloc: %s", e->msg);
  t->vals = calloc((size_t)n, sizeof(double));
}

G_FN void g_alloc(g_tensor *t, const stoke_shape *shape, stoke_dtype dtype, stoke_layout layout) {
  g_alloc2(t, shape, g_ref_dtype(dtype), dtype, layout);
}

G_FN void g_free(g_tensor *t) {
  free(t->ref.data);
  free(t->vals);
  if (t->dev.data) g_dev->free(g_dev_self, t->dev.data);
  memset(t, 0, sizeof *t);
}

/* Fill with values from `draw`, rounded to the tested dtype first, so CPU
 * and GPU see the same numbers; then upload. */
G_FN void g_fill(g_tensor *t, stoke_rng *r, double lo, double hi, int integer) {
  int64_t n = stoke_numel(&t->ref.shape);
  size_t bytes = (size_t)n * stoke_dtype_size(t->dev.dtype);
  void *host = malloc(bytes);
  for (int64_t i = 0; i < n; i++) {
    double v = lo + (hi - lo) * stoke_rng_uniform(r);
    if (integer) v = floor(v);
    g_set(host, t->dev.dtype, i, v);
    v = g_get(host, t->dev.dtype, i); /* rounded */
    t->vals[i] = v;
    g_set(t->ref.data, t->ref.dtype, i, v);
  }
  stoke_err *e = g_dev->copy(g_dev_self, t->dev.data, host, bytes, STOKE_COPY_H2D, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  free(host);
  if (e) fail_msg("upload: %s", e->msg);
}

/* Poison the device side: every byte 0xFF (NaN in f32/f16/bf16/f64). */
G_FN void g_poison(g_tensor *t) {
  size_t bytes = (size_t)stoke_numel(&t->dev.shape) * stoke_dtype_size(t->dev.dtype);
  stoke_err *e = g_dev->fill(g_dev_self, t->dev.data, 0xff, bytes, NULL);
  if (e) fail_msg("poison: %s", e->msg);
}

/* ||dev - ref|| / ||ref|| over the whole tensor (NaN if any element is). */
G_FN double g_compare(const g_tensor *t, double *max_abs) {
  int64_t n = stoke_numel(&t->dev.shape);
  size_t bytes = (size_t)n * stoke_dtype_size(t->dev.dtype);
  void *host = malloc(bytes);
  stoke_err *e = g_dev->copy(g_dev_self, host, t->dev.data, bytes, STOKE_COPY_D2H, NULL);
  if (e) fail_msg("download: %s", e->msg);
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    double a = g_get(host, t->dev.dtype, i), b = g_get(t->ref.data, t->ref.dtype, i);
    if (!isfinite(a) && isfinite(b)) {
      free(host);
      if (max_abs) *max_abs = INFINITY;
      return NAN;
    }
    num += (a - b) * (a - b);
    den += b * b;
    if (fabs(a - b) > mx) mx = fabs(a - b);
  }
  free(host);
  if (max_abs) *max_abs = mx;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Device memory of at least 16 bytes, and copies to and from it that wait
 * for the device; a failure fails the test. */
G_FN void *g_dev_alloc(size_t bytes) {
  void *p = NULL;
  stoke_err *e = g_dev->alloc(g_dev_self, bytes ? bytes : 16, &p);
  if (e) fail_msg("device alloc: %s", e->msg);
  return p;
}

G_FN void g_dev_put(void *dst, const void *src, size_t bytes) {
  stoke_err *e = g_dev->copy(g_dev_self, dst, src, bytes, STOKE_COPY_H2D, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("upload: %s", e->msg);
}

G_FN void g_dev_get(void *dst, const void *src, size_t bytes) {
  stoke_err *e = g_dev->copy(g_dev_self, dst, src, bytes, STOKE_COPY_D2H, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  if (e) fail_msg("download: %s", e->msg);
}

/* Kernels of the op on the CPU (f64) and on the first GPU engine that has
 * one for `dtype`. */
G_FN const stoke_kernel_v1 *g_gpu_kernel(const char *op, stoke_pass pass, stoke_dtype dtype, stoke_layout layout,
                                          void **engine_self) {
  for (int i = 0; i < g_n_engines; i++) {
    const stoke_kernel_v1 *k = stoke_find_kernel(g_reg, g_engines[i], op, pass, dtype, layout);
    if (k) {
      *engine_self = g_engine_self[i];
      return k;
    }
  }
  fail_msg("no GPU kernel for %s %s %s", op, pass == STOKE_FWD ? "forward" : "backward", stoke_dtype_name(dtype));
  return NULL;
}

/* Run one kernel (plan, workspace, run, sync, destroy); the workspace
 * poisoned first, as every_kernel_test's (a kernel writes the zeros it
 * needs there). */
G_FN void g_run(const stoke_kernel_v1 *k, stoke_kernel_args_v1 *a, int gpu) {
  void *state = NULL, *ws = NULL;
  size_t wsb = 0;
  stoke_err *e = k->plan ? k->plan(a, &state, &wsb) : NULL;
  if (!e && wsb) {
    if (gpu) e = g_dev->alloc(g_dev_self, wsb, &ws);
    else ws = malloc(wsb);
    if (!e && ws) {
      if (gpu) e = g_dev->fill(g_dev_self, ws, 0xff, wsb, a->stream);
      else memset(ws, 0xff, wsb);
    }
  }
  a->workspace = ws;
  a->workspace_bytes = wsb;
  if (!e) e = k->run(a, state);
  if (!e && gpu) e = g_dev->stream_sync(g_dev_self, NULL);
  if (k->destroy && state) k->destroy(state);
  if (ws) {
    if (gpu) g_dev->free(g_dev_self, ws);
    else free(ws);
  }
  if (e) fail_msg("%s kernel %s/%s: %s", gpu ? "GPU" : "CPU", k->engine, k->op, e->msg);
}

/* A case: an op with its attributes, input shapes and kinds. */
typedef struct g_case {
  const char *op, *attrs;
  int n_in;
  stoke_shape in_shape[STOKE_MAX_IO];
  stoke_dtype in_dtype[STOKE_MAX_IO]; /* 0 (F32) = the tested dtype */
  stoke_dtype out_dtype[STOKE_MAX_IO]; /* 0 (F32) = the tested dtype */
  int is_label[STOKE_MAX_IO];         /* i32 labels in [0, classes) */
  int64_t classes;
  uint32_t param_mask;                /* inputs that are parameters */
  uint32_t state_mask;                /* inputs that are state (running stats): f32, >0 */
  stoke_layout layout;
  stoke_dtype dtype;
  double tol;
  int training;
  int backward;
  uint32_t flags;                     /* STOKE_KFLAG_* */
  uint32_t douts;                     /* outputs given a gradient in backward (0: output 0 alone) */
} g_case;

/* Forward (and backward) of one case on both sides; fails past tol. */
G_FN void g_check(const g_case *c) {
  stoke_node_v1 node;
  char name[64];
  snprintf(name, sizeof name, "%s_test", c->op);
  stoke_err *e = stoke_node_init(g_reg, c->op, name, c->attrs, &node);
  if (e) fail_msg("%s", e->msg);
  const stoke_op_type_v1 *t = stoke_find_op(g_reg, c->op);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)c->dtype, (uint64_t)c->layout));
  g_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO], din[STOKE_MAX_IO], dout[STOKE_MAX_IO];
  stoke_value_desc_v1 ind[STOKE_MAX_IO], outd[STOKE_MAX_IO];
  memset(outd, 0, sizeof outd);
  for (int i = 0; i < c->n_in; i++) {
    stoke_dtype dt = c->is_label[i] ? STOKE_I32 : (c->state_mask >> i & 1) ? STOKE_F32 : c->dtype;
    if (c->in_dtype[i]) dt = c->in_dtype[i];
    stoke_layout lay = c->in_shape[i].ndim == 4 && !(c->param_mask >> i & 1) ? c->layout : STOKE_LAYOUT_ANY;
    g_alloc(&in[i], &c->in_shape[i], dt, lay);
    if (c->is_label[i]) g_fill(&in[i], &r, 0, (double)c->classes, 1);
    else if (dt == STOKE_U8) g_fill(&in[i], &r, 0, 256, 1);
    else if (c->state_mask >> i & 1) g_fill(&in[i], &r, 0.5, 1.5, 0);
    else g_fill(&in[i], &r, -1, 1, 0);
    ind[i] = (stoke_value_desc_v1){c->in_shape[i], in[i].ref.dtype == STOKE_F64 ? STOKE_F64 : dt};
  }
  /* the CPU runs in f64: its running stats are f64 too */
  e = t->infer(&node, ind, outd);
  if (e) fail_msg("infer: %s", e->msg);
  /* the device's outputs are what the op infers from the device's inputs:
   * the tested dtype, and f32 where the op keeps statistics or losses in
   * f32 (batch/layer norm's mean and rstd, attention's lse, softmax_ce) */
  stoke_value_desc_v1 ind_dev[STOKE_MAX_IO], outd_dev[STOKE_MAX_IO];
  memset(outd_dev, 0, sizeof outd_dev);
  for (int i = 0; i < c->n_in; i++) ind_dev[i] = (stoke_value_desc_v1){c->in_shape[i], in[i].dev.dtype};
  e = t->infer(&node, ind_dev, outd_dev);
  if (e) fail_msg("infer (device dtypes): %s", e->msg);
  int n_out = t->n_outputs;
  for (int j = 0; !t->n_outputs && j < STOKE_MAX_IO && outd[j].shape.ndim; j++) n_out = j + 1; /* split */
  for (int j = 0; j < n_out; j++) {
    stoke_dtype dt = c->out_dtype[j] ? c->out_dtype[j] : outd_dev[j].dtype;
    stoke_layout lay = outd[j].shape.ndim == 4 ? c->layout : STOKE_LAYOUT_ANY;
    g_alloc2(&out[j], &outd[j].shape, outd[j].dtype, dt, lay);
    g_poison(&out[j]);
  }
  /* the CPU gets f64 copies of state inputs: it updates them in place */
  stoke_tensor ref_in[STOKE_MAX_IO], ref_out[STOKE_MAX_IO], gpu_in[STOKE_MAX_IO], gpu_out[STOKE_MAX_IO];
  for (int i = 0; i < c->n_in; i++) ref_in[i] = in[i].ref, gpu_in[i] = in[i].dev;
  for (int j = 0; j < n_out; j++) ref_out[j] = out[j].ref, gpu_out[j] = out[j].dev;
  uint64_t seed = stoke_hash3(g_seed, 77, 0);
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = c->n_in, .n_out = n_out, .in = ref_in, .out = ref_out,
                             .training = c->training, .seed = seed, .flags = c->flags};
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", c->op, STOKE_FWD, ref_in[0].dtype, c->layout);
  if (!rk) fail_msg("no CPU reference kernel for %s (%s)", c->op, stoke_dtype_name(ref_in[0].dtype));
  void *es = NULL;
  const stoke_kernel_v1 *gk = g_gpu_kernel(c->op, STOKE_FWD, gpu_in[0].dtype, c->layout, &es);
  stoke_kernel_args_v1 ga = ra;
  ga.in = gpu_in;
  ga.out = gpu_out;
  ga.engine = es;
  ga.stream = g_dev->default_stream(g_dev_self);
  g_run(rk, &ra, 0);
  g_run(gk, &ga, 1);
  double tol = c->tol;
  for (int j = 0; j < n_out; j++) {
    double mx, err = g_compare(&out[j], &mx);
    print_message("  %-12s fwd out%d %-5s %-4s rel err %.3g (max abs %.3g)\n", c->op, j,
                  stoke_dtype_name(c->dtype), c->layout == STOKE_NHWC ? "NHWC" : "NCHW", err, mx);
    if (!(err <= tol)) fail_msg("%s forward output %d: relative error %.3g > %.3g (seed %llu)", c->op, j, err, tol,
                                (unsigned long long)g_seed);
  }
  if (c->backward && t->has_backward == STOKE_HAS_BACKWARD) {
    stoke_tensor rdin[STOKE_MAX_IO], rdout[STOKE_MAX_IO], gdin[STOKE_MAX_IO], gdout[STOKE_MAX_IO];
    memset(rdin, 0, sizeof rdin);
    memset(gdin, 0, sizeof gdin);
    for (int j = 0; j < n_out; j++) {
      memset(&dout[j], 0, sizeof dout[j]);
      rdout[j] = gdout[j] = (stoke_tensor){0};
      if (!((c->douts ? c->douts : 1u) >> j & 1)) continue; /* outputs without a gradient (statistics) */
      g_alloc2(&dout[j], &out[j].dev.shape, out[j].ref.dtype, out[j].dev.dtype, out[j].dev.layout);
      g_fill(&dout[j], &r, -1, 1, 0);
      rdout[j] = dout[j].ref;
      gdout[j] = dout[j].dev;
    }
    uint32_t pg = 0;
    for (int i = 0; i < c->n_in; i++) {
      memset(&din[i], 0, sizeof din[i]);
      if (c->is_label[i] || (c->state_mask >> i & 1) || (t->no_grad_inputs >> i & 1)) continue;
      g_alloc(&din[i], &c->in_shape[i], in[i].dev.dtype, in[i].dev.layout);
      g_poison(&din[i]);
      rdin[i] = din[i].ref;
      gdin[i] = din[i].dev;
      if (c->param_mask >> i & 1) pg |= 1u << i;
    }
    /* what backward may read: only what bwd_needs keeps */
    for (int i = 0; i < c->n_in; i++)
      if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) ref_in[i].data = gpu_in[i].data = NULL;
    for (int j = 0; j < n_out; j++)
      if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j))) ref_out[j].data = gpu_out[j].data = NULL;
    stoke_kernel_args_v1 rb = ra, gb = ga;
    rb.din = rdin, rb.dout = rdout, gb.din = gdin, gb.dout = gdout;
    rb.param_grads = gb.param_grads = pg;
    rb.param_grad_beta = gb.param_grad_beta = 0;
    const stoke_kernel_v1 *rbk = stoke_find_kernel(g_reg, "cpu", c->op, STOKE_BWD, STOKE_F64, c->layout);
    if (!rbk) fail_msg("no CPU backward kernel for %s", c->op);
    const stoke_kernel_v1 *gbk = g_gpu_kernel(c->op, STOKE_BWD, gpu_in[0].dtype, c->layout, &gb.engine);
    g_run(rbk, &rb, 0);
    g_run(gbk, &gb, 1);
    for (int i = 0; i < c->n_in; i++) {
      if (!gdin[i].data) continue;
      double mx, err = g_compare(&din[i], &mx);
      print_message("  %-12s bwd din%d %-5s %-4s rel err %.3g (max abs %.3g)\n", c->op, i,
                    stoke_dtype_name(c->dtype), c->layout == STOKE_NHWC ? "NHWC" : "NCHW", err, mx);
      if (!(err <= tol)) fail_msg("%s backward input %d: relative error %.3g > %.3g (seed %llu)", c->op, i, err,
                                  tol, (unsigned long long)g_seed);
    }
    for (int j = 0; j < n_out; j++) g_free(&dout[j]);
    for (int i = 0; i < c->n_in; i++) g_free(&din[i]);
  }
  for (int i = 0; i < c->n_in; i++) g_free(&in[i]);
  for (int j = 0; j < n_out; j++) g_free(&out[j]);
}

#endif
