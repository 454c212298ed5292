/* Softmax cross-entropy, whole-vocabulary and vocab-parallel passes: one
 * block per row (the kernels: kernels/cuda/cross_entropy.cuh). Each
 * exponential is a float expf of a difference that is exact enough in
 * float (arguments <= 0 after the max), summed in double as on the CPU;
 * double-precision exp on every logit made this the slowest pass of the
 * head. Templated on the logits' storage T (float, or bf16_t for the bf16
 * table: kernels/cuda/storage.cuh): the bf16 instances read the stored
 * logits and write the stored gradient in place, the same numbers as
 * widening, the fp32 kernel and rounding, without fp32 scratch. Statistics
 * and losses are fp32. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cross_entropy.cuh"

#define THREADS 512

template <typename T>
static void cross_entropy_t(float *losses, T *logits, const int32_t *targets, int N, int V, float dscale) {
    if (!N) return;
    cross_entropy_k<T, THREADS><<<N, THREADS>>>(losses, logits, targets, V, dscale);
    LAUNCH_CHECK();
}

template <typename T>
static void ce_row_max_t(float *rowmax, const T *logits, int N, int V) {
    if (!N) return;
    ce_row_max_k<T, THREADS><<<N, THREADS>>>(rowmax, logits, V);
    LAUNCH_CHECK();
}

template <typename T>
static void ce_row_sumexp_t(float *sumexp, float *target_logit, const T *logits, const int32_t *targets,
                            const float *rowmax, int N, int V, int vstart) {
    if (!N) return;
    ce_row_sumexp_k<T, THREADS><<<N, THREADS>>>(sumexp, target_logit, logits, targets, rowmax, V, vstart);
    LAUNCH_CHECK();
}

template <typename T>
static void ce_finish_t(float *losses, T *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                        const float *target_logit, int N, int V, int vstart, float dscale) {
    if (!N) return;
    ce_finish_k<<<N, THREADS>>>(losses, logits, targets, rowmax, sumexp, target_logit, V, vstart, dscale);
    LAUNCH_CHECK();
}

void cuda_cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
    cross_entropy_t(losses, logits, targets, N, V, dscale);
}
void cuda_ce_row_max(float *rowmax, const float *logits, int N, int V) { ce_row_max_t(rowmax, logits, N, V); }
void cuda_ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                        const float *rowmax, int N, int V, int vstart) {
    ce_row_sumexp_t(sumexp, target_logit, logits, targets, rowmax, N, V, vstart);
}
void cuda_ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                    const float *target_logit, int N, int V, int vstart, float dscale) {
    ce_finish_t(losses, logits, targets, rowmax, sumexp, target_logit, N, V, vstart, dscale);
}

/* the bf16 table's: logits are N x V bf16 values in a float*-typed buffer */
void cuda_bf16_cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
    cross_entropy_t(losses, (bf16_t *)logits, targets, N, V, dscale);
}
void cuda_bf16_ce_row_max(float *rowmax, const float *logits, int N, int V) {
    ce_row_max_t(rowmax, (const bf16_t *)logits, N, V);
}
void cuda_bf16_ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                             const float *rowmax, int N, int V, int vstart) {
    ce_row_sumexp_t(sumexp, target_logit, (const bf16_t *)logits, targets, rowmax, N, V, vstart);
}
void cuda_bf16_ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax,
                         const float *sumexp, const float *target_logit, int N, int V, int vstart, float dscale) {
    ce_finish_t(losses, (bf16_t *)logits, targets, rowmax, sumexp, target_logit, N, V, vstart, dscale);
}
