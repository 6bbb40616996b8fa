/* sources/lmdb/guard.h: runs LMDB's reading of a data set so that a fault
 * inside it (SIGBUS or SIGSEGV from a damaged or cut-short file, or one of
 * LMDB's internal assertions) comes back as an error instead of ending the
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

/* For mdb_env_set_assert: inside a guarded call, leaves it with LMDB's
 * message (outside one, LMDB aborts as it would anyway). */
void stoke_lmdb_on_assert(MDB_env *env, const char *msg);

#endif
