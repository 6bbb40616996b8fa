/* tests/gpu/fused_test.c: the fused engine's batch_norm, bn_relu,
 * bn_add_relu and bn_add_bn_relu kernels (backends/fused/bn_act.cu) against the CPU reference in f64
 * (gpu_harness.h) where every_kernel_test (small random shapes, every
 * dtype, accumulation) does not reach: ResNet-50's shapes (many row
 * partitions; the 14x14 and 7x7 layers' channel blocks) and misaligned
 * data (the scalar fallback): bf16, fp16 and f32, NHWC, training and eval,
 * forward (y, saved statistics, the running statistics updated in place)
 * and backward (dx, dweight, dbias, dr, and bn_add_bn_relu's shortcut
 * dweight and dbias; the parameters' gradients accumulated with
 * param_grad_beta 1 as well as overwritten), each with 3 seeds drawn from
 * the run's, with the engines ordered (fused, cuda) as `backends = fused,
 * ...` orders them. Outputs are poisoned first.
 *
 * The ReLU's mask near 0: bn_add_relu's (and bn_add_bn_relu's) backward reads the forward's ReLU
 * bitmask on both sides (the GPU's mask is copied into the reference: the
 * GPU rounds bn(x) to the dtype before the residual add, as the unfused
 * nodes do, where the f64 reference does not); the GPU's mask is checked
 * bit by bit against its own y > 0. bn_relu's backward recomputes the mask from x on
 * each side, in f32 on the GPU and f64 on the CPU, so dy is drawn as 0
 * where the pre-activation lies within 1e-3 of 0: the two masks may differ
 * only where the gradient is 0 anyway.
 *
 * Tolerance on the relative-norm error, from the dtype's unit roundoff u
 * (2^-8 bf16, 2^-11 fp16, 2^-24 f32) and the reduction length m (values
 * per channel): 2 u for the output's rounding and one intermediate
 * rounding (bn(x) before the add, or dz; 3 u for bn_add_bn_relu's y, whose
 * bn(x) and bn2(r) are each rounded before the add), plus u32 (8 sqrt(m) + 64) for the
 * f32 arithmetic: the per-channel sums of m terms in blocks (error growing
 * as sqrt(m)) and the per-element x - mean, scale and fma chains. The
 * statistics are f32 on every dtype: u32 (8 sqrt(m) + 64). Runs on a GPU
 * machine only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_harness.h"
#include "tests/common/relu_mask.h"

static int setup(void **state) { return g_setup_engine_first("fused"); /* (fused, cuda) */ }

typedef struct fcase {
  int64_t n, c, h, w;
  int act, training, beta, misalign; /* act: 0 batch_norm, 1 bn_relu, 2 bn_add_relu, 3 bn_add_bn_relu */
  stoke_dtype dt;
  int rep; /* which of the seeds drawn from the run's */
} fcase;

#define U32 5.960464477539063e-08 /* 2^-24 */

static const char *op_of(const fcase *k) {
  return k->act == 3 ? STOKE_OP_BN_ADD_BN_RELU
         : k->act == 2 ? STOKE_OP_BN_ADD_RELU
         : k->act == 1 ? STOKE_OP_BN_RELU
                       : STOKE_OP_BATCH_NORM;
}

/* See the top: the f32 arithmetic's share for m values per channel. */
static double tol_f32_part(int64_t m) { return U32 * (8.0 * sqrt((double)m) + 64.0); }

/* `roundings` of the dtype: 2, 3 for bn_add_bn_relu's y (see the top) */
static double tol_for(stoke_dtype dt, int64_t m, int roundings) {
  double u = dt == STOKE_BF16 ? 1.0 / 256 : dt == STOKE_F16 ? 1.0 / 2048 : U32;
  return roundings * u + tol_f32_part(m);
}

/* bn_relu: dy = 0 where the reference's pre-activation (x - mean) invstd
 * weight + bias is within 1e-3 of 0 (see the top); uploads dy again. */
