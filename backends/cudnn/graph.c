/* backends/cudnn/graph.c: the cuDNN graph ("backend") API helpers of the
 * cudnn plugin (see graph.h): descriptor builders, plan choice among the
 * heuristic engine configurations (timed or first-that-builds), the
 * engine's plan cache and execution.
 *
 * Plain C over cudnn_graph.h: the C++ cudnn-frontend headers are not
 * installed, and its descriptor work is a thin layer over these calls.
 * Candidates are the configurations of cuDNN's INSTANT heuristic mode then
 * its FALLBACK mode (what PyTorch's v8 path asks for), filtered by the
 * engine notes (NONDETERMINISTIC under `deterministic`; tensor-core
 * engines for f32 without TF32, as they down-convert to TF32) and the
 * workspace cap. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

#include "backends/cuda/tune_fill.h"

/* A cuDNN status as a stoke error (stoke_cudnn.h). */
stoke_err *stoke_cudnn_err(cudnnStatus_t s, const char *file, int line, const char *call, const char *ctx) {
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof detail);
  int code = (int)s;
  stoke_code c = code == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                         code == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                     ? STOKE_E_OOM
                 : code / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000 ? STOKE_E_UNSUPPORTED
                                                                   : STOKE_E_DEVICE;
  return stoke_host->err_new(c, file, line, "%s failed: %s (%d)%s%s; %s", call, cudnnGetErrorString(s), code,
                             detail[0] ? ": " : "", detail, ctx ? ctx : "");
}

#define CG_CHECK(call) CUDNN_CHECK(call, g->ctx)
#define SET(d, attr, type, n, ptr) CG_CHECK(cudnnBackendSetAttribute((d), (attr), (type), (n), (ptr)))

stoke_dtype cg_stoke_dtype(cudnnDataType_t dt) {
  switch (dt) {
    case CUDNN_DATA_FLOAT: return STOKE_F32;
    case CUDNN_DATA_BFLOAT16: return STOKE_BF16;
    case CUDNN_DATA_HALF: return STOKE_F16;
    default: return STOKE_U8;
  }
}

static size_t dt_size(cudnnDataType_t dt) {
  switch (dt) {
    case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8:
    case CUDNN_DATA_UINT8: return 1;
    default: return 4;
  }
}

void cg_graph_init(cg_graph *g, const char *ctx) {
  memset(g, 0, sizeof *g);
  g->ctx = ctx;
}

void cg_graph_free(cg_graph *g) {
  for (int i = g->n_ops - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->ops[i]);
  for (int i = g->n_other - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->other[i]);
  for (int i = g->n_tensors - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->tensors[i]);
  g->n_ops = g->n_other = g->n_tensors = 0;
}

/* A new descriptor of `type`, owned by the graph's list `list`. */
static stoke_err *make(cg_graph *g, cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *list, int *n,
                       int cap, cudnnBackendDescriptor_t *out) {
  if (*n >= cap)
    return STOKE_PERR(STOKE_E_INTERNAL, "cudnn graph: more than %d descriptors of one kind; %s", cap, g->ctx);
  CG_CHECK(cudnnBackendCreateDescriptor(type, &list[*n]));
  *out = list[(*n)++];
  return NULL;
}

stoke_err *cg_tensor(cg_graph *g, int64_t uid, cudnnDataType_t dt, int nd, const int64_t *dims,
                     const int64_t *strides, int is_virtual, cudnnBackendDescriptor_t *out) {
  int i = g->n_tensors;
  cudnnBackendDescriptor_t t;
  STOKE_PROPAGATE_P(make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, g->tensors, &g->n_tensors, CG_MAX_TENSORS, &t));
  int64_t align = 16;
  bool v = is_virtual != 0;
  SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims);
  SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, strides);
  SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  SET(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
  CG_CHECK(cudnnBackendFinalize(t));
  size_t span = 1;
  for (int k = 0; k < nd; k++) span += (size_t)(dims[k] - 1) * (size_t)strides[k];
  g->uids[i] = uid;
  g->is_virtual[i] = is_virtual;
  g->bytes[i] = span * dt_size(dt);
  g->dt[i] = dt;
  *out = t;
  return NULL;
}

