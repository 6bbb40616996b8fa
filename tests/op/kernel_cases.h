/* tests/op/kernel_cases.h: the case generators of tests/op/every_kernel_test.c,
 * one per op type: random shapes (odd ones among them: 1, primes, sizes
 * off every vector width), attributes and which inputs are parameters,
 * labels or statistics. A kernel whose op has no entry in case_table
 * fails the test: add a generator here with the op. Included once, by
 * every_kernel_test.c. */
#ifndef STOKE_TESTS_KERNEL_CASES_H
#define STOKE_TESTS_KERNEL_CASES_H

typedef enum kin_kind {
  IN_ACT = 0, /* an activation: uniform in [lo, hi) (default [-1, 1)), a gradient */
  IN_PARAM,   /* a parameter: its gradient accumulates under param_grad_beta */
  IN_LABEL,   /* i32 in [0, hi) */
  IN_U8,      /* u8 pixels */
  IN_STAT     /* statistics in [0.5, 1.5) (running mean/var, invstd): f32 (f64 for f64
               * kernels), no gradient */
} kin_kind;

typedef struct kin {
  stoke_shape shape;
  kin_kind kind;
  int fixed;          /* dtype below, else the kernel's (i32 labels, f32 statistics) */
  stoke_dtype dtype;
  stoke_layout layout; /* ANY: the case's for 4-D activations */
  double lo, hi;
  int no_grad;        /* a float input that gets no gradient (saved statistics read by the op) */
} kin;

typedef struct kcase {
  char label[80];
  const char *op;
  char attrs[128];
  const char *ref_attrs; /* the reference node's, when they differ (an f64 output) */
  int n_in;
  kin in[STOKE_MAX_IO];
  stoke_layout layout;
  int training;
  uint32_t flags;     /* STOKE_KFLAG_* */
  uint32_t douts;     /* outputs given a gradient in backward (0: output 0) */
  uint32_t skip_out;  /* outputs not compared with the reference (a ReLU bitmask whose bits may
                       * differ where z rounds to 0): */
  int relu_mask;      /* 1: output 1 is output 0's ReLU bitmask, checked bit by bit against the
                       * tested kernel's own output 0 (linear_act's aux) */
  int flat_mask_out;  /* > 0: that output is output 0's flat ReLU bitmask (bn_add_relu's, stoke/ops.h:
                       * bit e = element e of y > 0 as stored), checked exactly against the tested
                       * kernel's own output 0 and not against the reference */
  uint32_t state_out; /* IN_STAT inputs the forward updates in place: compared */
  double k;           /* the tolerance's K: the longest sum in forward or backward, or the
                       * product of the lengths of sums that feed one another (a
                       * gradient summed over rows of a product's gradient) */
  double arg;         /* an op's own number (grad_norm's max_norm) */
  int tf32_operands;  /* the TF32-rounded operands along the longest chain of products (0: a product's
                       * two with STOKE_KFLAG_TF32, none without); without the flag, operands split in
                       * two TF32 parts (3xTF32) */
  /* Output shapes for an op the compiler makes, whose inference refuses a
   * stand-alone node (linear_dact); 0: inferred. Their dtype is the kernel's. */
  int n_out;
  stoke_shape out[STOKE_MAX_IO];
  /* After the inputs are drawn: make them consistent (host, reference side). */
  void (*prep)(const struct kcase *c, stoke_tensor *ref, stoke_rng *r);
  /* Backward, after the reference forward and the output gradients are
   * drawn: zero the gradients the two sides may mask differently. */
  void (*prep_dout)(const struct kcase *c, const stoke_tensor *in, const stoke_tensor *out, stoke_tensor *dout);
} kcase;

#define MAX_CASES 12

static const char *pass_name(stoke_pass p) {
  return p == STOKE_FWD ? "forward" : p == STOKE_BWD ? "backward" : "update";
}

static int64_t pick(stoke_rng *r, int64_t lo, int64_t hi) { return lo + (int64_t)stoke_rng_below(r, (uint64_t)(hi - lo + 1)); }

/* An odd size: 1, a prime, or one past a power of two. */
static int64_t odd(stoke_rng *r) {
  static const int64_t v[] = {1, 3, 5, 7, 11, 13, 17, 31, 33};
  return v[stoke_rng_below(r, sizeof v / sizeof *v)];
}

/* An odd size of at least 5: for a dimension a parameter's gradient keeps
 * (bias, weight rows, channels). A gradient that is a sum of random-sign
 * terms over few elements can cancel to near 0, where a relative error
 * means nothing; with 5 or more the norm averages that out. */
static int64_t odd5(stoke_rng *r) {
  static const int64_t v[] = {5, 7, 11, 13, 17, 31, 33};
  return v[stoke_rng_below(r, sizeof v / sizeof *v)];
}

static stoke_shape shape_n(int n, const int64_t *d) {
  stoke_shape s = {n, {0}};
  for (int i = 0; i < n; i++) s.d[i] = d[i];
  return s;
}
#define SHAPE(...) shape_n((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})
#define S1(n) shape_n(1, (int64_t[]){n})

static kcase *new_case(kcase *out, int *n, const char *op, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static kcase *new_case(kcase *out, int *n, const char *op, const char *fmt, ...) {
  kcase *c = &out[(*n)++];
  memset(c, 0, sizeof *c);
  c->op = op;
  c->training = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->label, sizeof c->label, fmt, ap);
  va_end(ap);
  return c;
}

static void add_in(kcase *c, stoke_shape s, kin_kind kind) {
  c->in[c->n_in++] = (kin){.shape = s, .kind = kind};
}

static const char *shape_label(const stoke_shape *s) {
  static stoke_shape_text buf[4];
  static int next;
  char *b = buf[next++ % 4].s;
  snprintf(b, sizeof buf[0].s, "%s", stoke_shape_str(s).s);
  return b;
}

/* A GPU engine's kernel: its cases add the sizes the GPU's algorithms
 * switch at (the cpu's stay small: CI runs them). */
static int gpu_engine(const stoke_kernel_v1 *k) { return strcmp(k->engine, "cpu") != 0; }

/* ------------------------------------------------------- elementwise */

/* A random shape of 1 to 4 dimensions, small, sometimes with odd sizes;
 * one long row past any vector width. */
static stoke_shape any_shape(stoke_rng *r, int i) {
  switch (i % 4) {
    case 0: return SHAPE(pick(r, 2, 40), pick(r, 2, 130));
    case 1: return SHAPE(odd(r), odd(r), pick(r, 2, 9), odd(r));
    case 2: return S1(pick(r, 1000, 5003));
    default: return SHAPE(odd(r), pick(r, 1, 7), odd(r));
  }
}

static int gen_unary(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 4; i++) {
    stoke_shape s = any_shape(r, i);
    kcase *c = new_case(out, &n, k->op, "x %s", shape_label(&s));
    add_in(c, s, IN_ACT);
  }
  return n;
}

static int gen_gelu(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 4; i++) {
    stoke_shape s = any_shape(r, i);
    kcase *c = new_case(out, &n, k->op, "x %s %s", shape_label(&s), i & 1 ? "tanh" : "erf");
    snprintf(c->attrs, sizeof c->attrs, "approximate=%s", i & 1 ? "tanh" : "none");
    add_in(c, s, IN_ACT);
  }
  return n;
}

static int gen_add(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 4; i++) {
    stoke_shape s = any_shape(r, i);
    kcase *c = new_case(out, &n, k->op, "a, b %s", shape_label(&s));
    add_in(c, s, IN_ACT);
    add_in(c, s, IN_ACT);
  }
  return n;
}

