/* tests/unit/plugins/failreg.c: a plugin whose register function adds an op
 * and then fails; none of what it added may stay registered (loader tests). */
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                        stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static const stoke_op_type_v1 failreg_op = {
    STOKE_ABI(stoke_op_type_v1),
    .name = "test_failreg_op", .help = "must not survive", .n_inputs = 1, .n_outputs = 1,
    .infer = infer};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_op(r->self, &failreg_op));
  return STOKE_PERR(STOKE_E_INVALID, "failreg: refusing to finish registering (on purpose)");
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "failreg", "loader test: register fails", reg};
