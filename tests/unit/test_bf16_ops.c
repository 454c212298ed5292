/* The bf16 CPU table (kernels/cpu/bf16.c) against the fp32 ops, and the
 * rounding (kernels/bf16.h) against a naive nearest-value search.
 *
 * For every op: the fp32 op runs on fp32 random inputs, the bf16 op on the
 * same inputs rounded to bf16 (what bf16 storage holds), and
 *  - what the bf16 op stores as activations is within 1e-2 of the fp32
 *    result norm-wise (||got - want|| / ||want||; bf16 keeps 8 significant
 *    bits, a relative rounding of at most 2^-9 per stored value, so 1e-2
 *    leaves room for the input rounding that flows through the op) and
 *    every such value is exactly representable in bf16;
 *  - what stays fp32 (parameter gradients accumulated onto existing fp32
 *    values, statistics) is bitwise what the fp32 op computes from the same
 *    rounded inputs: nothing rounds it. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "tests/unit/check.h"

static const struct backend *f32, *b16;
static unsigned long long seed = 11;
static const double TOL = 1e-2;

static float *rnd(size_t n) { return test_rand_array(&seed, n); }
static float *copy_of(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}
/* a copy rounded to bf16 (what a bf16 buffer holds) */
static float *r16(const float *x, size_t n) {
    float *y = copy_of(x, n);
    for (size_t i = 0; i < n; i++) y[i] = bf16_round(y[i]);
    return y;
}

/* within TOL of the fp32 result norm-wise, and (stored) every value a bf16 one */
static void check_normwise(const char *name, const float *got, const float *want, size_t n, int stored) {
    double num = 0, den = 0;
    size_t off = n;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]), den += (double)want[i] * want[i];
        if (stored && off == n && got[i] != bf16_round(got[i])) off = i;
    }
    double e = sqrt(num / (den > 0 ? den : 1));
    if (off < n) TEST_FAIL(name, "element %zu = %.9g is not a bf16 value", off, got[off]);
    else TEST_RESULT(name, e <= TOL, "norm-wise relative error %.3g > %.0e", e, TOL);
}
static void check_act(const char *name, const float *got, const float *want, size_t n) {
    check_normwise(name, got, want, n, 1);
}
static void check_close(const char *name, const float *got, const float *want, size_t n) {
    check_normwise(name, got, want, n, 0);
}

static void check_exact(const char *name, const float *got, const float *want, size_t n) {
    TEST_RESULT(name, !memcmp(got, want, sizeof(float) * n), "not bitwise the fp32 op's result on the same inputs");
}

/* ---- rounding ---- */

/* The nearest bf16 value by search: the two bf16 neighbours of x (its
 * truncation and the next value away from zero), the closer one, ties to
 * the even bit pattern. */
static uint16_t naive_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x)) return 0x7fc0;
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if (isinf(x) || (u & 0xffff) == 0) return lo;
    double dlo = fabs((double)x - bf16_to_float(lo));
    /* past the largest finite bf16 the next value is infinity, at the distance of 2^128 */
    double vhi = (hi & 0x7fff) == 0x7f80 ? ldexp(x < 0 ? -1.0 : 1.0, 128) : bf16_to_float(hi);
    double dhi = fabs(vhi - x);
    if (dlo != dhi) return dlo < dhi ? lo : hi;
    return (lo & 1) ? hi : lo;
}

static void test_rounding(void) {
    static const uint32_t edges[] = {
        0x00000000, 0x80000000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, /* ties, both parities */
        0x7f7fffff, 0x7f7f7fff, 0x7f7f8000, 0xff7f8000, 0x7f800000, 0xff800000,              /* overflow, infinities */
        0x00000001, 0x00008000, 0x00018000, 0x007fffff, 0x00800000,                          /* subnormals */
        0x7fc00000, 0x7f800001, 0xffffffff, 0x7fa00000,                                      /* NaNs */
    };
    int bad = 0;
    uint32_t first_bad = 0;
    unsigned long long s = 99;
    for (size_t i = 0; i < 2000000 + sizeof edges / sizeof edges[0]; i++) {
        uint32_t u;
        if (i < sizeof edges / sizeof edges[0]) {
            u = edges[i];
        } else {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            u = (uint32_t)(s >> 32);
        }
        float x;
        memcpy(&x, &u, 4);
        uint16_t got = bf16_bits(x), want = naive_bits(x);
        int ok = isnan(x) ? isnan(bf16_to_float(got)) : got == want;
        if (!ok && !bad++) first_bad = u;
    }
    TEST_RESULT("bf16_round_nearest_even", !bad, "%d of 2M values differ from the nearest-value search, first 0x%08x",
                bad, first_bad);
}

