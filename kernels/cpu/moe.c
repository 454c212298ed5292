/* Mixture-of-experts routing and token permutation on the CPU. Every output
 * row is written by one thread in a fixed order, so results repeat bitwise. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/moe_sigmoid_route.h"

void cpu_moe_route_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E,
                           int k) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        const float *x = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        float mx = x[0];
        for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += exp((double)x[e] - mx);
        lse[t] = (float)(mx + log(sum));
        for (int e = 0; e < E; e++) p[e] = (float)(exp((double)x[e] - mx) / sum);
        /* selection by repeated arg-max: k is small */
        int32_t *ti = idx + (size_t)t * k;
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
        for (int j = 0; j < k; j++) w[(size_t)t * k + j] = p[ti[j]] / chosen;
    }
}

void cpu_moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                            const float *w, const float *aux_coef, float z_scale, int n, int E, int k, int T, int r0) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        const float *p = probs + (size_t)t * E;
        const int32_t *ti = idx + (size_t)t * k;
        const float *tw = w + (size_t)t * k, *tdw = dw + (size_t)t * k;
        float *g = dlogits + (size_t)t * E; /* dL/dprobs first, then dL/dlogits in place */
        const float *a = aux_coef ? aux_coef + (size_t)((r0 + t) / T) * E : NULL; /* its sequence's */
        for (int e = 0; e < E; e++) g[e] = a ? a[e] : 0.0f;
        /* w_j = p_j / S with S the sum of the chosen p: dL/dp_j = (dw_j - sum_m dw_m w_m) / S */
        float S = 0, dot = 0;
        for (int j = 0; j < k; j++) S += p[ti[j]], dot += tdw[j] * tw[j];
        for (int j = 0; j < k; j++) g[ti[j]] += (tdw[j] - dot) / S;
        /* softmax backward, and the z-loss's d(lse^2)/dlogits = 2 lse p */
        float pg = 0;
        for (int e = 0; e < E; e++) pg += p[e] * g[e];
        float z = z_scale * 2.0f * lse[t];
        for (int e = 0; e < E; e++) g[e] = p[e] * (g[e] - pg) + z * p[e];
    }
}

void cpu_gather_rows(float *out, const float *x, const int32_t *rows, int n, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * C, x + (size_t)rows[i] * C, sizeof(float) * C);
}

void cpu_moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                     int accumulate) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * C;
        if (!accumulate) memset(o, 0, sizeof(float) * C);
        for (int j = 0; j < k; j++) {
            int32_t r = pos[(size_t)t * k + j];
            if (r < 0) continue;
            float s = w ? w[(size_t)t * k + j] : 1.0f;
            const float *yr = y + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += s * yr[c];
        }
    }
}

void cpu_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                              const float *w, int n, int k, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        const float *g = dout + (size_t)t * C;
        for (int j = 0; j < k; j++) {
            int32_t r = pos[(size_t)t * k + j];
            if (r < 0) {
                dw[(size_t)t * k + j] = 0;
                continue;
            }
            float s = w[(size_t)t * k + j];
            const float *yr = y + (size_t)r * C;
            float *d = dy + (size_t)r * C;
            double acc = 0;
            for (int c = 0; c < C; c++) d[c] = s * g[c], acc += (double)g[c] * yr[c];
            dw[(size_t)t * k + j] = (float)acc;
        }
    }
}

void cpu_moe_route_sigmoid_forward(float *scores, int32_t *idx, float *w, const float *logits, const float *bias, int n,
                                   int E, int k, int n_group, int topk_group, float scaling) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++)
        route_sigmoid_token(scores + (size_t)t * E, idx + (size_t)t * k, w + (size_t)t * k, logits + (size_t)t * E, bias,
                            E, k, n_group, topk_group, scaling);
}

void cpu_moe_route_sigmoid_backward(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                    const float *w, const float *aux_coef, int n, int E, int k, float scaling, int T,
                                    int r0) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++)
        route_sigmoid_token_backward(dlogits + (size_t)t * E, dw + (size_t)t * k, scores + (size_t)t * E,
                                     idx + (size_t)t * k, w + (size_t)t * k,
                                     aux_coef ? aux_coef + (size_t)((r0 + t) / T) * E : NULL,
                                     E, k, scaling);
}
