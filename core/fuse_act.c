/* core/fuse_act.c: the compiler's linear fusions (run.fuse):
 * linear -> relu|gelu(tanh) -> linear becomes linear_act -> linear, and,
 * once backward is derived, the activation's gradient moves into the next
 * linear's backward (linear_dact), so a GPU engine applies it in the
 * epilogue of the product that makes the gradient (stoke/ops.h); and a
 * linear whose output only an add_layer_norm reads gives its bias to it
 * (stoke_fuse_bias_ln, below).
 *
 * Forward (stoke_fuse_linear_act, before backward derivation):
 *   L1: z = linear(x1, W1, b1);  A: y1 = act(z);  L2: linear(y1, W2, b2)
 *   ->  L1: (y1, aux1) = linear_act(x1, W1, b1);  L2 as it was.
 * The pre-activation value z is no longer written; it is re-used as aux1
 * (its shape and dtype become the aux's), so no value is added.
 *
 * Backward (stoke_fuse_act_grad, after derivation), per linear_act L1 from
 * the last to the first, with B1, B2 the backward nodes of L1, L2:
 *   B2: linear bwd, dy2 -> (dy1, dW2, db2);  B1: linear_act bwd, dy1 -> (dx1, dW1, db1)
 *   ->  B2: linear_dact, dy2 + aux1 -> (dz1, dW2, db2)
 *       B1: linear bwd, dz1 -> (dx1, dW1, db1)
 * The value dy1 now holds dz1 (same shape and dtype); the planner keeps
 * aux1 alive from L1 to B2 through linear_dact's bwd_needs. Going from the
 * last pair to the first matters: when L2 is a linear_act itself, its B2
 * has become a linear backward (by the pair after it) before L1's turn.
 *
 * d bias1 stays with B1, whose dW1 product sums it in its epilogue
 * (BGRADB), rather than moving into B2's dz1 product (the D*_BGRAD
 * epilogues, which linear_dact supports through din[4]). On the H100, bf16
 * 4096^3 (tests/gpu/lt_epilogue_bench): BGRADB adds 0.021 ms to the
 * 0.182 ms dW product, while the dz1 product takes 0.344 ms with
 * DGELU_BGRAD against 0.228 ms with DGELU (DRELU: 0.306 either way); the
 * mlp bench with the bias in dz1 ran 8% (ReLU) and 12% (GELU) slower than
 * unfused, and with it in dW1 10% slower (ReLU: cuBLASLt's DRELU product
 * itself, 0.306 ms against 0.184 + 0.039 for the plain product and the
 * separate ReLU gradient) and as fast (GELU). Hence run.fuse is off by
 * default. */
#include <stdio.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

/* The first engine with a kernel for (op, pass) of value x's type. */
static const char *serving(const stoke_graph *g, const stoke_plan_opts *o, const char *op, stoke_pass pass,
                           const stoke_value *x) {
  for (int i = 0; i < o->n_engines; i++)
    if (stoke_find_kernel(g->reg, o->engines[i], op, pass, x->dtype, x->layout)) return o->engines[i];
  return NULL;
}

/* How many input slots of forward nodes read value v; *node, *slot: the last. */
static int readers(const stoke_graph *g, int v, int *node, int *slot) {
  int n = 0;
  for (int i = 0; i < g->n_fwd; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] == v) {
        n++;
        if (node) *node = i;
        if (slot) *slot = k;
      }
  return n;
}

static int is_op(const stoke_gnode *n, const char *op) { return !strcmp(n->n.op, op); }

/* The activation a linear_act can take from node `a`, as attribute text;
 * NULL when it cannot: relu, and gelu with the tanh approximation only
 * (the one cuBLASLt's GELU epilogues compute). */
static const char *fusable_act(const stoke_gnode *a) {
  if (is_op(a, STOKE_OP_RELU)) return "act=relu";
  if (is_op(a, STOKE_OP_GELU) && !strcmp(a->n.attrs[STOKE_GELU_APPROXIMATE].s, "tanh"))
    return "act=gelu, approximate=tanh";
  return NULL;
}

/* Remove forward node r: later nodes move down one place (also used by
 * core/plan.c's fusion patterns). */
