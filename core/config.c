/* core/config.c: the strict INI config: declared keys with type, default,
 * range and help; files read with inih, overrides, checks, dump and help. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "stoke/config.h"
#include "stoke/core.h"

/* inih is the project's INI parser (Debian libinih-dev, linked statically).
 * Debian's inih 55 takes its options as runtime globals; see parse_text. */

/* A value as given (trimmed), and split on ',' for INTS and LIST. */
typedef struct val {
  char *text;         /* trimmed value text */
  char *buf;          /* copy of text with items cut and trimmed in place */
  const char **items; /* n_items pointers into buf */
  int n_items;
} val;

/* One declared key: a deep copy of the declaration plus its split default. */
typedef struct key_decl {
  stoke_cfg_key_v1 k;
  val def;
} key_decl;

typedef struct cfg_section {
  char *name;
  char *help; /* may be NULL */
  key_decl *keys;
  int n_keys, cap_keys;
} cfg_section;

/* One raw entry from a file or the command line, kept until read. A
 * "[section]" line is an entry too (key == NULL), so an unknown section is
 * reported at its header line even when it holds no keys. */
typedef struct entry {
  char *section;
  char *key;         /* NULL for a section header line */
  val v;
  int override;      /* from stoke_cfg_override */
  int line;          /* 0 for an override */
  int section_line;  /* line of the [section] header; 0 if none */
  char *where;       /* "run.ini:12" or "command line" */
  char *origin;      /* message prefix: "run.ini:12" or "command line: a.b=c" */
} entry;

struct stoke_cfg {
  cfg_section *secs;
  int n_secs, cap_secs;
  entry *ents;
  int n_ents, cap_ents;
};

#define OOM_ERR() STOKE_ERR(STOKE_E_OOM, "out of memory in the config")

/* ------------------------------------------------------------ helpers */

/* Grow a dynamic array so that it holds at least `need` items. */
static int grow(void **p, int *cap, int need, size_t size) {
  if (need <= *cap) return 0;
  int n = *cap ? *cap * 2 : 8;
  while (n < need) n *= 2;
  void *q = realloc(*p, (size_t)n * size);
  if (!q) return -1;
  *p = q;
  *cap = n;
  return 0;
}

/* printf into a new heap string (NULL when out of memory). */
static char *fmt_alloc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fmt_alloc(const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  char *s = n < 0 ? NULL : malloc((size_t)n + 1);
  if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

/* A heap copy of s (NULL stays NULL; *fail set when out of memory). */
static char *dup_or_null(const char *s, int *fail) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *fail = 1;
  return d;
}

/* A heap copy of the n bytes at s with surrounding whitespace removed. */
static char *dup_trim(const char *s, size_t n) {
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

/* Trim a string in place; returns the new start. */
static char *trim_in_place(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

static void val_free(val *v) {
  free(v->text);
  free(v->buf);
  free(v->items);
  memset(v, 0, sizeof *v);
}

/* Make a val from text: trimmed copy and comma-split items. 0 or -1 (OOM). */
static int val_make(val *v, const char *text) {
  memset(v, 0, sizeof *v);
  v->text = dup_trim(text, strlen(text));
  v->buf = v->text ? strdup(v->text) : NULL;
  if (!v->buf) goto oom;
  if (!v->buf[0]) return 0; /* "" holds no items */
  int n = 1;
  for (const char *p = v->buf; *p; p++) n += *p == ',';
  v->items = malloc((size_t)n * sizeof *v->items);
  if (!v->items) goto oom;
  char *p = v->buf;
  for (int i = 0; i < n; i++) {
    char *comma = strchr(p, ',');
    if (comma) *comma = '\0';
    v->items[i] = trim_in_place(p);
    p = comma ? comma + 1 : p + strlen(p);
  }
  v->n_items = n;
  return 0;
oom:
  val_free(v);
  return -1;
}

static void entry_free(entry *e) {
  free(e->section);
  free(e->key);
  val_free(&e->v);
  free(e->where);
  free(e->origin);
}

static void key_decl_free(key_decl *d) {
  free((char *)d->k.key);
  free((char *)d->k.def);
  free((char *)d->k.choices);
  free((char *)d->k.help);
  val_free(&d->def);
}

static const char *type_name(stoke_cfg_type t) {
  static const char *n[] = {"int", "float", "bool", "str", "enum", "ints", "list"};
  return (unsigned)t < sizeof n / sizeof *n ? n[t] : "?";
}

/* A range bound as text: integers without a fraction, else %g. */
static void fmt_num(double x, char buf[40]) {
  if (x == 0) snprintf(buf, 40, "0");
  else if (x == floor(x) && fabs(x) < 1e15) snprintf(buf, 40, "%.0f", x);
  else snprintf(buf, 40, "%g", x);
}

int stoke_edit_distance(const char *a, const char *b) {
  enum { M = 128 };
  size_t la = strlen(a), lb = strlen(b);
  if (la >= M || lb >= M) return 1 << 20;
  int prev[M], cur[M];
  for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
      int d = prev[j - 1] + cost;
      if (prev[j] + 1 < d) d = prev[j] + 1;
      if (cur[j - 1] + 1 < d) d = cur[j - 1] + 1;
      cur[j] = d;
    }
    memcpy(prev, cur, (lb + 1) * sizeof *prev);
  }
  return prev[lb];
}

/* Whether a candidate at distance d is close enough to `typed`. */
static int close_enough(const char *typed, int d) {
  int len = (int)strlen(typed);
  int limit = len / 3 > 2 ? len / 3 : 2;
  return d <= limit;
}

static cfg_section *find_section(const stoke_cfg *c, const char *name) {
  for (int i = 0; i < c->n_secs; i++)
    if (!strcmp(c->secs[i].name, name)) return &c->secs[i];
  return NULL;
}

