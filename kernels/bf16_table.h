/* A bf16 backend table built on an fp32 one (kernels/ops.h "Precision"),
 * included once per device as a template by kernels/cpu/bf16.c and
 * kernels/cuda/bf16.cu. Activations and the working weights are 2-byte bf16
 * values; each op widens its bf16 operands into fp32 scratch, runs the fp32
 * table's op (all arithmetic and every sum in fp32) and rounds what it
 * stores, to nearest even. Parameter gradients accumulate in fp32 and
 * statistics stay fp32, untouched. Pure moves of stored rows (embedding
 * lookup, row gathers, column copies) run on the 2-byte values directly.
 *
 * This is the reference bf16 path: exact storage, fp32 speed at best (the
 * widening costs copies; a device's fast bf16 kernels replace its ops one by
 * one and are tested against it). Scratch: one growing buffer per operand
 * position that never shrinks, so memory is the sum over positions of each
 * one's largest operand in fp32 (model/flops.c counts it); ops run on the
 * caller's thread.
 *
 * Define before including:
 *   BF16_TABLE  the name of the table to define
 *   BF16_INNER  the fp32 table (a struct backend object)
 *   BF16_NAME   the device's name ("cpu", "cuda")
 *   BF16_MEM    the device-memory function of the table, or NULL
 *   BF16_PEAK   the bf16 dense peak TFLOP/s function, or NULL
 *   BF16_HOST_VIEW  the device's host_view (kernels/ops.h), or NULL
 * and these storage functions of the device (src/dst in device memory):
 *   bf16_widen(float *dst, const float *src_bf16, size_t n)
 *   bf16_narrow(float *dst_bf16, const float *src, size_t n)     round to nearest even
 *   bf16_embedding(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V)
 *   bf16_gather_rows(float *out, const float *x, const int32_t *rows, int n, int C)
 *   bf16_copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate)
 * and, with BF16_OWN_MATMUL defined, the device's own bf16 GEMMs (bf16 in,
 * fp32 accumulation, bf16 out; dw accumulated in fp32) in place of the
 * widening ones: bf16_matmul_forward, bf16_matmul_backward (kernels/ops.h);
 * with BF16_OWN_ELEMENTWISE, its own rmsnorm_forward, rmsnorm_backward,
 * rope, swiglu_forward, swiglu_backward, add, scale and embedding_backward on bf16 storage (the
 * same numbers as the widening ones, in one pass); with BF16_OWN_ATTENTION,
 * its own attention_forward and attention_backward (the same state as the
 * fp32 table's), which may call ref_attention_forward/backward (below);
 * with BF16_OWN_COMBINE, its own moe_combine and moe_combine_backward on
 * bf16 rows (the same numbers; rows of dropped selections in dy unwritten);
 * with BF16_OWN_CROSS_ENTROPY, its own cross_entropy, ce_row_max,
 * ce_row_sumexp and ce_finish on the stored logits. */

#define BF16_SLOTS 8
static float *bf16_slot[BF16_SLOTS];
static size_t bf16_cap[BF16_SLOTS];
/* an FP8 GEMM input's codes (dequantised) kept in a slot for the next GEMM
 * of its group (fp8_recipe.input_group): which x they came from; any other
 * use of the slot forgets them */
static struct { unsigned group; const float *x; int rows, cols, br, bc; } bf16_kept[BF16_SLOTS];

/* fp32 scratch of n floats in slot s (the table's alloc zeroes it when it grows) */
static float *scratch(int s, size_t n) {
    bf16_kept[s].group = 0;
    if (n > bf16_cap[s]) {
        if (bf16_slot[s]) BF16_INNER.free(bf16_slot[s]);
        bf16_slot[s] = (float *)BF16_INNER.alloc(sizeof(float) * n);
        bf16_cap[s] = n;
    }
    return bf16_slot[s];
}

/* the n bf16 values at p as fp32, in slot s */
static float *wide(int s, const float *p, size_t n) {
    float *d = scratch(s, n);
    bf16_widen(d, p, n);
    return d;
}

