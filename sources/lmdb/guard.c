/* sources/lmdb/guard.c: see guard.h. A guarded call records where to jump
 * in a thread-local (initial-exec, so the handler reads it without any
 * call); the SIGBUS/SIGSEGV handler jumps there when the fault happened
 * inside a guarded call of its thread, and otherwise hands the fault to
 * the handler installed before (ASan's, or the default action).
 *
 * The CPU time limit costs a guarded call no system call: each thread that
 * makes one gets a periodic timer on its own CPU clock (SIGXCPU, every
 * `limit` ms of that thread's CPU time), and counts its outermost guarded
 * calls. A tick that finds the same call running as the tick before jumps
 * out of it: that call has used at least one whole period. (Arming a
 * timer around every call cost 1.1 us per record, twice the read of a raw
 * 28x28 record.) Ticks outside a guarded call are ignored; the timers stop
 * when the last user releases the guard, but the SIGXCPU handler, once
 * installed, stays, to swallow a tick already on its way (a SIGXCPU that
 * is not a timer's, RLIMIT_CPU's, goes to the handler before ours). */
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

static int users;
static struct sigaction old_segv, old_bus, old_xcpu;
static int xcpu_installed;
static long cpu_limit_ms = 10000;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* A thread's CPU-time timer: made at its first guarded call, deleted when
 * the thread ends, stopped (period 0) when the last user releases the
 * guard. All of them are listed, under `mu`. */
typedef struct cpu_timer {
  timer_t id;
  long ms; /* its period; the owner re-arms it when the limit differs */
  struct cpu_timer *next;
} cpu_timer;
static cpu_timer *timers;
static __thread cpu_timer *thread_timer;
static __thread int thread_timer_failed;
/* read by the tick's handler: initial-exec, as `current` */
static __thread unsigned long calls __attribute__((tls_model("initial-exec"))); /* outermost guarded calls begun */
static __thread unsigned long seen __attribute__((tls_model("initial-exec")));  /* the one the last tick found */
static pthread_key_t timer_key;
static pthread_once_t timer_once = PTHREAD_ONCE_INIT;

static void timer_free(void *p) {
  cpu_timer *t = p;
  pthread_mutex_lock(&mu);
  cpu_timer **at = &timers;
  while (*at != t) at = &(*at)->next;
  *at = t->next;
  pthread_mutex_unlock(&mu);
  timer_delete(t->id);
  free(t);
}

static void timer_key_make(void) { pthread_key_create(&timer_key, timer_free); }

static void timer_arm(cpu_timer *t, long ms) {
  struct itimerspec it;
  memset(&it, 0, sizeof it);
  it.it_value.tv_sec = it.it_interval.tv_sec = ms / 1000;
  it.it_value.tv_nsec = it.it_interval.tv_nsec = (ms % 1000) * 1000000L;
  timer_settime(t->id, 0, &it, NULL);
  __atomic_store_n(&t->ms, ms, __ATOMIC_RELAXED);
}

/* Makes this thread's timer tick every `ms` of its CPU time (0: stopped);
 * without a timer (it could not be made) calls run without a limit. */
static void cpu_timer_period(long ms) {
  if (thread_timer_failed || (!thread_timer && ms <= 0)) return;
  if (!thread_timer) {
    pthread_once(&timer_once, timer_key_make);
    cpu_timer *t = calloc(1, sizeof *t);
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
    pthread_mutex_lock(&mu);
    t->next = timers;
    timers = t;
    pthread_mutex_unlock(&mu);
    thread_timer = t;
    pthread_setspecific(timer_key, t);
  }
  timer_arm(thread_timer, ms);
}

/* A tick of this thread's timer: true when the guarded call running now
 * was running at the tick before too. */
static int over_limit(void) {
  if (!current) {
    seen = 0;
    return 0;
  }
  if (seen != calls) {
    seen = calls;
    return 0;
  }
  return 1;
}

static void on_fault(int sig, siginfo_t *si, void *uc) {
  guard *g = current;
  if (sig == SIGXCPU && si && si->si_code == SI_TIMER) { /* our tick */
    if (!over_limit()) return;
  } else if (sig == SIGXCPU) {
    g = NULL; /* RLIMIT_CPU's, not ours */
  }
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
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART; /* a tick interrupts no system call */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    if (!xcpu_installed) { /* once: see release */
      sigaction(SIGXCPU, &sa, &old_xcpu);
      xcpu_installed = 1;
    }
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
    /* every thread's timer stopped (re-armed by its next guarded call);
     * our SIGXCPU handler stays, to swallow a tick already under way */
    for (cpu_timer *t = timers; t; t = t->next) timer_arm(t, 0);
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

void stoke_lmdb_guard_progress(void) {
  if (!current) return;
  calls++; /* the next tick sees a number it has not seen: no whole period on one record */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void stoke_lmdb_guard_set_cpu_limit_ms(long ms) { __atomic_store_n(&cpu_limit_ms, ms, __ATOMIC_RELAXED); }

int stoke_lmdb_guarded(int (*fn)(void *), void *arg, char *why, size_t cap) {
  guard g;
  memset(&g, 0, sizeof g);
  guard *outer = current;
  long limit = __atomic_load_n(&cpu_limit_ms, __ATOMIC_RELAXED);
  if (limit < 0) limit = 0;
  if (!thread_timer ? limit > 0 : __atomic_load_n(&thread_timer->ms, __ATOMIC_RELAXED) != limit)
    cpu_timer_period(limit);
  if (sigsetjmp(g.jb, 0)) {
    current = outer;
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
  if (!outer) calls++;
  __atomic_signal_fence(__ATOMIC_SEQ_CST); /* a tick that sees this call sees its number */
  current = &g;
  int rc = fn(arg);
  current = outer;
  return rc;
}
