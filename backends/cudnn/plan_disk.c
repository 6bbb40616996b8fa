/* backends/cudnn/plan_disk.c: autotune's choices kept across runs.
 *
 * With conv_autotune each convolution problem times up to 12 of cuDNN's
 * engine configurations (graph.c's choose_plan), as cudnn.benchmark does:
 * about a minute for ResNet-50 at its start, again in every run and in
 * every round of a tools/bench A/B. The choice depends only on the problem,
 * the device and cuDNN, so it is written to a small text file and the next
 * run builds that one configuration instead of timing them all. A line:
 *
 *   stoke-cudnn-plan 1 KEY INDEX ENGINE MS
 *
 * KEY is a 64-bit FNV-1a hash (hex) of the device's name, compute
 * capability and SM count, cuDNN's version, the problem's key bytes (the
 * graph's geometry, dtype, layout, kind, beta) and the choice's flags;
 * INDEX the configuration's place in cuDNN's heuristic list (instant then
 * fallback mode), ENGINE its engine id, checked again when the plan is
 * built (a configuration that moved is timed afresh), MS its time. Lines
 * are appended with one write each (O_APPEND: whole lines also when data
 * parallel ranks write at once); the last line of a key wins; a line that
 * does not parse is skipped. Nothing here fails a run: a file that cannot
 * be read or written means timing as before, said once.
 *
 * Where: STOKE_CUDNN_PLAN_CACHE names the file ("off" turns it off);
 * without it, $XDG_CACHE_HOME/stoke/cudnn-plans.txt, else
 * ~/.cache/stoke/cudnn-plans.txt. Written by this file because no library
 * Debian packages does it and cuDNN keeps no such cache itself. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph.h"

typedef struct disk_entry {
  uint64_t key;
  cg_disk_choice c;
} disk_entry;

struct cg_disk {
  int enabled;
  char path[1024];
  disk_entry *e;
  int n, cap;
  int warned;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

uint64_t cg_disk_key(const cudnn_engine *eng, const void *key, size_t key_bytes, const cg_choice *c) {
  uint64_t h = 14695981039346656037ull;
  static const char tag[] = "stoke-cudnn-plan 1";
  h = fnv(h, tag, sizeof tag);
  if (eng->dev) {
    h = fnv(h, eng->dev->name, strnlen(eng->dev->name, sizeof eng->dev->name));
    int dev[3] = {eng->dev->cc_major, eng->dev->cc_minor, eng->dev->sm_count};
    h = fnv(h, dev, sizeof dev);
  }
  size_t ver = cudnnGetVersion();
  h = fnv(h, &ver, sizeof ver);
  h = fnv(h, key, key_bytes);
  int flags[5] = {c->autotune, c->deterministic, c->no_tf32, c->allow_lossy, c->max_candidates};
  return fnv(h, flags, sizeof flags);
}

static int add(struct cg_disk *d, uint64_t key, const cg_disk_choice *c) {
  for (int i = 0; i < d->n; i++)
    if (d->e[i].key == key) {
      d->e[i].c = *c;
      return 0;
    }
  if (d->n == d->cap) {
    int cap = d->cap ? 2 * d->cap : 64;
    disk_entry *ne = realloc(d->e, sizeof *ne * (size_t)cap);
    if (!ne) return -1;
    d->e = ne, d->cap = cap;
  }
  d->e[d->n++] = (disk_entry){key, *c};
  return 0;
}

/* mkdir -p of the file's folder (each missing level, 0755) */
static void make_dirs(const char *path) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return;
  *slash = 0;
  for (char *p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(dir, 0755);
      *p = '/';
    }
  mkdir(dir, 0755);
}

static struct cg_disk *disk_of(cudnn_engine *eng) {
  if (eng->disk) return eng->disk;
  struct cg_disk *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  eng->disk = d;
  const char *env = getenv("STOKE_CUDNN_PLAN_CACHE");
  if (env && (!*env || !strcmp(env, "off") || !strcmp(env, "0"))) return d;
  if (env) snprintf(d->path, sizeof d->path, "%s", env);
  else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
    snprintf(d->path, sizeof d->path, "%s/stoke/cudnn-plans.txt", getenv("XDG_CACHE_HOME"));
  else if (getenv("HOME") && *getenv("HOME"))
    snprintf(d->path, sizeof d->path, "%s/.cache/stoke/cudnn-plans.txt", getenv("HOME"));
  else return d;
  d->enabled = 1;
  FILE *f = fopen(d->path, "r");
  if (!f) return d; /* none yet */
  char line[256];
  while (fgets(line, sizeof line, f)) {
    unsigned long long key;
    long long engine;
    int index;
    float ms;
    if (sscanf(line, "stoke-cudnn-plan 1 %llx %d %lld %f", &key, &index, &engine, &ms) == 4 && index >= 0)
      add(d, (uint64_t)key, &(cg_disk_choice){index, engine, ms});
  }
  fclose(f);
  return d;
}

const char *cg_disk_path(cudnn_engine *eng) {
  struct cg_disk *d = disk_of(eng);
  return d && d->enabled ? d->path : NULL;
}

int cg_disk_find(cudnn_engine *eng, uint64_t key, cg_disk_choice *out) {
  struct cg_disk *d = disk_of(eng);
  if (!d || !d->enabled) return 0;
  for (int i = 0; i < d->n; i++)
    if (d->e[i].key == key) {
      *out = d->e[i].c;
      return 1;
    }
  return 0;
}

void cg_disk_put(cudnn_engine *eng, uint64_t key, const cg_disk_choice *c) {
  struct cg_disk *d = disk_of(eng);
  if (!d || !d->enabled) return;
  add(d, key, c);
  char line[160];
  int n = snprintf(line, sizeof line, "stoke-cudnn-plan 1 %016llx %d %lld %.4f\n", (unsigned long long)key, c->index,
                   (long long)c->engine_id, (double)c->ms);
  make_dirs(d->path);
  int fd = open(d->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  ssize_t w = fd >= 0 ? write(fd, line, (size_t)n) : -1;
  int err = errno;
  if (fd >= 0) close(fd);
  if (w != n && !d->warned) {
    d->warned = 1;
    stoke_host->log(STOKE_LOG_WARN, "cudnn",
                    "cannot write the plan cache %s (%s): autotune's choices are not kept for the next run "
                    "(STOKE_CUDNN_PLAN_CACHE names another file, or off)",
                    d->path, w < 0 ? strerror(err) : "short write");
  }
}

void cg_disk_free(cudnn_engine *eng) {
  struct cg_disk *d = eng->disk;
  if (!d) return;
  free(d->e);
  free(d);
  eng->disk = NULL;
}
