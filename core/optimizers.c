/* core/optimizers.c: the built-in optimizers, sgd (momentum, Nesterov) and
 * adamw, as stoke_optimizer_v1 parts like any plugin's: their keys, state
 * tensors and configure(). Their update kernels are in the backends (cpu
 * reference, cuda). */
#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/ops.h"

static const stoke_cfg_key_v1 sgd_keys[] = {
    {"momentum", STOKE_CFG_FLOAT, "0.9", 0, 1, NULL, "SGD momentum (0: plain SGD)"},
    {"nesterov", STOKE_CFG_BOOL, "false", 0, 0, NULL, "SGD Nesterov momentum"},
};

static stoke_err *sgd_configure(const stoke_cfg *c, const char *sec, stoke_opt_args_v1 *a) {
  STOKE_PROPAGATE(stoke_cfg_float(c, sec, "momentum", &a->momentum));
  STOKE_PROPAGATE(stoke_cfg_bool(c, sec, "nesterov", &a->nesterov));
  if (a->nesterov && !(a->momentum > 0))
    return STOKE_ERR(STOKE_E_INVALID, "%s: [%s] nesterov = true needs momentum > 0 (it is %g), as torch.optim.SGD",
                     stoke_cfg_where(c, sec, "nesterov"), sec, a->momentum);
  return NULL;
}

static const stoke_cfg_key_v1 adamw_keys[] = {
    {"beta1", STOKE_CFG_FLOAT, "0.9", 0, 1, NULL, "AdamW beta1 (decay of the first moment)"},
    {"beta2", STOKE_CFG_FLOAT, "0.999", 0, 1, NULL, "AdamW beta2 (decay of the second moment; nanoGPT: 0.95)"},
    {"eps", STOKE_CFG_FLOAT, "1e-8", 0, 1, NULL, "AdamW epsilon"},
};

static stoke_err *adamw_configure(const stoke_cfg *c, const char *sec, stoke_opt_args_v1 *a) {
  STOKE_PROPAGATE(stoke_cfg_float(c, sec, "beta1", &a->beta1));
  STOKE_PROPAGATE(stoke_cfg_float(c, sec, "beta2", &a->beta2));
  STOKE_PROPAGATE(stoke_cfg_float(c, sec, "eps", &a->eps));
  const char *bad = a->beta1 >= 1 ? "beta1" : a->beta2 >= 1 ? "beta2" : NULL;
  if (bad)
    return STOKE_ERR(STOKE_E_INVALID, "%s: [%s] %s must be below 1 (betas in [0, 1), as torch.optim.AdamW)",
                     stoke_cfg_where(c, sec, bad), sec, bad);
  return NULL;
}

static const stoke_optimizer_v1 optimizers[] = {
    {STOKE_ABI(stoke_optimizer_v1), STOKE_OP_SGD,
     "torch.optim.SGD (dampening 0): momentum buffer, optional Nesterov, L2 weight decay", sgd_keys,
     (int)(sizeof sgd_keys / sizeof *sgd_keys), 1, {"momentum_buffer"}, sgd_configure},
    {STOKE_ABI(stoke_optimizer_v1), STOKE_OP_ADAMW,
     "torch.optim.AdamW: moments m and v, bias corrections, decoupled weight decay", adamw_keys,
     (int)(sizeof adamw_keys / sizeof *adamw_keys), 2, {"exp_avg", "exp_avg_sq"}, adamw_configure},
};

stoke_err *stoke_register_optimizers(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof optimizers / sizeof *optimizers; i++)
    STOKE_TRY(r->add_optimizer(r->self, &optimizers[i]), "registering optimizer %s", optimizers[i].name);
  return NULL;
}
