/* tests/unit/recompute_test.c: activation recomputation (run.recompute) on
 * the CPU: the mlp, a ResNet and the GPT model trained two steps of two
 * micro-batches (gradient accumulation, an SGD update between) with and
 * without recomputation give the same loss, gradients, parameters and
 * batch-norm running statistics bit for bit, in f64 and f32, with the
 * fusion passes on and off; a dropout mask is drawn again the same; the
 * memory plan keeps no two live buffers in one place; patterns select whole
 * modules, and auto stops once the plan fits its budget. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/dist.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/run.h"
#include "tests/common/cpu_fixture.h"

static int setup(void **state) {
  if (cpu_fixture_setup("recompute_test")) return -1;
  static const char *models[] = {"models/mlp/libstoke_mlp.so", "models/resnet/libstoke_resnet.so",
                                 "models/gpt/libstoke_gpt.so"};
  for (int i = 0; i < 3; i++) {
    stoke_err *e = stoke_registry_load(reg, models[i]);
    if (e) {
      print_error("%s\n", e->msg);
      stoke_err_free(e);
      return -1;
    }
  }
  return 0;
}

/* A model's graph with its loss, as the run builds it: `model` from its
 * [model] keys `ini`, on a batch of n samples of `sample` (f32/f64 values)
 * or, with lm, n token windows of length sample.d[0] + 1 over `classes`
 * token ids. */
typedef struct spec {
  const char *label, *model, *ini;
  stoke_shape sample;
  int64_t n, classes;
  int lm;
} spec;

static stoke_graph *build(const spec *s, stoke_dtype dt) {
  const stoke_model_v1 *m = stoke_find_model(reg, s->model);
  assert_non_null(m);
  stoke_cfg *cfg = stoke_cfg_new();
  OK(stoke_declare_core_keys(cfg));
  OK(stoke_cfg_declare(cfg, "model", NULL, m->keys, m->n_keys));
  char text[512];
  snprintf(text, sizeof text, "[model]\nname = %s\n%s", s->model, s->ini);
  OK(stoke_cfg_load_string(cfg, "test.ini", text));
  OK(stoke_cfg_validate(cfg));
  stoke_graph *g;
  OK(stoke_graph_new(reg, dt, STOKE_NCHW, &g));
  stoke_shape xs = {s->sample.ndim + 1, {s->n}};
  for (int i = 0; i < s->sample.ndim; i++) xs.d[i + 1] = s->sample.d[i] + (s->lm ? 1 : 0);
  int x, y = -1, targets = -1, logits;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &xs, s->lm ? STOKE_I32 : dt, &x));
  if (s->lm) OK(stoke_lm_inputs(g, x, &x, &targets));
  else OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {s->n}}, STOKE_I32, &y));
  stoke_builder_v1 b = stoke_graph_builder(g);
  OK(m->build(cfg, "model", &b, x, s->classes, &logits));
  OK(stoke_graph_loss_on(g, logits, s->lm ? targets : y, ""));
  stoke_cfg_free(cfg);
  return g;
}

static stoke_plan *compile(stoke_graph *g, int fuse, const char *recompute, double budget) {
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .optimizer = "sgd",
                       .training = 1, .fuse = fuse, .recompute = recompute, .memory_budget = budget};
  stoke_plan *p;
  OK(stoke_compile(g, &o, &p));
  return p;
}

/* No two values of one buffer share bytes while both are live (aliases of
 * one root share them by design); returns the pairs checked. */
