/* The sum (or sum of squares) of a long fp32 vector in double, as partial
 * sums, one per block of a fixed grid that the host adds in order: bitwise
 * repeatable for a given grid and address. Built for memory bandwidth (the
 * gradient norm reads every gradient once a step: 7.8 GB at the 8B-shaped
 * stack): a grid that fills the GPU several times over and 16-byte loads,
 * four floats each, so enough bytes are in flight to keep HBM busy (a
 * 256-block grid of 4-byte loads keeps ~64K loads in flight, a fraction of
 * what H100's bandwidth needs). The up to three floats before the first
 * 16-byte boundary and the up to three after the last go to block 0's first
 * threads. Launch with blockDim.x == THREADS_R, a power of two from 8 to
 * 1024. Plain CUDA in a
 * header so that tests/unit/test_reduce_emulated.cpp runs it on the CPU. */
#pragma once
#include <stdint.h>

#include "kernels/cuda/block_reduce.cuh"

template <int THREADS_R>
__global__ void reduce_k(double *part, const float *x, size_t n, int square) {
    __shared__ double buf[THREADS_R];
    size_t head = ((16 - ((uintptr_t)x & 15)) & 15) / 4; /* floats before the first 16-byte boundary */
    if (head > n) head = n;
    size_t nv = (n - head) / 4, tail = head + 4 * nv; /* float4s, then the rest from tail on */
    const float4 *xv = (const float4 *)(x + head);
    double a0 = 0, a1 = 0; /* two chains: the adds of one load do not wait for each other */
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += stride) {
        float4 v = xv[i];
        if (square) {
            a0 += (double)v.x * v.x + (double)v.y * v.y;
            a1 += (double)v.z * v.z + (double)v.w * v.w;
        } else {
            a0 += (double)v.x + (double)v.y;
            a1 += (double)v.z + (double)v.w;
        }
    }
    if (blockIdx.x == 0) { /* the unaligned ends, at most 3 floats each: threads 0-2 and 3-5 */
        size_t t = threadIdx.x, i = n;
        if (t < head) i = t;
        else if (t >= 3 && t < 6 && tail + (t - 3) < n) i = tail + (t - 3);
        if (i < n) a0 += square ? (double)x[i] * x[i] : (double)x[i];
    }
    double acc = block_sum(a0 + a1, buf);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
