/* backends/cudnn/conv.c: conv2d forward and backward (f32, bf16, f16; x/y in
 * NCHW or NHWC) through cuDNN's classic convolution API: the
 * "cudnn_classic" engine, and the fallback of the graph-API path
 * (conv_graph.c) for problems no graph engine runs. Algorithms are
 * chosen once per node by plan(): timed (STOKE_KFLAG_AUTOTUNE, like
 * torch.backends.cudnn.benchmark) or by cuDNN's heuristics, and cached per
 * shape in the engine so identical nodes are not tuned twice.
 *
 * The weight is [O, C/groups, kh, kw] contiguous (OIHW) in memory whatever
 * the activations' layout, as the CPU backend and checkpoints keep it. With
 * NCHW activations cuDNN reads it in place (CUDNN_TENSOR_NCHW filter). With
 * NHWC activations cuDNN wants an NHWC (OHWI, "KRSC") filter: with an NCHW
 * filter it offers no backward-data algorithm at all (H100, cuDNN 9.14,
 * every case of tests/gpu/cudnn_test.c) and its tensor-core paths are
 * NHWC-only. So for NHWC the kernel stages the filter in the first part of
 * the workspace, as PyTorch does for channels_last: forward and
 * backward-data transpose W into it (cudnnTransformTensor), backward-filter
 * computes dW there and transposes it back, accumulating with
 * param_grad_beta. The weight in memory never changes layout.
 *
 * Math: bf16/f16 CUDNN_TENSOR_OP_MATH; f32 CUDNN_FMA_MATH (true fp32), or
 * CUDNN_DEFAULT_MATH (TF32 allowed) with STOKE_KFLAG_TF32. Compute type is
 * float for every dtype. */

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "stoke/ops.h"
#include "stoke_cudnn.h"

#define MAX_PERF 16

static const char *const dir_names[CUDNN_DIR_COUNT] = {"fwd", "bwd-data", "bwd-filter"};

static const char *algo_name(cudnn_dir d, int algo) {
  static const char *const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM",     "DIRECT",
                                    "FFT",           "FFT_TILING",            "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char *const bwd_data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char *const bwd_filter[] = {"ALGO_0",   "ALGO_1",           "FFT",       "ALGO_3",
                                           "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  if (d == CUDNN_DIR_FWD && algo >= 0 && algo < 8) return fwd[algo];
  if (d == CUDNN_DIR_BWD_DATA && algo >= 0 && algo < 6) return bwd_data[algo];
  if (d == CUDNN_DIR_BWD_FILTER && algo >= 0 && algo < 7) return bwd_filter[algo];
  return "?";
}

static const char *math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op-conv";
    case CUDNN_FMA_MATH: return "fma";
    default: return "?";
  }
}

/* One node's descriptors and chosen algorithms (the kernel's state). */
typedef struct conv_state {
  cudnn_engine *eng;
  cudnnTensorDescriptor_t x, y; /* y also describes dy, x also dx */
  cudnnFilterDescriptor_t w;    /* also dw; OHWI (in the workspace) when staged */
  int stage_w;                  /* NHWC: W staged as OHWI at the workspace start */
  cudnnTensorDescriptor_t w_oihw, w_ohwi; /* W as a tensor, both orders, for the transposes */
  size_t w_region;              /* bytes of workspace the staged W takes (aligned) */
  cudnnConvolutionDescriptor_t conv[CUDNN_DIR_COUNT]; /* one per call: each has its algorithm's math type */
  int used[CUDNN_DIR_COUNT];
  cudnn_algo_choice choice[CUDNN_DIR_COUNT];
  cudnn_conv_key key;
  cudnnDataType_t data;
  cudnnMathType_t math; /* requested */
  size_t workspace;     /* max over the used calls */
  char ctx[320];        /* node, shapes, layout, dtype: for every message */
} conv_state;

