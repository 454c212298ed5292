/* The flash attention kernels (kernels/cuda/flash_attention.cu says what
 * they compute), written once against a small layer that the includer
 * defines, so the same source runs on the GPU and, in CI, under a CPU
 * emulation of warps (tests/unit/test_flash_emulated.cpp):
 *   FA_FN            qualifier of helper functions
 *   FA_KERNEL(name)  declares a kernel (THREADS_FA threads a block)
 *   FA_SHARED(name)  declares the block's dynamic shared memory, uint16_t *
 *   FA_CONST         qualifier of constexpr helpers used in kernels
 *   fa_sync()        __syncthreads
 *   fa_shfl_xor(v,o) __shfl_xor_sync over the whole warp (float)
 *   fa_syncwarp()    __syncwarp
 *   ldsm(r, p), ldsm_t(r, p)   ldmatrix.x4 (.trans) from shared memory
 *   mma(c, a, b0, b1)          mma.sync m16n8k16 row.col, bf16 in, fp32 accumulate
 *   pack2(lo, hi)    two floats as bf16 (round to nearest even), lo in the low half
 *   bf(b)            a bf16 value as float
 *   cp_async16(dst, src, valid)  cp.async.cg of 16 bytes global -> shared
 *                    (zeros when !valid; src is not read then)
 *   cp_async_commit(), cp_async_wait(n)  commit_group, wait_group n
 * and the CUDA names threadIdx, blockIdx, gridDim, blockDim. Tiles stream
 * into shared memory by cp.async, double-buffered: the next tile's copy
 * runs while the current one is multiplied. Fragment layouts: PTX ISA, "Matrix fragments for
 * mma.m16n8k16" and "ldmatrix". */
#pragma once
#include <math.h>
#include <stdint.h>


constexpr int TILE = 64;   /* query rows per forward and dQ block; kv rows per forward step and per dK/dV block */
constexpr int PAD = 8;     /* bf16 per smem row beyond D: rows shift by 4 banks, ldmatrix conflict-free */
constexpr int THREADS_FA = 128; /* 4 warps */
constexpr float LOG2E = 1.4426950408889634f;

/* Context parallelism's block form (kernels/cuda/attention_block_flash.cu),
 * the kernels' BLK instances: one pair of T-row chunks, a query chunk and a
 * key chunk, not a whole sequence. seq: rows from one batch to the next in
 * q, k, v, dO (and from one (b, h) to the next in lse and Delta); q_pos:
 * the query chunk's position past the key chunk's (key j visible to query
 * i when j <= i + q_pos: 0 the same chunk, causal; T an earlier chunk, all
 * visible); the results fp32, merged into o32 and lse by log-sum-exp (the
 * forward) or added to dq32, dk32, dv32 (the backward), not stored as bf16. */
struct fa_blk {
    int seq, q_pos;
    float *o32, *dq32, *dk32, *dv32;
};

/* Addresses each lane gives ldmatrix.x4 (lanes 8i..8i+7: the rows of matrix i).
 * A operand, the 16 x 16 block at (r0, c0) of row-major smem:
 *   matrices (r0, c0) (r0+8, c0) (r0, c0+8) (r0+8, c0+8) -> a0..a3. */
FA_FN const uint16_t *a_addr(const uint16_t *s, int ld, int r0, int c0, int lane) {
    return s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}
/* B operand stored n-major (B(k, n) = S[n][k], like K in Q K^T): columns
 * n0..n0+15 at k-step k0 -> {b0, b1} of n-block n0, {b0, b1} of n0 + 8. */
FA_FN const uint16_t *bn_addr(const uint16_t *s, int ld, int n0, int k0, int lane) {
    return s + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
}
/* B operand stored k-major (B(k, n) = S[k][n], like V in P V), by .trans:
 * same register order as bn_addr. */
FA_FN const uint16_t *bk_addr(const uint16_t *s, int ld, int k0, int n0, int lane) {
    return s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}

/* rows r0 .. r0+R-1 of one head (g: its row 0, rows `stride` apart) into
 * smem rows of LD, asynchronously (cp.async; visible after cp_async_wait
 * and a barrier); rows at or past T read as zeros */
