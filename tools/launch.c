/* tools/launch: `launch --gpus N run.ini [section.key=value ...]` starts N
 * training processes on this machine, one per GPU, with the variables
 * torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT) and `run.comm=nccl`; with --nnodes and
 * --node-rank it is one node of several. A program other than an INI file
 * runs as it is (`launch --gpus 2 -- prog args`). SIGINT, SIGTERM, SIGHUP
 * and SIGQUIT go to every rank (a second one kills them), to its whole
 * process group (a wrapper script's children too); when one rank fails,
 * the others are stopped and the launcher says which rank failed and how;
 * a rank whose launcher dies (kill -9) gets SIGTERM. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stoke/visible.h"

#define MAX_RANKS 256

static volatile sig_atomic_t got_signal, signals;
static void on_signal(int sig) {
  got_signal = sig;
  signals++;
}

/* `sig` to rank `pid` and everything it started: each rank leads its own
 * process group (a rank that has not made it yet gets it alone). */
static void signal_rank(pid_t pid, int sig) {
  if (kill(-pid, sig) && errno == ESRCH) kill(pid, sig);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: launch [options] RUN.INI [section.key=value ...]\n"
          "       launch [options] -- PROGRAM [args ...]\n"
          "Starts one process per local GPU with torchrun's variables; an INI file is\n"
          "trained by the train binary beside this one with run.comm=nccl.\n"
          "  --gpus N          processes on this node (default: one per GPU in CUDA_VISIBLE_DEVICES,\n"
          "                    else every GPU, from nvidia-smi)\n"
          "  --nnodes N        nodes in the job (default 1)\n"
          "  --node-rank R     this node's index, 0 to N-1 (default 0)\n"
          "  --master-addr A   rank 0's node (default 127.0.0.1; required with --nnodes > 1)\n"
          "  --master-port P   (default 29500; NCCL's bootstrap listens on P + 1)\n"
          "  --grace S         seconds the others get to stop after a failure (default 10)\n");
}

/* GPUs this job may use: CUDA_VISIBLE_DEVICES's entries when it is set (as
 * CUDA reads it: up to the first entry that is not a device, so "-1" or
 * "0,1,x,2" stop there: none, two), else every GPU on the machine, from
 * nvidia-smi (0 when it cannot tell). */
static int count_gpus(void) {
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis) {
    int n = 0;
    for (const char *p = vis; *p;) {
      size_t k = strcspn(p, ","), kept = k;
      const char *entry = p;
      if (stoke_visible_entry(&entry, &kept) == STOKE_VISIBLE_INVALID) break;
      n++;
      p += k;
      if (*p == ',') p++;
    }
    return n;
  }
  FILE *p = popen("nvidia-smi --list-gpus 2>/dev/null", "r");
  if (!p) return 0;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, p))
    if (!strncmp(line, "GPU ", 4)) n++;
  pclose(p);
  return n;
}

static int parse_count(const char *opt, const char *v, int lo, int hi) {
  char *end;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || *end || end == v || x < lo || x > hi) {
    fprintf(stderr, "launch: error: %s needs a whole number from %d to %d, got '%s'\n", opt, lo, hi, v ? v : "");
    exit(2);
  }
  return (int)x;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void describe(int status, char *buf, size_t cap) {
  if (WIFSIGNALED(status))
    snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(buf, cap, "exited with code %d", WEXITSTATUS(status));
}

