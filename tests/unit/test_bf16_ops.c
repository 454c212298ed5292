/* The bf16 CPU table (kernels/cpu/bf16.c: 2-byte storage) against the fp32
 * ops, and the rounding (kernels/bf16.h) against a naive nearest-value
 * search.
 *
 * For every op: the fp32 op runs on fp32 random inputs, the bf16 op on the
 * same inputs stored as bf16 (rounded to nearest even), and
 *  - what the bf16 op stores (2-byte activations) is within 1e-2 of the fp32
 *    result norm-wise (||got - want|| / ||want||; bf16 keeps 8 significant
 *    bits, a relative rounding of at most 2^-9 per stored value, so 1e-2
 *    leaves room for the input rounding that flows through the op) and is
 *    bitwise the fp32 op's result on the widened inputs, rounded once;
 *  - what stays fp32 (parameter gradients accumulated onto existing fp32
 *    values, statistics) is bitwise what the fp32 op computes from the same
 *    (widened) inputs: nothing rounds it. */
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
/* x stored as bf16: n 2-byte values behind a float * handle, as the tables take them */
static float *pack(const float *x, size_t n) {
    uint16_t *b = malloc(sizeof(uint16_t) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) b[i] = bf16_bits(x[i]);
    return (float *)b;
}
/* the fp32 values of n stored bf16 values */
static float *unpack(const float *p, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) y[i] = bf16_to_float(((const uint16_t *)p)[i]);
    return y;
}
/* x rounded to bf16, as fp32 (what the fp32 op sees of the stored inputs) */
static float *r16(const float *x, size_t n) {
    float *y = copy_of(x, n);
    for (size_t i = 0; i < n; i++) y[i] = bf16_round(y[i]);
    return y;
}

static double normwise(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++)
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]), den += (double)want[i] * want[i];
    return sqrt(num / (den > 0 ? den : 1));
}

/* stored (bf16) output got against the fp32 op's want on fp32 inputs, and
 * against same: the fp32 op's result on the stored inputs (NULL: skip) */
