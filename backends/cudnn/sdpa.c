/* backends/cudnn/sdpa.c: causal scaled dot-product attention (the attention
 * op, stoke/ops.h) as cuDNN's flash-attention operation graphs, built with
 * the backend API of cudnn_graph.h (plain C; the C++ frontend is not
 * installed). The graphs are those of cudnn-frontend's flash MHA samples
 * (what its sdpa node expands to): forward Q K^T -> scale -> causal mask
 * (GEN_INDEX row >= column, BINARY_SELECT) -> softmax with the stats
 * max + log(sum) written out -> P V; backward dO.O summed per row, P
 * recomputed from the stats, dV = P^T dO, dS = P (dO V^T - sum), dQ =
 * scale dS K (through an f32 accumulator), dK = scale dS^T Q. Under
 * STOKE_KFLAG_DETERMINISTIC (run.deterministic) dQ is the product's own
 * output, no accumulator: cudnn-frontend's deterministic backward on Hopper
 * (set_deterministic_algorithm), whose engine does not sum dQ with atomics;
 * configurations with cuDNN's NONDETERMINISTIC note are skipped in both
 * directions. When no engine takes that, the plan says so once per
 * direction and uses the default (then not bitwise reproducible). Without
 * dropout, as cudnn-frontend 1.x builds them for p = 0 on cuDNN 9; the
 * older fused-attention pattern with a p = 0 dropout (an RNG node, its mask
 * multiplied in) is the fallback when no engine takes the graph without it
 * (the plan says which, once). Q, K, V are strided views of qkv
 * [B, T, 3, H, D] and O of y [B, T, H, D]: no copies, as llm.c's
 * cudnn_att.cpp. bf16 and fp16 (flash attention has no f32 engine); one
 * graph and plan per node, built in plan() (the heuristics' first engine
 * configuration, or with autotune, run.conv_autotune, the fastest of those
 * that build, timed on temporaries once per problem: the engine keeps the
 * choice for identical nodes); run() makes the variant pack
 * and executes on the node's stream (no device allocation: graph capture
 * works). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "graph.h"
#include "backends/cuda/tune_fill.h"
#include "stoke/ops.h"
#include "stoke_cudnn.h"

typedef cudnnBackendDescriptor_t bdesc;

/* Unique ids of the graphs' tensors given data; virtual ones count from
 * ID_VIRTUAL. */
enum {
  ID_Q = 1, ID_K, ID_V, ID_O, ID_STATS, ID_SCALE, ID_MASK, ID_SEED, ID_OFFSET, ID_DROP_SCALE,
  ID_DO, ID_DQ, ID_DK, ID_DV, ID_DQ_ACCUM, ID_SUM, ID_PROB, ID_VIRTUAL = 100
};

#define SDPA_MAX_DESC 192
#define SDPA_CFGS 16 /* engine configurations read from the heuristics */
#define SDPA_PLANS 8 /* of them, plans built (and timed) */

/* A graph under construction: every descriptor made (freed at the end),
 * the operations, the first failure (later calls do nothing). */
typedef struct sgraph {
  bdesc all[SDPA_MAX_DESC];
  int n_all;
  bdesc ops[48];
  int n_ops;
  cudnnStatus_t st;
  const char *failed; /* the call that failed */
  int64_t next_virtual;
} sgraph;

static bdesc make(sgraph *g, cudnnBackendDescriptorType_t t) {
  bdesc d = NULL;
  if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
  if (g->n_all == SDPA_MAX_DESC) {
    g->st = CUDNN_STATUS_BAD_PARAM;
    g->failed = "too many descriptors";
    return NULL;
  }
  g->st = cudnnBackendCreateDescriptor(t, &d);
  if (g->st != CUDNN_STATUS_SUCCESS) g->failed = "cudnnBackendCreateDescriptor";
  else g->all[g->n_all++] = d;
  return d;
}

static void set(sgraph *g, bdesc d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count,
                const void *v) {
  if (g->st != CUDNN_STATUS_SUCCESS) return;
  g->st = cudnnBackendSetAttribute(d, n, t, count, v);
  if (g->st != CUDNN_STATUS_SUCCESS) g->failed = "cudnnBackendSetAttribute";
}

static void finalize(sgraph *g, bdesc d, const char *what) {
  if (g->st != CUDNN_STATUS_SUCCESS) return;
  g->st = cudnnBackendFinalize(d);
  if (g->st != CUDNN_STATUS_SUCCESS) g->failed = what;
}

static void free_graph(sgraph *g) {
  for (int i = g->n_all - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->all[i]);
  g->n_all = g->n_ops = 0;
}

/* A 4-D tensor; id 0: a new virtual one. */
static bdesc tensor(sgraph *g, int64_t id, cudnnDataType_t dt, const int64_t dim[4], const int64_t stride[4],
                    int by_value, int reorder) {
  bdesc t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  bool virt = id == 0, val = by_value != 0;
  int64_t uid = id ? id : g->next_virtual++, align = 16;
  set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
  set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
  set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
  set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &val);
  if (reorder) {
    cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F16x16;
    set(g, t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &r);
  }
  finalize(g, t, "finalizing a tensor descriptor");
  return t;
}

