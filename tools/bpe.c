/* tools/bpe.c: GPT-2's BPE (see bpe.h). The text is cut into pre-tokens by
 * GPT-2's pattern through PCRE2 (Debian's libpcre2: Unicode letters and
 * numbers); with \s spelled out as JavaScript's whitespace class, so the
 * cuts are those of npm's gpt-3-encoder, the reference the tests compare
 * against. Each pre-token's bytes map to printable characters
 * (bytes_to_unicode), are merged pair by pair in rank order and looked up
 * in the encoder. encoder.json is a flat object of strings to integers,
 * parsed here (Debian's JSON libraries are shared-only; this tool must run
 * where they are not installed). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "bpe.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* JavaScript's \s (ECMAScript WhiteSpace and LineTerminator). */
#define JS_WS "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
static const char pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" JS_WS "\\p{L}\\p{N}]+|[" JS_WS
                              "]+(?![^" JS_WS "])|[" JS_WS "]+";

/* ------------------------------------------------------- string -> int */

typedef struct smap {
  char **key;
  int32_t *val;
  size_t cap; /* a power of two, at least twice the entries */
} smap;

static uint64_t fnv(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static int smap_init(smap *m, size_t entries) {
  m->cap = 1024;
  while (m->cap < 2 * entries) m->cap *= 2;
  m->key = calloc(m->cap, sizeof *m->key);
  m->val = calloc(m->cap, sizeof *m->val);
  return m->key && m->val ? 0 : -1;
}

static size_t smap_slot(const smap *m, const char *k, size_t n) {
  size_t i = (size_t)fnv(k, n) & (m->cap - 1);
  while (m->key[i] && !(strlen(m->key[i]) == n && !memcmp(m->key[i], k, n))) i = (i + 1) & (m->cap - 1);
  return i;
}

/* Takes `k` (malloc'ed); 0, or -1 when it was there already. */
static int smap_put(smap *m, char *k, int32_t v) {
  size_t i = smap_slot(m, k, strlen(k));
  if (m->key[i]) {
    free(k);
    return -1;
  }
  m->key[i] = k;
  m->val[i] = v;
  return 0;
}

static int32_t smap_get(const smap *m, const char *k, size_t n) {
  size_t i = smap_slot(m, k, n);
  return m->key[i] ? m->val[i] : -1;
}

static void smap_free(smap *m) {
  for (size_t i = 0; m->key && i < m->cap; i++) free(m->key[i]);
  free(m->key);
  free(m->val);
}

/* ------------------------------------------------------------- loading */

struct stoke_bpe {
  smap enc, ranks;             /* token -> id; "first second" -> merge rank */
  char byte_char[256][3];      /* bytes_to_unicode, as UTF-8 */
  short byte_of[324];          /* its inverse: code point (< 256 + 68) -> byte, -1 for none */
  const char *token[STOKE_BPE_VOCAB]; /* id -> its token (a key of enc), for decoding */
  pcre2_code *re;
  pcre2_match_data *md;
};

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other
 * 68 to U+0100 onwards, in byte order. */
static void make_byte_chars(stoke_bpe *b) {
  int n = 0;
  memset(b->byte_of, 0xff, sizeof b->byte_of);
  for (int c = 0; c < 256; c++) {
    int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    int cp = printable ? c : 256 + n++;
    b->byte_of[cp] = (short)c;
    char *o = b->byte_char[c];
    if (cp < 0x80) o[0] = (char)cp, o[1] = 0;
    else o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
  }
}

static void put_utf8(char **o, unsigned cp) {
  unsigned char *p = (unsigned char *)*o;
  if (cp < 0x80) *p++ = (unsigned char)cp;
  else if (cp < 0x800) *p++ = (unsigned char)(0xC0 | cp >> 6), *p++ = (unsigned char)(0x80 | (cp & 0x3F));
  else if (cp < 0x10000)
    *p++ = (unsigned char)(0xE0 | cp >> 12), *p++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)),
    *p++ = (unsigned char)(0x80 | (cp & 0x3F));
  else
    *p++ = (unsigned char)(0xF0 | cp >> 18), *p++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F)),
    *p++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), *p++ = (unsigned char)(0x80 | (cp & 0x3F));
  *o = (char *)p;
}