template <int D, int R>
FA_FN void load_rows(uint16_t *s, const uint16_t *g, size_t stride, int r0, int T) {
    constexpr int CH = D / 8, LD = D + PAD;
    for (int i = threadIdx.x; i < R * CH; i += THREADS_FA) {
        int r = i / CH, c = (i % CH) * 8, ok = r0 + r < T;
        cp_async16(s + r * LD + c, ok ? g + (size_t)(r0 + r) * stride + c : g, ok);
    }
}

/* NB 16 x 8 accumulator tiles set to zero */
template <int NB>
FA_FN void zero_acc(float (*acc)[4]) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0;
}

FA_FN float quad_max(float v) {
    v = fmaxf(v, fa_shfl_xor(v, 1));
    return fmaxf(v, fa_shfl_xor(v, 2));
}
FA_FN float quad_sum(float v) {
    v += fa_shfl_xor(v, 1);
    return v + fa_shfl_xor(v, 2);
}

/* acc[16 x 8 NB] += A[16 x 16 KS] B: A rows r0.. of smem sa, B n-major in sb (both rows ld apart) */
template <int KS, int NB>
FA_FN void mma_rows_nmajor(float (*acc)[4], const uint16_t *sa, int r0, const uint16_t *sb, int ld, int lane) {
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
FA_FN void mma_regs_kmajor(float (*acc)[4], const float (*p)[4], const uint16_t *sb, int ld, int lane) {
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
FA_FN void store_rows(uint16_t *o, size_t stride, const float (*acc)[4], float s0, float s1,
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

/* the same rows, times s, added to fp32 rows (the block form's gradients) */
template <int D>
FA_FN void add_rows_f32(float *o, size_t stride, const float (*acc)[4], float s0, float s1, int row0, int T, int t) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        if (row >= T) continue;
        float s = r ? s1 : s0, *dst = o + (size_t)row * stride + 2 * t;
#pragma unroll
        for (int nb = 0; nb < D / 8; nb++) dst[nb * 8] += acc[nb][2 * r] * s, dst[nb * 8 + 1] += acc[nb][2 * r + 1] * s;
    }
}

/* acc[16 x 8 NB] += A B with A [16 x 16 KS] held as fragments in registers
 * (af, loaded once by a kernel for its whole loop: the forward's and dQ
 * kernel's query rows) and B n-major in sb. Measured on an H200
 * (2026-11-26): the forward with Q's fragments kept took 2.50 ms where
 * reloading them per kv tile took 3.34 (and two m-tiles a warp, reloaded, 2.95). */
template <int KS, int NB>
FA_FN void mma_frags_nmajor(float (*acc)[4], const uint32_t (*af)[4], const uint16_t *sb, int ld, int lane) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int np = 0; np < NB / 2; np++) {
            uint32_t b[4];
            ldsm(b, bn_addr(sb, ld, np * 16, kk * 16, lane));
            mma(acc[2 * np], af[kk], b[0], b[1]);
            mma(acc[2 * np + 1], af[kk], b[2], b[3]);
        }
}

/* a warp's 16 rows (r0..) of smem sa as A fragments over KS 16-column steps */
template <int KS>
FA_FN void load_frags(uint32_t (*af)[4], const uint16_t *sa, int ld, int r0, int lane) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) ldsm(af[kk], a_addr(sa, ld, r0, kk * 16, lane));
}

/* Q, then two buffers each of K and V (query/key head dim D, value head dim DV) */
template <int D, int DV>
constexpr size_t forward_smem() {
    return ((size_t)3 * TILE * (D + PAD) + (size_t)2 * TILE * (DV + PAD)) * 2;
}

/* grid (B*H, query tiles): the longest (last) query tiles of every pair
 * first; warp w owns query rows 16 w .. of the tile (BLK: fa_blk's block
 * form, out unused) */
