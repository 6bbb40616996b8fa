/* backends/cuda/cuda.c: the "cuda" backend: a GPU device (memory taken once
 * when the plan is made, pinned host memory, a compute and a copy stream),
 * its peak rates for MFU, and the registration of its kernels (.cu files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "graph_memset.h"
#include "stoke_cuda.h"

const stoke_host_v1 *stoke_host;

/* Dense peak FLOP/s by dtype from the datasheets (SXM parts). An unknown
 * GPU has zeros: its MFU shows "n/a", never a made-up number. */
typedef struct peak {
  const char *name_part;
  double f32, tf32, bf16, f16;
} peak;

static const peak peaks[] = {
    {"H100", 67e12, 495e12, 989e12, 989e12},
    {"H200", 67e12, 495e12, 989e12, 989e12},
    {"A100", 19.5e12, 156e12, 312e12, 312e12},
};

static stoke_err *cuda_open(int index, void *device_self, void **self) {
  int n = 0;
  cudaError_t ce = cudaGetDeviceCount(&n);
  if (ce != cudaSuccess || n == 0)
    return STOKE_PERR(STOKE_E_NOT_FOUND,
                      "no CUDA GPU is available (%s); use backends = cpu, or run on a machine with "
                      "an NVIDIA GPU and its driver",
                      ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
  if (index >= n)
    return STOKE_PERR(STOKE_E_INVALID, "[run] device_index = %d, but this machine has %d GPU%s", index, n,
                      n == 1 ? "" : "s");
  STOKE_CUDA(cudaSetDevice(index));
  stoke_cuda_device *d = stoke_host->alloc(sizeof *d);
  if (!d) return STOKE_PERR(STOKE_E_OOM, "cuda: out of host memory");
  memset(d, 0, sizeof *d);
  d->version = STOKE_CUDA_DEVICE_VERSION;
  d->index = index;
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, index);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&d->copy_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    stoke_host->free(d);
    return STOKE_PERR(STOKE_E_DEVICE, "cuda: opening device %d: %s", index, cudaGetErrorString(e));
  }
  snprintf(d->name, sizeof d->name, "%.127s", p.name);
  d->sm_count = p.multiProcessorCount;
  d->cc_major = p.major;
  d->cc_minor = p.minor;
  d->total_bytes = p.totalGlobalMem;
  stoke_host->log(STOKE_LOG_INFO, "cuda", "device %d: %s, %d SMs, compute capability %d.%d, %.1f GiB", index,
                  d->name, d->sm_count, d->cc_major, d->cc_minor, (double)d->total_bytes / (1 << 30));
  *self = d;
  return NULL;
}

static void cuda_close(void *self) {
  stoke_cuda_device *d = self;
  if (!d) return;
  cudaStreamSynchronize(d->stream);
  cudaStreamDestroy(d->stream);
  cudaStreamDestroy(d->copy_stream);
  stoke_host->free(d);
}

static stoke_err *cuda_info(void *self, stoke_device_info_v1 *out) {
  stoke_cuda_device *d = self;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", d->name);
  out->cc_major = d->cc_major;
  out->cc_minor = d->cc_minor;
  STOKE_CUDA(cudaMemGetInfo(&out->free_bytes, &out->total_bytes));
  for (size_t i = 0; i < sizeof peaks / sizeof *peaks; i++)
    if (strstr(d->name, peaks[i].name_part)) {
      out->peak_flops[STOKE_F32] = peaks[i].f32;
      out->peak_flops[STOKE_BF16] = peaks[i].bf16;
      out->peak_flops[STOKE_F16] = peaks[i].f16;
      out->peak_tf32 = peaks[i].tf32;
      break;
    }
  return NULL;
}