static void add_op(sgraph *g, bdesc op) {
  if (g->st == CUDNN_STATUS_SUCCESS && op) g->ops[g->n_ops++] = op;
}

/* y = mode(x[, b[, t]]); axis for GEN_INDEX (else < 0). */
static void pointwise(sgraph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, bdesc x, bdesc b, bdesc t, bdesc y,
                      int64_t axis) {
  bdesc pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  if (axis >= 0) set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  finalize(g, pw, "finalizing a pointwise descriptor");
  bdesc op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  if (t) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(g, op, "finalizing a pointwise operation");
  add_op(g, op);
}

static void matmul(sgraph *g, bdesc a, bdesc b, bdesc c) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  bdesc mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
  finalize(g, mm, "finalizing a matmul descriptor");
  bdesc op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
  finalize(g, op, "finalizing a matmul operation");
  add_op(g, op);
}

static void reduction(sgraph *g, cudnnReduceTensorOp_t mode, bdesc x, bdesc y) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  bdesc r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
  set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
  finalize(g, r, "finalizing a reduction descriptor");
  bdesc op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
  finalize(g, op, "finalizing a reduction operation");
  add_op(g, op);
}

static void reshape(sgraph *g, bdesc x, bdesc y) {
  bdesc op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(g, op, "finalizing a reshape operation");
  add_op(g, op);
}

/* ------------------------------------------------------------ the shapes */

/* B, T, H, D of a node, the io data type, and every tensor's strides. */
typedef struct sdpa_geom {
  int64_t b, t, h, d;
  double scale;
  cudnnDataType_t io;
  int64_t q_dim[4], q_str[4];   /* [b, h, t, d] in qkv: Q, K, V, and their gradients in dqkv */
  int64_t kt_dim[4], kt_str[4]; /* K^T (and V^T): [b, h, d, t] */
  int64_t o_dim[4], o_str[4];   /* O, dO: [b, h, t, d] in y [B, T, C] */
  int64_t s_dim[4], s_str[4];   /* scores [b, h, t, t] */
  int64_t st_dim[4], st_tr[4];  /* scores transposed [b, h, t, t] */
  int64_t r_dim[4], r_str[4];   /* per row [b, h, t, 1]: the stats, lse [B, H, T] */
  int64_t one[4];               /* scalars */
  int64_t acc_str[4];           /* the f32 dQ accumulator, dense [b, h, t, d] */
} sdpa_geom;

static void set4(int64_t *d, int64_t a, int64_t b, int64_t c, int64_t e) { d[0] = a, d[1] = b, d[2] = c, d[3] = e; }

static void geom_strides(sdpa_geom *g) {
  int64_t B = g->b, T = g->t, H = g->h, D = g->d, C = H * D;
  set4(g->q_dim, B, H, T, D), set4(g->q_str, T * 3 * C, D, 3 * C, 1);
  set4(g->kt_dim, B, H, D, T), set4(g->kt_str, T * 3 * C, D, 1, 3 * C);
  set4(g->o_dim, B, H, T, D), set4(g->o_str, T * C, D, C, 1);
  set4(g->s_dim, B, H, T, T), set4(g->s_str, H * T * T, T * T, T, 1);
  set4(g->st_dim, B, H, T, T), set4(g->st_tr, H * T * T, T * T, 1, T);
  set4(g->r_dim, B, H, T, 1), set4(g->r_str, H * T, T, 1, 1);
  set4(g->one, 1, 1, 1, 1);
  set4(g->acc_str, H * T * D, T * D, D, 1);
}

static stoke_err *sdpa_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run, sdpa_geom *g) {
  const char *op = STOKE_OP_ATTENTION;
  if (a->n_in < 1 || a->n_out < 2 || !a->node || a->node->n_attrs <= STOKE_ATTENTION_SCALE ||
      (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "cudnn %s '%s': expects qkv -> y, lse and the attributes", op,
                      stoke_node_name(a));
  const char *name = stoke_node_name(a);
  const stoke_shape *x = &a->in[0].shape;
  g->h = a->node->attrs[STOKE_ATTENTION_N_HEAD].i;
  if (x->ndim != 3 || x->d[2] % 3 || g->h < 1 || (x->d[2] / 3) % g->h)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn %s '%s': qkv must be [B, T, 3C] with C a multiple of n_head", op, name);
  g->b = x->d[0], g->t = x->d[1], g->d = x->d[2] / 3 / g->h;
  g->scale = a->node->attrs[STOKE_ATTENTION_SCALE].f > 0 ? a->node->attrs[STOKE_ATTENTION_SCALE].f
                                                          : 1.0 / sqrt((double)g->d);
  if (a->node->attrs[STOKE_ATTENTION_CAUSAL].i != 1)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cudnn %s '%s': only causal attention is built (causal = 1)", op, name);
  /* up to 256 on Hopper, both directions (cuDNN's support matrix); elsewhere (Ampere's backward: 128) no engine
   * configuration makes a plan and the node is declined the same way */
  if (g->d % 8 || g->d > 256)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cudnn %s '%s': head size %lld; flash attention needs a multiple of 8 up "
                      "to 256", op, name, (long long)g->d);
  if (a->in[0].dtype != dt || a->out[0].dtype != dt || a->out[1].dtype != STOKE_F32)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn %s '%s': qkv and y must be %s, lse f32", op, name, stoke_dtype_name(dt));
  g->io = dt == STOKE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  geom_strides(g);
  if (run && (!a->in[0].data || !a->out[0].data || !a->out[1].data))
    return STOKE_PERR(STOKE_E_INVALID, "cudnn %s '%s': qkv, y or lse has no data", op, name);
  if (run && bwd && a->din[0].data && !a->dout[0].data)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn %s '%s': backward without dy", op, name);
  return NULL;
}

