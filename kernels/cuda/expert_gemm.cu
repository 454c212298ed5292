/* The local experts' GEMMs as one cuBLAS call each (cublasGemmGroupedBatchedEx,
 * CUDA 12.5+): a candidate for issue 28's grouped expert GEMMs, measured against
 * the per-expert cuBLASLt calls the model makes today by
 * scripts/bench/bench_expert_gemm.c (not yet on the model's path). Operands in the
 * bf16 table's storage, expert-major: expert e's rows are off[e] .. off[e + 1]
 * of x / dout / out (host offsets: the grouped call takes its sizes on the host);
 * weights one [M, K] matrix per expert (w[e], device pointers). Row-major
 * operands map to cuBLAS's column-major as in lt_gemm.cu. One group per expert
 * with rows (a group holds GEMMs of one shape); the device arrays of pointers
 * go through SCRATCH_POINTERS. Returns 0, or -1 where cuBLAS has no such
 * grouped GEMM (nothing written; said once per kind, and not tried again):
 * headers before cuBLAS 12.5, rows not 16-byte aligned (K or M not a
 * multiple of 8), or a refused type combination (cuBLAS may list bf16 A/B
 * with an fp32 C, the weight gradient's, for its batched calls and not for
 * the grouped one). */
#include "kernels/cuda/cuda.h"

#define MAX_GROUPS 1024

/* what every call fills: per group (one per expert with rows) sizes, leading dimensions and the three pointers */
struct groups {
    int n, m[MAX_GROUPS], nn[MAX_GROUPS], k[MAX_GROUPS], lda[MAX_GROUPS], ldb[MAX_GROUPS], ldc[MAX_GROUPS];
    int size[MAX_GROUPS];
    cublasOperation_t ta[MAX_GROUPS], tb[MAX_GROUPS];
    float alpha[MAX_GROUPS], beta[MAX_GROUPS];
    const void *a[MAX_GROUPS], *b[MAX_GROUPS];
    void *c[MAX_GROUPS];
};

enum kind { FORWARD, DGRAD, WGRAD };
static const char *const kind_name[3] = {"forward", "input-gradient", "weight-gradient"};
static int refused[3];

static int refuse(enum kind kind, const char *why) {
    if (!refused[kind])
        fprintf(stderr, "mtrain: no grouped %s GEMM for the experts (%s): they run expert by expert\n",
                kind_name[kind], why);
    refused[kind] = 1;
    return -1;
}

#if CUBLAS_VERSION >= 120500
static int run(struct groups *g, enum kind kind) {
    if (!g->n) return 0;
    cudaDataType_t c_type = kind == WGRAD ? CUDA_R_32F : CUDA_R_16BF;
    void **dev = (void **)cuda_scratch(SCRATCH_POINTERS, 3 * sizeof(void *) * g->n);
    const void *host[3 * MAX_GROUPS];
    for (int i = 0; i < g->n; i++) host[i] = g->a[i], host[g->n + i] = g->b[i], host[2 * g->n + i] = g->c[i];
    /* pageable host memory: the copy has read it when it returns */
    CUDA_CHECK(cudaMemcpyAsync(dev, host, 3 * sizeof(void *) * g->n, cudaMemcpyHostToDevice, 0));
    cublasStatus_t st = cublasGemmGroupedBatchedEx(
        cuda_blas(), g->ta, g->tb, g->m, g->nn, g->k, g->alpha, (const void *const *)dev, CUDA_R_16BF, g->lda,
        (const void *const *)(dev + g->n), CUDA_R_16BF, g->ldb, g->beta, dev + 2 * g->n, c_type, g->ldc, g->n, g->size,
        CUBLAS_COMPUTE_32F);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)
        return refuse(kind, st == CUBLAS_STATUS_NOT_SUPPORTED ? "cuBLAS: not supported" : "cuBLAS: invalid value");
    CUBLAS_CHECK(st);
    return 0;
}
#else
static int run(struct groups *, enum kind kind) { return refuse(kind, "cuBLAS before 12.5"); }
#endif

static void add(struct groups *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *a,
                int lda, const void *b, int ldb, void *c, int ldc, float beta) {
    if (g->n == MAX_GROUPS) die("cuda grouped expert GEMM: more than %d experts", MAX_GROUPS);
    int i = g->n++;
    g->ta[i] = ta, g->tb[i] = tb, g->m[i] = m, g->nn[i] = n, g->k[i] = k, g->a[i] = a, g->lda[i] = lda;
    g->b[i] = b, g->ldb[i] = ldb, g->c[i] = c, g->ldc[i] = ldc, g->alpha[i] = 1.0f, g->beta[i] = beta, g->size[i] = 1;
}

static const uint16_t *rows(const float *p, size_t row, size_t width) { return (const uint16_t *)p + row * width; }

/* one group per expert with rows: the kind's GEMM on its rows (a, b: the kind's two row-major operands) */
static int experts(enum kind kind, void *const *outs, void *out, const float *a, const float *const *w,
                   const float *b, const int *off, int E, int K, int M, float beta) {
    if (refused[kind]) return -1;
    if (K % 8 || M % 8) return refuse(kind, "rows not 16-byte aligned");
    static struct groups g;
    g.n = 0;
    for (int e = 0; e < E; e++) {
        int o = off[e], n = off[e + 1] - o;
        if (n <= 0) continue;
        if (kind == FORWARD) /* out [n, M] = x [n, K] w [M, K]^T */
            add(&g, CUBLAS_OP_T, CUBLAS_OP_N, M, n, K, w[e], K, rows(a, o, K), K, (void *)rows((float *)out, o, M), M,
                beta);
        else if (kind == DGRAD) /* dx [n, K] = dout [n, M] w [M, K] */
            add(&g, CUBLAS_OP_N, CUBLAS_OP_N, K, n, M, w[e], K, rows(a, o, M), M, (void *)rows((float *)out, o, K), K,
                beta);
        else /* dw [M, K] += dout [n, M]^T x [n, K]: a = x, b = dout */
            add(&g, CUBLAS_OP_N, CUBLAS_OP_T, K, M, n, rows(a, o, K), K, rows(b, o, M), M, outs[e], K, beta);
    }
    return run(&g, kind);
}

extern "C" int cuda_grouped_expert_forward(float *out, const float *x, const float *const *w, const int *off, int E,
                                           int K, int M) {
    return experts(FORWARD, NULL, out, x, w, NULL, off, E, K, M, 0.0f);
}

extern "C" int cuda_grouped_expert_dgrad(float *dx, const float *dout, const float *const *w, const int *off, int E,
                                         int K, int M, int accumulate) {
    return experts(DGRAD, NULL, dx, dout, w, NULL, off, E, K, M, accumulate ? 1.0f : 0.0f);
}

extern "C" int cuda_grouped_expert_wgrad(float *const *dw, const float *dout, const float *x, const int *off, int E,
                                         int K, int M) {
    return experts(WGRAD, (void *const *)dw, NULL, x, NULL, dout, off, E, K, M, 1.0f);
}