/* Temporary buffers for the timed search (autotune), freed after plan. */
typedef struct tune_bufs {
  void *x, *w, *y, *ws;
  size_t ws_bytes;
} tune_bufs;

void stoke_cudnn_classic_destroy(void *state) {
  conv_state *st = state;
  if (!st) return;
  if (st->x) cudnnDestroyTensorDescriptor(st->x);
  if (st->y) cudnnDestroyTensorDescriptor(st->y);
  if (st->w) cudnnDestroyFilterDescriptor(st->w);
  if (st->w_oihw) cudnnDestroyTensorDescriptor(st->w_oihw);
  if (st->w_ohwi) cudnnDestroyTensorDescriptor(st->w_ohwi);
  for (int d = 0; d < CUDNN_DIR_COUNT; d++)
    if (st->conv[d]) cudnnDestroyConvolutionDescriptor(st->conv[d]);
  stoke_host->free(st);
}

static int fits_int(const stoke_shape *s) { return stoke_numel(s) <= INT_MAX; }

/* Candidates of one call, in cuDNN's order (fastest first when timed). */
typedef struct perf {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t det;
  cudnnMathType_t math;
} perf;

#define COPY_PERFS(src, n, dst)                                                                  \
  for (int i_ = 0; i_ < (n); i_++)                                                               \
  (dst)[i_] = (perf){(int)(src)[i_].algo, (src)[i_].status, (src)[i_].time, (src)[i_].memory, \
                     (src)[i_].determinism, (src)[i_].mathType}

static stoke_err *list_perfs(conv_state *st, cudnn_dir d, const tune_bufs *tb, perf *out, int *n) {
  cudnnHandle_t h = st->eng->handle;
  cudnnConvolutionDescriptor_t c = st->conv[d];
  int max = 0;
  *n = 0;
  if (d == CUDNN_DIR_FWD) {
    cudnnConvolutionFwdAlgoPerf_t p[MAX_PERF];
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max), st->ctx);
    if (max > MAX_PERF) max = MAX_PERF;
    if (tb)
      CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, st->x, tb->x, st->w, tb->w, c, st->y, tb->y, max, n, p,
                                                         tb->ws, tb->ws_bytes),
                  st->ctx);
    else
      CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, st->x, st->w, c, st->y, max, n, p), st->ctx);
    COPY_PERFS(p, *n, out);
  } else if (d == CUDNN_DIR_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t p[MAX_PERF];
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max), st->ctx);
    if (max > MAX_PERF) max = MAX_PERF;
    /* dx is written into the temporary x buffer: only its time matters */
    if (tb)
      CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, st->w, tb->w, st->y, tb->y, c, st->x, tb->x, max, n,
                                                              p, tb->ws, tb->ws_bytes),
                  st->ctx);
    else
      CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, st->w, st->y, c, st->x, max, n, p), st->ctx);
    COPY_PERFS(p, *n, out);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t p[MAX_PERF];
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max), st->ctx);
    if (max > MAX_PERF) max = MAX_PERF;
    if (tb)
      CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, st->x, tb->x, st->y, tb->y, c, st->w, tb->w, max,
                                                                n, p, tb->ws, tb->ws_bytes),
                  st->ctx);
    else
      CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, st->x, st->y, c, st->w, max, n, p), st->ctx);
    COPY_PERFS(p, *n, out);
  }
  return NULL;
}

