/* backends/cudnn/graph.h: cuDNN's graph ("backend") API in plain C for the
 * cudnn plugin: operation graphs built from tensors and operations, engine
 * configurations from cuDNN's heuristics, an execution plan chosen among
 * them (timed like cudnn.benchmark, or the first that builds), cached per
 * problem in the engine, and executed with a variant pack.
 *
 * A graph file (conv_graph.c, conv_bn.c) describes its problem with the
 * cg_* builders below, gives it a cache key, and calls cg_plan_get: the
 * plan of an identical problem is built once per engine and shared by the
 * nodes that have it (cuDNN plans are reusable with other pointers). */
#ifndef STOKE_CUDNN_GRAPH_H
#define STOKE_CUDNN_GRAPH_H

#include "stoke_cudnn.h"

#define CG_MAX_TENSORS 24
#define CG_MAX_OPS 16
#define CG_MAX_OTHER 16

/* A graph under construction: every descriptor made for it, destroyed
 * together by cg_graph_free (the plan keeps what it needs). */
typedef struct cg_graph {
  cudnnBackendDescriptor_t tensors[CG_MAX_TENSORS];
  int64_t uids[CG_MAX_TENSORS];
  int is_virtual[CG_MAX_TENSORS];
  size_t bytes[CG_MAX_TENSORS]; /* of the memory a real tensor spans */
  cudnnDataType_t dt[CG_MAX_TENSORS];
  int n_tensors;
  cudnnBackendDescriptor_t ops[CG_MAX_OPS];
  int n_ops;
  cudnnBackendDescriptor_t other[CG_MAX_OTHER]; /* convolution and pointwise descriptors */
  int n_other;
  const char *ctx; /* node and shapes, for every message */
} cg_graph;

void cg_graph_init(cg_graph *g, const char *ctx);
/* cuDNN's float, bf16 and half as stoke's dtype; any other STOKE_U8 (an
 * autotune's operands are then filled with a constant, tune_fill.h). */
stoke_dtype cg_stoke_dtype(cudnnDataType_t dt);
void cg_graph_free(cg_graph *g);

/* A tensor: `nd` dims and strides (elements), its unique id in the graph;
 * virtual tensors are intermediates that never reach memory. Returns the
 * descriptor in *out (owned by the graph). */
stoke_err *cg_tensor(cg_graph *g, int64_t uid, cudnnDataType_t dt, int nd, const int64_t *dims,
                     const int64_t *strides, int is_virtual, cudnnBackendDescriptor_t *out);
/* 4-D (N, C, H, W) tensor in NHWC or NCHW memory order. */
stoke_err *cg_tensor4(cg_graph *g, int64_t uid, cudnnDataType_t dt, const int64_t d[4], int nhwc, int is_virtual,
                      cudnnBackendDescriptor_t *out);
/* A per-channel vector [1, C, 1, 1] (scale, bias, mean, statistics). */
stoke_err *cg_channel(cg_graph *g, int64_t uid, cudnnDataType_t dt, int64_t c, cudnnBackendDescriptor_t *out);

typedef enum cg_conv_kind { CG_FPROP = 0, CG_DGRAD, CG_WGRAD } cg_conv_kind;

/* A 2-D cross-correlation (cuDNN's convolution) with float accumulation;
 * for CG_FPROP (x, w) -> y, CG_DGRAD (dy = y, w) -> dx = x, CG_WGRAD
 * (x, dy = y) -> dw = w; beta 1 accumulates into the output. */
stoke_err *cg_conv(cg_graph *g, cg_conv_kind kind, const int64_t pad[2], const int64_t stride[2],
                   const int64_t dil[2], cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                   cudnnBackendDescriptor_t y, float beta);
/* A pointwise operation y = mode(x[, b]) in float; for CUDNN_POINTWISE_RELU_BWD
 * x is the gradient and b the forward input (dx = x * (b > 0)). */
stoke_err *cg_pointwise(cg_graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                        cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y);
/* Per-channel sum and sum of squares of x over N, H, W (float). */
stoke_err *cg_genstats(cg_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t sum,
                       cudnnBackendDescriptor_t sqsum);
