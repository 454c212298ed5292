/* The profiled backend table (kernels/profile.h): every op of the wrapped
 * table, then a wait for the device (a one-byte read-back through the
 * table's own to_host; a no-op's worth on the CPU), its time added to its
 * (op, shape) row. FLOP counts are model/flops.c's: 2NKM a GEMM, causal
 * attention B T^2 H (D + Dv) forward and twice that backward; other ops
 * count none. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/profile.h"

struct row {
    char op[28], shape[52];
    long calls;
    double seconds, flops;
    int part; /* a part of an op's time (profile_part), not an op */
};

static const struct backend *in;
static struct backend table;
static struct row rows[PROFILE_ENTRIES];
static int nrows, counting = 1;
static double since, paused, paused_at; /* wall time since the reset, less what was not counted */
static char *probe; /* one byte of device memory to read back */

int profile_requested(void) {
    const char *e = getenv("MTRAIN_PROFILE");
    return e && *e && strcmp(e, "0") != 0;
}

void profile_reset(void) {
    nrows = 0;
    since = paused_at = now_seconds();
    paused = 0;
}

int profile_counting(int on) {
    int was = counting;
    double t = now_seconds();
    if (was && !on) paused_at = t;
    if (!was && on) paused += t - paused_at;
    counting = on;
    return was;
}

static double begin(void) { return counting ? now_seconds() : 0; }

static int find(const char *op, const char *shape) {
    for (int i = 0; i < nrows; i++)
        if (!strcmp(rows[i].op, op) && !strcmp(rows[i].shape, shape)) return i;
    return -1;
}

/* adds dt and flops to the row (op, shape, part); once the table is nearly
 * full, new shapes share one "other" row per op (the last row, when even
 * those no longer fit) */
static void add(const char *op, int part, double dt, double flops, const char *fmt, va_list ap) {
    char shape[sizeof rows[0].shape];
    vsnprintf(shape, sizeof shape, fmt, ap);
    int i = find(op, shape);
    if (i < 0 && nrows >= PROFILE_ENTRIES / 2) i = find(op, strcpy(shape, "other"));
    if (i < 0 && nrows == PROFILE_ENTRIES) i = PROFILE_ENTRIES - 1;
    if (i < 0) {
        i = nrows++;
        memset(&rows[i], 0, sizeof rows[i]);
        snprintf(rows[i].op, sizeof rows[i].op, "%s", op);
        snprintf(rows[i].shape, sizeof rows[i].shape, "%s", shape);
        rows[i].part = part;
    }
    rows[i].calls++;
    rows[i].seconds += dt;
    rows[i].flops += flops;
}

/* waits for the op, then adds its time to its row */
static void done(double t0, const char *op, double flops, const char *fmt, ...) {
    if (!counting) return;
    char c;
    in->to_host(&c, probe, 1);
    double dt = now_seconds() - t0;
    va_list ap;
    va_start(ap, fmt);
    add(op, 0, dt, flops, fmt, ap);
    va_end(ap);
}

int profile_parts_active(void) { return in && counting; }

long profile_op_calls(void) {
    long n = 0;
    for (int i = 0; i < nrows; i++) n += rows[i].part ? 0 : rows[i].calls;
    return n;
}

void profile_part(const char *what, double flops, double seconds, const char *fmt, ...) {
    if (!profile_parts_active()) return;
    char op[sizeof rows[0].op];
    snprintf(op, sizeof op, "(%s)", what);
    va_list ap;
    va_start(ap, fmt);
    add(op, 1, seconds, flops, fmt, ap);
    va_end(ap);
}

static double gemm(int N, int K, int M) { return 2.0 * N * K * M; }
static double attention(int B, int T, int H, int D, int Dv) { return (double)B * T * T * H * (D + Dv); }
/* which gradients a backward GEMM call computed */
static const char *grads(const float *dx, const float *dw) { return dx ? (dw ? "dx+dw" : "dx") : "dw"; }

/* p_OP: the wrapped table's OP, then done() with the label, FLOPs and shape */
#define TIMED(op, params, args, ...) \
    static void p_##op params {      \
        double t = begin();          \
        in->op args;                 \
        done(t, __VA_ARGS__);        \
    }

