/* models/mlp: a multi-layer perceptron, Linear -> activation -> ... ->
 * Linear, layer widths from [model] hidden; parameter names and init as
 * PyTorch's nn.Sequential of nn.Linear (layers.<i>.weight / .bias). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static const stoke_cfg_key_v1 keys[] = {
    {"hidden", STOKE_CFG_INTS, "256, 256", 1, 1 << 20, NULL, "widths of the hidden layers, e.g. 4096, 4096"},
    {"activation", STOKE_CFG_STR, "relu", 0, 0, NULL,
     "op between layers: relu, gelu, or any one-input op a plugin registers (e.g. swish), with its attributes in "
     "parentheses: leaky_relu(negative_slope=0.1), gelu(approximate=tanh)"},
    {"approximate", STOKE_CFG_ENUM, "none", 0, 0, "none|tanh",
     "with activation = gelu: none (erf) or tanh, as nn.GELU(approximate=...)"},
};

static stoke_err *linear(const stoke_builder_v1 *b, int x, int64_t in, int64_t out, int idx, int *y) {
  char wn[64], bn[64], nn[64];
  snprintf(wn, sizeof wn, "layers.%d.weight", idx);
  snprintf(bn, sizeof bn, "layers.%d.bias", idx);
  snprintf(nn, sizeof nn, "layers.%d", idx);
  /* nn.Linear's default: kaiming_uniform(a = sqrt(5)) == U(+-1/sqrt(in)) */
  double bound = 1.0 / sqrt((double)in);
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -bound, bound};
  int w, bias;
  STOKE_PTRY(b->param(b->g, wn, &(stoke_shape){2, {out, in}}, init, &w), "layer %d", idx);
  STOKE_PTRY(b->param(b->g, bn, &(stoke_shape){1, {out}}, init, &bias), "layer %d", idx);
  int ins[3] = {x, w, bias};
  STOKE_PTRY(b->node(b->g, STOKE_OP_LINEAR, nn, ins, 3, "", y, 1), "layer %d", idx);
  return NULL;
}

static stoke_err *build(const stoke_cfg *c, const char *sec, const stoke_builder_v1 *b, int input,
                        int64_t classes, int *logits) {
  int64_t hidden[STOKE_CFG_MAX_LIST];
  int n = 0;
  const char *act, *approx;
  STOKE_PTRY(stoke_host->cfg_ints(c, sec, "hidden", hidden, &n), "reading [%s]", sec);
  if (!n)
    stoke_host->log(STOKE_LOG_WARN, "mlp", "[%s] hidden is empty: no hidden layer, a linear model (logistic "
                    "regression); give widths, e.g. hidden = 256, 256", sec);
  STOKE_PTRY(stoke_host->cfg_str(c, sec, "activation", &act), "reading [%s]", sec);
  STOKE_PTRY(stoke_host->cfg_str(c, sec, "approximate", &approx), "reading [%s]", sec);
  char act_attrs[48] = "";
  if (!strcmp(act, STOKE_OP_GELU)) snprintf(act_attrs, sizeof act_attrs, "approximate=%s", approx);
  stoke_shape s;
  STOKE_PROPAGATE_P(b->shape_of(b->g, input, &s));
  int x = input;
  if (s.ndim > 2) { /* images: flatten (N, C, H, W) to (N, C*H*W), as nn.Flatten */
    STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_FLATTEN, "flatten", &input, 1, "", &x, 1));
    STOKE_PROPAGATE_P(b->shape_of(b->g, x, &s));
  }
  int idx = 0;
  int64_t width = s.d[1];
  for (int i = 0; i < n; i++) {
    int y;
    STOKE_PROPAGATE_P(linear(b, x, width, hidden[i], idx++, &y));
    char an[32];
    snprintf(an, sizeof an, "layers.%d", idx++);
    int z;
    STOKE_PTRY(b->node(b->g, act, an, &y, 1, act_attrs, &z, 1), "%s: activation '%s'",
               stoke_host->cfg_where(c, sec, "activation"), act);
    x = z;
    width = hidden[i];
  }
  STOKE_PROPAGATE_P(linear(b, x, width, classes, idx, logits));
  return NULL;
}

static const stoke_model_v1 model = {STOKE_ABI(stoke_model_v1), "mlp",
                                     "multi-layer perceptron (Linear + activation)", keys,
                                     sizeof keys / sizeof *keys, build};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_model(r->self, &model);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "mlp", "MLP model builder", reg};
