/* sources/tokens: llm.c token shards (sources/tokens/shard.h) from a file, a
 * folder of *.bin files or a glob, memory-mapped. A sample is a window of
 * seq_len + 1 consecutive tokens of one shard, as i32 (the model reads the
 * first seq_len, the loss the last seq_len): at a seeded random offset
 * (training), or the consecutive windows in order (evaluation). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard.h"
#include "stoke/plugin.h"
#include "stoke/rng.h"

const stoke_host_v1 *stoke_host;

static const stoke_cfg_key_v1 keys[] = {
    {"path", STOKE_CFG_STR, "", 0, 0, NULL,
     "llm.c token shards: one file, a folder (its *.bin files, in name order) or a glob such as "
     "data/fineweb_train_*.bin; tools/convert text writes them"},
    {"seq_len", STOKE_CFG_INT, "1024", 1, 1 << 24, NULL,
     "T: a sample is T + 1 consecutive tokens, the model's input and its next-token targets"},
    {"order", STOKE_CFG_ENUM, "random", 0, 0, "random|sequential",
     "random: each sample a window at an offset drawn from the run's seed (training); sequential: the "
     "consecutive windows, every token once (evaluation); with `length` below their count, that many spread evenly "
     "over the whole set"},
    {"vocab", STOKE_CFG_INT, "50257", 1, 65536, NULL,
     "token ids are below this (GPT-2's BPE: 50257; byte-level: 256); a larger id is a data error naming "
     "the shard"},
    {"length", STOKE_CFG_INT, "0", 0, 1e15, NULL,
     "samples per epoch (0: the number of consecutive windows, one pass over the tokens)"},
};

typedef struct shard {
  char *path;
  const unsigned char *map;
  size_t bytes;
  int64_t tokens;
  int64_t starts_before;  /* window starts (random order) in the shards before this one */
  int64_t windows_before; /* consecutive windows (sequential order) in the shards before */
} shard;

typedef struct tok_src {
  shard *s;
  int n;
  int64_t seq_len, vocab, length, starts, windows;
  int sequential;
} tok_src;

static void tok_close(void *self) {
  tok_src *t = self;
  if (!t) return;
  for (int i = 0; i < t->n; i++) {
    if (t->s[i].map) munmap((void *)t->s[i].map, t->s[i].bytes);
    free(t->s[i].path);
  }
  free(t->s);
  free(t);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && !strcmp(s + a - b, tail);
}

/* The shard paths `path` names, sorted: the file, the folder's *.bin
 * files, or the glob's matches; *folder: which it was. */
static stoke_err *list_paths(const char *path, const char *where, char ***out, int *n, int *folder) {
  struct stat st;
  *out = NULL;
  *n = 0;
  *folder = 0;
  if (!path[0]) return STOKE_PERR(STOKE_E_INVALID, "%s: tokens: path is empty; name a shard, a folder or a glob", where);
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    *folder = 1;
    DIR *d = opendir(path);
    if (!d) return STOKE_PERR(STOKE_E_IO, "%s: tokens: cannot open folder '%s': %s", where, path, strerror(errno));
    char **list = NULL;
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
      if (!ends_with(e->d_name, ".bin")) continue;
      if (*n == cap) {
        char **nl = realloc(list, sizeof *nl * (size_t)(cap = cap ? 2 * cap : 16));
        if (!nl) break;
        list = nl;
      }
      if (asprintf(&list[*n], "%s/%s", path, e->d_name) < 0) break;
      (*n)++;
    }
    closedir(d);
    qsort(list, (size_t)*n, sizeof *list, by_name);
    *out = list;
    if (!*n) return STOKE_PERR(STOKE_E_NOT_FOUND, "%s: tokens: folder '%s' has no *.bin shards", where, path);
    return NULL;
  }
  glob_t g;
  int rc = glob(path, 0, NULL, &g); /* a plain file matches itself */
  if (rc) {
    if (rc != GLOB_NOMATCH) return STOKE_PERR(STOKE_E_IO, "%s: tokens: cannot expand '%s'", where, path);
    return STOKE_PERR(STOKE_E_NOT_FOUND, "%s: tokens: no file matches '%s' (make shards with tools/convert text)", where,
                      path);
  }
  *out = calloc(g.gl_pathc, sizeof **out);
  for (size_t i = 0; *out && i < g.gl_pathc; i++) (*out)[(*n)++] = strdup(g.gl_pathv[i]);
  globfree(&g);
  return *out ? NULL : STOKE_PERR(STOKE_E_OOM, "tokens: out of memory");
}

