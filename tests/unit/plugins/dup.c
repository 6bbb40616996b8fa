/* tests/unit/plugins/dup.c: a plugin that registers the op type "relu",
 * already taken by the core's built-in plugin (duplicate-name tests). */
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                        stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static const stoke_op_type_v1 relu_again = {
    STOKE_ABI(stoke_op_type_v1),
    .name = "relu", .help = "a second relu", .n_inputs = 1, .n_outputs = 1, .infer = infer};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_op(r->self, &relu_again);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "dup", "loader test: duplicates relu", reg};
