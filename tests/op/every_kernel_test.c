/* tests/op/every_kernel_test.c: one test for every kernel, as ggml's
 * test-backend-ops. It walks every (engine, op, pass, dtype, layout) kernel
 * that the loaded backends registered and checks each against the CPU
 * reference kernel of the same op in f64 (u8 and i32 inputs stay as they
 * are), on random shapes, odd ones included, drawn from a seed that is
 * fresh each run and printed (STOKE_TEST_SEED reruns one). Outputs are
 * poisoned first (every byte 0xff: NaN in every float dtype), so an
 * element a kernel does not write fails. A kernel whose op has no case
 * generator in the table (tests/op/kernel_cases.h) fails the test, naming
 * the op: a new kernel cannot ship untested.
 *
 * Each backward kernel runs twice: gradients overwritten (beta 0), then
 * accumulated: parameter gradients under param_grad_beta = 1 and, for the
 * inputs whose bit the kernel declares in `accumulates`, din_accumulate
 * (beta 1), both onto random values that must be kept and added to; the
 * other gradients poisoned again, to be overwritten. A backward kernel
 * that can do its forward's work too (caps STOKE_KCAP_WITH_FORWARD) runs a
 * third time with with_forward, its forward outputs poisoned and checked.
 * A case under STOKE_KFLAG_DETERMINISTIC runs once more on poisoned
 * outputs (forward) or gradients (backward), which must come out the same
 * bit for bit (the flag's promise: flash attention's dQ summed with atomics
 * would break it).
 *
 * Tolerance on the relative-norm error ||got - want|| / ||want|| of each
 * output (||want|| at least 1e-2 RMS: ERR_FLOOR), from the kernel's
 * precision and the longest sum the case makes (K, set by its generator):
 *     tol = 8 u(dtype) + 8 u(accumulator) sqrt(K)   [+ 2 n u(tf32) with TF32]
 * u the unit roundoff: f64 2^-53, f32 2^-24, fp16 2^-11, bf16 2^-8, the
 * accumulator f32 for every dtype but f64. The first term is the rounding
 * of the outputs (and of intermediates a kernel stores in its dtype), the
 * second the rounding error of a K-term sum, which grows as sqrt(K) for
 * random signs; with TF32 the third, each TF32-rounded operand (tf32's u =
 * 2^-11) perturbing the products it enters, n of them along the longest
 * chain of products (a product's 2; attention's dQ 6: q and k, dy and v, dS
 * and k). The cuda attention's bf16 and fp16 paths round P and dS to TF32
 * too, within their first term (bf16 and fp16 round as much or more); its
 * exact f32 path splits each operand in two TF32 parts (3xTF32), whose
 * products leave out 2^-22 of each: + 2 n 2^-22 for those cases. u8 and
 * i32 outputs must be exact.
 *
 * The cpu f64 kernels are the reference: here they run on every case too
 * (outputs poisoned, gradients accumulated), against themselves; their
 * gradients are checked against finite differences in the tests/op grad tests.
 *
 * Built twice from this file: //tests/op:every_kernel_test (CI: the cpu
 * backend and the example plugins) and //tests/gpu:every_kernel_test
 * (EVERY_KERNEL_GPU: also cuda, cudnn, cudnn_classic, cublaslt and fused,
 * run on the GPU machine by tools/gpu_check.sh). `every_kernel_test --list`
 * lists the kernels and which have no case, opening no device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/check.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "stoke/rng.h"
#include "tests/common/relu_mask.h"
#include "tests/common/seed.h"

/* ------------------------------------------------------------- engines */

/* The plugins loaded: (name, its path in the Bazel runfiles; the name
 * alone is looked up along STOKE_PLUGIN_PATH, as on the GPU machine). */
static const char *const plugins[][2] = {
    {"cpu", "backends/cpu/libstoke_cpu.so"},
    {"swish", "plugins/swish/libstoke_swish.so"},
    {"lion", "plugins/lion/libstoke_lion.so"},
#ifdef EVERY_KERNEL_GPU
    {"cuda", "backends/cuda/libstoke_cuda.so"},
    {"cudnn", "backends/cudnn/libstoke_cudnn.so"},
    {"cublaslt", "backends/cublaslt/libstoke_cublaslt.so"},
    {"fused", "backends/fused/libstoke_fused.so"},
#endif
};
#define N_PLUGINS (int)(sizeof plugins / sizeof *plugins)

/* An open backend, and the backend that owns its device (itself for cpu
 * and cuda): memory, copies and the stream come from the owner. */
typedef struct engine {
  const char *name;
  const stoke_backend_v1 *b, *dev;
  void *self, *dev_self;
} engine;

#define MAX_ENGINES 16
static stoke_registry *reg;
static engine engines[MAX_ENGINES];
static int n_engines;
static uint64_t seed;

static void fail_err(stoke_err *e, const char *what) {
  if (!e) return;
  fail_msg("%s: %s (seed %llu)", what, e->msg, (unsigned long long)seed);
}

static engine *engine_of(const char *name) {
  for (int i = 0; i < n_engines; i++)
    if (!strcmp(engines[i].name, name)) return &engines[i];
  return NULL;
}

/* Opens every registered backend: the device owners first. */
static stoke_err *open_engines(void) {
  char names[512];
  stoke_registry_names(reg, "backend", names, sizeof names);
  for (int owners = 1; owners >= 0; owners--) {
    char buf[512], *save = NULL;
    snprintf(buf, sizeof buf, "%s", names);
    for (char *n = strtok_r(buf, ", ", &save); n; n = strtok_r(NULL, ", ", &save)) {
      const stoke_backend_v1 *b = stoke_find_backend(reg, n);
      if (!b || (b->device_engine == NULL) != owners || n_engines == MAX_ENGINES) continue;
      engine *e = &engines[n_engines];
      e->name = b->name, e->b = b;
      engine *owner = owners ? e : engine_of(b->device_engine);
      if (!owner) return STOKE_ERR(STOKE_E_NOT_FOUND, "backend %s: its device %s is not loaded", n, b->device_engine);
      STOKE_PROPAGATE(b->open(0, owners ? NULL : owner->self, &e->self));
      e->dev = owner->b, e->dev_self = owners ? e->self : owner->self;
      n_engines++;
    }
  }
  return NULL;
}

