/* core/checkpoint.c: checkpoints in the safetensors format (PyTorch
 * state_dict names; optimizer and run state alongside), written atomically,
 * and a strict safetensors reader. The header JSON is small and of one
 * fixed shape, so it is written and parsed here rather than through a JSON
 * library: Debian ships cJSON only as a shared library, and the binaries
 * must run on machines without it. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stoke/checkpoint.h"
#include "stoke/check.h"
#include "stoke/core.h"
#include "stoke/crc32c.h"

/* The metadata keys of the checksums: CRC-32C of each tensor's bytes
 * ("name=8 hex digits;..."), and of every other metadata entry, keys
 * sorted, each key and value followed by a NUL byte. PyTorch's safetensors
 * keeps metadata as strings, so the file stays loadable there. */
#define CRC_KEY "stoke_crc32c"
#define META_CRC_KEY "stoke_meta_crc32c"
#define TENSOR_ORDER_KEY "tensor_order"

/* ------------------------------------------------------------ writing */

typedef struct sbuf {
  char *s;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_put(sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns;
    b->cap = cap;
  }
}

/* A JSON string (the config text has quotes, backslashes, newlines). */
static void sb_json_str(sbuf *b, const char *s) {
  sb_put(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') sb_put(b, "\\%c", c);
    else if (c == '\n') sb_put(b, "\\n");
    else if (c == '\t') sb_put(b, "\\t");
    else if (c < 0x20) sb_put(b, "\\u%04x", c);
    else sb_put(b, "%c", c);
  }
  sb_put(b, "\"");
}

static const char *st_dtype(stoke_dtype t) {
  switch (t) {
    case STOKE_F32: return "F32";
    case STOKE_F16: return "F16";
    case STOKE_BF16: return "BF16";
    case STOKE_I32: return "I32";
    case STOKE_U8: return "U8";
    case STOKE_F64: return "F64";
    default: return "?";
  }
}

/* A safetensors float dtype as stoke's (st_dtype's names read back), or -1 for any other. */
static int st_float(const char *d) {
  static const stoke_dtype floats[] = {STOKE_F32, STOKE_F16, STOKE_BF16, STOKE_F64};
  for (size_t i = 0; i < sizeof floats / sizeof *floats; i++)
    if (!strcmp(d, st_dtype(floats[i]))) return floats[i];
  return -1;
}

/* One tensor of the file: where its bytes are in host memory. */
typedef struct entry {
  char name[128];
  const char *dtype;
  stoke_shape shape;
  const void *src;
  size_t bytes;
  /* a parameter (under each of its names) or its master copy: which
   * parameter, for loading across precisions; 0 / NULL for the rest */
  enum { ENT_OTHER, ENT_PARAM, ENT_MASTER } role;
  const stoke_value *param;
} entry;

/* An optimizer tensor's name, as torch.optim's state_dict and the master
 * copy: "optimizer.<parameter>.<state>". */
static void opt_name(char *out, size_t cap, const stoke_value *param, const char *state) {
  snprintf(out, cap, "optimizer.%.80s.%s", param->name, state);
}

static int is_opt_kind(const stoke_value *v) { return v->kind == STOKE_VAL_PARAM; }

/* Where an entry's bytes are: host buffer `b` (0 params, 1 state, 2
 * optimizer state) at `off`; NULL without host buffers (sizes only). */
static const void *at(void *const *hb, int b, size_t off) { return hb ? (const char *)hb[b] + off : NULL; }

/* Every tensor of a checkpoint of this plan, in a fixed order; host
 * copies of the device buffers are made by the caller. `hb` holds host
 * pointers for params, state and optimizer state (NULL: only names and
 * sizes are wanted). `out` comes zeroed (callers calloc it): what an entry
 * does not set stays ENT_OTHER / NULL. */
static int list_entries(const stoke_plan *p, void *const *hb, const char *opt, int64_t nbt,
                        int64_t *nbt_store, entry *out, int cap) {
  const stoke_graph *g = p->g;
  int n = 0;
  for (int v = 0; v < g->n_values && n < cap; v++) {
    const stoke_value *val = &g->values[v];
    if (val->kind != STOKE_VAL_PARAM && val->kind != STOKE_VAL_STATE) continue;
    int b = val->kind == STOKE_VAL_PARAM ? 0 : 1;
    entry *e = &out[n++];
    snprintf(e->name, sizeof e->name, "%s", val->name);
    e->dtype = st_dtype(val->dtype);
    e->shape = val->shape;
    e->src = at(hb, b, val->offset);
    e->bytes = (size_t)stoke_numel(&val->shape) * stoke_dtype_size(val->dtype);
    if (val->kind == STOKE_VAL_PARAM) e->role = ENT_PARAM, e->param = val;
    /* a tied parameter again under each other name (PyTorch's state_dict
     * lists it under each) */
    for (int t = 0; t < g->n_tied && n < cap; t++)
      if (g->tied[t].value == v) {
        out[n] = *e;
        snprintf(out[n++].name, sizeof e->name, "%s", g->tied[t].name);
      }
    /* PyTorch's BatchNorm also keeps num_batches_tracked (int64, 0-d) */
    size_t len = strlen(val->name);
    if (val->kind == STOKE_VAL_STATE && len > 13 && !strcmp(val->name + len - 13, ".running_mean") &&
        n < cap) {
      entry *t = &out[n++];
      snprintf(t->name, sizeof t->name, "%.*s.num_batches_tracked", (int)(len - 13), val->name);
      t->dtype = "I64";
      t->shape.ndim = 0;
      *nbt_store = nbt;
      t->src = nbt_store;
      t->bytes = sizeof(int64_t);
    }
  }
  if (!opt || !p->opt_kernel || !p->opt_state_bytes || (hb && !hb[2])) return n;
  /* the state in the master dtype: the master copy of the flat parameter
   * buffer first (has_master), then each of the optimizer's tensors over
   * the flat buffer, named as torch.optim's state_dict; element i of a
   * parameter is at offset / es + i of each */
  size_t es = stoke_dtype_size(g->dtype), flat = p->bytes[STOKE_BUF_PARAMS] / es;
  size_t ss = stoke_dtype_size(p->state_dtype);
  for (int k = p->has_master ? -1 : 0; k < p->opt_state_per_param; k++)
    for (int v = 0; v < g->n_values && n < cap; v++) {
      const stoke_value *val = &g->values[v];
      if (!is_opt_kind(val)) continue;
      entry *e = &out[n++];
      opt_name(e->name, sizeof e->name, val, k < 0 ? "master" : p->opt->state_names[k]);
      e->shape = val->shape;
      e->dtype = st_dtype(p->state_dtype);
      e->src = at(hb, 2, ((size_t)(k + p->has_master) * flat + val->offset / es) * ss);
      e->bytes = (size_t)stoke_numel(&val->shape) * ss;
      if (k < 0) e->role = ENT_MASTER, e->param = val;
    }
  return n;
}

static stoke_err *write_all(int fd, const void *p, size_t n, const char *path) {
  const char *c = p;
  while (n) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return STOKE_ERR(STOKE_E_IO, "writing checkpoint '%s': %s", path, strerror(errno));
    c += k;
    n -= (size_t)k;
  }
  return NULL;
}

/* Host copies of the parameter, state and optimizer-state buffers. */
static stoke_err *host_copies(stoke_exec *x, void *hb[3], size_t sizes[3]) {
  stoke_plan *p = stoke_exec_plan(x);
  sizes[0] = p->bytes[STOKE_BUF_PARAMS];
  sizes[1] = p->bytes[STOKE_BUF_STATE];
  sizes[2] = p->opt_kernel ? p->opt_state_bytes : 0;
  void *dev[3] = {stoke_exec_buffer(x, STOKE_BUF_PARAMS), stoke_exec_buffer(x, STOKE_BUF_STATE),
                  stoke_exec_opt_state(x)};
  for (int i = 0; i < 3; i++) {
    hb[i] = NULL;
    if (!sizes[i] || !dev[i]) continue;
    if (!(hb[i] = stoke_alloc(sizes[i])))
      return STOKE_ERR(STOKE_E_OOM, "out of host memory (%zu bytes) for a checkpoint", sizes[i]);
    memset(hb[i], 0, sizes[i]); /* alignment gaps load as zeros */
  }
  return NULL;
}

