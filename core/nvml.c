/* core/nvml.c: NVML through dlopen("libnvidia-ml.so.1"): the few calls
 * stoke needs, declared here with NVML's documented C signatures, because
 * the toolkit here ships no nvml.h and the driver library only exists on
 * GPU machines. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke/nvml.h"
#include "stoke/visible.h"

typedef struct { unsigned int gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;
typedef struct { unsigned long long reference_us, violation_ns; } nvml_violation; /* nvmlViolationTime_t */
enum { NVML_CLOCK_SM = 1, NVML_PERF_POLICY_POWER = 0 };
#define STOKE_POWER_TICK_S 0.2

/* One reading of the counters: when (monotonic s), energy (mJ) and power-violation time (ns); -1: not counted. */
typedef struct {
  double at, mj, violation_ns;
} reading;

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
  /* The power sampler: a thread reading the counters every STOKE_POWER_TICK_S. On an H200 an energy and
   * violation read took milliseconds of the driver's time (run 31: 5-6 ms), a gap the step loop would
   * leave the GPU idle at a log step; the thread keeps them off it. Under mu: */
  pthread_t sampler;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started, stop;
  reading last, now;      /* the reading the last figure ended at (`last.at` < 0: none yet), the latest */
  double clock_sum;       /* the SM clock's samples since `last` */
  int64_t n_clock;
  double clock_latest;
};

int stoke_nvml_visible(const char *visible, int cuda_index, char *uuid, size_t len) {
  if (cuda_index < 0) return -1;
  if (!visible) return cuda_index;
  for (int i = 0;; i++) {
    const char *end = visible + strcspn(visible, ","), *p = visible;
    size_t n = (size_t)(end - p);
    stoke_visible_kind kind = stoke_visible_entry(&p, &n);
    /* CUDA stops at an invalid entry; a MIG slice's power is not its own */
    if (kind != STOKE_VISIBLE_INDEX && kind != STOKE_VISIBLE_GPU_UUID) return -1;
    int number = kind == STOKE_VISIBLE_INDEX;
    if (i == cuda_index) {
      if (number) return n < 9 ? atoi(p) : -1;
      if (n + 1 > len) return -1;
      memcpy(uuid, p, n);
      uuid[n] = 0;
      return -2;
    }
    if (!*end) return -1;
    visible = end + 1;
  }
}

/* NVML's handle of CUDA's device `cuda_index` (stoke_nvml_visible); 0 on success. A UUID prefix matches the
 * one GPU whose UUID starts with it, as CUDA matches it. */
