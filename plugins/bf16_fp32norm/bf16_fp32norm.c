/* plugins/bf16_fp32norm: an example out-of-tree precision policy, built
 * from the SDK headers alone: bf16 parameters and activations with f32
 * master weights, like the built-in bf16, except that batch norm and the
 * softmax cross-entropy run wholly in f32 (the compiler casts their inputs
 * up and their outputs back). Select it with `[run] precision =
 * bf16_fp32norm`: the plugin is loaded by that name. */
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static const stoke_precision_v1 policy = {
    STOKE_ABI(stoke_precision_v1),
    .name = "bf16_fp32norm",
    .help = "bf16 compute with f32 master weights; batch_norm and softmax_ce computed in f32",
    .param_dtype = STOKE_BF16,
    .compute_dtype = STOKE_BF16,
    .master_dtype = STOKE_F32,
    .tf32 = 1,
    .loss_scaling = STOKE_SCALING_NONE,
    .init_scale = 1,
    .fp32_ops = "batch_norm, softmax_ce",
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_precision(r->self, &policy);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1),
                                                            "bf16_fp32norm",
                                                            "a precision policy: bf16 with fp32 batch norm and loss",
                                                            reg};
