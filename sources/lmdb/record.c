/* sources/lmdb/record.c: encode and decode stoke records and metadata, and
 * decode Caffe Datum protobufs by hand; see record.h for the layouts. */
#include "record.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t cap, const char *fmt, ...) {
  if (why && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ------------------------------------------------------ little-endian */

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* The first four bytes, printable, for "bad magic" messages. */
static void show4(const uint8_t *p, char out[20]) {
  int k = 0;
  for (int i = 0; i < 4; i++) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '"') out[k++] = (char)p[i];
    else k += snprintf(out + k, 5, "\\x%02x", p[i]);
  }
  out[k] = 0;
}

const char *stoke_rec_encoding_name(unsigned encoding) {
  return encoding == STOKE_ENC_RAW ? "raw" : encoding == STOKE_ENC_JPEG ? "jpeg" : "unknown";
}

/* ------------------------------------------------------------ records */

size_t stoke_rec_size(const stoke_rec *r) { return STOKE_REC_HEADER_BYTES + (size_t)r->payload_bytes; }

size_t stoke_rec_encode(const stoke_rec *r, void *buf, size_t cap) {
  size_t n = stoke_rec_size(r);
  if (cap < n) return 0;
  uint8_t *p = buf;
  memcpy(p, STOKE_REC_MAGIC, 4);
  put16(p + 4, STOKE_REC_VERSION);
  p[6] = r->encoding;
  p[7] = 0;
  put32(p + 8, (uint32_t)r->label);
  put32(p + 12, r->height);
  put32(p + 16, r->width);
  put32(p + 20, r->channels);
  put32(p + 24, r->payload_bytes);
  if (r->payload_bytes) memcpy(p + STOKE_REC_HEADER_BYTES, r->payload, r->payload_bytes);
  return n;
}

int stoke_rec_decode(const void *val, size_t n, stoke_rec *out, char *why, size_t cap) {
  const uint8_t *p = val;
  if (n < 4) return fail(why, cap, "value is %zu bytes, too short to hold the 4-byte magic \"" STOKE_REC_MAGIC "\"", n);
  if (memcmp(p, STOKE_REC_MAGIC, 4)) {
    char m[20];
    show4(p, m);
    return fail(why, cap, "bad magic \"%s\", expected \"" STOKE_REC_MAGIC "\" (not a stoke record)", m);
  }
  if (n < STOKE_REC_HEADER_BYTES)
    return fail(why, cap, "truncated: value is %zu bytes, shorter than the %u-byte record header", n,
                STOKE_REC_HEADER_BYTES);
  unsigned version = get16(p + 4);
  if (version != STOKE_REC_VERSION)
    return fail(why, cap, "record version %u; this build reads version %u (convert the data again or update stoke)",
                version, STOKE_REC_VERSION);
  stoke_rec r = {.encoding = p[6],
                 .label = (int32_t)get32(p + 8),
                 .height = get32(p + 12),
                 .width = get32(p + 16),
                 .channels = get32(p + 20),
                 .payload_bytes = get32(p + 24),
                 .payload = p + STOKE_REC_HEADER_BYTES};
  if (r.encoding != STOKE_ENC_RAW && r.encoding != STOKE_ENC_JPEG)
    return fail(why, cap, "unknown encoding %u (0 = raw, 1 = jpeg)", r.encoding);
  if (p[7] != 0) return fail(why, cap, "reserved header byte is %u, must be 0", p[7]);
  if (!r.height || !r.width || !r.channels)
    return fail(why, cap, "zero dimension: height %u, width %u, channels %u", r.height, r.width, r.channels);
  size_t have = n - STOKE_REC_HEADER_BYTES;
  if (r.payload_bytes > have)
    return fail(why, cap, "truncated: header promises %u payload bytes, value holds %zu", r.payload_bytes, have);
  if (r.payload_bytes < have)
    return fail(why, cap, "inconsistent: header promises %u payload bytes, value holds %zu (trailing bytes)",
                r.payload_bytes, have);
  if (r.encoding == STOKE_ENC_RAW) {
    uint64_t want = (uint64_t)r.height * r.width * r.channels;
    if (want != r.payload_bytes)
      return fail(why, cap, "inconsistent: raw %ux%ux%u (HxWxC) needs %llu bytes, payload holds %u", r.height,
                  r.width, r.channels, (unsigned long long)want, r.payload_bytes);
  } else if (r.payload_bytes == 0) {
    return fail(why, cap, "empty JPEG payload");
  }
  *out = r;
  return 0;
}

