/* Sums and maxima over one block in a fixed tree order (bitwise
 * repeatable), for the kernels of kernels/cuda and, through the headers
 * that use them, the CPU emulation's tests (tests/unit/cuda_emulation.h).
 * blockDim.x is a power of two <= 1024; buf holds blockDim.x elements.
 * And a warp's maximum by shuffles. */
#pragma once

template <typename T>
__device__ inline T block_sum(T v, T *buf) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    T r = buf[0];
    __syncthreads();
    return r;
}

__device__ inline float block_max(float v, float *buf) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + s]);
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();
    return r;
}

/* the max of v over the warp, in every lane (all 32 lanes take part) */
__device__ inline unsigned warp_max_bits(unsigned v) {
    for (int o = 16; o; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
