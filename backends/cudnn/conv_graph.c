/* backends/cudnn/conv_graph.c: conv2d forward and backward (f32, bf16, f16;
 * NCHW or NHWC) through cuDNN's graph API: the "cudnn" engine's kernels.
 *
 * Why the graph API: on the H100 the classic API's algorithm list misses
 * the fast Hopper kernels for many of ResNet's shapes (layer1's 1x1 conv
 * at batch 256: 0.374 ms forward, 0.697 ms backward-filter, against a
 * 0.068 ms memory floor); PyTorch reaches cuDNN through the graph API and
 * its engine heuristics. One operation graph per direction (fprop, dgrad,
 * wgrad); the plan is timed among the heuristic candidates with
 * STOKE_KFLAG_AUTOTUNE (cudnn.benchmark), else the first that builds, and
 * shared by every node of the same problem (graph.c's cache).
 *
 * The weight stays [O, C/groups, kh, kw] (OIHW) in memory, as checkpoints
 * keep it. With NHWC activations the graph first describes it as it is
 * (OIHW strides); when no engine takes that mix, the kernel stages an OHWI
 * ("KRSC") copy in its workspace, as the classic path does. dW is computed
 * into that region too when it must be accumulated (param_grad_beta) or
 * transposed, and added onto dW with cudnnAddTensor/cudnnTransformTensor.
 * A problem no graph engine runs falls back to the classic API (conv.c),
 * once, with a log line that says why. dx honours din_accumulate (beta 1,
 * a second plan), so a residual block's input gradient needs no add.
 *
 * Inputs with few channels (at most 8, 16-bit NHWC: ResNet's stem) can
 * take the unfolded path (conv_unfold.cu): the kernel's taps copied into
 * the channels in the workspace, then a 1x1 (all taps) or R x 1 (width
 * taps) convolution that cuDNN runs on its fast tensor-core kernels. With
 * autotune the direct plan and the unfoldings are timed (the unfold
 * kernel counted) and the fastest kept; without, the width taps are
 * unfolded (into 32-channel rows) for at most 4 channels. Backward unfolds only for the weight's gradient
 * (the stem's input needs none). */
#include <stdio.h>
#include <string.h>

#include "conv_unfold.h"
#include "graph.h"
#include "stoke/ops.h"

enum { UID_X = 1, UID_W = 2, UID_Y = 3 };

/* What identifies one direction's plan (memcmp'd: memset first). */
typedef struct gconv_key {
  char tag[8]; /* "conv" */
  int32_t kind;
  float beta;
  cg_conv_geom g;
  uint32_t flags, reserved; /* no padding bytes: the key is memcmp'd */
} gconv_key;

typedef struct gconv_state {
  cudnn_engine *eng;
  const cg_plan *fprop, *dgrad, *dgrad_acc, *wgrad;
  int w_krsc;         /* NHWC with the weight read as OHWI: staged in the workspace, or w_mem_ohwi */
  int w_mem_ohwi;     /* the weight (and dW) is [O, kh, kw, C] in memory (core/layout.c's filter_ohwi) */
  size_t w_region;    /* bytes of workspace before the plans' (the staged W / dW) */
  size_t workspace;
  void *classic;      /* fallback state (conv.c) when no graph engine runs the problem */
  cudnnTensorDescriptor_t w_oihw, w_ohwi; /* for the staging transposes */
  cudnnDataType_t data;
  /* the unfolded path (conv_unfold.cu): CU_NONE, or how x is unfolded; the
   * plans above are then the unfolded problem's, and the workspace starts
   * with the packed weight (or its gradient) and the unfolded x */
  int unfold;
  cu_unfold_geom ug;
  size_t u_xu_off;
  char ctx[320];
} gconv_state;

/* The paths: direct, width taps unfolded (channels padded to a multiple of
 * 8, or of 32: cuDNN's R x 1 kernels ran the stem's 24 channels 1.9x
 * slower than 32, BENCHMARKS.md run 14), all taps unfolded. */
enum { CU_NONE = 0, CU_WIDTH = 1, CU_FULL = 2, CU_WIDTH32 = 3, CU_MODES = 4 };
static const char *const unfold_names[CU_MODES] = {"direct", "width taps unfolded",
                                                   "all taps unfolded (a 1x1 convolution)",
                                                   "width taps unfolded, 32-channel rows"};

