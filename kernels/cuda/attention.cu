/* Causal grouped-query attention with cuBLAS (TF32 when enabled): batched
 * GEMMs over many (batch, head) pairs at once through pointer arrays that a
 * small kernel fills on the device (no host round trip), in chunks of whole
 * kv groups sized so the T x T scratch stays under a budget. The scores live
 * only in that scratch: forward keeps each row's log-sum-exp lse[B,H,T] and
 * backward recomputes the probabilities from it, so stored attention state is
 * O(T), not O(T^2) per layer. Query head h reads kv head h / group; dk and dv
 * are computed per query head into scratch and summed over the group in
 * order g = 0, 1, ..., the CPU's order: no atomics, repeatable. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/cuda.h"

#define THREADS 256

/* Scratch budget for the T x T blocks of one chunk (backward needs two). */
static size_t chunk_bytes(void) {
    static size_t bytes;
    if (!bytes) {
        const char *e = getenv("MTRAIN_ATTN_CHUNK_MB"); /* tuning knob, docs/model.md */
        long mb = e ? atol(e) : 1024;
        bytes = (size_t)(mb > 0 ? mb : 1024) << 20;
    }
    return bytes;
}

/* Rows of scores (already scaled), row r of pair i at s + (i*T + r)*T:
 * causal softmax in place; lse[i*T + r] saved. */
__global__ void causal_softmax_k(float *s, float *lse, int T) {
    __shared__ float fbuf[THREADS];
    __shared__ float sbuf[THREADS];
    int t = blockIdx.x;
    float *row = s + ((size_t)blockIdx.y * T + t) * T;
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m, fbuf);
    float sum = 0;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) sum += expf(row[j] - m);
    sum = block_sum(sum, sbuf);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= t ? expf(row[j] - m) * inv : 0.0f;
    if (threadIdx.x == 0) lse[(size_t)blockIdx.y * T + t] = m + logf(sum);
}

/* Scores -> probabilities again from the saved log-sum-exp. */
__global__ void probs_from_lse_k(float *s, const float *lse, int T) {
    int t = blockIdx.x;
    float *row = s + ((size_t)blockIdx.y * T + t) * T;
    float l = lse[(size_t)blockIdx.y * T + t];
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

/* Pointer arrays for pairs i = first .. first+n-1 (pair = b*H + h): the rows
 * of query head h in a [B,T,H,D] tensor, the rows of its kv head in a
 * [B,T,KVH,D] tensor, or block i of a scratch buffer. */
enum ptr_kind { QUERY_ROWS, KV_ROWS, PAIR_BLOCK };

__global__ void fill_ptrs_k(const float **out, const float *base, int kind, long long block, int first, int n, int T,
                            int H, int group, int D) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int pair = first + i, b = pair / H, h = pair % H;
    if (kind == QUERY_ROWS) out[i] = base + (size_t)b * T * H * D + (size_t)h * D;
    else if (kind == KV_ROWS) out[i] = base + (size_t)b * T * (H / group) * D + (size_t)(h / group) * D;
    else out[i] = base + i * block;
}

/* dk/dv of every (b, kv head) in pairs [first, first+n): the group's
 * per-query-head blocks [n, T, D] summed in order into [B,T,KVH,D]. */
__global__ void sum_group_k(float *dst, const float *per_head, int first, int n, int T, int H, int group, int D) {
    size_t units = (size_t)(n / group) * T * D;
    int KVH = H / group;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < units; e += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(e % D), t = (int)((e / D) % T), u = (int)(e / ((size_t)T * D));
        int pair0 = first + u * group, b = pair0 / H, kh = (pair0 % H) / group;
        float acc = 0;
        for (int g = 0; g < group; g++) acc += per_head[((size_t)(u * group + g) * T + t) * D + d];
        dst[((size_t)b * T + t) * KVH * D + (size_t)kh * D + d] = acc;
    }
}

/* Batched row-major GEMM over pointer arrays (see gemm_rm). */
static void gemm_ptrs(int transA, int transB, int M, int N, int K, float alpha, const float **A, int lda,
                      const float **B, int ldb, float **C, int ldc, int batch) {
    cublasOperation_t ta = transA ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float beta = 0.0f;
    CUBLAS_CHECK(cublasSgemmBatched(cuda_blas(), tb, ta, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc, batch));
}

/* Device memory for `arrays` pointer arrays of n entries. */
static const float **ptr_arrays(int arrays, int n) {
    return (const float **)cuda_scratch(SCRATCH_POINTERS, sizeof(float *) * (size_t)arrays * n);
}

struct chunk {
    int first, n, T, H, group, D;
};

/* width: the head size of the tensor (D for q/k, Dv for v and the output) */
static const float **fill(const float **out, const float *base, enum ptr_kind kind, long long block,
                          const struct chunk *c, int width) {
    fill_ptrs_k<<<(c->n + 127) / 128, 128>>>(out, base, kind, block, c->first, c->n, c->T, c->H, c->group, width);
    LAUNCH_CHECK();
    return out;
}

/* Pairs per chunk: whole groups, as many as the scratch budget allows. */
static int chunk_pairs(int B, int H, int group, int T, int blocks) {
    size_t per_group = (size_t)group * T * T * sizeof(float) * blocks;
    size_t groups = chunk_bytes() / per_group;
    if (groups < 1) groups = 1;
    size_t total = (size_t)B * H / group, grid_limit = 65535 / group; /* pairs index gridDim.y */
    if (groups > total) groups = total;
    if (groups > grid_limit) groups = grid_limit;
    return (int)groups * group;
}

