/* Causal attention between two blocks of a context-parallel sequence
 * (kernels/ops.h attention_block_forward/backward; model/cp_attention.c runs
 * the ring). A block holds two chunks of c positions each; a query half
 * sees a key half whole when its chunk comes later, causally when it is the
 * same chunk, and not at all when it comes earlier, so a masked half is
 * skipped, not computed. Forward merges each block's normalised result into
 * running fp32 results by their log-sum-exp; backward recomputes the
 * probabilities from the final log-sum-exp (flash attention's form), so the
 * blocks' gradients add up to the whole sequence's. Work is split by
 * (batch, head) in forward and by (batch, kv head) in backward, so each
 * thread owns the rows it writes: no atomics, a fixed summation order. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/cpu/cpu.h"

/* the chunk of half i of a block whose chunks are (a, b) */
static int chunk_of(int i, int a, int b) { return i ? b : a; }

/* s [c, c] = scale * q_half k_half^T, causally masked (-inf) when diagonal */
static void scores(float *s, const float *qh, int ldq, const float *kh, int ldk, int c, int D, float scale,
                   int diagonal) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c, c, D, scale, qh, ldq, kh, ldk, 0.0f, s, c);
    if (!diagonal) return;
    for (int t = 0; t < c; t++)
        for (int u = t + 1; u < c; u++) s[(size_t)t * c + u] = -INFINITY;
}

void cpu_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B, int c,
                                 int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1, int first) {
    int group = H / KVH, T = 2 * c, ldq = H * D, ldk = KVH * D, ldo = H * Dv, ldv = KVH * Dv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *s = malloc(sizeof(float) * ((size_t)c * c + (size_t)c * Dv + 2 * (size_t)c));
        CHECK(s);
        float *ob = s + (size_t)c * c, *mx = ob + (size_t)c * Dv, *sum = mx + c;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int kh = h / group;
                float *ls = lse + ((size_t)b * H + h) * T, *obh = o + (size_t)b * T * ldo + h * Dv;
                if (first) {
                    for (int t = 0; t < T; t++) {
                        ls[t] = -INFINITY;
                        memset(obh + (size_t)t * ldo, 0, sizeof(float) * Dv);
                    }
                }
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++) {
                        int qc = chunk_of(i, q0, q1), kc = chunk_of(j, k0, k1);
                        if (kc > qc) continue; /* a later chunk: masked whole */
                        const float *qb = q + ((size_t)b * T + (size_t)i * c) * ldq + h * D;
                        const float *kb = k + ((size_t)b * T + (size_t)j * c) * ldk + kh * D;
                        const float *vb = v + ((size_t)b * T + (size_t)j * c) * ldv + kh * Dv;
                        scores(s, qb, ldq, kb, ldk, c, D, scale, kc == qc);
                        for (int t = 0; t < c; t++) {
                            float *row = s + (size_t)t * c, m = -INFINITY, l = 0;
                            for (int u = 0; u < c; u++) m = row[u] > m ? row[u] : m;
                            for (int u = 0; u < c; u++) l += row[u] = row[u] == -INFINITY ? 0.0f : expf(row[u] - m);
                            mx[t] = m, sum[t] = l;
                        }
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c, Dv, c, 1.0f, s, c, vb, ldv, 0.0f,
                                    ob, Dv);
                        for (int t = 0; t < c; t++) { /* merge this block's row into the running one */
                            float *orow = obh + (size_t)(i * c + t) * ldo, *prev = &ls[i * c + t];
                            float lb = mx[t] + logf(sum[t]);
                            if (*prev == -INFINITY) {
                                for (int d = 0; d < Dv; d++) orow[d] = ob[(size_t)t * Dv + d] / sum[t];
                                *prev = lb;
                                continue;
                            }
                            float top = *prev > lb ? *prev : lb;
                            float merged = top + logf(expf(*prev - top) + expf(lb - top));
                            float keep = expf(*prev - merged), add = expf(mx[t] - merged);
                            for (int d = 0; d < Dv; d++) orow[d] = orow[d] * keep + ob[(size_t)t * Dv + d] * add;
                            *prev = merged;
                        }
                    }
            }
        free(s);
    }
}

void cpu_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                  int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1) {
    int group = H / KVH, T = 2 * c, ldq = H * D, ldk = KVH * D, ldo = H * Dv, ldv = KVH * Dv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *p = malloc(sizeof(float) * (2 * (size_t)c * c + c));
        CHECK(p);
        float *ds = p + (size_t)c * c, *delta = ds + (size_t)c * c;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < KVH; kh++)
                for (int h = kh * group; h < (kh + 1) * group; h++) {
                    const float *ls = lse + ((size_t)b * H + h) * T;
                    for (int i = 0; i < 2; i++) {
                        const float *dob = dout + ((size_t)b * T + (size_t)i * c) * ldo + h * Dv;
                        const float *obh = out + ((size_t)b * T + (size_t)i * c) * ldo + h * Dv;
                        for (int t = 0; t < c; t++) { /* rowsum(dO * O) */
                            float dot = 0;
                            for (int d = 0; d < Dv; d++) dot += dob[(size_t)t * ldo + d] * obh[(size_t)t * ldo + d];
                            delta[t] = dot;
                        }
                        for (int j = 0; j < 2; j++) {
                            int qc = chunk_of(i, q0, q1), kc = chunk_of(j, k0, k1);
                            if (kc > qc) continue;
                            size_t qrow = (size_t)b * T + (size_t)i * c, krow = (size_t)b * T + (size_t)j * c;
                            const float *qb = q + qrow * ldq + h * D, *kb = k + krow * ldk + kh * D;
                            const float *vb = v + krow * ldv + kh * Dv;
                            float *dqb = dq + qrow * ldq + h * D, *dkb = dk + krow * ldk + kh * D;
                            float *dvb = dv + krow * ldv + kh * Dv;
                            scores(p, qb, ldq, kb, ldk, c, D, scale, kc == qc);
                            for (int t = 0; t < c; t++) { /* P from the final log-sum-exp */
                                float l = ls[i * c + t], *row = p + (size_t)t * c;
                                for (int u = 0; u < c; u++)
                                    row[u] = row[u] == -INFINITY || l == -INFINITY ? 0.0f : expf(row[u] - l);
                            }
                            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, Dv, c, 1.0f, p, c, dob, ldo, 1.0f,
                                        dvb, ldv);
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c, c, Dv, 1.0f, dob, ldo, vb, ldv,
                                        0.0f, ds, c);
                            for (int t = 0; t < c; t++)
                                for (int u = 0; u < c; u++) {
                                    size_t e = (size_t)t * c + u;
                                    ds[e] = p[e] * (ds[e] - delta[t]) * scale;
                                }
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c, D, c, 1.0f, ds, c, kb, ldk, 1.0f,
                                        dqb, ldq);
                            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, D, c, 1.0f, ds, c, qb, ldq, 1.0f,
                                        dkb, ldk);
                        }
                    }
                }
        free(p);
    }
}