static int setup(int open) {
  stoke_err *e = stoke_registry_new(&reg);
  for (int i = 0; i < N_PLUGINS && !e; i++)
    e = stoke_registry_load(reg, access(plugins[i][1], R_OK) ? plugins[i][0] : plugins[i][1]);
  if (!e && open) e = open_engines();
  if (e) {
    print_error("every_kernel_test setup: %s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  seed = test_seed("every_kernel_test");
  return 0;
}

static int teardown(void) {
  for (int i = n_engines - 1; i >= 0; i--)
    if (engines[i].b->close) engines[i].b->close(engines[i].self);
  stoke_registry_free(reg);
  return 0;
}

#include "kernel_cases.h"

/* ------------------------------------------------------------ tensors */

/* One tensor on both sides: `ref` in host memory for the cpu reference
 * (f64, or the integer dtype), `dut` on the tested engine's device. */
typedef struct ktensor {
  stoke_tensor ref, dut;
  const engine *e;
} ktensor;

static stoke_dtype ref_dtype(stoke_dtype t) { return t == STOKE_I32 || t == STOKE_U8 ? t : STOKE_F64; }
static int is_float(stoke_dtype t) { return t == STOKE_F32 || t == STOKE_F64 || t == STOKE_BF16 || t == STOKE_F16; }

static void kt_alloc(ktensor *t, const engine *e, const stoke_shape *s, stoke_dtype rdt, stoke_dtype dt,
                     stoke_layout lay) {
  size_t n = (size_t)stoke_numel(s);
  memset(t, 0, sizeof *t);
  t->e = e;
  t->ref = (stoke_tensor){calloc(n ? n : 1, stoke_dtype_size(rdt)), *s, rdt, lay, STOKE_DEV_CPU};
  t->dut = (stoke_tensor){NULL, *s, dt, lay, e->b->device};
  fail_err(e->dev->alloc(e->dev_self, n * stoke_dtype_size(dt) + 16, &t->dut.data), "device alloc");
}

static void kt_free(ktensor *t) {
  free(t->ref.data);
  if (t->dut.data) t->e->dev->free(t->e->dev_self, t->dut.data);
  memset(t, 0, sizeof *t);
}

static size_t dut_bytes(const ktensor *t) { return (size_t)stoke_numel(&t->dut.shape) * stoke_dtype_size(t->dut.dtype); }

static void kt_copy(const ktensor *t, void *dst, const void *src, size_t bytes, stoke_copy_kind kind) {
  stoke_err *e = t->e->dev->copy(t->e->dev_self, dst, src, bytes, kind, NULL);
  if (!e) e = t->e->dev->stream_sync(t->e->dev_self, NULL);
  fail_err(e, kind == STOKE_COPY_H2D ? "upload" : "download");
}

/* The reference values rounded to the tested dtype, on both sides (so
 * the two kernels read the same numbers). */
static void kt_sync_up(ktensor *t) {
  int64_t n = stoke_numel(&t->ref.shape);
  void *h = malloc(dut_bytes(t) + 1);
  for (int64_t i = 0; i < n; i++) {
    stoke_elem_set(h, t->dut.dtype, i, stoke_elem_get(t->ref.data, t->ref.dtype, i));
    stoke_elem_set(t->ref.data, t->ref.dtype, i, stoke_elem_get(h, t->dut.dtype, i));
  }
  kt_copy(t, t->dut.data, h, dut_bytes(t), STOKE_COPY_H2D);
  free(h);
}

static void kt_fill(ktensor *t, stoke_rng *r, double lo, double hi, int integer) {
  for (int64_t i = 0, n = stoke_numel(&t->ref.shape); i < n; i++) {
    double v = lo + (hi - lo) * stoke_rng_uniform(r);
    stoke_elem_set(t->ref.data, t->ref.dtype, i, integer ? floor(v) : v);
  }
  kt_sync_up(t);
}

static void kt_poison(ktensor *t) {
  fail_err(t->e->dev->fill(t->e->dev_self, t->dut.data, 0xff, dut_bytes(t), NULL), "poison");
  fail_err(t->e->dev->stream_sync(t->e->dev_self, NULL), "poison");
}

/* The tested side's values, as doubles. */
static double *kt_download(const ktensor *t) {
  int64_t n = stoke_numel(&t->dut.shape);
  void *h = malloc(dut_bytes(t) + 1);
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  kt_copy(t, h, t->dut.data, dut_bytes(t), STOKE_COPY_D2H);
  for (int64_t i = 0; i < n; i++) v[i] = stoke_elem_get(h, t->dut.dtype, i);
  free(h);
  return v;
}

/* ------------------------------------------------------------ checking */

/* The error is relative to the output's norm, but not to less than an RMS
 * of ERR_FLOOR per element: a sum of random-sign terms (a bias gradient, a
 * row's mean) can cancel to near 0, and its rounding error is relative to
 * the terms (inputs are O(1)), not to what is left (the finite-difference
 * checks' floor, opcase.h, for the same reason). */
#define ERR_FLOOR 1e-2

/* The tolerance of an output of dtype `out` of a kernel of dtype `dt`
 * (see the top of the file). */
static double tolerance(stoke_dtype dt, stoke_dtype out, uint32_t flags, double k, int tf32_operands) {
  double u = fmax(stoke_dtype_unit_roundoff(is_float(dt) ? dt : out), stoke_dtype_unit_roundoff(out));
  if (u == 0) return 0;
  double base = 8 * u + 8 * stoke_sum_roundoff(dt, k);
  if (flags & STOKE_KFLAG_TF32) return base + 2 * (tf32_operands ? tf32_operands : 2) * 0x1p-11;
  return base + 2 * tf32_operands * 0x1p-22; /* 3xTF32's residual */
}

typedef struct kcheck {
  const stoke_kernel_v1 *k;
  const kcase *c;
  const char *mode; /* "", " overwrite", " again", " with forward", " accumulate" */
} kcheck;

/* got (the tested side) against want over n values: every element finite
 * where want is, relative-norm error within tol. */
static void expect_close(const kcheck *ck, const char *what, const double *got, const double *want, int64_t n,
                         stoke_dtype out_dtype) {
  const kcase *c = ck->c;
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isfinite(want[i]) && !isfinite(got[i]))
      fail_msg("%s/%s %s %s %s%s, case %s: %s element %lld of %lld is %g, want %g (not written?) (seed %llu)",
               ck->k->engine, ck->k->op, pass_name(ck->k->pass), stoke_dtype_name(ck->k->dtype),
               stoke_layout_name(c->layout), ck->mode, c->label, what, (long long)i, (long long)n, got[i], want[i],
               (unsigned long long)seed);
    double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
    if (fabs(d) > mx) mx = fabs(d);
  }
  double err = sqrt(num / fmax(den, (double)n * ERR_FLOOR * ERR_FLOOR));
  double tol = tolerance(ck->k->dtype, out_dtype, c->flags, c->k, c->tf32_operands);
  print_message("  %-13s %-15s %-8s %-4s %-4s%-11s %-44s %-8s rel err %.2e tol %.2e\n", ck->k->engine, ck->k->op,
                pass_name(ck->k->pass), stoke_dtype_name(ck->k->dtype), stoke_layout_name(c->layout), ck->mode,
                c->label, what, err, tol);
  if (!(err <= tol)) { /* the three worst elements: one outlier, or an error everywhere? */
    int64_t worst[3] = {-1, -1, -1};
    for (int64_t i = 0; i < n; i++)
      for (int w = 0; w < 3; w++)
        if (worst[w] < 0 || fabs(got[i] - want[i]) > fabs(got[worst[w]] - want[worst[w]])) {
          for (int v = 2; v > w; v--) worst[v] = worst[v - 1];
          worst[w] = i;
          break;
        }
    for (int w = 0; w < 3 && worst[w] >= 0; w++)
      print_message("    element %lld of %lld: got %.9g want %.9g\n", (long long)worst[w], (long long)n, got[worst[w]],
                    want[worst[w]]);
    fail_msg("%s/%s %s %s %s%s, case %s: %s relative error %.3g > %.3g (max abs %.3g) (seed %llu)", ck->k->engine,
             ck->k->op, pass_name(ck->k->pass), stoke_dtype_name(ck->k->dtype), stoke_layout_name(c->layout),
             ck->mode, c->label, what, err, tol, mx, (unsigned long long)seed);
  }
}

