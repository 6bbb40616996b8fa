/* tests/e2e/resnet_test.c: the resnet model plugin through the core: each
 * depth's parameter count against torchvision's, ResNet-50's forward FLOPs
 * against the hand count, torchvision's state_dict names and inits, and a
 * short CPU training run of a narrow CIFAR-stem ResNet-18 whose loss falls. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"
#include "stoke/registry.h"
#include "stoke/run.h"
#include "tests/common/expect.h"

static stoke_registry *reg;
static const stoke_model_v1 *resnet;
static char tmp[512];

static int setup(void **state) {
  stoke_err *e = stoke_registry_new(&reg);
  if (!e) e = stoke_registry_load(reg, "backends/cpu/libstoke_cpu.so");
  if (!e) e = stoke_registry_load(reg, "models/resnet/libstoke_resnet.so");
  if (e) {
    print_error("%s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  resnet = stoke_find_model(reg, "resnet");
  return resnet ? 0 : -1;
}

static int teardown(void **state) {
  stoke_registry_free(reg);
  return 0;
}

/* The model's graph on input [n, c, hw, hw] of `dt` with `model_ini` as
 * the [model] section (after "name = resnet"), as the run builds it; its
 * logits value in *logits_out. */
static stoke_graph *build_dt(const char *model_ini, int64_t n, int64_t c, int64_t hw, int64_t classes,
                             stoke_dtype dt, int *logits_out) {
  stoke_cfg *cfg = stoke_cfg_new();
  EXPECT_OK(stoke_declare_core_keys(cfg));
  EXPECT_OK(stoke_cfg_declare(cfg, "model", NULL, resnet->keys, resnet->n_keys));
  char text[512];
  snprintf(text, sizeof text, "[model]\nname = resnet\n%s", model_ini);
  EXPECT_OK(stoke_cfg_load_string(cfg, "test.ini", text));
  EXPECT_OK(stoke_cfg_validate(cfg));
  stoke_graph *g;
  EXPECT_OK(stoke_graph_new(reg, dt, STOKE_NCHW, &g));
  int x, logits;
  EXPECT_OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){4, {n, c, hw, hw}}, dt, &x));
  stoke_builder_v1 b = stoke_graph_builder(g);
  EXPECT_OK(resnet->build(cfg, "model", &b, x, classes, &logits));
  stoke_shape s = g->values[logits].shape;
  assert_int_equal(s.ndim, 2);
  assert_int_equal(s.d[0], n);
  assert_int_equal(s.d[1], classes);
  stoke_cfg_free(cfg);
  if (logits_out) *logits_out = logits;
  return g;
}

static stoke_graph *build(const char *model_ini, int64_t n, int64_t c, int64_t hw, int64_t classes) {
  return build_dt(model_ini, n, c, hw, classes, STOKE_F32, NULL);
}

/* Trained parameters (elements) and the number of parameter + state values. */
static int64_t count(const stoke_graph *g, int *n_param_values, int *n_state_values) {
  int64_t n = 0;
  *n_param_values = *n_state_values = 0;
  for (int v = 0; v < g->n_values; v++) {
    if (g->values[v].kind == STOKE_VAL_PARAM) {
      n += stoke_numel(&g->values[v].shape);
      (*n_param_values)++;
    }
    *n_state_values += g->values[v].kind == STOKE_VAL_STATE;
  }
  return n;
}

static const stoke_value *find(const stoke_graph *g, const char *name) {
  for (int v = 0; v < g->n_values; v++)
    if ((g->values[v].kind == STOKE_VAL_PARAM || g->values[v].kind == STOKE_VAL_STATE) &&
        !strcmp(g->values[v].name, name))
      return &g->values[v];
  return NULL;
}

/* torchvision's sum(p.numel() for p in model.parameters()), and its
 * state_dict without the num_batches_tracked entries: 18 and 34 have
 * 20 / 36 convs (BN each) + fc, 50 has 53. */
