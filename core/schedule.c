/* core/schedule.c: learning-rate schedules (warm-up, then constant, cosine
 * or step decay) and the linear scaling rule, from [optimizer]. */
#include <math.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/run_config.h"
#include "stoke/schedule.h"

double stoke_lr_at(const stoke_lr_schedule *s, int64_t step) {
  if (s->warmup_steps > 0 && step <= s->warmup_steps)
    return s->base_lr * (double)step / (double)s->warmup_steps;
  int64_t t = step - s->warmup_steps; /* steps since warm-up, 1-based */
  switch (s->kind) {
    case STOKE_LR_COSINE: {
      /* nanoGPT's get_lr: from base_lr where the warm-up ends (its last step, or step 1 without one) down to
       * min_lr at the run's last step, which runs at min_lr */
      int64_t span = s->total_steps - s->warmup_steps;
      if (span <= 0) return s->base_lr;
      double frac = s->warmup_steps > 0 ? (double)t / (double)span : span > 1 ? (double)(t - 1) / (double)(span - 1) : 1;
      if (frac > 1) frac = 1;
      return s->min_lr + 0.5 * (s->base_lr - s->min_lr) * (1 + cos(M_PI * frac));
    }
    case STOKE_LR_STEP:
      return s->step_every > 0 ? s->base_lr * pow(s->gamma, (double)((t - 1) / s->step_every))
                               : s->base_lr;
    default:
      return s->base_lr;
  }
}

stoke_err *stoke_lr_schedule_make(const stoke_run_config *rc, int64_t total_steps, int64_t steps_per_epoch,
                                  int64_t global_batch, stoke_lr_schedule *out) {
  const stoke_cfg *c = rc->cfg;
  double warmup = rc->optimizer.warmup_epochs;
  *out = (stoke_lr_schedule){0};
  out->kind = rc->optimizer.schedule;
  /* Goyal et al.: lr = base lr x global batch / base batch */
  double lr = rc->optimizer.lr;
  out->base_lr = rc->optimizer.lr_scale_with_batch ? lr * (double)global_batch / (double)rc->optimizer.base_batch : lr;
  out->warmup_steps = (int64_t)llround(warmup * (double)steps_per_epoch);
  if (out->warmup_steps >= total_steps && warmup > 0)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [optimizer] warmup_epochs = %g is %lld steps, not shorter than the run's %lld: lower "
                     "warmup_epochs (below %g; 0: no warmup) or train longer ([run] steps or epochs)",
                     stoke_cfg_where(c, "optimizer", "warmup_epochs"), warmup,
                     (long long)out->warmup_steps, (long long)total_steps,
                     (double)total_steps / (double)(steps_per_epoch > 0 ? steps_per_epoch : 1));
  out->total_steps = total_steps;
  /* min_lr scales with lr (the schedule's shape stays what the INI says) */
  out->min_lr = rc->optimizer.lr_scale_with_batch && lr > 0 ? rc->optimizer.min_lr * out->base_lr / lr
                                                           : rc->optimizer.min_lr;
  if (out->kind == STOKE_LR_COSINE && out->min_lr > out->base_lr)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [optimizer] min_lr = %g is above lr = %g: the cosine \"decay\" would raise the rate to "
                     "min_lr by the last step; set min_lr at or below lr (nanoGPT's is lr / 10)",
                     stoke_cfg_where(c, "optimizer", stoke_cfg_is_set(c, "optimizer", "min_lr") ? "min_lr" : "lr"),
                     out->min_lr, out->base_lr);
  out->step_every = (int64_t)llround(rc->optimizer.step_epochs * (double)steps_per_epoch);
  if (out->kind == STOKE_LR_STEP && out->step_every < 1)
    return STOKE_ERR(STOKE_E_INVALID, "%s: [optimizer] schedule = step needs step_epochs > 0",
                     stoke_cfg_where(c, "optimizer", "step_epochs"));
  out->gamma = rc->optimizer.gamma;
  return NULL;
}

stoke_err *stoke_lr_from_config(const stoke_cfg *c, int64_t total_steps, int64_t steps_per_epoch,
                                int64_t global_batch, stoke_lr_schedule *out) {
  stoke_run_config rc;
  STOKE_PROPAGATE(stoke_run_config_read(c, &rc));
  return stoke_lr_schedule_make(&rc, total_steps, steps_per_epoch, global_batch, out);
}
