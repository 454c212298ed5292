/* Mixture-of-experts routing and token permutation on the CPU. Every output
 * row is written by one thread in a fixed order, so results repeat bitwise. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/moe_route.h"

void cpu_moe_route_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E,
                           int k) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++)
        route_softmax_token(probs + (size_t)t * E, lse + t, idx + (size_t)t * k, w + (size_t)t * k,
                            logits + (size_t)t * E, E, k);
}

void cpu_moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                            const float *w, const float *aux_coef, float z_scale, int n, int E, int k, int T, int r0) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++)
        route_softmax_token_backward(dlogits + (size_t)t * E, dw + (size_t)t * k, probs + (size_t)t * E, lse[t],
                                     idx + (size_t)t * k, w + (size_t)t * k,
                                     aux_coef ? aux_coef + (size_t)((r0 + t) / T) * E : NULL, z_scale, E, k);
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