/* ---- ops ---- */

static void test_matmul(void) {
    int N = 37, K = 70, M = 29;
    float *x = rnd((size_t)N * K), *w = rnd((size_t)M * K), *o = rnd((size_t)N * M), *dout = rnd((size_t)N * M);
    float *x16 = r16(x, (size_t)N * K), *w16 = r16(w, (size_t)M * K), *o16 = r16(o, (size_t)N * M);
    float *d16 = r16(dout, (size_t)N * M);
    float *want = copy_of(o, (size_t)N * M), *got = copy_of(o16, (size_t)N * M);
    f32->matmul_forward(want, x, w, N, K, M, 0);
    b16->matmul_forward(got, x16, w16, N, K, M, 0);
    check_act("bf16_matmul_forward", got, want, (size_t)N * M);
    memcpy(want, o, sizeof(float) * N * M), memcpy(got, o16, sizeof(float) * N * M);
    f32->matmul_forward(want, x, w, N, K, M, 1);
    b16->matmul_forward(got, x16, w16, N, K, M, 1);
    check_act("bf16_matmul_forward_accumulate", got, want, (size_t)N * M);
    /* dx like an activation; dw accumulates onto fp32 gradients unrounded */
    float *dw0 = rnd((size_t)M * K), *dx = malloc(4ul * N * K), *dx16 = malloc(4ul * N * K);
    float *dw = copy_of(dw0, (size_t)M * K), *dw16 = copy_of(dw0, (size_t)M * K), *dw_same = copy_of(dw0, (size_t)M * K);
    float *dx_same = malloc(4ul * N * K);
    f32->matmul_backward(dx, dw, dout, x, w, N, K, M, 0);
    b16->matmul_backward(dx16, dw16, d16, x16, w16, N, K, M, 0);
    check_act("bf16_matmul_backward_dx", dx16, dx, (size_t)N * K);
    check_close("bf16_matmul_backward_dw_close", dw16, dw, (size_t)M * K);
    f32->matmul_backward(dx_same, dw_same, d16, x16, w16, N, K, M, 0);
    check_exact("bf16_matmul_backward_dw_fp32_accumulate", dw16, dw_same, (size_t)M * K);
    free(x), free(w), free(o), free(dout), free(x16), free(w16), free(o16), free(d16), free(want), free(got);
    free(dw0), free(dx), free(dx16), free(dw), free(dw16), free(dw_same), free(dx_same);
}

