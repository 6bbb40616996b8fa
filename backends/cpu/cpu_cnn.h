/* backends/cpu/cpu_cnn.h: the CPU kernels of the convolutional ops
 * (conv.c, pool.c, norm.c), registered by cpu.c. */
#ifndef STOKE_CPU_CNN_H
#define STOKE_CPU_CNN_H

#include "stoke/plugin.h"

stoke_err *cpu_register_conv(const stoke_registry_v1 *r);
stoke_err *cpu_register_pool(const stoke_registry_v1 *r);
stoke_err *cpu_register_norm(const stoke_registry_v1 *r);
stoke_err *cpu_register_cast(const stoke_registry_v1 *r);
stoke_err *cpu_register_seq(const stoke_registry_v1 *r); /* seq.c: transformer ops and views */

#endif
