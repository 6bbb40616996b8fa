/* backends/cublaslt/cublaslt.c: the "cublaslt" engine: linear forward and
 * backward in f32 (optionally TF32), bf16 and fp16 through cuBLASLt, with
 * the bias add and the bias gradient fused into the product's epilogue;
 * linear_relu likewise, with the ReLU in the forward's epilogue.
 *
 * Layout. stoke's tensors are row-major; cuBLASLt is column-major. A
 * row-major A[r, c] is, as stored, the column-major matrix A^T (rows c,
 * cols r, leading dimension c). So every product is written for the
 * transposes, with N = batch, K = in features, O = out features:
 *
 *   forward   y[N,O] = x W^T + b      y^T (O x N, ld O) = op(A) op(B)
 *             A = W  stored K x O (ld K), transa = T   -> W    (O x K)
 *             B = x  stored K x N (ld K), transb = N   -> x^T  (K x N)
 *             m = O, n = N, k = K; EPILOGUE_BIAS adds b[O] to every
 *             column of D (bias length = rows of D = m = O).
 *   dx        dx[N,K] = dy W          dx^T (K x N, ld K) = W^T dy^T
 *             A = W  stored K x O (ld K), transa = N   -> W^T  (K x O)
 *             B = dy stored O x N (ld O), transb = N   -> dy^T (O x N)
 *             m = K, n = N, k = O.
 *   dW        dW[O,K] = dy^T x        dW^T (K x O, ld K) = x^T dy
 *             A = x  stored K x N (ld K), transa = N   -> x^T  (K x N)
 *             B = dy stored O x N (ld O), transb = T   -> dy   (N x O)
 *             m = K, n = O, k = N; EPILOGUE_BGRADB writes
 *             db[j] = sum_k op(B)[k, j] = sum over the batch of dy[:, j]
 *             (bias length = columns of D = n = O), as apex's fused_dense.
 *
 * The epilogue's bias gradient is written, not accumulated, so db goes
 * through it only when its beta is 0 (first micro-batch); with beta != 0
 * (gradient accumulation), under STOKE_KFLAG_DETERMINISTIC, when no
 * algorithm supports the epilogue, or when autotune timed the plain
 * product plus the kernel more than 5% faster (choose_epilogue), the plain dW
 * product runs and a deterministic column-sum kernel (lt_kernels.cu, two
 * passes over row partitions) does db = beta db + sum.
 * Descriptors, layouts and the algorithm are made once per node in plan();
 * run() only sets pointers and calls cublasLtMatmul.
 *
 * Algorithms. Without STOKE_KFLAG_AUTOTUNE each product takes the first
 * of cuBLASLt's heuristic. With it (run.conv_autotune, on by default, as
 * cudnn.benchmark for the convolutions) plan() asks the heuristic for up
 * to LT_TUNE_MAX candidates, times each on scratch operands (events on
 * the compute stream; the scratch is freed before plan() returns) and
 * keeps the fastest; the choice is cached in the engine per product
 * (shapes, leading dimensions, transposes, dtype, compute type, epilogue,
 * determinism), so identical nodes are timed once, and logged with its
 * time and the heuristic's first's (STOKE_LOG=debug: every candidate's).
 * Measured on an H100 (cuBLASLt of CUDA 13, bf16, the mlp bench's
 * shapes): the 5-8 candidates are variants (tile, cluster) of one
 * algorithm, and the heuristic's first was the fastest or within 1% for
 * most products, DRELU included (4096^3: 0.267 ms whatever the tile,
 * against 0.157 ms for the plain product); autotune gained 12% on one
 * RELU_AUX_BIAS product (K = 1024), 3-4% on GELU_AUX_BIAS and 5% on the
 * 4096 x 4096 x 1000 dx product, nothing measurable on the mlp bench end
 * to end. Under STOKE_KFLAG_DETERMINISTIC only algorithms
 * without split-K reductions are asked for, and each candidate's
 * configuration is checked again.
 *
 * linear_relu (y = max(x W^T + b, 0)) is the same forward product with the
 * RELU_BIAS epilogue (or, when no algorithm has it, the linear forward and
 * a small in-place ReLU kernel). Its backward masks the output gradient,
 * dz = dy * (y > 0) from the forward output, into the front of the
 * workspace (a small kernel), then runs the linear backward on dz.
 *
 * linear_act / linear_dact (what run.fuse makes of linear -> relu|gelu ->
 * linear, core/fuse_act.c): the forward is the same product with the
 * RELU_AUX_BIAS or GELU_AUX_BIAS epilogue, which also writes the aux (the
 * ReLU bitmask, or the pre-activation z for GELU: cuBLASLt's GELU is the
 * tanh approximation, so only approximate = tanh is served). linear_dact
 * is the next linear's backward: its dx product, dx^T = W^T dy^T (m = K,
 * the activation's width), takes the DRELU or DGELU epilogue, which
 * multiplies by the activation's derivative read from the aux; when d
 * bias1 is asked for (din[4]) the DRELU_BGRAD / DGELU_BGRAD epilogue also
 * writes the bias gradient of the linear_act before it (length m) in the
 * same pass, as apex's fused_dense does. Where an epilogue has no
 * algorithm (or the aux's leading dimension does not suit it: GELU's
 * must be a multiple of 8), the plain product runs and small kernels
 * (lt_kernels.cu) apply the activation and write the aux in the same
 * layout, or apply its gradient; d bias1 then comes from the column-sum
 * kernel, as it also does when accumulating or deterministic. With
 * autotune an activation epilogue is timed against the product without it
 * and that kernel, as the bias gradient's (choose_epilogue): in tf32
 * cuBLASLt serves GELU_AUX_BIAS as the product and a pass of its own. */
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backends/cublaslt/lt_algo_desc.h"
#include "backends/cublaslt/lt_kernels.h"
#include "backends/cuda/stoke_cuda.h"
#include "backends/cuda/tune_fill.h"
#include "stoke/check.h"
#include "stoke/ops.h"

const stoke_host_v1 *stoke_host;

#define LT_WHO "cublaslt"
/* The most workspace the heuristic may choose an algorithm for; plan()
 * asks for what the chosen algorithms need (at most this). */
#define LT_WORKSPACE_BYTES ((size_t)32 << 20)
/* The executor places every buffer at a multiple of 256 bytes (core/plan.c)
 * and cudaMalloc does too: the heuristic's default alignment assumption.
 * run() checks it, so a misaligned pointer is an error, not a fault. */
#define LT_ALIGN 256

/* ----------------------------------------------------------------- engine */

/* Autotune (STOKE_KFLAG_AUTOTUNE): up to LT_TUNE_MAX of the heuristic's
 * candidates are each run once untimed, then LT_TUNE_REPS times between
 * events; the fastest call counts. */
#define LT_TUNE_MAX 16
#define LT_TUNE_REPS 3
#define LT_CACHE_MAX 256

/* What identifies a product for the choice cache: everything its matmul
 * descriptor and layouts hold. Compared with memcmp: memset to 0 first. */
typedef struct lt_key {
  int32_t epi, ta, tb, compute, dtype, det;
  uint64_t m, n, k;
  int64_t lda, ldb, ldc, aux_ld;
} lt_key;

typedef struct lt_choice {
  cublasLtMatmulAlgo_t algo;
  size_t ws;
  float ms, first_ms; /* the chosen algorithm's time and the heuristic's first's (-1: did not run) */
  int timed;          /* candidates that ran */
} lt_choice;

typedef struct lt_engine {
  cublasLtHandle_t h;
  stoke_cuda_device *dev;
  int n_cache; /* autotuned choices, so identical products are timed once */
  lt_key keys[LT_CACHE_MAX];
  lt_choice vals[LT_CACHE_MAX];
  int n_kt; /* timed kernels beside the products (lt_kernel): kind, rows, cols, dtype -> ms */
  int64_t kt_keys[LT_CACHE_MAX][4];
  float kt_ms[LT_CACHE_MAX];
} lt_engine;

static stoke_err *lt_open(int index, void *device_self, void **self) {
  stoke_cuda_device *d = device_self;
  if (!d)
    return STOKE_PERR(STOKE_E_INVALID,
                      "cublaslt: no cuda device was given; list cuda before cublaslt in [run] backends");
  if (d->version != STOKE_CUDA_DEVICE_VERSION)
    return STOKE_PERR(STOKE_E_ABI, "cublaslt: the cuda device state is version %u, this plugin expects %u",
                      d->version, STOKE_CUDA_DEVICE_VERSION);
  STOKE_CUDA(cudaSetDevice(d->index));
  lt_engine *E = stoke_host->alloc(sizeof *E);
  if (!E) return STOKE_PERR(STOKE_E_OOM, "cublaslt: out of host memory");
  memset(E, 0, sizeof *E);
  E->dev = d;
  cublasStatus_t st = cublasLtCreate(&E->h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    stoke_host->free(E);
    return STOKE_PERR(STOKE_E_DEVICE, "cublasLtCreate failed on device %d: %s (%s)", d->index,
                      cublasLtGetStatusString(st), cublasLtGetStatusName(st));
  }
  size_t v = cublasLtGetVersion();
  stoke_host->log(STOKE_LOG_INFO, LT_WHO, "cuBLASLt %zu.%zu.%zu on device %d (%s)", v / 10000, v / 100 % 100,
                  v % 100, d->index, d->name);
  *self = E;
  return NULL;
}

