/* tools/plugin_check: the plugin test kit. `plugin_check libstoke_x.so`
 * loads a plugin beside the cpu backend (and a GPU backend, where one
 * opens) and checks what it registers as stoke checks its own parts:
 *  - every op, on its test cases (stoke/testkit.h; else every input of one
 *    shape): the cpu forward in f64 with its outputs poisoned (each element
 *    must be written), its backward against central differences in double
 *    (torch.autograd.gradcheck's test), the backward handed only what
 *    bwd_needs names (a read of anything else is caught and named, not a
 *    crash), and parameter gradients honouring param_grad_beta;
 *  - every other kernel of the op (a GPU's; the cpu's in f32), forward and
 *    backward: against the cpu f64 kernel of the same pass on the same
 *    random inputs and output gradient, outputs poisoned on its device,
 *    tolerance from its precision and the longest sum it can make;
 *  - every source: its sample info, labels in [0, classes), the same bytes
 *    for the same (index, seed) and every byte written, reads from 4
 *    threads equal to one thread's, and the memory order the core reads.
 * One line per check; exit 0 when every check passed, 1 otherwise. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/config.h"
#include "stoke/check.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/registry.h"
#include "stoke/rng.h"
#include "stoke/testkit.h"

#define FD_H 1e-6     /* central-difference step */
#define FD_TOL 1e-6   /* |analytic - numeric| / max(|a|, |n|, FD_FLOOR) */
#define FD_FLOOR 1e-2 /* so gradients near 0 do not divide by ~0 */
#define MAX_CASES 64

typedef struct kit {
  stoke_registry *reg;
  const char *plugin; /* its file, as loaded */
  const stoke_backend_v1 *cpu, *gpu;
  void *cpu_self, *gpu_self;
  const stoke_testkit_v1 *cases; /* the plugin's, or NULL */
  const char *ini;               /* --ini: the sources' keys */
  uint64_t seed;
  int checks, failures;
} kit;

/* ------------------------------------------------------------ reporting */

static void result(kit *k, int ok, const char *what, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void result(kit *k, int ok, const char *what, const char *fmt, ...) {
  k->checks++;
  k->failures += !ok;
  printf("%s %s", ok ? "ok  " : "FAIL", what);
  if (fmt && fmt[0]) {
    va_list ap;
    va_start(ap, fmt);
    printf(": ");
    vprintf(fmt, ap);
    va_end(ap);
  }
  printf("\n");
}

static int fail_err(kit *k, const char *what, stoke_err *e) {
  result(k, 0, what, "%s", e->msg);
  stoke_err_free(e);
  return 0;
}

/* ------------------------------------------------------ host tensors */

/* A host tensor's bytes are followed by a guard as long as they are (plus
 * 64), filled with GUARD_FILL and checked after every kernel call: a
 * kernel writing another dtype or shape than its table says (f64 code
 * registered as f32: twice the bytes) is named, where it had corrupted the
 * heap and glibc aborted later with no word of which check ran. */
#define GUARD_FILL 0xa5

static size_t body_bytes(const stoke_tensor *t) {
  size_t es = stoke_dtype_size(t->dtype) ? stoke_dtype_size(t->dtype) : 8;
  return ((size_t)stoke_numel(&t->shape) + 1) * es;
}

static stoke_tensor host_tensor(const stoke_shape *s, stoke_dtype dt) {
  stoke_tensor t = {NULL, *s, dt, s->ndim == 4 ? STOKE_NCHW : STOKE_LAYOUT_ANY, STOKE_DEV_CPU};
  size_t body = body_bytes(&t);
  if ((t.data = calloc(1, 2 * body + 64))) memset((char *)t.data + body, GUARD_FILL, body + 64);
  return t;
}

/* How far into a guard of n bytes a kernel wrote (0: not at all). */
static size_t guard_reach(const unsigned char *g, size_t n) {
  size_t last = 0;
  for (size_t i = 0; i < n; i++)
    if (g[i] != GUARD_FILL) last = i + 1;
  return last;
}

/* Bytes of t's guard a kernel overwrote (0: none); the guard is filled again. */
static size_t guard_hits(const stoke_tensor *t) {
  if (!t->data) return 0;
  unsigned char *g = (unsigned char *)t->data + body_bytes(t);
  size_t n = body_bytes(t) + 64, last = guard_reach(g, n);
  if (last) memset(g, GUARD_FILL, n);
  return last;
}

static void poison(stoke_tensor *t) { memset(t->data, 0xff, stoke_tensor_bytes(t)); /* NaN in every float dtype */ }

static int64_t first_nan(const stoke_tensor *t) {
  for (int64_t i = 0, n = stoke_numel(&t->shape); i < n; i++)
    if (isnan(stoke_elem_get(t->data, t->dtype, i))) return i;
  return -1;
}

/* -------------------------------------------------------- one op call */

typedef struct call {
  const stoke_op_type_v1 *op;
  stoke_node_v1 node;
  char label[160]; /* "op leaky_relu [3, 5] (negative_slope=0.1)" */
  int n_in, n_out;
  stoke_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO];
  uint32_t ints, params; /* inputs holding indices; inputs that may be parameters */
} call;

static void call_free(call *c) {
  for (int i = 0; i < c->n_in; i++) free(c->in[i].data);
  for (int j = 0; j < c->n_out; j++) free(c->out[j].data);
}

static stoke_kernel_args_v1 args_of(const call *c, const stoke_tensor *in, const stoke_tensor *out) {
  return (stoke_kernel_args_v1){.node = &c->node, .n_in = c->n_in, .n_out = c->n_out, .in = in, .out = out,
                                .training = 1};
}

/* Run a kernel on the cpu backend under a SIGSEGV/SIGBUS guard: 1 when it
 * crashed (a read through a NULL it was handed). */
static sigjmp_buf crash_jmp;
static const void *volatile crash_addr; /* the faulting address of the last crash */
static void on_crash(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  crash_addr = si ? si->si_addr : NULL;
  siglongjmp(crash_jmp, sig);
}

static int guarded(const stoke_kernel_v1 *kern, const stoke_kernel_args_v1 *a, void *state, stoke_err **e) {
  struct sigaction sa = {0}, old_segv, old_bus;
  sa.sa_sigaction = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_NODEFER | SA_SIGINFO;
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  int crashed = 0;
  *e = NULL;
  if (sigsetjmp(crash_jmp, 1) == 0) *e = kern->run(a, state);
  else crashed = 1;
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGBUS, &old_bus, NULL);
  return crashed;
}

struct engine;
static stoke_err *overrun(const struct engine *en, const stoke_kernel_v1 *kern, const stoke_kernel_args_v1 *a);

/* plan (when it has one), workspace, run, destroy; `crashed` as guarded(). */
static stoke_err *run_kernel(const stoke_kernel_v1 *kern, stoke_kernel_args_v1 a, int *crashed) {
  void *state = NULL, *ws = NULL;
  size_t wsb = 0;
  *crashed = 0;
  if (kern->plan) STOKE_TRY(kern->plan(&a, &state, &wsb), "plan() of %s %s", kern->engine, kern->op);
  if (wsb && !(ws = calloc(1, wsb))) return STOKE_ERR(STOKE_E_OOM, "workspace of %zu bytes", wsb);
  a.workspace = ws;
  a.workspace_bytes = wsb;
  stoke_err *e;
  *crashed = guarded(kern, &a, state, &e);
  if (kern->destroy && state) kern->destroy(state);
  free(ws);
  if (!e && !*crashed) e = overrun(NULL, kern, &a); /* past the end of a buffer it was handed */
  return e;
}

