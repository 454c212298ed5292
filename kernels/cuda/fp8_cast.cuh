/* The FP8 cast kernels of kernels/cuda/fp8_gemm.cu: a bf16 tensor's amax,
 * and its 8-bit codes scaled by the power of two that amax gives, row-major
 * or transposed. Plain CUDA, kept in a header so that
 * tests/unit/test_fp8_cast_emulated.cpp runs them on the CPU (under
 * tests/unit/cuda_emulation.h) against kernels/fp8.h's host functions. */
#pragma once
#include <stdint.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/fp8.h"
#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

/* The codes of a and b (a in the low byte): in device code built for a GPU
 * with FP8 (compute capability 8.9 and later; the Makefile builds sm_90a,
 * Hopper, and sm_80, where fp8_bits runs) one convert instruction for the pair, rounding
 * to nearest even and saturating finite values as fp8_bits does
 * (test_cuda_bf16's cuda_fp8_cast_codes checks every bf16 value at several
 * scales bitwise against it); elsewhere, and under the CPU emulation,
 * fp8_bits. The first H100 profile (2026-11-26) had the casts moving half
 * the bytes the memory allows: fp8_bits's rounding is some fifty
 * instructions a value. */
__device__ inline unsigned fp8_code2(float a, float b, int format) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, format == FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
#else
    return fp8_bits(a, format) | (unsigned)fp8_bits(b, format) << 8;
#endif
}
__device__ inline uint8_t fp8_code(float a, int format) { return (uint8_t)fp8_code2(a, 0.0f, format); }

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

/* *to = max(*to, v), the atomic skipped where *to already holds as much:
 * during a kernel *to only grows, so such a lane has nothing to add, and
 * after the first warps most have not (one address taking an atomic from
 * every warp of a grid of ~28k blocks is the speculative casts' suspected
 * cost, docs/model.md). The same bits either way. */
__device__ inline void max_into(unsigned *to, unsigned v) {
#ifdef __CUDACC__
    unsigned now = *(volatile unsigned *)to;
#else /* the CPU emulation's threads: an atomic read */
    unsigned now = __atomic_load_n(to, __ATOMIC_RELAXED);
#endif
    if (v > now) atomicMax(to, v);
}