/* tools/convert text writes PREFIX_train_* and PREFIX_val_* side by side:
 * a folder or a glob that takes both mixes the held-out text into the data
 * (refused), and training on the validation shards alone is said. */
static stoke_err *check_split(const char *sec, const char *path, int folder, const char *where, char **list, int n) {
  int train = 0, val = 0;
  for (int i = 0; i < n; i++) {
    const char *base = strrchr(list[i], '/') ? strrchr(list[i], '/') + 1 : list[i];
    train += strstr(base, "_train_") != NULL, val += strstr(base, "_val_") != NULL;
  }
  if (train && val)
    return STOKE_PERR(STOKE_E_INVALID,
                      "%s: tokens: %s '%s' takes %d training (*_train_*) and %d validation (*_val_*) shards, as "
                      "tools/convert text writes them: it would mix the two; name one set, e.g. path = "
                      "PREFIX_train_*.bin (and [eval_data] path = PREFIX_val_*.bin)",
                      where, folder ? "folder" : "the pattern", path, train, val);
  if (val && !strcmp(sec, "data"))
    stoke_host->log(STOKE_LOG_WARN, "tokens",
                    "%s: [data] path '%s' reads %d validation shard%s (*_val_*) only: the held-out text trains the "
                    "model, and an evaluation on it measures memory, not generalization; train on the *_train_* "
                    "shards", where, path, val, val == 1 ? "" : "s");
  return NULL;
}