/* ------------------------------------------------------------ the graphs */

/* scores = scale Q K^T, causally masked: the part both graphs share. */
static bdesc masked_scores(sgraph *g, const sdpa_geom *s, bdesc q, bdesc kt, bdesc scale, bdesc mask) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  bdesc sc = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  matmul(g, q, kt, sc);
  bdesc scaled = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  pointwise(g, CUDNN_POINTWISE_MUL, f, sc, scale, NULL, scaled, -1);
  bdesc row = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0), col = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f, scaled, NULL, NULL, row, 2);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f, scaled, NULL, NULL, col, 3);
  bdesc keep = tensor(g, 0, CUDNN_DATA_BOOLEAN, s->s_dim, s->s_str, 0, 0);
  pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
  bdesc masked = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, f, scaled, mask, keep, masked, -1);
  return masked;
}

/* Dropout with p = 0 (a mask of ones, scale 1): x -> x in the io type,
 * as the engine's pattern has it. */
static bdesc dropout_none(sgraph *g, const sdpa_geom *s, bdesc x, bdesc *mask_out) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  bdesc seed = tensor(g, ID_SEED, CUDNN_DATA_INT64, s->one, s->one, 0, 0);
  bdesc offset = tensor(g, ID_OFFSET, CUDNN_DATA_INT64, s->one, s->one, 0, 0);
  bdesc mask = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  bdesc rng = make(g, CUDNN_BACKEND_RNG_DESCRIPTOR);
  cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
  double keep = 1.0;
  set(g, rng, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &dist);
  set(g, rng, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep);
  finalize(g, rng, "finalizing the rng descriptor");
  bdesc op = make(g, CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_RNG_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mask);
  set(g, op, CUDNN_ATTR_OPERATION_RNG_SEED, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &seed);
  set(g, op, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &offset);
  set(g, op, CUDNN_ATTR_OPERATION_RNG_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rng);
  finalize(g, op, "finalizing the rng operation");
  add_op(g, op);
  bdesc dropped = tensor(g, 0, s->io, s->s_dim, s->s_str, 0, 1);
  pointwise(g, CUDNN_POINTWISE_MUL, f, x, mask, NULL, dropped, -1);
  bdesc scale = tensor(g, ID_DROP_SCALE, s->io, s->one, s->one, 1, 0);
  bdesc out = tensor(g, 0, s->io, s->s_dim, s->s_str, 0, 0);
  pointwise(g, CUDNN_POINTWISE_MUL, f, dropped, scale, NULL, out, -1);
  if (mask_out) *mask_out = mask;
  return out;
}

/* Forward: O = softmax(masked scores) V, the stats (max + log sum) out. */
static void build_fwd(sgraph *g, const sdpa_geom *s, int dropout) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  bdesc q = tensor(g, ID_Q, s->io, s->q_dim, s->q_str, 0, 0);
  bdesc kt = tensor(g, ID_K, s->io, s->kt_dim, s->kt_str, 0, 0);
  bdesc scale = tensor(g, ID_SCALE, f, s->one, s->one, 1, 0), mask = tensor(g, ID_MASK, f, s->one, s->one, 1, 0);
  bdesc x = masked_scores(g, s, q, kt, scale, mask);
  bdesc mx = tensor(g, 0, f, s->r_dim, s->r_str, 0, 0), sub = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  bdesc ex = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0), sum = tensor(g, 0, f, s->r_dim, s->r_str, 0, 0);
  bdesc lg = tensor(g, 0, f, s->r_dim, s->r_str, 0, 0), stats = tensor(g, ID_STATS, f, s->r_dim, s->r_str, 0, 0);
  bdesc p = dropout ? tensor(g, 0, f, s->s_dim, s->s_str, 0, 1) : tensor(g, 0, s->io, s->s_dim, s->s_str, 0, 0);
  reduction(g, CUDNN_REDUCE_TENSOR_MAX, x, mx);
  pointwise(g, CUDNN_POINTWISE_SUB, f, x, mx, NULL, sub, -1);
  pointwise(g, CUDNN_POINTWISE_EXP, f, sub, NULL, NULL, ex, -1);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  pointwise(g, CUDNN_POINTWISE_LOG, f, sum, NULL, NULL, lg, -1);
  pointwise(g, CUDNN_POINTWISE_ADD, f, mx, lg, NULL, stats, -1);
  pointwise(g, CUDNN_POINTWISE_DIV, f, ex, sum, NULL, p, -1);
  bdesc pd = dropout ? dropout_none(g, s, p, NULL) : p;
  bdesc v = tensor(g, ID_V, s->io, s->q_dim, s->q_str, 0, 0);
  bdesc o = tensor(g, ID_O, s->io, s->o_dim, s->o_str, 0, 0);
  matmul(g, pd, v, o);
}

