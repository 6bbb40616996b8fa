/* core/run_signals.c: Ctrl-C and SIGTERM during a run, and SIGXFSZ ignored
 * so that a write past the file-size limit fails with a message. */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "run_state.h"

/* From the step loop to the end of the run: the first signal stops the
 * run at the next micro-batch, loader wait or evaluation batch (a partly
 * accumulated step is dropped; a resume redoes it), which saves and exits
 * 0; the second is told the save is under way; the third ends the process
 * at once (the previous checkpoint, written atomically, stays).
 * SA_RESTART: a signal does not fail the run's file writes. */
volatile sig_atomic_t stoke_stop_signal;
static volatile sig_atomic_t n_signals;

static void say(const char *msg, size_t n) {
  ssize_t k = write(2, msg, n);
  (void)k;
}
#define SAY(lit) say(lit, sizeof lit - 1)

static void on_signal(int sig) {
  stoke_stop_signal = sig;
  if (++n_signals == 1)
    SAY("\nstoke: stopping at the next micro-batch to save a checkpoint (twice more quits at once without saving)\n");
  else if (n_signals == 2)
    SAY("\nstoke: still stopping and saving; once more quits at once without saving (the previous checkpoint stays)\n");
  else {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

static const int guarded_signals[3] = {SIGINT, SIGTERM, SIGXFSZ};

static void sig_set(sig_guard *g, int i, void (*handler)(int)) {
  struct sigaction sa = {0};
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigaction(guarded_signals[i], &sa, g->on[i] ? NULL : &g->old[i]);
  g->on[i] = 1;
}

/* A signal from an earlier run in this process is not for this one. */
void run_signals_reset(void) { stoke_stop_signal = n_signals = 0; }

void run_signals_ignore_xfsz(sig_guard *g) { sig_set(g, 2, SIG_IGN); }

void run_signals_catch(sig_guard *g) {
  run_signals_reset();
  sig_set(g, 0, on_signal);
  sig_set(g, 1, on_signal);
}

void run_signals_restore(sig_guard *g) {
  for (int i = 0; i < 3; i++)
    if (g->on[i]) sigaction(guarded_signals[i], &g->old[i], NULL);
  memset(g, 0, sizeof *g);
}

int run_stop_now(const run_state *s) { return stoke_stop_signal && !s->dp; }
