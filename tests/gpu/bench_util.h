/* tests/gpu/bench_util.h: what the GPU micro-benchmarks (conv_bench,
 * bn_bench) share: a check that ends the bench with the error's message,
 * and the median of a run of timings. Not tests: they print timings. */
#ifndef STOKE_TESTS_GPU_BENCH_UTIL_H
#define STOKE_TESTS_GPU_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "stoke/core.h"

/* Ends the program when e (a stoke_err *) is set: "prog: file:line: message". */
#define BENCH_DIE(prog, e)                                                        \
  do {                                                                            \
    stoke_err *e_ = (e);                                                          \
    if (e_) {                                                                     \
      fprintf(stderr, "%s: %s:%d: %s\n", prog, __FILE__, __LINE__, e_->msg);     \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

/* The median of n timings (sorts them). */
static inline float bench_median(float *ms, int n) {
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (ms[j] < ms[i]) {
        float x = ms[i];
        ms[i] = ms[j], ms[j] = x;
      }
  return ms[n / 2];
}

#endif