TIMED(zero, (void *p, size_t bytes), (p, bytes), "zero", 0, "%zu bytes", bytes)
TIMED(to_host, (void *dst, const void *src, size_t bytes), (dst, src, bytes), "to_host", 0, "%zu bytes", bytes)
TIMED(from_host, (void *dst, const void *src, size_t bytes), (dst, src, bytes), "from_host", 0, "%zu bytes", bytes)
TIMED(copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes), "copy", 0, "%zu bytes", bytes)
TIMED(embedding_forward, (float *out, const int32_t *tokens, const float *table_, int N, int C, int vstart, int V),
      (out, tokens, table_, N, C, vstart, V), "embedding_forward", 0, "%dx%d", N, C)
TIMED(embedding_backward, (float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart, int V),
      (dtable, tokens, dout, N, C, vstart, V), "embedding_backward", 0, "%dx%d", N, C)
TIMED(rmsnorm_forward, (float *out, float *rstd, const float *x, const float *w, int N, int C, float eps),
      (out, rstd, x, w, N, C, eps), "rmsnorm_forward", 0, "%dx%d", N, C)
TIMED(rmsnorm_backward,
      (float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N, int C,
       int accumulate),
      (dx, dw, dout, x, w, rstd, N, C, accumulate), "rmsnorm_backward", 0, "%dx%d", N, C)
TIMED(matmul_forward, (float *out, const float *x, const float *w, int N, int K, int M, int accumulate),
      (out, x, w, N, K, M, accumulate), "matmul_forward", gemm(N, K, M), "%dx%dx%d", N, K, M)
TIMED(matmul_backward,
      (float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K, int M, int accumulate_dx),
      (dx, dw, dout, x, w, N, K, M, accumulate_dx), "matmul_backward", gemm(N, K, M) * (!!dx + !!dw), "%s %dx%dx%d",
      grads(dx, dw), N, K, M)
TIMED(rope, (float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse),
      (x, cos, sin, B, T, H, D, inverse), inverse ? "rope_backward" : "rope", 0, "%dx%dx%dx%d", B, T, H, D)
TIMED(attention_forward,
      (float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D,
       int Dv),
      (out, att, q, k, v, B, T, H, KVH, D, Dv), "attention_forward", attention(B, T, H, D, Dv), "B%d T%d H%d/%d D%d/%d",
      B, T, H, KVH, D, Dv)
TIMED(attention_backward,
      (float *dq, float *dk, float *dv, const float *dout, const float *out, const float *att, const float *q,
       const float *k, const float *v, int B, int T, int H, int KVH, int D, int Dv),
      (dq, dk, dv, dout, out, att, q, k, v, B, T, H, KVH, D, Dv), "attention_backward", 2 * attention(B, T, H, D, Dv),
      "B%d T%d H%d/%d D%d/%d", B, T, H, KVH, D, Dv)
TIMED(attention_decode,
      (float *out, const float *q, const float *k, const float *v, int n, int Tk, int H, int KVH, int D, int Dv),
      (out, q, k, v, n, Tk, H, KVH, D, Dv), "attention_decode", 0, "n%d Tk%d", n, Tk)
TIMED(copy_cols, (float *dst, int ldd, const float *src, int lds, int rows_, int cols, int accumulate),
      (dst, ldd, src, lds, rows_, cols, accumulate), "copy_cols", 0, "%dx%d", rows_, cols)
TIMED(swiglu_forward, (float *out, const float *gate, const float *up, size_t n), (out, gate, up, n), "swiglu_forward",
      0, "%zu", n)
TIMED(swiglu_backward, (float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n),
      (dgate, dup, dout, gate, up, n), "swiglu_backward", 0, "%zu", n)
TIMED(moe_route_forward, (float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E, int k),
      (probs, lse, idx, w, logits, n, E, k), "moe_route_forward", 0, "%dx%d top%d", n, E, k)
