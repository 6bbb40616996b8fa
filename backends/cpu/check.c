/* backends/cpu/check.c: the argument-check helpers shared by the CPU
 * kernels; see check.h. */
#include "check.h"

#include <stdio.h>

stoke_err *check_xy(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt, int bwd,
                    int run) {
  const stoke_tensor *x = &a->in[0], *y = &a->out[0];
  CHECK(stoke_check_dtype(a, op, "x", x, dt));
  CHECK(stoke_check_dtype(a, op, "y", y, dt));
  if (!bwd) {
    CHECK(stoke_check_data(a, op, "x", x, run));
    return stoke_check_data(a, op, "y", y, run);
  }
  CHECK(stoke_check_grad(a, op, "x", &a->din[0], x));
  return stoke_check_grad(a, op, "y", &a->dout[0], y);
}
