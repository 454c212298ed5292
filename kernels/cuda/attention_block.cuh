/* Causal attention between two blocks of a context-parallel sequence on
 * CUDA (semantics in kernels/ops.h attention_block_forward/backward; the
 * CPU version, kernels/cpu/attention_block.c, is the reference). fp32
 * operands (the bf16 and fp8 tables widen, kernels/bf16_table.h). In a
 * header so that tests/unit/test_attention_block_emulated.cpp runs the
 * same source on the CPU.
 *
 * One warp per row: a query row in forward and for dq, a key row for dk
 * and dv. The lanes take 32 rows of the other side at a time (one score
 * each, a dot product over the head dim), and each lane owns head-dim
 * columns lane, lane+32, ... of what the warp accumulates. Every output
 * row has one writer, so results repeat bitwise (no atomics). Simple, not
 * fast: correct first; a tiled (flash) form is the next step. Head dims
 * up to ATTB_MAX_DIM. */
#pragma once
#include <math.h>
#include <stdint.h>

#define ATTB_MAX_DIM 256 /* head dims D and Dv: 8 columns per lane */
#define ATTB_COLS (ATTB_MAX_DIM / 32)
#define ATTB_FULL 0xffffffffu

static __device__ inline float attb_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ATTB_FULL, v, o));
    return v;
}
static __device__ inline float attb_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(ATTB_FULL, v, o);
    return v;
}
/* lane w's value */
static __device__ inline float attb_from(float v, int w) { return __shfl_sync(ATTB_FULL, v, w); }
static __device__ inline float attb_dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* where a block's rows live: row r of [B, 2c] rows of `ld` floats, head column offset `col` */
struct attb_rows {
    const float *p;
    int ld;
};
static __device__ inline const float *attb_row(attb_rows r, int b, int T, int t, int col) {
    return r.p + ((size_t)b * T + t) * r.ld + col;
}

/* the keys of half j a query of chunk qc at offset tq sees: 0 (a later chunk), tq + 1 (the same chunk), c */
static __device__ inline int attb_visible(int qc, int kc, int tq, int c) { return kc > qc ? 0 : kc == qc ? tq + 1 : c; }

/* forward: warp w = ((b * H) + h) * 2c + t; merges the block into o, lse */
static __global__ void attb_forward_k(float *o, float *lse, const float *q, const float *k, const float *v, int B,
                                      int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1, int first,
                                      float scale) {
    int T = 2 * c, lane = threadIdx.x % 32;
    long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (warp >= (long)B * H * T) return; /* whole warps */
    int t = (int)(warp % T), h = (int)(warp / T % H), b = (int)(warp / ((long)T * H)), kh = h / (H / KVH);
    int qc = t < c ? q0 : q1, tq = t % c;
    float *ls = lse + ((size_t)b * H + h) * T + t, *orow = o + ((size_t)b * T + t) * H * Dv + h * Dv;
    float prev = first ? -INFINITY : *ls; /* read before lane 0 writes it, last (the __syncwarp below) */
    const float *qr = q + ((size_t)b * T + t) * H * D + h * D;
    attb_rows kr = {k, KVH * D}, vr = {v, KVH * Dv};
    float m = -INFINITY, l = 0, acc[ATTB_COLS];
    for (int r = 0; r < ATTB_COLS; r++) acc[r] = 0;
    for (int j = 0; j < 2; j++) {
        int n = attb_visible(qc, j ? k1 : k0, tq, c);
        for (int u0 = 0; u0 < n; u0 += 32) {
            int u = u0 + lane;
            float s = u < n ? scale * attb_dot(qr, attb_row(kr, b, T, j * c + u, kh * D), D) : -INFINITY;
            float mn = fmaxf(m, attb_max(s)); /* finite: lane 0's key is visible */
            float p = u < n ? expf(s - mn) : 0.0f, corr = m == -INFINITY ? 0.0f : expf(m - mn);
            l = l * corr + attb_sum(p);
            for (int r = 0; r < ATTB_COLS; r++) acc[r] *= corr;
            for (int w = 0; w < 32 && u0 + w < n; w++) {
                float pw = attb_from(p, w);
                const float *vw = attb_row(vr, b, T, j * c + u0 + w, kh * Dv);
                for (int r = 0; r < ATTB_COLS; r++)
                    if (lane + 32 * r < Dv) acc[r] += pw * vw[lane + 32 * r];
            }
            m = mn;
        }
    }
    /* merge by log-sum-exp into the running row (first: o starts at 0, lse at -inf) */
    float lb = l > 0 ? m + logf(l) : -INFINITY, keep, add, out_lse;
    if (lb == -INFINITY) { /* no key of this block is visible */
        keep = first ? 0.0f : 1.0f, add = 0.0f, out_lse = prev;
    } else if (prev == -INFINITY) {
        keep = 0.0f, add = 1.0f / l, out_lse = lb;
    } else {
        float top = fmaxf(prev, lb);
        out_lse = top + logf(expf(prev - top) + expf(lb - top));
        keep = expf(prev - out_lse), add = expf(m - out_lse);
    }
    for (int r = 0; r < ATTB_COLS; r++) {
        int d = lane + 32 * r;
        if (d < Dv) orow[d] = (keep == 0.0f ? 0.0f : orow[d] * keep) + acc[r] * add;
    }
    __syncwarp(); /* every lane has read prev (no shuffle ran if no key was visible) */
    if (lane == 0) *ls = out_lse;
}