static void test_rmsnorm(void) {
    int N = 21, C = 96;
    float *x = rnd((size_t)N * C), *w = rnd(C), *dout = rnd((size_t)N * C), *dx0 = rnd((size_t)N * C);
    float *x16 = r16(x, (size_t)N * C), *d16 = r16(dout, (size_t)N * C), *dx016 = r16(dx0, (size_t)N * C);
    float *out = malloc(4ul * N * C), *out16 = malloc(4ul * N * C), *rs = malloc(4ul * N), *rs16 = malloc(4ul * N);
    float *rs_same = malloc(4ul * N), *out_same = malloc(4ul * N * C);
    f32->rmsnorm_forward(out, rs, x, w, N, C, 1e-5f);
    b16->rmsnorm_forward(out16, rs16, x16, w, N, C, 1e-5f); /* norm gains are fp32 (the master) */
    check_act("bf16_rmsnorm_forward", out16, out, (size_t)N * C);
    f32->rmsnorm_forward(out_same, rs_same, x16, w, N, C, 1e-5f);
    check_exact("bf16_rmsnorm_forward_rstd_fp32", rs16, rs_same, N);
    float *dw0 = rnd(C), *dw = copy_of(dw0, C), *dw16 = copy_of(dw0, C), *dw_same = copy_of(dw0, C);
    float *dx = copy_of(dx0, (size_t)N * C), *dx16 = copy_of(dx016, (size_t)N * C), *dx_same = copy_of(dx016, (size_t)N * C);
    f32->rmsnorm_backward(dx, dw, dout, x, w, rs, N, C, 1);
    b16->rmsnorm_backward(dx16, dw16, d16, x16, w, rs16, N, C, 1);
    check_act("bf16_rmsnorm_backward_dx_accumulate", dx16, dx, (size_t)N * C);
    f32->rmsnorm_backward(dx_same, dw_same, d16, x16, w, rs16, N, C, 1);
    check_exact("bf16_rmsnorm_backward_dw_fp32", dw16, dw_same, C);
    free(x), free(w), free(dout), free(dx0), free(x16), free(d16), free(dx016), free(out), free(out16), free(rs);
    free(rs16), free(rs_same), free(out_same), free(dw0), free(dw), free(dw16), free(dw_same), free(dx), free(dx16);
    free(dx_same);
}

static void test_rope(void) {
    int B = 2, T = 9, H = 3, D = 16;
    size_t n = (size_t)B * T * H * D;
    float *cs = malloc(4ul * T * D / 2), *sn = malloc(4ul * T * D / 2);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D / 2; i++) {
            double a = t * pow(10000.0, -2.0 * i / D);
            cs[t * D / 2 + i] = (float)cos(a), sn[t * D / 2 + i] = (float)sin(a);
        }
    float *x = rnd(n), *x16 = r16(x, n);
    f32->rope(x, cs, sn, B, T, H, D, 0);
    b16->rope(x16, cs, sn, B, T, H, D, 0);
    check_act("bf16_rope", x16, x, n);
    f32->rope(x, cs, sn, B, T, H, D, 1);
    b16->rope(x16, cs, sn, B, T, H, D, 1);
    check_act("bf16_rope_inverse", x16, x, n);
    free(cs), free(sn), free(x), free(x16);
}

static void test_attention(int H, int KVH, int D, int Dv, const char *tag) {
    int B = 2, T = 13;
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D, nv = (size_t)B * T * KVH * Dv;
    size_t no = (size_t)B * T * H * Dv, ns = f32->attention_state_floats(B, H, T);
    float *q = rnd(nq), *k = rnd(nk), *v = rnd(nv), *dout = rnd(no);
    float *q16 = r16(q, nq), *k16 = r16(k, nk), *v16 = r16(v, nv), *d16 = r16(dout, no);
    float *out = malloc(4 * no), *out16 = malloc(4 * no), *out_same = malloc(4 * no);
    float *att = malloc(4 * ns), *att16 = malloc(4 * ns), *att_same = malloc(4 * ns);
    char name[96];
    f32->attention_forward(out, att, q, k, v, B, T, H, KVH, D, Dv);
    b16->attention_forward(out16, att16, q16, k16, v16, B, T, H, KVH, D, Dv);
    snprintf(name, sizeof name, "bf16_attention_forward_%s", tag);
    check_act(name, out16, out, no);
    f32->attention_forward(out_same, att_same, q16, k16, v16, B, T, H, KVH, D, Dv);
    snprintf(name, sizeof name, "bf16_attention_state_fp32_%s", tag);
    check_exact(name, att16, att_same, ns);
    float *dq = malloc(4 * nq), *dk = malloc(4 * nk), *dv = malloc(4 * nv);
    float *dq16 = malloc(4 * nq), *dk16 = malloc(4 * nk), *dv16 = malloc(4 * nv);
    f32->attention_backward(dq, dk, dv, dout, att, q, k, v, B, T, H, KVH, D, Dv);
    b16->attention_backward(dq16, dk16, dv16, d16, att16, q16, k16, v16, B, T, H, KVH, D, Dv);
    snprintf(name, sizeof name, "bf16_attention_backward_dq_%s", tag);
    check_act(name, dq16, dq, nq);
    snprintf(name, sizeof name, "bf16_attention_backward_dk_%s", tag);
    check_act(name, dk16, dk, nk);
    snprintf(name, sizeof name, "bf16_attention_backward_dv_%s", tag);
    check_act(name, dv16, dv, nv);
    /* decode: the last 3 positions of sequence 0 against its cache */
    int n = 3;
    float *o = malloc(4ul * n * H * D), *o16 = malloc(4ul * n * H * D);
    f32->attention_decode(o, q + (size_t)(T - n) * H * D, k, v, n, T, H, KVH, D);
    b16->attention_decode(o16, q16 + (size_t)(T - n) * H * D, k16, v16, n, T, H, KVH, D);
    if (Dv == D) {
        snprintf(name, sizeof name, "bf16_attention_decode_%s", tag);
        check_act(name, o16, o, (size_t)n * H * D);
    }
    free(q), free(k), free(v), free(dout), free(q16), free(k16), free(v16), free(d16), free(out), free(out16);
    free(out_same), free(att), free(att16), free(att_same), free(dq), free(dk), free(dv), free(dq16), free(dk16);
    free(dv16), free(o), free(o16);
}

