/* models/resnet: torchvision's ResNet-18/34 (BasicBlock) and ResNet-50 v1.5
 * (Bottleneck, stride in the 3x3), with the ImageNet stem or the CIFAR one.
 * Parameter and state names are torchvision's state_dict keys, so a
 * checkpoint of depth = 50, stem = imagenet, width = 64 loads into
 * torchvision.models.resnet50() (and 18/34 likewise):
 *
 *   conv1.weight  bn1.{weight,bias,running_mean,running_var}
 *   layer<s>.<b>.conv<k>.weight  layer<s>.<b>.bn<k>.*           s = 1..4
 *   layer<s>.<b>.downsample.0.weight  layer<s>.<b>.downsample.1.* (first
 *       block of a stage whose shape changes)
 *   fc.weight  fc.bias
 *
 * (torchvision's BN num_batches_tracked is not a graph value; the core's
 * checkpoint writer adds it, so a checkpoint has all of resnet50's 320 keys.)
 * Init as torchvision: conv kaiming_normal_(mode='fan_out', relu), BN 1/0,
 * running stats 0/1, fc nn.Linear's default U(+-1/sqrt(in)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static const stoke_cfg_key_v1 keys[] = {
    {"depth", STOKE_CFG_ENUM, "50", 0, 0, "18|34|50",
     "18 and 34: BasicBlock [2,2,2,2] / [3,4,6,3]; 50: Bottleneck v1.5 [3,4,6,3], expansion 4"},
    {"stem", STOKE_CFG_ENUM, "imagenet", 0, 0, "imagenet|cifar",
     "imagenet: 7x7/2 conv + BN + ReLU + 3x3/2 max-pool; cifar: 3x3/1 conv + BN + ReLU, no max-pool"},
    {"width", STOKE_CFG_INT, "64", 1, 1 << 16, NULL,
     "channels of the stem and the first stage (doubled per stage; torchvision: 64)"},
    {"zero_init_residual", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "start the last BN of each residual block at weight 0 (torchvision's option)"},
};

#define NAME 64

/* conv kaiming_normal_(mode='fan_out', nonlinearity='relu'): N(0, 2 / (O kh kw)) */
static stoke_init_v1 fan_out_normal(int64_t out, int64_t k) {
  return (stoke_init_v1){STOKE_INIT_NORMAL, 0, sqrt(2.0 / (double)(out * k * k))};
}

/* nn.Linear default: U(+-1/sqrt(fan_in)) for weight and bias */
static stoke_init_v1 fan_in_uniform(int64_t fan_in) {
  double b = 1.0 / sqrt((double)fan_in);
  return (stoke_init_v1){STOKE_INIT_UNIFORM, -b, b};
}

/* `name`.weight [cout, cin, k, k] and the node `name` (no bias). */
static stoke_err *conv(const stoke_builder_v1 *b, int x, const char *name, int64_t cin, int64_t cout,
                       int64_t k, int64_t stride, int64_t pad, int *y) {
  char w[NAME], attrs[64];
  int wv;
  snprintf(w, sizeof w, "%s.weight", name);
  snprintf(attrs, sizeof attrs, "stride=%lld, padding=%lld", (long long)stride, (long long)pad);
  STOKE_PROPAGATE_P(b->param(b->g, w, &(stoke_shape){4, {cout, cin, k, k}}, fan_out_normal(cout, k), &wv));
  return b->node(b->g, STOKE_OP_CONV2D, name, (int[]){x, wv}, 2, attrs, y, 1);
}

