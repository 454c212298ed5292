/* Every CUDA backend op against the CPU backend (itself checked against naive
 * loops and finite differences in test_kernels.c) on the same random data.
 * Shapes are chosen to cross the kernels' block sizes (C=520, T up to 300,
 * V=1500) and to cover GQA, MHA and MQA.
 * Tolerance: max relative error <= 2e-5 (floored at 10% of the reference's
 * RMS, as in test_kernels.c): both sides are fp32 and differ only in the
 * order of sums. Attention's gradients get 5e-5: the GPU recomputes the
 * probabilities as exp(s - lse) where the CPU kept exp(s - max) / sum, and
 * dk/dv add that rounding over every query row of a kv head's group
 * (measured worst 2.2e-5, MQA, T=300). Ops without atomics must also repeat
 * bitwise.
 * Without a GPU every case is skipped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "tests/unit/check.h"

static const struct backend *cpu, *gpu;
static unsigned long long seed = 7;
static const double TOL = 2e-5;

static float *frand(size_t n) { return test_rand_array(&seed, n); }
static float *fcopy(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * n);
    memcpy(y, x, sizeof(float) * n);
    return y;
}
/* device copy of host data */
static void *dev(const void *h, size_t bytes) {
    void *d = gpu->alloc(bytes);
    gpu->from_host(d, h, bytes);
    return d;
}
/* host copy of device data (caller frees) */
static float *host(const void *d, size_t n) {
    float *h = malloc(sizeof(float) * n);
    gpu->to_host(h, d, sizeof(float) * n);
    return h;
}

/* GPU result (device pointer) against the CPU result (host). */
static void compare_tol(const char *name, const float *d_got, const float *want, size_t n, double tol) {
    float *got = host(d_got, n);
    double *w = malloc(sizeof(double) * n), ss = 0;
    for (size_t i = 0; i < n; i++) w[i] = want[i], ss += w[i] * w[i];
    double e = max_rel_err(got, w, n, fmax(1e-2, 0.1 * sqrt(ss / (double)n)));
    TEST_RESULT(name, e <= tol, "max rel err %.3g > %.1g", e, tol);
    free(got);
    free(w);
}
static void compare(const char *name, const float *d_got, const float *want, size_t n) {
    compare_tol(name, d_got, want, n, TOL);
}

static void test_matmul(int N, int K, int M) {
    float *x = frand((size_t)N * K), *w = frand((size_t)M * K), *o = frand((size_t)N * M);
    float *dout = frand((size_t)N * M), *dx = frand((size_t)N * K), *dw = frand((size_t)M * K);
    float *dx_, *o_ = fcopy(o, (size_t)N * M);
    float *dX = dev(x, 4ul * N * K), *dW = dev(w, 4ul * M * K), *dO = dev(o, 4ul * N * M);
    float *dD = dev(dout, 4ul * N * M), *dDX = dev(dx, 4ul * N * K), *dDW = dev(dw, 4ul * M * K);
    cpu->matmul_forward(o_, x, w, N, K, M, 1);
    gpu->matmul_forward(dO, dX, dW, N, K, M, 1);
    compare("cuda_matmul_forward_accumulate", dO, o_, (size_t)N * M);
    cpu->matmul_forward(o_, x, w, N, K, M, 0);
    gpu->matmul_forward(dO, dX, dW, N, K, M, 0);
    compare("cuda_matmul_forward", dO, o_, (size_t)N * M);
    dx_ = fcopy(dx, (size_t)N * K);
    cpu->matmul_backward(dx_, dw, dout, x, w, N, K, M, 1);
    gpu->matmul_backward(dDX, dDW, dD, dX, dW, N, K, M, 1);
    compare("cuda_matmul_backward_dx", dDX, dx_, (size_t)N * K);
    compare("cuda_matmul_backward_dw", dDW, dw, (size_t)M * K);
    /* TF32 tensor cores: same op, looser rounding (10-bit mantissa inputs) */
    cuda_set_tf32(1);
    gpu->matmul_forward(dO, dX, dW, N, K, M, 0);
    cuda_set_tf32(0);
    float *t = host(dO, (size_t)N * M);
    double worst = 0;
    for (size_t i = 0; i < (size_t)N * M; i++) worst = fmax(worst, fabs(t[i] - o_[i]) / sqrt((double)K));
    TEST_RESULT("cuda_matmul_tf32", worst <= 2e-3, "max err / sqrt(K) %.3g > 2e-3", worst);
    free(t), free(x), free(w), free(o), free(o_), free(dout), free(dx), free(dx_), free(dw);
    gpu->free(dX), gpu->free(dW), gpu->free(dO), gpu->free(dD), gpu->free(dDX), gpu->free(dDW);
}

