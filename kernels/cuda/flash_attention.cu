/* Flash attention for the bf16 table: causal grouped-query attention on bf16
 * q, k, v [B,T,heads,D] with fp32 accumulation on tensor cores (mma.sync
 * m16n8k16, operands from shared memory by ldmatrix), tiled so the T x T
 * scores never leave registers, online softmax, the kv head of query head h
 * read in place (h / group), no repeated heads materialised. State: each
 * row's natural log-sum-exp of the scaled scores, lse[B*H, T], the same as
 * the reference CUDA attention's, so either path's backward takes either
 * forward's state.
 *
 * Backward recomputes the probabilities from lse and needs the forward's
 * output for Delta = rowsum(dO * O); two kernels, no atomics, so it repeats
 * bitwise: one per query tile for dQ (a loop over kv tiles), one per kv tile
 * for dK and dV (a loop over the group's query heads in order, then query
 * tiles), dK and dV summed over the group in fp32 registers, rounded once.
 *
 * Head dims 64 and 128 (D = Dv); DeepSeek-V3's 192/128 needs a kernel with
 * two head widths (the tiles below take D only), so other shapes take the
 * reference path. Fragment layouts: PTX ISA, "Matrix fragments for
 * mma.m16n8k16" and "ldmatrix". A warp owns 16 rows of a 64-row tile:
 * lane = 4 g + t holds rows g and g + 8 of each accumulator, at columns
 * 2t and 2t + 1 of every 8-column block. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

namespace {

constexpr int TILE = 64;   /* query rows per block (forward, dQ); kv rows per block (dK/dV) and per kv tile */
constexpr int PAD = 8;     /* bf16 per smem row beyond D: rows shift by 4 banks, ldmatrix conflict-free */
constexpr int THREADS_FA = 128; /* 4 warps x 16 rows */
constexpr float LOG2E = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* the memory clobber keeps ldmatrix after the __syncthreads that publishes its tile */
__device__ __forceinline__ void ldsm(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_t(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

/* c[16x8] += a[16x16] b[16x8], bf16 in, fp32 accumulate */
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two floats as bf16 (round to nearest even), lo in the low half */
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

/* Addresses each lane gives ldmatrix.x4 (lanes 8i..8i+7: the rows of matrix i).
 * A operand, the 16 x 16 block at (r0, c0) of row-major smem:
 *   matrices (r0, c0) (r0+8, c0) (r0, c0+8) (r0+8, c0+8) -> a0..a3. */
__device__ __forceinline__ const uint16_t *a_addr(const uint16_t *s, int ld, int r0, int c0, int lane) {
    return s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}
/* B operand stored n-major (B(k, n) = S[n][k], like K in Q K^T): columns
 * n0..n0+15 at k-step k0 -> {b0, b1} of n-block n0, {b0, b1} of n0 + 8. */
__device__ __forceinline__ const uint16_t *bn_addr(const uint16_t *s, int ld, int n0, int k0, int lane) {
    return s + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
}
/* B operand stored k-major (B(k, n) = S[k][n], like V in P V), by .trans:
 * same register order as bn_addr. */
__device__ __forceinline__ const uint16_t *bk_addr(const uint16_t *s, int ld, int k0, int n0, int lane) {
    return s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}

/* rows r0 .. r0+R-1 of one head (g: its row 0, rows `stride` apart) into
 * smem rows of LD; rows at or past T read as zeros */
template <int D, int R>
__device__ __forceinline__ void load_rows(uint16_t *s, const uint16_t *g, size_t stride, int r0, int T) {
    constexpr int CH = D / 8, LD = D + PAD;
    for (int i = threadIdx.x; i < R * CH; i += THREADS_FA) {
        int r = i / CH, c = (i % CH) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) v = *reinterpret_cast<const uint4 *>(g + (size_t)(r0 + r) * stride + c);
        *reinterpret_cast<uint4 *>(s + r * LD + c) = v;
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* acc[16 x 8 NB] += A[16 x 16 KS] B: A rows r0.. of smem sa (ld LD), B n-major in sb */
template <int KS, int NB>
__device__ __forceinline__ void mma_rows_nmajor(float (*acc)[4], const uint16_t *sa, int r0, const uint16_t *sb, int ld,
                                                int lane) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a[4];
        ldsm(a, a_addr(sa, ld, r0, kk * 16, lane));
#pragma unroll
        for (int np = 0; np < NB / 2; np++) {
            uint32_t b[4];
            ldsm(b, bn_addr(sb, ld, np * 16, kk * 16, lane));
            mma(acc[2 * np], a, b[0], b[1]);
            mma(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* acc[16 x 8 NB] += P B where P [16 x 16 KS] is held as accumulators
 * (p[2 KS][4], rounded to bf16 here) and B is k-major in sb */
template <int KS, int NB>
__device__ __forceinline__ void mma_regs_kmajor(float (*acc)[4], const float (*p)[4], const uint16_t *sb, int ld,
                                                int lane) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a[4] = {pack2(p[2 * kk][0], p[2 * kk][1]), pack2(p[2 * kk][2], p[2 * kk][3]),
                         pack2(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < NB / 2; np++) {
            uint32_t b[4];
            ldsm_t(b, bk_addr(sb, ld, kk * 16, np * 16, lane));
            mma(acc[2 * np], a, b[0], b[1]);
            mma(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* rows g and g+8 of a warp's 16 x D accumulator, times s, as bf16 into rows
 * row0 and row0 + 8 (stride apart from o) below T */
template <int D>
__device__ __forceinline__ void store_rows(uint16_t *o, size_t stride, const float (*acc)[4], float s0, float s1,
                                           int row0, int T, int t) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        if (row >= T) continue;
        float s = r ? s1 : s0;
        uint16_t *dst = o + (size_t)row * stride + 2 * t;
#pragma unroll
        for (int nb = 0; nb < D / 8; nb++)
            *reinterpret_cast<uint32_t *>(dst + nb * 8) = pack2(acc[nb][2 * r] * s, acc[nb][2 * r + 1] * s);
    }
}

template <int D>
constexpr size_t forward_smem() {
    return (size_t)3 * TILE * (D + PAD) * 2;
}

/* grid (B*H, query tiles): the longest (last) query tiles of every pair first */
template <int D>
__global__ void __launch_bounds__(THREADS_FA) flash_forward_k(uint16_t *out, float *lse, const uint16_t *q,
                                                              const uint16_t *k, const uint16_t *v, int T, int H,
                                                              int KVH, float scale_log2) {
    constexpr int LD = D + PAD;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *Qs = smem, *Ks = Qs + TILE * LD, *Vs = Ks + TILE * LD;
    int qt = gridDim.y - 1 - blockIdx.y, pair = blockIdx.x, b = pair / H, h = pair % H, kh = h / (H / KVH);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int q0 = qt * TILE, row0 = q0 + warp * 16 + g;
    size_t qstride = (size_t)H * D, kstride = (size_t)KVH * D;
    const uint16_t *qg = q + ((size_t)b * T * H + h) * D;
    const uint16_t *kg = k + ((size_t)b * T * KVH + kh) * D, *vg = v + ((size_t)b * T * KVH + kh) * D;
    load_rows<D, TILE>(Qs, qg, qstride, q0, T);

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}, o[D / 8][4];
#pragma unroll
    for (int nb = 0; nb < D / 8; nb++) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0;
    int tiles = min(qt + 1, (T + TILE - 1) / TILE);
    for (int jt = 0; jt < tiles; jt++) {
        int k0 = jt * TILE;
        __syncthreads(); /* the previous tile's readers are done */
        load_rows<D, TILE>(Ks, kg, kstride, k0, T);
        load_rows<D, TILE>(Vs, vg, kstride, k0, T);
        __syncthreads();
        float s[TILE / 8][4];
#pragma unroll
        for (int nb = 0; nb < TILE / 8; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0;
        mma_rows_nmajor<D / 16, TILE / 8>(s, Qs, warp * 16, Ks, LD, lane);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < TILE / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int row = row0 + (c >> 1) * 8, col = k0 + nb * 8 + 2 * t + (c & 1);
                float x = (col <= row && col < T) ? s[nb][c] * scale_log2 : -INFINITY;
                s[nb][c] = x;
                mx[c >> 1] = fmaxf(mx[c >> 1], x);
            }
        float base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mn = fmaxf(m[r], quad_max(mx[r]));
            base[r] = mn == -INFINITY ? 0.0f : mn; /* a row with nothing visible yet keeps zeros */
            float alpha = exp2f(m[r] - base[r]);
            m[r] = mn;
            l[r] *= alpha;
#pragma unroll
            for (int nb = 0; nb < D / 8; nb++) o[nb][2 * r] *= alpha, o[nb][2 * r + 1] *= alpha;
        }
#pragma unroll
        for (int nb = 0; nb < TILE / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float p = exp2f(s[nb][c] - base[c >> 1]);
                s[nb][c] = p;
                l[c >> 1] += p;
            }
        mma_regs_kmajor<TILE / 16, D / 8>(o, s, Vs, LD, lane);
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] = quad_sum(l[r]);
        inv[r] = 1.0f / l[r];
        int row = row0 + 8 * r;
        if (t == 0 && row < T) lse[(size_t)pair * T + row] = m[r] / LOG2E + logf(l[r]);
    }
    store_rows<D>(out + ((size_t)b * T * H + h) * D, qstride, o, inv[0], inv[1], row0, T, t);
}

/* Delta[pair*T + t] = dO . O of each row (bf16 values, fp32 sum): a warp per row, grid-stride */
__global__ void delta_k(float *delta, const uint16_t *dout, const uint16_t *out, int B, int T, int H, int D) {
    size_t rows = (size_t)B * T * H, warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
        const uint16_t *a = dout + row * D, *o = out + row * D;
        float s = 0;
        for (int d = lane; d < D; d += 32) s += bf(a[d]) * bf(o[d]);
        for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        size_t b = row / ((size_t)T * H), tt = row / H % T, h = row % H;
        if (lane == 0) delta[(b * H + h) * T + tt] = s;
    }
}

template <int D>
constexpr size_t dq_smem() {
    return (size_t)4 * TILE * (D + PAD) * 2;
}

/* dQ = scale * sum over kv tiles of dS K, dS = P (dP - Delta), dP = dO V^T */
template <int D>
__global__ void __launch_bounds__(THREADS_FA) flash_dq_k(uint16_t *dq, const uint16_t *dout, const float *lse,
                                                         const float *delta, const uint16_t *q, const uint16_t *k,
                                                         const uint16_t *v, int T, int H, int KVH, float scale_log2,
                                                         float scale) {
    constexpr int LD = D + PAD;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *Qs = smem, *dOs = Qs + TILE * LD, *Ks = dOs + TILE * LD, *Vs = Ks + TILE * LD;
    int qt = gridDim.y - 1 - blockIdx.y, pair = blockIdx.x, b = pair / H, h = pair % H, kh = h / (H / KVH);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int q0 = qt * TILE, row0 = q0 + warp * 16 + g;
    size_t qstride = (size_t)H * D, kstride = (size_t)KVH * D, qoff = ((size_t)b * T * H + h) * D;
    const uint16_t *kg = k + ((size_t)b * T * KVH + kh) * D, *vg = v + ((size_t)b * T * KVH + kh) * D;
    load_rows<D, TILE>(Qs, q + qoff, qstride, q0, T);
    load_rows<D, TILE>(dOs, dout + qoff, qstride, q0, T);
    float lse2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        lse2[r] = row < T ? lse[(size_t)pair * T + row] * LOG2E : 0.0f;
        dl[r] = row < T ? delta[(size_t)pair * T + row] : 0.0f;
    }

    float acc[D / 8][4];
#pragma unroll
    for (int nb = 0; nb < D / 8; nb++) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0;
    int tiles = min(qt + 1, (T + TILE - 1) / TILE);
    for (int jt = 0; jt < tiles; jt++) {
        int k0 = jt * TILE;
        __syncthreads();
        load_rows<D, TILE>(Ks, kg, kstride, k0, T);
        load_rows<D, TILE>(Vs, vg, kstride, k0, T);
        __syncthreads();
        float s[TILE / 8][4], dp[TILE / 8][4];
#pragma unroll
        for (int nb = 0; nb < TILE / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[nb][c] = dp[nb][c] = 0;
        mma_rows_nmajor<D / 16, TILE / 8>(s, Qs, warp * 16, Ks, LD, lane);
        mma_rows_nmajor<D / 16, TILE / 8>(dp, dOs, warp * 16, Vs, LD, lane);
#pragma unroll
        for (int nb = 0; nb < TILE / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int r = c >> 1, row = row0 + r * 8, col = k0 + nb * 8 + 2 * t + (c & 1);
                float p = (col <= row && col < T && row < T) ? exp2f(s[nb][c] * scale_log2 - lse2[r]) : 0.0f;
                s[nb][c] = p * (dp[nb][c] - dl[r]);
            }
        mma_regs_kmajor<TILE / 16, D / 8>(acc, s, Ks, LD, lane);
    }
    store_rows<D>(dq + qoff, qstride, acc, scale, scale, row0, T, t);
}

/* query rows per step of the dK/dV kernel: two 16 x D accumulators already
 * hold 128 registers at D = 128 */
template <int D>
__host__ __device__ constexpr int dkdv_q_rows() {
    return D > 64 ? 32 : 64;
}
template <int D>
constexpr size_t dkdv_smem() {
    return (size_t)(2 * TILE + 2 * dkdv_q_rows<D>()) * (D + PAD) * 2 + (size_t)2 * dkdv_q_rows<D>() * 4;
}

/* grid (B*KVH, kv tiles): dV = sum P^T dO, dK = scale * sum dS^T Q over the
 * group's query heads (in order) and the query tiles at or after the kv tile */
template <int D>
__global__ void __launch_bounds__(THREADS_FA) flash_dkdv_k(uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                                           const float *lse, const float *delta, const uint16_t *q,
                                                           const uint16_t *k, const uint16_t *v, int T, int H, int KVH,
                                                           float scale_log2, float scale) {
    constexpr int LD = D + PAD, BQ = dkdv_q_rows<D>();
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *Ks = smem, *Vs = Ks + TILE * LD, *Qs = Vs + TILE * LD, *dOs = Qs + BQ * LD;
    float *lse_s = reinterpret_cast<float *>(dOs + BQ * LD), *dl_s = lse_s + BQ;
    int pair = blockIdx.x, b = pair / KVH, kh = pair % KVH, group = H / KVH;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int k0 = blockIdx.y * TILE, j0 = k0 + warp * 16 + g; /* this lane's kv rows j0, j0 + 8 */
    size_t qstride = (size_t)H * D, kstride = (size_t)KVH * D, koff = ((size_t)b * T * KVH + kh) * D;
    load_rows<D, TILE>(Ks, k + koff, kstride, k0, T);
    load_rows<D, TILE>(Vs, v + koff, kstride, k0, T);

    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int nb = 0; nb < D / 8; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) dka[nb][c] = dva[nb][c] = 0;
    for (int gi = 0; gi < group; gi++) {
        int h = kh * group + gi;
        size_t qoff = ((size_t)b * T * H + h) * D, srow = ((size_t)b * H + h) * T;
        for (int i0 = k0 / BQ * BQ; i0 < T; i0 += BQ) {
            __syncthreads();
            load_rows<D, BQ>(Qs, q + qoff, qstride, i0, T);
            load_rows<D, BQ>(dOs, dout + qoff, qstride, i0, T);
            for (int i = threadIdx.x; i < BQ; i += THREADS_FA) {
                lse_s[i] = i0 + i < T ? lse[srow + i0 + i] * LOG2E : 0.0f;
                dl_s[i] = i0 + i < T ? delta[srow + i0 + i] : 0.0f;
            }
            __syncthreads();
            float st[BQ / 8][4], dpt[BQ / 8][4]; /* S^T and dP^T: kv rows x query columns */
#pragma unroll
            for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) st[nb][c] = dpt[nb][c] = 0;
            mma_rows_nmajor<D / 16, BQ / 8>(st, Ks, warp * 16, Qs, LD, lane);
            mma_rows_nmajor<D / 16, BQ / 8>(dpt, Vs, warp * 16, dOs, LD, lane);
#pragma unroll
            for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int ic = nb * 8 + 2 * t + (c & 1), i = i0 + ic, j = j0 + (c >> 1) * 8;
                    float p = (i >= j && i < T && j < T) ? exp2f(st[nb][c] * scale_log2 - lse_s[ic]) : 0.0f;
                    st[nb][c] = p;
                    dpt[nb][c] = p * (dpt[nb][c] - dl_s[ic]);
                }
            mma_regs_kmajor<BQ / 16, D / 8>(dva, st, dOs, LD, lane);
            mma_regs_kmajor<BQ / 16, D / 8>(dka, dpt, Qs, LD, lane);
        }
    }
    int jrow = k0 + warp * 16 + g;
    store_rows<D>(dk + koff, kstride, dka, scale, scale, jrow, T, t);
    store_rows<D>(dv + koff, kstride, dva, 1.0f, 1.0f, jrow, T, t);
}

