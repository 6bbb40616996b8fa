/* core/eval.c: evaluation's arithmetic on logits read back from the device
 * (see stoke/eval.h): cross-entropy and top-1 per row, over any number of
 * classes, in double. */
#include <math.h>

#include "stoke/core.h"
#include "stoke/eval.h"

/* One row: the log-sum-exp in one pass (the running max rescales the
 * running sum when it grows), the first argmax, the label's logit. */
static void row_stats(const void *logits, stoke_dtype dt, int64_t base, int64_t classes, double *lse,
                      int64_t *argmax) {
  double mx = -INFINITY, sum = 0;
  *argmax = 0;
  for (int64_t c = 0; c < classes; c++) {
    double v = stoke_elem_get(logits, dt, base + c);
    if (v > mx) {
      sum = sum * exp(mx - v) + 1; /* exp(-inf) = 0 on the first class */
      mx = v;
      *argmax = c;
    } else {
      sum += exp(v - mx);
    }
  }
  *lse = mx + log(sum);
}

stoke_err *stoke_eval_rows(const void *logits, stoke_dtype dt, int64_t rows, int64_t classes,
                           const int32_t *labels, stoke_eval_sums *s) {
  for (int64_t r = 0; r < rows; r++)
    if (labels[r] < 0 || labels[r] >= classes)
      return STOKE_ERR(STOKE_E_DATA, "evaluation: row %lld has label %d, outside [0, %lld) of the model's classes",
                       (long long)r, labels[r], (long long)classes);
  for (int64_t r = 0; r < rows; r++) {
    double lse;
    int64_t best;
    row_stats(logits, dt, r * classes, classes, &lse, &best);
    s->loss += lse - stoke_elem_get(logits, dt, r * classes + labels[r]);
    s->correct += best == labels[r];
    s->count++;
  }
  return NULL;
}
