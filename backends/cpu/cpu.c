/* backends/cpu/cpu.c: the "cpu" plugin: the host-memory backend and the
 * reference kernels (linear, linear_relu, linear_act, linear_dact, relu,
 * gelu, add, softmax_ce; f32, f64; the update's are in optim.c).
 *
 * The kernel bodies live in kernels.inc, written once for an element type
 * T and included twice below: for float (what training runs on) and for
 * double, which exists so the op tests can check every gradient against
 * central finite differences in double. This file holds what does not
 * depend on T: the backend, the argument checks and the kernel table. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"
#include "act.h"
#include "blas.h"
#include "check.h"
#include "cpu_cnn.h"

const stoke_host_v1 *stoke_host;

/* ================================================================ backend */

static stoke_err *cpu_open(int device_index, void *device_self, void **self) {
  *self = NULL; /* the CPU backend keeps no state */
  return cpu_blas_ready();
}

static void cpu_close(void *self) {}

/* "model name" from /proc/cpuinfo, or "CPU" where there is none. */
static void cpu_model_name(char *out, size_t cap) {
  snprintf(out, cap, "CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10)) continue;
    const char *v = strchr(line, ':');
    if (!v) break;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strcspn(v, "\r\n");
    if (n) snprintf(out, cap, "%.*s", (int)n, v);
    break;
  }
  fclose(f);
}

static stoke_err *cpu_info(void *self, stoke_device_info_v1 *out) {
  memset(out, 0, sizeof *out); /* peak_flops all 0: unknown, MFU n/a */
  cpu_model_name(out->name, sizeof out->name);
  long page = sysconf(_SC_PAGESIZE);
  long total = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  if (page > 0 && total > 0) out->total_bytes = (size_t)total * (size_t)page;
  if (page > 0 && avail > 0) out->free_bytes = (size_t)avail * (size_t)page;
  return NULL;
}

static stoke_err *cpu_alloc(void *self, size_t bytes, void **ptr) {
  *ptr = stoke_host->alloc(bytes); /* 64-byte aligned */
  if (!*ptr)
    return STOKE_PERR(STOKE_E_OOM, "cpu: out of host memory allocating %zu bytes", bytes);
  return NULL;
}

static void cpu_free(void *self, void *ptr) { stoke_host->free(ptr); }

/* Every copy kind is a host copy on the CPU. */
static stoke_err *cpu_copy(void *self, void *dst, const void *src, size_t bytes,
                           stoke_copy_kind kind, void *stream) {
  if (bytes && dst != src) memcpy(dst, src, bytes);
  return NULL;
}

static stoke_err *cpu_fill(void *self, void *dst, int byte, size_t bytes, void *stream) {
  if (bytes) memset(dst, byte, bytes);
  return NULL;
}

static stoke_err *cpu_stream_create(void *self, void **stream) {
  *stream = NULL; /* the CPU has one, synchronous, stream */
  return NULL;
}

static void cpu_stream_destroy(void *self, void *stream) {}

static stoke_err *cpu_stream_sync(void *self, void *stream) { return NULL; }

/* Timers: the host's monotonic clock (kernels run synchronously here). */
static stoke_err *cpu_timer_create(void *self, void **t) {
  *t = stoke_host->alloc(sizeof(struct timespec));
  return *t ? NULL : STOKE_PERR(STOKE_E_OOM, "cpu: out of memory for a timer");
}

static void cpu_timer_destroy(void *self, void *t) { stoke_host->free(t); }

static stoke_err *cpu_timer_record(void *self, void *t, void *stream) {
  clock_gettime(CLOCK_MONOTONIC, (struct timespec *)t);
  return NULL;
}

static stoke_err *cpu_timer_elapsed(void *self, void *a, void *b, float *ms) {
  const struct timespec *x = a, *y = b;
  *ms = (float)((double)(y->tv_sec - x->tv_sec) * 1e3 + (double)(y->tv_nsec - x->tv_nsec) * 1e-6);
  return NULL;
}

static const stoke_backend_v1 cpu_backend = {
    STOKE_ABI(stoke_backend_v1),
    .name = "cpu",
    .help = "host memory and the reference kernels (OpenBLAS for matmuls)",
    .device = STOKE_DEV_CPU,
    .device_engine = NULL,
    .open = cpu_open,
    .close = cpu_close,
    .info = cpu_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_host = cpu_alloc,
    .free_host = cpu_free,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .timer_create = cpu_timer_create,
    .timer_destroy = cpu_timer_destroy,
    .timer_record = cpu_timer_record,
    .timer_elapsed_ms = cpu_timer_elapsed,
};

/* ========================================================= argument checks */

