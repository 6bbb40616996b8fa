/* backends/cudnn/conv_lt.c: 1x1 convolutions as cuBLASLt products (see
 * conv_lt.h). The products, with M = N H W, C = x's channels, K = y's, in
 * cuBLASLt's column-major terms (a row-major [r, c] matrix is stored as
 * the column-major c x r one):
 *
 *   fprop  y^T (K x M, ld K)  = op(W) x^T:  A = W stored C x K, T; B = x stored C x M, N
 *   dgrad  dx^T (C x M, ld C) = W dy^T:     A = W stored C x K, N; B = dy stored K x M, N
 *   wgrad  dW^T (C x K, ld C) = x^T dy:     A = x stored C x M, N; B = dy stored K x M, T
 *
 * Bf16 or fp16 operands, f32 accumulation, as cuDNN's engines. */
#include <stdio.h>
#include <string.h>

#include "backends/cublaslt/lt_algo_desc.h"
#include "conv_lt.h"

#define CLT_CANDIDATES 16
#define CLT_WS_MAX ((size_t)32 << 20) /* as the cublaslt engine's cap */
#define CLT_CACHE_MAX 128

/* What identifies a product's choice (memcmp'd: memset first). */
typedef struct clt_key {
  int32_t kind, dt, det, reserved;
  uint64_t m, n, k;
} clt_key;

struct clt_cache {
  cublasLtHandle_t h;
  int n;
  clt_key keys[CLT_CACHE_MAX];
  cublasLtMatmulAlgo_t algos[CLT_CACHE_MAX];
  size_t ws[CLT_CACHE_MAX];
  float ms[CLT_CACHE_MAX];
};

#define CLT_CHECK(call, ctx)                                                                                    \
  do {                                                                                                          \
    cublasStatus_t clt_s_ = (call);                                                                             \
    if (clt_s_ != CUBLAS_STATUS_SUCCESS)                                                                        \
      return STOKE_PERR(STOKE_E_DEVICE, "%s failed: %s (%s); %s", #call, cublasLtGetStatusString(clt_s_),        \
                        cublasLtGetStatusName(clt_s_), (ctx));                                                  \
  } while (0)

int clt_eligible(const cg_conv_geom *g, int64_t groups) {
  return g->nhwc && (g->dt == CUDNN_DATA_BFLOAT16 || g->dt == CUDNN_DATA_HALF) && groups == 1 && g->w[2] == 1 &&
         g->w[3] == 1 && g->stride[0] == 1 && g->stride[1] == 1 && g->pad[0] == 0 && g->pad[1] == 0 &&
         g->x[2] == g->y[2] && g->x[3] == g->y[3];
}

static stoke_err *engine_lt(cudnn_engine *eng, const char *ctx, struct clt_cache **out) {
  if (!eng->lt) {
    struct clt_cache *c = stoke_host->alloc(sizeof *c);
    if (!c) return STOKE_PERR(STOKE_E_OOM, "cudnn: out of host memory; %s", ctx);
    memset(c, 0, sizeof *c);
    cublasStatus_t s = cublasLtCreate(&c->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
      stoke_host->free(c);
      return STOKE_PERR(STOKE_E_DEVICE, "cublasLtCreate failed: %s; %s", cublasLtGetStatusString(s), ctx);
    }
    eng->lt = c;
  }
  *out = eng->lt;
  return NULL;
}

void clt_engine_close(cudnn_engine *eng) {
  if (!eng->lt) return;
  cublasLtDestroy(eng->lt->h);
  stoke_host->free(eng->lt);
  eng->lt = NULL;
}

void clt_free(clt_prod *p) {
  if (!p) return;
  if (p->a) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) cublasLtMatrixLayoutDestroy(p->b);
  if (p->c) cublasLtMatrixLayoutDestroy(p->c);
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  stoke_host->free(p);
}