static void test_rmsnorm(int N, int C) {
    float *x = frand((size_t)N * C), *w = frand(C), *dout = frand((size_t)N * C), *dx = frand((size_t)N * C);
    float *dw = frand(C), *out = malloc(4ul * N * C), *rstd = malloc(4ul * N);
    float *dX = dev(x, 4ul * N * C), *dWt = dev(w, 4ul * C), *dD = dev(dout, 4ul * N * C), *dDX = dev(dx, 4ul * N * C);
    float *dDW = dev(dw, 4ul * C), *dOut = gpu->alloc(4ul * N * C), *dR = gpu->alloc(4ul * N);
    cpu->rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    gpu->rmsnorm_forward(dOut, dR, dX, dWt, N, C, 1e-5f);
    compare("cuda_rmsnorm_forward", dOut, out, (size_t)N * C);
    compare("cuda_rmsnorm_rstd", dR, rstd, N);
    cpu->rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C, 1);
    gpu->rmsnorm_backward(dDX, dDW, dD, dX, dWt, dR, N, C, 1);
    compare("cuda_rmsnorm_backward_dx", dDX, dx, (size_t)N * C);
    compare("cuda_rmsnorm_backward_dw", dDW, dw, C);
    /* dw sums rows in fixed chunks: two runs from the same start agree bitwise */
    float *dDW2 = dev(dw, 4ul * C), *dDW3 = dev(dw, 4ul * C);
    gpu->rmsnorm_backward(dDX, dDW2, dD, dX, dWt, dR, N, C, 0);
    gpu->rmsnorm_backward(dDX, dDW3, dD, dX, dWt, dR, N, C, 0);
    float *b = host(dDW2, C), *c = host(dDW3, C);
    TEST_RESULT("cuda_rmsnorm_backward_repeatable", !memcmp(b, c, 4ul * C), "dw differs between identical runs");
    free(b), free(c), free(x), free(w), free(dout), free(dx), free(dw), free(out), free(rstd);
    gpu->free(dX), gpu->free(dWt), gpu->free(dD), gpu->free(dDX), gpu->free(dDW), gpu->free(dDW2), gpu->free(dDW3), gpu->free(dOut);
    gpu->free(dR);
}

static void test_rope(int B, int T, int H, int D) {
    size_t n = (size_t)B * T * H * D, half = (size_t)T * D / 2;
    float *x = frand(n), *cs = frand(half), *sn = frand(half);
    float *dX = dev(x, 4 * n), *dC = dev(cs, 4 * half), *dS = dev(sn, 4 * half);
    cpu->rope(x, cs, sn, B, T, H, D, 0);
    gpu->rope(dX, dC, dS, B, T, H, D, 0);
    compare("cuda_rope", dX, x, n);
    cpu->rope(x, cs, sn, B, T, H, D, 1);
    gpu->rope(dX, dC, dS, B, T, H, D, 1);
    compare("cuda_rope_inverse", dX, x, n);
    free(x), free(cs), free(sn);
    gpu->free(dX), gpu->free(dC), gpu->free(dS);
}

/* With TF32 on (train.tf32) attention's GEMMs round their inputs to 10
 * mantissa bits, so elementwise errors on small outputs reach a few percent;
 * that check is norm-wise, ||gpu - cpu|| / ||cpu|| <= 2e-3 (measured on an
 * H100: 2.7e-4 to 4.0e-4 at head sizes 64 and 128; the value is printed on a
 * '#' line). */
static void compare_norm(const char *name, const float *d_got, const float *want, size_t n, double tol) {
    float *got = host(d_got, n);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d, den += (double)want[i] * want[i];
    }
    double e = sqrt(num / den);
    printf("# %s: norm-wise relative error %.3g\n", name, e);
    TEST_RESULT(name, e <= tol, "norm-wise relative error %.3g > %.1g", e, tol);
    free(got);
}

/* fp32: forward 2e-5, gradients 5e-5 (see the top); tf32: norm-wise 2e-3 */
static void test_attention(int B, int T, int H, int KVH, int D, int Dv, const char *tag, int tf32) {
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D, na = cpu->attention_state_floats(B, H, T);
    size_t no = (size_t)B * T * H * Dv, nv = (size_t)B * T * KVH * Dv;
    float *q = frand(nq), *k = frand(nk), *v = frand(nv), *dout = frand(no);
    float *out = malloc(4 * no), *att = malloc(4 * na), *dq = malloc(4 * nq), *dk = malloc(4 * nk), *dv = malloc(4 * nv);
    float *dQ = dev(q, 4 * nq), *dK = dev(k, 4 * nk), *dV = dev(v, 4 * nv), *dD = dev(dout, 4 * no);
    /* the GPU keeps each row's log-sum-exp, not the probabilities: backward checks it */
    float *dOut = gpu->alloc(4 * no), *dAtt = gpu->alloc(4 * gpu->attention_state_floats(B, H, T));
    float *gq = gpu->alloc(4 * nq), *gk = gpu->alloc(4 * nk), *gv = gpu->alloc(4 * nv);
    cpu->attention_forward(out, att, q, k, v, B, T, H, KVH, D, Dv);
    cpu->attention_backward(dq, dk, dv, dout, out, att, q, k, v, B, T, H, KVH, D, Dv);
    cuda_set_tf32(tf32);
    gpu->attention_forward(dOut, dAtt, dQ, dK, dV, B, T, H, KVH, D, Dv);
    gpu->attention_backward(gq, gk, gv, dD, dOut, dAtt, dQ, dK, dV, B, T, H, KVH, D, Dv);
    cuda_set_tf32(0);
    const float *got[] = {dOut, gq, gk, gv}, *want[] = {out, dq, dk, dv};
    const char *what[] = {"forward", "backward_dq", "backward_dk", "backward_dv"};
    size_t n[] = {no, nq, nk, nv};
    for (int c = 0; c < 4; c++) {
        char name[96];
        snprintf(name, sizeof name, "cuda_attention%s_%s_%s", tf32 ? "_tf32" : "", what[c], tag);
        if (tf32) compare_norm(name, got[c], want[c], n[c], 2e-3);
        else compare_tol(name, got[c], want[c], n[c], c == 0 ? TOL : 5e-5);
    }
    free(q), free(k), free(v), free(dout), free(out), free(att), free(dq), free(dk), free(dv);
    gpu->free(dQ), gpu->free(dK), gpu->free(dV), gpu->free(dD), gpu->free(dOut), gpu->free(dAtt);
    gpu->free(gq), gpu->free(gk), gpu->free(gv);
}