static void zero_dy_near_kink(g_tensor *dy, const g_tensor *x, const g_tensor *w, const g_tensor *b,
                              const g_tensor *mean, const g_tensor *invstd, int64_t c) {
  int64_t n = stoke_numel(&dy->dev.shape), zeroed = 0;
  size_t bytes = (size_t)n * stoke_dtype_size(dy->dev.dtype);
  void *host = malloc(bytes);
  for (int64_t i = 0; i < n; i++) {
    int64_t ch = i % c; /* NHWC: channels innermost */
    double pre = (x->vals[i] - g_get(mean->ref.data, mean->ref.dtype, ch)) *
                     g_get(invstd->ref.data, invstd->ref.dtype, ch) * w->vals[ch] + b->vals[ch];
    if (fabs(pre) < 1e-3) dy->vals[i] = 0, zeroed++;
    g_set(host, dy->dev.dtype, i, dy->vals[i]);
    g_set(dy->ref.data, dy->ref.dtype, i, dy->vals[i]);
  }
  stoke_err *e = g_dev->copy(g_dev_self, dy->dev.data, host, bytes, STOKE_COPY_H2D, NULL);
  if (!e) e = g_dev->stream_sync(g_dev_self, NULL);
  free(host);
  if (e) fail_msg("upload: %s", e->msg);
  if (zeroed * 100 > n) fail_msg("%lld of %lld pre-activations near 0: the case tests little", (long long)zeroed, (long long)n);
}


/* Device copy of t's values into its reference side (as f64). */
static void pull_into_ref(g_tensor *t) {
  int64_t n = stoke_numel(&t->dev.shape);
  size_t bytes = (size_t)n * stoke_dtype_size(t->dev.dtype);
  void *host = malloc(bytes);
  stoke_err *e = g_dev->copy(g_dev_self, host, t->dev.data, bytes, STOKE_COPY_D2H, NULL);
  if (e) fail_msg("download: %s", e->msg);
  for (int64_t i = 0; i < n; i++) g_set(t->ref.data, t->ref.dtype, i, g_get(host, t->dev.dtype, i));
  free(host);
}

static void expect(const char *what, const g_tensor *t, const fcase *k, double tol) {
  double mx, err = g_compare(t, &mx);
  print_message("  %-11s %-4s %-8s (%lld, %lld, %lld, %lld)%s seed %d %-14s rel err %.3g (max abs %.3g, tol %.2g)\n",
                op_of(k), stoke_dtype_name(k->dt), k->training ? "training" : "eval",
                (long long)k->n, (long long)k->c, (long long)k->h, (long long)k->w, k->misalign ? " misaligned" : "",
                k->rep, what, err, mx, tol);
  if (!(err <= tol))
    fail_msg("%s %s %s: relative error %.3g > %.3g (seed %llu)", op_of(k),
             stoke_dtype_name(k->dt), what, err, tol, (unsigned long long)g_seed);
}