/* The workspace `algo` needs with the descriptor's current math type. */
static cudnnStatus_t workspace_of(conv_state *st, cudnn_dir d, int algo, size_t *bytes) {
  cudnnHandle_t h = st->eng->handle;
  cudnnConvolutionDescriptor_t c = st->conv[d];
  if (d == CUDNN_DIR_FWD)
    return cudnnGetConvolutionForwardWorkspaceSize(h, st->x, st->w, c, st->y, (cudnnConvolutionFwdAlgo_t)algo,
                                                   bytes);
  if (d == CUDNN_DIR_BWD_DATA)
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, st->w, st->y, c, st->x,
                                                        (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, st->x, st->y, c, st->w,
                                                        (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

static void free_tune(tune_bufs *tb) {
  if (tb->x) cudaFree(tb->x);
  if (tb->w) cudaFree(tb->w);
  if (tb->y) cudaFree(tb->y);
  if (tb->ws) cudaFree(tb->ws);
  memset(tb, 0, sizeof *tb);
}

/* An FFT or Winograd algorithm of call d. */
static int lossy_algo(cudnn_dir d, int algo) {
  switch (d) {
    case CUDNN_DIR_FWD:
      return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case CUDNN_DIR_BWD_DATA:
      return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
             algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    default:
      return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
  }
}

/* The bytes of x, w and y: what the workspace cap scales with. */
static void conv_bytes(const stoke_kernel_args_v1 *a, size_t *bx, size_t *bw, size_t *by) {
  *bx = stoke_tensor_bytes(&a->in[0]);
  *bw = stoke_tensor_bytes(&a->in[1]);
  *by = (size_t)stoke_numel(&a->out[0].shape) * stoke_dtype_size(a->in[0].dtype);
}

static size_t conv_ws_cap(const stoke_kernel_args_v1 *a) {
  size_t bx, bw, by;
  conv_bytes(a, &bx, &bw, &by);
  return cudnn_ws_cap(bx + bw + by);
}

/* Zeroed temporary x, w, y and up to the workspace cap (less when the
 * device is short of memory), so the search never touches live data. */
static stoke_err *alloc_tune(const stoke_kernel_args_v1 *a, conv_state *st, tune_bufs *tb) {
  size_t bx, bw, by;
  conv_bytes(a, &bx, &bw, &by);
  cudaStream_t s = a->stream;
  if (cudaMalloc(&tb->x, bx) != cudaSuccess || cudaMalloc(&tb->w, bw) != cudaSuccess ||
      cudaMalloc(&tb->y, by) != cudaSuccess) {
    cudaGetLastError();
    free_tune(tb);
    return STOKE_PERR(STOKE_E_OOM, "cudnn autotune: no device memory for temporary buffers (%zu B); %s",
                      bx + bw + by, st->ctx);
  }
  cudaError_t ce = cudaMemsetAsync(tb->x, 0, bx, s);
  if (ce == cudaSuccess) ce = cudaMemsetAsync(tb->w, 0, bw, s);
  if (ce == cudaSuccess) ce = cudaMemsetAsync(tb->y, 0, by, s);
  if (ce != cudaSuccess) free_tune(tb); /* the caller keeps nothing of a failed set-up */
  STOKE_CUDA(ce);
  for (size_t b = cudnn_ws_cap(bx + bw + by); b >= ((size_t)1 << 20); b /= 2) {
    if (cudaMalloc(&tb->ws, b) == cudaSuccess) {
      tb->ws_bytes = b;
      break;
    }
    cudaGetLastError(); /* clear the allocation failure; try less */
    tb->ws = NULL;
  }
  return NULL;
}

/* The first of the n listed algorithms that succeeded, fits the workspace
 * cap, is deterministic when asked, honours the requested precision and,
 * unless allow_lossy, is no FFT or Winograd one (*found, *ch). */
static stoke_err *pick(conv_state *st, cudnn_dir d, const perf *p, int n, int det, size_t cap, int allow_lossy,
                       int autotune, cudnn_algo_choice *ch, int *found, int *n_ok, int *n_det) {
  *n_ok = *n_det = 0;
  for (int i = 0; i < n && !*found; i++) {
    if (p[i].status != CUDNN_STATUS_SUCCESS) continue;
    ++*n_ok;
    if (det && p[i].det != CUDNN_DETERMINISTIC) continue;
    ++*n_det;
    /* true fp32 asked: cuDNN reports CUDNN_FMA_MATH for algorithms that
     * honour it; anything else could use TF32 tensor cores */
    if (st->math == CUDNN_FMA_MATH && p[i].math != CUDNN_FMA_MATH) continue;
    if (!allow_lossy && lossy_algo(d, p[i].algo)) continue;
    if (p[i].memory > cap) continue;
    CUDNN_CHECK(cudnnSetConvolutionMathType(st->conv[d], p[i].math), st->ctx);
    size_t ws = 0;
    if (workspace_of(st, d, p[i].algo, &ws) != CUDNN_STATUS_SUCCESS || ws > cap) continue;
    *ch = (cudnn_algo_choice){p[i].algo, p[i].math, ws, autotune ? p[i].time : -1.0f};
    *found = 1;
  }
  return NULL;
}

/* Choose the algorithm of call `d`: from the cache, else timed (tb set) or
 * by heuristics; the first candidate that succeeded, fits the workspace
 * cap, is deterministic when asked and honours the requested precision. */
static stoke_err *choose(const stoke_kernel_args_v1 *a, conv_state *st, cudnn_dir d, tune_bufs *tb,
                         int *tune_ready) {
  cudnn_engine *eng = st->eng;
  cudnn_conv_key key = st->key;
  key.dir = (int32_t)d;
  const cudnn_algo_choice *hit = stoke_cudnn_cache_get(eng, &key);
  const char *how = "cached";
  cudnn_algo_choice ch;
  if (hit) {
    ch = *hit;
    CUDNN_CHECK(cudnnSetConvolutionMathType(st->conv[d], ch.math), st->ctx);
  } else {
    int autotune = (a->flags & STOKE_KFLAG_AUTOTUNE) != 0;
    if (autotune && !*tune_ready) {
      stoke_err *te = alloc_tune(a, st, tb);
      if (cudnn_tune_fallback(&te, NULL)) autotune = 0; /* cuDNN's heuristic order */
      else if (te) return te;
      else *tune_ready = 1;
    }
    perf p[MAX_PERF];
    int n = 0;
    STOKE_PROPAGATE_P(list_perfs(st, d, autotune ? tb : NULL, p, &n));
    int det = (a->flags & STOKE_KFLAG_DETERMINISTIC) != 0, found = 0, n_ok = 0, n_det = 0;
    size_t cap = conv_ws_cap(a);
    /* true f32: FFT and Winograd algorithms (error relative to the largest
     * value, not to each sum: graph.c says what they did to ResNet's stem)
     * only where no other one runs: a second pass */
    for (int pass = st->math == CUDNN_FMA_MATH ? 0 : 1; pass < 2 && !found; pass++)
      STOKE_PROPAGATE_P(pick(st, d, p, n, det, cap, pass, autotune, &ch, &found, &n_ok, &n_det));
    if (!found)
      return STOKE_PERR(STOKE_E_UNSUPPORTED,
                        "cudnn: no %s algorithm for conv2d: %d candidates, %d ran, %d deterministic%s, none "
                        "with %s math within the %zu MiB workspace cap; %s",
                        dir_names[d], n, n_ok, n_det, det ? " (required)" : "", math_name(st->math),
                        cap >> 20, st->ctx);
    stoke_cudnn_cache_put(eng, &key, &ch);
    how = autotune ? "autotuned" : "heuristic";
  }
  st->used[d] = 1;
  st->choice[d] = ch;
  if (st->w_region + ch.workspace > st->workspace) st->workspace = st->w_region + ch.workspace;
  char t[32] = "";
  if (ch.ms >= 0) snprintf(t, sizeof t, ", %.3f ms", (double)ch.ms);
  stoke_host->log(STOKE_LOG_INFO, "cudnn", "conv2d '%s' %s: %s, %s math%s, workspace %.2f MiB (%s)", stoke_node_name(a),
                  dir_names[d], algo_name(d, ch.algo), math_name(ch.math), t,
                  (double)ch.workspace / (1 << 20), how);
  return NULL;
}

static cudnnDataType_t data_type(stoke_dtype t) {
  return t == STOKE_F16 ? CUDNN_DATA_HALF : t == STOKE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* Checks, descriptors and the cache key; no algorithm yet. */
static stoke_err *describe(const stoke_kernel_args_v1 *a, conv_state *st, int bwd) {
  if (!a->engine)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d '%s': no engine state (backend 'cudnn' not opened)",
                      stoke_node_name(a));
  st->eng = a->engine;
  if (a->n_in < 2 || a->n_out < 1 || !a->in || !a->out || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d '%s': needs x, weight and y%s", stoke_node_name(a),
                      bwd ? " and their gradients" : "");
  const stoke_tensor *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
  int nhwc = x->layout == STOKE_NHWC;
  int64_t stride[2], pad[2], dil[2];
  stoke_cudnn_attr_pair(a->node, STOKE_CONV2D_STRIDE, 1, stride);
  stoke_cudnn_attr_pair(a->node, STOKE_CONV2D_PADDING, 0, pad);
  stoke_cudnn_attr_pair(a->node, STOKE_CONV2D_DILATION, 1, dil);
  int64_t groups = a->node && a->node->n_attrs > STOKE_CONV2D_GROUPS ? a->node->attrs[STOKE_CONV2D_GROUPS].i : 1;
  const int64_t *xd = x->shape.d, *wd = w->shape.d, *yd = y->shape.d;
  snprintf(st->ctx, sizeof st->ctx,
           "node '%s': x [%lld, %lld, %lld, %lld] %s %s, weight [%lld, %lld, %lld, %lld], y [%lld, %lld, %lld, "
           "%lld], stride %lldx%lld, padding %lldx%lld, dilation %lldx%lld, groups %lld",
           stoke_node_name(a), (long long)xd[0], (long long)xd[1], (long long)xd[2], (long long)xd[3],
           nhwc ? "NHWC" : "NCHW", stoke_dtype_name(x->dtype), (long long)wd[0], (long long)wd[1],
           (long long)wd[2], (long long)wd[3], (long long)yd[0], (long long)yd[1], (long long)yd[2],
           (long long)yd[3], (long long)stride[0], (long long)stride[1], (long long)pad[0], (long long)pad[1],
           (long long)dil[0], (long long)dil[1], (long long)groups);
  if (x->shape.ndim != 4 || w->shape.ndim != 4 || y->shape.ndim != 4)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: x, weight and y must be 4-D; %s", st->ctx);
  if (x->dtype != STOKE_F32 && x->dtype != STOKE_F16 && x->dtype != STOKE_BF16)
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cudnn conv2d: dtype %s not supported (f32, bf16, f16); %s",
                      stoke_dtype_name(x->dtype), st->ctx);
  if (w->dtype != x->dtype || y->dtype != x->dtype)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: weight is %s and y %s, x is %s; %s", stoke_dtype_name(w->dtype),
                      stoke_dtype_name(y->dtype), stoke_dtype_name(x->dtype), st->ctx);
  if (w->layout == STOKE_NHWC && !nhwc)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: the weight is [O, kh, kw, C] in memory (NHWC) but x is NCHW; "
                      "such filters belong to NHWC graphs (core/layout.c); %s", st->ctx);
  if (y->layout != STOKE_LAYOUT_ANY && (y->layout == STOKE_NHWC) != nhwc)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: y's layout differs from x's; %s", st->ctx);
  if (bwd) {
    const stoke_tensor *dy = &a->dout[0];
    if (dy->dtype != x->dtype || dy->shape.ndim != 4 || memcmp(dy->shape.d, yd, sizeof(int64_t) * 4) ||
        (dy->layout != STOKE_LAYOUT_ANY && (dy->layout == STOKE_NHWC) != nhwc))
      return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: dy [%lld, %lld, %lld, %lld] %s does not match y; %s",
                        (long long)dy->shape.d[0], (long long)dy->shape.d[1], (long long)dy->shape.d[2],
                        (long long)dy->shape.d[3], stoke_dtype_name(dy->dtype), st->ctx);
    for (int i = 0; i < 2; i++) {
      const stoke_tensor *g = &a->din[i], *of = &a->in[i];
      if (g->data && (g->dtype != of->dtype || g->shape.ndim != 4 || memcmp(g->shape.d, of->shape.d, sizeof(int64_t) * 4)))
        return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: gradient of input %d does not match the input; %s", i,
                          st->ctx);
    }
  }
  if (!fits_int(&x->shape) || !fits_int(&y->shape) || !fits_int(&w->shape))
    return STOKE_PERR(STOKE_E_UNSUPPORTED, "cudnn conv2d: a tensor has more than 2^31-1 elements; %s", st->ctx);
  if (groups < 1 || xd[1] % groups || wd[0] % groups || wd[1] != xd[1] / groups || yd[0] != xd[0] ||
      yd[1] != wd[0])
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: inconsistent channels or groups; %s", st->ctx);

  st->data = data_type(x->dtype);
  st->math = x->dtype != STOKE_F32 ? CUDNN_TENSOR_OP_MATH
             : (a->flags & STOKE_KFLAG_TF32) ? CUDNN_DEFAULT_MATH
                                              : CUDNN_FMA_MATH;
  cudnnTensorFormat_t fmt = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&st->x), st->ctx);
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&st->y), st->ctx);
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&st->w), st->ctx);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(st->x, fmt, st->data, (int)xd[0], (int)xd[1], (int)xd[2], (int)xd[3]),
              st->ctx);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(st->y, fmt, st->data, (int)yd[0], (int)yd[1], (int)yd[2], (int)yd[3]),
              st->ctx);
  /* OIHW in memory, staged as OHWI for NHWC (see the top of the file); or OHWI in memory already (the
   * weight labelled NHWC: core/layout.c's filter_ohwi), read and written as it is */
  st->stage_w = nhwc && w->layout != STOKE_NHWC;
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(st->w, st->data, fmt, (int)wd[0], (int)wd[1], (int)wd[2], (int)wd[3]),
              st->ctx);
  if (st->stage_w) {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&st->w_oihw), st->ctx);
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&st->w_ohwi), st->ctx);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(st->w_oihw, CUDNN_TENSOR_NCHW, st->data, (int)wd[0], (int)wd[1],
                                           (int)wd[2], (int)wd[3]),
                st->ctx);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(st->w_ohwi, CUDNN_TENSOR_NHWC, st->data, (int)wd[0], (int)wd[1],
                                           (int)wd[2], (int)wd[3]),
                st->ctx);
    st->w_region = (stoke_tensor_bytes(w) + 255) & ~(size_t)255;
    st->workspace = st->w_region;
  }
  for (int d = 0; d < CUDNN_DIR_COUNT; d++) {
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&st->conv[d]), st->ctx);
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(st->conv[d], (int)pad[0], (int)pad[1], (int)stride[0],
                                                (int)stride[1], (int)dil[0], (int)dil[1], CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT),
                st->ctx);
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(st->conv[d], (int)groups), st->ctx);
    CUDNN_CHECK(cudnnSetConvolutionMathType(st->conv[d], st->math), st->ctx);
  }
  int on, oc, oh, ow;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(st->conv[0], st->x, st->w, &on, &oc, &oh, &ow), st->ctx);
  if (on != yd[0] || oc != yd[1] || oh != yd[2] || ow != yd[3])
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d: cuDNN computes y [%d, %d, %d, %d]; %s", on, oc, oh, ow,
                      st->ctx);

  cudnn_conv_key *k = &st->key;
  memset(k, 0, sizeof *k);
  memcpy(k->x, xd, sizeof k->x);
  memcpy(k->w, wd, sizeof k->w);
  memcpy(k->stride, stride, sizeof k->stride);
  memcpy(k->pad, pad, sizeof k->pad);
  memcpy(k->dil, dil, sizeof k->dil);
  k->groups = groups;
  k->dtype = (int32_t)x->dtype;
  k->layout = nhwc;
  k->flags = a->flags & (STOKE_KFLAG_TF32 | STOKE_KFLAG_DETERMINISTIC | STOKE_KFLAG_AUTOTUNE);
  return NULL;
}