/* KV-cache attention: the GPU op against the CPU op (n queries at the end of Tk). */
/* copy_cols: the same block of columns copied, then accumulated, on both backends */
/* context parallelism's block ops (kernels/cuda/attention_block.cuh): rank r's ring of cp blocks,
 * merged forward, then each block's backward (dq accumulated, dk dv per block), against the CPU's */
static void test_attention_block(int cp, int r, int B, int c, int H, int KVH, int D, int Dv, const char *tag) {
    size_t T = 2 * (size_t)c, nq = B * T * H * D, nk = B * T * KVH * D, nv = B * T * KVH * Dv, no = B * T * H * Dv;
    size_t nl = (size_t)B * H * T;
    float *q = frand(nq), *dout = frand(no), *o = calloc(no, sizeof(float)), *lse = calloc(nl, sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *dk = malloc(sizeof(float) * nk), *dv = malloc(sizeof(float) * nv);
    float *q_ = dev(q, sizeof(float) * nq), *dout_ = dev(dout, sizeof(float) * no), *o_ = dev(o, sizeof(float) * no);
    float *lse_ = dev(lse, sizeof(float) * nl), *dq_ = dev(dq, sizeof(float) * nq);
    float *dk_ = gpu->alloc(sizeof(float) * nk), *dv_ = gpu->alloc(sizeof(float) * nv);
    float **k = malloc(sizeof(float *) * cp), **v = malloc(sizeof(float *) * cp);
    for (int s = 0; s < cp; s++) k[s] = frand(nk), v[s] = frand(nv);
    int q0 = r, q1 = 2 * cp - 1 - r;
    char name[128];
    for (int step = 0; step < cp; step++) {
        int s = (r - step + cp) % cp;
        float *k_ = dev(k[s], sizeof(float) * nk), *v_ = dev(v[s], sizeof(float) * nv);
        cpu->attention_block_forward(o, lse, q, k[s], v[s], B, c, H, KVH, D, Dv, q0, q1, s, 2 * cp - 1 - s, step == 0);
        gpu->attention_block_forward(o_, lse_, q_, k_, v_, B, c, H, KVH, D, Dv, q0, q1, s, 2 * cp - 1 - s, step == 0);
        gpu->free(k_), gpu->free(v_);
    }
    snprintf(name, sizeof name, "cuda_attention_block_forward_%s", tag);
    compare(name, o_, o, no);
    snprintf(name, sizeof name, "cuda_attention_block_lse_%s", tag);
    compare(name, lse_, lse, nl);
    gpu->from_host(o_, o, sizeof(float) * no), gpu->from_host(lse_, lse, sizeof(float) * nl); /* the same final state */
    for (int step = 0; step < cp; step++) {
        int s = (r - step + cp) % cp;
        float *k_ = dev(k[s], sizeof(float) * nk), *v_ = dev(v[s], sizeof(float) * nv);
        memset(dk, 0, sizeof(float) * nk), memset(dv, 0, sizeof(float) * nv);
        gpu->zero(dk_, sizeof(float) * nk), gpu->zero(dv_, sizeof(float) * nv);
        cpu->attention_block_backward(dq, dk, dv, dout, o, lse, q, k[s], v[s], B, c, H, KVH, D, Dv, q0, q1, s,
                                      2 * cp - 1 - s);
        gpu->attention_block_backward(dq_, dk_, dv_, dout_, o_, lse_, q_, k_, v_, B, c, H, KVH, D, Dv, q0, q1, s,
                                      2 * cp - 1 - s);
        snprintf(name, sizeof name, "cuda_attention_block_dk_%s_step%d", tag, step);
        compare_tol(name, dk_, dk, nk, 5e-5);
        snprintf(name, sizeof name, "cuda_attention_block_dv_%s_step%d", tag, step);
        compare_tol(name, dv_, dv, nv, 5e-5);
        gpu->free(k_), gpu->free(v_);
    }
    snprintf(name, sizeof name, "cuda_attention_block_dq_%s", tag);
    compare_tol(name, dq_, dq, nq, 5e-5);
    for (int s = 0; s < cp; s++) free(k[s]), free(v[s]);
    free(k), free(v), free(q), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    gpu->free(q_), gpu->free(dout_), gpu->free(o_), gpu->free(lse_), gpu->free(dq_), gpu->free(dk_), gpu->free(dv_);
}

static void test_copy_cols(int rows, int ld, int cols) {
    size_t n = (size_t)rows * ld;
    float *src = frand(n), *dst = frand(n), *want = malloc(4 * n);
    float *dS = dev(src, 4 * n), *dDst = dev(dst, 4 * n);
    memcpy(want, dst, 4 * n);
    cpu->copy_cols(want + 3, ld, src + 1, ld, rows, cols, 0);
    cpu->copy_cols(want + 3, ld, src + 1, ld, rows, cols, 1);
    gpu->copy_cols(dDst + 3, ld, dS + 1, ld, rows, cols, 0);
    gpu->copy_cols(dDst + 3, ld, dS + 1, ld, rows, cols, 1);
    compare_tol("cuda_copy_cols", dDst, want, n, 0);
    free(src), free(dst), free(want);
    gpu->free(dS), gpu->free(dDst);
}

static void test_attention_decode(int n, int Tk, int H, int KVH, int D, int Dv, const char *name) {
    size_t nq = (size_t)n * H * D, nk = (size_t)Tk * KVH * D, nv = (size_t)Tk * KVH * Dv, no = (size_t)n * H * Dv;
    float *q = frand(nq), *k = frand(nk), *v = frand(nv), *out = malloc(sizeof(float) * no);
    float *dQ = dev(q, 4 * nq), *dK = dev(k, 4 * nk), *dV = dev(v, 4 * nv), *dOut = gpu->alloc(4 * no);
    cpu->attention_decode(out, q, k, v, n, Tk, H, KVH, D, Dv);
    gpu->attention_decode(dOut, dQ, dK, dV, n, Tk, H, KVH, D, Dv);
    compare(name, dOut, out, no);
    gpu->free(dQ), gpu->free(dK), gpu->free(dV), gpu->free(dOut);
    free(q), free(k), free(v), free(out);
}

static void test_swiglu(size_t n) {
    float *g = frand(n), *u = frand(n), *d = frand(n), *o = malloc(4 * n), *dg = malloc(4 * n), *du = malloc(4 * n);
    for (size_t i = 0; i < n; i++) g[i] *= 6; /* reach the saturated ends of the sigmoid */
    float *dG = dev(g, 4 * n), *dU = dev(u, 4 * n), *dD = dev(d, 4 * n);
    float *dO = gpu->alloc(4 * n), *dDG = gpu->alloc(4 * n), *dDU = gpu->alloc(4 * n);
    cpu->swiglu_forward(o, g, u, n);
    gpu->swiglu_forward(dO, dG, dU, n);
    compare("cuda_swiglu_forward", dO, o, n);
    cpu->swiglu_backward(dg, du, d, g, u, n);
    gpu->swiglu_backward(dDG, dDU, dD, dG, dU, n);
    compare("cuda_swiglu_backward_dgate", dDG, dg, n);
    compare("cuda_swiglu_backward_dup", dDU, du, n);
    free(g), free(u), free(d), free(o), free(dg), free(du);
    gpu->free(dG), gpu->free(dU), gpu->free(dD), gpu->free(dO), gpu->free(dDG), gpu->free(dDU);
}

static int32_t *targets_for(int N, int lo, int hi) {
    int32_t *t = malloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) t[n] = n % 17 == 5 ? -1 : lo + (int)((test_rand(&seed) + 1) * 0.5 * (hi - lo - 1));
    return t;
}