/* dynamic shared memory beyond 48 KiB needs the opt-in, once per kernel */
template <typename K>
void allow_smem(K kernel, size_t bytes, int *done) {
    if (*done) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = 1;
}

template <int D>
void forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int H, int KVH) {
    static int ready;
    size_t smem = forward_smem<D>();
    allow_smem(flash_forward_k<D>, smem, &ready);
    dim3 grid(B * H, (T + TILE - 1) / TILE);
    flash_forward_k<D><<<grid, THREADS_FA, smem>>>((uint16_t *)out, lse, (const uint16_t *)q, (const uint16_t *)k,
                                                   (const uint16_t *)v, T, H, KVH, 1.0f / sqrtf((float)D) * LOG2E);
    LAUNCH_CHECK();
}

template <int D>
void backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse, const float *q,
              const float *k, const float *v, int B, int T, int H, int KVH) {
    static int ready_dq, ready_dkdv;
    float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E; /* the forward's, bit for bit */
    size_t rows = (size_t)B * T * H;
    float *delta = (float *)cuda_scratch(SCRATCH_WORK, sizeof(float) * rows);
    delta_k<<<blocks_for(rows * 32, 256), 256>>>(delta, (const uint16_t *)dout, (const uint16_t *)out, B, T, H, D);
    LAUNCH_CHECK();
    size_t smem = dq_smem<D>();
    allow_smem(flash_dq_k<D>, smem, &ready_dq);
    flash_dq_k<D><<<dim3(B * H, (T + TILE - 1) / TILE), THREADS_FA, smem>>>(
        (uint16_t *)dq, (const uint16_t *)dout, lse, delta, (const uint16_t *)q, (const uint16_t *)k,
        (const uint16_t *)v, T, H, KVH, scale_log2, scale);
    LAUNCH_CHECK();
    smem = dkdv_smem<D>();
    allow_smem(flash_dkdv_k<D>, smem, &ready_dkdv);
    flash_dkdv_k<D><<<dim3(B * KVH, (T + TILE - 1) / TILE), THREADS_FA, smem>>>(
        (uint16_t *)dk, (uint16_t *)dv, (const uint16_t *)dout, lse, delta, (const uint16_t *)q, (const uint16_t *)k,
        (const uint16_t *)v, T, H, KVH, scale_log2, scale);
    LAUNCH_CHECK();
}

int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} // namespace

/* MTRAIN_ATTENTION=reference turns the kernels off (docs/model.md); they
 * need tensor-core bf16 (compute capability 8.0 or newer) */
int cuda_flash_attention_usable(int D, int Dv, const void *const *ptrs, int nptrs) {
    static int enabled = -1;
    if (enabled < 0) {
        const char *e = getenv("MTRAIN_ATTENTION");
        int dev = 0, major = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        enabled = major >= 8 && !(e && !strcmp(e, "reference"));
    }
    if (!enabled || D != Dv || (D != 64 && D != 128)) return 0;
    for (int i = 0; i < nptrs; i++)
        if (!aligned16(ptrs[i])) return 0;
    return 1;
}

void cuda_flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                  int H, int KVH, int D) {
    if (!B || !T || !H) return;
    if (D == 64) forward<64>(out, lse, q, k, v, B, T, H, KVH);
    else forward<128>(out, lse, q, k, v, B, T, H, KVH);
}

void cuda_flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                   int H, int KVH, int D) {
    if (!B || !T || !H) return;
    if (D == 64) backward<64>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH);
    else backward<128>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH);
}