static cudnnDataType_t data_type(stoke_dtype t) {
  return t == STOKE_F16 ? CUDNN_DATA_HALF : t == STOKE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static void gconv_destroy(void *state) {
  gconv_state *st = state;
  if (!st) return;
  if (st->classic) stoke_cudnn_classic_destroy(st->classic);
  if (st->w_oihw) cudnnDestroyTensorDescriptor(st->w_oihw);
  if (st->w_ohwi) cudnnDestroyTensorDescriptor(st->w_ohwi);
  stoke_host->free(st);
}

/* The problem of one node, read from its arguments. */
typedef struct conv_geom {
  cg_conv_geom g;
  int64_t groups;
  stoke_dtype dtype;
  int w_ohwi; /* the weight tensor is labelled NHWC: [O, kh, kw, C] in memory */
} conv_geom;

static stoke_err *geometry(const stoke_kernel_args_v1 *a, gconv_state *st, int bwd, conv_geom *cg0) {
  if (!a->engine)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d '%s': no engine state (backend 'cudnn' not opened)",
                      stoke_node_name(a));
  if (a->n_in < 2 || a->n_out < 1 || !a->in || !a->out || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d '%s': needs x, weight and y%s", stoke_node_name(a),
                      bwd ? " and their gradients" : "");
  const stoke_tensor *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
  if (x->shape.ndim != 4 || w->shape.ndim != 4 || y->shape.ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d '%s': x, weight and y must be 4-D", stoke_node_name(a));
  memset(cg0, 0, sizeof *cg0);
  cg_conv_geom *cg = &cg0->g;
  memcpy(cg->x, x->shape.d, sizeof cg->x);
  memcpy(cg->w, w->shape.d, sizeof cg->w);
  memcpy(cg->y, y->shape.d, sizeof cg->y);
  stoke_cudnn_attr_pair(a->node, STOKE_CONV2D_STRIDE, 1, cg->stride);
  stoke_cudnn_attr_pair(a->node, STOKE_CONV2D_PADDING, 0, cg->pad);
  stoke_cudnn_attr_pair(a->node, STOKE_CONV2D_DILATION, 1, cg->dil);
  cg0->groups = a->node && a->node->n_attrs > STOKE_CONV2D_GROUPS ? a->node->attrs[STOKE_CONV2D_GROUPS].i : 1;
  cg->nhwc = x->layout == STOKE_NHWC;
  cg0->w_ohwi = w->layout == STOKE_NHWC;
  cg0->dtype = x->dtype;
  cg->dt = data_type(x->dtype);
  snprintf(st->ctx, sizeof st->ctx,
           "node '%s': x [%lld, %lld, %lld, %lld] %s %s, weight [%lld, %lld, %lld, %lld]%s, y [%lld, %lld, %lld, "
           "%lld], stride %lldx%lld, padding %lldx%lld, dilation %lldx%lld, groups %lld",
           stoke_node_name(a), (long long)cg->x[0], (long long)cg->x[1], (long long)cg->x[2], (long long)cg->x[3],
           cg->nhwc ? "NHWC" : "NCHW", stoke_dtype_name(x->dtype), (long long)cg->w[0], (long long)cg->w[1],
           (long long)cg->w[2], (long long)cg->w[3], cg0->w_ohwi ? " (OHWI in memory)" : "", (long long)cg->y[0], (long long)cg->y[1],
           (long long)cg->y[2], (long long)cg->y[3], (long long)cg->stride[0], (long long)cg->stride[1],
           (long long)cg->pad[0], (long long)cg->pad[1], (long long)cg->dil[0], (long long)cg->dil[1],
           (long long)cg0->groups);
  if (cg0->w_ohwi && !cg->nhwc)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: the weight is [O, kh, kw, C] in memory (NHWC) but x is NCHW; "
                      "such filters belong to NHWC graphs (core/layout.c); %s", st->ctx);
  if (x->dtype != STOKE_F32 && x->dtype != STOKE_F16 && x->dtype != STOKE_BF16)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cudnn conv2d: dtype %s not supported (f32, bf16, f16); %s",
                      stoke_dtype_name(x->dtype), st->ctx);
  if (w->dtype != x->dtype || y->dtype != x->dtype)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: weight is %s and y %s, x is %s; %s",
                      stoke_dtype_name(w->dtype), stoke_dtype_name(y->dtype), stoke_dtype_name(x->dtype), st->ctx);
  int64_t groups = cg0->groups;
  if (groups < 1 || cg->x[1] % groups || cg->w[0] % groups || cg->w[1] != cg->x[1] / groups ||
      cg->y[0] != cg->x[0] || cg->y[1] != cg->w[0])
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: inconsistent channels or groups; %s", st->ctx);
  for (int i = 0; i < 2; i++) {
    int64_t want = (cg->x[2 + i] + 2 * cg->pad[i] - cg->dil[i] * (cg->w[2 + i] - 1) - 1) / cg->stride[i] + 1;
    if (cg->y[2 + i] != want)
      return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: y's %s is %lld, the convolution gives %lld; %s",
                        i ? "width" : "height", (long long)cg->y[2 + i], (long long)want, st->ctx);
  }
  return NULL;
}