/* memory, reductions and AdamW: the fp32 table's (bytes, fp32 gradients and master) */
static void *alloc(size_t bytes) { return BF16_INNER.alloc(bytes); }
static void free_(void *p) { BF16_INNER.free(p); }
static void zero(void *p, size_t bytes) { BF16_INNER.zero(p, bytes); }
static void to_host(void *dst, const void *src, size_t bytes) { BF16_INNER.to_host(dst, src, bytes); }
static void from_host(void *dst, const void *src, size_t bytes) { BF16_INNER.from_host(dst, src, bytes); }
static void copy(void *dst, const void *src, size_t bytes) { BF16_INNER.copy(dst, src, bytes); }
static size_t attention_state_floats(int B, int H, int T) { return BF16_INNER.attention_state_floats(B, H, T); }
static double sum(const float *x, size_t n) { return BF16_INNER.sum(x, n); }
static double sum_squares(const float *x, size_t n) { return BF16_INNER.sum_squares(x, n); }
static void adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int step, uint16_t *work) {
    BF16_INNER.adamw(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step, work);
#ifdef BF16_WEIGHTS_CHANGED /* a device that keeps codes of the weights (kernels/cuda/fp8_gemm.cu) drops them */
    BF16_WEIGHTS_CHANGED();
#endif
}

static void to_storage(float *dst, const float *src, size_t n) { bf16_narrow(dst, src, n); }
static void from_storage(float *dst, const float *src, size_t n) { bf16_widen(dst, src, n); }

#ifndef BF16_OWN_ELEMENTWISE
static void embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                               int V) {
    BF16_INNER.embedding_backward(dtable, tokens, wide(0, dout, (size_t)N * C), N, C, vstart, V);
}
#endif

#ifndef BF16_OWN_ELEMENTWISE
/* norm gains (w) are the fp32 master; rstd is fp32 */
static void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    size_t n = (size_t)N * C;
    float *o = scratch(1, n);
    BF16_INNER.rmsnorm_forward(o, rstd, wide(0, x, n), w, N, C, eps);
    bf16_narrow(out, o, n);
}

static void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                             int N, int C, int accumulate) {
    size_t n = (size_t)N * C;
    float *d = accumulate ? wide(2, dx, n) : scratch(2, n);
    BF16_INNER.rmsnorm_backward(d, dw, wide(0, dout, n), wide(1, x, n), w, rstd, N, C, accumulate);
    bf16_narrow(dx, d, n);
}

#endif /* BF16_OWN_ELEMENTWISE (continued below) */

#ifndef BF16_OWN_MATMUL
static void matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate) {
    size_t no = (size_t)N * M;
    float *o = accumulate ? wide(2, out, no) : scratch(2, no);
    BF16_INNER.matmul_forward(o, wide(0, x, (size_t)N * K), wide(1, w, (size_t)M * K), N, K, M, accumulate);
    bf16_narrow(out, o, no);
}

/* dw: the fp32 gradient, accumulated from the fp32 sums */
static void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K, int M,
                            int accumulate_dx) {
    size_t nx = (size_t)N * K;
    float *d = !dx ? NULL : accumulate_dx ? wide(3, dx, nx) : scratch(3, nx);
    BF16_INNER.matmul_backward(d, dw, wide(0, dout, (size_t)N * M), wide(1, x, nx), wide(2, w, (size_t)M * K), N, K, M,
                               accumulate_dx);
    if (dx) bf16_narrow(dx, d, nx);
}
#define bf16_matmul_forward matmul_forward
#define bf16_matmul_backward matmul_backward
#endif

#ifndef BF16_OWN_ELEMENTWISE
static void rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    size_t n = (size_t)B * T * H * D;
    float *v = wide(0, x, n);
    BF16_INNER.rope(v, cos, sin, B, T, H, D, inverse);
    bf16_narrow(x, v, n);
}

#endif

