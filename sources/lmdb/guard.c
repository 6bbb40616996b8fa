/* sources/lmdb/guard.c: see guard.h. A guarded call records where to jump
 * in a thread-local (initial-exec, so the handler reads it without any
 * call); the SIGBUS/SIGSEGV handler jumps there when the fault happened
 * inside a guarded call of its thread, and otherwise hands the fault to
 * the handler installed before (ASan's, or the default action). The CPU
 * time limit is a timer on the thread's CPU clock, one per thread, armed
 * by the outermost guarded call; it signals SIGXCPU to that thread, whose
 * handler jumps out the same way. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* gettid, SIGEV_THREAD_ID */
#endif
#include "guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct guard {
  sigjmp_buf jb;
  int sig;          /* the fault's signal, 0 for an assertion */
  void *addr;       /* the faulting address */
  char assert_msg[200];
} guard;

static __thread guard *current __attribute__((tls_model("initial-exec")));

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int users;
static struct sigaction old_segv, old_bus, old_xcpu;
static long cpu_limit_ms = 10000;

/* This thread's CPU-time timer: made at its first guarded call, deleted
 * when the thread ends. */
typedef struct cpu_timer {
  timer_t id;
} cpu_timer;
static __thread cpu_timer *thread_timer;
static __thread int thread_timer_failed;
static pthread_key_t timer_key;
static pthread_once_t timer_once = PTHREAD_ONCE_INIT;

static void timer_free(void *p) {
  cpu_timer *t = p;
  timer_delete(t->id);
  free(t);
}

static void timer_key_make(void) { pthread_key_create(&timer_key, timer_free); }

/* Arms (ms > 0) or disarms (0) this thread's timer; without one (it could
 * not be made) calls run without a limit. */
static void cpu_timer_set(long ms) {
  if (!thread_timer && (ms <= 0 || thread_timer_failed)) return;
  if (!thread_timer) {
    pthread_once(&timer_once, timer_key_make);
    cpu_timer *t = malloc(sizeof *t);
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGXCPU;
#ifdef sigev_notify_thread_id
    ev.sigev_notify_thread_id = gettid();
#else
    ev._sigev_un._tid = gettid(); /* glibc before 2.38 names it only so */
#endif
    if (!t || timer_create(CLOCK_THREAD_CPUTIME_ID, &ev, &t->id)) {
      free(t);
      thread_timer_failed = 1;
      return;
    }
    thread_timer = t;
    pthread_setspecific(timer_key, t);
  }
  struct itimerspec it;
  memset(&it, 0, sizeof it);
  it.it_value.tv_sec = ms / 1000;
  it.it_value.tv_nsec = (ms % 1000) * 1000000L;
  timer_settime(thread_timer->id, 0, &it, NULL);
}

static void on_fault(int sig, siginfo_t *si, void *uc) {
  guard *g = current;
  if (sig == SIGXCPU && (!si || si->si_code != SI_TIMER)) g = NULL; /* RLIMIT_CPU's, not ours */
  if (sig == SIGXCPU && si && si->si_code == SI_TIMER && !g) return; /* ours, after the call ended */
  if (g) {
    current = NULL;
    g->sig = sig;
    g->addr = si ? si->si_addr : NULL;
    siglongjmp(g->jb, 1);
  }
  const struct sigaction *old = sig == SIGBUS ? &old_bus : sig == SIGXCPU ? &old_xcpu : &old_segv;
  if (old->sa_flags & SA_SIGINFO) {
    old->sa_sigaction(sig, si, uc);
  } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
  } else if (sig == SIGXCPU) { /* RLIMIT_CPU's: ignored, or the default action now */
    if (old->sa_handler == SIG_IGN) return;
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
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
    sigaction(SIGXCPU, &sa, &old_xcpu);
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
    if (!sigaction(SIGXCPU, NULL, &now) && now.sa_sigaction == on_fault) sigaction(SIGXCPU, &old_xcpu, NULL);
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

void stoke_lmdb_guard_set_cpu_limit_ms(long ms) { __atomic_store_n(&cpu_limit_ms, ms, __ATOMIC_RELAXED); }

int stoke_lmdb_guarded(int (*fn)(void *), void *arg, char *why, size_t cap) {
  guard g;
  memset(&g, 0, sizeof g);
  guard *outer = current;
  long limit = outer ? 0 : __atomic_load_n(&cpu_limit_ms, __ATOMIC_RELAXED);
  if (sigsetjmp(g.jb, 0)) {
    current = outer;
    if (limit > 0) cpu_timer_set(0);
    if (g.sig == SIGXCPU)
      snprintf(why, cap,
               "LMDB used more than %ld ms of CPU time reading one record (a damaged page can make it loop): "
               "the file is damaged",
               limit);
    else if (g.sig)
      snprintf(why, cap, "%s at address %p while LMDB read the file: the file is damaged or was cut short",
               g.sig == SIGBUS ? "SIGBUS" : "SIGSEGV", g.addr);
    else
      snprintf(why, cap, "LMDB's own check failed (%s): the file is damaged", g.assert_msg);
    return -1;
  }
  current = &g;
  if (limit > 0) cpu_timer_set(limit);
  int rc = fn(arg);
  current = outer;
  if (limit > 0) cpu_timer_set(0);
  return rc;
}
