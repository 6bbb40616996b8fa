/* core/lm.c: what a language model's graph adds around the model: the
 * tokens it reads and the targets its loss compares against, both cut on
 * the device from a batch of token windows. */
#include <stdio.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

stoke_err *stoke_lm_inputs(stoke_graph *g, int windows, int *tokens, int *targets) {
  const stoke_shape *w = &g->values[windows].shape;
  if (w->ndim != 2 || w->d[1] < 2 || g->values[windows].dtype != STOKE_I32)
    return STOKE_ERR(STOKE_E_INVALID, "a language model's batch must be i32 token windows [B, T + 1], T >= 1");
  int64_t t = w->d[1] - 1;
  char in[64], next[64], flat[32];
  snprintf(in, sizeof in, "dim=1, start=0, length=%lld", (long long)t);
  snprintf(next, sizeof next, "dim=1, start=1, length=%lld", (long long)t);
  snprintf(flat, sizeof flat, "shape=%lld", (long long)(w->d[0] * t));
  stoke_builder_v1 b = stoke_graph_builder(g);
  int shifted;
  STOKE_TRY(b.node(g, STOKE_OP_SLICE, "tokens", &windows, 1, in, tokens, 1), "cutting the model's tokens");
  STOKE_TRY(b.node(g, STOKE_OP_SLICE, "next_tokens", &windows, 1, next, &shifted, 1), "cutting the targets");
  STOKE_TRY(b.node(g, STOKE_OP_RESHAPE, "targets", &shifted, 1, flat, targets, 1), "cutting the targets");
  return NULL;
}