static void test_cross_entropy(int N, int V) {
    float *logits = frand((size_t)N * V), *loss = malloc(4ul * N);
    for (size_t i = 0; i < (size_t)N * V; i++) logits[i] *= 8;
    int32_t *t = targets_for(N, 0, V);
    float *dL = dev(logits, 4ul * N * V), *dLoss = gpu->alloc(4ul * N);
    int32_t *dT = dev(t, sizeof(int32_t) * N);
    cpu->cross_entropy(loss, logits, t, N, V, 0.25f);
    gpu->cross_entropy(dLoss, dL, dT, N, V, 0.25f);
    compare("cuda_cross_entropy_loss", dLoss, loss, N);
    compare("cuda_cross_entropy_grad", dL, logits, (size_t)N * V);
    free(logits), free(loss), free(t);
    gpu->free(dL), gpu->free(dLoss), gpu->free(dT);
}

/* one rank's slice [vstart, vstart+V) of a 3V vocabulary */
static void test_vocab_parallel_ce(int N, int V) {
    int vstart = V;
    float *logits = frand((size_t)N * V), *mx = malloc(4ul * N), *se = malloc(4ul * N), *tl = malloc(4ul * N);
    float *loss = malloc(4ul * N);
    int32_t *t = targets_for(N, 0, 3 * V);
    float *dL = dev(logits, 4ul * N * V), *dM = gpu->alloc(4ul * N), *dS = gpu->alloc(4ul * N);
    float *dTl = gpu->alloc(4ul * N), *dLoss = gpu->alloc(4ul * N);
    int32_t *dT = dev(t, sizeof(int32_t) * N);
    cpu->ce_row_max(mx, logits, N, V);
    gpu->ce_row_max(dM, dL, N, V);
    compare("cuda_ce_row_max", dM, mx, N);
    cpu->ce_row_sumexp(se, tl, logits, t, mx, N, V, vstart);
    gpu->ce_row_sumexp(dS, dTl, dL, dT, dM, N, V, vstart);
    compare("cuda_ce_row_sumexp", dS, se, N);
    compare("cuda_ce_target_logit", dTl, tl, N);
    cpu->ce_finish(loss, logits, t, mx, se, tl, N, V, vstart, 0.5f);
    gpu->ce_finish(dLoss, dL, dT, dM, dS, dTl, N, V, vstart, 0.5f);
    compare("cuda_ce_finish_loss", dLoss, loss, N);
    compare("cuda_ce_finish_grad", dL, logits, (size_t)N * V);
    free(logits), free(mx), free(se), free(tl), free(loss), free(t);
    gpu->free(dL), gpu->free(dM), gpu->free(dS), gpu->free(dTl), gpu->free(dLoss), gpu->free(dT);
}

