/* sources/jpeg/decode.h: how stoke reads a JPEG everywhere (the jpeg source,
 * the lmdb source's JPEG records, tools/convert): one error manager with one
 * rule for libjpeg's warnings, one colour conversion, and a whole-image
 * decode to gray or RGB that also reads CMYK and YCCK files. */
#ifndef STOKE_JPEG_DECODE_H
#define STOKE_JPEG_DECODE_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* jpeglib.h needs FILE */

#include <jpeglib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The rule, from libjpeg's warning codes (jerror.h). A warning that means
 * the pixels are not the ones the file was encoded with makes the file
 * bad, in every reader: the data ends early (JWRN_JPEG_EOF: the rows below
 * come out gray) or the entropy-coded data is corrupt (JWRN_HIT_MARKER,
 * JWRN_HUFF_BAD_CODE, JWRN_ARITH_BAD_CODE, JWRN_MUST_RESYNC: gray or
 * garbled blocks). Every other warning is about the file's wrapping, not
 * its pixels, and is accepted: extraneous bytes before a marker, an unknown
 * JFIF or Adobe revision, a damaged ICC profile, odd scan parameters of a
 * sequential or progressive file (JWRN_NOT_SEQUENTIAL,
 * JWRN_BOGUS_PROGRESSION: encoders that write them make valid images). PIL
 * decodes all of these, damaged ones with gray or garbled blocks, except a
 * file cut short ("image file is truncated"); stoke is stricter, so that a
 * damaged image never trains as if it were whole. */
int stoke_jpeg_damaging(int msg_code);

typedef struct stoke_jpeg_err {
  struct jpeg_error_mgr pub;
  jmp_buf jb;                /* error_exit jumps here: setjmp it before any libjpeg call */
  char msg[JMSG_LENGTH_MAX]; /* the error's text, or the first damaging warning's */
  int code;                  /* its message code */
  int bad;                   /* a damaging warning was seen: the image is bad */
} stoke_jpeg_err;

/* d->err = e with stoke's handlers: errors jump to e->jb, damaging warnings
 * set e->bad (stoke_jpeg_damaging), nothing is printed (plugins never print). */
void stoke_jpeg_err_init(struct jpeg_decompress_struct *d, stoke_jpeg_err *e);

/* After jpeg_read_header: asks for `channels` (1 gray, 3 RGB) out. Returns
 * 0, or 1 when the decoder's rows come out as CMYK (CMYK and YCCK files:
 * libjpeg has no CMYK -> RGB) and go through stoke_jpeg_cmyk_rows, or -1
 * for a colour space stoke cannot read (e->msg says which). */
int stoke_jpeg_out_space(struct jpeg_decompress_struct *d, int channels, stoke_jpeg_err *e);

/* n pixels of CMYK as libjpeg returns them from an Adobe file (inverted, as
 * Photoshop writes them) to RGB, R = C K / 255 (djpeg's and PIL's
 * conversion), or to gray (channels 1: ITU-R 601 luma of that RGB, as PIL's
 * convert("L") and libjpeg's rgb-to-gray). */
void stoke_jpeg_cmyk_rows(const uint8_t *cmyk, uint8_t *out, size_t n, int channels);

/* The image's size from its header: 0, or -1 with libjpeg's reason. */
int stoke_jpeg_header(const uint8_t *data, size_t n, int *h, int *w, char *why, size_t cap);

/* Decodes the whole image at scale scale_num/8 (1 to 8) into `channels`
 * (1 or 3) per pixel, rows packed. With want_h > 0 the scaled image must be
 * want_h x want_w and goes into *px (the caller's buffer); otherwise *px
 * is allocated (free it) and *h, *w are its size. 0, or -1 with the reason
 * in `why` (libjpeg's message for a bad file, a damaging warning, or a size
 * or colour space stoke refuses). */
int stoke_jpeg_decode(const uint8_t *data, size_t n, int channels, int scale_num, int want_h, int want_w,
                      uint8_t **px, int *h, int *w, char *why, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