static void lt_close(void *self) {
  lt_engine *E = self;
  if (!E) return;
  cublasLtDestroy(E->h);
  stoke_host->free(E);
}

static stoke_err *lt_info(void *self, stoke_device_info_v1 *out) {
  lt_engine *E = self;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", E->dev->name);
  out->cc_major = E->dev->cc_major;
  out->cc_minor = E->dev->cc_minor;
  return NULL;
}

static const stoke_backend_v1 backend = {
    STOKE_ABI(stoke_backend_v1),
    .name = "cublaslt",
    .help = "cuBLASLt matmul kernels (linear, linear_relu, linear_act, linear_dact; fused bias, ReLU/GELU, their "
            "gradients and bias gradients) on the cuda device",
    .device = STOKE_DEV_GPU,
    .device_engine = "cuda",
    .open = lt_open,
    .close = lt_close,
    .info = lt_info,
};

/* ------------------------------------------------------------ node state */

/* One cuBLASLt product, made once in plan(). */
typedef struct lt_gemm {
  const char *what; /* "forward", "dx", "dW", "dW+db" */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c; /* c serves as C and D */
  cublasLtMatmulAlgo_t algo;
  size_t ws; /* workspace the chosen algorithm needs */
  float ms;  /* the chosen algorithm's time when autotuned (the fastest call), else -1 */
  int ready;
} lt_gemm;

typedef struct lt_state {
  const char *op; /* STOKE_OP_LINEAR or STOKE_OP_LINEAR_RELU, for messages */
  char node[64];
  stoke_dtype dt;
  int64_t n, k, o;
  lt_gemm fwd; /* with EPILOGUE_BIAS (RELU_BIAS) when fwd_bias, else plain (bias first, beta 1) */
  int fwd_bias;
  int relu;     /* linear_relu */
  int fwd_relu; /* the forward's epilogue applies the ReLU (RELU_BIAS) */
  size_t dz_bytes; /* linear_relu backward: dz at the front of the workspace (256-byte multiple) */
  lt_gemm dx, dw, dw_bgrad; /* dw_bgrad.ready: the BGRADB epilogue is usable */
  /* linear_act (forward) and linear_dact (backward) */
  int act;        /* LT_ACT_RELU or LT_ACT_GELU; 0 for linear and linear_relu */
  int fwd_aux;    /* the forward's epilogue writes the activation and the aux (*_AUX_BIAS) */
  int64_t aux_ld; /* aux elements per row (bits for the ReLU mask), as cuBLASLt's EPILOGUE_AUX_LD */
  lt_gemm dx_dact, dx_dact_bgrad; /* dz1 with D*_ (no bias gradient) / D*_BGRAD epilogues */
  int nobias;     /* matmul: a linear without bias (x, weight -> y) */
  int f32_exact;  /* f32 without TF32: GELU by our kernels, not cuBLASLt's epilogues (see act_epilogues_usable) */
} lt_state;

#define LT_ACT_RELU 1
#define LT_ACT_GELU 2

/* The context every cuBLASLt error carries: the node, the product, shapes. */
#define LT_CTX_FMT "%s '%s' (%s; x[%lld, %lld], weight[%lld, %lld], %s)"
#define LT_CTX_ARGS(s, what)                                                                            \
  (s)->op ? (s)->op : STOKE_OP_LINEAR, (s)->node, (what), (long long)(s)->n, (long long)(s)->k, (long long)(s)->o, (long long)(s)->k, \
      stoke_dtype_name((s)->dt)

#define LT_CHECK(call, s, what)                                                                      \
  do {                                                                                               \
    cublasStatus_t lt_st_ = (call);                                                                  \
    if (lt_st_ != CUBLAS_STATUS_SUCCESS)                                                             \
      return stoke_host->err_new(STOKE_E_DEVICE, __FILE__, __LINE__, "%s failed for " LT_CTX_FMT ": %s (%s)", \
                                 #call, LT_CTX_ARGS(s, what), cublasLtGetStatusString(lt_st_),       \
                                 cublasLtGetStatusName(lt_st_));                                     \
  } while (0)

#define LT_CUDA(call, s, what)                                                                      \
  do {                                                                                               \
    cudaError_t lt_ce_ = (call);                                                                     \
    if (lt_ce_ != cudaSuccess)                                                                       \
      return stoke_host->err_new(STOKE_E_DEVICE, __FILE__, __LINE__, "%s failed for " LT_CTX_FMT ": %s", #call, \
                                 LT_CTX_ARGS(s, what), cudaGetErrorString(lt_ce_));                  \
  } while (0)

static void gemm_free(lt_gemm *g) {
  if (g->c) cublasLtMatrixLayoutDestroy(g->c);
  if (g->b) cublasLtMatrixLayoutDestroy(g->b);
  if (g->a) cublasLtMatrixLayoutDestroy(g->a);
  if (g->op) cublasLtMatmulDescDestroy(g->op);
  memset(g, 0, sizeof *g);
}

static void lt_destroy(void *state) {
  lt_state *s = state;
  if (!s) return;
  gemm_free(&s->fwd);
  gemm_free(&s->dx);
  gemm_free(&s->dw);
  gemm_free(&s->dw_bgrad);
  gemm_free(&s->dx_dact);
  gemm_free(&s->dx_dact_bgrad);
  stoke_host->free(s);
}

static cudaDataType_t cuda_type(stoke_dtype t) {
  return t == STOKE_BF16 ? CUDA_R_16BF : t == STOKE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* A pointer attribute of a product's descriptor (bias, aux: set per call). */
static stoke_err *set_pointer(const lt_state *s, const lt_gemm *g, cublasLtMatmulDescAttributes_t attr,
                              const void *p) {
  LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, attr, &p, sizeof p), s, g->what);
  return NULL;
}

/* ---------------------------------------------------------------- autotune */

/* The epilogues that read or write the bias pointer. */
static int epi_uses_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_RELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB ||
         e == CUBLASLT_EPILOGUE_DRELU_BGRAD || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

/* Under STOKE_KFLAG_DETERMINISTIC the heuristic is asked for algorithms
 * without split-K reductions (REDUCTION_SCHEME_MASK = NONE); each timed
 * candidate's configuration is checked again here. Reproducible: no split
 * (SPLITK_NUM 1), or a fixed split whose partial sums are reduced in a
 * separate pass (COMPUTE_TYPE / OUTPUT_TYPE). Refused: a split added into
 * the output in place (INPLACE), and SPLITK_NUM -1, which the H100's
 * heuristic reports for some algorithms (with workspace for partial sums)
 * and whose summation order cublasLt.h does not document. */
static int algo_reproducible(const cublasLtMatmulAlgo_t *algo) {
  int32_t splitk = 1;
  uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t w = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w) !=
          CUBLAS_STATUS_SUCCESS)
    return 0;
  return splitk == 1 ||
         (splitk > 1 && (red == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE || red == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));
}

static const lt_choice *cache_get(const lt_engine *E, const lt_key *k) {
  for (int i = 0; i < E->n_cache; i++)
    if (!memcmp(&E->keys[i], k, sizeof *k)) return &E->vals[i];
  return NULL;
}

static void cache_put(lt_engine *E, const lt_key *k, const lt_choice *v) {
  if (E->n_cache >= LT_CACHE_MAX) return; /* full: later products are timed again, still correct */
  E->keys[E->n_cache] = *k;
  E->vals[E->n_cache] = *v;
  E->n_cache++;
}

static size_t round_up(size_t b) { return (b + LT_ALIGN - 1) / LT_ALIGN * LT_ALIGN; }

/* Scratch operands of one product for timing: A, B, D, bias, aux, workspace. */
typedef struct lt_scratch {
  void *a, *b, *d, *bias, *aux, *ws;
  size_t ws_bytes;
} lt_scratch;

/* The fastest of the LT_TUNE_REPS intervals between ev[0..LT_TUNE_REPS],
 * recorded on the stream (waits for the last). */
static stoke_err *fastest_rep(const lt_state *s, const char *what, cudaEvent_t *ev, float *best) {
  LT_CUDA(cudaEventSynchronize(ev[LT_TUNE_REPS]), s, what);
  *best = -1.f;
  for (int r = 0; r < LT_TUNE_REPS; r++) {
    float ms = 0.f;
    LT_CUDA(cudaEventElapsedTime(&ms, ev[r], ev[r + 1]), s, what);
    if (*best < 0.f || ms < *best) *best = ms;
  }
  return NULL;
}

/* Time the candidates on the scratch operands: every one runs once
 * untimed (loads its kernels, warms the clocks), then LT_TUNE_REPS calls
 * each between events on the stream; a candidate's time is its fastest
 * call. out gets the fastest candidate (timed = 0: none ran). */