static stoke_err *plan_dirs(const stoke_kernel_args_v1 *a, conv_state *st, int bwd) {
  STOKE_PROPAGATE_P(describe(a, st, bwd));
  CUDNN_CHECK(cudnnSetStream(st->eng->handle, (cudaStream_t)a->stream), st->ctx);
  tune_bufs tb;
  memset(&tb, 0, sizeof tb);
  int tune_ready = 0;
  stoke_err *e = NULL;
  if (!bwd) {
    e = choose(a, st, CUDNN_DIR_FWD, &tb, &tune_ready);
  } else {
    if (a->din[0].data) e = choose(a, st, CUDNN_DIR_BWD_DATA, &tb, &tune_ready);
    if (!e && a->din[1].data) e = choose(a, st, CUDNN_DIR_BWD_FILTER, &tb, &tune_ready);
  }
  if (tune_ready) {
    cudaStreamSynchronize((cudaStream_t)a->stream); /* the search ran there; then free */
    free_tune(&tb);
  }
  return e;
}

stoke_err *stoke_cudnn_classic_plan(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes, int bwd) {
  conv_state *st = stoke_host->alloc(sizeof *st);
  if (!st) return STOKE_PERR(STOKE_E_OOM, "cudnn conv2d '%s': out of host memory", stoke_node_name(a));
  memset(st, 0, sizeof *st);
  stoke_err *e = plan_dirs(a, st, bwd);
  if (e) {
    stoke_cudnn_classic_destroy(st);
    return e;
  }
  *state = st;
  *workspace_bytes = st->workspace;
  return NULL;
}

