/* backends/cpu/conv.c: CPU reference kernels (f32, f64) of conv2d,
 * bias_add, flatten and global_avg_pool; see stoke/ops.h.
 *
 * Shapes are logical (N, C, H, W); a 4-D tensor's memory order is NHWC when
 * the input's layout says STOKE_NHWC and NCHW otherwise (STOKE_LAYOUT_ANY
 * and STOKE_NCHW). Weights are always [O, C/groups, kh, kw], contiguous.
 *
 * The kernel bodies are written once for an element type T: this file
 * includes itself twice, with CPU_CONV_BODY defined, for float and for
 * double (as cpu.c does with kernels.inc). The part outside CPU_CONV_BODY
 * holds what does not depend on T: checks, geometry and the table.
 *
 * conv2d is im2col + one GEMM per group over a chunk of samples (the whole
 * batch unless its buffers would exceed CONV_CAP_BYTES): GEMM columns are
 * (sample, output position), so the GEMMs are large enough for BLAS to
 * thread well. The buffers (column matrix, plus y or dy of one group
 * gathered for NCHW) are allocated by plan() as the kernel's per-node
 * state, so run() does not allocate (unless run without a plan). NHWC 1x1
 * stride-1 unpadded convolutions are a plain GEMM on x, with no buffer. */
#ifndef CPU_CONV_BODY

#include <cblas.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke/plugin.h"
#include "check.h"
#include "cpu_cnn.h"

/* --------------------------------------------------------- conv2d geometry */

typedef struct conv_dims {
  int64_t n, c, h, w, o, kh, kw;
  int64_t groups, cg, og, k; /* C/groups, O/groups, cg*kh*kw */
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t ho, wo, hwo;
  int nhwc;
  /* element strides: x (and dx) by n, c, h, w; y (and dy) by n, channel,
   * and output position p = oh*Wo + ow */
  int64_t xn, xc, xh, xw;
  int64_t yn, yc, yp;
} conv_dims;

static stoke_err *conv_pair(const stoke_kernel_args_v1 *a, int idx, const char *what,
                            int64_t def, int64_t min, int64_t *h, int64_t *w) {
  const stoke_node_v1 *n = a->node;
  *h = *w = def;
  if (n && n->n_attrs > idx) {
    const stoke_attr_v1 *at = &n->attrs[idx];
    if (at->n == 1) {
      *h = *w = at->ints[0];
    } else if (at->n == 2) {
      *h = at->ints[0];
      *w = at->ints[1];
    } else if (at->n != 0) {
      return STOKE_PERR(STOKE_E_INVALID, "conv2d '%s': %s has %d values, expected 1 or 2",
                        stoke_node_name(a), what, at->n);
    }
  }
  if (*h < min || *w < min)
    return STOKE_PERR(STOKE_E_INVALID, "conv2d '%s': %s %lldx%lld, each must be >= %lld",
                      stoke_node_name(a), what, (long long)*h, (long long)*w, (long long)min);
  return NULL;
}

