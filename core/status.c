/* core/status.c: errors with context chains, the logger, aligned host
 * memory, and the host-services table handed to plugins. */
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

#include "stoke/config.h"
#include "stoke/core.h"

static char *vformat(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  char *s = malloc((size_t)n + 1);
  if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

/* Out of memory while reporting an error: a static error stands in. */
static stoke_err oom_err = {STOKE_E_OOM, "out of memory while reporting an error"};

static stoke_err *err_vnew(stoke_code code, const char *file, int line,
                           const char *fmt, va_list ap) {
  (void)file; (void)line;
  stoke_err *e = malloc(sizeof *e);
  if (!e) return &oom_err;
  e->code = code;
  e->msg = vformat(fmt, ap);
  if (!e->msg) { free(e); return &oom_err; }
  return e;
}

stoke_err *stoke_err_new(stoke_code code, const char *file, int line,
                         const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  stoke_err *e = err_vnew(code, file, line, fmt, ap);
  va_end(ap);
  return e;
}

/* Strip the build-tree prefix so messages show "core/graph.c:12". */
static const char *short_path(const char *file) {
  const char *marks[] = {"core/", "backends/", "sources/", "models/", "plugins/", "tools/", "tests/"};
  const char *best = NULL;
  for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
    const char *p = strstr(file, marks[i]);
    if (p && (!best || p < best)) best = p;
  }
  return best ? best : file;
}

static stoke_err *err_vwrap(stoke_err *e, const char *file, int line,
                            const char *fmt, va_list ap) {
  if (!e || e == &oom_err) return e;
  char *ctx = vformat(fmt, ap);
  if (!ctx) return e;
  if (ctx[0]) {
    size_t n = strlen(e->msg) + strlen(ctx) + strlen(file) + 48;
    char *m = malloc(n);
    if (m) {
      snprintf(m, n, "%s\n  while %s (%s:%d)", e->msg, ctx, short_path(file), line);
      free(e->msg);
      e->msg = m;
    }
  }
  free(ctx);
  return e;
}

stoke_err *stoke_err_wrap(stoke_err *e, const char *file, int line,
                          const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  e = err_vwrap(e, file, line, fmt, ap);
  va_end(ap);
  return e;
}

stoke_err *stoke_err_note(stoke_err *e, const char *fmt, ...) {
  if (!e || e == &oom_err) return e;
  va_list ap;
  va_start(ap, fmt);
  char *note = vformat(fmt, ap);
  va_end(ap);
  if (!note) return e;
  size_t n = strlen(e->msg) + strlen(note) + 4;
  char *m = malloc(n);
  if (m) {
    snprintf(m, n, "%s\n  %s", e->msg, note);
    free(e->msg);
    e->msg = m;
  }
  free(note);
  return e;
}

void stoke_err_free(stoke_err *e) {
  if (!e || e == &oom_err) return;
  free(e->msg);
  free(e);
}

const char *stoke_code_name(stoke_code c) {
  static const char *names[] = {"ok", "invalid", "not found", "i/o", "abi",
                                "duplicate", "unsupported", "out of memory",
                                "device", "data", "numeric", "interrupted",
                                "internal"};
  return (unsigned)c < sizeof names / sizeof *names ? names[c] : "unknown";
}

/* ------------------------------------------------------------- logging */

static stoke_log_level log_level = STOKE_LOG_INFO;
static FILE *log_file;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_env_once = PTHREAD_ONCE_INIT;

/* STOKE_LOG=debug|warn, read once (loader threads log concurrently) */
static void log_level_from_env(void) {
  const char *env = getenv("STOKE_LOG");
  if (env && !strcmp(env, "debug")) log_level = STOKE_LOG_DEBUG;
  if (env && !strcmp(env, "warn")) log_level = STOKE_LOG_WARN;
}

void stoke_log_set_level(stoke_log_level level) {
  pthread_once(&log_env_once, log_level_from_env);
  log_level = level;
}
void stoke_log_set_file(FILE *f) { log_file = f; }

void stoke_log(stoke_log_level level, const char *who, const char *fmt, ...) {
  pthread_once(&log_env_once, log_level_from_env);
  if (level < log_level) return;
  static const char *tag[] = {"debug", "info", "warning", "error"};
  va_list ap;
  va_start(ap, fmt);
  char *msg = vformat(fmt, ap);
  va_end(ap);
  if (!msg) return;
  pthread_mutex_lock(&log_mu);
  fprintf(stderr, "stoke %s [%s]: %s\n", tag[level], who ? who : "core", msg);
  if (log_file) {
    fprintf(log_file, "%s [%s]: %s\n", tag[level], who ? who : "core", msg);
    fflush(log_file);
  }
  pthread_mutex_unlock(&log_mu);
  free(msg);
}

/* -------------------------------------------------------------- memory */

void *stoke_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes > SIZE_MAX - 63) return NULL; /* rounding up would wrap to a tiny buffer */
  size_t n = (bytes + 63) / 64 * 64;
  if (n == 0) n = 64;
  if (posix_memalign(&p, 64, n)) return NULL;
  return p;
}

void stoke_free(void *p) { free(p); }

/* ---------------------------------------------------------- host table */

static const stoke_host_v1 host_table = {
    .abi_version = STOKE_ABI_VERSION,
    .struct_size = sizeof(stoke_host_v1),
    .log = stoke_log,
    .err_new = stoke_err_new,
    .err_wrap = stoke_err_wrap,
    .err_free = stoke_err_free,
    .alloc = stoke_alloc,
    .free = stoke_free,
    .cfg_int = stoke_cfg_int,
    .cfg_float = stoke_cfg_float,
    .cfg_bool = stoke_cfg_bool,
    .cfg_str = stoke_cfg_str,
    .cfg_ints = stoke_cfg_ints,
    .cfg_where = stoke_cfg_where,
    .cfg_list = stoke_cfg_list,
};

const stoke_host_v1 *stoke_host_table(void) { return &host_table; }
