/* sources/jpeg/decode.c: see decode.h. libjpeg-turbo's libjpeg API; the
 * caller links the library (the plugins statically, see their BUILD). */
#include "decode.h"

#include <stdlib.h>
#include <string.h>

#include <jerror.h>

int stoke_jpeg_damaging(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
      return 1;
    default:
      return 0;
  }
}

static void on_error(j_common_ptr c) {
  stoke_jpeg_err *e = (stoke_jpeg_err *)c->err;
  e->code = c->err->msg_code;
  c->err->format_message(c, e->msg);
  longjmp(e->jb, 1);
}

/* level -1: a warning (libjpeg goes on); the rule decides what it means */
static void on_emit(j_common_ptr c, int level) {
  stoke_jpeg_err *e = (stoke_jpeg_err *)c->err;
  if (level >= 0) return;
  c->err->num_warnings++;
  if (!stoke_jpeg_damaging(c->err->msg_code) || e->bad) return;
  e->bad = 1;
  e->code = c->err->msg_code;
  c->err->format_message(c, e->msg);
}

static void on_output(j_common_ptr c) { (void)c; }

void stoke_jpeg_err_init(struct jpeg_decompress_struct *d, stoke_jpeg_err *e) {
  memset(e, 0, sizeof *e);
  d->err = jpeg_std_error(&e->pub);
  e->pub.error_exit = on_error;
  e->pub.emit_message = on_emit;
  e->pub.output_message = on_output;
}

int stoke_jpeg_out_space(struct jpeg_decompress_struct *d, int channels, stoke_jpeg_err *e) {
  switch (d->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
      d->out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
      return 0;
    case JCS_CMYK:
    case JCS_YCCK:
      d->out_color_space = JCS_CMYK;
      return 1;
    default:
      snprintf(e->msg, sizeof e->msg, "unsupported JPEG colour space %d with %d components", (int)d->jpeg_color_space,
               d->num_components);
      return -1;
  }
}

void stoke_jpeg_cmyk_rows(const uint8_t *in, uint8_t *out, size_t n, int channels) {
  for (size_t i = 0; i < n; i++, in += 4) {
    unsigned k = in[3];
    unsigned r = (in[0] * k + 127) / 255, g = (in[1] * k + 127) / 255, b = (in[2] * k + 127) / 255;
    if (channels == 1) {
      *out++ = (uint8_t)((r * 19595 + g * 38470 + b * 7471 + 32768) >> 16);
    } else {
      *out++ = (uint8_t)r;
      *out++ = (uint8_t)g;
      *out++ = (uint8_t)b;
    }
  }
}

/* What a decode allocates, outside the frame that calls setjmp. */
typedef struct whole {
  struct jpeg_decompress_struct d;
  stoke_jpeg_err e;
  int created;
  uint8_t *own, *row;
} whole;

/* The header (px NULL: only it, the size in *h, *w) or the whole image. */
static int decode(whole *c, const uint8_t *data, size_t n, int channels, int scale_num, int want_h, int want_w,
                  uint8_t **px, int *h, int *w) {
  stoke_jpeg_err_init(&c->d, &c->e);
  if (setjmp(c->e.jb)) return -1;
  jpeg_create_decompress(&c->d);
  c->created = 1;
  jpeg_mem_src(&c->d, data, (unsigned long)n);
  jpeg_read_header(&c->d, TRUE);
  if (!px) {
    *h = (int)c->d.image_height;
    *w = (int)c->d.image_width;
    return 0;
  }
  c->d.scale_num = (unsigned)scale_num;
  c->d.scale_denom = 8;
  int cmyk = stoke_jpeg_out_space(&c->d, channels, &c->e);
  if (cmyk < 0) return -1;
  jpeg_calc_output_dimensions(&c->d);
  int oh = (int)c->d.output_height, ow = (int)c->d.output_width;
  if (want_h > 0 && (oh != want_h || ow != want_w)) {
    snprintf(c->e.msg, sizeof c->e.msg, "JPEG is %dx%d (HxW)%s, expected %dx%d", oh, ow,
             scale_num == 8 ? "" : " scaled", want_h, want_w);
    return -1;
  }
  size_t stride = (size_t)ow * (size_t)channels;
  uint8_t *out = want_h > 0 ? *px : (c->own = malloc(stride * (size_t)oh));
  c->row = cmyk ? malloc((size_t)ow * 4) : NULL;
  if (!out || (cmyk && !c->row)) {
    snprintf(c->e.msg, sizeof c->e.msg, "out of memory for a %dx%d image", oh, ow);
    return -1;
  }
  jpeg_start_decompress(&c->d);
  while (c->d.output_scanline < c->d.output_height) {
    uint8_t *dst = out + (size_t)c->d.output_scanline * stride;
    JSAMPROW r = cmyk ? c->row : dst;
    if (jpeg_read_scanlines(&c->d, &r, 1) != 1) break;
    if (cmyk) stoke_jpeg_cmyk_rows(c->row, dst, (size_t)ow, channels);
  }
  if (c->d.output_scanline < c->d.output_height) {
    snprintf(c->e.msg, sizeof c->e.msg, "the decoder stopped at row %u of %d", c->d.output_scanline, oh);
    return -1;
  }
  jpeg_finish_decompress(&c->d); /* reads to the end: a cut file warns here */
  if (c->e.bad) return -1;
  *px = out;
  c->own = NULL; /* the caller's now */
  *h = oh;
  *w = ow;
  return 0;
}

int stoke_jpeg_header(const uint8_t *data, size_t n, int *h, int *w, char *why, size_t cap) {
  return stoke_jpeg_decode(data, n, 0, 8, 0, 0, NULL, h, w, why, cap);
}

int stoke_jpeg_decode(const uint8_t *data, size_t n, int channels, int scale_num, int want_h, int want_w,
                      uint8_t **px, int *h, int *w, char *why, size_t cap) {
  whole c;
  memset(&c, 0, sizeof c);
  int rc = decode(&c, data, n, channels, scale_num, want_h, want_w, px, h, w);
  if (rc) snprintf(why, cap, "%s", c.e.msg[0] ? c.e.msg : "undecodable JPEG");
  if (c.created) jpeg_destroy_decompress(&c.d);
  free(c.own);
  free(c.row);
  return rc;
}