static void test_param_counts(void **state) {
  struct {
    const char *label, *ini;
    int64_t hw, classes, params;
    int param_values, state_values;
  } want[] = {
      {"resnet18", "depth = 18\nstem = imagenet\n", 224, 1000, 11689512, 20 + 2 * 20 + 2, 2 * 20},
      {"resnet34", "depth = 34\nstem = imagenet\n", 224, 1000, 21797672, 36 + 2 * 36 + 2, 2 * 36},
      {"resnet50", "depth = 50\n", 224, 1000, 25557032, 53 + 2 * 53 + 2, 2 * 53},
      /* CIFAR stem, 10 classes: resnet18's 11,689,512
       *   - 7x7 stem conv 3*64*49 + 3x3 stem conv 3*64*9        (-9,408 + 1,728)
       *   - fc 512*1000 + 1000 + fc 512*10 + 10                 (-513,000 + 5,130)
       * = 11,173,962 (the blocks, 11,166,976, and bn1, 128, are unchanged;
       * the max-pool has no parameters). */
      {"resnet18 cifar stem", "depth = 18\nstem = cifar\n", 32, 10, 11689512 - 9408 + 1728 - 513000 + 5130, 62, 40},
  };
  assert_int_equal(want[3].params, 11173962);
  for (int i = 0; i < 4; i++) {
    stoke_graph *g = build(want[i].ini, 2, 3, want[i].hw, want[i].classes);
    int np, ns;
    int64_t n = count(g, &np, &ns);
    print_message("%s: %lld parameters (%d tensors), %d state tensors\n", want[i].label, (long long)n, np, ns);
    assert_int_equal(n, want[i].params);
    assert_int_equal(np, want[i].param_values);
    assert_int_equal(ns, want[i].state_values);
    stoke_graph_free(g);
  }
}

/* ResNet-50 at 224x224, per image. The hand count: 4.089e9 multiply-adds
 * in the convolutions and fc (torchvision's "4.09 GFLOPS"), 2 FLOPs each,
 * = 8.18 GFLOP. stoke counts conv2d 2 per MAC, linear 2 per MAC + the bias
 * add, and also the cheap ops: batch_norm 4 per element, relu and add 1 per
 * element, max_pool 9 per output (3x3 window), global_avg_pool 1 per input
 * element. Those add under 1% (BN 0.044, relu 0.010, add 0.006 GFLOP), so the
 * whole forward must be within 2% of 8.18e9 (it is +0.76%) and the conv + fc
 * part within 0.1% of 2 x 4.089e9. */
static void test_resnet50_flops(void **state) {
  const int64_t batch = 2;
  stoke_graph *g = build("depth = 50\nstem = imagenet\nwidth = 64\n", batch, 3, 224, 1000);
  static const char *engines[] = {"cpu"};
  void *selves[] = {NULL};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves};
  stoke_plan *p;
  EXPECT_OK(stoke_compile(g, &o, &p));
  double matmul = 0, by_op[8] = {0};
  const char *ops[] = {STOKE_OP_CONV2D, STOKE_OP_LINEAR, STOKE_OP_BATCH_NORM, STOKE_OP_RELU,
                       STOKE_OP_ADD, STOKE_OP_MAX_POOL2D, STOKE_OP_GLOBAL_AVG_POOL};
  for (int i = 0; i < g->n_fwd; i++) {
    int k = 7;
    for (int j = 0; j < 7; j++)
      if (!strcmp(g->nodes[i].n.op, ops[j])) k = j;
    by_op[k] += g->nodes[i].flops / batch;
  }
  matmul = by_op[0] + by_op[1];
  double total = p->fwd_flops / batch, hand = 2 * 4.089e9;
  for (int j = 0; j < 8; j++)
    print_message("  %-16s %.4g GFLOP\n", j < 7 ? ops[j] : "other", by_op[j] / 1e9);
  print_message("resnet50 forward: %.4g GFLOP/image (conv + fc %.4g), hand count %.4g: %+.2f%%\n", total / 1e9,
                matmul / 1e9, hand / 1e9, 100 * (total / hand - 1));
  assert_true(fabs(matmul / hand - 1) < 1e-3);
  assert_true(fabs(total / hand - 1) < 0.02);
  assert_true(by_op[7] == 0);
  stoke_plan_free(p);
  stoke_graph_free(g);
}