size_t cuda_attention_state_floats(int B, int H, int T) { return (size_t)B * H * T; }

void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                            int H, int KVH, int D, int Dv) {
    int group = H / KVH, ldq = H * D, ldk = KVH * D, ldo = H * Dv, ldv = KVH * Dv, total = B * H;
    float scale = 1.0f / sqrtf((float)D);
    int per = chunk_pairs(B, H, group, T, 1);
    long long tt = (long long)T * T;
    float *s = (float *)cuda_scratch(SCRATCH_WORK, sizeof(float) * (size_t)per * tt);
    const float **arr = ptr_arrays(5, per);
    for (int first = 0; first < total; first += per) {
        struct chunk c = {first, total - first < per ? total - first : per, T, H, group, D};
        const float **Q = fill(arr, q, QUERY_ROWS, 0, &c, D), **K = fill(arr + per, k, KV_ROWS, 0, &c, D);
        const float **V = fill(arr + 2 * per, v, KV_ROWS, 0, &c, Dv), **S = fill(arr + 3 * per, s, PAIR_BLOCK, tt, &c, D);
        const float **O = fill(arr + 4 * per, out, QUERY_ROWS, 0, &c, Dv);
        gemm_ptrs(0, 1, T, T, D, scale, Q, ldq, K, ldk, (float **)S, T, c.n);
        causal_softmax_k<<<dim3(T, c.n), THREADS>>>(s, lse + (size_t)first * T, T);
        LAUNCH_CHECK();
        gemm_ptrs(0, 0, T, Dv, T, 1.0f, S, T, V, ldv, (float **)O, ldo, c.n);
    }
}

/* Per chunk: P = exp(scale Q K^T - lse); dP = dO V^T; dV_h = P^T dO;
 * dS = softmax backward; dQ = dS K; dK_h = dS^T Q; then dk, dv = the sums of
 * dK_h, dV_h over each kv head's group. */
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                             const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D,
                             int Dv) {
    (void)out; /* rowsum(P * dP) from the recomputed P instead */
    int group = H / KVH, ldq = H * D, ldk = KVH * D, ldo = H * Dv, ldv = KVH * Dv, total = B * H;
    float scale = 1.0f / sqrtf((float)D);
    int per = chunk_pairs(B, H, group, T, 2);
    long long tt = (long long)T * T, td = (long long)T * D, tdv = (long long)T * Dv;
    float *p = (float *)cuda_scratch(SCRATCH_WORK, sizeof(float) * (size_t)per * (2 * tt + td + tdv));
    float *ds = p + per * tt, *dkh = ds + per * tt, *dvh = dkh + per * td;
    const float **arr = ptr_arrays(9, per);
    for (int first = 0; first < total; first += per) {
        struct chunk c = {first, total - first < per ? total - first : per, T, H, group, D};
        const float **Q = fill(arr, q, QUERY_ROWS, 0, &c, D), **K = fill(arr + per, k, KV_ROWS, 0, &c, D);
        const float **V = fill(arr + 2 * per, v, KV_ROWS, 0, &c, Dv), **dO = fill(arr + 3 * per, dout, QUERY_ROWS, 0, &c, Dv);
        const float **dQ = fill(arr + 4 * per, dq, QUERY_ROWS, 0, &c, D), **P = fill(arr + 5 * per, p, PAIR_BLOCK, tt, &c, D);
        const float **dS = fill(arr + 6 * per, ds, PAIR_BLOCK, tt, &c, D);
        const float **dKh = fill(arr + 7 * per, dkh, PAIR_BLOCK, td, &c, D);
        const float **dVh = fill(arr + 8 * per, dvh, PAIR_BLOCK, tdv, &c, Dv);
        gemm_ptrs(0, 1, T, T, D, scale, Q, ldq, K, ldk, (float **)P, T, c.n);
        probs_from_lse_k<<<dim3(T, c.n), THREADS>>>(p, lse + (size_t)first * T, T);
        LAUNCH_CHECK();
        gemm_ptrs(0, 1, T, T, Dv, 1.0f, dO, ldo, V, ldv, (float **)dS, T, c.n);
        gemm_ptrs(1, 0, T, Dv, T, 1.0f, P, T, dO, ldo, (float **)dVh, Dv, c.n);
        softmax_backward_k<<<dim3(T, c.n), THREADS>>>(ds, p, T, scale);
        LAUNCH_CHECK();
        gemm_ptrs(0, 0, T, D, T, 1.0f, dS, T, K, ldk, (float **)dQ, ldq, c.n);
        gemm_ptrs(1, 0, T, D, T, 1.0f, dS, T, Q, ldq, (float **)dKh, D, c.n);
        size_t units = (size_t)(c.n / group) * td, vunits = (size_t)(c.n / group) * tdv;
        sum_group_k<<<blocks_for(units, THREADS), THREADS>>>(dk, dkh, first, c.n, T, H, group, D);
        LAUNCH_CHECK();
        sum_group_k<<<blocks_for(vunits, THREADS), THREADS>>>(dv, dvh, first, c.n, T, H, group, Dv);
        LAUNCH_CHECK();
    }
}