static void check_act(const char *name, const float *got, const float *want, size_t n, const float *same) {
    float *g = unpack(got, n);
    double e = normwise(g, want, n);
    size_t off = n;
    for (size_t i = 0; same && i < n && off == n; i++)
        if (((const uint16_t *)got)[i] != bf16_bits(same[i])) off = i;
    if (off < n) TEST_FAIL(name, "element %zu = %.9g is not the fp32 result %.9g rounded once", off, g[off], same[off]);
    else TEST_RESULT(name, e <= TOL, "norm-wise relative error %.3g > %.0e", e, TOL);
    free(g);
}
/* an fp32 output close to the fp32 op's on fp32 inputs */
static void check_close(const char *name, const float *got, const float *want, size_t n) {
    double e = normwise(got, want, n);
    TEST_RESULT(name, e <= TOL, "norm-wise relative error %.3g > %.0e", e, TOL);
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

/* An op's fp32 operand in three forms: x (fp32 random), X (stored bf16), xr
 * (the stored values as fp32, what the fp32 op sees for "same"). */
struct operand {
    float *x, *X, *xr;
    size_t n;
};
static struct operand operand(size_t n) {
    struct operand o = {rnd(n), NULL, NULL, n};
    o.X = pack(o.x, n), o.xr = r16(o.x, n);
    return o;
}
static void operand_free(struct operand *o) { free(o->x), free(o->X), free(o->xr); }

static void test_matmul(void) {
    int N = 37, K = 70, M = 29;
    size_t nx = (size_t)N * K, nw = (size_t)M * K, no = (size_t)N * M;
    struct operand x = operand(nx), w = operand(nw), o = operand(no), d = operand(no), dx = operand(nx);
    float *want = copy_of(o.x, no), *same = copy_of(o.xr, no);
    f32->matmul_forward(want, x.x, w.x, N, K, M, 1);
    f32->matmul_forward(same, x.xr, w.xr, N, K, M, 1);
    b16->matmul_forward(o.X, x.X, w.X, N, K, M, 1);
    check_act("bf16_matmul_forward_accumulate", o.X, want, no, same);
    f32->matmul_forward(want, x.x, w.x, N, K, M, 0);
    f32->matmul_forward(same, x.xr, w.xr, N, K, M, 0);
    b16->matmul_forward(o.X, x.X, w.X, N, K, M, 0);
    check_act("bf16_matmul_forward", o.X, want, no, same);
    /* dx is stored; dw accumulates onto fp32 gradients unrounded */
    float *dw0 = rnd(nw), *gx = copy_of(dx.x, nx), *gx_same = copy_of(dx.xr, nx);
    float *dw = copy_of(dw0, nw), *dw16 = copy_of(dw0, nw), *dw_same = copy_of(dw0, nw);
    f32->matmul_backward(gx, dw, d.x, x.x, w.x, N, K, M, 1);
    f32->matmul_backward(gx_same, dw_same, d.xr, x.xr, w.xr, N, K, M, 1);
    b16->matmul_backward(dx.X, dw16, d.X, x.X, w.X, N, K, M, 1);
    check_act("bf16_matmul_backward_dx_accumulate", dx.X, gx, nx, gx_same);
    check_close("bf16_matmul_backward_dw_close", dw16, dw, nw);
    check_exact("bf16_matmul_backward_dw_fp32_accumulate", dw16, dw_same, nw);
    operand_free(&x), operand_free(&w), operand_free(&o), operand_free(&d), operand_free(&dx);
    free(want), free(same), free(dw0), free(gx), free(gx_same), free(dw), free(dw16), free(dw_same);
}

static void test_rmsnorm(void) {
    int N = 21, C = 96;
    size_t n = (size_t)N * C;
    struct operand x = operand(n), d = operand(n), dx = operand(n), out = operand(n);
    float *w = rnd(C); /* norm gains: the fp32 master */
    float *o = malloc(4 * n), *o_same = malloc(4 * n), *rs = malloc(4ul * N), *rs16 = malloc(4ul * N);
    float *rs_same = malloc(4ul * N);
    f32->rmsnorm_forward(o, rs, x.x, w, N, C, 1e-5f);
    f32->rmsnorm_forward(o_same, rs_same, x.xr, w, N, C, 1e-5f);
    b16->rmsnorm_forward(out.X, rs16, x.X, w, N, C, 1e-5f);
    check_act("bf16_rmsnorm_forward", out.X, o, n, o_same);
    check_exact("bf16_rmsnorm_forward_rstd_fp32", rs16, rs_same, N);
    float *dw0 = rnd(C), *dw = copy_of(dw0, C), *dw16 = copy_of(dw0, C), *dw_same = copy_of(dw0, C);
    float *g = copy_of(dx.x, n), *g_same = copy_of(dx.xr, n);
    f32->rmsnorm_backward(g, dw, d.x, x.x, w, rs, N, C, 1);
    f32->rmsnorm_backward(g_same, dw_same, d.xr, x.xr, w, rs16, N, C, 1);
    b16->rmsnorm_backward(dx.X, dw16, d.X, x.X, w, rs16, N, C, 1);
    check_act("bf16_rmsnorm_backward_dx_accumulate", dx.X, g, n, g_same);
    check_exact("bf16_rmsnorm_backward_dw_fp32", dw16, dw_same, C);
    operand_free(&x), operand_free(&d), operand_free(&dx), operand_free(&out);
    free(w), free(o), free(o_same), free(rs), free(rs16), free(rs_same), free(dw0), free(dw), free(dw16), free(dw_same);
    free(g), free(g_same);
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
    struct operand x = operand(n);
    f32->rope(x.x, cs, sn, B, T, H, D, 0);
    f32->rope(x.xr, cs, sn, B, T, H, D, 0);
    b16->rope(x.X, cs, sn, B, T, H, D, 0);
    check_act("bf16_rope", x.X, x.x, n, x.xr);
    free(x.xr);
    x.xr = unpack(x.X, n);
    f32->rope(x.x, cs, sn, B, T, H, D, 1);
    f32->rope(x.xr, cs, sn, B, T, H, D, 1);
    b16->rope(x.X, cs, sn, B, T, H, D, 1);
    check_act("bf16_rope_inverse", x.X, x.x, n, x.xr);
    operand_free(&x), free(cs), free(sn);
}

static void test_attention(int H, int KVH, int D, int Dv, const char *tag) {
    int B = 2, T = 13;
    size_t rows = (size_t)B * T, nq = rows * H * D, nk = rows * KVH * D, nv = rows * KVH * Dv, no = rows * H * Dv;
    size_t ns = f32->attention_state_floats(B, H, T);
    struct operand q = operand(nq), k = operand(nk), v = operand(nv), d = operand(no), out = operand(no);
    float *o = malloc(4 * no), *o_same = malloc(4 * no), *att = malloc(4 * ns), *att16 = malloc(4 * ns);
    float *att_same = malloc(4 * ns);
    char name[96];
    f32->attention_forward(o, att, q.x, k.x, v.x, B, T, H, KVH, D, Dv);
    f32->attention_forward(o_same, att_same, q.xr, k.xr, v.xr, B, T, H, KVH, D, Dv);
    b16->attention_forward(out.X, att16, q.X, k.X, v.X, B, T, H, KVH, D, Dv);
    snprintf(name, sizeof name, "bf16_attention_forward_%s", tag);
    check_act(name, out.X, o, no, o_same);
    snprintf(name, sizeof name, "bf16_attention_state_fp32_%s", tag);
    check_exact(name, att16, att_same, ns);
    struct operand gq = operand(nq), gk = operand(nk), gv = operand(nv);
    float *dq = malloc(4 * nq), *dk = malloc(4 * nk), *dv = malloc(4 * nv);
    float *dq_s = malloc(4 * nq), *dk_s = malloc(4 * nk), *dv_s = malloc(4 * nv);
    f32->attention_backward(dq, dk, dv, d.x, o, att, q.x, k.x, v.x, B, T, H, KVH, D, Dv);
    f32->attention_backward(dq_s, dk_s, dv_s, d.xr, o_same, att_same, q.xr, k.xr, v.xr, B, T, H, KVH, D, Dv);
    b16->attention_backward(gq.X, gk.X, gv.X, d.X, out.X, att16, q.X, k.X, v.X, B, T, H, KVH, D, Dv);
    snprintf(name, sizeof name, "bf16_attention_backward_dq_%s", tag);
    check_act(name, gq.X, dq, nq, dq_s);
    snprintf(name, sizeof name, "bf16_attention_backward_dk_%s", tag);
    check_act(name, gk.X, dk, nk, dk_s);
    snprintf(name, sizeof name, "bf16_attention_backward_dv_%s", tag);
    check_act(name, gv.X, dv, nv, dv_s);
    { /* decode: the last 3 positions of sequence 0 against its cache */
        int n = 3;
        size_t off = (size_t)(T - n) * H * D, nd = (size_t)n * H * Dv;
        float *od = malloc(4 * nd), *od_s = malloc(4 * nd), *OD = malloc(2 * nd);
        f32->attention_decode(od, q.x + off, k.x, v.x, n, T, H, KVH, D, Dv);
        f32->attention_decode(od_s, q.xr + off, k.xr, v.xr, n, T, H, KVH, D, Dv);
        b16->attention_decode(OD, (const float *)((const uint16_t *)q.X + off), k.X, v.X, n, T, H, KVH, D, Dv);
        snprintf(name, sizeof name, "bf16_attention_decode_%s", tag);
        check_act(name, OD, od, nd, od_s);
        free(od), free(od_s), free(OD);
    }
    operand_free(&q), operand_free(&k), operand_free(&v), operand_free(&d), operand_free(&out);
    operand_free(&gq), operand_free(&gk), operand_free(&gv);
    free(o), free(o_same), free(att), free(att16), free(att_same), free(dq), free(dk), free(dv), free(dq_s), free(dk_s);
    free(dv_s);
}

static void test_elementwise(void) {
    size_t n = 3001;
    struct operand g = operand(n), u = operand(n), d = operand(n), h = operand(n), dg = operand(n), du = operand(n);
    float *w = malloc(4 * n), *w_s = malloc(4 * n), *w2 = malloc(4 * n), *w2_s = malloc(4 * n);
    f32->swiglu_forward(w, g.x, u.x, n);
    f32->swiglu_forward(w_s, g.xr, u.xr, n);
    b16->swiglu_forward(h.X, g.X, u.X, n);
    check_act("bf16_swiglu_forward", h.X, w, n, w_s);
    f32->swiglu_backward(w, w2, d.x, g.x, u.x, n);
    f32->swiglu_backward(w_s, w2_s, d.xr, g.xr, u.xr, n);
    b16->swiglu_backward(dg.X, du.X, d.X, g.X, u.X, n);
    check_act("bf16_swiglu_backward_dgate", dg.X, w, n, w_s);
    check_act("bf16_swiglu_backward_dup", du.X, w2, n, w2_s);
    memcpy(w, g.x, 4 * n), memcpy(w_s, g.xr, 4 * n);
    f32->add(w, u.x, n);
    f32->add(w_s, u.xr, n);
    b16->add(g.X, u.X, n);
    check_act("bf16_add", g.X, w, n, w_s);
    free(w_s);
    w_s = unpack(g.X, n);
    f32->scale(w, 0.37f, n);
    f32->scale(w_s, 0.37f, n);
    b16->scale(g.X, 0.37f, n);
    check_act("bf16_scale", g.X, w, n, w_s);
    /* to_storage rounds, from_storage is exact */
    b16->to_storage(h.X, d.x, n);
    check_act("bf16_to_storage_rounds", h.X, d.x, n, d.x);
    b16->from_storage(w, h.X, n);
    check_exact("bf16_from_storage_exact", w, d.xr, n);
    /* copy_cols: a copy of stored values is exact, accumulating rounds once */
    int rows = 7, cols = 5, ldd = 9, lds = 11;
    struct operand dst = operand((size_t)rows * ldd), src = operand((size_t)rows * lds);
    float *want = copy_of(dst.x, (size_t)rows * ldd), *same = copy_of(dst.xr, (size_t)rows * ldd);
    f32->copy_cols(want, ldd, src.x, lds, rows, cols, 1);
    f32->copy_cols(same, ldd, src.xr, lds, rows, cols, 1);
    b16->copy_cols(dst.X, ldd, src.X, lds, rows, cols, 1);
    check_act("bf16_copy_cols_accumulate", dst.X, want, (size_t)rows * ldd, same);
    f32->copy_cols(same, ldd, src.xr, lds, rows, cols, 0);
    b16->copy_cols(dst.X, ldd, src.X, lds, rows, cols, 0);
    check_act("bf16_copy_cols", dst.X, same, (size_t)rows * ldd, same);
    operand_free(&g), operand_free(&u), operand_free(&d), operand_free(&h), operand_free(&dg), operand_free(&du);
    operand_free(&dst), operand_free(&src);
    free(w), free(w_s), free(w2), free(w2_s), free(want), free(same);
}

/* test name + suffix (one at a time) */
static const char *nm(const char *base, const char *sfx) {
    static char buf[96];
    snprintf(buf, sizeof buf, "%s%s", base, sfx);
    return buf;
}

/* the cross-entropy ops on N = 19 rows of V stored logits (a target of -1 is ignored) */
static void test_loss(int V, const char *sfx) {
    int N = 19;
    /* cross-entropy on stored logits: fp32 losses, the gradient stored */
    size_t nl = (size_t)N * V;
    struct operand lg = operand(nl);
    for (size_t i = 0; i < nl; i++) lg.x[i] *= 4, lg.xr[i] = bf16_round(lg.x[i]);
    free(lg.X);
    lg.X = pack(lg.x, nl);
    int32_t tg[19];
    for (int i = 0; i < N; i++) tg[i] = i == 5 ? -1 : (i * 11) % V;
    float *ls = malloc(4ul * N), *ls16 = malloc(4ul * N), *ls_same = malloc(4ul * N);
    f32->cross_entropy(ls, lg.x, tg, N, V, 0.5f);
    f32->cross_entropy(ls_same, lg.xr, tg, N, V, 0.5f);
    b16->cross_entropy(ls16, lg.X, tg, N, V, 0.5f);
    check_exact(nm("bf16_cross_entropy_losses_fp32", sfx), ls16, ls_same, N);
    check_close(nm("bf16_cross_entropy_losses_close", sfx), ls16, ls, N);
    check_act(nm("bf16_cross_entropy_dlogits", sfx), lg.X, lg.x, nl, lg.xr);
    /* vocab-parallel: fp32 statistics of the stored logits, the gradient stored */
    struct operand lv = operand(nl);
    float mx[19], se[19], tl[19], mx16[19], se16[19], tl16[19], lo[19], lo16[19], lo_same[19];
    f32->ce_row_max(mx, lv.xr, N, V);
    b16->ce_row_max(mx16, lv.X, N, V);
    check_exact(nm("bf16_ce_row_max_fp32", sfx), mx16, mx, N);
    f32->ce_row_sumexp(se, tl, lv.xr, tg, mx, N, V, 0);
    b16->ce_row_sumexp(se16, tl16, lv.X, tg, mx, N, V, 0);
    check_exact(nm("bf16_ce_row_sumexp_fp32", sfx), se16, se, N);
    float *want_l = copy_of(lv.x, nl);
    f32->ce_finish(lo, want_l, tg, mx, se, tl, N, V, 0, 1.0f);
    f32->ce_finish(lo_same, lv.xr, tg, mx, se, tl, N, V, 0, 1.0f);
    b16->ce_finish(lo16, lv.X, tg, mx, se, tl, N, V, 0, 1.0f);
    check_act(nm("bf16_ce_finish_dlogits", sfx), lv.X, want_l, nl, lv.xr);
    check_exact(nm("bf16_ce_finish_losses_fp32", sfx), lo16, lo_same, N);
    operand_free(&lg), operand_free(&lv);
    free(ls), free(ls16), free(ls_same), free(want_l);
}

static void test_embedding_and_loss(void) {
    int N = 19, C = 40, V = 57, vstart = 3, Vl = 50; /* a vocabulary slice: some tokens outside */
    struct operand table = operand((size_t)Vl * C), e = operand((size_t)N * C), d = operand((size_t)N * C);
    int32_t tok[19];
    for (int i = 0; i < N; i++) tok[i] = (i * 7 + 1) % V;
    float *want = malloc(4ul * N * C);
    f32->embedding_forward(want, tok, table.xr, N, C, vstart, Vl);
    b16->embedding_forward(e.X, tok, table.X, N, C, vstart, Vl);
    check_act("bf16_embedding_forward", e.X, want, (size_t)N * C, want);
    float *g0 = rnd((size_t)Vl * C), *g16 = copy_of(g0, (size_t)Vl * C), *g_same = copy_of(g0, (size_t)Vl * C);
    b16->embedding_backward(g16, tok, d.X, N, C, vstart, Vl);
    f32->embedding_backward(g_same, tok, d.xr, N, C, vstart, Vl);
    check_exact("bf16_embedding_backward_fp32", g16, g_same, (size_t)Vl * C);
    operand_free(&table), operand_free(&e), operand_free(&d);
    free(want), free(g0), free(g16), free(g_same);
    test_loss(V, "");
    test_loss(120000, "_chunked"); /* 2.3M logits: the bf16 table widens them in chunks of 1M */
}

static void test_moe(void) {
    int n = 24, E = 6, k = 2, C = 20;
    size_t nE = (size_t)n * E, nk = (size_t)n * k, ny = nk * C, nc = (size_t)n * C;
    struct operand lg = operand(nE);
    float *p = malloc(4 * nE), *lse = malloc(4ul * n), *w = malloc(4 * nk);
    float *p16 = malloc(4 * nE), *lse16 = malloc(4ul * n), *w16 = malloc(4 * nk);
    int32_t *idx = malloc(4 * nk), *idx16 = malloc(4 * nk), *pos = malloc(4 * nk);
    f32->moe_route_forward(p, lse, idx, w, lg.xr, n, E, k);
    b16->moe_route_forward(p16, lse16, idx16, w16, lg.X, n, E, k);
    check_exact("bf16_moe_route_probs_fp32", p16, p, nE);
    check_exact("bf16_moe_route_weights_fp32", w16, w, nk);
    float *dw = rnd(nk), *aux = rnd(nE), *dl = malloc(4 * nE);
    struct operand DL = operand(nE);
    f32->moe_route_backward(dl, dw, p, lse, idx, w, aux, 0.01f, n, E, k, 1, 0);
    b16->moe_route_backward(DL.X, dw, p16, lse16, idx16, w16, aux, 0.01f, n, E, k, 1, 0);
    check_act("bf16_moe_route_backward", DL.X, dl, nE, dl);
    float *bias = rnd(E);
    f32->moe_route_sigmoid_forward(p, idx, w, lg.xr, bias, n, E, k, 2, 1, 2.5f);
    b16->moe_route_sigmoid_forward(p16, idx16, w16, lg.X, bias, n, E, k, 2, 1, 2.5f);
    check_exact("bf16_moe_route_sigmoid_weights_fp32", w16, w, nk);
    f32->moe_route_sigmoid_backward(dl, dw, p, idx, w, aux, n, E, k, 2.5f, 1, 0);
    b16->moe_route_sigmoid_backward(DL.X, dw, p16, idx16, w16, aux, n, E, k, 2.5f, 1, 0);
    check_act("bf16_moe_route_sigmoid_backward", DL.X, dl, nE, dl);
    /* permutation and combine: rows in send order, one dropped */
    for (size_t i = 0; i < nk; i++) pos[i] = i == 3 ? -1 : (int32_t)i;
    struct operand y = operand(ny), x = operand(nc), out = operand(nc), d = operand(nc), dy = operand(ny);
    int32_t rows[24];
    for (int i = 0; i < n; i++) rows[i] = (i * 5) % n;
    float *gy = malloc(4 * nc);
    f32->gather_rows(gy, x.xr, rows, n, C);
    b16->gather_rows(out.X, x.X, rows, n, C);
    check_act("bf16_gather_rows", out.X, gy, nc, gy);
    float *o = malloc(4 * nc), *o_same = malloc(4 * nc);
    f32->moe_combine(o, y.x, pos, w, n, k, C, 0);
    f32->moe_combine(o_same, y.xr, pos, w16, n, k, C, 0);
    b16->moe_combine(out.X, y.X, pos, w16, n, k, C, 0);
    check_act("bf16_moe_combine", out.X, o, nc, o_same);
    float *gd = calloc(ny, 4), *gd_s = calloc(ny, 4), *gw = malloc(4 * nk), *gw16 = malloc(4 * nk);
    float *gw_same = malloc(4 * nk);
    f32->moe_combine_backward(gd, gw, d.x, y.x, pos, w, n, k, C);
    f32->moe_combine_backward(gd_s, gw_same, d.xr, y.xr, pos, w16, n, k, C);
    memset(dy.X, 0, 2 * ny);
    b16->moe_combine_backward(dy.X, gw16, d.X, y.X, pos, w16, n, k, C);
    check_act("bf16_moe_combine_backward_dy", dy.X, gd, ny, gd_s);
    check_exact("bf16_moe_combine_backward_gate_grad_fp32", gw16, gw_same, nk);
    operand_free(&lg), operand_free(&DL), operand_free(&y), operand_free(&x), operand_free(&out), operand_free(&d);
    operand_free(&dy);
    free(p), free(lse), free(w), free(p16), free(lse16), free(w16), free(idx), free(idx16), free(pos), free(dw);
    free(aux), free(dl), free(bias), free(gy), free(o), free(o_same), free(gd), free(gd_s), free(gw), free(gw16);
    free(gw_same);
}

/* AdamW and the reductions are the fp32 ops themselves (master state);
 * AdamW's working-copy output is to_storage of the updated parameters */
static void test_optimizer(void) {
    size_t n = 1000;
    float *p = rnd(n), *g = rnd(n), *m = rnd(n), *v = rnd(n);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *p2 = copy_of(p, n), *m2 = copy_of(m, n), *v2 = copy_of(v, n);
    uint16_t *work = malloc(2 * n), *want = malloc(2 * n);
    f32->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3, NULL);
    b16->adamw(p2, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3, work);
    check_exact("bf16_adamw_master_fp32", p2, p, n);
    b16->to_storage((float *)want, p2, n);
    TEST_RESULT("bf16_adamw_writes_working_copy", !memcmp(work, want, 2 * n), "not to_storage of the update");
    free(work), free(want);
    TEST_RESULT("bf16_sum_squares_fp32", f32->sum_squares(g, n) == b16->sum_squares(g, n), "differs");
    free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2);
}

int main(void) {
    f32 = backend_get("cpu", "fp32");
    b16 = backend_get("cpu", "bf16");
    TEST_RESULT("bf16_table", b16 && b16->precision == PRECISION_BF16 && b16->act_bytes == 2 &&
                                  f32->precision == PRECISION_FP32 && f32->act_bytes == 4,
                "backend_get(cpu, bf16) is not the 2-byte bf16 table");
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
