/* tests/fuzz/jpeg_fuzz.c: fuzz target of a JPEG as the jpeg source reads a
 * file: the header, the crop drawn from it, the partial decode and the
 * resample (train: RandomResizedCrop + flip; eval: resize + centre crop),
 * and the whole-image decode of tools/convert and the lmdb source. Images
 * above 4 megapixels are skipped (their decode is slow, not wrong). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sources/jpeg/decode.h"
#include "sources/jpeg/sample.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  uint8_t *v = malloc(size);
  if (!v) return 0;
  memcpy(v, data, size);
  char why[JMSG_LENGTH_MAX + 64];
  int h, w;
  if (stoke_jpeg_header(v, size, &h, &w, why, sizeof why) == 0 && (uint64_t)h * (uint64_t)w <= (1u << 22)) {
    static const stoke_jpeg_tf tfs[2] = {
        {.size = 24, .train = 1, .flip = 1, .scale_min = 0.08, .scale_max = 1, .ratio_min = 0.75, .ratio_max = 4.0 / 3},
        {.size = 16, .resize = 20, .train = 0},
    };
    uint8_t dst[24 * 24 * 3];
    for (int i = 0; i < 2; i++) stoke_jpeg_sample(&tfs[i], v, size, (uint64_t)size * 31 + (uint64_t)i, dst, why, sizeof why);
    uint8_t *px = NULL;
    int oh, ow;
    if (stoke_jpeg_decode(v, size, 3, 8, 0, 0, &px, &oh, &ow, why, sizeof why) == 0) free(px);
    /* gray at 1/8, into a buffer of exactly that size */
    int sh = (h + 7) / 8, sw = (w + 7) / 8;
    uint8_t *sp = malloc((size_t)sh * (size_t)sw + 1);
    if (sp) stoke_jpeg_decode(v, size, 1, 1, sh, sw, &sp, &oh, &ow, why, sizeof why);
    free(sp);
  }
  free(v);
  return 0;
}