/* the running max of |x| over a grid-stride loop, one atomic per warp at most */
__global__ void amax_bf16_k(unsigned *amax, const uint16_t *x, size_t n) {
    unsigned run = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t groups = vec_groups(x, NULL, n);
    for (size_t i = tid; i < groups; i += stride) {
        uint4 v = reinterpret_cast<const uint4 *>(x)[i];
        run = max(run, max(max(abs_bits2(v.x), abs_bits2(v.y)), max(abs_bits2(v.z), abs_bits2(v.w))));
    }
    for (size_t i = groups * CAST_VEC + tid; i < n; i += stride) run = max(run, (unsigned)(x[i] & 0x7fffu) << 16);
    run = warp_max_bits(run);
    if ((threadIdx.x & 31) == 0) max_into(amax, run);
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

/* Speculative current scaling: a cast site's scale exponent k from its
 * last cast, used before this tensor's amax is known. The cast makes the
 * codes with it while it takes the amax (pass 1); spec_finish_k derives
 * this tensor's k from the amax, as cast_scale does, and sets redo if it
 * differs; a second cast (pass 2) remakes the codes with it only then
 * (its blocks return at once otherwise). So the codes and scale are
 * current scaling's, bit for bit, and where a site's k holds from one
 * step to the next (it is a power of two: most steps) the tensor is read
 * once instead of twice (amax pass, cast pass). Off by default
 * (fp8_gemm.cu's speculate(): slower on an H100 as it stands). */
struct fp8_spec {
    int k, redo;
};

/* a cast kernel's scale: speculative (spec: pass 1 when it takes the amax
 * into acc, else pass 2, which *skip tells to do nothing when the first
 * pass had the right k) or from *amax / k_fixed (cast_scale) */
__device__ inline float kernel_scale(const struct fp8_spec *spec, const unsigned *acc, const unsigned *amax,
                                     int format, int k_fixed, float *inv, int *skip) {
    *skip = 0;
    if (!spec) return cast_scale(amax, format, k_fixed, inv);
    if (!acc && !spec->redo) *skip = 1;
    return fp8_pow2(spec->k);
}

/* pass 1's amax (bits, over the grid) into *acc: one atomic per warp at most; every lane of the warp calls it */
__device__ inline void take_amax(unsigned *acc, unsigned run) {
    if (!acc) return;
    run = warp_max_bits(run);
    if ((threadIdx.x & 31) == 0) max_into(acc, run);
}

/* after pass 1: this tensor's k from its amax (a non-finite amax: k 0 and
 * a NaN inverse scale, as cast_scale), its inverse scale, redo if pass 1
 * used another k, and k kept for the site's next cast. One thread. */
__global__ void spec_finish_k(struct fp8_spec *spec, float *inv, const unsigned *amax, int format) {
    if (threadIdx.x || threadIdx.y || blockIdx.x || blockIdx.y) return;
    float a = __uint_as_float(*amax);
    int k = fp8_scale_exp(isfinite(a) ? a : 0.0f, format);
    *inv = isfinite(a) ? fp8_pow2(-k) : __uint_as_float(0x7fc00000u);
    spec->redo = k != spec->k;
    spec->k = k;
}

/* the codes of two packed bf16 values, scaled by s, in the low two bytes */
__device__ inline unsigned codes2(unsigned w, float s, int format) {
    return fp8_code2(widen1((uint16_t)(w & 0xffffu)) * s, widen1((uint16_t)(w >> 16)) * s, format);
}

/* codes of x [rows, cols] scaled by 2^k (k from *amax, or k_fixed, or
 * speculative: spec, acc as kernel_scale), row-major; CAST_VEC elements a
 * thread per step where x and q are aligned */
__global__ void cast_k(uint8_t *q, float *inv, const uint16_t *x, size_t n, const unsigned *amax, int format,
                       int k_fixed, const struct fp8_spec *spec = NULL, unsigned *acc = NULL) {
    int skip;
    float s = kernel_scale(spec, acc, amax, format, k_fixed, inv, &skip);
    if (skip) return;
    size_t stride = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t groups = vec_groups(x, q, n);
    unsigned run = 0;
    for (size_t i = tid; i < groups; i += stride) {
        uint4 v = reinterpret_cast<const uint4 *>(x)[i];
        if (acc) run = max(run, max(max(abs_bits2(v.x), abs_bits2(v.y)), max(abs_bits2(v.z), abs_bits2(v.w))));
        reinterpret_cast<uint2 *>(q)[i] = make_uint2(codes2(v.x, s, format) | codes2(v.y, s, format) << 16,
                                                     codes2(v.z, s, format) | codes2(v.w, s, format) << 16);
    }
    for (size_t i = groups * CAST_VEC + tid; i < n; i += stride) {
        if (acc) run = max(run, (unsigned)(x[i] & 0x7fffu) << 16);
        q[i] = fp8_code(widen1(x[i]) * s, format);
    }
    take_amax(acc, run);
}

/* x[r][c .. c + 7] of the row-major x [rows, cols] into v, zeros past rows
 * and cols; one 16-byte load where vec (x 16-byte aligned, cols a multiple
 * of 8) and all eight lie inside */
__device__ inline void load8(uint16_t *v, const uint16_t *x, int rows, int cols, int r, int c, int vec) {
    if (vec && r < rows && c + 8 <= cols) {
        uint4 w = *reinterpret_cast<const uint4 *>(x + (size_t)r * cols + c);
        const unsigned u[4] = {w.x, w.y, w.z, w.w};
        for (int j = 0; j < 4; j++) v[2 * j] = (uint16_t)u[j], v[2 * j + 1] = (uint16_t)(u[j] >> 16);
        return;
    }
    for (int j = 0; j < 8; j++) v[j] = r < rows && c + j < cols ? x[(size_t)r * cols + c + j] : 0;
}

/* the first n of sixteen codes b to `to`: one 16-byte store where vec (to
 * 16-byte aligned) and n is 16, else byte by byte */
__device__ inline void store16(uint8_t *to, const uint8_t *b, int n, int vec) {
    if (vec && n == 16) {
        unsigned w[4];
        for (int e = 0; e < 4; e++)
            w[e] = b[4 * e] | (unsigned)b[4 * e + 1] << 8 | (unsigned)b[4 * e + 2] << 16 | (unsigned)b[4 * e + 3] << 24;
        *reinterpret_cast<uint4 *>(to) = uint4{w[0], w[1], w[2], w[3]};
        return;
    }
    for (int e = 0; e < n; e++) to[e] = b[e];
}

/* the same codes transposed, qt [cols, ld] (ld >= rows: columns rows .. ld-1
 * of qt are zero codes, padding a contraction over the rows to the GEMM's
 * multiple of 16; ld at most rows rounded up to TT), through a TT x TT tile
 * of codes in shared memory, so both the reads and the writes run along
 * rows. Blocks of 32 x 8 threads, grid (rows / TT, cols / TT) rounded up
 * (rows on x: its limit is 2^31 - 1 blocks, y's 65535). A thread reads
 * eight bf16 values at once (one 16-byte load) where x is 16-byte aligned
 * and cols a multiple of 8, and writes sixteen codes at once (one 16-byte
 * store) where qt is 16-byte aligned and ld a multiple of 16 (fp8_gemm.cu's
 * buffers and padded rows), else one value at a time: the first GPU
 * profile (H200, 2026-11-26) had the FP8 ops, casts included, slower than
 * bf16's GEMMs, with 2-byte reads here. q (NULL: none) also gets the
 * row-major codes [rows, cols], so an operand wanted in both layouts (the
 * output gradient) is read once. */
#define TT 64
__global__ void cast_t_k(uint8_t *qt, uint8_t *q, float *inv, const uint16_t *x, int rows, int cols, int ld,
                         const unsigned *amax, int format, int k_fixed, const struct fp8_spec *spec = NULL,
                         unsigned *acc = NULL) {
    __shared__ uint8_t tile[TT][TT + 4];
    int skip;
    float s = kernel_scale(spec, acc, amax, format, k_fixed, inv, &skip);
    if (skip) return; /* the whole block: spec->redo is the grid's */
    unsigned run = 0;
    int r0 = blockIdx.x * TT, c0 = blockIdx.y * TT, t = threadIdx.y * blockDim.x + threadIdx.x;
    int nt = blockDim.x * blockDim.y;
    int vec_in = ((uintptr_t)x & 15) == 0 && cols % 8 == 0, vec_q = vec_in && ((uintptr_t)q & 7) == 0;
    for (int i = t; i < TT * TT / 8; i += nt) { /* eight values: row i / 8, columns 8 (i % 8) .. + 7 */
        int row = i / (TT / 8), c8 = i % (TT / 8) * 8, r = r0 + row, c = c0 + c8;
        uint16_t v[8];
        load8(v, x, rows, cols, r, c, vec_in);
        if (acc)
            for (int j = 0; j < 8; j++) run = max(run, (unsigned)(v[j] & 0x7fffu) << 16); /* zeros past the edges */
        uint8_t *code = &tile[row][c8]; /* zero codes past rows and cols */
        for (int j = 0; j < 8; j += 2) {
            unsigned pair = fp8_code2(widen1(v[j]) * s, widen1(v[j + 1]) * s, format);
            code[j] = (uint8_t)pair, code[j + 1] = (uint8_t)(pair >> 8);
        }
        if (!q || r >= rows) continue;
        if (vec_q && c + 8 <= cols) {
            unsigned lo = code[0] | (unsigned)code[1] << 8 | (unsigned)code[2] << 16 | (unsigned)code[3] << 24;
            unsigned hi = code[4] | (unsigned)code[5] << 8 | (unsigned)code[6] << 16 | (unsigned)code[7] << 24;
            *reinterpret_cast<uint2 *>(q + (size_t)r * cols + c) = make_uint2(lo, hi);
        } else {
            for (int j = 0; j < 8 && c + j < cols; j++) q[(size_t)r * cols + c + j] = code[j];
        }
    }
    take_amax(acc, run);
    __syncthreads();
    int vec_out = ((uintptr_t)qt & 15) == 0 && ld % 16 == 0;
    for (int i = t; i < TT * TT / 16; i += nt) { /* sixteen codes: qt row c0 + i / 4, columns r0 + 16 (i % 4) .. + 15 */
        int j = i / (TT / 16), r16 = i % (TT / 16) * 16, c = c0 + j, r = r0 + r16;
        if (c >= cols || r >= ld) continue;
        uint8_t b[16]; /* past rows the tile holds zero codes */
        for (int e = 0; e < 16; e++) b[e] = tile[r16 + e][j];
        store16(qt + (size_t)c * ld + r, b, min(16, ld - r), vec_out);
    }
}

/* ---- block scaling (DeepSeek-V3's recipe) for cuBLASLt's block-scaled
 * FP8 GEMMs: each block of 128 values along the contraction (1 x 128), or
 * each 128 x 128 block of a weight, has its own scale 2^k from its own
 * amax, as kernels/cpu/bf16.c's fp8_qdq_blocks has; the GEMM reads the
 * inverse scales 2^-k (NaN for a block holding an infinity or NaN, so the
 * outputs it reaches are NaN and the step is rejected) from arrays laid
 * out as cuBLASLt's VEC128_32F and BLK128x128_32F modes read them, for an
 * operand t [R, C] whose rows are contracted along C:
 *   1 x 128:   the scale of t[r][c] at (c / 128) * R + r (rows fastest)
 *   128 x 128: at (r / 128) * (C / 128) + c / 128 (row-major over blocks)
 * (PyTorch's torch._scaled_mm takes the same layouts: its "outer-dim-major"
 * 1 x 128 scales and row-major 128 x 128 ones). */
#define BLK 128

/* 2^k for a block's amax bits; *inv = 2^-k, or NaN for a non-finite amax */
__device__ inline float block_scale(unsigned amax_bits, int format, float *inv) {
    float a = __uint_as_float(amax_bits);
    int ok = amax_bits < 0x7f800000u, k = fp8_scale_exp(ok ? a : 0.0f, format);
    *inv = ok ? fp8_pow2(-k) : __uint_as_float(0x7fc00000u);
    return fp8_pow2(k);
}

/* x [rows, cols] (cols a multiple of 128) to codes q [ld, cols] in 1 x 128
 * blocks along the rows: one warp a block, four values a lane (one 8-byte
 * load where x is 8-byte aligned, one 4-byte store of the codes where q is
 * 4-byte aligned); inv [cols / 128, ld]. Rows rows .. ld - 1 (ld >= rows:
 * the padding a GEMM's row count needs) get zero codes and inverse scale
 * 1. Any grid of 32-multiple blocks (warps stride over the blocks). */
__global__ void cast_rows128_k(uint8_t *q, float *inv, const uint16_t *x, int rows, int ld, int cols, int format) {
    int lane = threadIdx.x & 31;
    size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5, warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    size_t nblk = (size_t)ld * (cols / BLK);
    int vec_in = ((uintptr_t)x & 7) == 0, vec_out = ((uintptr_t)q & 3) == 0;
    for (size_t b = warp; b < nblk; b += warps) {
        int r = (int)(b % ld), cb = (int)(b / ld);
        size_t at = (size_t)r * cols + (size_t)cb * BLK + lane * 4;
        unsigned codes = 0;
        float iv = 1.0f;
        if (r < rows) {
            unsigned w0, w1;
            if (vec_in) {
                uint2 v = *reinterpret_cast<const uint2 *>(x + at);
                w0 = v.x, w1 = v.y;
            } else {
                w0 = x[at] | (unsigned)x[at + 1] << 16, w1 = x[at + 2] | (unsigned)x[at + 3] << 16;
            }
            float s = block_scale(warp_max_bits(max(abs_bits2(w0), abs_bits2(w1))), format, &iv);
            codes = codes2(w0, s, format) | codes2(w1, s, format) << 16;
        }
        if (vec_out) {
            *reinterpret_cast<unsigned *>(q + at) = codes;
        } else {
            for (int e = 0; e < 4; e++) q[at + e] = (uint8_t)(codes >> (8 * e));
        }
        if (lane == 0) inv[(size_t)cb * ld + r] = iv;
    }
}

/* x [rows, cols] to codes qt [cols, ld] transposed, in 128 x 1 blocks along
 * x's rows (the weight gradient's operands, contracted over the tokens):
 * ld a multiple of 128 at least rows, the columns rows .. ld - 1 of qt zero
 * codes; inv [ld / 128, cols]. Blocks of 32 x 8 threads, grid (ld / 128,
 * cols / COLS_T rounded up): each stages a 128 x COLS_T tile of x (eight
 * values a 16-byte load where x is 16-byte aligned and cols a multiple of
 * 8), takes each column's amax, and writes sixteen codes a 16-byte store
 * (qt 16-byte aligned), else one value at a time. */
#define COLS_T 64
__global__ void cast_cols128_t_k(uint8_t *qt, float *inv, const uint16_t *x, int rows, int cols, int ld, int format) {
    __shared__ uint16_t tile[BLK][COLS_T + 8];
    __shared__ unsigned part[4][COLS_T];
    __shared__ float scale[COLS_T];
    int r0 = blockIdx.x * BLK, c0 = blockIdx.y * COLS_T, t = threadIdx.y * blockDim.x + threadIdx.x;
    int nt = blockDim.x * blockDim.y, vec_in = ((uintptr_t)x & 15) == 0 && cols % 8 == 0;
    for (int i = t; i < BLK * COLS_T / 8; i += nt) { /* eight values: row i / 8, columns 8 (i % 8) .. + 7 */
        int row = i / (COLS_T / 8), c8 = i % (COLS_T / 8) * 8;
        load8(&tile[row][c8], x, rows, cols, r0 + row, c0 + c8, vec_in);
    }
    __syncthreads();
    for (int i = t; i < 4 * COLS_T; i += nt) { /* a quarter of a column's rows: column i % COLS_T */
        int j = i % COLS_T, q = i / COLS_T;
        unsigned run = 0;
        for (int e = 0; e < BLK / 4; e++) run = max(run, (unsigned)(tile[q * (BLK / 4) + e][j] & 0x7fffu) << 16);
        part[q][j] = run;
    }
    __syncthreads();
    for (int j = t; j < COLS_T; j += nt) {
        unsigned run = max(max(part[0][j], part[1][j]), max(part[2][j], part[3][j]));
        float iv;
        scale[j] = block_scale(run, format, &iv);
        if (c0 + j < cols) inv[(size_t)blockIdx.x * cols + c0 + j] = iv;
    }
    __syncthreads();
    int vec_out = ((uintptr_t)qt & 15) == 0 && ld % 16 == 0;
    for (int i = t; i < COLS_T * BLK / 16; i += nt) { /* sixteen codes: qt row c0 + i / 8, columns r0 + 16 (i % 8) .. */
        int j = i / (BLK / 16), r16 = i % (BLK / 16) * 16, c = c0 + j;
        if (c >= cols) continue;
        uint8_t b[16];
        for (int e = 0; e < 16; e += 2) { /* zeros past rows */
            unsigned pair = fp8_code2(widen1(tile[r16 + e][j]) * scale[j], widen1(tile[r16 + e + 1][j]) * scale[j], format);
            b[e] = (uint8_t)pair, b[e + 1] = (uint8_t)(pair >> 8);
        }
        store16(qt + (size_t)c * ld + r0 + r16, b, 16, vec_out);
    }
}

/* a weight x [rows, cols] (both multiples of 128) in 128 x 128 blocks: its
 * codes row-major q [rows, cols] with inv [rows / 128, cols / 128], and/or
 * transposed qt [cols, rows] with inv_t [cols / 128, rows / 128] (the same
 * scales, the blocks transposed); NULL skips a layout. Blocks of 32 x 8
 * threads, grid (rows / 128, cols / 128): each stages its 128 x 128 tile
 * (four values a thread per row, one 8-byte load where x is 8-byte aligned,
 * rows ty, ty + 8, ...), takes the tile's
 * amax, then writes four codes a thread (4-byte aligned q and qt). */
#define TILE_PAD 8
__global__ void cast_block128_k(uint8_t *q, float *inv, uint8_t *qt, float *inv_t, const uint16_t *x, int rows,
                                int cols, int format) {
    __shared__ uint16_t tile[BLK][BLK + TILE_PAD];
    __shared__ unsigned part[8];
    int tx = threadIdx.x, ty = threadIdx.y, rb = blockIdx.x, cb = blockIdx.y, t = ty * 32 + tx;
    const uint16_t *src = x + (size_t)rb * BLK * cols + (size_t)cb * BLK;
    unsigned run = 0;
    int vec_in = ((uintptr_t)x & 7) == 0; /* cols is a multiple of 128: every row's four values 8-byte aligned */
    for (int i = ty; i < BLK; i += 8) {
        const uint16_t *p = src + (size_t)i * cols + tx * 4;
        unsigned w0, w1;
        if (vec_in) {
            uint2 v = *reinterpret_cast<const uint2 *>(p);
            w0 = v.x, w1 = v.y;
        } else {
            w0 = p[0] | (unsigned)p[1] << 16, w1 = p[2] | (unsigned)p[3] << 16;
        }
        tile[i][tx * 4] = (uint16_t)w0, tile[i][tx * 4 + 1] = (uint16_t)(w0 >> 16);
        tile[i][tx * 4 + 2] = (uint16_t)w1, tile[i][tx * 4 + 3] = (uint16_t)(w1 >> 16);
        run = max(run, max(abs_bits2(w0), abs_bits2(w1)));
    }
    run = warp_max_bits(run);
    if (tx == 0) part[ty] = run;
    __syncthreads();
    for (int j = 0; j < 8; j++) run = max(run, part[j]);
    float iv, s = block_scale(run, format, &iv);
    if (t == 0) {
        if (inv) inv[(size_t)rb * (cols / BLK) + cb] = iv;
        if (inv_t) inv_t[(size_t)cb * (rows / BLK) + rb] = iv;
    }
    if (q)
        for (int i = ty; i < BLK; i += 8) {
            unsigned word = 0;
            for (int e = 0; e < 4; e += 2)
                word |= fp8_code2(widen1(tile[i][tx * 4 + e]) * s, widen1(tile[i][tx * 4 + e + 1]) * s, format) << (8 * e);
            *reinterpret_cast<unsigned *>(q + (size_t)(rb * BLK + i) * cols + (size_t)cb * BLK + tx * 4) = word;
        }
    if (qt)
        for (int w = t; w < BLK * BLK / 4; w += 256) { /* word w: qt row (x column) w / 32, x rows 4 (w % 32) .. + 3 */
            int j = w / (BLK / 4), rq = w % (BLK / 4) * 4;
            unsigned word = 0;
            for (int e = 0; e < 4; e += 2)
                word |= fp8_code2(widen1(tile[rq + e][j]) * s, widen1(tile[rq + e + 1][j]) * s, format) << (8 * e);
            *reinterpret_cast<unsigned *>(qt + (size_t)(cb * BLK + j) * rows + (size_t)rb * BLK + rq) = word;
        }
}
