/* backends/cpu/blas.h: OpenBLAS made safe to start under a memory limit
 * (see blas.c). */
#ifndef STOKE_CPU_BLAS_H
#define STOKE_CPU_BLAS_H

#include "stoke/plugin.h"

/* Before the first GEMM: check that OpenBLAS can map its GEMM buffer, and
 * make it do so; an error (with the limit and what is needed) if not. */
stoke_err *cpu_blas_ready(void);

#endif
