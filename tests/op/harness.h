/* tests/op/harness.h: helpers shared by the op tests: load the cpu plugin,
 * find kernels, make and fill tensors (fresh random values each run, the
 * seed printed on failure), poison outputs and run kernels.
 * Include after cmocka.h. Every helper is static; unused ones are fine. */
#ifndef STOKE_TESTS_OP_HARNESS_H
#define STOKE_TESTS_OP_HARNESS_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke/core.h"
#include "stoke/ops.h"
#include "stoke/registry.h"

#define H_FN static __attribute__((unused))

/* Bazel runs tests with the working directory at the runfiles root. */
#define H_PLUGIN "backends/cpu/libstoke_cpu.so"

static stoke_registry *h_reg;
static unsigned long long h_seed; /* this test's seed, for messages */
static unsigned long long h_rng;  /* splitmix64 state */

/* A failed check: the message and the seed that reproduces it. */
#define H_FAIL(...)                                                             \
  do {                                                                          \
    print_error("seed %llu (rerun with STOKE_TEST_SEED=%llu)\n", h_seed, h_seed); \
    fail_msg(__VA_ARGS__);                                                      \
  } while (0)
#define H_CHECK(cond, ...)    \
  do {                        \
    if (!(cond)) H_FAIL(__VA_ARGS__); \
  } while (0)

