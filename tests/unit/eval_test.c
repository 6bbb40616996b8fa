/* tests/unit/eval_test.c: evaluation's cross-entropy and top-1 over logits
 * of GPT-2's vocabulary class (10,000 and 50,304 classes, fresh random
 * logits, the winner and the label past class 4096) against a two-pass
 * reference in long double, in f32, bf16 and f64; a bad label is an error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "stoke/eval.h"
#include "stoke/rng.h"
#include "tests/common/expect.h"
#include "tests/common/seed.h"

static uint64_t seed;

/* The reference: max, then the sum of exponentials, in long double. */
static void reference(const void *x, stoke_dtype dt, int64_t rows, int64_t classes, const int32_t *labels,
                      long double *loss, int64_t *correct) {
  *loss = 0;
  *correct = 0;
  for (int64_t r = 0; r < rows; r++) {
    long double mx = -INFINITY, sum = 0;
    int64_t best = 0;
    for (int64_t c = 0; c < classes; c++) {
      long double v = stoke_elem_get(x, dt, r * classes + c);
      if (v > mx) mx = v, best = c;
    }
    for (int64_t c = 0; c < classes; c++) sum += expl((long double)stoke_elem_get(x, dt, r * classes + c) - mx);
    *loss += logl(sum) + mx - (long double)stoke_elem_get(x, dt, r * classes + labels[r]);
    *correct += best == labels[r];
  }
}

/* Random logits in [-4, 4]; row r's winner (logit 12) sits at a class past
 * 4096 and is the label for even rows; odd rows' labels are elsewhere. */
static void check(stoke_dtype dt, int64_t classes) {
  enum { ROWS = 6 };
  void *x = malloc((size_t)(ROWS * classes) * stoke_dtype_size(dt));
  int32_t labels[ROWS];
  stoke_rng r = stoke_rng_seed(stoke_hash3(seed, (uint64_t)classes, (uint64_t)dt));
  for (int64_t i = 0; i < ROWS * classes; i++) stoke_elem_set(x, dt, i, -4 + 8 * stoke_rng_uniform(&r));
  for (int i = 0; i < ROWS; i++) {
    int64_t win = 4096 + (int64_t)(stoke_rng_uniform(&r) * (double)(classes - 4096 - 1));
    stoke_elem_set(x, dt, i * classes + win, 12);
    labels[i] = (int32_t)(i % 2 == 0 ? win : (int64_t)(stoke_rng_uniform(&r) * (double)classes));
    if (i == 1) labels[i] = (int32_t)(classes - 1); /* the very last class */
  }
  stoke_eval_sums s = {0};
  EXPECT_OK(stoke_eval_rows(x, dt, ROWS, classes, labels, &s));
  long double want;
  int64_t correct;
  reference(x, dt, ROWS, classes, labels, &want, &correct);
  double rel = fabs((double)(s.loss - want)) / (double)want;
  print_message("%s, %lld classes: loss %.12g (reference %.12Lg, rel. error %.2g), %lld of %d correct\n",
                stoke_dtype_name(dt), (long long)classes, s.loss, want, rel, (long long)s.correct, ROWS);
  assert_int_equal(s.count, ROWS);
  assert_int_equal(s.correct, correct);
  assert_true(s.correct >= ROWS / 2); /* every even row's winner is its label */
  assert_true(rel < 1e-12);           /* double against long double over <= 50,304 terms */
  free(x);
}

static void test_large_vocabulary(void **state) {
  static const stoke_dtype dts[] = {STOKE_F32, STOKE_BF16, STOKE_F64};
  for (int d = 0; d < 3; d++) {
    check(dts[d], 10000);
    check(dts[d], 50304);
  }
}

/* A label outside [0, classes) names the row; nothing is counted. */
static void test_bad_label(void **state) {
  float x[2 * 5] = {0};
  int32_t labels[2] = {1, 5};
  stoke_eval_sums s = {0};
  EXPECT_ERR(stoke_eval_rows(x, STOKE_F32, 2, 5, labels, &s), STOKE_E_DATA, "row 1 has label 5",
             "outside [0, 5)");
  assert_int_equal(s.count, 0);
}

int main(void) {
  seed = test_seed("eval_test");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_large_vocabulary),
      cmocka_unit_test(test_bad_label),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