/* The widening attention (att, what backward needs, is fp32); a table with
 * its own kernels defines BF16_OWN_ATTENTION and attention_forward/backward
 * that fall back on these where the kernels do not apply. */
static void ref_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B,
                                  int T, int H, int KVH, int D, int Dv) {
    size_t rows = (size_t)B * T, no = rows * H * Dv;
    float *o = scratch(3, no);
    BF16_INNER.attention_forward(o, att, wide(0, q, rows * H * D), wide(1, k, rows * KVH * D),
                                 wide(2, v, rows * KVH * Dv), B, T, H, KVH, D, Dv);
    bf16_narrow(out, o, no);
}

static void ref_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *att, const float *q, const float *k, const float *v, int B, int T,
                                   int H, int KVH, int D, int Dv) {
    size_t rows = (size_t)B * T, nq = rows * H * D, nk = rows * KVH * D, nv = rows * KVH * Dv;
    float *gq = scratch(4, nq), *gk = scratch(5, nk), *gv = scratch(6, nv);
    BF16_INNER.attention_backward(gq, gk, gv, wide(0, dout, rows * H * Dv), NULL, att, wide(1, q, nq), wide(2, k, nk),
                                  wide(3, v, nv), B, T, H, KVH, D, Dv);
    bf16_narrow(dq, gq, nq);
    bf16_narrow(dk, gk, nk);
    bf16_narrow(dv, gv, nv);
}

/* context parallelism's block ops on the fp32 table's (o, lse, dq, dk, dv are fp32 already); a table with
 * its own defines BF16_OWN_ATTENTION_BLOCK and attention_block_forward / _backward falling back on these */
static void ref_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B,
                                        int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1,
                                        int first) {
    size_t rows = (size_t)B * 2 * c;
    CHECK(BF16_INNER.attention_block_forward);
    BF16_INNER.attention_block_forward(o, lse, wide(0, q, rows * H * D), wide(1, k, rows * KVH * D),
                                       wide(2, v, rows * KVH * Dv), B, c, H, KVH, D, Dv, q0, q1, k0, k1, first);
}

static void ref_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                         const float *lse, const float *q, const float *k, const float *v, int B,
                                         int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1) {
    size_t rows = (size_t)B * 2 * c;
    CHECK(BF16_INNER.attention_block_backward);
    BF16_INNER.attention_block_backward(dq, dk, dv, wide(0, dout, rows * H * Dv), wide(1, out, rows * H * Dv), lse,
                                        wide(2, q, rows * H * D), wide(3, k, rows * KVH * D),
                                        wide(4, v, rows * KVH * Dv), B, c, H, KVH, D, Dv, q0, q1, k0, k1);
}

static void attention_decode(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H, int KVH,
                             int D, int Dv) {
    size_t nq = (size_t)n * H * D, no = (size_t)n * H * Dv, nk = (size_t)Tk * KVH * D, nv = (size_t)Tk * KVH * Dv;
    float *o = scratch(3, no);
    BF16_INNER.attention_decode(o, wide(0, q, nq), wide(1, k, nk), wide(2, v, nv), n, Tk, H, KVH, D, Dv);
    bf16_narrow(out, o, no);
}

#ifndef BF16_OWN_ELEMENTWISE
static void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    float *o = scratch(2, n);
    BF16_INNER.swiglu_forward(o, wide(0, gate, n), wide(1, up, n), n);
    bf16_narrow(out, o, n);
}

static void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    float *dg = scratch(3, n), *du = scratch(4, n);
    BF16_INNER.swiglu_backward(dg, du, wide(0, dout, n), wide(1, gate, n), wide(2, up, n), n);
    bf16_narrow(dgate, dg, n);
    bf16_narrow(dup, du, n);
}

#endif

/* routing: the logits are stored, probabilities, lse, scores and gate weights are fp32 statistics */
static void moe_route_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E,
                              int k) {
    BF16_INNER.moe_route_forward(probs, lse, idx, w, wide(0, logits, (size_t)n * E), n, E, k);
}

