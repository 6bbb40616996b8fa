/* tests/common/seed.h: the seed of a test run with fresh random inputs:
 * STOKE_TEST_SEED when set (to rerun a failure), else the time; printed.
 * Include after cmocka.h. */
#ifndef STOKE_TESTS_SEED_H
#define STOKE_TESTS_SEED_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* `who` names the test in the printed line. */
static __attribute__((unused)) uint64_t test_seed(const char *who) {
  const char *env = getenv("STOKE_TEST_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
  print_message("%s seed %llu (rerun with STOKE_TEST_SEED)\n", who, (unsigned long long)seed);
  return seed;
}

#endif