static void expect_tensor(const kcheck *ck, const char *what, const ktensor *t, const double *want) {
  double *got = kt_download(t);
  int64_t n = stoke_numel(&t->ref.shape);
  double *w = (double *)want;
  if (!w) {
    w = malloc((size_t)(n ? n : 1) * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = stoke_elem_get(t->ref.data, t->ref.dtype, i);
  }
  expect_close(ck, what, got, w, n, t->dut.dtype);
  if (w != want) free(w);
  free(got);
}

/* The tested side's bytes now against `first`, those of an earlier call
 * on the same inputs: every element the same bits. */
static void expect_same_bits(const kcheck *ck, const char *what, const ktensor *t, const unsigned char *first) {
  size_t bytes = dut_bytes(t), es = stoke_dtype_size(t->dut.dtype);
  unsigned char *now = malloc(bytes + 1);
  kt_copy(t, now, t->dut.data, bytes, STOKE_COPY_D2H);
  int64_t n_diff = 0, at = -1;
  for (size_t i = 0; i < bytes; i += es)
    if (memcmp(now + i, first + i, es)) {
      if (at < 0) at = (int64_t)(i / es);
      n_diff++;
    }
  free(now);
  print_message("  %-13s %-15s %-8s %-4s %-4s%-11s %-44s %-8s %lld of %zu elements differ from the first call\n",
                ck->k->engine, ck->k->op, pass_name(ck->k->pass), stoke_dtype_name(ck->k->dtype),
                stoke_layout_name(ck->c->layout), ck->mode, ck->c->label, what, (long long)n_diff, bytes / es);
  if (n_diff)
    fail_msg("%s/%s %s %s, case %s%s: %s of a second call differs from the first's in %lld elements (the first at "
             "%lld) though STOKE_KFLAG_DETERMINISTIC is set (seed %llu)", ck->k->engine, ck->k->op,
             pass_name(ck->k->pass), stoke_dtype_name(ck->k->dtype), ck->c->label, ck->mode, what, (long long)n_diff,
             (long long)at, (unsigned long long)seed);
}

/* A ReLU bitmask (stoke/ops.h, linear_act: row i's bit j is bit j % 8 of
 * byte i * stride + j / 8, stride a multiple of 16 bytes; the padding bits
 * past `out` are unspecified: cuBLASLt sets them from its tiles' rows)
 * against the tested kernel's own output: set iff y > 0. One exception, a
 * tie: cuBLASLt decides the bit on its f32 sum z while y is rounded to the
 * output dtype after the bias (H100, bf16: bit 1 with y = 0 at seeds
 * 1310301843 and 1795449250), so where y is 0 and the f64 reference puts z
 * (from the inputs)
 * within 4 units of the dtype's rounding (tf32's for f32) of 0, relative
 * to the output's RMS, either bit is a valid subgradient. */
static double pre_activation(const ktensor *in, int64_t i, int64_t j) { /* z[i, j] = x[i] . W[j] + b[j] in f64 */
  int64_t k = in[0].ref.shape.d[1];
  double z = stoke_elem_get(in[2].ref.data, in[2].ref.dtype, j);
  for (int64_t t = 0; t < k; t++)
    z += stoke_elem_get(in[0].ref.data, in[0].ref.dtype, i * k + t) * stoke_elem_get(in[1].ref.data, in[1].ref.dtype, j * k + t);
  return z;
}

static void expect_relu_mask(const kcheck *ck, const ktensor *in, const ktensor *y, const ktensor *mask) {
  double *yv = kt_download(y), *mv = kt_download(mask);
  int64_t rows = y->dut.shape.d[0], cols = y->dut.shape.d[1], stride = mask->dut.shape.d[1];
  double rms = 0, u = ck->k->dtype == STOKE_BF16 ? 0x1p-8 : ck->k->dtype == STOKE_F64 ? 0x1p-53 : 0x1p-11;
  for (int64_t i = 0; i < rows * cols; i++) {
    double r = stoke_elem_get(y->ref.data, y->ref.dtype, i);
    rms += r * r;
  }
  rms = sqrt(rms / (double)(rows * cols > 0 ? rows * cols : 1));
  int64_t ties = 0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols && j < stride * 8; j++) {
      int bit = ((int)mv[i * stride + j / 8] >> (j % 8)) & 1, want = yv[i * cols + j] > 0;
      if (bit == want) continue;
      if (yv[i * cols + j] == 0 && fabs(pre_activation(in, i, j)) <= 4 * u * rms) {
        ties++;
        continue;
      }
      fail_msg("%s/%s %s %s, case %s: ReLU mask row %lld bit %lld is %d, y is %g (seed %llu)", ck->k->engine,
               ck->k->op, pass_name(ck->k->pass), stoke_dtype_name(ck->k->dtype), ck->c->label, (long long)i,
               (long long)j, bit, yv[i * cols + j], (unsigned long long)seed);
    }
  print_message("  %-13s %-15s ReLU mask of %lld x %lld: every bit as y > 0 (%lld ties at 0)\n", ck->k->engine,
                ck->k->op, (long long)rows, (long long)cols, (long long)ties);
  free(yv), free(mv);
}

/* A flat ReLU bitmask (stoke/ops.h, bn_add_relu's output 3): bit e of byte
 * e / 8 is element e of y, in memory order as the tested kernel stored it,
 * > 0. Exact: the mask is defined from the stored y, so no tie is allowed. */
static void expect_flat_mask(const kcheck *ck, const ktensor *y, const ktensor *mask) {
  double *yv = kt_download(y);
  int64_t n = stoke_numel(&y->dut.shape), set = 0;
  if (stoke_numel(&mask->dut.shape) < (n + 7) / 8)
    fail_msg("%s/%s, case %s: ReLU mask of %lld bytes for %lld elements", ck->k->engine, ck->k->op, ck->c->label,
             (long long)stoke_numel(&mask->dut.shape), (long long)n);
  uint8_t *mv = malloc(dut_bytes(mask) + 1);
  kt_copy(mask, mv, mask->dut.data, dut_bytes(mask), STOKE_COPY_D2H);
  int64_t e = relu_mask_first_wrong(mv, yv, STOKE_F64, n);
  if (e >= 0)
    fail_msg("%s/%s %s %s, case %s: ReLU mask bit %lld is %d, y there is %g (seed %llu)", ck->k->engine, ck->k->op,
             pass_name(ck->k->pass), stoke_dtype_name(ck->k->dtype), ck->c->label, (long long)e,
             relu_mask_bit(mv, e), yv[e], (unsigned long long)seed);
  for (int64_t i = 0; i < n; i++) set += yv[i] > 0;
  print_message("  %-13s %-15s ReLU bitmask of %lld elements: every bit as y > 0 (%lld set)\n", ck->k->engine,
                ck->k->op, (long long)n, (long long)set);
  free(yv), free(mv);
}