stoke_err *cg_tensor4(cg_graph *g, int64_t uid, cudnnDataType_t dt, const int64_t d[4], int nhwc, int is_virtual,
                      cudnnBackendDescriptor_t *out) {
  int64_t s[4];
  if (nhwc) s[0] = d[1] * d[2] * d[3], s[1] = 1, s[2] = d[3] * d[1], s[3] = d[1];
  else s[0] = d[1] * d[2] * d[3], s[1] = d[2] * d[3], s[2] = d[3], s[3] = 1;
  return cg_tensor(g, uid, dt, 4, d, s, is_virtual, out);
}

stoke_err *cg_channel(cg_graph *g, int64_t uid, cudnnDataType_t dt, int64_t c, cudnnBackendDescriptor_t *out) {
  const int64_t d[4] = {1, c, 1, 1}, s[4] = {c, 1, c, c};
  return cg_tensor(g, uid, dt, 4, d, s, 0, out);
}

stoke_err *cg_conv_tensors(cg_graph *g, const cg_conv_geom *cg, int64_t ux, int64_t uw, int64_t uy,
                           cudnnBackendDescriptor_t *x, cudnnBackendDescriptor_t *w, cudnnBackendDescriptor_t *y) {
  const int64_t *wd = cg->w;
  const int64_t oihw[4] = {wd[1] * wd[2] * wd[3], wd[2] * wd[3], wd[3], 1};
  const int64_t ohwi[4] = {wd[1] * wd[2] * wd[3], 1, wd[3] * wd[1], wd[1]};
  STOKE_PROPAGATE_P(cg_tensor4(g, ux, (cudnnDataType_t)cg->dt, cg->x, cg->nhwc, 0, x));
  STOKE_PROPAGATE_P(cg_tensor(g, uw, (cudnnDataType_t)cg->dt, 4, wd, cg->w_krsc ? ohwi : oihw, 0, w));
  return cg_tensor4(g, uy, (cudnnDataType_t)cg->dt, cg->y, cg->nhwc, 0, y);
}