/* Backward (flash attention's, as the frontend sample): see the top; det:
 * dQ written by its product (no f32 accumulator). */
static void build_bwd(sgraph *g, const sdpa_geom *s, int dropout, int det) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  bdesc o = tensor(g, ID_O, s->io, s->o_dim, s->o_str, 0, 0), dout = tensor(g, ID_DO, s->io, s->o_dim, s->o_str, 0, 0);
  bdesc dot = tensor(g, 0, f, s->o_dim, s->o_str, 0, 0), red = tensor(g, 0, f, s->r_dim, s->r_str, 0, 0);
  pointwise(g, CUDNN_POINTWISE_MUL, f, dout, o, NULL, dot, -1);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, dot, red);
  bdesc sum = tensor(g, ID_SUM, f, s->r_dim, s->r_str, 0, 0), prob = tensor(g, ID_PROB, f, s->one, s->one, 1, 0);
  pointwise(g, CUDNN_POINTWISE_MUL, f, red, prob, NULL, sum, -1);
  bdesc q = tensor(g, ID_Q, s->io, s->q_dim, s->q_str, 0, 0), kt = tensor(g, ID_K, s->io, s->kt_dim, s->kt_str, 0, 0);
  bdesc scale = tensor(g, ID_SCALE, f, s->one, s->one, 1, 0), mask = tensor(g, ID_MASK, f, s->one, s->one, 1, 0);
  bdesc x = masked_scores(g, s, q, kt, scale, mask);
  bdesc stats = tensor(g, ID_STATS, f, s->r_dim, s->r_str, 0, 0);
  bdesc sub = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0), p = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  pointwise(g, CUDNN_POINTWISE_SUB, f, x, stats, NULL, sub, -1);
  pointwise(g, CUDNN_POINTWISE_EXP, f, sub, NULL, NULL, p, -1);
  bdesc dmask = NULL;
  bdesc pd = dropout ? dropout_none(g, s, p, &dmask) : p;
  bdesc pt = tensor(g, 0, s->io, s->st_dim, s->st_tr, 0, 0);
  reshape(g, pd, pt);
  bdesc dq = tensor(g, ID_DQ, s->io, s->q_dim, s->q_str, 0, 0), dk = tensor(g, ID_DK, s->io, s->q_dim, s->q_str, 0, 0);
  bdesc dv = tensor(g, ID_DV, s->io, s->q_dim, s->q_str, 0, 0);
  matmul(g, pt, dout, dv);
  bdesc vt = tensor(g, ID_V, s->io, s->kt_dim, s->kt_str, 0, 0), ds = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  matmul(g, dout, vt, ds);
  bdesc dsm = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0), dss = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  bdesc dp = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0), dpd = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  bdesc dps = tensor(g, 0, f, s->s_dim, s->s_str, 0, 0);
  if (dropout) pointwise(g, CUDNN_POINTWISE_MUL, f, ds, dmask, NULL, dsm, -1);
  pointwise(g, CUDNN_POINTWISE_SUB, f, dropout ? dsm : ds, sum, NULL, dss, -1);
  pointwise(g, CUDNN_POINTWISE_MUL, f, dss, p, NULL, dp, -1);
  if (dropout) {
    bdesc dscale = tensor(g, ID_DROP_SCALE, s->io, s->one, s->one, 1, 0);
    pointwise(g, CUDNN_POINTWISE_MUL, f, dp, dscale, NULL, dpd, -1);
  }
  pointwise(g, CUDNN_POINTWISE_MUL, f, dropout ? dpd : dp, scale, NULL, dps, -1);
  bdesc k = tensor(g, 0, s->io, s->q_dim, s->q_str, 0, 0);
  reshape(g, kt, k);
  bdesc acc = det ? NULL : tensor(g, ID_DQ_ACCUM, f, s->q_dim, s->acc_str, 0, 1);
  matmul(g, dps, k, det ? dq : acc);
  bdesc dpt = tensor(g, 0, dropout ? f : s->io, s->st_dim, s->st_tr, 0, 0); /* dS^T in the io type, as the frontend */
  reshape(g, dps, dpt);
  matmul(g, dpt, q, dk);
  if (!det) pointwise(g, CUDNN_POINTWISE_IDENTITY, f, acc, NULL, NULL, dq, -1);
}

/* ------------------------------------------------------- plan and run */