/* A JSON string at *s (past its opening quote) into malloc'ed UTF-8. */
static char *json_string(const char **s) {
  const char *p = *s, *end = p;
  /* the string's own length (an escape skips the character after it): not
   * the rest of the file's, which made loading encoder.json quadratic (a
   * 1 MB strlen and allocation per token; 30 s under ASan) */
  while (*end && *end != '"') end += end[0] == '\\' && end[1] ? 2 : 1;
  char *out = malloc(4 * (size_t)(end - p) + 1), *o = out;
  if (!out) return NULL;
  /* everything below stays inside [*s, end): an escape cut short by the
   * string's end (or the file's) ends it */
  while (p < end) {
    if (*p != '\\') {
      *o++ = *p++;
      continue;
    }
    p++;
    if (p >= end) break;
    char c = *p++;
    if (c == 'u') {
      if (end - p < 4) break;
      unsigned cp = (unsigned)strtoul((char[5]){p[0], p[1], p[2], p[3], 0}, NULL, 16);
      p += 4;
      if (cp >= 0xD800 && cp < 0xDC00 && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
        unsigned lo = (unsigned)strtoul((char[5]){p[2], p[3], p[4], p[5], 0}, NULL, 16);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        p += 6;
      }
      put_utf8(&o, cp);
    } else {
      *o++ = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
    }
  }
  *o = 0;
  *s = *end ? end + 1 : end;
  return out;
}

/* encoder.json: {"token": id, ...} */
static stoke_err *load_encoder(stoke_bpe *b, const char *text, const char *path) {
  stoke_err *e = smap_init(&b->enc, 65536) ? STOKE_ERR(STOKE_E_OOM, "bpe: out of memory") : NULL;
  const char *p = text;
  int count = 0;
  while (!e && (p = strchr(p, '"'))) {
    p++;
    char *key = json_string(&p);
    while (*p == ' ' || *p == ':') p++;
    char *end;
    long id = strtol(p, &end, 10);
    if (!key || end == p || id < 0 || id >= STOKE_BPE_VOCAB) {
      free(key);
      e = STOKE_ERR(STOKE_E_DATA, "bpe: '%s' is not GPT-2's encoder.json (entry %d)", path, count);
      break;
    }
    if (smap_put(&b->enc, key, (int32_t)id)) { /* frees key */
      e = STOKE_ERR(STOKE_E_DATA, "bpe: '%s': entry %d repeats a token", path, count);
      break;
    }
    p = end;
    count++;
  }
  for (size_t i = 0; !e && i < b->enc.cap; i++)
    if (b->enc.key[i]) b->token[b->enc.val[i]] = b->enc.key[i];
  if (!e && count != STOKE_BPE_VOCAB)
    e = STOKE_ERR(STOKE_E_DATA, "bpe: '%s' has %d tokens, GPT-2's encoder.json has %d", path, count, STOKE_BPE_VOCAB);
  return e;
}

/* vocab.bpe: "#version: 0.2" then one merge "first second" a line, by rank. */
static stoke_err *load_merges(stoke_bpe *b, char *text, const char *path) {
  stoke_err *e = smap_init(&b->ranks, 65536) ? STOKE_ERR(STOKE_E_OOM, "bpe: out of memory") : NULL;
  int rank = 0;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line && !e; line = strtok_r(NULL, "\n", &save)) {
    size_t len = strlen(line);
    if (len && line[len - 1] == '\r') line[len - 1] = 0; /* CR LF line endings (a copy made on Windows) */
    if (!strncmp(line, "#version", 8) || !line[0]) continue; /* merges of '#' start with '#' too */
    char *sp = strchr(line, ' ');
    char *k = sp ? strdup(line) : NULL;
    if (!k || smap_put(&b->ranks, k, rank++))
      e = STOKE_ERR(STOKE_E_DATA, "bpe: '%s' line '%.40s' is not a merge \"first second\"", path, line);
  }
  if (!e && rank != STOKE_BPE_VOCAB - 257)
    e = STOKE_ERR(STOKE_E_DATA, "bpe: '%s' has %d merges, GPT-2's vocab.bpe has %d", path, rank, STOKE_BPE_VOCAB - 257);
  return e;
}

stoke_err *stoke_bpe_load(const char *encoder_json, const char *vocab_bpe, stoke_bpe **out) {
  char *enc = NULL, *merges = NULL;
  size_t n;
  stoke_err *e = stoke_read_file(encoder_json, "GPT-2 tokenizer file", &enc, &n);
  if (!e) e = stoke_read_file(vocab_bpe, "GPT-2 tokenizer file", &merges, &n);
  if (!e) e = stoke_bpe_parse(enc, merges, encoder_json, vocab_bpe, out);
  free(enc);
  free(merges);
  return e;
}

stoke_err *stoke_bpe_parse(const char *encoder_text, char *merges_text, const char *encoder_name,
                           const char *merges_name, stoke_bpe **out) {
  stoke_bpe *b = calloc(1, sizeof *b);
  if (!b) return STOKE_ERR(STOKE_E_OOM, "bpe: out of memory");
  make_byte_chars(b);
  stoke_err *e = load_encoder(b, encoder_text, encoder_name);
  if (!e) e = load_merges(b, merges_text, merges_name);
  int code;
  PCRE2_SIZE at;
  if (!e) b->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &code,
                                &at, NULL);
  if (!e && !b->re) e = STOKE_ERR(STOKE_E_INTERNAL, "bpe: GPT-2's pattern did not compile (PCRE2 error %d at %zu)", code, at);
  if (!e && !(b->md = pcre2_match_data_create_from_pattern(b->re, NULL))) e = STOKE_ERR(STOKE_E_OOM, "bpe: out of memory");
  if (e) {
    stoke_bpe_free(b);
    return e;
  }
  *out = b;
  return NULL;
}