static void check_case(const fcase *k) {
  const char *op = op_of(k);
  int add = k->act >= 2, dual = k->act == 3;
  stoke_node_v1 node;
  stoke_err *e = stoke_node_init(g_reg, op, "fused_test",
                                 dual ? "eps=1e-5, momentum=0.2, shortcut_eps=1e-3, shortcut_momentum=0.3"
                                      : "eps=1e-5, momentum=0.2",
                                 &node);
  if (e) fail_msg("%s", e->msg);
  int64_t m = k->n * k->h * k->w;
  double tol = tol_for(k->dt, m, 2), tol_y = tol_for(k->dt, m, dual ? 3 : 2), tol_stat = tol_f32_part(m);
  stoke_rng r = stoke_rng_seed(stoke_hash3(g_seed, (uint64_t)k->c * 131 + (uint64_t)k->dt + ((uint64_t)k->rep << 32),
                                           (uint64_t)k->act));
  int n_in = dual ? 10 : add ? 6 : 5;
  stoke_shape xs = {4, {k->n, k->c, k->h, k->w}}, cs = {1, {k->c}};
  g_tensor in[10], out[6], din[10], dy;
  int n_out = dual ? 6 : add ? 4 : 3;
  stoke_shape ms = {1, {stoke_relu_mask_bytes(stoke_numel(&xs))}};
  memset(in, 0, sizeof in);
  memset(din, 0, sizeof din);
  for (int i = 0; i < n_in; i++) {
    int act = i == 0 || i == 5, stat = i == 3 || i == 4 || i == 8 || i == 9;
    g_alloc(&in[i], act ? &xs : &cs, stat ? STOKE_F32 : k->dt, act ? STOKE_NHWC : STOKE_LAYOUT_ANY);
    if (stat) g_fill(&in[i], &r, 0.5, 1.5, 0);
    else if (i == 1 || i == 6) g_fill(&in[i], &r, 0.5, 1.5, 0);
    else g_fill(&in[i], &r, -1, 1, 0);
  }
  g_alloc2(&out[0], &xs, STOKE_F64, k->dt, STOKE_NHWC);
  for (int j = 1; j < 3; j++) g_alloc2(&out[j], &cs, STOKE_F64, STOKE_F32, STOKE_LAYOUT_ANY);
  if (add) g_alloc2(&out[3], &ms, STOKE_U8, STOKE_U8, STOKE_LAYOUT_ANY);
  for (int j = 4; j < n_out; j++) g_alloc2(&out[j], &cs, STOKE_F64, STOKE_F32, STOKE_LAYOUT_ANY);
  size_t shift = k->misalign ? stoke_dtype_size(k->dt) : 0; /* off the 16-byte grid: the scalar path */
  if (shift) {
    /* move the data one element on: refill x and r there */
    in[0].dev.data = (char *)in[0].dev.data + shift;
    g_fill(&in[0], &r, -1, 1, 0);
    if (add) {
      in[5].dev.data = (char *)in[5].dev.data + shift;
      g_fill(&in[5], &r, -1, 1, 0);
    }
    out[0].dev.data = (char *)out[0].dev.data + shift;
  }
  for (int j = 0; j < n_out; j++) g_poison(&out[j]);
  stoke_tensor ri[10], gi[10], ro[6], go[6];
  for (int i = 0; i < n_in; i++) ri[i] = in[i].ref, gi[i] = in[i].dev;
  for (int j = 0; j < n_out; j++) ro[j] = out[j].ref, go[j] = out[j].dev;
  stoke_kernel_args_v1 ra = {.node = &node, .n_in = n_in, .n_out = n_out, .in = ri, .out = ro, .training = k->training};
  stoke_kernel_args_v1 ga = ra;
  ga.in = gi, ga.out = go, ga.engine = g_engine_self_of("fused"), ga.stream = g_dev->default_stream(g_dev_self);
  const stoke_kernel_v1 *rk = stoke_find_kernel(g_reg, "cpu", op, STOKE_FWD, STOKE_F64, STOKE_NHWC);
  const stoke_kernel_v1 *gk = stoke_find_kernel(g_reg, "fused", op, STOKE_FWD, k->dt, STOKE_NHWC);
  if (!rk || !gk) fail_msg("no %s forward kernel (cpu f64 or fused %s)", op, stoke_dtype_name(k->dt));
  g_run(rk, &ra, 0);
  g_run(gk, &ga, 1);
  expect("y", &out[0], k, tol_y);
  expect("saved_mean", &out[1], k, tol_stat);
  expect("saved_invstd", &out[2], k, tol_stat);
  expect("running_mean", &in[3], k, tol_stat);
  expect("running_var", &in[4], k, tol_stat);
  if (dual) {
    expect("saved_mean2", &out[4], k, tol_stat);
    expect("saved_invstd2", &out[5], k, tol_stat);
    expect("running_mean2", &in[8], k, tol_stat);
    expect("running_var2", &in[9], k, tol_stat);
  }
  if (add) { /* the bitmask: bit e exactly the GPU's own y element e > 0 */
    int64_t ne = stoke_numel(&xs);
    size_t yb = (size_t)ne * stoke_dtype_size(k->dt), mb = (size_t)ms.d[0];
    uint8_t *hm = malloc(mb);
    void *hy = malloc(yb);
    g_dev_get(hm, out[3].dev.data, mb);
    g_dev_get(hy, out[0].dev.data, yb);
    int64_t e = relu_mask_first_wrong(hm, hy, k->dt, ne);
    if (e >= 0)
      fail_msg("%s %s: ReLU mask bit %lld is %d, y there is %g (seed %llu)", op, stoke_dtype_name(k->dt), (long long)e,
               relu_mask_bit(hm, e), g_get(hy, k->dt, e), (unsigned long long)g_seed);
    free(hm), free(hy);
  }
  /* backward on the GPU's y and mask (see the top) */
  pull_into_ref(&out[0]);
  if (add) pull_into_ref(&out[3]);
  g_alloc2(&dy, &xs, STOKE_F64, k->dt, STOKE_NHWC);
  if (shift) dy.dev.data = (char *)dy.dev.data + shift;
  g_fill(&dy, &r, -1, 1, 0);
  if (k->act == 1) zero_dy_near_kink(&dy, &in[0], &in[1], &in[2], &out[1], &out[2], k->c);
  stoke_tensor rdin[10], gdin[10], rdout[6], gdout[6];
  memset(rdin, 0, sizeof rdin);
  memset(gdin, 0, sizeof gdin);
  memset(rdout, 0, sizeof rdout);
  memset(gdout, 0, sizeof gdout);
  rdout[0] = dy.ref, gdout[0] = dy.dev;
  for (int i = 0; i < n_in; i++) {
    if (i == 3 || i == 4 || i == 8 || i == 9) continue;
    int param = i == 1 || i == 2 || i == 6 || i == 7;
    g_alloc(&din[i], param ? &cs : &xs, k->dt, in[i].dev.layout);
    if (shift && !param) din[i].dev.data = (char *)din[i].dev.data + shift;
    if (k->beta && param) g_fill(&din[i], &r, -1, 1, 0); /* accumulated onto */
    else g_poison(&din[i]);
    rdin[i] = din[i].ref, gdin[i] = din[i].dev;
  }
  const stoke_op_type_v1 *t = stoke_find_op(g_reg, op);
  for (int i = 0; i < n_in; i++)
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_INPUT(i))) ri[i].data = gi[i].data = NULL;
  /* only what bwd_needs keeps holds data: bn_relu's backward must not read y */
  for (int j = 0; j < n_out; j++)
    if (!(t->bwd_needs & STOKE_BWD_NEEDS_OUTPUT(j))) ro[j].data = go[j].data = NULL;
  stoke_kernel_args_v1 rb = ra, gb = ga;
  rb.din = rdin, rb.dout = rdout, gb.din = gdin, gb.dout = gdout;
  rb.param_grads = gb.param_grads = 6u | (dual ? 0xc0u : 0u);
  rb.param_grad_beta = gb.param_grad_beta = k->beta ? 1.0f : 0.0f;
  const stoke_kernel_v1 *rbk = stoke_find_kernel(g_reg, "cpu", op, STOKE_BWD, STOKE_F64, STOKE_NHWC);
  const stoke_kernel_v1 *gbk = stoke_find_kernel(g_reg, "fused", op, STOKE_BWD, k->dt, STOKE_NHWC);
  if (!rbk || !gbk) fail_msg("no %s backward kernel", op);
  g_run(rbk, &rb, 0);
  g_run(gbk, &gb, 1);
  static const char *names[] = {"dx", "dweight", "dbias", "", "", "dr", "dweight2", "dbias2", "", ""};
  for (int i = 0; i < n_in; i++)
    if (din[i].dev.data) expect(names[i], &din[i], k, tol);
  /* put the shifted pointers back before freeing */
  if (shift) {
    in[0].dev.data = (char *)in[0].dev.data - shift;
    out[0].dev.data = (char *)out[0].dev.data - shift;
    dy.dev.data = (char *)dy.dev.data - shift;
    if (add) in[5].dev.data = (char *)in[5].dev.data - shift;
    for (int i = 0; i < n_in; i++)
      if (din[i].dev.data && i != 1 && i != 2 && i != 6 && i != 7) din[i].dev.data = (char *)din[i].dev.data - shift;
  }
  g_free(&dy);
  for (int i = 0; i < n_in; i++) g_free(&in[i]), g_free(&din[i]);
  for (int j = 0; j < n_out; j++) g_free(&out[j]);
}