static stoke_err *cuda_alloc(void *self, size_t bytes, void **ptr) {
  cudaError_t e = cudaMalloc(ptr, bytes);
  if (e == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total);
    return STOKE_PERR(STOKE_E_OOM,
                      "out of GPU memory: %zu bytes asked, %zu of %zu free; lower [data] batch_size "
                      "(or use batch_size = auto)",
                      bytes, free_b, total);
  }
  STOKE_CUDA(e);
  return NULL;
}

static void cuda_free(void *self, void *p) { cudaFree(p); }

static stoke_err *cuda_alloc_host(void *self, size_t bytes, void **ptr) {
  STOKE_CUDA(cudaMallocHost(ptr, bytes));
  return NULL;
}

static void cuda_free_host(void *self, void *p) { cudaFreeHost(p); }

static cudaStream_t pick(stoke_cuda_device *d, void *stream) { return stream ? (cudaStream_t)stream : d->stream; }

static stoke_err *cuda_copy(void *self, void *dst, const void *src, size_t bytes, stoke_copy_kind kind,
                            void *stream) {
  stoke_cuda_device *d = self;
  enum cudaMemcpyKind k = kind == STOKE_COPY_H2D ? cudaMemcpyHostToDevice
                          : kind == STOKE_COPY_D2H ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyDeviceToDevice;
  STOKE_CUDA(cudaMemcpyAsync(dst, src, bytes, k, pick(d, stream)));
  /* a device-to-host copy is read by the host right after: wait for it */
  if (kind == STOKE_COPY_D2H) STOKE_CUDA(cudaStreamSynchronize(pick(d, stream)));
  return NULL;
}

static stoke_err *cuda_fill(void *self, void *dst, int byte, size_t bytes, void *stream) {
  STOKE_CUDA(cudaMemsetAsync(dst, byte, bytes, pick(self, stream)));
  return NULL;
}

static stoke_err *cuda_stream_create(void *self, void **stream) {
  cudaStream_t s;
  STOKE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return NULL;
}

static void cuda_stream_destroy(void *self, void *stream) { cudaStreamDestroy((cudaStream_t)stream); }

static stoke_err *cuda_stream_sync(void *self, void *stream) {
  STOKE_CUDA(cudaStreamSynchronize(pick(self, stream)));
  return NULL;
}

static void *cuda_default_stream(void *self) { return ((stoke_cuda_device *)self)->stream; }

static stoke_err *cuda_timer_create(void *self, void **t) {
  cudaEvent_t e;
  STOKE_CUDA(cudaEventCreate(&e));
  *t = e;
  return NULL;
}

static void cuda_timer_destroy(void *self, void *t) { cudaEventDestroy((cudaEvent_t)t); }

static stoke_err *cuda_timer_record(void *self, void *t, void *stream) {
  STOKE_CUDA(cudaEventRecord((cudaEvent_t)t, pick(self, stream)));
  return NULL;
}

static void *cuda_copy_stream(void *self) { return ((stoke_cuda_device *)self)->copy_stream; }

static stoke_err *cuda_stream_wait(void *self, void *stream, void *t) {
  STOKE_CUDA(cudaStreamWaitEvent(pick(self, stream), (cudaEvent_t)t, 0));
  return NULL;
}

static stoke_err *cuda_timer_sync(void *self, void *t) {
  STOKE_CUDA(cudaEventSynchronize((cudaEvent_t)t));
  return NULL;
}

static stoke_err *cuda_timer_elapsed(void *self, void *a, void *b, float *ms) {
  cudaError_t e = cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b);
  /* an event not recorded (yet) is an answer, not a fault: cleared, so the next launch's check does not take it
   * for its own */
  if (e != cudaSuccess) cudaGetLastError();
  STOKE_CUDA(e);
  return NULL;
}

/* Thread-local capture: the loader's threads may call CUDA meanwhile. */
static stoke_err *cuda_capture_begin(void *self, void *stream) {
  STOKE_CUDA(cudaStreamBeginCapture(pick(self, stream), cudaStreamCaptureModeThreadLocal));
  return NULL;
}