static void test_embedding(int N, int C, int V, const char *tag) {
    char name[96];
    int vstart = 10; /* tokens below 10 and at/after 10+V fall outside this slice */
    float *table = frand((size_t)V * C), *dout = frand((size_t)N * C), *dtable = frand((size_t)V * C);
    float *out = malloc(4ul * N * C);
    int32_t *tok = targets_for(N, 0, V + 20);
    for (int n = 0; n < N; n++) tok[n] = tok[n] < 0 ? 12 : tok[n]; /* repeats, so rows sum several tokens */
    float *dTab = dev(table, 4ul * V * C), *dD = dev(dout, 4ul * N * C), *dDT = dev(dtable, 4ul * V * C);
    float *dOut = gpu->alloc(4ul * N * C);
    int32_t *dTok = dev(tok, sizeof(int32_t) * N);
    cpu->embedding_forward(out, tok, table, N, C, vstart, V);
    gpu->embedding_forward(dOut, dTok, dTab, N, C, vstart, V);
    snprintf(name, sizeof name, "cuda_embedding_forward_%s", tag);
    compare(name, dOut, out, (size_t)N * C);
    cpu->embedding_backward(dtable, tok, dout, N, C, vstart, V);
    gpu->embedding_backward(dDT, dTok, dD, N, C, vstart, V);
    /* same order of additions as the CPU: bitwise equal */
    float *got = host(dDT, (size_t)V * C);
    snprintf(name, sizeof name, "cuda_embedding_backward_%s", tag);
    TEST_RESULT(name, !memcmp(got, dtable, 4ul * V * C), "differs from the CPU");
    free(got), free(table), free(dout), free(dtable), free(out), free(tok);
    gpu->free(dTab), gpu->free(dD), gpu->free(dDT), gpu->free(dOut), gpu->free(dTok);
}

static void test_vectors(size_t n) {
    float *a = frand(n), *b = frand(n);
    float *dA = dev(a, 4 * n), *dB = dev(b, 4 * n);
    cpu->add(a, b, n);
    gpu->add(dA, dB, n);
    compare("cuda_add", dA, a, n);
    cpu->scale(a, -0.37f, n);
    gpu->scale(dA, -0.37f, n);
    compare("cuda_scale", dA, a, n);
    double s = cpu->sum(a, n), gs = gpu->sum(dA, n), ss = cpu->sum_squares(a, n), gss = gpu->sum_squares(dA, n);
    TEST_RESULT("cuda_sum", fabs(gs - s) <= 1e-9 * (double)n, "%.17g vs %.17g", gs, s);
    TEST_RESULT("cuda_sum_squares", fabs(gss - ss) <= 1e-12 * ss, "%.17g vs %.17g", gss, ss);
    TEST_RESULT("cuda_sum_repeatable", gpu->sum_squares(dA, n) == gss && gpu->sum(dA, n) == gs, "differs");
    free(a), free(b);
    gpu->free(dA), gpu->free(dB);
}

static void test_adamw(size_t n) {
    float *p = frand(n), *g = frand(n), *m = calloc(n, 4), *v = calloc(n, 4);
    float *dP = dev(p, 4 * n), *dG = dev(g, 4 * n), *dM = gpu->alloc(4 * n), *dV = gpu->alloc(4 * n);
    for (int step = 1; step <= 3; step++) {
        cpu->adamw(p, g, m, v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step, NULL);
        gpu->adamw(dP, dG, dM, dV, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step, NULL);
    }
    compare("cuda_adamw_param", dP, p, n);
    compare("cuda_adamw_m", dM, m, n);
    compare("cuda_adamw_v", dV, v, n);
    free(p), free(g), free(m), free(v);
    gpu->free(dP), gpu->free(dG), gpu->free(dM), gpu->free(dV);
}

/* MoE routing and permutation ops: n tokens, E experts, top k, C channels
 * (n*C crosses the grid-stride loops, C the dot product's block). */