static void test_elementwise(void) {
    size_t n = 3001;
    float *g = rnd(n), *u = rnd(n), *dout = rnd(n), *g16 = r16(g, n), *u16 = r16(u, n), *d16 = r16(dout, n);
    float *h = malloc(4 * n), *h16 = malloc(4 * n), *dg = malloc(4 * n), *du = malloc(4 * n), *dg16 = malloc(4 * n);
    float *du16 = malloc(4 * n);
    f32->swiglu_forward(h, g, u, n);
    b16->swiglu_forward(h16, g16, u16, n);
    check_act("bf16_swiglu_forward", h16, h, n);
    f32->swiglu_backward(dg, du, dout, g, u, n);
    b16->swiglu_backward(dg16, du16, d16, g16, u16, n);
    check_act("bf16_swiglu_backward_dgate", dg16, dg, n);
    check_act("bf16_swiglu_backward_dup", du16, du, n);
    memcpy(h, g, 4 * n), memcpy(h16, g16, 4 * n);
    f32->add(h, u, n);
    b16->add(h16, u16, n);
    check_act("bf16_add", h16, h, n);
    f32->scale(h, 0.37f, n);
    b16->scale(h16, 0.37f, n);
    check_act("bf16_scale", h16, h, n);
    /* copy_cols: a copy of bf16 values stays exact; accumulating rounds */
    int rows = 7, cols = 5, ldd = 9, lds = 11;
    float *dst = r16(dout, (size_t)rows * ldd), *dst16 = r16(dout, (size_t)rows * ldd), *src = rnd((size_t)rows * lds);
    float *src16 = r16(src, (size_t)rows * lds);
    memcpy(dst, dst16, 4ul * rows * ldd);
    f32->copy_cols(dst, ldd, src, lds, rows, cols, 1);
    b16->copy_cols(dst16, ldd, src16, lds, rows, cols, 1);
    check_act("bf16_copy_cols_accumulate", dst16, dst, (size_t)rows * ldd);
    b16->to_storage(h16, g, n);
    for (size_t i = 0; i < n; i++) h[i] = bf16_round(g[i]);
    check_exact("bf16_to_storage_rounds", h16, h, n);
    free(g), free(u), free(dout), free(g16), free(u16), free(d16), free(h), free(h16), free(dg), free(du), free(dg16);
    free(du16), free(dst), free(dst16), free(src), free(src16);
}