/* dropout p = 0.3 training (every backend draws the same mask from the
 * seed) and eval (identity), p = 0. */
static int gen_dropout(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 4; i++) {
    stoke_shape s = any_shape(r, i);
    kcase *c = new_case(out, &n, k->op, "x %s p %s %s", shape_label(&s), i == 3 ? "0" : "0.3",
                        i == 2 ? "eval" : "training");
    snprintf(c->attrs, sizeof c->attrs, "p=%s", i == 3 ? "0" : "0.3");
    c->training = i != 2;
    add_in(c, s, IN_ACT);
  }
  return n;
}

/* ------------------------------------------------------------ linear */

static int gen_linear(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 3; i++) {
    int64_t b = i == 2 ? odd(r) : pick(r, 2, 64), in = i == 1 ? odd(r) : pick(r, 8, 130), o = pick(r, 5, 70);
    int bias = strcmp(k->op, STOKE_OP_MATMUL) != 0;
    kcase *c = new_case(out, &n, k->op, "x [%lld, %lld] W [%lld, %lld]", (long long)b, (long long)in, (long long)o,
                        (long long)in);
    add_in(c, SHAPE(b, in), IN_ACT);
    add_in(c, SHAPE(o, in), IN_PARAM);
    if (bias) add_in(c, S1(o), IN_PARAM);
    c->k = (double)(in > b ? in : b);
    /* the GPU engines: autotuned, deterministic, TF32 (f32) */
    static const uint32_t gpu_flags[3] = {STOKE_KFLAG_AUTOTUNE, STOKE_KFLAG_DETERMINISTIC, STOKE_KFLAG_TF32};
    c->flags = gpu_engine(k) && (i < 2 || k->dtype == STOKE_F32) ? gpu_flags[i] : 0;
  }
  if (gpu_engine(k)) { /* GPT-2's output head, in part */
    int bias = strcmp(k->op, STOKE_OP_MATMUL) != 0;
    kcase *c = new_case(out, &n, k->op, "x [128, 768] W [1024, 768]");
    add_in(c, SHAPE(128, 768), IN_ACT);
    add_in(c, SHAPE(1024, 768), IN_PARAM);
    if (bias) add_in(c, S1(1024), IN_PARAM);
    c->k = 1024;
  }
  return n;
}

/* linear_act: y and, for gelu, its aux z (relu's aux is a bitmask whose
 * bits may differ where z rounds to 0 on one side: not compared; the
 * backward, linear_dact, checks what the mask does). */
static int gen_linear_act(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  static const char *acts[] = {"act=relu", "act=gelu, approximate=tanh", "act=gelu, approximate=none"};
  int n_acts = strcmp(k->engine, "cublaslt") ? 3 : 2; /* cuBLASLt's epilogues: relu and gelu's tanh form */
  for (int i = 0; i < n_acts; i++) {
    int64_t b = pick(r, 1, 40), in = i ? odd(r) : pick(r, 8, 100), o = i == 2 ? 129 : pick(r, 5, 70);
    kcase *c = new_case(out, &n, k->op, "[%lld, %lld] -> %lld %s", (long long)b, (long long)in, (long long)o, acts[i]);
    snprintf(c->attrs, sizeof c->attrs, "%s", acts[i]);
    add_in(c, SHAPE(b, in), IN_ACT);
    add_in(c, SHAPE(o, in), IN_PARAM);
    add_in(c, S1(o), IN_PARAM);
    c->skip_out = i == 0 ? 2u : 0u;
    c->relu_mask = i == 0;
    c->k = (double)(in > b ? in : b);
  }
  return n;
}

static double gelu_of(double z, int tanh_form) {
  if (tanh_form) return 0.5 * z * (1 + tanh(sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
  return 0.5 * z * (1 + erf(z / sqrt(2)));
}

/* linear_dact's inputs as a linear_act wrote them: y1 = act(z1) and aux1
 * (relu: the bitmask of z1 > 0; gelu: z1). */
static void prep_dact(const kcase *c, stoke_tensor *ref, stoke_rng *r) {
  const stoke_tensor *y = &ref[0];
  int64_t rows = y->shape.d[0], cols = y->shape.d[1];
  int relu = strstr(c->attrs, "relu") != NULL, tanh_form = strstr(c->attrs, "tanh") != NULL;
  int64_t stride = (cols + 127) / 128 * 16;
  if (relu) memset(ref[3].data, 0, (size_t)(rows * stride)); /* padding bits (unspecified): 0 */
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      double z = -1 + 2 * stoke_rng_uniform(r);
      if (relu) {
        stoke_elem_set(y->data, y->dtype, i * cols + j, z > 0 ? z : 0);
        uint8_t *m = (uint8_t *)ref[3].data + i * stride + j / 8;
        if (z > 0) *m |= (uint8_t)(1u << (j % 8));
        else *m &= (uint8_t)~(1u << (j % 8));
      } else {
        stoke_elem_set(ref[3].data, ref[3].dtype, i * cols + j, z);
        stoke_elem_set(y->data, y->dtype, i * cols + j, gelu_of(z, tanh_form));
      }
    }
}

static int gen_linear_dact(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  static const char *acts[] = {"act=relu", "act=gelu, approximate=tanh", "act=gelu, approximate=none"};
  int n_acts = strcmp(k->engine, "cublaslt") ? 3 : 2; /* cuBLASLt's epilogues: relu and gelu's tanh form */
  for (int i = 0; i < n_acts; i++) {
    int64_t b = pick(r, 1, 40), in = i ? pick(r, 5, 140) : 129, o = pick(r, 5, 70);
    int relu = i == 0;
    kcase *c = new_case(out, &n, k->op, "y1 [%lld, %lld] W [%lld, %lld] %s", (long long)b, (long long)in, (long long)o,
                        (long long)in, acts[i]);
    snprintf(c->attrs, sizeof c->attrs, "%s", acts[i]);
    add_in(c, SHAPE(b, in), IN_ACT);
    add_in(c, SHAPE(o, in), IN_PARAM);
    add_in(c, S1(o), IN_PARAM);
    if (relu) c->in[c->n_in++] = (kin){.shape = SHAPE(b, (in + 127) / 128 * 16), .kind = IN_U8, .fixed = 1, .dtype = STOKE_U8};
    else c->in[c->n_in++] = (kin){.shape = SHAPE(b, in), .kind = IN_ACT, .no_grad = 1};
    add_in(c, S1(in), IN_PARAM); /* bias1: d bias1 is asked for */
    c->n_out = 1, c->out[0] = SHAPE(b, o);
    c->prep = prep_dact;
    c->k = (double)(o * b); /* d bias1 sums dz1 over rows, each a sum over o */
  }
  return n;
}

/* -------------------------------------------------------------- loss */

static int gen_softmax_ce(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 4; i++) {
    int64_t rows = i == 3 ? 1 : pick(r, 1, 40), cl = i == 1 ? 1000 : i == 2 ? odd(r) : pick(r, 2, 600);
    kcase *c = new_case(out, &n, k->op, "logits [%lld, %lld] smoothing %s", (long long)rows, (long long)cl,
                        i & 1 ? "0.1" : "0");
    snprintf(c->attrs, sizeof c->attrs, "label_smoothing=%s", i & 1 ? "0.1" : "0");
    c->in[c->n_in++] = (kin){.shape = SHAPE(rows, cl), .kind = IN_ACT, .lo = -4, .hi = 4};
    c->in[c->n_in++] = (kin){.shape = S1(rows), .kind = IN_LABEL, .hi = (double)cl};
    c->k = (double)(cl > rows ? cl : rows);
  }
  /* rows of whole 16-byte vectors longer than 512 (the cuda vector
   * kernels): one of 8 k classes, and GPT-2's padded vocabulary, but not
   * in fp16, where dloss / N times probabilities near 1 / 50304 fall below
   * its normal range (its spacing there, 2^-24, is no longer relative) */
  for (int i = 0; i < 2; i++) {
    if (i && k->dtype == STOKE_F16) break;
    int64_t rows = pick(r, 1, 6), cl = i ? 50304 : 8 * pick(r, 65, 400);
    kcase *c = new_case(out, &n, k->op, "logits [%lld, %lld] smoothing 0.1", (long long)rows, (long long)cl);
    snprintf(c->attrs, sizeof c->attrs, "label_smoothing=0.1");
    c->in[c->n_in++] = (kin){.shape = SHAPE(rows, cl), .kind = IN_ACT, .lo = -4, .hi = 4};
    c->in[c->n_in++] = (kin){.shape = S1(rows), .kind = IN_LABEL, .hi = (double)cl};
    c->k = (double)cl;
  }
  return n;
}