/* plan, workspace, run, wait, destroy: as the executor does. The
 * workspace is poisoned first (every byte 0xff: NaN in every float
 * type): the executor hands a kernel memory other nodes just used, so a
 * kernel that needs zeros there must write them itself. */
static void run_kernel(const stoke_kernel_v1 *k, stoke_kernel_args_v1 *a, const engine *e, const char *who) {
  void *state = NULL, *ws = NULL;
  size_t wsb = 0;
  a->engine = e->self;
  a->stream = e->dev->default_stream ? e->dev->default_stream(e->dev_self) : NULL;
  stoke_kernel_args_v1 pa = *a;
  if (k->pass == STOKE_OPT) pa.opt = NULL; /* update kernels plan once, before any step */
  stoke_err *err = k->plan ? k->plan(&pa, &state, &wsb) : NULL;
  if (!err && wsb) err = e->dev->alloc(e->dev_self, wsb, &ws);
  if (!err && ws) err = e->dev->fill(e->dev_self, ws, 0xff, wsb, a->stream);
  a->workspace = ws, a->workspace_bytes = wsb;
  if (!err) err = k->run(a, state);
  if (!err) err = e->dev->stream_sync(e->dev_self, NULL);
  if (k->destroy && state) k->destroy(state);
  if (ws) e->dev->free(e->dev_self, ws);
  if (err)
    fail_msg("%s kernel %s/%s %s %s: %s (seed %llu)", who, k->engine, k->op, pass_name(k->pass),
             stoke_dtype_name(k->dtype), err->msg, (unsigned long long)seed);
}

/* ----------------------------------------------------- one op call */

static const engine *cpu_engine(void) { return engine_of("cpu"); }

/* The cpu reference kernel of the case's op and pass in the reference
 * dtype of the first input. */
static const stoke_kernel_v1 *ref_kernel(const kcase *c, stoke_pass p, stoke_dtype in0) {
  return stoke_find_kernel(reg, "cpu", c->op, p, ref_dtype(in0), c->layout);
}

typedef struct call {
  const kcase *c;
  const stoke_op_type_v1 *t;
  stoke_node_v1 node, ref_node;
  int n_in, n_out;
  ktensor in[STOKE_MAX_IO], out[STOKE_MAX_IO];
} call;

static stoke_dtype in_dtype(const kcase *c, const stoke_kernel_v1 *k, int i) {
  if (c->in[i].dtype) return c->in[i].dtype;
  switch (c->in[i].kind) {
    case IN_LABEL: return STOKE_I32;
    case IN_STAT: return k->dtype == STOKE_F64 ? STOKE_F64 : STOKE_F32;
    default: return k->dtype;
  }
}

static stoke_layout in_layout(const kcase *c, int i) {
  if (c->in[i].layout) return c->in[i].layout;
  return c->in[i].shape.ndim == 4 && c->in[i].kind != IN_PARAM ? c->layout : STOKE_LAYOUT_ANY;
}

/* Inputs drawn, outputs made (and poisoned) from the op's shape inference. */
static void call_open(call *cl, const kcase *c, const stoke_kernel_v1 *k, const engine *e, stoke_rng *r) {
  memset(cl, 0, sizeof *cl);
  cl->c = c;
  cl->t = stoke_find_op(reg, c->op);
  if (!cl->t) fail_msg("op %s is not registered", c->op);
  fail_err(stoke_node_init(reg, c->op, "kernel_test", c->attrs, &cl->node), c->label);
  fail_err(stoke_node_init(reg, c->op, "kernel_test", c->ref_attrs ? c->ref_attrs : c->attrs, &cl->ref_node), c->label);
  cl->n_in = c->n_in;
  stoke_value_desc_v1 rin[STOKE_MAX_IO], din[STOKE_MAX_IO], rout[STOKE_MAX_IO], dout[STOKE_MAX_IO];
  memset(rout, 0, sizeof rout);
  memset(dout, 0, sizeof dout);
  for (int i = 0; i < c->n_in; i++) {
    stoke_dtype dt = in_dtype(c, k, i);
    kt_alloc(&cl->in[i], e, &c->in[i].shape, ref_dtype(dt), dt, in_layout(c, i));
    const kin *ki = &c->in[i];
    switch (ki->kind) {
      case IN_LABEL: kt_fill(&cl->in[i], r, 0, (double)ki->hi, 1); break;
      case IN_U8: kt_fill(&cl->in[i], r, 0, 256, 1); break;
      case IN_STAT: kt_fill(&cl->in[i], r, 0.5, 1.5, 0); break;
      default: kt_fill(&cl->in[i], r, ki->hi > ki->lo ? ki->lo : -1, ki->hi > ki->lo ? ki->hi : 1, 0);
    }
    rin[i] = (stoke_value_desc_v1){c->in[i].shape, cl->in[i].ref.dtype};
    din[i] = (stoke_value_desc_v1){c->in[i].shape, dt};
  }
  if (c->prep) {
    stoke_tensor ref[STOKE_MAX_IO];
    for (int i = 0; i < c->n_in; i++) ref[i] = cl->in[i].ref;
    c->prep(c, ref, r);
    for (int i = 0; i < c->n_in; i++) kt_sync_up(&cl->in[i]);
  }
  if (c->n_out) {
    for (int j = 0; j < c->n_out; j++) {
      rout[j] = (stoke_value_desc_v1){c->out[j], ref_dtype(k->dtype)};
      dout[j] = (stoke_value_desc_v1){c->out[j], k->dtype};
    }
  } else {
    fail_err(cl->t->infer(&cl->ref_node, rin, rout), "shape inference (reference)");
    fail_err(cl->t->infer(&cl->node, din, dout), "shape inference");
  }
  cl->n_out = cl->t->n_outputs;
  for (int j = 0; !cl->t->n_outputs && j < STOKE_MAX_IO && rout[j].shape.ndim; j++) cl->n_out = j + 1;
  for (int j = 0; j < cl->n_out; j++) {
    stoke_layout lay = rout[j].shape.ndim == 4 ? c->layout : STOKE_LAYOUT_ANY;
    kt_alloc(&cl->out[j], e, &rout[j].shape, rout[j].dtype, dout[j].dtype, lay);
    kt_poison(&cl->out[j]);
  }
}

static void call_close(call *cl) {
  for (int i = 0; i < cl->n_in; i++) kt_free(&cl->in[i]);
  for (int j = 0; j < cl->n_out; j++) kt_free(&cl->out[j]);
}

