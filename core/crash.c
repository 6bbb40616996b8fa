/* core/crash.c: what a kernel's crash says. The executor notes the kernel it
 * is running; a SIGSEGV or SIGBUS in it prints the node, the op, the pass
 * and the engine, and for a backward the inputs and outputs it was handed
 * without data (not named in the op's bwd_needs: the usual cause), then
 * dies of the signal as before. Only async-signal-safe calls (write). */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "stoke/graph.h"

static const stoke_kernel_args_v1 *volatile running_args;
static const stoke_kernel_v1 *volatile running_kernel;

void stoke_crash_note_kernel(const stoke_kernel_v1 *k, const stoke_kernel_args_v1 *a) {
  running_kernel = k;
  running_args = a;
}

static void put(const char *s) {
  ssize_t n = write(2, s, strlen(s));
  (void)n;
}

static void put_int(int v) {
  char b[16];
  int i = (int)sizeof b - 1;
  b[i] = 0;
  do b[--i] = (char)('0' + v % 10), v /= 10;
  while (v && i > 0);
  put(b + i);
}

/* " input 0, output 1" for each tensor of `t` without data; 1 if any */
static int put_missing(const char *what, const stoke_tensor *t, int n, int any) {
  for (int i = 0; t && i < n; i++) {
    if (t[i].data) continue;
    put(any++ ? ", " : " ");
    put(what);
    put(" ");
    put_int(i);
  }
  return any;
}

static void on_crash(int sig) {
  const stoke_kernel_v1 *k = running_kernel;
  const stoke_kernel_args_v1 *a = running_args;
  if (k && a) {
    put(sig == SIGBUS ? "\nstoke: SIGBUS" : "\nstoke: SIGSEGV");
    put(k->pass == STOKE_BWD ? " in the backward kernel of node '" : " in the kernel of node '");
    put(a->node && a->node->name ? a->node->name : "?");
    put("' (op '");
    put(k->op ? k->op : "?");
    put("', engine '");
    put(k->engine ? k->engine : "?");
    put("')\n");
    if (k->pass == STOKE_BWD) {
      put("  handed without data (data == NULL) because the op's bwd_needs does not name them:");
      int any = put_missing("output", a->out, a->n_out, put_missing("input", a->in, a->n_in, 0));
      put(any ? "\n  if the backward reads one, add STOKE_BWD_NEEDS_INPUT(i) / STOKE_BWD_NEEDS_OUTPUT(j) to the op's "
                "bwd_needs; stoke/testkit.h checks this without a crash\n"
              : " none\n");
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void stoke_crash_guard_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
}