static key_decl *find_key(const cfg_section *s, const char *key) {
  for (int i = 0; i < s->n_keys; i++)
    if (!strcmp(s->keys[i].k.key, key)) return &s->keys[i];
  return NULL;
}

/* The entry that decides a key: the last override, else the last file
 * entry (a later file wins over an earlier one). */
static const entry *find_entry(const stoke_cfg *c, const char *section,
                               const char *key) {
  const entry *from_file = NULL;
  for (int i = c->n_ents - 1; i >= 0; i--) {
    const entry *e = &c->ents[i];
    if (!e->key || strcmp(e->section, section) || strcmp(e->key, key)) continue;
    if (e->override) return e;
    if (!from_file) from_file = e;
  }
  return from_file;
}

/* Drop the entries from index `from` on (a failed load leaves no trace). */
static void drop_entries(stoke_cfg *c, int from) {
  for (int i = from; i < c->n_ents; i++) entry_free(&c->ents[i]);
  c->n_ents = from;
}

/* -------------------------------------------------------- value checks */

/* Parse one integer, the whole string. NULL or why it is not one. */
static char *parse_int(const char *s, int64_t *out) {
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (!*s || end == s || *end || isspace((unsigned char)*s))
    return fmt_alloc("not an integer");
  if (errno == ERANGE) return fmt_alloc("out of range for a 64-bit integer");
  *out = v;
  return NULL;
}

/* Parse one float, the whole string, finite. NULL or why it is not one. */
static char *parse_float(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || end == s || *end || isspace((unsigned char)*s))
    return fmt_alloc("not a number (float expected)");
  if (!isfinite(v)) return fmt_alloc("not a finite number");
  *out = v;
  return NULL;
}

static int bounded(const stoke_cfg_key_v1 *k) { return !(k->min == 0 && k->max == 0); }

/* Why x is outside the key's range, or NULL. */
static char *range_why(const stoke_cfg_key_v1 *k, double x) {
  if (!bounded(k) || (x >= k->min && x <= k->max)) return NULL;
  char lo[40], hi[40];
  fmt_num(k->min, lo);
  fmt_num(k->max, hi);
  return fmt_alloc("out of range [%s, %s]", lo, hi);
}

/* Whether `s` is one of the '|'-separated `choices` (case-sensitive). */
static int is_choice(const char *choices, const char *s) {
  size_t n = strlen(s);
  for (const char *p = choices;;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && !strncmp(p, s, n)) return 1;
    if (!bar) return 0;
    p = bar + 1;
  }
}

/* The nearest choice to `s` if close enough, copied into buf; else "". */
static void nearest_choice(const char *choices, const char *s, char *buf, size_t cap) {
  int best = -1;
  buf[0] = '\0';
  for (const char *p = choices;;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    char one[128];
    if (len < sizeof one) {
      memcpy(one, p, len);
      one[len] = '\0';
      int d = stoke_edit_distance(s, one);
      if ((best < 0 || d < best) && close_enough(s, d) && len < cap) {
        best = d;
        memcpy(buf, one, len + 1);
      }
    }
    if (!bar) return;
    p = bar + 1;
  }
}

/* Parsed forms of a value; what a getter reads out. */
typedef struct parsed {
  int64_t i;
  double f;
  int b;
  int64_t ints[STOKE_CFG_MAX_LIST];
  int n;
} parsed;

/* Check value `v` against declaration `k`. Returns NULL when good (and
 * fills *out if given), else the text that follows "key = " in the message,
 * e.g. "'abc': not a number (float expected)" (heap). */
static char *check_value(const stoke_cfg_key_v1 *k, const val *v, parsed *out) {
  parsed tmp;
  if (!out) out = &tmp;
  const char *s = v->text;
  char *why = NULL, *msg = NULL;
  switch (k->type) {
    case STOKE_CFG_INT:
      if ((why = parse_int(s, &out->i))) break;
      if ((why = range_why(k, (double)out->i))) {
        msg = fmt_alloc("%s: %s", s, why);
        free(why);
        return msg ? msg : fmt_alloc("bad value");
      }
      return NULL;
    case STOKE_CFG_FLOAT:
      if ((why = parse_float(s, &out->f))) break;
      if ((why = range_why(k, out->f))) {
        msg = fmt_alloc("%s: %s", s, why);
        free(why);
        return msg ? msg : fmt_alloc("bad value");
      }
      return NULL;
    case STOKE_CFG_BOOL: {
      static const char *yes[] = {"true", "yes", "on", "1"};
      static const char *no[] = {"false", "no", "off", "0"};
      for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) { out->b = 1; return NULL; }
        if (!strcasecmp(s, no[i])) { out->b = 0; return NULL; }
      }
      why = fmt_alloc("not a boolean (true/false, yes/no, on/off, 1/0)");
      break;
    }
    case STOKE_CFG_STR:
      return NULL;
    case STOKE_CFG_ENUM: {
      if (is_choice(k->choices, s)) return NULL;
      char near[128];
      nearest_choice(k->choices, s, near, sizeof near);
      if (near[0]) why = fmt_alloc("not one of %s (did you mean '%s'?)", k->choices, near);
      else why = fmt_alloc("not one of %s", k->choices);
      break;
    }
    case STOKE_CFG_INTS:
      if (v->n_items > STOKE_CFG_MAX_LIST) {
        why = fmt_alloc("more than %d values", STOKE_CFG_MAX_LIST);
        break;
      }
      for (int i = 0; i < v->n_items && !why; i++) {
        const char *item = v->items[i];
        char *w;
        if (!item[0]) {
          why = fmt_alloc("value %d is empty", i + 1);
        } else if ((w = parse_int(item, &out->ints[i]))) {
          why = fmt_alloc("value %d '%s' is %s", i + 1, item, w);
          free(w);
        } else if ((w = range_why(k, (double)out->ints[i]))) {
          why = fmt_alloc("value %d = %s is %s", i + 1, item, w);
          free(w);
        }
      }
      if (!why) { out->n = v->n_items; return NULL; }
      break;
    case STOKE_CFG_LIST:
      if (v->n_items > STOKE_CFG_MAX_LIST) {
        why = fmt_alloc("more than %d items", STOKE_CFG_MAX_LIST);
        break;
      }
      for (int i = 0; i < v->n_items && !why; i++)
        if (!v->items[i][0]) why = fmt_alloc("item %d is empty", i + 1);
      if (!why) { out->n = v->n_items; return NULL; }
      break;
    default:
      why = fmt_alloc("unknown type %d", (int)k->type);
      break;
  }
  msg = why ? fmt_alloc("'%s': %s", s, why) : NULL;
  free(why);
  return msg ? msg : fmt_alloc("bad value");
}

