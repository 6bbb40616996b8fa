/* sources/jpeg/sample.h: one sample of the "jpeg" source from a JPEG's
 * bytes: the crop chosen from the header, DCT-domain scaling, a decode of
 * only the crop's rows and columns, the antialiased resample. Shared by
 * the plugin and its fuzz target (tests/fuzz/jpeg_sample_fuzz.c). */
#ifndef STOKE_JPEG_SAMPLE_H
#define STOKE_JPEG_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "decode.h"

/* torchvision's transforms: RandomResizedCrop(size, scale, ratio) + a
 * horizontal flip with probability 0.5 when `flip` (train), or
 * Resize(resize) + CenterCrop(size) (eval). */
typedef struct stoke_jpeg_tf {
  int size, resize, train, flip;
  double scale_min, scale_max, ratio_min, ratio_max;
} stoke_jpeg_tf;

/* Decodes the JPEG `data` (n bytes) and writes its size x size x 3 RGB
 * sample into dst; the crop and the flip are drawn from `seed`. 0, or -1
 * with the reason (libjpeg's message, a damaging warning of decode.h's
 * rule, out of memory) in `why`. Where libjpeg refuses to crop in the
 * decoder for some file, it is decoded whole and cropped after. */
int stoke_jpeg_sample(const stoke_jpeg_tf *t, const uint8_t *data, size_t n, uint64_t seed, uint8_t *dst, char *why,
                      size_t cap);

#endif