static stoke_kernel_args_v1 args_of(call *cl, stoke_tensor *in, stoke_tensor *out, int ref) {
  for (int i = 0; i < cl->n_in; i++) in[i] = ref ? cl->in[i].ref : cl->in[i].dut;
  for (int j = 0; j < cl->n_out; j++) out[j] = ref ? cl->out[j].ref : cl->out[j].dut;
  return (stoke_kernel_args_v1){.node = ref ? &cl->ref_node : &cl->node, .n_in = cl->n_in, .n_out = cl->n_out,
                                .in = in, .out = out, .training = cl->c->training, .seed = stoke_hash3(seed, 7, 0),
                                .flags = cl->c->flags};
}

/* The call's outputs (those the case compares) against the reference's. */
static void expect_outputs(const kcheck *ck, const call *cl) {
  for (int j = 0; j < cl->n_out; j++) {
    if (ck->c->skip_out >> j & 1) continue;
    char what[16];
    snprintf(what, sizeof what, "out%d", j);
    expect_tensor(ck, what, &cl->out[j], NULL);
  }
}

/* The input gradients made (dx[i] allocated) against the reference's. */
static void expect_input_grads(const kcheck *ck, const call *cl, const ktensor *dx) {
  for (int i = 0; i < cl->n_in; i++)
    if (dx[i].ref.data) {
      char what[16];
      snprintf(what, sizeof what, "din%d", i);
      expect_tensor(ck, what, &dx[i], NULL);
    }
}

static void check_forward(const stoke_kernel_v1 *k, const engine *e, const kcase *c, stoke_rng *r) {
  call cl;
  call_open(&cl, c, k, e, r);
  const stoke_kernel_v1 *rk = ref_kernel(c, STOKE_FWD, cl.in[0].dut.dtype);
  if (!rk) fail_msg("no cpu reference kernel for %s forward %s", c->op, stoke_dtype_name(ref_dtype(cl.in[0].dut.dtype)));
  stoke_tensor ri[STOKE_MAX_IO], ro[STOKE_MAX_IO], gi[STOKE_MAX_IO], go[STOKE_MAX_IO];
  stoke_kernel_args_v1 ra = args_of(&cl, ri, ro, 1), ga = args_of(&cl, gi, go, 0);
  run_kernel(rk, &ra, cpu_engine(), "reference");
  run_kernel(k, &ga, e, "tested");
  kcheck ck = {k, c, ""};
  expect_outputs(&ck, &cl);
  if (c->relu_mask) expect_relu_mask(&ck, cl.in, &cl.out[0], &cl.out[1]);
  if (c->flat_mask_out) expect_flat_mask(&ck, &cl.out[0], &cl.out[c->flat_mask_out]);
  for (int i = 0; i < c->n_in; i++) /* running statistics, updated in place */
    if (c->in[i].kind == IN_STAT && c->state_out >> i & 1) {
      char what[16];
      snprintf(what, sizeof what, "state%d", i);
      expect_tensor(&ck, what, &cl.in[i], NULL);
    }
  /* deterministic: the same call again on poisoned outputs, the same bits
   * (cuDNN's attention forward has configurations noted NONDETERMINISTIC
   * too); not for a kernel that updates its state in place */
  if (c->flags & STOKE_KFLAG_DETERMINISTIC && !c->state_out) {
    ck.mode = " again";
    unsigned char *first[STOKE_MAX_IO] = {0};
    for (int j = 0; j < cl.n_out; j++) {
      first[j] = malloc(dut_bytes(&cl.out[j]) + 1);
      kt_copy(&cl.out[j], first[j], cl.out[j].dut.data, dut_bytes(&cl.out[j]), STOKE_COPY_D2H);
      kt_poison(&cl.out[j]);
    }
    run_kernel(k, &ga, e, "tested");
    for (int j = 0; j < cl.n_out; j++) {
      char what[16];
      snprintf(what, sizeof what, "out%d", j);
      /* a bitmask's padding bits are unspecified (expect_relu_mask) */
      int mask = (c->relu_mask && j == 1) || (c->flat_mask_out && j == c->flat_mask_out);
      if (!(c->skip_out >> j & 1) && !mask) expect_same_bits(&ck, what, &cl.out[j], first[j]);
      free(first[j]);
    }
  }
  call_close(&cl);
}

/* Inputs that get a gradient: floats that are no labels, statistics or
 * no-grad inputs of the op. */
static int wants_grad(const call *cl, int i) {
  const kin *ki = &cl->c->in[i];
  return ki->kind != IN_LABEL && ki->kind != IN_STAT && ki->kind != IN_U8 && !ki->no_grad &&
         !(cl->t->no_grad_inputs >> i & 1) && is_float(cl->in[i].dut.dtype);
}