/* The graph of one direction, its plan from the engine's cache or built. */
static stoke_err *plan_dir(const stoke_kernel_args_v1 *a, gconv_state *st, const conv_geom *cg0, cg_conv_kind kind,
                           int w_krsc, float beta, const cg_plan **out) {
  cg_conv_geom cg = cg0->g;
  cg.w_krsc = w_krsc;
  gconv_key k;
  memset(&k, 0, sizeof k);
  memcpy(k.tag, "conv", 4);
  k.kind = kind, k.beta = beta;
  memcpy(&k.g, &cg, sizeof cg);
  k.flags = a->flags & (STOKE_KFLAG_TF32 | STOKE_KFLAG_DETERMINISTIC | STOKE_KFLAG_AUTOTUNE);
  cg_graph g;
  cg_graph_init(&g, st->ctx);
  cudnnBackendDescriptor_t x, w, y;
  stoke_err *e = cg_conv_tensors(&g, &cg, UID_X, UID_W, UID_Y, &x, &w, &y);
  if (!e) e = cg_conv(&g, kind, cg.pad, cg.stride, cg.dil, x, w, y, beta);
  static const char *const what[3] = {"conv2d fprop", "conv2d dgrad", "conv2d wgrad"};
  char label[96];
  snprintf(label, sizeof label, "%s%s%s%s", what[kind], st->unfold ? " (input unfolded)" : "",
           w_krsc && !st->unfold && !st->w_mem_ohwi ? " (weight staged OHWI)" : "", beta != 0 ? " (accumulating)" : "");
  cg_choice c = {.autotune = (a->flags & STOKE_KFLAG_AUTOTUNE) != 0,
                 .deterministic = (a->flags & STOKE_KFLAG_DETERMINISTIC) != 0,
                 .no_tf32 = cg0->dtype == STOKE_F32 && !(a->flags & STOKE_KFLAG_TF32),
                 .stream = a->stream};
  if (!e) e = cg_plan_get(st->eng, &g, &k, sizeof k, &c, label, out);
  cg_graph_free(&g);
  return e;
}

/* Every direction this node needs, with the weight as it is or staged. */
static stoke_err *plan_all(const stoke_kernel_args_v1 *a, gconv_state *st, const conv_geom *cg, int bwd,
                           int w_krsc) {
  st->fprop = st->dgrad = st->dgrad_acc = st->wgrad = NULL;
  if (!bwd) return plan_dir(a, st, cg, CG_FPROP, w_krsc, 0.0f, &st->fprop);
  if (a->din[0].data) {
    STOKE_PROPAGATE_P(plan_dir(a, st, cg, CG_DGRAD, w_krsc, 0.0f, &st->dgrad));
    if ((a->din_accumulate & 1u) || (a->param_grads & 1u))
      STOKE_PROPAGATE_P(plan_dir(a, st, cg, CG_DGRAD, w_krsc, 1.0f, &st->dgrad_acc));
  }
  if (a->din[1].data) STOKE_PROPAGATE_P(plan_dir(a, st, cg, CG_WGRAD, w_krsc, 0.0f, &st->wgrad));
  return NULL;
}