static stoke_err *tune_time(lt_engine *E, const lt_state *s, const lt_gemm *g, const stoke_kernel_args_v1 *a,
                            const cublasLtMatmulHeuristicResult_t *res, const int *ok, int found,
                            const lt_scratch *x, cudaEvent_t *ev, lt_choice *out) {
  cudaStream_t st = (cudaStream_t)a->stream;
  float alpha = 1.f, beta = 0.f;
  int ran[LT_TUNE_MAX] = {0};
  for (int i = 0; i < found; i++) /* an algorithm that fails to run is dropped, not an error */
    ran[i] = ok[i] && cublasLtMatmul(E->h, g->op, &alpha, x->a, g->a, x->b, g->b, &beta, x->d, g->c, x->d, g->c,
                                     &res[i].algo, res[i].workspaceSize ? x->ws : NULL, res[i].workspaceSize,
                                     st) == CUBLAS_STATUS_SUCCESS;
  cudaGetLastError(); /* a dropped candidate's launch error is not ours; a sticky one shows at the next sync */
  for (int i = 0; i < found; i++) {
    if (!ran[i]) continue;
    LT_CUDA(cudaEventRecord(ev[0], st), s, g->what);
    for (int r = 0; r < LT_TUNE_REPS; r++) { /* every event recorded, even after a failed call */
      ran[i] &= cublasLtMatmul(E->h, g->op, &alpha, x->a, g->a, x->b, g->b, &beta, x->d, g->c, x->d, g->c,
                               &res[i].algo, res[i].workspaceSize ? x->ws : NULL, res[i].workspaceSize,
                               st) == CUBLAS_STATUS_SUCCESS;
      LT_CUDA(cudaEventRecord(ev[r + 1], st), s, g->what);
    }
    float best = -1.f;
    STOKE_PROPAGATE_P(fastest_rep(s, g->what, ev, &best));
    if (!ran[i]) continue;
    char desc[128];
    stoke_lt_algo_desc(&res[i].algo, desc, sizeof desc);
    stoke_host->log(STOKE_LOG_DEBUG, LT_WHO, "%s '%s' %s candidate %d: %s, %.4f ms, workspace %zu bytes", s->op,
                    s->node, g->what, i, desc, (double)best, res[i].workspaceSize);
    if (i == 0) out->first_ms = best;
    if (!out->timed++ || best < out->ms) {
      out->algo = res[i].algo;
      out->ws = res[i].workspaceSize;
      out->ms = best;
    }
  }
  return NULL;
}

/* What a timing needs: `bytes` of scratch operands on the device, filled
 * on the stream with values of the product's type uniform in [-1, 1)
 * (backends/cuda/tune_fill.cu: products of constants run faster than the
 * step's and could rank the candidates differently; random ReLU mask bits
 * too), so no live buffer is touched, and the LT_TUNE_REPS + 1 events
 * around the timed calls. */
typedef struct lt_timing {
  char *buf;
  cudaEvent_t ev[LT_TUNE_REPS + 1];
  int n_ev;
} lt_timing;

/* t->buf NULL (nothing held) when the device has no room for the scratch;
 * else the status of the fill and the events (close the timing either
 * way). */
static cudaError_t timing_open(lt_timing *t, size_t bytes, stoke_dtype dt, cudaStream_t st) {
  memset(t, 0, sizeof *t);
  if (cudaMalloc((void **)&t->buf, bytes) != cudaSuccess) {
    cudaGetLastError(); /* clear the allocation failure */
    t->buf = NULL;
    return cudaErrorMemoryAllocation;
  }
  cudaError_t ce = stoke_cuda_tune_fill(t->buf, bytes, dt, STOKE_TUNE_FILL_SEED, st);
  for (; ce == cudaSuccess && t->n_ev <= LT_TUNE_REPS; t->n_ev++) ce = cudaEventCreate(&t->ev[t->n_ev]);
  return ce;
}

/* The events destroyed and the scratch freed: cudaFree's status. */
static cudaError_t timing_close(lt_timing *t) {
  for (int i = 0; i < t->n_ev; i++)
    if (t->ev[i]) cudaEventDestroy(t->ev[i]);
  cudaError_t ce = t->buf ? cudaFree(t->buf) : cudaSuccess;
  memset(t, 0, sizeof *t);
  return ce;
}

/* Autotune one product (key k, descriptors in g) among the heuristic's
 * `found` candidates: those that succeeded, fit the workspace cap and (when
 * deterministic) are reproducible are timed on scratch operands of
 * random values (timing_open), so no live buffer is touched; the scratch is freed
 * before returning and run() allocates nothing. out->timed = 0 when none
 * ran, or the device had no memory for the scratch (then the heuristic's
 * first is kept, with a warning). */
static stoke_err *tune(lt_engine *E, const lt_state *s, const lt_gemm *g, const stoke_kernel_args_v1 *a,
                       const lt_key *k, const cublasLtMatmulHeuristicResult_t *res, int found, lt_choice *out) {
  memset(out, 0, sizeof *out);
  out->first_ms = -1.f;
  int ok[LT_TUNE_MAX] = {0}, n_ok = 0;
  size_t ws = 0;
  for (int i = 0; i < found; i++) {
    ok[i] = res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= LT_WORKSPACE_BYTES &&
            (!k->det || algo_reproducible(&res[i].algo));
    if (ok[i] && res[i].workspaceSize > ws) ws = res[i].workspaceSize;
    n_ok += ok[i];
  }
  if (!n_ok) return NULL;
  size_t elt = stoke_dtype_size(s->dt);
  uint64_t cols_a = k->ta == CUBLAS_OP_N ? k->k : k->m, cols_b = k->tb == CUBLAS_OP_N ? k->n : k->k;
  size_t sz[6] = {round_up((size_t)k->lda * cols_a * elt), round_up((size_t)k->ldb * cols_b * elt),
                  round_up((size_t)k->ldc * k->n * elt), round_up((k->m > k->n ? k->m : k->n) * elt),
                  round_up((size_t)k->aux_ld * k->n * elt), round_up(ws)};
  size_t total = 0;
  for (int i = 0; i < 6; i++) total += sz[i];
  lt_timing t;
  cudaError_t ce = timing_open(&t, total, s->dt, (cudaStream_t)a->stream);
  if (!t.buf) {
    stoke_host->log(STOKE_LOG_WARN, LT_WHO,
                    "autotune of " LT_CTX_FMT " skipped: no device memory for %.1f MiB of scratch operands; the "
                    "heuristic's first algorithm is used",
                    LT_CTX_ARGS(s, g->what), (double)total / (1 << 20));
    return NULL;
  }
  char *buf = t.buf;
  lt_scratch x = {buf, buf + sz[0], buf + sz[0] + sz[1], buf + sz[0] + sz[1] + sz[2],
                  buf + sz[0] + sz[1] + sz[2] + sz[3], buf + sz[0] + sz[1] + sz[2] + sz[3] + sz[4], ws};
  stoke_err *e = NULL;
  if (ce != cudaSuccess)
    e = STOKE_PERR(STOKE_E_DEVICE, "cublaslt autotune of " LT_CTX_FMT ": %s", LT_CTX_ARGS(s, g->what),
                   cudaGetErrorString(ce));
  if (!e && epi_uses_bias(k->epi)) e = set_pointer(s, g, CUBLASLT_MATMUL_DESC_BIAS_POINTER, x.bias);
  if (!e && k->aux_ld) e = set_pointer(s, g, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.aux);
  if (!e) e = tune_time(E, s, g, a, res, ok, found, &x, t.ev, out);
  /* run() sets these per call; leave no pointer to freed memory behind */
  const void *none = NULL;
  if (epi_uses_bias(k->epi))
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &none, sizeof none);
  if (k->aux_ld) cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &none, sizeof none);
  ce = timing_close(&t);
  if (ce != cudaSuccess && !e)
    e = STOKE_PERR(STOKE_E_DEVICE, "cublaslt autotune of " LT_CTX_FMT ": cudaFree of the scratch failed: %s",
                   LT_CTX_ARGS(s, g->what), cudaGetErrorString(ce));
  return e;
}

/* The small kernels a product may run beside instead of an epilogue
 * (lt_kernels.cu), timed against the epilogue by autotune. */
typedef enum lt_kernel {
  LT_K_COLSUM,    /* the bias gradient: column sums of dy[rows, cols] */
  LT_K_RELU_AUX,  /* linear_act's forward: y = relu(z) in place and its bitmask */
  LT_K_GELU_AUX,  /* y = gelu(z) in place and z as the aux */
  LT_K_DRELU,     /* linear_dact's dz1 *= relu'(z1) from the bitmask */
  LT_K_DGELU,     /* dz1 *= gelu'(z1) from the aux */
} lt_kernel;

static const char *const lt_kernel_name[] = {"the column-sum kernel", "the ReLU kernel", "the GELU kernel",
                                             "the ReLU gradient kernel", "the GELU gradient kernel"};

/* One call of kernel `kind` over [rows, cols] of the node's dtype on the
 * scratch at buf, laid out by time_kernel: sz[0] bytes of the operand (dy,
 * y or dz1), then sz[1] of db or the aux, then sz[2] of the column sums'
 * partials. */
static cudaError_t kernel_call(lt_kernel kind, char *buf, const size_t *sz, int64_t rows, int64_t cols,
                               int64_t aux_ld, stoke_dtype dt, cudaStream_t st) {
  switch (kind) {
    case LT_K_COLSUM: return stoke_lt_colsum(buf + sz[0], buf, rows, cols, 0.f, dt, buf + sz[0] + sz[1], sz[2], st);
    case LT_K_RELU_AUX:
    case LT_K_GELU_AUX: return stoke_lt_act_aux(buf, buf + sz[0], rows, cols, aux_ld, kind == LT_K_GELU_AUX, dt, st);
    default: return stoke_lt_dact(buf, buf + sz[0], rows, cols, aux_ld, kind == LT_K_DGELU, dt, st);
  }
}

/* Kernel `kind`'s time over [rows, cols] (aux_ld as the node's aux: bits a
 * row for the ReLU's mask, elements for GELU's z): its fastest of
 * LT_TUNE_REPS calls on scratch operands of random values (the in-place
 * kernels rewrite them call after call: the values stay finite), once per
 * shape (engine cache); -1 when it could not be timed (no device memory
 * for the scratch). */
