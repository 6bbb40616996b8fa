/* tests/tools/launch_test.c: tools/launch with a shell script for a
 * program: every rank gets torchrun's variables (one node and one of
 * several), a failing or killed rank stops the others at once with a
 * message naming it and its exit code or signal, a rank that ignores
 * SIGTERM is killed after the grace time, and bad options are refused.
 * Nothing outlives the launcher: a rank's own children are stopped with it
 * (the signals go to its process group), SIGHUP is passed on like SIGINT,
 * and ranks whose launcher is killed outright get SIGTERM. */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "child.h"

#define LAUNCH "tools/launch"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Each rank writes its variables to <tmp>/rank<RANK>. */
static const char *WRITE_VARS =
    "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT\" > $TEST_TMPDIR/rank$RANK";

static void expect_file(int rank, const char *want) {
  char path[4096], got[256] = "";
  snprintf(path, sizeof path, "%s/rank%d", tmpdir(), rank);
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("rank %d wrote no %s", rank, path);
  if (!fgets(got, sizeof got, f)) got[0] = 0;
  fclose(f);
  got[strcspn(got, "\n")] = 0;
  if (strcmp(got, want)) fail_msg("rank %d: variables '%s', expected '%s'", rank, got, want);
}

static void test_variables_one_node(void **state) {
  (void)state;
  char out[8192];
  RUN_OK(LAUNCH, out, "--gpus", "3", "--", "/bin/sh", "-c", WRITE_VARS);
  expect_file(0, "0 3 0 3 127.0.0.1 29500");
  expect_file(1, "1 3 1 3 127.0.0.1 29500");
  expect_file(2, "2 3 2 3 127.0.0.1 29500");
  EXPECT_HAS(out, "3 processes on this node (ranks 0 to 2 of 3)");
}

static void test_variables_second_node(void **state) {
  (void)state;
  char out[8192];
  RUN_OK(LAUNCH, out, "--gpus", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr", "node0",
         "--master-port", "4000", "--", "/bin/sh", "-c", WRITE_VARS);
  expect_file(2, "2 6 0 2 node0 4000");
  expect_file(3, "3 6 1 2 node0 4000");
}

static void test_failing_rank_stops_the_others(void **state) {
  (void)state;
  char out[8192];
  double t0 = now_s();
  int rc = run_child(LAUNCH, (const char *const[]){"--gpus", "3", "--", "/bin/sh", "-c",
                                                   "if [ $RANK = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 60", NULL},
                     out, sizeof out);
  double took = now_s() - t0;
  assert_int_equal(rc, 3);
  EXPECT_HAS(out, "rank 1 (local rank 1, pid");
  EXPECT_HAS(out, "exited with code 3; stopping the other 2 ranks");
  EXPECT_HAS(out, "launch: error: rank 1 exited with code 3");
  if (took > 10) fail_msg("the others were not stopped: %.1f s", took);
}

static void test_killed_rank(void **state) {
  (void)state;
  char out[8192];
  int rc = run_child(LAUNCH, (const char *const[]){"--gpus", "2", "--", "/bin/sh", "-c",
                                                   "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 60", NULL},
                     out, sizeof out);
  assert_int_equal(rc, 128 + 9);
  EXPECT_HAS(out, "rank 0 (local rank 0, pid");
  EXPECT_HAS(out, "was killed by signal 9");
}

static void test_grace_then_kill(void **state) {
  (void)state;
  char out[8192];
  double t0 = now_s();
  /* rank 0 ignores SIGTERM (sleep inherits it): killed after --grace 1.
   * Rank 1 fails only once rank 0 has its trap (the marker file), or the
   * launcher's SIGTERM could reach rank 0 first and end it at once. */
  char marker[600], script[1400];
  snprintf(marker, sizeof marker, "%s/launch_grace_%d", getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp",
           (int)getpid());
  unlink(marker);
  snprintf(script, sizeof script,
           "trap '' TERM; if [ $RANK = 1 ]; then while [ ! -e %s ]; do sleep 0.05; done; exit 1; fi; "
           "touch %s; exec sleep 60",
           marker, marker);
  int rc = run_child(LAUNCH, (const char *const[]){"--gpus", "2", "--grace", "1", "--", "/bin/sh", "-c", script, NULL},
                     out, sizeof out);
  unlink(marker);
  assert_int_equal(rc, 1);
  EXPECT_HAS(out, "still running 1 s after the failure: killing them");
  if (now_s() - t0 > 10) fail_msg("took %.1f s", now_s() - t0);
}

/* Processes whose command line holds `mark` (a unique sleep duration), after up to 3 s for them to go. */
static int still_running(const char *mark) {
  for (int tries = 0; tries < 60; tries++) {
    int n = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *de; d && (de = readdir(d));) {
      char path[300], cmd[512] = "";
      snprintf(path, sizeof path, "/proc/%s/cmdline", de->d_name);
      FILE *f = fopen(path, "r");
      if (!f) continue;
      size_t k = fread(cmd, 1, sizeof cmd - 1, f);
      fclose(f);
      for (size_t i = 0; i < k; i++)
        if (!cmd[i]) cmd[i] = ' ';
      cmd[k] = 0;
      n += strstr(cmd, mark) != NULL;
    }
    if (d) closedir(d);
    if (!n) return 0;
    usleep(50 * 1000);
  }
  return 1;
}

/* A rank's program starts children of its own (a wrapper script): when another rank fails, they are stopped
 * with it, not left running under init holding a GPU. */
