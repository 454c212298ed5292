/* Softmax cross-entropy, whole-vocabulary and vocab-parallel passes: one
 * block per row. Each exponential is a float expf of a difference that is
 * exact enough in float (arguments <= 0 after the max), summed in double as
 * on the CPU; double-precision exp on every logit made this the slowest
 * pass of the head. */
#include <math.h>

#include "kernels/cuda/cuda.h"

#define THREADS 512

__device__ float row_max(const float *row, int V, float *fbuf) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, row[i]);
    return block_max(m, fbuf);
}

__device__ double row_sumexp(const float *row, int V, float maxv, double *dbuf) {
    double s = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += (double)expf(row[i] - maxv);
    return block_sum(s, dbuf);
}

/* logits <- dscale * (softmax - onehot(t)) for row n, or zeros if ignored */
__device__ void write_grad(float *row, int V, double logz, int t, int ignore, float dscale) {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float g = ignore ? 0.0f : expf(row[i] - (float)logz) * dscale;
        if (!ignore && i == t) g -= dscale;
        row[i] = g;
    }
}

__global__ void cross_entropy_k(float *losses, float *logits, const int32_t *targets, int V, float dscale) {
    __shared__ float fbuf[THREADS];
    __shared__ double dbuf[THREADS];
    float *row = logits + (size_t)blockIdx.x * V;
    int tgt = targets[blockIdx.x];
    float maxv = row_max(row, V, fbuf);
    double logz = log(row_sumexp(row, V, maxv, dbuf)) + maxv;
    if (threadIdx.x == 0) losses[blockIdx.x] = tgt < 0 ? 0.0f : (float)(logz - row[tgt]);
    __syncthreads(); /* the target logit is read before the row is overwritten */
    if (dscale != 0.0f) write_grad(row, V, logz, tgt, tgt < 0, dscale);
}

void cuda_cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
    if (!N) return;
    cross_entropy_k<<<N, THREADS>>>(losses, logits, targets, V, dscale);
    LAUNCH_CHECK();
}

__global__ void ce_row_max_k(float *rowmax, const float *logits, int V) {
    __shared__ float fbuf[THREADS];
    float m = row_max(logits + (size_t)blockIdx.x * V, V, fbuf);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

void cuda_ce_row_max(float *rowmax, const float *logits, int N, int V) {
    if (!N) return;
    ce_row_max_k<<<N, THREADS>>>(rowmax, logits, V);
    LAUNCH_CHECK();
}

__global__ void ce_row_sumexp_k(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                                const float *rowmax, int V, int vstart) {
    __shared__ double dbuf[THREADS];
    const float *row = logits + (size_t)blockIdx.x * V;
    double s = row_sumexp(row, V, rowmax[blockIdx.x], dbuf);
    if (threadIdx.x == 0) {
        sumexp[blockIdx.x] = (float)s;
        int t = targets[blockIdx.x] - vstart;
        target_logit[blockIdx.x] = (t >= 0 && t < V) ? row[t] : 0.0f;
    }
}

void cuda_ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                        const float *rowmax, int N, int V, int vstart) {
    if (!N) return;
    ce_row_sumexp_k<<<N, THREADS>>>(sumexp, target_logit, logits, targets, rowmax, V, vstart);
    LAUNCH_CHECK();
}

__global__ void ce_finish_k(float *losses, float *logits, const int32_t *targets, const float *rowmax,
                            const float *sumexp, const float *target_logit, int V, int vstart, float dscale) {
    int n = blockIdx.x;
    double logz = log((double)sumexp[n]) + rowmax[n];
    int ignore = targets[n] < 0;
    if (threadIdx.x == 0) losses[n] = ignore ? 0.0f : (float)(logz - target_logit[n]);
    if (dscale != 0.0f) write_grad(logits + (size_t)n * V, V, logz, targets[n] - vstart, ignore, dscale);
}

void cuda_ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                    const float *target_logit, int N, int V, int vstart, float dscale) {
    if (!N) return;
    ce_finish_k<<<N, THREADS>>>(losses, logits, targets, rowmax, sumexp, target_logit, V, vstart, dscale);
    LAUNCH_CHECK();
}
