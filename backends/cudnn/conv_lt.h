/* backends/cudnn/conv_lt.h: a 1x1 convolution (stride 1, no padding,
 * groups 1) over NHWC activations as a cuBLASLt product, beside cuDNN's
 * plans for the same pass (conv_graph.c times both and keeps the faster).
 *
 * In NHWC such a convolution is a product over M = N H W rows: x [M, C]
 * and y [M, K] row-major, the OIHW weight [K, C, 1, 1] is [K, C]
 * row-major, so fprop is y = x W^T, dgrad dx = dy W and wgrad dW = dy^T x:
 * the three products of a linear (backends/cublaslt/cublaslt.c's header
 * derives their column-major form). On an H200 cuBLASLt's best algorithm
 * ran ResNet-50's layer1 and layer2 1x1 shapes 7-15% faster than cuDNN's
 * best engine, the others within 3% (BENCHMARKS.md run 29). */
#ifndef STOKE_CUDNN_CONV_LT_H
#define STOKE_CUDNN_CONV_LT_H

#include <cublasLt.h>

#include "graph.h"

/* One pass's product, made in plan(), run with any pointers. */
typedef struct clt_prod {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c; /* c serves as C and D */
  cublasLtMatmulAlgo_t algo;
  size_t ws; /* workspace the algorithm needs */
  float ms;  /* its timed median (cg_time3) */
  int cached; /* the choice came from the engine's record (timed for an earlier node) */
} clt_prod;

/* Whether a convolution problem can run as a product: NHWC, 16-bit data
 * (f32 stays on cuDNN, whose TF32 rules the plans already follow), a 1x1
 * filter, stride 1, no padding, groups 1. */
int clt_eligible(const cg_conv_geom *g, int64_t groups);

/* The fastest of cuBLASLt's heuristic candidates (reproducible ones only
 * when `deterministic`) for pass `kind` of the problem, timed on
 * temporaries on `stream` like cuDNN's plans (cg_time3); the choice is
 * cached in the engine per problem. *out NULL (no error) when no candidate
 * ran or the device has no room for the temporaries: the caller keeps
 * cuDNN's plan. Free with clt_free. */
stoke_err *clt_plan(cudnn_engine *eng, cg_conv_kind kind, const cg_conv_geom *g, int deterministic, void *stream,
                    const char *ctx, clt_prod **out);

/* D = A B (+ beta D) with the pass's operands: fprop (x, w, y), dgrad
 * (dy, w, dx), wgrad (x, dy, dw); `ws` holds p->ws bytes. */
stoke_err *clt_run(cudnn_engine *eng, const clt_prod *p, cg_conv_kind kind, const void *in0, const void *in1,
                   void *out, float beta, void *ws, void *stream, const char *ctx);

void clt_free(clt_prod *p);

/* The cuBLASLt handle of an engine (made at its first use) and its
 * release (cudnn.c's close). */
void clt_engine_close(cudnn_engine *eng);

#endif