/* A sample of torchvision.models.resnet50().state_dict() keys with shapes. */
static void test_torchvision_names(void **state) {
  stoke_graph *g = build("depth = 50\n", 2, 3, 224, 1000);
  struct {
    const char *name;
    int ndim;
    int64_t d[4];
  } keys[] = {
      {"conv1.weight", 4, {64, 3, 7, 7}},
      {"bn1.weight", 1, {64}},
      {"bn1.bias", 1, {64}},
      {"bn1.running_mean", 1, {64}},
      {"bn1.running_var", 1, {64}},
      {"layer1.0.conv1.weight", 4, {64, 64, 1, 1}},
      {"layer1.0.bn1.weight", 1, {64}},
      {"layer1.0.conv2.weight", 4, {64, 64, 3, 3}},
      {"layer1.0.conv3.weight", 4, {256, 64, 1, 1}},
      {"layer1.0.bn3.running_var", 1, {256}},
      {"layer1.0.downsample.0.weight", 4, {256, 64, 1, 1}},
      {"layer1.0.downsample.1.weight", 1, {256}},
      {"layer1.0.downsample.1.bias", 1, {256}},
      {"layer1.0.downsample.1.running_mean", 1, {256}},
      {"layer1.0.downsample.1.running_var", 1, {256}},
      {"layer1.2.conv3.weight", 4, {256, 64, 1, 1}},
      {"layer2.0.conv1.weight", 4, {128, 256, 1, 1}},
      {"layer2.0.conv2.weight", 4, {128, 128, 3, 3}},
      {"layer2.0.downsample.0.weight", 4, {512, 256, 1, 1}},
      {"layer2.3.bn2.bias", 1, {128}},
      {"layer3.5.conv3.weight", 4, {1024, 256, 1, 1}},
      {"layer3.5.bn3.running_mean", 1, {1024}},
      {"layer4.0.downsample.0.weight", 4, {2048, 1024, 1, 1}},
      {"layer4.2.conv3.weight", 4, {2048, 512, 1, 1}},
      {"layer4.2.bn3.weight", 1, {2048}},
      {"fc.weight", 2, {1000, 2048}},
      {"fc.bias", 1, {1000}},
  };
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    const stoke_value *v = find(g, keys[i].name);
    if (!v) fail_msg("no parameter or state named '%s'", keys[i].name);
    assert_int_equal(v->shape.ndim, keys[i].ndim);
    for (int d = 0; d < keys[i].ndim; d++) assert_int_equal(v->shape.d[d], keys[i].d[d]);
    int is_state = strstr(keys[i].name, "running_") != NULL;
    assert_int_equal(v->kind, is_state ? STOKE_VAL_STATE : STOKE_VAL_PARAM);
  }
  /* only the first block of a stage has a downsample; no block has a bias */
  const char *absent[] = {"layer1.1.downsample.0.weight", "layer2.1.downsample.1.weight", "conv1.bias",
                          "layer5.0.conv1.weight", "layer1.0.conv1.bias"};
  for (int i = 0; i < 5; i++)
    if (find(g, absent[i])) fail_msg("unexpected '%s'", absent[i]);
  /* torchvision's init */
  const stoke_value *v = find(g, "conv1.weight");
  assert_int_equal(v->init.kind, STOKE_INIT_NORMAL);
  assert_true(v->init.a == 0 && fabs(v->init.b - sqrt(2.0 / (64 * 49))) < 1e-12);
  v = find(g, "layer2.0.conv2.weight");
  assert_true(fabs(v->init.b - sqrt(2.0 / (128 * 9))) < 1e-12);
  v = find(g, "fc.weight");
  assert_int_equal(v->init.kind, STOKE_INIT_UNIFORM);
  assert_true(fabs(v->init.b - 1 / sqrt(2048.0)) < 1e-12 && v->init.a == -v->init.b);
  assert_int_equal(find(g, "fc.bias")->init.kind, STOKE_INIT_UNIFORM);
  assert_int_equal(find(g, "layer1.0.bn3.weight")->init.kind, STOKE_INIT_ONES);
  assert_int_equal(find(g, "layer1.0.bn3.bias")->init.kind, STOKE_INIT_ZEROS);
  assert_int_equal(find(g, "layer1.0.bn3.running_mean")->init.kind, STOKE_INIT_ZEROS);
  assert_int_equal(find(g, "layer1.0.bn3.running_var")->init.kind, STOKE_INIT_ONES);
  /* readable node names */
  int seen = 0;
  for (int i = 0; i < g->n_fwd; i++)
    seen += !strcmp(g->nodes[i].n.name, "layer1.0.conv1") || !strcmp(g->nodes[i].n.name, "layer4.2.bn3") ||
            !strcmp(g->nodes[i].n.name, "maxpool") || !strcmp(g->nodes[i].n.name, "fc");
  assert_int_equal(seen, 4);
  stoke_graph_free(g);

  /* zero_init_residual: the last BN of every block starts at weight 0 */
  g = build("depth = 50\nzero_init_residual = true\n", 2, 3, 64, 10);
  assert_int_equal(find(g, "layer1.0.bn3.weight")->init.kind, STOKE_INIT_ZEROS);
  assert_int_equal(find(g, "layer4.2.bn3.weight")->init.kind, STOKE_INIT_ZEROS);
  assert_int_equal(find(g, "layer1.0.bn2.weight")->init.kind, STOKE_INIT_ONES);
  assert_int_equal(find(g, "layer1.0.downsample.1.weight")->init.kind, STOKE_INIT_ONES);
  stoke_graph_free(g);
  g = build("depth = 18\nstem = cifar\nzero_init_residual = yes\n", 2, 3, 32, 10);
  assert_int_equal(find(g, "layer3.1.bn2.weight")->init.kind, STOKE_INIT_ZEROS);
  assert_int_equal(find(g, "layer3.1.bn1.weight")->init.kind, STOKE_INIT_ONES);
  assert_int_equal(find(g, "conv1.weight")->shape.d[3], 3);
  assert_non_null(find(g, "layer2.0.downsample.0.weight"));
  assert_null(find(g, "layer1.0.downsample.0.weight")); /* BasicBlock: same shape */
  stoke_graph_free(g);
}