/* ------------------------------------------------------ convolutions */

static int gen_conv2d(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  static const struct {
    int kh, stride, pad, dil, groups;
  } g[] = {{3, 1, 1, 1, 1}, {3, 2, 1, 1, 1}, {1, 1, 0, 1, 1}, {5, 2, 2, 1, 1}, {3, 1, 1, 1, 2}, {3, 1, 2, 2, 1}};
  for (int i = 0; i < 6; i++) {
    int64_t grp = g[i].groups, cin = grp * pick(r, 1, 6), o = grp * pick(r, 3, 9);
    int64_t b = pick(r, 1, 3), h = pick(r, 4, 11), w = i & 1 ? odd(r) + 4 : pick(r, 4, 11);
    kcase *c = new_case(out, &n, k->op, "x [%lld, %lld, %lld, %lld] %dx%d s%d p%d d%d g%d", (long long)b,
                        (long long)cin, (long long)h, (long long)w, g[i].kh, g[i].kh, g[i].stride, g[i].pad, g[i].dil,
                        g[i].groups);
    snprintf(c->attrs, sizeof c->attrs, "stride=%d, padding=%d, dilation=%d, groups=%d", g[i].stride, g[i].pad,
             g[i].dil, g[i].groups);
    add_in(c, SHAPE(b, cin, h, w), IN_ACT);
    add_in(c, SHAPE(o, cin / grp, g[i].kh, g[i].kh), IN_PARAM);
    c->k = (double)(b * h * w > cin * 25 ? b * h * w : cin * 25);
    c->flags = (i % 3 == 1 ? STOKE_KFLAG_AUTOTUNE : 0) | (i % 3 == 2 ? STOKE_KFLAG_DETERMINISTIC : 0);
  }
  if (!gpu_engine(k)) return n;
  /* the GPU engines' algorithms for deep layers and the stem: ResNet's */
  static const struct {
    int64_t b, c, h, o, kh, stride;
  } deep[] = {{4, 256, 4, 256, 3, 1}, {4, 64, 8, 128, 3, 2}, {2, 3, 32, 16, 7, 2}};
  for (int i = 0; i < 3; i++) {
    kcase *c = new_case(out, &n, k->op, "x [%lld, %lld, %lld, %lld] %lldx%lld s%lld (ResNet)", (long long)deep[i].b,
                        (long long)deep[i].c, (long long)deep[i].h, (long long)deep[i].h, (long long)deep[i].kh,
                        (long long)deep[i].kh, (long long)deep[i].stride);
    snprintf(c->attrs, sizeof c->attrs, "stride=%lld, padding=%lld", (long long)deep[i].stride,
             (long long)deep[i].kh / 2);
    add_in(c, SHAPE(deep[i].b, deep[i].c, deep[i].h, deep[i].h), IN_ACT);
    add_in(c, SHAPE(deep[i].o, deep[i].c, deep[i].kh, deep[i].kh), IN_PARAM);
    c->k = (double)(deep[i].c * deep[i].kh * deep[i].kh);
    c->flags = i == 0 && k->dtype == STOKE_F32 ? STOKE_KFLAG_TF32 : i == 1 ? STOKE_KFLAG_AUTOTUNE : 0;
  }
  return n;
}

static int gen_bias_add(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  stoke_shape xs[4] = {SHAPE(pick(r, 1, 40), pick(r, 5, 130)), SHAPE(odd(r), pick(r, 5, 9), odd(r)),
                       SHAPE(pick(r, 1, 4), odd5(r), pick(r, 2, 12), odd(r)), SHAPE(pick(r, 1, 5), 70, 1, 1)};
  for (int i = 0; i < 4; i++) {
    kcase *c = new_case(out, &n, k->op, "x %s", shape_label(&xs[i]));
    add_in(c, xs[i], IN_ACT);
    add_in(c, S1(xs[i].d[1]), IN_PARAM);
    c->k = (double)(stoke_numel(&xs[i]) / xs[i].d[1]);
  }
  return n;
}

static int gen_flatten(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  stoke_shape xs[2] = {SHAPE(odd(r), pick(r, 1, 6), odd(r), pick(r, 2, 9)), SHAPE(pick(r, 1, 5), odd(r), pick(r, 2, 9))};
  for (int i = 0; i < 2; i++) {
    kcase *c = new_case(out, &n, k->op, "x %s", shape_label(&xs[i]));
    add_in(c, xs[i], IN_ACT);
  }
  return n;
}

static int gen_global_avg_pool(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  /* the fourth: channels a multiple of 16, the cuda kernels' 16-byte vectors in NHWC */
  stoke_shape xs[4] = {SHAPE(pick(r, 1, 4), odd(r), pick(r, 1, 12), odd(r)), SHAPE(2, 3, 33, 35),
                       SHAPE(pick(r, 1, 4), 70, pick(r, 1, 3), pick(r, 1, 3)),
                       SHAPE(pick(r, 1, 3), 16 * pick(r, 1, 4), pick(r, 1, 8), odd(r))};
  for (int i = 0; i < 4; i++) {
    kcase *c = new_case(out, &n, k->op, "x %s", shape_label(&xs[i]));
    add_in(c, xs[i], IN_ACT);
    c->k = (double)(xs[i].d[2] * xs[i].d[3]);
  }
  return n;
}

/* max_pool2d: distinct values in every plane (k / 32, exact in every
 * dtype), so no window holds a tie whose winner a backend may choose. */