static void test_embedding_and_loss(void) {
    int N = 19, C = 40, V = 57;
    float *table = rnd((size_t)V * C), *t16 = r16(table, (size_t)V * C);
    int32_t tok[19];
    for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % V;
    tok[4] = -1 + V; /* the last row too */
    float *e = malloc(4ul * N * C), *e16 = malloc(4ul * N * C);
    f32->embedding_forward(e, tok, table, N, C, 0, V);
    b16->embedding_forward(e16, tok, t16, N, C, 0, V);
    check_act("bf16_embedding_forward", e16, e, (size_t)N * C);
    float *dout = rnd((size_t)N * C), *d16 = r16(dout, (size_t)N * C), *g0 = rnd((size_t)V * C);
    float *g16 = copy_of(g0, (size_t)V * C), *g_same = copy_of(g0, (size_t)V * C);
    b16->embedding_backward(g16, tok, d16, N, C, 0, V);
    f32->embedding_backward(g_same, tok, d16, N, C, 0, V);
    check_exact("bf16_embedding_backward_fp32", g16, g_same, (size_t)V * C);
    /* cross-entropy on bf16 logits: fp32 losses, the gradient stored like an activation */
    float *lg = rnd((size_t)N * V), *lg16 = r16(lg, (size_t)N * V), *lg_same = r16(lg, (size_t)N * V);
    for (size_t i = 0; i < (size_t)N * V; i++) lg[i] *= 4, lg16[i] = bf16_round(lg[i]), lg_same[i] = lg16[i];
    int32_t tg[19];
    for (int i = 0; i < N; i++) tg[i] = i == 5 ? -1 : (i * 11) % V;
    float *ls = malloc(4ul * N), *ls16 = malloc(4ul * N), *ls_same = malloc(4ul * N);
    f32->cross_entropy(ls, lg, tg, N, V, 0.5f);
    b16->cross_entropy(ls16, lg16, tg, N, V, 0.5f);
    f32->cross_entropy(ls_same, lg_same, tg, N, V, 0.5f);
    check_exact("bf16_cross_entropy_losses_fp32", ls16, ls_same, N);
    check_close("bf16_cross_entropy_losses_close", ls16, ls, N);
    check_act("bf16_cross_entropy_dlogits", lg16, lg, (size_t)N * V);
    /* the vocab-parallel finish stores its gradient the same way */
    float *lv = rnd((size_t)N * V), *lv16 = r16(lv, (size_t)N * V), mx[19], se[19], tl[19], lo[19], lo16[19];
    f32->ce_row_max(mx, lv16, N, V);
    f32->ce_row_sumexp(se, tl, lv16, tg, mx, N, V, 0);
    f32->ce_finish(lo, lv, tg, mx, se, tl, N, V, 0, 1.0f);
    b16->ce_finish(lo16, lv16, tg, mx, se, tl, N, V, 0, 1.0f);
    check_act("bf16_ce_finish_dlogits", lv16, lv, (size_t)N * V);
    free(table), free(t16), free(e), free(e16), free(dout), free(d16), free(g0), free(g16), free(g_same), free(lg);
    free(lg16), free(lg_same), free(ls), free(ls16), free(ls_same), free(lv), free(lv16);
}

