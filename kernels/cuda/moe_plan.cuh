/* The routing decisions of an MoE layer on the GPU (semantics in
 * kernels/ops.h, moe_route_counts .. moe_expert_order; the CPU's in
 * kernels/cpu/moe_plan.c), in a header so that
 * tests/unit/test_moe_plan_emulated.cpp runs them on the CPU (under
 * tests/unit/cuda_emulation.h) against the CPU ops. Every decision has one
 * writer that takes its selections in token order, so choices and rows are
 * the CPU's bit for bit; sums of whole numbers (counts) may use atomics, as
 * they are exact in any order, and the balance and z-loss statistics are
 * summed in a fixed tree. */
#pragma once
#include <stdint.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/moe_balance.h"

enum { MOE_PLAN_CHUNK = 256 }; /* selections one thread of the counting sort takes in order */

/* the local tokens [*t0, *t1) of sequence b */
__device__ inline void moe_seq_tokens(int b, int n, int T, int r0, int *t0, int *t1) {
    int lo = b * T - r0, hi = (b + 1) * T - r0;
    *t0 = lo < 0 ? 0 : lo;
    *t1 = hi > n ? n : hi;
}

/* moe_counts_k's tokens and experts a block, and moe_balance_k's blocks (a power of two, 32 to 256);
 * tests/unit/test_moe_plan_emulated.cpp sets small ones, to take several of each */
#ifndef MOE_COUNT_TOKENS
#define MOE_COUNT_TOKENS 1024
#define MOE_COUNT_TILE 1024
#define MOE_BALANCE_BLOCKS 128
#endif

/* grid (chunks of MOE_COUNT_TOKENS tokens of a sequence, B, tiles of MOE_COUNT_TILE experts): a block counts
 * its tokens' selections of its experts in shared memory, then adds them to counts (zeroed before); counts
 * are whole numbers, so the atomics' order does not change them */
static __global__ void moe_counts_k(float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B) {
    __shared__ int h[MOE_COUNT_TILE];
    int b = blockIdx.y, e0 = blockIdx.z * MOE_COUNT_TILE, ne = min(MOE_COUNT_TILE, E - e0), t0, t1;
    for (int e = threadIdx.x; e < ne; e += blockDim.x) h[e] = 0;
    __syncthreads();
    moe_seq_tokens(b, n, T, r0, &t0, &t1);
    int c0 = t0 + blockIdx.x * MOE_COUNT_TOKENS, c1 = min(t1, c0 + MOE_COUNT_TOKENS);
    for (long s = (long)c0 * k + threadIdx.x; s < (long)c1 * k; s += blockDim.x) {
        int e = idx[s] - e0;
        if (e >= 0 && e < ne) atomicAdd(&h[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ne; e += blockDim.x)
        if (h[e]) atomicAdd(&counts[(size_t)b * E + e0 + e], (float)h[e]);
}

/* one thread per (sequence, expert): the coefficient, and TP rank 0's load and drops */
static __global__ void moe_coef_k(float *coef, double *metrics, const float *counts_all, int E, int T, int BE, int tp,
                                  int tp_rank, double f_scale, float aux_scale, long cap) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BE) return;
    double c = moe_count_at(counts_all, BE, tp, i);
    coef[i] = (float)(aux_scale * f_scale * c / T);
    if (!metrics || tp_rank != 0) return;
    atomicAdd(&metrics[i % E], c);
    if (cap >= 0 && c > cap) atomicAdd(&metrics[E + 2], c - (double)cap);
}

/* MOE_BALANCE_BLOCKS blocks (blockDim.x a power of two <= 256): block g's tokens' balance and z-loss terms
 * into part[2g], part[2g + 1] */
static __global__ void moe_balance_k(double *part, const float *counts_all, const float *probs, const float *lse,
                                     int n, int E, int T, int r0, int BE, int tp, int sigmoid) {
    __shared__ double buf[256];
    double aux = 0, z = 0;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        aux += moe_token_balance(probs + (size_t)t * E, counts_all, BE, tp, (size_t)((r0 + t) / T) * E, E, sigmoid);
        if (!sigmoid) z += (double)lse[t] * lse[t];
    }
    aux = block_sum(aux, buf);
    z = block_sum(z, buf);
    if (threadIdx.x == 0) part[2 * blockIdx.x] = aux, part[2 * blockIdx.x + 1] = z;
}

/* one block of MOE_BALANCE_BLOCKS threads: the partial sums in a fixed tree (the same sums every run) into
 * this rank's balance and z-loss statistics */
static __global__ void moe_balance_sum_k(double *metrics, const double *part, int E, int T, double f_scale) {
    __shared__ double buf[MOE_BALANCE_BLOCKS];
    double aux = block_sum(part[2 * threadIdx.x], buf), z = block_sum(part[2 * threadIdx.x + 1], buf);
    if (threadIdx.x == 0) metrics[E] += aux * f_scale / T, metrics[E + 1] += z / T;
}

