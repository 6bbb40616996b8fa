/* backends/cublaslt/lt_algo_desc.h: one line that names a cuBLASLt
 * algorithm's configuration, "algo 66 tile 20 stages 35 cluster 0 split-K 1"
 * (cublasLt.h's enums; the reduction scheme when split), for the engine's
 * log (cublaslt.c) and tests/gpu/lt_gemm_bench; and whether an algorithm
 * is reproducible (cublaslt.c, and the cudnn engine's 1x1 convolutions as
 * products, backends/cudnn/conv_lt.c). */
#ifndef STOKE_LT_ALGO_DESC_H
#define STOKE_LT_ALGO_DESC_H

#include <stdio.h>
#include <string.h>

#include <cublasLt.h>

static inline void stoke_lt_algo_desc(const cublasLtMatmulAlgo_t *algo, char *buf, size_t size) {
  int32_t id = -1, splitk = 1;
  uint32_t tile = 0, stages = 0, red = 0;
  uint16_t cluster = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
  cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
  cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
  cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
  snprintf(buf, size, "algo %d tile %u stages %u cluster %u split-K %d", id, tile, stages, (unsigned)cluster, splitk);
  if (splitk > 1) snprintf(buf + strlen(buf), size - strlen(buf), " (reduction %u)", red);
}

/* Whether an algorithm sums each output in one fixed order (under
 * STOKE_KFLAG_DETERMINISTIC the engines ask the heuristic for algorithms
 * without split-K reductions, REDUCTION_SCHEME_MASK = NONE, and check each
 * candidate's configuration again here). Reproducible: no split
 * (SPLITK_NUM 1), or a fixed split whose partial sums are reduced in a
 * separate pass (COMPUTE_TYPE / OUTPUT_TYPE). Refused: a split added into
 * the output in place (INPLACE), and SPLITK_NUM -1, which the H100's
 * heuristic reports for some algorithms (with workspace for partial sums)
 * and whose summation order cublasLt.h does not document. */
static inline int stoke_lt_algo_reproducible(const cublasLtMatmulAlgo_t *algo) {
  int32_t splitk = 1;
  uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t w = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w) !=
          CUBLAS_STATUS_SUCCESS)
    return 0;
  return splitk == 1 ||
         (splitk > 1 && (red == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE || red == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));
}

#endif
