/* tests/unit/decline_test.c: a kernel that declines its node at plan time
 * (core/exec.c's plan_node), on the CPU. A test op, `half` (y = x / 2),
 * has forward kernels from two engines that are not backends, `picky`
 * (declines more than 8 elements) and `fussy` (more than 16), and its
 * backward on `cpu`; a graph x -> half -> linear -> loss is compiled with
 * [run] backends = picky, fussy, cpu at three batch sizes:
 *   - 6 elements: picky plans and runs the node, nothing is logged;
 *   - 12: picky declines, fussy runs it, one warning names the node, who
 *     declined it and why, and who runs it; the plan report names fussy;
 *     the parameters' gradients match central differences;
 *   - 30: both decline: the error is fussy's reason, says that no backend
 *     after it has a kernel, and names the node;
 *   - an evaluation plan sharing the 12-element training plan's parameters
 *     moves its node to fussy too, without a second warning;
 *   - picky failing with any other error (here: invalid) fails the plan
 *     with it; fussy is not tried;
 *   - picky's plan() asking for a workspace no allocation can give (a
 *     size_t from a negative number, and 2^50 bytes): the error is the
 *     allocation's and names the node and engine that asked, instead of a
 *     rounded-up size wrapping to a 64-byte buffer the kernel overruns;
 *   - the graph in f32, where half has f64 kernels only: the error lists
 *     the kernels of half there are, with their dtypes and files.
 * The losses of the 6-element graph under picky and under fussy (picky
 * left out of the list) are equal bit for bit: the same arithmetic. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "tests/common/cpu_fixture.h"
#include "tests/common/log_capture.h"

enum { C = 3, CLASSES = 2 };

static int picky_runs, fussy_runs, picky_invalid;
static size_t picky_ws; /* the workspace picky's plan() asks for (0: none) */

static stoke_err *half_infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  (void)n;
  out[0] = in[0];
  return NULL;
}

static int64_t numel(const stoke_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->shape.ndim; i++) n *= t->shape.d[i];
  return n;
}

static stoke_err *picky_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  (void)state;
  if (picky_invalid) return STOKE_ERR(STOKE_E_INVALID, "picky: a broken node");
  if (picky_ws) *ws = picky_ws;
  if (numel(&a->in[0]) > 8)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "picky: %lld elements, at most 8", (long long)numel(&a->in[0]));
  return NULL;
}

static stoke_err *fussy_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  (void)state, (void)ws;
  if (numel(&a->in[0]) > 16)
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "fussy: %lld elements, at most 16", (long long)numel(&a->in[0]));
  return NULL;
}

static void half(const stoke_kernel_args_v1 *a) {
  const double *x = a->in[0].data;
  double *y = a->out[0].data;
  for (int64_t i = 0; i < numel(&a->in[0]); i++) y[i] = 0.5 * x[i];
}

static stoke_err *picky_run(const stoke_kernel_args_v1 *a, void *state) {
  (void)state;
  picky_runs++;
  half(a);
  return NULL;
}

static stoke_err *fussy_run(const stoke_kernel_args_v1 *a, void *state) {
  (void)state;
  fussy_runs++;
  half(a);
  return NULL;
}

static stoke_err *half_bwd(const stoke_kernel_args_v1 *a, void *state) {
  (void)state;
  const double *dy = a->dout[0].data;
  double *dx = a->din[0].data;
  if (dx)
    for (int64_t i = 0; i < numel(&a->dout[0]); i++) dx[i] = 0.5 * dy[i];
  return NULL;
}

static const stoke_op_type_v1 half_op = {STOKE_ABI(stoke_op_type_v1), .name = "half", .n_inputs = 1,
                                         .n_outputs = 1, .infer = half_infer, .bwd_needs = STOKE_BWD_NEEDS_NOTHING,
                                         .has_backward = STOKE_HAS_BACKWARD};