static void moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                               const float *w, const float *aux_coef, float z_scale, int n, int E, int k, int T,
                               int r0) {
    float *d = scratch(0, (size_t)n * E);
    BF16_INNER.moe_route_backward(d, dw, probs, lse, idx, w, aux_coef, z_scale, n, E, k, T, r0);
    bf16_narrow(dlogits, d, (size_t)n * E);
}

static void moe_route_sigmoid_forward(float *scores, int32_t *idx, float *w, const float *logits, const float *bias,
                                      int n, int E, int k, int n_group, int topk_group, float scaling) {
    BF16_INNER.moe_route_sigmoid_forward(scores, idx, w, wide(0, logits, (size_t)n * E), bias, n, E, k, n_group,
                                         topk_group, scaling);
}

static void moe_route_sigmoid_backward(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                       const float *w, const float *aux_coef, int n, int E, int k, float scaling,
                                       int T, int r0) {
    float *d = scratch(0, (size_t)n * E);
    BF16_INNER.moe_route_sigmoid_backward(d, dw, scores, idx, w, aux_coef, n, E, k, scaling, T, r0);
    bf16_narrow(dlogits, d, (size_t)n * E);
}

/* the routing decisions read counts, statistics and indices only: the fp32 table's */
static void moe_route_counts(float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B) {
    BF16_INNER.moe_route_counts(counts, idx, n, k, E, T, r0, B);
}
static void moe_route_balance(float *coef, double *metrics, const float *counts_all, const float *probs,
                              const float *lse, int n, int E, int k, int T, int r0, int B, int tp, int tp_rank,
                              int sigmoid, float aux_scale, long cap) {
    BF16_INNER.moe_route_balance(coef, metrics, counts_all, probs, lse, n, E, k, T, r0, B, tp, tp_rank, sigmoid,
                                 aux_scale, cap);
}
static void moe_dispatch(int32_t *pos, int32_t *send_rows, float *expert_counts, const int32_t *idx,
                         const float *counts_all, int n, int k, int E, int T, int r0, int B, int tp_rank, long cap) {
    BF16_INNER.moe_dispatch(pos, send_rows, expert_counts, idx, counts_all, n, k, E, T, r0, B, tp_rank, cap);
}
static void moe_expert_order(int32_t *order, int32_t *inverse, int32_t *offsets, const float *in, int ep, int El,
                             int rows) {
    BF16_INNER.moe_expert_order(order, inverse, offsets, in, ep, El, rows);
}

#ifndef BF16_OWN_COMBINE
/* y has n*k rows (the send order); gate weights w are fp32 */
static void moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                        int accumulate) {
    size_t no = (size_t)n * C;
    float *o = accumulate ? wide(1, out, no) : scratch(1, no);
    BF16_INNER.moe_combine(o, wide(0, y, no * k), pos, w, n, k, C, accumulate);
    bf16_narrow(out, o, no);
}

static void moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                                 const float *w, int n, int k, int C) {
    size_t ny = (size_t)n * k * C;
    float *d = scratch(2, ny);
    BF16_INNER.zero(d, sizeof(float) * ny); /* rows of dropped selections */
    BF16_INNER.moe_combine_backward(d, dw, wide(0, dout, (size_t)n * C), wide(1, y, ny), pos, w, n, k, C);
    bf16_narrow(dy, d, ny);
}
#endif

#ifndef BF16_OWN_CROSS_ENTROPY
/* The cross-entropy ops work row by row, so they widen the logits a chunk
 * of rows at a time (BF16_CE_CHUNK_FLOATS fp32 values, at least one row):
 * no fp32 copy of all N x V logits (4.2 GB at 8192 tokens x 128256), the
 * same numbers. The losses and row statistics are fp32; the logits'
 * gradient is stored. */