static stoke_err *time_kernel(lt_engine *E, const lt_state *s, const stoke_kernel_args_v1 *a, lt_kernel kind,
                              int64_t rows, int64_t cols, int64_t aux_ld, float *ms) {
  *ms = -1.f;
  for (int i = 0; i < E->n_kt; i++)
    if (E->kt_keys[i][0] == (int64_t)kind && E->kt_keys[i][1] == rows && E->kt_keys[i][2] == cols &&
        E->kt_keys[i][3] == (int64_t)s->dt) {
      *ms = E->kt_ms[i];
      return NULL;
    }
  size_t elt = stoke_dtype_size(s->dt), sz[3] = {round_up((size_t)rows * (size_t)cols * elt), 0, 0};
  if (kind == LT_K_COLSUM) {
    sz[1] = round_up((size_t)cols * elt);
    sz[2] = round_up(stoke_lt_colsum_workspace(rows, cols, s->dt));
  } else { /* the aux: a bitmask of aux_ld bits a row, or z with aux_ld elements a row */
    int relu = kind == LT_K_RELU_AUX || kind == LT_K_DRELU;
    sz[1] = round_up((size_t)rows * (size_t)aux_ld * (relu ? 1 : elt * 8) / 8);
  }
  cudaStream_t st = (cudaStream_t)a->stream;
  lt_timing t;
  cudaError_t ce = timing_open(&t, sz[0] + sz[1] + sz[2], s->dt, st);
  if (!t.buf) return NULL; /* no room for the scratch: the epilogue stays */
  stoke_err *e = NULL;
  /* once untimed (loads the kernel), then the timed calls */
  for (int r = -1; ce == cudaSuccess && r < LT_TUNE_REPS; r++) {
    ce = kernel_call(kind, t.buf, sz, rows, cols, aux_ld, s->dt, st);
    if (ce == cudaSuccess) ce = cudaEventRecord(t.ev[r + 1], st);
  }
  if (ce != cudaSuccess)
    e = STOKE_PERR(STOKE_E_DEVICE, "cublaslt: timing %s of " LT_CTX_FMT ": %s", lt_kernel_name[kind],
                   LT_CTX_ARGS(s, "autotune"), cudaGetErrorString(ce));
  if (!e) e = fastest_rep(s, lt_kernel_name[kind], t.ev, ms);
  ce = timing_close(&t);
  if (ce != cudaSuccess && !e)
    e = STOKE_PERR(STOKE_E_DEVICE, "cublaslt: cudaFree of the scratch of %s failed: %s", lt_kernel_name[kind],
                   cudaGetErrorString(ce));
  if (!e && *ms >= 0.f && E->n_kt < LT_CACHE_MAX) {
    int64_t *k = E->kt_keys[E->n_kt];
    k[0] = (int64_t)kind, k[1] = rows, k[2] = cols, k[3] = (int64_t)s->dt;
    E->kt_ms[E->n_kt++] = *ms;
  }
  return e;
}

/* With autotune, keep an epilogue (`fused`: the product that also writes
 * the bias gradient, or applies the activation or its gradient) unless the
 * product without it (`plain_ms`, timed) plus the kernel that does the
 * epilogue's work over [rows, cols] (lt_kernels.cu), timed too, is faster
 * by more than 5% (LT_EPI_MARGIN); then the fused product is dropped and
 * run() takes the plain one and the kernel. *without_ms gets the pair's
 * time (-1 when either was not timed). Timed alone, the kernel's second
 * pass misses the L2 the product leaves warm in a step: on GPT-2 (H200)
 * c_fc's dW took 0.1356 ms with BGRADB against 0.0974 + 0.0376 without, a
 * tie that went to the pair and cost 0.5% tokens/s end to end; the
 * DGELU_BGRAD product (0.431 ms against 0.133 + 0.038) is where the pair
 * wins, and in tf32, where cuBLASLt runs GELU_AUX_BIAS as the product and
 * a separate pass (370 us a call on GPT-2's c_fc, run 39), the product
 * and our GELU kernel. */
#define LT_EPI_MARGIN 1.05f
static stoke_err *choose_epilogue(lt_engine *E, lt_state *s, const stoke_kernel_args_v1 *a, lt_gemm *fused,
                                  float plain_ms, lt_kernel kind, int64_t rows, int64_t cols, int64_t aux_ld,
                                  float *without_ms) {
  if (without_ms) *without_ms = -1.f;
  if (!(a->flags & STOKE_KFLAG_AUTOTUNE) || plain_ms < 0.f) return NULL;
  float kt = -1.f;
  STOKE_PROPAGATE_P(time_kernel(E, s, a, kind, rows, cols, aux_ld, &kt));
  if (kt < 0.f) return NULL;
  if (without_ms) *without_ms = plain_ms + kt;
  if (!fused->ready || fused->ms < 0.f) return NULL;
  int keep = fused->ms <= LT_EPI_MARGIN * (plain_ms + kt);
  stoke_host->log(STOKE_LOG_INFO, LT_WHO,
                  "%s '%s' %s: %.4f ms with the epilogue, %.4f + %.4f ms as the product without it and %s "
                  "[%lld x %lld]: %s",
                  s->op, s->node, fused->what, (double)fused->ms, (double)plain_ms, (double)kt,
                  lt_kernel_name[kind], (long long)rows, (long long)cols,
                  keep ? "the epilogue kept" : "the product and the kernel");
  if (!keep) gemm_free(fused);
  return NULL;
}

/* The log line of an autotuned (or cached) choice, as the cudnn plugin's. */
static void log_choice(const lt_state *s, const lt_gemm *g, const lt_key *k, const lt_choice *c, int n_cand,
                       const char *how) {
  char desc[128];
  stoke_lt_algo_desc(&c->algo, desc, sizeof desc);
  char first[48] = "";
  if (c->first_ms >= 0.f) snprintf(first, sizeof first, ", heuristic's first %.4f ms", (double)c->first_ms);
  char cands[48] = "";
  if (n_cand) snprintf(cands, sizeof cands, ", %d of %d candidates timed", c->timed, n_cand);
  stoke_host->log(STOKE_LOG_INFO, LT_WHO, "%s '%s' %s [m %llu n %llu k %llu, %s]: %s, %.4f ms%s%s, workspace %.2f MiB (%s)",
                  s->op, s->node, g->what, (unsigned long long)k->m, (unsigned long long)k->n,
                  (unsigned long long)k->k, stoke_dtype_name(s->dt), desc, (double)c->ms, first, cands,
                  (double)c->ws / (1 << 20), how);
}

/* The plan of one product op(A)[m, k] op(B)[k, n] -> D[m, n], all
 * column-major as described at the top. The algorithm is the heuristic's
 * first, or with STOKE_KFLAG_AUTOTUNE the fastest of its first
 * LT_TUNE_MAX candidates, timed once per distinct product (engine cache).
 * `optional`: when the heuristic finds no algorithm, leave g->ready = 0
 * instead of failing (epilogue variants with a plain fallback). */
