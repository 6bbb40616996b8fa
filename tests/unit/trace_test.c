/* tests/unit/trace_test.c: run.trace's window (parsing, which steps are
 * traced, when the loader's work starts being recorded) and the GPU lane
 * of a traced step as written to trace.json: one slice per plan node named
 * as in the plan, with op, pass and engine, laid end to end up to the
 * step's end; under cuda_graph the same slices, and the step and the GPU
 * process say that traced steps ran eagerly, outside the graph. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/ops.h"
#include "stoke/trace.h"
#include "tests/common/cpu_fixture.h"

static int setup(void **state) { return cpu_fixture_setup("trace_test"); }

static void test_window(void **state) {
  int64_t a, b;
  OK(stoke_trace_parse("20-24", &a, &b));
  assert_int_equal(a, 20);
  assert_int_equal(b, 24);
  OK(stoke_trace_parse("7", &a, &b));
  assert_true(a == 7 && b == 7);
  OK(stoke_trace_parse("", &a, &b));
  assert_int_equal(a, 0); /* off */
  const char *bad[] = {"9-3", "0", "0-4", "x", "3-", "4-5x"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    stoke_err *e = stoke_trace_parse(bad[i], &a, &b);
    assert_non_null(e);
    char want[64];
    snprintf(want, sizeof want, "[run] trace = '%s': give the steps", bad[i]);
    if (!strstr(e->msg, want)) fail_msg("'%s': %s", bad[i], e->msg);
    stoke_err_free(e);
  }
  stoke_trace *t;
  OK(stoke_trace_new("/dev/null", 20, 24, 0, &t));
  assert_false(stoke_trace_has(NULL, 20));
  assert_false(stoke_trace_has(t, 19));
  assert_true(stoke_trace_has(t, 20) && stoke_trace_has(t, 24));
  assert_false(stoke_trace_has(t, 25));
  /* the loader is recorded from `prefetch` + 1 batches before the window to its end */
  stoke_trace_lead(t, 15, 3);
  assert_false(stoke_trace_recording(t));
  stoke_trace_lead(t, 16, 3);
  assert_true(stoke_trace_recording(t));
  stoke_trace_lead(t, 24, 0);
  assert_true(stoke_trace_recording(t));
  stoke_trace_lead(t, 25, 0);
  assert_false(stoke_trace_recording(t));
  stoke_trace_free(t);
}

/* x -> fc1 -> relu -> fc2 -> loss, compiled with sgd on the cpu engine. */
static stoke_plan *small_plan(stoke_graph **gp) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, STOKE_F32, STOKE_LAYOUT_ANY, &g));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int x, y, w1, b1, w2, b2, a1, h, logits;
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -0.5, 0.5};
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {4, 3}}, STOKE_F32, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {4}}, STOKE_I32, &y));
  OK(b.param(g, "fc1.weight", &(stoke_shape){2, {5, 3}}, init, &w1));
  OK(b.param(g, "fc1.bias", &(stoke_shape){1, {5}}, init, &b1));
  OK(b.param(g, "fc2.weight", &(stoke_shape){2, {2, 5}}, init, &w2));
  OK(b.param(g, "fc2.bias", &(stoke_shape){1, {2}}, init, &b2));
  OK(b.node(g, STOKE_OP_LINEAR, "fc1", (int[]){x, w1, b1}, 3, "", &a1, 1));
  OK(b.node(g, STOKE_OP_RELU, "act1", &a1, 1, "", &h, 1));
  OK(b.node(g, STOKE_OP_LINEAR, "fc2", (int[]){h, w2, b2}, 3, "", &logits, 1));
  OK(stoke_graph_loss(g, logits, ""));
  *gp = g;
  return cpu_compile(g, "sgd", 0);
}

/* The value of "key": "..." or "key": number in `line`, into out. */
static int field(const char *line, const char *key, char *out, size_t cap) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = strstr(line, pat);
  if (!p) return 0;
  p += strlen(pat);
  size_t n = 0;
  if (*p == '"') {
    for (p++; *p && *p != '"' && n + 1 < cap; p++) out[n++] = *p;
  } else {
    for (; *p && *p != ',' && *p != '}' && n + 1 < cap; p++) out[n++] = *p;
  }
  out[n] = 0;
  return 1;
}

/* One traced step written and read back; `graphs` as the step loop passes it. */
static void check_gpu_step(int graphs) {
  stoke_graph *g;
  stoke_plan *p = small_plan(&g);
  int n = g->n_nodes + 1; /* the nodes, then the update */
  double *ms = malloc(sizeof *ms * (size_t)n), sum = 0;
  stoke_rng r = stoke_rng_seed(seed);
  for (int i = 0; i < n; i++) sum += ms[i] = 0.01 + stoke_rng_uniform(&r);
  char dir[] = "/tmp/trace_test.XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/trace.json", dir);
  stoke_trace *t;
  OK(stoke_trace_new(path, 20, 20, 0, &t));
  double end = 5e5; /* microseconds into the trace */
  stoke_trace_gpu_step(t, 20, p, ms, n, sum + 0.25, end, graphs);
  OK(stoke_trace_write(t));
  stoke_trace_free(t);

  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1024], v[256];
  int ops = 0, steps = 0, labels = 0;
  double at = end - 1e3 * sum;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "\"cat\": \"op\"")) {
      assert_true(ops < n);
      const char *want = ops < g->n_nodes ? g->nodes[ops].n.name : "optimizer + scaler";
      assert_true(field(line, "name", v, sizeof v));
      assert_string_equal(v, want);
      assert_true(field(line, "engine", v, sizeof v));
      assert_string_equal(v, "cpu");
      assert_true(field(line, "pass", v, sizeof v));
      assert_string_equal(v, ops >= g->n_nodes ? "update" : ops < g->n_fwd ? "forward" : "backward");
      assert_true(field(line, "tid", v, sizeof v));
      assert_int_equal(atoi(v), STOKE_TRACE_GPU);
      assert_true(field(line, "pid", v, sizeof v));
      assert_int_equal(atoi(v), 1); /* rank 0's GPU process */
      assert_true(field(line, "ts", v, sizeof v));
      assert_float_equal(atof(v), at, 2e-3); /* end to end, the last ending at the step's end */
      assert_true(field(line, "dur", v, sizeof v));
      assert_float_equal(atof(v), 1e3 * ms[ops], 2e-3);
      at += 1e3 * ms[ops++];
    }
    if (strstr(line, "\"cat\": \"step\"")) {
      steps++;
      assert_true(field(line, "name", v, sizeof v));
      assert_string_equal(v, "step 20");
      assert_true(field(line, "dur", v, sizeof v));
      assert_float_equal(atof(v), 1e3 * (sum + 0.25), 2e-3);
      int noted = field(line, "cuda_graph", v, sizeof v);
      assert_int_equal(noted, graphs);
      if (graphs) assert_non_null(strstr(v, "traced steps run eagerly, outside the CUDA graph"));
    }
    if (strstr(line, "process_labels") && strstr(line, "outside the CUDA graph")) labels++;
  }
  fclose(f);
  assert_int_equal(ops, n);
  assert_float_equal(at, end, 2e-3);
  assert_int_equal(steps, 1);
  assert_int_equal(labels, graphs ? 2 : 0); /* the GPU process and the trace's own label */
  remove(path);
  rmdir(dir);
  free(ms);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

static void test_eager_step(void **state) { check_gpu_step(0); }
static void test_graph_run_step(void **state) { check_gpu_step(1); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window),
      cmocka_unit_test(test_eager_step),
      cmocka_unit_test(test_graph_run_step),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