static int check_no_overlap(const stoke_graph *g) {
  int checked = 0;
  for (int i = 0; i < g->n_values; i++)
    for (int j = i + 1; j < g->n_values; j++) {
      const stoke_value *a = &g->values[i], *b = &g->values[j];
      if (a->buffer != STOKE_BUF_ARENA || b->buffer != STOKE_BUF_ARENA) continue;
      if (stoke_alias_root(g, i, NULL) == stoke_alias_root(g, j, NULL)) continue;
      int live = !(a->last < b->first || b->last < a->first);
      int overlap = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
      if (live && overlap)
        fail_msg("'%s' [%zu, +%zu) live %d..%d overlaps '%s' [%zu, +%zu) live %d..%d", a->name, a->offset, a->bytes,
                 a->first, a->last, b->name, b->offset, b->bytes, b->first, b->last);
      checked++;
    }
  return checked;
}

/* Micro-batch `micro` of step `step`: random samples (or tokens), labels. */
static void fill_batch(stoke_exec *x, const spec *s, stoke_dtype dt, int step, int micro) {
  const stoke_graph *g = stoke_exec_plan(x)->g;
  stoke_rng r = stoke_rng_seed(stoke_hash3(seed, (uint64_t)step, (uint64_t)micro));
  int64_t numel = stoke_numel(&g->values[g->input].shape);
  void *in = stoke_exec_input(x);
  for (int64_t i = 0; i < numel; i++) {
    if (s->lm) ((int32_t *)in)[i] = (int32_t)stoke_rng_below(&r, (uint64_t)s->classes);
    else if (dt == STOKE_F64) ((double *)in)[i] = stoke_rng_normal(&r);
    else ((float *)in)[i] = (float)stoke_rng_normal(&r);
  }
  if (!s->lm)
    for (int64_t i = 0; i < s->n; i++)
      ((int32_t *)stoke_exec_labels(x))[i] = (int32_t)stoke_rng_below(&r, (uint64_t)s->classes);
}

/* Two steps of two micro-batches; the buffers after them, and the loss. */
typedef struct outcome {
  stoke_exec *x;
  double loss;
} outcome;

static outcome train(stoke_plan *p, const spec *s, stoke_dtype dt) {
  outcome o;
  OK(stoke_exec_new(p, cpu, cpu_self, seed, &o.x));
  stoke_opt_args_v1 opt = {.lr = 0.05, .momentum = 0.9, .grad_scale = 0.5};
  for (int step = 1; step <= 2; step++)
    for (int micro = 0; micro < 2; micro++) {
      fill_batch(o.x, s, dt, step, micro);
      opt.step = step;
      OK(stoke_exec_micro(o.x, micro == 0, micro == 1, stoke_hash3(seed, (uint64_t)step, 11), &opt));
    }
  OK(stoke_exec_read_loss(o.x, &o.loss));
  return o;
}

static void same_buffer(stoke_exec *a, stoke_exec *b, stoke_buffer_id id, const char *what, const char *label) {
  size_t n = stoke_exec_plan(a)->bytes[id];
  assert_int_equal(n, stoke_exec_plan(b)->bytes[id]);
  if (n && memcmp(stoke_exec_buffer(a, id), stoke_exec_buffer(b, id), n))
    fail_msg("%s: %s differ with recomputation (seed %llu)", label, what, (unsigned long long)seed);
}

