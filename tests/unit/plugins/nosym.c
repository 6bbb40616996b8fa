/* tests/unit/plugins/nosym.c: a shared object that is not a stoke plugin:
 * it exports a function but no stoke_plugin_v1_entry (loader tests). */
#include "stoke/plugin.h"

STOKE_EXPORT int stoke_test_nosym_hello(void) { return 42; }
