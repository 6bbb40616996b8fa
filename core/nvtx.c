/* core/nvtx.c: the switch of the NVTX ranges (core/nvtx.h), on unless a
 * run says run.nvtx = false. */
#include "nvtx.h"

volatile int stoke_nvtx_on = 1;