/* A metadata entry: key and value text. */
typedef struct meta_kv {
  const char *key, *val;
} meta_kv;

static int by_key(const void *a, const void *b) { return strcmp(((const meta_kv *)a)->key, ((const meta_kv *)b)->key); }

/* The checksum over metadata entries (sorted here; `kv` is reordered). */
static uint32_t meta_crc(meta_kv *kv, int n) {
  qsort(kv, (size_t)n, sizeof *kv, by_key);
  uint32_t c = 0;
  for (int i = 0; i < n; i++) {
    c = stoke_crc32c(c, kv[i].key, strlen(kv[i].key) + 1);
    c = stoke_crc32c(c, kv[i].val, strlen(kv[i].val) + 1);
  }
  return c;
}

/* `{"__metadata__":{` the run state, its checksum, `}` left open for more. */
static void header_meta(sbuf *h, const stoke_ckpt_meta *m, const char *optimizer, const char *config_text) {
  char num[10][40];
  snprintf(num[0], sizeof num[0], "%d", STOKE_CKPT_VERSION);
  snprintf(num[1], sizeof num[1], "%lld", (long long)m->step);
  snprintf(num[2], sizeof num[2], "%lld", (long long)m->epoch);
  snprintf(num[3], sizeof num[3], "%lld", (long long)m->seed);
  snprintf(num[4], sizeof num[4], "%lld", (long long)m->accumulate);
  snprintf(num[5], sizeof num[5], "%.17g", m->loss_scale);
  snprintf(num[6], sizeof num[6], "%lld", (long long)(m->world > 0 ? m->world : 1));
  snprintf(num[7], sizeof num[7], "%lld", (long long)m->batch);
  snprintf(num[8], sizeof num[8], "%lld", (long long)m->skipped_steps);
  snprintf(num[9], sizeof num[9], "%lld", (long long)m->loss_scale_good_steps);
  /* loss_scale only from a run with a loss scaler: a run without one (fp32, tf32, bf16) has no scale to
   * carry, and an fp16 run resuming its file starts from its own initial scale, not from 1 */
  /* tensor_order: 4-D tensors are row-major (N, C, H, W) whatever the run's layout (since 2026-11-29; before, a
   * 4-D parameter or state tensor that is no convolution's filter was written in an NHWC run's memory order) */
  meta_kv kv[14] = {{"format", "pt"},         {"stoke_checkpoint_version", num[0]},
                    {"step", num[1]},         {"epoch", num[2]},
                    {"seed", num[3]},         {"accumulate", num[4]},
                    {"world", num[6]},        {"batch", num[7]},
                    {"skipped_steps", num[8]}, {"loss_scale_good_steps", num[9]},
                    {"optimizer", optimizer}, {TENSOR_ORDER_KEY, "row-major"}};
  int n = 12;
  if (m->loss_scale > 0) kv[n++] = (meta_kv){"loss_scale", num[5]};
  if (config_text) kv[n++] = (meta_kv){"config", config_text};
  sb_put(h, "{\"__metadata__\":{");
  for (int i = 0; i < n; i++) {
    sb_put(h, "%s\"%s\":", i ? "," : "", kv[i].key);
    sb_json_str(h, kv[i].val);
  }
  sb_put(h, ",\"" META_CRC_KEY "\":\"%08x\"", meta_crc(kv, n));
}

/* This machine's name as a file name part: dots and slashes made '_'. */
static void host_tag(char *out, size_t cap) {
  char h[256] = "";
  if (gethostname(h, sizeof h - 1)) snprintf(h, sizeof h, "host");
  h[sizeof h - 1] = 0;
  snprintf(out, cap, "%.63s", h[0] ? h : "host");
  for (char *c = out; *c; c++)
    if (*c == '.' || *c == '/') *c = '_';
}

void stoke_checkpoint_tmp_path(const char *path, char *out, size_t cap) {
  char host[64];
  host_tag(host, sizeof host);
  snprintf(out, cap, "%s.tmp.%s.%d", path, host, (int)getpid());
}

long stoke_checkpoint_tmp_pid(const char *suffix) {
  const char *dot = strrchr(suffix, '.'), *num = dot ? dot + 1 : suffix;
  if (dot) { /* "<host>.<pid>": only this machine's */
    char host[64];
    host_tag(host, sizeof host);
    if ((size_t)(dot - suffix) != strlen(host) || strncmp(suffix, host, strlen(host))) return 0;
  }
  char *end;
  long pid = strtol(num, &end, 10);
  if (end == num || *end || pid <= 0 || pid > INT_MAX) return 0;
  return pid;
}

/* Whether a tensor of a checkpoint belongs to this plan's model, or is
 * not the model's at all: the optimizer's state and master copies (of
 * this optimizer or another) and BatchNorm's num_batches_tracked. */
static int model_knows(const char *name, const entry *ents, int n) {
  size_t len = strlen(name);
  if (!strncmp(name, "optimizer.", 10) || (len > 20 && !strcmp(name + len - 20, ".num_batches_tracked"))) return 1;
  for (int i = 0; i < n; i++)
    if (!strcmp(ents[i].name, name)) return 1;
  return 0;
}

/* The weights must be finite to be saved: a diverged run's NaN or Inf
 * parameters (or their master copies, or the optimizer's state) never
 * replace the last good checkpoint. The loss, read only at logged steps,
 * cannot tell: a save between them, or on the way out after Ctrl-C, would
 * otherwise write whatever the last update left. */
static stoke_err *check_finite(const entry *ents, int n, const char *path, int64_t step) {
  for (int i = 0; i < n; i++) {
    if (ents[i].role == ENT_OTHER && strncmp(ents[i].name, "optimizer.", 10)) continue; /* running statistics */
    int dt = st_float(ents[i].dtype);
    if (dt < 0) continue;
    int64_t n = (int64_t)(ents[i].bytes / stoke_dtype_size((stoke_dtype)dt));
    int64_t bad = stoke_count_nonfinite(ents[i].src, (stoke_dtype)dt, n, NULL);
    if (bad)
      return STOKE_ERR(STOKE_E_NUMERIC,
                       "not saved: after step %lld, '%s' holds %lld NaN or infinite values (training diverged); "
                       "the checkpoint already at '%s', if any, is kept. Lower [optimizer] lr or check the data, "
                       "then continue from that checkpoint",
                       (long long)step, ents[i].name, (long long)bad, path);
  }
  return NULL;
}

