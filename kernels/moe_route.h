/* Routing of one token, softmax (Mixtral) and DeepSeek-V3's sigmoid
 * (semantics in kernels/ops.h, moe_route_*), written once for the CPU
 * backend and the CUDA kernels (compiled as __host__ __device__ there) so
 * both decide alike, bitwise. */
#pragma once
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ROUTE_FN static __host__ __device__ inline
#else
#define ROUTE_FN static inline
#endif

/* Softmax over the E logits (p, and lse = log sum exp for the z-loss), then
 * the k largest p by repeated arg-max (k is small; ties: the lower expert),
 * weighted by p over the chosen ones' sum */
ROUTE_FN void route_softmax_token(float *p, float *lse, int32_t *ti, float *tw, const float *x, int E, int k) {
    float mx = x[0];
    for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    double sum = 0;
    for (int e = 0; e < E; e++) sum += exp((double)x[e] - mx);
    *lse = (float)(mx + log(sum));
    for (int e = 0; e < E; e++) p[e] = (float)(exp((double)x[e] - mx) / sum);
    float chosen = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int m = 0; m < j; m++) taken |= ti[m] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ti[j] = best;
        chosen += p[best];
    }
    for (int j = 0; j < k; j++) tw[j] = p[ti[j]] / chosen;
}

/* Its backward into g (E logits' gradients): the weights' gradient tdw, the
 * auxiliary loss's per-expert coefficients a (its sequence's; NULL: none)
 * and the z-loss (z_scale x lse^2) */
ROUTE_FN void route_softmax_token_backward(float *g, const float *tdw, const float *p, float lse, const int32_t *ti,
                                           const float *tw, const float *a, float z_scale, int E, int k) {
    for (int e = 0; e < E; e++) g[e] = a ? a[e] : 0.0f; /* dL/dprobs first, then dL/dlogits in place */
    /* w_j = p_j / S with S the sum of the chosen p: dL/dp_j = (dw_j - sum_m dw_m w_m) / S */
    float S = 0, dot = 0;
    for (int j = 0; j < k; j++) S += p[ti[j]], dot += tdw[j] * tw[j];
    for (int j = 0; j < k; j++) g[ti[j]] += (tdw[j] - dot) / S;
    /* softmax backward, and the z-loss's d(lse^2)/dlogits = 2 lse p */
    float pg = 0;
    for (int e = 0; e < E; e++) pg += p[e] * g[e];
    float z = z_scale * 2.0f * lse;
    for (int e = 0; e < E; e++) g[e] = p[e] * (g[e] - pg) + z * p[e];
}

#define ROUTE_MAX_GROUPS 64 /* config/recipe_validate.c enforces moe_n_group <= this */

ROUTE_FN float route_biased(const float *s, const float *bias, int e) { return s[e] + (bias ? bias[e] : 0.0f); }

/* Group-limited routing: a bit per group among the best topk_group groups,
 * each scored by the sum of its two best biased scores (ties: lower group). */
ROUTE_FN uint64_t route_group_mask(const float *s, const float *bias, int E, int n_group, int topk_group) {
    if (n_group <= 1) return ~(uint64_t)0;
    float score[ROUTE_MAX_GROUPS];
    int per = E / n_group;
    for (int g = 0; g < n_group; g++) {
        float a = -INFINITY, b = -INFINITY; /* best, second best */
        for (int e = g * per; e < (g + 1) * per; e++) {
            float v = route_biased(s, bias, e);
            if (v > a) b = a, a = v;
            else if (v > b) b = v;
        }
        score[g] = a + b;
    }
    uint64_t mask = 0;
    for (int j = 0; j < topk_group; j++) {
        int best = -1;
        for (int g = 0; g < n_group; g++)
            if (!(mask >> g & 1) && (best < 0 || score[g] > score[best])) best = g;
        mask |= (uint64_t)1 << best;
    }
    return mask;
}

ROUTE_FN void route_sigmoid_token(float *s, int32_t *idx, float *w, const float *x, const float *bias, int E, int k,
                                  int n_group, int topk_group, float scaling) {
    for (int e = 0; e < E; e++) s[e] = (float)(1.0 / (1.0 + exp(-(double)x[e])));
    uint64_t groups = route_group_mask(s, bias, E, n_group, topk_group);
    int per = n_group > 1 ? E / n_group : E;
    float chosen = 0;
    for (int j = 0; j < k; j++) { /* repeated arg-max of the biased score over eligible experts: k is small */
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (!(groups >> (e / per) & 1)) continue;
            int taken = 0;
            for (int m = 0; m < j; m++) taken |= idx[m] == e;
            if (!taken && (best < 0 || route_biased(s, bias, e) > route_biased(s, bias, best))) best = e;
        }
        idx[j] = best;
        chosen += s[best];
    }
    for (int j = 0; j < k; j++) w[j] = s[idx[j]] / chosen * scaling;
}

ROUTE_FN void route_sigmoid_token_backward(float *g, const float *dw, const float *s, const int32_t *idx, const float *w,
                                           const float *aux, int E, int k, float scaling) {
    for (int e = 0; e < E; e++) g[e] = 0.0f;
    if (aux) { /* balance loss on s_e / sum s: d/ds_e = (a_e - sum_j a_j s_j / sum s) / sum s */
        float total = 0, dot = 0;
        for (int e = 0; e < E; e++) total += s[e], dot += aux[e] * s[e];
        dot /= total;
        for (int e = 0; e < E; e++) g[e] = (aux[e] - dot) / total;
    }
    /* w_j = scaling s_j / S, S the sum of the chosen: d/ds_j = (scaling dw_j - sum_m dw_m w_m) / S */
    float S = 0, dot = 0;
    for (int j = 0; j < k; j++) S += s[idx[j]], dot += dw[j] * w[j];
    for (int j = 0; j < k; j++) g[idx[j]] += (scaling * dw[j] - dot) / S;
    for (int e = 0; e < E; e++) g[e] *= s[e] * (1.0f - s[e]);
}
