/* sources/lmdb/guard.h: runs LMDB's reading of a data set so that a fault
 * inside it (SIGBUS or SIGSEGV from a damaged or cut-short file, one of
 * LMDB's internal assertions, or a loop: a call that runs past its CPU
 * time limit) comes back as an error instead of ending or hanging the
 * process. */
#ifndef STOKE_LMDB_GUARD_H
#define STOKE_LMDB_GUARD_H

#include <stddef.h>

#include <lmdb.h>

/* Installs the fault handlers for the first user (an open data set) and
 * puts the previous ones back after the last one. */
void stoke_lmdb_guard_retain(void);
void stoke_lmdb_guard_release(void);

/* fn(arg), guarded: its return value, or -1 after a fault, with what
 * happened in `why` (cap bytes). Memory fn allocated before a fault is
 * not freed: a fault means a damaged file, which stops the run. */
int stoke_lmdb_guarded(int (*fn)(void *), void *arg, char *why, size_t cap);

/* The CPU time one guarded call may use (its thread's, so waiting on the
 * disk does not count) before it is stopped as a loop: it is stopped
 * between one and two times `ms` (a timer ticks every `ms` of each
 * guarded thread's CPU time); 10 s unless set. One record's fetch and
 * decode takes milliseconds, but a damaged page can send LMDB's binary
 * search round forever (a page header counting fewer than zero keys).
 * <= 0: no limit. */
void stoke_lmdb_guard_set_cpu_limit_ms(long ms);

/* Inside a long guarded call that works through many records (the open's
 * scan of every key: about 8 us of CPU a record on a cold cache, so 10 s
 * by 1.2 million records, ImageNet's size): one record done. The CPU time
 * limit then counts from the last record, not from the call's start, so
 * only a single record that loops is stopped. Outside a guarded call it
 * does nothing. */
void stoke_lmdb_guard_progress(void);

/* For mdb_env_set_assert: inside a guarded call, leaves it with LMDB's
 * message (outside one, LMDB aborts as it would anyway). */
void stoke_lmdb_on_assert(MDB_env *env, const char *msg);

#endif
