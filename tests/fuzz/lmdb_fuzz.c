/* tests/fuzz/lmdb_fuzz.c: fuzz target of a whole LMDB data set: the bytes
 * are a data.mdb, written into a folder of its own and opened by the lmdb
 * source as a run opens it (sources/lmdb/lmdb.c linked in and registered
 * through the core: the checks of the file before LMDB sees it, LMDB's
 * open, the layout read under guard.c), then every record read and decoded
 * as the loader reads them. LMDB trusts its file; what this target checks
 * is that the source's checks and the guard turn every damaged file into
 * an error, never a crash, a hang or a sanitizer report. LMDB itself is
 * Debian's liblmdb.a, the library the plugin ships with (not instrumented:
 * coverage guides through the source's code, not LMDB's). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/registry.h"
#include "sources/lmdb/guard.h"

extern const stoke_plugin_v1 stoke_plugin_v1_entry; /* sources/lmdb/lmdb.c */

/* The plugin's shared object binds LMDB's `stderr` through
 * sources/lmdb/stderr_shim.c; linked into an executable, LMDB uses the C
 * library's own, so there is nothing to set up. */
void stoke_lmdb_stderr_init(void) {}

#define MAX_SAMPLE_BYTES (16u << 20) /* the loader's batch buffers hold samples of the declared size */
#define MAX_READS 4096               /* records read per input (the metadata may declare billions) */

static char dir[4096], file[4200], lock[4200];
static stoke_registry *reg;
static const stoke_source_v1 *src;
static stoke_cfg *cfg;

static void drop(stoke_err *e) {
  if (e) stoke_err_free(e);
}

static void cleanup(void) {
  if (cfg) stoke_cfg_free(cfg);
  if (reg) stoke_registry_free(reg);
  unlink(file);
  unlink(lock);
  rmdir(dir);
}

static void must(stoke_err *e) {
  if (!e) return;
  fprintf(stderr, "lmdb_fuzz: setup failed: %s\n", e->msg);
  abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *t = getenv("TEST_TMPDIR");
  if (!t) t = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/stoke-lmdb-fuzz-XXXXXX", t ? t : "/tmp");
  if (!mkdtemp(dir)) {
    perror("lmdb_fuzz: mkdtemp");
    abort();
  }
  snprintf(file, sizeof file, "%s/data.mdb", dir);
  snprintf(lock, sizeof lock, "%s/lock.mdb", dir);
  atexit(cleanup);
  stoke_log_set_level(STOKE_LOG_ERROR); /* a warning per damaged input would cost more than the input */
  /* a loop inside LMDB (a damaged page) is stopped well before libFuzzer's
   * timeout would call it a hang; a whole input takes milliseconds under
   * ASan, and the fuzzer finds many such loops */
  stoke_lmdb_guard_set_cpu_limit_ms(50);
  must(stoke_registry_new(&reg));
  must(stoke_registry_add_plugin(reg, &stoke_plugin_v1_entry, "sources/lmdb/lmdb.c (linked in)"));
  src = stoke_find_source(reg, "lmdb");
  if (!src) must(STOKE_ERR(STOKE_E_NOT_FOUND, "no source 'lmdb' after registering sources/lmdb/lmdb.c"));
  cfg = stoke_cfg_new();
  must(stoke_cfg_declare(cfg, "data", NULL, src->keys, src->n_keys));
  char ini[4400];
  snprintf(ini, sizeof ini, "[data]\npath = %s\nmax_readers = 4\n", dir);
  must(stoke_cfg_load_string(cfg, "fuzz.ini", ini));
  must(stoke_cfg_validate(cfg));
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, data, size) != (ssize_t)size) {
    perror("lmdb_fuzz: writing data.mdb");
    abort();
  }
  close(fd);
  void *self = NULL;
  stoke_err *e = src->open(cfg, "data", &self);
  if (e) {
    drop(e);
    return 0;
  }
  stoke_sample_info_v1 info;
  drop(src->info(self, &info));
  uint64_t bytes = 1;
  for (int d = 0; d < info.shape.ndim; d++) bytes *= (uint64_t)info.shape.d[d];
  int64_t n = src->length(self);
  uint8_t *px = bytes <= MAX_SAMPLE_BYTES ? malloc(bytes ? bytes : 1) : NULL;
  /* as the loader reads: a damaged record (STOKE_E_DATA) is skipped, but
   * 17 in a row or any other error ends the run */
  for (int64_t i = 0, bad = 0; px && i < n && i < MAX_READS && bad < 17; i++) {
    int32_t label; /* its range is the loader's check */
    e = src->read(self, i, (uint64_t)i, px, &label);
    bad = e ? bad + 1 : 0;
    int stop = e && e->code != STOKE_E_DATA;
    drop(e);
    if (stop) break;
  }
  /* and past the end: an error, not a read */
  if (px) drop(src->read(self, n, 0, px, &(int32_t){0}));
  free(px);
  src->close(self);
  return 0;
}
