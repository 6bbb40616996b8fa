/* tests/unit/side_test.c: [run] wgrad_stream in the compiler (core/plan.c)
 * and the executor, on the CPU. A test op, `scale` (y[n, c] = x[n, c] w[c]),
 * registers a cpu backward kernel with STOKE_KCAP_SIDE_GRADS; a chain of
 * four scales (the first weight used twice, tied) is compiled with and
 * without the key:
 *   - the side nodes are the scales' backward nodes, not the linear's (its
 *     kernel lacks the cap), and each waits where the key's lag says, or
 *     before the next node touching its weight's gradient (the tied one);
 *   - what each side node reads stays live until the node before its join,
 *     and no value placed over it is live then;
 *   - the plan report says so;
 *   - on the CPU (no side stream: the kernels run in order) the loss and
 *     every gradient equal the plan without the key's, bit for bit, and
 *     match central differences;
 *   - the executor's stream protocol, on the cpu backend given a second
 *     stream and events that only log what is asked of them (the kernels
 *     still run in order, so the results are the CPU's): each side node's
 *     kernel gets the side stream and workspace after the side stream waits
 *     for the compute stream, its end is recorded on the side stream, and
 *     the compute stream waits for that record after the node and before
 *     its join, every side node's by the backward's end. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/check.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "stoke/rng.h"
#include "tests/common/cpu_fixture.h"

enum { N = 6, C = 5, CLASSES = 3 };

static stoke_err *scale_infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static stoke_err *scale_fwd(const stoke_kernel_args_v1 *a, void *state) {
  const double *x = a->in[0].data, *w = a->in[1].data;
  double *y = a->out[0].data;
  for (int64_t i = 0; i < N * C; i++) y[i] = x[i] * w[i % C];
  return NULL;
}

/* dx overwritten; dw = beta dw + sum over rows of dy x. A side stream is
 * never given on the CPU: the test fails if it is. */
/* The stream protocol's log (test_side_protocol): 'K' a scale backward
 * kernel (its node's index), 'R' an event recorded, 'W' a stream waiting for
 * one. */
typedef struct proto_ev {
  char what;
  const void *event, *stream;
  int node;
} proto_ev;
static proto_ev proto[256];
static int n_proto, logging; /* logging: the recording backend is in use */
static void proto_add(char what, const void *event, const void *stream, int node) {
  if (n_proto < 256) proto[n_proto++] = (proto_ev){what, event, stream, node};
}

static stoke_err *scale_bwd(const stoke_kernel_args_v1 *a, void *state) {
  if (a->side_stream && !logging) return STOKE_ERR(STOKE_E_INTERNAL, "a side stream on the CPU");
  /* event: 1 when the side workspace is as large as the compute stream's and not the same memory */
  int own_ws = a->side_workspace_bytes == a->workspace_bytes && (!a->workspace || a->side_workspace != a->workspace);
  if (logging) proto_add('K', own_ws ? (void *)proto : NULL, a->side_stream, atoi(a->node->name + 1));
  const double *x = a->in[0].data, *w = a->in[1].data, *dy = a->dout[0].data;
  double *dx = a->din[0].data, *dw = a->din[1].data;
  if (dx)
    for (int64_t i = 0; i < N * C; i++) dx[i] = dy[i] * w[i % C];
  if (dw) {
    float beta = stoke_grad_beta(a, 1);
    for (int c = 0; c < C; c++) {
      double s = 0;
      for (int r = 0; r < N; r++) s += dy[r * C + c] * x[r * C + c];
      dw[c] = (beta ? dw[c] : 0) + s;
    }
  }
  return NULL;
}

static const stoke_op_type_v1 scale_op = {STOKE_ABI(stoke_op_type_v1), .name = "scale", .n_inputs = 2,
                                          .n_outputs = 1, .infer = scale_infer,
                                          .bwd_needs = STOKE_BWD_NEEDS_INPUT(0) | STOKE_BWD_NEEDS_INPUT(1),
                                          .has_backward = STOKE_HAS_BACKWARD};