template <int D, int DV, bool BLK = false>
FA_KERNEL(flash_forward_k)(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v, int T,
                           int H, int KVH, float scale_log2, fa_blk blk) {
    constexpr int LD = D + PAD, TL = TILE * LD, LDV = DV + PAD, TLV = TILE * LDV;
    FA_SHARED(smem);
    uint16_t *Qs = smem, *Kb = Qs + TL, *Vb = Kb + 2 * TL;
    int qt = gridDim.y - 1 - blockIdx.y, pair = blockIdx.x, b = pair / H, h = pair % H, kh = h / (H / KVH);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int q0 = qt * TILE, row0 = q0 + warp * 16 + g, seq = BLK ? blk.seq : T, qp = BLK ? blk.q_pos : 0;
    size_t qstride = (size_t)H * D, kstride = (size_t)KVH * D, vstride = (size_t)KVH * DV;
    const uint16_t *qg = q + ((size_t)b * seq * H + h) * D;
    const uint16_t *kg = k + ((size_t)b * seq * KVH + kh) * D, *vg = v + ((size_t)b * seq * KVH + kh) * DV;
    load_rows<D, TILE>(Qs, qg, qstride, q0, T);
    load_rows<D, TILE>(Kb, kg, kstride, 0, T);
    load_rows<DV, TILE>(Vb, vg, vstride, 0, T);
    cp_async_commit();

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}, o[DV / 8][4];
    uint32_t qf[D / 16][4]; /* this warp's 16 query rows as A operands, loaded once */
    zero_acc<DV / 8>(o);
    /* through the tile of the last row's last visible key (the whole-sequence form: this tile) */
    int tiles = BLK ? (q0 + TILE - 1 + qp) / TILE + 1 : qt + 1;
    tiles = tiles < (T + TILE - 1) / TILE ? tiles : (T + TILE - 1) / TILE;
    for (int jt = 0; jt < tiles; jt++) {
        int k0 = jt * TILE, cur = jt & 1;
        if (jt + 1 < tiles) { /* prefetch the next tile into the other buffer */
            load_rows<D, TILE>(Kb + (cur ^ 1) * TL, kg, kstride, k0 + TILE, T);
            load_rows<DV, TILE>(Vb + (cur ^ 1) * TLV, vg, vstride, k0 + TILE, T);
        }
        cp_async_commit();
        cp_async_wait(1); /* all but the prefetch: this tile (and Q) landed */
        fa_sync();
        const uint16_t *Ks = Kb + cur * TL, *Vs = Vb + cur * TLV;
        if (jt == 0) load_frags<D / 16>(qf, Qs, LD, warp * 16, lane);
        float s[TILE / 8][4];
        zero_acc<TILE / 8>(s);
        mma_frags_nmajor<D / 16, TILE / 8>(s, qf, Ks, LD, lane);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < TILE / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int row = row0 + (c >> 1) * 8, col = k0 + nb * 8 + 2 * t + (c & 1);
                float x = (col <= row + qp && col < T) ? s[nb][c] * scale_log2 : -INFINITY;
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
            for (int nb = 0; nb < DV / 8; nb++) o[nb][2 * r] *= alpha, o[nb][2 * r + 1] *= alpha;
        }
#pragma unroll
        for (int nb = 0; nb < TILE / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float p = exp2f(s[nb][c] - base[c >> 1]);
                s[nb][c] = p;
                l[c >> 1] += p;
            }
        mma_regs_kmajor<TILE / 16, DV / 8>(o, s, Vs, LDV, lane);
        fa_sync(); /* the next iteration's prefetch overwrites this buffer */
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = quad_sum(l[r]), inv[r] = 1.0f / l[r];
    if (BLK) { /* merged into the running rows: every lane of a row's quad reads its lse before lane t 0 writes it */
        float keep[2], add[2], nl[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + 8 * r;
            float prev = row < T ? lse[(size_t)pair * seq + row] : -INFINITY, lb = m[r] / LOG2E + logf(l[r]);
            if (prev == -INFINITY) { /* nothing merged yet (the running rows start at lse -inf, o 0) */
                keep[r] = 0.0f, add[r] = inv[r], nl[r] = lb;
            } else {
                float top = fmaxf(prev, lb);
                nl[r] = top + logf(expf(prev - top) + expf(lb - top));
                keep[r] = expf(prev - nl[r]), add[r] = expf(lb - nl[r]) * inv[r];
            }
        }
        fa_syncwarp();
        float *og = blk.o32 + ((size_t)b * seq * H + h) * DV;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + 8 * r;
            if (row >= T) continue;
            if (t == 0) lse[(size_t)pair * seq + row] = nl[r];
            float *dst = og + (size_t)row * H * DV + 2 * t;
#pragma unroll
            for (int nb = 0; nb < DV / 8; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float x = o[nb][2 * r + e] * add[r];
                    dst[nb * 8 + e] = keep[r] == 0.0f ? x : dst[nb * 8 + e] * keep[r] + x;
                }
        }
    } else {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + 8 * r;
            if (t == 0 && row < T) lse[(size_t)pair * T + row] = m[r] / LOG2E + logf(l[r]);
        }
        store_rows<DV>(out + ((size_t)b * T * H + h) * DV, (size_t)H * DV, o, inv[0], inv[1], row0, T, t);
    }
}