/* The f64 forward, outputs poisoned and checked whole. */
static stoke_err *forward(const call *c, const stoke_kernel_v1 *kern, stoke_tensor *out) {
  for (int j = 0; j < c->n_out; j++) poison(&out[j]);
  int crashed;
  STOKE_PROPAGATE(run_kernel(kern, args_of(c, c->in, out), &crashed));
  /* every input and output had data: a fault in the first page is most likely the host table left unset */
  if (crashed && (uintptr_t)crash_addr < 4096)
    return STOKE_ERR(STOKE_E_INTERNAL,
                     "the forward kernel crashed (SIGSEGV at address %zu: through a NULL pointer, with every input "
                     "and output given data): does the plugin's register() keep the host table (`stoke_host = h;` "
                     "first in it, plugins/README.md)? Without it the first stoke_host->... call (STOKE_PERR, log, a "
                     "config read) crashes so", (size_t)(uintptr_t)crash_addr);
  if (crashed) return STOKE_ERR(STOKE_E_INTERNAL, "the forward kernel crashed (SIGSEGV)");
  for (int j = 0; j < c->n_out; j++) {
    int64_t at = first_nan(&out[j]);
    if (at >= 0)
      return STOKE_ERR(STOKE_E_INVALID,
                       "output %d element %lld is NaN after the forward: left unwritten (outputs are poisoned with "
                       "NaN first) or computed as NaN", j, (long long)at);
  }
  return NULL;
}

/* L = sum_j sum r_j * out_j, with r the fixed random weights in `w`. */
static double weighted(const call *c, const stoke_tensor *out, const stoke_tensor *w) {
  double l = 0;
  for (int j = 0; j < c->n_out; j++)
    for (int64_t i = 0, n = stoke_numel(&out[j].shape); i < n; i++)
      l += stoke_elem_get(out[j].data, out[j].dtype, i) * stoke_elem_get(w[j].data, w[j].dtype, i);
  return l;
}

/* Inputs that get a gradient from this call. */
static uint32_t grad_inputs(const call *c) {
  uint32_t m = 0;
  for (int i = 0; i < c->n_in; i++)
    if (!(c->op->no_grad_inputs >> i & 1u) && !(c->ints >> i & 1u)) m |= 1u << i;
  return m;
}

/* din = backward(dout = w): `live` says which inputs/outputs hold data
 * (bit i: input i, bit 16 + j: output j); `params`/`beta` as in a run. */
static stoke_err *backward(const call *c, const stoke_kernel_v1 *kern, const stoke_tensor *w, uint32_t live,
                           uint32_t params, float beta, stoke_tensor *din, int *crashed) {
  stoke_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO];
  for (int i = 0; i < c->n_in; i++) {
    in[i] = c->in[i];
    if (!(live >> i & 1u)) in[i].data = NULL;
  }
  for (int j = 0; j < c->n_out; j++) {
    out[j] = c->out[j];
    if (!(live >> (16 + j) & 1u)) out[j].data = NULL;
  }
  stoke_kernel_args_v1 a = args_of(c, in, out);
  a.din = din;
  a.dout = w;
  a.param_grads = params;
  a.param_grad_beta = beta;
  return run_kernel(kern, a, crashed);
}

/* What the backward may read: the op's bwd_needs as a live mask. */
static uint32_t needs_mask(const stoke_op_type_v1 *op) {
  return op->bwd_needs & STOKE_BWD_NEEDS_NOTHING ? 0 : op->bwd_needs;
}

static const char *needs_name(int bit, char *buf, size_t cap) {
  if (bit < 16) snprintf(buf, cap, "input %d (STOKE_BWD_NEEDS_INPUT(%d))", bit, bit);
  else snprintf(buf, cap, "output %d (STOKE_BWD_NEEDS_OUTPUT(%d))", bit - 16, bit - 16);
  return buf;
}

/* ---------------------------------------------------------- op checks */

/* The backward with only bwd_needs live must not read anything else: run
 * it with each undeclared value withheld alone and name the ones it reads. */
static void check_bwd_needs(kit *k, const call *c, const stoke_kernel_v1 *bwd, const stoke_tensor *w,
                            stoke_tensor *din) {
  char what[256];
  snprintf(what, sizeof what, "%s: backward reads only what bwd_needs names", c->label);
  uint32_t all = 0, needs = needs_mask(c->op);
  for (int i = 0; i < c->n_in; i++) all |= 1u << i;
  for (int j = 0; j < c->n_out; j++) all |= 1u << (16 + j);
  char bad[512] = "";
  size_t used = 0;
  for (int b = 0; b < 32; b++) {
    if (!(all >> b & 1u) || (needs >> b & 1u)) continue;
    int crashed;
    stoke_err *e = backward(c, bwd, w, all & ~(1u << b), 0, 0, din, &crashed);
    stoke_err_free(e);
    char nm[64];
    if (crashed && used < sizeof bad)
      used += (size_t)snprintf(bad + used, sizeof bad - used, "%s%s", used ? ", " : "", needs_name(b, nm, sizeof nm));
  }
  if (used)
    result(k, 0, what,
           "it crashed when %s had no data: add %s to the op's bwd_needs (the executor hands values it does not "
           "name as data == NULL, and frees them before the backward)",
           bad, bad);
  else result(k, 1, what, NULL);
}

/* The first element of `got` not within f64 rounding of `ref` (NaN where
 * ref is not counts), or -1. */
static int64_t first_off(const stoke_tensor *got, const stoke_tensor *ref, double *g, double *r) {
  for (int64_t x = 0, n = stoke_numel(&got->shape); x < n; x++) {
    *g = stoke_elem_get(got->data, got->dtype, x), *r = stoke_elem_get(ref->data, ref->dtype, x);
    if (!(fabs(*g - *r) <= 1e-9 * fmax(1, fabs(*r))) && !(isnan(*g) && isnan(*r))) return x;
  }
  return -1;
}

/* A backward kernel whose caps has STOKE_KCAP_WITH_FORWARD, run as the
 * compiler runs it when it drops the forward node (the loss): every input
 * and output holding data, with_forward set, the outputs poisoned. Its
 * outputs must be the forward kernel's (c->out) and its gradients the plain
 * backward's (din_ref), to f64 rounding. */
static void check_with_forward(kit *k, const call *c, const stoke_kernel_v1 *bwd, const stoke_tensor *w,
                               const stoke_tensor *din_ref) {
  char what[256], bad[256] = "";
  snprintf(what, sizeof what, "%s: backward with with_forward also writes the forward's outputs (STOKE_KCAP_WITH_FORWARD)",
           c->label);
  stoke_tensor out[STOKE_MAX_IO], din[STOKE_MAX_IO];
  memset(din, 0, sizeof din);
  uint32_t want = grad_inputs(c);
  for (int j = 0; j < c->n_out; j++) {
    out[j] = host_tensor(&c->out[j].shape, c->out[j].dtype);
    poison(&out[j]);
  }
  for (int i = 0; i < c->n_in; i++)
    if (want >> i & 1u) {
      din[i] = host_tensor(&c->in[i].shape, c->in[i].dtype);
      poison(&din[i]);
    }
  stoke_kernel_args_v1 a = args_of(c, c->in, out);
  a.din = din;
  a.dout = w;
  a.with_forward = 1;
  int crashed;
  stoke_err *e = run_kernel(bwd, a, &crashed);
  double got, ref;
  int64_t x;
  for (int j = 0; j < c->n_out && !e && !crashed && !bad[0]; j++)
    if ((x = first_off(&out[j], &c->out[j], &got, &ref)) >= 0) {
      if (isnan(got))
        snprintf(bad, sizeof bad, "output %d element %lld is NaN: left unwritten (outputs are poisoned with NaN first)", j,
                 (long long)x);
      else snprintf(bad, sizeof bad, "output %d element %lld is %.9g, the forward kernel's %.9g", j, (long long)x, got, ref);
    }
  for (int i = 0; i < c->n_in && !e && !crashed && !bad[0]; i++)
    if ((want >> i & 1u) && (x = first_off(&din[i], &din_ref[i], &got, &ref)) >= 0)
      snprintf(bad, sizeof bad, "gradient of input %d element %lld is %.9g, the plain backward's %.9g", i, (long long)x,
               got, ref);
  if (e) fail_err(k, what, e);
  else if (crashed) result(k, 0, what, "the backward crashed when called with with_forward (every input and output holds data)");
  else if (bad[0])
    result(k, 0, what,
           "%s; with with_forward set the kernel must compute every forward output as its forward kernel does, or "
           "leave STOKE_KCAP_WITH_FORWARD out of its caps",
           bad);
  else result(k, 1, what, NULL);
  for (int j = 0; j < c->n_out; j++) free(out[j].data);
  for (int i = 0; i < c->n_in; i++) free(din[i].data);
}

