/* cuBLASLt matmuls for the bf16 and fp8 tables: one handle, one 32 MiB
 * workspace, and a plan per distinct call (shape, transposes, leading
 * dimensions, types, beta zero or not, operand alignment) holding the
 * descriptors and the heuristic's first ALGOS candidates (the first that a
 * call accepts is kept), made on first use and reused: a dense model has a
 * few dozen GEMM shapes; MoE experts' token counts change every step, so
 * the table (PLANS entries) evicts round-robin when full. Row-major
 * operands map to cuBLAS's column-major the usual way: C^T = op(B)^T op(A)^T. */
#include <cublasLt.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

#define PLANS 256
#define ALGOS 8
#define WORKSPACE_BYTES ((size_t)32 << 20)

struct plan_key {
    int ta, tb, M, N, K, lda, ldb, ldc, beta_zero, scaled, a_mode, b_mode, fast_accum;
    int a_type, b_type, c_type, align_a, align_b, align_c;
};

struct plan {
    struct plan_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo[ALGOS]; /* the heuristic's candidates, best first */
    int nalgo, cur;                   /* how many; the one in use */
};

static cublasLtHandle_t lt;
static void *workspace;
static struct plan plans[PLANS];
static int nplans, victim;

size_t cuda_blaslt_version(void) { return cublasLtGetVersion(); }

/* the largest power of two (<= 256) dividing the address: what the heuristic may assume */
static int alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % (uintptr_t)al) al >>= 1;
    return al;
}

static void drop_plan(struct plan *p) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

/* 0, or -1 where cuBLASLt has no algorithm (p holds nothing then) */
static int make_plan(struct plan *p, const struct plan_key *k) {
    if (!lt) {
        CUBLAS_CHECK(cublasLtCreate(&lt));
        CUDA_CHECK(cudaMalloc(&workspace, WORKSPACE_BYTES));
    }
    p->key = *k;
    /* cuBLAS's A is our B (m = N), its B our A (n = M) */
    cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, (cudaDataType_t)k->b_type, k->tb ? k->K : k->N,
                                            k->tb ? k->N : k->K, k->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, (cudaDataType_t)k->a_type, k->ta ? k->M : k->K,
                                            k->ta ? k->K : k->M, k->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, (cudaDataType_t)k->c_type, k->N, k->M, k->ldc));
    cublasLtMatmulPreference_t pref;
    size_t ws = WORKSPACE_BYTES;
    uint32_t aa = (uint32_t)k->align_b, ab = (uint32_t)k->align_a, ac = (uint32_t)k->align_c;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
    if (k->fast_accum) {
        int8_t on = 1;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on));
    }
    if (k->scaled) { /* the heuristic must see the scale pointers' presence; any device address will do here */
        const float *dummy = (const float *)workspace;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy));
        if (k->a_mode || k->b_mode) { /* block scales; cuBLAS's A is our B */
#if CUBLAS_VERSION >= 120900
            int32_t ma = k->b_mode, mb = k->a_mode;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
#else /* headers before 12.9 have no block-scaled GEMMs: no plan (the caller's reference path) */
            drop_plan(p);
            CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
            return -1;
#endif
        }
    }
    cublasLtMatmulHeuristicResult_t result[ALGOS];
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, ALGOS, result, &found);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st); /* NOT_SUPPORTED: no algorithm, like found = 0 */
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || !found) {
        drop_plan(p);
        return -1;
    }
    for (int i = 0; i < found; i++) p->algo[i] = result[i].algo;
    p->nalgo = found, p->cur = 0;
    return 0;
}

int lt_matmul(int transA, int transB, int M, int N, int K, const void *A, cudaDataType_t a_type, int lda, const void *B,
               cudaDataType_t b_type, int ldb, float beta, void *C, cudaDataType_t c_type, int ldc,
               const float *a_scale, const float *b_scale, int a_mode, int b_mode, int fast_accum) {
#if CUBLAS_VERSION >= 120900
    static_assert((int)LT_SCALE_VEC128 == (int)CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F &&
                      (int)LT_SCALE_BLK128 == (int)CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
                      (int)LT_SCALE_TENSOR == (int)CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                  "lt_scale_mode is cuBLASLt's cublasLtMatmulMatrixScale_t");
#endif
    if (!M || !N) return 0;
    if ((a_scale != NULL) != (b_scale != NULL)) die("lt_matmul: one operand scaled, the other not");
    if (!K) { /* an empty contraction (an expert without tokens): C = beta C */
        size_t es = c_type == CUDA_R_32F ? 4 : c_type == CUDA_R_16BF ? 2 : 1;
        if (beta == 0.0f) CUDA_CHECK(cudaMemset2D(C, (size_t)ldc * es, 0, (size_t)N * es, (size_t)M));
        else if (beta != 1.0f) die("lt_matmul: beta %g with an empty contraction", beta);
        return 0;
    }
    /* all ints, no padding: compared with memcmp */
    if (!a_scale) a_mode = b_mode = LT_SCALE_TENSOR;
    struct plan_key key = {transA,      transB,      M,           N,           K,           lda,
                           ldb,         ldc,         beta == 0.0f, a_scale != NULL, a_mode,   b_mode,
                           fast_accum != 0, (int)a_type, (int)b_type, (int)c_type, alignment(A), alignment(B),
                           alignment(C)};
    struct plan *p = NULL;
    for (int i = 0; i < nplans && !p; i++)
        if (!memcmp(&plans[i].key, &key, sizeof key)) p = &plans[i];
    if (!p) { /* a new plan, in a free entry or the oldest one's (queued matmuls keep no reference to it) */
        int at = nplans < PLANS ? nplans : victim++ % PLANS;
        if (at < nplans) drop_plan(&plans[at]);
        if (make_plan(&plans[at], &key)) {
            if (at < nplans) plans[at] = plans[--nplans]; /* the entry is empty now: move the last one in */
            return -1;
        }
        if (at == nplans) nplans++;
        p = &plans[at];
    }
    if (a_scale) { /* cuBLAS's A is our B */
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale,
                                                    sizeof b_scale));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale,
                                                    sizeof a_scale));
    }
    float alpha = 1.0f;
    /* An algorithm the heuristic offered can still be refused at the call (seen on an H200 with
     * cuBLASLt 13.1 for FP8, 2026-11-26): take the next candidate; none left is -1, nothing written. */
    for (;;) {
        cublasStatus_t st = cublasLtMatmul(lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                           &p->algo[p->cur], workspace, WORKSPACE_BYTES, 0);
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
            CUBLAS_CHECK(st);
            return 0;
        }
        if (p->cur + 1 >= p->nalgo) {
            static int said;
            if (!said++)
                fprintf(stderr,
                        "mtrain: cuBLASLt refused all %d algorithms it offered for a %dx%dx%d matmul (types %d, %d -> "
                        "%d); taking the slower path (CUBLASLT_LOG_MASK=31 logs cuBLASLt's calls)\n",
                        p->nalgo, M, N, K, (int)a_type, (int)b_type, (int)c_type);
            return -1;
        }
        p->cur++;
    }
}