static size_t max_ws(const gconv_state *st) {
  int64_t m = 0;
  const cg_plan *p[4] = {st->fprop, st->dgrad, st->dgrad_acc, st->wgrad};
  for (int i = 0; i < 4; i++)
    if (p[i] && p[i]->workspace > m) m = p[i]->workspace;
  return (size_t)m;
}

static stoke_err *make_stage_descs(gconv_state *st, const conv_geom *cg) {
  const int64_t *wd = cg->g.w;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&st->w_oihw), st->ctx);
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&st->w_ohwi), st->ctx);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(st->w_oihw, CUDNN_TENSOR_NCHW, st->data, (int)wd[0], (int)wd[1],
                                         (int)wd[2], (int)wd[3]),
              st->ctx);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(st->w_ohwi, CUDNN_TENSOR_NHWC, st->data, (int)wd[0], (int)wd[1],
                                         (int)wd[2], (int)wd[3]),
              st->ctx);
  return NULL;
}

/* Whether the plans read a staged OHWI copy of an OIHW weight (made in
 * the workspace's first region before each pass), not the weight itself. */
static int w_staged(const gconv_state *st) { return st->w_krsc && !st->w_mem_ohwi; }

/* The direct path: the weight as it is first; staged OHWI when no engine
 * takes that mix (NHWC). STOKE_E_UNSUPPORTED when no engine runs it. */
static stoke_err *plan_direct(const stoke_kernel_args_v1 *a, gconv_state *st, const conv_geom *cg, int bwd) {
  st->unfold = CU_NONE;
  if (cg->w_ohwi) { /* read as it is: no staging, and no OIHW plan */
    st->w_krsc = 1;
    return plan_all(a, st, cg, bwd, 1);
  }
  st->w_krsc = 0;
  stoke_err *e = plan_all(a, st, cg, bwd, 0);
  if (e && e->code == STOKE_E_UNSUPPORTED && cg->g.nhwc) {
    stoke_host->err_free(e);
    st->w_krsc = 1;
    e = plan_all(a, st, cg, bwd, 1);
  }
  return e;
}

/* Whether the unfolded path (conv_unfold.cu) can serve this node's pass:
 * 16-bit NHWC, groups 1, dilation 1, at most 8 input channels, a kernel
 * larger than 1x1, and in backward the weight's gradient only (the stem's
 * input is data: it needs none). */
static int unfold_eligible(const stoke_kernel_args_v1 *a, const conv_geom *cg, int bwd) {
  const cg_conv_geom *g = &cg->g;
  if (!g->nhwc || (cg->dtype != STOKE_BF16 && cg->dtype != STOKE_F16) || cg->groups != 1) return 0;
  if (g->dil[0] != 1 || g->dil[1] != 1 || g->x[1] > 8 || g->w[2] * g->w[3] < 2) return 0;
  if (bwd && (a->din[0].data || !a->din[1].data)) return 0;
  for (int i = 0; i < 4; i++)
    if (g->x[i] > (1 << 24) || g->y[i] > (1 << 24) || g->w[i] > (1 << 24)) return 0;
  /* the unfold kernels' grid: one block per unfolded row (n x h rows at most) */
  return g->x[0] * (g->x[2] > g->y[2] ? g->x[2] : g->y[2]) <= INT32_MAX;
}

/* The unfolding of mode `mode` and the problem it leaves: x' NHWC
 * [n, cu, hu, wu], the packed weight [o, cu, r', 1] in OHWI order. */