static stoke_err *cuda_capture_end(void *self, void *stream, void **graph, int64_t *ops) {
  cudaGraph_t g = NULL;
  cudaGraphExec_t ge = NULL;
  *graph = NULL;
  cudaError_t e = cudaStreamEndCapture(pick(self, stream), &g);
  if (e != cudaSuccess || !g) {
    cudaGetLastError();
    return STOKE_PERR(STOKE_E_DEVICE,
                      "cuda: capturing the step into a CUDA graph failed (%s): a kernel synchronized, "
                      "allocated or used another stream inside the step; set [run] cuda_graph = false",
                      cudaGetErrorString(e));
  }
  size_t n = 0;
  cudaGraphGetNodes(g, NULL, &n);
  *ops = (int64_t)n;
  /* small memsets become kernel nodes (graph_memset.cu: 7 us of waiting each
   * in a replay); STOKE_GRAPH_MEMSETS=keep leaves them, for an A/B run */
  const char *keep = getenv("STOKE_GRAPH_MEMSETS");
  if (!keep || strcmp(keep, "keep")) {
    int found = 0, done = 0;
    e = stoke_cuda_graph_memsets_to_kernels(g, STOKE_GRAPH_MEMSET_MAX_BYTES, &found, &done);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaGraphDestroy(g);
      return STOKE_PERR(STOKE_E_DEVICE,
                        "cuda: turning the step graph's memset nodes into kernel nodes: %s; "
                        "STOKE_GRAPH_MEMSETS=keep skips it, or set [run] cuda_graph = false",
                        cudaGetErrorString(e));
    }
    if (found)
      stoke_host->log(STOKE_LOG_INFO, "cuda", "step graph: %d of its %d memset nodes made kernel nodes (at most %zu bytes)",
                      done, found, (size_t)STOKE_GRAPH_MEMSET_MAX_BYTES);
  }
  e = cudaGraphInstantiateWithFlags(&ge, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return STOKE_PERR(STOKE_E_DEVICE, "cuda: instantiating the step's CUDA graph (%zu operations): %s", n,
                      cudaGetErrorString(e));
  }
  *graph = ge;
  return NULL;
}

static stoke_err *cuda_graph_launch(void *self, void *graph, void *stream) {
  STOKE_CUDA(cudaGraphLaunch((cudaGraphExec_t)graph, pick(self, stream)));
  return NULL;
}

static void cuda_graph_destroy(void *self, void *graph) {
  if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static const stoke_backend_v1 backend = {
    STOKE_ABI(stoke_backend_v1),
    .name = "cuda",
    .help = "NVIDIA GPU: device memory, streams, elementwise/norm/optimizer kernels",
    .device = STOKE_DEV_GPU,
    .device_engine = NULL,
    .open = cuda_open,
    .close = cuda_close,
    .info = cuda_info,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .default_stream = cuda_default_stream,
    .timer_create = cuda_timer_create,
    .timer_destroy = cuda_timer_destroy,
    .timer_record = cuda_timer_record,
    .timer_elapsed_ms = cuda_timer_elapsed,
    .copy_stream = cuda_copy_stream,
    .stream_wait = cuda_stream_wait,
    .timer_sync = cuda_timer_sync,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_backend(r->self, &backend));
  STOKE_PROPAGATE_P(stoke_cuda_register_elementwise(r));
  STOKE_PROPAGATE_P(stoke_cuda_register_norm(r));
  STOKE_PROPAGATE_P(stoke_cuda_register_optim(r));
  STOKE_PROPAGATE_P(stoke_cuda_register_amp(r));
  STOKE_PROPAGATE_P(stoke_cuda_register_cast(r));
  STOKE_PROPAGATE_P(stoke_cuda_register_seq(r));
  STOKE_PROPAGATE_P(stoke_cuda_register_layer_norm(r));
  STOKE_PROPAGATE_P(stoke_cuda_register_attention(r));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "cuda", "CUDA device backend and kernels", reg};
