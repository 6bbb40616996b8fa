/* backends/cudnn/convbn.h: the fused convolution + batch-norm graphs
 * (convbn_graph.c) and the order of their tensors' pointers at execution. */
#ifndef STOKE_CUDNN_CONVBN_H
#define STOKE_CUDNN_CONVBN_H

#include "graph.h"

/* conv_stats: x, w -> y, sum, sqsum (f32 [K]) */
enum { CB_CS_X = 0, CB_CS_W, CB_CS_Y, CB_CS_SUM, CB_CS_SQSUM, CB_CS_COUNT };
/* sbr_conv_stats: p, s, b (per channel of p), w -> y, sum, sqsum */
enum { CB_SC_P = 0, CB_SC_W, CB_SC_Y, CB_SC_SUM, CB_SC_SQSUM, CB_SC_S, CB_SC_B, CB_SC_COUNT };
/* sbr_wgrad: p, s, b, dy -> dw */
enum { CB_SW_P = 0, CB_SW_DW, CB_SW_DY, CB_SW_S, CB_SW_B, CB_SW_COUNT };
/* dgrad_drelu_dbn: dy, w, p, mean, invstd, scale, bias (f32 [C]) -> dz (p's
 * shape and dtype), dscale, dbias, eq_dy, eq_x, eq_bias (f32 [C]) */
enum {
  CB_DD_P = 0, CB_DD_W, CB_DD_DY, CB_DD_MEAN, CB_DD_INVSTD, CB_DD_SCALE, CB_DD_BIAS,
  CB_DD_DZ, CB_DD_DSCALE, CB_DD_DBIAS, CB_DD_EQ_DY, CB_DD_EQ_X, CB_DD_EQ_BIAS, CB_DD_COUNT
};

/* Each builds (or finds in the engine's cache) the plan of its graph for
 * geometry `cg`; STOKE_E_UNSUPPORTED when no cuDNN engine runs it. `sb_dt`
 * is the data type of the per-channel scale and bias of the prologue. */
stoke_err *cb_conv_stats(cudnn_engine *eng, const cg_conv_geom *cg, const cg_choice *c, const char *ctx,
                         const cg_plan **out);
stoke_err *cb_sbr_conv_stats(cudnn_engine *eng, const cg_conv_geom *cg, cudnnDataType_t sb_dt, const cg_choice *c,
                             const char *ctx, const cg_plan **out);
stoke_err *cb_sbr_wgrad(cudnn_engine *eng, const cg_conv_geom *cg, cudnnDataType_t sb_dt, const cg_choice *c,
                        const char *ctx, const cg_plan **out);
stoke_err *cb_dgrad_drelu_dbn(cudnn_engine *eng, const cg_conv_geom *cg, const cg_choice *c, const char *ctx,
                              const cg_plan **out);

#endif