static stoke_err *conv_geometry(const stoke_kernel_args_v1 *a, conv_dims *d) {
  const stoke_shape *xs = &a->in[0].shape, *ws = &a->in[1].shape, *ys = &a->out[0].shape;
  if (xs->ndim != 4 || ws->ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID,
                      "conv2d '%s': expects x[N, C, H, W], weight[O, C/groups, kh, kw]; got x "
                      "%s, weight %s",
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ws).s);
  memset(d, 0, sizeof *d);
  CHECK(conv_pair(a, STOKE_CONV2D_STRIDE, "stride", 1, 1, &d->sh, &d->sw));
  CHECK(conv_pair(a, STOKE_CONV2D_PADDING, "padding", 0, 0, &d->ph, &d->pw));
  CHECK(conv_pair(a, STOKE_CONV2D_DILATION, "dilation", 1, 1, &d->dh, &d->dw));
  d->groups = a->node && a->node->n_attrs > STOKE_CONV2D_GROUPS
                  ? a->node->attrs[STOKE_CONV2D_GROUPS].i
                  : 1;
  d->n = xs->d[0], d->c = xs->d[1], d->h = xs->d[2], d->w = xs->d[3];
  d->o = ws->d[0], d->kh = ws->d[2], d->kw = ws->d[3];
  if (d->groups < 1 || d->n < 0 || d->c < 1 || d->h < 1 || d->w < 1 || d->o < 1 || d->kh < 1 ||
      d->kw < 1 || d->c % d->groups || d->o % d->groups || ws->d[1] != d->c / d->groups)
    return STOKE_PERR(STOKE_E_INVALID,
                      "conv2d '%s': x %s and weight %s do not match groups %lld (weight must be "
                      "[O, C/groups, kh, kw], groups dividing C and O)",
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ws).s, (long long)d->groups);
  d->cg = d->c / d->groups;
  d->og = d->o / d->groups;
  int64_t eh = d->h + 2 * d->ph - d->dh * (d->kh - 1) - 1;
  int64_t ew = d->w + 2 * d->pw - d->dw * (d->kw - 1) - 1;
  if (eh < 0 || ew < 0)
    return STOKE_PERR(STOKE_E_INVALID, "conv2d '%s': kernel %s does not fit x %s: output < 1",
                      stoke_node_name(a), stoke_shape_str(ws).s, stoke_shape_str(xs).s);
  d->ho = eh / d->sh + 1;
  d->wo = ew / d->sw + 1;
  d->hwo = d->ho * d->wo;
  d->k = d->cg * d->kh * d->kw;
  if (ys->ndim != 4 || ys->d[0] != d->n || ys->d[1] != d->o || ys->d[2] != d->ho ||
      ys->d[3] != d->wo)
    return STOKE_PERR(STOKE_E_INVALID,
                      "conv2d '%s': y is %s, expected [%lld, %lld, %lld, %lld] from x %s, "
                      "weight %s",
                      stoke_node_name(a), stoke_shape_str(ys).s, (long long)d->n, (long long)d->o,
                      (long long)d->ho, (long long)d->wo, stoke_shape_str(xs).s, stoke_shape_str(ws).s);
  /* BLAS takes int dimensions and leading dimensions */
  if (d->k > INT_MAX || d->hwo > INT_MAX || d->o > INT_MAX)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "conv2d '%s': x %s, weight %s: a GEMM dimension is "
                      "beyond int", stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ws).s);
  d->nhwc = stoke_is_nhwc(&a->in[0]);
  if (d->nhwc) {
    d->xw = d->c, d->xh = d->w * d->c, d->xc = 1;
    d->yc = 1, d->yp = d->o;
  } else {
    d->xw = 1, d->xh = d->w, d->xc = d->h * d->w;
    d->yc = d->hwo, d->yp = 1;
  }
  d->xn = d->c * d->h * d->w;
  d->yn = d->o * d->hwo;
  return NULL;
}

static stoke_err *conv_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run,
                             conv_dims *d) {
  const char *op = STOKE_OP_CONV2D;
  CHECK(stoke_check_counts(a, op, bwd, 2, 1));
  CHECK(conv_geometry(a, d));
  const stoke_tensor *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
  CHECK(stoke_check_dtype(a, op, "x", x, dt));
  CHECK(stoke_check_dtype(a, op, "weight", w, dt));
  CHECK(stoke_check_dtype(a, op, "y", y, dt));
  CHECK(stoke_check_layout(a, op, "y", y, x));
  if (w->layout == STOKE_NHWC)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "%s '%s': the weight is [O, kh, kw, C] in memory; the cpu backend reads "
                      "[O, C, kh, kw] filters only: set run.filter_layout = oihw (or auto)", op, stoke_node_name(a));
  if (!bwd) {
    CHECK(stoke_check_data(a, op, "x", x, run));
    CHECK(stoke_check_data(a, op, "weight", w, run));
    return stoke_check_data(a, op, "y", y, run);
  }
  CHECK(stoke_check_grad(a, op, "x", &a->din[0], x));
  CHECK(stoke_check_grad(a, op, "weight", &a->din[1], w));
  CHECK(stoke_check_grad(a, op, "y", &a->dout[0], y));
  if (a->din[0].data) CHECK(stoke_check_layout(a, op, "dx", &a->din[0], x));
  CHECK(stoke_check_layout(a, op, "dy", &a->dout[0], x));
  CHECK(stoke_check_data(a, op, "dy", &a->dout[0], run));
  if (a->din[0].data) CHECK(stoke_check_data(a, op, "weight", w, run)); /* dx from W */
  if (a->din[1].data) CHECK(stoke_check_data(a, op, "x", x, run));      /* dW from x */
  return NULL;
}

/* The buffers of run, the kernel's per-node state from plan(). conv2d runs
 * on chunks of nb samples at once, L = nb*Ho*Wo GEMM columns: the column
 * matrix [K x L] and, for NCHW, one group of y (or dy) gathered as
 * [O/g x L]. A chunk holds as many samples as fit CONV_CAP_BYTES (at least
 * one): a few MiB keep the column matrix in cache between im2col and the
 * GEMM, and measured a little faster on fmnist_cnn's conv2 than the whole
 * batch (L = 12544, 17 MiB), while L stays in the thousands for BLAS. */
#define CONV_CAP_BYTES ((size_t)4 << 20)

typedef struct conv_state {
  size_t bytes;
  void *col;
} conv_state;

/* NHWC 1x1, stride 1, no padding: x is already the column matrix (L x C). */
static int conv_direct(const conv_dims *d) {
  return d->nhwc && d->kh == 1 && d->kw == 1 && d->sh == 1 && d->sw == 1 && d->ph == 0 &&
         d->pw == 0 && d->n * d->hwo <= INT_MAX && d->c <= INT_MAX && d->o <= INT_MAX;
}

