/* Softmax cross-entropy kernels of kernels/cuda/cross_entropy.cu: one block
 * per row of logits, templated on the logits' storage T (float, or bf16_t
 * for the bf16 table: kernels/cuda/storage.cuh) and the block size. Plain
 * CUDA, kept in a header so that tests/unit/test_ce_emulated.cpp runs them
 * on the CPU (under tests/unit/cuda_emulation.h) against a double-precision
 * loop.
 *
 * A row is read in 16-byte vectors (eight bf16 or four fp32 values a load)
 * from its first 16-byte boundary on, the scalar loops taking the values
 * before it and after the last whole vector: one 2-byte load per thread and
 * step kept too few bytes in flight to reach the memory's rate (the
 * 8B-shaped stack's 8192 x 128256 bf16 logits took 6.3 ms in three such
 * passes on an H200, 2026-11-26). The
 * whole-vocabulary kernel takes the row's max and sum of exponentials in one
 * pass (each thread a running max and a sum rescaled when the max grows,
 * combined over the block), then writes the gradient in a second. Each
 * exponential is a float expf of a difference <= 0, summed in double. */
#pragma once
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/storage.cuh"

/* A row of V values of T as head, vectors, tail: its first head values
 * (up to the row's first 16-byte boundary) and the rest past its nv whole
 * vectors go scalar. */
struct row_split {
    int head, nv;
};
template <typename T>
__device__ inline row_split split_row(const T *row, int V) {
    int per = 16 / (int)sizeof(T), head = (int)(((16 - ((uintptr_t)row & 15)) & 15) / sizeof(T));
    if (head > V) head = V;
    return row_split{head, (V - head) / per};
}

/* Calls f(i, x) for every value x = row[i] this thread takes: its vectors,
 * then its share of the scalar head and tail. */
template <typename T, typename F>
__device__ inline void each_value(const T *row, int V, F f) {
    row_split r = split_row(row, V);
    int per = 16 / (int)sizeof(T);
    float x[8];
    for (int j = threadIdx.x; j < r.nv; j += blockDim.x) {
        int n = load16(row + r.head, j, x);
        for (int e = 0; e < n; e++) f(r.head + j * per + e, x[e]);
    }
    for (int i = threadIdx.x; i < r.head; i += blockDim.x) f(i, ld(row, i));
    for (int i = r.head + r.nv * per + threadIdx.x; i < V; i += blockDim.x) f(i, ld(row, i));
}

template <typename T>
__device__ float row_max(const T *row, int V, float *fbuf) {
    float m = -INFINITY;
    each_value(row, V, [&](int, float x) { m = fmaxf(m, x); });
    return block_max(m, fbuf);
}

template <typename T>
__device__ double row_sumexp(const T *row, int V, float maxv, double *dbuf) {
    double s = 0;
    each_value(row, V, [&](int, float x) { s += (double)expf(x - maxv); });
    return block_sum(s, dbuf);
}

/* log of the sum of exp(x) over the row, in one pass. Each thread's
 * running sum is of exp(x - its running max), rescaled (in double: a
 * factor that multiplies the whole partial sum) when that grows; -inf adds
 * nothing, and a NaN anywhere makes the sum NaN, as the two-pass form does
 * (NaN times the rescale stays NaN; a thread that saw no value adds 0). */
template <typename T>
__device__ double row_logsumexp(const T *row, int V, float *fbuf, double *dbuf) {
    float m = -INFINITY;
    double s = 0;
    each_value(row, V, [&](int, float x) {
        if (x > m) {
            s = s * exp((double)m - x) + 1.0; /* exp(-inf) = 0 before the first value */
            m = x;
        } else if (x != -INFINITY) {
            s += (double)expf(x - m);
        }
    });
    float maxv = block_max(m, fbuf);
    double sum = block_sum(s == 0.0 ? 0.0 : s * exp((double)m - maxv), dbuf);
    return log(sum) + maxv;
}

/* row <- dscale * (softmax - onehot(t)), or zeros if ignored */
template <typename T>
__device__ void write_grad(T *row, int V, double logz, int t, int ignore, float dscale) {
    row_split r = split_row(row, V);
    int per = 16 / (int)sizeof(T);
    float lz = (float)logz, x[8], g[8];
    auto grad = [&](int i, float xi) {
        float gi = ignore ? 0.0f : expf(xi - lz) * dscale;
        return !ignore && i == t ? gi - dscale : gi;
    };
    for (int j = threadIdx.x; j < r.nv; j += blockDim.x) {
        int n = load16(row + r.head, j, x), i0 = r.head + j * per;
        for (int e = 0; e < n; e++) g[e] = grad(i0 + e, x[e]);
        store16(row + r.head, j, g);
    }
    for (int i = threadIdx.x; i < r.head; i += blockDim.x) st(row, i, grad(i, ld(row, i)));
    for (int i = r.head + r.nv * per + threadIdx.x; i < V; i += blockDim.x) st(row, i, grad(i, ld(row, i)));
}

/* the whole vocabulary: losses[n], and the gradient in place (dscale != 0) */
template <typename T, int THREADS_T>
__global__ void cross_entropy_k(float *losses, T *logits, const int32_t *targets, int V, float dscale) {
    __shared__ float fbuf[THREADS_T];
    __shared__ double dbuf[THREADS_T];
    T *row = logits + (size_t)blockIdx.x * V;
    int tgt = targets[blockIdx.x];
    double logz = row_logsumexp(row, V, fbuf, dbuf);
    if (threadIdx.x == 0) losses[blockIdx.x] = tgt < 0 ? 0.0f : (float)(logz - ld(row, tgt));
    __syncthreads(); /* the target logit is read before the row is overwritten */
    if (dscale != 0.0f) write_grad(row, V, logz, tgt, tgt < 0, dscale);
}

/* vocabulary-parallel: this rank's slice's max, then (after the caller's
 * all-reduce) its sum of exponentials and target logit, then the losses
 * and gradient from the reduced statistics */
template <typename T, int THREADS_T>
__global__ void ce_row_max_k(float *rowmax, const T *logits, int V) {
    __shared__ float fbuf[THREADS_T];
    float m = row_max(logits + (size_t)blockIdx.x * V, V, fbuf);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

template <typename T, int THREADS_T>
__global__ void ce_row_sumexp_k(float *sumexp, float *target_logit, const T *logits, const int32_t *targets,
                                const float *rowmax, int V, int vstart) {
    __shared__ double dbuf[THREADS_T];
    const T *row = logits + (size_t)blockIdx.x * V;
    double s = row_sumexp(row, V, rowmax[blockIdx.x], dbuf);
    if (threadIdx.x == 0) {
        sumexp[blockIdx.x] = (float)s;
        int t = targets[blockIdx.x] - vstart;
        target_logit[blockIdx.x] = (t >= 0 && t < V) ? ld(row, t) : 0.0f;
    }
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