/* The model trained with and without `recompute`: equal bit for bit. */
static void check_equal(const spec *s, stoke_dtype dt, int fuse, const char *recompute, double budget) {
  stoke_graph *ga = build(s, dt), *gb = build(s, dt);
  stoke_plan *pa = compile(ga, fuse, "none", 0), *pb = compile(gb, fuse, recompute, budget);
  char label[160];
  snprintf(label, sizeof label, "%s %s fuse=%d recompute=%s", s->label, stoke_dtype_name(dt), fuse, recompute);
  assert_null(pa->recompute_report);
  assert_non_null(pb->recompute_report);
  print_message("%s: %d nodes re-run in %d segments, arena %zu -> %zu bytes (%zu without), +%.4g FLOPs\n", label,
                pb->n_recomputed, pb->n_recompute_segments, pa->bytes[STOKE_BUF_ARENA], pb->bytes[STOKE_BUF_ARENA],
                pb->arena_without_recompute, pb->recompute_flops);
  assert_true(pb->n_recomputed > 0);
  assert_true(pb->recompute_flops > 0);
  assert_int_equal(pb->arena_without_recompute, pa->bytes[STOKE_BUF_ARENA]);
  assert_true(pb->bytes[STOKE_BUF_ARENA] < pa->bytes[STOKE_BUF_ARENA]);
  /* MFU counts the model's FLOPs: recomputation adds none to train_flops */
  assert_true(pb->train_flops == pa->train_flops);
  assert_int_equal(gb->n_nodes, ga->n_nodes + pb->n_recomputed);
  assert_true(check_no_overlap(gb) > 100);
  outcome a = train(pa, s, dt), b = train(pb, s, dt);
  if (memcmp(&a.loss, &b.loss, sizeof a.loss))
    fail_msg("%s: loss %.17g without, %.17g with recomputation", label, a.loss, b.loss);
  same_buffer(a.x, b.x, STOKE_BUF_GRADS, "gradients", label);
  same_buffer(a.x, b.x, STOKE_BUF_PARAMS, "parameters after two updates", label);
  same_buffer(a.x, b.x, STOKE_BUF_STATE, "running statistics", label);
  stoke_exec_free(a.x);
  stoke_exec_free(b.x);
  stoke_plan_free(pa);
  stoke_plan_free(pb);
  stoke_graph_free(ga);
  stoke_graph_free(gb);
}

static const spec mlp = {"mlp", "mlp", "hidden = 48, 40, 32\nactivation = gelu\napproximate = tanh\n", {1, {24}}, 16, 10, 0};
static const spec resnet = {"resnet18 (cifar stem, width 8)", "resnet", "depth = 18\nstem = cifar\nwidth = 8\n",
                            {3, {3, 8, 8}}, 4, 10, 0};
static const spec resnet50 = {"resnet50 (width 4)", "resnet", "depth = 50\nwidth = 4\n", {3, {3, 32, 32}}, 2, 10, 0};
static const spec gpt = {"gpt (2 layers, d 32)", "gpt", "n_layer = 2\nn_head = 2\nn_embd = 32\ncontext = 16\n",
                         {1, {16}}, 3, 64, 1};

static const spec gpt4 = {"gpt (4 layers, d 64, context 64)", "gpt", "n_layer = 4\nn_head = 2\nn_embd = 64\ncontext = 64\n",
                          {1, {64}}, 8, 256, 1};

static void test_mlp(void **state) {
  for (int dt = 0; dt < 2; dt++)
    for (int fuse = 0; fuse < 2; fuse++) {
      /* fused: the activations are the linears' epilogues, named after them */
      check_equal(&mlp, dt ? STOKE_F32 : STOKE_F64, fuse, fuse ? "layers.0, layers.2" : "layers.1, layers.3", 0);
      check_equal(&mlp, dt ? STOKE_F32 : STOKE_F64, fuse, "layers.*", 0);
    }
}

static void test_resnet(void **state) {
  for (int dt = 0; dt < 2; dt++)
    for (int fuse = 0; fuse < 2; fuse++) {
      stoke_dtype d = dt ? STOKE_F32 : STOKE_F64;
      check_equal(&resnet, d, fuse, "layer1.*, layer3.*", 0);
      /* the first batch norm and ReLU of every block (fused: one bn_relu node) */
      check_equal(&resnet, d, fuse, fuse ? "layer*.*.bn1" : "layer*.*.bn1, layer*.*.relu1", 0);
    }
  check_equal(&resnet50, STOKE_F32, 1, "layer2.*, layer4.*", 0);
}