/* The analytic gradient against central differences, in double. */
static void check_gradient(kit *k, call *c, const stoke_kernel_v1 *fwd, const stoke_kernel_v1 *bwd) {
  char what[256];
  snprintf(what, sizeof what, "%s: gradient against finite differences (f64)", c->label);
  stoke_tensor w[STOKE_MAX_IO], din[STOKE_MAX_IO], tmp[STOKE_MAX_IO];
  stoke_rng r = stoke_rng_seed(stoke_hash3(k->seed, 0x9ad, 0));
  memset(din, 0, sizeof din);
  for (int j = 0; j < c->n_out; j++) {
    w[j] = host_tensor(&c->out[j].shape, c->out[j].dtype);
    tmp[j] = host_tensor(&c->out[j].shape, c->out[j].dtype);
    for (int64_t i = 0, n = stoke_numel(&w[j].shape); i < n; i++) stoke_elem_set(w[j].data, w[j].dtype, i, stoke_rng_normal(&r));
  }
  uint32_t want = grad_inputs(c), live = needs_mask(c->op);
  for (int i = 0; i < c->n_in; i++)
    if (want >> i & 1u) {
      din[i] = host_tensor(&c->in[i].shape, c->in[i].dtype);
      poison(&din[i]);
    }
  int crashed;
  stoke_err *e = backward(c, bwd, w, live, 0, 0, din, &crashed);
  if (crashed) {
    /* name what it reads, then stop: its gradients mean nothing */
    uint32_t all = 0;
    for (int i = 0; i < c->n_in; i++) all |= 1u << i;
    for (int j = 0; j < c->n_out; j++) all |= 1u << (16 + j);
    stoke_err_free(e);
    e = NULL;
    stoke_err_free(backward(c, bwd, w, all, 0, 0, din, &crashed));
    if (!crashed) check_bwd_needs(k, c, bwd, w, din);
    else result(k, 0, what, "the backward kernel crashed with every input and output present");
    goto done;
  }
  if (e) {
    fail_err(k, what, e);
    goto done;
  }
  check_bwd_needs(k, c, bwd, w, din);
  double worst = 0;
  char where[160] = "";
  for (int i = 0; i < c->n_in && !e; i++) {
    if (!(want >> i & 1u)) continue;
    int64_t nan = first_nan(&din[i]);
    if (nan >= 0) {
      result(k, 0, what,
             "gradient of input %d, element %lld, is NaN: unwritten (poisoned first) or computed as NaN (with "
             "param_grad_beta 0 a gradient is overwritten: 0 x the old value is NaN when that was NaN)", i,
             (long long)nan);
      goto done;
    }
    for (int64_t x = 0, n = stoke_numel(&c->in[i].shape); x < n && !e; x++) {
      double v = stoke_elem_get(c->in[i].data, c->in[i].dtype, x), lp = 0, lm = 0;
      stoke_elem_set(c->in[i].data, c->in[i].dtype, x, v + FD_H);
      if (!(e = forward(c, fwd, tmp))) lp = weighted(c, tmp, w);
      stoke_elem_set(c->in[i].data, c->in[i].dtype, x, v - FD_H);
      if (!e && !(e = forward(c, fwd, tmp))) lm = weighted(c, tmp, w);
      stoke_elem_set(c->in[i].data, c->in[i].dtype, x, v);
      if (e) break;
      double num = (lp - lm) / (2 * FD_H), ana = stoke_elem_get(din[i].data, din[i].dtype, x);
      double rel = fabs(ana - num) / fmax(fmax(fabs(ana), fabs(num)), FD_FLOOR);
      if (rel > worst) {
        worst = rel;
        snprintf(where, sizeof where, "input %d element %lld: backward %.9g, finite differences %.9g", i,
                 (long long)x, ana, num);
      }
    }
  }
  if (e) fail_err(k, what, e);
  else if (worst > FD_TOL) result(k, 0, what, "relative error %.3g > %g at %s", worst, FD_TOL, where);
  else result(k, 1, what, "largest relative error %.2g", worst);
  /* a parameter's gradient accumulates: din = beta din + computed */
  uint32_t params = c->params & want;
  if (!e && params) {
    snprintf(what, sizeof what, "%s: parameter gradients honour param_grad_beta", c->label);
    stoke_tensor acc[STOKE_MAX_IO];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < c->n_in; i++)
      if (want >> i & 1u) {
        acc[i] = host_tensor(&c->in[i].shape, c->in[i].dtype);
        for (int64_t x = 0, n = stoke_numel(&acc[i].shape); x < n; x++) stoke_elem_set(acc[i].data, acc[i].dtype, x, 1.0);
      }
    e = backward(c, bwd, w, live, params, 1.0f, acc, &crashed);
    double bad = 0;
    int bad_in = -1;
    for (int i = 0; i < c->n_in && !e; i++)
      for (int64_t x = 0, n = (params >> i & 1u) ? stoke_numel(&acc[i].shape) : 0; x < n; x++) {
        double d = fabs(stoke_elem_get(acc[i].data, acc[i].dtype, x) - 1.0 - stoke_elem_get(din[i].data, din[i].dtype, x));
        if (d > bad) bad = d, bad_in = i;
      }
    if (e) fail_err(k, what, e);
    else if (crashed) result(k, 0, what, "the backward crashed");
    else if (bad > 1e-9)
      result(k, 0, what, "input %d: with beta 1 and the gradient preset to 1 it should hold 1 + the gradient (off by %.3g)",
             bad_in, bad);
    else result(k, 1, what, NULL);
    for (int i = 0; i < c->n_in; i++) free(acc[i].data);
  }
  if (!e && (bwd->caps & STOKE_KCAP_WITH_FORWARD)) check_with_forward(k, c, bwd, w, din);
done:
  for (int j = 0; j < c->n_out; j++) free(w[j].data), free(tmp[j].data);
  for (int i = 0; i < c->n_in; i++) free(din[i].data);
}

/* ----------------------------------------------------- other engines */

/* The relative-norm error a kernel of dtype dt may have against the cpu's
 * f64 results on the same inputs (rounded to dt first), derived as
 * tests/op/every_kernel_test derives it: 8 u(dt) for the rounding of the
 * outputs and of what the kernel stores in its dtype, plus 8 u(acc)
 * sqrt(K) for a K-term sum in the accumulator (f32 for every dtype but
 * f64), u the unit roundoff. The kit does not know an op's sums, so K is
 * the element count of the call's largest tensor: no sum is longer. */
static double tolerance(stoke_dtype dt, double k) {
  return 8 * stoke_dtype_unit_roundoff(dt) + 8 * stoke_sum_roundoff(dt, k);
}

/* v rounded to dtype dt (as a kernel of dt is handed it), as a double. */
static double round_to(stoke_dtype dt, double v) {
  unsigned char b[8];
  stoke_elem_set(b, dt, 0, v);
  return stoke_elem_get(b, dt, 0);
}

/* The errors are relative to the reference's norm, but not to less than
 * an RMS of ERR_FLOOR per element: a sum of random-sign terms can cancel
 * to near 0, and its rounding is relative to the terms, not to the rest. */
#define ERR_FLOOR 1e-2

static double longest_sum(const call *c) {
  int64_t k = 1;
  for (int i = 0; i < c->n_in; i++)
    if (stoke_numel(&c->in[i].shape) > k) k = stoke_numel(&c->in[i].shape);
  for (int j = 0; j < c->n_out; j++)
    if (stoke_numel(&c->out[j].shape) > k) k = stoke_numel(&c->out[j].shape);
  return (double)k;
}

