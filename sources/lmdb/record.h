/* sources/lmdb/record.h: the on-disk formats of stoke's LMDB data sets (the
 * versioned stoke record and metadata entry) and a Caffe Datum decoder.
 *
 * Shared by the lmdb source plugin and tools/convert. Pure byte handling:
 * no LMDB, no JPEG, no host services. Every decode function validates each
 * length against the size of the value it was given and, on failure,
 * returns -1 with a one-line reason in `why` (the caller adds path, key and
 * index); 0 on success.
 *
 * A stoke record (all integers little-endian), STOKE_REC_HEADER_BYTES then
 * the payload:
 *
 *   offset  size  field
 *        0     4  magic "STKR"
 *        4     2  version (1)
 *        6     1  encoding: 0 = raw u8 pixels in HWC order, 1 = JPEG bytes
 *        7     1  reserved, 0
 *        8     4  label (i32)
 *       12     4  height
 *       16     4  width
 *       20     4  channels
 *       24     4  payload bytes (raw: height * width * channels)
 *       28     -  payload
 *
 * Keys are the sample index as 10 decimal digits ("0000000042"), so key
 * order is index order. One metadata entry under STOKE_META_KEY:
 *
 *        0     4  magic "STKM"
 *        4     2  version (1)
 *        6     2  reserved, 0
 *        8     8  count (records)
 *       16     4  classes
 *       20     4  height
 *       24     4  width
 *       28     4  channels
 *       32     1  encoding (every record shares H, W, C and encoding)
 */
#ifndef STOKE_LMDB_RECORD_H
#define STOKE_LMDB_RECORD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STOKE_REC_MAGIC "STKR"
#define STOKE_REC_VERSION 1u
#define STOKE_REC_HEADER_BYTES 28u

#define STOKE_META_KEY "__stoke__"
#define STOKE_META_MAGIC "STKM"
#define STOKE_META_VERSION 1u
#define STOKE_META_BYTES 33u

#define STOKE_KEY_DIGITS 10
#define STOKE_MAX_INDEX 9999999999LL /* the largest 10-digit key */

/* Longest reason a decode function writes (callers may pass less). */
#define STOKE_WHY_BYTES 256

typedef enum stoke_rec_encoding {
  STOKE_ENC_RAW = 0,  /* u8 pixels, HWC */
  STOKE_ENC_JPEG = 1  /* JPEG file bytes (1 or 3 channels) */
} stoke_rec_encoding;

/* One record. After stoke_rec_decode, `payload` points into the value. */
typedef struct stoke_rec {
  uint8_t encoding;
  int32_t label;
  uint32_t height, width, channels;
  uint32_t payload_bytes;
  const uint8_t *payload;
} stoke_rec;

typedef struct stoke_meta {
  uint64_t count;
  uint32_t classes;
  uint32_t height, width, channels;
  uint8_t encoding;
} stoke_meta;

/* "raw" / "jpeg" / "unknown". */
const char *stoke_rec_encoding_name(unsigned encoding);

/* Bytes of the encoded record: header + payload. */
size_t stoke_rec_size(const stoke_rec *r);
/* Writes header and payload into `buf`; returns the bytes written, or 0
 * when `cap` is smaller than stoke_rec_size(r). */
size_t stoke_rec_encode(const stoke_rec *r, void *buf, size_t cap);
/* Parses and checks one value: size against the header, magic, version,
 * encoding, reserved byte, non-zero dimensions, payload length against the
 * value (truncated or trailing bytes) and, for raw records, against
 * height * width * channels. */
int stoke_rec_decode(const void *val, size_t n, stoke_rec *out, char *why,
                     size_t why_cap);

void stoke_meta_encode(const stoke_meta *m, uint8_t out[STOKE_META_BYTES]);
int stoke_meta_decode(const void *val, size_t n, stoke_meta *out, char *why,
                      size_t why_cap);

/* Key of sample `index` (0 <= index <= STOKE_MAX_INDEX) into `out`, NUL
 * terminated; returns STOKE_KEY_DIGITS. */
int stoke_rec_key(int64_t index, char out[STOKE_KEY_DIGITS + 1]);

/* ------------------------------------------------------- Caffe Datum */

/* A Caffe `Datum` protobuf (caffe.proto): channels = 1, height = 2,
 * width = 3, data = 4 (bytes, CHW order, or an encoded image when
 * encoded = 7 is true), label = 5, float_data = 6. Unknown fields are
 * skipped by wire type. `data` points into the value. */
typedef struct stoke_datum {
  int32_t channels, height, width;
  int32_t label;
  const uint8_t *data;
  size_t data_bytes;
  int has_data;
  int has_float_data;
  int encoded;
} stoke_datum;

/* Parses the protobuf and checks it holds an image stoke can use: uint8
 * `data` (float_data alone is refused) and, when not encoded, positive
 * channels/height/width whose product is the size of `data`. */
int stoke_datum_decode(const void *val, size_t n, stoke_datum *out,
                       char *why, size_t why_cap);

/* Unencoded datum: CHW `data` -> HWC `dst` (channels * height * width
 * bytes). Channel order is kept as stored (Caffe's own tools store BGR). */
void stoke_datum_chw_to_hwc(const stoke_datum *d, uint8_t *dst);

#ifdef __cplusplus
}
#endif
#endif