static void test_moe(void) {
    int n = 24, E = 6, k = 2, C = 20;
    float *lg = rnd((size_t)n * E), *lg16 = r16(lg, (size_t)n * E);
    float *p = malloc(4ul * n * E), *lse = malloc(4ul * n), *w = malloc(4ul * n * k);
    float *p16 = malloc(4ul * n * E), *lse16 = malloc(4ul * n), *w16 = malloc(4ul * n * k);
    int32_t *idx = malloc(4ul * n * k), *idx16 = malloc(4ul * n * k), *pos = malloc(4ul * n * k);
    f32->moe_route_forward(p, lse, idx, w, lg16, n, E, k);
    b16->moe_route_forward(p16, lse16, idx16, w16, lg16, n, E, k);
    check_exact("bf16_moe_route_probs_fp32", p16, p, (size_t)n * E);
    check_exact("bf16_moe_route_weights_fp32", w16, w, (size_t)n * k);
    float *dw = rnd((size_t)n * k), *aux = rnd((size_t)n * E), *dl = malloc(4ul * n * E), *dl16 = malloc(4ul * n * E);
    f32->moe_route_backward(dl, dw, p, lse, idx, w, aux, 0.01f, n, E, k);
    b16->moe_route_backward(dl16, dw, p16, lse16, idx16, w16, aux, 0.01f, n, E, k);
    check_act("bf16_moe_route_backward", dl16, dl, (size_t)n * E);
    f32->moe_route_sigmoid_forward(p, idx, w, lg16, NULL, n, E, k, 1, 1, 2.5f);
    b16->moe_route_sigmoid_forward(p16, idx16, w16, lg16, NULL, n, E, k, 1, 1, 2.5f);
    check_exact("bf16_moe_route_sigmoid_weights_fp32", w16, w, (size_t)n * k);
    f32->moe_route_sigmoid_backward(dl, dw, p, idx, w, aux, n, E, k, 2.5f);
    b16->moe_route_sigmoid_backward(dl16, dw, p16, idx16, w16, aux, n, E, k, 2.5f);
    check_act("bf16_moe_route_sigmoid_backward", dl16, dl, (size_t)n * E);
    /* combine: rows in send order, one dropped */
    for (int i = 0; i < n * k; i++) pos[i] = i == 3 ? -1 : i;
    float *y = rnd((size_t)n * k * C), *y16 = r16(y, (size_t)n * k * C);
    float *o = malloc(4ul * n * C), *o16 = malloc(4ul * n * C);
    f32->moe_combine(o, y, pos, w, n, k, C, 0);
    b16->moe_combine(o16, y16, pos, w16, n, k, C, 0);
    check_act("bf16_moe_combine", o16, o, (size_t)n * C);
    float *dout = rnd((size_t)n * C), *d16 = r16(dout, (size_t)n * C);
    float *dy = calloc((size_t)n * k * C, 4), *dy16 = calloc((size_t)n * k * C, 4), *gw = malloc(4ul * n * k);
    float *gw16 = malloc(4ul * n * k), *dy_same = calloc((size_t)n * k * C, 4), *gw_same = malloc(4ul * n * k);
    f32->moe_combine_backward(dy, gw, dout, y, pos, w, n, k, C);
    b16->moe_combine_backward(dy16, gw16, d16, y16, pos, w16, n, k, C);
    check_act("bf16_moe_combine_backward_dy", dy16, dy, (size_t)n * k * C);
    f32->moe_combine_backward(dy_same, gw_same, d16, y16, pos, w16, n, k, C);
    check_exact("bf16_moe_combine_backward_gate_grad_fp32", gw16, gw_same, (size_t)n * k);
    free(lg), free(lg16), free(p), free(lse), free(w), free(p16), free(lse16), free(w16), free(idx), free(idx16);
    free(pos), free(dw), free(aux), free(dl), free(dl16), free(y), free(y16), free(o), free(o16), free(dout), free(d16);
    free(dy), free(dy16), free(gw), free(gw16), free(dy_same), free(gw_same);
}

/* AdamW and the reductions are the fp32 ops themselves (master state) */
static void test_optimizer(void) {
    size_t n = 1000;
    float *p = rnd(n), *g = rnd(n), *m = rnd(n), *v = rnd(n);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *p2 = copy_of(p, n), *m2 = copy_of(m, n), *v2 = copy_of(v, n);
    f32->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3);
    b16->adamw(p2, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3);
    check_exact("bf16_adamw_master_fp32", p2, p, n);
    TEST_RESULT("bf16_sum_squares_fp32", f32->sum_squares(g, n) == b16->sum_squares(g, n), "differs");
    free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2);
}

int main(void) {
    f32 = backend_get("cpu", "fp32");
    b16 = backend_get("cpu", "bf16");
    TEST_RESULT("bf16_table", b16 && b16->precision == PRECISION_BF16 && f32->precision == PRECISION_FP32,
                "backend_get(cpu, bf16) is not the bf16 table");
    if (!b16) TEST_EXIT();
    test_rounding();
    test_matmul();
    test_rmsnorm();
    test_rope();
    test_attention(4, 2, 16, 16, "gqa");
    test_attention(4, 4, 16, 16, "mha");
    test_attention(4, 1, 24, 16, "mqa_value_dim");
    test_elementwise();
    test_embedding_and_loss();
    test_moe();
    test_optimizer();
    TEST_EXIT();
}
