/* tests/lmdb/guard_test.c: sources/lmdb/guard.h on real faults: a read of a
 * page with no access (SIGSEGV), past the end of a file's mapping (SIGBUS)
 * and an LMDB assertion inside a guarded call each come back as -1 with
 * what happened, again and again; a guarded call that loops is stopped at
 * its CPU time limit (a sleeping one is not); the same fault outside a
 * guarded call still ends the process; the old handlers come back after
 * the last user. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sources/lmdb/guard.h"

static int read_byte(void *p) { return *(volatile char *)p; }

static int assert_fails(void *p) {
  stoke_lmdb_on_assert(NULL, (const char *)p);
  return 7; /* not reached inside a guard */
}

static int fine(void *p) { return *(int *)p; }

static void test_faults_come_back_as_errors(void **state) {
  stoke_lmdb_guard_retain();
  char why[256];
  /* no access at all: SIGSEGV */
  char *none = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(none != MAP_FAILED);
  for (int i = 0; i < 3; i++) { /* and again: the guard is not used up */
    assert_int_equal(stoke_lmdb_guarded(read_byte, none + 100, why, sizeof why), -1);
    assert_non_null(strstr(why, "SIGSEGV"));
  }
  /* a file's mapping past its end: SIGBUS */
  char path[256];
  const char *t = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/guard.bin", t ? t : "/tmp");
  FILE *f = fopen(path, "w+");
  assert_non_null(f);
  fputs("x", f);
  fflush(f);
  char *map = mmap(NULL, 3 * 4096, PROT_READ, MAP_SHARED, fileno(f), 0);
  assert_true(map != MAP_FAILED);
  assert_int_equal(stoke_lmdb_guarded(read_byte, map, why, sizeof why), 'x');
  assert_int_equal(stoke_lmdb_guarded(read_byte, map + 2 * 4096, why, sizeof why), -1);
  assert_non_null(strstr(why, "SIGBUS"));
  /* LMDB's assertion hook */
  assert_int_equal(stoke_lmdb_guarded(assert_fails, "mdb_page_search_root: Assertion failed", why, sizeof why), -1);
  assert_non_null(strstr(why, "mdb_page_search_root"));
  /* a call that does not fault returns its value */
  int v = 42;
  assert_int_equal(stoke_lmdb_guarded(fine, &v, why, sizeof why), 42);
  munmap(map, 3 * 4096);
  fclose(f);
  munmap(none, 4096);
  stoke_lmdb_guard_release();
}

static int spin(void *p) { /* LMDB's binary search on a damaged page, as far as the clock can tell */
  for (volatile unsigned long i = 0;; i++)
    if (p && i == ~0ul) return 1;
}

/* The open's scan, as far as the clock can tell: 1.2 s of CPU in one guarded call (8 times the
 * limit the test sets), a record done every 20 ms. */
static int scan_records(void *p) {
  for (int rec = 0; rec < 60; rec++) {
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 20000000L);
    stoke_lmdb_guard_progress();
  }
  return *(int *)p;
}

static int doze(void *p) {
  struct timespec ts = {0, 300 * 1000000L};
  nanosleep(&ts, NULL);
  return *(int *)p;
}

static void *spin_thread(void *p) {
  char why[256];
  int rc = stoke_lmdb_guarded(spin, NULL, why, sizeof why);
  return rc == -1 && strstr(why, "ms of CPU time") ? p : NULL;
}

static void test_loop_stopped_at_cpu_limit(void **state) {
  stoke_lmdb_guard_retain();
  stoke_lmdb_guard_set_cpu_limit_ms(150);
  char why[256];
  for (int i = 0; i < 3; i++) { /* again and again: the timer is re-armed */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(stoke_lmdb_guarded(spin, NULL, why, sizeof why), -1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_non_null(strstr(why, "more than 150 ms of CPU time"));
    assert_true(t1.tv_sec - t0.tv_sec < 30); /* stopped, not run to the end */
  }
  /* time asleep (the disk) is not CPU time: 300 ms asleep under 150 ms */
  int v = 5;
  assert_int_equal(stoke_lmdb_guarded(doze, &v, why, sizeof why), 5);
  /* ticks outside guarded calls are ignored, and short calls between
   * them are never stopped: 2 s of CPU in 40 ms slices, a call after each */
  for (int i = 0; i < 50; i++) {
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 40000000L);
    assert_int_equal(stoke_lmdb_guarded(fine, &v, why, sizeof why), 5);
  }
  /* a long call that reports each record done is not a loop: the limit is per record */
  assert_int_equal(stoke_lmdb_guarded(scan_records, &v, why, sizeof why), 5);
  stoke_lmdb_guard_progress(); /* outside a guarded call: nothing */
  /* the timer is per thread: another thread's loop is stopped in it */
  pthread_t th;
  void *res = NULL;
  assert_int_equal(pthread_create(&th, NULL, spin_thread, &v), 0);
  assert_int_equal(pthread_join(th, &res), 0);
  assert_ptr_equal(res, &v);
  stoke_lmdb_guard_set_cpu_limit_ms(10000);
  stoke_lmdb_guard_release();
}

/* Outside a guarded call a fault is not swallowed: the process ends (by
 * the signal, or by the sanitizer's report when one runs). */
static void test_unguarded_fault_still_ends_the_process(void **state) {
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL); /* not cmocka's handler, which would carry on in this child */
    stoke_lmdb_guard_retain();
    char *none = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    read_byte(none);
    _exit(0); /* must not get here */
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The handlers installed before the first user are back after the last. */
static void test_handlers_restored(void **state) {
  struct sigaction before, during, after;
  sigaction(SIGSEGV, NULL, &before);
  stoke_lmdb_guard_retain();
  stoke_lmdb_guard_retain();
  stoke_lmdb_guard_release();
  sigaction(SIGSEGV, NULL, &during);
  assert_true(during.sa_sigaction != before.sa_sigaction || during.sa_handler != before.sa_handler);
  stoke_lmdb_guard_release();
  sigaction(SIGSEGV, NULL, &after);
  assert_true(after.sa_sigaction == before.sa_sigaction);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_faults_come_back_as_errors),
      cmocka_unit_test(test_loop_stopped_at_cpu_limit),
      cmocka_unit_test(test_unguarded_fault_still_ends_the_process),
      cmocka_unit_test(test_handlers_restored),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
