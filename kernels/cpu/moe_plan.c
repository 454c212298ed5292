/* Routing decisions of a mixture-of-experts layer on the CPU (semantics in
 * kernels/ops.h, moe_route_counts .. moe_expert_order): what model/moe.c
 * computed on the host before the decisions moved to the device, in the
 * same order, so these are the reference the CUDA kernels
 * (kernels/cuda/moe_plan.cuh) are tested against. Sequential: O(n k + B E)
 * per layer and micro batch, small next to the expert GEMMs. */
#include <string.h>

#include "config/common.h"
#include "kernels/cpu/cpu.h"
#include "kernels/moe_balance.h"

void cpu_moe_route_counts(float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B) {
    memset(counts, 0, sizeof(float) * B * E);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) counts[(size_t)((r0 + t) / T) * E + idx[(size_t)t * k + j]] += 1;
}


void cpu_moe_route_balance(float *coef, double *metrics, const float *counts_all, const float *probs, const float *lse,
                           int n, int E, int k, int T, int r0, int B, int tp, int tp_rank, int sigmoid, float aux_scale,
                           long cap) {
    size_t BE = (size_t)B * E;
    double f_scale = sigmoid ? (double)E / ((double)k * T) : (double)E / T;
    for (size_t i = 0; i < BE; i++) coef[i] = (float)(aux_scale * f_scale * moe_count_at(counts_all, BE, tp, i) / T);
    if (!metrics) return;
    double aux = 0, z = 0;
    for (int t = 0; t < n; t++) {
        aux += moe_token_balance(probs + (size_t)t * E, counts_all, BE, tp, (size_t)((r0 + t) / T) * E, E, sigmoid);
        if (!sigmoid) z += (double)lse[t] * lse[t];
    }
    metrics[E] += aux * f_scale / T;
    metrics[E + 1] += z / T;
    if (tp_rank != 0) return;
    for (size_t i = 0; i < BE; i++) {
        double c = moe_count_at(counts_all, BE, tp, i);
        metrics[i % E] += c;
        if (cap >= 0 && c > cap) metrics[E + 2] += c - cap;
    }
}

void cpu_moe_dispatch(int32_t *pos, int32_t *send_rows, float *expert_counts, const int32_t *idx,
                      const float *counts_all, int n, int k, int E, int T, int r0, int B, int tp_rank, long cap) {
    size_t BE = (size_t)B * E;
    int nk = n * k;
    /* the capacity: selections per (sequence, expert) in token order, earlier TP ranks' first */
    double *fill = xcalloc(BE, sizeof *fill);
    for (int r = 0; r < tp_rank; r++)
        for (size_t i = 0; i < BE; i++) fill[i] += counts_all[(size_t)r * BE + i];
    for (int i = 0; i < nk; i++) {
        size_t slot = (size_t)((r0 + i / k) / T) * E + idx[i];
        pos[i] = cap < 0 || fill[slot] < cap ? 0 : -1;
        fill[slot] += 1;
    }
    free(fill);
    /* the counting sort, stable: kept rows by expert, then the dropped ones */
    int *next = xcalloc(E + 1, sizeof *next);
    for (int i = 0; i < nk; i++) next[pos[i] < 0 ? E : idx[i]]++;
    for (int e = 0; e < E; e++) expert_counts[e] = (float)next[e];
    for (int e = 0, start = 0; e <= E; e++) {
        int c = next[e];
        next[e] = start, start += c;
    }
    for (int i = 0; i < nk; i++) {
        int kept = pos[i] >= 0, row = next[kept ? idx[i] : E]++;
        pos[i] = kept ? row : -1;
        send_rows[row] = i / k;
    }
    free(next);
}

void cpu_moe_expert_order(int32_t *order, int32_t *inverse, int32_t *offsets, const float *in, int ep, int El,
                          int rows) {
    offsets[0] = 0;
    for (int e = 0; e < El; e++) {
        offsets[e + 1] = offsets[e];
        for (int s = 0; s < ep; s++) offsets[e + 1] += (int)in[s * El + e];
    }
    CHECK(offsets[El] <= rows);
    if (!order) return;
    /* received rows: source s's block holds its rows for local experts 0..El-1 in turn */
    for (int s = 0, src = 0; s < ep; s++)
        for (int e = 0; e < El; e++) {
            int dst = offsets[e];
            for (int s2 = 0; s2 < s; s2++) dst += (int)in[s2 * El + e];
            for (int r = 0; r < (int)in[s * El + e]; r++, src++) order[dst + r] = src, inverse[src] = dst + r;
        }
}
