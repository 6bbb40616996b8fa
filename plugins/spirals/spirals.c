/* plugins/spirals: the example source plugin: two interleaved spirals in
 * the plane, one class each (the classic two-spirals task), with Gaussian
 * noise. Sample i is a function of (data_seed, offset + i) alone, so a
 * held-out set is the same data_seed with an offset past the training
 * length; read() is deterministic and safe on several threads at once, as
 * the loader needs (`plugin_check libstoke_spirals.so` checks both). */
#include <math.h>
#include <stdlib.h>

#include "stoke/plugin.h"
#include "stoke/rng.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

const stoke_host_v1 *stoke_host;

typedef struct spirals {
  int64_t length, offset;
  double turns, noise;
  uint64_t data_seed;
} spirals;

static const stoke_cfg_key_v1 keys[] = {
    {"length", STOKE_CFG_INT, "4096", 2, 1e12, NULL, "samples"},
    {"turns", STOKE_CFG_FLOAT, "1.5", 0.1, 10, NULL, "turns of each spiral"},
    {"noise", STOKE_CFG_FLOAT, "0.05", 0, 1, NULL, "standard deviation of the noise added to each point"},
    {"data_seed", STOKE_CFG_INT, "7", 0, 9.2e18, NULL, "seed of the data set itself"},
    {"offset", STOKE_CFG_INT, "0", 0, 1e15, NULL, "index of the first sample (held-out data: past the training length)"},
};

static stoke_err *sp_open(const stoke_cfg *c, const char *sec, void **self) {
  spirals *s = calloc(1, sizeof *s);
  if (!s) return STOKE_PERR(STOKE_E_OOM, "spirals: out of memory");
  int64_t seed = 0;
  stoke_err *e = stoke_host->cfg_int(c, sec, "length", &s->length);
  if (!e) e = stoke_host->cfg_int(c, sec, "offset", &s->offset);
  if (!e) e = stoke_host->cfg_int(c, sec, "data_seed", &seed);
  if (!e) e = stoke_host->cfg_float(c, sec, "turns", &s->turns);
  if (!e) e = stoke_host->cfg_float(c, sec, "noise", &s->noise);
  if (e) {
    free(s);
    return e;
  }
  s->data_seed = (uint64_t)seed;
  *self = s;
  return NULL;
}

static void sp_close(void *self) { free(self); }
static int64_t sp_length(void *self) { return ((spirals *)self)->length; }

static stoke_err *sp_info(void *self, stoke_sample_info_v1 *o) {
  *o = (stoke_sample_info_v1){.shape = {1, {2}}, .dtype = STOKE_F32, .layout = STOKE_LAYOUT_ANY, .classes = 2};
  return NULL;
}

/* Class y = i % 2; t uniform in [0, 1): the point at radius t, angle
 * 2 pi turns t (+ pi for class 1), plus noise. */
static stoke_err *sp_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  const spirals *s = self;
  int64_t i = s->offset + index;
  stoke_rng r = stoke_rng_seed(stoke_hash3(s->data_seed, (uint64_t)i, 0x5b1));
  int y = (int)(i % 2);
  double t = stoke_rng_uniform(&r), a = 2 * M_PI * s->turns * t + M_PI * y;
  float *x = dst;
  x[0] = (float)(t * cos(a) + s->noise * stoke_rng_normal(&r));
  x[1] = (float)(t * sin(a) + s->noise * stoke_rng_normal(&r));
  *label = y; /* classes count from 0 */
  return NULL;
}

static const stoke_source_v1 source = {STOKE_ABI(stoke_source_v1), "spirals", "two interleaved spirals, 2 classes",
                                       keys, sizeof keys / sizeof *keys, sp_open, sp_close, sp_length, sp_info,
                                       sp_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_source(r->self, &source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "spirals",
                                                            "example source plugin: two spirals", reg};
