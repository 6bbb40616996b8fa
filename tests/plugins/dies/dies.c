/* tests/plugins/dies: a library on the plugin search path that ends the
 * process while it is being loaded, as an ASan-built plugin does in a normal
 * process ("ASan runtime does not come first", then exit 1). stoke loads
 * every plugin on the path only to list what is available after a typo
 * (core/run.c list_available), in a child process: train_test checks that
 * the message still comes. */
#include <unistd.h>

#include "stoke/plugin.h"

__attribute__((constructor)) static void die_on_load(void) { _exit(1); }

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) { return NULL; }

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "dies",
                                                            "dies while it is loaded (a test)", reg};