static stoke_err *gemm_plan(lt_engine *E, const lt_state *s, const stoke_kernel_args_v1 *args, lt_gemm *g,
                            const char *what, cublasOperation_t ta, cublasOperation_t tb, uint64_t m, uint64_t n,
                            uint64_t k, int64_t lda, int64_t ldb, int64_t ldc, cublasLtEpilogue_t epi,
                            int64_t aux_ld, int optional) {
  uint32_t flags = args->flags;
  memset(g, 0, sizeof *g);
  g->what = what;
  g->ms = -1.f;
  cudaDataType_t t = cuda_type(s->dt);
  cublasComputeType_t ct =
      s->dt == STOKE_F32 && (flags & STOKE_KFLAG_TF32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_CHECK(cublasLtMatmulDescCreate(&g->op, ct, CUDA_R_32F), s, what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), s, what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), s, what);
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), s, what);
    /* bias (and its gradient) in the dtype of the output, as the op's bias */
    int32_t bt = (int32_t)t;
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), s,
             what);
  }
  if (aux_ld) /* activation epilogues: the aux's leading dimension (its pointer is set per call) */
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld), s,
             what);
  /* stored shapes: A is m x k when not transposed, else k x m; B likewise */
  LT_CHECK(cublasLtMatrixLayoutCreate(&g->a, t, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda), s,
           what);
  LT_CHECK(cublasLtMatrixLayoutCreate(&g->b, t, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb), s,
           what);
  LT_CHECK(cublasLtMatrixLayoutCreate(&g->c, t, m, n, ldc), s, what);

  int autotune = (flags & STOKE_KFLAG_AUTOTUNE) != 0;
  lt_key key;
  memset(&key, 0, sizeof key);
  key.epi = (int32_t)epi, key.ta = (int32_t)ta, key.tb = (int32_t)tb, key.compute = (int32_t)ct;
  key.dtype = (int32_t)s->dt, key.det = (flags & STOKE_KFLAG_DETERMINISTIC) != 0;
  key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc, key.aux_ld = aux_ld;
  const lt_choice *hit = autotune ? cache_get(E, &key) : NULL;
  if (hit) {
    g->algo = hit->algo;
    g->ws = hit->ws;
    g->ms = hit->ms;
    g->ready = 1;
    log_choice(s, g, &key, hit, 0, "cached");
    return NULL;
  }

  cublasLtMatmulPreference_t pref = NULL;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), s, what);
  size_t ws_max = LT_WORKSPACE_BYTES;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max,
                                                           sizeof ws_max);
  if (st == CUBLAS_STATUS_SUCCESS && key.det) {
    /* no split-K reductions: one fixed summation order per element */
    uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                              sizeof mask);
  }
  cublasLtMatmulHeuristicResult_t res[LT_TUNE_MAX];
  memset(res, 0, sizeof res);
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(E->h, g->op, g->a, g->b, g->c, g->c, pref,
                                        autotune || key.det ? LT_TUNE_MAX : 1, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && key.det) {
    /* deterministic: the first candidate the reproducibility check passes (the reduction mask asks for no
     * split-K, but the heuristic's first is not checked otherwise), also when autotune times none */
    int r = 0;
    while (r < found && !(res[r].state == CUBLAS_STATUS_SUCCESS && algo_reproducible(&res[r].algo))) r++;
    if (r == found) found = 0; /* none: reported below as no algorithm */
    else if (r) res[0] = res[r];
  }
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && res[0].state == CUBLAS_STATUS_SUCCESS) {
    g->algo = res[0].algo;
    g->ws = res[0].workspaceSize;
    g->ready = 1;
    if (autotune) {
      lt_choice c;
      STOKE_PROPAGATE_P(tune(E, s, g, args, &key, res, found, &c));
      if (c.timed) {
        g->algo = c.algo;
        g->ws = c.ws;
        g->ms = c.ms;
        cache_put(E, &key, &c);
        log_choice(s, g, &key, &c, found, "autotuned");
      }
    }
    return NULL;
  }
  if (st == CUBLAS_STATUS_SUCCESS) st = found > 0 ? res[0].state : CUBLAS_STATUS_NOT_SUPPORTED;
  if (optional) {
    stoke_host->log(STOKE_LOG_DEBUG, LT_WHO, "no cuBLASLt algorithm for " LT_CTX_FMT ": %s; using the fallback",
                    LT_CTX_ARGS(s, what), cublasLtGetStatusName(st));
    gemm_free(g);
    return NULL;
  }
  return STOKE_PERR(st == CUBLAS_STATUS_NOT_SUPPORTED ? STOKE_E_UNSUPPORTED : STOKE_E_DEVICE,
                    "cublasLtMatmulAlgoGetHeuristic found no algorithm for " LT_CTX_FMT ": %s (%s)",
                    LT_CTX_ARGS(s, what), cublasLtGetStatusString(st), cublasLtGetStatusName(st));
}

/* ----------------------------------------------------------------- checks */

static stoke_err *check_tensor(const stoke_kernel_args_v1 *a, const char *what, const stoke_tensor *t,
                               stoke_dtype dt, int ndim, int64_t d0, int64_t d1) {
  if (t->dtype != dt || t->shape.ndim != ndim || t->shape.d[0] != d0 || (ndim == 2 && t->shape.d[1] != d1)) {
    char want[64];
    if (ndim == 2) snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
    else snprintf(want, sizeof want, "[%lld]", (long long)d0);
    return STOKE_PERR(STOKE_E_INVALID, "cublaslt linear '%s': %s should be %s %s, got a %d-D %s tensor",
                      stoke_node_name(a), what, stoke_dtype_name(dt), want, t->shape.ndim, stoke_dtype_name(t->dtype));
  }
  return NULL;
}

/* Shapes and dtypes of every tensor the kernel touches; fills s's dims. */
/* matmul (stoke/ops.h): linear's kernels without the bias input. */
static int is_matmul(const stoke_kernel_args_v1 *a) { return a->node && a->node->op && !strcmp(a->node->op, STOKE_OP_MATMUL); }

static stoke_err *linear_check(const stoke_kernel_args_v1 *a, stoke_dtype dt, int bwd, lt_state *s) {
  int nobias = is_matmul(a);
  if (a->n_in < (nobias ? 2 : 3) || a->n_out < 1 || !a->in || !a->out || (bwd && (!a->din || !a->dout)))
    return STOKE_PERR(STOKE_E_INVALID, "cublaslt %s '%s': expects x, weight%s -> y%s", nobias ? "matmul" : "linear",
                      stoke_node_name(a), nobias ? "" : ", bias", bwd ? " with their gradients" : "");
  const stoke_shape *xs = &a->in[0].shape, *ws = &a->in[1].shape;
  if (xs->ndim != 2 || ws->ndim != 2)
    return STOKE_PERR(STOKE_E_INVALID, "cublaslt linear '%s': x and weight must be 2-D, got %d-D and %d-D",
                      stoke_node_name(a), xs->ndim, ws->ndim);
  int64_t n = xs->d[0], k = xs->d[1], o = ws->d[0];
  STOKE_PROPAGATE_P(check_tensor(a, "x", &a->in[0], dt, 2, n, k));
  STOKE_PROPAGATE_P(check_tensor(a, "weight", &a->in[1], dt, 2, o, k));
  if (!nobias) STOKE_PROPAGATE_P(check_tensor(a, "bias", &a->in[2], dt, 1, o, 0));
  STOKE_PROPAGATE_P(check_tensor(a, "y", &a->out[0], dt, 2, n, o));
  if (bwd) {
    STOKE_PROPAGATE_P(check_tensor(a, "dy", &a->dout[0], dt, 2, n, o));
    if (a->din[0].data) STOKE_PROPAGATE_P(check_tensor(a, "dx", &a->din[0], dt, 2, n, k));
    if (a->din[1].data) STOKE_PROPAGATE_P(check_tensor(a, "dweight", &a->din[1], dt, 2, o, k));
    if (!nobias && a->din[2].data) STOKE_PROPAGATE_P(check_tensor(a, "dbias", &a->din[2], dt, 1, o, 0));
  }
  if (!a->engine)
    return STOKE_PERR(STOKE_E_INVALID, "cublaslt linear '%s': the cublaslt engine is not open", stoke_node_name(a));
  if (s) {
    snprintf(s->node, sizeof s->node, "%.63s", stoke_node_name(a));
    s->dt = dt;
    s->n = n, s->k = k, s->o = o;
    s->nobias = nobias;
  }
  return NULL;
}

static stoke_err *check_align(const lt_state *s, const char *what, const void *p) {
  if ((uintptr_t)p % LT_ALIGN)
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "cublaslt linear '%s': %s at %p is not %d-byte aligned (cuBLASLt algorithms are chosen for "
                      "%d-byte aligned buffers)",
                      s->node, what, p, LT_ALIGN, LT_ALIGN);
  return NULL;
}

static stoke_err *new_state(lt_state **out) {
  lt_state *s = stoke_host->alloc(sizeof *s);
  if (!s) return STOKE_PERR(STOKE_E_OOM, "cublaslt: out of host memory");
  memset(s, 0, sizeof *s);
  *out = s;
  return NULL;
}

static size_t max_ws(size_t a, size_t b) { return a > b ? a : b; }

/* -------------------------------------------------- activation epilogues */

/* The activation of a linear_act / linear_dact node, its aux checked
 * against y's [rows, cols] (stoke/ops.h) and its leading dimension. */
static stoke_err *act_setup(const stoke_kernel_args_v1 *a, lt_state *s, const stoke_tensor *aux, int64_t rows,
                            int64_t cols) {
  const stoke_node_v1 *nd = a->node;
  const char *act = nd && nd->n_attrs > STOKE_LINEAR_ACT_ACT ? nd->attrs[STOKE_LINEAR_ACT_ACT].s : "";
  const char *approx =
      nd && nd->n_attrs > STOKE_LINEAR_ACT_APPROXIMATE ? nd->attrs[STOKE_LINEAR_ACT_APPROXIMATE].s : "";
  if (!strcmp(act, "relu")) s->act = LT_ACT_RELU;
  else if (!strcmp(act, "gelu") && !strcmp(approx, "tanh")) s->act = LT_ACT_GELU;
  else
    return STOKE_PERR(STOKE_E_UNSUPPORTED,
                      "cublaslt %s '%s': act = '%s', approximate = '%s'; cuBLASLt's epilogues compute relu and the "
                      "tanh approximation of gelu only (the compiler fuses nothing else)",
                      s->op, s->node, act, approx);
  int relu = s->act == LT_ACT_RELU;
  int64_t want = relu ? (cols + 127) / 128 * 16 : cols; /* bytes of bitmask, or elements of z */
  stoke_dtype dt = relu ? STOKE_U8 : s->dt;
  if (aux->shape.ndim != 2 || aux->shape.d[0] != rows || aux->shape.d[1] != want || aux->dtype != dt)
    return STOKE_PERR(STOKE_E_INVALID, "cublaslt %s '%s': aux should be %s [%lld, %lld], got a %d-D %s tensor", s->op,
                      s->node, stoke_dtype_name(dt), (long long)rows, (long long)want, aux->shape.ndim,
                      stoke_dtype_name(aux->dtype));
  s->aux_ld = relu ? want * 8 : cols;
  return NULL;
}

/* The epilogues of the activation: forward (with bias, writing the aux)
 * and backward (its gradient from the aux, with or without the bias
 * gradient). GELU's aux leading dimension must be a multiple of 8. In f32
 * without TF32 the GELU epilogues are not used: cuBLASLt evaluates the
 * tanh approximately, off by up to 89 units of f32's rounding (5.3e-6
 * near |z| = 1.5; tests/gpu/cublaslt_test's sweep, H200, CUDA 13), which
 * f32 promises not to be (every_kernel_test's tolerance failed on it at
 * seed 4010559333); the plain product and lt_kernels.cu's GELU (tanhf)
 * serve f32 instead. bf16, fp16 and TF32 round far more than that. */
