/* tools/kernel_trace.c: a CUPTI injection library that writes every kernel,
 * copy and memset the GPU ran, with its start and end on the device clock,
 * to a CSV file, for any process: stoke's train (CUDA graphs and the second
 * stream included) or PyTorch's anchor, in their real configurations. Nsight
 * Compute serializes kernels, locks clocks and slows the launches that
 * cuDNN's and PyTorch's autotuning time, so their choices under it differ
 * from a normal run's (BENCHMARKS.md run 32); CUPTI's activity records cost
 * well under a microsecond a kernel and change nothing the step does.
 * Nsight Systems is the usual tool for this and is not installed on the GPU
 * machine; NVIDIA's CUPTI is, as part of the toolkit.
 *
 * Use (any CUDA program; the driver loads it at cuInit):
 *   CUDA_INJECTION64_PATH=/path/libkernel_trace.so KTRACE_OUT=trace.csv prog ...
 * Rows: kind (K kernel, C copy, S memset), start ns, end ns, stream,
 * graph id, grid x y z, block x y z, name (mangled; C++ names as the
 * compiler wrote them). tools/kernel_trace.py reads it: the step's wall
 * time, the time no kernel ran, and the kernels by family.
 *
 * Library code: nothing here exits; a failure is one line on stderr and the
 * program runs on untraced. */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)

static FILE *out;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void warn_cupti(const char *what, CUptiResult r) {
  const char *s = NULL;
  cuptiGetResultString(r, &s);
  fprintf(stderr, "kernel_trace: %s failed: %s (the program runs untraced)\n", what, s ? s : "?");
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, BUF_BYTES);
  *size = *buffer ? BUF_BYTES : 0;
  *max_records = 0;
}

/* Commas in a C++ name would split the CSV row: the name is the last field
 * and the reader takes the rest of the line. */
static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *rec = NULL;
  pthread_mutex_lock(&out_lock);
  while (out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
      fprintf(out, "K,%llu,%llu,%u,%u,%d,%d,%d,%d,%d,%d,%s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->streamId, k->graphId, k->gridX, k->gridY, k->gridZ, k->blockX,
              k->blockY, k->blockZ, k->name ? k->name : "?");
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
      fprintf(out, "C,%llu,%llu,%u,%u,0,0,0,0,0,0,memcpy %llu bytes kind %u\n", (unsigned long long)m->start,
              (unsigned long long)m->end, m->streamId, m->graphId, (unsigned long long)m->bytes,
              (unsigned)m->copyKind);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
      fprintf(out, "S,%llu,%llu,%u,%u,0,0,0,0,0,0,memset %llu bytes\n", (unsigned long long)m->start,
              (unsigned long long)m->end, m->streamId, m->graphId, (unsigned long long)m->bytes);
    }
  }
  pthread_mutex_unlock(&out_lock);
  free(buffer);
}

static void flush_at_exit(void) {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  pthread_mutex_lock(&out_lock);
  if (out) fclose(out);
  out = NULL;
  pthread_mutex_unlock(&out_lock);
}

/* Called by the CUDA driver at cuInit when CUDA_INJECTION64_PATH names this
 * library. */
__attribute__((visibility("default"))) int InitializeInjection(void) {
  const char *path = getenv("KTRACE_OUT");
  if (!path || !*path) path = "kernel_trace.csv";
  out = fopen(path, "w");
  if (!out) {
    fprintf(stderr, "kernel_trace: cannot write %s (set KTRACE_OUT to a writable path); the program runs untraced\n",
            path);
    return 1;
  }
  fprintf(out, "kind,start_ns,end_ns,stream,graph,gx,gy,gz,bx,by,bz,name\n");
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    warn_cupti("cuptiActivityRegisterCallbacks", r);
    return 1;
  }
  static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                             CUPTI_ACTIVITY_KIND_MEMSET};
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    if ((r = cuptiActivityEnable(kinds[i])) != CUPTI_SUCCESS) warn_cupti("cuptiActivityEnable", r);
  atexit(flush_at_exit);
  return 1;
}
