/* sources/jpeg/crop.c: which part of an image a sample shows (torchvision's
 * RandomResizedCrop and Resize + CenterCrop, drawn from stoke_rng) and the
 * resampler that brings that part to the output size. */
#include "crop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Python's round(): half to even, which is what nearbyint does in the
 * default rounding mode. */
static int py_round(double v) { return (int)nearbyint(v); }

void stoke_jpeg_random_crop(stoke_rng *r, int h, int w, double scale_min, double scale_max, double ratio_min,
                            double ratio_max, int *top, int *left, int *ch, int *cw) {
  double area = (double)h * (double)w;
  double lr0 = log(ratio_min), lr1 = log(ratio_max);
  for (int attempt = 0; attempt < 10; attempt++) {
    double target = area * (scale_min + (scale_max - scale_min) * stoke_rng_uniform(r));
    double aspect = exp(lr0 + (lr1 - lr0) * stoke_rng_uniform(r));
    int cw_ = py_round(sqrt(target * aspect));
    int ch_ = py_round(sqrt(target / aspect));
    if (cw_ > 0 && cw_ <= w && ch_ > 0 && ch_ <= h) {
      *top = (int)stoke_rng_below(r, (uint64_t)(h - ch_ + 1));
      *left = (int)stoke_rng_below(r, (uint64_t)(w - cw_ + 1));
      *ch = ch_;
      *cw = cw_;
      return;
    }
  }
  /* fallback: the centre crop with the aspect ratio clamped to the range */
  double in_ratio = (double)w / (double)h;
  int cw_ = w, ch_ = h;
  if (in_ratio < ratio_min) ch_ = py_round(cw_ / ratio_min);
  else if (in_ratio > ratio_max) cw_ = py_round(ch_ * ratio_max);
  if (ch_ < 1) ch_ = 1;
  if (cw_ < 1) cw_ = 1;
  if (ch_ > h) ch_ = h;
  if (cw_ > w) cw_ = w;
  *top = (h - ch_) / 2;
  *left = (w - cw_) / 2;
  *ch = ch_;
  *cw = cw_;
}

stoke_jpeg_rect stoke_jpeg_center_crop(int h, int w, int resize, int size) {
  /* torchvision's _compute_resized_output_size: the long side truncated */
  int shorter = h < w ? h : w, longer = h < w ? w : h;
  int new_long = (int)((double)resize * (double)longer / (double)shorter);
  int new_w = w <= h ? resize : new_long, new_h = w <= h ? new_long : resize;
  /* CenterCrop: offsets rounded as Python does */
  int top = py_round((new_h - size) / 2.0), left = py_round((new_w - size) / 2.0);
  double sx = (double)new_w / w, sy = (double)new_h / h;
  stoke_jpeg_rect r = {left / sx, top / sy, size / sx, size / sy};
  return r;
}

/* ---------------------------------------------------------- resampling
 *
 * Why a resampler of our own: libjpeg-turbo has no arbitrary resize; it
 * scales only in the DCT domain, by M/8, so the decoder brings the crop to
 * within 2x of the target (jpeg.c uses M = 1, 2, 4, 8) or leaves it
 * smaller, and this brings it to exactly size x size. It is PIL's (and torchvision's antialias=True) bilinear: a triangle
 * filter whose support widens with the scale factor when shrinking, so
 * every source pixel contributes (area averaging) and a downscale of more
 * than 2x does not alias as plain 2-tap bilinear would; when enlarging it
 * is ordinary bilinear with half-pixel centres. At the borders the taps
 * that would fall outside the source are dropped and the remaining weights
 * renormalized, as PIL does, so edge pixels are neither darkened nor
 * replicated. Separable, in float: per output row a vertical pass over
 * the source columns, then a horizontal pass rounding to uint8. */

typedef struct taps {
  int k;     /* room for taps per output sample */
  int kk;    /* taps every output sample uses (zero-padded windows) */
  int *lo;   /* first source index of each output sample */
  int *n;    /* taps used by each output sample */
  float *w;  /* [out][k] normalized weights */
} taps;

static void taps_free(taps *t) {
  free(t->lo);
  free(t->n);
  free(t->w);
}