/* The error for a bad value of an entry (or of a default when e is NULL). */
static stoke_err *bad_value(const char *origin, const char *section,
                            const char *key, char *why) {
  stoke_err *err = STOKE_ERR(STOKE_E_INVALID, "%s: [%s] %s = %s", origin, section,
                             key, why ? why : "bad value");
  free(why);
  return err;
}

/* ------------------------------------------------------- unknown names */

/* "unknown section [x] (did you mean [y]?)" or the list of sections. */
static stoke_err *unknown_section(const stoke_cfg *c, const char *origin,
                                  const char *name) {
  const char *best = NULL;
  int best_d = 0;
  for (int i = 0; i < c->n_secs; i++) {
    int d = stoke_edit_distance(name, c->secs[i].name);
    if ((!best || d < best_d) && close_enough(name, d)) best = c->secs[i].name, best_d = d;
  }
  if (best)
    return STOKE_ERR(STOKE_E_INVALID, "%s: unknown section [%s] (did you mean [%s]?)",
                     origin, name, best);
  size_t n = 32;
  for (int i = 0; i < c->n_secs; i++) n += strlen(c->secs[i].name) + 4;
  char *list = malloc(n);
  if (!list) return OOM_ERR();
  list[0] = '\0';
  for (int i = 0; i < c->n_secs; i++) {
    if (i) strcat(list, ", ");
    strcat(list, "[");
    strcat(list, c->secs[i].name);
    strcat(list, "]");
  }
  stoke_err *e = STOKE_ERR(STOKE_E_INVALID, "%s: unknown section [%s] (sections: %s)",
                           origin, name, c->n_secs ? list : "none declared");
  free(list);
  return e;
}

/* "[s] unknown key 'x' (did you mean 'y'?)" or the keys of the section;
 * a key of another section ("[run] lr") or PyTorch's name for one of ours
 * ("num_workers") says where it is. */
static stoke_err *unknown_key(const stoke_cfg *c, const cfg_section *s, const char *origin, const char *key) {
  /* PyTorch's, nanoGPT's and llm.c's names, and where units differ, how */
  static const char *const alias[][4] = {
      {"num_workers", "data", "workers", NULL},
      {"max_steps", "run", "steps", NULL},
      {"max_iters", "run", "steps", NULL},
      {"learning_rate", "optimizer", "lr", NULL},
      {"max_epochs", "run", "epochs", NULL},
      {"prefetch_factor", "data", "prefetch", NULL},
      {"gradient_accumulation_steps", "run", "accumulate", NULL},
      {"max_grad_norm", "optimizer", "grad_clip", NULL},
      {"dtype", "run", "precision", NULL},
      {"amp", "run", "precision", NULL},
      {"warmup_iters", "optimizer", "warmup_epochs", "in epochs, not steps: warmup_iters / steps per epoch"},
      {"warmup_steps", "optimizer", "warmup_epochs", "in epochs, not steps: warmup_steps / steps per epoch"},
      {"lr_decay_iters", "optimizer", "schedule",
       "cosine decays over the whole run, [run] steps, down to min_lr: there is no separate decay length"},
      {"decay_lr", "optimizer", "schedule", "cosine or constant"},
      {"eval_interval", "run", "eval_every", "in epochs, not steps"},
      {"eval_iters", "eval_data", "length", "samples (token windows) per evaluation, not batches"},
      {"block_size", "data", "seq_len", "with [model] context and [eval_data] seq_len, all three the same"},
      {"always_save_checkpoint", "run", "checkpoint_every", "steps between saves"},
      {"compile", "run", "cuda_graph", "the nearest: the whole step as one CUDA graph"}};
  for (size_t a = 0; a < sizeof alias / sizeof *alias; a++) {
    const cfg_section *t = strcmp(key, alias[a][0]) ? NULL : find_section(c, alias[a][1]);
    for (int i = 0; t && i < t->n_keys; i++)
      if (!strcmp(t->keys[i].k.key, alias[a][2]))
        return STOKE_ERR(STOKE_E_INVALID, "%s: [%s] unknown key '%s': stoke's is [%s] %s%s%s%s", origin, s->name, key,
                         alias[a][1], alias[a][2], alias[a][3] ? " (" : "", alias[a][3] ? alias[a][3] : "",
                         alias[a][3] ? ")" : "");
  }
  for (int j = 0; j < c->n_secs; j++) {
    const cfg_section *t = &c->secs[j];
    if (t == s) continue;
    for (int i = 0; i < t->n_keys; i++)
      if (!strcmp(t->keys[i].k.key, key))
        return STOKE_ERR(STOKE_E_INVALID, "%s: [%s] unknown key '%s': it is a key of [%s] (%s.%s on the command line)",
                         origin, s->name, key, t->name, t->name, key);
  }
  const char *best = NULL;
  int best_d = 0;
  for (int i = 0; i < s->n_keys; i++) {
    int d = stoke_edit_distance(key, s->keys[i].k.key);
    if ((!best || d < best_d) && close_enough(key, d)) best = s->keys[i].k.key, best_d = d;
  }
  if (best)
    return STOKE_ERR(STOKE_E_INVALID, "%s: [%s] unknown key '%s' (did you mean '%s'?)",
                     origin, s->name, key, best);
  if (!s->n_keys)
    return STOKE_ERR(STOKE_E_INVALID, "%s: [%s] unknown key '%s' ([%s] has no keys)",
                     origin, s->name, key, s->name);
  size_t n = 1;
  for (int i = 0; i < s->n_keys; i++) n += strlen(s->keys[i].k.key) + 2;
  char *list = malloc(n);
  if (!list) return OOM_ERR();
  list[0] = '\0';
  for (int i = 0; i < s->n_keys; i++) {
    if (i) strcat(list, ", ");
    strcat(list, s->keys[i].k.key);
  }
  stoke_err *e = STOKE_ERR(STOKE_E_INVALID, "%s: [%s] unknown key '%s' (keys of [%s]: %s)",
                           origin, s->name, key, s->name, list);
  free(list);
  return e;
}

