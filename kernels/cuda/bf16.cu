/* The CUDA backend at bf16 precision: kernels/bf16_table.h on the fp32 CUDA
 * table (ops widened to fp32, computed by the tested fp32 kernels, rounded
 * where stored), with the storage kernels below, cuBLASLt bf16 GEMMs, flash
 * attention, FP8 tensor-core GEMMs (the fp8 table) and the element-wise
 * kernels' bf16 instances (RMSNorm, RoPE, SwiGLU, add, scale:
 * kernels/cuda/storage.cuh) in place of their widening versions; each is
 * checked against the widening path and the CPU bf16 table. The rounding
 * is the host's (kernels/bf16.h) bit for bit, NaN handling included. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/fp8.h"

#define THREADS 256

__global__ void widen_k(float *d, const uint16_t *s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = widen1(s[i]);
}

__global__ void narrow_k(uint16_t *d, const float *s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = bits_rne(s[i]);
}

static void bf16_widen(float *dst, const float *src, size_t n) {
    if (!n) return;
    widen_k<<<blocks_for(n, THREADS), THREADS>>>(dst, (const uint16_t *)src, n);
    LAUNCH_CHECK();
}

static void bf16_narrow(float *dst, const float *src, size_t n) {
    if (!n) return;
    narrow_k<<<blocks_for(n, THREADS), THREADS>>>((uint16_t *)dst, src, n);
    LAUNCH_CHECK();
}

/* one block per token: its row of the bf16 table, or zeros outside the slice */
__global__ void embedding_k(uint16_t *out, const int32_t *tokens, const uint16_t *table, int C, int vstart, int V) {
    int n = blockIdx.x, row = tokens[n] - vstart;
    uint16_t *o = out + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (row >= 0 && row < V) ? table[(size_t)row * C + c] : 0;
}

static void bf16_embedding(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V) {
    if (N == 0) return;
    embedding_k<<<N, THREADS>>>((uint16_t *)out, tokens, (const uint16_t *)table, C, vstart, V);
    LAUNCH_CHECK();
}

__global__ void gather_k(uint16_t *out, const uint16_t *x, const int32_t *rows, int C) {
    int i = blockIdx.x;
    const uint16_t *s = x + (size_t)rows[i] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[(size_t)i * C + c] = s[c];
}

static void bf16_gather_rows(float *out, const float *x, const int32_t *rows, int n, int C) {
    if (n == 0) return;
    gather_k<<<n, THREADS>>>((uint16_t *)out, (const uint16_t *)x, rows, C);
    LAUNCH_CHECK();
}

/* a copy of bf16 values is exact; accumulating adds in fp32 and rounds once */
__global__ void copy_cols_k(uint16_t *d, int ldd, const uint16_t *s, int lds, int rows, int cols, int accumulate) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, c = i % cols;
        uint16_t *o = d + r * ldd + c;
        uint16_t v = s[r * lds + c];
        *o = accumulate ? bits_rne(widen1(*o) + widen1(v)) : v;
    }
}

static void bf16_copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate) {
    size_t n = (size_t)rows * cols;
    if (!n) return;
    copy_cols_k<<<blocks_for(n, THREADS), THREADS>>>((uint16_t *)dst, ldd, (const uint16_t *)src, lds, rows, cols,
                                                     accumulate);
    LAUNCH_CHECK();
}

/* Row-major C[M,N] (bf16, or fp32 with c_fp32) = op(A) op(B) + beta C on
 * bf16 A and B with fp32 accumulation (tensor cores): cuBLASLt with a plan
 * cached per shape (kernels/cuda/lt_gemm.cu); where it has no algorithm
 * (an odd alignment), cuBLAS's GemmEx, the column-major mapping of
 * common.cu's gemm_rm. */