static const stoke_kernel_v1 scale_kernels[] = {
    {"cpu", "scale", STOKE_FWD, STOKE_F64, STOKE_LAYOUT_ANY, NULL, scale_fwd, NULL, 0, 0},
    {"cpu", "scale", STOKE_BWD, STOKE_F64, STOKE_LAYOUT_ANY, NULL, scale_bwd, NULL, 0, STOKE_KCAP_SIDE_GRADS}};

static stoke_err *reg_scale(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  STOKE_PROPAGATE_P(r->add_op(r->self, &scale_op));
  for (int i = 0; i < 2; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &scale_kernels[i]));
  return NULL;
}

static int setup(void **state) {
  if (cpu_fixture_setup("side_test")) return -1;
  static const stoke_plugin_v1 p = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "scale", "", reg_scale};
  stoke_err *e = stoke_registry_add_plugin(reg, &p, "side_test.c");
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  return 0;
}

/* x -> scale(w1) -> relu -> scale(w2) -> scale(w1, tied) -> scale(w3) -> fc -> loss */
static stoke_graph *chain(void) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F64, STOKE_NHWC, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, w[3], h[5], fw, fb, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {N, C}}, STOKE_F64, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {N}}, STOKE_I32, &y));
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i + 1);
    OK(b.param(g, name, &(stoke_shape){1, {C}}, (stoke_init_v1){STOKE_INIT_UNIFORM, 0.5, 1.5}, &w[i]));
  }
  OK(b.node(g, "scale", "s1", (int[]){x, w[0]}, 2, "", &h[0], 1));
  OK(b.node(g, STOKE_OP_RELU, "relu", &h[0], 1, "", &h[1], 1));
  OK(b.node(g, "scale", "s2", (int[]){h[1], w[1]}, 2, "", &h[2], 1));
  OK(b.node(g, "scale", "s3", (int[]){h[2], w[0]}, 2, "", &h[3], 1));
  OK(b.node(g, "scale", "s4", (int[]){h[3], w[2]}, 2, "", &h[4], 1));
  OK(b.param(g, "fc.weight", &(stoke_shape){2, {CLASSES, C}}, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &fw));
  OK(b.param(g, "fc.bias", &(stoke_shape){1, {CLASSES}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &fb));
  OK(b.node(g, STOKE_OP_LINEAR, "fc", (int[]){h[4], fw, fb}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  return g;
}

static stoke_plan *compile(stoke_graph *g, int lag) {
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .training = 1,
                       .wgrad_stream = lag};
  stoke_plan *p;
  OK(stoke_compile(g, &o, &p));
  return p;
}

/* The index of node `name`'s backward node. */
static int bwd_node(const stoke_graph *g, const char *name) {
  for (int i = g->n_fwd; i < g->n_nodes; i++)
    if (g->nodes[i].pass == STOKE_BWD && !strcmp(g->nodes[g->nodes[i].fwd].n.name, name)) return i;
  fail_msg("no backward node of %s", name);
  return -1;
}

/* Each side node's reads live until its join; nothing live then shares
 * their memory. */
static void check_liveness(const stoke_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const stoke_gnode *n = &g->nodes[i];
    if (!n->side) continue;
    int reads[STOKE_MAX_IO * 2], nr = 0;
    for (int k = 0; k < n->n_in; k++)
      if (n->type->bwd_needs & STOKE_BWD_NEEDS_INPUT(k)) reads[nr++] = n->in[k];
    if (n->dout[0] >= 0) reads[nr++] = n->dout[0];
    for (int r = 0; r < nr; r++) {
      const stoke_value *v = &g->values[reads[r]];
      if (v->buffer != STOKE_BUF_ARENA) continue;
      int root = v->alias >= 0 ? stoke_alias_root(g, reads[r], NULL) : reads[r];
      const stoke_value *rv = &g->values[root];
      if (rv->last < n->side_join - 1)
        fail_msg("%s's side work reads %s (live until %d) until node %d", n->n.name, v->name, rv->last,
                 n->side_join - 1);
      for (int u = 0; u < g->n_values; u++) {
        const stoke_value *o = &g->values[u];
        if (u == root || o->buffer != STOKE_BUF_ARENA || o->alias >= 0) continue;
        int written = o->first > i && o->first < n->side_join; /* while the side work may still read */
        int meets = o->offset < v->offset + v->bytes && v->offset < o->offset + o->bytes;
        if (written && meets)
          fail_msg("%s (written at %d) is placed over %s, which %s's side work reads until %d", o->name, o->first,
                   v->name, n->n.name, n->side_join - 1);
      }
    }
  }
}