/* Check one raw entry: declared section and key, value that parses. */
static stoke_err *check_entry(const stoke_cfg *c, const entry *e) {
  const cfg_section *s = find_section(c, e->section);
  if (!e->key) return s ? NULL : unknown_section(c, e->origin, e->section);
  if (!s) {
    if (!e->override && !e->section_line)
      return STOKE_ERR(STOKE_E_INVALID, "%s: key '%s' is outside any [section]",
                       e->origin, e->key);
    return unknown_section(c, e->origin, e->section);
  }
  const key_decl *d = find_key(s, e->key);
  if (!d) return unknown_key(c, s, e->origin, e->key);
  char *why = check_value(&d->k, &e->v, NULL);
  return why ? bad_value(e->origin, e->section, e->key, why) : NULL;
}

/* ------------------------------------------------------------- new/free */

/* An empty config: nothing declared, nothing given. */
stoke_cfg *stoke_cfg_new(void) { return calloc(1, sizeof(stoke_cfg)); }

/* Free the config and every string it handed out. */
void stoke_cfg_free(stoke_cfg *c) {
  if (!c) return;
  for (int i = 0; i < c->n_secs; i++) {
    cfg_section *s = &c->secs[i];
    for (int j = 0; j < s->n_keys; j++) key_decl_free(&s->keys[j]);
    free(s->keys);
    free(s->name);
    free(s->help);
  }
  free(c->secs);
  drop_entries(c, 0);
  free(c->ents);
  free(c);
}

/* -------------------------------------------------------------- declare */

/* Whether a key name can be written in INI and on the command line. */
static int good_key_name(const char *k) {
  if (!k || !k[0]) return 0;
  for (const char *p = k; *p; p++)
    if (isspace((unsigned char)*p) || strchr("=:.;#[]", *p)) return 0;
  return 1;
}

/* Whether a section name can be written as "[name]". */
static int good_section_name(const char *s) {
  if (!s) return 0;
  for (const char *p = s; *p; p++)
    if (strchr("[]=;#\r\n", *p)) return 0;
  size_t n = strlen(s);
  return !n || (!isspace((unsigned char)s[0]) && !isspace((unsigned char)s[n - 1]));
}

/* Whether an ENUM's choices are "a|b|c" with no empty choice. */
static int good_choices(const char *ch) {
  if (!ch || !ch[0] || ch[0] == '|' || ch[strlen(ch) - 1] == '|') return 0;
  return !strstr(ch, "||");
}

/* Check one declaration and make its owned copy in *d. */
static stoke_err *make_key_decl(const char *section, const stoke_cfg_key_v1 *k,
                                key_decl *d) {
  memset(d, 0, sizeof *d);
  if (!good_key_name(k->key))
    return STOKE_ERR(STOKE_E_INTERNAL, "config section [%s]: bad key name '%s'", section,
                     k->key ? k->key : "(null)");
  if ((unsigned)k->type > STOKE_CFG_LIST)
    return STOKE_ERR(STOKE_E_INTERNAL, "config key [%s] %s: unknown type %d", section,
                     k->key, (int)k->type);
  if (k->type == STOKE_CFG_ENUM && !good_choices(k->choices))
    return STOKE_ERR(STOKE_E_INTERNAL, "config key [%s] %s: enum choices '%s' are not 'a|b|c'",
                     section, k->key, k->choices ? k->choices : "(null)");
  if (bounded(k) && !(k->min <= k->max))
    return STOKE_ERR(STOKE_E_INTERNAL, "config key [%s] %s: min > max", section, k->key);
  int fail = 0;
  d->k = *k;
  d->k.key = dup_or_null(k->key, &fail);
  d->k.def = dup_or_null(k->def ? k->def : "", &fail);
  d->k.choices = dup_or_null(k->choices, &fail);
  d->k.help = dup_or_null(k->help, &fail);
  if (fail || val_make(&d->def, d->k.def) < 0) {
    key_decl_free(d);
    return OOM_ERR();
  }
  char *why = check_value(&d->k, &d->def, NULL);
  if (why) {
    stoke_err *e = STOKE_ERR(STOKE_E_INTERNAL, "default of [%s] %s = %s", section, k->key, why);
    free(why);
    key_decl_free(d);
    return e;
  }
  return NULL;
}

