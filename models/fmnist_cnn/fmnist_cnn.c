/* models/fmnist_cnn: a small CNN with batch norm for 28x28 images
 * (Fashion-MNIST): per block conv3x3 -> BN -> ReLU -> max-pool 2, then
 * Linear -> ReLU (-> dropout) -> Linear. Parameter names are those of the
 * PyTorch module in the comment below, so checkpoints load into it:
 *
 *   class FmnistCnn(nn.Module):  # channels=(32, 64), hidden=128
 *     conv1 = Conv2d(1, 32, 3, padding=1, bias=False); bn1 = BatchNorm2d(32)
 *     conv2 = Conv2d(32, 64, 3, padding=1, bias=False); bn2 = BatchNorm2d(64)
 *     fc1 = Linear(64 * 7 * 7, 128); fc2 = Linear(128, 10)
 *     forward: pool(relu(bn(conv))) per block, flatten, relu(fc1), dropout, fc2
 */
#include <math.h>
#include <stdio.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static const stoke_cfg_key_v1 keys[] = {
    {"channels", STOKE_CFG_INTS, "32, 64", 1, 4096, NULL, "output channels of each conv block"},
    {"hidden", STOKE_CFG_INT, "128", 1, 1 << 20, NULL, "width of the hidden fully connected layer"},
    {"dropout", STOKE_CFG_FLOAT, "0", 0, 0.99, NULL, "dropout before the last layer (0: none)"},
};

/* nn.Conv2d / nn.Linear default init: kaiming_uniform(a = sqrt(5)) = U(+-1/sqrt(fan_in)) */
static stoke_init_v1 fan_in_uniform(int64_t fan_in) {
  double b = 1.0 / sqrt((double)fan_in);
  return (stoke_init_v1){STOKE_INIT_UNIFORM, -b, b};
}

static stoke_err *block(const stoke_builder_v1 *b, int x, int64_t cin, int64_t cout, int idx, int *y) {
  char n[64], w[64], bw[64], bb[64], rm[64], rv[64], an[64], pn[64];
  snprintf(n, sizeof n, "conv%d", idx);
  snprintf(w, sizeof w, "conv%d.weight", idx);
  snprintf(bw, sizeof bw, "bn%d.weight", idx);
  snprintf(bb, sizeof bb, "bn%d.bias", idx);
  snprintf(rm, sizeof rm, "bn%d.running_mean", idx);
  snprintf(rv, sizeof rv, "bn%d.running_var", idx);
  int wv, g, beta, mean, var, c, bn[3], r;
  STOKE_PROPAGATE_P(b->param(b->g, w, &(stoke_shape){4, {cout, cin, 3, 3}}, fan_in_uniform(cin * 9), &wv));
  STOKE_PROPAGATE_P(b->param(b->g, bw, &(stoke_shape){1, {cout}}, (stoke_init_v1){STOKE_INIT_ONES, 0, 0}, &g));
  STOKE_PROPAGATE_P(b->param(b->g, bb, &(stoke_shape){1, {cout}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &beta));
  STOKE_PROPAGATE_P(b->state(b->g, rm, &(stoke_shape){1, {cout}}, (stoke_init_v1){STOKE_INIT_ZEROS, 0, 0}, &mean));
  STOKE_PROPAGATE_P(b->state(b->g, rv, &(stoke_shape){1, {cout}}, (stoke_init_v1){STOKE_INIT_ONES, 0, 0}, &var));
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_CONV2D, n, (int[]){x, wv}, 2, "padding=1", &c, 1));
  snprintf(n, sizeof n, "bn%d", idx);
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_BATCH_NORM, n, (int[]){c, g, beta, mean, var}, 5, "", bn, 3));
  snprintf(an, sizeof an, "relu%d", idx);
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_RELU, an, &bn[0], 1, "", &r, 1));
  snprintf(pn, sizeof pn, "pool%d", idx);
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_MAX_POOL2D, pn, &r, 1, "kernel=2", y, 1));
  return NULL;
}

static stoke_err *linear(const stoke_builder_v1 *b, int x, int64_t in, int64_t out, const char *name, int *y) {
  char w[64], bias[64];
  snprintf(w, sizeof w, "%s.weight", name);
  snprintf(bias, sizeof bias, "%s.bias", name);
  int wv, bv;
  STOKE_PROPAGATE_P(b->param(b->g, w, &(stoke_shape){2, {out, in}}, fan_in_uniform(in), &wv));
  STOKE_PROPAGATE_P(b->param(b->g, bias, &(stoke_shape){1, {out}}, fan_in_uniform(in), &bv));
  return b->node(b->g, STOKE_OP_LINEAR, name, (int[]){x, wv, bv}, 3, "", y, 1);
}

static stoke_err *build(const stoke_cfg *c, const char *sec, const stoke_builder_v1 *b, int input,
                        int64_t classes, int *logits) {
  int64_t ch[STOKE_CFG_MAX_LIST], hidden;
  int n;
  double drop;
  STOKE_PTRY(stoke_host->cfg_ints(c, sec, "channels", ch, &n), "reading [%s]", sec);
  STOKE_PTRY(stoke_host->cfg_int(c, sec, "hidden", &hidden), "reading [%s]", sec);
  STOKE_PTRY(stoke_host->cfg_float(c, sec, "dropout", &drop), "reading [%s]", sec);
  stoke_shape s;
  STOKE_PROPAGATE_P(b->shape_of(b->g, input, &s));
  if (s.ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID,
                      "fmnist_cnn: expects images (N, C, H, W); the source gives %d-D samples", s.ndim - 1);
  int x = input;
  int64_t cin = s.d[1];
  for (int i = 0; i < n; i++) {
    STOKE_PTRY(block(b, x, cin, ch[i], i + 1, &x), "conv block %d", i + 1);
    cin = ch[i];
  }
  int f, h, r;
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_FLATTEN, "flatten", &x, 1, "", &f, 1));
  STOKE_PROPAGATE_P(b->shape_of(b->g, f, &s));
  STOKE_PROPAGATE_P(linear(b, f, s.d[1], hidden, "fc1", &h));
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_RELU, "relu_fc1", &h, 1, "", &r, 1));
  if (drop > 0) {
    char a[32];
    snprintf(a, sizeof a, "p=%.17g", drop);
    STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_DROPOUT, "dropout", &r, 1, a, &h, 1));
    r = h;
  }
  return linear(b, r, hidden, classes, "fc2", logits);
}

static const stoke_model_v1 model = {STOKE_ABI(stoke_model_v1), "fmnist_cnn",
                                     "small CNN with batch norm for 28x28 images", keys,
                                     sizeof keys / sizeof *keys, build};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_model(r->self, &model);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "fmnist_cnn", "small CNN model builder", reg};
