/* tests/plugins/newuser/rings.c: the source a new user wrote from
 * plugins/README.md and the SDK headers alone (issue 18's trial):
 * concentric rings in the plane, one class per ring (`rings` of them),
 * radius 1, 2, ... plus Gaussian noise, scaled into [-1, 1]. Sample i
 * depends on (data_seed, offset + i) alone. */
#include <math.h>
#include <stdlib.h>

#include "stoke/plugin.h"
#include "stoke/rng.h"

const stoke_host_v1 *stoke_host;

typedef struct rings {
  int64_t length, offset, rings;
  double noise;
  uint64_t data_seed;
} rings;

static const stoke_cfg_key_v1 keys[] = {
    {"length", STOKE_CFG_INT, "4096", 2, 1e12, NULL, "samples"},
    {"rings", STOKE_CFG_INT, "3", 2, 100, NULL, "rings, one class each"},
    {"noise", STOKE_CFG_FLOAT, "0.15", 0, 10, NULL, "standard deviation of the radial noise"},
    {"data_seed", STOKE_CFG_INT, "11", 0, 9.2e18, NULL, "seed of the data set itself"},
    {"offset", STOKE_CFG_INT, "0", 0, 1e15, NULL, "index of the first sample (held-out data: past the training length)"},
};

static stoke_err *r_open(const stoke_cfg *c, const char *sec, void **self) {
  rings *s = calloc(1, sizeof *s);
  if (!s) return STOKE_PERR(STOKE_E_OOM, "rings: out of memory");
  int64_t seed = 0;
  stoke_err *e = stoke_host->cfg_int(c, sec, "length", &s->length);
  if (!e) e = stoke_host->cfg_int(c, sec, "rings", &s->rings);
  if (!e) e = stoke_host->cfg_int(c, sec, "offset", &s->offset);
  if (!e) e = stoke_host->cfg_int(c, sec, "data_seed", &seed);
  if (!e) e = stoke_host->cfg_float(c, sec, "noise", &s->noise);
  if (e) {
    free(s);
    return e;
  }
  s->data_seed = (uint64_t)seed;
  *self = s;
  return NULL;
}

static void r_close(void *self) { free(self); }
static int64_t r_length(void *self) { return ((rings *)self)->length; }

static stoke_err *r_info(void *self, stoke_sample_info_v1 *o) {
  *o = (stoke_sample_info_v1){.shape = {1, {2}}, .dtype = STOKE_F32, .layout = STOKE_LAYOUT_ANY,
                              .classes = ((rings *)self)->rings};
  return NULL;
}

static stoke_err *r_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  const rings *s = self;
  int64_t i = s->offset + index;
  stoke_rng r = stoke_rng_seed(stoke_hash3(s->data_seed, (uint64_t)i, 0x121));
  int32_t y = (int32_t)(i % s->rings);
  double a = 2 * M_PI * stoke_rng_uniform(&r), rad = 1 + y + s->noise * stoke_rng_normal(&r);
  float *x = dst;
  x[0] = (float)(rad * cos(a) / s->rings);
  x[1] = (float)(rad * sin(a) / s->rings);
  *label = y;
  return NULL;
}

static const stoke_source_v1 source = {STOKE_ABI(stoke_source_v1), "rings", "concentric rings, one class each", keys,
                                       sizeof keys / sizeof *keys, r_open, r_close, r_length, r_info, r_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_source(r->self, &source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "rings",
                                                            "synthetic concentric rings", reg};