/* the capacity, one thread per (sequence, expert): its selections in token order, earlier TP ranks' first */
static __global__ void moe_keep_k(int32_t *pos, const int32_t *idx, const float *counts_all, int n, int k, int E, int T,
                                  int r0, int B, int tp_rank, long cap) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, t0, t1;
    if (i >= B * E) return;
    double fill = 0;
    for (int r = 0; r < tp_rank; r++) fill += counts_all[(size_t)r * B * E + i];
    moe_seq_tokens(i / E, n, T, r0, &t0, &t1);
    for (int t = t0; t < t1; t++)
        for (int j = 0; j < k; j++)
            if (idx[(size_t)t * k + j] == i % E) {
                pos[(size_t)t * k + j] = fill < cap ? 0 : -1;
                fill += 1;
            }
}

/* the counting sort's bin of selection i: its expert, or E when dropped */
__device__ inline int moe_bin(const int32_t *pos, const int32_t *idx, int i, int E, int capped) {
    return capped && pos[i] < 0 ? E : idx[i];
}

/* one thread per chunk of MOE_PLAN_CHUNK selections: hist [chunks, E+1], its selections per bin */
static __global__ void moe_hist_k(int32_t *hist, const int32_t *pos, const int32_t *idx, int nk, int E, int capped) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c * MOE_PLAN_CHUNK >= nk) return;
    int32_t *h = hist + (size_t)c * (E + 1);
    for (int e = 0; e <= E; e++) h[e] = 0;
    int end = min(nk, (c + 1) * MOE_PLAN_CHUNK);
    for (int i = c * MOE_PLAN_CHUNK; i < end; i++) h[moe_bin(pos, idx, i, E, capped)]++;
}

/* one block: each chunk's first row in each bin (bins in order: experts, then the dropped) */
static __global__ void moe_scan_k(int32_t *hist, int32_t *start, float *expert_counts, int chunks, int E) {
    for (int e = threadIdx.x; e <= E; e += blockDim.x) {
        int run = 0;
        for (int c = 0; c < chunks; c++) {
            int v = hist[(size_t)c * (E + 1) + e];
            hist[(size_t)c * (E + 1) + e] = run;
            run += v;
        }
        start[e] = run;
        if (e < E) expert_counts[e] = (float)run;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0, s = 0; e <= E; e++) {
            int v = start[e];
            start[e] = s, s += v;
        }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x)
        for (int c = 0; c < chunks; c++) hist[(size_t)c * (E + 1) + e] += start[e];
}

/* one thread per chunk: rows in token order from the chunk's starts */
static __global__ void moe_assign_k(int32_t *pos, int32_t *send_rows, int32_t *hist, const int32_t *idx, int nk, int k,
                                    int E, int capped) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c * MOE_PLAN_CHUNK >= nk) return;
    int32_t *next = hist + (size_t)c * (E + 1);
    int end = min(nk, (c + 1) * MOE_PLAN_CHUNK);
    for (int i = c * MOE_PLAN_CHUNK; i < end; i++) {
        int bin = moe_bin(pos, idx, i, E, capped), row = next[bin]++;
        pos[i] = bin == E ? -1 : row;
        send_rows[row] = i / k;
    }
}

/* one thread: the experts' offsets and, with blocks, each received block (s, e)'s first
 * received row and first expert-major row: blocks [ep*El][2] */
static __global__ void moe_offsets_k(int32_t *offsets, int32_t *blocks, const float *in, int ep, int El) {
    if (threadIdx.x || blockIdx.x) return;
    offsets[0] = 0;
    for (int e = 0; e < El; e++) {
        offsets[e + 1] = offsets[e];
        for (int s = 0; s < ep; s++) offsets[e + 1] += (int)in[s * El + e];
    }
    if (!blocks) return;
    for (int s = 0, src = 0; s < ep; s++)
        for (int e = 0; e < El; e++) {
            int dst = offsets[e];
            for (int s2 = 0; s2 < s; s2++) dst += (int)in[s2 * El + e];
            blocks[2 * (s * El + e)] = src, blocks[2 * (s * El + e) + 1] = dst;
            src += (int)in[s * El + e];
        }
}

/* one thread per received row (rows a bound on the total) */
static __global__ void moe_order_k(int32_t *order, int32_t *inverse, const int32_t *blocks, const int32_t *offsets,
                                   const float *in, int ep, int El, int rows) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows || i >= offsets[El]) return;
    for (int q = 0; q < ep * El; q++) {
        int src = blocks[2 * q];
        if (i >= src && i < src + (int)in[q]) {
            int dst = blocks[2 * q + 1] + i - src;
            order[dst] = i, inverse[i] = dst;
            return;
        }
    }
}
