/* tests/fuzz/ini_fuzz.c: fuzz target of the INI config: the core's keys
 * declared, the bytes loaded as run.ini (inih and stoke's own checks),
 * validated, read by type and printed back as the resolved config. Lines
 * after a line "%%" are command-line overrides (section.key=value). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/run.h"

static void drop(stoke_err *e) {
  if (e) stoke_err_free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  char *over = strstr(text, "\n%%\n");
  if (over) {
    *over = 0;
    over += 4;
  }
  stoke_cfg *c = stoke_cfg_new();
  stoke_err *e = stoke_declare_core_keys(c);
  if (!e) e = stoke_cfg_load_string(c, "fuzz.ini", text);
  for (char *line = over; !e && line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    e = stoke_cfg_override(c, line);
    line = nl ? nl + 1 : NULL;
  }
  if (!e) e = stoke_cfg_validate(c);
  if (!e) {
    /* what a run reads first, each by its type */
    int64_t i, ints[64];
    double f;
    int b, n;
    const char *s, *list[64];
    drop(stoke_cfg_int(c, "run", "steps", &i));
    drop(stoke_cfg_int(c, "run", "seed", &i));
    drop(stoke_cfg_int(c, "run", "accumulate", &i));
    drop(stoke_cfg_int(c, "data", "batch_size", &i));
    drop(stoke_cfg_float(c, "optimizer", "lr", &f));
    drop(stoke_cfg_bool(c, "run", "cuda_graph", &b));
    drop(stoke_cfg_str(c, "run", "out_dir", &s));
    drop(stoke_cfg_list(c, "run", "backends", list, &n));
    drop(stoke_cfg_ints(c, "model", "hidden", ints, &n));
    (void)stoke_cfg_where(c, "run", "steps");
    (void)stoke_cfg_is_set(c, "data", "source");
    FILE *null = fopen("/dev/null", "w");
    if (null) {
      stoke_cfg_dump(c, null);
      fclose(null);
    }
  }
  drop(e);
  stoke_cfg_free(c);
  free(text);
  return 0;
}