static void prep_distinct(const kcase *c, stoke_tensor *ref, stoke_rng *r) {
  const stoke_shape *s = &ref[0].shape;
  int64_t planes = s->d[0] * s->d[1], hw = s->d[2] * s->d[3];
  int64_t *perm = malloc((size_t)hw * sizeof *perm);
  for (int64_t p = 0; p < planes; p++) {
    for (int64_t i = 0; i < hw; i++) perm[i] = i;
    for (int64_t i = hw - 1; i > 0; i--) {
      int64_t j = (int64_t)stoke_rng_below(r, (uint64_t)i + 1), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    int64_t n = p / s->d[1], ch = p % s->d[1];
    for (int64_t i = 0; i < hw; i++) {
      int64_t h = i / s->d[3], w = i % s->d[3];
      int64_t at = ref[0].layout == STOKE_NHWC ? ((n * s->d[2] + h) * s->d[3] + w) * s->d[1] + ch : p * hw + i;
      stoke_elem_set(ref[0].data, ref[0].dtype, at, (double)(perm[i] - hw / 2) / 32);
    }
  }
  free(perm);
}

static int gen_pool(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  /* the last two: 16 channels, so that NHWC takes the GPU's vectorized
   * kernels (channels a multiple of 16 bytes' worth; rows this short take its row tiles),
   * ResNet's 3x3/2 among them */
  static const struct {
    int kernel, stride, pad;
  } g[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0}, {3, 2, 1}, {2, 2, 0}};
  int max = !strcmp(k->op, STOKE_OP_MAX_POOL2D) || !strcmp(k->op, STOKE_OP_MAX_POOL2D_IDX);
  for (int i = 0; i < 6; i++) {
    int64_t b = pick(r, 1, 3), ch = i >= 4 ? 16 : i & 1 ? odd(r) : pick(r, 1, 8), h = pick(r, 3, 15), w = pick(r, 3, 15);
    kcase *c = new_case(out, &n, k->op, "x [%lld, %lld, %lld, %lld] k%d s%d p%d", (long long)b, (long long)ch,
                        (long long)h, (long long)w, g[i].kernel, g[i].stride, g[i].pad);
    snprintf(c->attrs, sizeof c->attrs, "kernel=%d, stride=%d, padding=%d", g[i].kernel, g[i].stride, g[i].pad);
    add_in(c, SHAPE(b, ch, h, w), IN_ACT);
    if (max) c->prep = prep_distinct;
    c->k = (double)(g[i].kernel * g[i].kernel);
  }
  /* rows too wide for the GPU's row tiles (3 rows of 65 x 128 channels: over 48 KB in bf16 and
   * f32), so that its per-window vectorized kernels stay tested too; 325 values a plane keep
   * prep_distinct's exact in bf16 */
  kcase *c = new_case(out, &n, k->op, "x [1, 128, 5, 65] k3 s2 p1");
  snprintf(c->attrs, sizeof c->attrs, "kernel=3, stride=2, padding=1");
  add_in(c, SHAPE(1, 128, 5, 65), IN_ACT);
  if (max) c->prep = prep_distinct;
  c->k = 9;
  return n;
}

/* ------------------------------------------------------- batch norm */

/* A ReLU mask recomputed from the inputs (bn_relu's, bn_apply_relu's,
 * bn_relu_conv_bn's) is computed in f32 on one side and in f64 on the
 * other: a pre-activation within rounding of 0 may take the other side of
 * the mask, which changes a gradient by a whole element, not a rounding.
 * The cases keep such elements out (fused_test does the same). */
#define MASK_MARGIN 1e-3

/* Channel of element i of a [N, C, ...] tensor in its layout. */
static int64_t channel_of(const stoke_tensor *t, int64_t i) {
  const stoke_shape *s = &t->shape;
  if (stoke_is_nhwc(t)) return i % s->d[1];
  int64_t inner = stoke_numel(s) / (s->d[0] * s->d[1]);
  return (i / inner) % s->d[1];
}

/* bn_relu (training: statistics of the batch, known after the forward):
 * dy = 0 where the pre-activation (x - mean) invstd weight + bias lies
 * within MASK_MARGIN of 0. */
static void prep_dout_bn_relu(const kcase *c, const stoke_tensor *in, const stoke_tensor *out, stoke_tensor *dout) {
  if (strcmp(c->op, STOKE_OP_BN_RELU)) return;
  for (int64_t i = 0, n = stoke_numel(&in[0].shape); i < n; i++) {
    int64_t ch = channel_of(&in[0], i);
    double pre = (stoke_elem_get(in[0].data, in[0].dtype, i) - stoke_elem_get(out[1].data, out[1].dtype, ch)) *
                     stoke_elem_get(out[2].data, out[2].dtype, ch) * stoke_elem_get(in[1].data, in[1].dtype, ch) +
                 stoke_elem_get(in[2].data, in[2].dtype, ch);
    if (fabs(pre) < MASK_MARGIN) stoke_elem_set(dout[0].data, dout[0].dtype, i, 0);
  }
}

/* Inputs (v, mean, invstd, weight, bias[, r]) whose ReLU is recomputed
 * from them (already rounded to the tested dtype): where the
 * pre-activation (plus r, when given) is within 0.05 of 0, v moves it up
 * by 0.1. bn_apply_add_relu rounds b to the dtype before adding r (up to
 * ~0.01 off in bf16), and v's own rounding after the move shifts it by
 * ~0.012 at most: the mask then agrees on both sides. */
static void nudge_off_zero(const stoke_tensor *v, const stoke_tensor *mean, const stoke_tensor *invstd,
                           const stoke_tensor *w, const stoke_tensor *b, const stoke_tensor *r) {
  for (int64_t i = 0, n = stoke_numel(&v->shape); i < n; i++) {
    int64_t ch = channel_of(v, i);
    double scale = stoke_elem_get(invstd->data, invstd->dtype, ch) * stoke_elem_get(w->data, w->dtype, ch);
    double pre = (stoke_elem_get(v->data, v->dtype, i) - stoke_elem_get(mean->data, mean->dtype, ch)) * scale +
                 stoke_elem_get(b->data, b->dtype, ch) + (r ? stoke_elem_get(r->data, r->dtype, i) : 0);
    if (fabs(pre) < 0.05) stoke_elem_set(v->data, v->dtype, i, stoke_elem_get(v->data, v->dtype, i) + 0.1 / scale);
  }
}

static void prep_bn_apply(const kcase *c, stoke_tensor *ref, stoke_rng *r) {
  if (strcmp(c->op, STOKE_OP_BN_APPLY)) nudge_off_zero(&ref[0], &ref[1], &ref[2], &ref[3], &ref[4], c->n_in > 5 ? &ref[5] : NULL);
}

static void prep_bn_relu_conv_bn(const kcase *c, stoke_tensor *ref, stoke_rng *r) {
  nudge_off_zero(&ref[0], &ref[1], &ref[2], &ref[3], &ref[4], NULL);
}

/* Training: every channel's batch spread to a standard deviation of at
 * least 0.5. Batch norm's input gradient is gamma * invstd * (dy - mean(dy)
 * - xhat * mean(dy * xhat)): terms of size invstd that cancel (over 2
 * values exactly, up to eps), so an fp32 kernel's rounding error is u x
 * invstd x |dy|, not u x |dx|. With as few as 2 values per channel (x [2,
 * 24, 1, 1]) a channel's two draws can be close and invstd reach 300: the
 * cuda f32 backward then missed the tolerance meant for O(1) terms (2.85e-6
 * against 1.15e-6, seed 3780078465, H100) with nothing wrong in the kernel.
 * Spreading the batch keeps invstd <= 2 and the terms O(1), as ResNet's
 * batches are; the kernels still see every shape. x has ch channels. */
