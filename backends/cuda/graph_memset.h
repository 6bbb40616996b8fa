/* backends/cuda/graph_memset.h: a captured step graph's small memset nodes
 * turned into kernel nodes before it is instantiated (graph_memset.cu says
 * why). Plain C, no stoke host: the cuda backend and tests/gpu call it. */
#ifndef STOKE_CUDA_GRAPH_MEMSET_H
#define STOKE_CUDA_GRAPH_MEMSET_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Memsets of at most this many bytes are rewritten; a larger one is bound
 * by its bytes, not by the latency around it, and stays a memset node. */
#define STOKE_GRAPH_MEMSET_MAX_BYTES ((size_t)64 << 10)

/* Replace every memset node of `g` that writes at most `max_bytes` by a
 * kernel node writing the same bytes, with the same dependencies and
 * dependents. *rewritten: how many were replaced (of *memsets found). On an
 * error the graph may hold some rewritten nodes (each one whole: its
 * kernel node has every edge the memset had, or the memset is kept). */
cudaError_t stoke_cuda_graph_memsets_to_kernels(cudaGraph_t g, size_t max_bytes, int *memsets, int *rewritten);

#ifdef __cplusplus
}
#endif
#endif