TIMED(moe_route_backward,
      (float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx, const float *w,
       const float *aux_coef, float z_scale, int n, int E, int k, int T, int r0),
      (dlogits, dw, probs, lse, idx, w, aux_coef, z_scale, n, E, k, T, r0), "moe_route_backward", 0, "%dx%d top%d", n,
      E, k)
TIMED(moe_route_sigmoid_forward,
      (float *scores, int32_t *idx, float *w, const float *logits, const float *bias, int n, int E, int k,
       int n_group, int topk_group, float scaling),
      (scores, idx, w, logits, bias, n, E, k, n_group, topk_group, scaling), "moe_route_sigmoid_forward", 0,
      "%dx%d top%d", n, E, k)
TIMED(moe_route_sigmoid_backward,
      (float *dlogits, const float *dw, const float *scores, const int32_t *idx, const float *w,
       const float *aux_coef, int n, int E, int k, float scaling, int T, int r0),
      (dlogits, dw, scores, idx, w, aux_coef, n, E, k, scaling, T, r0), "moe_route_sigmoid_backward", 0, "%dx%d top%d",
      n, E, k)
TIMED(moe_route_counts, (float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B),
      (counts, idx, n, k, E, T, r0, B), "moe_route_counts", 0, "%dx%d top%d", n, E, k)
TIMED(moe_route_balance,
      (float *coef, double *metrics, const float *counts_all, const float *probs, const float *lse, int n, int E, int k,
       int T, int r0, int B, int tp, int tp_rank, int sigmoid, float aux_scale, long cap),
      (coef, metrics, counts_all, probs, lse, n, E, k, T, r0, B, tp, tp_rank, sigmoid, aux_scale, cap),
      "moe_route_balance", 0, "%dx%d top%d", n, E, k)
TIMED(moe_dispatch,
      (int32_t *pos, int32_t *send_rows, float *expert_counts, const int32_t *idx, const float *counts_all, int n,
       int k, int E, int T, int r0, int B, int tp_rank, long cap),
      (pos, send_rows, expert_counts, idx, counts_all, n, k, E, T, r0, B, tp_rank, cap), "moe_dispatch", 0,
      "%dx%d top%d", n, E, k)
TIMED(moe_expert_order,
      (int32_t *order, int32_t *inverse, int32_t *offsets, const float *received, int ep, int El, int rows_),
      (order, inverse, offsets, received, ep, El, rows_), "moe_expert_order", 0, "ep%d El%d", ep, El)
TIMED(gather_rows, (float *out, const float *x, const int32_t *rows_, int n, int C), (out, x, rows_, n, C),
      "gather_rows", 0, "C%d", C) /* n varies with the routing */
TIMED(moe_combine,
      (float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C, int accumulate),
      (out, y, pos, w, n, k, C, accumulate), "moe_combine", 0, "%dx%d top%d", n, C, k)
TIMED(moe_combine_backward,
      (float *dy, float *dw, const float *dout, const float *y, const int32_t *pos, const float *w, int n, int k,
       int C),
      (dy, dw, dout, y, pos, w, n, k, C), "moe_combine_backward", 0, "%dx%d top%d", n, C, k)
TIMED(cross_entropy, (float *losses, float *logits, const int32_t *targets, int N, int V, float dscale),
      (losses, logits, targets, N, V, dscale), "cross_entropy", 0, "%dx%d", N, V)
TIMED(ce_row_max, (float *rowmax, const float *logits, int N, int V), (rowmax, logits, N, V), "ce_row_max", 0, "%dx%d",
      N, V)
TIMED(ce_row_sumexp,
      (float *sumexp, float *target_logit, const float *logits, const int32_t *targets, const float *rowmax, int N,
       int V, int vstart),
      (sumexp, target_logit, logits, targets, rowmax, N, V, vstart), "ce_row_sumexp", 0, "%dx%d", N, V)
TIMED(ce_finish,
      (float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
       const float *target_logit, int N, int V, int vstart, float dscale),
      (losses, logits, targets, rowmax, sumexp, target_logit, N, V, vstart, dscale), "ce_finish", 0, "%dx%d", N, V)