/* Shared by both instantiations. Each takes `run`: 0 when called from plan
 * (data pointers may all be NULL, so only shapes and dtypes are checked),
 * 1 from run (the data the kernel reads or writes must be there too). */

/* BLAS takes int dimensions. */
static stoke_err *check_blas_dims(const stoke_kernel_args_v1 *a, const char *op,
                                  const stoke_shape *s) {
  for (int i = 0; i < s->ndim; i++)
    if (s->d[i] < 0 || s->d[i] > INT_MAX)
      return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': shape %s has a dimension beyond int",
                        op, stoke_node_name(a), stoke_shape_str(s).s);
  return NULL;
}

static stoke_err *linear_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd,
                               int run) {
  const char *op = STOKE_OP_LINEAR;
  CHECK(stoke_check_counts(a, op, bwd, 3, 1));
  const stoke_tensor *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
  const stoke_shape *xs = &x->shape, *ws = &w->shape, *bs = &b->shape, *ys = &y->shape;
  if (xs->ndim != 2 || ws->ndim != 2 || bs->ndim != 1 || ys->ndim != 2 ||
      xs->d[1] != ws->d[1] || bs->d[0] != ws->d[0] || ys->d[0] != xs->d[0] ||
      ys->d[1] != ws->d[0])
    return STOKE_PERR(STOKE_E_INVALID,
                      "linear '%s': expects x[N, in], weight[out, in], bias[out] -> y[N, out]; "
                      "got x %s, weight %s, bias %s, y %s",
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ws).s, stoke_shape_str(bs).s, stoke_shape_str(ys).s);
  CHECK(check_blas_dims(a, op, xs));
  CHECK(check_blas_dims(a, op, ws));
  CHECK(stoke_check_dtype(a, op, "x", x, dt));
  CHECK(stoke_check_dtype(a, op, "weight", w, dt));
  CHECK(stoke_check_dtype(a, op, "bias", b, dt));
  CHECK(stoke_check_dtype(a, op, "y", y, dt));
  if (!bwd) {
    CHECK(stoke_check_data(a, op, "x", x, run));
    CHECK(stoke_check_data(a, op, "weight", w, run));
    CHECK(stoke_check_data(a, op, "bias", b, run));
    return stoke_check_data(a, op, "y", y, run);
  }
  CHECK(stoke_check_grad(a, op, "x", &a->din[0], x));
  CHECK(stoke_check_grad(a, op, "weight", &a->din[1], w));
  CHECK(stoke_check_grad(a, op, "bias", &a->din[2], b));
  CHECK(stoke_check_grad(a, op, "y", &a->dout[0], y));
  CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
  if (a->din[0].data) CHECK(stoke_check_data(a, op, "weight", w, run)); /* dx = dy W */
  if (a->din[1].data) CHECK(stoke_check_data(a, op, "x", x, run));      /* dW = dy^T x */
  return NULL;
}

/* An elementwise activation x -> y; its backward reads y (relu) or x
 * (gelu): `reads`, named in the error. */
static stoke_err *act_check(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd, int run,
                            const stoke_tensor *reads, const char *what) {
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  if (!stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': x is %s but y is %s", op, stoke_node_name(a),
                      stoke_shape_str(&x->shape).s, stoke_shape_str(&y->shape).s);
  CHECK(check_xy(a, op, dt, bwd, run));
  if (!bwd) return NULL;
  CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
  if (a->din[0].data) CHECK(stoke_check_data(a, op, what, reads, run));
  return NULL;
}

static stoke_err *relu_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  return act_check(a, STOKE_OP_RELU, dt, bwd, run, &a->out[0], "y (the forward output)");
}

static stoke_err *gelu_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  return act_check(a, STOKE_OP_GELU, dt, bwd, run, &a->in[0], "x (the forward input)");
}

/* The aux of linear_act / linear_dact for y[N, out] of dtype dt (stoke/ops.h). */
static stoke_err *act_aux_check(const stoke_kernel_args_v1 *a, const char *op, const char *act,
                                const stoke_tensor *aux, const stoke_shape *y, stoke_dtype dt, int run) {
  int relu = !strcmp(act, "relu");
  int64_t cols = relu ? relu_mask_stride(y->d[1]) : y->d[1];
  stoke_dtype want = relu ? STOKE_U8 : dt;
  if (strcmp(act, "relu") && strcmp(act, "gelu"))
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': act '%s' is neither relu nor gelu", op, stoke_node_name(a), act);
  if (aux->shape.ndim != 2 || aux->shape.d[0] != y->d[0] || aux->shape.d[1] != cols)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': aux is %s, a %s aux for [%lld, %lld] is [%lld, %lld]", op,
                      stoke_node_name(a), stoke_shape_str(&aux->shape).s, act, (long long)y->d[0], (long long)y->d[1],
                      (long long)y->d[0], (long long)cols);
  CHECK(stoke_check_dtype(a, op, "aux", aux, want));
  return stoke_check_data(a, op, "aux", aux, run);
}