stoke_err *cg_conv(cg_graph *g, cg_conv_kind kind, const int64_t pad[2], const int64_t stride[2],
                   const int64_t dil[2], cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                   cudnnBackendDescriptor_t y, float beta) {
  cudnnBackendDescriptor_t c, op;
  STOKE_PROPAGATE_P(make(g, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, g->other, &g->n_other, CG_MAX_OTHER, &c));
  int64_t dims = 2;
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  SET(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  SET(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  SET(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  SET(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  SET(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  SET(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  SET(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  CG_CHECK(cudnnBackendFinalize(c));
  static const cudnnBackendDescriptorType_t types[3] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                                        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                                        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
  /* attribute ids of (x, w, y, conv, alpha, beta) per kind */
  static const cudnnBackendAttributeName_t at[3][6] = {
      {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
  STOKE_PROPAGATE_P(make(g, types[kind], g->ops, &g->n_ops, CG_MAX_OPS, &op));
  float alpha = 1.0f;
  SET(op, at[kind][0], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  SET(op, at[kind][1], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
  SET(op, at[kind][2], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  SET(op, at[kind][3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  SET(op, at[kind][4], CUDNN_TYPE_FLOAT, 1, &alpha);
  SET(op, at[kind][5], CUDNN_TYPE_FLOAT, 1, &beta);
  CG_CHECK(cudnnBackendFinalize(op));
  return NULL;
}

static int is_bwd_mode(cudnnPointwiseMode_t m) {
  return m == CUDNN_POINTWISE_RELU_BWD || m == CUDNN_POINTWISE_TANH_BWD || m == CUDNN_POINTWISE_SIGMOID_BWD ||
         m == CUDNN_POINTWISE_ELU_BWD || m == CUDNN_POINTWISE_GELU_BWD || m == CUDNN_POINTWISE_SOFTPLUS_BWD ||
         m == CUDNN_POINTWISE_SWISH_BWD;
}

stoke_err *cg_pointwise(cg_graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                        cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t pw, op;
  STOKE_PROPAGATE_P(make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, g->other, &g->n_other, CG_MAX_OTHER, &pw));
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  CG_CHECK(cudnnBackendFinalize(pw));
  STOKE_PROPAGATE_P(make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, g->ops, &g->n_ops, CG_MAX_OPS, &op));
  SET(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  if (is_bwd_mode(mode)) { /* dx = f'(b) * x: x is the incoming gradient */
    SET(op, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    SET(op, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  } else {
    SET(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) SET(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    SET(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  }
  CG_CHECK(cudnnBackendFinalize(op));
  return NULL;
}

stoke_err *cg_genstats(cg_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t sum,
                       cudnnBackendDescriptor_t sqsum) {
  cudnnBackendDescriptor_t op;
  STOKE_PROPAGATE_P(make(g, CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, g->ops, &g->n_ops, CG_MAX_OPS, &op));
  cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  SET(op, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode);
  SET(op, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  SET(op, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  SET(op, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sum);
  SET(op, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sqsum);
  CG_CHECK(cudnnBackendFinalize(op));
  return NULL;
}

stoke_err *cg_bn_bwd_weights(cg_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t mean,
                             cudnnBackendDescriptor_t invstd, cudnnBackendDescriptor_t scale,
                             cudnnBackendDescriptor_t dy, cudnnBackendDescriptor_t dscale,
                             cudnnBackendDescriptor_t dbias, cudnnBackendDescriptor_t eq_dy,
                             cudnnBackendDescriptor_t eq_x, cudnnBackendDescriptor_t eq_bias) {
  cudnnBackendDescriptor_t op;
  STOKE_PROPAGATE_P(
      make(g, CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, g->ops, &g->n_ops, CG_MAX_OPS, &op));
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mean);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &invstd);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &scale);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dy);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dscale);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dbias);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eq_dy);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eq_x);
  SET(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eq_bias);
  CG_CHECK(cudnnBackendFinalize(op));
  return NULL;
}

/* ------------------------------------------------------------ plan choice */

/* The configurations of one heuristic mode for a finalized operation
 * graph (descriptors the caller destroys), at most `cap`. */
static stoke_err *heur_configs(cudnn_engine *eng, cg_graph *g, cudnnBackendDescriptor_t opg,
                               cudnnBackendHeurMode_t mode, cudnnBackendDescriptor_t *cfgs, int cap, int *n) {
  cudnnBackendDescriptor_t h;
  *n = 0;
  CG_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &h));
  stoke_err *e = NULL;
  cudnnStatus_t s = cudnnBackendSetAttribute(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opg);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(h);
  int64_t count = 0;
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
  if (s == CUDNN_STATUS_SUCCESS && count > 0) {
    if (count > cap) count = cap;
    int made = 0; /* descriptors created: a failed create leaves its slot unset, never destroyed */
    while (made < count && (s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[made])) ==
                               CUDNN_STATUS_SUCCESS)
      made++;
    int64_t got = 0;
    if (s == CUDNN_STATUS_SUCCESS)
      s = cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                   cfgs);
    if (s != CUDNN_STATUS_SUCCESS) {
      for (int i = 0; i < made; i++) cudnnBackendDestroyDescriptor(cfgs[i]);
    } else {
      *n = (int)(got < count ? got : count);
      for (int i = *n; i < made; i++) cudnnBackendDestroyDescriptor(cfgs[i]);
    }
  }
  /* a mode that has nothing for this graph is not an error: the caller
   * tries the next mode and reports when none had a configuration */
  if (s != CUDNN_STATUS_SUCCESS && s != CUDNN_STATUS_NOT_SUPPORTED && s / 1000 != CUDNN_STATUS_NOT_SUPPORTED / 1000)
    e = stoke_cudnn_err(s, __FILE__, __LINE__, "cudnn engine heuristics", g->ctx);
  cudnnBackendDestroyDescriptor(h);
  (void)eng;
  return e;
}

/* What the engine of configuration `cfg` is: global index, numerical and
 * behaviour notes. 0 when it can be read. */
typedef struct cfg_info {
  int64_t id;
  int nondeterministic, tensor_core, down_convert, runtime_compiled;
  int lossy; /* FFT, Winograd or a reduced-precision reduction: error relative to the largest value */
} cfg_info;

static int read_cfg(cudnnBackendDescriptor_t cfg, cfg_info *ci) {
  memset(ci, 0, sizeof *ci);
  cudnnBackendDescriptor_t en;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &en) != CUDNN_STATUS_SUCCESS) return -1;
  int64_t n = 0;
  int rc = -1;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &en) ==
      CUDNN_STATUS_SUCCESS) {
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t beh[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t nn = 0, nb = 0;
    cudnnBackendGetAttribute(en, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &ci->id);
    if (cudnnBackendGetAttribute(en, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) != CUDNN_STATUS_SUCCESS)
      nn = 0;
    if (cudnnBackendGetAttribute(en, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nb, beh) != CUDNN_STATUS_SUCCESS)
      nb = 0;
    for (int64_t i = 0; i < nn; i++) {
      if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) ci->nondeterministic = 1;
      if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) ci->tensor_core = 1;
      if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) ci->down_convert = 1;
      if (notes[i] == CUDNN_NUMERICAL_NOTE_FFT || notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD ||
          notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4 || notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 ||
          notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13 ||
          notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
        ci->lossy = 1;
    }
    for (int64_t i = 0; i < nb; i++)
      if (beh[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) ci->runtime_compiled = 1;
    rc = 0;
  }
  cudnnBackendDestroyDescriptor(en);
  return rc;
}

int cg_cfg_nondeterministic(cudnnBackendDescriptor_t cfg) {
  cfg_info ci;
  return read_cfg(cfg, &ci) ? -1 : ci.nondeterministic;
}

/* An execution plan of configuration `cfg`; NULL plan when it does not build. */
static cudnnBackendDescriptor_t build_plan(cudnn_engine *eng, cudnnBackendDescriptor_t cfg, int64_t *ws) {
  cudnnBackendDescriptor_t p;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS) return NULL;
  cudnnStatus_t s = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &eng->handle);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(p);
  int64_t n = 0;
  *ws = 0;
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, ws);
  if (s != CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(p);
    return NULL;
  }
  return p;
}

