/* The CPU backend at bf16 precision (kernels/ops.h "Precision"): activations
 * and the working weights are stored as 2-byte bf16 values (act_bytes 2),
 * exactly the storage of a GPU's bf16 kernels. Each op widens its bf16
 * operands into fp32 scratch, runs the fp32 op (all arithmetic and every sum
 * in fp32) and rounds what it stores to bf16, to nearest even
 * (kernels/bf16.h). Parameter gradients accumulate in fp32, statistics stay
 * fp32. So the mixed-precision path (casts, master weights, accumulation,
 * checkpoints, parallel layouts, the model's 2-byte buffers) runs in CI, and
 * the GPU's bf16 ops can be compared with these op by op.
 *
 * Scratch: one growing fp32 buffer per operand position (at most 7 per op),
 * so memory is bounded by the largest op's operands; ops run on one thread
 * of the caller (OpenMP inside), so the buffers are not shared. */
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

enum { SLOTS = 8 };
static float *slot_buf[SLOTS];
static size_t slot_cap[SLOTS];

/* fp32 scratch of n floats in slot s (zeros when it grows: never uninitialised) */
static float *scratch(int s, size_t n) {
    if (n > slot_cap[s]) {
        free(slot_buf[s]);
        slot_buf[s] = xcalloc(n, sizeof(float));
        slot_cap[s] = n;
    }
    return slot_buf[s];
}

static void widen_into(float *dst, const float *src, size_t n) {
    const uint16_t *b = (const uint16_t *)src;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(b[i]);
}

/* the n bf16 values at p as fp32, in slot s */
static float *wide(int s, const float *p, size_t n) {
    float *d = scratch(s, n);
    widen_into(d, p, n);
    return d;
}

/* store n fp32 values as bf16 at p */
static void narrow(float *p, const float *src, size_t n) {
    uint16_t *b = (uint16_t *)p;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) b[i] = bf16_bits(src[i]);
}

static void to_storage(float *dst, const float *src, size_t n) { narrow(dst, src, n); }
static void from_storage(float *dst, const float *src, size_t n) { widen_into(dst, src, n); }

/* rows of the bf16 table (or zeros outside this rank's vocabulary slice): a copy, exact */
static void embedding_forward(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V) {
    uint16_t *o = (uint16_t *)out;
    const uint16_t *t = (const uint16_t *)table;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - vstart;
        if (row >= 0 && row < V) memcpy(o + (size_t)n * C, t + (size_t)row * C, sizeof(uint16_t) * C);
        else memset(o + (size_t)n * C, 0, sizeof(uint16_t) * C);
    }
}

static void embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                               int V) {
    cpu_embedding_backward(dtable, tokens, wide(0, dout, (size_t)N * C), N, C, vstart, V);
}

/* norm gains (w) are the fp32 master; rstd is fp32 */
static void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    size_t n = (size_t)N * C;
    float *o = scratch(1, n);
    cpu_rmsnorm_forward(o, rstd, wide(0, x, n), w, N, C, eps);
    narrow(out, o, n);
}

static void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                             int N, int C, int accumulate) {
    size_t n = (size_t)N * C;
    float *d = accumulate ? wide(2, dx, n) : scratch(2, n);
    cpu_rmsnorm_backward(d, dw, wide(0, dout, n), wide(1, x, n), w, rstd, N, C, accumulate);
    narrow(dx, d, n);
}

static void matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate) {
    size_t no = (size_t)N * M;
    float *o = accumulate ? wide(2, out, no) : scratch(2, no);
    cpu_matmul_forward(o, wide(0, x, (size_t)N * K), wide(1, w, (size_t)M * K), N, K, M, accumulate);
    narrow(out, o, no);
}