static stoke_err *plan_fwd(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  return stoke_cudnn_classic_plan(a, state, ws, 0);
}
static stoke_err *plan_bwd(const stoke_kernel_args_v1 *a, void **state, size_t *ws) {
  return stoke_cudnn_classic_plan(a, state, ws, 1);
}

/* The algorithms' workspace: after the staged filter, if any. */
static void *algo_ws(const stoke_kernel_args_v1 *a, const conv_state *st) {
  return a->workspace ? (char *)a->workspace + st->w_region : NULL;
}

stoke_err *stoke_cudnn_classic_run_fwd(const stoke_kernel_args_v1 *a, void *state) {
  conv_state *st = state;
  STOKE_PROPAGATE_P(stoke_cudnn_check_run(a, st, st ? st->workspace : 0, st ? st->ctx : ""));
  if (!a->in[0].data || !a->in[1].data || !a->out[0].data)
    return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d forward: x, weight or y has no data; %s", st->ctx);
  cudnnHandle_t h = st->eng->handle;
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnSetStream(h, (cudaStream_t)a->stream), st->ctx);
  const void *w = a->in[1].data;
  if (st->stage_w) {
    CUDNN_CHECK(cudnnTransformTensor(h, &one, st->w_oihw, w, &zero, st->w_ohwi, a->workspace), st->ctx);
    w = a->workspace;
  }
  CUDNN_CHECK(cudnnConvolutionForward(h, &one, st->x, a->in[0].data, st->w, w, st->conv[CUDNN_DIR_FWD],
                                      (cudnnConvolutionFwdAlgo_t)st->choice[CUDNN_DIR_FWD].algo, algo_ws(a, st),
                                      a->workspace_bytes - st->w_region, &zero, st->y, a->out[0].data),
              st->ctx);
  return NULL;
}