/* Declare n keys of a section; all or nothing. */
stoke_err *stoke_cfg_declare(stoke_cfg *c, const char *section,
                             const char *section_help,
                             const stoke_cfg_key_v1 *keys, int n) {
  if (!c || !good_section_name(section) || n < 0 || (n > 0 && !keys))
    return STOKE_ERR(STOKE_E_INTERNAL, "stoke_cfg_declare: bad arguments (section '%s')",
                     section ? section : "(null)");
  cfg_section *s = find_section(c, section);
  for (int i = 0; i < n; i++) {
    const char *k = keys[i].key;
    int dup = 0;
    for (int j = 0; j < i && k; j++) dup |= keys[j].key && !strcmp(keys[j].key, k);
    if (k && dup)
      return STOKE_ERR(STOKE_E_DUPLICATE, "config key [%s] %s declared twice in one key table", section, k);
    if (k && s && find_key(s, k))
      return STOKE_ERR(STOKE_E_DUPLICATE,
                       "config key [%s] %s is declared already, by the core or a part loaded before (`train "
                       "--help-config` lists [%s]'s keys): a part may not declare it again; give the part's key "
                       "another name, or read the existing one (stoke_host->cfg_int and the like)",
                       section, k, section);
  }
  key_decl *tmp = n ? calloc((size_t)n, sizeof *tmp) : NULL;
  if (n && !tmp) return OOM_ERR();
  for (int i = 0; i < n; i++) {
    stoke_err *e = make_key_decl(section, &keys[i], &tmp[i]);
    if (e) {
      for (int j = 0; j < i; j++) key_decl_free(&tmp[j]);
      free(tmp);
      return e;
    }
  }
  int fail = 0;
  if (!s) {
    if (grow((void **)&c->secs, &c->cap_secs, c->n_secs + 1, sizeof *c->secs) < 0) goto oom;
    s = &c->secs[c->n_secs];
    memset(s, 0, sizeof *s);
    s->name = dup_or_null(section, &fail);
    s->help = dup_or_null(section_help, &fail);
    if (fail) {
      free(s->name);
      free(s->help);
      goto oom;
    }
    c->n_secs++;
  } else if (!s->help && section_help) {
    if (!(s->help = strdup(section_help))) goto oom;
  }
  if (grow((void **)&s->keys, &s->cap_keys, s->n_keys + n, sizeof *s->keys) < 0) goto oom;
  if (n) memcpy(s->keys + s->n_keys, tmp, (size_t)n * sizeof *tmp);
  s->n_keys += n;
  free(tmp);
  return NULL;
oom:
  for (int j = 0; j < n; j++) key_decl_free(&tmp[j]);
  free(tmp);
  return OOM_ERR();
}

/* -------------------------------------------------------------- parsing */

/* State of one file being read: the reader hands inih one line at a time
 * and counts lines, so the handler (called for the line just read) knows
 * its exact line number; the reader also tracks "[section]" headers. */
typedef struct parse_state {
  stoke_cfg *c;
  const char *name; /* file name for messages */
  const char *text;
  size_t len, pos;
  int line;
  const char *cur;  /* the line just read, without its end of line */
  size_t cur_len;
  char *section;    /* current section (trimmed), "" before any header */
  int section_line;
  int first;        /* first entry index of this load */
  stoke_err *err;
} parse_state;

/* Append an entry; takes ownership of nothing (copies what it needs). */
static stoke_err *add_entry(stoke_cfg *c, const char *section, const char *key,
                            const char *value, int override, int line,
                            int section_line, char *where, char *origin) {
  if (!where || !origin ||
      grow((void **)&c->ents, &c->cap_ents, c->n_ents + 1, sizeof *c->ents) < 0) {
    free(where);
    free(origin);
    return OOM_ERR();
  }
  entry *e = &c->ents[c->n_ents];
  memset(e, 0, sizeof *e);
  int fail = 0;
  e->section = dup_or_null(section, &fail);
  e->key = dup_or_null(key, &fail);
  e->override = override;
  e->line = line;
  e->section_line = section_line;
  e->where = where;
  e->origin = origin;
  if (fail || val_make(&e->v, value ? value : "") < 0) {
    entry_free(e);
    return OOM_ERR();
  }
  c->n_ents++;
  return NULL;
}

/* A file-located entry ("name:line") for the current parse. */
static stoke_err *add_file_entry(parse_state *p, const char *key, const char *value) {
  return add_entry(p->c, p->section, key, value, 0, p->line, p->section_line,
                   fmt_alloc("%s:%d", p->name, p->line),
                   fmt_alloc("%s:%d", p->name, p->line));
}

/* If the line is a "[section]" header (as inih reads one: '[' first, then
 * ']' before any inline comment), make it the current section. */
static void track_section(parse_state *p, const char *s, size_t n) {
  if (p->line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) s += 3, n -= 3;
  while (n && isspace((unsigned char)*s)) s++, n--;
  if (!n || *s != '[') return;
  size_t i = 1;
  int was_space = 0;
  for (; i < n && s[i] != ']'; i++) {
    if (was_space && strchr(";#", s[i])) return; /* comment: no ']' */
    was_space = isspace((unsigned char)s[i]);
  }
  if (i >= n) return; /* no ']': inih reports the syntax error */
  /* inih ignores the rest of the line; only a comment may follow ("[run] steps = 5" would lose the key) */
  size_t j = i + 1;
  while (j < n && isspace((unsigned char)s[j])) j++;
  if (j < n && !strchr(";#", s[j])) {
    p->err = STOKE_ERR(STOKE_E_INVALID, "%s:%d: text after the section header: '%.*s' (put each key = value on a line "
                       "of its own after [%.*s])", p->name, p->line, (int)(n - j > 40 ? 40 : n - j), s + j,
                       (int)(i - 1), s + 1);
    return;
  }
  char *name = dup_trim(s + 1, i - 1);
  if (!name) {
    p->err = OOM_ERR();
    return;
  }
  free(p->section);
  p->section = name;
  p->section_line = p->line;
  p->err = add_file_entry(p, NULL, NULL);
}

/* inih's fgets-like reader over the text in memory: one line per call,
 * counted; over-long lines and NUL bytes stop the parse with an error. */
