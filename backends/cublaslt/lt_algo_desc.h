/* backends/cublaslt/lt_algo_desc.h: one line that names a cuBLASLt
 * algorithm's configuration, "algo 66 tile 20 stages 35 cluster 0 split-K 1"
 * (cublasLt.h's enums; the reduction scheme when split), for the engine's
 * log (cublaslt.c) and tests/gpu/lt_gemm_bench. */
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

#endif