TIMED(to_storage, (float *dst, const float *src, size_t n), (dst, src, n), "to_storage", 0, "%zu", n)
TIMED(from_storage, (float *dst, const float *src, size_t n), (dst, src, n), "from_storage", 0, "%zu", n)
TIMED(add, (float *dst, const float *src, size_t n), (dst, src, n), "add", 0, "%zu", n)
TIMED(scale, (float *x, float s, size_t n), (x, s, n), "scale", 0, "%zu", n)
static double p_sum(const float *x, size_t n) {
    double t = begin(), r = in->sum(x, n);
    done(t, "sum", 0, "%zu", n);
    return r;
}
static double p_sum_squares(const float *x, size_t n) {
    double t = begin(), r = in->sum_squares(x, n);
    done(t, "sum_squares", 0, "%zu", n);
    return r;
}
TIMED(adamw,
      (float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps,
       float weight_decay, float grad_scale, int step, uint16_t *work),
      (param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step, work), "adamw", 0, "%zu", n)
TIMED(fp8_matmul_forward,
      (float *out, const float *x, const float *w, int N, int K, int M, int accumulate, struct fp8_recipe recipe),
      (out, x, w, N, K, M, accumulate, recipe), "fp8_matmul_forward", gemm(N, K, M), "%dx%dx%d", N, K, M)
TIMED(fp8_matmul_backward,
      (float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K, int M, int accumulate_dx,
       struct fp8_recipe recipe),
      (dx, dw, dout, x, w, N, K, M, accumulate_dx, recipe), "fp8_matmul_backward", gemm(N, K, M) * (!!dx + !!dw),
      "%s %dx%dx%d", grads(dx, dw), N, K, M)

/* the experts' GEMMs at once: timed when the inner table took them (0), each its kind's GEMMs over all rows */
static double expert_flops(const int32_t *off, int E, int K, int M) { return gemm(off[E] - off[0], K, M); }
static int p_experts_matmul_forward(float *out, const float *x, const float *const *w, const int32_t *off, int E, int K,
                                    int M) {
    double t = begin();
    int rc = in->experts_matmul_forward(out, x, w, off, E, K, M);
    if (!rc) done(t, "experts_matmul_forward", expert_flops(off, E, K, M), "%d experts %dx%dx%d", E, off[E], K, M);
    return rc;
}
static int p_experts_matmul_backward(float *dx, float *const *dw, const float *dout, const float *x,
                                     const float *const *w, const int32_t *off, int E, int K, int M, int accumulate_dx) {
    double t = begin();
    int rc = in->experts_matmul_backward(dx, dw, dout, x, w, off, E, K, M, accumulate_dx);
    if (!rc)
        done(t, "experts_matmul_backward", expert_flops(off, E, K, M) * (!!dx + !!dw), "%s %d experts %dx%dx%d",
             grads(dx, (const float *)dw), E, off[E], K, M);
    return rc;
}

/* each op the inner table has, timed; what it lacks stays NULL */
#define WRAP(op) table.op = inner->op ? p_##op : NULL
const struct backend *backend_profiled(const struct backend *inner) {
    if (in == inner) return &table;
    if (in) die("backend_profiled: one table per process (%s already profiled)", in->name);
    in = inner;
    table = *inner; /* name, precision, sizes, alloc/free, device queries */
    probe = inner->alloc(16);
    WRAP(zero), WRAP(to_host), WRAP(from_host), WRAP(copy);
    WRAP(embedding_forward), WRAP(embedding_backward), WRAP(rmsnorm_forward), WRAP(rmsnorm_backward);
    WRAP(matmul_forward), WRAP(matmul_backward), WRAP(experts_matmul_forward), WRAP(experts_matmul_backward);
    WRAP(rope), WRAP(attention_forward), WRAP(attention_backward);
    WRAP(attention_decode), WRAP(copy_cols), WRAP(swiglu_forward), WRAP(swiglu_backward);
    WRAP(moe_route_forward), WRAP(moe_route_backward), WRAP(moe_route_sigmoid_forward);
    WRAP(moe_route_sigmoid_backward), WRAP(gather_rows), WRAP(moe_combine), WRAP(moe_combine_backward);
    WRAP(moe_route_counts), WRAP(moe_route_balance), WRAP(moe_dispatch), WRAP(moe_expert_order);
    WRAP(cross_entropy), WRAP(ce_row_max), WRAP(ce_row_sumexp), WRAP(ce_finish), WRAP(to_storage);
    WRAP(from_storage), WRAP(add), WRAP(scale), WRAP(sum), WRAP(sum_squares), WRAP(adamw);
    WRAP(fp8_matmul_forward), WRAP(fp8_matmul_backward);
    profile_reset();
    return &table;
}

