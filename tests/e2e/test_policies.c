/* tests/e2e/test_policies.c: precision policies the CPU can run, from a
 * plugin built from the SDK alone like any user's, for the end-to-end
 * tests of the precision interface: f64 with f32 islands (linear and the
 * loss), f32 with a static and with a dynamic loss scale, f32 with an f64
 * master copy. */
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

#define POLICY(NAME, HELP, PARAM, MASTER, ISLANDS, SCALING, SCALE)                                        \
  {STOKE_ABI(stoke_precision_v1), .name = NAME, .help = HELP, .param_dtype = PARAM, .compute_dtype = PARAM,  \
   .master_dtype = MASTER, .fp32_ops = ISLANDS, .loss_scaling = SCALING, .init_scale = SCALE,                \
   .growth_interval = 4}

static const stoke_precision_v1 policies[] = {
    POLICY("test_f64_f32islands", "f64, linear and softmax_ce in f32", STOKE_F64, STOKE_F64, "linear, softmax_ce",
           STOKE_SCALING_NONE, 1),
    POLICY("test_fp32_static", "f32, a static loss scale of 1024", STOKE_F32, STOKE_F32, "", STOKE_SCALING_STATIC,
           1024),
    POLICY("test_fp32_dynamic", "f32, a dynamic loss scale from 2^20, doubling every 4 clean steps", STOKE_F32,
           STOKE_F32, "", STOKE_SCALING_DYNAMIC, 1048576),
    POLICY("test_fp32_master64", "f32 parameters, the optimizer on an f64 master copy", STOKE_F32, STOKE_F64, "",
           STOKE_SCALING_NONE, 1),
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  for (size_t i = 0; i < sizeof policies / sizeof *policies; i++)
    STOKE_PROPAGATE_P(r->add_precision(r->self, &policies[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1),
                                                            "test_policies", "CPU precision policies for tests",
                                                            reg};