static void check_backward(const stoke_kernel_v1 *k, const engine *e, const kcase *c, stoke_rng *r) {
  call cl;
  call_open(&cl, c, k, e, r);
  stoke_tensor ri[STOKE_MAX_IO], ro[STOKE_MAX_IO], gi[STOKE_MAX_IO], go[STOKE_MAX_IO];
  stoke_kernel_args_v1 ra = args_of(&cl, ri, ro, 1), ga = args_of(&cl, gi, go, 0);
  /* the forward outputs backward reads: the reference's, rounded to the
   * tested dtype, on both sides */
  const stoke_kernel_v1 *rf = ref_kernel(c, STOKE_FWD, cl.in[0].dut.dtype);
  if (rf) {
    run_kernel(rf, &ra, cpu_engine(), "reference forward");
    for (int j = 0; j < cl.n_out; j++) kt_sync_up(&cl.out[j]);
    for (int i = 0; i < c->n_in; i++) kt_sync_up(&cl.in[i]); /* running statistics moved */
  }
  for (int i = 0; i < cl.n_in; i++)
    if (!(cl.t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) ri[i].data = gi[i].data = NULL;
  for (int j = 0; j < cl.n_out; j++)
    if (!(cl.t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j))) ro[j].data = go[j].data = NULL;
  ktensor dout[STOKE_MAX_IO], dx[STOKE_MAX_IO];
  stoke_tensor rdo[STOKE_MAX_IO], gdo[STOKE_MAX_IO], rdx[STOKE_MAX_IO], gdx[STOKE_MAX_IO];
  memset(dout, 0, sizeof dout), memset(dx, 0, sizeof dx);
  memset(rdo, 0, sizeof rdo), memset(gdo, 0, sizeof gdo), memset(rdx, 0, sizeof rdx), memset(gdx, 0, sizeof gdx);
  uint32_t douts = c->douts ? c->douts : 1u, params = 0, acc = 0;
  for (int j = 0; j < cl.n_out; j++) {
    rdo[j] = cl.out[j].ref, gdo[j] = cl.out[j].dut;
    rdo[j].data = gdo[j].data = NULL;
    if (!(douts >> j & 1)) continue;
    kt_alloc(&dout[j], e, &cl.out[j].ref.shape, cl.out[j].ref.dtype, cl.out[j].dut.dtype, cl.out[j].dut.layout);
    kt_fill(&dout[j], r, -1, 1, 0);
    rdo[j] = dout[j].ref, gdo[j] = dout[j].dut;
  }
  if (c->prep_dout) {
    stoke_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO], d[STOKE_MAX_IO];
    for (int i = 0; i < cl.n_in; i++) in[i] = cl.in[i].ref;
    for (int j = 0; j < cl.n_out; j++) out[j] = cl.out[j].ref, d[j] = dout[j].ref;
    c->prep_dout(c, in, out, d);
    for (int j = 0; j < cl.n_out; j++)
      if (dout[j].ref.data) kt_sync_up(&dout[j]);
  }
  for (int i = 0; i < cl.n_in; i++) {
    rdx[i] = cl.in[i].ref, gdx[i] = cl.in[i].dut;
    rdx[i].data = gdx[i].data = NULL;
    if (!wants_grad(&cl, i)) continue;
    kt_alloc(&dx[i], e, &cl.in[i].ref.shape, cl.in[i].ref.dtype, cl.in[i].dut.dtype, cl.in[i].dut.layout);
    kt_poison(&dx[i]);
    rdx[i] = dx[i].ref, gdx[i] = dx[i].dut;
    if (c->in[i].kind == IN_PARAM) params |= 1u << i;
    if (k->accumulates >> i & 1) acc |= 1u << i;
  }
  ra.din = rdx, ra.dout = rdo, ga.din = gdx, ga.dout = gdo;
  ra.param_grads = ga.param_grads = params;
  const stoke_kernel_v1 *rb = ref_kernel(c, STOKE_BWD, cl.in[0].dut.dtype);
  if (!rb) fail_msg("no cpu reference kernel for %s backward %s", c->op, stoke_dtype_name(ref_dtype(cl.in[0].dut.dtype)));
  run_kernel(rb, &ra, cpu_engine(), "reference");
  run_kernel(k, &ga, e, "tested");
  kcheck ck = {k, c, " overwrite"};
  expect_input_grads(&ck, &cl, dx);
  /* deterministic: the same call again, the gradients poisoned, the same bits */
  if (c->flags & STOKE_KFLAG_DETERMINISTIC) {
    ck.mode = " again";
    unsigned char *first[STOKE_MAX_IO] = {0};
    for (int i = 0; i < cl.n_in; i++)
      if (dx[i].ref.data) {
        first[i] = malloc(dut_bytes(&dx[i]) + 1);
        kt_copy(&dx[i], first[i], dx[i].dut.data, dut_bytes(&dx[i]), STOKE_COPY_D2H);
        kt_poison(&dx[i]);
      }
    run_kernel(k, &ga, e, "tested");
    for (int i = 0; i < cl.n_in; i++)
      if (first[i]) {
        char what[16];
        snprintf(what, sizeof what, "din%d", i);
        expect_same_bits(&ck, what, &dx[i], first[i]);
        free(first[i]);
      }
  }
  /* with forward (STOKE_KCAP_WITH_FORWARD): the forward's outputs poisoned
   * and made by this backward call too, every input and output live, as
   * the compiler runs it when it drops the forward node */
  if (k->caps & STOKE_KCAP_WITH_FORWARD) {
    ck.mode = " with forward";
    for (int i = 0; i < cl.n_in; i++) gi[i] = cl.in[i].dut;
    for (int j = 0; j < cl.n_out; j++) {
      go[j] = cl.out[j].dut;
      kt_poison(&cl.out[j]);
    }
    for (int i = 0; i < cl.n_in; i++)
      if (dx[i].ref.data) kt_poison(&dx[i]);
    ga.with_forward = 1;
    run_kernel(k, &ga, e, "tested");
    ga.with_forward = 0;
    expect_outputs(&ck, &cl);
    expect_input_grads(&ck, &cl, dx);
  }
  /* accumulate: onto random values where the kernel adds, poisoned where it overwrites */
  if (params | acc) {
    ck.mode = " accumulate";
    double *prior[STOKE_MAX_IO] = {0};
    for (int i = 0; i < cl.n_in; i++) {
      if (!dx[i].ref.data) continue;
      int64_t n = stoke_numel(&dx[i].ref.shape);
      double *grad = malloc((size_t)(n ? n : 1) * sizeof *grad);
      for (int64_t q = 0; q < n; q++) grad[q] = stoke_elem_get(dx[i].ref.data, dx[i].ref.dtype, q);
      if ((params | acc) >> i & 1) {
        kt_fill(&dx[i], r, -1, 1, 0);
        prior[i] = malloc((size_t)(n ? n : 1) * sizeof(double));
        for (int64_t q = 0; q < n; q++) prior[i][q] = stoke_elem_get(dx[i].ref.data, dx[i].ref.dtype, q) + grad[q];
      } else {
        kt_poison(&dx[i]);
        prior[i] = grad;
        grad = NULL;
      }
      free(grad);
    }
    ga.param_grad_beta = 1.0f;
    ga.din_accumulate = acc;
    run_kernel(k, &ga, e, "tested");
    for (int i = 0; i < cl.n_in; i++)
      if (prior[i]) {
        char what[24];
        snprintf(what, sizeof what, "din%d%s", i, (params | acc) >> i & 1 ? " (+=)" : "");
        expect_tensor(&ck, what, &dx[i], prior[i]);
        free(prior[i]);
      }
  }
  for (int j = 0; j < cl.n_out; j++) kt_free(&dout[j]);
  for (int i = 0; i < cl.n_in; i++) kt_free(&dx[i]);
  call_close(&cl);
}

/* --------------------------------------------------- optimizer steps */

/* A flat buffer of n values on both sides (ref f64 for float dtypes). */
static void kt_flat(ktensor *t, const engine *e, int64_t n, stoke_dtype rdt, stoke_dtype dt) {
  stoke_shape s = S1(n);
  kt_alloc(t, e, &s, rdt, dt, STOKE_LAYOUT_ANY);
}

/* The node an update-pass kernel is given (its name appears in messages). */
static stoke_node_v1 opt_node(const stoke_kernel_v1 *k) { return (stoke_node_v1){.op = k->op, .name = "kernel_test"}; }

/* The reference of an update-pass kernel: the cpu's in f64, else in its
 * own dtype (amp_update is f32 only). */
static const stoke_kernel_v1 *opt_ref(const stoke_kernel_v1 *k) {
  const stoke_kernel_v1 *rk = stoke_find_kernel(reg, "cpu", k->op, STOKE_OPT, STOKE_F64, STOKE_LAYOUT_ANY);
  return rk ? rk : stoke_find_kernel(reg, "cpu", k->op, STOKE_OPT, k->dtype, STOKE_LAYOUT_ANY);
}

/* An optimizer's update (any registered optimizer, a plugin's too: hyper[]
 * all 0.5): three steps of fresh gradients on random parameters, state
 * from zero. A parameter dtype below f32 keeps an f32 master copy at the
 * start of the state (stoke_kernel_args_v1). Parameters, master and state
 * compared after the last step. */
