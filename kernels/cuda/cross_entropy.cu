/* Softmax cross-entropy, whole-vocabulary and vocab-parallel passes: one
 * block per row. Each exponential is a float expf of a difference that is
 * exact enough in float (arguments <= 0 after the max), summed in double as
 * on the CPU; double-precision exp on every logit made this the slowest
 * pass of the head. Templated on the logits' storage T (float, or bf16_t
 * for the bf16 table: kernels/cuda/storage.cuh): the bf16 instances read
 * the stored logits and write the stored gradient in place, the same
 * numbers as widening, the fp32 kernel and rounding, in one pass and
 * without fp32 scratch. Statistics and losses are fp32. */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/storage.cuh"

#define THREADS 512

template <typename T>
__device__ float row_max(const T *row, int V, float *fbuf) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, ld(row, i));
    return block_max(m, fbuf);
}

template <typename T>
__device__ double row_sumexp(const T *row, int V, float maxv, double *dbuf) {
    double s = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += (double)expf(ld(row, i) - maxv);
    return block_sum(s, dbuf);
}

/* logits <- dscale * (softmax - onehot(t)) for row n, or zeros if ignored */
template <typename T>
__device__ void write_grad(T *row, int V, double logz, int t, int ignore, float dscale) {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float g = ignore ? 0.0f : expf(ld(row, i) - (float)logz) * dscale;
        if (!ignore && i == t) g -= dscale;
        st(row, i, g);
    }
}

template <typename T>
__global__ void cross_entropy_k(float *losses, T *logits, const int32_t *targets, int V, float dscale) {
    __shared__ float fbuf[THREADS];
    __shared__ double dbuf[THREADS];
    T *row = logits + (size_t)blockIdx.x * V;
    int tgt = targets[blockIdx.x];
    float maxv = row_max(row, V, fbuf);
    double logz = log(row_sumexp(row, V, maxv, dbuf)) + maxv;
    if (threadIdx.x == 0) losses[blockIdx.x] = tgt < 0 ? 0.0f : (float)(logz - ld(row, tgt));
    __syncthreads(); /* the target logit is read before the row is overwritten */
    if (dscale != 0.0f) write_grad(row, V, logz, tgt, tgt < 0, dscale);
}

template <typename T>
static void cross_entropy_t(float *losses, T *logits, const int32_t *targets, int N, int V, float dscale) {
    if (!N) return;
    cross_entropy_k<<<N, THREADS>>>(losses, logits, targets, V, dscale);
    LAUNCH_CHECK();
}

template <typename T>
__global__ void ce_row_max_k(float *rowmax, const T *logits, int V) {
    __shared__ float fbuf[THREADS];
    float m = row_max(logits + (size_t)blockIdx.x * V, V, fbuf);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

template <typename T>
static void ce_row_max_t(float *rowmax, const T *logits, int N, int V) {
    if (!N) return;
    ce_row_max_k<<<N, THREADS>>>(rowmax, logits, V);
    LAUNCH_CHECK();
}

template <typename T>
__global__ void ce_row_sumexp_k(float *sumexp, float *target_logit, const T *logits, const int32_t *targets,
                                const float *rowmax, int V, int vstart) {
    __shared__ double dbuf[THREADS];
    const T *row = logits + (size_t)blockIdx.x * V;
    double s = row_sumexp(row, V, rowmax[blockIdx.x], dbuf);
    if (threadIdx.x == 0) {
        sumexp[blockIdx.x] = (float)s;
        int t = targets[blockIdx.x] - vstart;
        target_logit[blockIdx.x] = (t >= 0 && t < V) ? ld(row, t) : 0.0f;
    }
}

template <typename T>
static void ce_row_sumexp_t(float *sumexp, float *target_logit, const T *logits, const int32_t *targets,
                            const float *rowmax, int N, int V, int vstart) {
    if (!N) return;
    ce_row_sumexp_k<<<N, THREADS>>>(sumexp, target_logit, logits, targets, rowmax, V, vstart);
    LAUNCH_CHECK();
}

template <typename T>
__global__ void ce_finish_k(float *losses, T *logits, const int32_t *targets, const float *rowmax,
                            const float *sumexp, const float *target_logit, int V, int vstart, float dscale) {
    int n = blockIdx.x;
    double logz = log((double)sumexp[n]) + rowmax[n];
    int ignore = targets[n] < 0;
    if (threadIdx.x == 0) losses[n] = ignore ? 0.0f : (float)(logz - target_logit[n]);
    if (dscale != 0.0f) write_grad(logits + (size_t)n * V, V, logz, targets[n] - vstart, ignore, dscale);
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
