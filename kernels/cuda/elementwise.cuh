/* SwiGLU and the add / scale helpers of kernels/cuda/elementwise.cu,
 * templated on the activations' storage T (float, or bf16_t for the bf16
 * table: kernels/cuda/storage.cuh), the arithmetic fp32. Where every buffer
 * is 16-byte aligned a thread takes one 16-byte vector of each (4 fp32 or 8
 * bf16 values; SwiGLU was 5 ms of the 8B-shaped step on an H200 with one
 * 2-byte access a thread), the scalar loop the rest and unaligned buffers;
 * each element's arithmetic is the same either way. In a header so that
 * tests/unit/test_elementwise_emulated.cpp runs them on the CPU (under
 * tests/unit/cuda_emulation.h). */
#pragma once
#include <math.h>

#include "kernels/cuda/storage.cuh"

__device__ inline float swiglu1(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ inline void swiglu_grad1(float d, float g, float u, float *dgate, float *dup) {
    float sig = 1.0f / (1.0f + expf(-g));
    *dup = d * (g * sig);
    *dgate = d * u * sig * (1.0f + g * (1.0f - sig));
}

#define EW_TID (blockIdx.x * (size_t)blockDim.x + threadIdx.x)
#define EW_STRIDE ((size_t)gridDim.x * blockDim.x)

template <typename T>
__global__ void swiglu_forward_k(T *out, const T *gate, const T *up, size_t n) {
    int per = per16(out);
    size_t groups = is_aligned16(out) && is_aligned16(gate) && is_aligned16(up) ? n / per : 0;
    for (size_t j = EW_TID; j < groups; j += EW_STRIDE) {
        float g[8], u[8], o[8];
        load16(gate, j, g), load16(up, j, u);
        for (int e = 0; e < per; e++) o[e] = swiglu1(g[e], u[e]);
        store16(out, j, o);
    }
    for (size_t i = groups * per + EW_TID; i < n; i += EW_STRIDE) st(out, i, swiglu1(ld(gate, i), ld(up, i)));
}

template <typename T>
__global__ void swiglu_backward_k(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n) {
    int per = per16(dgate);
    bool aligned = is_aligned16(dgate) && is_aligned16(dup) && is_aligned16(dout) && is_aligned16(gate) &&
                   is_aligned16(up);
    size_t groups = aligned ? n / per : 0;
    for (size_t j = EW_TID; j < groups; j += EW_STRIDE) {
        float d[8], g[8], u[8], dg[8], du[8];
        load16(dout, j, d), load16(gate, j, g), load16(up, j, u);
        for (int e = 0; e < per; e++) swiglu_grad1(d[e], g[e], u[e], &dg[e], &du[e]);
        store16(dup, j, du), store16(dgate, j, dg);
    }
    for (size_t i = groups * per + EW_TID; i < n; i += EW_STRIDE) {
        float dg, du;
        swiglu_grad1(ld(dout, i), ld(gate, i), ld(up, i), &dg, &du);
        st(dup, i, du), st(dgate, i, dg);
    }
}

template <typename T>
__global__ void add_k(T *dst, const T *src, size_t n) {
    int per = per16(dst);
    size_t groups = is_aligned16(dst) && is_aligned16(src) ? n / per : 0;
    for (size_t j = EW_TID; j < groups; j += EW_STRIDE) {
        float a[8], b[8];
        load16(dst, j, a), load16(src, j, b);
        for (int e = 0; e < per; e++) a[e] += b[e];
        store16(dst, j, a);
    }
    for (size_t i = groups * per + EW_TID; i < n; i += EW_STRIDE) st(dst, i, ld(dst, i) + ld(src, i));
}

template <typename T>
__global__ void scale_k(T *x, float s, size_t n) {
    int per = per16(x);
    size_t groups = is_aligned16(x) ? n / per : 0;
    for (size_t j = EW_TID; j < groups; j += EW_STRIDE) {
        float a[8];
        load16(x, j, a);
        for (int e = 0; e < per; e++) a[e] *= s;
        store16(x, j, a);
    }
    for (size_t i = groups * per + EW_TID; i < n; i += EW_STRIDE) st(x, i, ld(x, i) * s);
}