/* delta[b, h, t] = rowsum(dout * out) of each query row (flash attention's backward term) */
static __global__ void attb_delta_k(float *delta, const float *dout, const float *out, int B, int T, int H, int Dv) {
    int lane = threadIdx.x % 32;
    long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (warp >= (long)B * H * T) return;
    int t = (int)(warp % T), h = (int)(warp / T % H), b = (int)(warp / ((long)T * H));
    const float *dr = dout + ((size_t)b * T + t) * H * Dv + h * Dv, *orow = out + ((size_t)b * T + t) * H * Dv + h * Dv;
    float s = 0;
    for (int d = lane; d < Dv; d += 32) s += dr[d] * orow[d];
    s = attb_sum(s);
    if (lane == 0) delta[((size_t)b * H + h) * T + t] = s;
}

/* the score of query row t (head h) and key row u (kv head kh), its probability from the final lse and
 * ds = p (dO . v - delta) scale */
struct attb_grad {
    float p, ds;
};
static __device__ inline attb_grad attb_pds(const float *qr, const float *kr, const float *dor, const float *vr,
                                            float L, float delta, int D, int Dv, float scale) {
    attb_grad g;
    float s = scale * attb_dot(qr, kr, D);
    g.p = L == -INFINITY ? 0.0f : expf(s - L);
    g.ds = g.p * (attb_dot(dor, vr, Dv) - delta) * scale;
    return g;
}

