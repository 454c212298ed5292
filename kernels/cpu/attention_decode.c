/* Attention of a few new queries against a KV cache (incremental decoding,
 * model/decode.h). One (query, head) pair per OpenMP task; scores are formed
 * with plain loops: n is small (1 per generated token) and each key row is
 * read once per query head. */
#include <math.h>
#include <stdlib.h>

#include "config/common.h"
#include "kernels/cpu/cpu.h"

void cpu_attention_decode(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H, int KVH,
                          int D, int Dv) {
    int group = H / KVH, ldk = KVH * D, ldv = KVH * Dv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *p = xmalloc(sizeof(float) * (Tk > 0 ? Tk : 1)); /* one row of probabilities per thread */
#pragma omp for collapse(2) schedule(static)
        for (int i = 0; i < n; i++)
            for (int h = 0; h < H; h++) {
                int last = Tk - n + i; /* the query's own position: keys [0, last] are visible */
                const float *qi = q + ((size_t)i * H + h) * D;
                const float *kh = k + (size_t)(h / group) * D, *vh = v + (size_t)(h / group) * Dv;
                float maxv = -INFINITY;
                for (int j = 0; j <= last; j++) {
                    const float *kj = kh + (size_t)j * ldk;
                    float s = 0;
                    for (int d = 0; d < D; d++) s += qi[d] * kj[d];
                    p[j] = s * scale;
                    maxv = p[j] > maxv ? p[j] : maxv;
                }
                float sum = 0;
                for (int j = 0; j <= last; j++) sum += p[j] = expf(p[j] - maxv);
                float inv = 1.0f / sum, *o = out + ((size_t)i * H + h) * Dv;
                for (int d = 0; d < Dv; d++) o[d] = 0;
                for (int j = 0; j <= last; j++) {
                    const float *vj = vh + (size_t)j * ldv;
                    float w = p[j] * inv;
                    for (int d = 0; d < Dv; d++) o[d] += w * vj[d];
                }
            }
        free(p);
    }
}
