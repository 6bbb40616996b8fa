/* core/nvml.c: NVML through dlopen("libnvidia-ml.so.1"): the few calls
 * stoke needs, declared here with NVML's documented C signatures, because
 * the toolkit here ships no nvml.h and the driver library only exists on
 * GPU machines. */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>

#include "stoke/nvml.h"

typedef struct { unsigned int gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;
typedef struct { unsigned long long reference_us, violation_ns; } nvml_violation; /* nvmlViolationTime_t */
enum { NVML_CLOCK_SM = 1, NVML_PERF_POLICY_POWER = 0 };

struct stoke_nvml {
  void *lib;
  void *dev;
  int (*util)(void *dev, nvml_util *u);
  int (*mem)(void *dev, nvml_mem *m);
  int (*shutdown)(void);
  /* the power counters (Volta and later; NULL where the driver lacks them) */
  int (*energy)(void *dev, unsigned long long *mj);
  int (*violation)(void *dev, int policy, nvml_violation *v);
  int (*clock)(void *dev, int type, unsigned int *mhz);
  int (*limit)(void *dev, unsigned int *mw);
  int (*max_clock)(void *dev, int type, unsigned int *mhz);
  /* the counters at the last stoke_nvml_power call */
  int have_last;
  double last_s, last_mj, last_violation_ns;
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
    n->energy = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    n->violation = (int (*)(void *, int, nvml_violation *))dlsym(lib, "nvmlDeviceGetViolationStatus");
    n->clock = (int (*)(void *, int, unsigned int *))dlsym(lib, "nvmlDeviceGetClockInfo");
    n->limit = (int (*)(void *, unsigned int *))dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
    n->max_clock = (int (*)(void *, int, unsigned int *))dlsym(lib, "nvmlDeviceGetMaxClockInfo");
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

void stoke_power_interval(double dt_s, double d_mj, double d_violation_ns, double *power_w, double *capped) {
  int ok = dt_s > 0 && isfinite(dt_s);
  *power_w = ok && d_mj >= 0 ? 1e-3 * d_mj / dt_s : NAN;
  double f = ok && d_violation_ns >= 0 ? 1e-9 * d_violation_ns / dt_s : NAN;
  *capped = f > 1 ? 1 : f; /* the two clocks are not the same: a share a hair over 1 is all of it */
}

int stoke_nvml_power(stoke_nvml *n, double now_s, stoke_power_sample *p) {
  p->power_w = p->capped = p->sm_mhz = NAN;
  if (!n) return -1;
  unsigned long long mj = 0;
  nvml_violation v = {0, 0};
  unsigned int mhz = 0;
  int have_e = n->energy && n->energy(n->dev, &mj) == 0;
  int have_v = n->violation && n->violation(n->dev, NVML_PERF_POLICY_POWER, &v) == 0;
  if (n->clock && n->clock(n->dev, NVML_CLOCK_SM, &mhz) == 0) p->sm_mhz = mhz;
  if (n->have_last)
    stoke_power_interval(now_s - n->last_s, have_e && n->last_mj >= 0 ? (double)mj - n->last_mj : -1,
                         have_v && n->last_violation_ns >= 0 ? (double)v.violation_ns - n->last_violation_ns : -1,
                         &p->power_w, &p->capped);
  n->have_last = 1;
  n->last_s = now_s;
  n->last_mj = have_e ? (double)mj : -1;
  n->last_violation_ns = have_v ? (double)v.violation_ns : -1;
  return 0;
}

void stoke_nvml_power_limits(stoke_nvml *n, double *limit_w, double *max_sm_mhz) {
  unsigned int mw = 0, mhz = 0;
  *limit_w = n && n->limit && n->limit(n->dev, &mw) == 0 ? 1e-3 * mw : NAN;
  *max_sm_mhz = n && n->max_clock && n->max_clock(n->dev, NVML_CLOCK_SM, &mhz) == 0 ? (double)mhz : NAN;
}