static void test_side_joins(void **state) {
  stoke_graph *g = chain();
  stoke_plan *p = compile(g, 3);
  assert_int_equal(p->n_side, 4);
  int b1 = bwd_node(g, "s1"), b2 = bwd_node(g, "s2"), b3 = bwd_node(g, "s3"), b4 = bwd_node(g, "s4"),
      bf = bwd_node(g, "fc");
  assert_false(g->nodes[bf].side); /* the cpu linear's kernel has no STOKE_KCAP_SIDE_GRADS */
  assert_true(b4 < b3 && b3 < b2 && b2 < b1);
  /* lag 3: s4's third side node after it is s1's; s3 (w1's second user in
   * the forward, its gradient written first) waits before s1, which adds
   * into w1's gradient; s2 and s1 have none left: the backward's end */
  assert_int_equal(g->nodes[b4].side, 3);
  assert_int_equal(g->nodes[b4].side_join, b1);
  assert_int_equal(g->nodes[b3].side_join, b1);
  assert_int_equal(g->nodes[b2].side_join, g->n_nodes);
  assert_int_equal(g->nodes[b1].side_join, g->n_nodes);
  check_liveness(g);
  cpu_expect_report(p, "weight gradients: 4 backward nodes may compute theirs on a second stream (wgrad_stream = 3)",
                    "which nodes use the side stream");
  stoke_plan_free(p);
  stoke_graph_free(g);
  /* lag 1: each waits before the next side node */
  g = chain();
  p = compile(g, 1);
  b1 = bwd_node(g, "s1"), b2 = bwd_node(g, "s2"), b3 = bwd_node(g, "s3"), b4 = bwd_node(g, "s4");
  assert_int_equal(g->nodes[b4].side_join, b3);
  assert_int_equal(g->nodes[b3].side_join, b2);
  assert_int_equal(g->nodes[b2].side_join, b1);
  assert_int_equal(g->nodes[b1].side_join, g->n_nodes);
  check_liveness(g);
  stoke_plan_free(p);
  stoke_graph_free(g);
  /* off: no side node */
  g = chain();
  p = compile(g, 0);
  assert_int_equal(p->n_side, 0);
  for (int i = 0; i < g->n_nodes; i++) assert_false(g->nodes[i].side || g->nodes[i].side_join);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

/* The same step with and without the key: the same loss and gradients, bit
 * for bit, and those match central differences. */
static void test_side_same_step(void **state) {
  stoke_graph *g[2] = {chain(), chain()};
  stoke_plan *p[2] = {compile(g[0], 0), compile(g[1], 2)};
  stoke_exec *x[2];
  double loss[2];
  for (int i = 0; i < 2; i++) {
    OK(stoke_exec_new(p[i], cpu, cpu_self, seed, &x[i]));
    cpu_random_batch(x[i], seed, N * C, N, CLASSES);
    *(double *)stoke_exec_tensor(x[i], g[i]->seed).data = 1.0;
    double *grads = stoke_exec_buffer(x[i], STOKE_BUF_GRADS);
    for (size_t k = 0; k < p[i]->bytes[STOKE_BUF_GRADS] / sizeof(double); k++) grads[k] = NAN;
    loss[i] = cpu_loss(x[i]);
  }
  assert_true(isfinite(loss[0]) && loss[0] == loss[1]);
  assert_int_equal(p[0]->bytes[STOKE_BUF_GRADS], p[1]->bytes[STOKE_BUF_GRADS]);
  assert_memory_equal(stoke_exec_buffer(x[0], STOKE_BUF_GRADS), stoke_exec_buffer(x[1], STOKE_BUF_GRADS),
                      p[0]->bytes[STOKE_BUF_GRADS]);
  int compared;
  double worst = cpu_check_gradients(x[1], 1e-6, &compared);
  print_message("loss %.17g; %d gradients against central differences, worst relative error %.3g\n", loss[1],
                compared, worst);
  assert_int_equal(compared, 3 * C + CLASSES * C + CLASSES);
  for (int i = 0; i < 2; i++) {
    stoke_exec_free(x[i]);
    stoke_plan_free(p[i]);
    stoke_graph_free(g[i]);
  }
}

/* The cpu backend with a second stream and events that log (no device: its
 * kernels still run in order when called). */
static int main_stream, side_stream_id;
static void *rec_default_stream(void *self) { return &main_stream; }
static stoke_err *rec_stream_create(void *self, void **s) {
  *s = &side_stream_id;
  return NULL;
}
static void rec_stream_destroy(void *self, void *s) {}
static stoke_err *rec_record(void *self, void *t, void *stream) {
  proto_add('R', t, stream, -1);
  return NULL;
}
static stoke_err *rec_wait(void *self, void *stream, void *t) {
  proto_add('W', t, stream, -1);
  return NULL;
}

/* Where in the log: the first entry at or after `from` matching. */
static int find(int from, char what, const void *event, const void *stream, int node) {
  for (int k = from; k < n_proto; k++)
    if (proto[k].what == what && (!event || proto[k].event == event) && (!stream || proto[k].stream == stream) &&
        (node < 0 || proto[k].node == node))
      return k;
  return -1;
}

static void test_side_protocol(void **state) {
  stoke_backend_v1 rec = *cpu;
  rec.default_stream = rec_default_stream;
  rec.stream_create = rec_stream_create;
  rec.stream_destroy = rec_stream_destroy;
  rec.timer_record = rec_record;
  rec.stream_wait = rec_wait;
  for (int lag = 1; lag <= 3; lag += 2) {
    stoke_graph *g = chain();
    stoke_plan *p = compile(g, lag);
    stoke_exec *x;
    OK(stoke_exec_new(p, &rec, cpu_self, seed, &x));
    cpu_random_batch(x, seed, N * C, N, CLASSES);
    *(double *)stoke_exec_tensor(x, g->seed).data = 1.0;
    n_proto = 0;
    logging = 1;
    OK(stoke_exec_forward_backward(x, 1, 7));
    logging = 0;
    const char *names[] = {"s1", "s2", "s3", "s4"};
    int waited = 0;
    for (int s = 0; s < 4; s++) {
      int i = bwd_node(g, names[s]), join = g->nodes[i].side_join;
      int k = find(0, 'K', NULL, NULL, s + 1);
      if (k < 0) fail_msg("lag %d: %s's backward kernel did not run", lag, names[s]);
      if (proto[k].stream != &side_stream_id || !proto[k].event)
        fail_msg("lag %d: %s's backward kernel got no side stream or no workspace of its own", lag, names[s]);
      /* before it: the fork recorded on the compute stream, the side stream waiting for it */
      if (k < 2 || proto[k - 2].what != 'R' || proto[k - 2].stream != &main_stream || proto[k - 1].what != 'W' ||
          proto[k - 1].stream != &side_stream_id || proto[k - 1].event != proto[k - 2].event)
        fail_msg("lag %d: %s's side work does not start after the compute stream's work", lag, names[s]);
      /* after it: its end recorded on the side stream, then the compute stream waits for that */
      if (k + 1 >= n_proto || proto[k + 1].what != 'R' || proto[k + 1].stream != &side_stream_id)
        fail_msg("lag %d: %s's side work's end is not recorded on the side stream", lag, names[s]);
      int w = find(k + 2, 'W', proto[k + 1].event, &main_stream, -1);
      if (w < 0) fail_msg("lag %d: the compute stream never waits for %s's side work", lag, names[s]);
      waited++;
      /* the wait comes before the join node when that is a scale's backward */
      for (int t = 0; t < 4; t++)
        if (bwd_node(g, names[t]) == join) {
          int kj = find(0, 'K', NULL, NULL, t + 1);
          if (!(w < kj))
            fail_msg("lag %d: %s's side work is waited for after its join node (%s's backward) ran", lag, names[s],
                     names[t]);
        }
    }
    assert_int_equal(waited, 4);
    stoke_exec_free(x);
    stoke_plan_free(p);
    stoke_graph_free(g);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_side_joins),
      cmocka_unit_test(test_side_same_step),
      cmocka_unit_test(test_side_protocol),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