/* Temporary memory for timing candidates: every real tensor of the graph
 * (a non-zero pattern: timing on zeros is not honest) and a workspace. */
typedef struct tune_mem {
  void *ptrs[CG_MAX_TENSORS];
  void *ws;
  size_t ws_bytes;
} tune_mem;

static void tune_free(tune_mem *t) {
  for (int i = 0; i < CG_MAX_TENSORS; i++)
    if (t->ptrs[i]) cudaFree(t->ptrs[i]);
  if (t->ws) cudaFree(t->ws);
  memset(t, 0, sizeof *t);
}

/* The workspace cap of graph g: cudnn_ws_cap of its real tensors' bytes. */
static size_t graph_ws_cap(const cg_graph *g) {
  size_t b = 0;
  for (int i = 0; i < g->n_tensors; i++)
    if (!g->is_virtual[i]) b += g->bytes[i];
  return cudnn_ws_cap(b);
}

static stoke_err *tune_alloc(const cg_graph *g, const cg_plan *shape, tune_mem *t, cudaStream_t s) {
  memset(t, 0, sizeof *t);
  for (int i = 0, k = 0; i < g->n_tensors; i++) {
    if (g->is_virtual[i]) continue;
    if (cudaMalloc(&t->ptrs[k], g->bytes[i]) != cudaSuccess) {
      cudaGetLastError();
      tune_free(t);
      return STOKE_PERR(STOKE_E_OOM, "cudnn autotune: no device memory for a %zu B temporary tensor; %s",
                        g->bytes[i], g->ctx);
    }
    /* values of the tensor's type uniform in [-1, 1): constants run faster than the step's data
       (backends/cuda/tune_fill.cu) */
    stoke_cuda_tune_fill(t->ptrs[k], g->bytes[i], cg_stoke_dtype(g->dt[i]), STOKE_TUNE_FILL_SEED + (uint32_t)i, s);
    k++;
  }
  (void)shape;
  for (size_t b = graph_ws_cap(g); b >= ((size_t)1 << 20); b /= 2) {
    if (cudaMalloc(&t->ws, b) == cudaSuccess) {
      t->ws_bytes = b;
      break;
    }
    cudaGetLastError();
    t->ws = NULL;
  }
  return NULL;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

float cg_time3(int (*run)(void *ctx), void *ctx, cudaStream_t s) {
  cudaEvent_t ev[4] = {0};
  float ms[3], out = -1;
  int ok = 1;
  for (int i = 0; i < 4 && ok; i++) ok = cudaEventCreate(&ev[i]) == cudaSuccess;
  if (ok) ok = !run(ctx); /* the warm-up */
  for (int r = 0; r < 3 && ok; r++) {
    cudaEventRecord(ev[r], s);
    ok = !run(ctx);
    cudaEventRecord(ev[r + 1], s);
  }
  if (ok && cudaEventSynchronize(ev[3]) == cudaSuccess) {
    for (int r = 0; r < 3; r++) cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]);
    qsort(ms, 3, sizeof *ms, cmp_float);
    out = ms[1];
  }
  cudaStreamSynchronize(s);
  cudaGetLastError();
  for (int i = 0; i < 4; i++)
    if (ev[i]) cudaEventDestroy(ev[i]);
  return out;
}