static void test_gpt(void **state) {
  for (int dt = 0; dt < 2; dt++) {
    stoke_dtype d = dt ? STOKE_F32 : STOKE_F64;
    check_equal(&gpt, d, 0, "h.*.attn", 0);
    check_equal(&gpt, d, 0, "h.*", 0);
    check_equal(&gpt, d, 0, "h.*.mlp.gelu, h.*.ln_1", 0);
    /* fused: c_fc's GELU in its product, c_proj's biases in add_bias_layer_norm (core/fuse_act.c) */
    check_equal(&gpt, d, 1, "h.*", 0);
    check_equal(&gpt, d, 1, "h.*.ln_1, h.*.attn", 0);
  }
}

/* auto: a budget between the plan with everything kept and the least it
 * can reach; it stops once the plan fits, and gradients stay equal. */
static void check_auto(const spec *s, stoke_dtype dt, int fuse) {
  stoke_graph *g = build(s, dt);
  stoke_plan *p = compile(g, fuse, "none", 0);
  double fixed = stoke_plan_device_bytes(p) - (double)p->bytes[STOKE_BUF_ARENA];
  double full = stoke_plan_device_bytes(p);
  stoke_plan_free(p);
  stoke_graph_free(g);
  /* no budget, or one the plan fits: nothing recomputed */
  g = build(s, dt);
  p = compile(g, fuse, "auto", full + 1);
  assert_int_equal(p->n_recomputed, 0);
  assert_non_null(strstr(p->recompute_report, "fits the budget"));
  stoke_plan_free(p);
  stoke_graph_free(g);
  /* the least: a budget of nothing */
  g = build(s, dt);
  p = compile(g, fuse, "auto", 1);
  double least = stoke_plan_device_bytes(p);
  print_message("%s auto: arena %.0f bytes kept all, %.0f at the least\n", s->label, full - fixed, least - fixed);
  assert_true(least < full);
  stoke_plan_free(p);
  stoke_graph_free(g);
  /* halfway: fits, and recomputes less than the least does */
  double budget = (least + full) / 2;
  g = build(s, dt);
  p = compile(g, fuse, "auto", budget);
  assert_true(stoke_plan_device_bytes(p) <= budget);
  assert_true(p->n_recomputed > 0);
  stoke_plan_free(p);
  stoke_graph_free(g);
  check_equal(s, dt, fuse, "auto", budget);
}

/* auto's least is no more than recomputing every block (a
 * torch.utils.checkpoint on each): where node by node does not reach the
 * budget, whole blocks do; gradients stay equal there too. */
static void check_auto_least(const spec *s, stoke_dtype dt, int fuse, const char *every_block) {
  stoke_graph *g = build(s, dt);
  stoke_plan *p = compile(g, fuse, every_block, 0);
  double blocks = stoke_plan_device_bytes(p);
  stoke_plan_free(p);
  stoke_graph_free(g);
  g = build(s, dt);
  p = compile(g, fuse, "auto", 1);
  double least = stoke_plan_device_bytes(p);
  print_message("%s: auto's least %.0f bytes, every block (%s) %.0f\n", s->label, least, every_block, blocks);
  assert_true(least <= blocks);
  stoke_plan_free(p);
  stoke_graph_free(g);
  check_equal(s, dt, fuse, "auto", 1);
}

static void test_auto(void **state) {
  check_auto(&mlp, STOKE_F64, 0);
  check_auto(&resnet, STOKE_F32, 1);
  check_auto(&gpt, STOKE_F32, 0);
  check_auto_least(&gpt, STOKE_F32, 0, "h.*");
  check_auto_least(&gpt4, STOKE_F32, 0, "h.*");
  check_auto_least(&resnet, STOKE_F32, 1, "layer*.*");
}

/* Data parallel with recomputation: the gradient buckets are planned from
 * the backward nodes that write each parameter's gradient (core/dp.c). With
 * recomputation every gradient is still written by a backward node (the
 * forward copies write none), in the same order as without, so the buckets
 * come out the same and launch in the same order. */
static int by_ready(const void *a, const void *b) {
  const stoke_dist_grad *x = a, *y = b;
  return x->ready != y->ready ? (x->ready < y->ready ? -1 : 1) : (x->offset < y->offset ? -1 : 1);
}