static void test_moe(int n, int E, int k, int C) {
    float *x = frand((size_t)n * E);
    for (size_t i = 0; i < (size_t)n * E; i++) x[i] *= 3;
    float *probs = malloc(4ul * n * E), *lse = malloc(4ul * n), *w = malloc(4ul * n * k);
    int32_t *idx = malloc(4ul * n * k);
    cpu->moe_route_forward(probs, lse, idx, w, x, n, E, k);
    float *dX = dev(x, 4ul * n * E), *dP = gpu->alloc(4ul * n * E), *dL = gpu->alloc(4ul * n), *dW = gpu->alloc(4ul * n * k);
    int32_t *dI = gpu->alloc(4ul * n * k);
    gpu->moe_route_forward(dP, dL, dI, dW, dX, n, E, k);
    compare("cuda_moe_route_probs", dP, probs, (size_t)n * E);
    compare("cuda_moe_route_lse", dL, lse, n);
    compare("cuda_moe_route_weights", dW, w, (size_t)n * k);
    int32_t *gi = malloc(4ul * n * k);
    gpu->to_host(gi, dI, 4ul * n * k);
    TEST_RESULT("cuda_moe_route_experts", !memcmp(gi, idx, 4ul * n * k), "top-k choices differ from the CPU's");
    float *R = frand((size_t)n * k), *A = frand((size_t)n * E), *dl = malloc(4ul * n * E);
    cpu->moe_route_backward(dl, R, probs, lse, idx, w, A, 0.3f, n, E, k, 2, 1); /* sequences of 2 tokens from row 1 */
    float *dR = dev(R, 4ul * n * k), *dA = dev(A, 4ul * n * E), *dDL = gpu->alloc(4ul * n * E);
    gpu->moe_route_backward(dDL, dR, dP, dL, dI, dW, dA, 0.3f, n, E, k, 2, 1); /* sequences of 2 tokens from row 1 */
    compare("cuda_moe_route_backward", dDL, dl, (size_t)n * E);
    /* DeepSeek-V3 sigmoid routing: 8 groups, best 4, a bias that reorders choices */
    int G = E >= 16 ? 8 : 4; /* groups of at least 2 experts (validated) */
    float *bias = frand(E), *ss = malloc(4ul * n * E), *sw = malloc(4ul * n * k), *sdl = malloc(4ul * n * E);
    int32_t *sidx = malloc(4ul * n * k), *sgi = malloc(4ul * n * k);
    for (int e = 0; e < E; e++) bias[e] *= 0.3f;
    cpu->moe_route_sigmoid_forward(ss, sidx, sw, x, bias, n, E, k, G, G / 2, 2.5f);
    float *dB = dev(bias, 4ul * E), *dS = gpu->alloc(4ul * n * E), *dSW = gpu->alloc(4ul * n * k);
    int32_t *dSI = gpu->alloc(4ul * n * k);
    gpu->moe_route_sigmoid_forward(dS, dSI, dSW, dX, dB, n, E, k, G, G / 2, 2.5f);
    compare("cuda_moe_route_sigmoid_scores", dS, ss, (size_t)n * E);
    compare("cuda_moe_route_sigmoid_weights", dSW, sw, (size_t)n * k);
    gpu->to_host(sgi, dSI, 4ul * n * k);
    TEST_RESULT("cuda_moe_route_sigmoid_experts", !memcmp(sgi, sidx, 4ul * n * k), "choices differ from the CPU's");
    cpu->moe_route_sigmoid_backward(sdl, R, ss, sidx, sw, A, n, E, k, 2.5f, 2, 1);
    gpu->moe_route_sigmoid_backward(dDL, dR, dS, dSI, dSW, dA, n, E, k, 2.5f, 2, 1);
    compare("cuda_moe_route_sigmoid_backward", dDL, sdl, (size_t)n * E);
    free(bias), free(ss), free(sw), free(sdl), free(sidx), free(sgi);
    gpu->free(dB), gpu->free(dS), gpu->free(dSW), gpu->free(dSI);
    /* a permutation with every 5th selection dropped */
    int32_t *pos = malloc(4ul * n * k), *src = malloc(4ul * n * k);
    int rows = 0;
    for (int i = 0; i < n * k; i++) pos[i] = i % 5 == 4 ? -1 : rows++;
    for (int i = 0; i < n * k; i++)
        if (pos[i] >= 0) pos[i] = (int)(((long)pos[i] * 7919) % rows); /* scattered, still a bijection if gcd = 1 */
    for (int i = 0; i < n * k; i++)
        if (pos[i] >= 0) src[pos[i]] = i / k;
    float *xt = frand((size_t)n * C), *xp = malloc(4ul * rows * C), *y = frand((size_t)rows * C);
    float *dXT = dev(xt, 4ul * n * C), *dXP = gpu->alloc(4ul * rows * C), *dY = dev(y, 4ul * rows * C);
    int32_t *dSrc = dev(src, 4ul * rows), *dPos = dev(pos, 4ul * n * k);
    cpu->gather_rows(xp, xt, src, rows, C);
    gpu->gather_rows(dXP, dXT, dSrc, rows, C);
    compare("cuda_gather_rows", dXP, xp, (size_t)rows * C);
    float *out = frand((size_t)n * C), *dOut = dev(out, 4ul * n * C);
    cpu->moe_combine(out, y, pos, w, n, k, C, 1);
    gpu->moe_combine(dOut, dY, dPos, dW, n, k, C, 1);
    compare("cuda_moe_combine", dOut, out, (size_t)n * C);
    cpu->moe_combine(out, y, pos, NULL, n, k, C, 0);
    gpu->moe_combine(dOut, dY, dPos, NULL, n, k, C, 0);
    compare("cuda_moe_combine_unweighted", dOut, out, (size_t)n * C);
    float *g = frand((size_t)n * C), *dy = calloc((size_t)rows * C, 4), *dw = malloc(4ul * n * k);
    float *dG = dev(g, 4ul * n * C), *dDY = gpu->alloc(4ul * rows * C), *dDW = gpu->alloc(4ul * n * k);
    cpu->moe_combine_backward(dy, dw, g, y, pos, w, n, k, C);
    gpu->moe_combine_backward(dDY, dDW, dG, dY, dPos, dW, n, k, C);
    compare("cuda_moe_combine_backward_dy", dDY, dy, (size_t)rows * C);
    compare("cuda_moe_combine_backward_dw", dDW, dw, (size_t)n * k);
    free(x), free(probs), free(lse), free(w), free(idx), free(gi), free(R), free(A), free(dl), free(pos), free(src);
    free(xt), free(xp), free(y), free(out), free(g), free(dy), free(dw);
    gpu->free(dX), gpu->free(dP), gpu->free(dL), gpu->free(dW), gpu->free(dI), gpu->free(dR), gpu->free(dA);
    gpu->free(dDL), gpu->free(dXT), gpu->free(dXP), gpu->free(dY), gpu->free(dSrc), gpu->free(dPos), gpu->free(dOut);
    gpu->free(dG), gpu->free(dDY), gpu->free(dDW);
}

/* The routing decisions (kernels/cuda/moe_plan.cuh) against the CPU ops on
 * the same choices: counts, coefficients, kept rows, send order, per-expert
 * counts and the received order bitwise, the statistics within 1e-12; over
 * 3 TP ranks with a capacity (sequences split between ranks) and without. */
