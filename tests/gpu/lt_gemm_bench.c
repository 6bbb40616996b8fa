/* tests/gpu/lt_gemm_bench.c: times GPT-2 124M's linear products (B = 16,
 * T = 1024: 16,384 tokens; bf16 in and out, f32 compute) through cuBLASLt
 * directly, every candidate the heuristic offers, and for the weight
 * gradients (k = 16,384 tokens, a small m x n output) also split-K
 * variants of the heuristic's algorithms (SPLITK_NUM 2-16 with each
 * reduction scheme, checked by cublasLtMatmulAlgoCheck) and the product
 * split into a strided batch over the tokens (f32 partials; their
 * reduction is not timed here, its bytes are printed). What the cublaslt
 * engine's autotune candidates (backends/cublaslt/cublaslt.c) rest on.
 * Operands are random bf16 (not constant: power and clocks depend on the
 * data). Each line: median of 20 timed calls after 3 warm-up calls, in
 * ms and TFLOP/s. A benchmark, not a test. GPU machine only.
 *   lt_gemm_bench [tokens]          every product of the four linears
 *   lt_gemm_bench rn50 [batch] [px] ResNet-50's stride-1 1x1 convolutions
 *                                   as the same three products (NHWC rows)
 * The layouts are the engine's (cublaslt.c's header): forward m = O,
 * n = N, k = K; dx m = K, n = N, k = O; dW m = K, n = O, k = N. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backends/cublaslt/lt_algo_desc.h"

#define WARMUP 3
#define TIMED 20
#define MAX_CAND 32
#define WS_BYTES ((size_t)64 << 20)

#define CK(x)                                                                                                    \
  do {                                                                                                           \
    cudaError_t e_ = (x);                                                                                        \
    if (e_ != cudaSuccess) {                                                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
      exit(1);                                                                                                   \
    }                                                                                                            \
  } while (0)
#define LK(x)                                                                                                    \
  do {                                                                                                           \
    cublasStatus_t s_ = (x);                                                                                     \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasLtGetStatusName(s_));                     \
      exit(1);                                                                                                   \
    }                                                                                                            \
  } while (0)

static cublasLtHandle_t H;
static cudaStream_t S;
static void *WS;
static cudaEvent_t E0, E1;

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* One product's descriptors: D[m, n] = op(A) op(B), column-major. */
typedef struct prod {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
} prod;

static prod make(cublasOperation_t ta, cublasOperation_t tb, uint64_t m, uint64_t n, uint64_t k, int64_t lda,
                 int64_t ldb, int64_t ldc, cudaDataType_t dt_d, int batch, int64_t sa, int64_t sb, int64_t sc) {
  prod p;
  LK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  LK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
  LK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
  LK(cublasLtMatrixLayoutCreate(&p.c, dt_d, m, n, ldc));
  if (batch > 1) {
    cublasLtMatrixLayout_t l[3] = {p.a, p.b, p.c};
    int64_t st[3] = {sa, sb, sc};
    for (int i = 0; i < 3; i++) {
      LK(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
      LK(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof st[i]));
    }
  }
  return p;
}

static void unmake(prod *p) {
  cublasLtMatrixLayoutDestroy(p->a);
  cublasLtMatrixLayoutDestroy(p->b);
  cublasLtMatrixLayoutDestroy(p->c);
  cublasLtMatmulDescDestroy(p->op);
}

/* Median ms of one algorithm, or -1 when it fails to run. */
static float time_algo(const prod *p, const cublasLtMatmulAlgo_t *algo, size_t ws, const void *A, const void *B,
                       void *D) {
  float alpha = 1.f, beta = 0.f, ms[TIMED];
  for (int i = 0; i < WARMUP + TIMED; i++) {
    CK(cudaEventRecord(E0, S));
    if (cublasLtMatmul(H, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c, algo, ws ? WS : NULL, ws, S) !=
        CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();
      return -1.f;
    }
    CK(cudaEventRecord(E1, S));
    CK(cudaEventSynchronize(E1));
    if (i >= WARMUP) CK(cudaEventElapsedTime(&ms[i - WARMUP], E0, E1));
  }
  qsort(ms, TIMED, sizeof *ms, by_value);
  return ms[TIMED / 2];
}

/* Every heuristic candidate of one product; with `splits`, the split-K
 * variants of the first few too. Returns the best ms. */