/* Fails the test with the error's message (and frees it). */
#define H_OK(expr)                                                       \
  do {                                                                   \
    stoke_err *h_e_ = (expr);                                            \
    if (h_e_) {                                                          \
      print_error("%s: %s\n", stoke_code_name(h_e_->code), h_e_->msg);   \
      stoke_err_free(h_e_);                                              \
      H_FAIL("%s failed", #expr);                                        \
    }                                                                    \
  } while (0)

/* cmocka group setup/teardown: one registry with the cpu plugin. */
H_FN int h_setup(void **state) {
  stoke_err *e = stoke_registry_new(&h_reg);
  if (!e) e = stoke_registry_load(h_reg, H_PLUGIN);
  if (e) {
    print_error("loading %s: %s\n", H_PLUGIN, e->msg);
    stoke_err_free(e);
    stoke_registry_free(h_reg);
    h_reg = NULL;
    return -1;
  }
  return 0;
}

H_FN int h_teardown(void **state) {
  stoke_registry_free(h_reg);
  h_reg = NULL;
  return 0;
}

/* Per-test setup: a fresh seed (time and a counter), or STOKE_TEST_SEED. */
H_FN int h_seed_test(void **state) {
  static unsigned long long counter;
  const char *env = getenv("STOKE_TEST_SEED");
  if (env && *env) {
    h_seed = strtoull(env, NULL, 0);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h_seed = ((unsigned long long)ts.tv_sec * 1000003ull) ^ (unsigned long long)ts.tv_nsec ^
             (++counter * 0x9e3779b97f4a7c15ull);
  }
  h_rng = h_seed;
  return 0;
}

#define H_TEST(f) cmocka_unit_test_setup(f, h_seed_test)

H_FN unsigned long long h_next(void) {
  unsigned long long z = (h_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
H_FN double h_uniform(double lo, double hi) {
  return lo + (hi - lo) * ((double)(h_next() >> 11) * 0x1.0p-53);
}

H_FN const stoke_kernel_v1 *h_kernel(const char *op, stoke_pass pass, stoke_dtype dt) {
  const stoke_kernel_v1 *k = stoke_find_kernel(h_reg, "cpu", op, pass, dt, STOKE_LAYOUT_ANY);
  if (!k) fail_msg("no cpu kernel for %s pass %d dtype %d", op, (int)pass, (int)dt);
  return k;
}

/* ---------------------------------------------------------------- tensors */

/* A CPU tensor of `ndim` int64 dims, data allocated (zeroed). */
H_FN stoke_tensor h_tensor(stoke_dtype dt, int ndim, ...) {
  stoke_tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.layout = STOKE_LAYOUT_ANY;
  t.device = STOKE_DEV_CPU;
  t.shape.ndim = ndim;
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; i++) t.shape.d[i] = va_arg(ap, int64_t);
  va_end(ap);
  size_t bytes = stoke_tensor_bytes(&t);
  t.data = stoke_alloc(bytes);
  assert_non_null(t.data);
  memset(t.data, 0, bytes);
  return t;
}

/* Same shape and dtype as `like` (another dtype if dt >= 0). */
H_FN stoke_tensor h_like(const stoke_tensor *like, int dt) {
  stoke_tensor t = *like;
  if (dt >= 0) t.dtype = (stoke_dtype)dt;
  size_t bytes = stoke_tensor_bytes(&t);
  t.data = stoke_alloc(bytes);
  assert_non_null(t.data);
  memset(t.data, 0, bytes);
  return t;
}

H_FN void h_free(stoke_tensor *t) {
  stoke_free(t->data);
  t->data = NULL;
}

H_FN int64_t h_numel(const stoke_tensor *t) { return stoke_numel(&t->shape); }

H_FN double h_get(const stoke_tensor *t, int64_t i) {
  switch (t->dtype) {
    case STOKE_F32: return ((const float *)t->data)[i];
    case STOKE_F64: return ((const double *)t->data)[i];
    case STOKE_I32: return ((const int32_t *)t->data)[i];
    default: fail_msg("h_get: dtype %d", (int)t->dtype);
  }
  return 0;
}

H_FN void h_set(stoke_tensor *t, int64_t i, double v) {
  switch (t->dtype) {
    case STOKE_F32: ((float *)t->data)[i] = (float)v; break;
    case STOKE_F64: ((double *)t->data)[i] = v; break;
    case STOKE_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    default: fail_msg("h_set: dtype %d", (int)t->dtype);
  }
}

H_FN void h_set_all(stoke_tensor *t, const double *v) {
  for (int64_t i = 0; i < h_numel(t); i++) h_set(t, i, v[i]);
}

/* Uniform in [lo, hi), every element fresh. */
H_FN void h_random(stoke_tensor *t, double lo, double hi) {
  for (int64_t i = 0; i < h_numel(t); i++) h_set(t, i, h_uniform(lo, hi));
}

/* dst = src converted to dst's dtype (same numel). */
H_FN void h_convert(stoke_tensor *dst, const stoke_tensor *src) {
  assert_int_equal(h_numel(dst), h_numel(src));
  for (int64_t i = 0; i < h_numel(src); i++) h_set(dst, i, h_get(src, i));
}

/* NaN everywhere, so an element the kernel does not write shows up. */
H_FN void h_poison(stoke_tensor *t) {
  for (int64_t i = 0; i < h_numel(t); i++) h_set(t, i, NAN);
}

/* Every element written (finite). */
H_FN void h_check_written(const stoke_tensor *t, const char *what) {
  for (int64_t i = 0; i < h_numel(t); i++)
    H_CHECK(isfinite(h_get(t, i)), "%s: element %lld of %lld not written (%g)", what,
            (long long)i, (long long)h_numel(t), h_get(t, i));
}

/* ||a - b|| / ||b|| (0 when both are 0). */
H_FN double h_rel_norm(const stoke_tensor *a, const stoke_tensor *b) {
  assert_int_equal(h_numel(a), h_numel(b));
  double num = 0, den = 0;
  for (int64_t i = 0; i < h_numel(a); i++) {
    double d = h_get(a, i) - h_get(b, i);
    num += d * d;
    den += h_get(b, i) * h_get(b, i);
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---------------------------------------------------------------- running */

/* plan, workspace, run, destroy, the way the executor does (of the CPU
 * kernels only bn_add_bn_relu's asks for workspace: the unfused nodes'
 * intermediate value). */
H_FN stoke_err *h_run(const stoke_kernel_v1 *k, const stoke_kernel_args_v1 *args) {
  stoke_kernel_args_v1 a = *args;
  void *state = NULL;
  size_t ws = 0;
  if (k->plan) {
    /* plan sees the same arguments without data */
    stoke_tensor in[STOKE_MAX_IO], out[STOKE_MAX_IO], din[STOKE_MAX_IO], dout[STOKE_MAX_IO];
    stoke_kernel_args_v1 p = a;
    for (int i = 0; i < a.n_in && i < STOKE_MAX_IO; i++) {
      in[i] = a.in[i];
      in[i].data = NULL;
      if (a.din) {
        din[i] = a.din[i];
        din[i].data = NULL;
      }
    }
    for (int i = 0; i < a.n_out && i < STOKE_MAX_IO; i++) {
      out[i] = a.out[i];
      out[i].data = NULL;
      if (a.dout) {
        dout[i] = a.dout[i];
        dout[i].data = NULL;
      }
    }
    p.in = in;
    p.out = out;
    p.din = a.din ? din : NULL;
    p.dout = a.dout ? dout : NULL;
    stoke_err *e = k->plan(&p, &state, &ws);
    if (e) return e;
  }
  void *wsp = NULL;
  if (ws && !(wsp = malloc(ws))) fail_msg("cpu kernel %s: no memory for %zu bytes of workspace", k->op, ws);
  a.workspace = wsp, a.workspace_bytes = ws;
  stoke_err *e = k->run(&a, state);
  free(wsp);
  if (k->destroy) k->destroy(state);
  return e;
}

/* A node as the graph hands it to kernels. */
H_FN stoke_node_v1 h_node(const char *op, const char *name) {
  stoke_node_v1 n;
  memset(&n, 0, sizeof n);
  n.op = op;
  n.name = name;
  return n;
}

#endif