#ifndef BF16_CE_CHUNK_FLOATS
#define BF16_CE_CHUNK_FLOATS ((size_t)1 << 24)
#endif
#define CE_CHUNKS(N, V)                                                                                        \
    for (int r0 = 0, rows_ = (int)(BF16_CE_CHUNK_FLOATS / (size_t)(V) > 0 ? BF16_CE_CHUNK_FLOATS / (size_t)(V) : 1), \
             n = (N) < rows_ ? (N) : rows_;                                                                    \
         r0 < (N); r0 += rows_, n = (N) - r0 < rows_ ? (N) - r0 : rows_)
/* row r0 of logits rows of V bf16 values */
static float *ce_row(const float *logits, int r0, int V) { return (float *)((char *)logits + 2 * (size_t)r0 * V); }

static void cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
    CE_CHUNKS(N, V) {
        float *l = wide(0, ce_row(logits, r0, V), (size_t)n * V);
        BF16_INNER.cross_entropy(losses + r0, l, targets + r0, n, V, dscale);
        if (dscale != 0.0f) bf16_narrow(ce_row(logits, r0, V), l, (size_t)n * V);
    }
}

static void ce_row_max(float *rowmax, const float *logits, int N, int V) {
    CE_CHUNKS(N, V) BF16_INNER.ce_row_max(rowmax + r0, wide(0, ce_row(logits, r0, V), (size_t)n * V), n, V);
}

static void ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                          const float *rowmax, int N, int V, int vstart) {
    CE_CHUNKS(N, V)
    BF16_INNER.ce_row_sumexp(sumexp + r0, target_logit + r0, wide(0, ce_row(logits, r0, V), (size_t)n * V),
                             targets + r0, rowmax + r0, n, V, vstart);
}

static void ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                      const float *target_logit, int N, int V, int vstart, float dscale) {
    CE_CHUNKS(N, V) {
        float *l = wide(0, ce_row(logits, r0, V), (size_t)n * V);
        BF16_INNER.ce_finish(losses + r0, l, targets + r0, rowmax + r0, sumexp + r0, target_logit + r0, n, V, vstart,
                             dscale);
        if (dscale != 0.0f) bf16_narrow(ce_row(logits, r0, V), l, (size_t)n * V);
    }
}

#endif /* BF16_OWN_CROSS_ENTROPY */

#ifndef BF16_OWN_ELEMENTWISE
static void add(float *dst, const float *src, size_t n) {
    float *d = wide(0, dst, n);
    BF16_INNER.add(d, wide(1, src, n), n);
    bf16_narrow(dst, d, n);
}

static void scale(float *x, float s, size_t n) {
    float *d = wide(0, x, n);
    BF16_INNER.scale(d, s, n);
    bf16_narrow(x, d, n);
}
#endif

#ifdef BF16_OWN_ATTENTION_BLOCK
#define BF16_ATTENTION_BLOCK_FORWARD attention_block_forward
#define BF16_ATTENTION_BLOCK_BACKWARD attention_block_backward
#else
#define BF16_ATTENTION_BLOCK_FORWARD ref_attention_block_forward
#define BF16_ATTENTION_BLOCK_BACKWARD ref_attention_block_backward
#endif
#ifdef BF16_OWN_ATTENTION
#define BF16_ATTENTION_FORWARD attention_forward
#define BF16_ATTENTION_BACKWARD attention_backward
#else
#define BF16_ATTENTION_FORWARD ref_attention_forward
#define BF16_ATTENTION_BACKWARD ref_attention_backward
#endif

/* the experts' GEMMs at once: a device's own (BF16_EXPERTS_FORWARD / _BACKWARD), else none */
#ifndef BF16_EXPERTS_FORWARD
#define BF16_EXPERTS_FORWARD NULL
#define BF16_EXPERTS_BACKWARD NULL
#endif

