/* RMSNorm's row kernels of kernels/cuda/norm.cu (one block per row), templated
 * on the storage T of activations (float, or bf16_t for the bf16 table:
 * kernels/cuda/storage.cuh) and the block size; weights, rstd and all
 * arithmetic are fp32, sums in double. Where the row and the weights are
 * 16-byte aligned a thread takes 16-byte vectors (4 fp32 or 8 bf16
 * values), the scalar loop the rest and unaligned rows (the row sums then
 * add in another order). In a header so that
 * tests/unit/test_norm_emulated.cpp runs them on the CPU (under
 * tests/unit/cuda_emulation.h). */
#pragma once
#include <math.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/storage.cuh"

/* the four or eight weights of vector j */
__device__ inline void weights16(const float *w, int j, int per, float *out) {
    for (int q = 0; q < per / 4; q++) {
        float4 v = reinterpret_cast<const float4 *>(w)[j * (per / 4) + q];
        out[4 * q] = v.x, out[4 * q + 1] = v.y, out[4 * q + 2] = v.z, out[4 * q + 3] = v.w;
    }
}

/* the vectors of a row of C values of T: 0 where the row or w is not aligned */
template <typename T>
__device__ inline int norm_vectors(const T *row, const float *w, int C) {
    return is_aligned16(row) && is_aligned16(w) ? C / per16(row) : 0;
}

template <typename T, int THREADS_T>
__global__ void rmsnorm_forward_k(T *out, float *rstd, const T *x, const float *w, int C, float eps) {
    __shared__ double buf[THREADS_T];
    const T *xr = x + (size_t)blockIdx.x * C;
    T *orow = out + (size_t)blockIdx.x * C;
    int per = per16(xr), nv = norm_vectors(xr, w, C) * (is_aligned16(orow) ? 1 : 0);
    double ss = 0;
    float v[8], g[8];
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        load16(xr, j, v);
        for (int e = 0; e < per; e++) ss += (double)v[e] * v[e];
    }
    for (int c = nv * per + threadIdx.x; c < C; c += blockDim.x) ss += (double)ld(xr, c) * ld(xr, c);
    ss = block_sum(ss, buf);
    float r = (float)(1.0 / sqrt(ss / C + eps));
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        load16(xr, j, v);
        weights16(w, j, per, g);
        for (int e = 0; e < per; e++) v[e] = g[e] * (v[e] * r);
        store16(orow, j, v);
    }
    for (int c = nv * per + threadIdx.x; c < C; c += blockDim.x) st(orow, c, w[c] * (ld(xr, c) * r));
}

template <typename T, int THREADS_T>
__global__ void rmsnorm_dx_k(T *dx, const T *dout, const T *x, const float *w, const float *rstd, int C,
                             int accumulate) {
    __shared__ double buf[THREADS_T];
    size_t base = (size_t)blockIdx.x * C;
    const T *xr = x + base, *dr = dout + base;
    T *dxr = dx + base;
    float r = rstd[blockIdx.x];
    int per = per16(xr);
    int nv = is_aligned16(dr) && is_aligned16(dxr) ? norm_vectors(xr, w, C) : 0;
    double dot = 0;
    float a[8], d[8], g[8], o[8];
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        load16(xr, j, a);
        load16(dr, j, d);
        weights16(w, j, per, g);
        for (int e = 0; e < per; e++) dot += (double)g[e] * d[e] * a[e];
    }
    for (int c = nv * per + threadIdx.x; c < C; c += blockDim.x) dot += (double)w[c] * ld(dr, c) * ld(xr, c);
    dot = block_sum(dot, buf);
    float k = (float)(dot * r * r * r / C);
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        load16(xr, j, a);
        load16(dr, j, d);
        weights16(w, j, per, g);
        if (accumulate) load16(dxr, j, o);
        for (int e = 0; e < per; e++) {
            float gr = r * g[e] * d[e] - k * a[e];
            o[e] = accumulate ? o[e] + gr : gr;
        }
        store16(dxr, j, o);
    }
    for (int c = nv * per + threadIdx.x; c < C; c += blockDim.x) {
        float gr = r * w[c] * ld(dr, c) - k * ld(xr, c);
        st(dxr, c, accumulate ? ld(dxr, c) + gr : gr);
    }
}
