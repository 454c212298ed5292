/* Causal grouped-query attention as in kernels/cpu/attention.c: strided
 * batched sgemms over the heads of one (batch, group member) at a time, with
 * the probabilities kept in att[B,H,T,T] for backward. Query head h reads kv
 * head h / group; for a fixed member g of each group the query heads
 * kh*group+g are evenly strided, so one batched call covers every kv head. */
#include <math.h>

#include "kernels/cuda/cuda.h"

#define THREADS 256

/* In place over rows of T (scores already scaled): causal softmax. */
__global__ void causal_softmax_k(float *att, int T) {
    __shared__ float fbuf[THREADS];
    __shared__ float sbuf[THREADS];
    size_t r = blockIdx.x;
    int t = (int)(r % T);
    float *row = att + r * T;
    float m = -INFINITY;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) m = fmaxf(m, row[s]);
    m = block_max(m, fbuf);
    float sum = 0;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) sum += expf(row[s] - m);
    sum = block_sum(sum, sbuf);
    float inv = 1.0f / sum;
    for (int s = threadIdx.x; s < T; s += blockDim.x) row[s] = s <= t ? expf(row[s] - m) * inv : 0.0f;
}

/* dS = P * (dP - rowsum(P * dP)) * scale, in place over dP rows: row t of
 * kv head blockIdx.y, whose probabilities are p_stride apart. */
__global__ void softmax_backward_k(float *ds, const float *p, int T, long long p_stride, float scale) {
    __shared__ float buf[THREADS];
    int t = blockIdx.x;
    float *dr = ds + ((size_t)blockIdx.y * T + t) * T;
    const float *pr = p + blockIdx.y * p_stride + (size_t)t * T;
    float dot = 0;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) dot += pr[s] * dr[s];
    dot = block_sum(dot, buf);
    for (int s = threadIdx.x; s < T; s += blockDim.x) dr[s] = s <= t ? pr[s] * (dr[s] - dot) * scale : 0.0f;
}

void cuda_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                            int H, int KVH, int D) {
    int group = H / KVH, ldq = H * D, ldk = KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    long long sTT = (long long)T * T;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < group; g++) {
            const float *qb = q + (size_t)b * T * ldq + g * D, *kb = k + (size_t)b * T * ldk;
            float *p = att + ((size_t)b * H + g) * T * T;
            gemm_rm(0, 1, T, T, D, scale, qb, ldq, (long long)group * D, kb, ldk, D, 0.0f, p, T, group * sTT, KVH);
        }
    causal_softmax_k<<<(unsigned)((size_t)B * H * T), THREADS>>>(att, T);
    LAUNCH_CHECK();
    for (int b = 0; b < B; b++)
        for (int g = 0; g < group; g++) {
            const float *vb = v + (size_t)b * T * ldk;
            const float *p = att + ((size_t)b * H + g) * T * T;
            float *ob = out + (size_t)b * T * ldq + g * D;
            gemm_rm(0, 0, T, D, T, 1.0f, p, T, group * sTT, vb, ldk, D, 0.0f, ob, ldq, (long long)group * D, KVH);
        }
}

/* dV = sum_g P^T dO; dP = dO V^T; dS = softmax backward; dQ = dS K;
 * dK = sum_g dS^T Q. The group members run in order (beta 0 then 1), so
 * dk/dv sum in the same order as on the CPU. */
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att, const float *q,
                             const float *k, const float *v, int B, int T, int H, int KVH, int D) {
    int group = H / KVH, ldq = H * D, ldk = KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    long long sTT = (long long)T * T;
    float *ds = (float *)cuda_scratch(sizeof(float) * (size_t)KVH * T * T);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < group; g++) {
            const float *p = att + ((size_t)b * H + g) * T * T;
            const float *dob = dout + (size_t)b * T * ldq + g * D, *qb = q + (size_t)b * T * ldq + g * D;
            const float *kb = k + (size_t)b * T * ldk, *vb = v + (size_t)b * T * ldk;
            float *dqb = dq + (size_t)b * T * ldq + g * D;
            float *dkb = dk + (size_t)b * T * ldk, *dvb = dv + (size_t)b * T * ldk;
            float beta = g == 0 ? 0.0f : 1.0f;
            long long sq = (long long)group * D;
            gemm_rm(1, 0, T, D, T, 1.0f, p, T, group * sTT, dob, ldq, sq, beta, dvb, ldk, D, KVH);
            gemm_rm(0, 1, T, T, D, 1.0f, dob, ldq, sq, vb, ldk, D, 0.0f, ds, T, sTT, KVH);
            softmax_backward_k<<<dim3(T, KVH), THREADS>>>(ds, p, T, group * sTT, scale);
            LAUNCH_CHECK();
            gemm_rm(0, 0, T, D, T, 1.0f, ds, T, sTT, kb, ldk, D, 0.0f, dqb, ldq, sq, KVH);
            gemm_rm(1, 0, T, D, T, 1.0f, ds, T, sTT, qb, ldq, sq, beta, dkb, ldk, D, KVH);
        }
}