void stoke_graph_drop_fwd_node(stoke_graph *g, int r) {
  memmove(&g->nodes[r], &g->nodes[r + 1], sizeof *g->nodes * (size_t)(g->n_nodes - r - 1));
  g->n_nodes--;
  g->n_fwd--;
  for (int i = 0; i < g->n_nodes; i++) g->nodes[i].n.name = g->nodes[i].name_buf;
  for (int i = 0; i < g->n_values; i++)
    if (g->values[i].producer > r) g->values[i].producer--;
}

stoke_err *stoke_fuse_linear_act(stoke_graph *g, const stoke_plan_opts *o) {
  const stoke_op_type_v1 *t = stoke_find_op(g->reg, STOKE_OP_LINEAR_ACT);
  if (!t) return NULL;
  for (int r = 0; r < g->n_fwd; r++) {
    stoke_gnode *an = &g->nodes[r];
    const char *attrs = fusable_act(an);
    if (!attrs) continue;
    int z = an->in[0], y = an->out[0], l = g->values[z].producer, next = -1, slot = -1;
    if (l < 0 || !is_op(&g->nodes[l], STOKE_OP_LINEAR) || z == g->logits || y == g->logits || y == g->loss) continue;
    if (readers(g, z, NULL, NULL) != 1 || readers(g, y, &next, &slot) != 1 || slot != 0) continue;
    if (!is_op(&g->nodes[next], STOKE_OP_LINEAR) && !is_op(&g->nodes[next], STOKE_OP_LINEAR_ACT)) continue;
    /* one engine serves the linear, the fused forward, the next linear and
     * the backward that takes the activation's gradient */
    const stoke_value *x = &g->values[g->nodes[l].in[0]];
    const char *lin = serving(g, o, STOKE_OP_LINEAR, STOKE_FWD, x);
    const char *fwd = serving(g, o, STOKE_OP_LINEAR_ACT, STOKE_FWD, x);
    const char *nxt = serving(g, o, STOKE_OP_LINEAR, STOKE_FWD, &g->values[y]);
    const char *bwd = serving(g, o, STOKE_OP_LINEAR_DACT, STOKE_BWD, &g->values[y]);
    if (!lin || !fwd || !nxt || !bwd || strcmp(lin, fwd) || strcmp(lin, nxt) || strcmp(lin, bwd)) continue;
    stoke_gnode *ln = &g->nodes[l];
    stoke_node_v1 fused;
    STOKE_TRY(stoke_node_init(g->reg, STOKE_OP_LINEAR_ACT, ln->name_buf, attrs, &fused), "fusing '%s' into '%s'",
              an->n.name, ln->n.name);
    stoke_value_desc_v1 in[3], out[2];
    for (int k = 0; k < 3; k++) in[k] = (stoke_value_desc_v1){g->values[ln->in[k]].shape, g->values[ln->in[k]].dtype};
    memset(out, 0, sizeof out);
    STOKE_TRY(t->infer(&fused, in, out), "fusing '%s' into '%s'", an->n.name, ln->n.name);
    ln->type = t;
    ln->n = fused;
    ln->n.name = ln->name_buf;
    ln->flops += an->flops;
    ln->n_out = 2;
    ln->out[0] = y;
    ln->out[1] = z;
    g->values[y].producer = l;
    stoke_value *aux = &g->values[z];
    char name[sizeof aux->name];
    snprintf(name, sizeof name, "%.58s.aux", ln->name_buf);
    memcpy(aux->name, name, sizeof name);
    aux->shape = out[1].shape;
    aux->dtype = out[1].dtype;
    aux->layout = STOKE_LAYOUT_ANY;
    stoke_graph_drop_fwd_node(g, r);
    r--;
  }
  return NULL;
}