/* the block form's chunk pairs (kernels/ops.h attention_block_forward): each
 * (query half qi, key half kj) of a block whose key chunk is not after its
 * query chunk, with its q_pos (0 the same chunk, c an earlier one); a host
 * function, so the GPU build and the emulated test launch the same pairs */
template <typename F>
inline void fa_block_pairs(int c, int q0, int q1, int k0, int k1, F pair) {
    for (int qi = 0; qi < 2; qi++)
        for (int kj = 0; kj < 2; kj++) {
            int qc = qi ? q1 : q0, kc = kj ? k1 : k0;
            if (kc <= qc) pair(qi, kj, kc == qc ? 0 : c);
        }
}

/* Delta[pair*T + t] = dO . O of each row (bf16 values, fp32 sum): a warp per row, grid-stride */
FA_KERNEL(delta_k)(float *delta, const uint16_t *dout, const uint16_t *out, int B, int T, int H, int D) {
    size_t rows = (size_t)B * T * H, warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
        const uint16_t *a = dout + row * D, *o = out + row * D;
        float s = 0;
        for (int d = lane; d < D; d += 32) s += bf(a[d]) * bf(o[d]);
        for (int off = 16; off; off >>= 1) s += fa_shfl_xor(s, off);
        size_t b = row / ((size_t)T * H), tt = row / H % T, h = row % H;
        if (lane == 0) delta[(b * H + h) * T + tt] = s;
    }
}

/* kv rows per step of the dQ kernel. Measured on an H200 (2026-11-26, the
 * 8B stack's attention, B 1, T 8192, 32/8 heads, D 128): 32-row steps that
 * reload the query rows' fragments, a warp skipping the kv rows above its
 * diagonal and masking only on the tiles the diagonal or the end crosses,
 * took the backward from 9.40 to 8.64 ms; 64-row steps with the Q and dO
 * fragments kept in registers (as the forward keeps Q's) took 10.07. */
constexpr int DQ_KT = 32;

template <int D, int DV>
constexpr size_t dq_smem() { /* Q and dO (TILE rows), then two buffers each of DQ_KT rows of K and V */
    return ((size_t)(TILE + 2 * DQ_KT) * (D + PAD) + (size_t)(TILE + 2 * DQ_KT) * (DV + PAD)) * 2;
}

/* dQ = scale * sum over kv tiles of dS K, dS = P (dP - Delta), dP = dO V^T;
 * grid (B*H, query tiles), warp w owns query rows 16 w .. of the tile */
