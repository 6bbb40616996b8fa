/* tests/unit/plugins/badsize.c: a plugin whose entry claims a struct size 8
 * bytes larger than stoke_plugin_v1, which the loader must refuse. */
#include "stoke/plugin.h"

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) { return NULL; }

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1) + 8, "badsize", "loader test: wrong struct size",
    reg};