typedef struct engine {
  const stoke_backend_v1 *b, *dev; /* the engine, and the one owning its device */
  void *self, *dev_self;
  int gpu;
} engine;

/* Open the engine named `name` (and its device's engine), or say why not. */
static stoke_err *open_engine(kit *k, const char *name, engine *out) {
  memset(out, 0, sizeof *out);
  out->b = stoke_find_backend(k->reg, name);
  if (!out->b) {
    stoke_err_free(stoke_registry_load(k->reg, name));
    out->b = stoke_find_backend(k->reg, name);
  }
  if (!out->b) return STOKE_ERR(STOKE_E_NOT_FOUND, "no backend '%s' registered or found as a plugin", name);
  out->dev = out->b;
  if (out->b->device_engine) {
    engine d;
    STOKE_PROPAGATE(open_engine(k, out->b->device_engine, &d));
    out->dev = d.b;
    out->dev_self = d.self;
  }
  if (out->b->open) STOKE_PROPAGATE(out->b->open(0, out->dev_self, &out->self));
  if (!out->b->device_engine) out->dev_self = out->self;
  out->gpu = out->dev->device == STOKE_DEV_GPU;
  return NULL;
}

static void close_engine(engine *en) {
  if (en->b->close) en->b->close(en->self);
  if (en->dev != en->b && en->dev->close) en->dev->close(en->dev_self);
}

/* A tensor of dtype dt on the engine's device: `from`'s values (f64 on the
 * host) rounded to dt, or every byte 0xff (NaN) when `from` is NULL. */
static stoke_err *to_device(const engine *en, const stoke_shape *s, stoke_dtype dt, const stoke_tensor *from,
                            stoke_tensor *d) {
  *d = host_tensor(s, dt);
  void *host = d->data;
  d->data = NULL;
  d->device = en->gpu ? STOKE_DEV_GPU : STOKE_DEV_CPU;
  size_t bytes = stoke_tensor_bytes(d), body = bytes ? bytes : 1;
  /* a guard after it, as the host tensors have (dev_guard_hits) */
  stoke_err *e = en->dev->alloc(en->dev_self, 2 * body + 64, &d->data);
  if (!e) e = en->dev->fill(en->dev_self, (char *)d->data + body, GUARD_FILL, body + 64, NULL);
  if (!e && from) {
    for (int64_t x = 0, n = stoke_numel(s); x < n; x++) stoke_elem_set(host, dt, x, stoke_elem_get(from->data, from->dtype, x));
    e = en->dev->copy(en->dev_self, d->data, host, bytes, STOKE_COPY_H2D, NULL);
  } else if (!e) {
    e = en->dev->fill(en->dev_self, d->data, 0xff, bytes, NULL);
  }
  free(host);
  return e;
}

static void free_device(const engine *en, stoke_tensor *t, int n) {
  for (int i = 0; i < n; i++)
    if (t[i].data) en->dev->free(en->dev_self, t[i].data), t[i].data = NULL;
}

/* The relative-norm error of device tensor `d` against the f64 `want`;
 * an error when an element is NaN (poisoned and never written). */
static stoke_err *device_error(const engine *en, const stoke_tensor *d, const stoke_tensor *want, double *err) {
  stoke_tensor h = host_tensor(&d->shape, d->dtype);
  stoke_err *e = en->dev->copy(en->dev_self, h.data, d->data, stoke_tensor_bytes(&h), STOKE_COPY_D2H, NULL);
  int64_t nan = e ? -1 : first_nan(&h), n = stoke_numel(&h.shape);
  if (nan >= 0) e = STOKE_ERR(STOKE_E_INVALID, "element %lld of %lld is NaN: unwritten (poisoned first) or computed as NaN",
                              (long long)nan, (long long)n);
  double num = 0, den = 0;
  for (int64_t x = 0; x < n && !e; x++) {
    double g = stoke_elem_get(h.data, h.dtype, x), r = stoke_elem_get(want->data, want->dtype, x);
    num += (g - r) * (g - r);
    den += r * r;
  }
  *err = sqrt(num / fmax(den, (double)n * ERR_FLOOR * ERR_FLOOR));
  free(h.data);
  return e;
}

/* Bytes of device tensor t's guard (to_device) a kernel overwrote (0:
 * none; the guard is filled again). */
static size_t dev_guard_hits(const engine *en, const stoke_tensor *t, stoke_err **e) {
  if (!t->data || *e) return 0;
  size_t bytes = stoke_tensor_bytes(t), body = bytes ? bytes : 1, n = body + 64, last = 0;
  unsigned char *g = malloc(n);
  if (!g) return 0;
  *e = en->dev->copy(en->dev_self, g, (const char *)t->data + body, n, STOKE_COPY_D2H, NULL);
  if (!*e) last = guard_reach(g, n);
  if (last) *e = en->dev->fill(en->dev_self, (char *)t->data + body, GUARD_FILL, n, NULL);
  free(g);
  return last;
}

/* An error naming the buffer a kernel wrote past the end of (host or device tensors), or NULL. */
static stoke_err *overrun(const engine *en, const stoke_kernel_v1 *kern, const stoke_kernel_args_v1 *a) {
  const struct {
    const stoke_tensor *t;
    int n;
    const char *what;
  } sets[] = {{a->out, a->n_out, "output"}, {a->din, a->din ? a->n_in : 0, "gradient of input"}, {a->in, a->n_in, "input"}};
  stoke_err *e = NULL;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < sets[k].n && !e; i++) {
      const stoke_tensor *t = &sets[k].t[i];
      size_t over = en ? dev_guard_hits(en, t, &e) : guard_hits(t);
      if (over && !e)
        e = STOKE_ERR(STOKE_E_INVALID,
                      "%s %s kernel (%s, %s) wrote up to %zu bytes past the end of %s %d (%s %s: %zu bytes): it "
                      "writes another dtype or shape than its kernel table declares, or indexes past the end",
                      kern->engine, kern->pass == STOKE_BWD ? "backward" : "forward", kern->op,
                      stoke_dtype_name(kern->dtype), over, sets[k].what, i, stoke_dtype_name(t->dtype),
                      stoke_shape_str(&t->shape).s, stoke_tensor_bytes(t));
    }
  return e;
}

/* plan, workspace, run and wait, on the engine's default stream. */
static stoke_err *run_on(const engine *en, const stoke_kernel_v1 *kern, stoke_kernel_args_v1 a) {
  a.engine = en->self;
  a.stream = en->dev->default_stream ? en->dev->default_stream(en->dev_self) : NULL;
  void *state = NULL, *ws = NULL;
  size_t wsb = 0;
  stoke_err *e = kern->plan ? kern->plan(&a, &state, &wsb) : NULL;
  if (!e && wsb) e = en->dev->alloc(en->dev_self, wsb, &ws);
  a.workspace = ws;
  a.workspace_bytes = wsb;
  if (!e) e = kern->run(&a, state);
  if (!e && en->dev->stream_sync) e = en->dev->stream_sync(en->dev_self, NULL);
  if (kern->destroy && state) kern->destroy(state);
  if (ws) en->dev->free(en->dev_self, ws);
  if (!e) e = overrun(en, kern, &a);
  return e;
}

/* One output or gradient compared; the worst so far kept in worst and at. */
static void compare(const engine *en, const stoke_tensor *d, const stoke_tensor *want, const char *name, int idx,
                    stoke_err **e, double *worst, char *at, size_t cap) {
  double err = 0;
  if (*e) return;
  *e = device_error(en, d, want, &err);
  if (*e) *e = stoke_err_note(*e, "%s %d", name, idx);
  else if (err > *worst) *worst = err, snprintf(at, cap, "%s %d", name, idx);
}

static void report_engine(kit *k, const char *what, stoke_err *e, double worst, const char *at, double tol) {
  if (e) fail_err(k, what, e);
  else if (worst > tol) result(k, 0, what, "%s: relative error %.3g > tolerance %.3g", at, worst, tol);
  else result(k, 1, what, "relative error %.2g (tolerance %.2g)", worst, tol);
}