stoke_err *stoke_checkpoint_save(stoke_exec *x, const char *path, const stoke_ckpt_meta *m,
                                 const char *config_text) {
  stoke_plan *p = stoke_exec_plan(x);
  void *hb[3] = {0};
  size_t sizes[3];
  void *dev[3] = {stoke_exec_buffer(x, STOKE_BUF_PARAMS), stoke_exec_buffer(x, STOKE_BUF_STATE),
                  stoke_exec_opt_state(x)};
  stoke_err *e = host_copies(x, hb, sizes);
  for (int i = 0; i < 3 && !e; i++)
    if (hb[i]) e = stoke_exec_copy(x, hb[i], dev[i], sizes[i], STOKE_COPY_D2H);
  /* filters kept [O, kh, kw, C] on the device are written [O, C, kh, kw], as PyTorch's state_dict holds them */
  if (!e) e = stoke_plan_filters_permute(p, hb[0], hb[2], -1, 0);
  int cap = 5 * p->g->n_values + p->g->n_tied + 8; /* parameter, state, master, two optimizer tensors, tied names */
  entry *ents = e ? NULL : calloc((size_t)cap, sizeof *ents);
  if (!e && !ents) e = STOKE_ERR(STOKE_E_OOM, "out of memory");
  sbuf h = {0};
  int fd = -1;
  char tmp[PATH_MAX + 96];
  stoke_checkpoint_tmp_path(path, tmp, sizeof tmp);
  if (e) goto out;
  int64_t nbt_val = m->step * m->accumulate, nbt_store = 0;
  int n = list_entries(p, hb, p->opt_kernel ? m->optimizer : NULL, nbt_val, &nbt_store, ents, cap);
  if ((e = check_finite(ents, n, path, m->step))) goto out;
  header_meta(&h, m, p->opt_kernel ? m->optimizer : "", config_text);
  sb_put(&h, ",\"" CRC_KEY "\":\"");
  for (int i = 0; i < n; i++)
    sb_put(&h, "%s%s=%08x", i ? ";" : "", ents[i].name, stoke_crc32c(0, ents[i].src, ents[i].bytes));
  sb_put(&h, "\"}");
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    sb_put(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", ents[i].name, ents[i].dtype);
    for (int d = 0; d < ents[i].shape.ndim; d++) sb_put(&h, "%s%lld", d ? "," : "", (long long)ents[i].shape.d[d]);
    sb_put(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + ents[i].bytes);
    off += ents[i].bytes;
  }
  sb_put(&h, "}");
  while (!h.oom && h.n % 8) sb_put(&h, " "); /* the data section starts 8-aligned */
  if (h.oom) {
    e = STOKE_ERR(STOKE_E_OOM, "out of memory writing a checkpoint header");
    goto out;
  }
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    e = STOKE_ERR(STOKE_E_IO, "cannot create '%s': %s (is the folder writable?)", tmp, strerror(errno));
    goto out;
  }
  uint64_t hlen = h.n;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hlen >> (8 * i));
  e = write_all(fd, le, 8, tmp);
  if (!e) e = write_all(fd, h.s, h.n, tmp);
  for (int i = 0; i < n && !e; i++) e = write_all(fd, ents[i].src, ents[i].bytes, tmp);
  if (!e && fsync(fd)) e = STOKE_ERR(STOKE_E_IO, "fsync '%s': %s", tmp, strerror(errno));
  if (close(fd) && !e) e = STOKE_ERR(STOKE_E_IO, "closing '%s': %s", tmp, strerror(errno));
  fd = -1;
  if (!e && rename(tmp, path))
    e = STOKE_ERR(STOKE_E_IO, "renaming '%s' to '%s': %s", tmp, path, strerror(errno));
  if (!e) {
    /* make the rename itself durable */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    const char *folder = dirname(dir);
    int dfd = open(folder, O_RDONLY | O_DIRECTORY);
    /* a file system that cannot sync folders (EINVAL) has nothing to sync; any other failure is said, not
     * hidden: the file is complete, but a power loss may undo its rename */
    if ((dfd < 0 || fsync(dfd)) && errno != EINVAL && errno != ENOTSUP)
      stoke_log(STOKE_LOG_WARN, "checkpoint", "'%s' is written, but syncing its folder '%s' failed: %s (a power "
                "loss may leave the previous checkpoint there)", path, folder, strerror(errno));
    if (dfd >= 0) close(dfd);
  }
out:
  if (fd >= 0) close(fd);
  if (e) unlink(tmp);
  free(h.s);
  free(ents);
  for (int i = 0; i < 3; i++) stoke_free(hb[i]);
  return e;
}

size_t stoke_checkpoint_bytes(const stoke_plan *p, const char *optimizer, size_t config_bytes) {
  int cap = 5 * p->g->n_values + 8;
  entry *ents = calloc((size_t)cap, sizeof *ents);
  if (!ents) return 0;
  int64_t nbt = 0;
  int n = list_entries(p, NULL, p->opt_kernel ? optimizer : NULL, 0, &nbt, ents, cap);
  /* the header: the run state, the config (escaping at most doubles it),
   * and per tensor its entry and its checksum */
  size_t total = 8 + 2048 + 2 * config_bytes;
  for (int i = 0; i < n; i++) total += ents[i].bytes + 2 * strlen(ents[i].name) + 160;
  free(ents);
  return total;
}

/* ------------------------------------------------------------ reading */

typedef struct jp {
  const char *s, *end;
  const char *path;
} jp;

static void ws(jp *j) {
  while (j->s < j->end && isspace((unsigned char)*j->s)) j->s++;
}

static stoke_err *bad(jp *j, const char *what) {
  return STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': corrupt safetensors header: %s", j->path, what);
}

static stoke_err *expect(jp *j, char c) {
  ws(j);
  if (j->s >= j->end || *j->s != c) return bad(j, "unexpected character");
  j->s++;
  return NULL;
}

/* A JSON string into a malloc'd buffer. */
static stoke_err *jstring(jp *j, char **out) {
  STOKE_PROPAGATE(expect(j, '"'));
  size_t cap = 64, n = 0;
  char *s = malloc(cap);
  if (!s) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  while (j->s < j->end && *j->s != '"') {
    char c = *j->s++;
    if (c == '\\') {
      if (j->s >= j->end) break;
      char k = *j->s++;
      c = k == 'n' ? '\n' : k == 't' ? '\t' : k == 'r' ? '\r' : k == 'b' ? '\b' : k == 'f' ? '\f' : k;
      if (k == 'u') {
        unsigned v = 0;
        for (int i = 0; i < 4 && j->s < j->end; i++) {
          char h = *j->s++;
          v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
        }
        c = v < 0x80 ? (char)v : '?'; /* names and metadata here are ASCII */
      }
    }
    if (n + 2 > cap) {
      char *ns = realloc(s, cap *= 2);
      if (!ns) {
        free(s);
        return STOKE_ERR(STOKE_E_OOM, "out of memory");
      }
      s = ns;
    }
    s[n++] = c;
  }
  if (j->s >= j->end) {
    free(s);
    return bad(j, "unterminated string");
  }
  j->s++;
  s[n] = 0;
  *out = s;
  return NULL;
}

/* A non-negative integer. The header is not NUL-terminated (the data or
 * the end of the file follows), so its digits are copied out first. */
static stoke_err *jint(jp *j, int64_t *v) {
  ws(j);
  char digits[24];
  size_t n = 0;
  while (j->s + n < j->end && n < sizeof digits - 1 && isdigit((unsigned char)j->s[n])) {
    digits[n] = j->s[n];
    n++;
  }
  digits[n] = 0;
  char *e;
  errno = 0;
  long long x = strtoll(digits, &e, 10);
  if (!n || errno || n == sizeof digits - 1) return bad(j, "bad integer");
  j->s += n;
  *v = x;
  return NULL;
}

static stoke_err *jints(jp *j, int64_t *v, int cap, int *n) {
  STOKE_PROPAGATE(expect(j, '['));
  *n = 0;
  ws(j);
  if (j->s < j->end && *j->s == ']') {
    j->s++;
    return NULL;
  }
  for (;;) {
    if (*n == cap) return bad(j, "too many dimensions");
    STOKE_PROPAGATE(jint(j, &v[(*n)++]));
    ws(j);
    if (j->s < j->end && *j->s == ',') {
      j->s++;
      continue;
    }
    return expect(j, ']');
  }
}

static size_t st_size(const char *dtype) {
  if (!strcmp(dtype, "F64") || !strcmp(dtype, "I64")) return 8;
  if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
  if (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16") || !strcmp(dtype, "I16")) return 2;
  if (!strcmp(dtype, "U8") || !strcmp(dtype, "I8") || !strcmp(dtype, "BOOL")) return 1;
  return 0;
}

static int by_begin(const void *a, const void *b) {
  const stoke_st_tensor *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const stoke_st_tensor *)a)->name, ((const stoke_st_tensor *)b)->name);
}

