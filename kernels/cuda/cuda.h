/* CUDA backend internals (fp32): error checks, the one cuBLAS handle, launch
 * helpers and block reductions shared by the kernel files. Included by .cu
 * files only; model code sees just the struct backend table. */
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/ops.h"

extern "C" {
#include "config/common.h"
}

#define CUDA_CHECK(call)                                                                                          \
    do {                                                                                                          \
        cudaError_t err_ = (call);                                                                                \
        if (err_ != cudaSuccess) die("%s:%d: CUDA: %s (%s)", __FILE__, __LINE__, cudaGetErrorString(err_), #call); \
    } while (0)
#define CUBLAS_CHECK(call)                                                                                     \
    do {                                                                                                       \
        cublasStatus_t st_ = (call);                                                                           \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                                      \
            die("%s:%d: cuBLAS: %s (%s)", __FILE__, __LINE__, cublasGetStatusString(st_), #call);               \
    } while (0)
/* after every kernel launch: a bad configuration is reported where it happened */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* The cuBLAS handle, created on first use (fp32 math, or TF32 tensor cores
 * when cuda_set_tf32(1) was called before). */
cublasHandle_t cuda_blas(void);
/* Device scratch of at least bytes, reused across calls (grows, never
 * shrinks): one buffer per slot, for pieces needed at the same time. */
enum scratch_slot { SCRATCH_WORK, SCRATCH_POINTERS, SCRATCH_MOE, SCRATCH_SLOTS };
void *cuda_scratch(enum scratch_slot slot, size_t bytes);

/* Row-major C[M,N] = alpha * op(A) op(B) + beta * C, with op(A) [M,K] and
 * op(B) [K,N]; lda/ldb/ldc are row strides. batch > 1 repeats it at the given
 * element strides. */
void gemm_rm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, long long strideA,
             const float *B, int ldb, long long strideB, float beta, float *C, int ldc, long long strideC,
             int batch);

/* Row-major C[M,N] = op(A) op(B) (times *a_scale * *b_scale when given:
 * device scalars, FP8 operands) + beta C through cuBLASLt with fp32
 * accumulation, the algorithm chosen once per shape (kernels/cuda/lt_gemm.cu).
 * fast_accum: FP8 only, cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM (the
 * tensor cores' own accumulation, without periodic promotion to fp32).
 * 0, or -1 (nothing done) where cuBLASLt has no algorithm for it. */
/* cublasLtGetVersion(): major * 10000 + minor * 100 + patch */
size_t cuda_blaslt_version(void);
/* How an FP8 operand's scales are laid out (cuBLASLt's
 * cublasLtMatmulMatrixScale_t values; kernels/cuda/fp8_cast.cuh says where
 * each block's scale sits): one for the tensor, one per 128 values along
 * the contraction, one per 128 x 128 block (cuBLASLt 12.9 and later, Hopper). */
enum lt_scale_mode { LT_SCALE_TENSOR = 0, LT_SCALE_VEC128 = 4, LT_SCALE_BLK128 = 5 };
/* a_mode, b_mode: the scales' lt_scale_mode (scaled operands only) */
int lt_matmul(int transA, int transB, int M, int N, int K, const void *A, cudaDataType_t a_type, int lda, const void *B,
               cudaDataType_t b_type, int ldb, float beta, void *C, cudaDataType_t c_type, int ldc,
               const float *a_scale, const float *b_scale, int a_mode, int b_mode, int fast_accum);

/* The ops of the other kernel files (semantics in kernels/ops.h). */
void cuda_embedding_forward(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V);
void cuda_embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart, int V);
void cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
void cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                           int N, int C, int accumulate);
void cuda_rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse);
void cuda_copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate);
void cuda_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                            int H, int KVH, int D, int Dv);
size_t cuda_attention_state_floats(int B, int H, int T);
void cuda_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B, int c,
                                  int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1, int first);
void cuda_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                   int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1);
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *att,
                             const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D, int Dv);
void cuda_attention_decode(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H, int KVH,
                           int D, int Dv);
void cuda_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
void cuda_moe_route_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E, int k);
void cuda_moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                             const float *w, const float *aux_coef, float z_scale, int n, int E, int k, int T, int r0);
void cuda_moe_route_sigmoid_forward(float *scores, int32_t *idx, float *w, const float *logits, const float *bias, int n,
                                    int E, int k, int n_group, int topk_group, float scaling);
void cuda_moe_route_sigmoid_backward(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                     const float *w, const float *aux_coef, int n, int E, int k, float scaling, int T,
                                     int r0);
