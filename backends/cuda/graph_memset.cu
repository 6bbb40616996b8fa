// backends/cuda/graph_memset.cu: a captured step graph's small memset nodes
// turned into kernel nodes that write the same bytes.
//
// Why: cuDNN's implicit-GEMM engines zero a 4-byte counter in their
// workspace (cudaMemsetAsync) before each convolution, and a capture keeps
// it as a memset node. In a replayed graph a memset node costs far more than
// its 1.3 us: the GPU waits about 3.5 us after the kernel before it and
// about 3.4 us after it before the convolution starts (BENCHMARKS.md run 33:
// ResNet-18c's step holds 26 of them, 11 in the forward's chain, 15 ahead
// of data-gradient convolutions), where one kernel node follows
// another within 0.1-0.3 us. A kernel node doing the memset's work keeps the
// graph's order and meaning: it has the memset's dependencies and its
// dependents, and writes the same elements with the same value.
//
// Larger memsets (past STOKE_GRAPH_MEMSET_MAX_BYTES) stay: their bytes, not
// the latency around them, set their time.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/graph_memset.h"

namespace {

// One element per thread step: esize 1, 2 or 4 bytes, rows of `width`
// elements `pitch` bytes apart (height 1: one row, pitch unused).
__global__ void k_graph_memset(char *dst, size_t pitch, unsigned value, unsigned esize, size_t width,
                               size_t height) {
  size_t n = width * height;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t r = height > 1 ? i / width : 0, c = height > 1 ? i % width : i;
    char *p = dst + r * pitch + c * esize;
    if (esize == 4) *(uint32_t *)p = value;
    else if (esize == 2) *(uint16_t *)p = (uint16_t)value;
    else *(uint8_t *)p = (uint8_t)value;
  }
}

constexpr unsigned kThreads = 256;

// The kernel node in the memset's place: its dependencies, then edges to
// its dependents, then the memset removed. A failure part way removes the
// kernel node with its edges, so the memset stays whole.
cudaError_t add_kernel(cudaGraph_t g, cudaGraphNode_t node, const cudaMemsetParams *m, size_t n,
                       const cudaGraphNode_t *deps, size_t nd, const cudaGraphNode_t *outs, size_t no, int *done) {
  char *dst = (char *)m->dst;
  size_t pitch = m->pitch, width = m->width, height = m->height ? m->height : 1;
  unsigned value = m->value, esize = m->elementSize;
  void *args[] = {&dst, &pitch, &value, &esize, &width, &height};
  size_t blocks = (n + kThreads - 1) / kThreads;
  cudaKernelNodeParams p = {};
  p.func = (void *)k_graph_memset;
  p.gridDim = dim3((unsigned)(blocks < 1024 ? blocks : 1024));
  p.blockDim = dim3(kThreads);
  p.kernelParams = args;
  cudaGraphNode_t k = NULL;
  cudaError_t e = cudaGraphAddKernelNode(&k, g, nd ? deps : NULL, nd, &p);
  if (e != cudaSuccess) return e;
  for (size_t i = 0; i < no && e == cudaSuccess; i++) e = cudaGraphAddDependencies(g, &k, &outs[i], NULL, 1);
  if (e != cudaSuccess) {
    cudaGraphDestroyNode(k);
    return e;
  }
  e = cudaGraphDestroyNode(node);
  if (e == cudaSuccess) *done = 1;
  return e;
}

// Replace one memset node; returns cudaSuccess with *done 0 when it is left
// as it was (too large, or an edge that carries data).
cudaError_t rewrite_one(cudaGraph_t g, cudaGraphNode_t node, size_t max_bytes, int *done) {
  *done = 0;
  cudaMemsetParams m;
  cudaError_t e = cudaGraphMemsetNodeGetParams(node, &m);
  if (e != cudaSuccess) return e;
  if (m.elementSize != 1 && m.elementSize != 2 && m.elementSize != 4) return cudaSuccess;
  size_t n = m.width * (m.height ? m.height : 1);
  if (n == 0 || n * m.elementSize > max_bytes) return cudaSuccess;

  size_t nd = 0, no = 0;
  if ((e = cudaGraphNodeGetDependencies(node, NULL, NULL, &nd)) != cudaSuccess) return e;
  if ((e = cudaGraphNodeGetDependentNodes(node, NULL, NULL, &no)) != cudaSuccess) return e;
  cudaGraphNode_t *deps = (cudaGraphNode_t *)calloc(nd + no + 1, sizeof *deps);
  cudaGraphEdgeData *ed = (cudaGraphEdgeData *)calloc(nd + no + 1, sizeof *ed);
  if (!deps || !ed) e = cudaErrorMemoryAllocation;
  /* queried only when there are edges: a root or a leaf passes no arrays */
  if (e == cudaSuccess && nd) e = cudaGraphNodeGetDependencies(node, deps, ed, &nd);
  if (e == cudaSuccess && no) e = cudaGraphNodeGetDependentNodes(node, deps + nd, ed + nd, &no);
  if (e == cudaSuccess) {
    /* only plain edges; one with data (a programmatic launch's, a port) keeps the memset */
    static const cudaGraphEdgeData plain = {};
    int all_plain = 1;
    for (size_t i = 0; i < nd + no; i++) all_plain &= !memcmp(&ed[i], &plain, sizeof plain);
    if (all_plain) e = add_kernel(g, node, &m, n, deps, nd, deps + nd, no, done);
  }
  free(deps);
  free(ed);
  return e;
}

}  // namespace

extern "C" cudaError_t stoke_cuda_graph_memsets_to_kernels(cudaGraph_t g, size_t max_bytes, int *memsets,
                                                           int *rewritten) {
  *memsets = *rewritten = 0;
  size_t n = 0;
  cudaError_t e = cudaGraphGetNodes(g, NULL, &n);
  if (e != cudaSuccess || n == 0) return e;
  cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n * sizeof *nodes);
  if (!nodes) return cudaErrorMemoryAllocation;
  e = cudaGraphGetNodes(g, nodes, &n);
  for (size_t i = 0; i < n && e == cudaSuccess; i++) {
    cudaGraphNodeType t;
    if ((e = cudaGraphNodeGetType(nodes[i], &t)) != cudaSuccess || t != cudaGraphNodeTypeMemset) continue;
    ++*memsets;
    int done = 0;
    e = rewrite_one(g, nodes[i], max_bytes, &done);
    *rewritten += done;
  }
  free(nodes);
  return e;
}