template <int D, int DV, bool BLK = false>
FA_KERNEL(flash_dq_k)(uint16_t *dq, const uint16_t *dout, const float *lse, const float *delta, const uint16_t *q,
                      const uint16_t *k, const uint16_t *v, int T, int H, int KVH, float scale_log2, float scale,
                      fa_blk blk) {
    constexpr int KT = DQ_KT, LD = D + PAD, LDV = DV + PAD, TL = KT * LD, TLV = KT * LDV;
    FA_SHARED(smem);
    uint16_t *Qs = smem, *dOs = Qs + TILE * LD, *Kb = dOs + TILE * LDV, *Vb = Kb + 2 * TL;
    int qt = gridDim.y - 1 - blockIdx.y, pair = blockIdx.x, b = pair / H, h = pair % H, kh = h / (H / KVH);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int q0 = qt * TILE, w0 = q0 + warp * 16, row0 = w0 + g, seq = BLK ? blk.seq : T, qp = BLK ? blk.q_pos : 0;
    size_t qstride = (size_t)H * D, kstride = (size_t)KVH * D, qoff = ((size_t)b * seq * H + h) * D;
    size_t ostride = (size_t)H * DV, vstride = (size_t)KVH * DV;
    const uint16_t *kg = k + ((size_t)b * seq * KVH + kh) * D, *vg = v + ((size_t)b * seq * KVH + kh) * DV;
    load_rows<D, TILE>(Qs, q + qoff, qstride, q0, T);
    load_rows<DV, TILE>(dOs, dout + ((size_t)b * seq * H + h) * DV, ostride, q0, T);
    load_rows<D, KT>(Kb, kg, kstride, 0, T);
    load_rows<DV, KT>(Vb, vg, vstride, 0, T);
    cp_async_commit();
    float lse2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        lse2[r] = row < T ? lse[(size_t)pair * seq + row] * LOG2E : 0.0f;
        dl[r] = row < T ? delta[(size_t)pair * seq + row] : 0.0f;
    }

    float acc[D / 8][4];
    zero_acc<D / 8>(acc);
    int last = q0 + TILE + qp < T ? q0 + TILE + qp : T, tiles = (last + KT - 1) / KT;
    for (int jt = 0; jt < tiles; jt++) {
        int k0 = jt * KT, cur = jt & 1;
        if (jt + 1 < tiles) {
            load_rows<D, KT>(Kb + (cur ^ 1) * TL, kg, kstride, k0 + KT, T);
            load_rows<DV, KT>(Vb + (cur ^ 1) * TLV, vg, vstride, k0 + KT, T);
        }
        cp_async_commit();
        cp_async_wait(1);
        fa_sync();
        const uint16_t *Ks = Kb + cur * TL, *Vs = Vb + cur * TLV;
        if (k0 <= w0 + 15 + qp && w0 < T) { /* some of this warp's rows see some of the tile */
            float s[KT / 8][4], dp[KT / 8][4];
            zero_acc<KT / 8>(s);
            zero_acc<KT / 8>(dp);
            mma_rows_nmajor<D / 16, KT / 8>(s, Qs, warp * 16, Ks, LD, lane);
            mma_rows_nmajor<DV / 16, KT / 8>(dp, dOs, warp * 16, Vs, LDV, lane);
            int edge = k0 + KT - 1 > w0 + qp || k0 + KT > T || w0 + 15 >= T; /* a mask, the end or rows past it */
#pragma unroll
            for (int nb = 0; nb < KT / 8; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int r = c >> 1, row = row0 + r * 8, col = k0 + nb * 8 + 2 * t + (c & 1);
                    float p = !edge || (col <= row + qp && col < T && row < T) ? exp2f(s[nb][c] * scale_log2 - lse2[r])
                                                                          : 0.0f;
                    s[nb][c] = p * (dp[nb][c] - dl[r]);
                }
            mma_regs_kmajor<KT / 16, D / 8>(acc, s, Ks, LD, lane);
        }
        fa_sync();
    }
    if (BLK) add_rows_f32<D>(blk.dq32 + qoff, qstride, acc, scale, scale, row0, T, t);
    else store_rows<D>(dq + qoff, qstride, acc, scale, scale, row0, T, t);
}

/* query rows per step of the dK/dV kernel: two 16 x D accumulators already
 * hold 128 registers at D = 128 */
template <int D>
FA_CONST int dkdv_q_rows() { /* query rows per step: the dK and dV accumulators take 2 D / 8 * 4 registers */
    return D > 64 ? 32 : 64;
}
/* K and V, then two buffers each of Q, dO, and the rows' lse and Delta */
template <int D, int DV>
constexpr size_t dkdv_smem() {
    return ((size_t)(TILE + 2 * dkdv_q_rows<D>()) * (D + PAD) + (size_t)(TILE + 2 * dkdv_q_rows<D>()) * (DV + PAD)) * 2 +
           (size_t)4 * dkdv_q_rows<D>() * 4;
}

/* grid (B*KVH, kv tiles): dV = sum P^T dO, dK = scale * sum dS^T Q over the
 * group's query heads (in order) and the query tiles at or after the kv tile:
 * step s of the loop is query head s / ntiles, tile s % ntiles. (Masking
 * only the steps the diagonal or the end crosses, as the dQ kernel does,
 * measured 0.8 ms slower here on an H200: the masks stay on every step.) */