/* ops first, most time first; then the parts, likewise */
static int by_time(const void *a, const void *b) {
    const struct row *p = a, *q = b;
    if (p->part != q->part) return p->part - q->part;
    return (p->seconds < q->seconds) - (p->seconds > q->seconds);
}

/* a row's TFLOP/s, or -1 for an op without a FLOP count */
static double row_tflops(const struct row *r) { return r->flops > 0 && r->seconds > 0 ? r->flops / r->seconds / 1e12 : -1; }

/* the rows most time first (the caller frees them), the wall and op seconds
 * per step; *steps at least 1 */
static struct row *sorted_rows(int *steps_io, double *wall, double *ops) {
    if (*steps_io < 1) *steps_io = 1;
    int steps = *steps_io;
    *wall = (now_seconds() - since - paused - (counting ? 0 : now_seconds() - paused_at)) / steps, *ops = 0;
    struct row *sorted = xmalloc(sizeof(struct row) * (nrows ? nrows : 1));
    memcpy(sorted, rows, sizeof(struct row) * nrows);
    qsort(sorted, nrows, sizeof *sorted, by_time);
    for (int i = 0; i < nrows; i++)
        if (!sorted[i].part) *ops += sorted[i].seconds / steps;
    return sorted;
}

char *profile_json(int steps) {
    double wall, ops;
    struct row *sorted = sorted_rows(&steps, &wall, &ops);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) die("profile: open_memstream failed");
    fprintf(f, "{\"event\":\"profile\",\"steps\":%d,\"step_ms\":%.4f,\"ops_ms\":%.4f,\"rows\":[", steps, wall * 1e3,
            ops * 1e3);
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &sorted[i];
        fprintf(f, "%s{\"op\":\"%s\",%s\"shape\":\"%s\",\"ms\":%.4f,\"calls\":%.2f,\"tflops\":", i ? "," : "",
                r->op, r->part ? "\"part\":true," : "", r->shape, r->seconds / steps * 1e3, (double)r->calls / steps);
        if (row_tflops(r) >= 0) fprintf(f, "%.2f}", row_tflops(r));
        else fprintf(f, "null}");
    }
    fprintf(f, "]}");
    if (fclose(f) != 0) die("profile: cannot write the profile event");
    free(sorted);
    return out;
}

void profile_report(FILE *f, int steps) {
    double wall, ops;
    struct row *sorted = sorted_rows(&steps, &wall, &ops);
    fprintf(f, "profile (%s %s, MTRAIN_PROFILE): %d step%s, %.2f ms a step; its ops %.2f ms (%.1f%%), each waited for; "
               "the rest is host work and communication\n",
            in ? in->name : "-", in ? precision_name(in->precision) : "-", steps, steps == 1 ? "" : "s", wall * 1e3,
            ops * 1e3, wall > 0 ? 100 * ops / wall : 0);
    fprintf(f, "%10s %7s %10s %9s  %-26s %s\n", "ms/step", "share", "calls/step", "TFLOP/s", "op", "shape");
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &sorted[i];
        if (r->part && (i == 0 || !sorted[i - 1].part))
            fprintf(f, "  parts of the ops above (in parentheses; inside their rows, not added to the total):\n");
        char rate[16] = "-";
        if (row_tflops(r) >= 0) snprintf(rate, sizeof rate, "%.1f", row_tflops(r));
        fprintf(f, "%10.3f %6.1f%% %10.1f %9s  %-26s %s\n", r->seconds / steps * 1e3,
                ops > 0 ? 100 * r->seconds / steps / ops : 0, (double)r->calls / steps, rate, r->op, r->shape);
    }
    free(sorted);
}