static const char *act_attr(const stoke_kernel_args_v1 *a, int i, const char *def) {
  return a->node && a->node->n_attrs > i ? a->node->attrs[i].s : def;
}

/* linear_act: linear's checks, and a second output, the aux. */
static stoke_err *linear_act_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int run) {
  CHECK(linear_check(a, dt, 0, run));
  if (a->n_out < 2)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs the outputs y and aux, got %d", STOKE_OP_LINEAR_ACT,
                      stoke_node_name(a), a->n_out);
  return act_aux_check(a, STOKE_OP_LINEAR_ACT, act_attr(a, STOKE_LINEAR_ACT_ACT, ""), &a->out[1],
                       &a->out[0].shape, dt, run);
}

/* linear_dact: linear's backward checks on (y1, W, b), plus aux1 for y1
 * and, when asked for, d bias1 [in]. */
static stoke_err *linear_dact_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int run) {
  const char *op = STOKE_OP_LINEAR_DACT;
  CHECK(linear_check(a, dt, 1, run));
  if (a->n_in < 5)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': needs y1, weight, bias, aux1, bias1; got %d inputs", op,
                      stoke_node_name(a), a->n_in);
  CHECK(act_aux_check(a, op, act_attr(a, STOKE_LINEAR_ACT_ACT, ""), &a->in[3], &a->in[0].shape, dt,
                      run && a->din[0].data));
  const stoke_tensor *b1 = &a->in[4];
  if (b1->shape.ndim != 1 || b1->shape.d[0] != a->in[0].shape.d[1])
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': bias1 is %s, expected [%lld]", op, stoke_node_name(a),
                      stoke_shape_str(&b1->shape).s, (long long)a->in[0].shape.d[1]);
  CHECK(stoke_check_grad(a, op, "bias1", &a->din[4], b1));
  if (a->din[4].data && !a->din[0].data)
    return STOKE_PERR(STOKE_E_INVALID, "%s '%s': d bias1 is asked for without dz1", op, stoke_node_name(a));
  return NULL;
}


static double softmax_ce_smoothing(const stoke_kernel_args_v1 *a) {
  const stoke_node_v1 *n = a->node;
  return n && n->n_attrs > STOKE_SOFTMAX_CE_LABEL_SMOOTHING
             ? n->attrs[STOKE_SOFTMAX_CE_LABEL_SMOOTHING].f
             : 0.0;
}

static stoke_err *softmax_ce_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd,
                                   int run) {
  const char *op = STOKE_OP_SOFTMAX_CE;
  CHECK(stoke_check_counts(a, op, bwd, 2, 2));
  const stoke_tensor *x = &a->in[0], *lab = &a->in[1], *loss = &a->out[0], *lse = &a->out[1];
  const stoke_shape *xs = &x->shape, *ls = &lab->shape;
  if (xs->ndim != 2 || ls->ndim != 1 || ls->d[0] != xs->d[0] || xs->d[0] < 1 || xs->d[1] < 1 ||
      stoke_numel(&loss->shape) != 1 || lse->shape.ndim != 1 || lse->shape.d[0] != xs->d[0])
    return STOKE_PERR(STOKE_E_INVALID,
                      "softmax_ce '%s': expects logits[N, C] (N, C >= 1), labels[N] -> loss[1], lse[N]; "
                      "got logits %s, labels %s, loss %s, lse %s",
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ls).s, stoke_shape_str(&loss->shape).s, stoke_shape_str(&lse->shape).s);
  double smooth = softmax_ce_smoothing(a);
  if (!(smooth >= 0 && smooth < 1))
    return STOKE_PERR(STOKE_E_INVALID, "softmax_ce '%s': label_smoothing %g not in [0, 1)",
                      stoke_node_name(a), smooth);
  CHECK(stoke_check_dtype(a, op, "logits", x, dt));
  CHECK(stoke_check_dtype(a, op, "labels", lab, STOKE_I32));
  CHECK(stoke_check_dtype(a, op, "loss", loss, dt));
  CHECK(stoke_check_dtype(a, op, "lse", lse, dt));
  CHECK(stoke_check_data(a, op, "logits", x, run));
  CHECK(stoke_check_data(a, op, "labels", lab, run));
  CHECK(stoke_check_data(a, op, "lse", lse, run));
  if (!bwd) return stoke_check_data(a, op, "loss", loss, run);
  CHECK(stoke_check_grad(a, op, "logits", &a->din[0], x));
  CHECK(stoke_check_grad(a, op, "loss", &a->dout[0], loss));
  return stoke_check_data(a, op, "dloss", &a->dout[0], run);
}