static void gemm_bf16(int transA, int transB, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc, int c_fp32) {
    cudaDataType_t ct = c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    if (!lt_matmul(transA, transB, M, N, K, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, beta, C, ct, ldc, NULL, NULL, 0, 0, 0))
        return;
    cublasOperation_t ta = transA ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(cuda_blas(), tb, ta, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C,
                              ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void bf16_matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate) {
    if (N && M) gemm_bf16(0, 1, N, M, K, x, K, w, K, accumulate ? 1.0f : 0.0f, out, M, 0);
}

/* dx stored in bf16; dw, the fp32 gradient, accumulated straight from the GEMM (beta 1) */
static void bf16_matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                                 int M, int accumulate_dx) {
    if (dx && N && K) gemm_bf16(0, 0, N, K, M, dout, M, w, K, accumulate_dx ? 1.0f : 0.0f, dx, K, 0);
    if (dw && M && K) gemm_bf16(1, 0, M, K, N, dout, M, x, K, 1.0f, dw, K, 1);
}
#define BF16_OWN_MATMUL

/* RMSNorm, RoPE, SwiGLU, add, scale and the embedding gradient: the fp32 kernels' bf16 instances
 * (kernels/cuda/storage.cuh), one pass each instead of widen, op, narrow */
#define BF16_OWN_ELEMENTWISE
static void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    cuda_bf16_rmsnorm_forward(out, rstd, x, w, N, C, eps);
}
static void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                             int N, int C, int accumulate) {
    cuda_bf16_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C, accumulate);
}
static void rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    cuda_bf16_rope(x, cos, sin, B, T, H, D, inverse);
}
static void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    cuda_bf16_swiglu_forward(out, gate, up, n);
}
static void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    cuda_bf16_swiglu_backward(dgate, dup, dout, gate, up, n);
}
static void add(float *dst, const float *src, size_t n) { cuda_bf16_add(dst, src, n); }
static void embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                               int V) {
    cuda_bf16_embedding_backward(dtable, tokens, dout, N, C, vstart, V);
}

/* the MoE combine and its backward on bf16 rows (kernels/cuda/moe_combine.cuh): no fp32 copy of the k x tokens rows */
#define BF16_OWN_COMBINE
static void moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                        int accumulate) {
    cuda_bf16_moe_combine(out, y, pos, w, n, k, C, accumulate);
}
static void moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                                 const float *w, int n, int k, int C) {
    cuda_bf16_moe_combine_backward(dy, dw, dout, y, pos, w, n, k, C);
}

/* cross-entropy on the stored logits, gradient stored in place (kernels/cuda/cross_entropy.cu) */
#define BF16_OWN_CROSS_ENTROPY
static void cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
    cuda_bf16_cross_entropy(losses, logits, targets, N, V, dscale);
}
static void ce_row_max(float *rowmax, const float *logits, int N, int V) { cuda_bf16_ce_row_max(rowmax, logits, N, V); }
static void ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                          const float *rowmax, int N, int V, int vstart) {
    cuda_bf16_ce_row_sumexp(sumexp, target_logit, logits, targets, rowmax, N, V, vstart);
}
static void ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                      const float *target_logit, int N, int V, int vstart, float dscale) {
    cuda_bf16_ce_finish(losses, logits, targets, rowmax, sumexp, target_logit, N, V, vstart, dscale);
}
static void scale(float *x, float s, size_t n) { cuda_bf16_scale(x, s, n); }

/* Attention: cuDNN's fused attention or the flash kernels where they apply
 * (kernels/cuda/attention_choice.cu says which), else the widening
 * reference path. All keep the same state (each row's log-sum-exp), so the
 * choice may differ between forward and backward. */
#define BF16_OWN_ATTENTION
static void ref_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B,
                                  int T, int H, int KVH, int D, int Dv);
static void ref_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *att, const float *q, const float *k, const float *v, int B, int T,
                                   int H, int KVH, int D, int Dv);

static void attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                              int H, int KVH, int D, int Dv) {
    if (!cuda_fast_attention_forward(out, att, q, k, v, B, T, H, KVH, D, Dv))
        ref_attention_forward(out, att, q, k, v, B, T, H, KVH, D, Dv);
}

static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *att,
                               const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D,
                               int Dv) {
    if (!cuda_fast_attention_backward(dq, dk, dv, dout, out, att, q, k, v, B, T, H, KVH, D, Dv))
        ref_attention_backward(dq, dk, dv, dout, out, att, q, k, v, B, T, H, KVH, D, Dv);
}

/* context parallelism's block ops: the flash kernels' block form where it applies, else the widening path onto
 * the fp32 block kernels */
