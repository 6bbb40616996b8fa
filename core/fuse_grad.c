/* core/fuse_grad.c: gradient sums accumulated in place. Where a value feeds
 * two nodes (a residual block's input: the main branch's first conv and the
 * shortcut), backward derivation sums the two gradients with an `add` node
 * (core/graph.c). When the kernel that makes the second gradient can add
 * into its output (stoke_kernel_v1.accumulates; the cudnn and cpu conv2d
 * backward for dx), it writes straight into the first gradient with
 * din_accumulate, and the add node, its read of two tensors and its write
 * of a third, go (ResNet-50: 16 adds, 2.8 ms of an H100 step).
 *
 * Runs after kernel resolution (accumulation is a kernel property), on the
 * backward part of a training plan. Safe when nothing reads the first
 * gradient after the partial's producer but the add (add's backward gives
 * one gradient to both its inputs; the other input's backward reads it
 * earlier) and the partial gradient is read by the add alone. */
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

/* Reads of value v by nodes from schedule position `from` on: inputs of
 * forward-pass nodes (the adds of the backward region are such) and output
 * gradients of backward nodes. */
static int reads(const stoke_graph *g, int v, int from) {
  int n = 0;
  for (int i = from; i < g->n_nodes; i++) {
    const stoke_gnode *nd = &g->nodes[i];
    for (int k = 0; k < nd->n_in; k++)
      if (nd->in[k] == v && (nd->pass != STOKE_BWD || (nd->type->bwd_needs & STOKE_BWD_NEEDS_INPUT(k)))) n++;
    if (nd->pass == STOKE_BWD)
      for (int j = 0; j < nd->n_out; j++) n += nd->dout[j] == v;
  }
  return n;
}

/* Every read of value `from` now reads `to`; gradients that were `from` become `to`. */
static void redirect(stoke_graph *g, int from, int to) {
  for (int i = 0; i < g->n_nodes; i++) {
    stoke_gnode *nd = &g->nodes[i];
    for (int k = 0; k < nd->n_in; k++)
      if (nd->in[k] == from) nd->in[k] = to;
    for (int j = 0; j < nd->n_out; j++)
      if (nd->dout[j] == from) nd->dout[j] = to;
  }
  for (int v = 0; v < g->n_values; v++)
    if (g->values[v].grad == from) g->values[v].grad = to;
}

/* Remove node r of the backward region (r >= n_fwd). */
static void drop_node(stoke_graph *g, int r) {
  memmove(&g->nodes[r], &g->nodes[r + 1], sizeof *g->nodes * (size_t)(g->n_nodes - r - 1));
  g->n_nodes--;
  for (int i = 0; i < g->n_nodes; i++) g->nodes[i].n.name = g->nodes[i].name_buf;
  for (int v = 0; v < g->n_values; v++)
    if (g->values[v].producer > r) g->values[v].producer--;
}

/* Fold one gradient-sum add at node a if it qualifies; 1 when folded. */
static int fold(stoke_graph *g, int a) {
  stoke_gnode *an = &g->nodes[a];
  if (an->pass != STOKE_FWD || strcmp(an->n.op, STOKE_OP_ADD) || an->n_in != 2) return 0;
  int first = an->in[0], part = an->in[1], sum = an->out[0];
  if (g->values[sum].kind != STOKE_VAL_GRAD || g->values[part].kind != STOKE_VAL_GRAD) return 0;
  int pp = g->values[part].producer, fp = g->values[first].producer;
  if (pp < g->n_fwd || fp < 0 || fp >= pp || g->nodes[pp].pass != STOKE_BWD) return 0;
  stoke_gnode *pn = &g->nodes[pp];
  int slot = -1;
  for (int k = 0; k < pn->n_in; k++)
    if (pn->din[k] == part) slot = k;
  if (slot < 0 || !pn->kernel || !((pn->kernel->accumulates >> slot) & 1u)) return 0;
  /* the first gradient may be read before the partial is added (add's
   * backward gives one gradient to both its inputs: the other input's
   * backward reads it first), but from then on only by this add */
  if (reads(g, first, pp) != 1 || reads(g, part, 0) != 1) return 0;
  /* the partial's producer adds into the first gradient; the sum is it */
  pn->din[slot] = first;
  pn->din_accumulate |= 1u << slot;
  g->values[part].producer = -1;
  g->values[part].shape = (stoke_shape){1, {1}};
  redirect(g, sum, first);
  g->values[sum].producer = -1;
  g->values[sum].shape = (stoke_shape){1, {1}};
  drop_node(g, a);
  return 1;
}

int stoke_fuse_grad_sums(stoke_graph *g) {
  int folded = 0;
  for (int a = g->n_fwd; a < g->n_nodes; a++)
    if (fold(g, a)) {
      folded++;
      a--; /* node a is now the next one */
    }
  return folded;
}

/* Forward in backward. A forward node whose backward node comes right
 * after it in the schedule (the loss: the last forward node, the first
 * backward one) is skipped when that backward's kernel can compute the
 * forward's outputs too (STOKE_KCAP_WITH_FORWARD): softmax_ce on the GPU
 * then reads the logits once for the log-sum-exp, the loss and dlogits,
 * instead of once in the forward and again in the backward (GPT-2: 1.65 GB
 * of bf16 logits a step). Nothing runs between the two nodes, so every
 * value the forward would have written is written before its first reader,
 * and the memory plan's live ranges hold unchanged. Runs after
 * recomputation placed its nodes (one between the two keeps them apart). */
int stoke_fuse_fwd_in_bwd(stoke_graph *g) {
  int n = 0;
  for (int b = 1; b < g->n_nodes; b++) {
    stoke_gnode *bn = &g->nodes[b], *fn = &g->nodes[b - 1];
    if (bn->pass != STOKE_BWD || bn->fwd != b - 1 || fn->pass != STOKE_FWD || fn->recompute) continue;
    if (!bn->kernel || !(bn->kernel->caps & STOKE_KCAP_WITH_FORWARD)) continue;
    fn->with_forward = bn->with_forward = 1;
    n++;
  }
  return n;
}
