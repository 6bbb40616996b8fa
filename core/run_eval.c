/* core/run_eval.c: evaluation on [eval_data] with the forward-only plan:
 * mean cross-entropy and top-1 accuracy of a classifier, or a language
 * model's mean next-token loss; data parallel ranks sum their shards. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/eval.h"
#include "run_state.h"

/* stoke_eval_rows over the rows the loader could read: a row it could not
 * read has label -1 and is left out, never counted. */
static stoke_err *eval_readable_rows(const void *logits, stoke_dtype dt, int64_t rows, int64_t classes,
                                     const int32_t *labels, stoke_eval_sums *sums) {
  size_t row_bytes = (size_t)classes * stoke_dtype_size(dt);
  for (int64_t r = 0; r < rows;) {
    int64_t end = r;
    while (end < rows && labels[end] >= 0) end++;
    if (end > r)
      STOKE_PROPAGATE(stoke_eval_rows((const char *)logits + (size_t)r * row_bytes, dt, end - r, classes,
                                      labels + r, sums));
    r = end + 1; /* past the unreadable row */
  }
  return NULL;
}

/* The next evaluation batch into the forward plan's input (host_labels:
 * a host copy of its labels, or NULL), unless a signal came:
 * STOKE_E_INTERRUPTED. */
static stoke_err *next_batch(run_state *s, int32_t *host_labels, stoke_fed *fed) {
  if (run_stop_now(s)) return STOKE_ERR(STOKE_E_INTERRUPTED, "evaluation interrupted");
  return run_feed(&s->eval, host_labels, fed, NULL);
}

/* A language model's evaluation: the mean next-token cross-entropy over
 * every whole batch, computed on the device by the loss node (the logits
 * of a GPT-2 batch, 1.6 GB, never travel); a last partial batch is left
 * out, and so is a batch holding a window the source could not read (the
 * loader fills it with zeros and marks its label -1: scored, its zeros
 * would pass for text). No accuracy (NaN), as nanoGPT's estimate_loss. */
static stoke_err *evaluate_lm(run_state *s, stoke_summary *sum) {
  stream *st = &s->eval;
  double total = 0, count = 0, l;
  int64_t nb = stoke_loader_batches_per_epoch(st->loader), left_out = 0, unreadable = 0;
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)st->batch);
  stoke_err *e = labels ? NULL : STOKE_ERR(STOKE_E_OOM, "out of memory for evaluation");
  for (int64_t i = 0; i < nb && !e; i++) {
    stoke_fed fed;
    if ((e = next_batch(s, labels, &fed))) break;
    if (fed.n < st->batch) { /* a last partial batch: fed, not run */
      left_out += fed.n;
      continue;
    }
    int bad = 0;
    for (int64_t r = 0; r < fed.n; r++) bad += labels[r] < 0;
    if (bad) {
      unreadable += fed.n;
      continue;
    }
    e = stoke_exec_forward_backward(st->x, 1, 0);
    if (!e) e = stoke_exec_read_loss(st->x, &l);
    if (!e) total += l, count += 1;
  }
  if (!e && s->dp) { /* each rank evaluated its shard */
    double v[2] = {total, count};
    e = stoke_dp_sum(s->dp, v, 2);
    total = v[0], count = v[1];
  }
  free(labels);
  if (!e && !count)
    e = STOKE_ERR(STOKE_E_DATA, "%s: [eval_data] gave no whole batch of %lld readable sequences to evaluate%s",
                  stoke_cfg_where(s->cfg, "eval_data", "batch_size"), (long long)st->batch,
                  unreadable ? " (batches with an unreadable window are left out: each window is in the log with "
                               "its reason)" : "");
  if (e) return e->code == STOKE_E_INTERRUPTED ? e : stoke_err_wrap(e, __FILE__, __LINE__, "evaluating on [eval_data]");
  if (left_out) stoke_log(STOKE_LOG_DEBUG, "eval", "a last partial batch of %lld sequences left out", (long long)left_out);
  if (unreadable)
    stoke_log(STOKE_LOG_WARN, "eval", "%lld sequences in batches holding an unreadable window were left out of the "
              "evaluation loss (each window is in the log with its reason)", (long long)unreadable);
  sum->eval_loss = total / count;
  sum->eval_accuracy = NAN;
  sum->eval_samples = (int64_t)count * st->batch;
  return NULL;
}

/* One pass over the evaluation data with the forward-only plan: mean
 * cross-entropy and top-1 accuracy over every sample that could be read
 * (a last partial batch counts only its real rows; the loader marks an
 * unreadable sample with label -1 instead of replacing it). A signal
 * stops it (STOKE_E_INTERRUPTED). A language model: evaluate_lm. */
stoke_err *run_evaluate(run_state *s, stoke_summary *sum) {
  stream *st = &s->eval;
  if (st->lm) return evaluate_lm(s, sum);
  const stoke_value *lv = &st->g->values[st->g->logits];
  int64_t classes = lv->shape.d[1];
  size_t lbytes = (size_t)stoke_numel(&lv->shape) * stoke_dtype_size(lv->dtype);
  void *logits = malloc(lbytes);
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)st->batch);
  if (!logits || !labels) {
    free(logits);
    free(labels);
    return STOKE_ERR(STOKE_E_OOM, "out of memory for evaluation");
  }
  stoke_eval_sums sums = {0};
  stoke_err *e = NULL;
  int64_t nb = stoke_loader_batches_per_epoch(st->loader);
  for (int64_t i = 0; i < nb && !e; i++) {
    stoke_fed fed;
    if ((e = next_batch(s, labels, &fed))) break;
    e = stoke_exec_forward_backward(st->x, 1, 0);
    if (!e) e = stoke_exec_read(st->x, st->g->logits, logits, lbytes);
    if (!e) e = eval_readable_rows(logits, lv->dtype, fed.n, classes, labels, &sums); /* the graph's dtype */
  }
  free(logits);
  free(labels);
  if (!e && s->dp) { /* each rank evaluated its shard */
    double v[3] = {sums.loss, (double)sums.correct, (double)sums.count};
    e = stoke_dp_sum(s->dp, v, 3);
    sums.loss = v[0], sums.correct = (int64_t)v[1], sums.count = (int64_t)v[2];
  }
  if (!e && !sums.count)
    e = STOKE_ERR(STOKE_E_DATA, "%s: no sample of [eval_data] could be read (each is in the log with its reason)",
                  stoke_cfg_where(s->cfg, "eval_data", "source"));
  if (e) return e->code == STOKE_E_INTERRUPTED ? e : stoke_err_wrap(e, __FILE__, __LINE__, "evaluating on [eval_data]");
  sum->eval_loss = sums.loss / (double)sums.count;
  sum->eval_accuracy = (double)sums.correct / (double)sums.count;
  sum->eval_samples = sums.count;
  return NULL;
}