/* Kernel `kern` (engine E, dtype dt, forward or backward) against the
 * cpu's f64 kernel of the same pass on the same random inputs (rounded to
 * dt for both), its outputs poisoned on E's device first. A backward gets
 * what a run hands it: the inputs and outputs its op's bwd_needs names
 * (the others data == NULL), a random output gradient, every input
 * gradient poisoned (param_grad_beta 0); then, for inputs a case marks as
 * parameters, gradients preset to random values and accumulated (beta 1). */
/* The backend name (registered, or a plugin file on the search path)
 * one edit (case aside) from `name`, or NULL: the engine a kernel meant.
 * Not two: "cuda" is two from "cudnn", and a cuda kernel on a machine
 * without the cuda plugin is skipped, not wrong. */
typedef struct near_ctx {
  const char *name, *best;
  int dist;
} near_ctx;
static void near_backend(void *ctx, const void *part, const char *origin) {
  near_ctx *n = ctx;
  const char *b = ((const stoke_backend_v1 *)part)->name;
  int d = strcmp(n->name, b) ? stoke_edit_distance(n->name, b) : -1; /* -1: the name itself exists */
  if (d < n->dist) n->dist = d, n->best = b;
}
static const char *near_engine(kit *k, const char *name) {
  near_ctx n = {name, NULL, 2};
  stoke_registry_each(k->reg, "backend", near_backend, &n);
  static char avail[2048], found[64];
  stoke_registry_available(k->reg, avail, sizeof avail);
  for (char *p = strtok(avail, ", "); p; p = strtok(NULL, ", ")) {
    int d = strcmp(name, p) ? stoke_edit_distance(name, p) : -1; /* a plugin of that name that cannot open here */
    if (d < n.dist) n.dist = d, n.best = strcpy(found, strlen(p) < sizeof found ? p : "");
  }
  return n.dist >= 0 && n.best && n.best[0] ? n.best : NULL;
}

static void check_engine_kernel(kit *k, const call *c, const stoke_kernel_v1 *kern) {
  int bwd = kern->pass == STOKE_BWD;
  char what[320];
  snprintf(what, sizeof what, "%s: %s %s %s kernel against the cpu f64 one", c->label, kern->engine,
           stoke_dtype_name(kern->dtype), bwd ? "backward" : "forward");
  const stoke_kernel_v1 *ref_fwd = stoke_find_kernel(k->reg, "cpu", c->op->name, STOKE_FWD, STOKE_F64, c->in[0].layout);
  const stoke_kernel_v1 *ref_bwd = stoke_find_kernel(k->reg, "cpu", c->op->name, STOKE_BWD, STOKE_F64, c->in[0].layout);
  if (bwd && !ref_bwd) {
    result(k, 0, what, "no cpu STOKE_BWD kernel in STOKE_F64 to compare it with");
    return;
  }
  engine en;
  stoke_err *e = open_engine(k, kern->engine, &en);
  const char *near = e && e->code == STOKE_E_NOT_FOUND ? near_engine(k, kern->engine) : NULL;
  if (near) { /* a misspelt engine ("CPU"): a kernel no run would ever pick */
    result(k, 0, what,
           "no backend is named '%s' (did you mean '%s'?): a kernel's engine is the backend's name as registered, "
           "and under another spelling no run ever uses it",
           kern->engine, near);
    stoke_err_free(e);
    return;
  }
  if (e) {
    printf("skip %s: cannot open engine '%s' here: %s\n", what, kern->engine, e->msg);
    stoke_err_free(e);
    return;
  }
  stoke_dtype dt = kern->dtype;
  /* the reference: the cpu f64 kernels on the inputs rounded to dt */
  call r = *c;
  stoke_tensor w[STOKE_MAX_IO], rdin[STOKE_MAX_IO], preset[STOKE_MAX_IO];
  stoke_tensor din[STOKE_MAX_IO], dout[STOKE_MAX_IO], dw[STOKE_MAX_IO], ddin[STOKE_MAX_IO];
  memset(w, 0, sizeof w), memset(rdin, 0, sizeof rdin), memset(preset, 0, sizeof preset);
  memset(din, 0, sizeof din), memset(dout, 0, sizeof dout), memset(dw, 0, sizeof dw), memset(ddin, 0, sizeof ddin);
  stoke_rng rng = stoke_rng_seed(stoke_hash3(k->seed, 0xe61, (uint64_t)bwd));
  for (int i = 0; i < c->n_in; i++) {
    r.in[i] = host_tensor(&c->in[i].shape, c->in[i].dtype);
    stoke_dtype as = c->ints >> i & 1u ? STOKE_I32 : dt;
    for (int64_t x = 0, n = stoke_numel(&c->in[i].shape); x < n; x++)
      stoke_elem_set(r.in[i].data, r.in[i].dtype, x, round_to(as, stoke_elem_get(c->in[i].data, c->in[i].dtype, x)));
  }
  for (int j = 0; j < c->n_out; j++) r.out[j] = host_tensor(&c->out[j].shape, c->out[j].dtype);
  e = forward(&r, ref_fwd, r.out);
  uint32_t want = grad_inputs(c), live = needs_mask(c->op), params = bwd ? c->params & want : 0;
  if (!e && bwd) {
    for (int j = 0; j < c->n_out; j++) {
      w[j] = host_tensor(&c->out[j].shape, c->out[j].dtype);
      for (int64_t x = 0, n = stoke_numel(&w[j].shape); x < n; x++)
        stoke_elem_set(w[j].data, w[j].dtype, x, round_to(dt, stoke_rng_normal(&rng)));
    }
    for (int i = 0; i < c->n_in; i++)
      if (want >> i & 1u) rdin[i] = host_tensor(&c->in[i].shape, c->in[i].dtype);
    int crashed;
    e = backward(&r, ref_bwd, w, live, 0, 0, rdin, &crashed);
    if (!e && crashed) e = STOKE_ERR(STOKE_E_INTERNAL, "the cpu backward crashed (see its own check above)");
  }
  if (e) {
    fail_err(k, what, stoke_err_note(e, "computing the cpu f64 reference"));
    goto done;
  }
  /* the device side: inputs (a backward: only those bwd_needs names) */
  for (int i = 0; i < c->n_in && !e; i++)
    if (!bwd || live >> i & 1u) e = to_device(&en, &c->in[i].shape, c->ints >> i & 1u ? STOKE_I32 : dt, &r.in[i], &din[i]);
  for (int j = 0; j < c->n_out && !e; j++) {
    stoke_dtype odt = c->out[j].dtype == STOKE_F64 ? dt : c->out[j].dtype;
    if (!bwd) e = to_device(&en, &c->out[j].shape, odt, NULL, &dout[j]);
    else {
      if (live >> (16 + j) & 1u) e = to_device(&en, &c->out[j].shape, odt, &r.out[j], &dout[j]);
      if (!e) e = to_device(&en, &c->out[j].shape, odt, &w[j], &dw[j]);
    }
  }
  for (int i = 0; i < c->n_in && !e && bwd; i++)
    if (want >> i & 1u) e = to_device(&en, &c->in[i].shape, dt, NULL, &ddin[i]);
  for (int i = 0; i < c->n_in; i++) { /* a run's shapes on a NULL pointer: the descriptor is there */
    din[i].shape = c->in[i].shape, ddin[i].shape = c->in[i].shape;
    if (!din[i].data) din[i].dtype = c->ints >> i & 1u ? STOKE_I32 : dt, din[i].layout = c->in[i].layout;
    if (!ddin[i].data) ddin[i].dtype = dt;
  }
  for (int j = 0; j < c->n_out; j++)
    if (!dout[j].data) dout[j].shape = c->out[j].shape, dout[j].dtype = c->out[j].dtype == STOKE_F64 ? dt : c->out[j].dtype;
  stoke_kernel_args_v1 a = args_of(c, din, dout);
  if (bwd) a.din = ddin, a.dout = dw, a.param_grads = params, a.param_grad_beta = 0;
  if (!e) e = run_on(&en, kern, a);
  if (e && bwd)
    e = stoke_err_note(e, "a run hands a backward only the inputs and outputs its op's bwd_needs names (the others "
                          "with data == NULL): reading another one faults on the device");
  double tol = tolerance(dt, longest_sum(c)), worst = 0;
  char at[64] = "";
  for (int j = 0; j < c->n_out && !bwd; j++)
    compare(&en, &dout[j], &r.out[j], "output", j, &e, &worst, at, sizeof at);
  for (int i = 0; i < c->n_in && bwd; i++)
    if (want >> i & 1u) compare(&en, &ddin[i], &rdin[i], "gradient of input", i, &e, &worst, at, sizeof at);
  report_engine(k, what, e, worst, at, tol);
  if (e || !params) goto done;
  /* parameter gradients accumulate: din = 1 x (random preset) + computed */
  snprintf(what, sizeof what, "%s: %s %s backward kernel, parameter gradients accumulated (param_grad_beta 1)",
           c->label, kern->engine, stoke_dtype_name(dt));
  for (int i = 0; i < c->n_in && !e; i++) {
    if (!(want >> i & 1u)) continue;
    free_device(&en, &ddin[i], 1);
    preset[i] = host_tensor(&c->in[i].shape, c->in[i].dtype);
    stoke_tensor sum = host_tensor(&c->in[i].shape, c->in[i].dtype);
    for (int64_t x = 0, n = stoke_numel(&c->in[i].shape); x < n; x++) {
      double v = round_to(dt, stoke_rng_normal(&rng));
      stoke_elem_set(preset[i].data, preset[i].dtype, x, v);
      stoke_elem_set(sum.data, sum.dtype, x, (params >> i & 1u ? v : 0) + stoke_elem_get(rdin[i].data, rdin[i].dtype, x));
    }
    e = to_device(&en, &c->in[i].shape, dt, params >> i & 1u ? &preset[i] : NULL, &ddin[i]);
    memcpy(rdin[i].data, sum.data, stoke_tensor_bytes(&sum));
    free(sum.data);
  }
  a.param_grad_beta = 1;
  if (!e) e = run_on(&en, kern, a);
  worst = 0;
  for (int i = 0; i < c->n_in; i++)
    if (want >> i & 1u) compare(&en, &ddin[i], &rdin[i], "gradient of input", i, &e, &worst, at, sizeof at);
  report_engine(k, what, e, worst, at, tol);
done:
  free_device(&en, din, c->n_in), free_device(&en, ddin, c->n_in);
  free_device(&en, dout, c->n_out), free_device(&en, dw, c->n_out);
  for (int i = 0; i < c->n_in; i++) free(r.in[i].data), free(rdin[i].data), free(preset[i].data);
  for (int j = 0; j < c->n_out; j++) free(r.out[j].data), free(w[j].data);
  close_engine(&en);
}

