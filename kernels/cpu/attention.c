/* Causal grouped-query attention. Query head h reads kv head h / (H/KVH).
 * Each (batch, head) is a few small sgemms on strided views of the
 * [B,T,heads,D] tensors: BLAS computes the full T x T score block (twice the
 * causal work, but far faster than scalar loops) and the mask zeroes the
 * upper triangle of the probabilities, kept in att[B,H,T,T] for backward.
 * Inside the OpenMP region OpenBLAS runs each call single-threaded. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/cpu/cpu.h"

/* Row-wise causal softmax of scores already scaled, in place. */
static void causal_softmax(float *p, int T) {
    for (int t = 0; t < T; t++) {
        float *row = p + (size_t)t * T;
        float maxv = -INFINITY;
        for (int s = 0; s <= t; s++) maxv = row[s] > maxv ? row[s] : maxv;
        float sum = 0;
        for (int s = 0; s <= t; s++) {
            row[s] = expf(row[s] - maxv);
            sum += row[s];
        }
        float inv = 1.0f / sum;
        for (int s = 0; s <= t; s++) row[s] *= inv;
        for (int s = t + 1; s < T; s++) row[s] = 0;
    }
}

void cpu_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                           int H, int KVH, int D, int Dv) {
    int group = H / KVH, ldq = H * D, ldk = KVH * D, ldo = H * Dv, ldv = KVH * Dv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kh = h / group;
            const float *qb = q + (size_t)b * T * ldq + h * D;
            const float *kb = k + (size_t)b * T * ldk + kh * D;
            const float *vb = v + (size_t)b * T * ldv + kh * Dv;
            float *p = att + ((size_t)b * H + h) * T * T;
            float *ob = out + (size_t)b * T * ldo + h * Dv;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, qb, ldq, kb, ldk, 0.0f, p, T);
            causal_softmax(p, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, Dv, T, 1.0f, p, T, vb, ldv, 0.0f, ob, ldo);
        }
}

/* dP = dO V^T; dS = P * (dP - rowsum(P * dP)) * scale; dQ = dS K;
 * dK += dS^T Q; dV += P^T dO. Work is split by (batch, kv head) so each
 * thread owns the dk/dv rows it accumulates into: no atomics, and a fixed
 * summation order. */
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *att,
                            const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D, int Dv) {
    (void)out; /* the probabilities are kept */
    int group = H / KVH, ldq = H * D, ldk = KVH * D, ldo = H * Dv, ldv = KVH * Dv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *ds = malloc(sizeof(float) * T * T);
        CHECK(ds);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < KVH; kh++) {
                const float *kb = k + (size_t)b * T * ldk + kh * D, *vb = v + (size_t)b * T * ldv + kh * Dv;
                float *dkb = dk + (size_t)b * T * ldk + kh * D, *dvb = dv + (size_t)b * T * ldv + kh * Dv;
                for (int h = kh * group; h < (kh + 1) * group; h++) {
                    const float *p = att + ((size_t)b * H + h) * T * T;
                    const float *dob = dout + (size_t)b * T * ldo + h * Dv, *qb = q + (size_t)b * T * ldq + h * D;
                    float *dqb = dq + (size_t)b * T * ldq + h * D;
                    float beta = h == kh * group ? 0.0f : 1.0f; /* first head of the group overwrites */
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, Dv, T, 1.0f, p, T, dob, ldo, beta, dvb, ldv);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, Dv, 1.0f, dob, ldo, vb, ldv, 0.0f, ds, T);
                    for (int t = 0; t < T; t++) {
                        const float *pr = p + (size_t)t * T;
                        float *dr = ds + (size_t)t * T;
                        float dot = 0;
                        for (int s = 0; s <= t; s++) dot += pr[s] * dr[s];
                        for (int s = 0; s <= t; s++) dr[s] = pr[s] * (dr[s] - dot) * scale;
                        for (int s = t + 1; s < T; s++) dr[s] = 0;
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.0f, ds, T, kb, ldk, 0.0f, dqb, ldq);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, ds, T, qb, ldq, beta, dkb, ldk);
                }
            }
        free(ds);
    }
}