typedef struct sdpa_state {
  sdpa_geom s;
  sgraph g;       /* its descriptors stay alive with the plan */
  bdesc plan;
  int64_t ws;     /* the engine's workspace */
  size_t extra;   /* ours after it: seed, offset (int64), backward: the row sums and the dQ accumulator */
  size_t zero;    /* of `extra`, the bytes each run zeroes first (sdpa_exec) */
  int bwd;
  int dropout;    /* the fallback graph (with a p = 0 dropout) made the plan */
  int det;        /* backward: the deterministic graph made the plan (no dQ accumulator) */
  int det_only;   /* only configurations not noted NONDETERMINISTIC (forward under deterministic, or st->det) */
  char node[64];
} sdpa_state;

static void sdpa_destroy(void *state) {
  sdpa_state *st = state;
  if (!st) return;
  free_graph(&st->g);
  stoke_host->free(st);
}

#define SDPA_ALIGN 256
static size_t up(size_t n) { return (n + SDPA_ALIGN - 1) / SDPA_ALIGN * SDPA_ALIGN; }

static stoke_err *time_plans(sdpa_state *st, cudnn_engine *eng, bdesc *plans, int n, const int64_t *ws, void *stream,
                             float *ms);

/* The engine's record of timed choices: the configuration index of a
 * problem (B, T, H, D, io type, backward, dropout, deterministic), or -1. */
static int sdpa_choice_get(const cudnn_engine *e, const int64_t *key) {
  for (int i = 0; i < e->n_sdpa; i++)
    if (!memcmp(e->sdpa_keys[i], key, sizeof e->sdpa_keys[i])) return e->sdpa_best[i];
  return -1;
}

static void sdpa_choice_put(cudnn_engine *e, const int64_t *key, int best) {
  if (e->n_sdpa >= CUDNN_SDPA_CACHE) return; /* full: later problems are timed again, still correct */
  memcpy(e->sdpa_keys[e->n_sdpa], key, sizeof e->sdpa_keys[0]);
  e->sdpa_best[e->n_sdpa++] = best;
}

/* The graph (st->dropout and st->det say which), cuDNN's heuristics (mode
 * A; under st->det_only without configurations noted NONDETERMINISTIC), and the
 * engine configurations that make an execution plan: the first, or with
 * autotune the fastest of them, timed on temporaries (cuDNN offers several
 * for the flash-attention graphs, as cudnn-frontend's autotune times). */
static stoke_err *make_plan_of(sdpa_state *st, cudnn_engine *eng, int autotune, void *stream) {
  cudnnHandle_t h = eng->handle;
  const sdpa_geom *s0 = &st->s;
  sgraph *g = &st->g;
  g->next_virtual = ID_VIRTUAL;
  if (st->bwd) build_bwd(g, &st->s, st->dropout, st->det);
  else build_fwd(g, &st->s, st->dropout);
  bdesc graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
  finalize(g, graph, "finalizing the operation graph (cuDNN does not take this SDPA graph)");
  bdesc heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(g, heur, "finalizing the engine heuristics");
  /* up to SDPA_CFGS of the heuristics' configurations (under det_only the deterministic ones may come after the
   * first few), of which at most SDPA_PLANS become plans (timed with autotune) */
  bdesc cfgs[SDPA_CFGS];
  int64_t n_cfg = 0;
  for (int i = 0; i < SDPA_CFGS; i++) cfgs[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (g->st == CUDNN_STATUS_SUCCESS) {
    g->st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, SDPA_CFGS,
                                     &n_cfg, cfgs);
    if (g->st != CUDNN_STATUS_SUCCESS) g->failed = "reading the heuristics' engine configurations";
    if (n_cfg > SDPA_CFGS) n_cfg = SDPA_CFGS; /* the count may be all cuDNN has; SDPA_CFGS were written */
  }
  char ctx[160];
  snprintf(ctx, sizeof ctx, "attention '%s' %s: B %lld, T %lld, H %lld, D %lld", st->node, st->bwd ? "backward" : "forward",
           (long long)st->s.b, (long long)st->s.t, (long long)st->s.h, (long long)st->s.d);
  if (g->st != CUDNN_STATUS_SUCCESS) return stoke_cudnn_err(g->st, __FILE__, __LINE__, g->failed, ctx);
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  bdesc built[SDPA_PLANS];
  int64_t wss[SDPA_PLANS], cfg_of[SDPA_PLANS];
  int n_built = 0;
  /* an identical problem timed before (another layer's node): its choice,
   * built alone (the configurations after it, untimed, if it fails) */
  int64_t key[CUDNN_SDPA_KEY] = {s0->b, s0->t, s0->h, s0->d, (int64_t)s0->io, st->bwd, st->dropout,
                                 st->det + 2 * st->det_only};
  int cached = autotune ? sdpa_choice_get(eng, key) : -1, timing = autotune && cached < 0;
  for (int64_t i = cached > 0 ? cached : 0; i < n_cfg && n_built < SDPA_PLANS && (timing || !n_built); i++) {
    if (st->det_only && cg_cfg_nondeterministic(cfgs[i]) != 0) continue; /* unreadable notes: not known deterministic */
    bdesc plan = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
    if (g->st != CUDNN_STATUS_SUCCESS) break;
    last = cudnnBackendFinalize(plan);
    int64_t n;
    if (last == CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                 &wss[n_built]) == CUDNN_STATUS_SUCCESS)
      cfg_of[n_built] = i, built[n_built++] = plan;
  }
  if (!n_built)
    return stoke_cudnn_err(g->st != CUDNN_STATUS_SUCCESS ? g->st : last, __FILE__, __LINE__,
                           "no engine configuration of the SDPA graph made an execution plan", ctx);
  st->extra = up(2 * sizeof(int64_t)) +
              (st->bwd ? up((size_t)(s0->b * s0->h * s0->t) * 4) : 0) +
              (st->bwd && !st->det ? up((size_t)(s0->b * s0->h * s0->t * s0->d) * 4) : 0);
  /* The dropout graph's seed and offset are zeros. Since cuDNN 9.6 the backward's engines zero the dQ
   * accumulator themselves (cudnn-frontend memsets it only before 9.6.0): a memset of it cost GPT-2
   * 12.9 us a layer (BENCHMARKS.md run 36); every_kernel_test hands the kernel a poisoned workspace. */
  st->zero = cudnnGetVersion() < 90600 ? st->extra : st->dropout ? 2 * sizeof(int64_t) : 0;
  int best = 0;
  stoke_err *te = NULL;
  float ms[SDPA_PLANS];
  /* no memory to time in: cuDNN's first configuration, cached as the
   * convolutions' untimed choice is (the memory does not come back during a
   * run; the next identical node would only warn again) */
  if (n_built > 1 && (te = time_plans(st, eng, built, n_built, wss, stream, ms)) && cudnn_tune_fallback(&te, ctx))
    n_built = 1;
  if (te) return te; /* the plans are the graph's descriptors: freed with it */
  if (n_built > 1) {
    char list[256] = "";
    for (int i = 0; i < n_built; i++) {
      if (ms[i] >= 0 && (ms[best] < 0 || ms[i] < ms[best])) best = i;
      size_t l = strlen(list);
      snprintf(list + l, sizeof list - l, "%s%.3f", i ? ", " : "", (double)ms[i]);
    }
    stoke_host->log(STOKE_LOG_INFO, "cudnn", "%s: engine configuration %lld of %lld (timed, ms: %s; -1 failed)", ctx,
                    (long long)cfg_of[best] + 1, (long long)n_cfg, list);
  }
  if (timing) sdpa_choice_put(eng, key, (int)cfg_of[best]);
  st->plan = built[best];
  st->ws = wss[best];
  return NULL;
}