/* ------------------------------------------------------------- cases */

/* Build call c for `op` from test case t (NULL: shape `s` for every input). */
static stoke_err *make_call(kit *k, const stoke_op_type_v1 *op, const stoke_testcase_v1 *t, const stoke_shape *s,
                            call *c) {
  memset(c, 0, sizeof *c);
  c->op = op;
  c->n_in = op->n_inputs;
  if (t && t->n_inputs != op->n_inputs)
    return STOKE_ERR(STOKE_E_INVALID, "test case of op '%s' gives %d input shapes, the op takes %d", op->name,
                     t->n_inputs, op->n_inputs);
  if (t && t->n_inputs > STOKE_TESTKIT_MAX_INPUTS)
    return STOKE_ERR(STOKE_E_INVALID, "test case of op '%s' gives %d input shapes, a case holds at most %d (stoke/testkit.h)",
                     op->name, t->n_inputs, STOKE_TESTKIT_MAX_INPUTS);
  STOKE_PROPAGATE(stoke_node_init(k->reg, op->name, "check", t ? t->attrs : NULL, &c->node));
  c->ints = t ? t->int_inputs : 0;
  c->params = t ? t->param_inputs : 0;
  stoke_value_desc_v1 in[STOKE_MAX_IO], out[STOKE_MAX_IO];
  memset(out, 0, sizeof out);
  for (int i = 0; i < c->n_in; i++) in[i] = (stoke_value_desc_v1){t ? t->shapes[i] : *s, c->ints >> i & 1u ? STOKE_I32 : STOKE_F64};
  STOKE_TRY(op->infer(&c->node, in, out), "shape inference of op '%s'", op->name);
  c->n_out = op->n_outputs;
  if (!c->n_out)
    while (c->n_out < STOKE_MAX_IO && out[c->n_out].shape.ndim) c->n_out++;
  for (int j = 0; j < c->n_out; j++) { /* what train's graph builder checks (core/graph.c) */
    const stoke_shape *os = &out[j].shape;
    if (!stoke_desc_valid(&out[j]))
      return STOKE_ERR(STOKE_E_INVALID, "op '%s': its infer() gave output %d %d dimensions %s, dtype %d: not a shape "
                       "(1 to %d dimensions, each >= 1) or not a dtype; infer must set every output", op->name, j,
                       os->ndim, os->ndim >= 0 && os->ndim <= STOKE_MAX_DIMS ? stoke_shape_str(os).s : "[?]",
                       (int)out[j].dtype, STOKE_MAX_DIMS);
  }
  double lo = t && (t->lo || t->hi) ? t->lo : -2, hi = t && (t->lo || t->hi) ? t->hi : 2;
  stoke_rng r = stoke_rng_seed(stoke_hash3(k->seed, 0xca5e, 0));
  for (int i = 0; i < c->n_in; i++) {
    c->in[i] = host_tensor(&in[i].shape, in[i].dtype);
    for (int64_t x = 0, n = stoke_numel(&in[i].shape); x < n; x++)
      stoke_elem_set(c->in[i].data, in[i].dtype, x,
                     c->ints >> i & 1u ? (double)stoke_rng_below(&r, (uint64_t)(t->int_max > 0 ? t->int_max : 2))
                                       : lo + (hi - lo) * stoke_rng_uniform(&r));
  }
  for (int j = 0; j < c->n_out; j++) c->out[j] = host_tensor(&out[j].shape, out[j].dtype);
  char shapes[96] = "";
  size_t used = 0;
  for (int d = 0; d < in[0].shape.ndim && used < sizeof shapes; d++)
    used += (size_t)snprintf(shapes + used, sizeof shapes - used, "%s%lld", d ? "x" : "", (long long)in[0].shape.d[d]);
  snprintf(c->label, sizeof c->label, "op %s [%s]%s%s%s", op->name, shapes, t && t->attrs ? " (" : "",
           t && t->attrs ? t->attrs : "", t && t->attrs ? ")" : "");
  return NULL;
}

typedef struct kernel_list {
  const stoke_kernel_v1 *k[256];
  int n;
  const char *origin; /* keep those registered by this file only (NULL: all) */
} kernel_list;

static void collect_kernel(void *ctx, const void *part, const char *origin) {
  kernel_list *l = ctx;
  if (l->n < 256 && (!l->origin || !strcmp(origin, l->origin))) l->k[l->n++] = part;
}

/* Every check of one call: the f64 forward and backward on the cpu,
 * then each other engine's kernels of the op (plugin's own or not). */