/* every op but the name, precision and the fp8 GEMMs: both tables' */
#define BF16_OPS \
    .alloc = alloc, \
    .free = free_, \
    .zero = zero, \
    .to_host = to_host, \
    .from_host = from_host, \
    .copy = copy, \
    .host_view = BF16_HOST_VIEW, \
    .embedding_forward = bf16_embedding, \
    .embedding_backward = embedding_backward, \
    .rmsnorm_forward = rmsnorm_forward, \
    .rmsnorm_backward = rmsnorm_backward, \
    .matmul_forward = bf16_matmul_forward, \
    .matmul_backward = bf16_matmul_backward, \
    .experts_matmul_forward = BF16_EXPERTS_FORWARD, \
    .experts_matmul_backward = BF16_EXPERTS_BACKWARD, \
    .rope = rope, \
    .attention_forward = BF16_ATTENTION_FORWARD, \
    .attention_state_floats = attention_state_floats, \
    .attention_backward = BF16_ATTENTION_BACKWARD, \
    .attention_block_forward = BF16_ATTENTION_BLOCK_FORWARD, \
    .attention_block_backward = BF16_ATTENTION_BLOCK_BACKWARD, \
    .attention_decode = attention_decode, \
    .copy_cols = bf16_copy_cols, \
    .swiglu_forward = swiglu_forward, \
    .swiglu_backward = swiglu_backward, \
    .moe_route_forward = moe_route_forward, \
    .moe_route_backward = moe_route_backward, \
    .moe_route_sigmoid_forward = moe_route_sigmoid_forward, \
    .moe_route_sigmoid_backward = moe_route_sigmoid_backward, \
    .gather_rows = bf16_gather_rows, \
    .moe_combine = moe_combine, \
    .moe_combine_backward = moe_combine_backward, \
    .moe_route_counts = moe_route_counts, \
    .moe_route_balance = moe_route_balance, \
    .moe_dispatch = moe_dispatch, \
    .moe_expert_order = moe_expert_order, \
    .cross_entropy = cross_entropy, \
    .ce_row_max = ce_row_max, \
    .ce_row_sumexp = ce_row_sumexp, \
    .ce_finish = ce_finish, \
    .to_storage = to_storage, \
    .from_storage = from_storage, \
    .add = add, \
    .scale = scale, \
    .sum = sum, \
    .sum_squares = sum_squares, \
    .adamw = adamw, \
    .device_mem_mib = BF16_MEM, \
    .peak_tflops = BF16_PEAK

#ifdef __cplusplus
extern "C"
#endif
const struct backend BF16_TABLE = {.name = BF16_NAME, .precision = PRECISION_BF16, .act_bytes = 2, BF16_OPS};

#ifdef BF16_FP8_TABLE
/* ---- FP8: the bf16 table plus FP8 GEMMs for the blocks' linear layers ----
 * The reference FP8 GEMM: each operand widened to fp32, quantised and
 * dequantised in place by the device's fp8_qdq_blocks (kernels/fp8.h: the
 * value an 8-bit code times its power-of-two scale stands for, so exact in
 * fp32), multiplied by the fp32 table's GEMM: what an FP8 tensor-core GEMM
 * computes, up to the order of its fp32 sums. Blocks follow the contraction:
 * per-tensor scaling takes the whole operand as one block; block scaling
 * takes 1 x 128 blocks of activations and output gradients along K (dgrad:
 * along M), 128 x 1 along the tokens for the weight gradient's operands,
 * and 128 x 128 blocks of weights. Needs
 *   fp8_qdq_blocks(float *x, int rows, int cols, int br, int bc, int format, int k, float *amax)
 * from the device (x in device memory, fp32, row-major; k: one block's
 * fixed scale exponent, or FP8_SCALE_CURRENT; amax: NULL, or where the
 * tensor's amax is max-accumulated, device memory). A device with its
 * own FP8 GEMMs defines BF16_OWN_FP8 and fp8_matmul_forward/backward, which
 * may fall back on ref_fp8_matmul_forward/backward. */
#define FP8_BLOCK 128
#ifdef BF16_OWN_FP8
#define BF16_FP8_FORWARD fp8_matmul_forward
#define BF16_FP8_BACKWARD fp8_matmul_backward
#else
#define BF16_FP8_FORWARD ref_fp8_matmul_forward
#define BF16_FP8_BACKWARD ref_fp8_matmul_backward
#endif

