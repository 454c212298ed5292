/* Embedding, SwiGLU, vector helpers, repeatable reductions and AdamW.
 * Nothing uses atomics: every sum runs in a fixed order, so a run on the
 * same GPU repeats bitwise. */
#include <math.h>

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"

#define THREADS 256

__global__ void embedding_forward_k(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart,
                                    int V) {
    int n = blockIdx.x;
    int row = tokens[n] - vstart;
    float *o = out + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (row >= 0 && row < V) ? table[(size_t)row * C + c] : 0.0f;
}

void cuda_embedding_forward(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V) {
    if (N == 0) return;
    embedding_forward_k<<<N, THREADS>>>(out, tokens, table, N, C, vstart, V);
    LAUNCH_CHECK();
}

/* Embedding backward without atomics on floats, in the CPU's order: the
 * tokens are sorted stably by vocabulary row (a counting sort: per-chunk
 * counts, their prefix over chunks, a scan over rows, then each token's rank
 * among equal tokens before it in its chunk), and one block per row adds its
 * tokens' gradients in increasing position, exactly as the CPU loop does. */
#define EMB_CHUNK 1024

__global__ void emb_count_k(int *counts, const int32_t *tokens, int N, int vstart, int V) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int r = tokens[n] - vstart;
    if (r >= 0 && r < V) atomicAdd(&counts[(size_t)(n / EMB_CHUNK) * V + r], 1); /* integer: order-free */
}

/* counts[k][r] -> tokens of row r in chunks before k; total[r] = all of them */
__global__ void emb_chunk_prefix_k(int *counts, int *total, int K, int V) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= V) return;
    int run = 0;
    for (int k = 0; k < K; k++) {
        int c = counts[(size_t)k * V + r];
        counts[(size_t)k * V + r] = run;
        run += c;
    }
    total[r] = run;
}

/* In place: total[0..V) -> exclusive prefix sums, total[V] = the sum. One block. */
__global__ void emb_scan_k(int *total, int V) {
    __shared__ int part[1024];
    int per = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per, hi = min(V, lo + per);
    int sum = 0;
    for (int i = lo; i < hi; i++) sum += total[i];
    part[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (unsigned t = 0; t < blockDim.x; t++) {
            int c = part[t];
            part[t] = run;
            run += c;
        }
        total[V] = run;
    }
    __syncthreads();
    int run = part[threadIdx.x];
    for (int i = lo; i < hi; i++) {
        int c = total[i];
        total[i] = run;
        run += c;
    }
}

__global__ void emb_scatter_k(int *perm, const int *counts, const int *offsets, const int32_t *tokens, int N,
                              int vstart, int V) {
    __shared__ int32_t tok[EMB_CHUNK];
    int k = blockIdx.x, n = k * EMB_CHUNK + threadIdx.x;
    tok[threadIdx.x] = n < N ? tokens[n] : -1;
    __syncthreads();
    if (n >= N) return;
    int t = tok[threadIdx.x], r = t - vstart;
    if (r < 0 || r >= V) return;
    int rank = 0;
    for (int j = 0; j < (int)threadIdx.x; j++) rank += tok[j] == t;
    perm[offsets[r] + counts[(size_t)k * V + r] + rank] = n;
}

/* dout in storage T (float, or the bf16 table's bf16_t); the table's gradient is fp32 */
template <typename T>
__global__ void emb_accumulate_k(float *dtable, const T *dout, const int *perm, const int *offsets, int C) {
    int r = blockIdx.x, begin = offsets[r], end = offsets[r + 1];
    if (begin == end) return;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float x = dtable[(size_t)r * C + c];
        for (int i = begin; i < end; i++) x += ld(dout, (size_t)perm[i] * C + c);
        dtable[(size_t)r * C + c] = x;
    }
}

template <typename T>
static void embedding_backward_t(float *dtable, const int32_t *tokens, const T *dout, int N, int C, int vstart,
                                 int V) {
    if (N == 0 || C == 0 || V == 0) return;
    int K = (N + EMB_CHUNK - 1) / EMB_CHUNK;
    int *counts = (int *)cuda_scratch(SCRATCH_WORK, sizeof(int) * ((size_t)K * V + V + 1 + N));
    int *offsets = counts + (size_t)K * V, *perm = offsets + V + 1;
    CUDA_CHECK(cudaMemset(counts, 0, sizeof(int) * (size_t)K * V));
    emb_count_k<<<(N + 255) / 256, 256>>>(counts, tokens, N, vstart, V);
    LAUNCH_CHECK();
    emb_chunk_prefix_k<<<(V + 255) / 256, 256>>>(counts, offsets, K, V);
    LAUNCH_CHECK();
    emb_scan_k<<<1, 1024>>>(offsets, V);
    LAUNCH_CHECK();
    emb_scatter_k<<<K, EMB_CHUNK>>>(perm, counts, offsets, tokens, N, vstart, V);
    LAUNCH_CHECK();
    emb_accumulate_k<<<V, 256>>>(dtable, dout, perm, offsets, C);
    LAUNCH_CHECK();
}

