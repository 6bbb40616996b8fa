/* stoke/testkit.h: test cases a plugin gives the plugin test kit
 * (tools/plugin_check, see plugins/README.md "The test kit"): for each of
 * its ops, input shapes and attributes to check it with. Optional: for an
 * op without a case the kit gives every input one shape, [3, 5] and then
 * [2, 3, 4, 5]. Export the table beside the entry:
 *
 *   static const stoke_testcase_v1 cases[] = {
 *       {.op = "leaky_relu", .attrs = "negative_slope=0.1", .n_inputs = 1, .shapes = {{2, {4, 6}}}},
 *       {.op = "my_linear", .n_inputs = 3, .shapes = {{2, {4, 8}}, {2, {5, 8}}, {1, {5}}}, .param_inputs = 6},
 *   };
 *   STOKE_EXPORT const stoke_testkit_v1 stoke_testkit_v1_entry = {
 *       STOKE_ABI(stoke_testkit_v1), cases, sizeof cases / sizeof *cases};
 */
#ifndef STOKE_TESTKIT_H
#define STOKE_TESTKIT_H

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Input shapes a case holds: 8, as when STOKE_MAX_IO was 8 (the struct's
 * layout is the kit's ABI); an op with more inputs has no case here. */
#define STOKE_TESTKIT_MAX_INPUTS 8

typedef struct stoke_testcase_v1 {
  const char *op;
  const char *attrs; /* as a model passes them, "negative_slope=0.1"; NULL: the defaults */
  int n_inputs;
  stoke_shape shapes[STOKE_TESTKIT_MAX_INPUTS];
  /* Inputs that may be parameters (bit i): their gradient must honour
   * param_grad_beta (din = beta din + computed), which the kit checks. */
  uint32_t param_inputs;
  /* Inputs holding class or index values (i32 in [0, int_max)), no gradient. */
  uint32_t int_inputs;
  int64_t int_max;
  /* Float inputs uniform in [lo, hi); both 0: [-2, 2). Widen it so every
   * piece of a piecewise op is reached (hardswish: -5, 5). */
  double lo, hi;
} stoke_testcase_v1;

typedef struct stoke_testkit_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_testkit_v1) */
  const stoke_testcase_v1 *cases;
  int n_cases;
} stoke_testkit_v1;

#define STOKE_TESTKIT_SYMBOL "stoke_testkit_v1_entry"

#ifdef __cplusplus
}
#endif
#endif