static void spread_one(const stoke_tensor *x, int64_t ch) {
  int64_t n = stoke_numel(&x->shape);
  double *sum = calloc((size_t)ch, sizeof *sum), *sq = calloc((size_t)ch, sizeof *sq);
  int64_t *cnt = calloc((size_t)ch, sizeof *cnt);
  if (!sum || !sq || !cnt) fail_msg("out of memory");
  for (int64_t i = 0; i < n; i++) {
    int64_t k = channel_of(x, i);
    double v = stoke_elem_get(x->data, x->dtype, i);
    sum[k] += v, sq[k] += v * v, cnt[k]++;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t k = channel_of(x, i);
    double mean = sum[k] / (double)cnt[k], sd = sqrt(fmax(sq[k] / (double)cnt[k] - mean * mean, 0));
    if (sd >= 0.5 || cnt[k] < 2) continue;
    double v = stoke_elem_get(x->data, x->dtype, i), d = v - mean;
    /* all equal: spread by index parity */
    stoke_elem_set(x->data, x->dtype, i, mean + (sd > 1e-3 ? d * 0.5 / sd : (i & 1 ? 0.5 : -0.5)));
  }
  free(sum);
  free(sq);
  free(cnt);
}

/* A batch norm case's x spread in training (and r, bn_add_bn_relu's shortcut x). */
static void prep_bn_spread(const kcase *c, stoke_tensor *ref, stoke_rng *r) {
  (void)r;
  if (!c->training) return;
  spread_one(&ref[0], stoke_numel(&ref[1].shape));
  if (!strcmp(c->op, STOKE_OP_BN_ADD_BN_RELU)) spread_one(&ref[5], stoke_numel(&ref[1].shape)); /* the shortcut's x */
}

/* (x, weight, bias, running_mean, running_var[, r]): training and eval,
 * 4-D and 2-D, the running statistics compared after the forward. */
static int gen_batch_norm(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int dual = !strcmp(k->op, STOKE_OP_BN_ADD_BN_RELU), n = 0, add = !strcmp(k->op, STOKE_OP_BN_ADD_RELU) || dual;
  int four_only = !strcmp(k->engine, "fused") || !strcmp(k->engine, "cudnn") || add || strcmp(k->op, STOKE_OP_BATCH_NORM);
  for (int i = 0; i < 4; i++) {
    int training = i != 1, two_d = i == 3 && !four_only;
    int64_t b = pick(r, 2, 6), ch = i == 2 ? odd5(r) : i == 0 ? 8 * pick(r, 1, 8) : pick(r, 5, 40);
    int64_t h = pick(r, 1, 9), w = odd(r);
    /* Training needs 3 or more values a channel for a backward to check: over 2, the normalized
     * values are +-1 and dx = k (dy - mean(dy) - xhat mean(dy xhat)) is 0 but for eps's share
     * (a few 1e-5 of |dy| after prep_bn_spread), so its relative error is rounding noise over that
     * residue (the cuda f32 backward, x [2, 31, 1, 1]: 4.69e-6 against 1.15e-6, seed 710559, H200).
     * With 3 or more, dx keeps dy's part outside span(1, xhat), of the size of dy. */
    if (training && b * h * w < 3) h = 2;
    stoke_shape xs = two_d ? SHAPE(b * 3, ch) : SHAPE(b, ch, h, w);
    kcase *c = new_case(out, &n, k->op, "x %s %s", shape_label(&xs), training ? "training" : "eval");
    snprintf(c->attrs, sizeof c->attrs, dual ? "eps=1e-5, momentum=0.2, shortcut_eps=1e-3, shortcut_momentum=0.3"
                                             : "eps=1e-5, momentum=0.2");
    c->training = training;
    add_in(c, xs, IN_ACT);
    c->in[c->n_in++] = (kin){.shape = S1(ch), .kind = IN_PARAM, .lo = 0.5, .hi = 1.5};
    add_in(c, S1(ch), IN_PARAM);
    add_in(c, S1(ch), IN_STAT);
    add_in(c, S1(ch), IN_STAT);
    if (add) add_in(c, xs, IN_ACT);
    if (add) c->skip_out = 1u << STOKE_BN_ADD_RELU_MASK, c->flat_mask_out = STOKE_BN_ADD_RELU_MASK;
    if (dual) { /* the shortcut batch norm's weight, bias and running statistics; r is its x */
      c->in[c->n_in++] = (kin){.shape = S1(ch), .kind = IN_PARAM, .lo = 0.5, .hi = 1.5};
      add_in(c, S1(ch), IN_PARAM);
      add_in(c, S1(ch), IN_STAT);
      add_in(c, S1(ch), IN_STAT);
    }
    c->prep = prep_bn_spread;
    c->prep_dout = prep_dout_bn_relu;
    c->state_out = 3u << 3 | (dual ? 3u << 8 : 0);
    c->k = (double)(stoke_numel(&xs) / ch);
  }
  return n;
}

/* conv_bn: conv2d's geometry, then the output's statistics. */
static int gen_conv_bn(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 4; i++) {
    int kh = i & 1 ? 3 : 1, stride = i == 3 ? 2 : 1, pad = kh / 2, training = i != 2;
    int64_t b = pick(r, 1, 3), cin = pick(r, 1, 7), o = i == 1 ? odd5(r) : pick(r, 5, 9), h = pick(r, 3, 9), w = odd(r) + 2;
    kcase *c = new_case(out, &n, k->op, "x [%lld, %lld, %lld, %lld] W %lldx%d %s", (long long)b, (long long)cin,
                        (long long)h, (long long)w, (long long)o, kh, training ? "training" : "eval");
    snprintf(c->attrs, sizeof c->attrs, "stride=%d, padding=%d, eps=1e-5, momentum=0.2", stride, pad);
    c->training = training;
    add_in(c, SHAPE(b, cin, h, w), IN_ACT);
    add_in(c, SHAPE(o, cin, kh, kh), IN_PARAM);
    add_in(c, S1(o), IN_STAT);
    add_in(c, S1(o), IN_STAT);
    c->state_out = 3u << 2;
    c->k = (double)(b * h * w > cin * 9 ? b * h * w : cin * 9);
  }
  return n;
}

static int gen_bn_relu_conv_bn(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 3; i++) {
    int kh = i == 1 ? 1 : 3, training = i != 2;
    int64_t b = pick(r, 1, 3), cin = i ? odd5(r) : pick(r, 5, 7), o = pick(r, 5, 9), h = pick(r, 3, 8), w = pick(r, 3, 8);
    kcase *c = new_case(out, &n, k->op, "p [%lld, %lld, %lld, %lld] W %lldx%d %s", (long long)b, (long long)cin,
                        (long long)h, (long long)w, (long long)o, kh, training ? "training" : "eval");
    snprintf(c->attrs, sizeof c->attrs, "stride=1, padding=%d, eps=1e-5, momentum=0.2", kh / 2);
    c->training = training;
    add_in(c, SHAPE(b, cin, h, w), IN_ACT);
    add_in(c, S1(cin), IN_STAT); /* p_mean */
    add_in(c, S1(cin), IN_STAT); /* p_invstd */
    c->in[c->n_in++] = (kin){.shape = S1(cin), .kind = IN_PARAM, .lo = 0.5, .hi = 1.5};
    add_in(c, S1(cin), IN_PARAM);
    add_in(c, SHAPE(o, cin, kh, kh), IN_PARAM);
    add_in(c, S1(o), IN_STAT);
    add_in(c, S1(o), IN_STAT);
    c->state_out = 3u << 6;
    c->prep = prep_bn_relu_conv_bn;
    c->k = (double)(o * kh * kh * b * h * w); /* dp's sums over rows of dgrad's */
  }
  return n;
}

