/* stoke/core.h: host-side helpers shared by the core, tools and tests:
 * error construction and the check macros, logging, aligned memory. */
#ifndef STOKE_CORE_H
#define STOKE_CORE_H

#include <stdio.h>

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

stoke_err *stoke_err_new(stoke_code code, const char *file, int line,
                         const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Adds a "  while <context> (file:line)" line; returns e (NULL stays NULL). */
stoke_err *stoke_err_wrap(stoke_err *e, const char *file, int line,
                          const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Adds a line "  <note>" (what was done about it, what to do); returns e. */
stoke_err *stoke_err_note(stoke_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void stoke_err_free(stoke_err *e);
const char *stoke_code_name(stoke_code c);

#define STOKE_ERR(code, ...) stoke_err_new((code), __FILE__, __LINE__, __VA_ARGS__)
/* Return the error of `expr`, if any, with context added. */
#define STOKE_TRY(expr, ...)                                                 \
  do {                                                                       \
    stoke_err *stoke_e_ = (expr);                                            \
    if (stoke_e_) return stoke_err_wrap(stoke_e_, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
/* Return the error of `expr`, if any, as it is. */
#define STOKE_PROPAGATE(expr)             \
  do {                                    \
    stoke_err *stoke_e_ = (expr);         \
    if (stoke_e_) return stoke_e_;        \
  } while (0)
/* Same, but jump to a cleanup label with the error in `var`. */
#define STOKE_TRY_GOTO(var, label, expr, ...)                                \
  do {                                                                       \
    (var) = (expr);                                                          \
    if (var) { (var) = stoke_err_wrap((var), __FILE__, __LINE__, __VA_ARGS__); goto label; } \
  } while (0)

void stoke_log(stoke_log_level level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Messages below `level` are dropped (default INFO; STOKE_LOG=debug). */
void stoke_log_set_level(stoke_log_level level);
/* Send log lines to `f` too (the run's log file); NULL stops. */
void stoke_log_set_file(FILE *f);

/* 64-byte aligned host memory; NULL when out of memory. */
void *stoke_alloc(size_t bytes);
void stoke_free(void *p);

/* A whole file in memory (read to its end: a pipe too), with a NUL after
 * its *n bytes; free() it. `what` names it in the error ("config",
 * "tokenizer file"): "cannot open config 'path': reason". */
stoke_err *stoke_read_file(const char *path, const char *what, char **buf, size_t *n);

/* A file written whole or not at all (a report, a trace, a benchmark's
 * JSON): stoke_write_begin opens "<path>.tmp" (tmp: cap bytes, at least
 * strlen(path) + 5) for writing; stoke_write_end checks the stream for a
 * write error (a full disk), closes it and renames it over `path`, or,
 * given an error (`e`, already the caller's) or on one of its own, removes
 * it and returns the error. `what` names the file in messages ("report"). */
stoke_err *stoke_write_begin(const char *path, const char *what, char *tmp, size_t cap, FILE **f);
stoke_err *stoke_write_end(FILE *f, const char *tmp, const char *path, const char *what, stoke_err *e);

/* Levenshtein distance, case-insensitive (the did-you-mean of config keys
 * and names); large for very long strings. */
int stoke_edit_distance(const char *a, const char *b);

/* The NaN and infinite values among the n elements of a float array of
 * `dtype` in host memory (exponent bits all ones), and the first one's
 * index in *first (when not NULL and any). 0 for integer dtypes. */
int64_t stoke_count_nonfinite(const void *p, stoke_dtype dtype, int64_t n, int64_t *first);

/* The host-services table handed to plugins. */
const stoke_host_v1 *stoke_host_table(void);

#ifdef __cplusplus
}
#endif
#endif