static void unfold_geom(const conv_geom *cg, int mode, cu_unfold_geom *u, conv_geom *ucg) {
  const cg_conv_geom *g = &cg->g;
  memset(u, 0, sizeof *u);
  u->n = (int)g->x[0], u->c = (int)g->x[1], u->h = (int)g->x[2], u->w = (int)g->x[3];
  u->o = (int)g->w[0], u->r = (int)g->w[2], u->s = (int)g->w[3];
  u->sh = (int)g->stride[0], u->sw = (int)g->stride[1], u->ph = (int)g->pad[0], u->pw = (int)g->pad[1];
  u->full = mode == CU_FULL;
  u->w_ohwi = cg->w_ohwi;
  int taps = u->full ? u->r * u->s : u->s, align = mode == CU_WIDTH32 ? 32 : 8;
  u->cu = (taps * u->c + align - 1) / align * align;
  u->hu = u->full ? (int)g->y[2] : u->h;
  u->wu = (int)g->y[3];
  *ucg = *cg;
  cg_conv_geom *v = &ucg->g;
  v->x[1] = v->w[1] = u->cu, v->x[2] = u->hu, v->x[3] = u->wu;
  v->w[2] = u->full ? 1 : u->r, v->w[3] = 1;
  v->stride[0] = u->full ? 1 : u->sh, v->stride[1] = 1;
  v->pad[0] = u->full ? 0 : u->ph, v->pad[1] = 0;
}

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* The unfolded path's plans (st->ug, the workspace's layout). */
static stoke_err *plan_unfolded(const stoke_kernel_args_v1 *a, gconv_state *st, const conv_geom *cg, int bwd,
                                int mode) {
  conv_geom ucg;
  unfold_geom(cg, mode, &st->ug, &ucg);
  st->unfold = mode;
  st->w_krsc = 1;
  stoke_err *e = plan_all(a, st, &ucg, bwd, 1);
  if (e) st->unfold = CU_NONE;
  return e;
}

/* One unfolding on the timing temporaries. */
typedef struct unfold_run {
  const cu_unfold_geom *u;
  void *x, *xu;
  cudaStream_t s;
} unfold_run;

static int run_unfold(void *ctx) {
  unfold_run *r = ctx;
  return stoke_cudnn_unfold(r->x, r->xu, r->u, r->s) != cudaSuccess;
}

/* The unfolding's time on temporaries (cg_time3), ms; -1 when it could not
 * be timed. */
static float time_unfold(const cu_unfold_geom *u, cudaStream_t s) {
  size_t xb = (size_t)u->n * u->h * u->w * u->c * 2, ub = (size_t)stoke_cudnn_unfold_numel(u) * 2;
  unfold_run r = {u, NULL, NULL, s};
  float out = -1;
  if (cudaMalloc(&r.x, xb) == cudaSuccess && cudaMalloc(&r.xu, ub) == cudaSuccess) {
    cudaMemsetAsync(r.x, 0x3c, xb, s);
    out = cg_time3(run_unfold, &r, s);
  }
  if (r.x) cudaFree(r.x);
  if (r.xu) cudaFree(r.xu);
  cudaGetLastError();
  return out;
}

/* The measured time of the plan this pass runs (autotune), or -1. */
static float pass_ms(const gconv_state *st, int bwd) {
  const cg_plan *p = bwd ? st->wgrad : st->fprop;
  return p ? p->ms : -1;
}

/* Which path runs a pass that can be unfolded: forced (the engine's
 * conv_unfold_force, for tests), timed with autotune (the direct plan
 * against each unfolding, its unfold kernel counted), else the width taps
 * unfolded into 32-channel rows for at most 4 channels (the measured case:
 * ResNet's stem, BENCHMARKS.md run 14). Leaves st planned for the choice. */