/* Buffer bytes per sample of a chunk. */
static size_t conv_sample_bytes(const conv_dims *d, size_t elem) {
  return ((size_t)d->k + (d->nhwc ? 0 : (size_t)d->og)) * (size_t)d->hwo * elem;
}

/* Samples per chunk: at most `fit` (buffer room), CONV_CAP_BYTES, and what
 * keeps L within int. */
static int64_t conv_chunk(const conv_dims *d, size_t elem, size_t fit) {
  size_t per = conv_sample_bytes(d, elem);
  int64_t nb = d->n < 1 ? 1 : d->n;
  size_t cap = CONV_CAP_BYTES / per;
  if (fit / per < cap) cap = fit / per;
  if (cap < 1) cap = 1;
  if ((size_t)nb > cap) nb = (int64_t)cap;
  if (nb > INT_MAX / d->hwo) nb = INT_MAX / d->hwo;
  return nb;
}

static void conv_destroy(void *state) {
  conv_state *s = state;
  if (!s) return;
  stoke_host->free(s->col);
  stoke_host->free(s);
}

static stoke_err *conv_plan_state(const stoke_kernel_args_v1 *a, const conv_dims *d, size_t elem,
                                  void **state) {
  if (conv_direct(d)) return NULL; /* no buffer */
  conv_state *s = stoke_host->alloc(sizeof *s);
  if (!s) return STOKE_PERR(STOKE_E_OOM, "conv2d '%s': out of host memory", stoke_node_name(a));
  s->bytes = (size_t)conv_chunk(d, elem, SIZE_MAX) * conv_sample_bytes(d, elem);
  s->col = stoke_host->alloc(s->bytes);
  if (!s->col) {
    stoke_host->free(s);
    return STOKE_PERR(STOKE_E_OOM,
                      "conv2d '%s': out of host memory for the %zu-byte im2col buffer",
                      stoke_node_name(a), s->bytes);
  }
  *state = s;
  return NULL;
}

/* The buffers for run and the samples per chunk *nb: the plan's buffer,
 * or (run without plan, or with shapes larger than planned) a temporary
 * one that *tmp owns. */
static stoke_err *conv_col(const stoke_kernel_args_v1 *a, const conv_dims *d, size_t elem,
                           void *state, void **col, void **tmp, int64_t *nb) {
  size_t per = conv_sample_bytes(d, elem);
  conv_state *s = state;
  *tmp = NULL;
  if (s && s->bytes >= per) {
    *nb = conv_chunk(d, elem, s->bytes);
    *col = s->col;
    return NULL;
  }
  *nb = conv_chunk(d, elem, SIZE_MAX);
  size_t bytes = (size_t)*nb * per;
  *col = *tmp = stoke_host->alloc(bytes);
  if (!*col)
    return STOKE_PERR(STOKE_E_OOM, "conv2d '%s': out of host memory for %zu bytes",
                      stoke_node_name(a), bytes);
  return NULL;
}

/* ----------------------------------------------------- the other checks */

/* What every op below checks: dtypes, data, gradients against values. */
static stoke_err *simple_check(const stoke_kernel_args_v1 *a, const char *op, stoke_dtype dt,
                               int bwd, int run, int n_in) {
  CHECK(stoke_check_counts(a, op, bwd, n_in, 1));
  const stoke_tensor *x = &a->in[0];
  CHECK(check_xy(a, op, dt, bwd, run));
  if (!bwd) return NULL;
  if (a->din[0].data) CHECK(stoke_check_layout(a, op, "dx", &a->din[0], x));
  CHECK(stoke_check_layout(a, op, "dy", &a->dout[0], x));
  return stoke_check_data(a, op, "dy", &a->dout[0], run);
}

static stoke_err *bias_add_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd,
                                 int run) {
  const char *op = STOKE_OP_BIAS_ADD;
  CHECK(stoke_check_counts(a, op, bwd, 2, 1));
  const stoke_tensor *x = &a->in[0], *b = &a->in[1], *y = &a->out[0];
  if (x->shape.ndim < 2 || b->shape.ndim != 1 || b->shape.d[0] != x->shape.d[1] ||
      !stoke_same_shape(&x->shape, &y->shape))
    return STOKE_PERR(STOKE_E_INVALID,
                      "bias_add '%s': expects x[N, C, ...], bias[C] -> y like x; got x %s, bias "
                      "%s, y %s",
                      stoke_node_name(a), stoke_shape_str(&x->shape).s, stoke_shape_str(&b->shape).s, stoke_shape_str(&y->shape).s);
  CHECK(stoke_check_dtype(a, op, "bias", b, dt));
  CHECK(stoke_check_layout(a, op, "y", y, x));
  if (!bwd) CHECK(stoke_check_data(a, op, "bias", b, run));
  else CHECK(stoke_check_grad(a, op, "bias", &a->din[1], b));
  return simple_check(a, op, dt, bwd, run, 2);
}