static float sweep(const char *name, const prod *p, double flop, const void *A, const void *B, void *D,
                   int splits) {
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  size_t wsmax = WS_BYTES;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax, sizeof wsmax));
  cublasLtMatmulHeuristicResult_t res[MAX_CAND];
  int found = 0;
  memset(res, 0, sizeof res);
  LK(cublasLtMatmulAlgoGetHeuristic(H, p->op, p->a, p->b, p->c, p->c, pref, MAX_CAND, res, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  float best = -1.f, first = -1.f;
  char d[160], bestd[160] = "";
  for (int i = 0; i < found; i++) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    float ms = time_algo(p, &res[i].algo, res[i].workspaceSize, A, B, D);
    stoke_lt_algo_desc(&res[i].algo, d, sizeof d);
    printf("  %-22s cand %2d %-58s ws %8zu  %.4f ms  %6.1f TFLOP/s\n", name, i, d, res[i].workspaceSize, ms,
           ms > 0 ? flop / ms / 1e9 : 0.0);
    if (i == 0) first = ms;
    if (ms > 0 && (best < 0 || ms < best)) best = ms, memcpy(bestd, d, sizeof d);
  }
  static const int ks[] = {2, 3, 4, 6, 8, 12, 16};
  static const uint32_t reds[] = {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                  CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
  for (int i = 0; splits && i < found && i < 6; i++) {
    int32_t sk = 1;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk, &w);
    if (sk != 1) continue;
    for (size_t j = 0; j < sizeof ks / sizeof *ks; j++)
      for (size_t r = 0; r < sizeof reds / sizeof *reds; r++) {
        cublasLtMatmulAlgo_t al = res[i].algo;
        int32_t s2 = ks[j];
        uint32_t rd = reds[r];
        if (cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s2, sizeof s2) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &rd, sizeof rd) !=
                CUBLAS_STATUS_SUCCESS)
          continue;
        cublasLtMatmulHeuristicResult_t chk;
        memset(&chk, 0, sizeof chk);
        if (cublasLtMatmulAlgoCheck(H, p->op, p->a, p->b, p->c, p->c, &al, &chk) != CUBLAS_STATUS_SUCCESS ||
            chk.workspaceSize > WS_BYTES)
          continue;
        float ms = time_algo(p, &al, chk.workspaceSize, A, B, D);
        stoke_lt_algo_desc(&al, d, sizeof d);
        printf("  %-22s split  %-58s ws %8zu  %.4f ms  %6.1f TFLOP/s\n", name, d, chk.workspaceSize, ms,
               ms > 0 ? flop / ms / 1e9 : 0.0);
        if (ms > 0 && (best < 0 || ms < best)) best = ms, memcpy(bestd, d, sizeof d);
      }
  }
  printf("%-24s first %.4f ms (%.1f TFLOP/s), best %.4f ms (%.1f TFLOP/s): %s\n", name, first,
         first > 0 ? flop / first / 1e9 : 0.0, best, best > 0 ? flop / best / 1e9 : 0.0, bestd);
  fflush(stdout);
  return best;
}

static void *dev_random(size_t n, unsigned seed) {
  uint16_t *h = malloc(n * 2);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) { /* bf16 of a value in [-1, 1) */
    s = s * 1664525u + 1013904223u;
    float f = ((float)(s >> 8) / (float)(1u << 24)) * 2.f - 1.f;
    uint32_t u;
    memcpy(&u, &f, 4);
    h[i] = (uint16_t)(u >> 16);
  }
  void *d;
  CK(cudaMalloc(&d, n * 2));
  CK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

/* ResNet-50's stride-1 1x1 convolutions as linears over M = N H W rows
 * (NHWC: X [M, C] row-major, W [K, C]): uses a step, C in, K out, H at 224. */
static const struct {
  const char *name;
  int64_t c, k, h;
  int uses;
} RN50_1X1[] = {{"l1 64-64", 64, 64, 56, 1},     {"l1 64-256", 64, 256, 56, 4},   {"l1 256-64", 256, 64, 56, 2},
                {"l2 256-128", 256, 128, 56, 1}, {"l2 128-512", 128, 512, 28, 4}, {"l2 512-128", 512, 128, 28, 3},
                {"l3 512-256", 512, 256, 28, 1}, {"l3 256-1024", 256, 1024, 14, 6}, {"l3 1024-256", 1024, 256, 14, 5},
                {"l4 1024-512", 1024, 512, 14, 1}, {"l4 512-2048", 512, 2048, 7, 3}, {"l4 2048-512", 2048, 512, 7, 2}};