/* s's fp32 widening of the bf16 operand x [rows, cols], quantised in blocks
 * of br x bc (block scaling), else as one tensor: by its current amax, or
 * (delayed scaling) by the exponent its history gave, its amax recorded */
static float *fp8_operand(int s, const float *x, int rows, int cols, int br, int bc, int format,
                          struct fp8_recipe recipe, enum fp8_operand which) {
    if (recipe.scaling != FP8_SCALING_BLOCK) br = rows, bc = cols;
    int grouped = which == FP8_INPUT && recipe.input_group && recipe.scaling != FP8_SCALING_DELAYED;
    if (grouped && bf16_kept[s].group == recipe.input_group && bf16_kept[s].x == x && bf16_kept[s].rows == rows &&
        bf16_kept[s].cols == cols && bf16_kept[s].br == br && bf16_kept[s].bc == bc)
        return bf16_slot[s]; /* the group's previous GEMM made these codes */
    float *d = wide(s, x, (size_t)rows * cols);
    int k = FP8_SCALE_CURRENT;
    float *amax = NULL;
    if (recipe.scaling == FP8_SCALING_DELAYED) k = recipe.scale_exp[which], amax = recipe.amax + which;
    fp8_qdq_blocks(d, rows, cols, br, bc, format, k, amax);
    if (grouped) {
        bf16_kept[s].group = recipe.input_group, bf16_kept[s].x = x;
        bf16_kept[s].rows = rows, bf16_kept[s].cols = cols, bf16_kept[s].br = br, bf16_kept[s].bc = bc;
    }
    return d;
}

static void ref_fp8_matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate,
                                   struct fp8_recipe recipe) {
    size_t no = (size_t)N * M;
    if (!no) return;
    float *o = accumulate ? wide(2, out, no) : scratch(2, no);
    BF16_INNER.matmul_forward(o, fp8_operand(0, x, N, K, 1, FP8_BLOCK, FP8_E4M3, recipe, FP8_INPUT),
                              fp8_operand(1, w, M, K, FP8_BLOCK, FP8_BLOCK, FP8_E4M3, recipe, FP8_WEIGHT), N, K, M,
                              accumulate);
    bf16_narrow(out, o, no);
}

static void ref_fp8_matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N,
                                    int K, int M, int accumulate_dx, struct fp8_recipe recipe) {
    size_t nx = (size_t)N * K;
    int gf = recipe.grad_e5m2 ? FP8_E5M2 : FP8_E4M3;
    if (!N || !M || !K) return;
    float *wq = fp8_operand(2, w, M, K, FP8_BLOCK, FP8_BLOCK, FP8_E4M3, recipe, FP8_WEIGHT);
    if (dx) { /* dx = dout @ w: contraction over M */
        float *d = accumulate_dx ? wide(3, dx, nx) : scratch(3, nx);
        BF16_INNER.matmul_backward(d, NULL, fp8_operand(0, dout, N, M, 1, FP8_BLOCK, gf, recipe, FP8_GRAD), NULL, wq,
                                   N, K, M, accumulate_dx);
        bf16_narrow(dx, d, nx);
    }
    if (dw) /* dw += dout^T @ x: contraction over the tokens */
        BF16_INNER.matmul_backward(NULL, dw, fp8_operand(0, dout, N, M, FP8_BLOCK, 1, gf, recipe, FP8_GRAD),
                                   fp8_operand(1, x, N, K, FP8_BLOCK, 1, FP8_E4M3, recipe, FP8_INPUT), wq, N, K, M,
                                   0);
}

#ifdef __cplusplus
extern "C"
#endif
const struct backend BF16_FP8_TABLE = {.name = BF16_NAME, .precision = PRECISION_FP8, .act_bytes = 2, BF16_OPS,
                                       .fp8_matmul_forward = BF16_FP8_FORWARD,
                                       .fp8_matmul_backward = BF16_FP8_BACKWARD};
#endif
