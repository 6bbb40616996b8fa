/* backends/cpu/blas.c: OpenBLAS made safe to start under a memory limit.
 *
 * Debian's OpenBLAS (0.3.21) maps one GEMM buffer per calling thread the
 * first time that thread runs a GEMM (BUFFER_SIZE: 128 MiB of address
 * space) and keeps it for the life of the process; when the mapping fails,
 * blas_memory_alloc tries again forever at 100% CPU: under `ulimit -v
 * 200000` the quickstart never ended. Its threaded variant also starts a
 * thread pool when the plugin is loaded, every thread mapping a buffer of
 * its own, and at exit waits for threads still retrying (bench_loader hung
 * in gotoblas_quit). So the plugin links the serial variant (BUILD: one
 * buffer, the executor's thread being the only one that runs GEMMs; this
 * backend's GEMMs are small, and one thread was as fast as two on the
 * quickstart (20% faster) and on the Fashion-MNIST CNN (3% slower)), and
 * before the plan takes any memory this file checks that the buffer can be
 * mapped, then has OpenBLAS map it with one GEMM large enough to need it.
 * Every later GEMM reuses that buffer. */
#include "blas.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

extern const stoke_host_v1 *stoke_host;

/* OpenBLAS's BUFFER_SIZE on x86-64 (alloc_mmap maps 0x8000000 bytes, its
 * malloc fallback asks a page more), and a little room. */
#define BUFFER_BYTES (((size_t)128 << 20) + ((size_t)64 << 10))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int ready;

/* The address-space limit and what is mapped now, as text. */
static void limits(char *out, size_t cap) {
  struct rlimit r;
  long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld", &pages) != 1) pages = 0;
    fclose(f);
  }
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    snprintf(out, cap, "the address-space limit (ulimit -v) is %llu KiB and %ld KiB are mapped already",
             (unsigned long long)r.rlim_cur / 1024, pages * 4);
  else
    snprintf(out, cap, "there is no address-space limit (ulimit -v): the system is out of memory");
}

stoke_err *cpu_blas_ready(void) {
  pthread_mutex_lock(&mu);
  stoke_err *e = NULL;
  if (!ready) {
    void *p = mmap(NULL, BUFFER_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      char lim[256];
      limits(lim, sizeof lim);
      e = STOKE_PERR(STOKE_E_OOM,
                     "cpu backend: OpenBLAS needs %zu MiB of address space for its GEMM buffer and cannot map it "
                     "(%s): %s; raise the limit by at least that much (OpenBLAS would otherwise retry forever)",
                     BUFFER_BYTES >> 20, strerror(err), lim);
    } else {
      munmap(p, BUFFER_BYTES);
      /* big enough for OpenBLAS's blocked path (small GEMMs skip the buffer) */
      enum { N = 256 };
      float *a = calloc((size_t)3 * N * N, sizeof *a);
      if (!a) {
        e = STOKE_PERR(STOKE_E_OOM, "cpu backend: out of memory");
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, a + N * N, N, 0.0f,
                    a + 2 * N * N, N);
        free(a);
        ready = 1;
      }
    }
  }
  pthread_mutex_unlock(&mu);
  return e;
}