template <int D, int DV, bool BLK = false>
FA_KERNEL(flash_dkdv_k)(uint16_t *dk, uint16_t *dv, const uint16_t *dout, const float *lse, const float *delta,
                        const uint16_t *q, const uint16_t *k, const uint16_t *v, int T, int H, int KVH,
                        float scale_log2, float scale, fa_blk blk) {
    constexpr int LD = D + PAD, LDV = DV + PAD, BQ = dkdv_q_rows<D>(), QL = BQ * LD, OL = BQ * LDV;
    FA_SHARED(smem);
    uint16_t *Ks = smem, *Vs = Ks + TILE * LD, *Qb = Vs + TILE * LDV, *dOb = Qb + 2 * QL;
    float *lse_b = reinterpret_cast<float *>(dOb + 2 * OL), *dl_b = lse_b + 2 * BQ;
    int pair = blockIdx.x, b = pair / KVH, kh = pair % KVH, group = H / KVH;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int k0 = blockIdx.y * TILE, j0 = k0 + warp * 16 + g; /* this lane's kv rows j0, j0 + 8 */
    int seq = BLK ? blk.seq : T, qp = BLK ? blk.q_pos : 0;
    int from = BLK && k0 < qp ? 0 : k0 - qp; /* the first query row seeing kv row k0 */
    int first = from / BQ * BQ, ntiles = (T - first + BQ - 1) / BQ, steps = group * ntiles;
    size_t qstride = (size_t)H * D, kstride = (size_t)KVH * D, koff = ((size_t)b * seq * KVH + kh) * D;
    size_t ostride = (size_t)H * DV, vstride = (size_t)KVH * DV, voff = ((size_t)b * seq * KVH + kh) * DV;
    /* step st's query tile, its rows' lse (log2 units) and Delta into buffer st & 1 */
    auto fetch = [&](int st) {
        int h = kh * group + st / ntiles, i0 = first + st % ntiles * BQ, buf = st & 1;
        size_t qoff = ((size_t)b * seq * H + h) * D, ooff = ((size_t)b * seq * H + h) * DV;
        size_t srow = ((size_t)b * H + h) * seq;
        load_rows<D, BQ>(Qb + buf * QL, q + qoff, qstride, i0, T);
        load_rows<DV, BQ>(dOb + buf * OL, dout + ooff, ostride, i0, T);
        for (int i = threadIdx.x; i < BQ; i += THREADS_FA) {
            lse_b[buf * BQ + i] = i0 + i < T ? lse[srow + i0 + i] * LOG2E : 0.0f;
            dl_b[buf * BQ + i] = i0 + i < T ? delta[srow + i0 + i] : 0.0f;
        }
    };
    load_rows<D, TILE>(Ks, k + koff, kstride, k0, T);
    load_rows<DV, TILE>(Vs, v + voff, vstride, k0, T);
    fetch(0);
    cp_async_commit();

    float dka[D / 8][4], dva[DV / 8][4];
    zero_acc<D / 8>(dka);
    zero_acc<DV / 8>(dva);
    for (int st = 0; st < steps; st++) {
        int i0 = first + st % ntiles * BQ, buf = st & 1;
        if (st + 1 < steps) fetch(st + 1);
        cp_async_commit();
        cp_async_wait(1);
        fa_sync();
        const uint16_t *Qs = Qb + buf * QL, *dOs = dOb + buf * OL;
        const float *lse_s = lse_b + buf * BQ, *dl_s = dl_b + buf * BQ;
        float sT[BQ / 8][4], dpT[BQ / 8][4]; /* S^T and dP^T: kv rows x query columns */
        zero_acc<BQ / 8>(sT);
        zero_acc<BQ / 8>(dpT);
        mma_rows_nmajor<D / 16, BQ / 8>(sT, Ks, warp * 16, Qs, LD, lane);
        mma_rows_nmajor<DV / 16, BQ / 8>(dpT, Vs, warp * 16, dOs, LDV, lane);
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int ic = nb * 8 + 2 * t + (c & 1), i = i0 + ic, j = j0 + (c >> 1) * 8;
                float p = (i + qp >= j && i < T && j < T) ? exp2f(sT[nb][c] * scale_log2 - lse_s[ic]) : 0.0f;
                sT[nb][c] = p;
                dpT[nb][c] = p * (dpT[nb][c] - dl_s[ic]);
            }
        mma_regs_kmajor<BQ / 16, DV / 8>(dva, sT, dOs, LDV, lane);
        mma_regs_kmajor<BQ / 16, D / 8>(dka, dpT, Qs, LD, lane);
        fa_sync(); /* the next step's fetch overwrites this buffer */
    }
    if (BLK) {
        add_rows_f32<D>(blk.dk32 + koff, kstride, dka, scale, scale, j0, T, t);
        add_rows_f32<DV>(blk.dv32 + voff, vstride, dva, 1.0f, 1.0f, j0, T, t);
    } else {
        store_rows<D>(dk + koff, kstride, dka, scale, scale, j0, T, t);
        store_rows<DV>(dv + voff, vstride, dva, 1.0f, 1.0f, j0, T, t);
    }
}
