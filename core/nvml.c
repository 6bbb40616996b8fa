/* core/nvml.c: NVML through dlopen("libnvidia-ml.so.1"): the few calls
 * stoke needs, declared here with NVML's documented C signatures, because
 * the toolkit here ships no nvml.h and the driver library only exists on
 * GPU machines. */
#include <dlfcn.h>
#include <stdlib.h>

#include "stoke/nvml.h"

typedef struct { unsigned int gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;

struct stoke_nvml {
  void *lib;
  void *dev;
  int (*util)(void *dev, nvml_util *u);
  int (*mem)(void *dev, nvml_mem *m);
  int (*shutdown)(void);
};

stoke_nvml *stoke_nvml_open(int device_index) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return NULL;
  int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
  int (*by_index)(unsigned int, void **) = (int (*)(unsigned int, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  stoke_nvml *n = calloc(1, sizeof *n);
  if (n) {
    n->util = (int (*)(void *, nvml_util *))dlsym(lib, "nvmlDeviceGetUtilizationRates");
    n->mem = (int (*)(void *, nvml_mem *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    n->shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown");
  }
  if (!n || !init || !by_index || !n->util || !n->mem || init() != 0 ||
      by_index((unsigned)device_index, &n->dev) != 0) {
    free(n);
    dlclose(lib);
    return NULL;
  }
  n->lib = lib;
  return n;
}

void stoke_nvml_close(stoke_nvml *n) {
  if (!n) return;
  if (n->shutdown) n->shutdown();
  dlclose(n->lib);
  free(n);
}

int stoke_nvml_sample(stoke_nvml *n, double *util_pct, double *mem_used_mib) {
  nvml_util u;
  nvml_mem m;
  if (!n || n->util(n->dev, &u) != 0 || n->mem(n->dev, &m) != 0) return -1;
  *util_pct = u.gpu;
  *mem_used_mib = (double)m.used / 1048576.0;
  return 0;
}