/* Drops a graph no engine took (its descriptors, no plan) before the next attempt. */
static void reset_graph(sdpa_state *st) {
  free_graph(&st->g);
  memset(&st->g, 0, sizeof st->g);
  st->plan = NULL;
}

/* The graph without dropout; when no engine takes it, the older pattern
 * with a p = 0 dropout (said once per direction: it is slower). Under
 * `det` both first with the deterministic choice (backward: the
 * deterministic graph; both: no configuration noted NONDETERMINISTIC);
 * when no engine takes either so, the default ones, said once per
 * direction. When nothing works, the error is the default graph's. */
static stoke_err *make_plan(sdpa_state *st, cudnn_engine *eng, int autotune, int det, void *stream) {
  stoke_err *nodrop[2] = {NULL, NULL}; /* why the graph without dropout failed, default [0] and deterministic [1] */
  for (int d = det; d >= 0 && !st->plan; d--)
    for (int drop = 0; drop < 2 && !st->plan; drop++) {
      st->det = d && st->bwd;
      st->det_only = d;
      st->dropout = drop;
      stoke_err *e = make_plan_of(st, eng, autotune, stream);
      if (!e) {
        static int said_det[2], said_drop[2];
        if (det && !d && !said_det[st->bwd]++)
          stoke_host->log(STOKE_LOG_WARN, "cudnn", "attention %s '%s': no deterministic engine takes the graph (%s); "
                          "using the default one, whose %s not bitwise reproducible from run to run",
                          st->bwd ? "backward" : "forward", st->node, nodrop[1] ? nodrop[1]->msg : "",
                          st->bwd ? "dQ sums are" : "results may be");
        if (drop && !said_drop[st->bwd]++)
          stoke_host->log(STOKE_LOG_WARN, "cudnn", "attention %s: no %sengine takes the graph without dropout (%s); "
                          "using the pattern with a p = 0 dropout, which is slower", st->bwd ? "backward" : "forward",
                          d ? "deterministic " : "", nodrop[d] ? nodrop[d]->msg : "");
        break;
      }
      if (!drop) nodrop[d] = e;
      else stoke_host->err_free(e);
      reset_graph(st);
    }
  if (nodrop[1]) stoke_host->err_free(nodrop[1]);
  if (st->plan) {
    if (nodrop[0]) stoke_host->err_free(nodrop[0]);
    return NULL;
  }
  st->det = st->det_only = st->dropout = 0;
  return nodrop[0]; /* the default graph's reason, as without `det` */
}

