/* The balance statistics of MoE routing (kernels/ops.h moe_route_balance),
 * written once for the CPU op (kernels/cpu/moe_plan.c) and the CUDA kernels
 * (kernels/cuda/moe_plan.cuh, compiled __host__ __device__ there). */
#pragma once
#include <stddef.h>

#ifdef __CUDACC__
#define BALANCE_FN static __host__ __device__ inline
#else
#define BALANCE_FN static inline
#endif

/* the selections of (sequence, expert) i over every TP rank: the sum of counts_all [tp, BE] at i */
BALANCE_FN double moe_count_at(const float *counts_all, size_t BE, int tp, size_t i) {
    double c = 0;
    for (int r = 0; r < tp; r++) c += counts_all[(size_t)r * BE + i];
    return c;
}

/* one token's balance term: sum_e c[seq, e] p[e] / norm, norm 1 (softmax) or sum_e p[e] (sigmoid);
 * seq is the token's sequence's first index into [B, E] */
BALANCE_FN double moe_token_balance(const float *p, const float *counts_all, size_t BE, int tp, size_t seq, int E,
                                    int sigmoid) {
    double norm = 1, dot = 0;
    if (sigmoid) {
        norm = 0;
        for (int e = 0; e < E; e++) norm += p[e];
    }
    for (int e = 0; e < E; e++) dot += moe_count_at(counts_all, BE, tp, seq + e) * (p[e] / norm);
    return dot;
}
