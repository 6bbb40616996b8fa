/* core/nvtx.c: the switch of the NVTX ranges (core/nvtx.h): off until a
 * run turns it on (run.nvtx, true by default). */
#include "nvtx.h"

int stoke_nvtx_flag;

void stoke_nvtx_enable(int on) {
  if (on) nvtxInitialize(NULL);
  __atomic_store_n(&stoke_nvtx_flag, on, __ATOMIC_RELEASE);
}