static char *read_line(char *str, int num, void *stream) {
  parse_state *p = stream;
  if (p->err || p->pos >= p->len) return NULL;
  const char *s = p->text + p->pos;
  size_t rest = p->len - p->pos;
  const char *nl = memchr(s, '\n', rest);
  size_t n = nl ? (size_t)(nl - s) + 1 : rest; /* with the '\n' */
  p->pos += n;
  p->line++;
  size_t content = n;
  if (content && s[content - 1] == '\n') content--;
  if (content && s[content - 1] == '\r') content--;
  p->cur = s;
  p->cur_len = content;
  if (content > STOKE_CFG_MAX_LINE) {
    p->err = STOKE_ERR(STOKE_E_INVALID, "%s:%d: line longer than %d characters", p->name,
                       p->line, STOKE_CFG_MAX_LINE);
    return NULL;
  }
  if (memchr(s, '\0', n)) {
    p->err = STOKE_ERR(STOKE_E_INVALID, "%s:%d: NUL byte in line", p->name, p->line);
    return NULL;
  }
  if (memchr(s, '\r', content)) { /* lines ended by CR alone would be read as one line, its keys lost */
    p->err = STOKE_ERR(STOKE_E_INVALID, "%s:%d: a carriage return inside a line (the file's lines end with CR alone, "
                       "as old Mac files do?): save it with LF (or CR LF) line endings", p->name, p->line);
    return NULL;
  }
  if (num < 0 || n + 1 > (size_t)num) {
    p->err = STOKE_ERR(STOKE_E_INTERNAL, "%s:%d: inih line buffer too small (%d)", p->name,
                       p->line, num);
    return NULL;
  }
  memcpy(str, s, n);
  str[n] = '\0';
  track_section(p, s, content);
  return p->err ? NULL : str;
}

/* inih's handler for "name = value" on the line just read: refuse a key
 * given twice in this file, keep the entry raw. Returns 0 to stop. */
static int on_pair(void *user, const char *section, const char *name,
                   const char *value) {
  parse_state *p = user;
  (void)section; /* ours, trimmed and never truncated, is p->section */
  if (p->err) return 0;
  if (!name[0]) {
    p->err = STOKE_ERR(STOKE_E_INVALID, "%s:%d: syntax error: no key name before '='",
                       p->name, p->line);
    return 0;
  }
  for (int i = p->first; i < p->c->n_ents; i++) {
    const entry *e = &p->c->ents[i];
    if (e->key && !strcmp(e->section, p->section) && !strcmp(e->key, name)) {
      p->err = STOKE_ERR(STOKE_E_INVALID, "%s:%d: [%s] key '%s' given twice (first at line %d)",
                         p->name, p->line, p->section, name, e->line);
      return 0;
    }
  }
  p->err = add_file_entry(p, name, value);
  return !p->err;
}

/* The syntax error inih found on the line just read. */
static stoke_err *syntax_error(const parse_state *p, int line) {
  const char *s = p->cur ? p->cur : "";
  size_t n = p->cur ? p->cur_len : 0;
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  int shown = n > 60 ? 57 : (int)n;
  const char *more = n > 60 ? "..." : "";
  if (line != p->line) /* not expected with stop-on-first-error */
    return STOKE_ERR(STOKE_E_INVALID, "%s:%d: syntax error", p->name, line);
  if (n && *s == '[')
    return STOKE_ERR(STOKE_E_INVALID, "%s:%d: syntax error: '%.*s%s' has no closing ']'",
                     p->name, line, shown, s, more);
  return STOKE_ERR(STOKE_E_INVALID,
                   "%s:%d: syntax error: '%.*s%s' is not 'key = value', a [section] or a comment",
                   p->name, line, shown, s, more);
}

/* Parse INI text with inih under our options, restoring inih's globals
 * after: max line long enough that nothing is truncated (longer lines are
 * refused by read_line), ';' and '#' comments, inline comments after
 * whitespace, no multi-line continuation, stop on the first error. */
static stoke_err *parse_text(stoke_cfg *c, const char *name, const char *text, size_t len) {
  static char comment_prefixes[] = ";#";
  static char inline_prefixes[] = ";#";
  parse_state p = {.c = c, .name = name, .text = text, .len = len, .first = c->n_ents};
  p.section = strdup("");
  if (!p.section) return OOM_ERR();

  bool multi = ini_allow_multiline, bom = ini_allow_bom, inl = ini_allow_inline_comments;
  bool stack = ini_use_stack, re = ini_allow_realloc, stop = ini_stop_on_first_error;
  bool novalue = ini_allow_no_value;
  char *start_pre = ini_start_comment_prefixes, *inline_pre = ini_inline_comment_prefixes;
  int max_line = ini_max_line;

  ini_allow_multiline = false;
  ini_allow_bom = true;
  ini_allow_inline_comments = true;
  ini_start_comment_prefixes = comment_prefixes;
  ini_inline_comment_prefixes = inline_prefixes;
  ini_use_stack = true; /* a line buffer of ini_max_line bytes */
  ini_allow_realloc = false;
  ini_max_line = STOKE_CFG_MAX_LINE + 16; /* room for "\r\n\0" */
  ini_stop_on_first_error = true;
  ini_allow_no_value = false;

  int r = ini_parse_stream(read_line, &p, on_pair, &p);

  ini_allow_multiline = multi;
  ini_allow_bom = bom;
  ini_allow_inline_comments = inl;
  ini_start_comment_prefixes = start_pre;
  ini_inline_comment_prefixes = inline_pre;
  ini_use_stack = stack;
  ini_allow_realloc = re;
  ini_max_line = max_line;
  ini_stop_on_first_error = stop;
  ini_allow_no_value = novalue;

  stoke_err *err = p.err;
  if (!err && r > 0) err = syntax_error(&p, r);
  if (!err && r < 0) err = STOKE_ERR(STOKE_E_INTERNAL, "%s: inih failed (%d)", name, r);
  free(p.section);
  if (err) drop_entries(c, p.first);
  return err;
}