static void check_buckets(const spec *s, int fuse, const char *recompute, double budget) {
  stoke_graph *ga = build(s, STOKE_F32), *gb = build(s, STOKE_F32);
  stoke_plan *pa = compile(ga, fuse, "none", 0), *pb = compile(gb, fuse, recompute, budget);
  assert_true(pb->n_recomputed > 0);
  stoke_dist_grad *a = malloc(sizeof *a * (size_t)ga->n_values), *b = malloc(sizeof *b * (size_t)gb->n_values);
  int na = stoke_graph_param_grads(ga, a), nb = stoke_graph_param_grads(gb, b);
  assert_int_equal(na, nb);
  assert_true(na > 0);
  for (int k = 0; k < nb; k++) {
    assert_true(a[k].offset == b[k].offset && a[k].bytes == b[k].bytes);
    /* written last by a backward node that takes it as its input gradient */
    assert_true(b[k].ready >= gb->n_fwd && gb->nodes[b[k].ready].pass == STOKE_BWD);
    assert_false(gb->nodes[b[k].ready].recompute);
  }
  qsort(a, (size_t)na, sizeof *a, by_ready);
  qsort(b, (size_t)nb, sizeof *b, by_ready);
  for (int k = 0; k < nb; k++)
    if (a[k].offset != b[k].offset)
      fail_msg("%s recompute=%s: gradient %d of %d becomes final at another place in backward's order", s->label,
               recompute, k, nb);
  stoke_dist_bucket ba[256], bb[256];
  size_t total = pa->bytes[STOKE_BUF_GRADS];
  assert_true(total == pb->bytes[STOKE_BUF_GRADS]);
  int ka = stoke_dist_plan_buckets(a, na, total, total / 16 + 1, total / 4 + 1, ga->n_nodes - 1, ba, 256);
  int kb = stoke_dist_plan_buckets(b, nb, total, total / 16 + 1, total / 4 + 1, gb->n_nodes - 1, bb, 256);
  assert_int_equal(ka, kb);
  assert_true(kb > 1);
  for (int k = 0; k < kb; k++) assert_true(ba[k].offset == bb[k].offset && ba[k].bytes == bb[k].bytes);
  print_message("%s recompute=%s: %d gradients, %d buckets in the same order as without\n", s->label, recompute, nb,
                kb);
  free(a), free(b);
  stoke_plan_free(pa);
  stoke_plan_free(pb);
  stoke_graph_free(ga);
  stoke_graph_free(gb);
}

static void test_buckets(void **state) {
  check_buckets(&gpt4, 0, "h.*", 0);
  check_buckets(&gpt4, 0, "auto", 1);
  check_buckets(&resnet, 1, "layer*.*", 0);
  check_buckets(&mlp, 1, "layers.*", 0);
}

/* x -> linear -> dropout(0.3) -> relu -> linear: the recomputed dropout
 * draws the forward's mask again. */