static stoke_err *sdpa_plan(const stoke_kernel_args_v1 *a, void **state, size_t *ws, stoke_dtype dt, int bwd) {
  *state = NULL;
  *ws = 0;
  sdpa_state *st = stoke_host->alloc(sizeof *st);
  if (!st) return STOKE_PERR(STOKE_E_OOM, "cudnn attention: out of host memory");
  memset(st, 0, sizeof *st);
  stoke_err *e = sdpa_check(a, dt, bwd, 0, &st->s);
  cudnn_engine *eng = a->engine;
  if (!e && !eng) e = STOKE_PERR(STOKE_E_INVALID, "cudnn attention: the cudnn engine is not open");
  st->bwd = bwd;
  snprintf(st->node, sizeof st->node, "%.63s", stoke_node_name(a));
  if (!e)
    e = make_plan(st, eng, (a->flags & STOKE_KFLAG_AUTOTUNE) != 0, (a->flags & STOKE_KFLAG_DETERMINISTIC) != 0,
                  a->stream);
  if (e) {
    sdpa_destroy(st);
    return e;
  }
  *state = st;
  *ws = up((size_t)st->ws) + st->extra;
  return NULL;
}

static stoke_err *sdpa_exec(const sdpa_state *st, cudnn_engine *eng, bdesc plan, int64_t ws_bytes, void *qkv_p,
                            void *y, void *stats, void *dy, void *dqkv_p, void *workspace, void *stream_p);

/* The data of each unique id, then execute on the node's stream. */
static stoke_err *sdpa_run(const stoke_kernel_args_v1 *a, void *state, stoke_dtype dt) {
  sdpa_state *st = state;
  sdpa_geom s;
  STOKE_PROPAGATE_P(sdpa_check(a, dt, st ? st->bwd : 0, 1, &s));
  if (!st || !st->plan) return STOKE_PERR(STOKE_E_INTERNAL, "cudnn attention: run() without plan()");
  if (st->bwd && !a->din[0].data) return NULL;
  size_t need = up((size_t)st->ws) + st->extra;
  if (a->workspace_bytes < need || (need && !a->workspace))
    return STOKE_PERR(STOKE_E_INTERNAL, "cudnn attention '%s': needs %zu bytes of workspace, got %zu", st->node, need,
                      a->workspace_bytes);
  return sdpa_exec(st, a->engine, st->plan, st->ws, a->in[0].data, a->out[0].data, a->out[1].data,
                   st->bwd ? a->dout[0].data : NULL, st->bwd ? a->din[0].data : NULL, a->workspace, a->stream);
}

/* Execute `plan` (workspace ws_bytes of the engine's) on the given tensors:
 * qkv, y, the lse stats, and for backward dy and dqkv; `workspace` holds
 * the engine's part, then ours (sdpa_state.extra). */
static stoke_err *sdpa_exec(const sdpa_state *st, cudnn_engine *eng, bdesc plan, int64_t ws_bytes, void *qkv_p,
                            void *y, void *stats, void *dy, void *dqkv_p, void *workspace, void *stream_p) {
  const sdpa_geom s = st->s;
  cudnnDataType_t io = s.io;
  char *ws = workspace, *ours = ws + up((size_t)ws_bytes);
  int64_t c = s.h * s.d;
  char *qkv = qkv_p;
  size_t es = 2; /* bf16, fp16 */
  float scale = (float)s.scale, mask = -1e30f, one_f = 1.f;
  uint16_t one_io = io == CUDNN_DATA_BFLOAT16 ? 0x3f80 : 0x3c00; /* 1.0, the dropout scale in the io type */
  void *seed = ours, *offset = ours + sizeof(int64_t);
  int64_t ids[20];
  void *ptrs[20];
  int n = 0;
#define BIND(id, p) (ids[n] = (id), ptrs[n++] = (void *)(p))
  BIND(ID_Q, qkv), BIND(ID_K, qkv + c * es), BIND(ID_V, qkv + 2 * c * es), BIND(ID_O, y);
  BIND(ID_STATS, stats), BIND(ID_SCALE, &scale), BIND(ID_MASK, &mask);
  if (st->dropout) BIND(ID_SEED, seed), BIND(ID_OFFSET, offset), BIND(ID_DROP_SCALE, &one_io);
  cudaStream_t stream = (cudaStream_t)stream_p;
  CUDNN_CHECK(cudnnSetStream(eng->handle, stream), st->node);
  if (st->zero) STOKE_CUDA(cudaMemsetAsync(ours, 0, st->zero, stream));
  if (st->bwd) {
    char *dqkv = dqkv_p, *sum = ours + up(2 * sizeof(int64_t));
    BIND(ID_DO, dy), BIND(ID_DQ, dqkv), BIND(ID_DK, dqkv + c * es), BIND(ID_DV, dqkv + 2 * c * es);
    BIND(ID_SUM, sum), BIND(ID_PROB, &one_f);
    if (!st->det) BIND(ID_DQ_ACCUM, sum + up((size_t)(s.b * s.h * s.t) * 4));
  }
#undef BIND
  bdesc vp;
  CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), st->node);
  void *wsp = ws_bytes ? ws : NULL;
  cudnnStatus_t r = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, ids);
  if (r == CUDNN_STATUS_SUCCESS)
    r = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (r == CUDNN_STATUS_SUCCESS)
    r = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
  if (r == CUDNN_STATUS_SUCCESS) r = cudnnBackendFinalize(vp);
  if (r == CUDNN_STATUS_SUCCESS) r = cudnnBackendExecute(eng->handle, plan, vp);
  cudnnBackendDestroyDescriptor(vp);
  if (r != CUDNN_STATUS_SUCCESS)
    return stoke_cudnn_err(r, __FILE__, __LINE__, "cudnnBackendExecute (SDPA)", st->node);
  return NULL;
}