static void test_moe_plan(int n, int k, int E, int T, int tp, int sigmoid, double cap_factor, const char *tag) {
    int B = tp * n / T, nk = n * k, BE = B * E;
    long cap = cap_factor > 0 ? (long)ceil(cap_factor * T * k / E) : -1;
    int32_t *idx = malloc(sizeof(int32_t) * tp * nk);
    for (int t = 0; t < tp * n; t++)
        for (int j = 0; j < k; j++) { /* skewed distinct choices */
            int e;
            do {
                double u = (test_rand(&seed) + 1) / 2;
                e = (int)(u * u * E) % E;
                for (int m = 0; m < j; m++) e = idx[t * k + m] == e ? -1 : e;
            } while (e < 0);
            idx[t * k + j] = e;
        }
    float *probs = frand((size_t)tp * n * E), *lse = frand((size_t)tp * n);
    for (size_t i = 0; i < (size_t)tp * n * E; i++) probs[i] = fabsf(probs[i]) + 0.05f;
    float *all = malloc(sizeof(float) * tp * BE), *d_all = gpu->alloc(sizeof(float) * tp * BE);
    int32_t *d_idx = gpu->alloc(sizeof(int32_t) * nk);
    int ok = 1;
    for (int r = 0; r < tp; r++) {
        cpu->moe_route_counts(all + (size_t)r * BE, idx + (size_t)r * nk, n, k, E, T, r * n, B);
        gpu->from_host(d_idx, idx + (size_t)r * nk, sizeof(int32_t) * nk);
        gpu->moe_route_counts(d_all + (size_t)r * BE, d_idx, n, k, E, T, r * n, B);
    }
    float *g_all = host(d_all, (size_t)tp * BE);
    ok &= !memcmp(g_all, all, sizeof(float) * tp * BE);
    for (int r = 0; r < tp; r++) {
        float *coef = malloc(sizeof(float) * BE), *ec = malloc(sizeof(float) * E), *d_coef = gpu->alloc(sizeof(float) * BE);
        float *d_ec = gpu->alloc(sizeof(float) * E), *d_probs = dev(probs + (size_t)r * n * E, sizeof(float) * n * E);
        float *d_lse = dev(lse + (size_t)r * n, sizeof(float) * n);
        double *met = calloc(E + 3, sizeof(double)), *gmet = malloc(sizeof(double) * (E + 3));
        double *d_met = gpu->alloc(sizeof(double) * (E + 3));
        int32_t *pos = malloc(sizeof(int32_t) * nk), *rows = malloc(sizeof(int32_t) * nk), *gpos = malloc(sizeof(int32_t) * nk);
        int32_t *grows = malloc(sizeof(int32_t) * nk), *d_pos = gpu->alloc(sizeof(int32_t) * nk);
        int32_t *d_rows = gpu->alloc(sizeof(int32_t) * nk);
        gpu->from_host(d_idx, idx + (size_t)r * nk, sizeof(int32_t) * nk);
        cpu->moe_route_balance(coef, met, all, probs + (size_t)r * n * E, lse + (size_t)r * n, n, E, k, T, r * n, B, tp, r,
                               sigmoid, 0.3f, cap);
        gpu->moe_route_balance(d_coef, d_met, d_all, d_probs, d_lse, n, E, k, T, r * n, B, tp, r, sigmoid, 0.3f, cap);
        cpu->moe_dispatch(pos, rows, ec, idx + (size_t)r * nk, all, n, k, E, T, r * n, B, r, cap);
        gpu->moe_dispatch(d_pos, d_rows, d_ec, d_idx, d_all, n, k, E, T, r * n, B, r, cap);
        float *gcoef = host(d_coef, BE), *gec = host(d_ec, E);
        gpu->to_host(gmet, d_met, sizeof(double) * (E + 3));
        gpu->to_host(gpos, d_pos, sizeof(int32_t) * nk);
        gpu->to_host(grows, d_rows, sizeof(int32_t) * nk);
        ok &= !memcmp(gcoef, coef, sizeof(float) * BE) && !memcmp(gec, ec, sizeof(float) * E);
        ok &= !memcmp(gpos, pos, sizeof(int32_t) * nk) && !memcmp(grows, rows, sizeof(int32_t) * nk);
        for (int i = 0; i < E + 3; i++) ok &= fabs(gmet[i] - met[i]) <= 1e-12 * fmax(fabs(met[i]), 1e-30);
        free(coef), free(ec), free(pos), free(rows), free(gpos), free(grows), free(gcoef), free(gec), free(met), free(gmet);
        gpu->free(d_coef), gpu->free(d_ec), gpu->free(d_probs), gpu->free(d_lse), gpu->free(d_met);
        gpu->free(d_pos), gpu->free(d_rows);
    }
    /* the received order, 4 sources of E/4 local experts */
    int El = E / 4, total = 0;
    float *in = malloc(sizeof(float) * E);
    for (int i = 0; i < E; i++) total += (int)(in[i] = (float)(int)((test_rand(&seed) + 1) * 3));
    int32_t *o = malloc(sizeof(int32_t) * (total + 1)), *iv = malloc(sizeof(int32_t) * (total + 1));
    int32_t *off = malloc(sizeof(int32_t) * (El + 1)), *go = malloc(sizeof(int32_t) * (total + 1));
    int32_t *giv = malloc(sizeof(int32_t) * (total + 1)), *goff = malloc(sizeof(int32_t) * (El + 1));
    int32_t *d_o = gpu->alloc(sizeof(int32_t) * (total + 1)), *d_iv = gpu->alloc(sizeof(int32_t) * (total + 1));
    int32_t *d_off = gpu->alloc(sizeof(int32_t) * (El + 1));
    float *d_in = dev(in, sizeof(float) * E);
    cpu->moe_expert_order(o, iv, off, in, 4, El, total);
    gpu->moe_expert_order(d_o, d_iv, d_off, d_in, 4, El, total);
    gpu->to_host(go, d_o, sizeof(int32_t) * total);
    gpu->to_host(giv, d_iv, sizeof(int32_t) * total);
    gpu->to_host(goff, d_off, sizeof(int32_t) * (El + 1));
    ok &= !memcmp(go, o, sizeof(int32_t) * total) && !memcmp(giv, iv, sizeof(int32_t) * total) &&
          !memcmp(goff, off, sizeof(int32_t) * (El + 1));
    char name[96];
    snprintf(name, sizeof name, "cuda_moe_plan_%s", tag);
    TEST_RESULT(name, ok, "a routing decision differs from the CPU op's");
    free(idx), free(probs), free(lse), free(all), free(g_all), free(in), free(o), free(iv), free(off), free(go);
    free(giv), free(goff);
    gpu->free(d_all), gpu->free(d_idx), gpu->free(d_o), gpu->free(d_iv), gpu->free(d_off), gpu->free(d_in);
}