static void test_dropout(void **state) {
  stoke_graph *gs[2];
  stoke_plan *ps[2];
  outcome o[2];
  spec s = {"dropout", NULL, NULL, {1, {12}}, 5, 4, 0};
  for (int k = 0; k < 2; k++) {
    stoke_graph *g;
    OK(stoke_graph_new(reg, STOKE_F64, STOKE_LAYOUT_ANY, &g));
    stoke_builder_v1 b = stoke_graph_builder(g);
    int x, y, w1, b1, w2, b2, h, d, r, logits;
    OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {5, 12}}, STOKE_F64, &x));
    OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {5}}, STOKE_I32, &y));
    stoke_init_v1 init = {STOKE_INIT_NORMAL, 0, 0.3};
    OK(b.param(g, "w1", &(stoke_shape){2, {16, 12}}, init, &w1));
    OK(b.param(g, "b1", &(stoke_shape){1, {16}}, init, &b1));
    OK(b.param(g, "w2", &(stoke_shape){2, {4, 16}}, init, &w2));
    OK(b.param(g, "b2", &(stoke_shape){1, {4}}, init, &b2));
    OK(b.node(g, STOKE_OP_LINEAR, "fc1", (int[]){x, w1, b1}, 3, "", &h, 1));
    OK(b.node(g, STOKE_OP_DROPOUT, "drop", &h, 1, "p=0.3", &d, 1));
    OK(b.node(g, STOKE_OP_RELU, "act", &d, 1, "", &r, 1));
    OK(b.node(g, STOKE_OP_LINEAR, "fc2", (int[]){r, w2, b2}, 3, "", &logits, 1));
    OK(stoke_graph_loss(g, logits, ""));
    gs[k] = g;
    ps[k] = compile(g, 0, k ? "drop, act" : "none", 0);
    o[k] = train(ps[k], &s, STOKE_F64);
  }
  assert_int_equal(ps[1]->n_recomputed, 2);
  assert_memory_equal(&o[0].loss, &o[1].loss, sizeof o[0].loss);
  same_buffer(o[0].x, o[1].x, STOKE_BUF_GRADS, "gradients", "dropout");
  same_buffer(o[0].x, o[1].x, STOKE_BUF_PARAMS, "parameters", "dropout");
  for (int k = 0; k < 2; k++) {
    stoke_exec_free(o[k].x);
    stoke_plan_free(ps[k]);
    stoke_graph_free(gs[k]);
  }
}

/* A pattern that matches nothing is an error naming it; the report names
 * the segments. */
/* The plan report as text (malloc'd), its recompute lines printed. */
static char *report_text(const stoke_plan *p) {
  char *text = cpu_plan_report(p);
  print_message("%s", strstr(text, "recompute ("));
  return text;
}

static void test_patterns(void **state) {
  stoke_graph *g = build(&gpt, STOKE_F32);
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .optimizer = "sgd",
                       .training = 1, .recompute = "h.*.attn, h.*.nope"};
  stoke_plan *p = NULL;
  stoke_err *e = stoke_compile(g, &o, &p);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "'h.*.nope' matches no forward node"));
  stoke_err_free(e);
  stoke_graph_free(g);
  g = build(&gpt, STOKE_F32);
  p = compile(g, 0, "h.*.attn", 0);
  char *text = report_text(p);
  /* one segment per block's attention module */
  assert_int_equal(p->n_recompute_segments, 2);
  assert_non_null(strstr(text, "segment transformer.h.0.attn"));
  assert_non_null(strstr(text, "segment transformer.h.1.attn"));
  assert_non_null(strstr(text, "recompute"));
  free(text);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

/* A pattern that costs memory is said so: a ReLU alone, whose input the
 * backward keeps anyway (as layers.* on examples/mlp.ini with cuBLASLt,
 * where only the last ReLU is a node of its own: 15.6 MiB more). */
static void test_pattern_costs_memory(void **state) {
  static const spec relu_mlp = {"mlp (relu)", "mlp", "hidden = 48, 48, 48, 48\n", {1, {24}}, 16, 10, 0};
  stoke_graph *g = build(&relu_mlp, STOKE_F32);
  stoke_plan *p = compile(g, 0, "layers.7", 0);
  char *text = report_text(p);
  assert_true(p->bytes[STOKE_BUF_ARENA] > p->arena_without_recompute);
  assert_non_null(strstr(text, "of memory instead of saving it"));
  free(text);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pattern_costs_memory),
      cmocka_unit_test(test_mlp),     cmocka_unit_test(test_resnet),  cmocka_unit_test(test_gpt),
      cmocka_unit_test(test_auto),    cmocka_unit_test(test_dropout), cmocka_unit_test(test_patterns),
      cmocka_unit_test(test_buckets),
  };
  return cmocka_run_group_tests(tests, setup, cpu_fixture_teardown);
}