/* The header: {"__metadata__": {k: "v", ...}, name: {dtype, shape, data_offsets}, ...} */
static stoke_err *parse_header(stoke_st_file *f, jp *j) {
  STOKE_PROPAGATE(expect(j, '{'));
  int cap_t = 0, cap_m = 0;
  ws(j);
  if (j->s < j->end && *j->s == '}') {
    j->s++;
    return NULL;
  }
  for (;;) {
    char *key;
    STOKE_PROPAGATE(jstring(j, &key));
    stoke_err *e = expect(j, ':');
    if (!e && !strcmp(key, "__metadata__")) {
      e = expect(j, '{');
      ws(j);
      int empty = !e && j->s < j->end && *j->s == '}';
      if (empty) j->s++;
      while (!e && !empty) {
        char *k, *v;
        if ((e = jstring(j, &k))) break;
        if ((e = expect(j, ':')) || (e = jstring(j, &v))) {
          free(k);
          break;
        }
        if (f->n_meta == cap_m) {
          cap_m = cap_m ? 2 * cap_m : 16;
          void *nk = realloc(f->meta_keys, (size_t)cap_m * sizeof *f->meta_keys);
          void *nv = nk ? realloc(f->meta_values, (size_t)cap_m * sizeof *f->meta_values) : NULL;
          if (nk) f->meta_keys = nk;
          if (nv) f->meta_values = nv;
          if (!nk || !nv) {
            free(k);
            free(v);
            e = STOKE_ERR(STOKE_E_OOM, "out of memory");
            break;
          }
        }
        snprintf(f->meta_keys[f->n_meta], 64, "%s", k);
        f->meta_values[f->n_meta++] = v;
        free(k);
        ws(j);
        if (j->s < j->end && *j->s == ',') {
          j->s++;
          continue;
        }
        e = expect(j, '}');
        break;
      }
    } else if (!e) {
      if (f->n_tensors == cap_t) {
        cap_t = cap_t ? 2 * cap_t : 64;
        stoke_st_tensor *nt = realloc(f->tensors, (size_t)cap_t * sizeof *nt);
        if (!nt) e = STOKE_ERR(STOKE_E_OOM, "out of memory");
        else f->tensors = nt;
      }
      stoke_st_tensor *t = e ? NULL : &f->tensors[f->n_tensors];
      if (t) {
        memset(t, 0, sizeof *t);
        if (strlen(key) >= sizeof t->name) e = bad(j, "tensor name too long");
        else snprintf(t->name, sizeof t->name, "%s", key);
      }
      int have = 0;
      if (!e) e = expect(j, '{');
      while (!e) {
        char *field;
        if ((e = jstring(j, &field))) break;
        if ((e = expect(j, ':'))) {
          free(field);
          break;
        }
        if (!strcmp(field, "dtype")) {
          char *dt;
          if (!(e = jstring(j, &dt))) {
            snprintf(t->dtype, sizeof t->dtype, "%s", dt);
            free(dt);
            have |= 1;
          }
        } else if (!strcmp(field, "shape")) {
          int64_t dims[STOKE_MAX_DIMS];
          if (!(e = jints(j, dims, STOKE_MAX_DIMS, &t->ndim))) memcpy(t->shape, dims, sizeof dims);
          have |= 2;
        } else if (!strcmp(field, "data_offsets")) {
          int64_t o[2];
          int k = 0;
          if (!(e = jints(j, o, 2, &k)) && k != 2) e = bad(j, "data_offsets needs two numbers");
          if (!e) t->begin = (size_t)o[0], t->end = (size_t)o[1];
          have |= 4;
        } else {
          e = bad(j, "unknown tensor field");
        }
        free(field);
        if (e) break;
        ws(j);
        if (j->s < j->end && *j->s == ',') {
          j->s++;
          continue;
        }
        e = expect(j, '}');
        break;
      }
      if (!e && have != 7) e = bad(j, "a tensor lacks dtype, shape or data_offsets");
      if (!e) f->n_tensors++;
    }
    free(key);
    if (e) return e;
    ws(j);
    if (j->s < j->end && *j->s == ',') {
      j->s++;
      continue;
    }
    return expect(j, '}');
  }
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a folder" : S_ISCHR(m) || S_ISBLK(m) ? "a device" :
         S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* The whole of a regular file (opened without blocking, so a FIFO is
 * refused instead of waiting for a writer). */
/* The file's first `limit` bytes (all of it when shorter), malloc'd. */
static stoke_err *read_head(const char *path, size_t limit, unsigned char **out, size_t *size) {
  *out = NULL;
  *size = 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return STOKE_ERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_IO, "cannot open checkpoint '%s': %s", path,
                     strerror(errno));
  struct stat st;
  stoke_err *e = NULL;
  if (fstat(fd, &st)) e = STOKE_ERR(STOKE_E_IO, "cannot stat checkpoint '%s': %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    e = STOKE_ERR(STOKE_E_INVALID, "checkpoint '%s' is %s, not a file: name a checkpoint.safetensors file", path,
                  file_kind(st.st_mode));
  else if (st.st_size < 8)
    e = STOKE_ERR(STOKE_E_DATA, "checkpoint '%s' is truncated (%lld bytes)", path, (long long)st.st_size);
  size_t want = (size_t)st.st_size < limit ? (size_t)st.st_size : limit;
  if (!e && !(*out = malloc(want)))
    e = STOKE_ERR(STOKE_E_OOM, "out of memory reading '%s' (%zu bytes)", path, want);
  size_t got = 0;
  while (!e && got < want) {
    ssize_t k = read(fd, *out + got, want - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) e = STOKE_ERR(STOKE_E_IO, "reading checkpoint '%s' failed: %s", path, k ? strerror(errno) : "it shrank");
    else got += (size_t)k;
  }
  close(fd);
  if (e) {
    free(*out);
    *out = NULL;
  }
  *size = got;
  return e;
}

stoke_err *stoke_st_read(const char *path, stoke_st_file *f) {
  memset(f, 0, sizeof *f);
  unsigned char *bytes;
  size_t size;
  STOKE_PROPAGATE(read_head(path, SIZE_MAX, &bytes, &size));
  return stoke_st_parse(bytes, size, path, f);
}

stoke_err *stoke_checkpoint_config(const char *path, char **text) {
  *text = NULL;
  unsigned char *b;
  size_t n;
  STOKE_PROPAGATE(read_head(path, 8, &b, &n));
  uint64_t hlen = 0;
  int texty = n >= 8;
  for (size_t i = 0; i < 8 && i < n; i++) {
    hlen |= (uint64_t)b[i] << (8 * i);
    texty &= b[i] == '\n' || b[i] == '\t' || (b[i] >= 0x20 && b[i] < 0x7f);
  }
  free(b);
  if (n < 8) return STOKE_ERR(STOKE_E_DATA, "checkpoint '%s' is truncated (%zu bytes)", path, n);
  if (hlen > ((uint64_t)1 << 30))
    return STOKE_ERR(STOKE_E_DATA, "'%s' is not a checkpoint (a safetensors file): %s", path,
                     texty ? "it starts with text, as an INI file does; a checkpoint is the .safetensors file a run "
                            "saved in its out_dir"
                          : "its first 8 bytes give no header length");
  STOKE_PROPAGATE(read_head(path, 8 + (size_t)hlen, &b, &n));
  stoke_st_file f = {.bytes = b, .size = n};
  stoke_err *e = n < 8 + hlen ? STOKE_ERR(STOKE_E_DATA, "checkpoint '%s' is truncated inside its header", path) : NULL;
  jp j = {(const char *)b + 8, (const char *)b + n, path};
  if (!e) e = parse_header(&f, &j);
  const char *c = e ? NULL : stoke_st_meta(&f, "config");
  if (c && !(*text = strdup(c))) e = STOKE_ERR(STOKE_E_OOM, "out of memory");
  stoke_st_free(&f);
  return e;
}

