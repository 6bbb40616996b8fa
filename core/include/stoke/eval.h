/* stoke/eval.h: evaluation's arithmetic on logits read back from the
 * device: per-row cross-entropy and top-1 over any number of classes. */
#ifndef STOKE_EVAL_H
#define STOKE_EVAL_H

#include <stdint.h>

#include "stoke/status.h"
#include "stoke/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Running totals of an evaluation pass. */
typedef struct stoke_eval_sums {
  double loss;     /* sum of -log softmax(logits)[label] */
  int64_t correct; /* rows whose argmax (the first, on ties) is the label */
  int64_t count;   /* rows seen */
} stoke_eval_sums;

/* Adds `rows` rows of host logits [rows, classes] in dtype `dt` against
 * `labels` to `s`, streaming the max and the log-sum-exp over every class
 * (no per-row buffer: any vocabulary size). A label outside [0, classes)
 * is an error naming the row and the label; nothing is added then. */
stoke_err *stoke_eval_rows(const void *logits, stoke_dtype dt, int64_t rows, int64_t classes,
                           const int32_t *labels, stoke_eval_sums *s);

#ifdef __cplusplus
}
#endif
#endif
