/* sources/jpeg/crop.h: the geometry and resampling of the "jpeg" source,
 * shared with its tests: torchvision's RandomResizedCrop / Resize +
 * CenterCrop choices, and the antialiased bilinear resampler. */
#ifndef STOKE_JPEG_CROP_H
#define STOKE_JPEG_CROP_H

#include <stdint.h>

#include "stoke/rng.h"

/* A rectangle in source pixel coordinates: pixel i covers [i, i + 1). */
typedef struct stoke_jpeg_rect {
  double x, y, w, h;
} stoke_jpeg_rect;

/* RandomResizedCrop.get_params of torchvision for an h x w image, drawing
 * from `r` (10 attempts, then the centre crop with the ratio clamped):
 * integer top/left/height/width in *top, *left, *ch, *cw. */
void stoke_jpeg_random_crop(stoke_rng *r, int h, int w, double scale_min, double scale_max, double ratio_min,
                            double ratio_max, int *top, int *left, int *ch, int *cw);

/* Resize(resize) + CenterCrop(size) of torchvision, as the rectangle of the
 * original h x w image that lands in the size x size output. */
stoke_jpeg_rect stoke_jpeg_center_crop(int h, int w, int resize, int size);

/* Resamples rectangle `r` of `src` (sw x sh pixels of 3 bytes, rows
 * `stride` bytes apart; r may reach past src only by less than a pixel) to
 * dw x dh into `dst` (HWC, packed), mirrored left-right when `flip`.
 * Filter windows are clipped to src and renormalized (PIL's border rule).
 * 0, or -1 when out of memory. */
int stoke_jpeg_resample(const uint8_t *src, int sw, int sh, int stride, stoke_jpeg_rect r, uint8_t *dst, int dw,
                        int dh, int flip);

#endif