static void test_memory(void) {
    size_t n = 1000;
    float *a = frand(n), *b = malloc(4 * n), *z = calloc(n, 4);
    float *dA = gpu->alloc(4 * n), *dB = gpu->alloc(4 * n);
    float *fresh = host(dA, n);
    TEST_RESULT("cuda_alloc_zeroed", !memcmp(fresh, z, 4 * n), "alloc is not zero-initialised");
    gpu->from_host(dA, a, 4 * n);
    gpu->copy(dB, dA, 4 * n);
    gpu->to_host(b, dB, 4 * n);
    TEST_RESULT("cuda_copy_round_trip", !memcmp(a, b, 4 * n), "host -> device -> device -> host changed data");
    gpu->zero(dB, 4 * n);
    gpu->to_host(b, dB, 4 * n);
    TEST_RESULT("cuda_zero", !memcmp(b, z, 4 * n), "zero left data");
    free(a), free(b), free(z), free(fresh);
    gpu->free(dA), gpu->free(dB);
}

int main(void) {
    cpu = backend_get("cpu", "fp32");
    if (!cuda_backend_available()) {
        printf("SKIP cuda_ops: no CUDA device (this build %s the CUDA backend)\n",
               cuda_backend.alloc ? "has" : "lacks");
        return 0;
    }
    /* a 1 MiB budget for attention's score blocks: T=300 runs in chunks of
     * one kv group, T=67 fits every group in one chunk; both paths run */
    setenv("MTRAIN_ATTN_CHUNK_MB", "1", 1);
    gpu = backend_get("cuda", "fp32");
    test_memory();
    test_matmul(300, 520, 130);
    test_rmsnorm(300, 520);
    test_rope(2, 67, 6, 16);
    test_attention(2, 67, 6, 2, 16, 16, "gqa", 0);
    test_attention(2, 67, 6, 6, 16, 16, "mha", 0);
    test_attention(1, 300, 4, 1, 32, 32, "mqa_t300", 0);
    test_attention(2, 300, 6, 2, 16, 16, "gqa_t300_four_chunks", 0);
    test_attention(2, 300, 6, 2, 64, 64, "gqa_d64_t300", 1);
    test_attention(1, 130, 4, 4, 128, 128, "mha_d128_t130", 1);
    test_attention(2, 67, 4, 1, 16, 16, "mqa_d16_t67", 1);
    test_attention(2, 67, 4, 4, 24, 16, "mla_value_dim", 0); /* MLA: qk head 192, v head 128, here 24 / 16 */
    test_attention_block(2, 0, 2, 67, 6, 2, 64, 64, "cp2_rank0_gqa_d64");
    test_attention_block(4, 2, 1, 40, 4, 4, 192, 128, "cp4_rank2_mla_192_128");
    test_copy_cols(37, 29, 13);
    test_attention_decode(1, 300, 8, 2, 64, 64, "cuda_attention_decode_one_query");
    test_attention_decode(37, 37, 4, 1, 128, 128, "cuda_attention_decode_prefill_d128");
    test_attention_decode(5, 2000, 6, 6, 16, 16, "cuda_attention_decode_chunk_t2000");
    test_attention_decode(3, 70, 4, 4, 192, 128, "cuda_attention_decode_mla_192_128");
    test_swiglu(100003);
    test_cross_entropy(77, 1500);
    test_vocab_parallel_ce(77, 1500);
    test_embedding(300, 520, 97, "one_chunk");
    test_embedding(2500, 64, 50, "three_chunks"); /* rows repeat across the sort's 1024-token chunks */
    test_vectors(1000003);
    test_adamw(100003);
    test_moe(1000, 8, 2, 520);
    test_moe(77, 64, 6, 96);
    test_moe_plan(2048, 8, 256, 2048, 1, 1, 0, "deepseek_shape");
    test_moe_plan(40, 3, 16, 24, 3, 0, 1.25, "tp3_capacity");
    test_moe_plan(600, 2, 8, 300, 2, 0, 1.0, "softmax_chunks_capacity");
    TEST_EXIT();
}