/* dw: the fp32 gradient, accumulated from the fp32 sums */
static void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K, int M,
                            int accumulate_dx) {
    size_t nx = (size_t)N * K;
    float *d = !dx ? NULL : accumulate_dx ? wide(3, dx, nx) : scratch(3, nx);
    cpu_matmul_backward(d, dw, wide(0, dout, (size_t)N * M), wide(1, x, nx), wide(2, w, (size_t)M * K), N, K, M,
                        accumulate_dx);
    if (dx) narrow(dx, d, nx);
}

static void rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    size_t n = (size_t)B * T * H * D;
    float *v = wide(0, x, n);
    cpu_rope(v, cos, sin, B, T, H, D, inverse);
    narrow(x, v, n);
}

/* att (what backward needs) is fp32 */
static void attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                              int H, int KVH, int D, int Dv) {
    size_t rows = (size_t)B * T, no = rows * H * Dv;
    float *o = scratch(3, no);
    cpu_attention_forward(o, att, wide(0, q, rows * H * D), wide(1, k, rows * KVH * D), wide(2, v, rows * KVH * Dv), B,
                          T, H, KVH, D, Dv);
    narrow(out, o, no);
}

static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att, const float *q,
                               const float *k, const float *v, int B, int T, int H, int KVH, int D, int Dv) {
    size_t rows = (size_t)B * T, nq = rows * H * D, nk = rows * KVH * D, nv = rows * KVH * Dv;
    float *gq = scratch(4, nq), *gk = scratch(5, nk), *gv = scratch(6, nv);
    cpu_attention_backward(gq, gk, gv, wide(0, dout, rows * H * Dv), att, wide(1, q, nq), wide(2, k, nk),
                           wide(3, v, nv), B, T, H, KVH, D, Dv);
    narrow(dq, gq, nq);
    narrow(dk, gk, nk);
    narrow(dv, gv, nv);
}

static void attention_decode(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H, int KVH,
                             int D) {
    size_t no = (size_t)n * H * D, nk = (size_t)Tk * KVH * D;
    float *o = scratch(3, no);
    cpu_attention_decode(o, wide(0, q, no), wide(1, k, nk), wide(2, v, nk), n, Tk, H, KVH, D);
    narrow(out, o, no);
}

/* a copy of bf16 values is exact; accumulating adds in fp32 and rounds */
static void copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate) {
    uint16_t *d = (uint16_t *)dst;
    const uint16_t *s = (const uint16_t *)src;
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > 65536)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            uint16_t *o = d + (size_t)r * ldd + c;
            uint16_t v = s[(size_t)r * lds + c];
            *o = accumulate ? bf16_bits(bf16_to_float(*o) + bf16_to_float(v)) : v;
        }
}

static void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    float *o = scratch(2, n);
    cpu_swiglu_forward(o, wide(0, gate, n), wide(1, up, n), n);
    narrow(out, o, n);
}

static void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    float *dg = scratch(3, n), *du = scratch(4, n);
    cpu_swiglu_backward(dg, du, wide(0, dout, n), wide(1, gate, n), wide(2, up, n), n);
    narrow(dgate, dg, n);
    narrow(dup, du, n);
}

/* routing: the logits are stored, probabilities, lse, scores and gate weights are fp32 statistics */
static void moe_route_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E,
                              int k) {
    cpu_moe_route_forward(probs, lse, idx, w, wide(0, logits, (size_t)n * E), n, E, k);
}

static void moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                               const float *w, const float *aux_coef, float z_scale, int n, int E, int k) {
    float *d = scratch(0, (size_t)n * E);
    cpu_moe_route_backward(d, dw, probs, lse, idx, w, aux_coef, z_scale, n, E, k);
    narrow(dlogits, d, (size_t)n * E);
}

static void moe_route_sigmoid_forward(float *scores, int32_t *idx, float *w, const float *logits, const float *bias,
                                      int n, int E, int k, int n_group, int topk_group, float scaling) {
    cpu_moe_route_sigmoid_forward(scores, idx, w, wide(0, logits, (size_t)n * E), bias, n, E, k, n_group, topk_group,
                                  scaling);
}