stoke_err *stoke_st_parse(unsigned char *bytes, size_t size, const char *path, stoke_st_file *f) {
  memset(f, 0, sizeof *f);
  f->bytes = bytes;
  f->size = size;
  if (size < 8) {
    stoke_st_free(f);
    return STOKE_ERR(STOKE_E_DATA, "checkpoint '%s' is truncated (%zu bytes)", path, size);
  }
  stoke_err *e = NULL;
  uint64_t hlen = 0;
  for (int i = 0; i < 8 && !e; i++) hlen |= (uint64_t)f->bytes[i] << (8 * i);
  if (!e && hlen > f->size - 8)
    e = STOKE_ERR(STOKE_E_DATA,
                  "checkpoint '%s' is truncated or not a safetensors file (header of %llu bytes in "
                  "a file of %zu)",
                  path, (unsigned long long)hlen, f->size);
  if (!e) {
    jp j = {(const char *)f->bytes + 8, (const char *)f->bytes + 8 + hlen, path};
    e = parse_header(f, &j);
    ws(&j); /* the header's padding */
    if (!e && j.s != j.end) e = bad(&j, "bytes after the header's closing brace");
    f->data = f->bytes + 8 + hlen;
    f->data_size = f->size - 8 - hlen;
  }
  /* every tensor's bytes: dtype x shape, and together they tile the data */
  if (!e) {
    stoke_st_tensor *sorted = malloc(sizeof *sorted * (size_t)(f->n_tensors ? f->n_tensors : 1));
    if (!sorted) e = STOKE_ERR(STOKE_E_OOM, "out of memory");
    if (!e && f->n_tensors) memcpy(sorted, f->tensors, sizeof *sorted * (size_t)f->n_tensors);
    if (!e) qsort(sorted, (size_t)f->n_tensors, sizeof *sorted, by_begin);
    size_t at = 0;
    for (int i = 0; i < f->n_tensors && !e; i++) {
      const stoke_st_tensor *t = &sorted[i];
      size_t n = st_size(t->dtype);
      int over = 0;
      for (int d = 0; d < t->ndim; d++) over |= __builtin_mul_overflow(n, (size_t)t->shape[d], &n);
      if (!st_size(t->dtype)) e = STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': tensor '%s' has unknown dtype '%s'", path, t->name, t->dtype);
      else if (over || t->begin != at || t->end < t->begin || t->end - t->begin != n)
        e = STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': tensor '%s' has inconsistent data_offsets", path, t->name);
      at = t->end;
    }
    if (!e && at != f->data_size)
      e = STOKE_ERR(STOKE_E_DATA,
                    "checkpoint '%s' is truncated or padded: tensors cover %zu bytes, the file holds %zu",
                    path, at, f->data_size);
    /* one entry per name (a JSON object's keys are unique) */
    if (!e) qsort(sorted, (size_t)f->n_tensors, sizeof *sorted, by_name);
    for (int i = 1; i < f->n_tensors && !e; i++)
      if (!strcmp(sorted[i].name, sorted[i - 1].name))
        e = STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': tensor '%s' appears twice in the header", path, sorted[i].name);
    free(sorted);
  }
  if (e) stoke_st_free(f);
  return e;
}

void stoke_st_free(stoke_st_file *f) {
  for (int i = 0; i < f->n_meta; i++) free(f->meta_values[i]);
  free(f->meta_values);
  free(f->meta_keys);
  free(f->tensors);
  free(f->bytes);
  memset(f, 0, sizeof *f);
}

const stoke_st_tensor *stoke_st_find(const stoke_st_file *f, const char *name) {
  for (int i = 0; i < f->n_tensors; i++)
    if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
  return NULL;
}

const char *stoke_st_meta(const stoke_st_file *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
  return NULL;
}

/* ------------------------------------------------------- run state */

/* A metadata field that must be a whole decimal integer in [lo, hi];
 * `dflt` when absent, or an error when `required`. */
static stoke_err *meta_int(const stoke_st_file *f, const char *path, const char *key, int64_t lo, int64_t hi,
                           int required, int64_t dflt, int64_t *out) {
  const char *v = stoke_st_meta(f, key);
  if (!v) {
    if (required)
      return STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': its metadata has no \"%s\" field: not a whole stoke checkpoint",
                       path, key);
    *out = dflt;
    return NULL;
  }
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno || x < lo || x > hi || !(isdigit((unsigned char)v[0]) || v[0] == '-'))
    return STOKE_ERR(STOKE_E_DATA,
                     "checkpoint '%s': metadata field \"%s\" = \"%.40s\" is not an integer in [%lld, %lld]: the file is "
                     "damaged or was not written by stoke; resume from another checkpoint",
                     path, key, v, (long long)lo, (long long)hi);
  *out = x;
  return NULL;
}

/* The metadata checksum, when the file has one: *checked says whether. */
static stoke_err *check_meta_crc(const stoke_st_file *f, const char *path, int *checked) {
  const char *want = stoke_st_meta(f, META_CRC_KEY);
  *checked = want != NULL;
  if (!want) return NULL;
  meta_kv *kv = malloc(sizeof *kv * (size_t)(f->n_meta ? f->n_meta : 1));
  if (!kv) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  int n = 0;
  for (int i = 0; i < f->n_meta; i++)
    if (strcmp(f->meta_keys[i], META_CRC_KEY) && strcmp(f->meta_keys[i], CRC_KEY))
      kv[n++] = (meta_kv){f->meta_keys[i], f->meta_values[i]};
  char got[16];
  snprintf(got, sizeof got, "%08x", meta_crc(kv, n));
  free(kv);
  if (strcmp(got, want))
    return STOKE_ERR(STOKE_E_DATA,
                     "checkpoint '%s': its run state (step %s, epoch %s, ...) does not match its checksum (" META_CRC_KEY
                     " %.16s, computed %s): the metadata is damaged or was edited; resume from another checkpoint",
                     path, stoke_st_meta(f, "step") ? stoke_st_meta(f, "step") : "?",
                     stoke_st_meta(f, "epoch") ? stoke_st_meta(f, "epoch") : "?", want, got);
  return NULL;
}

/* The run state, every field checked against its range and the whole
 * against its checksum; a bad field is named. */