void stoke_bpe_free(stoke_bpe *b) {
  if (!b) return;
  smap_free(&b->enc);
  smap_free(&b->ranks);
  if (b->md) pcre2_match_data_free(b->md);
  if (b->re) pcre2_code_free(b->re);
  free(b);
}

/* ------------------------------------------------------------ encoding */

/* The rank of merging symbols a and b, or -1. */
static int32_t pair_rank(const stoke_bpe *b, const char *a, const char *c) {
  char key[512];
  int n = snprintf(key, sizeof key, "%s %s", a, c);
  return n < (int)sizeof key ? smap_get(&b->ranks, key, (size_t)n) : -1;
}

/* A candidate merge: the pair (left, right) of linked symbols, with the
 * versions both had when it was formed (a symbol that merged since has
 * another string, so the candidate is stale). */
typedef struct {
  int32_t rank;
  uint32_t left, right, lver, rver;
} bpe_cand;

static int cand_less(const bpe_cand *a, const bpe_cand *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c) {
  size_t i = (*n)++;
  while (i && cand_less(&c, &h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
  bpe_cand top = h[0], last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
    if (!cand_less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

/* One pre-token: its byte characters as symbols, merged by lowest rank
 * until no pair is a merge, then looked up. encoder.py's bpe() scans every
 * pair for the lowest rank, then merges each of its occurrences left to
 * right: quadratic in the word, so a long run of letters or digits (a
 * base64 blob, a hash) took hours. Here the pairs wait in a heap ordered by
 * (rank, position), and the symbols are a linked list, O(n log n); the
 * pairs a merge forms are held back until every occurrence of the pair
 * being merged is done (GPT-2's ranks never need that, a merge's parts
 * being older merges, but other files might), so the result is bpe()'s. */
static stoke_err *bpe_token(const stoke_bpe *b, const unsigned char *s, size_t n, int32_t **ids, int64_t *count,
                            int64_t *cap) {
  if (!n) return NULL;
  if (n > UINT32_MAX / 2) return STOKE_ERR(STOKE_E_INVALID, "bpe: a pre-token of %zu bytes (at most 2^31)", n);
  char **sym = calloc(n, sizeof *sym);
  uint32_t *next = malloc(sizeof *next * n), *prev = malloc(sizeof *prev * n), *ver = calloc(n, sizeof *ver);
  /* pushes: n - 1 pairs, then at most 2 a merge (n - 1 merges); held: at most 2 a merge of one round */
  bpe_cand *heap = malloc(sizeof *heap * 3 * n), *held = malloc(sizeof *held * 2 * n);
  stoke_err *e = sym && next && prev && ver && heap && held ? NULL : STOKE_ERR(STOKE_E_OOM, "bpe: out of memory");
  const uint32_t none = UINT32_MAX;
  size_t nh = 0, nheld = 0;
  for (size_t i = 0; i < n && !e; i++) {
    if (!(sym[i] = strdup(b->byte_char[s[i]]))) e = STOKE_ERR(STOKE_E_OOM, "bpe: out of memory");
    next[i] = i + 1 < n ? (uint32_t)i + 1 : none;
    prev[i] = i ? (uint32_t)i - 1 : none;
  }
  for (size_t i = 0; i + 1 < n && !e; i++) {
    int32_t r = pair_rank(b, sym[i], sym[i + 1]);
    if (r >= 0) heap_push(heap, &nh, (bpe_cand){r, (uint32_t)i, (uint32_t)i + 1, 0, 0});
  }
  int32_t merging = -1;
  while (!e) {
    if (!nh || heap[0].rank != merging) { /* every occurrence of `merging` done: the held pairs join */
      for (size_t i = 0; i < nheld; i++) heap_push(heap, &nh, held[i]);
      nheld = 0;
      if (!nh) break;
      merging = heap[0].rank;
    }
    bpe_cand c = heap_pop(heap, &nh);
    /* stale: a side merged since (its version moved), or the two are no longer neighbors */
    if (!sym[c.left] || !sym[c.right] || ver[c.left] != c.lver || ver[c.right] != c.rver || next[c.left] != c.right)
      continue;
    size_t la = strlen(sym[c.left]), lb = strlen(sym[c.right]);
    char *m = malloc(la + lb + 1);
    if (!m) {
      e = STOKE_ERR(STOKE_E_OOM, "bpe: out of memory");
      break;
    }
    memcpy(m, sym[c.left], la);
    memcpy(m + la, sym[c.right], lb + 1);
    free(sym[c.left]);
    free(sym[c.right]);
    sym[c.left] = m, sym[c.right] = NULL;
    ver[c.left]++;
    next[c.left] = next[c.right];
    if (next[c.right] != none) prev[next[c.right]] = c.left;
    uint32_t p = prev[c.left], q = next[c.left];
    int32_t r;
    if (p != none && (r = pair_rank(b, sym[p], m)) >= 0) held[nheld++] = (bpe_cand){r, p, c.left, ver[p], ver[c.left]};
    if (q != none && (r = pair_rank(b, m, sym[q])) >= 0) held[nheld++] = (bpe_cand){r, c.left, q, ver[c.left], ver[q]};
  }
  for (uint32_t i = 0; !e && i != none; i = next[i]) {
    int32_t id = smap_get(&b->enc, sym[i], strlen(sym[i]));
    if (id < 0) e = STOKE_ERR(STOKE_E_DATA, "bpe: '%s' is not in encoder.json (mismatched files?)", sym[i]);
    if (!e && *count == *cap) {
      int32_t *ni = realloc(*ids, sizeof *ni * (size_t)(*cap = *cap ? 2 * *cap : 4096));
      if (!ni) e = STOKE_ERR(STOKE_E_OOM, "bpe: out of memory");
      else *ids = ni;
    }
    if (!e) (*ids)[(*count)++] = id;
  }
  for (size_t i = 0; sym && i < n; i++) free(sym[i]);
  free(sym), free(next), free(prev), free(ver), free(heap), free(held);
  return e;
}

stoke_err *stoke_bpe_encode(const stoke_bpe *b, const char *text, size_t n, int32_t **ids, int64_t *count) {
  int64_t cap = 0;
  *ids = NULL;
  *count = 0;
  if (!b) { /* byte level: the ids are the bytes */
    if (!(*ids = malloc(sizeof(int32_t) * (n ? n : 1)))) return STOKE_ERR(STOKE_E_OOM, "bpe: out of memory");
    for (size_t i = 0; i < n; i++) (*ids)[i] = (unsigned char)text[i];
    *count = (int64_t)n;
    return NULL;
  }
  stoke_err *e = NULL;
  PCRE2_SIZE at = 0;
  while (!e && at < n) {
    int rc = pcre2_match(b->re, (PCRE2_SPTR)text, n, at, 0, b->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) { /* only bytes no pattern matches are left: invalid UTF-8 */
      e = bpe_token(b, (const unsigned char *)text + at, n - at, ids, count, &cap);
      break;
    }
    if (rc < 0) {
      e = STOKE_ERR(STOKE_E_INTERNAL, "bpe: PCRE2 match error %d at byte %zu", rc, (size_t)at);
      break;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
    /* PCRE2_MATCH_INVALID_UTF steps over bytes that are not UTF-8: they pass as bytes, a pre-token of their
     * own (byte-level BPE encodes any byte), so that decoding gives the text back */
    if (ov[0] > at) e = bpe_token(b, (const unsigned char *)text + at, ov[0] - at, ids, count, &cap);
    if (e) break;
    if (ov[1] == ov[0]) { /* never for this pattern; step on rather than loop */
      at = ov[0] + 1;
      continue;
    }
    e = bpe_token(b, (const unsigned char *)text + ov[0], ov[1] - ov[0], ids, count, &cap);
    at = ov[1];
  }
  if (e) {
    free(*ids);
    *ids = NULL;
  }
  return e;
}

/* ------------------------------------------------------------ decoding */

size_t stoke_bpe_decode(const stoke_bpe *b, int32_t id, char *out, size_t cap) {
  const char *t = id >= 0 && id < STOKE_BPE_VOCAB ? b->token[id] : NULL;
  size_t n = 0;
  /* each UTF-8 character of the token (1 or 2 bytes: code points below
   * 324) is one byte_char: back to its byte */
  for (const unsigned char *u = (const unsigned char *)t; u && *u && n < cap;) {
    int two = *u >= 0x80;
    if (two && ((*u & 0xE0) != 0xC0 || (u[1] & 0xC0) != 0x80)) break; /* not a 2-byte character */
    unsigned cp = two ? (unsigned)(*u & 0x1F) << 6 | (u[1] & 0x3F) : *u;
    if (cp >= sizeof b->byte_of / sizeof *b->byte_of || b->byte_of[cp] < 0) break; /* not GPT-2's alphabet */
    out[n++] = (char)b->byte_of[cp];
    u += *u < 0x80 ? 1 : 2;
  }
  return n;
}
