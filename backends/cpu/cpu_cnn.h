/* backends/cpu/cpu_cnn.h: the CPU kernels kept in files of their own
 * (conv.c, pool.c, norm.c, cast.c, optim.c), registered by cpu.c. */
#ifndef STOKE_CPU_CNN_H
#define STOKE_CPU_CNN_H

#include "stoke/plugin.h"

stoke_err *cpu_register_conv(const stoke_registry_v1 *r);
stoke_err *cpu_register_pool(const stoke_registry_v1 *r);
stoke_err *cpu_register_norm(const stoke_registry_v1 *r);
stoke_err *cpu_register_cast(const stoke_registry_v1 *r);
stoke_err *cpu_register_optim(const stoke_registry_v1 *r); /* optim.c: the update's kernels */

#endif