void stoke_meta_encode(const stoke_meta *m, uint8_t out[STOKE_META_BYTES]) {
  memcpy(out, STOKE_META_MAGIC, 4);
  put16(out + 4, STOKE_META_VERSION);
  put16(out + 6, 0);
  put64(out + 8, m->count);
  put32(out + 16, m->classes);
  put32(out + 20, m->height);
  put32(out + 24, m->width);
  put32(out + 28, m->channels);
  out[32] = m->encoding;
}

int stoke_meta_decode(const void *val, size_t n, stoke_meta *out, char *why, size_t cap) {
  const uint8_t *p = val;
  if (n < 4) return fail(why, cap, "metadata is %zu bytes, too short to hold the magic \"" STOKE_META_MAGIC "\"", n);
  if (memcmp(p, STOKE_META_MAGIC, 4)) {
    char m[20];
    show4(p, m);
    return fail(why, cap, "bad metadata magic \"%s\", expected \"" STOKE_META_MAGIC "\"", m);
  }
  if (n < 6) return fail(why, cap, "truncated metadata: %zu bytes, expected %u", n, STOKE_META_BYTES);
  unsigned version = get16(p + 4);
  if (version != STOKE_META_VERSION)
    return fail(why, cap, "metadata version %u; this build reads version %u (convert the data again or update stoke)",
                version, STOKE_META_VERSION);
  if (n != STOKE_META_BYTES)
    return fail(why, cap, "%s metadata: %zu bytes, expected %u", n < STOKE_META_BYTES ? "truncated" : "inconsistent",
                n, STOKE_META_BYTES);
  stoke_meta m = {.count = get64(p + 8),
                  .classes = get32(p + 16),
                  .height = get32(p + 20),
                  .width = get32(p + 24),
                  .channels = get32(p + 28),
                  .encoding = p[32]};
  if (get16(p + 6) != 0) return fail(why, cap, "reserved metadata field is %u, must be 0", get16(p + 6));
  if (m.encoding != STOKE_ENC_RAW && m.encoding != STOKE_ENC_JPEG)
    return fail(why, cap, "metadata names unknown encoding %u (0 = raw, 1 = jpeg)", m.encoding);
  if (!m.height || !m.width || !m.channels)
    return fail(why, cap, "metadata has a zero dimension: height %u, width %u, channels %u", m.height, m.width,
                m.channels);
  if (m.encoding == STOKE_ENC_JPEG && m.channels != 1 && m.channels != 3)
    return fail(why, cap, "metadata declares JPEG with %u channels; JPEG records have 1 or 3", m.channels);
  if (m.classes < 1) return fail(why, cap, "metadata declares 0 classes");
  if (m.count > (uint64_t)STOKE_MAX_INDEX + 1)
    return fail(why, cap, "metadata declares %llu records, more than 10-digit keys can hold",
                (unsigned long long)m.count);
  *out = m;
  return 0;
}

int stoke_rec_key(int64_t index, char out[STOKE_KEY_DIGITS + 1]) {
  uint64_t v = index < 0 ? 0 : (uint64_t)index;
  for (int i = STOKE_KEY_DIGITS - 1; i >= 0; i--, v /= 10) out[i] = (char)('0' + v % 10);
  out[STOKE_KEY_DIGITS] = 0;
  return STOKE_KEY_DIGITS;
}

/* ------------------------------------------------------- Caffe Datum */

/* Reads a base-128 varint at *pos; -1 when it runs past `n` or past the
 * 10 bytes a 64-bit varint can take. */
static int varint(const uint8_t *p, size_t n, size_t *pos, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*pos >= n) return -1;
    uint8_t b = p[(*pos)++];
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
    if (shift == 63) return -1;
  }
  return -1;
}

