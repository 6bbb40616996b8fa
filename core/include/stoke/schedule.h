/* stoke/schedule.h: learning-rate schedules: linear warm-up, then constant,
 * cosine or step decay; optional linear scaling with the global batch. */
#ifndef STOKE_SCHEDULE_H
#define STOKE_SCHEDULE_H

#include <stdint.h>

#include "stoke/plugin.h"

typedef enum { STOKE_LR_CONSTANT = 0, STOKE_LR_COSINE, STOKE_LR_STEP } stoke_lr_kind;

typedef struct stoke_lr_schedule {
  stoke_lr_kind kind;
  double base_lr;        /* after the linear scaling rule, if on */
  int64_t warmup_steps;  /* linear from base_lr/warmup_steps up to base_lr */
  int64_t total_steps;   /* cosine: min_lr at total_steps, the last step */
  double min_lr;         /* cosine floor */
  int64_t step_every;    /* step: multiply by gamma every step_every steps */
  double gamma;
} stoke_lr_schedule;

/* The lr of optimizer step `step` (1-based): a linear warm-up to base_lr
 * at step warmup_steps, then constant, StepLR's steps, or nanoGPT's cosine
 * (get_lr), which falls from base_lr at the warm-up's last step (step 1
 * without one) to min_lr at step total_steps, the run's last. */
double stoke_lr_at(const stoke_lr_schedule *s, int64_t step);

struct stoke_run_config;

/* The schedule of a config read once (stoke/run_config.h): [optimizer]'s
 * lr, schedule, warmup_epochs, min_lr, step_epochs, gamma,
 * lr_scale_with_batch and base_batch, given the run's length and the
 * global batch. Errors name the key's file:line. */
stoke_err *stoke_lr_schedule_make(const struct stoke_run_config *rc, int64_t total_steps, int64_t steps_per_epoch,
                                  int64_t global_batch, stoke_lr_schedule *out);

/* The same from a config not read yet (the core's keys declared). */
stoke_err *stoke_lr_from_config(const stoke_cfg *c, int64_t total_steps, int64_t steps_per_epoch,
                                int64_t global_batch, stoke_lr_schedule *out);

#endif
