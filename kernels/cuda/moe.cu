// Mixture-of-experts routing and token permutation on the GPU (semantics in
// kernels/ops.h). One thread per token for routing (E and k are small), one
// thread per output element for the row moves; every output has one writer,
// so results repeat bitwise. Simple first: speed comes with grouped GEMMs.
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/moe_combine.cuh"
#include "kernels/cuda/moe_plan.cuh"
#include "kernels/moe_route.h"

static const unsigned THREADS = 256;
/* the routing kernels' blocks: a thread per token, so small blocks spread 8192 tokens over 128 SMs, not 32 */
static const unsigned ROUTE_THREADS = 64;
static unsigned route_blocks(int n) { return (n + ROUTE_THREADS - 1) / ROUTE_THREADS; }

__global__ void route_forward_k(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E,
                                int k) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    route_softmax_token(probs + (size_t)t * E, lse + t, idx + (size_t)t * k, w + (size_t)t * k, logits + (size_t)t * E,
                        E, k);
}

__global__ void route_backward_k(float *dlogits, const float *dw, const float *probs, const float *lse,
                                 const int32_t *idx, const float *w, const float *aux_coef, float z_scale, int n, int E,
                                 int k, int T, int r0) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    route_softmax_token_backward(dlogits + (size_t)t * E, dw + (size_t)t * k, probs + (size_t)t * E, lse[t],
                                 idx + (size_t)t * k, w + (size_t)t * k,
                                 aux_coef ? aux_coef + (size_t)((r0 + t) / T) * E : NULL, z_scale, E, k);
}

__global__ void route_sigmoid_forward_k(float *scores, int32_t *idx, float *w, const float *logits, const float *bias,
                                        int n, int E, int k, int n_group, int topk_group, float scaling) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    route_sigmoid_token(scores + (size_t)t * E, idx + (size_t)t * k, w + (size_t)t * k, logits + (size_t)t * E, bias, E,
                        k, n_group, topk_group, scaling);
}

__global__ void route_sigmoid_backward_k(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                         const float *w, const float *aux_coef, int n, int E, int k, float scaling,
                                         int T, int r0) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    route_sigmoid_token_backward(dlogits + (size_t)t * E, dw + (size_t)t * k, scores + (size_t)t * E,
                                 idx + (size_t)t * k, w + (size_t)t * k,
                                 aux_coef ? aux_coef + (size_t)((r0 + t) / T) * E : NULL, E, k, scaling);
}

__global__ void gather_rows_k(float *out, const float *x, const int32_t *rows, int n, int C) {
    size_t total = (size_t)n * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = x[(size_t)rows[i / C] * C + i % C];
}

void cuda_moe_route_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E, int k) {
    if (!n) return;
    route_forward_k<<<route_blocks(n), ROUTE_THREADS>>>(probs, lse, idx, w, logits, n, E, k);
    LAUNCH_CHECK();
}

void cuda_moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                             const float *w, const float *aux_coef, float z_scale, int n, int E, int k, int T, int r0) {
    if (!n) return;
    route_backward_k<<<route_blocks(n), ROUTE_THREADS>>>(dlogits, dw, probs, lse, idx, w, aux_coef, z_scale, n, E, k,
                                                         T, r0);
    LAUNCH_CHECK();
}

void cuda_moe_route_sigmoid_forward(float *scores, int32_t *idx, float *w, const float *logits, const float *bias, int n,
                                    int E, int k, int n_group, int topk_group, float scaling) {
    if (!n) return;
    route_sigmoid_forward_k<<<route_blocks(n), ROUTE_THREADS>>>(scores, idx, w, logits, bias, n, E, k, n_group,
                                                                topk_group, scaling);
    LAUNCH_CHECK();
}

void cuda_moe_route_sigmoid_backward(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                     const float *w, const float *aux_coef, int n, int E, int k, float scaling, int T,
                                     int r0) {
    if (!n) return;
    route_sigmoid_backward_k<<<route_blocks(n), ROUTE_THREADS>>>(dlogits, dw, scores, idx, w, aux_coef, n, E, k,
                                                                 scaling, T, r0);
    LAUNCH_CHECK();
}

void cuda_gather_rows(float *out, const float *x, const int32_t *rows, int n, int C) {
    if (!n) return;
    gather_rows_k<<<blocks_for((size_t)n * C, THREADS), THREADS>>>(out, x, rows, n, C);
    LAUNCH_CHECK();
}

template <typename T>
static void combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C, int accumulate) {
    if (!n) return;
    moe_combine_k<T><<<blocks_for((size_t)n * C, THREADS), THREADS>>>((T *)out, (const T *)y, pos, w, n, k, C,
                                                                     accumulate);
    LAUNCH_CHECK();
}