#define BF16_OWN_ATTENTION_BLOCK
static void ref_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B,
                                        int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1,
                                        int first);
static void ref_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                         const float *lse, const float *q, const float *k, const float *v, int B,
                                         int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1);
static void attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B, int c,
                                    int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1, int first) {
    if (!cuda_fast_attention_block_forward(o, lse, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0, k1, first))
        ref_attention_block_forward(o, lse, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0, k1, first);
}
static void attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                     const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                     int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1) {
    if (!cuda_fast_attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0, k1))
        ref_attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0, k1);
}

static double mem(void) { return cuda_backend.device_mem_mib(); }

/* Dense bf16 tensor-core peaks from NVIDIA's datasheets, by device name. */
static double bf16_peak(int unused) {
    (void)unused;
    static const struct { const char *name; double tflops; } table[] = {
        {"H100 PCIe", 756}, {"H100 NVL", 835}, {"H100", 989}, /* SXM (HBM3) */
        {"H200", 989},      {"A100", 312},     {"L40S", 362},
    };
    cudaDeviceProp prop;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(prop.name, table[i].name)) return table[i].tflops;
    return 0;
}

/* FP8 quantise-dequantise in blocks (kernels/cpu/bf16.c's fp8_qdq_blocks,
 * the same rounding functions): each block's amax as the max of the bits
 * (non-negative floats order like their bits; NaN's bits beat infinity's),
 * then every element through its block's code. The amax: a warp whose 32
 * elements share a block takes their max by shuffles and makes one
 * atomicMax; one block for the whole tensor (per-tensor scaling) keeps a
 * running max per thread over its grid-stride loop, so the one address
 * gets one atomic per warp, not per element. Launched with a multiple of
 * 32 threads per block; every lane runs the same number of iterations. */
__global__ void block_amax_k(unsigned *amax, const float *x, int rows, int cols, int br, int bc, int nbc, int single) {
    size_t n = (size_t)rows * cols, stride = (size_t)gridDim.x * blockDim.x, iters = (n + stride - 1) / stride;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned run = 0;
    for (size_t it = 0; it < iters; it++, i += stride) {
        unsigned v = 0;
        long long b = -1;
        if (i < n) {
            int r = (int)(i / cols), c = (int)(i % cols);
            b = (long long)(r / br) * nbc + c / bc;
            v = __float_as_uint(fabsf(x[i]));
        }
        if (single) {
            run = max(run, v);
            continue;
        }
        long long b0 = __shfl_sync(0xffffffffu, b, 0);
        if (__all_sync(0xffffffffu, b == b0)) {
            v = warp_max_bits(v);
            if (b0 >= 0 && (threadIdx.x & 31) == 0) atomicMax(amax + b0, v);
        } else if (b >= 0) {
            atomicMax(amax + b, v);
        }
    }
    if (single) {
        run = warp_max_bits(run);
        if ((threadIdx.x & 31) == 0) atomicMax(amax, run);
    }
}

__global__ void block_qdq_k(float *x, const unsigned *amax, int rows, int cols, int br, int bc, int nbc, int format,
                            int k_fixed) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / cols), c = (int)(i % cols);
        float a = __uint_as_float(amax[(size_t)(r / br) * nbc + c / bc]);
        if (isfinite(a)) x[i] = fp8_qdq(x[i], k_fixed == FP8_SCALE_CURRENT ? fp8_scale_exp(a, format) : k_fixed, format);
    }
}

static void fp8_qdq_blocks(float *x, int rows, int cols, int br, int bc, int format, int k_fixed, float *amax_out) {
    size_t n = (size_t)rows * cols;
    if (!n) return;
    int nbc = (cols + bc - 1) / bc;
    size_t nb = (size_t)((rows + br - 1) / br) * nbc;
    static unsigned *amax;
    static size_t cap;
    if (nb > cap) {
        if (amax) cuda_backend.free(amax);
        amax = (unsigned *)cuda_backend.alloc(sizeof(unsigned) * nb);
        cap = nb;
    }
    cuda_backend.zero(amax, sizeof(unsigned) * nb);
    unsigned grid = nb == 1 ? (blocks_for(n, THREADS) < 1024 ? blocks_for(n, THREADS) : 1024) : blocks_for(n, THREADS);
    block_amax_k<<<grid, THREADS>>>(amax, x, rows, cols, br, bc, nbc, nb == 1);
    LAUNCH_CHECK();
    if (amax_out) {
        CHECK(nb == 1);
        cuda_fp8_record_amax(amax_out, amax);
    }
    block_qdq_k<<<blocks_for(n, THREADS), THREADS>>>(x, amax, rows, cols, br, bc, nbc, format, k_fixed);
    LAUNCH_CHECK();
}

