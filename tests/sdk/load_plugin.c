/* tests/sdk/load_plugin.c: `load_plugin NAME OP` loads libstoke_NAME.so
 * through the core's loader and checks it registered op OP. */
#include <stdio.h>

#include "stoke/core.h"
#include "stoke/registry.h"

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  stoke_registry *r;
  stoke_err *e = stoke_registry_new(&r);
  if (!e) e = stoke_registry_load(r, argv[1]);
  if (e) {
    fprintf(stderr, "FAIL: %s\n", e->msg);
    stoke_err_free(e);
    return 1;
  }
  int ok = stoke_find_op(r, argv[2]) != NULL;
  if (!ok) fprintf(stderr, "FAIL: plugin %s registered no op %s\n", argv[1], argv[2]);
  stoke_registry_free(r);
  return ok ? 0 : 1;
}
