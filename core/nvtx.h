/* core/nvtx.h: NVTX ranges around steps, nodes and the loader's work, so
 * `nsys profile` shows stoke's names. NVTX3 is header-only: with no tool
 * attached a range costs a call through a null hook, and no GPU is needed. */
#ifndef STOKE_CORE_NVTX_H
#define STOKE_CORE_NVTX_H

#include <nvtx3/nvToolsExt.h>

/* run.nvtx: off until a run turns it on. NVTX ranges are per process and
 * per thread, like the tools that read them. */
extern int stoke_nvtx_flag;

/* On: NVTX is initialized here, on the calling thread, before any loader
 * worker may push a range (NVTX's own lazy start is not thread safe). */
void stoke_nvtx_enable(int on);

static inline int stoke_nvtx_on(void) { return __atomic_load_n(&stoke_nvtx_flag, __ATOMIC_ACQUIRE); }

static inline void stoke_range_push(const char *name) {
  if (stoke_nvtx_on()) nvtxRangePushA(name);
}

static inline void stoke_range_pop(void) {
  if (stoke_nvtx_on()) nvtxRangePop();
}

#endif