int stoke_datum_decode(const void *val, size_t n, stoke_datum *out, char *why, size_t cap) {
  static const char *const names[] = {"?", "channels", "height", "width", "data", "label", "float_data", "encoded"};
  const uint8_t *p = val;
  stoke_datum d = {0};
  size_t pos = 0;
  if (n == 0) return fail(why, cap, "empty value (not a Caffe Datum)");
  while (pos < n) {
    size_t at = pos;
    uint64_t tag, v = 0;
    if (varint(p, n, &pos, &tag)) return fail(why, cap, "Datum: truncated field tag at byte %zu of %zu", at, n);
    uint64_t field = tag >> 3;
    unsigned wt = (unsigned)(tag & 7);
    if (field == 0) return fail(why, cap, "Datum: field number 0 at byte %zu (not a protobuf)", at);
    const uint8_t *bytes = NULL;
    switch (wt) {
      case 0: /* varint */
        if (varint(p, n, &pos, &v)) return fail(why, cap, "Datum: truncated varint of field %llu at byte %zu",
                                                (unsigned long long)field, at);
        break;
      case 1: /* 64-bit */
      case 5: { /* 32-bit */
        size_t w = wt == 1 ? 8 : 4;
        if (n - pos < w)
          return fail(why, cap, "Datum: truncated %zu-byte field %llu at byte %zu", w, (unsigned long long)field, at);
        pos += w;
        break;
      }
      case 2: { /* length-delimited */
        if (varint(p, n, &pos, &v))
          return fail(why, cap, "Datum: truncated length of field %llu at byte %zu", (unsigned long long)field, at);
        if (v > n - pos)
          return fail(why, cap, "Datum: truncated: field %llu at byte %zu claims %llu bytes, %zu remain",
                      (unsigned long long)field, at, (unsigned long long)v, n - pos);
        bytes = p + pos;
        pos += (size_t)v;
        break;
      }
      default:
        return fail(why, cap, "Datum: wire type %u of field %llu at byte %zu is not supported (not a Caffe Datum?)",
                    wt, (unsigned long long)field, at);
    }
    /* the wire type each known field must have (float_data: 5, or 2 packed) */
    if (field >= 1 && field <= 7) {
      int ok = field == 4 ? wt == 2 : field == 6 ? (wt == 5 || wt == 2) : wt == 0;
      if (!ok)
        return fail(why, cap, "Datum: field %llu (%s) has wire type %u at byte %zu; not a Caffe Datum",
                    (unsigned long long)field, names[field], wt, at);
    }
    switch (field) {
      case 1: d.channels = (int32_t)(uint32_t)v; break;
      case 2: d.height = (int32_t)(uint32_t)v; break;
      case 3: d.width = (int32_t)(uint32_t)v; break;
      case 4:
        d.data = bytes;
        d.data_bytes = (size_t)v;
        d.has_data = 1;
        break;
      case 5: d.label = (int32_t)(uint32_t)v; break; /* negative int32 is a sign-extended varint */
      case 6: d.has_float_data = 1; break;
      case 7: d.encoded = v != 0; break;
      default: break; /* unknown field: skipped */
    }
  }
  if (!d.has_data || (d.data_bytes == 0 && d.has_float_data)) {
    if (d.has_float_data) return fail(why, cap, "Datum holds float_data only; stoke reads uint8 `data`");
    return fail(why, cap, "Datum has no data field");
  }
  if (d.encoded) {
    if (d.data_bytes == 0) return fail(why, cap, "Datum is marked encoded but its data is empty");
  } else {
    if (d.channels <= 0 || d.height <= 0 || d.width <= 0)
      return fail(why, cap, "Datum has channels %d, height %d, width %d; all must be positive", d.channels, d.height,
                  d.width);
    uint64_t want = (uint64_t)d.channels * (uint64_t)d.height * (uint64_t)d.width;
    if (want != d.data_bytes)
      return fail(why, cap, "Datum: data holds %zu bytes, channels*height*width = %dx%dx%d = %llu", d.data_bytes,
                  d.channels, d.height, d.width, (unsigned long long)want);
  }
  *out = d;
  return 0;
}

void stoke_datum_chw_to_hwc(const stoke_datum *d, uint8_t *dst) {
  size_t c = (size_t)d->channels, hw = (size_t)d->height * (size_t)d->width;
  if (c == 1) {
    memcpy(dst, d->data, hw);
    return;
  }
  for (size_t ch = 0; ch < c; ch++) {
    const uint8_t *src = d->data + ch * hw;
    uint8_t *o = dst + ch;
    for (size_t i = 0; i < hw; i++) o[i * c] = src[i];
  }
}