static void test_children_of_a_rank_stopped(void **state) {
  (void)state;
  char out[8192], mark[64], script[512];
  snprintf(mark, sizeof mark, "sleep 37.%d", (int)getpid() % 1000 + 1000);
  snprintf(script, sizeof script, "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; %s; echo done", mark);
  int rc = run_child(LAUNCH, (const char *const[]){"--gpus", "2", "--grace", "1", "--", "/bin/sh", "-c", script, NULL},
                     out, sizeof out);
  assert_int_equal(rc, 3);
  if (still_running(mark)) fail_msg("'%s', rank 0's child, outlived the launcher", mark);
}

/* SIGHUP (a closed ssh session) is passed on like SIGINT; a launcher killed outright (kill -9) leaves no rank. */
static void test_launcher_gone_leaves_nothing(void **state) {
  (void)state;
  int sigs[2] = {SIGHUP, SIGKILL};
  for (int k = 0; k < 2; k++) {
    char mark[64];
    snprintf(mark, sizeof mark, "%d.%d", 41 + k, (int)getpid() % 1000 + 1000);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      freopen("/dev/null", "w", stderr);
      execl(LAUNCH, LAUNCH, "--gpus", "2", "--", "/bin/sleep", mark, (char *)NULL);
      _exit(127);
    }
    char full[80];
    snprintf(full, sizeof full, "sleep %s", mark);
    for (int i = 0; i < 100 && !still_running(full); i++) usleep(20 * 1000); /* both ranks up? (one is enough) */
    usleep(200 * 1000);
    kill(pid, sigs[k]);
    int status;
    waitpid(pid, &status, 0);
    if (still_running(full)) fail_msg("after %s to the launcher, '%s' still runs", strsignal(sigs[k]), full);
  }
}

/* Without --gpus: one rank per GPU that CUDA_VISIBLE_DEVICES lets the job use (not every GPU nvidia-smi lists,
 * whose extra ranks would fail); "-1" lets it use none. */
static void test_visible_devices(void **state) {
  (void)state;
  char out[8192];
  int rc = run_child_env(LAUNCH, (const char *const[]){"--", "/bin/true", NULL}, "CUDA_VISIBLE_DEVICES=0,2,5", out,
                         sizeof out);
  assert_int_equal(rc, 0);
  EXPECT_HAS(out, "3 processes on this node (ranks 0 to 2 of 3)");
  rc = run_child_env(LAUNCH, (const char *const[]){"--", "/bin/true", NULL}, "CUDA_VISIBLE_DEVICES=-1", out,
                     sizeof out);
  assert_int_equal(rc, 2);
  EXPECT_HAS(out, "no GPU found (CUDA_VISIBLE_DEVICES");
  /* CUDA stops at the first entry that is not a device: two GPUs here, not four; UUIDs and spaces count as CUDA
   * reads them */
  rc = run_child_env(LAUNCH, (const char *const[]){"--", "/bin/true", NULL}, "CUDA_VISIBLE_DEVICES=0,1,x,2", out,
                     sizeof out);
  assert_int_equal(rc, 0);
  EXPECT_HAS(out, "2 processes on this node (ranks 0 to 1 of 2)");
  rc = run_child_env(LAUNCH, (const char *const[]){"--", "/bin/true", NULL},
                     "CUDA_VISIBLE_DEVICES= GPU-5d1f0a2b, MIG-9c1e ,3,1a", out, sizeof out);
  assert_int_equal(rc, 0);
  EXPECT_HAS(out, "3 processes on this node (ranks 0 to 2 of 3)");
  /* more entries than a node's ranks: refused (the ranks' table overflowed) */
  static char many[2000];
  size_t used = (size_t)snprintf(many, sizeof many, "CUDA_VISIBLE_DEVICES=0");
  for (int i = 1; i < 300; i++) used += (size_t)snprintf(many + used, sizeof many - used, ",%d", i);
  rc = run_child_env(LAUNCH, (const char *const[]){"--", "/bin/true", NULL}, many, out, sizeof out);
  assert_int_equal(rc, 2);
  EXPECT_HAS(out, "300 GPUs in CUDA_VISIBLE_DEVICES, at most 256");
}

static void test_bad_options(void **state) {
  (void)state;
  char out[8192];
  int rc = run_child(LAUNCH, (const char *const[]){"--gpus", "2", "--nnodes", "2", "--", "/bin/true", NULL}, out,
                     sizeof out);
  assert_int_equal(rc, 2);
  EXPECT_HAS(out, "needs --master-addr");
  rc = run_child(LAUNCH, (const char *const[]){"--gpus", "0", "--", "/bin/true", NULL}, out, sizeof out);
  assert_int_equal(rc, 2);
  EXPECT_HAS(out, "--gpus needs a whole number from 1 to 256");
  rc = run_child(LAUNCH, (const char *const[]){"--gpus", "1", "--", "/no/such/program", NULL}, out, sizeof out);
  assert_int_equal(rc, 127);
  EXPECT_HAS(out, "cannot start '/no/such/program'");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_variables_one_node),     cmocka_unit_test(test_variables_second_node),
      cmocka_unit_test(test_failing_rank_stops_the_others), cmocka_unit_test(test_killed_rank),
      cmocka_unit_test(test_grace_then_kill),        cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_children_of_a_rank_stopped), cmocka_unit_test(test_launcher_gone_leaves_nothing),
      cmocka_unit_test(test_visible_devices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