/* Read an INI file whole, then parse it. */
stoke_err *stoke_cfg_load_file(stoke_cfg *c, const char *path) {
  if (!c || !path) return STOKE_ERR(STOKE_E_INTERNAL, "stoke_cfg_load_file: NULL argument");
  char *buf;
  size_t len;
  stoke_err *err = stoke_read_file(path, "config", &buf, &len);
  if (!err) err = parse_text(c, path, buf, len);
  free(buf);
  return err;
}

/* Parse INI text given as a string; `name` stands for the file. */
stoke_err *stoke_cfg_load_string(stoke_cfg *c, const char *name, const char *text) {
  if (!c || !text) return STOKE_ERR(STOKE_E_INTERNAL, "stoke_cfg_load_string: NULL argument");
  return parse_text(c, name ? name : "<string>", text, strlen(text));
}

/* One "section.key=value" from the command line; split at the first '='
 * and the last '.' before it (section names may hold dots). */
stoke_err *stoke_cfg_override(stoke_cfg *c, const char *assignment) {
  if (!c) return STOKE_ERR(STOKE_E_INTERNAL, "stoke_cfg_override: NULL config");
  const char *a = assignment ? assignment : "";
  const char *eq = strchr(a, '=');
  const char *dot = NULL;
  for (const char *p = a; eq && p < eq; p++)
    if (*p == '.') dot = p;
  char *section = dot ? dup_trim(a, (size_t)(dot - a)) : NULL;
  char *key = dot ? dup_trim(dot + 1, (size_t)(eq - dot - 1)) : NULL;
  char *value = eq ? dup_trim(eq + 1, strlen(eq + 1)) : NULL;
  stoke_err *err = NULL;
  if (!eq || !dot) {
    err = STOKE_ERR(STOKE_E_INVALID, "command line: '%s': expected section.key=value", a);
  } else if (!section || !key || !value) {
    err = OOM_ERR();
  } else if (!key[0]) {
    err = STOKE_ERR(STOKE_E_INVALID, "command line: '%s': no key name; expected section.key=value", a);
  } else if (strpbrk(value, "\r\n")) {
    err = STOKE_ERR(STOKE_E_INVALID, "command line: %s.%s: a value cannot hold a line break",
                    section, key);
  } else {
    err = add_entry(c, section, key, value, 1, 0, 0, strdup("command line"),
                    fmt_alloc("command line: %s.%s=%s", section, key, value));
  }
  free(section);
  free(key);
  free(value);
  return err;
}

/* ------------------------------------------------------------- checking */

/* Every raw entry, in the order given: the first problem. */
stoke_err *stoke_cfg_validate(const stoke_cfg *c) { return stoke_cfg_validate_but(c, NULL, 0); }

stoke_err *stoke_cfg_validate_but(const stoke_cfg *c, const char *const *later, int n_later) {
  if (!c) return STOKE_ERR(STOKE_E_INTERNAL, "stoke_cfg_validate: NULL config");
  for (int i = 0; i < c->n_ents; i++) {
    const entry *en = &c->ents[i];
    int skip = 0;
    for (int k = 0; k < n_later && !skip; k++) skip = en->section && !strcmp(en->section, later[k]);
    if (skip) continue;
    /* a declared key whose value an override (or a later file) replaced is
     * not checked: `train run.ini model.name=x model.hidden=128` must be able
     * to replace a value the new model would reject */
    const cfg_section *s = en->key ? find_section(c, en->section) : NULL;
    if (s && find_key(s, en->key) && find_entry(c, en->section, en->key) != en) continue;
    stoke_err *e = check_entry(c, en);
    if (e) return e;
  }
  return NULL;
}

/* ------------------------------------------------------------- getters */

/* Find a declared key read as type `want` (ENUM goes with STR) and parse
 * its effective value; *v is the value used. */
static stoke_err *read_key(const stoke_cfg *c, const char *section, const char *key,
                           stoke_cfg_type want, const char *getter, parsed *out,
                           const val **v) {
  if (!c || !section || !key)
    return STOKE_ERR(STOKE_E_INTERNAL, "%s: NULL argument", getter);
  const cfg_section *s = find_section(c, section);
  const key_decl *d = s ? find_key(s, key) : NULL;
  if (!d)
    return STOKE_ERR(STOKE_E_INTERNAL, "config key [%s] %s is not declared (read with %s)",
                     section, key, getter);
  stoke_cfg_type t = d->k.type == STOKE_CFG_ENUM ? STOKE_CFG_STR : d->k.type;
  if (t != want)
    return STOKE_ERR(STOKE_E_INTERNAL, "config key [%s] %s is %s, read with %s", section, key,
                     type_name(d->k.type), getter);
  const entry *e = find_entry(c, section, key);
  *v = e ? &e->v : &d->def;
  char *why = check_value(&d->k, *v, out);
  return why ? bad_value(e ? e->origin : "default", section, key, why) : NULL;
}

/* INT value. */
stoke_err *stoke_cfg_int(const stoke_cfg *c, const char *section, const char *key,
                         int64_t *out) {
  parsed p;
  const val *v;
  stoke_err *e = read_key(c, section, key, STOKE_CFG_INT, "stoke_cfg_int", &p, &v);
  if (!e) *out = p.i;
  return e;
}

/* FLOAT value. */
stoke_err *stoke_cfg_float(const stoke_cfg *c, const char *section, const char *key,
                           double *out) {
  parsed p;
  const val *v;
  stoke_err *e = read_key(c, section, key, STOKE_CFG_FLOAT, "stoke_cfg_float", &p, &v);
  if (!e) *out = p.f;
  return e;
}

/* BOOL value as 0/1. */
stoke_err *stoke_cfg_bool(const stoke_cfg *c, const char *section, const char *key,
                          int *out) {
  parsed p;
  const val *v;
  stoke_err *e = read_key(c, section, key, STOKE_CFG_BOOL, "stoke_cfg_bool", &p, &v);
  if (!e) *out = p.b;
  return e;
}

