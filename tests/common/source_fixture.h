/* tests/common/source_fixture.h: a data source plugin opened through the
 * core as a run opens it (registry, declared keys, a [data] section), for
 * the source tests (tests/jpeg, tests/lmdb). */
#ifndef STOKE_TESTS_SOURCE_FIXTURE_H
#define STOKE_TESTS_SOURCE_FIXTURE_H

#include <stdio.h>
#include <string.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/registry.h"

typedef struct opened {
  stoke_registry *reg;
  stoke_cfg *cfg;
  const stoke_source_v1 *src;
  void *self;
} opened;

/* Load `plugin` (a path), find source `name`, and open it from "[SECTION]\n"
 * followed by `keys` (the source's keys, one per line): [data] or
 * [eval_data], as a run opens its training and evaluation sources. */
static inline stoke_err *open_source_sec(opened *o, const char *plugin, const char *name, const char *section,
                                         const char *keys) {
  memset(o, 0, sizeof *o);
  STOKE_PROPAGATE(stoke_registry_new(&o->reg));
  STOKE_PROPAGATE(stoke_registry_load(o->reg, plugin));
  o->src = stoke_find_source(o->reg, name);
  if (!o->src) return STOKE_ERR(STOKE_E_NOT_FOUND, "no source '%s' after loading %s", name, plugin);
  o->cfg = stoke_cfg_new();
  STOKE_PROPAGATE(stoke_cfg_declare(o->cfg, section, NULL, o->src->keys, o->src->n_keys));
  char ini[8192 + 32];
  snprintf(ini, sizeof ini, "[%s]\n%s", section, keys);
  STOKE_PROPAGATE(stoke_cfg_load_string(o->cfg, "test.ini", ini));
  STOKE_PROPAGATE(stoke_cfg_validate(o->cfg));
  return o->src->open(o->cfg, section, &o->self);
}

/* The same in [data]. */
static inline stoke_err *open_source_from(opened *o, const char *plugin, const char *name, const char *data_keys) {
  return open_source_sec(o, plugin, name, "data", data_keys);
}

static inline void close_source(opened *o) {
  if (o->self) o->src->close(o->self);
  if (o->cfg) stoke_cfg_free(o->cfg);
  if (o->reg) stoke_registry_free(o->reg);
  memset(o, 0, sizeof *o);
}

#endif