/* `name`.{weight, bias} parameters, .{running_mean, running_var} state. */
static stoke_err *bn(const stoke_builder_v1 *b, int x, const char *name, int64_t c, int zero_weight, int *y) {
  char w[NAME], bb[NAME], rm[NAME], rv[NAME];
  snprintf(w, sizeof w, "%s.weight", name);
  snprintf(bb, sizeof bb, "%s.bias", name);
  snprintf(rm, sizeof rm, "%s.running_mean", name);
  snprintf(rv, sizeof rv, "%s.running_var", name);
  stoke_shape s = {1, {c}};
  stoke_init_v1 zeros = {STOKE_INIT_ZEROS, 0, 0}, ones = {STOKE_INIT_ONES, 0, 0};
  int g, beta, mean, var, out[3];
  STOKE_PROPAGATE_P(b->param(b->g, w, &s, zero_weight ? zeros : ones, &g));
  STOKE_PROPAGATE_P(b->param(b->g, bb, &s, zeros, &beta));
  STOKE_PROPAGATE_P(b->state(b->g, rm, &s, zeros, &mean));
  STOKE_PROPAGATE_P(b->state(b->g, rv, &s, ones, &var));
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_BATCH_NORM, name, (int[]){x, g, beta, mean, var}, 5, "", out, 3));
  *y = out[0];
  return NULL;
}

static stoke_err *relu(const stoke_builder_v1 *b, int x, const char *name, int *y) {
  return b->node(b->g, STOKE_OP_RELU, name, &x, 1, "", y, 1);
}

/* "<block>.<part>" */
static const char *sub(char *buf, const char *block, const char *part) {
  /* block names are short ("layer4.2"); a longer one is cut, never overrun */
  snprintf(buf, NAME, "%.40s.%.20s", block, part);
  return buf;
}

/* conv -> bn (-> relu when `act`): `block`.conv<k>, `block`.bn<k>, `block`.relu<k>. */
static stoke_err *conv_bn(const stoke_builder_v1 *b, int x, const char *block, int k, int64_t cin,
                          int64_t cout, int64_t ksize, int64_t stride, int act, int zero_bn, int *y) {
  char n[NAME], part[16];
  int c;
  snprintf(part, sizeof part, "conv%d", k);
  STOKE_PROPAGATE_P(conv(b, x, sub(n, block, part), cin, cout, ksize, stride, ksize / 2, &c));
  snprintf(part, sizeof part, "bn%d", k);
  STOKE_PROPAGATE_P(bn(b, c, sub(n, block, part), cout, zero_bn, y));
  if (!act) return NULL;
  snprintf(part, sizeof part, "relu%d", k);
  return relu(b, *y, sub(n, block, part), y);
}

/* One residual block. BasicBlock (expansion 1): 3x3/stride, 3x3.
 * Bottleneck (expansion 4): 1x1, 3x3/stride, 1x1 to 4 planes. The shortcut
 * is `block`.downsample.{0: 1x1/stride conv, 1: BN} when the shape changes. */
static stoke_err *block(const stoke_builder_v1 *b, int x, const char *name, int bottleneck, int64_t cin,
                        int64_t planes, int64_t stride, int zero_init, int *y) {
  int64_t cout = bottleneck ? 4 * planes : planes;
  int h;
  if (bottleneck) {
    STOKE_PROPAGATE_P(conv_bn(b, x, name, 1, cin, planes, 1, 1, 1, 0, &h));
    STOKE_PROPAGATE_P(conv_bn(b, h, name, 2, planes, planes, 3, stride, 1, 0, &h));
    STOKE_PROPAGATE_P(conv_bn(b, h, name, 3, planes, cout, 1, 1, 0, zero_init, &h));
  } else {
    STOKE_PROPAGATE_P(conv_bn(b, x, name, 1, cin, planes, 3, stride, 1, 0, &h));
    STOKE_PROPAGATE_P(conv_bn(b, h, name, 2, planes, cout, 3, 1, 0, zero_init, &h));
  }
  int identity = x;
  char n[NAME];
  if (stride != 1 || cin != cout) {
    int d;
    STOKE_PROPAGATE_P(conv(b, x, sub(n, name, "downsample.0"), cin, cout, 1, stride, 0, &d));
    STOKE_PROPAGATE_P(bn(b, d, sub(n, name, "downsample.1"), cout, 0, &identity));
  }
  int s;
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_ADD, sub(n, name, "add"), (int[]){h, identity}, 2, "", &s, 1));
  return relu(b, s, sub(n, name, "relu"), y);
}