/* Batch-norm backward reductions (cuDNN's "dbn weight"): from the input x
 * of a batch norm with (mean, invstd, scale) and the gradient dy of its
 * output: dscale, dbias and the coefficients of dx = eq_dy * dy + eq_x * x
 * + eq_bias. */
stoke_err *cg_bn_bwd_weights(cg_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t mean,
                             cudnnBackendDescriptor_t invstd, cudnnBackendDescriptor_t scale,
                             cudnnBackendDescriptor_t dy, cudnnBackendDescriptor_t dscale,
                             cudnnBackendDescriptor_t dbias, cudnnBackendDescriptor_t eq_dy,
                             cudnnBackendDescriptor_t eq_x, cudnnBackendDescriptor_t eq_bias);

/* A built plan: what execution needs. Owned by the engine's plan cache. */
typedef struct cg_plan {
  cudnnBackendDescriptor_t plan;
  int64_t workspace;
  int n_uids;
  int64_t uids[CG_MAX_TENSORS]; /* the real (non-virtual) tensors, in graph order */
  int64_t engine_id;            /* cuDNN's global engine index, for the log */
  int runtime_compiled;         /* the engine compiled its kernel (NVRTC) at build */
  float ms;                     /* measured time (autotune) or -1 */
  int candidates, built;        /* heuristic configurations, and those that built */
} cg_plan;

/* How a plan is chosen. */
typedef struct cg_choice {
  int autotune;      /* time the candidates that build, keep the fastest */
  int deterministic; /* skip engines with the NONDETERMINISTIC note */
  int no_tf32;       /* f32 data: skip tensor-core engines (they would use TF32) and FFT/Winograd ones */
  int allow_lossy;   /* with no_tf32: FFT/Winograd engines allowed (set when nothing else runs) */
  int max_candidates;/* autotune: time at most this many (0: 12) */
  void *stream;      /* where the timing runs */
} cg_choice;

/* The plan for graph `g` under `key` (any bytes identifying the problem and
 * the choice; compared with memcmp): from the engine's cache, else built
 * and cached. NULL with an STOKE_E_UNSUPPORTED error when no engine
 * supports the graph (callers fall back). `what` names the graph kind in
 * the log ("conv fprop"). */
stoke_err *cg_plan_get(cudnn_engine *eng, cg_graph *g, const void *key, size_t key_bytes, const cg_choice *c,
                       const char *what, const cg_plan **out);

/* 1 when engine configuration `cfg` (from cuDNN's heuristics) carries the
 * NONDETERMINISTIC numerical note, 0 when not, -1 when it cannot be read. */
int cg_cfg_nondeterministic(cudnnBackendDescriptor_t cfg);

/* Autotune's timing: the median of 3 timed calls of run(ctx) (0: it ran)
 * on stream s after one warm-up, in ms; -1 when a call or the events
 * failed. Waits for the stream and clears CUDA's error state after. */
float cg_time3(int (*run)(void *ctx), void *ctx, cudaStream_t s);

/* Execute a plan with the data pointers of its real tensors (in the order
 * of plan->uids) and `workspace` (at least plan->workspace bytes) on
 * `stream`. */
stoke_err *cg_execute(cudnn_engine *eng, const cg_plan *p, void *const *ptrs, void *workspace, void *stream,
                      const char *ctx);

/* A 2-D convolution problem: logical (N, C, H, W) shapes of x, weight
 * [K, C/groups, R, S] and y, and the weight's memory order (OIHW as
 * stoke keeps it, or OHWI staged for engines that need it). */
typedef struct cg_conv_geom {
  int64_t x[4], w[4], y[4], stride[2], pad[2], dil[2];
  int32_t nhwc, w_krsc;
  int32_t dt;       /* cudnnDataType_t of x, w, y */
  int32_t reserved; /* 0: no padding bytes, so the struct can be a cache key */
} cg_conv_geom;

/* x, w, y of a geometry as graph tensors with the given uids. */
stoke_err *cg_conv_tensors(cg_graph *g, const cg_conv_geom *cg, int64_t ux, int64_t uw, int64_t uy,
                           cudnnBackendDescriptor_t *x, cudnnBackendDescriptor_t *w, cudnnBackendDescriptor_t *y);

/* The engine's plan cache (cudnn.c's close frees it). */
void cg_cache_free(cudnn_engine *eng);

#endif