/* One execution of a candidate plan on the timing temporaries. */
typedef struct plan_run {
  cudnn_engine *eng;
  const cg_plan *p;
  tune_mem *t;
  cudaStream_t s;
} plan_run;

static int run_plan(void *ctx) {
  plan_run *r = ctx;
  stoke_err *e = cg_execute(r->eng, r->p, r->t->ptrs, r->t->ws, r->s, "autotune");
  if (e) stoke_host->err_free(e);
  return e != NULL;
}

/* Median of 3 timed runs after one warm-up, in ms; < 0 when it failed. */
static float time_plan(cudnn_engine *eng, const cg_plan *p, tune_mem *t, cudaStream_t s) {
  if ((size_t)p->workspace > t->ws_bytes) return -1;
  plan_run r = {eng, p, t, s};
  return cg_time3(run_plan, &r, s);
}

/* Choose and build the plan of a finalized operation graph. */
static stoke_err *choose_plan(cudnn_engine *eng, cg_graph *g, cudnnBackendDescriptor_t opg, const cg_choice *c,
                              cg_plan *out) {
  enum { CAP = 64 };
  cudnnBackendDescriptor_t cfgs[2 * CAP];
  int n = 0, n_mode;
  static const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_INSTANT, CUDNN_HEUR_MODE_FALLBACK};
  for (int m = 0; m < 2; m++) {
    stoke_err *he = heur_configs(eng, g, opg, modes[m], cfgs + n, CAP, &n_mode);
    if (he) { /* the first mode's configurations go too */
      for (int i = 0; i < n; i++) cudnnBackendDestroyDescriptor(cfgs[i]);
      return he;
    }
    n += n_mode;
  }
  memset(out, 0, sizeof *out);
  out->candidates = n;
  out->ms = -1;
  for (int i = 0; i < g->n_tensors && out->n_uids < CG_MAX_TENSORS; i++)
    if (!g->is_virtual[i]) out->uids[out->n_uids++] = g->uids[i];
  int tune = c->autotune, limit = tune ? (c->max_candidates > 0 ? c->max_candidates : 12) : 1;
  int timed = 0, skipped_det = 0, skipped_tf32 = 0, skipped_ws = 0;
  tune_mem tm;
  int tm_ready = 0;
  cudaStream_t s = (cudaStream_t)c->stream;
  stoke_err *e = NULL;
  for (int i = 0; i < n && timed < limit && !e; i++) {
    cfg_info ci;
    if (read_cfg(cfgs[i], &ci)) continue;
    if (c->deterministic && ci.nondeterministic) {
      skipped_det++;
      continue;
    }
    /* true f32 asked: no TF32, and no transform whose error is relative to
     * the largest value rather than to each sum (FFT, Winograd): a weight
     * gradient with heavy cancellation (ResNet's stem, 8x32x32 terms of both
     * signs per element) came out 2,700x less accurate than the CPU's f32
     * (tests/gpu/resnet_gpu_test, H100). Only where nothing else runs. */
    if (c->no_tf32 && (ci.tensor_core || ci.down_convert || (ci.lossy && !c->allow_lossy))) {
      skipped_tf32++;
      continue;
    }
    cg_plan cand = *out;
    cand.ms = -1;
    cand.plan = build_plan(eng, cfgs[i], &cand.workspace);
    if (!cand.plan) continue;
    out->built++;
    if ((size_t)cand.workspace > graph_ws_cap(g)) {
      skipped_ws++;
      cudnnBackendDestroyDescriptor(cand.plan);
      continue;
    }
    cand.engine_id = ci.id;
    cand.runtime_compiled = ci.runtime_compiled;
    timed++;
    if (tune && !tm_ready) {
      e = tune_alloc(g, &cand, &tm, s);
      if (cudnn_tune_fallback(&e, NULL)) { /* this candidate, the heuristic order's first that fits */
        tune = 0, limit = timed;
      } else if (e) {
        cudnnBackendDestroyDescriptor(cand.plan);
        break;
      } else {
        tm_ready = 1;
      }
    }
    if (tune) {
      /* a workspace the timing could not allocate (the device is short of memory): kept untimed when nothing
       * else has been, as cuDNN's heuristic order's first that fits; a timed candidate replaces it */
      int short_ws = (size_t)cand.workspace > tm.ws_bytes;
      cand.ms = short_ws ? -1 : time_plan(eng, &cand, &tm, s);
      if (cand.ms < 0 && !(short_ws && !out->plan)) {
        cudnnBackendDestroyDescriptor(cand.plan);
        continue;
      }
    }
    if (!out->plan || (cand.ms >= 0 && (out->ms < 0 || cand.ms < out->ms))) {
      if (out->plan) cudnnBackendDestroyDescriptor(out->plan);
      int cands = out->candidates, built = out->built;
      *out = cand;
      out->candidates = cands, out->built = built;
    } else {
      cudnnBackendDestroyDescriptor(cand.plan);
    }
  }
  if (tm_ready) tune_free(&tm);
  for (int i = 0; i < n; i++) cudnnBackendDestroyDescriptor(cfgs[i]);
  if (e) {
    if (out->plan) cudnnBackendDestroyDescriptor(out->plan);
    out->plan = NULL;
    return e;
  }
  if (!out->plan)
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "cudnn graph: no engine runs this graph: %d configurations from cuDNN's heuristics, %d "
                      "built (%d skipped as nondeterministic, %d as TF32 or FFT/Winograd for f32, %d over the %zu "
                      "MiB workspace cap); %s",
                      n, out->built, skipped_det, skipped_tf32, skipped_ws, graph_ws_cap(g) >> 20, g->ctx);
  return NULL;
}