static stoke_err *choose_unfold(const stoke_kernel_args_v1 *a, gconv_state *st, const conv_geom *cg, int bwd) {
  int force = st->eng->conv_unfold_force;
  const char *pass = bwd ? "wgrad" : "fprop";
  if (force == 1) return plan_direct(a, st, cg, bwd);
  int mode = force == 2 ? CU_WIDTH : force == 3 ? CU_FULL : force == 4 ? CU_WIDTH32 : CU_NONE;
  if (!mode && !(a->flags & STOKE_KFLAG_AUTOTUNE)) mode = cg->g.x[1] <= 4 ? CU_WIDTH32 : CU_NONE;
  if (mode) {
    stoke_err *e = plan_unfolded(a, st, cg, bwd, mode);
    if (!e) {
      stoke_host->log(STOKE_LOG_INFO, "cudnn", "conv2d '%s' %s: %s (%d channels)%s", stoke_node_name(a), pass,
                      unfold_names[mode], st->ug.cu, force ? ", forced" : "");
      return NULL;
    }
    if (e->code != STOKE_E_UNSUPPORTED) return e;
    stoke_host->log(STOKE_LOG_INFO, "cudnn", "conv2d '%s' %s: %s has no engine, direct: %s", stoke_node_name(a),
                    pass, unfold_names[mode], e->msg);
    stoke_host->err_free(e);
    return plan_direct(a, st, cg, bwd);
  }
  if (force) return plan_direct(a, st, cg, bwd);
  /* timed: each candidate's plan time plus its unfolding */
  float t[CU_MODES] = {-1, -1, -1, -1}, tu[CU_MODES] = {0, 0, 0, 0};
  stoke_err *e = plan_direct(a, st, cg, bwd);
  if (e && e->code != STOKE_E_UNSUPPORTED) return e;
  if (e) stoke_host->err_free(e);
  else t[CU_NONE] = pass_ms(st, bwd);
  for (int m = CU_WIDTH; m < CU_MODES; m++) {
    e = plan_unfolded(a, st, cg, bwd, m);
    if (e && e->code != STOKE_E_UNSUPPORTED) return e;
    if (e) {
      stoke_host->err_free(e);
      continue;
    }
    tu[m] = time_unfold(&st->ug, (cudaStream_t)a->stream);
    if (pass_ms(st, bwd) >= 0 && tu[m] >= 0) t[m] = pass_ms(st, bwd) + tu[m];
  }
  int best = -1;
  for (int m = 0; m < CU_MODES; m++)
    if (t[m] >= 0 && (best < 0 || t[m] < t[best])) best = m;
  if (best < 0) best = CU_NONE; /* nothing timed: the direct path (or its fallback) */
  stoke_host->log(STOKE_LOG_INFO, "cudnn",
                  "conv2d '%s' %s: %s (timed: direct %.3f ms, width taps unfolded %.3f (unfold %.3f), into "
                  "32-channel rows %.3f (unfold %.3f), all taps unfolded %.3f (unfold %.3f); -1: no engine)",
                  stoke_node_name(a), pass, unfold_names[best], (double)t[0], (double)t[1], (double)tu[1],
                  (double)t[3], (double)tu[3], (double)t[2], (double)tu[2]);
  return best == CU_NONE ? plan_direct(a, st, cg, bwd) : plan_unfolded(a, st, cg, bwd, best); /* cached plans */
}

static stoke_err *gconv_plan(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes, int bwd) {
  gconv_state *st = stoke_host->alloc(sizeof *st);
  if (!st) return STOKE_PERR(STOKE_E_OOM, "cudnn conv2d '%s': out of host memory", stoke_node_name(a));
  memset(st, 0, sizeof *st);
  st->eng = a->engine;
  conv_geom cg;
  stoke_err *e = geometry(a, st, bwd, &cg);
  if (e) goto fail;
  st->data = cg.g.dt;
  st->w_mem_ohwi = cg.w_ohwi;
  e = unfold_eligible(a, &cg, bwd) ? choose_unfold(a, st, &cg, bwd) : plan_direct(a, st, &cg, bwd);
  if (e && e->code == STOKE_E_UNSUPPORTED) { /* no graph engine: the classic API */
    stoke_host->log(STOKE_LOG_INFO, "cudnn", "conv2d '%s': falls back to the classic API: %s", stoke_node_name(a),
                    e->msg);
    stoke_host->err_free(e);
    size_t ws = 0;
    e = stoke_cudnn_classic_plan(a, &st->classic, &ws, bwd);
    if (e) goto fail;
    *state = st;
    *workspace_bytes = ws;
    return NULL;
  }
  if (e) goto fail;
  e = make_stage_descs(st, &cg);
  if (e) goto fail;
  if (st->unfold) {
    /* the packed weight (or its gradient), then the unfolded x */
    st->u_xu_off = align256((size_t)st->ug.o * (st->ug.full ? 1 : st->ug.r) * st->ug.cu * 2);
    st->w_region = st->u_xu_off + align256((size_t)stoke_cudnn_unfold_numel(&st->ug) * 2);
  } else {
    /* the staged W (or dW, when accumulated or transposed) leads the workspace */
    int needs_region = w_staged(st) || (bwd && a->din[1].data);
    st->w_region = needs_region ? align256(stoke_tensor_bytes(&a->in[1])) : 0;
  }
  st->workspace = st->w_region + max_ws(st);
  *state = st;
  *workspace_bytes = st->workspace;
  return NULL;
fail:
  gconv_destroy(st);
  return e;
}

