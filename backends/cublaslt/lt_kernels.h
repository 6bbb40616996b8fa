/* backends/cublaslt/lt_kernels.h: the small CUDA kernels next to the
 * cuBLASLt products of the linear kernels (lt_kernels.cu), private to the
 * cublaslt plugin: bias broadcast, scaling, the bias gradient, the ReLU
 * (forward fallback and gradient mask) of linear_relu, and the activation
 * epilogues' fallbacks of linear_act / linear_dact. */
#ifndef STOKE_CUBLASLT_KERNELS_H
#define STOKE_CUBLASLT_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "stoke/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i, j] = b[j] for a row-major y[rows, cols]. */
cudaError_t stoke_lt_bias_rows(void *y, const void *b, int64_t rows, int64_t cols, stoke_dtype dt,
                               cudaStream_t s);

/* d[0..n) = beta * d (d is not read when beta is 0: it may hold NaN). */
cudaError_t stoke_lt_scale(void *d, int64_t n, float beta, stoke_dtype dt, cudaStream_t s);

/* db[j] = beta * db[j] + sum_i dy[i, j] for a row-major dy[rows, cols],
 * summed in f32 in a fixed order (bitwise reproducible for the same
 * shapes, alignment and workspace); db is not read when beta is 0. The
 * row partitions' partial sums go to ws: with fewer than
 * stoke_lt_colsum_workspace(rows, cols, dt) bytes there, one partition
 * runs (correct, slower). */
cudaError_t stoke_lt_colsum(void *db, const void *dy, int64_t rows, int64_t cols, float beta, stoke_dtype dt,
                            void *ws, size_t ws_bytes, cudaStream_t s);

/* The workspace stoke_lt_colsum uses at most for a dy[rows, cols] of dt. */
size_t stoke_lt_colsum_workspace(int64_t rows, int64_t cols, stoke_dtype dt);

/* y[0..n) = max(y, 0) in place (NaN stays NaN): linear_relu's forward
 * when no algorithm has the RELU_BIAS epilogue. */
cudaError_t stoke_lt_relu(void *y, int64_t n, stoke_dtype dt, cudaStream_t s);

/* dz[i] = y[i] > 0 ? dy[i] : 0 for i in [0, n): linear_relu's backward,
 * the ReLU's gradient from the forward output. */
cudaError_t stoke_lt_relu_mask(void *dz, const void *dy, const void *y, int64_t n, stoke_dtype dt,
                               cudaStream_t s);

/* linear_act's forward without its epilogue: y[rows, cols] holds z; write
 * the aux and make y = act(z) in place. gelu = 0: ReLU, the aux a bitmask
 * of aux_ld bits per row (bit j of row i: bit j % 8 of byte
 * i * aux_ld / 8 + j / 8, set iff z > 0; the padding bits 0), as cuBLASLt's
 * RELU_AUX_BIAS; gelu = 1: GELU (tanh approximation), the aux z itself
 * with aux_ld elements per row, as GELU_AUX_BIAS. */
cudaError_t stoke_lt_act_aux(void *y, void *aux, int64_t rows, int64_t cols, int64_t aux_ld, int gelu,
                             stoke_dtype dt, cudaStream_t s);

/* linear_dact without its epilogue: dz[rows, cols] *= act'(z) read from
 * the aux (layout as above), in place. */
cudaError_t stoke_lt_dact(void *dz, const void *aux, int64_t rows, int64_t cols, int64_t aux_ld, int gelu,
                          stoke_dtype dt, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