/* The bias fold (before backward derivation, after stoke_fuse_linear_act):
 *   L: r = linear(x, W, b);  N: (s, y, ...) = add_layer_norm(a, r, w, beta)
 *   ->  L: r = matmul(x, W);  N: (s, y, ...) = add_bias_layer_norm(a, r, w, beta, b)
 * when r is read by N alone, and the engines that serve the linear and the
 * add_layer_norm also serve matmul and add_bias_layer_norm both ways. The
 * bias gradient then comes out of the layer norm's backward, which makes
 * the gradient of r (the column sums of it, next to dweight and dbias),
 * instead of the product's BGRADB epilogue or a column-sum pass over r's
 * gradient. On GPT-2 124M (H200) the products lost 0.22 ms a step of bias
 * epilogues, the layer norm's backward gained less with its third column
 * sum, and the step ran 0.5% faster than with the fold off (BENCHMARKS.md
 * run 20; run.fuse_bias_norm = false turns it off). The forward adds b in
 * the layer norm's sum (s rounded once) and the product loses its bias
 * epilogue. A linear_act's next linear (mlp.c_proj) folds
 * too: its linear_dact backward then writes no bias gradient. */
stoke_err *stoke_fuse_bias_ln(stoke_graph *g, const stoke_plan_opts *o) {
  const stoke_op_type_v1 *mm = stoke_find_op(g->reg, STOKE_OP_MATMUL);
  const stoke_op_type_v1 *abln = stoke_find_op(g->reg, STOKE_OP_ADD_BIAS_LAYER_NORM);
  if (!mm || !abln) return NULL;
  for (int t = 0; t < g->n_fwd; t++) {
    stoke_gnode *nn = &g->nodes[t];
    if (!is_op(nn, STOKE_OP_ADD_LAYER_NORM) || nn->in[0] == nn->in[1]) continue;
    for (int k = 0; k < 2; k++) {
      int r = nn->in[k], l = g->values[r].producer;
      if (l < 0 || !is_op(&g->nodes[l], STOKE_OP_LINEAR) || r == g->logits || r == g->loss ||
          readers(g, r, NULL, NULL) != 1)
        continue;
      stoke_gnode *ln = &g->nodes[l];
      const stoke_value *x = &g->values[ln->in[0]], *a = &g->values[nn->in[0]];
      const char *lin = serving(g, o, STOKE_OP_LINEAR, STOKE_FWD, x);
      const char *mf = serving(g, o, STOKE_OP_MATMUL, STOKE_FWD, x), *mb = serving(g, o, STOKE_OP_MATMUL, STOKE_BWD, x);
      const char *lnf = serving(g, o, STOKE_OP_ADD_LAYER_NORM, STOKE_FWD, a);
      const char *af = serving(g, o, STOKE_OP_ADD_BIAS_LAYER_NORM, STOKE_FWD, a);
      const char *ab = serving(g, o, STOKE_OP_ADD_BIAS_LAYER_NORM, STOKE_BWD, a);
      if (!lin || !mf || !mb || !lnf || !af || !ab || strcmp(lin, mf) || strcmp(lin, mb) || strcmp(lnf, af) ||
          strcmp(lnf, ab))
        continue;
      stoke_value_desc_v1 in[5], out[4];
      for (int i = 0; i < 4; i++) in[i] = (stoke_value_desc_v1){g->values[nn->in[i]].shape, g->values[nn->in[i]].dtype};
      in[4] = (stoke_value_desc_v1){g->values[ln->in[2]].shape, g->values[ln->in[2]].dtype};
      stoke_node_v1 folded = nn->n;
      folded.op = abln->name;
      stoke_err *e = abln->infer(&folded, in, out);
      if (e) { /* a bias that does not fit (shape or dtype): leave the pair as it is */
        stoke_err_free(e);
        continue;
      }
      nn->type = abln;
      nn->n.op = abln->name;
      nn->in[4] = ln->in[2];
      nn->n_in = 5;
      ln->type = mm;
      ln->n.op = mm->name;
      ln->n_in = 2;
      ln->in[2] = -1;
      break;
    }
  }
  return NULL;
}

/* 1: d bias1 in the dz1 product's epilogue (D*_BGRAD), 0: in B1's dW1
 * product (BGRADB), measured faster (above). */
#define BIAS_IN_DZ 0

/* The bias that forward node f (a matmul) gave to the add_bias_layer_norm
 * that reads its output (stoke_fuse_bias_ln), or -1. */
