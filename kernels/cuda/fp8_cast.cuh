/* The FP8 cast kernels of kernels/cuda/fp8_gemm.cu: a bf16 tensor's amax,
 * and its 8-bit codes scaled by the power of two that amax gives, row-major
 * or transposed. Plain CUDA, kept in a header so that
 * tests/unit/test_fp8_cast_emulated.cpp runs them on the CPU (under
 * tests/unit/cuda_emulation.h) against kernels/fp8.h's host functions. */
#pragma once
#include <stdint.h>

#include "kernels/cuda/storage.cuh"
#include "kernels/fp8.h"

/* Elements a thread takes per step where the tensor (and its codes) are
 * 16-byte aligned: one 16-byte load of eight bf16 values, one 8-byte store
 * of their codes (the scalar loops take the rest, and unaligned tensors).
 * The first GPU profile (H200, 2026-11-26) had the FP8 ops, casts
 * included, slower than bf16's GEMMs; one 2-byte load per thread reads far
 * below the memory's rate. */
#define CAST_VEC 8

/* the number of CAST_VEC-element groups a vector loop takes from x (and q) */
__device__ inline size_t vec_groups(const void *x, const void *q, size_t n) {
    return ((uintptr_t)x & 15) || ((uintptr_t)q & 7) ? 0 : n / CAST_VEC;
}

/* |x| of two packed bf16 values as fp32 bits (the larger) */
__device__ inline unsigned abs_bits2(unsigned w) { return max((w & 0x7fffu) << 16, w & 0x7fff0000u); }

/* the running max of |x| over a grid-stride loop, one atomic per warp */
__global__ void amax_bf16_k(unsigned *amax, const uint16_t *x, size_t n) {
    unsigned run = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t groups = vec_groups(x, NULL, n);
    for (size_t i = tid; i < groups; i += stride) {
        uint4 v = reinterpret_cast<const uint4 *>(x)[i];
        run = max(run, max(max(abs_bits2(v.x), abs_bits2(v.y)), max(abs_bits2(v.z), abs_bits2(v.w))));
    }
    for (size_t i = groups * CAST_VEC + tid; i < n; i += stride) run = max(run, (unsigned)(x[i] & 0x7fffu) << 16);
    for (int o = 16; o; o >>= 1) run = max(run, __shfl_xor_sync(0xffffffffu, run, o));
    if ((threadIdx.x & 31) == 0) atomicMax(amax, run);
}

/* fold a tensor's amax (bits) into a delayed-scaling record (an fp32 in
 * device memory): a non-finite amax as NaN, whose bits beat every other
 * value's, so it sticks. One thread. */
__global__ void record_amax_k(unsigned *out, const unsigned *amax) {
    unsigned a = *amax;
    atomicMax(out, a >= 0x7f800000u ? 0x7fc00000u : a);
}

/* the scale 2^k for *amax, or the given 2^k (delayed scaling: k_fixed is
 * not FP8_SCALE_CURRENT); *inv = 2^-k, or NaN when the tensor holds an
 * infinity or NaN (the codes would saturate it; a NaN scale makes the
 * GEMM's output NaN, so the step is rejected as the reference path's is) */
__device__ inline float cast_scale(const unsigned *amax, int format, int k_fixed, float *inv) {
    float a = __uint_as_float(*amax);
    int k = k_fixed != FP8_SCALE_CURRENT ? k_fixed : fp8_scale_exp(isfinite(a) ? a : 0.0f, format);
    if (inv && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
        *inv = isfinite(a) ? fp8_pow2(-k) : __uint_as_float(0x7fc00000u);
    return fp8_pow2(k);
}

/* the codes of two packed bf16 values, scaled by s, in the low two bytes */
__device__ inline unsigned codes2(unsigned w, float s, int format) {
    unsigned lo = fp8_bits(widen1((uint16_t)(w & 0xffffu)) * s, format);
    return lo | (unsigned)fp8_bits(widen1((uint16_t)(w >> 16)) * s, format) << 8;
}

/* codes of x [rows, cols] scaled by 2^k (k from *amax, or k_fixed), row-major;
 * CAST_VEC elements a thread per step where x and q are aligned */
__global__ void cast_k(uint8_t *q, float *inv, const uint16_t *x, size_t n, const unsigned *amax, int format,
                       int k_fixed) {
    float s = cast_scale(amax, format, k_fixed, inv);
    size_t stride = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t groups = vec_groups(x, q, n);
    for (size_t i = tid; i < groups; i += stride) {
        uint4 v = reinterpret_cast<const uint4 *>(x)[i];
        reinterpret_cast<uint2 *>(q)[i] = make_uint2(codes2(v.x, s, format) | codes2(v.y, s, format) << 16,
                                                     codes2(v.z, s, format) | codes2(v.w, s, format) << 16);
    }
    for (size_t i = groups * CAST_VEC + tid; i < n; i += stride) q[i] = fp8_bits(widen1(x[i]) * s, format);
}

/* the same codes transposed, qt [cols, ld] (ld >= rows: columns rows .. ld-1
 * of qt are zero codes, padding a contraction over the rows to the GEMM's
 * multiple of 16; ld at most rows rounded up to 32), through a 32 x 32 tile in shared memory
 * so both the reads and the writes run along rows; blocks of 32 x 8
 * threads, grid (rows / 32, cols / 32) rounded up (rows on x: its limit is
 * 2^31 - 1 blocks, y's 65535). Where qt and ld allow (4-byte aligned, ld a
 * multiple of 4: fp8_gemm.cu's buffers and padded rows) each thread writes
 * four codes at once, else one. */
#define TT 32
__global__ void cast_t_k(uint8_t *qt, float *inv, const uint16_t *x, int rows, int cols, int ld, const unsigned *amax,
                         int format, int k_fixed) {
    __shared__ uint8_t tile[TT][TT + 4];
    float s = cast_scale(amax, format, k_fixed, inv);
    int r0 = blockIdx.x * TT, c0 = blockIdx.y * TT;
    for (int i = threadIdx.y; i < TT; i += blockDim.y) {
        int r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = fp8_bits(widen1(x[(size_t)r * cols + c]) * s, format);
    }
    __syncthreads();
    if (((uintptr_t)qt & 3) == 0 && ld % 4 == 0) {
        int nt = blockDim.x * blockDim.y;
        for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < TT * TT / 4; i += nt) {
            int j = i / (TT / 4), rq = i % (TT / 4) * 4, c = c0 + j, r = r0 + rq;
            if (r >= ld || c >= cols) continue; /* ld % 4 == 0: the four rows r .. r + 3 are all below ld */
            unsigned word = 0;
            for (int e = 0; e < 4; e++)
                if (r + e < rows) word |= (unsigned)tile[rq + e][j] << (8 * e);
            *reinterpret_cast<unsigned *>(qt + (size_t)c * ld + r) = word;
        }
        return;
    }
    for (int j = threadIdx.y; j < TT; j += blockDim.y) {
        int c = c0 + j, r = r0 + threadIdx.x;
        if (r < ld && c < cols) qt[(size_t)c * ld + r] = r < rows ? tile[threadIdx.x][j] : 0;
    }
}
