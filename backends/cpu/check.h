/* backends/cpu/check.h: the argument-check helpers of the CPU kernels
 * (cpu.c, kernels.inc, conv.c, pool.c, norm.c, cast.c) beyond those every
 * backend shares (stoke/check.h).
 *
 * The functions are defined once in check.c; the plugin is built with
 * -fvisibility=hidden, so they stay internal to libstoke_cpu.so. The checks
 * that take `run` get 0 when called from plan (data pointers may all be
 * NULL, so only shapes and dtypes are checked) and 1 from run (the data the
 * kernel reads or writes must be there too). Every error names the op, the
 * node and what is wrong. */
#ifndef STOKE_CPU_CHECK_H
#define STOKE_CPU_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/check.h"
#include "stoke/plugin.h"

/* Return the error of `expr`, if any, from the calling function. */
#define CHECK(expr) STOKE_PROPAGATE_P(expr)

/* Token pasting for the per-type kernel names: CAT(fwd, f32) = fwd_f32. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* The kernel table entry of op's `pass` in dtype dt: fn##_plan_##sfx and
 * fn##_##sfx, freed by `destroy`. */
#define CPU_KERNEL(op, pass, fn, sfx, dt, destroy) \
  {"cpu", op, pass, dt, STOKE_LAYOUT_ANY, CAT(fn##_plan, sfx), CAT(fn, sfx), destroy}
/* The same, for a backward kernel that adds its gradients of the inputs
 * in `acc` (bits) into din on request (din_accumulate, via stoke_grad_beta). */
#define CPU_KERNEL_ACC(op, pass, fn, sfx, dt, destroy, acc) \
  {"cpu", op, pass, dt, STOKE_LAYOUT_ANY, CAT(fn##_plan, sfx), CAT(fn, sfx), destroy, acc}

/* d = beta * d + v for element type T, without reading d when beta is 0
 * (it may hold NaN). */
#define ACC(T, d, beta, v) \
  ((d) = (beta) != 0 ? (T)((beta) * (double)(d) + (double)(v)) : (T)(v))

/* Defines `name`, the plan() of a kernel with no per-node state and no
 * workspace: `decl` (a declaration `check` needs, or nothing), then clears
 * both outputs and returns `check`, the kernel's argument check in plan
 * mode (run = 0). */
#define CPU_PLAN(name, decl, check)                                                  \
  static stoke_err *name(const stoke_kernel_args_v1 *a, void **state, size_t *ws) { \
    decl;                                                                            \
    if (state) *state = NULL;                                                        \
    if (ws) *ws = 0;                                                                 \
    return check;                                                                    \
  }

/* The dtypes of x = in[0] and y = out[0] are dt; forward: both hold data
 * in run; backward: their requested gradients din[0] and dout[0] match
 * them (the op checks what else its backward reads). */
stoke_err *check_xy(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd,
                    int run);

#endif