static int act_epilogues_usable(const lt_state *s) {
  return s->act == LT_ACT_RELU || (s->aux_ld % 8 == 0 && !s->f32_exact);
}

static cublasLtEpilogue_t act_fwd_epilogue(const lt_state *s) {
  return s->act == LT_ACT_RELU ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

static cublasLtEpilogue_t act_bwd_epilogue(const lt_state *s, int bgrad) {
  if (s->act == LT_ACT_RELU) return bgrad ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU;
  return bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
}

/* What both plans start with: the checked shapes in a new state for op
 * `fused` (linear_act / linear_dact), linear_relu or linear. */
static stoke_err *plan_state(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes,
                             stoke_dtype dt, int bwd, int relu, const char *fused, lt_state **out) {
  *state = NULL;
  *workspace_bytes = 0;
  lt_state tmp;
  memset(&tmp, 0, sizeof tmp);
  STOKE_PROPAGATE_P(linear_check(a, dt, bwd, &tmp));
  STOKE_PROPAGATE_P(new_state(out));
  **out = tmp;
  (*out)->op = fused ? fused : relu ? STOKE_OP_LINEAR_RELU : tmp.nobias ? STOKE_OP_MATMUL : STOKE_OP_LINEAR;
  (*out)->relu = relu;
  (*out)->f32_exact = dt == STOKE_F32 && !(a->flags & STOKE_KFLAG_TF32);
  return NULL;
}

/* ---------------------------------------------------------------- forward */

static stoke_err *fwd_plan_dt(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes,
                              stoke_dtype dt, int relu, int act) {
  lt_state *s;
  STOKE_PROPAGATE_P(plan_state(a, state, workspace_bytes, dt, 0, relu, act ? STOKE_OP_LINEAR_ACT : NULL, &s));
  stoke_err *e = NULL;
  if (act && a->n_out < 2)
    e = STOKE_PERR(STOKE_E_INVALID, "cublaslt linear_act '%s': needs the outputs y and aux", s->node);
  if (act && !e) e = act_setup(a, s, &a->out[1], s->n, s->o);
  if (e) {
    lt_destroy(s);
    return e;
  }
  if (dt != STOKE_F32 && (s->n % 8 || s->k % 8 || s->o % 8))
    stoke_host->log(STOKE_LOG_WARN, LT_WHO,
                    "linear '%s': batch %lld, in %lld, out %lld are not all multiples of 8 in %s; tensor cores "
                    "are not fully used (pad the sizes to multiples of 8)",
                    s->node, (long long)s->n, (long long)s->k, (long long)s->o, stoke_dtype_name(dt));
  if (s->n && s->k && s->o) {
    lt_engine *E = a->engine;
    if (s->act && act_epilogues_usable(s)) { /* activation, aux and bias in the epilogue */
      e = gemm_plan(E, s, a, &s->fwd, "forward", CUBLAS_OP_T, CUBLAS_OP_N, (uint64_t)s->o, (uint64_t)s->n,
                    (uint64_t)s->k, s->k, s->k, s->o, act_fwd_epilogue(s), s->aux_ld, 1);
      s->fwd_aux = s->fwd.ready;
      if (!e && s->fwd_aux && !s->nobias && (a->flags & STOKE_KFLAG_AUTOTUNE)) {
        /* against the bias-only product and the activation kernel (choose_epilogue) */
        lt_gemm plain;
        e = gemm_plan(E, s, a, &plain, "forward", CUBLAS_OP_T, CUBLAS_OP_N, (uint64_t)s->o, (uint64_t)s->n,
                      (uint64_t)s->k, s->k, s->k, s->o, CUBLASLT_EPILOGUE_BIAS, 0, 1);
        if (!e && plain.ready)
          e = choose_epilogue(E, s, a, &s->fwd, plain.ms, s->act == LT_ACT_GELU ? LT_K_GELU_AUX : LT_K_RELU_AUX,
                              s->n, s->o, s->aux_ld, NULL);
        if (!e && !s->fwd.ready) { /* dropped: the plain product serves, the kernel after it */
          s->fwd = plain;
          s->fwd_aux = 0;
        } else {
          gemm_free(&plain);
        }
      }
    }
    if (relu) { /* ReLU and bias in the epilogue; else as linear, then the ReLU kernel */
      e = gemm_plan(E, s, a, &s->fwd, "forward", CUBLAS_OP_T, CUBLAS_OP_N, (uint64_t)s->o,
                    (uint64_t)s->n, (uint64_t)s->k, s->k, s->k, s->o, CUBLASLT_EPILOGUE_RELU_BIAS, 0, 1);
      s->fwd_relu = s->fwd.ready;
    }
    if (!e && !s->fwd.ready && !s->nobias) /* linear, linear_act without its epilogue: bias only */
      e = gemm_plan(E, s, a, &s->fwd, "forward", CUBLAS_OP_T, CUBLAS_OP_N, (uint64_t)s->o,
                    (uint64_t)s->n, (uint64_t)s->k, s->k, s->k, s->o, CUBLASLT_EPILOGUE_BIAS, 0, 1);
    s->fwd_bias = s->fwd.ready;
    if (!e && !s->fwd.ready)
      e = gemm_plan(E, s, a, &s->fwd, "forward", CUBLAS_OP_T, CUBLAS_OP_N, (uint64_t)s->o,
                    (uint64_t)s->n, (uint64_t)s->k, s->k, s->k, s->o, CUBLASLT_EPILOGUE_DEFAULT, 0, 0);
  }
  if (e) {
    lt_destroy(s);
    return e;
  }
  if (s->n && s->k && s->o)
    stoke_host->log(STOKE_LOG_DEBUG, LT_WHO, "%s '%s' forward: %s%s, workspace %zu bytes", s->op, s->node,
                    s->fwd_aux    ? "bias, activation and aux fused (EPILOGUE_*_AUX_BIAS)"
                    : s->fwd_relu ? "bias and ReLU fused (EPILOGUE_RELU_BIAS)"
                    : s->fwd_bias ? "bias fused (EPILOGUE_BIAS)"
                                  : "bias by a separate kernel",
                    (relu && !s->fwd_relu) || (s->act && !s->fwd_aux) ? ", activation by a separate kernel" : "",
                    s->fwd.ws);
  *state = s;
  *workspace_bytes = s->fwd.ws;
  return NULL;
}

static stoke_err *matmul(lt_engine *E, const lt_state *s, const lt_gemm *g, const stoke_kernel_args_v1 *a,
                         const void *A, const void *B, void *D, float beta) {
  float alpha = 1.f;
  STOKE_PROPAGATE_P(check_align(s, "A", A));
  STOKE_PROPAGATE_P(check_align(s, "B", B));
  STOKE_PROPAGATE_P(check_align(s, "D", D));
  if (g->ws > a->workspace_bytes || (g->ws && !a->workspace))
    return STOKE_PERR(STOKE_E_INTERNAL, "cublaslt linear '%s' (%s): the algorithm needs %zu bytes of workspace, "
                      "the executor gave %zu", s->node, g->what, g->ws, a->workspace_bytes);
  LT_CHECK(cublasLtMatmul(E->h, g->op, &alpha, A, g->a, B, g->b, &beta, D, g->c, D, g->c, &g->algo,
                          g->ws ? a->workspace : NULL, g->ws, (cudaStream_t)a->stream),
           s, g->what);
  return NULL;
}

static stoke_err *fwd_run_dt(const stoke_kernel_args_v1 *a, void *state, stoke_dtype dt) {
  lt_state *s = state;
  if (!s) return STOKE_PERR(STOKE_E_INTERNAL, "cublaslt linear '%s': run() without plan()", stoke_node_name(a));
  STOKE_PROPAGATE_P(linear_check(a, dt, 0, NULL));
  lt_engine *E = a->engine;
  cudaStream_t st = (cudaStream_t)a->stream;
  const void *x = a->in[0].data, *w = a->in[1].data, *b = s->nobias ? NULL : a->in[2].data;
  void *y = a->out[0].data;
  if (!s->n || !s->o) return NULL;
  if (s->nobias) { /* matmul: y = x W^T (0 when K = 0) */
    if (s->k) return matmul(E, s, &s->fwd, a, w, x, y, 0.f);
    LT_CUDA(stoke_lt_scale(y, s->n * s->o, 0.f, dt, st), s, "forward");
    return NULL;
  }
  if (!s->k || !s->fwd_bias) { /* y = b, then (if K > 0) y += x W^T */
    LT_CUDA(stoke_lt_bias_rows(y, b, s->n, s->o, dt, st), s, "forward");
    if (s->k) STOKE_PROPAGATE_P(matmul(E, s, &s->fwd, a, w, x, y, 1.f));
  } else {
    LT_CHECK(cublasLtMatmulDescSetAttribute(s->fwd.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b), s,
             "forward");
    if (s->fwd_aux) {
      STOKE_PROPAGATE_P(check_align(s, "aux", a->out[1].data));
      STOKE_PROPAGATE_P(set_pointer(s, &s->fwd, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, a->out[1].data));
    }
    STOKE_PROPAGATE_P(matmul(E, s, &s->fwd, a, w, x, y, 0.f));
  }
  if (s->relu && !(s->k && s->fwd_relu)) LT_CUDA(stoke_lt_relu(y, s->n * s->o, dt, st), s, "forward ReLU");
  if (s->act && !(s->k && s->fwd_aux)) /* z is in y: the aux from it, then y = act(z) */
    LT_CUDA(stoke_lt_act_aux(y, a->out[1].data, s->n, s->o, s->aux_ld, s->act == LT_ACT_GELU, dt, st), s,
            "forward activation");
  return NULL;
}

/* --------------------------------------------------------------- backward */

static stoke_err *bwd_plan_dt(const stoke_kernel_args_v1 *a, void **state, size_t *workspace_bytes,
                              stoke_dtype dt, int relu, int dact) {
  lt_state *s;
  STOKE_PROPAGATE_P(plan_state(a, state, workspace_bytes, dt, 1, relu, dact ? STOKE_OP_LINEAR_DACT : NULL, &s));
  stoke_err *e = NULL;
  if (dact && a->n_in < 5)
    e = STOKE_PERR(STOKE_E_INVALID, "cublaslt linear_dact '%s': needs y1, weight, bias, aux1, bias1", s->node);
  if (dact && !e) e = act_setup(a, s, &a->in[3], s->n, s->k); /* the aux of y1[N, K] */
  if (dact && !e && (a->in[4].shape.ndim != 1 || a->in[4].shape.d[0] != s->k || a->in[4].dtype != dt))
    e = STOKE_PERR(STOKE_E_INVALID, "cublaslt linear_dact '%s': bias1 should be %s [%lld]", s->node,
                   stoke_dtype_name(dt), (long long)s->k);
  if (e) {
    lt_destroy(s);
    return e;
  }
  if (relu) { /* dz[N, O] in the dtype, rounded up so the products' workspace after it stays aligned */
    size_t bytes = (size_t)s->n * (size_t)s->o * stoke_dtype_size(dt);
    s->dz_bytes = (bytes + LT_ALIGN - 1) / LT_ALIGN * LT_ALIGN;
  }
  lt_engine *E = a->engine;
  uint64_t n = (uint64_t)s->n, k = (uint64_t)s->k, o = (uint64_t)s->o;
  /* plan what may be wanted: din[i].data may be NULL at plan time, but a gradient nobody wants has no shape
   * (linear_dact's b2 after core/fuse_act.c's bias fold) */
  int want_db = !s->nobias && a->din[2].shape.ndim > 0;
  if (n && k && o) {
    e = gemm_plan(E, s, a, &s->dx, "dx", CUBLAS_OP_N, CUBLAS_OP_N, k, n, o, s->k, s->o, s->k,
                  CUBLASLT_EPILOGUE_DEFAULT, 0, 0);
    if (!e)
      e = gemm_plan(E, s, a, &s->dw, "dW", CUBLAS_OP_N, CUBLAS_OP_T, k, o, n, s->k, s->o, s->k,
                    CUBLASLT_EPILOGUE_DEFAULT, 0, 0);
    if (!e && !(a->flags & STOKE_KFLAG_DETERMINISTIC) && want_db)
      e = gemm_plan(E, s, a, &s->dw_bgrad, "dW+db", CUBLAS_OP_N, CUBLAS_OP_T, k, o, n, s->k, s->o, s->k,
                    CUBLASLT_EPILOGUE_BGRADB, 0, 1);
    /* linear_dact: dz1 = dx * act'(z1) in the dx product's epilogue, with d bias1 (not accumulating, not
     * deterministic) or without */
    if (!e && dact && act_epilogues_usable(s) && !(a->flags & STOKE_KFLAG_DETERMINISTIC))
      e = gemm_plan(E, s, a, &s->dx_dact_bgrad, "dz1+dbias1", CUBLAS_OP_N, CUBLAS_OP_N, k, n, o, s->k, s->o,
                    s->k, act_bwd_epilogue(s, 1), s->aux_ld, 1);
    if (!e && dact && act_epilogues_usable(s))
      e = gemm_plan(E, s, a, &s->dx_dact, "dz1", CUBLAS_OP_N, CUBLAS_OP_N, k, n, o, s->k, s->o, s->k,
                    act_bwd_epilogue(s, 0), s->aux_ld, 1);
  }
  if (!e && n && k && o && want_db && s->dw.ready)
    e = choose_epilogue(E, s, a, &s->dw_bgrad, s->dw.ms, LT_K_COLSUM, s->n, s->o, 0, NULL);
  if (!e && n && k && o && dact && s->dx.ready && (s->dx_dact.ready || s->dx_dact_bgrad.ready)) {
    /* dz1: the D* epilogue against the plain dx product and the gradient kernel; then D*_BGRAD against
     * whichever of those is kept and the column sums (neither epilogue, as in exact f32: nothing to time) */
    float pair = -1.f;
    e = choose_epilogue(E, s, a, &s->dx_dact, s->dx.ms, s->act == LT_ACT_GELU ? LT_K_DGELU : LT_K_DRELU, s->n,
                        s->k, s->aux_ld, &pair);
    float without = s->dx_dact.ready ? s->dx_dact.ms : pair;
    if (!e) e = choose_epilogue(E, s, a, &s->dx_dact_bgrad, without, LT_K_COLSUM, s->n, s->k, 0, NULL);
  }
  if (e) {
    lt_destroy(s);
    return e;
  }
  if (n && k && o)
    stoke_host->log(STOKE_LOG_DEBUG, LT_WHO, "%s '%s' backward: db %s; workspace %zu/%zu/%zu bytes%s", s->op,
                    s->node,
                    s->dw_bgrad.ready ? "fused (EPILOGUE_BGRADB) when not accumulating" : "by a column-sum kernel",
                    s->dx.ws, s->dw.ws, s->dw_bgrad.ws, relu ? " after the masked dz" : "");
  if (n && k && o && dact)
    stoke_host->log(STOKE_LOG_DEBUG, LT_WHO, "linear_dact '%s': dz1 and d bias1 %s", s->node,
                    s->dx_dact_bgrad.ready ? "in one product (EPILOGUE_D*_BGRAD) when not accumulating"
                    : s->dx_dact.ready     ? "by the D* epilogue and a column-sum kernel"
                                           : "by kernels after the plain product");
  *state = s;
  /* the column sums' partials (db over dy[N, O]; d bias1 over dz1[N, K]) share the products' workspace: they
   * run after them */
  size_t cs = max_ws(want_db ? stoke_lt_colsum_workspace(s->n, s->o, dt) : 0,
                     dact ? stoke_lt_colsum_workspace(s->n, s->k, dt) : 0);
  *workspace_bytes = s->dz_bytes + max_ws(max_ws(max_ws(s->dx.ws, s->dx_dact.ws), cs),
                                          max_ws(s->dx_dact_bgrad.ws, max_ws(s->dw.ws, s->dw_bgrad.ws)));
  return NULL;
}

static stoke_err *bwd_run_dt(const stoke_kernel_args_v1 *a, void *state, stoke_dtype dt) {
  lt_state *s = state;
  if (!s) return STOKE_PERR(STOKE_E_INTERNAL, "cublaslt linear '%s': run() without plan()", stoke_node_name(a));
  STOKE_PROPAGATE_P(linear_check(a, dt, 1, NULL));
  lt_engine *E = a->engine;
  cudaStream_t st = (cudaStream_t)a->stream;
  const void *x = a->in[0].data, *w = a->in[1].data, *dy = a->dout[0].data;
  void *dx = a->din[0].data, *dw = a->din[1].data, *db = s->nobias ? NULL : a->din[2].data;
  int64_t n = s->n, k = s->k, o = s->o;
  int gemm = n && k && o;
  if (dx && n && k) { /* dx = dy W: overwritten (or beta dx for a parameter input) */
    if (gemm) STOKE_PROPAGATE_P(matmul(E, s, &s->dx, a, w, dy, dx, stoke_grad_beta(a, 0)));
    else LT_CUDA(stoke_lt_scale(dx, n * k, stoke_grad_beta(a, 0), dt, st), s, "dx");
  }
  int db_done = 0;
  if (dw && o && k) { /* dW = beta dW + dy^T x */
    float bw = stoke_grad_beta(a, 1);
    if (!gemm) {
      LT_CUDA(stoke_lt_scale(dw, o * k, bw, dt, st), s, "dW");
    } else if (db && s->dw_bgrad.ready && stoke_grad_beta(a, 2) == 0.f) {
      LT_CHECK(cublasLtMatmulDescSetAttribute(s->dw_bgrad.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &db, sizeof db),
               s, "dW+db");
      STOKE_PROPAGATE_P(matmul(E, s, &s->dw_bgrad, a, x, dy, dw, bw));
      db_done = 1;
    } else {
      STOKE_PROPAGATE_P(matmul(E, s, &s->dw, a, x, dy, dw, bw));
    }
  }
  if (db && !db_done) /* db = beta db + column sums of dy */
    LT_CUDA(stoke_lt_colsum(db, dy, n, o, stoke_grad_beta(a, 2), dt, a->workspace, a->workspace_bytes, st), s, "db");
  return NULL;
}

/* linear_relu: dz = dy * (y > 0) into the front of the workspace, then the
 * linear backward reading dz for dy, with the rest of the workspace. */
static stoke_err *relu_bwd_run_dt(const stoke_kernel_args_v1 *a, void *state, stoke_dtype dt) {
  lt_state *s = state;
  if (!s || !s->relu)
    return STOKE_PERR(STOKE_E_INTERNAL, "cublaslt linear_relu '%s': run() without plan()", stoke_node_name(a));
  STOKE_PROPAGATE_P(linear_check(a, dt, 1, NULL));
  int64_t n = s->n * s->o;
  if (n && (!a->out[0].data || !a->dout[0].data))
    return STOKE_PERR(STOKE_E_INVALID, "cublaslt linear_relu '%s': backward needs the forward output y and dy",
                      s->node);
  if (a->workspace_bytes < s->dz_bytes || (s->dz_bytes && !a->workspace))
    return STOKE_PERR(STOKE_E_INTERNAL,
                      "cublaslt linear_relu '%s': the backward needs %zu bytes of workspace for dz, the executor "
                      "gave %zu",
                      s->node, s->dz_bytes, a->workspace_bytes);
  stoke_tensor dz = a->dout[0];
  dz.data = n ? a->workspace : a->dout[0].data; /* nothing to mask: no product reads it */
  LT_CUDA(stoke_lt_relu_mask(dz.data, a->dout[0].data, a->out[0].data, n, dt, (cudaStream_t)a->stream), s,
          "dz = dy * (y > 0)");
  stoke_kernel_args_v1 b = *a;
  b.dout = &dz;
  b.workspace = s->dz_bytes ? (char *)a->workspace + s->dz_bytes : a->workspace;
  b.workspace_bytes = a->workspace_bytes - s->dz_bytes;
  if (!b.workspace_bytes) b.workspace = NULL;
  return bwd_run_dt(&b, state, dt);
}

/* linear_dact: dz1 = (dy W) * act'(z1) from the aux and d bias1 =
 * colsum(dz1), in the dx product's epilogue where one serves, then the
 * next linear's dW and db as linear's backward. */
static stoke_err *dact_bwd_run_dt(const stoke_kernel_args_v1 *a, void *state, stoke_dtype dt) {
  lt_state *s = state;
  if (!s || !s->act)
    return STOKE_PERR(STOKE_E_INTERNAL, "cublaslt linear_dact '%s': run() without plan()", stoke_node_name(a));
  STOKE_PROPAGATE_P(linear_check(a, dt, 1, NULL));
  lt_engine *E = a->engine;
  cudaStream_t st = (cudaStream_t)a->stream;
  const void *w = a->in[1].data, *dy = a->dout[0].data, *aux = a->in[3].data;
  void *dz = a->din[0].data, *db1 = a->din[4].data;
  int64_t n = s->n, k = s->k, o = s->o;
  if (db1 && !dz)
    return STOKE_PERR(STOKE_E_INVALID, "cublaslt linear_dact '%s': d bias1 asked for without dz1", s->node);
  if (dz && n && k) {
    if (!aux) return STOKE_PERR(STOKE_E_INVALID, "cublaslt linear_dact '%s': backward needs aux1", s->node);
    STOKE_PROPAGATE_P(check_align(s, "aux", aux));
    int db_done = 0;
    if (!o) {
      LT_CUDA(stoke_lt_scale(dz, n * k, 0.f, dt, st), s, "dz1");
    } else if (db1 && s->dx_dact_bgrad.ready && stoke_grad_beta(a, 4) == 0.f) {
      STOKE_PROPAGATE_P(set_pointer(s, &s->dx_dact_bgrad, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux));
      STOKE_PROPAGATE_P(set_pointer(s, &s->dx_dact_bgrad, CUBLASLT_MATMUL_DESC_BIAS_POINTER, db1));
      STOKE_PROPAGATE_P(matmul(E, s, &s->dx_dact_bgrad, a, w, dy, dz, 0.f));
      db_done = 1;
    } else if (s->dx_dact.ready) {
      STOKE_PROPAGATE_P(set_pointer(s, &s->dx_dact, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux));
      STOKE_PROPAGATE_P(matmul(E, s, &s->dx_dact, a, w, dy, dz, 0.f));
    } else {
      STOKE_PROPAGATE_P(matmul(E, s, &s->dx, a, w, dy, dz, 0.f));
      LT_CUDA(stoke_lt_dact(dz, aux, n, k, s->aux_ld, s->act == LT_ACT_GELU, dt, st), s, "dz1 = dx * act'(z1)");
    }
    if (db1 && !db_done)
      LT_CUDA(stoke_lt_colsum(db1, dz, n, k, stoke_grad_beta(a, 4), dt, a->workspace, a->workspace_bytes, st), s,
              "d bias1");
  } else if (db1 && k) { /* no rows: d bias1 keeps beta times itself */
    LT_CUDA(stoke_lt_scale(db1, k, stoke_grad_beta(a, 4), dt, st), s, "d bias1");
  }
  stoke_tensor din[STOKE_MAX_IO];
  memcpy(din, a->din, sizeof(stoke_tensor) * (size_t)a->n_in);
  din[0].data = NULL; /* done above */
  stoke_kernel_args_v1 b = *a;
  b.din = din;
  return bwd_run_dt(&b, state, dt);
}

/* ------------------------------------------------------------ the tables */

#define LT_KERNELS(sfx, DT)                                                                                   \
  static stoke_err *fwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {                  \
    return fwd_plan_dt(a, st, ws, DT, 0, 0);                                                                \
  }                                                                                                         \
  static stoke_err *fwd_run_##sfx(const stoke_kernel_args_v1 *a, void *st) { return fwd_run_dt(a, st, DT); } \
  static stoke_err *bwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {                  \
    return bwd_plan_dt(a, st, ws, DT, 0, 0);                                                                \
  }                                                                                                         \
  static stoke_err *bwd_run_##sfx(const stoke_kernel_args_v1 *a, void *st) { return bwd_run_dt(a, st, DT); } \
  static stoke_err *relu_fwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {             \
    return fwd_plan_dt(a, st, ws, DT, 1, 0);                                                                \
  }                                                                                                         \
  static stoke_err *relu_bwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {             \
    return bwd_plan_dt(a, st, ws, DT, 1, 0);                                                                \
  }                                                                                                         \
  static stoke_err *relu_bwd_run_##sfx(const stoke_kernel_args_v1 *a, void *st) {                           \
    return relu_bwd_run_dt(a, st, DT);                                                                      \
  }                                                                                                         \
  static stoke_err *act_fwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {              \
    return fwd_plan_dt(a, st, ws, DT, 0, 1);                                                                \
  }                                                                                                         \
  static stoke_err *dact_bwd_plan_##sfx(const stoke_kernel_args_v1 *a, void **st, size_t *ws) {             \
    return bwd_plan_dt(a, st, ws, DT, 0, 1);                                                                \
  }                                                                                                         \
  static stoke_err *dact_bwd_run_##sfx(const stoke_kernel_args_v1 *a, void *st) {                           \
    return dact_bwd_run_dt(a, st, DT);                                                                      \
  }