int main(int argc, char **argv) {
  int rn50 = argc > 1 && !strcmp(argv[1], "rn50");
  int64_t N = rn50 ? 0 : argc > 1 ? atoll(argv[1]) : 16384;
  int64_t batch = rn50 && argc > 2 ? atoll(argv[2]) : 256, res = rn50 && argc > 3 ? atoll(argv[3]) : 224;
  CK(cudaStreamCreate(&S));
  LK(cublasLtCreate(&H));
  CK(cudaMalloc(&WS, WS_BYTES));
  CK(cudaEventCreate(&E0));
  CK(cudaEventCreate(&E1));
  struct {
    const char *name;
    int64_t K, O, N;
    int uses;
  } lin[16] = {{"c_attn", 768, 2304, N, 1}, {"attn.c_proj", 768, 768, N, 1}, {"c_fc", 768, 3072, N, 1},
               {"mlp.c_proj", 3072, 768, N, 1}};
  size_t nlin = 4;
  if (rn50) {
    nlin = sizeof RN50_1X1 / sizeof *RN50_1X1;
    for (size_t i = 0; i < nlin; i++) {
      int64_t h = RN50_1X1[i].h * res / 224;
      lin[i].name = RN50_1X1[i].name, lin[i].K = RN50_1X1[i].c, lin[i].O = RN50_1X1[i].k;
      lin[i].N = batch * h * h, lin[i].uses = RN50_1X1[i].uses;
    }
  }
  int64_t big = 0, wmax = 3072 * 768;
  for (size_t l = 0; l < nlin; l++) {
    int64_t io = lin[l].N * (lin[l].K > lin[l].O ? lin[l].K : lin[l].O);
    if (io > big) big = io;
    if (lin[l].K * lin[l].O > wmax) wmax = lin[l].K * lin[l].O;
  }
  void *X = dev_random((size_t)big, 1), *DY = dev_random((size_t)big, 2), *Wt = dev_random((size_t)wmax, 3);
  void *D;
  CK(cudaMalloc(&D, (size_t)big * 4 * 4));
  if (rn50)
    printf("lt_gemm_bench: ResNet-50's stride-1 1x1 convolutions as products, batch %lld, %lld px, bf16, f32 "
           "compute, cuBLASLt %zu\n",
           (long long)batch, (long long)res, cublasLtGetVersion());
  else
    printf("lt_gemm_bench: N = %lld tokens, bf16, f32 compute, cuBLASLt %zu\n", (long long)N, cublasLtGetVersion());
  double step[3] = {0, 0, 0};
  for (size_t l = 0; l < nlin; l++) {
    int64_t K = lin[l].K, O = lin[l].O, Nl = lin[l].N;
    double flop = 2.0 * (double)Nl * (double)K * (double)O;
    char name[64];
    snprintf(name, sizeof name, "%s fwd", lin[l].name);
    prod p = make(CUBLAS_OP_T, CUBLAS_OP_N, O, Nl, K, K, K, O, CUDA_R_16BF, 1, 0, 0, 0);
    step[0] += lin[l].uses * sweep(name, &p, flop, Wt, X, D, 0);
    unmake(&p);
    snprintf(name, sizeof name, "%s dx", lin[l].name);
    p = make(CUBLAS_OP_N, CUBLAS_OP_N, K, Nl, O, K, O, K, CUDA_R_16BF, 1, 0, 0, 0);
    step[1] += lin[l].uses * sweep(name, &p, flop, Wt, DY, D, 0);
    unmake(&p);
    snprintf(name, sizeof name, "%s dW", lin[l].name);
    p = make(CUBLAS_OP_N, CUBLAS_OP_T, K, O, Nl, K, O, K, CUDA_R_16BF, 1, 0, 0, 0);
    step[2] += lin[l].uses * sweep(name, &p, flop, X, DY, D, 1);
    unmake(&p);
    for (int sb = 2; !rn50 && sb <= 8; sb *= 2) { /* the tokens split into sb strided batches, f32 partials */
      int64_t nb = Nl / sb;
      snprintf(name, sizeof name, "%s dW batch%d", lin[l].name, sb);
      p = make(CUBLAS_OP_N, CUBLAS_OP_T, K, O, nb, K, O, K, CUDA_R_32F, sb, K * nb, O * nb, K * O);
      sweep(name, &p, flop, X, DY, D, 0);
      printf("%-24s + reduction of %d f32 partials: %.1f MB read\n", name, sb, (double)sb * K * O * 4 / 1e6);
      unmake(&p);
    }
  }
  if (rn50)
    printf("per step (uses counted), best candidates: fwd %.3f ms, dx %.3f ms, dW %.3f ms, all %.3f ms\n", step[0],
           step[1], step[2], step[0] + step[1] + step[2]);
  return 0;
}
