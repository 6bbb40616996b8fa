/* backends/cudnn/convbn_graph.c: the cuDNN operation graphs behind the
 * fused convolution + batch-norm nodes (conv_bn, bn_relu_conv_bn), the
 * runtime-fusion patterns of NVIDIA's MLPerf ResNet:
 *   conv_stats      y = conv(x, w); per-channel sum and sum of squares of y
 *   sbr_conv_stats  y = conv(relu(p * s + b), w) (+ the same statistics):
 *                   the preceding batch norm applied on the fly
 *   sbr_wgrad       dw = wgrad(relu(p * s + b), dy): the same input, for dW
 *   dgrad_drelu_dbn dz = dgrad(dy, w) * (bn(p) > 0), and the batch-norm
 *                   backward reductions of p's batch norm over dz (dscale,
 *                   dbias and the coefficients of dp = a*dz + b*p + c)
 * Each returns the plan (graph.c's cache) with its real tensors' pointers
 * in the order of its CB_* enum below. */
#include <stdio.h>
#include <string.h>

#include "convbn.h"

/* Cache key of a fused graph: which one, the geometry, the choice. */
typedef struct cb_key {
  char tag[8];
  int32_t kind, sb_dt;
  cg_conv_geom g;
  uint32_t autotune, deterministic;
} cb_key;

static cb_key key_of(int kind, const cg_conv_geom *g, cudnnDataType_t sb_dt, const cg_choice *c) {
  cb_key k;
  memset(&k, 0, sizeof k);
  memcpy(k.tag, "convbn", 6);
  k.kind = kind;
  k.sb_dt = (int32_t)sb_dt;
  memcpy(&k.g, g, sizeof *g);
  k.autotune = (uint32_t)c->autotune;
  k.deterministic = (uint32_t)c->deterministic;
  return k;
}

/* relu(p * s + b) as virtual float tensors: the prologue of the two sbr graphs. */
static stoke_err *sbr_prologue(cg_graph *g, const cg_conv_geom *cg, cudnnBackendDescriptor_t p,
                               cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t *out) {
  cudnnBackendDescriptor_t t1, t2, t3;
  STOKE_PROPAGATE_P(cg_tensor4(g, 101, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &t1));
  STOKE_PROPAGATE_P(cg_tensor4(g, 102, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &t2));
  STOKE_PROPAGATE_P(cg_tensor4(g, 103, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &t3));
  STOKE_PROPAGATE_P(cg_pointwise(g, CUDNN_POINTWISE_MUL, p, s, t1));
  STOKE_PROPAGATE_P(cg_pointwise(g, CUDNN_POINTWISE_ADD, t1, b, t2));
  STOKE_PROPAGATE_P(cg_pointwise(g, CUDNN_POINTWISE_RELU_FWD, t2, NULL, t3));
  *out = t3;
  return NULL;
}

stoke_err *cb_conv_stats(cudnn_engine *eng, const cg_conv_geom *cg, const cg_choice *c, const char *ctx,
                         const cg_plan **out) {
  cb_key k = key_of(0, cg, 0, c);
  cg_graph g;
  cg_graph_init(&g, ctx);
  cudnnBackendDescriptor_t x, w, y, sum, sq;
  stoke_err *e = cg_conv_tensors(&g, cg, CB_CS_X + 1, CB_CS_W + 1, CB_CS_Y + 1, &x, &w, &y);
  if (!e) e = cg_channel(&g, CB_CS_SUM + 1, CUDNN_DATA_FLOAT, cg->y[1], &sum);
  if (!e) e = cg_channel(&g, CB_CS_SQSUM + 1, CUDNN_DATA_FLOAT, cg->y[1], &sq);
  if (!e) e = cg_conv(&g, CG_FPROP, cg->pad, cg->stride, cg->dil, x, w, y, 0.0f);
  if (!e) e = cg_genstats(&g, y, sum, sq);
  if (!e) e = cg_plan_get(eng, &g, &k, sizeof k, c, "conv_bn fprop + statistics", out);
  cg_graph_free(&g);
  return e;
}

stoke_err *cb_sbr_conv_stats(cudnn_engine *eng, const cg_conv_geom *cg, cudnnDataType_t sb_dt, const cg_choice *c,
                             const char *ctx, const cg_plan **out) {
  cb_key k = key_of(1, cg, sb_dt, c);
  cg_graph g;
  cg_graph_init(&g, ctx);
  cudnnBackendDescriptor_t p, w, y, sum, sq, s, b, a;
  stoke_err *e = cg_conv_tensors(&g, cg, CB_SC_P + 1, CB_SC_W + 1, CB_SC_Y + 1, &p, &w, &y);
  if (!e) e = cg_channel(&g, CB_SC_SUM + 1, CUDNN_DATA_FLOAT, cg->y[1], &sum);
  if (!e) e = cg_channel(&g, CB_SC_SQSUM + 1, CUDNN_DATA_FLOAT, cg->y[1], &sq);
  if (!e) e = cg_channel(&g, CB_SC_S + 1, sb_dt, cg->x[1], &s);
  if (!e) e = cg_channel(&g, CB_SC_B + 1, sb_dt, cg->x[1], &b);
  if (!e) e = sbr_prologue(&g, cg, p, s, b, &a);
  if (!e) e = cg_conv(&g, CG_FPROP, cg->pad, cg->stride, cg->dil, a, w, y, 0.0f);
  if (!e) e = cg_genstats(&g, y, sum, sq);
  if (!e) e = cg_plan_get(eng, &g, &k, sizeof k, c, "bn_relu_conv_bn fprop (scale-bias-relu prologue) + statistics",
                          out);
  cg_graph_free(&g);
  return e;
}

