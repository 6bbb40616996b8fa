/* tests/unit/plugins/good.c: a well-formed test plugin for the loader tests
 * (tests/unit/plugin_test.c); it registers one op type, "test_good_op". */
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

/* The output is shaped and typed like the input. */
static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                        stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

/* One FLOP an element. */
static double flops(const stoke_node_v1 *n, const stoke_value_desc_v1 *in,
                    const stoke_value_desc_v1 *out) {
  return (double)stoke_numel(&in[0].shape);
}

static const stoke_op_type_v1 good_op = {
    STOKE_ABI(stoke_op_type_v1),
    .name = "test_good_op",
    .help = "identity-shaped op from the loader tests' good plugin",
    .n_inputs = 1,
    .n_outputs = 1,
    .infer = infer,
    .flops = flops,
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_op(r->self, &good_op);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "good", "loader test: a good plugin", reg};