static int gen_bn_apply(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0, add = !strcmp(k->op, STOKE_OP_BN_APPLY_ADD_RELU);
  for (int i = 0; i < 3; i++) {
    int training = i != 1;
    int64_t b = pick(r, 1, 4), ch = i == 2 ? odd5(r) : pick(r, 5, 20);
    stoke_shape ys = i == 2 ? SHAPE(b * 5, ch) : SHAPE(b, ch, pick(r, 1, 7), odd(r));
    kcase *c = new_case(out, &n, k->op, "y %s %s", shape_label(&ys), training ? "training" : "eval");
    c->training = training;
    add_in(c, ys, IN_ACT);
    add_in(c, S1(ch), IN_STAT); /* mean */
    add_in(c, S1(ch), IN_STAT); /* invstd */
    c->in[c->n_in++] = (kin){.shape = S1(ch), .kind = IN_PARAM, .lo = 0.5, .hi = 1.5};
    add_in(c, S1(ch), IN_PARAM);
    if (add) add_in(c, ys, IN_ACT);
    c->prep = prep_bn_apply;
    c->k = (double)(stoke_numel(&ys) / ch);
  }
  return n;
}

/* -------------------------------------------------- input conversion */

/* normalize: u8 HWC images to each float dtype and both layouts; the
 * reference writes f32. */
static int gen_normalize(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  static const char *dts[] = {"f32", "bf16", "f16"};
  int n_dts = gpu_engine(k) ? 3 : 1; /* the cpu writes f32 */
  for (int i = 0; i < 2 * n_dts; i++) {
    int64_t ch = i & 1 ? 3 : 1;
    stoke_shape xs = SHAPE(pick(r, 1, 3), ch, pick(r, 1, 13), odd(r));
    kcase *c = new_case(out, &n, k->op, "x %s to %s %s", shape_label(&xs), dts[i / 2], i & 1 ? "nhwc" : "nchw");
    snprintf(c->attrs, sizeof c->attrs, "mean=%s, std=%s, layout=%s, dtype=%s", ch == 3 ? "0.485:0.456:0.406" : "0.5",
             ch == 3 ? "0.229:0.224:0.225" : "0.25", i & 1 ? "nhwc" : "nchw", dts[i / 2]);
    c->ref_attrs = i & 1 ? (ch == 3 ? "mean=0.485:0.456:0.406, std=0.229:0.224:0.225, layout=nhwc, dtype=f32"
                                    : "mean=0.5, std=0.25, layout=nhwc, dtype=f32")
                         : (ch == 3 ? "mean=0.485:0.456:0.406, std=0.229:0.224:0.225, layout=nchw, dtype=f32"
                                    : "mean=0.5, std=0.25, layout=nchw, dtype=f32");
    c->in[c->n_in++] = (kin){.shape = xs, .kind = IN_U8, .fixed = 1, .dtype = STOKE_U8, .layout = STOKE_NHWC};
    c->layout = i & 1 ? STOKE_NHWC : STOKE_NCHW;
  }
  return n;
}

/* cast and autocast: every output dtype the engine converts to from the
 * kernel's; the reference writes f64. cast also reorders 4-D images from
 * NCHW to the output's layout. */
static int gen_cast(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0, autocast = !strcmp(k->op, STOKE_OP_AUTOCAST), cpu = !strcmp(k->engine, "cpu");
  stoke_dtype to[4];
  int n_to = 0;
  if (autocast) {
    if (k->dtype == STOKE_F32) {
      if (cpu) to[n_to++] = STOKE_F64;
      else to[n_to++] = STOKE_BF16, to[n_to++] = STOKE_F16;
    } else {
      to[n_to++] = STOKE_F32;
    }
  } else {
    to[n_to++] = STOKE_F32;
    if (cpu) to[n_to++] = STOKE_F64; /* the cpu casts to f32 and f64 */
    else to[n_to++] = STOKE_BF16, to[n_to++] = STOKE_F16;
  }
  /* 4-D: one case with 1, 3 or 4 channels (the cuda cast's per-pixel path for image batches), one
   * with 5 or more (its per-element path) */
  static const int64_t few[] = {1, 3, 4};
  for (int t = 0; t < n_to; t++)
    for (int shape = 0; shape < 3; shape++) {
      int four = shape > 0;
      int64_t ch = shape == 1 ? few[stoke_rng_below(r, 3)] : odd5(r);
      stoke_shape s = four ? SHAPE(pick(r, 1, 3), ch, pick(r, 1, 9), odd(r)) : SHAPE(pick(r, 1, 40), pick(r, 1, 300));
      kcase *c = new_case(out, &n, k->op, "x %s to %s", shape_label(&s), stoke_dtype_name(to[t]));
      snprintf(c->attrs, sizeof c->attrs, "dtype=%s", stoke_dtype_name(to[t]));
      c->ref_attrs = "dtype=f64";
      c->in[c->n_in++] = (kin){.shape = s, .kind = IN_ACT, .lo = -3, .hi = 3,
                               .layout = four && !autocast ? STOKE_NCHW : STOKE_LAYOUT_ANY};
      if (four) c->layout = autocast ? STOKE_NCHW : STOKE_NHWC;
    }
  return n;
}

/* ---------------------------------------------------------- sequences */

static int gen_embedding(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 3; i++) {
    int64_t v = i == 2 ? 1 : pick(r, 2, 60), c_ = i == 1 ? odd5(r) : pick(r, 5, 130), b = pick(r, 1, 4), t = odd(r);
    kcase *c = new_case(out, &n, k->op, "weight [%lld, %lld] idx [%lld, %lld]", (long long)v, (long long)c_,
                        (long long)b, (long long)t);
    add_in(c, SHAPE(v, c_), IN_PARAM);
    c->in[c->n_in++] = (kin){.shape = SHAPE(b, t), .kind = IN_LABEL, .hi = (double)v};
    c->k = (double)(b * t);
  }
  if (gpu_engine(k)) { /* also the cuda forward's vector path (rows of whole 16-byte vectors) */
    kcase *c = new_case(out, &n, k->op, "weight [1000, 64] idx [8, 64]");
    add_in(c, SHAPE(1000, 64), IN_PARAM);
    c->in[c->n_in++] = (kin){.shape = SHAPE(8, 64), .kind = IN_LABEL, .hi = 1000};
    c->k = 512;
  }
  return n;
}

static int gen_position_embedding(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  for (int i = 0; i < 3; i++) {
    int64_t b = pick(r, 1, 4), t = odd(r), ch = i ? odd5(r) : pick(r, 5, 100), p = t + pick(r, 0, 5);
    kcase *c = new_case(out, &n, k->op, "x [%lld, %lld, %lld] weight [%lld, %lld]", (long long)b, (long long)t,
                        (long long)ch, (long long)p, (long long)ch);
    add_in(c, SHAPE(b, t, ch), IN_ACT);
    add_in(c, SHAPE(p, ch), IN_PARAM);
    c->k = (double)b;
  }
  if (gpu_engine(k)) { /* rows of whole 16-byte vectors: the cuda kernels' vector path */
    kcase *c = new_case(out, &n, k->op, "x [3, 16, 64] weight [20, 64]");
    add_in(c, SHAPE(3, 16, 64), IN_ACT);
    add_in(c, SHAPE(20, 64), IN_PARAM);
    c->k = 3;
  }
  return n;
}

/* Every element of t as round(v * scale) 2^-7: on the grid of 2^-7. */
static void to_grid(stoke_tensor *t, double scale) {
  for (int64_t j = 0, n = stoke_numel(&t->shape); j < n; j++)
    stoke_elem_set(t->data, t->dtype, j, round(stoke_elem_get(t->data, t->dtype, j) * scale) / 128);
}