/* ------------------------------------------------------------------ cache */

/* Entries are allocated one by one and never move: nodes keep pointers
 * to their plans while later nodes add entries. */
typedef struct cg_entry {
  void *key;
  size_t key_bytes;
  cg_plan plan;
} cg_entry;

struct cg_cache {
  cg_entry **e;
  int n, cap;
};

void cg_cache_free(cudnn_engine *eng) {
  struct cg_cache *c = eng->plans;
  if (!c) return;
  for (int i = 0; i < c->n; i++) {
    cudnnBackendDestroyDescriptor(c->e[i]->plan.plan);
    free(c->e[i]->key);
    free(c->e[i]);
  }
  free(c->e);
  free(c);
  eng->plans = NULL;
}

static const cg_plan *cache_find(cudnn_engine *eng, const void *key, size_t kb) {
  struct cg_cache *c = eng->plans;
  for (int i = 0; c && i < c->n; i++)
    if (c->e[i]->key_bytes == kb && !memcmp(c->e[i]->key, key, kb)) return &c->e[i]->plan;
  return NULL;
}

static stoke_err *cache_add(cudnn_engine *eng, const void *key, size_t kb, const cg_plan *p, const cg_plan **out) {
  if (!eng->plans && !(eng->plans = calloc(1, sizeof(struct cg_cache))))
    return STOKE_PERR(STOKE_E_OOM, "cudnn: out of host memory for the plan cache");
  struct cg_cache *c = eng->plans;
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 32;
    cg_entry **ne = realloc(c->e, sizeof *ne * (size_t)cap);
    if (!ne) return STOKE_PERR(STOKE_E_OOM, "cudnn: out of host memory for the plan cache");
    c->e = ne, c->cap = cap;
  }
  cg_entry *en = malloc(sizeof *en);
  void *k = malloc(kb);
  if (!en || !k) {
    free(en);
    free(k);
    return STOKE_PERR(STOKE_E_OOM, "cudnn: out of host memory for the plan cache");
  }
  memcpy(k, key, kb);
  *en = (cg_entry){k, kb, *p};
  c->e[c->n++] = en;
  *out = &en->plan;
  return NULL;
}