template <typename T>
static void combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                             const float *w, int n, int k, int C) {
    if (!n) return;
    moe_combine_dy_k<T><<<blocks_for((size_t)n * k * C, THREADS), THREADS>>>((T *)dy, (const T *)dout, pos, w, n, k,
                                                                            C);
    LAUNCH_CHECK();
    moe_combine_dw_k<T><<<(unsigned)((size_t)n * k), THREADS>>>(dw, (const T *)dout, (const T *)y, pos, k, C);
    LAUNCH_CHECK();
}

void cuda_moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                      int accumulate) {
    combine<float>(out, y, pos, w, n, k, C, accumulate);
}

void cuda_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                               const float *w, int n, int k, int C) {
    combine_backward<float>(dy, dw, dout, y, pos, w, n, k, C);
}

/* the bf16 table's: the same kernels on bf16 rows (kernels/cuda/moe_combine.cuh) */
void cuda_bf16_moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                           int accumulate) {
    combine<bf16_t>(out, y, pos, w, n, k, C, accumulate);
}

void cuda_bf16_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                                    const float *w, int n, int k, int C) {
    combine_backward<bf16_t>(dy, dw, dout, y, pos, w, n, k, C);
}

// ---- routing decisions (kernels/cuda/moe_plan.cuh): no host copy ----

static unsigned grid_for(long n) { return (unsigned)((n + THREADS - 1) / THREADS); }

void cuda_moe_route_counts(float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B) {
    CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(float) * B * E, 0));
    if (!n || !B) return;
    dim3 grid((unsigned)((T + MOE_COUNT_TOKENS - 1) / MOE_COUNT_TOKENS), (unsigned)B,
              (unsigned)((E + MOE_COUNT_TILE - 1) / MOE_COUNT_TILE));
    moe_counts_k<<<grid, THREADS>>>(counts, idx, n, k, E, T, r0, B);
    LAUNCH_CHECK();
}

void cuda_moe_route_balance(float *coef, double *metrics, const float *counts_all, const float *probs, const float *lse,
                            int n, int E, int k, int T, int r0, int B, int tp, int tp_rank, int sigmoid,
                            float aux_scale, long cap) {
    int BE = B * E;
    double f_scale = sigmoid ? (double)E / ((double)k * T) : (double)E / T;
    moe_coef_k<<<grid_for(BE), THREADS>>>(coef, metrics, counts_all, E, T, BE, tp, tp_rank, f_scale, aux_scale, cap);
    LAUNCH_CHECK();
    if (!metrics) return;
    double *part = (double *)cuda_scratch(SCRATCH_MOE, sizeof(double) * 2 * MOE_BALANCE_BLOCKS);
    moe_balance_k<<<MOE_BALANCE_BLOCKS, 256>>>(part, counts_all, probs, lse, n, E, T, r0, BE, tp, sigmoid);
    LAUNCH_CHECK();
    moe_balance_sum_k<<<1, MOE_BALANCE_BLOCKS>>>(metrics, part, E, T, f_scale);
    LAUNCH_CHECK();
}

void cuda_moe_dispatch(int32_t *pos, int32_t *send_rows, float *expert_counts, const int32_t *idx,
                       const float *counts_all, int n, int k, int E, int T, int r0, int B, int tp_rank, long cap) {
    int nk = n * k, chunks = (nk + MOE_PLAN_CHUNK - 1) / MOE_PLAN_CHUNK, capped = cap >= 0;
    if (!nk) {
        CUDA_CHECK(cudaMemset(expert_counts, 0, sizeof(float) * E));
        return;
    }
    int32_t *hist = (int32_t *)cuda_scratch(SCRATCH_MOE, sizeof(int32_t) * ((size_t)chunks + 1) * (E + 1));
    if (capped) {
        moe_keep_k<<<grid_for((long)B * E), THREADS>>>(pos, idx, counts_all, n, k, E, T, r0, B, tp_rank, cap);
        LAUNCH_CHECK();
    }
    moe_hist_k<<<grid_for(chunks), THREADS>>>(hist, pos, idx, nk, E, capped);
    LAUNCH_CHECK();
    moe_scan_k<<<1, THREADS>>>(hist, hist + (size_t)chunks * (E + 1), expert_counts, chunks, E);
    LAUNCH_CHECK();
    moe_assign_k<<<grid_for(chunks), THREADS>>>(pos, send_rows, hist, idx, nk, k, E, capped);
    LAUNCH_CHECK();
}

void cuda_moe_expert_order(int32_t *order, int32_t *inverse, int32_t *offsets, const float *in, int ep, int El,
                           int rows) {
    int32_t *blocks = order ? (int32_t *)cuda_scratch(SCRATCH_MOE, sizeof(int32_t) * 2 * ep * El) : NULL;
    moe_offsets_k<<<1, 32>>>(offsets, blocks, in, ep, El);
    LAUNCH_CHECK();
    if (!order || !rows) return;
    moe_order_k<<<grid_for(rows), THREADS>>>(order, inverse, blocks, offsets, in, ep, El, rows);
    LAUNCH_CHECK();
}