static void moe_route_sigmoid_backward(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                       const float *w, const float *aux_coef, int n, int E, int k, float scaling) {
    float *d = scratch(0, (size_t)n * E);
    cpu_moe_route_sigmoid_backward(d, dw, scores, idx, w, aux_coef, n, E, k, scaling);
    narrow(dlogits, d, (size_t)n * E);
}

static void gather_rows(float *out, const float *x, const int32_t *rows, int n, int C) {
    uint16_t *o = (uint16_t *)out;
    const uint16_t *s = (const uint16_t *)x;
#pragma omp parallel for schedule(static) if ((size_t)n * C > 65536)
    for (int i = 0; i < n; i++) memcpy(o + (size_t)i * C, s + (size_t)rows[i] * C, sizeof(uint16_t) * C);
}

/* y has n*k rows (the send order); gate weights w are fp32 */
static void moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                        int accumulate) {
    size_t no = (size_t)n * C;
    float *o = accumulate ? wide(1, out, no) : scratch(1, no);
    cpu_moe_combine(o, wide(0, y, no * k), pos, w, n, k, C, accumulate);
    narrow(out, o, no);
}

static void moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                                 const float *w, int n, int k, int C) {
    size_t ny = (size_t)n * k * C;
    float *d = scratch(2, ny);
    memset(d, 0, sizeof(float) * ny); /* rows of dropped selections */
    cpu_moe_combine_backward(d, dw, wide(0, dout, (size_t)n * C), wide(1, y, ny), pos, w, n, k, C);
    narrow(dy, d, ny);
}

/* the losses and row statistics are fp32; the logits' gradient is stored */
static void cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
    size_t n = (size_t)N * V;
    float *l = wide(0, logits, n);
    cpu_cross_entropy(losses, l, targets, N, V, dscale);
    if (dscale != 0.0f) narrow(logits, l, n);
}

static void ce_row_max(float *rowmax, const float *logits, int N, int V) {
    cpu_ce_row_max(rowmax, wide(0, logits, (size_t)N * V), N, V);
}

static void ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                          const float *rowmax, int N, int V, int vstart) {
    cpu_ce_row_sumexp(sumexp, target_logit, wide(0, logits, (size_t)N * V), targets, rowmax, N, V, vstart);
}

static void ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                      const float *target_logit, int N, int V, int vstart, float dscale) {
    size_t n = (size_t)N * V;
    float *l = wide(0, logits, n);
    cpu_ce_finish(losses, l, targets, rowmax, sumexp, target_logit, N, V, vstart, dscale);
    if (dscale != 0.0f) narrow(logits, l, n);
}

static void add(float *dst, const float *src, size_t n) {
    float *d = wide(0, dst, n);
    cpu_add(d, wide(1, src, n), n);
    narrow(dst, d, n);
}

static void scale(float *x, float s, size_t n) {
    float *d = wide(0, x, n);
    cpu_scale(d, s, n);
    narrow(x, d, n);
}

const struct backend cpu_bf16_backend = {
    .name = "cpu",
    .precision = PRECISION_BF16,
    .act_bytes = 2,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .copy = cpu_copy,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
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
    .moe_route_forward = moe_route_forward,
    .moe_route_backward = moe_route_backward,
    .moe_route_sigmoid_forward = moe_route_sigmoid_forward,
    .moe_route_sigmoid_backward = moe_route_sigmoid_backward,
    .gather_rows = gather_rows,
    .moe_combine = moe_combine,
    .moe_combine_backward = moe_combine_backward,
    .cross_entropy = cross_entropy,
    .ce_row_max = ce_row_max,
    .ce_row_sumexp = ce_row_sumexp,
    .ce_finish = ce_finish,
    .to_storage = to_storage,
    .from_storage = from_storage,
    .add = add,
    .scale = scale,
    .sum = cpu_sum,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw,
};
