/* The CPU backend at bf16 precision (kernels/ops.h "Precision"): each op is
 * the fp32 op followed by rounding what it stored as activation storage to
 * bf16 (round to nearest even, kernels/bf16.h). Inputs already hold bf16
 * values (they were stored by such ops; weights are the working copy), the
 * arithmetic and every sum inside an op stay fp32, parameter gradients
 * accumulate in fp32 unrounded and statistics stay fp32: exactly the
 * storage a GPU's bf16 kernels keep, so the mixed-precision path (casts,
 * master weights, accumulation, checkpoints, parallel layouts) is tested
 * here and the GPU's bf16 ops can be compared with these op by op. */
#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

/* x[0..n) rounded in place */
static void store(float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

static void to_storage(float *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_round(src[i]);
}

static void embedding_forward(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V) {
    cpu_embedding_forward(out, tokens, table, N, C, vstart, V);
    store(out, (size_t)N * C);
}

static void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    cpu_rmsnorm_forward(out, rstd, x, w, N, C, eps);
    store(out, (size_t)N * C);
}

static void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                             int N, int C, int accumulate) {
    cpu_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C, accumulate);
    store(dx, (size_t)N * C);
}

static void matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate) {
    cpu_matmul_forward(out, x, w, N, K, M, accumulate);
    store(out, (size_t)N * M);
}

static void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K, int M,
                            int accumulate_dx) {
    cpu_matmul_backward(dx, dw, dout, x, w, N, K, M, accumulate_dx);
    if (dx) store(dx, (size_t)N * K);
}

static void rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    cpu_rope(x, cos, sin, B, T, H, D, inverse);
    store(x, (size_t)B * T * H * D);
}

static void attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                              int H, int KVH, int D, int Dv) {
    cpu_attention_forward(out, att, q, k, v, B, T, H, KVH, D, Dv);
    store(out, (size_t)B * T * H * Dv);
}

static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att, const float *q,
                               const float *k, const float *v, int B, int T, int H, int KVH, int D, int Dv) {
    cpu_attention_backward(dq, dk, dv, dout, att, q, k, v, B, T, H, KVH, D, Dv);
    store(dq, (size_t)B * T * H * D);
    store(dk, (size_t)B * T * KVH * D);
    store(dv, (size_t)B * T * KVH * Dv);
}

static void attention_decode(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H, int KVH,
                             int D) {
    cpu_attention_decode(out, q, k, v, n, Tk, H, KVH, D);
    store(out, (size_t)n * H * D);
}

static void copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate) {
    cpu_copy_cols(dst, ldd, src, lds, rows, cols, accumulate);
    if (!accumulate) return; /* a copy of bf16 values is exact */
    for (int r = 0; r < rows; r++) store(dst + (size_t)r * ldd, cols);
}

static void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    cpu_swiglu_forward(out, gate, up, n);
    store(out, n);
}

static void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    cpu_swiglu_backward(dgate, dup, dout, gate, up, n);
    store(dgate, n);
    store(dup, n);
}

/* routing: probabilities, lse and gate weights are statistics (fp32); the
 * logits' gradient feeds the router's GEMM */
static void moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                               const float *w, const float *aux_coef, float z_scale, int n, int E, int k) {
    cpu_moe_route_backward(dlogits, dw, probs, lse, idx, w, aux_coef, z_scale, n, E, k);
    store(dlogits, (size_t)n * E);
}

static void moe_route_sigmoid_backward(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                       const float *w, const float *aux_coef, int n, int E, int k, float scaling) {
    cpu_moe_route_sigmoid_backward(dlogits, dw, scores, idx, w, aux_coef, n, E, k, scaling);
    store(dlogits, (size_t)n * E);
}

static void moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                        int accumulate) {
    cpu_moe_combine(out, y, pos, w, n, k, C, accumulate);
    store(out, (size_t)n * C);
}

static void moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                                 const float *w, int n, int k, int C) {
    cpu_moe_combine_backward(dy, dw, dout, y, pos, w, n, k, C);
    store(dy, (size_t)n * k * C); /* rows past the received ones are zeros either way */
}

/* the loss and the row statistics are fp32; the logits' gradient is stored */
static void cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
    cpu_cross_entropy(losses, logits, targets, N, V, dscale);
    if (dscale != 0.0f) store(logits, (size_t)N * V);
}

static void ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                      const float *target_logit, int N, int V, int vstart, float dscale) {
    cpu_ce_finish(losses, logits, targets, rowmax, sumexp, target_logit, N, V, vstart, dscale);
    if (dscale != 0.0f) store(logits, (size_t)N * V);
}

static void add(float *dst, const float *src, size_t n) {
    cpu_add(dst, src, n);
    store(dst, n);
}

static void scale(float *x, float s, size_t n) {
    cpu_scale(x, s, n);
    store(x, n);
}

const struct backend cpu_bf16_backend = {
    .name = "cpu",
    .precision = PRECISION_BF16,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .copy = cpu_copy,
    .embedding_forward = embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .rope = rope,
    .attention_forward = attention_forward,
    .attention_state_floats = cpu_attention_state_floats,
    .attention_backward = attention_backward,
    .attention_decode = attention_decode,
    .copy_cols = copy_cols,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .moe_route_forward = cpu_moe_route_forward,
    .moe_route_backward = moe_route_backward,
    .moe_route_sigmoid_forward = cpu_moe_route_sigmoid_forward,
    .moe_route_sigmoid_backward = moe_route_sigmoid_backward,
    .gather_rows = cpu_gather_rows,
    .moe_combine = moe_combine,
    .moe_combine_backward = moe_combine_backward,
    .cross_entropy = cross_entropy,
    .ce_row_max = cpu_ce_row_max,
    .ce_row_sumexp = cpu_ce_row_sumexp,
    .ce_finish = ce_finish,
    .to_storage = to_storage,
    .add = add,
    .scale = scale,
    .sum = cpu_sum,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw,
};
