/* Causal grouped-query attention. Query head h reads kv head h / (H/KVH).
 * Probabilities are kept in att[B,H,T,T] (upper triangle zero) for backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void cpu_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                           int H, int KVH, int D) {
    int group = H / KVH;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int kh = h / group;
                const float *qr = q + (((size_t)b * T + t) * H + h) * D;
                float *p = att + (((size_t)b * H + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const float *kr = k + (((size_t)b * T + s) * KVH + kh) * D;
                    float dot = 0;
                    for (int i = 0; i < D; i++) dot += qr[i] * kr[i];
                    p[s] = dot * scale;
                    if (p[s] > maxv) maxv = p[s];
                }
                float sum = 0;
                for (int s = 0; s <= t; s++) {
                    p[s] = expf(p[s] - maxv);
                    sum += p[s];
                }
                float inv = 1.0f / sum;
                for (int s = 0; s <= t; s++) p[s] *= inv;
                for (int s = t + 1; s < T; s++) p[s] = 0;
                float *o = out + (((size_t)b * T + t) * H + h) * D;
                memset(o, 0, sizeof(float) * D);
                for (int s = 0; s <= t; s++) {
                    const float *vr = v + (((size_t)b * T + s) * KVH + kh) * D;
                    for (int i = 0; i < D; i++) o[i] += p[s] * vr[i];
                }
            }
}

/* Work is split by (batch, kv head) so each thread owns the dk/dv rows it
 * accumulates into: no atomics, and a fixed summation order. */
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att, const float *q,
                            const float *k, const float *v, int B, int T, int H, int KVH, int D) {
    int group = H / KVH;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *dp = malloc(sizeof(float) * T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < KVH; kh++) {
                for (int s = 0; s < T; s++) {
                    memset(dk + (((size_t)b * T + s) * KVH + kh) * D, 0, sizeof(float) * D);
                    memset(dv + (((size_t)b * T + s) * KVH + kh) * D, 0, sizeof(float) * D);
                }
                for (int h = kh * group; h < (kh + 1) * group; h++)
                    for (int t = 0; t < T; t++) {
                        const float *p = att + (((size_t)b * H + h) * T + t) * T;
                        const float *dor = dout + (((size_t)b * T + t) * H + h) * D;
                        const float *qr = q + (((size_t)b * T + t) * H + h) * D;
                        float *dqr = dq + (((size_t)b * T + t) * H + h) * D;
                        float pdp = 0;
                        for (int s = 0; s <= t; s++) {
                            const float *vr = v + (((size_t)b * T + s) * KVH + kh) * D;
                            float *dvr = dv + (((size_t)b * T + s) * KVH + kh) * D;
                            float d = 0;
                            for (int i = 0; i < D; i++) {
                                d += dor[i] * vr[i];
                                dvr[i] += p[s] * dor[i];
                            }
                            dp[s] = d;
                            pdp += p[s] * d;
                        }
                        memset(dqr, 0, sizeof(float) * D);
                        for (int s = 0; s <= t; s++) {
                            float ds = p[s] * (dp[s] - pdp) * scale;
                            const float *kr = k + (((size_t)b * T + s) * KVH + kh) * D;
                            float *dkr = dk + (((size_t)b * T + s) * KVH + kh) * D;
                            for (int i = 0; i < D; i++) {
                                dqr[i] += ds * kr[i];
                                dkr[i] += ds * qr[i];
                            }
                        }
                    }
            }
        free(dp);
    }
}
