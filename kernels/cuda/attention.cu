/* Causal grouped-query attention: strided batched sgemms (cuBLAS, TF32 when
 * enabled) over the heads of one (batch, group member) at a time. Query head
 * h reads kv head h / group; for a fixed member g of each group the query
 * heads kh*group+g are evenly strided, so one batched call covers every kv
 * head. The T x T scores live only in scratch for one (batch, member) at a
 * time: forward keeps each row's log-sum-exp lse[B,H,T] and backward
 * recomputes the probabilities from it, so stored attention state is O(T),
 * not O(T^2) per layer. */
#include <math.h>

#include "kernels/cuda/cuda.h"

#define THREADS 256

/* Rows of scores (already scaled), T rows per head, heads p_stride apart
 * (blockIdx.y = kv head): causal softmax in place, lse[row] saved. */
__global__ void causal_softmax_k(float *s, long long s_stride, float *lse, long long lse_stride, int T) {
    __shared__ float fbuf[THREADS];
    __shared__ float sbuf[THREADS];
    int t = blockIdx.x;
    float *row = s + blockIdx.y * s_stride + (size_t)t * T;
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m, fbuf);
    float sum = 0;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) sum += expf(row[j] - m);
    sum = block_sum(sum, sbuf);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= t ? expf(row[j] - m) * inv : 0.0f;
    if (threadIdx.x == 0) lse[blockIdx.y * lse_stride + t] = m + logf(sum);
}

/* Scores -> probabilities again from the saved log-sum-exp. */
__global__ void probs_from_lse_k(float *s, const float *lse, long long lse_stride, int T) {
    int t = blockIdx.x;
    float *row = s + ((size_t)blockIdx.y * T + t) * T;
    float l = lse[blockIdx.y * lse_stride + t];
    for (int j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= t ? expf(row[j] - l) : 0.0f;
}

/* dS = P * (dP - rowsum(P * dP)) * scale, in place over dP rows. */
__global__ void softmax_backward_k(float *ds, const float *p, int T, float scale) {
    __shared__ float buf[THREADS];
    int t = blockIdx.x;
    size_t off = ((size_t)blockIdx.y * T + t) * T;
    float *dr = ds + off;
    const float *pr = p + off;
    float dot = 0;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) dot += pr[j] * dr[j];
    dot = block_sum(dot, buf);
    for (int j = threadIdx.x; j < T; j += blockDim.x) dr[j] = j <= t ? pr[j] * (dr[j] - dot) * scale : 0.0f;
}

size_t cuda_attention_state_floats(int B, int H, int T) { return (size_t)B * H * T; }

void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                            int H, int KVH, int D) {
    int group = H / KVH, ldq = H * D, ldk = KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    long long sTT = (long long)T * T, sq = (long long)group * D;
    float *p = (float *)cuda_scratch(sizeof(float) * (size_t)KVH * T * T);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < group; g++) {
            const float *qb = q + (size_t)b * T * ldq + g * D, *kb = k + (size_t)b * T * ldk;
            const float *vb = v + (size_t)b * T * ldk;
            float *ob = out + (size_t)b * T * ldq + g * D, *lb = lse + ((size_t)b * H + g) * T;
            gemm_rm(0, 1, T, T, D, scale, qb, ldq, sq, kb, ldk, D, 0.0f, p, T, sTT, KVH);
            causal_softmax_k<<<dim3(T, KVH), THREADS>>>(p, sTT, lb, (long long)group * T, T);
            LAUNCH_CHECK();
            gemm_rm(0, 0, T, D, T, 1.0f, p, T, sTT, vb, ldk, D, 0.0f, ob, ldq, sq, KVH);
        }
}

/* Per (batch, member): P from Q K^T and lse; dV += P^T dO; dP = dO V^T;
 * dS = softmax backward; dQ = dS K; dK += dS^T Q. The members run in order
 * (beta 0 then 1), so dk/dv sum in the same order as on the CPU. */
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                             const float *k, const float *v, int B, int T, int H, int KVH, int D) {
    int group = H / KVH, ldq = H * D, ldk = KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    long long sTT = (long long)T * T, sq = (long long)group * D;
    float *p = (float *)cuda_scratch(sizeof(float) * 2 * (size_t)KVH * T * T), *ds = p + (size_t)KVH * T * T;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < group; g++) {
            const float *dob = dout + (size_t)b * T * ldq + g * D, *qb = q + (size_t)b * T * ldq + g * D;
            const float *kb = k + (size_t)b * T * ldk, *vb = v + (size_t)b * T * ldk;
            const float *lb = lse + ((size_t)b * H + g) * T;
            float *dqb = dq + (size_t)b * T * ldq + g * D;
            float *dkb = dk + (size_t)b * T * ldk, *dvb = dv + (size_t)b * T * ldk;
            float beta = g == 0 ? 0.0f : 1.0f;
            gemm_rm(0, 1, T, T, D, scale, qb, ldq, sq, kb, ldk, D, 0.0f, p, T, sTT, KVH);
            probs_from_lse_k<<<dim3(T, KVH), THREADS>>>(p, lb, (long long)group * T, T);
            LAUNCH_CHECK();
            gemm_rm(1, 0, T, D, T, 1.0f, p, T, sTT, dob, ldq, sq, beta, dvb, ldk, D, KVH);
            gemm_rm(0, 1, T, T, D, 1.0f, dob, ldq, sq, vb, ldk, D, 0.0f, ds, T, sTT, KVH);
            softmax_backward_k<<<dim3(T, KVH), THREADS>>>(ds, p, T, scale);
            LAUNCH_CHECK();
            gemm_rm(0, 0, T, D, T, 1.0f, ds, T, sTT, kb, ldk, D, 0.0f, dqb, ldq, sq, KVH);
            gemm_rm(1, 0, T, D, T, 1.0f, ds, T, sTT, qb, ldq, sq, beta, dkb, ldk, D, KVH);
        }
}