static stoke_err *parse_meta(const stoke_st_file *f, const char *path, stoke_ckpt_meta *m) {
  memset(m, 0, sizeof *m);
  const char *ver = stoke_st_meta(f, "stoke_checkpoint_version");
  if (!ver)
    return STOKE_ERR(STOKE_E_DATA, "'%s' is a safetensors file but not a stoke checkpoint (no stoke_checkpoint_version "
                     "in its metadata: PyTorch's save_file writes such files): a run resumes only from a checkpoint "
                     "a stoke run saved, which holds the optimizer state and the run's place beside the weights", path);
  if (strcmp(ver, "1"))
    return STOKE_ERR(STOKE_E_DATA, "'%s' is a stoke checkpoint of version %.40s; this stoke reads version %d", path, ver,
                     STOKE_CKPT_VERSION);
  /* a file written since the checksums exist carries both, an older one neither: one alone means the
   * other's key was damaged (a flipped bit in "stoke_meta_crc32c" otherwise read as an old file) */
  const char *has_meta = stoke_st_meta(f, META_CRC_KEY), *has_data = stoke_st_meta(f, CRC_KEY);
  if (!has_meta != !has_data)
    return STOKE_ERR(STOKE_E_DATA,
                     "checkpoint '%s': its metadata has \"%s\" but no \"%s\": a metadata key is damaged; resume "
                     "from another checkpoint",
                     path, has_meta ? META_CRC_KEY : CRC_KEY, has_meta ? CRC_KEY : META_CRC_KEY);
  STOKE_PROPAGATE(check_meta_crc(f, path, &m->meta_checked));
  const int64_t max = INT64_MAX;
  STOKE_PROPAGATE(meta_int(f, path, "step", 0, max, 1, 0, &m->step));
  STOKE_PROPAGATE(meta_int(f, path, "accumulate", 1, 1 << 20, 1, 1, &m->accumulate));
  STOKE_PROPAGATE(meta_int(f, path, "seed", 0, max, 1, 0, &m->seed));
  STOKE_PROPAGATE(meta_int(f, path, "world", 1, 1 << 24, 0, 1, &m->world));
  STOKE_PROPAGATE(meta_int(f, path, "batch", 0, 1 << 24, 0, 0, &m->batch));
  /* the samples seen, step x accumulate x batch x world, must be a number */
  int64_t seen;
  if (__builtin_mul_overflow(m->step, m->accumulate, &seen) ||
      __builtin_mul_overflow(seen, m->batch > 0 ? m->batch : 1, &seen) ||
      __builtin_mul_overflow(seen, m->world, &seen))
    return STOKE_ERR(STOKE_E_DATA,
                     "checkpoint '%s': metadata field \"step\" = %lld is impossible (x accumulate %lld x batch %lld x "
                     "world %lld overflows): the file is damaged; resume from another checkpoint",
                     path, (long long)m->step, (long long)m->accumulate, (long long)m->batch, (long long)m->world);
  /* an epoch holds at least one sample */
  STOKE_PROPAGATE(meta_int(f, path, "epoch", 0, seen, 1, 0, &m->epoch));
  const char *ls = stoke_st_meta(f, "loss_scale");
  char *end = NULL;
  m->loss_scale = ls ? strtod(ls, &end) : 0; /* absent: the run that wrote it had no loss scaler */
  if (ls && (end == ls || *end || !isfinite(m->loss_scale) || m->loss_scale <= 0 || m->loss_scale > 3.4e38))
    return STOKE_ERR(STOKE_E_DATA,
                     "checkpoint '%s': metadata field \"loss_scale\" = \"%.40s\" is not a positive finite number: the "
                     "file is damaged; resume from another checkpoint",
                     path, ls);
  /* of `step`, those the loss scaler skipped (AdamW's bias corrections count the others) */
  STOKE_PROPAGATE(meta_int(f, path, "skipped_steps", 0, m->step, 0, 0, &m->skipped_steps));
  /* the scaler's clean steps since its last change (0 in files written before it was kept) */
  STOKE_PROPAGATE(meta_int(f, path, "loss_scale_good_steps", 0, m->step, 0, 0, &m->loss_scale_good_steps));
  /* an optimizer's name (a plugin's too): a C identifier, or empty */
  const char *opt = stoke_st_meta(f, "optimizer");
  int name_ok = !opt || strlen(opt) < sizeof m->optimizer;
  for (const char *c = opt; c && *c && name_ok; c++) name_ok = isalnum((unsigned char)*c) || *c == '_';
  if (!name_ok)
    return STOKE_ERR(STOKE_E_DATA,
                     "checkpoint '%s': metadata field \"optimizer\" = \"%.40s\" is not an optimizer's name: the file "
                     "is damaged; resume from another checkpoint",
                     path, opt);
  snprintf(m->optimizer, sizeof m->optimizer, "%s", opt ? opt : "");
  return NULL;
}


/* Each tensor's bytes against its checksum in the metadata, when the file
 * has them: *checked says whether. */
static stoke_err *check_data_crc(const stoke_st_file *f, const char *path, int *checked) {
  const char *list = stoke_st_meta(f, CRC_KEY);
  *checked = list != NULL;
  if (!list) return NULL;
  int found = 0;
  for (const char *p = list; *p;) {
    const char *eq = strchr(p, '='), *semi = strchr(p, ';');
    if (!semi) semi = p + strlen(p);
    char name[sizeof f->tensors[0].name];
    unsigned want = 0;
    int len = eq && eq < semi ? (int)(eq - p) : -1, hex = 0;
    if (len > 0 && len < (int)sizeof name && semi - eq == 9) hex = sscanf(eq + 1, "%8x", &want) == 1;
    if (!hex)
      return STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': its " CRC_KEY " metadata entry is damaged near \"%.40s\"", path,
                       p);
    memcpy(name, p, (size_t)len);
    name[len] = 0;
    const stoke_st_tensor *t = stoke_st_find(f, name);
    if (!t)
      return STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': " CRC_KEY " names tensor '%s', which the file does not hold",
                       path, name);
    uint32_t got = stoke_crc32c(0, f->data + t->begin, t->end - t->begin);
    if (got != want)
      return STOKE_ERR(STOKE_E_DATA,
                       "checkpoint '%s': tensor '%s' is damaged: its bytes give CRC-32C %08x, the file recorded %08x "
                       "(a flipped bit on disk or in a copy); resume from another checkpoint",
                       path, name, got, want);
    found++;
    p = *semi ? semi + 1 : semi;
  }
  if (found != f->n_tensors)
    return STOKE_ERR(STOKE_E_DATA, "checkpoint '%s': " CRC_KEY " covers %d tensors, the file holds %d", path, found,
                     f->n_tensors);
  return NULL;
}

stoke_err *stoke_checkpoint_check(const stoke_st_file *f, const char *path, stoke_ckpt_meta *m) {
  STOKE_PROPAGATE(parse_meta(f, path, m));
  return check_data_crc(f, path, &m->data_checked);
}

/* The file read and checked: its run state, and with `data` its tensors. */
static stoke_err *read_checked(const char *path, stoke_ckpt_meta *m, int data) {
  stoke_st_file f;
  STOKE_PROPAGATE(stoke_st_read(path, &f));
  stoke_err *e = data ? stoke_checkpoint_check(&f, path, m) : parse_meta(&f, path, m);
  stoke_st_free(&f);
  return e;
}

stoke_err *stoke_checkpoint_read_meta(const char *path, stoke_ckpt_meta *m) { return read_checked(path, m, 0); }

stoke_err *stoke_checkpoint_verify(const char *path, stoke_ckpt_meta *m) { return read_checked(path, m, 1); }

/* A file without tensor_order was written before 4-D tensors were kept
 * row-major in every graph: a 4-D parameter or state tensor that is no
 * convolution's filter was then saved in the run's memory order, NHWC in a
 * GPU run's graph (filters were [O, C, kh, kw] always). Unless the file's
 * config says the run was NCHW (layout = nchw, or layout = auto with device
 * = cpu; layout = nhwc is NHWC on the CPU too), such tensors may load
 * permuted: said at each load of such a file, naming them, with the fix. */
static void warn_old_order(const stoke_plan *p, const stoke_st_file *f, const char *path) {
  if (stoke_st_meta(f, TENSOR_ORDER_KEY)) return;
  const char *cfg = stoke_st_meta(f, "config");
  if (cfg && (strstr(cfg, "\nlayout = nchw") || (strstr(cfg, "\ndevice = cpu") && !strstr(cfg, "\nlayout = nhwc"))))
    return;
  const stoke_graph *g = p->g;
  char names[256] = "";
  int count = 0;
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *val = &g->values[v];
    if ((val->kind != STOKE_VAL_PARAM && val->kind != STOKE_VAL_STATE) || val->shape.ndim != 4 ||
        stoke_value_is_filter(g, v))
      continue;
    size_t used = strlen(names);
    if (used + 4 < sizeof names) snprintf(names + used, sizeof names - used, "%s'%s'", count ? ", " : "", val->name);
    count++;
  }
  if (count)
    stoke_log(STOKE_LOG_WARN, "checkpoint",
              "%s was written before stoke kept 4-D tensors row-major (no \"" TENSOR_ORDER_KEY "\" in its metadata), "
              "and its config does not say the run was NCHW: if it came from a GPU (NHWC) run, %d tensor%s of 4 dimensions that "
              "%s no convolution's filter (%s) %s in NHWC memory order and load%s permuted. Check them, or permute "
              "each [a, b, c, d] in the file (PyTorch: t.reshape(a, c, d, b).permute(0, 3, 1, 2)) and its optimizer "
              "state the same way",
              path, count, count == 1 ? "" : "s", count == 1 ? "is" : "are", names, count == 1 ? "is" : "are",
              count == 1 ? "s" : "");
}

