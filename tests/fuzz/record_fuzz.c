/* tests/fuzz/record_fuzz.c: fuzz target of an LMDB value as the lmdb source
 * reads it: a stoke record (raw pixels copied, JPEG payloads decoded to the
 * record's size), the metadata entry, and a Caffe Datum (CHW to HWC, or
 * its encoded image decoded). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sources/jpeg/decode.h"
#include "sources/lmdb/record.h"

#define MAX_PIXELS (1u << 22) /* the source checks records against the metadata's size */

static void decode_jpeg(const uint8_t *p, size_t n, int channels, int h, int w) {
  char why[256];
  uint8_t *px = NULL;
  int oh = 0, ow = 0;
  if (h > 0 && w > 0 && (uint64_t)h * (uint64_t)w * (uint64_t)channels <= MAX_PIXELS) {
    px = malloc((size_t)h * (size_t)w * (size_t)channels);
    if (px) stoke_jpeg_decode(p, n, channels, 8, h, w, &px, &oh, &ow, why, sizeof why);
    free(px);
    return;
  }
  int hh, ww;
  if (stoke_jpeg_header(p, n, &hh, &ww, why, sizeof why) == 0 && (uint64_t)hh * (uint64_t)ww <= MAX_PIXELS &&
      stoke_jpeg_decode(p, n, channels, 8, 0, 0, &px, &oh, &ow, why, sizeof why) == 0)
    free(px);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *v = malloc(size ? size : 1); /* exactly the value's size, as LMDB hands it */
  if (!v) return 0;
  memcpy(v, data, size);
  char why[STOKE_WHY_BYTES];
  stoke_rec r;
  if (stoke_rec_decode(v, size, &r, why, sizeof why) == 0) {
    uint64_t px = (uint64_t)r.height * r.width * r.channels;
    if (r.encoding == STOKE_ENC_RAW && px <= MAX_PIXELS) {
      uint8_t *dst = malloc(px ? px : 1);
      if (dst) memcpy(dst, r.payload, px);
      free(dst);
    } else if (r.encoding == STOKE_ENC_JPEG && (r.channels == 1 || r.channels == 3)) {
      decode_jpeg(r.payload, r.payload_bytes, (int)r.channels, (int)r.height, (int)r.width);
    }
  }
  stoke_meta m;
  stoke_meta_decode(v, size, &m, why, sizeof why);
  stoke_datum d;
  if (stoke_datum_decode(v, size, &d, why, sizeof why) == 0) {
    if (d.encoded) {
      decode_jpeg(d.data, d.data_bytes, 3, 0, 0);
    } else if ((uint64_t)d.channels * (uint64_t)d.height * (uint64_t)d.width <= MAX_PIXELS) {
      uint8_t *dst = malloc(d.data_bytes ? d.data_bytes : 1);
      if (dst) stoke_datum_chw_to_hwc(&d, dst);
      free(dst);
    }
  }
  free(v);
  return 0;
}
