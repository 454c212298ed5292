/* The gate-weighted un-permute of an MoE layer and its backward (semantics
 * in kernels/ops.h moe_combine, moe_combine_backward), templated on the
 * activation storage (kernels/cuda/storage.cuh): the fp32 table's kernels
 * and their bf16 instances, which compute on bf16 rows exactly what the fp32
 * kernels compute on the widened rows, rounded once where they store: no
 * fp32 copy of the k x tokens rows. In a header so that
 * tests/unit/test_moe_combine_emulated.cpp runs both on the CPU. */
#pragma once
#include <stdint.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/storage.cuh"

/* one thread per output element: out[t,c] (+)= sum_j w[t,j] y[pos[t,j],c] over kept selections */
template <typename T>
static __global__ void moe_combine_k(T *out, const T *y, const int32_t *pos, const float *w, int n, int k, int C,
                                     int accumulate) {
    size_t total = (size_t)n * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / C, c = i % C;
        float acc = accumulate ? ld(out, i) : 0.0f;
        for (int j = 0; j < k; j++) {
            int32_t r = pos[t * k + j];
            if (r >= 0) acc += (w ? w[t * k + j] : 1.0f) * ld(y, (size_t)r * C + c);
        }
        st(out, i, acc);
    }
}

/* one thread per (selection, column): dy[pos[t,j],c] = w[t,j] dout[t,c] for kept selections */
template <typename T>
static __global__ void moe_combine_dy_k(T *dy, const T *dout, const int32_t *pos, const float *w, int n, int k, int C) {
    size_t total = (size_t)n * k * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t tj = i / C, c = i % C;
        int32_t r = pos[tj];
        if (r >= 0) st(dy, (size_t)r * C + c, w[tj] * ld(dout, (tj / k) * C + c));
    }
}

/* one block (blockDim.x a power of two <= 256) per selection: dw = dout[t] . y[pos] (0 when dropped) */
template <typename T>
static __global__ void moe_combine_dw_k(float *dw, const T *dout, const T *y, const int32_t *pos, int k, int C) {
    __shared__ double buf[256];
    size_t tj = blockIdx.x;
    int32_t r = pos[tj];
    double acc = 0;
    if (r >= 0)
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            acc += (double)ld(dout, (tj / k) * C + c) * ld(y, (size_t)r * C + c);
    acc = block_sum(acc, buf);
    if (threadIdx.x == 0) dw[tj] = r >= 0 ? (float)acc : 0.0f;
}