/* STR or ENUM value; the string lives as long as the config. */
stoke_err *stoke_cfg_str(const stoke_cfg *c, const char *section, const char *key,
                         const char **out) {
  parsed p;
  const val *v;
  stoke_err *e = read_key(c, section, key, STOKE_CFG_STR, "stoke_cfg_str", &p, &v);
  if (!e) *out = v->text;
  return e;
}

/* INTS values into out[STOKE_CFG_MAX_LIST]; *n how many. */
stoke_err *stoke_cfg_ints(const stoke_cfg *c, const char *section, const char *key,
                          int64_t *out, int *n) {
  parsed p;
  const val *v;
  stoke_err *e = read_key(c, section, key, STOKE_CFG_INTS, "stoke_cfg_ints", &p, &v);
  if (e) return e;
  for (int i = 0; i < p.n; i++) out[i] = p.ints[i];
  *n = p.n;
  return NULL;
}

/* LIST items into out[STOKE_CFG_MAX_LIST]; strings live with the config. */
stoke_err *stoke_cfg_list(const stoke_cfg *c, const char *section, const char *key,
                          const char **out, int *n) {
  parsed p;
  const val *v;
  stoke_err *e = read_key(c, section, key, STOKE_CFG_LIST, "stoke_cfg_list", &p, &v);
  if (e) return e;
  for (int i = 0; i < p.n; i++) out[i] = v->items[i];
  *n = p.n;
  return NULL;
}

/* "run.ini:12", "command line" or "default". */
const char *stoke_cfg_where(const stoke_cfg *c, const char *section, const char *key) {
  const entry *e = c && section && key ? find_entry(c, section, key) : NULL;
  return e ? e->where : "default";
}

/* 1 if the key was given in a file or on the command line. */
int stoke_cfg_is_set(const stoke_cfg *c, const char *section, const char *key) {
  return c && section && key && find_entry(c, section, key) != NULL;
}

int stoke_cfg_drop_undeclared(stoke_cfg *c, const char *section, char *dropped, size_t cap) {
  const cfg_section *s = find_section(c, section);
  int n = 0, kept = 0;
  size_t used = 0;
  if (cap) dropped[0] = 0;
  for (int i = 0; i < c->n_ents; i++) {
    entry *e = &c->ents[i];
    if (e->key && !e->override && !strcmp(e->section, section) && !(s && find_key(s, e->key))) {
      if (used < cap)
        used += (size_t)snprintf(dropped + used, cap - used, "%s%s (%s)", n ? ", " : "", e->key, e->where);
      n++;
      entry_free(e);
      continue;
    }
    c->ents[kept++] = *e;
  }
  c->n_ents = kept;
  return n;
}

int stoke_cfg_file_keys(const stoke_cfg *c) {
  int n = 0;
  for (int i = 0; c && i < c->n_ents; i++) n += c->ents[i].key && !c->ents[i].override;
  return n;
}

/* ------------------------------------------------------- dump and help */

/* Write text as comment lines: "<lead>; " before each of its lines. */
static void put_comment(FILE *f, const char *lead, const char *text, const char *tail) {
  fprintf(f, "%s; ", lead);
  for (const char *p = text; *p; p++) {
    if (*p == '\n') fprintf(f, "\n%s; ", lead);
    else if (*p != '\r') fputc(*p, f);
  }
  fprintf(f, "%s\n", tail);
}

/* The resolved config as INI text that loads back: each key preceded by
 * "; help", marked "(set at ...)" when not a default. */
void stoke_cfg_dump(const stoke_cfg *c, FILE *f) {
  if (!c || !f) return;
  fprintf(f, "; stoke config: every declared key with its resolved value\n");
  for (int i = 0; i < c->n_secs; i++) {
    const cfg_section *s = &c->secs[i];
    fprintf(f, "\n[%s]\n", s->name);
    if (s->help && s->help[0]) put_comment(f, "", s->help, "");
    for (int j = 0; j < s->n_keys; j++) {
      const key_decl *d = &s->keys[j];
      const entry *e = find_entry(c, s->name, d->k.key);
      char tail[512] = "";
      if (e) snprintf(tail, sizeof tail, " (set at %s)", e->where);
      put_comment(f, "", d->k.help && d->k.help[0] ? d->k.help : "(no help)", tail);
      const char *v = e ? e->v.text : d->def.text;
      fprintf(f, "%s =%s%s\n", d->k.key, v[0] ? " " : "", v);
    }
  }
}

/* `--help-config`: each section with its help, each key with type,
 * default, range, choices and help. */
void stoke_cfg_help(const stoke_cfg *c, FILE *f) {
  if (!c || !f) return;
  for (int i = 0; i < c->n_secs; i++) {
    const cfg_section *s = &c->secs[i];
    if (i) fputc('\n', f);
    fprintf(f, "[%s]", s->name);
    if (s->help && s->help[0]) fprintf(f, "  %s", s->help);
    fputc('\n', f);
    for (int j = 0; j < s->n_keys; j++) {
      const stoke_cfg_key_v1 *k = &s->keys[j].k;
      fprintf(f, "  %s (%s, default: ", k->key, type_name(k->type));
      if (k->def[0]) fputs(k->def, f);
      else fputs("\"\"", f);
      if (bounded(k) && (k->type == STOKE_CFG_INT || k->type == STOKE_CFG_FLOAT ||
                         k->type == STOKE_CFG_INTS)) {
        char lo[40], hi[40];
        fmt_num(k->min, lo);
        fmt_num(k->max, hi);
        fprintf(f, ", range [%s, %s]", lo, hi);
      }
      if (k->type == STOKE_CFG_ENUM) fprintf(f, ", one of %s", k->choices);
      fprintf(f, ")");
      if (k->help && k->help[0]) {
        fputc(' ', f);
        for (const char *p = k->help; *p; p++) {
          if (*p == '\n') fputs("\n      ", f);
          else if (*p != '\r') fputc(*p, f);
        }
      }
      fputc('\n', f);
    }
  }
}
