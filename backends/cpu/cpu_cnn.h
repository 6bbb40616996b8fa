/* backends/cpu/cpu_cnn.h: the CPU kernels kept in files of their own
 * (conv.c, pool.c, norm.c, convbn.c, cast.c, seq.c, optim.c), registered
 * by cpu.c. */
#ifndef STOKE_CPU_CNN_H
#define STOKE_CPU_CNN_H

#include "stoke/plugin.h"

stoke_err *cpu_register_conv(const stoke_registry_v1 *r);
stoke_err *cpu_register_pool(const stoke_registry_v1 *r);
stoke_err *cpu_register_norm(const stoke_registry_v1 *r);
stoke_err *cpu_register_cast(const stoke_registry_v1 *r);
stoke_err *cpu_register_optim(const stoke_registry_v1 *r); /* optim.c: the update's kernels */
stoke_err *cpu_register_seq(const stoke_registry_v1 *r); /* seq.c: transformer ops and views */
stoke_err *cpu_register_convbn(const stoke_registry_v1 *r);

/* conv2d's kernel of `pass` in f32 or f64 (conv.c), which the folded
 * conv + batch-norm kernels (convbn.c) call; its attributes are the first
 * four of theirs. */
const stoke_kernel_v1 *cpu_conv2d_kernel(stoke_pass pass, stoke_dtype dt);

#endif
