/* tests/unit/plugins/dup2.c: a plugin that registers "test_dup2_op", then
 * "test_good_op" again (taken by the good plugin): duplicates across files. */
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                        stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static const stoke_op_type_v1 ops[] = {
    {STOKE_ABI(stoke_op_type_v1), .name = "test_dup2_op", .help = "added before the clash", .n_inputs = 1, .n_outputs = 1,
     .infer = infer},
    {STOKE_ABI(stoke_op_type_v1), .name = "test_good_op", .help = "clashes with the good plugin", .n_inputs = 1,
     .n_outputs = 1, .infer = infer},
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  for (unsigned i = 0; i < sizeof ops / sizeof *ops; i++)
    STOKE_PROPAGATE_P(r->add_op(r->self, &ops[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "dup2", "loader test: duplicates test_good_op",
    reg};