static const int64_t shapes[][4] = {
    {16, 64, 56, 56}, /* ResNet-50 layer1 (3.2M values: many partitions) */
    {8, 2048, 7, 7},  /* layer4: channel blocks across x */
    {4, 1024, 14, 14}, /* layer3 */
};                     /* small and odd channel counts: every_kernel_test */
#define N_SHAPES ((int)(sizeof shapes / sizeof *shapes))

static void run_all(stoke_dtype dt) {
  for (int rep = 0; rep < 3; rep++) {
    for (int s = 0; s < N_SHAPES; s++)
      for (int act = 0; act < 4; act++)
        for (int training = 1; training >= 0; training--) {
          fcase k = {shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], act, training, 0, 0, dt, rep};
          check_case(&k);
        }
    for (int act = 0; act < 4; act++) {
      fcase beta = {4, 40, 7, 9, act, 1, 1, 0, dt, rep}, mis = {4, 64, 6, 5, act, 1, 0, 1, dt, rep};
      check_case(&beta);
      check_case(&mis);
    }
  }
}

static void test_bf16(void **state) { run_all(STOKE_BF16); }
static void test_f16(void **state) { run_all(STOKE_F16); }
static void test_f32(void **state) { run_all(STOKE_F32); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_f16),
      cmocka_unit_test(test_f32),
  };
  return cmocka_run_group_tests(tests, setup, g_teardown_engine_first);
}
