/* models/gpt: GPT-2 as nanoGPT's `GPT` builds it: token and learned position
 * embeddings, n_layer pre-LayerNorm blocks (causal self-attention, GELU(tanh)
 * MLP, residual adds fused into the next layer norm), a final layer norm
 * and an output head tied to the token embedding. Parameter names, layouts
 * and initialization are nanoGPT's state_dict (transformer.wte.weight,
 * transformer.h.0.attn.c_attn.weight, ..., lm_head.weight), so a checkpoint
 * loads into nanoGPT's model with strict=True. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static const stoke_cfg_key_v1 keys[] = {
    {"n_layer", STOKE_CFG_INT, "12", 1, 1024, NULL, "transformer blocks (GPT-2 small: 12)"},
    {"n_head", STOKE_CFG_INT, "12", 1, 1024, NULL, "attention heads; n_embd / n_head is the head size"},
    {"n_embd", STOKE_CFG_INT, "768", 1, 1 << 16, NULL, "width of the residual stream"},
    {"context", STOKE_CFG_INT, "1024", 1, 1 << 20, NULL,
     "the longest sequence (nanoGPT's block_size): rows of the position embedding; the data's seq_len may "
     "be shorter"},
    {"vocab", STOKE_CFG_INT, "0", 0, 1 << 24, NULL,
     "token ids the model knows (0: the data's, e.g. 50257 for GPT-2's BPE), padded up to a multiple of 64 "
     "for the tensor cores (50257 -> 50304, nanoGPT's vocab_size)"},
};

typedef struct gpt_cfg {
  int64_t layers, heads, embd, context, vocab; /* vocab: padded */
  int64_t b, t;                                /* the batch's sequences and their length */
} gpt_cfg;

/* One parameter; `std` 0: zeros, < 0: ones (layer norm weights). */
static stoke_err *param(const stoke_builder_v1 *b, const char *name, int64_t d0, int64_t d1, double std, int *v) {
  stoke_shape s = d1 ? (stoke_shape){2, {d0, d1}} : (stoke_shape){1, {d0}};
  stoke_init_v1 init = {std > 0 ? STOKE_INIT_NORMAL : std < 0 ? STOKE_INIT_ONES : STOKE_INIT_ZEROS, 0, std > 0 ? std : 0};
  STOKE_PTRY(b->param(b->g, name, &s, init, v), "parameter %s", name);
  return NULL;
}

/* nn.Linear(in, out) named `name` (weight N(0, std), bias zeros) on x. */
static stoke_err *linear(const stoke_builder_v1 *b, const char *name, int x, int64_t in, int64_t out, double std,
                         int *y) {
  char wn[96], bn[96];
  snprintf(wn, sizeof wn, "%s.weight", name);
  snprintf(bn, sizeof bn, "%s.bias", name);
  int w, bias;
  STOKE_PROPAGATE_P(param(b, wn, out, in, std, &w));
  STOKE_PROPAGATE_P(param(b, bn, out, 0, 0, &bias));
  STOKE_PTRY(b->node(b->g, STOKE_OP_LINEAR, name, (int[]){x, w, bias}, 3, "", y, 1), "%s", name);
  return NULL;
}

/* nn.LayerNorm named `name` on `x`, or on x + r in one node when r >= 0
 * (*sum: the residual stream after the add). */
static stoke_err *layer_norm(const stoke_builder_v1 *b, const gpt_cfg *g, const char *name, int x, int r, int *sum,
                             int *y) {
  char wn[96], bn[96];
  snprintf(wn, sizeof wn, "%s.weight", name);
  snprintf(bn, sizeof bn, "%s.bias", name);
  int w, bias, out[4];
  STOKE_PROPAGATE_P(param(b, wn, g->embd, 0, -1, &w));
  STOKE_PROPAGATE_P(param(b, bn, g->embd, 0, 0, &bias));
  if (r < 0) {
    STOKE_PTRY(b->node(b->g, STOKE_OP_LAYER_NORM, name, (int[]){x, w, bias}, 3, "", out, 3), "%s", name);
    *y = out[0];
    return NULL;
  }
  STOKE_PTRY(b->node(b->g, STOKE_OP_ADD_LAYER_NORM, name, (int[]){x, r, w, bias}, 4, "", out, 4), "%s", name);
  *sum = out[0];
  *y = out[1];
  return NULL;
}

static stoke_err *reshape(const stoke_builder_v1 *b, const char *name, int x, int64_t d0, int64_t d1, int64_t d2,
                          int *y) {
  char attrs[96];
  if (d2) snprintf(attrs, sizeof attrs, "shape=%lldx%lldx%lld", (long long)d0, (long long)d1, (long long)d2);
  else snprintf(attrs, sizeof attrs, "shape=%lldx%lld", (long long)d0, (long long)d1);
  STOKE_PTRY(b->node(b->g, STOKE_OP_RESHAPE, name, &x, 1, attrs, y, 1), "%s", name);
  return NULL;
}

/* CausalSelfAttention: c_attn (q, k, v packed), attention, c_proj. */
static stoke_err *attention(const stoke_builder_v1 *b, const gpt_cfg *g, const char *blk, int h, int *out) {
  char name[96], attrs[64];
  int64_t bt = g->b * g->t, c = g->embd;
  double proj_std = 0.02 / sqrt(2.0 * (double)g->layers); /* nanoGPT's scaled init of c_proj */
  int qkv, qkv3, y[2], y2;
  snprintf(name, sizeof name, "%s.attn.c_attn", blk);
  STOKE_PROPAGATE_P(linear(b, name, h, c, 3 * c, 0.02, &qkv));
  snprintf(name, sizeof name, "%s.attn.qkv", blk);
  STOKE_PROPAGATE_P(reshape(b, name, qkv, g->b, g->t, 3 * c, &qkv3));
  snprintf(name, sizeof name, "%s.attn", blk);
  snprintf(attrs, sizeof attrs, "n_head=%lld, causal=1", (long long)g->heads);
  STOKE_PTRY(b->node(b->g, STOKE_OP_ATTENTION, name, &qkv3, 1, attrs, y, 2), "%s", name);
  snprintf(name, sizeof name, "%s.attn.y", blk);
  STOKE_PROPAGATE_P(reshape(b, name, y[0], bt, c, 0, &y2));
  snprintf(name, sizeof name, "%s.attn.c_proj", blk);
  return linear(b, name, y2, c, c, proj_std, out);
}