LT_KERNELS(f32, STOKE_F32)
LT_KERNELS(bf16, STOKE_BF16)
LT_KERNELS(f16, STOKE_F16)

#define LT_ENTRY(sfx, DT)                                                                                \
  {"cublaslt", STOKE_OP_MATMUL, STOKE_FWD, DT, STOKE_LAYOUT_ANY, fwd_plan_##sfx, fwd_run_##sfx, lt_destroy}, \
      {"cublaslt", STOKE_OP_MATMUL, STOKE_BWD, DT, STOKE_LAYOUT_ANY, bwd_plan_##sfx, bwd_run_##sfx, lt_destroy}, \
      {"cublaslt", STOKE_OP_LINEAR, STOKE_FWD, DT, STOKE_LAYOUT_ANY, fwd_plan_##sfx, fwd_run_##sfx, lt_destroy}, \
      {"cublaslt", STOKE_OP_LINEAR, STOKE_BWD, DT, STOKE_LAYOUT_ANY, bwd_plan_##sfx, bwd_run_##sfx, lt_destroy}, \
      {"cublaslt", STOKE_OP_LINEAR_RELU, STOKE_FWD, DT, STOKE_LAYOUT_ANY, relu_fwd_plan_##sfx, fwd_run_##sfx,  \
       lt_destroy},                                                                                       \
      {"cublaslt", STOKE_OP_LINEAR_RELU, STOKE_BWD, DT, STOKE_LAYOUT_ANY, relu_bwd_plan_##sfx,                \
       relu_bwd_run_##sfx, lt_destroy},                                                                    \
      {"cublaslt", STOKE_OP_LINEAR_ACT, STOKE_FWD, DT, STOKE_LAYOUT_ANY, act_fwd_plan_##sfx, fwd_run_##sfx,    \
       lt_destroy},                                                                                       \
      {"cublaslt", STOKE_OP_LINEAR_DACT, STOKE_BWD, DT, STOKE_LAYOUT_ANY, dact_bwd_plan_##sfx,                \
       dact_bwd_run_##sfx, lt_destroy}

static const stoke_kernel_v1 kernels[] = {
    LT_ENTRY(f32, STOKE_F32),
    LT_ENTRY(bf16, STOKE_BF16),
    LT_ENTRY(f16, STOKE_F16),
};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_backend(r->self, &backend));
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++)
    STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "cublaslt",
    "cuBLASLt linear, linear_relu, linear_act and linear_dact kernels (fused bias, ReLU/GELU and their gradients, "
    "bias gradients) for f32/TF32, bf16 and fp16",
    reg};