/* add_layer_norm rounds s = a + b to the kernel's dtype before its
 * statistics (stoke/ops.h), which the f64 reference, adding exactly, does
 * not: a saved mean then differs by the average of the C roundings of s,
 * u |s| / sqrt(C) in size, which the relative-norm check measures against
 * ERR_FLOOR when the mean itself is near 0 (seed 266005693, bf16, one row
 * of 165: mean 0.0086 off by 3.5e-4). a and b on the grid of 2^-7 in
 * [-1, 1] make every s exact in bf16 (8 significant bits hold multiples of
 * 2^-7 below 2), fp16 and f32, so the two sides normalize the same s. */
static void prep_exact_sum(const kcase *c, stoke_tensor *ref, stoke_rng *r) {
  (void)c, (void)r;
  to_grid(&ref[0], 128);
  to_grid(&ref[1], 128);
}

/* add_bias_layer_norm's s = a + b + c[j]: the three on the grid of 2^-7 in
 * [-1/2, 1/2], so |s| < 2 and every s is exact in bf16 as above. */
static void prep_exact_sum3(const kcase *c, stoke_tensor *ref, stoke_rng *r) {
  (void)c, (void)r;
  to_grid(&ref[0], 64);
  to_grid(&ref[1], 64);
  to_grid(&ref[4], 64);
}

/* One layer norm case on x: weight near 1, bias, both parameters. */
static void ln_case(kcase *out, int *n, const stoke_kernel_v1 *k, int add, stoke_shape xs) {
  int64_t ch = xs.d[xs.ndim - 1], rows = stoke_numel(&xs) / ch;
  kcase *c = new_case(out, n, k->op, "x %s", shape_label(&xs));
  snprintf(c->attrs, sizeof c->attrs, "eps=1e-5");
  add_in(c, xs, IN_ACT);
  if (add) add_in(c, xs, IN_ACT);
  c->in[c->n_in++] = (kin){.shape = S1(ch), .kind = IN_PARAM, .lo = 0.5, .hi = 1.5};
  add_in(c, S1(ch), IN_PARAM);
  if (add == 2) add_in(c, S1(ch), IN_PARAM); /* add_bias_layer_norm's c */
  c->douts = add ? 3u : 1u;
  if (add) c->prep = add == 2 ? prep_exact_sum3 : prep_exact_sum;
  c->k = (double)(rows > ch ? rows : ch);
}

static int gen_layer_norm(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0, add = !strcmp(k->op, STOKE_OP_ADD_BIAS_LAYER_NORM) ? 2 : !strcmp(k->op, STOKE_OP_ADD_LAYER_NORM);
  for (int i = 0; i < 4; i++) {
    int64_t rows = i == 1 ? 1 : pick(r, 1, 40), ch = i == 2 ? 768 : i == 3 ? odd5(r) : pick(r, 5, 200);
    ln_case(out, &n, k, add, i == 0 ? SHAPE(pick(r, 1, 3), rows, ch) : SHAPE(rows, ch));
  }
  /* the cuda register path: whole 16-byte vectors up to 1024 columns, more
   * rows than its backward's blocks (at most 512, and at most what the
   * device holds at once) take in one pass */
  ln_case(out, &n, k, add, SHAPE(pick(r, 40, 300), 8 * pick(r, 1, 128)));
  ln_case(out, &n, k, add, SHAPE(2100, 1024));
  /* past 1024 columns (GPT-2 large's 1280, XL's 1600): the 16-bit types'
   * register path at 6 slots a lane (to 1536 columns, both directions) and
   * at 8 (to 2048: the forward; the backward there takes the plain path),
   * f32's plain path in 16-byte loads with more rows than its partial sums'
   * 16 a part; then GPT-2 XL's 1600 columns over 1000-1100 rows */
  ln_case(out, &n, k, add, SHAPE(pick(r, 20, 300), 1024 + 8 * pick(r, 1, 64)));
  ln_case(out, &n, k, add, SHAPE(pick(r, 20, 300), 1536 + 8 * pick(r, 1, 64)));
  ln_case(out, &n, k, add, SHAPE(pick(r, 1000, 1100), 1600));
  /* every type's plain path in 16-byte loads, past the register path's 2048 */
  ln_case(out, &n, k, add, SHAPE(pick(r, 17, 60), 2048 + 8 * pick(r, 1, 64)));
  return n;
}

/* attention over packed qkv; cudnn's flash attention is causal with a head
 * size that is a multiple of 8 (at most 128), and bf16/fp16 only. */
static int gen_attention(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0, cudnn = !strcmp(k->engine, "cudnn");
  for (int i = 0; i < 4; i++) {
    int causal = cudnn || i != 1;
    int64_t b = pick(r, 1, 2), t = i == 2 ? 64 : odd(r) + pick(r, 0, 3), h = pick(r, 1, 3);
    int64_t d = cudnn ? 8 * pick(r, 1, 8) : i == 3 ? odd(r) : pick(r, 1, 16);
    kcase *c = new_case(out, &n, k->op, "qkv [%lld, %lld, 3x%lldx%lld] %s", (long long)b, (long long)t, (long long)h,
                        (long long)d, causal ? "causal" : "full");
    snprintf(c->attrs, sizeof c->attrs, "n_head=%lld, causal=%d", (long long)h, causal);
    add_in(c, SHAPE(b, t, 3 * h * d), IN_ACT);
    c->k = (double)(t * d); /* dq sums over keys of dS, itself from sums over the head */
  }
  if (gpu_engine(k)) { /* GPT-2's head size */
    kcase *c = new_case(out, &n, k->op, "qkv [2, 256, 3x4x64] causal");
    snprintf(c->attrs, sizeof c->attrs, "n_head=4, causal=1");
    add_in(c, SHAPE(2, 256, 3 * 4 * 64), IN_ACT);
    c->k = 256 * 64;
    /* run.deterministic: long enough that dQ sums over several key blocks
     * (flash attention's default engine adds them with atomics) */
    c = new_case(out, &n, k->op, "qkv [2, 1024, 3x2x64] causal, deterministic");
    snprintf(c->attrs, sizeof c->attrs, "n_head=2, causal=1");
    add_in(c, SHAPE(2, 1024, 3 * 2 * 64), IN_ACT);
    c->k = 1024 * 64;
    c->flags = STOKE_KFLAG_DETERMINISTIC;
    /* head sizes past 128 (cuDNN's Hopper engines take them up to 256) */
    int64_t d = 8 * pick(r, 17, 32);
    c = new_case(out, &n, k->op, "qkv [2, 200, 3x2x%lld] causal", (long long)d);
    snprintf(c->attrs, sizeof c->attrs, "n_head=2, causal=1");
    add_in(c, SHAPE(2, 200, 3 * 2 * d), IN_ACT);
    c->k = (double)(200 * d);
  }
  if (gpu_engine(k)) { /* a head size a multiple of 8 below 64: the tensor-core tiles' 16-byte loads, padded */
    int64_t d = 8 * pick(r, 1, 7), t = 64 + odd(r);
    kcase *c = new_case(out, &n, k->op, "qkv [2, %lld, 3x2x%lld] causal", (long long)t, (long long)d);
    snprintf(c->attrs, sizeof c->attrs, "n_head=2, causal=1");
    add_in(c, SHAPE(2, t, 3 * 2 * d), IN_ACT);
    c->k = (double)(t * d);
  }
  if (gpu_engine(k) && k->dtype == STOKE_F32) { /* run.precision = tf32: the cuda kernels' tensor-core path */
    for (int i = 0; i < 3; i++) { /* head size 64; 72-120 (16-byte loads, padded); odd (element-wise loads) */
      int64_t d = i == 0 ? 64 : i == 1 ? 8 * pick(r, 9, 15) : 64 + odd(r) % 64, t = i ? 64 + odd(r) : 256;
      kcase *c = new_case(out, &n, k->op, "qkv [2, %lld, 3x2x%lld] %s, TF32", (long long)t, (long long)d,
                          i == 2 ? "full" : "causal");
      snprintf(c->attrs, sizeof c->attrs, "n_head=2, causal=%d", i != 2);
      add_in(c, SHAPE(2, t, 3 * 2 * d), IN_ACT);
      c->k = (double)(t * d);
      c->flags = STOKE_KFLAG_TF32;
      /* dQ's chain: q and k (the scores), dy and v (dP), dS and k (the sum over keys) */
      c->tf32_operands = 6;
    }
  }
  /* exact f32 on the GPU: 3xTF32 (each operand split in two TF32 parts; the residual 2^-22 a product) */
  for (int i = 0; gpu_engine(k) && k->dtype == STOKE_F32 && i < n; i++)
    if (!out[i].tf32_operands) out[i].tf32_operands = 6;
  return n;
}