static stoke_err *plan_fwd(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  return gconv_plan(a, state, ws, 0);
}
static stoke_err *plan_bwd(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  return gconv_plan(a, state, ws, 1);
}

static void *plan_ws(const stoke_kernel_args_v1 *a, const gconv_state *st) {
  return a->workspace ? (char *)a->workspace + st->w_region : NULL;
}

/* The weight as the plans read it: in place, or staged OHWI. */
static stoke_err *weight_for(const stoke_kernel_args_v1 *a, const gconv_state *st, void **w) {
  *w = a->in[1].data;
  if (!*w) return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: weight has no data; %s", st->ctx);
  if (!w_staged(st)) return NULL;
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnSetStream(st->eng->handle, (cudaStream_t)a->stream), st->ctx);
  CUDNN_CHECK(cudnnTransformTensor(st->eng->handle, &one, st->w_oihw, *w, &zero, st->w_ohwi, a->workspace),
              st->ctx);
  *w = a->workspace;
  return NULL;
}

static stoke_err *run_fwd(const stoke_kernel_args_v1 *a, void *state) {
  gconv_state *st = state;
  if (st && st->classic) return stoke_cudnn_classic_run_fwd(a, st->classic);
  STOKE_PROPAGATE_P(stoke_cudnn_check_run(a, st, st ? st->workspace : 0, st ? st->ctx : ""));
  if (!a->in[0].data || !a->out[0].data)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d forward: x or y has no data; %s", st->ctx);
  if (st->unfold) {
    char *ws = a->workspace;
    STOKE_CUDA(stoke_cudnn_unfold_pack_w(a->in[1].data, ws, &st->ug, a->stream));
    STOKE_CUDA(stoke_cudnn_unfold(a->in[0].data, ws + st->u_xu_off, &st->ug, a->stream));
    void *ptrs[3] = {ws + st->u_xu_off, ws, a->out[0].data};
    return cg_execute(st->eng, st->fprop, ptrs, plan_ws(a, st), a->stream, st->ctx);
  }
  void *w;
  STOKE_PROPAGATE_P(weight_for(a, st, &w));
  void *ptrs[3] = {a->in[0].data, w, a->out[0].data};
  return cg_execute(st->eng, st->fprop, ptrs, plan_ws(a, st), a->stream, st->ctx);
}

/* dW (param_grad_beta: 0 overwrites, else accumulates) on `stream` with
 * the workspace at `ws`: the compute stream's, or the side stream's
 * ([run] wgrad_stream), laid out alike. */
static stoke_err *run_wgrad(const stoke_kernel_args_v1 *a, const gconv_state *st, void *dy, void *dw, void *stream,
                            char *ws) {
  if (!a->in[0].data) return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d backward: x has no data; %s", st->ctx);
  float beta = (a->param_grads & 2u) ? a->param_grad_beta : 0.0f;
  void *plan_ws = ws ? ws + st->w_region : NULL;
  if (st->unfold) { /* dW = unpack(wgrad(unfold(x), dy)), added with beta */
    STOKE_CUDA(stoke_cudnn_unfold(a->in[0].data, ws + st->u_xu_off, &st->ug, stream));
    void *ptrs[3] = {ws + st->u_xu_off, ws, dy};
    STOKE_PROPAGATE_P(cg_execute(st->eng, st->wgrad, ptrs, plan_ws, stream, st->ctx));
    /* the unfolded path is 16-bit only (unfold_eligible) */
    STOKE_CUDA(stoke_cudnn_unfold_unpack_dw(ws, dw, &st->ug, cg_stoke_dtype(st->data), beta, stream));
    return NULL;
  }
  /* straight into dW when its layout is the plan's and nothing accumulates */
  int direct = !w_staged(st) && beta == 0.0f;
  void *target = direct ? dw : ws;
  void *ptrs[3] = {a->in[0].data, target, dy};
  STOKE_PROPAGATE_P(cg_execute(st->eng, st->wgrad, ptrs, plan_ws, stream, st->ctx));
  if (!direct) {
    cudnnHandle_t h = st->eng->handle;
    const float one = 1.0f;
    CUDNN_CHECK(cudnnSetStream(h, (cudaStream_t)stream), st->ctx);
    if (st->w_mem_ohwi)
      CUDNN_CHECK(cudnnAddTensor(h, &one, st->w_ohwi, ws, &beta, st->w_ohwi, dw), st->ctx);
    else if (st->w_krsc)
      CUDNN_CHECK(cudnnTransformTensor(h, &one, st->w_ohwi, ws, &beta, st->w_oihw, dw), st->ctx);
    else
      CUDNN_CHECK(cudnnAddTensor(h, &one, st->w_oihw, ws, &beta, st->w_oihw, dw), st->ctx);
  }
  return NULL;
}