/* One forward and backward of a narrow f64 ResNet-18 (CIFAR stem) on the
 * cpu engine, gradient sums as add nodes or accumulated in place
 * (core/fuse_grad.c): the flat gradient buffer (malloc'd copy) and how
 * many sums were folded. */
static double *resnet_grads(int no_acc, size_t *bytes, int *folded) {
  const stoke_backend_v1 *cpu = stoke_find_backend(reg, "cpu");
  void *cpu_self = NULL;
  EXPECT_OK(cpu->open(0, NULL, &cpu_self));
  int logits, label;
  stoke_graph *g = build_dt("depth = 18\nstem = cifar\nwidth = 4\n", 3, 3, 16, 5, STOKE_F64, &logits);
  EXPECT_OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {3}}, STOKE_I32, &label));
  EXPECT_OK(stoke_graph_loss(g, logits, ""));
  static const char *engines[] = {"cpu"};
  void *selves[] = {cpu_self};
  stoke_plan_opts o = {.engines = engines, .n_engines = 1, .engine_selves = selves, .optimizer = "sgd",
                       .training = 1, .no_grad_accumulate = no_acc};
  stoke_plan *p;
  EXPECT_OK(stoke_compile(g, &o, &p));
  *folded = p->n_accumulated;
  stoke_exec *x;
  EXPECT_OK(stoke_exec_new(p, cpu, cpu_self, 11, &x));
  double *in = stoke_exec_input(x);
  int32_t *lab = stoke_exec_labels(x);
  for (int i = 0; i < 3 * 3 * 16 * 16; i++) in[i] = sin(0.37 * i) + 0.1 * cos(1.3 * i);
  for (int i = 0; i < 3; i++) lab[i] = (int32_t)(2 * i + 1) % 5;
  EXPECT_OK(stoke_exec_forward_backward(x, 1, 7));
  *bytes = p->bytes[STOKE_BUF_GRADS];
  double *out = malloc(*bytes);
  memcpy(out, stoke_exec_buffer(x, STOKE_BUF_GRADS), *bytes);
  stoke_exec_free(x);
  stoke_plan_free(p);
  stoke_graph_free(g);
  cpu->close(cpu_self);
  return out;
}

/* Where a block's input gradient meets the shortcut's, the conv backward
 * adds into it (din_accumulate) instead of an add node: 8 sums in a
 * ResNet-18, and the same gradients (f64: to rounding, the order of the
 * additions differs). */
