/* stoke/nvml.h: GPU utilization and memory through NVML (what users watch
 * with `nvidia-smi dmon`), loaded at run time with dlopen so that nothing
 * links against the driver and CPU machines need no NVML. */
#ifndef STOKE_NVML_H
#define STOKE_NVML_H

#include <stddef.h>

typedef struct stoke_nvml stoke_nvml;

/* NULL when NVML or the device is not there (CPU machines): sampling is
 * then skipped and reported as n/a. device_index is CUDA's (the run's
 * device): NVML counts every GPU of the machine, so CUDA_VISIBLE_DEVICES
 * maps it (stoke_nvml_visible). */
stoke_nvml *stoke_nvml_open(int device_index);

/* Which of NVML's GPUs CUDA's device `cuda_index` is under
 * CUDA_VISIBLE_DEVICES = `visible` (NULL: unset), as PyTorch's
 * torch.cuda power and utilization calls map it: the list's entry
 * `cuda_index` (entries are separated by commas, spaces around them
 * ignored; CUDA reads the list up to its first invalid entry). Returns the
 * NVML index (>= 0) for a number; -2 for a GPU's UUID (or a prefix of one,
 * "GPU-..."), copied into uuid (at most len bytes, NUL-terminated); -1 when
 * the list has no such entry or it is neither (MIG-... included: a MIG
 * slice's power is its GPU's). Unset: cuda_index itself. */
int stoke_nvml_visible(const char *visible, int cuda_index, char *uuid, size_t len);
void stoke_nvml_close(stoke_nvml *n);
/* GPU utilization (%) over NVML's last sample period and memory used by
 * everything on the device (MiB); 0 on success. */
int stoke_nvml_sample(stoke_nvml *n, double *util_pct, double *mem_used_mib);

/* Power since the previous figure: the board's mean draw from its energy
 * counter, the share of the time its power limit held the clocks down
 * (NVML's power violation time), and the SM clock (the mean of the samples
 * a figure covers; between figures the latest sample). The H200s of
 * BENCHMARKS.md's run 31 trained at their 700 W cap with the clock swinging
 * between 1,380 and 1,965 MHz: a step's speed there is its energy. A thread
 * reads the counters every 0.2 s (one read took the driver 5-6 ms there,
 * time the step loop would leave the GPU idle); the first call starts it
 * and its first reading starts the counters. The counters move in the
 * driver's own steps (0.1-0.2 s), so a figure covers at least
 * STOKE_POWER_MIN_SPAN_S; a call before one is due gives the clock alone
 * (power and capped NaN, span_s 0). span_s: the seconds a figure covers.
 * NaN for what the driver does not count; -1 without NVML. */
#define STOKE_POWER_MIN_SPAN_S 1.0
typedef struct {
  double power_w, capped, sm_mhz, span_s;
} stoke_power_sample;
int stoke_nvml_power(stoke_nvml *n, stoke_power_sample *p);
/* The enforced power limit (W) and the SM clock's maximum (MHz); NaN: unknown. */
void stoke_nvml_power_limits(stoke_nvml *n, double *limit_w, double *max_sm_mhz);
/* The arithmetic of stoke_nvml_power from counter differences (negative: not
 * counted): mean power in W and the capped share of dt_s, at most 1. */
void stoke_power_interval(double dt_s, double d_mj, double d_violation_ns, double *power_w, double *capped);

/* Every rank's mean power (W) and SM clock (MHz), n ranks, as one line
 * into out (cap bytes, NUL-terminated): "0: 687 W, 1816 MHz; 1: 689 W,
 * 1892 MHz", n/a for a NaN; "" when every figure is NaN (no NVML). */
void stoke_power_by_rank(const double *power_w, const double *sm_mhz, int n, char *out, size_t cap);

#endif
