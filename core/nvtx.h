/* core/nvtx.h: NVTX ranges around steps, nodes and the loader's work, so
 * `nsys profile` shows stoke's names. NVTX3 is header-only: with no tool
 * attached a range costs a call through a null hook, and no GPU is needed. */
#ifndef STOKE_CORE_NVTX_H
#define STOKE_CORE_NVTX_H

#include <nvtx3/nvToolsExt.h>

/* run.nvtx (on by default), set once when a run starts: NVTX ranges are
 * per process and per thread, like the tools that read them. */
extern volatile int stoke_nvtx_on;

static inline void stoke_range_push(const char *name) {
  if (stoke_nvtx_on) nvtxRangePushA(name);
}

static inline void stoke_range_pop(void) {
  if (stoke_nvtx_on) nvtxRangePop();
}

#endif
