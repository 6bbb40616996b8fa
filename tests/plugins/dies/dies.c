/* tests/plugins/dies: a library on the plugin search path that ends the
 * process while it is being loaded, as an ASan-built plugin does in a normal
 * process ("ASan runtime does not come first", then exit 1). stoke loads
 * every plugin on the path only to list what is there (after a typo, and
 * --help-config: stoke_registry_load_every), each first in a child process:
 * train_test and train_cli_test check that the listing still comes. Its
 * exit code is 1, or STOKE_TEST_DIES_CODE (0: a library that ends the
 * process "successfully", which the child's exit code cannot tell apart). */
#include <stdlib.h>
#include <unistd.h>

#include "stoke/plugin.h"

__attribute__((constructor)) static void die_on_load(void) {
  const char *code = getenv("STOKE_TEST_DIES_CODE");
  _exit(code ? atoi(code) : 1);
}

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) { return NULL; }

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "dies",
                                                            "dies while it is loaded (a test)", reg};