/* A file tensor's shape as stoke's (for messages). */
static stoke_shape st_shape(const stoke_st_tensor *t) {
  stoke_shape ts = {.ndim = t->ndim < STOKE_MAX_DIMS ? t->ndim : STOKE_MAX_DIMS};
  for (int d = 0; d < ts.ndim; d++) ts.d[d] = t->shape[d];
  return ts;
}

/* A file tensor of stoke's shape `sh`. */
static int same_shape(const stoke_st_tensor *t, const stoke_shape *sh) {
  int same = t->ndim == sh->ndim;
  for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == sh->d[d];
  return same;
}

/* The file's fp32 master copy of parameter entry `e` (a bf16 run's exact
 * weight) when it has one of the parameter tensor t's shape, else NULL (a
 * tied parameter's master is under its value's name). */
static const stoke_st_tensor *file_master(const stoke_st_file *f, const entry *e, const stoke_st_tensor *t) {
  char mname[sizeof e->name];
  opt_name(mname, sizeof mname, e->param, "master");
  const stoke_st_tensor *mt = stoke_st_find(f, mname);
  return mt && mt->ndim == t->ndim && !memcmp(mt->shape, t->shape, sizeof(t->shape[0]) * (size_t)t->ndim) ? mt : NULL;
}

/* count values of the file's float dtype `from` at src into dst as `to`,
 * rounded to nearest even where narrower, as PyTorch's load_state_dict
 * copies them (the file's offsets need not be aligned for the dtype: each
 * value is copied out first). */
static void convert_into(void *dst, stoke_dtype to, const unsigned char *src, stoke_dtype from, int64_t count) {
  size_t es = stoke_dtype_size(from);
  for (int64_t k = 0; k < count; k++) {
    double v8;
    memcpy(&v8, src + (size_t)k * es, es);
    stoke_elem_set(dst, to, k, stoke_elem_get(&v8, from, 0));
  }
}

/* A fresh optimizer's master copy (the optimizer state's first region) is
 * the parameters: host copies, in the same order. */
static void masters_from_params(const stoke_plan *p, void *hb[3]) {
  const stoke_graph *g = p->g;
  size_t es = stoke_dtype_size(g->dtype);
  for (int v = 0; v < g->n_values; v++) {
    const stoke_value *val = &g->values[v];
    if (!is_opt_kind(val)) continue;
    for (int64_t i = 0; i < stoke_numel(&val->shape); i++)
      stoke_elem_set(hb[2], p->state_dtype, (int64_t)(val->offset / es) + i,
                     stoke_elem_get((const char *)hb[0] + val->offset, val->dtype, i));
  }
}

/* "'a' ([2, 3] here, F32 [4, 3] in the file), 'b' (not in the file)": the first few, into buf at *used */
static void note_kept(char *buf, size_t cap, size_t *used, int *n, const char *name, const char *why) {
  if ((*n)++ < 4 && *used < cap)
    *used += (size_t)snprintf(buf + *used, cap - *used, "%s'%s' (%s)", *n > 1 ? ", " : "", name, why);
  else if (*n == 5 && *used < cap)
    *used += (size_t)snprintf(buf + *used, cap - *used, ", ...");
}

stoke_err *stoke_checkpoint_load_weights(stoke_exec *x, const char *path, char *report, size_t report_cap) {
  stoke_plan *p = stoke_exec_plan(x);
  stoke_st_file f;
  STOKE_PROPAGATE(stoke_st_read(path, &f));
  stoke_ckpt_meta m = {0};
  /* a stoke checkpoint is verified as a resume verifies it; a PyTorch state_dict has no run state to check */
  stoke_err *e = stoke_st_meta(&f, "stoke_checkpoint_version") ? stoke_checkpoint_check(&f, path, &m) : NULL;
  void *hb[3] = {0};
  size_t sizes[3] = {0};
  if (!e) e = host_copies(x, hb, sizes);
  void *dev[3] = {stoke_exec_buffer(x, STOKE_BUF_PARAMS), stoke_exec_buffer(x, STOKE_BUF_STATE),
                  stoke_exec_opt_state(x)};
  /* the model's own initialization, kept where the file has no tensor of the right shape */
  for (int i = 0; i < 3 && !e; i++)
    if (hb[i]) e = stoke_exec_copy(x, hb[i], dev[i], sizes[i], STOKE_COPY_D2H);
  if (!e) e = stoke_plan_filters_permute(p, hb[0], hb[2], -1, 0); /* into the file's order (row-major) */
  int cap = p->g->n_values + p->g->n_tied + 8;
  entry *ents = e ? NULL : calloc((size_t)cap, sizeof *ents);
  if (!e && !ents) e = STOKE_ERR(STOKE_E_OOM, "out of memory");
  int64_t nbt = 0;
  int n = e ? 0 : list_entries(p, hb, NULL, 0, &nbt, ents, cap), loaded = 0, kept = 0, unused = 0;
  /* a fresh optimizer: its master copy starts as the parameters (those loaded overwrite theirs below) */
  if (!e && p->has_master && hb[2]) masters_from_params(p, hb);
  char kept_s[600] = "", unused_s[600] = "";
  size_t kept_u = 0, unused_u = 0;
  for (int i = 0; i < n && !e; i++) {
    if (!strcmp(ents[i].dtype, "I64")) continue; /* num_batches_tracked: informational */
    const stoke_st_tensor *t = stoke_st_find(&f, ents[i].name);
    int same = t && same_shape(t, &ents[i].shape);
    const stoke_st_tensor *mt = same && ents[i].role == ENT_PARAM ? file_master(&f, &ents[i], t) : NULL;
    if (mt) t = mt; /* a bf16 run's file: its fp32 master copy is the exact weight */
    int from = t ? st_float(t->dtype) : -1, to = st_float(ents[i].dtype);
    if (!t || !same || from < 0 || to < 0) {
      char why[320] = "not in the file";
      if (t) {
        stoke_shape ts = st_shape(t);
        snprintf(why, sizeof why, "%s here, %s %s in the file", stoke_shape_str(&ents[i].shape).s, t->dtype,
                 stoke_shape_str(&ts).s);
      }
      note_kept(kept_s, sizeof kept_s, &kept_u, &kept, ents[i].name, why);
      continue;
    }
    int64_t count = stoke_numel(&ents[i].shape);
    convert_into((void *)ents[i].src, (stoke_dtype)to, f.data + t->begin, (stoke_dtype)from, count);
    /* a bf16 or fp16 plan's master copy takes the file's values at the file's precision, not rounded */
    const stoke_value *pv = ents[i].role == ENT_PARAM && p->has_master && hb[2] ? ents[i].param : NULL;
    if (pv)
      convert_into((char *)hb[2] + pv->offset / stoke_dtype_size(p->g->dtype) * stoke_dtype_size(p->state_dtype),
                   p->state_dtype, f.data + t->begin, (stoke_dtype)from, count);
    loaded++;
  }
  for (int t = 0; t < f.n_tensors && !e; t++)
    if (strncmp(f.tensors[t].name, "optimizer.", 10) && strcmp(f.tensors[t].dtype, "I64") &&
        !model_knows(f.tensors[t].name, ents, n))
      note_kept(unused_s, sizeof unused_s, &unused_u, &unused, f.tensors[t].name, "no such tensor here");
  if (!e && !loaded)
    e = STOKE_ERR(STOKE_E_DATA, "[run] init_from '%s': no tensor of the file fits this model (%d kept their "
                  "initialization: %s): it is of another model; compare its names and shapes with plan.txt",
                  path, kept, kept_s);
  if (!e) e = stoke_plan_filters_permute(p, hb[0], hb[2], -1, 1);
  for (int i = 0; i < 3 && !e; i++)
    if (hb[i]) e = stoke_exec_copy(x, dev[i], hb[i], sizes[i], STOKE_COPY_H2D);
  if (!e)
    snprintf(report, report_cap, "%d tensors loaded; %d kept their initialization%s%s; %d of the file's unused%s%s",
             loaded, kept, kept ? ": " : "", kept_s, unused, unused ? ": " : "", unused_s);
  free(ents);
  for (int i = 0; i < 3; i++) stoke_free(hb[i]);
  stoke_st_free(&f);
  return e;
}