stoke_err *cb_sbr_wgrad(cudnn_engine *eng, const cg_conv_geom *cg, cudnnDataType_t sb_dt, const cg_choice *c,
                        const char *ctx, const cg_plan **out) {
  cb_key k = key_of(2, cg, sb_dt, c);
  cg_graph g;
  cg_graph_init(&g, ctx);
  cudnnBackendDescriptor_t p, dw, dy, s, b, a;
  stoke_err *e = cg_conv_tensors(&g, cg, CB_SW_P + 1, CB_SW_DW + 1, CB_SW_DY + 1, &p, &dw, &dy);
  if (!e) e = cg_channel(&g, CB_SW_S + 1, sb_dt, cg->x[1], &s);
  if (!e) e = cg_channel(&g, CB_SW_B + 1, sb_dt, cg->x[1], &b);
  if (!e) e = sbr_prologue(&g, cg, p, s, b, &a);
  if (!e) e = cg_conv(&g, CG_WGRAD, cg->pad, cg->stride, cg->dil, a, dw, dy, 0.0f);
  if (!e) e = cg_plan_get(eng, &g, &k, sizeof k, c, "bn_relu_conv_bn wgrad (scale-bias-relu prologue)", out);
  cg_graph_free(&g);
  return e;
}

stoke_err *cb_dgrad_drelu_dbn(cudnn_engine *eng, const cg_conv_geom *cg, const cg_choice *c, const char *ctx,
                              const cg_plan **out) {
  cb_key k = key_of(3, cg, CUDNN_DATA_FLOAT, c);
  cg_graph g;
  cg_graph_init(&g, ctx);
  cudnnBackendDescriptor_t p, w, dy, m, v, s, b, dz, ds, db, eqdy, eqx, eqb;
  cudnnBackendDescriptor_t dx, t1, t2, t3, t4;
  int64_t C = cg->x[1];
  stoke_err *e = cg_conv_tensors(&g, cg, CB_DD_P + 1, CB_DD_W + 1, CB_DD_DY + 1, &p, &w, &dy);
  if (!e) e = cg_channel(&g, CB_DD_MEAN + 1, CUDNN_DATA_FLOAT, C, &m);
  if (!e) e = cg_channel(&g, CB_DD_INVSTD + 1, CUDNN_DATA_FLOAT, C, &v);
  if (!e) e = cg_channel(&g, CB_DD_SCALE + 1, CUDNN_DATA_FLOAT, C, &s);
  if (!e) e = cg_channel(&g, CB_DD_BIAS + 1, CUDNN_DATA_FLOAT, C, &b);
  if (!e) e = cg_tensor4(&g, CB_DD_DZ + 1, (cudnnDataType_t)cg->dt, cg->x, cg->nhwc, 0, &dz);
  if (!e) e = cg_channel(&g, CB_DD_DSCALE + 1, CUDNN_DATA_FLOAT, C, &ds);
  if (!e) e = cg_channel(&g, CB_DD_DBIAS + 1, CUDNN_DATA_FLOAT, C, &db);
  if (!e) e = cg_channel(&g, CB_DD_EQ_DY + 1, CUDNN_DATA_FLOAT, C, &eqdy);
  if (!e) e = cg_channel(&g, CB_DD_EQ_X + 1, CUDNN_DATA_FLOAT, C, &eqx);
  if (!e) e = cg_channel(&g, CB_DD_EQ_BIAS + 1, CUDNN_DATA_FLOAT, C, &eqb);
  if (!e) e = cg_tensor4(&g, 111, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &dx);
  if (!e) e = cg_tensor4(&g, 112, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &t1);
  if (!e) e = cg_tensor4(&g, 113, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &t2);
  if (!e) e = cg_tensor4(&g, 114, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &t3);
  if (!e) e = cg_tensor4(&g, 115, CUDNN_DATA_FLOAT, cg->x, cg->nhwc, 1, &t4);
  if (!e) e = cg_conv(&g, CG_DGRAD, cg->pad, cg->stride, cg->dil, dx, w, dy, 0.0f);
  if (!e) e = cg_pointwise(&g, CUDNN_POINTWISE_SUB, p, m, t1);
  if (!e) e = cg_pointwise(&g, CUDNN_POINTWISE_MUL, t1, v, t2);
  if (!e) e = cg_pointwise(&g, CUDNN_POINTWISE_MUL, t2, s, t3);
  if (!e) e = cg_pointwise(&g, CUDNN_POINTWISE_ADD, t3, b, t4);
  if (!e) e = cg_pointwise(&g, CUDNN_POINTWISE_RELU_BWD, dx, t4, dz);
  if (!e) e = cg_bn_bwd_weights(&g, p, m, v, s, dz, ds, db, eqdy, eqx, eqb);
  if (!e) e = cg_plan_get(eng, &g, &k, sizeof k, c, "bn_relu_conv_bn dgrad + relu backward + batch-norm reductions",
                          out);
  cg_graph_free(&g);
  return e;
}