/* MLP: c_fc, GELU(tanh), c_proj. */
static stoke_err *mlp(const stoke_builder_v1 *b, const gpt_cfg *g, const char *blk, int h, int *out) {
  char name[96];
  int64_t c = g->embd;
  int f, a;
  snprintf(name, sizeof name, "%s.mlp.c_fc", blk);
  STOKE_PROPAGATE_P(linear(b, name, h, c, 4 * c, 0.02, &f));
  snprintf(name, sizeof name, "%s.mlp.gelu", blk);
  STOKE_PTRY(b->node(b->g, STOKE_OP_GELU, name, &f, 1, "approximate=tanh", &a, 1), "%s", name);
  snprintf(name, sizeof name, "%s.mlp.c_proj", blk);
  return linear(b, name, a, 4 * c, c, 0.02 / sqrt(2.0 * (double)g->layers), out);
}

/* The keys, checked, and the batch's shape from the tokens [B, T]. */
static stoke_err *read_cfg(const stoke_cfg *c, const char *sec, const stoke_builder_v1 *b, int tokens,
                           int64_t classes, gpt_cfg *g) {
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "n_layer", &g->layers));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "n_head", &g->heads));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "n_embd", &g->embd));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "context", &g->context));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "vocab", &g->vocab));
  if (g->embd % g->heads)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] n_embd = %lld is not a multiple of n_head = %lld",
                      stoke_host->cfg_where(c, sec, "n_embd"), sec, (long long)g->embd, (long long)g->heads);
  if (g->vocab && g->vocab < classes)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] vocab = %lld, but the data's token ids go up to %lld",
                      stoke_host->cfg_where(c, sec, "vocab"), sec, (long long)g->vocab, (long long)classes - 1);
  if (!g->vocab) g->vocab = classes;
  g->vocab = (g->vocab + 63) / 64 * 64;
  stoke_shape s;
  STOKE_PROPAGATE_P(b->shape_of(b->g, tokens, &s));
  if (s.ndim != 2)
    return STOKE_PERR(STOKE_E_INVALID, "gpt: the input must be token windows (a tokens source, or synthetic with "
                                       "tokens = true), got %d-D samples", s.ndim - 1);
  g->b = s.d[0];
  g->t = s.d[1];
  if (g->t > g->context)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] context = %lld, shorter than the data's seq_len = %lld",
                      stoke_host->cfg_where(c, sec, "context"), sec, (long long)g->context, (long long)g->t);
  return NULL;
}

static stoke_err *build(const stoke_cfg *c, const char *sec, const stoke_builder_v1 *b, int tokens, int64_t classes,
                        int *logits) {
  gpt_cfg g;
  STOKE_PTRY(read_cfg(c, sec, b, tokens, classes, &g), "building gpt");
  int wte, wpe, emb, pos, x, h, r = -1;
  STOKE_PROPAGATE_P(param(b, "transformer.wte.weight", g.vocab, g.embd, 0.02, &wte));
  STOKE_PROPAGATE_P(param(b, "transformer.wpe.weight", g.context, g.embd, 0.02, &wpe));
  STOKE_PROPAGATE_P(b->param_alias(b->g, wte, "lm_head.weight")); /* tied, as nanoGPT's state_dict lists it */
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_EMBEDDING, "transformer.wte", (int[]){wte, tokens}, 2, "", &emb, 1));
  STOKE_PROPAGATE_P(b->node(b->g, STOKE_OP_POSITION_EMBEDDING, "transformer.wpe", (int[]){emb, wpe}, 2, "", &pos, 1));
  STOKE_PROPAGATE_P(reshape(b, "transformer.x", pos, g.b * g.t, g.embd, 0, &x));
  for (int64_t l = 0; l < g.layers; l++) {
    char blk[64], name[96];
    snprintf(blk, sizeof blk, "transformer.h.%lld", (long long)l);
    snprintf(name, sizeof name, "%s.ln_1", blk);
    STOKE_PROPAGATE_P(layer_norm(b, &g, name, x, r, &x, &h)); /* x += the previous block's MLP */
    STOKE_PROPAGATE_P(attention(b, &g, blk, h, &r));
    snprintf(name, sizeof name, "%s.ln_2", blk);
    STOKE_PROPAGATE_P(layer_norm(b, &g, name, x, r, &x, &h)); /* x += attention */
    STOKE_PROPAGATE_P(mlp(b, &g, blk, h, &r));
  }
  STOKE_PROPAGATE_P(layer_norm(b, &g, "transformer.ln_f", x, r, &x, &h));
  STOKE_PTRY(b->node(b->g, STOKE_OP_MATMUL, "lm_head", (int[]){h, wte}, 2, "", logits, 1), "lm_head");
  return NULL;
}

static const stoke_model_v1 model = {STOKE_ABI(stoke_model_v1), "gpt",
                                     "GPT-2 (nanoGPT's GPT: pre-LayerNorm blocks, tied head)", keys,
                                     sizeof keys / sizeof *keys, build};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_model(r->self, &model);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "gpt", "GPT-2 model builder (nanoGPT's names)", reg};