/* Labels are checked before use: one outside [0, C) would index out of
 * the row. */
static stoke_err *softmax_ce_labels(const stoke_kernel_args_v1 *a) {
  const int32_t *lab = a->in[1].data;
  int64_t n = a->in[0].shape.d[0], c = a->in[0].shape.d[1];
  for (int64_t r = 0; r < n; r++)
    if (lab[r] < 0 || lab[r] >= c)
      return STOKE_PERR(STOKE_E_DATA,
                        "softmax_ce '%s': row %lld has label %d, outside [0, %lld) classes",
                        stoke_node_name(a), (long long)r, (int)lab[r], (long long)c);
  return NULL;
}

/* ================================================== the two instantiations */

#define PER_TYPE_FILE "kernels.inc"
#include "per_type.h"

/* ============================================================ registration */

#define KERNEL(op, pass, fn, sfx, dt) CPU_KERNEL(op, pass, fn, sfx, dt, stoke_destroy_none)
/* A kernel with per-node state from plan(), freed by fn##_destroy. */
#define KERNEL_STATE(op, pass, fn, sfx, dt) \
  CPU_KERNEL(op, pass, fn, sfx, dt, CAT(fn##_destroy, sfx))
#define KERNELS(sfx, dt)                                          \
  KERNEL(STOKE_OP_LINEAR, STOKE_FWD, linear_fwd, sfx, dt),         \
  KERNEL(STOKE_OP_LINEAR, STOKE_BWD, linear_bwd, sfx, dt),         \
  KERNEL(STOKE_OP_LINEAR_RELU, STOKE_FWD, linear_relu_fwd, sfx, dt), \
  KERNEL_STATE(STOKE_OP_LINEAR_RELU, STOKE_BWD, linear_relu_bwd, sfx, dt), \
  KERNEL(STOKE_OP_RELU, STOKE_FWD, relu_fwd, sfx, dt),             \
  KERNEL(STOKE_OP_RELU, STOKE_BWD, relu_bwd, sfx, dt),             \
  KERNEL(STOKE_OP_GELU, STOKE_FWD, gelu_fwd, sfx, dt),             \
  KERNEL(STOKE_OP_GELU, STOKE_BWD, gelu_bwd, sfx, dt),             \
  KERNEL(STOKE_OP_LINEAR_ACT, STOKE_FWD, linear_act_fwd, sfx, dt), \
  KERNEL(STOKE_OP_LINEAR_DACT, STOKE_BWD, linear_dact_bwd, sfx, dt), \
  KERNEL(STOKE_OP_ADD, STOKE_FWD, add_fwd, sfx, dt),               \
  KERNEL(STOKE_OP_ADD, STOKE_BWD, add_bwd, sfx, dt),               \
  KERNEL(STOKE_OP_SOFTMAX_CE, STOKE_FWD, softmax_ce_fwd, sfx, dt), \
  {"cpu", STOKE_OP_SOFTMAX_CE, STOKE_BWD, dt, STOKE_LAYOUT_ANY, CAT(softmax_ce_bwd_plan, sfx),  \
   CAT(softmax_ce_bwd, sfx), stoke_destroy_none, 0, STOKE_KCAP_WITH_FORWARD}

static const stoke_kernel_v1 cpu_kernels[] = {
    KERNELS(f32, STOKE_F32),
    KERNELS(f64, STOKE_F64),
};

static stoke_err *cpu_register(const stoke_host_v1 *host, const stoke_registry_v1 *r) {
  stoke_host = host;
  STOKE_PTRY(r->add_backend(r->self, &cpu_backend), "registering the cpu backend");
  STOKE_PROPAGATE_P(stoke_add_kernels(r, cpu_kernels, sizeof cpu_kernels / sizeof *cpu_kernels));
  STOKE_PROPAGATE_P(cpu_register_conv(r));
  STOKE_PROPAGATE_P(cpu_register_pool(r));
  STOKE_PROPAGATE_P(cpu_register_norm(r));
  STOKE_PROPAGATE_P(cpu_register_cast(r));
  STOKE_PROPAGATE_P(cpu_register_optim(r));
  STOKE_PROPAGATE_P(cpu_register_seq(r));
  STOKE_PROPAGATE_P(cpu_register_convbn(r));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "cpu",
    "CPU backend and reference kernels (f32, f64)", cpu_register};