static stoke_err *build(const stoke_cfg *c, const char *sec, const stoke_builder_v1 *b, int input,
                        int64_t classes, int *logits) {
  const char *depth_s, *stem;
  int64_t width;
  int zero_init;
  STOKE_PTRY(stoke_host->cfg_str(c, sec, "depth", &depth_s), "reading [%s]", sec);
  STOKE_PTRY(stoke_host->cfg_str(c, sec, "stem", &stem), "reading [%s]", sec);
  STOKE_PTRY(stoke_host->cfg_int(c, sec, "width", &width), "reading [%s]", sec);
  STOKE_PTRY(stoke_host->cfg_bool(c, sec, "zero_init_residual", &zero_init), "reading [%s]", sec);
  int depth = atoi(depth_s), bottleneck = depth == 50;
  static const int blocks18[4] = {2, 2, 2, 2}, blocks34[4] = {3, 4, 6, 3};
  const int *blocks = depth == 18 ? blocks18 : blocks34; /* 50 has 34's counts */
  int cifar = stem[0] == 'c';

  stoke_shape s;
  STOKE_PROPAGATE_P(b->shape_of(b->g, input, &s));
  if (s.ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID, "resnet: expects images (N, C, H, W); the source gives %d-D samples",
                      s.ndim - 1);
  int64_t min_hw = cifar ? 8 : 32; /* the stride of the whole net: 8 or 32 */
  if (s.d[2] < min_hw || s.d[3] < min_hw)
    return STOKE_PERR(STOKE_E_INVALID,
                      "resnet: stem = %s needs images of at least %lldx%lld (%s); the source gives %lldx%lld",
                      stem, (long long)min_hw, (long long)min_hw, stoke_host->cfg_where(c, sec, "stem"),
                      (long long)s.d[2], (long long)s.d[3]);

  int x;
  if (cifar) {
    STOKE_PROPAGATE_P(conv(b, input, "conv1", s.d[1], width, 3, 1, 1, &x));
  } else {
    STOKE_PROPAGATE_P(conv(b, input, "conv1", s.d[1], width, 7, 2, 3, &x));
  }
  STOKE_PROPAGATE_P(bn(b, x, "bn1", width, 0, &x));
  STOKE_PROPAGATE_P(relu(b, x, "relu", &x));
  if (!cifar)
    STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_MAX_POOL2D, "maxpool", &x, 1, "kernel=3, stride=2, padding=1", &x, 1));

  int64_t cin = width;
  for (int st = 0; st < 4; st++) {
    int64_t planes = width << st;
    for (int i = 0; i < blocks[st]; i++) {
      char name[NAME];
      snprintf(name, sizeof name, "layer%d.%d", st + 1, i);
      int64_t stride = (st > 0 && i == 0) ? 2 : 1;
      STOKE_PTRY(block(b, x, name, bottleneck, cin, planes, stride, zero_init, &x), "resnet%d block %s", depth,
                 name);
      cin = bottleneck ? 4 * planes : planes;
    }
  }
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_GLOBAL_AVG_POOL, "avgpool", &x, 1, "", &x, 1));
  int w, bias;
  STOKE_PROPAGATE_P(b->param(b->g, "fc.weight", &(stoke_shape){2, {classes, cin}}, fan_in_uniform(cin), &w));
  STOKE_PROPAGATE_P(b->param(b->g, "fc.bias", &(stoke_shape){1, {classes}}, fan_in_uniform(cin), &bias));
  return b->node(b->g, STOKE_OP_LINEAR, "fc", (int[]){x, w, bias}, 3, "", logits, 1);
}

static const stoke_model_v1 model = {
    STOKE_ABI(stoke_model_v1),
    "resnet", "torchvision ResNet-18/34/50 (v1.5), ImageNet or CIFAR stem, torchvision parameter names", keys,
    sizeof keys / sizeof *keys, build};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_model(r->self, &model);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "resnet", "ResNet model builder", reg};