/* Map one shard and check its header and size against the file. */
static stoke_err *map_shard(shard *s) {
  /* O_NONBLOCK: a FIFO's open would wait for a writer forever; it is refused below */
  int fd = open(s->path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) return STOKE_PERR(STOKE_E_IO, "tokens: cannot open '%s': %s", s->path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    close(fd);
    return STOKE_PERR(STOKE_E_IO, "tokens: cannot stat '%s': %s", s->path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return STOKE_PERR(STOKE_E_DATA, "tokens: '%s' is not a regular file (a %s): a token shard must be one", s->path,
                      S_ISDIR(st.st_mode) ? "folder" : S_ISFIFO(st.st_mode) ? "FIFO" : "device or socket");
  }
  s->bytes = (size_t)st.st_size;
  void *m = s->bytes ? mmap(NULL, s->bytes, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  close(fd);
  if (m == MAP_FAILED) {
    s->bytes = 0;
    if (!st.st_size) return STOKE_PERR(STOKE_E_DATA, "tokens: '%s': an empty file, not an llm.c token shard", s->path);
    return STOKE_PERR(STOKE_E_IO, "tokens: cannot map '%s': %s", s->path, strerror(errno));
  }
  s->map = m;
  madvise(m, s->bytes, MADV_RANDOM);
  char why[256];
  if (stoke_shard_parse(s->map, s->bytes, &s->tokens, why, sizeof why))
    return STOKE_PERR(STOKE_E_DATA, "tokens: '%s': %s", s->path, why);
  return NULL;
}

/* Open every shard; those shorter than one window are skipped, with a
 * warning, and none left is an error. */
static stoke_err *open_shards(tok_src *t, char **paths, int n) {
  t->s = calloc((size_t)n, sizeof *t->s);
  if (!t->s) return STOKE_PERR(STOKE_E_OOM, "tokens: out of memory");
  for (int i = 0; i < n; i++) {
    shard *s = &t->s[t->n++];
    s->path = paths[i];
    paths[i] = NULL;
    STOKE_PROPAGATE_P(map_shard(s));
    if (s->tokens < t->seq_len + 1) {
      stoke_host->log(STOKE_LOG_WARN, "tokens", "'%s': %lld tokens, fewer than one window of seq_len + 1 = %lld; skipped",
                      s->path, (long long)s->tokens, (long long)(t->seq_len + 1));
      munmap((void *)s->map, s->bytes);
      free(s->path);
      memset(s, 0, sizeof *s);
      t->n--;
      continue;
    }
    s->starts_before = t->starts;
    s->windows_before = t->windows;
    t->starts += s->tokens - t->seq_len;
    t->windows += (s->tokens - 1) / t->seq_len;
  }
  if (!t->n)
    return STOKE_PERR(STOKE_E_DATA, "tokens: no shard holds a window of seq_len + 1 = %lld tokens",
                      (long long)(t->seq_len + 1));
  int64_t tokens = 0;
  for (int i = 0; i < t->n; i++) tokens += t->s[i].tokens;
  stoke_host->log(STOKE_LOG_INFO, "tokens", "%d shard%s, %lld tokens: %s%s%s", t->n, t->n == 1 ? "" : "s",
                  (long long)tokens, t->s[0].path, t->n > 1 ? " ... " : "", t->n > 1 ? t->s[t->n - 1].path : "");
  return NULL;
}

static stoke_err *tok_open(const stoke_cfg *c, const char *sec, void **self) {
  tok_src *t = calloc(1, sizeof *t);
  if (!t) return STOKE_PERR(STOKE_E_OOM, "tokens: out of memory");
  const char *path = NULL, *order = NULL;
  char **paths = NULL;
  int n = 0;
  stoke_err *e = stoke_host->cfg_str(c, sec, "path", &path);
  if (!e) e = stoke_host->cfg_str(c, sec, "order", &order);
  if (!e) e = stoke_host->cfg_int(c, sec, "seq_len", &t->seq_len);
  if (!e) e = stoke_host->cfg_int(c, sec, "vocab", &t->vocab);
  if (!e) e = stoke_host->cfg_int(c, sec, "length", &t->length);
  int folder = 0;
  if (!e) e = list_paths(path, stoke_host->cfg_where(c, sec, "path"), &paths, &n, &folder);
  if (!e) e = check_split(sec, path, folder, stoke_host->cfg_where(c, sec, "path"), paths, n);
  if (!e) e = open_shards(t, paths, n);
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
  if (e) {
    tok_close(t);
    return e;
  }
  t->sequential = !strcmp(order, "sequential");
  if (!t->length) t->length = t->windows;
  if (t->sequential && t->length > t->windows)
    stoke_host->log(STOKE_LOG_WARN, "tokens", "[%s] length %lld > the %lld consecutive windows: they repeat", sec,
                    (long long)t->length, (long long)t->windows);
  *self = t;
  return NULL;
}

static int64_t tok_length(void *self) { return ((tok_src *)self)->length; }

static stoke_err *tok_info(void *self, stoke_sample_info_v1 *out) {
  tok_src *t = self;
  memset(out, 0, sizeof *out);
  out->shape = (stoke_shape){1, {t->seq_len + 1}};
  out->dtype = STOKE_I32;
  out->layout = STOKE_LAYOUT_ANY;
  out->classes = t->vocab;
  return NULL;
}

/* The shard holding position `at` of a running count (starts or windows). */
static const shard *find_shard(const tok_src *t, int64_t at, int windows) {
  int lo = 0, hi = t->n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if ((windows ? t->s[mid].windows_before : t->s[mid].starts_before) <= at) lo = mid;
    else hi = mid - 1;
  }
  return &t->s[lo];
}

static stoke_err *tok_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  tok_src *t = self;
  if (index < 0 || index >= t->length)
    return STOKE_PERR(STOKE_E_INVALID, "tokens: index %lld outside [0, %lld)", (long long)index, (long long)t->length);
  const shard *s;
  int64_t at;
  if (t->sequential) {
    /* fewer samples than windows (an evaluation's `length`): spread evenly over the whole set, so the estimate
     * covers every document, not the first ones (the first 256 windows of fortunes were its ASCII art) */
    int64_t w = t->length < t->windows ? (int64_t)((__int128)index * t->windows / t->length) : index % t->windows;
    s = find_shard(t, w, 1);
    at = (w - s->windows_before) * t->seq_len;
  } else {
    stoke_rng r = stoke_rng_seed(seed);
    int64_t u = (int64_t)stoke_rng_below(&r, (uint64_t)t->starts);
    s = find_shard(t, u, 0);
    at = u - s->starts_before;
  }
  const unsigned char *p = s->map + STOKE_SHARD_HEADER_BYTES + 2 * at;
  int32_t *out = dst;
  for (int64_t i = 0; i <= t->seq_len; i++) {
    out[i] = (int32_t)(p[2 * i] | p[2 * i + 1] << 8);
    if (out[i] >= t->vocab)
      return STOKE_PERR(STOKE_E_DATA, "tokens: '%s': token %d at position %lld is not below vocab = %lld (a shard of "
                                      "another tokenizer?)",
                        s->path, out[i], (long long)(at + i), (long long)t->vocab);
  }
  *label = 0; /* the targets are the window's own next tokens */
  return NULL;
}

static const stoke_source_v1 source = {
    STOKE_ABI(stoke_source_v1), "tokens", "llm.c token shards (memory-mapped): windows of seq_len + 1 tokens for language models",
    keys, sizeof keys / sizeof *keys, tok_open, tok_close, tok_length, tok_info, tok_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  return r->add_source(r->self, &source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "tokens", "llm.c token-shard data source", reg};