/* FP8 GEMMs on FP8 tensor cores (kernels/cuda/fp8_gemm.cu) where the shape
 * allows it (K and M multiples of 16, any N; for block scaling K and M
 * multiples of 512; token rows padded to 4) and
 * cuBLASLt has an algorithm; other shapes take the reference path
 * (quantise-dequantise, fp32 GEMM). */
#define BF16_OWN_FP8
static void ref_fp8_matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate,
                                   struct fp8_recipe recipe);
static void ref_fp8_matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N,
                                    int K, int M, int accumulate_dx, struct fp8_recipe recipe);

static void fp8_matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate,
                               struct fp8_recipe recipe) {
    const void *outs[] = {out};
    if (!cuda_fp8_gemm_usable(N, K, M, outs, 1, recipe.scaling == FP8_SCALING_BLOCK)) {
        cuda_fp8_forget_weight(w); /* codes kept from an earlier forward may not be w's now */
        backend_count_fp8_reference();
        ref_fp8_matmul_forward(out, x, w, N, K, M, accumulate, recipe);
    } else if (cuda_fp8_forward(out, x, w, N, K, M, accumulate, recipe)) {
        backend_count_fp8_reference();
        ref_fp8_matmul_forward(out, x, w, N, K, M, accumulate, recipe);
    }
}

static void fp8_matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                                int M, int accumulate_dx, struct fp8_recipe recipe) {
    const void *outs[] = {dx, dw};
    int rc = cuda_fp8_gemm_usable(N, K, M, outs, 2, recipe.scaling == FP8_SCALING_BLOCK)
                 ? cuda_fp8_backward(dx, dw, dout, x, w, N, K, M, accumulate_dx, recipe)
                 : -1;
    if (rc) /* 1: dx is done, the weight gradient alone takes the reference path */
        backend_count_fp8_reference(),
        ref_fp8_matmul_backward(rc > 0 ? NULL : dx, dw, dout, x, w, N, K, M, accumulate_dx, recipe);
}

/* the experts' GEMMs at once: cuBLAS's grouped call (kernels/cuda/expert_gemm.cu) under
 * MTRAIN_EXPERT_GEMM=grouped, until a measurement makes it the default (scripts/bench/bench_expert_gemm.c);
 * a grouped GEMM cuBLAS refuses runs per expert in model/moe.c */
static int experts_grouped(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("MTRAIN_EXPERT_GEMM");
        on = e && !strcmp(e, "grouped");
    }
    return on;
}
static int experts_matmul_forward(float *out, const float *x, const float *const *w, const int32_t *off, int E, int K,
                                  int M) {
    return experts_grouped() ? cuda_grouped_expert_forward(out, x, w, off, E, K, M) : -1;
}
static int experts_matmul_backward(float *dx, float *const *dw, const float *dout, const float *x,
                                   const float *const *w, const int32_t *off, int E, int K, int M, int accumulate_dx) {
    if (!experts_grouped()) return -1;
    return dx ? cuda_grouped_expert_dgrad(dx, dout, w, off, E, K, M, accumulate_dx)
              : cuda_grouped_expert_wgrad(dw, dout, x, off, E, K, M);
}
#define BF16_EXPERTS_FORWARD experts_matmul_forward
#define BF16_EXPERTS_BACKWARD experts_matmul_backward

#define BF16_WEIGHTS_CHANGED cuda_fp8_weights_changed
#define BF16_TABLE cuda_bf16_backend
#define BF16_FP8_TABLE cuda_fp8_backend
#define BF16_INNER cuda_backend
#define BF16_HOST_VIEW NULL
#define BF16_NAME "cuda"
#define BF16_MEM mem
#define BF16_PEAK bf16_peak
#include "kernels/bf16_table.h"