static void check_update(const stoke_kernel_v1 *k, const engine *e, const kcase *c, stoke_rng *r) {
  stoke_node_v1 node = opt_node(k);
  const stoke_optimizer_v1 *o = stoke_find_optimizer(reg, k->op);
  const stoke_kernel_v1 *rk = opt_ref(k);
  if (!rk) fail_msg("no cpu reference kernel for update %s", k->op);
  int64_t n = c->in[0].shape.d[0], ns = o->n_state;
  int master = k->dtype == STOKE_BF16 || k->dtype == STOKE_F16;
  stoke_dtype sdt = master ? STOKE_F32 : k->dtype, rdt = rk->dtype;
  ktensor p, g, st;
  kt_flat(&p, e, n, rdt, k->dtype);
  kt_flat(&g, e, n, rdt, k->dtype);
  kt_flat(&st, e, n * (ns + master), rdt, sdt);
  kt_fill(&p, r, -1, 1, 0);
  for (int64_t i = 0; i < n * (ns + master); i++)
    stoke_elem_set(st.ref.data, rdt, i, i < n && master ? stoke_elem_get(p.ref.data, rdt, i) : 0);
  kt_sync_up(&st);
  /* the reference keeps no master: its state is the optimizer's alone */
  ktensor rst;
  kt_flat(&rst, cpu_engine(), n * ns > 0 ? n * ns : 1, rdt, rdt);
  stoke_opt_args_v1 oa = {.lr = 0.01, .momentum = 0.9, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.99,
                          .eps = 1e-8, .nesterov = c->training, .grad_scale = 0.5};
  for (int h = 0; h < STOKE_OPT_MAX_HYPER; h++) oa.hyper[h] = 0.5;
  for (int step = 1; step <= 3; step++) {
    kt_fill(&g, r, -1, 1, 0);
    oa.step = step;
    stoke_tensor ri[3] = {p.ref, g.ref, rst.ref}, gi[3] = {p.dut, g.dut, st.dut};
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 3, .in = ri, .opt = &oa, .training = 1};
    stoke_kernel_args_v1 ga = ra;
    ga.in = gi;
    run_kernel(rk, &ra, cpu_engine(), "reference");
    run_kernel(k, &ga, e, "tested");
  }
  kcheck ck = {k, c, ""};
  expect_tensor(&ck, "params", &p, NULL);
  double *got = kt_download(&st), *want = malloc((size_t)(n * (ns + master)) * sizeof *want);
  for (int64_t i = 0; i < n * (ns + master); i++)
    want[i] = master && i < n ? stoke_elem_get(p.ref.data, rdt, i) : stoke_elem_get(rst.ref.data, rdt, i - (master ? n : 0));
  expect_close(&ck, master ? "master, state" : "state", got, want, n * (ns + master), sdt);
  free(got), free(want);
  kt_free(&p), kt_free(&g), kt_free(&st), kt_free(&rst);
}

/* grad_norm: [norm, factor] of random gradients, and with one of them inf. */
static void check_grad_norm(const stoke_kernel_v1 *k, const engine *e, const kcase *c, stoke_rng *r) {
  stoke_node_v1 node = opt_node(k);
  const stoke_kernel_v1 *rk = opt_ref(k);
  if (!rk) fail_msg("no cpu reference kernel for %s", k->op);
  ktensor g, out;
  kt_flat(&g, e, c->in[0].shape.d[0], rk->dtype, k->dtype);
  kt_flat(&out, e, 2, STOKE_F32, STOKE_F32);
  kt_fill(&g, r, -1, 1, 0);
  stoke_opt_args_v1 oa = {.grad_scale = 0.5, .max_norm = c->arg};
  stoke_tensor ri[2] = {g.ref, out.ref}, gi[2] = {g.dut, out.dut};
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .in = ri, .opt = &oa}, ga = ra;
  ga.in = gi;
  kt_poison(&out);
  run_kernel(rk, &ra, cpu_engine(), "reference");
  run_kernel(k, &ga, e, "tested");
  kcheck ck = {k, c, ""};
  expect_tensor(&ck, "norm, factor", &out, NULL);
  kt_free(&g), kt_free(&out);
}

/* amp_check: found_inf stays 0 on finite gradients and becomes 1 with one
 * inf among them (at a random place). */
static void check_amp_check(const stoke_kernel_v1 *k, const engine *e, const kcase *c, stoke_rng *r) {
  stoke_node_v1 node = opt_node(k);
  const stoke_kernel_v1 *rk = opt_ref(k);
  if (!rk) fail_msg("no cpu reference kernel for %s", k->op);
  int64_t n = c->in[0].shape.d[0];
  ktensor g, st;
  kt_flat(&g, e, n, rk->dtype, k->dtype);
  kt_flat(&st, e, 4, STOKE_F32, STOKE_F32);
  for (int bad = 0; bad < 2; bad++) {
    kt_fill(&g, r, -1, 1, 0);
    if (bad) {
      stoke_elem_set(g.ref.data, g.ref.dtype, (int64_t)stoke_rng_below(r, (uint64_t)n), INFINITY);
      kt_sync_up(&g);
    }
    float s0[4] = {1024, 3, 0, 1};
    memcpy(st.ref.data, s0, sizeof s0);
    kt_copy(&st, st.dut.data, s0, sizeof s0, STOKE_COPY_H2D);
    stoke_opt_args_v1 oa = {0};
    stoke_tensor ri[2] = {g.ref, st.ref}, gi[2] = {g.dut, st.dut};
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .in = ri, .opt = &oa}, ga = ra;
    ga.in = gi;
    run_kernel(rk, &ra, cpu_engine(), "reference");
    run_kernel(k, &ga, e, "tested");
    kcheck ck = {k, c, bad ? " one inf" : " finite"};
    if (((float *)st.ref.data)[2] != (float)bad) fail_msg("reference amp_check: found_inf %g", ((float *)st.ref.data)[2]);
    expect_tensor(&ck, "scaler state", &st, NULL);
  }
  kt_free(&g), kt_free(&st);
}

/* amp_update: a clean step that grows the scale (growth interval
 * reached), a clean one that does not, and an overflow that backs off. */
static void check_amp_update(const stoke_kernel_v1 *k, const engine *e, const kcase *c, stoke_rng *r) {
  stoke_node_v1 node = opt_node(k);
  const stoke_kernel_v1 *rk = opt_ref(k);
  if (!rk) fail_msg("no cpu reference kernel for %s", k->op);
  static const float starts[3][4] = {{1024, 1, 0, 2}, {1024, 0, 0, 0}, {512, 1, 1, 3}};
  ktensor st, sd;
  kt_flat(&st, e, 4, STOKE_F32, STOKE_F32);
  kt_flat(&sd, e, 1, STOKE_F32, STOKE_F32);
  for (int i = 0; i < 3; i++) {
    memcpy(st.ref.data, starts[i], sizeof starts[i]);
    kt_copy(&st, st.dut.data, starts[i], sizeof starts[i], STOKE_COPY_H2D);
    kt_poison(&sd);
    stoke_opt_args_v1 oa = {.growth_interval = 2, .growth_factor = 2, .backoff_factor = 0.5};
    stoke_tensor ri[2] = {st.ref, sd.ref}, gi[2] = {st.dut, sd.dut};
    stoke_kernel_args_v1 ra = {.node = &node, .n_in = 2, .in = ri, .opt = &oa}, ga = ra;
    ga.in = gi;
    run_kernel(rk, &ra, cpu_engine(), "reference");
    run_kernel(k, &ga, e, "tested");
    kcheck ck = {k, c, i == 2 ? " overflow" : " clean"};
    expect_tensor(&ck, "scaler state", &st, NULL);
    expect_tensor(&ck, "loss seed", &sd, NULL);
  }
  kt_free(&st), kt_free(&sd);
}

