/* tests/tools/child.h: run a tool as a child process (a data dependency,
 * runfiles-relative) and capture its stdout and stderr, for the cmocka
 * tests of tools/. Include after <cmocka.h>. */
#ifndef STOKE_TESTS_TOOLS_CHILD_H
#define STOKE_TESTS_TOOLS_CHILD_H

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

static const char *tmpdir(void) {
  const char *t = getenv("TEST_TMPDIR");
  return t && t[0] ? t : "/tmp";
}

/* Writes `text` to the file `name` in the test's temporary folder, whose
 * path lands in `path` (`cap` bytes). Returns 0, or -1 on failure. */
static __attribute__((unused)) int write_tmp(char *path, size_t cap, const char *name, const char *text) {
  snprintf(path, cap, "%s/%s", tmpdir(), name);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

/* Runs `tool` with `args` (NULL-terminated) and, when `env` is not NULL, one
 * extra NAME=VALUE in its environment; its stdout and stderr together land
 * in `out` (`cap` bytes, NUL-terminated). Returns the exit code (-1: killed
 * by a signal). */
static __attribute__((unused)) int run_child_env(const char *tool, const char *const *args, const char *env,
                                                 char *out, size_t cap) {
  char log[4096];
  snprintf(log, sizeof log, "%s/child.log", tmpdir());
  const char *argv[64] = {tool};
  int n = 1;
  for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  int ne = 0;
  while (environ[ne]) ne++;
  char **envp = calloc((size_t)ne + 2, sizeof *envp);
  assert_non_null(envp);
  memcpy(envp, environ, sizeof *envp * (size_t)ne);
  if (env) envp[ne] = (char *)env;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawn(&pid, tool, &fa, NULL, (char *const *)argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  free(envp);
  if (rc) {
    print_error("cannot start %s: %s\n", tool, strerror(rc));
    fail();
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  FILE *f = fopen(log, "rb");
  size_t got = f ? fread(out, 1, cap - 1, f) : 0;
  out[got] = 0;
  if (f) fclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* run_child_env with the environment as it is. */
static inline int run_child(const char *tool, const char *const *args, char *out, size_t cap) {
  return run_child_env(tool, args, NULL, out, cap);
}

/* Runs the tool and fails the test, showing its output, unless it exits 0. */
static inline void run_ok(const char *tool, const char *const *args, char *out, size_t cap) {
  int rc = run_child(tool, args, out, cap);
  if (rc != 0) {
    print_error("%s exited %d:\n%s\n", tool, rc, out);
    fail();
  }
}

/* run_ok with the arguments listed, into the array `out`. */
#define RUN_OK(tool, out, ...) run_ok((tool), (const char *const[]){__VA_ARGS__, NULL}, out, sizeof out)

/* The [data] and [model] of the tools' tests: a small MLP on 4096
 * synthetic samples of 32 features, 4 classes, batches of 16 (the INI
 * adds its [run] section and model.hidden). */
#define TINY_MLP_INI                                                                     \
  "[data]\n"                                                                             \
  "source = synthetic\n"                                                                 \
  "shape = 32\n"                                                                         \
  "classes = 4\n"                                                                        \
  "length = 4096\n"                                                                      \
  "batch_size = 16\n"                                                                    \
  "workers = 1\n"                                                                        \
  "[model]\n"                                                                            \
  "name = mlp\n"

static void expect_has(const char *text, const char *sub, const char *file, int line) {
  if (!strstr(text, sub)) {
    print_error("%s:%d: output lacks \"%s\":\n%s\n", file, line, sub, text);
    _fail(file, line);
  }
}
#define EXPECT_HAS(text, sub) expect_has((text), (sub), __FILE__, __LINE__)

#endif