stoke_err *cg_plan_get(cudnn_engine *eng, cg_graph *g, const void *key, size_t key_bytes, const cg_choice *c,
                       const char *what, const cg_plan **out) {
  const cg_plan *hit = cache_find(eng, key, key_bytes);
  if (hit) {
    *out = hit;
    return NULL;
  }
  cudnnBackendDescriptor_t opg;
  CG_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &opg));
  cudnnStatus_t s =
      cudnnBackendSetAttribute(opg, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(opg, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &eng->handle);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(opg);
  if (s != CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(opg);
    /* a graph cuDNN cannot express is a fallback case, not a failure */
    stoke_err *e = stoke_cudnn_err(s, __FILE__, __LINE__, "cudnn operation graph", g->ctx);
    if (s / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000 || s == CUDNN_STATUS_BAD_PARAM) e->code = STOKE_E_UNSUPPORTED;
    return e;
  }
  cg_plan p;
  cudnnStatus_t ss = cudnnSetStream(eng->handle, (cudaStream_t)c->stream);
  if (ss != CUDNN_STATUS_SUCCESS) cudnnBackendDestroyDescriptor(opg); /* not left behind by the error */
  CG_CHECK(ss);
  stoke_err *e = choose_plan(eng, g, opg, c, &p);
  if (e && e->code == STOKE_E_UNSUPPORTED && c->no_tf32 && !c->allow_lossy) {
    /* f32 with no exact engine: an FFT/Winograd one rather than none */
    cg_choice lossy = *c;
    lossy.allow_lossy = 1;
    stoke_host->err_free(e);
    e = choose_plan(eng, g, opg, &lossy, &p);
    if (!e)
      stoke_host->log(STOKE_LOG_INFO, "cudnn", "%s: f32 with an FFT/Winograd engine (no other runs it); %s", what,
                      g->ctx);
  }
  cudnnBackendDestroyDescriptor(opg);
  if (e) return e;
  char t[48] = "";
  if (p.ms >= 0) snprintf(t, sizeof t, ", %.3f ms", (double)p.ms);
  stoke_host->log(STOKE_LOG_INFO, "cudnn", "%s: engine %lld%s of %d candidates (%d built)%s, workspace %.2f MiB; %s",
                  what, (long long)p.engine_id, p.runtime_compiled ? " (runtime-compiled)" : "", p.candidates,
                  p.built, t, (double)p.workspace / (1 << 20), g->ctx);
  e = cache_add(eng, key, key_bytes, &p, out);
  if (e) cudnnBackendDestroyDescriptor(p.plan);
  return e;
}

stoke_err *cg_execute(cudnn_engine *eng, const cg_plan *p, void *const *ptrs, void *workspace, void *stream,
                      const char *ctx) {
  cudnnBackendDescriptor_t vp;
  CUDNN_CHECK(cudnnSetStream(eng->handle, (cudaStream_t)stream), ctx);
  CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), ctx);
  cudnnStatus_t s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, p->n_uids,
                                             p->uids);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, p->n_uids,
                                 (void *)ptrs);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(eng->handle, p->plan, vp);
  cudnnBackendDestroyDescriptor(vp);
  if (s != CUDNN_STATUS_SUCCESS) return stoke_cudnn_err(s, __FILE__, __LINE__, "cudnnBackendExecute", ctx);
  return NULL;
}
