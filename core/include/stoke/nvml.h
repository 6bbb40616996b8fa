/* stoke/nvml.h: GPU utilization and memory through NVML (what users watch
 * with `nvidia-smi dmon`), loaded at run time with dlopen so that nothing
 * links against the driver and CPU machines need no NVML. */
#ifndef STOKE_NVML_H
#define STOKE_NVML_H

typedef struct stoke_nvml stoke_nvml;

/* NULL when NVML or the device is not there (CPU machines): sampling is
 * then skipped and reported as n/a. */
stoke_nvml *stoke_nvml_open(int device_index);
void stoke_nvml_close(stoke_nvml *n);
/* GPU utilization (%) over NVML's last sample period and memory used by
 * everything on the device (MiB); 0 on success. */
int stoke_nvml_sample(stoke_nvml *n, double *util_pct, double *mem_used_mib);

#endif