/* The descriptors of pass `kind` (the table above). */
static stoke_err *describe(clt_prod *p, cg_conv_kind kind, const cg_conv_geom *g, clt_key *k, const char *ctx) {
  uint64_t m_rows = (uint64_t)(g->x[0] * g->x[2] * g->x[3]), c = (uint64_t)g->x[1], kk = (uint64_t)g->y[1];
  cublasOperation_t ta = kind == CG_FPROP ? CUBLAS_OP_T : CUBLAS_OP_N, tb = kind == CG_WGRAD ? CUBLAS_OP_T : CUBLAS_OP_N;
  /* D is m x n with a k-long sum; A stored (ta N: m x k, T: k x m), B (tb N: k x n, T: n x k) */
  uint64_t m = kind == CG_FPROP ? kk : c, n = kind == CG_WGRAD ? kk : m_rows,
           kl = kind == CG_FPROP ? c : kind == CG_DGRAD ? kk : m_rows;
  int64_t lda = (int64_t)c, ldb = kind == CG_FPROP ? (int64_t)c : (int64_t)kk, ldc = (int64_t)m;
  cudaDataType_t t = g->dt == CUDNN_DATA_HALF ? CUDA_R_16F : CUDA_R_16BF;
  CLT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), ctx);
  CLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), ctx);
  CLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), ctx);
  CLT_CHECK(cublasLtMatrixLayoutCreate(&p->a, t, ta == CUBLAS_OP_N ? m : kl, ta == CUBLAS_OP_N ? kl : m, lda), ctx);
  CLT_CHECK(cublasLtMatrixLayoutCreate(&p->b, t, tb == CUBLAS_OP_N ? kl : n, tb == CUBLAS_OP_N ? n : kl, ldb), ctx);
  CLT_CHECK(cublasLtMatrixLayoutCreate(&p->c, t, m, n, ldc), ctx);
  memset(k, 0, sizeof *k);
  k->kind = kind, k->dt = g->dt, k->m = m, k->n = n, k->k = kl;
  return NULL;
}

/* Bytes of the pass's operands: A, B, D. */
static void operand_bytes(cg_conv_kind kind, const cg_conv_geom *g, size_t b[3]) {
  size_t xb = (size_t)(g->x[0] * g->x[1] * g->x[2] * g->x[3]) * 2, yb = (size_t)(g->y[0] * g->y[1] * g->y[2] * g->y[3]) * 2,
         wb = (size_t)(g->w[0] * g->w[1]) * 2;
  b[0] = kind == CG_WGRAD ? xb : wb;
  b[1] = kind == CG_FPROP ? xb : yb;
  b[2] = kind == CG_FPROP ? yb : kind == CG_DGRAD ? xb : wb;
}

typedef struct clt_timing {
  cublasLtHandle_t h;
  const clt_prod *p;
  const cublasLtMatmulAlgo_t *algo;
  size_t ws;
  void *ptr[4]; /* A, B, D, workspace */
  cudaStream_t s;
} clt_timing;

static int run_candidate(void *ctx) {
  clt_timing *t = ctx;
  const float alpha = 1.f, beta = 0.f;
  return cublasLtMatmul(t->h, t->p->op, &alpha, t->ptr[0], t->p->a, t->ptr[1], t->p->b, &beta, t->ptr[2], t->p->c,
                        t->ptr[2], t->p->c, t->algo, t->ws ? t->ptr[3] : NULL, t->ws, t->s) != CUBLAS_STATUS_SUCCESS;
}