static stoke_err *flatten_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd,
                                int run) {
  const char *op = STOKE_OP_FLATTEN;
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  const stoke_shape *xs = &a->in[0].shape, *ys = &a->out[0].shape;
  int64_t rest = 1;
  for (int i = 1; i < xs->ndim; i++) rest *= xs->d[i];
  if (xs->ndim < 2 || ys->ndim != 2 || ys->d[0] != xs->d[0] || ys->d[1] != rest)
    return STOKE_PERR(STOKE_E_INVALID, "flatten '%s': expects x[N, ...] -> y[N, prod]; got x %s, y %s",
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ys).s);
  return simple_check(a, op, dt, bwd, run, 1);
}

static stoke_err *gap_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, int run) {
  const char *op = STOKE_OP_GLOBAL_AVG_POOL;
  CHECK(stoke_check_counts(a, op, bwd, 1, 1));
  const stoke_shape *xs = &a->in[0].shape, *ys = &a->out[0].shape;
  if (xs->ndim != 4 || xs->d[2] < 1 || xs->d[3] < 1 || ys->ndim != 2 || ys->d[0] != xs->d[0] ||
      ys->d[1] != xs->d[1])
    return STOKE_PERR(STOKE_E_INVALID,
                      "global_avg_pool '%s': expects x[N, C, H, W] (H, W >= 1) -> y[N, C]; got "
                      "x %s, y %s",
                      stoke_node_name(a), stoke_shape_str(xs).s, stoke_shape_str(ys).s);
  return simple_check(a, op, dt, bwd, run, 1);
}

/* ================================================== the two instantiations */

#define CPU_CONV_BODY
#define PER_TYPE_FILE "conv.c"
#include "per_type.h"
#undef CPU_CONV_BODY

/* ============================================================ registration */

#define KERNEL CPU_KERNEL
#define KERNELS(sfx, dt)                                                                 \
  KERNEL(STOKE_OP_CONV2D, STOKE_FWD, conv2d_fwd, sfx, dt, conv_destroy),                \
  CPU_KERNEL_ACC(STOKE_OP_CONV2D, STOKE_BWD, conv2d_bwd, sfx, dt, conv_destroy, 1u),    \
  KERNEL(STOKE_OP_BIAS_ADD, STOKE_FWD, bias_add_fwd, sfx, dt, stoke_destroy_none),            \
  KERNEL(STOKE_OP_BIAS_ADD, STOKE_BWD, bias_add_bwd, sfx, dt, stoke_destroy_none),            \
  KERNEL(STOKE_OP_FLATTEN, STOKE_FWD, flatten_fwd, sfx, dt, stoke_destroy_none),              \
  KERNEL(STOKE_OP_FLATTEN, STOKE_BWD, flatten_bwd, sfx, dt, stoke_destroy_none),              \
  KERNEL(STOKE_OP_GLOBAL_AVG_POOL, STOKE_FWD, gap_fwd, sfx, dt, stoke_destroy_none),          \
  KERNEL(STOKE_OP_GLOBAL_AVG_POOL, STOKE_BWD, gap_bwd, sfx, dt, stoke_destroy_none)

static const stoke_kernel_v1 conv_kernels[] = {
    KERNELS(f32, STOKE_F32),
    KERNELS(f64, STOKE_F64),
};

stoke_err *cpu_register_conv(const stoke_registry_v1 *r) {
  return stoke_add_kernels(r, conv_kernels, sizeof conv_kernels / sizeof *conv_kernels);
}

const stoke_kernel_v1 *cpu_conv2d_kernel(stoke_pass pass, stoke_dtype dt) {
  for (size_t i = 0; i < sizeof conv_kernels / sizeof *conv_kernels; i++) {
    const stoke_kernel_v1 *k = &conv_kernels[i];
    if (!strcmp(k->op, STOKE_OP_CONV2D) && k->pass == pass && k->dtype == dt) return k;
  }
  return NULL;
}

#else /* CPU_CONV_BODY: the kernels for element type T */

#define FN(name) CAT(name, SFX)

static void FN(scale)(T *d, int64_t n, double beta) {
  for (int64_t i = 0; i < n; i++) ACC(T, d[i], beta, 0);
}

#define PLAN(fn, check) CPU_PLAN(FN(fn##_plan), , check)

/* ----------------------------------------------------------------- conv2d */

/* A row-major matrix operand: element (i, j) is p[i*ld + j], or p[j*ld + i]
 * when tr (it is stored transposed). */
typedef struct FN(mat) {
  T *p;
  int64_t ld;
  int tr;
} FN(mat);

static FN(mat) FN(mat_t)(FN(mat) m) {
  m.tr = !m.tr;
  return m;
}

/* c[m x n] = alpha a[m x k] b[k x n] + beta c; a c stored transposed is
 * computed as c^T = b^T a^T. */