void cuda_embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                             int V) {
    embedding_backward_t(dtable, tokens, dout, N, C, vstart, V);
}
void cuda_bf16_embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                                  int V) {
    embedding_backward_t(dtable, tokens, (const bf16_t *)dout, N, C, vstart, V);
}

/* SwiGLU, add and scale (kernels/cuda/elementwise.cuh): a thread per
 * 16-byte vector, 4 fp32 or 8 bf16 elements (per) */
#define LAUNCH_N(kernel, per, n, ...)                                                     \
    do {                                                                                  \
        if (!(n)) return;                                                                 \
        kernel<<<blocks_for(((n) + (per) - 1) / (per), THREADS), THREADS>>>(__VA_ARGS__); \
        LAUNCH_CHECK();                                                                   \
    } while (0)

void cuda_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    LAUNCH_N(swiglu_forward_k<float>, 4, n, out, gate, up, n);
}
void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    LAUNCH_N(swiglu_backward_k<float>, 4, n, dgate, dup, dout, gate, up, n);
}
void cuda_add(float *dst, const float *src, size_t n) { LAUNCH_N(add_k<float>, 4, n, dst, src, n); }
void cuda_scale(float *x, float s, size_t n) { LAUNCH_N(scale_k<float>, 4, n, x, s, n); }

/* the bf16 table's instances */
typedef bf16_t B16;
void cuda_bf16_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    LAUNCH_N(swiglu_forward_k<B16>, 8, n, (B16 *)out, (const B16 *)gate, (const B16 *)up, n);
}
void cuda_bf16_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                               size_t n) {
    LAUNCH_N(swiglu_backward_k<B16>, 8, n, (B16 *)dgate, (B16 *)dup, (const B16 *)dout, (const B16 *)gate,
             (const B16 *)up, n);
}
void cuda_bf16_add(float *dst, const float *src, size_t n) {
    LAUNCH_N(add_k<B16>, 8, n, (B16 *)dst, (const B16 *)src, n);
}
void cuda_bf16_scale(float *x, float s, size_t n) { LAUNCH_N(scale_k<B16>, 8, n, (B16 *)x, s, n); }

/* A fixed grid of partial sums in double, added on the host in order
 * (kernels/cuda/reduce.cuh): 1024 blocks of 256 threads, 16-byte loads. */
#define REDUCE_BLOCKS 1024
static double reduce(const float *x, size_t n, int square) {
    if (!n) return 0.0;
    static double host[REDUCE_BLOCKS];
    double *part = (double *)cuda_scratch(SCRATCH_WORK, sizeof(double) * REDUCE_BLOCKS);
    reduce_k<THREADS><<<REDUCE_BLOCKS, THREADS>>>(part, x, n, square);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpy(host, part, sizeof host, cudaMemcpyDeviceToHost));
    double total = 0;
    for (int i = 0; i < REDUCE_BLOCKS; i++) total += host[i];
    return total;
}

double cuda_sum(const float *x, size_t n) { return reduce(x, n, 0); }
double cuda_sum_squares(const float *x, size_t n) { return reduce(x, n, 1); }

/* torch.optim.AdamW, as kernels/cpu/elementwise.c (the kernel: kernels/cuda/adamw.cuh) */
void cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, float grad_scale, int step, uint16_t *work) {
    if (!n) return;
    double bc1 = 1.0 - pow(beta1, step);
    adamw_step a = {beta1, beta2, eps, 1.0f - lr * weight_decay, (float)(lr / bc1), (float)sqrt(1.0 - pow(beta2, step)),
                    grad_scale};
    adamw_k<<<blocks_for((n + 3) / 4, THREADS), THREADS>>>(param, grad, m, v, n, a, work);
    LAUNCH_CHECK();
}

__global__ void copy_cols_k(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, c = i % cols;
        float v = src[r * lds + c];
        dst[r * ldd + c] = accumulate ? dst[r * ldd + c] + v : v;
    }
}

void cuda_copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate) {
    size_t n = (size_t)rows * cols;
    if (!n) return;
    copy_cols_k<<<blocks_for(n, 256), 256>>>(dst, ldd, src, lds, rows, cols, accumulate);
    LAUNCH_CHECK();
}