/* dx (beta 0: activations are overwritten) and dW (beta param_grad_beta:
 * parameter gradients accumulate), each only when wanted. */
stoke_err *stoke_cudnn_classic_run_bwd(const stoke_kernel_args_v1 *a, void *state) {
  conv_state *st = state;
  STOKE_PROPAGATE_P(stoke_cudnn_check_run(a, st, st ? st->workspace : 0, st ? st->ctx : ""));
  const void *dy = a->dout[0].data;
  void *dx = a->din[0].data, *dw = a->din[1].data;
  if (!dy) return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d backward: dy has no data; %s", st->ctx);
  if ((dx && !st->used[CUDNN_DIR_BWD_DATA]) || (dw && !st->used[CUDNN_DIR_BWD_FILTER]))
    return STOKE_PERR(STOKE_E_INTERNAL, "cudnn conv2d backward: a gradient is wanted that plan() did not see; %s",
                      st->ctx);
  cudnnHandle_t h = st->eng->handle;
  const float one = 1.0f, zero = 0.0f;
  void *ws = algo_ws(a, st);
  size_t ws_bytes = a->workspace_bytes - st->w_region;
  CUDNN_CHECK(cudnnSetStream(h, (cudaStream_t)a->stream), st->ctx);
  if (dx) {
    const void *w = a->in[1].data;
    if (!w) return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d backward: weight has no data; %s", st->ctx);
    if (st->stage_w) {
      CUDNN_CHECK(cudnnTransformTensor(h, &one, st->w_oihw, w, &zero, st->w_ohwi, a->workspace), st->ctx);
      w = a->workspace;
    }
    float beta = (a->din_accumulate & 1u) ? 1.0f : (a->param_grads & 1u) ? a->param_grad_beta : 0.0f;
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, st->w, w, st->y, dy, st->conv[CUDNN_DIR_BWD_DATA],
                                             (cudnnConvolutionBwdDataAlgo_t)st->choice[CUDNN_DIR_BWD_DATA].algo, ws,
                                             ws_bytes, &beta, st->x, dx),
                st->ctx);
  }
  if (dw) {
    if (!a->in[0].data) return STOKE_PERR(STOKE_E_INVALID, "cudnn conv2d backward: x has no data; %s", st->ctx);
    float beta = (a->param_grads & 2u) ? a->param_grad_beta : 0.0f;
    /* staged: dW (OHWI) into the workspace, then transposed onto dW with beta */
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, st->x, a->in[0].data, st->y, dy,
                                               st->conv[CUDNN_DIR_BWD_FILTER],
                                               (cudnnConvolutionBwdFilterAlgo_t)st->choice[CUDNN_DIR_BWD_FILTER].algo,
                                               ws, ws_bytes, st->stage_w ? &zero : &beta, st->w,
                                               st->stage_w ? a->workspace : dw),
                st->ctx);
    if (st->stage_w)
      CUDNN_CHECK(cudnnTransformTensor(h, &one, st->w_ohwi, a->workspace, &beta, st->w_oihw, dw), st->ctx);
  }
  return NULL;
}

/* The "cudnn_classic" engine (A/B runs against the graph API, and what
 * PyTorch users know as the v7 API): every layout (the kernel reads x's),
 * three dtypes, both passes. */
#define CONV_KERNELS(dt)                                                                                           \
  {"cudnn_classic", STOKE_OP_CONV2D, STOKE_FWD, dt, STOKE_LAYOUT_ANY, plan_fwd, stoke_cudnn_classic_run_fwd,     \
   stoke_cudnn_classic_destroy},                                                                                  \
  {"cudnn_classic", STOKE_OP_CONV2D, STOKE_BWD, dt, STOKE_LAYOUT_ANY, plan_bwd, stoke_cudnn_classic_run_bwd,     \
   stoke_cudnn_classic_destroy, 1u}

static const stoke_kernel_v1 kernels[] = {CONV_KERNELS(STOKE_F32), CONV_KERNELS(STOKE_BF16), CONV_KERNELS(STOKE_F16)};

stoke_err *stoke_cudnn_register_conv_classic(const stoke_registry_v1 *r) {
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}
