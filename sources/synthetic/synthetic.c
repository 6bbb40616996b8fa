/* sources/synthetic: seeded random samples of any shape, with labels that
 * are either random or learnable (argmax of a fixed random linear map of
 * the sample), for smoke runs, benchmarks and end-to-end tests; or token
 * windows (uniform ids below `classes`) for language-model benchmarks. */
#include <stdlib.h>
#include <string.h>

#include "stoke/plugin.h"
#include "stoke/rng.h"

const stoke_host_v1 *stoke_host;

typedef struct synth {
  stoke_sample_info_v1 info;
  int64_t length, features, offset;
  int learnable, tokens;
  double noise;
  uint64_t data_seed;
  float *w; /* [classes, features] when learnable */
} synth;

static const stoke_cfg_key_v1 keys[] = {
    {"shape", STOKE_CFG_INTS, "64", 1, 1 << 24, NULL, "shape of one sample: 64 (features) or 3,32,32 (C,H,W)"},
    {"classes", STOKE_CFG_INT, "10", 2, 1 << 20, NULL, "number of classes"},
    {"length", STOKE_CFG_INT, "16384", 1, 1e12, NULL, "samples per epoch"},
    {"learnable", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "labels are argmax(W x) for a fixed random W (a task a model can learn); false: random labels"},
    {"noise", STOKE_CFG_FLOAT, "0", 0, 1, NULL, "fraction of labels replaced by random ones"},
    {"data_seed", STOKE_CFG_INT, "1234", 0, 9.2e18, NULL, "seed of the data set itself (not of the run)"},
    {"tokens", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "samples are token windows: `shape` = T + 1 i32 ids, uniform below `classes` (the random tokens of "
     "GPT benchmarks; a language model reads the first T and predicts the last T)"},
    {"offset", STOKE_CFG_INT, "0", 0, 1e15, NULL,
     "index of the first sample: a held-out set of the same task is the same data_seed with an "
     "offset past the training length"},
};

static stoke_err *synth_open(const stoke_cfg *c, const char *sec, void **self) {
  synth *s = calloc(1, sizeof *s);
  if (!s) return STOKE_PERR(STOKE_E_OOM, "synthetic: out of memory");
  int64_t dims[STOKE_CFG_MAX_LIST];
  int nd = 0;
  stoke_err *e = stoke_host->cfg_ints(c, sec, "shape", dims, &nd);
  if (!e && (nd < 1 || nd > 3))
    e = STOKE_PERR(STOKE_E_INVALID, "%s: [%s] shape must have 1 to 3 dimensions, got %d",
                   stoke_host->cfg_where(c, sec, "shape"), sec, nd);
  int64_t seed = 0;
  if (!e) e = stoke_host->cfg_int(c, sec, "classes", &s->info.classes);
  if (!e) e = stoke_host->cfg_int(c, sec, "length", &s->length);
  if (!e) e = stoke_host->cfg_bool(c, sec, "learnable", &s->learnable);
  if (!e) e = stoke_host->cfg_float(c, sec, "noise", &s->noise);
  if (!e) e = stoke_host->cfg_int(c, sec, "data_seed", &seed);
  if (!e) e = stoke_host->cfg_int(c, sec, "offset", &s->offset);
  if (!e) e = stoke_host->cfg_bool(c, sec, "tokens", &s->tokens);
  if (!e && s->tokens && nd != 1)
    e = STOKE_PERR(STOKE_E_INVALID, "%s: [%s] tokens = true needs a 1-D shape (T + 1 tokens), got %d dimensions",
                   stoke_host->cfg_where(c, sec, "shape"), sec, nd);
  if (e) {
    free(s);
    return e;
  }
  s->data_seed = (uint64_t)seed;
  s->info.shape.ndim = nd;
  s->features = 1;
  for (int i = 0; i < nd; i++) s->features *= (s->info.shape.d[i] = dims[i]);
  s->info.dtype = s->tokens ? STOKE_I32 : STOKE_F32;
  s->info.layout = STOKE_LAYOUT_ANY;
  if (s->learnable && !s->tokens) {
    s->w = malloc(sizeof(float) * (size_t)(s->features * s->info.classes));
    if (!s->w) {
      free(s);
      return STOKE_PERR(STOKE_E_OOM, "synthetic: out of memory for the label map");
    }
    stoke_rng r = stoke_rng_seed(stoke_hash3(s->data_seed, 0x3a9ull, 0));
    for (int64_t i = 0; i < s->features * s->info.classes; i++) s->w[i] = (float)stoke_rng_normal(&r);
  }
  *self = s;
  return NULL;
}

static void synth_close(void *self) {
  synth *s = self;
  if (!s) return;
  free(s->w);
  free(s);
}

static int64_t synth_length(void *self) { return ((synth *)self)->length; }

static stoke_err *synth_info(void *self, stoke_sample_info_v1 *out) {
  *out = ((synth *)self)->info;
  return NULL;
}

/* Sample `index` is a fixed function of (data_seed, index): a data set,
 * not fresh noise every epoch. */
static stoke_err *synth_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  synth *s = self;
  if (index < 0 || index >= s->length)
    return STOKE_PERR(STOKE_E_INVALID, "synthetic: index %lld outside [0, %lld)", (long long)index,
                      (long long)s->length);
  stoke_rng r = stoke_rng_seed(stoke_hash3(s->data_seed, 0x5a3b1eull, (uint64_t)(index + s->offset)));
  if (s->tokens) {
    int32_t *t = dst;
    for (int64_t i = 0; i < s->features; i++) t[i] = (int32_t)stoke_rng_below(&r, (uint64_t)s->info.classes);
    *label = 0; /* the window's own next tokens are the targets */
    return NULL;
  }
  float *x = dst;
  for (int64_t i = 0; i < s->features; i++) x[i] = (float)stoke_rng_normal(&r);
  if (s->learnable) {
    int best = 0;
    double best_v = -1e300;
    for (int64_t c = 0; c < s->info.classes; c++) {
      const float *w = s->w + c * s->features;
      double v = 0;
      for (int64_t i = 0; i < s->features; i++) v += (double)w[i] * x[i];
      if (v > best_v) best_v = v, best = (int)c;
    }
    *label = best;
    if (s->noise > 0 && stoke_rng_uniform(&r) < s->noise) *label = (int32_t)stoke_rng_below(&r, (uint64_t)s->info.classes);
  } else {
    *label = (int32_t)stoke_rng_below(&r, (uint64_t)s->info.classes);
  }
  return NULL;
}

static const stoke_source_v1 source = {
    STOKE_ABI(stoke_source_v1),
    "synthetic", "seeded random samples; learnable labels from a fixed linear map",
    keys, sizeof keys / sizeof *keys, synth_open, synth_close, synth_length, synth_info, synth_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_source(r->self, &source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "synthetic", "synthetic data source", reg};
