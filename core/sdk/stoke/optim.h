/* stoke/optim.h: what every optimizer's CPU update kernel does besides its
 * own arithmetic, so a plugin optimizer honours the core's hooks by calling
 * two functions: the step's learning rate, bias-correction step and
 * gradient factor (CUDA graphs' live values, the loss scaler's skip and
 * unscale, the clipping factor), and weight decay by parameter group.
 * Plain C, static inline; the cpu backend's sgd and adamw use it too. */
#ifndef STOKE_OPTIM_H
#define STOKE_OPTIM_H

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This update, as the hooks make it. */
typedef struct stoke_opt_step {
  double lr;    /* the learning rate (from opt->live under CUDA graphs) */
  double t;     /* the applied update this is, 1 for the first: steps the loss scaler skipped do not count */
  double scale; /* multiply each gradient by this: grad_scale / loss scale x clipping factor */
} stoke_opt_step;

/* Fills *s; returns 0 when the loss scaler skips this step (inf/NaN
 * gradients): the kernel must then change nothing. */
static inline int stoke_opt_begin(const stoke_opt_args_v1 *o, stoke_opt_step *s) {
  s->lr = o->live ? o->live[0] : o->lr;
  s->t = o->live ? o->live[1] : (double)o->step;
  s->scale = o->grad_scale;
  if (o->amp) {
    if (o->amp[2] != 0.0f) return 0;
    s->scale /= (double)o->amp[0];
    s->t -= (double)o->amp[3];
  }
  if (o->clip) s->scale *= (double)o->clip[1];
  return 1;
}

/* Whether element i of the flat buffer gets weight decay. *cursor starts
 * at 0 and belongs to one pass over increasing i. */
static inline int stoke_opt_decays(const stoke_opt_args_v1 *o, int *cursor, int64_t i) {
  if (!o->decay_ranges) return 1;
  while (*cursor < o->n_decay_ranges && o->decay_ranges[2 * *cursor + 1] <= i) (*cursor)++;
  return *cursor < o->n_decay_ranges && o->decay_ranges[2 * *cursor] <= i;
}

#ifdef __cplusplus
}
#endif
#endif