static const stoke_kernel_v1 half_kernels[] = {
    {"picky", "half", STOKE_FWD, STOKE_F64, STOKE_LAYOUT_ANY, picky_plan, picky_run, NULL, 0, 0},
    {"fussy", "half", STOKE_FWD, STOKE_F64, STOKE_LAYOUT_ANY, fussy_plan, fussy_run, NULL, 0, 0},
    {"cpu", "half", STOKE_BWD, STOKE_F64, STOKE_LAYOUT_ANY, NULL, half_bwd, NULL, 0, 0}};

static stoke_err *reg_half(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  (void)h;
  STOKE_PROPAGATE_P(r->add_op(r->self, &half_op));
  for (int i = 0; i < 3; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &half_kernels[i]));
  return NULL;
}

static int setup(void **state) {
  (void)state;
  if (cpu_fixture_setup("decline_test")) return -1;
  static const stoke_plugin_v1 p = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "half", "", reg_half};
  stoke_err *e = stoke_registry_add_plugin(reg, &p, "decline_test.c");
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  return 0;
}

/* x [n, C] -> half -> fc -> loss, in f64 (net) or another dtype */
static stoke_graph *net_of(int64_t n, stoke_dtype dt) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, dt, STOKE_NHWC, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, h, fw, fb, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {n, C}}, dt, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {n}}, STOKE_I32, &y));
  OK(b.node(g, "half", "h", &x, 1, "", &h, 1));
  OK(b.param(g, "fc.weight", &(stoke_shape){2, {CLASSES, C}}, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &fw));
  OK(b.param(g, "fc.bias", &(stoke_shape){1, {CLASSES}}, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &fb));
  OK(b.node(g, STOKE_OP_LINEAR, "fc", (int[]){h, fw, fb}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  return g;
}

static stoke_graph *net(int64_t n) { return net_of(n, STOKE_F64); }

/* The executor made for a compiled plan: a training plan's own, or an
 * evaluation plan's sharing `share`'s parameters. */
typedef struct bind_ctx {
  stoke_plan *p;
  stoke_exec *share, **x;
  stoke_err *e;
} bind_ctx;
static void bind(void *c) {
  bind_ctx *b = c;
  b->e = b->share ? stoke_exec_new_shared(b->p, b->share, b->x) : stoke_exec_new(b->p, cpu, cpu_self, seed, b->x);
}

/* Compiled with [run] backends = `engines` (cpu last), for training, or
 * for evaluation sharing `share`'s parameters, and bound to the cpu
 * backend; what was logged meanwhile into *log (malloc'd). The executor's
 * error, if any, is returned (the plan freed). */
static stoke_err *prepare(stoke_graph *g, const char **engines, int n_engines, stoke_exec *share, stoke_exec **x,
                          char **log) {
  void *selves[4] = {0};
  selves[n_engines - 1] = cpu_self;
  stoke_plan_opts o = {.engines = engines, .n_engines = n_engines, .engine_selves = selves, .training = !share};
  bind_ctx b = {NULL, share, x, NULL};
  OK(stoke_compile(g, &o, &b.p));
  *log = test_log_of(bind, &b);
  if (b.e) stoke_plan_free(b.p);
  return b.e;
}

static const stoke_gnode *half_fwd(const stoke_exec *x) {
  const stoke_graph *g = stoke_exec_plan((stoke_exec *)x)->g;
  for (int i = 0; i < g->n_nodes; i++)
    if (!strcmp(g->nodes[i].n.op, "half") && g->nodes[i].pass == STOKE_FWD) return &g->nodes[i];
  fail_msg("no half node");
  return NULL;
}

static void done(stoke_exec *x, stoke_graph *g, char *log) {
  stoke_plan *p = stoke_exec_plan(x);
  stoke_exec_free(x);
  stoke_plan_free(p);
  stoke_graph_free(g);
  free(log);
}

static void test_accepted(void **state) {
  (void)state;
  static const char *engines[] = {"picky", "fussy", "cpu"};
  stoke_graph *g = net(2);
  stoke_exec *x;
  char *log;
  picky_runs = fussy_runs = 0;
  OK(prepare(g, engines, 3, NULL, &x, &log));
  assert_string_equal(half_fwd(x)->kernel->engine, "picky");
  if (strstr(log, "declined")) fail_msg("a warning when nothing was declined: %s", log);
  cpu_random_batch(x, seed, 2 * C, 2, CLASSES);
  double loss = cpu_loss(x);
  assert_int_equal(picky_runs, 1);
  assert_int_equal(fussy_runs, 0);
  /* the same graph on fussy alone: the same bits */
  static const char *without_picky[] = {"fussy", "cpu"};
  stoke_graph *g2 = net(2);
  stoke_exec *x2;
  char *log2;
  OK(prepare(g2, without_picky, 2, NULL, &x2, &log2));
  assert_string_equal(half_fwd(x2)->kernel->engine, "fussy");
  cpu_random_batch(x2, seed, 2 * C, 2, CLASSES);
  double loss2 = cpu_loss(x2);
  assert_int_equal(fussy_runs, 1);
  if (memcmp(&loss, &loss2, sizeof loss)) fail_msg("loss %.17g under picky, %.17g under fussy", loss, loss2);
  done(x, g, log);
  done(x2, g2, log2);
}

static void test_declined(void **state) {
  (void)state;
  static const char *engines[] = {"picky", "fussy", "cpu"};
  stoke_graph *g = net(4); /* 12 elements: picky declines, fussy takes it */
  stoke_exec *x;
  char *log;
  picky_runs = fussy_runs = 0;
  OK(prepare(g, engines, 3, NULL, &x, &log));
  print_message("%s", log);
  assert_string_equal(half_fwd(x)->kernel->engine, "fussy");
  const char *want = "node 'h' (half forward): picky declined it (picky: 12 elements, at most 8); fussy runs it";
  if (!strstr(log, want)) fail_msg("the log does not say \"%s\":\n%s", want, log);
  int declines = 0;
  for (const char *q = log; (q = strstr(q, "declined")); q++) declines++;
  if (declines != 1) fail_msg("%d warnings of a decline, not one:\n%s", declines, log);
  cpu_expect_report(stoke_exec_plan(x), "fussy", "that fussy runs the node");
  cpu_random_batch(x, seed, 4 * C, 4, CLASSES);
  int compared;
  double worst = cpu_check_gradients(x, 1e-6, &compared);
  assert_int_equal(compared, CLASSES * C + CLASSES); /* every element of fc.weight and fc.bias */
  print_message("gradients against central differences: worst relative error %.2g\n", worst);
  assert_int_equal(picky_runs, 0);
  if (fussy_runs < 1) fail_msg("fussy never ran");
  done(x, g, log);
}

/* An evaluation plan sharing the training plan's parameters declines the
 * same forward node: fussy runs it there too, and the warning is not given
 * again. */
static void test_eval_plan_quiet(void **state) {
  (void)state;
  static const char *engines[] = {"picky", "fussy", "cpu"};
  stoke_graph *g = net(4), *ge = net(4);
  stoke_exec *x, *xe;
  char *log, *log_eval;
  OK(prepare(g, engines, 3, NULL, &x, &log));
  if (!strstr(log, "picky declined it")) fail_msg("the training plan's decline not logged:\n%s", log);
  OK(prepare(ge, engines, 3, x, &xe, &log_eval));
  assert_string_equal(half_fwd(xe)->kernel->engine, "fussy");
  if (strstr(log_eval, "declined")) fail_msg("the evaluation plan warned again:\n%s", log_eval);
  done(xe, ge, log_eval);
  done(x, g, log);
}

static void test_nobody_left(void **state) {
  (void)state;
  static const char *engines[] = {"picky", "fussy", "cpu"};
  stoke_graph *g = net(10); /* 30 elements: both decline */
  stoke_exec *x = NULL;
  char *log;
  stoke_err *e = prepare(g, engines, 3, NULL, &x, &log);
  if (!e) fail_msg("planned 30 elements that neither picky nor fussy takes");
  print_message("%s\n", e->msg);
  const char *says[] = {"fussy: 30 elements, at most 16", "node 'h'",
                        "no backend after it in [run] backends has a kernel for the node"};
  for (int i = 0; i < 3; i++)
    if (!strstr(e->msg, says[i])) fail_msg("the error does not say \"%s\": %s", says[i], e->msg);
  if (!strstr(log, "picky declined it (picky: 30 elements, at most 8); fussy runs it"))
    fail_msg("picky's decline not logged:\n%s", log);
  stoke_err_free(e);
  stoke_graph_free(g);
  free(log);
}

static void test_other_error(void **state) {
  (void)state;
  static const char *engines[] = {"picky", "fussy", "cpu"};
  stoke_graph *g = net(2);
  stoke_exec *x = NULL;
  char *log;
  picky_invalid = 1;
  stoke_err *e = prepare(g, engines, 3, NULL, &x, &log);
  picky_invalid = 0;
  if (!e) fail_msg("planned past picky's invalid-node error");
  print_message("%s\n", e->msg);
  if (!strstr(e->msg, "picky: a broken node") || !strstr(e->msg, "node 'h' (picky)"))
    fail_msg("the error is not picky's own, with the node: %s", e->msg);
  if (strstr(log, "declined")) fail_msg("an error that is not a decline was taken for one:\n%s", log);
  stoke_err_free(e);
  stoke_graph_free(g);
  free(log);
}

static void test_huge_workspace(void **state) {
  (void)state;
  static const char *engines[] = {"picky", "fussy", "cpu"};
  const size_t asks[] = {(size_t)(int64_t)-4, (size_t)1 << 50};
#if defined(__SANITIZE_ADDRESS__)
  const int n_asks = 1; /* ASan aborts a 2^50-byte request instead of returning NULL */
#else
  const int n_asks = 2;
#endif
  for (int i = 0; i < n_asks; i++) {
    stoke_graph *g = net(2);
    stoke_exec *x = NULL;
    char *log;
    picky_ws = asks[i];
    stoke_err *e = prepare(g, engines, 3, NULL, &x, &log);
    picky_ws = 0;
    if (!e) fail_msg("a workspace of %zu bytes was allocated", asks[i]);
    print_message("%s\n", e->msg);
    char want[160];
    snprintf(want, sizeof want, "%zu bytes is the most any kernel's plan() asked for, by node 'h' (op half, kernel of engine picky)", asks[i]);
    if (e->code != STOKE_E_OOM || !strstr(e->msg, want))
      fail_msg("not an out-of-memory error saying \"%s\": %s", want, e->msg);
    stoke_err_free(e);
    stoke_graph_free(g);
    free(log);
  }
}

/* A node whose dtype no kernel of its op has (half in f32: the plugin
 * registered f64 only): the error lists the kernels there are, with their
 * dtypes and the file that registered them, instead of suggesting to add a
 * backend that is already listed. */
static void test_wrong_dtype(void **state) {
  (void)state;
  static const char *engines[] = {"picky", "fussy", "cpu"};
  stoke_graph *g = net_of(2, STOKE_F32);
  stoke_plan_opts o = {.engines = engines, .n_engines = 3, .training = 1};
  stoke_plan *p = NULL;
  stoke_err *e = stoke_compile(g, &o, &p);
  if (!e) fail_msg("compiled half in f32 with f64 kernels only");
  print_message("%s\n", e->msg);
  const char *says[] = {"node 'h': no kernel for op 'half' (forward, f32) in backends [picky, fussy, cpu]",
                        "the forward kernels of 'half' registered are for other dtypes or layouts: "
                        "picky f64 (from decline_test.c), fussy f64 (from decline_test.c)",
                        "the node's input is f32, layout any"};
  for (int i = 0; i < 3; i++)
    if (!strstr(e->msg, says[i])) fail_msg("the error does not say \"%s\": %s", says[i], e->msg);
  if (strstr(e->msg, "add one to [run] backends")) fail_msg("it suggests a backend already listed: %s", e->msg);
  stoke_err_free(e);
  stoke_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accepted),
      cmocka_unit_test(test_declined),
      cmocka_unit_test(test_eval_plan_quiet),
      cmocka_unit_test(test_nobody_left),
      cmocka_unit_test(test_other_error),
      cmocka_unit_test(test_huge_workspace),
      cmocka_unit_test(test_wrong_dtype),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