static int taps_make(taps *t, int n_src, double r0, double rlen, int n_out) {
  double scale = rlen / n_out, ss = scale > 1.0 ? scale : 1.0, support = ss;
  t->k = (int)ceil(support) * 2 + 2;
  t->lo = malloc(sizeof(int) * (size_t)n_out);
  t->n = malloc(sizeof(int) * (size_t)n_out);
  t->w = malloc(sizeof(float) * (size_t)n_out * (size_t)t->k);
  if (!t->lo || !t->n || !t->w) return -1;
  for (int o = 0; o < n_out; o++) {
    double center = r0 + (o + 0.5) * scale;
    int lo = (int)floor(center - support + 0.5), hi = (int)floor(center + support + 0.5);
    if (lo < 0) lo = 0;
    if (hi > n_src) hi = n_src;
    if (hi - lo > t->k) hi = lo + t->k;
    float *w = t->w + (size_t)o * t->k;
    double sum = 0;
    for (int j = lo; j < hi; j++) {
      double d = fabs((j + 0.5 - center) / ss);
      double v = d < 1.0 ? 1.0 - d : 0.0;
      w[j - lo] = (float)v;
      sum += v;
    }
    if (sum > 0) {
      for (int j = lo; j < hi; j++) w[j - lo] = (float)(w[j - lo] / sum);
    } else { /* a window entirely off the source: the nearest pixel */
      lo = (int)floor(center);
      if (lo < 0) lo = 0;
      if (lo > n_src - 1) lo = n_src - 1;
      hi = lo + 1;
      w[0] = 1.0f;
    }
    t->lo[o] = lo;
    t->n[o] = hi - lo;
  }
  /* pad every window to the widest, with zero weights, so the inner loops
   * have one trip count (a window that would run off the end starts
   * earlier instead) */
  int kk = 1;
  for (int o = 0; o < n_out; o++)
    if (t->n[o] > kk) kk = t->n[o];
  if (kk > n_src) kk = n_src;
  for (int o = 0; o < n_out; o++) {
    float *w = t->w + (size_t)o * t->k;
    int lo = t->lo[o], n = t->n[o], nlo = lo + kk > n_src ? n_src - kk : lo;
    if (nlo != lo) memmove(w + (lo - nlo), w, sizeof(float) * (size_t)n);
    for (int j = 0; j < lo - nlo; j++) w[j] = 0.0f;
    for (int j = lo - nlo + n; j < kk; j++) w[j] = 0.0f;
    t->lo[o] = nlo;
    t->n[o] = kk;
  }
  t->kk = kk;
  return 0;
}

/* acc[i] = sum_j w[j] * src[j * stride + i], i < n: the vertical pass over
 * one output row, straight from the uint8 source rows (restrict: written
 * and read rows never overlap, so it vectorizes). */
static void vrow(float *restrict acc, const uint8_t *restrict src, size_t stride, size_t n, const float *restrict w,
                 int taps) {
  for (size_t i = 0; i < n; i++) acc[i] = w[0] * (float)src[i];
  for (int j = 1; j < taps; j++) {
    const uint8_t *restrict s = src + (size_t)j * stride;
    const float wj = w[j];
    for (size_t i = 0; i < n; i++) acc[i] += wj * (float)s[i];
  }
}

/* The horizontal pass over one row of floats (3 per pixel), mirrored when
 * `flip`; inlined per tap count. */
static inline __attribute__((always_inline)) void hrow(float *restrict out, const float *restrict in, const taps *t,
                                                       int x0, int dw, int flip, const int kk) {
  for (int o = 0; o < dw; o++) {
    const float *w = t->w + (size_t)o * t->k;
    const float *p = in + (size_t)(t->lo[o] - x0) * 3;
    float a = 0, b = 0, c = 0;
    for (int j = 0; j < kk; j++, p += 3) {
      a += w[j] * p[0];
      b += w[j] * p[1];
      c += w[j] * p[2];
    }
    float *q = out + (size_t)(flip ? dw - 1 - o : o) * 3;
    q[0] = a, q[1] = b, q[2] = c;
  }
}

static uint8_t to_u8(float v) {
  v += 0.5f; /* rounds on truncation */
  v = v > 0.0f ? v : 0.0f;
  v = v < 255.0f ? v : 255.0f;
  return (uint8_t)(int)v;
}

int stoke_jpeg_resample(const uint8_t *src, int sw, int sh, int stride, stoke_jpeg_rect r, uint8_t *dst, int dw,
                        int dh, int flip) {
  taps tx = {0}, ty = {0};
  float *acc = NULL;
  int rc = -1;
  if (taps_make(&tx, sw, r.x, r.w, dw) || taps_make(&ty, sh, r.y, r.h, dh)) goto out;
  /* only the columns some output reads */
  int x0 = tx.lo[0], x1 = tx.lo[0] + tx.kk;
  for (int o = 0; o < dw; o++) {
    if (tx.lo[o] < x0) x0 = tx.lo[o];
    if (tx.lo[o] + tx.kk > x1) x1 = tx.lo[o] + tx.kk;
  }
  acc = malloc(sizeof(float) * ((size_t)(x1 - x0) + (size_t)dw) * 3);
  if (!acc) goto out;
  float *hout = acc + (size_t)(x1 - x0) * 3; /* one output row before rounding */
  /* vertical first (vectorized, over the source width), then horizontal
   * over output rows only: the horizontal pass is the scalar one */
  const int kk = tx.kk;
  for (int oy = 0; oy < dh; oy++) {
    vrow(acc, src + (size_t)ty.lo[oy] * stride + (size_t)x0 * 3, (size_t)stride, (size_t)(x1 - x0) * 3,
         ty.w + (size_t)oy * ty.k, ty.kk);
    uint8_t *d = dst + (size_t)oy * dw * 3;
    switch (kk) { /* constant trip counts unroll: the common widths */
      case 2: hrow(hout, acc, &tx, x0, dw, flip, 2); break;
      case 3: hrow(hout, acc, &tx, x0, dw, flip, 3); break;
      case 4: hrow(hout, acc, &tx, x0, dw, flip, 4); break;
      case 5: hrow(hout, acc, &tx, x0, dw, flip, 5); break;
      case 6: hrow(hout, acc, &tx, x0, dw, flip, 6); break;
      default: hrow(hout, acc, &tx, x0, dw, flip, kk); break;
    }
    for (int i = 0; i < dw * 3; i++) d[i] = to_u8(hout[i]); /* vectorizes */
  }
  rc = 0;
out:
  taps_free(&tx);
  taps_free(&ty);
  free(acc);
  return rc;
}