void cuda_bf16_moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                           int accumulate);
void cuda_bf16_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                                    const float *w, int n, int k, int C);
void cuda_moe_route_counts(float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B);
void cuda_moe_route_balance(float *coef, double *metrics, const float *counts_all, const float *probs, const float *lse,
                            int n, int E, int k, int T, int r0, int B, int tp, int tp_rank, int sigmoid,
                            float aux_scale, long cap);
void cuda_moe_dispatch(int32_t *pos, int32_t *send_rows, float *expert_counts, const int32_t *idx,
                       const float *counts_all, int n, int k, int E, int T, int r0, int B, int tp_rank, long cap);
void cuda_moe_expert_order(int32_t *order, int32_t *inverse, int32_t *offsets, const float *in, int ep, int El,
                           int rows);
void cuda_gather_rows(float *out, const float *x, const int32_t *rows, int n, int C);
void cuda_moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                      int accumulate);
void cuda_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                               const float *w, int n, int k, int C);
void cuda_cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale);
void cuda_ce_row_max(float *rowmax, const float *logits, int N, int V);
void cuda_ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                        const float *rowmax, int N, int V, int vstart);
void cuda_ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                    const float *target_logit, int N, int V, int vstart, float dscale);
void cuda_add(float *dst, const float *src, size_t n);
void cuda_scale(float *x, float s, size_t n);
/* the same kernels on bf16 activation storage (kernels/cuda/storage.cuh), for the bf16 table */
void cuda_bf16_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
void cuda_bf16_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                const float *rstd, int N, int C, int accumulate);
void cuda_bf16_rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse);
void cuda_bf16_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void cuda_bf16_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                               size_t n);
void cuda_bf16_add(float *dst, const float *src, size_t n);
void cuda_bf16_embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                                  int V);
void cuda_bf16_cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale);
void cuda_bf16_ce_row_max(float *rowmax, const float *logits, int N, int V);
void cuda_bf16_ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                             const float *rowmax, int N, int V, int vstart);
void cuda_bf16_ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax,
                         const float *sumexp, const float *target_logit, int N, int V, int vstart, float dscale);
void cuda_bf16_scale(float *x, float s, size_t n);
/* flash attention on bf16 storage (kernels/cuda/flash_attention.cu): usable
 * for these head dims on this device (16-byte aligned pointers)? state:
 * lse [B*H, T] */
int cuda_flash_attention_usable(int D, int Dv);
void cuda_flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                  int H, int KVH, int D, int Dv);
void cuda_flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                   int H, int KVH, int D, int Dv);
/* context parallelism's block ops (kernels/ops.h attention_block_forward /
 * _backward) on bf16 q, k, v, out, dout with fp32 o, lse, dq, dk, dv: the
 * flash kernels' block form, and the choice (1 done, 0 not applicable) */
void cuda_flash_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B,
                                        int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1,
                                        int first);
void cuda_flash_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                         const float *lse, const float *q, const float *k, const float *v, int B,
                                         int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1);
int cuda_fast_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B,
                                      int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1,
                                      int first);
int cuda_fast_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                       const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                       int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1);
/* attention on bf16 storage by cuDNN or the flash kernels, as
 * kernels/cuda/attention_choice.cu chooses: 1 done, 0 neither applies (the
 * caller runs the reference path). out NULL (backward): 0. */
int cuda_fast_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                int H, int KVH, int D, int Dv);
int cuda_fast_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                 const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                 int H, int KVH, int D, int Dv);
/* FP8 GEMMs on FP8 tensor cores (kernels/cuda/fp8_gemm.cu) on bf16
 * storage, per-tensor (current or delayed) or block scaling: usable for
 * this shape? (K, M multiples of 16; for block scaling of 512: token rows are padded to 4;
 * not turned off) */
int cuda_fp8_gemm_usable(int N, int K, int M, const void *const *outs, int nouts, int block);
int cuda_fp8_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate,
                     struct fp8_recipe recipe);
int cuda_fp8_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K, int M,
                      int accumulate_dx, struct fp8_recipe recipe);
/* fold the amax bits *amax (device) into the delayed-scaling record *out (device), a NaN sticking */
void cuda_fp8_record_amax(float *out, const unsigned *amax);
/* The weights changed (the optimizer's step): the FP8 GEMMs drop the
 * weight codes they kept from a forward for its backward. */
void cuda_fp8_weights_changed(void);
/* A forward of w took the reference path: codes kept from an earlier
 * forward of w are not used for its backward. */
void cuda_fp8_forget_weight(const float *w);
double cuda_sum(const float *x, size_t n);
double cuda_sum_squares(const float *x, size_t n);
void cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, float grad_scale, int step, uint16_t *work);

static inline unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535u * 32u ? b : 65535u * 32u);
}

#include "kernels/cuda/block_reduce.cuh"