static void test_grad_sums_in_place(void **state) {
  size_t b0, b1;
  int f0, f1;
  double *ref = resnet_grads(1, &b0, &f0), *acc = resnet_grads(0, &b1, &f1);
  assert_int_equal(b0, b1);
  assert_int_equal(f0, 0);
  assert_int_equal(f1, 8);
  double num = 0, den = 0;
  for (size_t i = 0; i < b0 / sizeof(double); i++) {
    num += (acc[i] - ref[i]) * (acc[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  print_message("gradients, sums in place vs add nodes: relative difference %.3g over %zu values\n",
                sqrt(num / den), b0 / sizeof(double));
  assert_true(den > 0);
  assert_true(sqrt(num / den) < 1e-12);
  free(ref);
  free(acc);
}

/* A bad value names the key and the choices; too small an image is refused. */
static void test_messages(void **state) {
  stoke_cfg *cfg = stoke_cfg_new();
  EXPECT_OK(stoke_declare_core_keys(cfg));
  EXPECT_OK(stoke_cfg_declare(cfg, "model", NULL, resnet->keys, resnet->n_keys));
  for (int i = 0; i < resnet->n_keys; i++) assert_true(resnet->keys[i].help && *resnet->keys[i].help);
  EXPECT_OK(stoke_cfg_load_string(cfg, "bad.ini", "[model]\nname = resnet\ndepth = 101\n"));
  stoke_err *e = stoke_cfg_validate(cfg);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "depth"));
  stoke_err_free(e);
  stoke_cfg_free(cfg);

  cfg = stoke_cfg_new();
  EXPECT_OK(stoke_declare_core_keys(cfg));
  EXPECT_OK(stoke_cfg_declare(cfg, "model", NULL, resnet->keys, resnet->n_keys));
  EXPECT_OK(stoke_cfg_load_string(cfg, "small.ini", "[model]\nname = resnet\ndepth = 18\n"));
  stoke_graph *g;
  EXPECT_OK(stoke_graph_new(reg, STOKE_F32, STOKE_NCHW, &g));
  int x, logits;
  EXPECT_OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){4, {2, 3, 16, 16}}, STOKE_F32, &x));
  stoke_builder_v1 b = stoke_graph_builder(g);
  e = resnet->build(cfg, "model", &b, x, 10, &logits);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  assert_non_null(strstr(e->msg, "32x32"));
  stoke_err_free(e);
  stoke_graph_free(g);
  stoke_cfg_free(cfg);
}

/* ResNet-18, CIFAR stem, width 8, on 16x16 synthetic images of 4 classes:
 * a small data set seen a few times, so the loss must fall well below ln 4. */
static void test_resnet18_cifar_learns(void **state) {
  static const char *ini =
      "[run]\n"
      "backends = cpu\n"
      "steps = 30\n"
      "seed = 5\n"
      "log_every = 5\n"
      "progress = off\n"
      "\n"
      "[data]\n"
      "source = synthetic\n"
      "shape = 3,16,16\n"
      "classes = 4\n"
      "length = 128\n"
      "batch_size = 32\n"
      "\n"
      "[model]\n"
      "name = resnet\n"
      "depth = 18\n"
      "stem = cifar\n"
      "width = 8\n"
      "\n"
      "[optimizer]\n"
      "name = sgd\n"
      "lr = 0.05\n"
      "momentum = 0.9\n"
      "weight_decay = 5e-5\n";
  char path[600], out_dir[700];
  snprintf(path, sizeof path, "%s/resnet18c.ini", tmp);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(ini, f);
  fclose(f);
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/resnet18c", tmp);
  const char *over[] = {out_dir};
  static const char *dirs[] = {"backends/cpu", "sources/synthetic", "models/resnet"};
  stoke_run_opts o = {.ini_path = path, .overrides = over, .n_overrides = 1, .plugin_dirs = dirs,
                      .n_plugin_dirs = 3, .quiet = 1};
  stoke_summary s;
  EXPECT_OK(stoke_train(&o, &s));
  print_message("resnet18 cifar w8: loss %.4f -> %.4f in %lld steps, %.0f samples/s\n", s.first_loss,
                s.final_loss, (long long)s.steps, s.samples_per_s);
  assert_int_equal(s.steps, 30);
  assert_true(s.first_loss > 1.0);
  assert_true(s.final_loss < 0.6 * s.first_loss);
}

int main(void) {
  const char *t = getenv("TEST_TMPDIR");
  snprintf(tmp, sizeof tmp, "%s", t ? t : "/tmp");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_param_counts),
      cmocka_unit_test(test_resnet50_flops),
      cmocka_unit_test(test_torchvision_names),
      cmocka_unit_test(test_messages),
      cmocka_unit_test(test_grad_sums_in_place),
      cmocka_unit_test(test_resnet18_cifar_learns),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