typedef void (*check_fn)(const stoke_kernel_v1 *k, const engine *e, const kcase *c, stoke_rng *r);

/* The update-pass ops and their checks; an optimizer's update (a plugin's
 * too) needs no entry. */
static const struct {
  const char *op;
  check_fn check;
} opt_table[] = {
    {STOKE_OP_GRAD_NORM, check_grad_norm},
    {STOKE_OP_AMP_CHECK, check_amp_check},
    {STOKE_OP_AMP_UPDATE, check_amp_update},
};

static check_fn opt_check(const char *op) {
  for (size_t i = 0; i < sizeof opt_table / sizeof *opt_table; i++)
    if (!strcmp(opt_table[i].op, op)) return opt_table[i].check;
  return stoke_find_optimizer(reg, op) ? check_update : NULL;
}

/* Update cases: flat buffers of odd lengths (every kernel's tail), one
 * long enough for several blocks. */
static int gen_opt(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  int64_t lens[3] = {odd5(r) + 12, pick(r, 100, 1000) * 4 + 1, 70001}; /* 17 and more: see odd5 */
  for (int i = 0; i < 3; i++) {
    kcase *c = new_case(out, &n, k->op, "%lld values%s", (long long)lens[i], i == 1 ? ", nesterov" : "");
    add_in(c, S1(lens[i]), IN_PARAM);
    c->training = i == 1; /* nesterov, for sgd */
    c->arg = i == 0 ? 1e6 : 0.1; /* grad_norm's max_norm: no clipping, then clipping */
    c->k = strcmp(k->op, STOKE_OP_GRAD_NORM) ? 1 : (double)lens[i];
  }
  return n;
}

/* ---------------------------------------------------- the walk */

static int has_4d_act(const kcase *c) {
  for (int i = 0; i < c->n_in; i++)
    if (c->in[i].shape.ndim == 4 && c->in[i].kind != IN_PARAM && !c->in[i].layout) return 1;
  return 0;
}

/* One kernel: its cases, each in every layout it serves. */
static void test_kernel(void **state) {
  const stoke_kernel_v1 *k = *state;
  const engine *e = engine_of(k->engine);
  if (!e) fail_msg("kernel %s/%s: its engine %s is not open", k->engine, k->op, k->engine);
  check_fn opt = k->pass == STOKE_OPT ? opt_check(k->op) : NULL;
  case_fn gen = k->pass == STOKE_OPT ? (opt ? gen_opt : NULL) : case_gen(k->op);
  if (!gen)
    fail_msg("kernel %s/%s %s %s %s has no test case: op type '%s' has no generator in tests/op/kernel_cases.h "
             "(case_table%s); add one",
             k->engine, k->op, pass_name(k->pass), stoke_dtype_name(k->dtype), stoke_layout_name(k->layout), k->op,
             k->pass == STOKE_OPT ? ", or opt_table in every_kernel_test.c" : "");
  uint64_t name = 1469598103934665603ull; /* FNV-1a of engine/op: each kernel its own draws */
  for (const char *p = k->engine; *p; p++) name = (name ^ (uint8_t)*p) * 1099511628211ull;
  for (const char *p = k->op; *p; p++) name = (name ^ (uint8_t)*p) * 1099511628211ull;
  stoke_rng r = stoke_rng_seed(stoke_hash3(seed, name, (uint64_t)k->pass * 64 + (uint64_t)k->dtype * 8 + k->layout));
  kcase cases[MAX_CASES];
  int n = gen(k, &r, cases);
  for (int i = 0; i < n; i++) {
    kcase c = cases[i];
    stoke_layout lays[2] = {c.layout, c.layout};
    int n_lay = 1;
    if (k->layout != STOKE_LAYOUT_ANY) lays[0] = k->layout;
    else if (!c.layout && has_4d_act(&c)) lays[0] = STOKE_NCHW, lays[1] = STOKE_NHWC, n_lay = 2;
    for (int l = 0; l < n_lay; l++) {
      c.layout = lays[l];
      if (k->pass == STOKE_OPT) opt(k, e, &c, &r);
      else if (k->pass == STOKE_FWD) check_forward(k, e, &c, &r);
      else check_backward(k, e, &c, &r);
    }
  }
}

/* --list: every registered kernel and whether its op has a case, without
 * opening a device (what a GPU run would test, seen from any machine). */
static int list_kernels(void) {
  int n = 0, missing = 0;
  for (const stoke_kernel_v1 *k; (k = stoke_registry_kernel(reg, n)); n++) {
    int has = k->pass == STOKE_OPT ? opt_check(k->op) != NULL : case_gen(k->op) != NULL;
    missing += !has;
    printf("%-14s %-20s %-8s %-4s %-4s%s%s\n", k->engine, k->op, pass_name(k->pass), stoke_dtype_name(k->dtype),
           stoke_layout_name(k->layout), k->accumulates ? " accumulates" : "", has ? "" : "  NO TEST CASE");
  }
  printf("%d kernels, %d without a test case\n", n, missing);
  return missing != 0;
}

int main(int argc, char **argv) {
  int list = argc > 1 && !strcmp(argv[1], "--list");
  if (setup(!list)) return 1;
  if (list) {
    int rc = list_kernels();
    stoke_registry_free(reg);
    return rc;
  }
  int n = 0;
  while (stoke_registry_kernel(reg, n)) n++;
  struct CMUnitTest *tests = calloc((size_t)n + 1, sizeof *tests);
  char line[160];
  print_message("every_kernel_test: %d kernels registered\n", n);
  for (int i = 0; i < n; i++) {
    const stoke_kernel_v1 *k = stoke_registry_kernel(reg, i);
    snprintf(line, sizeof line, "%s/%s %s %s %s%s", k->engine, k->op, pass_name(k->pass), stoke_dtype_name(k->dtype),
             stoke_layout_name(k->layout), k->accumulates ? " (accumulates)" : "");
    tests[i] = (struct CMUnitTest){strdup(line), test_kernel, NULL, NULL, (void *)k};
  }
  for (int i = 0; i < n_engines; i++) {
    int count = 0;
    for (int j = 0; j < n; j++) count += !strcmp(stoke_registry_kernel(reg, j)->engine, engines[i].name);
    print_message("  engine %-14s %3d kernels\n", engines[i].name, count);
  }
  int failed = _cmocka_run_group_tests("every_kernel", tests, (size_t)n, NULL, NULL);
  for (int i = 0; i < n; i++) free((void *)tests[i].name);
  free(tests);
  teardown();
  return failed;
}
