/* tests/unit/plugins/badabi.c: a plugin built for a future ABI version
 * (STOKE_ABI_VERSION + 1), which the loader must refuse (loader tests). */
#include "stoke/plugin.h"

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) { return NULL; }

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION + 1, sizeof(stoke_plugin_v1), "badabi", "loader test: wrong ABI version",
    reg};