static void FN(gemm)(int64_t m, int64_t n, int64_t k, FN(mat) a, FN(mat) b, double beta,
                     FN(mat) c) {
  if (c.tr) {
    FN(mat) at = FN(mat_t)(a), bt = FN(mat_t)(b);
    c.tr = 0;
    FN(gemm)(n, m, k, bt, at, beta, c);
    return;
  }
  GEMM(CblasRowMajor, a.tr ? CblasTrans : CblasNoTrans, b.tr ? CblasTrans : CblasNoTrans, (int)m,
       (int)n, (int)k, (T)1, a.p, (int)a.ld, b.p, (int)b.ld, (T)beta, c.p, (int)c.ld);
}

/* The output columns [lo, hi) of kernel column j whose input column
 * iw = ow*sw - pw + j*dw lies inside x; the rest read the zero padding. */
static void FN(ow_range)(const conv_dims *d, int64_t j, int64_t *lo, int64_t *hi) {
  int64_t iw0 = j * d->dw - d->pw;
  int64_t l = iw0 >= 0 ? 0 : (-iw0 + d->sw - 1) / d->sw;
  int64_t h = d->w - 1 - iw0 < 0 ? 0 : (d->w - 1 - iw0) / d->sw + 1;
  if (h > d->wo) h = d->wo;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

/* col[(c*kh + i)*kw + j][m*Ho*Wo + oh*Wo + ow] = x[n0 + m, g*Cg + c,
 * oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 in the padding) for the nb
 * samples from n0; the rows are ld apart. */
static void FN(im2col)(const conv_dims *d, const T *x, int64_t n0, int64_t nb, int64_t g,
                       T *col, int64_t ld) {
  for (int64_t c = 0; c < d->cg; c++)
    for (int64_t i = 0; i < d->kh; i++)
      for (int64_t j = 0; j < d->kw; j++) {
        int64_t lo, hi, iw0 = j * d->dw - d->pw;
        FN(ow_range)(d, j, &lo, &hi);
        int contig = d->sw == 1 && d->xw == 1;
        T *row = col + ((c * d->kh + i) * d->kw + j) * ld;
        for (int64_t m = 0; m < nb; m++) {
          const T *xc = x + (n0 + m) * d->xn + (g * d->cg + c) * d->xc;
          T *rm = row + m * d->hwo;
          for (int64_t oh = 0; oh < d->ho; oh++) {
            T *r = rm + oh * d->wo;
            int64_t ih = oh * d->sh - d->ph + i * d->dh;
            if (ih < 0 || ih >= d->h) {
              memset(r, 0, sizeof(T) * (size_t)d->wo);
              continue;
            }
            const T *xr = xc + ih * d->xh;
            for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;
            if (contig) {
              if (hi > lo) memcpy(r + lo, xr + lo + iw0, sizeof(T) * (size_t)(hi - lo));
            } else {
              for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[(ow * d->sw + iw0) * d->xw];
            }
            for (int64_t ow = hi; ow < d->wo; ow++) r[ow] = 0;
          }
        }
      }
}

/* The adjoint of im2col: dx[...] += col[...] for the nb samples from n0. */
static void FN(col2im)(const conv_dims *d, const T *col, int64_t ld, int64_t n0, int64_t nb,
                       int64_t g, T *dx) {
  for (int64_t c = 0; c < d->cg; c++)
    for (int64_t i = 0; i < d->kh; i++)
      for (int64_t j = 0; j < d->kw; j++) {
        int64_t lo, hi, iw0 = j * d->dw - d->pw;
        FN(ow_range)(d, j, &lo, &hi);
        const T *row = col + ((c * d->kh + i) * d->kw + j) * ld;
        for (int64_t m = 0; m < nb; m++) {
          T *xc = dx + (n0 + m) * d->xn + (g * d->cg + c) * d->xc;
          const T *rm = row + m * d->hwo;
          for (int64_t oh = 0; oh < d->ho; oh++) {
            int64_t ih = oh * d->sh - d->ph + i * d->dh;
            if (ih < 0 || ih >= d->h) continue;
            const T *r = rm + oh * d->wo;
            T *xr = xc + ih * d->xh;
            if (d->sw == 1 && d->xw == 1) {
              T *xo = xr + iw0;
              for (int64_t ow = lo; ow < hi; ow++) xo[ow] += r[ow];
            } else {
              for (int64_t ow = lo; ow < hi; ow++) xr[(ow * d->sw + iw0) * d->xw] += r[ow];
            }
          }
        }
      }
}

/* Group g's weight [O/g, K]. */
static FN(mat) FN(w_mat)(const conv_dims *d, const T *w, int64_t g) {
  return (FN(mat)){(T *)w + g * d->og * d->k, d->k, 0};
}

/* Group g of y (or dy) of the samples from n0 as [O/g, L]: NHWC stores it
 * transposed with every sample's positions in a row; NCHW has it only per
 * sample, so it is gathered into (or scattered from) buf. */
static FN(mat) FN(y_mat)(const conv_dims *d, const T *y, int64_t n0, int64_t g, T *buf,
                         int64_t ld) {
  if (d->nhwc) return (FN(mat)){(T *)y + n0 * d->yn + g * d->og, d->o, 1};
  return (FN(mat)){buf, ld, 0};
}

/* copy y[n0 + m, g*og + o, p] <-> buf[o][m*HoWo + p] (to_buf: gather) */
static void FN(y_copy)(const conv_dims *d, T *y, int64_t n0, int64_t nb, int64_t g, T *buf,
                       int64_t ld, int to_buf) {
  size_t bytes = sizeof(T) * (size_t)d->hwo;
  for (int64_t o = 0; o < d->og; o++)
    for (int64_t m = 0; m < nb; m++) {
      T *yp = y + (n0 + m) * d->yn + (g * d->og + o) * d->yc;
      T *bp = buf + o * ld + m * d->hwo;
      if (to_buf) memcpy(bp, yp, bytes);
      else memcpy(yp, bp, bytes);
    }
}

static stoke_err *FN(conv2d_fwd_plan)(const stoke_kernel_args_v1 *a, void **state,
                                      size_t *workspace_bytes) {
  conv_dims d;
  if (state) *state = NULL;
  if (workspace_bytes) *workspace_bytes = 0;
  CHECK(conv_check(a, DT, 0, 0, &d));
  return state ? conv_plan_state(a, &d, sizeof(T), state) : NULL;
}

static stoke_err *FN(conv2d_bwd_plan)(const stoke_kernel_args_v1 *a, void **state,
                                      size_t *workspace_bytes) {
  conv_dims d;
  if (state) *state = NULL;
  if (workspace_bytes) *workspace_bytes = 0;
  CHECK(conv_check(a, DT, 1, 0, &d));
  return state ? conv_plan_state(a, &d, sizeof(T), state) : NULL;
}

/* x of group g as the column matrix [Cg, N*H*W] of a direct conv. */
static FN(mat) FN(x_direct)(const conv_dims *d, const T *x, int64_t g) {
  return (FN(mat)){(T *)x + g * d->cg, d->c, 1};
}

/* y[chunk, g block] = W_g [O/g, K] x im2col(x[chunk], g) [K, L] */
static stoke_err *FN(conv2d_fwd)(const stoke_kernel_args_v1 *a, void *state) {
  conv_dims d;
  CHECK(conv_check(a, DT, 0, 1, &d));
  const T *x = a->in[0].data, *w = a->in[1].data;
  T *y = a->out[0].data;
  if (d.n == 0) return NULL;
  if (conv_direct(&d)) {
    for (int64_t g = 0; g < d.groups; g++)
      FN(gemm)(d.og, d.n * d.hwo, d.k, FN(w_mat)(&d, w, g), FN(x_direct)(&d, x, g), 0,
               FN(y_mat)(&d, y, 0, g, NULL, 0));
    return NULL;
  }
  void *colv, *tmp;
  int64_t nb;
  CHECK(conv_col(a, &d, sizeof(T), state, &colv, &tmp, &nb));
  T *col = colv;
  for (int64_t n0 = 0; n0 < d.n; n0 += nb) {
    int64_t cnt = d.n - n0 < nb ? d.n - n0 : nb, ld = cnt * d.hwo;
    T *ybuf = col + d.k * ld;
    FN(mat) cm = {col, ld, 0};
    for (int64_t g = 0; g < d.groups; g++) {
      FN(im2col)(&d, x, n0, cnt, g, col, ld);
      FN(gemm)(d.og, ld, d.k, FN(w_mat)(&d, w, g), cm, 0, FN(y_mat)(&d, y, n0, g, ybuf, ld));
      if (!d.nhwc) FN(y_copy)(&d, y, n0, cnt, g, ybuf, ld, 0);
    }
  }
  if (tmp) stoke_host->free(tmp);
  return NULL;
}

/* dW_g = beta dW_g + dy_g [O/g, L] x col^T [L, K] over the chunks;
 * dx = beta dx + col2im(W_g^T [K, O/g] x dy_g [O/g, L]). */
static stoke_err *FN(conv2d_bwd)(const stoke_kernel_args_v1 *a, void *state) {
  conv_dims d;
  CHECK(conv_check(a, DT, 1, 1, &d));
  const T *x = a->in[0].data, *w = a->in[1].data, *dy = a->dout[0].data;
  T *dx = a->din[0].data, *dw = a->din[1].data;
  if (!dx && !dw) return NULL;
  double bx = stoke_grad_beta(a, 0), bw = stoke_grad_beta(a, 1);
  if (d.n == 0) {
    if (dx) FN(scale)(dx, d.n * d.xn, bx);
    if (dw) FN(scale)(dw, d.o * d.k, bw);
    return NULL;
  }
  if (conv_direct(&d)) {
    for (int64_t g = 0; g < d.groups; g++) {
      FN(mat) dym = FN(y_mat)(&d, dy, 0, g, NULL, 0), xm = FN(x_direct)(&d, x, g);
      if (dw) {
        FN(mat) dwm = {dw + g * d.og * d.k, d.k, 0};
        FN(gemm)(d.og, d.k, d.n * d.hwo, dym, FN(mat_t)(xm), bw, dwm);
      }
      if (dx) {
        FN(mat) dxm = FN(x_direct)(&d, dx, g);
        FN(gemm)(d.k, d.n * d.hwo, d.og, FN(mat_t)(FN(w_mat)(&d, w, g)), dym, bx, dxm);
      }
    }
    return NULL;
  }
  if (dx) FN(scale)(dx, d.n * d.xn, bx);
  void *colv, *tmp;
  int64_t nb;
  CHECK(conv_col(a, &d, sizeof(T), state, &colv, &tmp, &nb));
  T *col = colv;
  for (int64_t n0 = 0; n0 < d.n; n0 += nb) {
    int64_t cnt = d.n - n0 < nb ? d.n - n0 : nb, ld = cnt * d.hwo;
    T *ybuf = col + d.k * ld;
    FN(mat) cm = {col, ld, 0};
    for (int64_t g = 0; g < d.groups; g++) {
      if (!d.nhwc) FN(y_copy)(&d, (T *)dy, n0, cnt, g, ybuf, ld, 1);
      FN(mat) dym = FN(y_mat)(&d, dy, n0, g, ybuf, ld);
      if (dw) {
        FN(im2col)(&d, x, n0, cnt, g, col, ld);
        FN(mat) dwm = {dw + g * d.og * d.k, d.k, 0};
        FN(gemm)(d.og, d.k, ld, dym, FN(mat_t)(cm), n0 == 0 ? bw : 1.0, dwm);
      }
      if (dx) {
        FN(gemm)(d.k, ld, d.og, FN(mat_t)(FN(w_mat)(&d, w, g)), dym, 0, cm);
        FN(col2im)(&d, col, ld, n0, cnt, g, dx);
      }
    }
  }
  if (tmp) stoke_host->free(tmp);
  return NULL;
}

/* --------------------------------------------------------------- bias_add */

PLAN(bias_add_fwd, bias_add_check(a, DT, 0, 0))
PLAN(bias_add_bwd, bias_add_check(a, DT, 1, 0))

/* The channel of memory element i: x is N x C x S (S the rest), or
 * N x (H W) x C for NHWC. Calls body(i, c) for every element. */
#define FOR_CHANNEL(x, i, ch, body)                                         \
  do {                                                                      \
    const stoke_shape *s_ = &(x)->shape;                                    \
    int64_t n_ = s_->d[0], c_ = s_->d[1], rest_ = 1;                        \
    for (int k_ = 2; k_ < s_->ndim; k_++) rest_ *= s_->d[k_];               \
    if (stoke_is_nhwc(x)) {                                                       \
      for (int64_t r_ = 0; r_ < n_ * rest_; r_++)                           \
        for (int64_t ch = 0; ch < c_; ch++) {                               \
          int64_t i = r_ * c_ + ch;                                         \
          body;                                                             \
        }                                                                   \
    } else {                                                                \
      for (int64_t m_ = 0; m_ < n_; m_++)                                   \
        for (int64_t ch = 0; ch < c_; ch++)                                 \
          for (int64_t s2_ = 0; s2_ < rest_; s2_++) {                       \
            int64_t i = (m_ * c_ + ch) * rest_ + s2_;                       \
            body;                                                           \
          }                                                                 \
    }                                                                       \
  } while (0)

static stoke_err *FN(bias_add_fwd)(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(bias_add_check(a, DT, 0, 1));
  const T *x = a->in[0].data, *b = a->in[1].data;
  T *y = a->out[0].data;
  FOR_CHANNEL(&a->in[0], i, c, y[i] = x[i] + b[c]);
  return NULL;
}

/* dx = dy; db = beta db + sum over N and the spatial dims of dy. */
static stoke_err *FN(bias_add_bwd)(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(bias_add_check(a, DT, 1, 1));
  const T *dy = a->dout[0].data;
  T *dx = a->din[0].data, *db = a->din[1].data;
  if (dx) {
    double beta = stoke_grad_beta(a, 0);
    int64_t n = stoke_numel(&a->in[0].shape);
    for (int64_t i = 0; i < n; i++) ACC(T, dx[i], beta, dy[i]);
  }
  if (db) {
    const stoke_shape *s = &a->in[0].shape;
    int64_t n = s->d[0], c = s->d[1], rest = 1;
    for (int k = 2; k < s->ndim; k++) rest *= s->d[k];
    double beta = stoke_grad_beta(a, 1);
    int nhwc = stoke_is_nhwc(&a->in[0]);
    for (int64_t j = 0; j < c; j++) {
      double sum = 0;
      for (int64_t m = 0; m < n; m++)
        for (int64_t p = 0; p < rest; p++)
          sum += (double)dy[nhwc ? (m * rest + p) * c + j : (m * c + j) * rest + p];
      ACC(T, db[j], beta, sum);
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------- flatten */

PLAN(flatten_fwd, flatten_check(a, DT, 0, 0))
PLAN(flatten_bwd, flatten_check(a, DT, 1, 0))

/* The NCHW (logical) index of every NHWC memory element: calls
 * body(mem, logical). */
#define FOR_NHWC(s, mem, lg, body)                                          \
  do {                                                                      \
    int64_t n_ = (s)->d[0], c_ = (s)->d[1], hw_ = (s)->d[2] * (s)->d[3];    \
    for (int64_t m_ = 0; m_ < n_; m_++)                                     \
      for (int64_t p_ = 0; p_ < hw_; p_++)                                  \
        for (int64_t ch_ = 0; ch_ < c_; ch_++) {                            \
          int64_t mem = (m_ * hw_ + p_) * c_ + ch_;                         \
          int64_t lg = (m_ * c_ + ch_) * hw_ + p_;                          \
          body;                                                             \
        }                                                                   \
  } while (0)

/* y[n, (c, h, w)] = x[n, c, h, w] in logical order, whatever x's memory. */
static stoke_err *FN(flatten_fwd)(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(flatten_check(a, DT, 0, 1));
  const T *x = a->in[0].data;
  T *y = a->out[0].data;
  if (stoke_is_nhwc(&a->in[0])) FOR_NHWC(&a->in[0].shape, m, l, y[l] = x[m]);
  else if (stoke_numel(&a->in[0].shape))
    memcpy(y, x, sizeof(T) * (size_t)stoke_numel(&a->in[0].shape));
  return NULL;
}

static stoke_err *FN(flatten_bwd)(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(flatten_check(a, DT, 1, 1));
  const T *dy = a->dout[0].data;
  T *dx = a->din[0].data;
  if (!dx) return NULL;
  double beta = stoke_grad_beta(a, 0);
  if (stoke_is_nhwc(&a->in[0])) {
    FOR_NHWC(&a->in[0].shape, m, l, ACC(T, dx[m], beta, dy[l]));
  } else {
    int64_t n = stoke_numel(&a->in[0].shape);
    for (int64_t i = 0; i < n; i++) ACC(T, dx[i], beta, dy[i]);
  }
  return NULL;
}

/* -------------------------------------------------------- global_avg_pool */

PLAN(gap_fwd, gap_check(a, DT, 0, 0))
PLAN(gap_bwd, gap_check(a, DT, 1, 0))

/* y[n, c] = mean over (h, w) of x[n, c, h, w], summed in double. */
static stoke_err *FN(gap_fwd)(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(gap_check(a, DT, 0, 1));
  const stoke_shape *s = &a->in[0].shape;
  const T *x = a->in[0].data;
  T *y = a->out[0].data;
  int64_t n = s->d[0], c = s->d[1], hw = s->d[2] * s->d[3];
  if (stoke_is_nhwc(&a->in[0])) {
    for (int64_t m = 0; m < n; m++)
      for (int64_t j = 0; j < c; j++) {
        double sum = 0;
        for (int64_t p = 0; p < hw; p++) sum += (double)x[(m * hw + p) * c + j];
        y[m * c + j] = (T)(sum / (double)hw);
      }
  } else {
    for (int64_t r = 0; r < n * c; r++) {
      double sum = 0;
      for (int64_t p = 0; p < hw; p++) sum += (double)x[r * hw + p];
      y[r] = (T)(sum / (double)hw);
    }
  }
  return NULL;
}

/* dx[n, c, h, w] = dy[n, c] / (H W); reads only shapes of the forward. */
static stoke_err *FN(gap_bwd)(const stoke_kernel_args_v1 *a, void *state) {
  CHECK(gap_check(a, DT, 1, 1));
  T *dx = a->din[0].data;
  if (!dx) return NULL;
  const stoke_shape *s = &a->in[0].shape;
  const T *dy = a->dout[0].data;
  int64_t n = s->d[0], c = s->d[1], hw = s->d[2] * s->d[3];
  double beta = stoke_grad_beta(a, 0);
  if (stoke_is_nhwc(&a->in[0])) {
    for (int64_t m = 0; m < n; m++)
      for (int64_t p = 0; p < hw; p++)
        for (int64_t j = 0; j < c; j++)
          ACC(T, dx[(m * hw + p) * c + j], beta, (double)dy[m * c + j] / (double)hw);
  } else {
    for (int64_t r = 0; r < n * c; r++)
      for (int64_t p = 0; p < hw; p++) ACC(T, dx[r * hw + p], beta, (double)dy[r] / (double)hw);
  }
  return NULL;
}

#undef FOR_NHWC
#undef FOR_CHANNEL
#undef PLAN
#undef FN

#endif /* CPU_CONV_BODY */