/* The views: reshape, slice, split, transpose (i32 token windows too). */
static int gen_view(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out) {
  int n = 0;
  int64_t a = pick(r, 1, 4), b = odd(r), c_ = pick(r, 2, 12);
  stoke_shape x = SHAPE(a, b, c_);
  kcase *c;
  /* i32 views (token windows): ids below GPT-2's vocabulary */
  kin xin = {.shape = x, .kind = k->dtype == STOKE_I32 ? IN_LABEL : IN_ACT, .hi = k->dtype == STOKE_I32 ? 50257 : 0};
  if (!strcmp(k->op, STOKE_OP_RESHAPE)) {
    c = new_case(out, &n, k->op, "x %s to [%lld, -1]", shape_label(&x), (long long)a);
    snprintf(c->attrs, sizeof c->attrs, "shape=%lldx-1", (long long)a);
    c->in[c->n_in++] = xin;
    c = new_case(out, &n, k->op, "x %s to [-1]", shape_label(&x));
    snprintf(c->attrs, sizeof c->attrs, "shape=-1");
    c->in[c->n_in++] = xin;
  } else if (!strcmp(k->op, STOKE_OP_SLICE)) {
    for (int dim = 0; dim < 3; dim++) {
      int64_t len = pick(r, 1, x.d[dim]), start = pick(r, 0, x.d[dim] - len);
      c = new_case(out, &n, k->op, "x %s dim %d [%lld, +%lld)", shape_label(&x), dim, (long long)start, (long long)len);
      snprintf(c->attrs, sizeof c->attrs, "dim=%d, start=%lld, length=%lld", dim == 2 ? -1 : dim, (long long)start,
               (long long)len);
      c->in[c->n_in++] = xin;
    }
  } else if (!strcmp(k->op, STOKE_OP_SPLIT)) {
    for (int dim = 0; dim < 3; dim++) {
      int64_t s1 = pick(r, 0, x.d[dim] - 1);
      c = new_case(out, &n, k->op, "x %s dim %d sizes %lld, %lld", shape_label(&x), dim, (long long)(x.d[dim] - s1),
                   (long long)s1);
      if (s1) snprintf(c->attrs, sizeof c->attrs, "dim=%d, sizes=%lldx%lld", dim, (long long)(x.d[dim] - s1), (long long)s1);
      else snprintf(c->attrs, sizeof c->attrs, "dim=%d, sizes=%lld", dim, (long long)x.d[dim]);
      c->in[c->n_in++] = xin;
      c->douts = s1 ? 3u : 1u;
    }
  } else {
    static const int dd[][2] = {{0, 2}, {1, 2}, {0, 1}};
    for (int i = 0; i < 3; i++) {
      c = new_case(out, &n, k->op, "x %s swap %d, %d", shape_label(&x), dd[i][0], dd[i][1]);
      snprintf(c->attrs, sizeof c->attrs, "dim0=%d, dim1=%d", dd[i][0], dd[i][1]);
      c->in[c->n_in++] = xin;
    }
  }
  return n;
}

/* ------------------------------------------------------------ table */

typedef int (*case_fn)(const stoke_kernel_v1 *k, stoke_rng *r, kcase *out);

static const struct {
  const char *op;
  case_fn gen;
} case_table[] = {
    {STOKE_OP_RELU, gen_unary},
    {"swish", gen_unary}, /* plugins/swish */
    {STOKE_OP_GELU, gen_gelu},
    {STOKE_OP_ADD, gen_add},
    {STOKE_OP_DROPOUT, gen_dropout},
    {STOKE_OP_LINEAR, gen_linear},
    {STOKE_OP_LINEAR_RELU, gen_linear},
    {STOKE_OP_MATMUL, gen_linear},
    {STOKE_OP_LINEAR_ACT, gen_linear_act},
    {STOKE_OP_LINEAR_DACT, gen_linear_dact},
    {STOKE_OP_SOFTMAX_CE, gen_softmax_ce},
    {STOKE_OP_CONV2D, gen_conv2d},
    {STOKE_OP_BIAS_ADD, gen_bias_add},
    {STOKE_OP_FLATTEN, gen_flatten},
    {STOKE_OP_GLOBAL_AVG_POOL, gen_global_avg_pool},
    {STOKE_OP_MAX_POOL2D, gen_pool},
    {STOKE_OP_MAX_POOL2D_IDX, gen_pool},
    {STOKE_OP_AVG_POOL2D, gen_pool},
    {STOKE_OP_BATCH_NORM, gen_batch_norm},
    {STOKE_OP_BN_RELU, gen_batch_norm},
    {STOKE_OP_BN_ADD_RELU, gen_batch_norm},
    {STOKE_OP_BN_ADD_BN_RELU, gen_batch_norm},
    {STOKE_OP_CONV_BN, gen_conv_bn},
    {STOKE_OP_BN_RELU_CONV_BN, gen_bn_relu_conv_bn},
    {STOKE_OP_BN_APPLY, gen_bn_apply},
    {STOKE_OP_BN_APPLY_RELU, gen_bn_apply},
    {STOKE_OP_BN_APPLY_ADD_RELU, gen_bn_apply},
    {STOKE_OP_NORMALIZE, gen_normalize},
    {STOKE_OP_CAST, gen_cast},
    {STOKE_OP_AUTOCAST, gen_cast},
    {STOKE_OP_EMBEDDING, gen_embedding},
    {STOKE_OP_POSITION_EMBEDDING, gen_position_embedding},
    {STOKE_OP_LAYER_NORM, gen_layer_norm},
    {STOKE_OP_ADD_LAYER_NORM, gen_layer_norm},
    {STOKE_OP_ADD_BIAS_LAYER_NORM, gen_layer_norm},
    {STOKE_OP_ATTENTION, gen_attention},
    {STOKE_OP_RESHAPE, gen_view},
    {STOKE_OP_SLICE, gen_view},
    {STOKE_OP_SPLIT, gen_view},
    {STOKE_OP_TRANSPOSE, gen_view},
};

static case_fn case_gen(const char *op) {
  for (size_t i = 0; i < sizeof case_table / sizeof *case_table; i++)
    if (!strcmp(case_table[i].op, op)) return case_table[i].gen;
  return NULL;
}

#endif
