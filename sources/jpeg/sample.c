/* sources/jpeg/sample.c: one sample of the "jpeg" source from a JPEG's
 * bytes (sample.h): crop from the header, DCT scaling, a partial decode,
 * the resample. */
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>

#include "crop.h"
#include "sample.h"
#include "stoke/rng.h"

/* Everything one decode allocates, outside the frame that calls setjmp. */
typedef struct dec {
  struct jpeg_decompress_struct d;
  stoke_jpeg_err e;
  int created;
  uint8_t *buf; /* decoded rows, RGB */
  uint8_t *row; /* one row: CMYK before conversion, or discarded */
} dec;

static void dec_free(dec *c) {
  if (c->created) jpeg_destroy_decompress(&c->d);
  free(c->buf);
  free(c->row);
  c->created = 0;
  c->buf = c->row = NULL;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Whether the data ends with the EOI marker: then it was not cut short, and
 * the rows below the crop need no decoding just to find that out. */
static int ends_with_eoi(const uint8_t *p, size_t n) { return n >= 2 && p[n - 2] == 0xFF && p[n - 1] == 0xD9; }

/* Decodes and transforms one JPEG into dst. `partial`: crop and skip in the
 * decoder; 0: decode every row and column, then crop (the fallback). -1 on
 * bad data, with the reason in c->e.msg. */
static int decode(const stoke_jpeg_tf *s, const uint8_t *data, size_t n, uint64_t seed, uint8_t *dst, dec *c,
                  int partial) {
  stoke_jpeg_err_init(&c->d, &c->e); /* decode.h: one rule for libjpeg's warnings, everywhere */
  if (setjmp(c->e.jb)) return -1;
  jpeg_create_decompress(&c->d);
  c->created = 1;
  jpeg_mem_src(&c->d, data, (unsigned long)n);
  jpeg_read_header(&c->d, TRUE);
  int H = (int)c->d.image_height, W = (int)c->d.image_width, size = s->size;

  /* (3) the crop, in the original image's pixels */
  stoke_jpeg_rect r;
  int flip = 0;
  if (s->train) {
    stoke_rng g = stoke_rng_seed(seed);
    int top, left, ch, cw;
    stoke_jpeg_random_crop(&g, H, W, s->scale_min, s->scale_max, s->ratio_min, s->ratio_max, &top, &left, &ch, &cw);
    r = (stoke_jpeg_rect){left, top, cw, ch};
    flip = s->flip && stoke_rng_uniform(&g) < 0.5;
  } else {
    r = stoke_jpeg_center_crop(H, W, s->resize, size);
  }

  /* (4) the smallest DCT scale M/8 at which the crop still covers `size`
   * pixels both ways: less to decode, and a good antialiased downscale.
   * Only M = 1, 2, 4, 8: libjpeg-turbo has SIMD inverse DCTs for those,
   * while 3/8, 5/8, 6/8, 7/8 run its scalar C ones (and 12x12, 14x14 ones
   * for 4:2:0 chroma); measured on a 500x375 q90 4:2:0 photo to 224, full
   * size + our resampler decoded ~18% more images/s than 6/8 or 7/8. */
  static const int scales[3] = {1, 2, 4};
  int M = 8;
  for (int i = 0; i < 3; i++)
    if (r.w * scales[i] / 8 >= size && r.h * scales[i] / 8 >= size) {
      M = scales[i];
      break;
    }
  c->d.scale_num = (unsigned)M;
  c->d.scale_denom = 8;
  int cmyk = stoke_jpeg_out_space(&c->d, 3, &c->e);
  if (cmyk < 0) return -1;
  jpeg_start_decompress(&c->d);
  int OW = (int)c->d.output_width, OH = (int)c->d.output_height;
  double f = M / 8.0;
  stoke_jpeg_rect rs = {r.x * f, r.y * f, r.w * f, r.h * f};
  /* train: torchvision crops, then resizes, so the filter stops at the
   * crop's edges; eval resizes the whole image, then crops, so the filter
   * may reach a little past the crop: decode that margin too */
  int margin = 0;
  if (!s->train) margin = (int)ceil(rs.w / size > 1 ? rs.w / size : 1) + 1;
  int bx0 = clampi((int)floor(rs.x) - margin, 0, OW - 1), bx1 = clampi((int)ceil(rs.x + rs.w) + margin, bx0 + 1, OW);
  int by0 = clampi((int)floor(rs.y) - margin, 0, OH - 1), by1 = clampi((int)ceil(rs.y + rs.h) + margin, by0 + 1, OH);
  JDIMENSION xoff = 0, wid = (JDIMENSION)OW;
  if (partial && bx1 - bx0 < OW) {
    xoff = (JDIMENSION)bx0;
    wid = (JDIMENSION)(bx1 - bx0);
    jpeg_crop_scanline(&c->d, &xoff, &wid); /* widens to iMCU boundaries */
  }
  size_t stride = (size_t)wid * 3;
  c->buf = malloc(stride * (size_t)(by1 - by0));
  c->row = malloc((size_t)wid * 4); /* CMYK, and the scratch row */
  if (!c->buf || !c->row) {
    snprintf(c->e.msg, sizeof c->e.msg, "out of memory for %ux%d decoded pixels", wid, by1 - by0);
    return -1;
  }
  if (by0 > 0 && partial) jpeg_skip_scanlines(&c->d, (JDIMENSION)by0);
  while ((int)c->d.output_scanline < by1) {
    int y = (int)c->d.output_scanline;
    JSAMPROW out = y >= by0 ? c->buf + (size_t)(y - by0) * stride : c->buf; /* rows above: scratch */
    JSAMPROW target = cmyk ? c->row : out;
    if (jpeg_read_scanlines(&c->d, &target, 1) != 1) break;
    if (cmyk) stoke_jpeg_cmyk_rows(c->row, out, wid, 3);
  }
  if ((int)c->d.output_scanline < by1 && !c->e.bad)
    snprintf(c->e.msg, sizeof c->e.msg, "decoder stopped at row %u of %d", c->d.output_scanline, by1);
  if ((int)c->d.output_scanline < by1) return -1;
  if (!ends_with_eoi(data, n) && !c->e.bad) {
    /* no EOI at the end: truncated, or trailing bytes after the image;
     * decode to the end to tell (skipping to the last row reads nothing,
     * so the rows are read; finish reads up to the EOI marker) */
    while (c->d.output_scanline < c->d.output_height && !c->e.bad) {
      JSAMPROW scratch = c->row;
      if (jpeg_read_scanlines(&c->d, &scratch, 1) != 1) break;
    }
    if (!c->e.bad) jpeg_finish_decompress(&c->d);
  }
  if (c->e.bad) return -1;

  /* (5, 6) resample the crop to size x size, mirrored when flipped */
  stoke_jpeg_rect rel = {rs.x - bx0, rs.y - by0, rs.w, rs.h};
  if (stoke_jpeg_resample(c->buf + (size_t)(bx0 - (int)xoff) * 3, bx1 - bx0, by1 - by0, (int)stride, rel, dst, size,
                          size, flip)) {
    snprintf(c->e.msg, sizeof c->e.msg, "out of memory resampling");
    return -1;
  }
  return 0;
}

int stoke_jpeg_sample(const stoke_jpeg_tf *t, const uint8_t *data, size_t n, uint64_t seed, uint8_t *dst, char *why,
                      size_t cap) {
  dec c;
  memset(&c, 0, sizeof c);
  int rc = decode(t, data, n, seed, dst, &c, 1);
  if (rc && !c.e.bad && (c.e.code == JERR_BAD_CROP_SPEC || c.e.code == JERR_NOTIMPL)) {
    /* a mode where cropping in the decoder is refused: decode it all */
    dec_free(&c);
    memset(&c, 0, sizeof c);
    rc = decode(t, data, n, seed, dst, &c, 0);
  }
  if (rc) snprintf(why, cap, "%s", c.e.msg[0] ? c.e.msg : "undecodable JPEG");
  dec_free(&c);
  return rc;
}