static int nvml_handle(void *lib, int cuda_index, void **dev) {
  int (*by_index)(unsigned int, void **) = (int (*)(unsigned int, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  int (*count)(unsigned int *) = (int (*)(unsigned int *))dlsym(lib, "nvmlDeviceGetCount_v2");
  int (*get_uuid)(void *, char *, unsigned int) = (int (*)(void *, char *, unsigned int))dlsym(lib, "nvmlDeviceGetUUID");
  char want[96];
  int idx = stoke_nvml_visible(getenv("CUDA_VISIBLE_DEVICES"), cuda_index, want, sizeof want);
  if (!by_index || idx == -1) return -1;
  if (idx >= 0) return by_index((unsigned)idx, dev);
  unsigned int n = 0;
  if (!count || !get_uuid || count(&n) != 0) return -1;
  int found = 0;
  for (unsigned int i = 0; i < n; i++) {
    void *h = NULL;
    char id[96];
    if (by_index(i, &h) == 0 && get_uuid(h, id, sizeof id) == 0 && !strncmp(id, want, strlen(want))) {
      *dev = h;
      found++;
    }
  }
  return found == 1 ? 0 : -1;
}

stoke_nvml *stoke_nvml_open(int device_index) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return NULL;
  int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
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
  int ok = n && init && n->util && n->mem && init() == 0;
  if (ok && nvml_handle(lib, device_index, &n->dev) != 0) {
    if (n->shutdown) n->shutdown();
    ok = 0;
  }
  if (!ok) {
    free(n);
    dlclose(lib);
    return NULL;
  }
  n->lib = lib;
  return n;
}

void stoke_nvml_close(stoke_nvml *n) {
  if (!n) return;
  if (n->started) {
    pthread_mutex_lock(&n->mu);
    n->stop = 1;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->sampler, NULL);
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
  }
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

void stoke_power_by_rank(const double *power_w, const double *sm_mhz, int n, char *out, size_t cap) {
  if (!cap) return;
  out[0] = 0;
  int any = 0;
  for (int r = 0; r < n; r++) any |= isfinite(power_w[r]) || isfinite(sm_mhz[r]);
  size_t used = 0;
  for (int r = 0; any && r < n && used < cap; r++) {
    char w[32] = "n/a", c[32] = "n/a";
    if (isfinite(power_w[r])) snprintf(w, sizeof w, "%.0f W", power_w[r]);
    if (isfinite(sm_mhz[r])) snprintf(c, sizeof c, "%.0f MHz", sm_mhz[r]);
    used += (size_t)snprintf(out + used, cap - used, "%s%d: %s, %s", r ? "; " : "", r, w, c);
  }
}

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *sampler_main(void *arg) {
  stoke_nvml *n = arg;
  pthread_mutex_lock(&n->mu);
  while (!n->stop) {
    pthread_mutex_unlock(&n->mu);
    unsigned long long mj = 0;
    nvml_violation v = {0, 0};
    unsigned int mhz = 0;
    reading r = {mono_s(), -1, -1};
    if (n->energy && n->energy(n->dev, &mj) == 0) r.mj = (double)mj;
    if (n->violation && n->violation(n->dev, NVML_PERF_POLICY_POWER, &v) == 0) r.violation_ns = (double)v.violation_ns;
    int have_clock = n->clock && n->clock(n->dev, NVML_CLOCK_SM, &mhz) == 0;
    pthread_mutex_lock(&n->mu);
    n->now = r;
    if (n->last.at < 0) n->last = r; /* the first reading starts the counters */
    else if (have_clock) n->clock_sum += mhz, n->n_clock++;
    if (have_clock) n->clock_latest = mhz;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += (long)(STOKE_POWER_TICK_S * 1e9);
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    if (!n->stop) pthread_cond_timedwait(&n->cv, &n->mu, &until);
  }
  pthread_mutex_unlock(&n->mu);
  return NULL;
}

/* The sampler, started by the first stoke_nvml_power call (a run that never asks has no thread). */
static int start_sampler(stoke_nvml *n) {
  pthread_condattr_t ca;
  if (pthread_mutex_init(&n->mu, NULL)) return -1;
  if (pthread_condattr_init(&ca) || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) || pthread_cond_init(&n->cv, &ca)) {
    pthread_mutex_destroy(&n->mu);
    return -1;
  }
  pthread_condattr_destroy(&ca);
  n->last.at = n->now.at = -1;
  n->clock_latest = NAN;
  if (pthread_create(&n->sampler, NULL, sampler_main, n)) {
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
    return -1;
  }
  n->started = 1;
  return 0;
}

int stoke_nvml_power(stoke_nvml *n, stoke_power_sample *p) {
  p->power_w = p->capped = p->sm_mhz = NAN;
  p->span_s = 0;
  if (!n) return -1;
  if (!n->started) return start_sampler(n);
  pthread_mutex_lock(&n->mu);
  reading a = n->last, b = n->now;
  p->sm_mhz = n->clock_latest;
  /* the counters move in the driver's steps (0.1-0.2 s on an H200): a figure covers STOKE_POWER_MIN_SPAN_S */
  if (a.at >= 0 && b.at - a.at >= STOKE_POWER_MIN_SPAN_S) {
    p->span_s = b.at - a.at;
    stoke_power_interval(p->span_s, a.mj >= 0 && b.mj >= 0 ? b.mj - a.mj : -1,
                         a.violation_ns >= 0 && b.violation_ns >= 0 ? b.violation_ns - a.violation_ns : -1,
                         &p->power_w, &p->capped);
    if (n->n_clock) p->sm_mhz = n->clock_sum / (double)n->n_clock;
    n->last = b;
    n->clock_sum = 0, n->n_clock = 0;
  }
  pthread_mutex_unlock(&n->mu);
  return 0;
}

void stoke_nvml_power_limits(stoke_nvml *n, double *limit_w, double *max_sm_mhz) {
  unsigned int mw = 0, mhz = 0;
  *limit_w = n && n->limit && n->limit(n->dev, &mw) == 0 ? 1e-3 * mw : NAN;
  *max_sm_mhz = n && n->max_clock && n->max_clock(n->dev, NVML_CLOCK_SM, &mhz) == 0 ? (double)mhz : NAN;
}