static int folded_bias(const stoke_graph *g, int f) {
  if (f < 0 || f >= g->n_fwd) return -1;
  int node = -1, slot = -1;
  if (readers(g, g->nodes[f].out[0], &node, &slot) != 1 || slot > 1 ||
      !is_op(&g->nodes[node], STOKE_OP_ADD_BIAS_LAYER_NORM))
    return -1;
  return g->nodes[node].in[4];
}

/* The backward node of forward node f, or -1. */
static int backward_of(const stoke_graph *g, int f) {
  for (int i = g->n_fwd; i < g->n_nodes; i++)
    if (g->nodes[i].pass == STOKE_BWD && g->nodes[i].fwd == f) return i;
  return -1;
}

/* Nodes other than `except` that read value v (as input or as an output
 * gradient). */
static int other_uses(const stoke_graph *g, int v, int except) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    if (i == except) continue;
    for (int k = 0; k < g->nodes[i].n_in; k++) n += g->nodes[i].in[k] == v;
    for (int j = 0; j < g->nodes[i].n_out; j++) n += g->nodes[i].dout[j] == v;
  }
  return n;
}

stoke_err *stoke_fuse_act_grad(stoke_graph *g) {
  const stoke_op_type_v1 *lin = stoke_find_op(g->reg, STOKE_OP_LINEAR);
  const stoke_op_type_v1 *dact = stoke_find_op(g->reg, STOKE_OP_LINEAR_DACT);
  for (int l = g->n_fwd - 1; l >= 0; l--) {
    const stoke_gnode *ln = &g->nodes[l];
    if (!is_op(ln, STOKE_OP_LINEAR_ACT)) continue;
    int b1 = backward_of(g, l);
    if (b1 < 0) continue; /* nothing upstream wants a gradient */
    int dy1 = g->nodes[b1].dout[0], b2 = dy1 >= 0 ? g->values[dy1].producer : -1;
    stoke_gnode *n2 = b2 >= 0 ? &g->nodes[b2] : NULL;
    /* a next linear that gave its bias to an add_bias_layer_norm is a matmul now: fb is that bias */
    int fb = n2 && is_op(n2, STOKE_OP_MATMUL) ? folded_bias(g, n2->fwd) : -1;
    if (!dact || !n2 || n2->pass != STOKE_BWD || !(is_op(n2, STOKE_OP_LINEAR) || fb >= 0) || n2->din[0] != dy1 ||
        n2->in[0] != ln->out[0] || other_uses(g, dy1, b1))
      return STOKE_ERR(STOKE_E_INTERNAL,
                       "node '%s' (linear_act): the gradient of its output does not come from one linear's "
                       "backward, so its activation gradient has nowhere to go; run with fuse = false and "
                       "report this graph",
                       ln->n.name);
    /* B2: the next linear's backward, now also the activation's */
    char name[64];
    snprintf(name, sizeof name, "%.38s+%.18s.dact", n2->name_buf, ln->name_buf);
    memcpy(n2->name_buf, name, sizeof name);
    n2->type = dact;
    n2->n.op = dact->name;
    n2->n.n_attrs = ln->n.n_attrs;
    memcpy(n2->n.attrs, ln->n.attrs, sizeof n2->n.attrs);
    n2->n_in = 5;
    if (fb >= 0) { /* linear_dact's b2: its gradient comes from the layer norm */
      n2->in[2] = fb;
      n2->din[2] = -1;
      n2->n_out = 1;
    }
    n2->in[3] = ln->out[1];
    n2->in[4] = ln->in[2];
    n2->din[3] = -1;
    stoke_gnode *n1 = &g->nodes[b1];
    n2->din[4] = BIAS_IN_DZ ? n1->din[2] : -1;
    if (n2->din[4] >= 0) g->values[n2->din[4]].producer = b2;
    /* B1: what is left is a linear's backward on dz1 */
    n1->type = lin;
    n1->n.op = lin->name;
    n1->n.n_attrs = 0;
    n1->n_out = 1;
    n1->out[1] = n1->dout[1] = -1;
    if (BIAS_IN_DZ) n1->din[2] = -1;
    snprintf(g->values[dy1].name, sizeof g->values[dy1].name, "%.50s.dz", ln->name_buf);
  }
  return NULL;
}