int main(int argc, char **argv) {
  const char *cwd = getenv("BUILD_WORKING_DIRECTORY"); /* bazel run: paths are the user's */
  if (cwd && chdir(cwd) != 0) {
    fprintf(stderr, "launch: error: cannot enter %s\n", cwd);
    return 1;
  }
  int gpus = 0, nnodes = 1, node_rank = 0, port = 29500, grace = 10;
  const char *addr = NULL;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--")) {
      i++;
      break;
    } else if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(o, "--gpus")) gpus = parse_count(o, v, 1, MAX_RANKS), i++;
    else if (!strcmp(o, "--nnodes")) nnodes = parse_count(o, v, 1, 1 << 20), i++;
    else if (!strcmp(o, "--node-rank")) node_rank = parse_count(o, v, 0, 1 << 20), i++;
    else if (!strcmp(o, "--master-port")) port = parse_count(o, v, 1, 65534), i++;
    else if (!strcmp(o, "--grace")) grace = parse_count(o, v, 0, 3600), i++;
    else if (!strcmp(o, "--master-addr") && v) addr = v, i++;
    else {
      fprintf(stderr, "launch: error: unknown option '%s'\n", o);
      usage(stderr);
      return 2;
    }
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  if (node_rank >= nnodes) {
    fprintf(stderr, "launch: error: --node-rank %d with --nnodes %d: node ranks go from 0 to %d\n", node_rank,
            nnodes, nnodes - 1);
    return 2;
  }
  if (nnodes > 1 && !addr) {
    fprintf(stderr, "launch: error: --nnodes %d needs --master-addr: the host name or address of node 0, the same "
                    "on every node\n", nnodes);
    return 2;
  }
  if (!gpus && !(gpus = count_gpus())) {
    fprintf(stderr, "launch: error: no GPU found (CUDA_VISIBLE_DEVICES, or nvidia-smi --list-gpus); say how many "
                    "processes with --gpus N\n");
    return 2;
  }
  if (gpus > MAX_RANKS) { /* counted from CUDA_VISIBLE_DEVICES: --gpus is checked when read */
    fprintf(stderr, "launch: error: %d GPUs in CUDA_VISIBLE_DEVICES, at most %d processes on a node; say how many "
                    "with --gpus N\n", gpus, MAX_RANKS);
    return 2;
  }
  /* the command: train beside this binary for an INI file, else as given */
  const char *cmd[1024];
  int n = 0;
  char train[PATH_MAX];
  size_t len = strlen(argv[i]);
  int ini = len > 4 && !strcmp(argv[i] + len - 4, ".ini");
  if (ini) {
    ssize_t k = readlink("/proc/self/exe", train, sizeof train - 8);
    if (k <= 0) {
      fprintf(stderr, "launch: error: cannot find this binary's folder\n");
      return 1;
    }
    train[k] = 0;
    char *slash = strrchr(train, '/');
    strcpy(slash ? slash + 1 : train, "train");
    cmd[n++] = train;
  }
  for (; i < argc && n < 1021; i++) cmd[n++] = argv[i];
  if (ini) cmd[n++] = "run.comm=nccl";
  cmd[n] = NULL;

  struct sigaction sa = {0};
  sa.sa_handler = on_signal; /* no SA_RESTART: waits return on a signal */
  static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (int k = 0; k < 4; k++) sigaction(forwarded_signals[k], &sa, NULL);
  const pid_t launcher = getpid();
  int world = nnodes * gpus;
  pid_t pids[MAX_RANKS];
  int alive = 0;
  char v[64];
  for (int r = 0; r < gpus; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "launch: error: fork: %s\n", strerror(errno));
      for (int k = 0; k < r; k++) signal_rank(pids[k], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      setpgid(0, 0); /* Ctrl-C reaches the launcher only, which forwards it once */
      for (int k = 0; k < 4; k++) signal(forwarded_signals[k], SIG_DFL);
      /* the launcher killed outright (its signals never come): SIGTERM, as a forwarded one */
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(1); /* it died before the line above */
#define SETI(name, x) (snprintf(v, sizeof v, "%d", (x)), setenv(name, v, 1))
      SETI("RANK", node_rank * gpus + r);
      SETI("WORLD_SIZE", world);
      SETI("LOCAL_RANK", r);
      SETI("LOCAL_WORLD_SIZE", gpus);
      SETI("GROUP_RANK", node_rank);
      SETI("MASTER_PORT", port);
#undef SETI
      setenv("MASTER_ADDR", addr ? addr : "127.0.0.1", 1);
      execvp(cmd[0], (char *const *)cmd);
      fprintf(stderr, "launch: error: cannot start '%s': %s\n", cmd[0], strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid); /* as the child does: either may run first */
    pids[r] = pid;
    alive++;
  }
  fprintf(stderr, "launch: %d process%s on this node (ranks %d to %d of %d), rendezvous %s:%d\n", gpus,
          gpus == 1 ? "" : "es", node_rank * gpus, node_rank * gpus + gpus - 1, world, addr ? addr : "127.0.0.1",
          port);

  int failed_rank = -1, failed_status = 0, forwarded = 0;
  double stop_at = 0; /* when the others were told to stop */
  while (alive > 0) {
    if (got_signal && forwarded < signals) {
      int sig = signals > 1 ? SIGKILL : got_signal;
      forwarded = signals;
      fprintf(stderr, "launch: %s: %s every rank\n", strsignal(got_signal),
              sig == SIGKILL ? "killing" : "passing it to");
      for (int r = 0; r < gpus; r++)
        if (pids[r] > 0) signal_rank(pids[r], sig);
    }
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD) break;
    if (pid <= 0) {
      if (stop_at > 0 && now_s() - stop_at > grace) {
        fprintf(stderr, "launch: %d rank%s still running %d s after the failure: killing them\n", alive,
                alive == 1 ? "" : "s", grace);
        for (int r = 0; r < gpus; r++)
          if (pids[r] > 0) signal_rank(pids[r], SIGKILL);
        stop_at = now_s() + 1e9;
      }
      usleep(50 * 1000);
      continue;
    }
    int r = 0;
    while (r < gpus && pids[r] != pid) r++;
    if (r == gpus) continue;
    pids[r] = 0;
    alive--;
    int bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (bad && failed_rank < 0 && !got_signal) {
      failed_rank = node_rank * gpus + r;
      failed_status = status;
      char how[128];
      describe(status, how, sizeof how);
      fprintf(stderr, "launch: rank %d (local rank %d, pid %d) %s; stopping the other %d rank%s\n", failed_rank, r,
              (int)pid, how, alive, alive == 1 ? "" : "s");
      for (int k = 0; k < gpus; k++)
        if (pids[k] > 0) signal_rank(pids[k], SIGTERM);
      stop_at = now_s();
    }
  }
  if (failed_rank >= 0) {
    char how[128];
    describe(failed_status, how, sizeof how);
    fprintf(stderr, "launch: error: rank %d %s (its output above says why)\n", failed_rank, how);
    return WIFSIGNALED(failed_status) ? 128 + WTERMSIG(failed_status) : WEXITSTATUS(failed_status);
  }
  return got_signal ? 128 + got_signal : 0;
}