static void check_call(kit *k, call *c, const kernel_list *all) {
  char what[256];
  stoke_layout lay = c->in[0].layout;
  const stoke_kernel_v1 *fwd = stoke_find_kernel(k->reg, "cpu", c->op->name, STOKE_FWD, STOKE_F64, lay);
  snprintf(what, sizeof what, "%s: cpu forward in f64, every output element written", c->label);
  if (!fwd) {
    result(k, 0, what, "no cpu kernel for STOKE_F64: the gradient check runs in double; register the f32 body for "
                       "STOKE_F64 too (plugins/swish does, from one macro)");
    return;
  }
  stoke_err *e = forward(c, fwd, c->out);
  if (e) {
    fail_err(k, what, e);
    return;
  }
  result(k, 1, what, NULL);
  if (c->op->has_backward == STOKE_HAS_BACKWARD) {
    const stoke_kernel_v1 *bwd = stoke_find_kernel(k->reg, "cpu", c->op->name, STOKE_BWD, STOKE_F64, lay);
    snprintf(what, sizeof what, "%s: cpu backward in f64", c->label);
    if (!bwd) result(k, 0, what, "has_backward is set but no cpu STOKE_BWD kernel for STOKE_F64 is registered");
    else check_gradient(k, c, fwd, bwd);
  } else {
    /* backward kernels of an op whose type says it has none: train refuses the plugin; say it here too */
    for (int i = 0; i < all->n; i++)
      if (!strcmp(all->k[i]->op, c->op->name) && all->k[i]->pass == STOKE_BWD) {
        snprintf(what, sizeof what, "%s: backward kernels only with has_backward", c->label);
        result(k, 0, what,
               "the op's has_backward is %d, yet a STOKE_BWD kernel is registered (%s %s): set has_backward = "
               "STOKE_HAS_BACKWARD to have it checked and used, or leave the backward kernels out",
               c->op->has_backward, all->k[i]->engine, stoke_dtype_name(all->k[i]->dtype));
        break;
      }
  }
  for (int i = 0; i < all->n; i++) {
    const stoke_kernel_v1 *kern = all->k[i];
    if (strcmp(kern->op, c->op->name) || kern->pass == STOKE_OPT) continue;
    if (!strcmp(kern->engine, "cpu") && kern->dtype == STOKE_F64) continue; /* the reference itself */
    if (kern->pass == STOKE_BWD && c->op->has_backward != STOKE_HAS_BACKWARD) continue;
    check_engine_kernel(k, c, kern);
  }
}

static void check_op(kit *k, const stoke_op_type_v1 *op, const kernel_list *all) {
  int given = 0;
  for (int i = 0; k->cases && i < k->cases->n_cases; i++) {
    const stoke_testcase_v1 *t = &k->cases->cases[i];
    if (strcmp(t->op, op->name)) continue;
    given++;
    call c;
    stoke_err *e = make_call(k, op, t, NULL, &c);
    if (e) fail_err(k, op->name, e);
    else check_call(k, &c, all);
    call_free(&c);
  }
  if (given) return;
  /* no case given: every input of one shape, a matrix, then an image batch */
  static const stoke_shape tries[] = {{2, {3, 5}}, {4, {2, 3, 4, 5}}};
  char why[512] = "";
  for (size_t s = 0; s < sizeof tries / sizeof *tries; s++) {
    call c;
    stoke_err *e = make_call(k, op, NULL, &tries[s], &c);
    if (!e) {
      check_call(k, &c, all);
      call_free(&c);
      return;
    }
    snprintf(why, sizeof why, "%s", e->msg);
    stoke_err_free(e);
    call_free(&c);
  }
  char what[160];
  snprintf(what, sizeof what, "op %s", op->name);
  result(k, 0, what,
         "no test case, and every input shaped [3, 5] or [2, 3, 4, 5] is refused (%s): give its input shapes in "
         "stoke_testkit_v1_entry (stoke/testkit.h)", why);
}

/* ----------------------------------------------------------- sources */

#define SRC_SAMPLES 64
#define SRC_THREADS 4

typedef struct src_run {
  const stoke_source_v1 *s;
  void *self;
  const int64_t *idx;
  int n;
  size_t bytes;
  uint64_t seed;
  unsigned char *x; /* n x bytes */
  int32_t *y;
  int fill_byte;
  stoke_err *e;
} src_run;

/* Read samples idx[0..n) into x, every byte preset to `fill`. */
static void *read_all(void *arg) {
  src_run *r = arg;
  memset(r->x, r->fill_byte, (size_t)r->n * r->bytes);
  for (int i = 0; i < r->n && !r->e; i++)
    r->e = r->s->read(r->self, r->idx[i], stoke_hash3(r->seed, 0, (uint64_t)r->idx[i]), r->x + (size_t)i * r->bytes,
                      &r->y[i]);
  return NULL;
}

static src_run src_alloc(const stoke_source_v1 *s, void *self, const int64_t *idx, int n, size_t bytes, int fill) {
  src_run r = {s, self, idx, n, bytes, 0x5eed, malloc((size_t)n * bytes), calloc((size_t)n, sizeof(int32_t)), fill,
               NULL};
  return r;
}

static void src_free(src_run *r) {
  free(r->x);
  free(r->y);
  stoke_err_free(r->e);
}

/* Opens the source with its keys' defaults, or --ini's [data] section. */
static stoke_err *open_source(kit *k, const stoke_source_v1 *s, stoke_cfg **cfg, void **self) {
  *cfg = stoke_cfg_new();
  if (!*cfg) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  STOKE_PROPAGATE(stoke_cfg_declare(*cfg, "data", "the source's keys", s->keys, s->n_keys));
  if (k->ini) STOKE_PROPAGATE(stoke_cfg_load_file(*cfg, k->ini));
  return s->open(*cfg, "data", self);
}