stoke_err *stoke_checkpoint_load(stoke_exec *x, const char *path, stoke_ckpt_meta *m) {
  stoke_plan *p = stoke_exec_plan(x);
  stoke_st_file f;
  STOKE_PROPAGATE(stoke_st_read(path, &f));
  stoke_err *e = stoke_checkpoint_check(&f, path, m);
  if (e) {
    stoke_st_free(&f);
    return e;
  }
  if (!m->data_checked || !m->meta_checked)
    stoke_log(STOKE_LOG_WARN, "checkpoint", "%s has no checksum of its %s (written by an older stoke?): %s unverified",
              path, !m->data_checked && !m->meta_checked ? "tensors or run state" : !m->data_checked ? "tensors" : "run state",
              !m->data_checked && !m->meta_checked ? "both are loaded" : "it is loaded");
  void *hb[3] = {0};
  size_t sizes[3];
  e = host_copies(x, hb, sizes);
  /* optimizer tensors only when the file has the plan's optimizer */
  const char *want_opt = p->opt && !strcmp(m->optimizer, p->opt->name) ? m->optimizer : NULL;
  int cap = 5 * p->g->n_values + p->g->n_tied + 8; /* parameter, state, master, two optimizer tensors, tied names */
  entry *ents = e ? NULL : calloc((size_t)cap, sizeof *ents);
  if (!e && !ents) e = STOKE_ERR(STOKE_E_OOM, "out of memory");
  int64_t nbt = 0;
  int n = e ? 0 : list_entries(p, hb, want_opt, 0, &nbt, ents, cap), converted = 0;
  const char *conv_from = "", *conv_to = "";
  /* Across precisions the master copy (a bf16 or fp16 plan's fp32 weights,
   * "optimizer.NAME.master") stands in for the parameter where it is the
   * more exact one: a plan without one (fp32, the cpu backend) takes the
   * parameter from the file's master, and a plan with one loading a file
   * without (an fp32 run's) takes its master from the file's parameter, at
   * the file's precision (not from the parameter rounded to bf16). */
  int from_master = 0, master_from_param = 0;
  for (int i = 0; i < n && !e; i++) {
    if (!strcmp(ents[i].dtype, "I64")) continue; /* num_batches_tracked: informational */
    const stoke_st_tensor *t = stoke_st_find(&f, ents[i].name);
    if (!t && ents[i].role == ENT_MASTER) {
      if ((t = stoke_st_find(&f, ents[i].param->name))) master_from_param++;
    } else if (t && ents[i].role == ENT_PARAM && !p->has_master && strcmp(t->dtype, ents[i].dtype)) {
      const stoke_st_tensor *mt = file_master(&f, &ents[i], t);
      if (mt) t = mt, from_master += !strcmp(ents[i].name, ents[i].param->name);
    }
    if (!t) {
      e = STOKE_ERR(STOKE_E_DATA, "checkpoint '%s' has no tensor '%s' (saved from another model?)", path,
                    ents[i].name);
      break;
    }
    int same = same_shape(t, &ents[i].shape);
    int from = st_float(t->dtype), to = st_float(ents[i].dtype);
    if (!same || (strcmp(t->dtype, ents[i].dtype) && (from < 0 || to < 0))) {
      stoke_shape ts = st_shape(t);
      e = STOKE_ERR(STOKE_E_DATA,
                    "checkpoint '%s': tensor '%s' is %s %s, the model needs %s %s (the file is of another model "
                    "configuration: compare the [model] keys with the config.ini of the run that saved it)",
                    path, ents[i].name, t->dtype, stoke_shape_str(&ts).s, ents[i].dtype,
                    stoke_shape_str(&ents[i].shape).s);
      break;
    }
    if (!strcmp(t->dtype, ents[i].dtype)) {
      memcpy((void *)ents[i].src, f.data + t->begin, ents[i].bytes);
      continue;
    }
    /* another float precision (a bf16 GPU run's weights into an fp32 plan, on the cpu backend say) */
    convert_into((void *)ents[i].src, (stoke_dtype)to, f.data + t->begin, (stoke_dtype)from,
                 stoke_numel(&ents[i].shape));
    converted++, conv_from = t->dtype, conv_to = ents[i].dtype;
  }
  /* The other way round: model tensors in the file that this plan lacks (a deeper network's layers, more
   * transformer blocks) mean another model, as PyTorch's load_state_dict(strict=True) says. */
  int extra = 0, first = -1;
  for (int t = 0; t < f.n_tensors && !e; t++)
    if (!model_knows(f.tensors[t].name, ents, n)) extra++, first = first < 0 ? t : first;
  if (extra)
    e = STOKE_ERR(STOKE_E_DATA, "checkpoint '%s' has %d tensor%s this model does not have, '%s' the first: it was "
                  "saved from another model (more layers or blocks?); set [model] as the run that wrote it had it, "
                  "or start without run.resume", path, extra, extra == 1 ? "" : "s", f.tensors[first].name);
  if (!e) warn_old_order(p, &f, path);
  if (!e && p->opt_kernel && !want_opt && m->optimizer[0])
    stoke_log(STOKE_LOG_WARN, "checkpoint", "%s was written by optimizer '%s', this run uses '%s': the weights are "
              "loaded, the optimizer's state (momentum, moments) starts fresh", path, m->optimizer, p->opt->name);
  if (!e && converted)
    stoke_log(STOKE_LOG_INFO, "checkpoint", "%s: %d tensors converted from the file's %s to the model's %s (rounded "
              "to nearest even where narrower), as PyTorch's load_state_dict copies them", path, converted, conv_from,
              conv_to);
  if (!e && from_master)
    stoke_log(STOKE_LOG_INFO, "checkpoint", "%s: %d parameters taken from the file's fp32 master copies (the run's "
              "exact weights), not from its rounded parameters", path, from_master);
  if (!e && master_from_param)
    stoke_log(STOKE_LOG_INFO, "checkpoint", "%s has no master copies (written by an fp32 run): the %s plan's %d master "
              "weights are the file's parameters", path, stoke_dtype_name(p->g->dtype), master_from_param);
  if (!e && p->opt_kernel && !want_opt && hb[2] && p->has_master) {
    /* another optimizer's checkpoint: fresh state, the master copy from the parameters */
    masters_from_params(p, hb);
  }
  void *dev[3] = {stoke_exec_buffer(x, STOKE_BUF_PARAMS), stoke_exec_buffer(x, STOKE_BUF_STATE),
                  stoke_exec_opt_state(x)};
  if (!e) e = stoke_plan_filters_permute(p, hb[0], hb[2], -1, 1); /* into the device's order (filter_ohwi) */
  for (int i = 0; i < 3 && !e; i++)
    if (hb[i]) e = stoke_exec_copy(x, dev[i], hb[i], sizes[i], STOKE_COPY_H2D);
  free(ents);
  for (int i = 0; i < 3; i++) stoke_free(hb[i]);
  stoke_st_free(&f);
  return e;
}