/* The heuristic's candidates timed on temporaries; p->ms < 0 when none ran. */
static stoke_err *tune(struct clt_cache *L, clt_prod *p, cg_conv_kind kind, const cg_conv_geom *g, int det,
                       cudaStream_t s, const char *ctx) {
  p->ms = -1.f;
  cublasLtMatmulPreference_t pref = NULL;
  CLT_CHECK(cublasLtMatmulPreferenceCreate(&pref), ctx);
  size_t ws_max = CLT_WS_MAX;
  uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE; /* deterministic: no split-K reductions asked for */
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof ws_max);
  if (st == CUBLAS_STATUS_SUCCESS && det)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
  cublasLtMatmulHeuristicResult_t res[CLT_CANDIDATES];
  memset(res, 0, sizeof res);
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(L->h, p->op, p->a, p->b, p->c, p->c, pref, CLT_CANDIDATES, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found <= 0) return NULL; /* no product: cuDNN's plan stays */
  size_t b[3], wsb = 0;
  operand_bytes(kind, g, b);
  for (int i = 0; i < found; i++)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize > wsb) wsb = res[i].workspaceSize;
  clt_timing t = {L->h, p, NULL, 0, {NULL, NULL, NULL, NULL}, s};
  size_t sizes[4] = {b[0], b[1], b[2], wsb ? wsb : 256};
  int have = 1;
  for (int i = 0; i < 4 && have; i++) {
    have = cudaMalloc(&t.ptr[i], sizes[i]) == cudaSuccess;
    if (have) cudaMemsetAsync(t.ptr[i], 0x3c, sizes[i], s); /* bf16 0.0115, fp16 1.06: finite */
  }
  if (!have)
    stoke_host->log(STOKE_LOG_DEBUG, "cudnn", "%s: no device memory to time cuBLASLt products; cuDNN's plan kept",
                    ctx);
  for (int i = 0; have && i < found; i++) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || (det && !stoke_lt_algo_reproducible(&res[i].algo))) continue;
    t.algo = &res[i].algo, t.ws = res[i].workspaceSize;
    float ms = cg_time3(run_candidate, &t, s);
    if (ms >= 0 && (p->ms < 0 || ms < p->ms)) p->ms = ms, p->algo = res[i].algo, p->ws = res[i].workspaceSize;
  }
  for (int i = 0; i < 4; i++)
    if (t.ptr[i]) cudaFree(t.ptr[i]);
  cudaGetLastError();
  return NULL;
}

stoke_err *clt_plan(cudnn_engine *eng, cg_conv_kind kind, const cg_conv_geom *g, int deterministic, void *stream,
                    const char *ctx, clt_prod **out) {
  *out = NULL;
  struct clt_cache *L = NULL;
  STOKE_PROPAGATE_P(engine_lt(eng, ctx, &L));
  clt_prod *p = stoke_host->alloc(sizeof *p);
  if (!p) return STOKE_PERR(STOKE_E_OOM, "cudnn: out of host memory; %s", ctx);
  memset(p, 0, sizeof *p);
  clt_key k;
  stoke_err *e = describe(p, kind, g, &k, ctx);
  k.det = deterministic != 0;
  int hit = -1;
  for (int i = 0; !e && i < L->n && hit < 0; i++)
    if (!memcmp(&L->keys[i], &k, sizeof k)) hit = i;
  if (!e && hit >= 0) {
    p->algo = L->algos[hit], p->ws = L->ws[hit], p->ms = L->ms[hit], p->cached = 1;
  } else if (!e) {
    e = tune(L, p, kind, g, deterministic, (cudaStream_t)stream, ctx);
    if (!e && p->ms >= 0 && L->n < CLT_CACHE_MAX) { /* full: later problems are timed again, still correct */
      L->keys[L->n] = k, L->algos[L->n] = p->algo, L->ws[L->n] = p->ws, L->ms[L->n] = p->ms;
      L->n++;
    }
  }
  if (e || p->ms < 0) {
    clt_free(p);
    return e;
  }
  *out = p;
  return NULL;
}

stoke_err *clt_run(cudnn_engine *eng, const clt_prod *p, cg_conv_kind kind, const void *in0, const void *in1,
                   void *out, float beta, void *ws, void *stream, const char *ctx) {
  const float alpha = 1.f;
  /* fprop (x, w): A = w, B = x; dgrad (dy, w): A = w, B = dy; wgrad (x, dy): A = x, B = dy */
  const void *A = kind == CG_WGRAD ? in0 : in1, *B = kind == CG_WGRAD ? in1 : in0;
  CLT_CHECK(cublasLtMatmul(eng->lt->h, p->op, &alpha, A, p->a, B, p->b, &beta, out, p->c, out, p->c, &p->algo,
                           p->ws ? ws : NULL, p->ws, (cudaStream_t)stream),
            ctx);
  eng->conv_products_run++;
  return NULL;
}