/* One execution of a candidate plan on the timing temporaries p: qkv, y,
 * stats, dy, dqkv, workspace. */
typedef struct sdpa_run_ctx {
  sdpa_state *st;
  cudnn_engine *eng;
  bdesc plan;
  int64_t ws;
  void *p[6];
  void *stream;
} sdpa_run_ctx;

static int run_sdpa(void *ctx) {
  sdpa_run_ctx *r = ctx;
  int bwd = r->st->bwd;
  stoke_err *e = sdpa_exec(r->st, r->eng, r->plan, r->ws, r->p[0], r->p[1], r->p[2], bwd ? r->p[3] : NULL,
                           bwd ? r->p[4] : NULL, r->p[5], r->stream);
  if (e) stoke_host->err_free(e);
  return e != NULL;
}

/* Each plan's time (cg_time3) on temporaries (a non-zero pattern, finite),
 * ms; -1 where it failed. */
static stoke_err *time_plans(sdpa_state *st, cudnn_engine *eng, bdesc *plans, int n, const int64_t *ws, void *stream,
                             float *ms) {
  const sdpa_geom *s = &st->s;
  size_t c = (size_t)(s->b * s->t * s->h * s->d), rows = (size_t)(s->b * s->h * s->t), wmax = 0;
  for (int i = 0; i < n; i++)
    if ((size_t)ws[i] > wmax) wmax = (size_t)ws[i];
  size_t bytes[6] = {3 * c * 2, c * 2, rows * 4, c * 2, 3 * c * 2, up(wmax) + st->extra};
  sdpa_run_ctx r = {st, eng, NULL, 0, {0}, stream};
  stoke_err *e = NULL;
  /* q, k, v; o; the softmax statistics (f32); dO; dq, dk, dv: values uniform in [-1, 1) (constants run faster
     than the step's data: backends/cuda/tune_fill.cu); the workspace as before, 0x3c bytes */
  const stoke_dtype io = cg_stoke_dtype(s->io), kind[6] = {io, io, STOKE_F32, io, io, STOKE_U8};
  for (int i = 0; i < 6 && !e; i++) {
    if (cudaMalloc(&r.p[i], bytes[i]) != cudaSuccess)
      e = STOKE_PERR(STOKE_E_OOM, "cudnn attention '%s': autotune: no device memory for %zu B of temporaries",
                     st->node, bytes[i]);
    else
      stoke_cuda_tune_fill(r.p[i], bytes[i], kind[i], STOKE_TUNE_FILL_SEED + (uint32_t)i, (cudaStream_t)stream);
  }
  for (int k = 0; k < n && !e; k++) {
    r.plan = plans[k], r.ws = ws[k];
    ms[k] = cg_time3(run_sdpa, &r, (cudaStream_t)stream);
  }
  for (int i = 0; i < 6; i++)
    if (r.p[i]) cudaFree(r.p[i]);
  cudaGetLastError();
  return e;
}

#define SDPA_KERNELS(sfx, DT)                                                                          \
  static stoke_err *fwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {           \
    return sdpa_plan(a, st, ws, DT, 0);                                                              \
  }                                                                                                  \
  static stoke_err *bwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {           \
    return sdpa_plan(a, st, ws, DT, 1);                                                              \
  }                                                                                                  \
  static stoke_err *run_##sfx(const stoke_kernel_args_v1 *a, void *st) { return sdpa_run(a, st, DT); }

SDPA_KERNELS(bf16, STOKE_BF16)
SDPA_KERNELS(f16, STOKE_F16)

static const stoke_kernel_v1 kernels[] = {
    {"cudnn", STOKE_OP_ATTENTION, STOKE_FWD, STOKE_BF16, STOKE_LAYOUT_ANY, fwd_plan_bf16, run_bf16, sdpa_destroy},
    {"cudnn", STOKE_OP_ATTENTION, STOKE_BWD, STOKE_BF16, STOKE_LAYOUT_ANY, bwd_plan_bf16, run_bf16, sdpa_destroy},
    {"cudnn", STOKE_OP_ATTENTION, STOKE_FWD, STOKE_F16, STOKE_LAYOUT_ANY, fwd_plan_f16, run_f16, sdpa_destroy},
    {"cudnn", STOKE_OP_ATTENTION, STOKE_BWD, STOKE_F16, STOKE_LAYOUT_ANY, bwd_plan_f16, run_f16, sdpa_destroy},
};

stoke_err *stoke_cudnn_register_sdpa(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++)
    STOKE_PTRY(r->add_kernel(r->self, &kernels[i]), "registering cudnn attention (%s)", stoke_dtype_name(kernels[i].dtype));
  return NULL;
}
