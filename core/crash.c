/* core/crash.c: what a kernel's crash says. The executor notes the kernel it
 * is running; a SIGSEGV or SIGBUS in it prints the node, the op, the pass
 * and the engine, and for a backward the inputs and outputs it was handed
 * without data (not named in the op's bwd_needs: the usual cause), and
 * for a fault through a NULL pointer the unset `stoke_host` (the other
 * usual cause), then dies of the signal as before. Only async-signal-safe
 * calls (write). */
#include <signal.h>
#include <stdint.h>
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

/* A fault in the first page is a read or write through a NULL pointer:
 * the usual one in a plugin is `stoke_host`, which its register() must
 * set (`stoke_host = h;`) before any stoke_host->... call (the STOKE_PERR
 * macros, log, config reads) can work. */
static void null_hint(const void *addr) {
  if ((uintptr_t)addr >= 4096) return;
  put("  the fault is at address ");
  put_int((int)(uintptr_t)addr);
  put(", through a NULL pointer: if the plugin's register() does not keep the host table (`stoke_host = h;`, "
      "plugins/README.md), its first stoke_host->... call (STOKE_PERR, log, a config read) crashes so\n");
}

static void on_crash(int sig, siginfo_t *si, void *uc) {
  (void)uc;
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
    null_hint(si ? si->si_addr : NULL);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void stoke_crash_guard_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER | SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
}
