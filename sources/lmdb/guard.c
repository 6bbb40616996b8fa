/* sources/lmdb/guard.c: see guard.h. A guarded call records where to jump
 * in a thread-local (initial-exec, so the handler reads it without any
 * call); the SIGBUS/SIGSEGV handler jumps there when the fault happened
 * inside a guarded call of its thread, and otherwise hands the fault to
 * the handler installed before (ASan's, or the default action). */
#include "guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

typedef struct guard {
  sigjmp_buf jb;
  int sig;          /* the fault's signal, 0 for an assertion */
  void *addr;       /* the faulting address */
  char assert_msg[200];
} guard;

static __thread guard *current __attribute__((tls_model("initial-exec")));

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int users;
static struct sigaction old_segv, old_bus;

static void on_fault(int sig, siginfo_t *si, void *uc) {
  guard *g = current;
  if (g) {
    current = NULL;
    g->sig = sig;
    g->addr = si ? si->si_addr : NULL;
    siglongjmp(g->jb, 1);
  }
  const struct sigaction *old = sig == SIGBUS ? &old_bus : &old_segv;
  if (old->sa_flags & SA_SIGINFO) {
    old->sa_sigaction(sig, si, uc);
  } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
  } else { /* the fault repeats on return and takes the default action */
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
  }
}

void stoke_lmdb_guard_retain(void) {
  pthread_mutex_lock(&mu);
  if (users++ == 0) {
    struct sigaction sa = {0};
    sa.sa_sigaction = on_fault;
    /* SA_NODEFER: the jump out leaves the signal unblocked, so the guard
     * needs no signal mask saved per call (sigsetjmp(.., 0)) */
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
  }
  pthread_mutex_unlock(&mu);
}

void stoke_lmdb_guard_release(void) {
  pthread_mutex_lock(&mu);
  if (--users == 0) {
    struct sigaction now;
    /* only if nobody replaced ours since */
    if (!sigaction(SIGSEGV, NULL, &now) && now.sa_sigaction == on_fault) sigaction(SIGSEGV, &old_segv, NULL);
    if (!sigaction(SIGBUS, NULL, &now) && now.sa_sigaction == on_fault) sigaction(SIGBUS, &old_bus, NULL);
  }
  pthread_mutex_unlock(&mu);
}

void stoke_lmdb_on_assert(MDB_env *env, const char *msg) {
  (void)env;
  guard *g = current;
  if (!g) return; /* LMDB aborts next, as without us */
  current = NULL;
  g->sig = 0;
  snprintf(g->assert_msg, sizeof g->assert_msg, "%s", msg);
  siglongjmp(g->jb, 1);
}

int stoke_lmdb_guarded(int (*fn)(void *), void *arg, char *why, size_t cap) {
  guard g;
  memset(&g, 0, sizeof g);
  guard *outer = current;
  if (sigsetjmp(g.jb, 0)) {
    current = outer;
    if (g.sig)
      snprintf(why, cap, "%s at address %p while LMDB read the file: the file is damaged or was cut short",
               g.sig == SIGBUS ? "SIGBUS" : "SIGSEGV", g.addr);
    else
      snprintf(why, cap, "LMDB's own check failed (%s): the file is damaged", g.assert_msg);
    return -1;
  }
  current = &g;
  int rc = fn(arg);
  current = outer;
  return rc;
}