static void check_source(kit *k, const stoke_source_v1 *s) {
  char what[160];
  snprintf(what, sizeof what, "source %s: opens%s", s->name, k->ini ? " with --ini's [data]" : " with its defaults");
  stoke_cfg *cfg = NULL;
  void *self = NULL;
  stoke_err *e = open_source(k, s, &cfg, &self);
  if (e) {
    fail_err(k, what, stoke_err_note(e, "give the keys it needs with --ini FILE ([data] section)"));
    stoke_cfg_free(cfg);
    return;
  }
  result(k, 1, what, NULL);
  stoke_sample_info_v1 info;
  int64_t len = s->length(self);
  snprintf(what, sizeof what, "source %s: length and sample info", s->name);
  e = s->info(self, &info);
  int64_t numel = e ? 0 : stoke_numel(&info.shape);
  if (!e && len < 1) e = STOKE_ERR(STOKE_E_INVALID, "length() is %lld", (long long)len);
  if (!e && (info.shape.ndim < 1 || info.shape.ndim > 3 || numel < 1))
    e = STOKE_ERR(STOKE_E_INVALID, "a sample's shape has %d dimensions and %lld elements (1 to 3 dimensions)",
                  info.shape.ndim, (long long)numel);
  if (!e && info.dtype != STOKE_F32 && info.dtype != STOKE_U8 && info.dtype != STOKE_I32)
    e = STOKE_ERR(STOKE_E_INVALID, "samples are %s; the core reads f32, u8 images or i32 token windows",
                  stoke_dtype_name(info.dtype));
  if (!e && info.dtype != STOKE_I32 && info.classes < 2)
    e = STOKE_ERR(STOKE_E_INVALID, "classes = %lld: a classifier needs 2 or more", (long long)info.classes);
  if (!e && info.dtype == STOKE_U8 && (info.shape.ndim != 3 || info.layout == STOKE_NCHW))
    e = STOKE_ERR(STOKE_E_INVALID, "u8 samples must be images (C, H, W) written HWC (STOKE_NHWC); this says %s%s",
                  info.shape.ndim != 3 ? "another shape" : "STOKE_NCHW", "");
  if (e) {
    fail_err(k, what, e);
    goto done;
  }
  result(k, 1, what, "%lld samples of %lld %s values, %lld classes%s", (long long)len, (long long)numel,
         stoke_dtype_name(info.dtype), (long long)info.classes,
         info.shape.ndim == 3 ? (info.dtype == STOKE_U8 || info.layout == STOKE_NHWC
                                     ? "; images read as HWC (STOKE_NHWC)"
                                     : "; images read as CHW (say STOKE_NHWC if read() writes HWC)")
                              : "");
  /* the first samples and some from the rest */
  int64_t idx[SRC_SAMPLES];
  int n = len < SRC_SAMPLES ? (int)len : SRC_SAMPLES;
  stoke_rng rng = stoke_rng_seed(stoke_hash3(k->seed, 0x50c, 0));
  for (int i = 0; i < n; i++) idx[i] = i < n / 2 ? i : (int64_t)stoke_rng_below(&rng, (uint64_t)len);
  size_t bytes = (size_t)numel * stoke_dtype_size(info.dtype);
  src_run a = src_alloc(s, self, idx, n, bytes, 0x00), b = src_alloc(s, self, idx, n, bytes, 0xff);
  read_all(&a);
  read_all(&b);
  snprintf(what, sizeof what, "source %s: read() of %d samples", s->name, n);
  if (a.e || b.e) {
    result(k, 0, what, "%s", (a.e ? a.e : b.e)->msg);
    goto free_runs;
  }
  result(k, 1, what, NULL);
  snprintf(what, sizeof what, "source %s: labels in [0, classes)", s->name);
  int bad = -1;
  for (int i = 0; i < n && bad < 0 && info.dtype != STOKE_I32; i++)
    if (a.y[i] < 0 || a.y[i] >= info.classes) bad = i;
  if (bad >= 0)
    result(k, 0, what, "sample %lld has label %d, outside [0, %lld): labels count from 0", (long long)idx[bad], a.y[bad],
           (long long)info.classes);
  else result(k, 1, what, NULL);
  snprintf(what, sizeof what, "source %s: the same (index, seed) gives the same sample, every byte written", s->name);
  int diff = -1;
  for (int i = 0; i < n && diff < 0; i++)
    if (memcmp(a.x + i * bytes, b.x + i * bytes, bytes) || a.y[i] != b.y[i]) diff = i;
  if (diff >= 0) {
    size_t at = 0;
    while (at < bytes && a.x[diff * bytes + at] == b.x[diff * bytes + at]) at++;
    result(k, 0, what,
           "sample %lld read twice differs at byte %zu of %zu (preset to 0x00, then 0xff): read() leaves bytes "
           "unwritten or depends on something besides (index, seed)",
           (long long)idx[diff], at, bytes);
  } else {
    result(k, 1, what, NULL);
  }
  snprintf(what, sizeof what, "source %s: %d threads read what one thread reads", s->name, SRC_THREADS);
  src_run t[SRC_THREADS];
  pthread_t th[SRC_THREADS];
  for (int i = 0; i < SRC_THREADS; i++) t[i] = src_alloc(s, self, idx, n, bytes, 0x00);
  for (int i = 0; i < SRC_THREADS; i++) pthread_create(&th[i], NULL, read_all, &t[i]);
  for (int i = 0; i < SRC_THREADS; i++) pthread_join(th[i], NULL);
  int thread_bad = -1;
  for (int i = 0; i < SRC_THREADS && thread_bad < 0; i++)
    if (t[i].e || memcmp(t[i].x, a.x, (size_t)n * bytes) || memcmp(t[i].y, a.y, sizeof(int32_t) * (size_t)n))
      thread_bad = i;
  if (thread_bad >= 0)
    result(k, 0, what, "thread %d read other samples%s%s: read() is not safe to call concurrently (the loader does)",
           thread_bad, t[thread_bad].e ? ": " : "", t[thread_bad].e ? t[thread_bad].e->msg : "");
  else result(k, 1, what, NULL);
  for (int i = 0; i < SRC_THREADS; i++) src_free(&t[i]);
free_runs:
  src_free(&a);
  src_free(&b);
done:
  if (s->close) s->close(self);
  stoke_cfg_free(cfg);
}

/* ------------------------------------------------------------- main */

typedef struct part_list {
  const void *p[128];
  int n;
  const char *origin;
} part_list;

static void collect(void *ctx, const void *part, const char *origin) {
  part_list *l = ctx;
  if (l->n < 128 && !strcmp(origin, l->origin)) l->p[l->n++] = part;
}

static void usage(FILE *f) {
  fprintf(f, "usage: plugin_check PLUGIN [--ini FILE] [--seed N]\n"
             "  PLUGIN  libstoke_<name>.so (a path) or a plugin name on the search path\n"
             "  --ini   an INI file whose [data] section gives the keys a source needs to open\n"
             "Checks every op, kernel and source the plugin registers (see plugins/README.md, \"The test kit\").\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* each check's line out before the next kernel runs (a crash loses none) */
  kit k = {0};
  k.seed = 1;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--ini") && i + 1 < argc) k.ini = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) k.seed = strtoull(argv[++i], NULL, 10);
    else {
      fprintf(stderr, "plugin_check: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  stoke_err *e = stoke_registry_new(&k.reg);
  if (!e) e = stoke_registry_load(k.reg, "cpu");
  if (!e) e = stoke_registry_load(k.reg, argv[1]);
  if (e) {
    fprintf(stderr, "plugin_check: %s\n", e->msg);
    stoke_err_free(e);
    stoke_registry_free(k.reg);
    return 1;
  }
  /* the file the plugin was loaded from names its parts' origin */
  k.plugin = stoke_registry_plugin_path(k.reg, argv[1]);
  void *h = dlopen(k.plugin, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  k.cases = h ? dlsym(h, STOKE_TESTKIT_SYMBOL) : NULL;
  if (k.cases && (k.cases->abi_version != STOKE_ABI_VERSION || k.cases->struct_size != sizeof(stoke_testkit_v1))) {
    fprintf(stderr, "plugin_check: %s: %s says ABI %u, %u bytes; this kit is ABI %u, %zu bytes: rebuild the plugin\n",
            k.plugin, STOKE_TESTKIT_SYMBOL, k.cases->abi_version, k.cases->struct_size, STOKE_ABI_VERSION,
            sizeof(stoke_testkit_v1));
    return 1;
  }
  kernel_list all = {.origin = NULL};
  stoke_registry_each(k.reg, "kernel", collect_kernel, &all);
  part_list ops = {.origin = k.plugin}, srcs = {.origin = k.plugin};
  stoke_registry_each(k.reg, "op", collect, &ops);
  stoke_registry_each(k.reg, "source", collect, &srcs);
  kernel_list mine = {.origin = k.plugin};
  stoke_registry_each(k.reg, "kernel", collect_kernel, &mine);
  printf("plugin_check %s (seed %llu)%s\n", k.plugin, (unsigned long long)k.seed,
         k.cases                 ? ": with its test cases (stoke_testkit_v1_entry)"
         : ops.n || mine.n       ? ": no test cases exported, every op input of one shape (stoke/testkit.h gives others)"
                                 : "");
  for (int i = 0; i < ops.n; i++) check_op(&k, ops.p[i], &all);
  /* kernels for ops of others (a CUDA kernel for a core op): against the cpu's */
  for (int i = 0; i < mine.n; i++) {
    const stoke_kernel_v1 *kern = mine.k[i];
    int own = 0, seen = 0;
    for (int j = 0; j < ops.n; j++) own |= !strcmp(((const stoke_op_type_v1 *)ops.p[j])->name, kern->op);
    for (int j = 0; j < i; j++) seen |= !strcmp(mine.k[j]->op, kern->op) && strcmp(mine.k[j]->engine, "cpu");
    const stoke_op_type_v1 *op = stoke_find_op(k.reg, kern->op);
    if (own || seen || !op || !strcmp(kern->engine, "cpu")) continue;
    kernel_list of_op = {.origin = NULL}; /* this plugin's kernels of the op, forward and backward */
    for (int j = i; j < mine.n; j++)
      if (!strcmp(mine.k[j]->op, kern->op)) of_op.k[of_op.n++] = mine.k[j];
    check_op(&k, op, &of_op);
  }
  for (int i = 0; i < srcs.n; i++) check_source(&k, srcs.p[i]);
  if (!ops.n && !mine.n && !srcs.n) printf("note: the plugin registers no op, kernel or source: nothing to check\n");
  printf("%d checks, %d failed\n", k.checks, k.failures);
  if (h) dlclose(h);
  stoke_registry_free(k.reg);
  return k.failures ? 1 : 0;
}