/* dx (overwritten, or added with din_accumulate / a parameter's beta) and
 * dW. Given a side stream (STOKE_KCAP_SIDE_GRADS), dW goes there first,
 * with the side workspace, and dx follows on the compute stream. */
static stoke_err *run_bwd(const stoke_kernel_args_v1 *a, void *state) {
  gconv_state *st = state;
  if (st && st->classic) return stoke_cudnn_classic_run_bwd(a, st->classic);
  STOKE_PROPAGATE_P(stoke_cudnn_check_run(a, st, st ? st->workspace : 0, st ? st->ctx : ""));
  void *dy = a->dout[0].data, *dx = a->din[0].data, *dw = a->din[1].data;
  if (!dy) return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d backward: dy has no data; %s", st->ctx);
  if ((dx && !st->dgrad) || (dw && !st->wgrad))
    return STOKE_PERR(STOKE_E_INTERNAL, "cudnn conv2d backward: a gradient is wanted that plan() did not see; %s",
                      st->ctx);
  int side = dw && a->side_stream && a->side_workspace_bytes >= st->workspace && (a->side_workspace || !st->workspace);
  if (side) STOKE_PROPAGATE_P(run_wgrad(a, st, dy, dw, a->side_stream, a->side_workspace));
  if (dx) {
    void *w;
    STOKE_PROPAGATE_P(weight_for(a, st, &w));
    int acc = (a->din_accumulate & 1u) || ((a->param_grads & 1u) && a->param_grad_beta != 0);
    if (acc && !st->dgrad_acc)
      return STOKE_PERR(STOKE_E_INTERNAL, "cudnn conv2d backward: dx must accumulate but plan() did not see it; %s",
                        st->ctx);
    void *ptrs[3] = {dx, w, dy};
    STOKE_PROPAGATE_P(cg_execute(st->eng, acc ? st->dgrad_acc : st->dgrad, ptrs, plan_ws(a, st), a->stream, st->ctx));
  }
  if (dw && !side) STOKE_PROPAGATE_P(run_wgrad(a, st, dy, dw, a->stream, a->workspace));
  if (side && !dx) /* the handle back on the compute stream (every call here sets it; this is for any other) */
    CUDNN_CHECK(cudnnSetStream(st->eng->handle, (cudaStream_t)a->stream), st->ctx);
  return NULL;
}

/* Every layout (the kernel reads x's), three dtypes, both passes; the
 * backward adds dx into its buffer on request (din_accumulate bit 0) and
 * may put dW on the side stream. */
#define GCONV_KERNELS(dt)                                                                                            \
  {"cudnn", STOKE_OP_CONV2D, STOKE_FWD, dt, STOKE_LAYOUT_ANY, plan_fwd, run_fwd, gconv_destroy, 0, 0},              \
  {"cudnn", STOKE_OP_CONV2D, STOKE_BWD, dt, STOKE_LAYOUT_ANY, plan_bwd, run_bwd, gconv_destroy, 1u,                \
   STOKE_KCAP_SIDE_GRADS}

static const stoke_kernel_v1 kernels[] = {GCONV_KERNELS(STOKE_F32), GCONV_KERNELS(STOKE_BF16),
                                          GCONV_KERNELS(STOKE_F16)};

stoke_err *stoke_cudnn_register_conv(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}