/* dq: warp per query row (b, h, t), accumulated (+=) over the keys of the block it sees */
static __global__ void attb_dq_k(float *dq, const float *dout, const float *lse, const float *delta, const float *q,
                          const float *k, const float *v, int B, int c, int H, int KVH, int D, int Dv, int q0, int q1,
                          int k0, int k1, float scale) {
    int T = 2 * c, lane = threadIdx.x % 32;
    long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (warp >= (long)B * H * T) return;
    int t = (int)(warp % T), h = (int)(warp / T % H), b = (int)(warp / ((long)T * H)), kh = h / (H / KVH);
    int qc = t < c ? q0 : q1, tq = t % c;
    size_t row = ((size_t)b * H + h) * T + t;
    float L = lse[row], dl = delta[row], acc[ATTB_COLS];
    const float *qr = q + ((size_t)b * T + t) * H * D + h * D, *dor = dout + ((size_t)b * T + t) * H * Dv + h * Dv;
    attb_rows kr = {k, KVH * D}, vr = {v, KVH * Dv};
    for (int r = 0; r < ATTB_COLS; r++) acc[r] = 0;
    for (int j = 0; j < 2; j++) {
        int n = attb_visible(qc, j ? k1 : k0, tq, c);
        for (int u0 = 0; u0 < n; u0 += 32) {
            int u = u0 + lane;
            float ds = 0;
            if (u < n)
                ds = attb_pds(qr, attb_row(kr, b, T, j * c + u, kh * D), dor, attb_row(vr, b, T, j * c + u, kh * Dv),
                              L, dl, D, Dv, scale).ds;
            for (int w = 0; w < 32 && u0 + w < n; w++) {
                float dw = attb_from(ds, w);
                const float *kw = attb_row(kr, b, T, j * c + u0 + w, kh * D);
                for (int r = 0; r < ATTB_COLS; r++)
                    if (lane + 32 * r < D) acc[r] += dw * kw[lane + 32 * r];
            }
        }
    }
    float *dqr = dq + ((size_t)b * T + t) * H * D + h * D;
    for (int r = 0; r < ATTB_COLS; r++)
        if (lane + 32 * r < D) dqr[lane + 32 * r] += acc[r];
}

/* dk, dv: warp per key row (b, kh, s), accumulated (+=) over the query rows of its heads that see it */
static __global__ void attb_dkv_k(float *dk, float *dv, const float *dout, const float *lse, const float *delta,
                           const float *q, const float *k, const float *v, int B, int c, int H, int KVH, int D, int Dv,
                           int q0, int q1, int k0, int k1, float scale) {
    int T = 2 * c, lane = threadIdx.x % 32, group = H / KVH;
    long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (warp >= (long)B * KVH * T) return;
    int s = (int)(warp % T), kh = (int)(warp / T % KVH), b = (int)(warp / ((long)T * KVH));
    int kc = s < c ? k0 : k1, su = s % c;
    const float *kr = k + ((size_t)b * T + s) * KVH * D + kh * D, *vr = v + ((size_t)b * T + s) * KVH * Dv + kh * Dv;
    float ak[ATTB_COLS], av[ATTB_COLS];
    for (int r = 0; r < ATTB_COLS; r++) ak[r] = av[r] = 0;
    for (int h = kh * group; h < (kh + 1) * group; h++)
        for (int i = 0; i < 2; i++) {
            int qc = i ? q1 : q0;
            if (kc > qc) continue;
            int from = kc == qc ? su : 0; /* same chunk: the queries at or after the key */
            for (int t0 = from; t0 < c; t0 += 32) {
                int t = i * c + t0 + lane;
                attb_grad g = {0.0f, 0.0f};
                if (t0 + lane < c) {
                    size_t row = ((size_t)b * H + h) * T + t, tr = (size_t)b * T + t;
                    g = attb_pds(q + tr * H * D + h * D, kr, dout + tr * H * Dv + h * Dv, vr, lse[row], delta[row], D,
                                 Dv, scale);
                }
                for (int w = 0; w < 32 && t0 + w < c; w++) {
                    float pw = attb_from(g.p, w), dw = attb_from(g.ds, w);
                    size_t tw = (size_t)b * T + i * c + t0 + w;
                    const float *qw = q + tw * H * D + h * D, *dow = dout + tw * H * Dv + h * Dv;
                    for (int r = 0; r < ATTB_COLS; r++) {
                        int d = lane + 32 * r;
                        if (d < D) ak[r] += dw * qw[d];
                        if (d < Dv) av[r] += pw * dow[d];
                    }
                }
            }
        }
    float *dkr = dk + ((size_t)b * T + s) * KVH * D + kh * D, *dvr = dv + ((size_t)b * T + s) * KVH * Dv + kh * Dv;
    for (int r = 0; r < ATTB_COLS; r++) {
        int d = lane + 32 * r;
        if (d < D) dkr[d] += ak[r];
        if (d < Dv) dvr[d] += av[r];
    }
}
