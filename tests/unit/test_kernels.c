/* Every CPU op against a naive double-precision loop on random data.
 * Forward: max relative error <= 1e-5 (floored, see check_close).
 * Backward: compared with central finite differences of the double forward
 * of L = sum(out * R) for random R: max relative error (floored) <= 1e-4. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/vec_exp.h"
#include "kernels/ops.h"
#include "tests/unit/check.h"

static const struct backend *be;
static unsigned long long seed = 42;

static float *frand(size_t n) { return test_rand_array(&seed, n); }
static double *to_double(const float *x, size_t n) {
    double *d = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* ---- double references ---- */
static int gB = 2, gT = 7, gH = 4, gKVH = 2, gD = 8, gN = 14, gC = 24, gM = 10, gV = 33;

static void ref_matmul(double *out, const double *x, const double *w, int N, int K, int M) {
    for (int n = 0; n < N; n++)
        for (int m = 0; m < M; m++) {
            double a = 0;
            for (int k = 0; k < K; k++) a += x[n * K + k] * w[m * K + k];
            out[n * M + m] = a;
        }
}
static void ref_rmsnorm(double *out, const double *x, const double *w, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += x[n * C + c] * x[n * C + c];
        double r = 1 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) out[n * C + c] = w[c] * x[n * C + c] * r;
    }
}
static void ref_rope(double *out, const double *x, const float *cs, const float *sn, int B, int T, int H, int D) {
    int half = D / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < D; i++) {
                    size_t base = (((size_t)b * T + t) * H + h) * D;
                    int j = i % half;
                    double c = cs[t * half + j], s = sn[t * half + j];
                    double rot = i < half ? -x[base + i + half] : x[base + i - half];
                    out[base + i] = x[base + i] * c + rot * s;
                }
}
/* the value head size when it differs from D (MLA); 0: D */
static int gDv = 0;
static void ref_attention(double *out, const double *q, const double *k, const double *v, int B, int T, int H,
                          int KVH, int D) {
    int Dv = gDv ? gDv : D;
    int group = H / KVH;
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int kh = h / group;
                double mx = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < D; i++)
                        d += q[((b * T + t) * H + h) * D + i] * k[((b * T + s) * KVH + kh) * D + i];
                    p[s] = d / sqrt(D);
                    mx = fmax(mx, p[s]);
                }
                for (int s = 0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
                for (int i = 0; i < Dv; i++) {
                    double o = 0;
                    for (int s = 0; s <= t; s++) o += p[s] / sum * v[((b * T + s) * KVH + kh) * Dv + i];
                    out[((b * T + t) * H + h) * Dv + i] = o;
                }
            }
    free(p);
}
static double silu_d(double x) { return x / (1 + exp(-x)); }

/* ---- finite differences: d/dx_i of sum(f(x) * R) ---- */
typedef void (*ref_fn)(double *out, double **inputs);
static double objective(ref_fn f, double **in, const double *R, size_t nout, double *scratch) {
    f(scratch, in);
    double s = 0;
    for (size_t i = 0; i < nout; i++) s += scratch[i] * R[i];
    return s;
}
static double *fd_grad(ref_fn f, double **in, int which, size_t nin, const double *R, size_t nout) {
    double *g = malloc(sizeof(double) * nin), *scratch = malloc(sizeof(double) * nout);
    for (size_t i = 0; i < nin; i++) {
        double keep = in[which][i], h = 1e-6;
        in[which][i] = keep + h;
        double up = objective(f, in, R, nout, scratch);
        in[which][i] = keep - h;
        double dn = objective(f, in, R, nout, scratch);
        in[which][i] = keep;
        g[i] = (up - dn) / (2 * h);
    }
    free(scratch);
    return g;
}

/* Relative error floored at 10% of the reference's RMS (and 1e-2), so float
 * rounding on values that cancel to near zero is not mistaken for a bug. */
static double floor_for(const double *want, size_t n) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += want[i] * want[i];
    return fmax(1e-2, 0.1 * sqrt(ss / n));
}
static void check_close(const char *name, const float *got, const double *want, size_t n, double tol) {
    double e = max_rel_err(got, want, n, floor_for(want, n));
    TEST_RESULT(name, e <= tol, "max rel err %.3g > %.1g", e, tol);
}

/* ---- tests ---- */
static void ref_matmul_fn(double *out, double **in) { ref_matmul(out, in[0], in[1], gN, gC, gM); }
static void test_matmul(void) {
    int N = gN, K = gC, M = gM;
    float *x = frand(N * K), *w = frand(M * K), *R = frand(N * M);
    float *out = calloc(N * M, 4), *dx = calloc(N * K, 4), *dw = calloc(M * K, 4);
    double *xd = to_double(x, N * K), *wd = to_double(w, M * K), *Rd = to_double(R, N * M);
    double *ref = malloc(sizeof(double) * N * M), *in[] = {xd, wd};
    be->matmul_forward(out, x, w, N, K, M, 0);
    ref_matmul(ref, xd, wd, N, K, M);
    check_close("matmul_forward", out, ref, N * M, 1e-5);
    be->matmul_forward(out, x, w, N, K, M, 1);
    for (int i = 0; i < N * M; i++) ref[i] *= 2;
    check_close("matmul_forward_accumulate", out, ref, N * M, 1e-5);
    be->matmul_backward(dx, dw, R, x, w, N, K, M, 0);
    double *gx = fd_grad(ref_matmul_fn, in, 0, N * K, Rd, N * M), *gw = fd_grad(ref_matmul_fn, in, 1, M * K, Rd, N * M);
    check_close("matmul_backward_dx", dx, gx, N * K, 1e-4);
    check_close("matmul_backward_dw", dw, gw, M * K, 1e-4);
    be->matmul_backward(dx, dw, R, x, w, N, K, M, 1); /* dw accumulates, dx too */
    for (int i = 0; i < M * K; i++) gw[i] *= 2;
    for (int i = 0; i < N * K; i++) gx[i] *= 2;
    check_close("matmul_backward_accumulates", dw, gw, M * K, 1e-4);
    check_close("matmul_backward_dx_accumulate", dx, gx, N * K, 1e-4);
    free(x), free(w), free(R), free(out), free(dx), free(dw), free(xd), free(wd), free(Rd), free(ref), free(gx), free(gw);
}

static void ref_rmsnorm_fn(double *out, double **in) { ref_rmsnorm(out, in[0], in[1], gN, gC, 1e-5); }
/* C 24: three of the sums' 8 lanes; C 75: a tail beyond the lanes and two of the dw sum's 64-column blocks */
static void test_rmsnorm(int C, const char *tag) {
    int N = gN, keep_C = gC;
    gC = C;
    char name[64];
    float *x = frand(N * C), *w = frand(C), *R = frand(N * C), *out = calloc(N * C, 4), *rstd = calloc(N, 4);
    float *dx = calloc(N * C, 4), *dw = calloc(C, 4);
    double *xd = to_double(x, N * C), *wd = to_double(w, C), *Rd = to_double(R, N * C), *in[] = {xd, wd};
    double *ref = malloc(sizeof(double) * N * C);
    be->rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    ref_rmsnorm(ref, xd, wd, N, C, 1e-5);
    snprintf(name, sizeof name, "rmsnorm_forward%s", tag);
    check_close(name, out, ref, N * C, 1e-5);
    be->rmsnorm_backward(dx, dw, R, x, w, rstd, N, C, 0);
    double *gx = fd_grad(ref_rmsnorm_fn, in, 0, N * C, Rd, N * C), *gw = fd_grad(ref_rmsnorm_fn, in, 1, C, Rd, N * C);
    snprintf(name, sizeof name, "rmsnorm_backward_dx%s", tag);
    check_close(name, dx, gx, N * C, 1e-4);
    snprintf(name, sizeof name, "rmsnorm_backward_dw%s", tag);
    check_close(name, dw, gw, C, 1e-4);
    free(x), free(w), free(R), free(out), free(rstd), free(dx), free(dw), free(xd), free(wd), free(Rd), free(ref), free(gx), free(gw);
    gC = keep_C;
}

static float *g_cos, *g_sin;
static void ref_rope_fn(double *out, double **in) { ref_rope(out, in[0], g_cos, g_sin, gB, gT, gH, gD); }
static void test_rope(void) {
    int n = gB * gT * gH * gD, half = gD / 2;
    g_cos = malloc(4 * gT * half), g_sin = malloc(4 * gT * half);
    for (int t = 0; t < gT; t++)
        for (int i = 0; i < half; i++) {
            double a = t * pow(10000.0, -2.0 * i / gD);
            g_cos[t * half + i] = cos(a), g_sin[t * half + i] = sin(a);
        }
    float *x = frand(n), *R = frand(n), *y = malloc(4 * n);
    double *xd = to_double(x, n), *Rd = to_double(R, n), *ref = malloc(8 * n), *in[] = {xd};
    memcpy(y, x, 4 * n);
    be->rope(y, g_cos, g_sin, gB, gT, gH, gD, 0);
    ref_rope(ref, xd, g_cos, g_sin, gB, gT, gH, gD);
    check_close("rope_forward", y, ref, n, 1e-5);
    memcpy(y, R, 4 * n);
    be->rope(y, g_cos, g_sin, gB, gT, gH, gD, 1);
    double *gx = fd_grad(ref_rope_fn, in, 0, n, Rd, n);
    check_close("rope_backward", y, gx, n, 1e-4);
    free(x), free(R), free(y), free(xd), free(Rd), free(ref), free(gx), free(g_cos), free(g_sin);
}

static void ref_attn_fn(double *out, double **in) { ref_attention(out, in[0], in[1], in[2], gB, gT, gH, gKVH, gD); }
/* copy_cols against a naive loop: a block of columns, copied then accumulated */
static void test_copy_cols(void) {
    int rows = 5, lds = 9, ldd = 7, cols = 4;
    float *src = frand(rows * lds), *dst = frand(rows * ldd);
    double *want = to_double(dst, rows * ldd);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) want[r * ldd + 2 + c] = src[r * lds + 3 + c];
    be->copy_cols(dst + 2, ldd, src + 3, lds, rows, cols, 0);
    check_close("copy_cols", dst, want, rows * ldd, 0);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) want[r * ldd + 2 + c] += src[r * lds + 3 + c];
    be->copy_cols(dst + 2, ldd, src + 3, lds, rows, cols, 1);
    check_close("copy_cols_accumulate", dst, want, rows * ldd, 1e-7);
    free(src), free(dst), free(want);
}

/* Dv != D: MLA's value heads (128) beside its query/key heads (192) */
static void test_attention(int H, int KVH, int Dv, const char *fwd_name, const char *bwd_name) {
    gH = H, gKVH = KVH, gDv = Dv;
    int nq = gB * gT * H * gD, nk = gB * gT * KVH * gD, no = gB * gT * H * Dv, nv = gB * gT * KVH * Dv;
    float *q = frand(nq), *k = frand(nk), *v = frand(nv), *R = frand(no);
    float *out = calloc(no, 4), *att = calloc(gB * H * gT * gT, 4);
    float *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nv, 4);
    double *qd = to_double(q, nq), *kd = to_double(k, nk), *vd = to_double(v, nv), *Rd = to_double(R, no);
    double *ref = malloc(8 * no), *in[] = {qd, kd, vd};
    be->attention_forward(out, att, q, k, v, gB, gT, H, KVH, gD, Dv);
    ref_attention(ref, qd, kd, vd, gB, gT, H, KVH, gD);
    check_close(fwd_name, out, ref, no, 1e-5);
    be->attention_backward(dq, dk, dv, R, out, att, q, k, v, gB, gT, H, KVH, gD, Dv);
    double *gq = fd_grad(ref_attn_fn, in, 0, nq, Rd, no), *gk = fd_grad(ref_attn_fn, in, 1, nk, Rd, no);
    double *gv = fd_grad(ref_attn_fn, in, 2, nv, Rd, no);
    double e = fmax(fmax(max_rel_err(dq, gq, nq, 1e-2), max_rel_err(dk, gk, nk, 1e-2)), max_rel_err(dv, gv, nv, 1e-2));
    TEST_RESULT(bwd_name, e <= 1e-4, "max rel err %.3g", e);
    gDv = 0;
    free(q), free(k), free(v), free(R), free(out), free(att), free(dq), free(dk), free(dv);
    free(qd), free(kd), free(vd), free(Rd), free(ref), free(gq), free(gk), free(gv);
}

/* The last n of Tk causal positions against the cached keys: the same rows
 * as full causal attention over the whole sequence. */
static void test_attention_decode(int n, int Tk, int H, int KVH, int Dv, const char *name) {
    int D = gD;
    gDv = Dv;
    size_t nq = (size_t)Tk * H * D, nk = (size_t)Tk * KVH * D, nv = (size_t)Tk * KVH * Dv, no = (size_t)Tk * H * Dv;
    float *q = frand(nq), *k = frand(nk), *v = frand(nv), *out = malloc(sizeof(float) * n * H * Dv);
    double *qd = to_double(q, nq), *kd = to_double(k, nk), *vd = to_double(v, nv), *ref = malloc(sizeof(double) * no);
    ref_attention(ref, qd, kd, vd, 1, Tk, H, KVH, D);
    be->attention_decode(out, q + (size_t)(Tk - n) * H * D, k, v, n, Tk, H, KVH, D, Dv);
    check_close(name, out, ref + (size_t)(Tk - n) * H * Dv, (size_t)n * H * Dv, 1e-5);
    gDv = 0;
    free(q), free(k), free(v), free(out), free(qd), free(kd), free(vd), free(ref);
}

static void ref_swiglu_fn(double *out, double **in) {
    for (int i = 0; i < gN * gC; i++) out[i] = silu_d(in[0][i]) * in[1][i];
}
static void test_swiglu(void) {
    int n = gN * gC;
    float *g = frand(n), *u = frand(n), *R = frand(n), *out = malloc(4 * n), *dg = malloc(4 * n), *du = malloc(4 * n);
    for (int i = 0; i < n; i++) g[i] *= 4; /* exercise the tails of the sigmoid */
    double *gd = to_double(g, n), *ud = to_double(u, n), *Rd = to_double(R, n), *ref = malloc(8 * n), *in[] = {gd, ud};
    be->swiglu_forward(out, g, u, n);
    ref_swiglu_fn(ref, in);
    check_close("swiglu_forward", out, ref, n, 1e-5);
    be->swiglu_backward(dg, du, R, g, u, n);
    double *gg = fd_grad(ref_swiglu_fn, in, 0, n, Rd, n), *gu = fd_grad(ref_swiglu_fn, in, 1, n, Rd, n);
    check_close("swiglu_backward_dgate", dg, gg, n, 1e-4);
    check_close("swiglu_backward_dup", du, gu, n, 1e-4);
    free(g), free(u), free(R), free(out), free(dg), free(du), free(gd), free(ud), free(Rd), free(ref), free(gg), free(gu);
}

/* vec_exp (the CPU ops' vectorised exp) against double exp: at most 2 ulp of
 * the float result over every float step of 2^-10 in [-87.3, 88.3], and its
 * edges: +inf above 88.37, 0 below -87.33, NaN kept */
static void test_vec_exp(void) {
    double worst = 0, at = 0;
    for (float x = -87.3f; x <= 88.3f; x += 1.0f / 1024) {
        double ref = exp((double)x), ulp = nextafterf((float)ref, INFINITY) - (float)ref;
        double e = fabs((double)vec_exp(x) - ref) / ulp;
        if (e > worst) worst = e, at = x;
    }
    TEST_RESULT("vec_exp_within_2_ulp", worst <= 2.0, "%.2f ulp at %.6f", worst, at);
    int edges = isinf(vec_exp(89.0f)) && vec_exp(89.0f) > 0 && vec_exp(-88.0f) == 0.0f && vec_exp(-1e30f) == 0.0f &&
                isinf(vec_exp(INFINITY)) && vec_exp(-INFINITY) == 0.0f && isnan(vec_exp(NAN)) && vec_exp(0.0f) == 1.0f;
    TEST_RESULT("vec_exp_edges", edges, "exp(89) %g, exp(-88) %g, exp(nan) %g, exp(0) %g", vec_exp(89.0f),
                vec_exp(-88.0f), vec_exp(NAN), vec_exp(0.0f));
}

static int32_t g_targets[64];
static void ref_ce_fn(double *out, double **in) {
    double total = 0;
    for (int n = 0; n < gN; n++) {
        const double *row = in[0] + n * gV;
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < gV; i++) mx = fmax(mx, row[i]);
        for (int i = 0; i < gV; i++) s += exp(row[i] - mx);
        if (g_targets[n] >= 0) total += log(s) + mx - row[g_targets[n]];
    }
    out[0] = total;
}
static void test_cross_entropy(void) {
    int N = gN, V = gV;
    float *logits = frand(N * V), *work = malloc(4 * N * V), *losses = malloc(4 * N);
    for (int i = 0; i < N * V; i++) logits[i] *= 5;
    for (int n = 0; n < N; n++) g_targets[n] = (n == 3) ? -1 : (int)((test_rand(&seed) + 1) / 2 * V) % V;
    double *ld = to_double(logits, N * V), *in[] = {ld}, one = 1, total_ref;
    ref_ce_fn(&total_ref, in);
    memcpy(work, logits, 4 * N * V);
    be->cross_entropy(losses, work, g_targets, N, V, 1.0f);
    double total = 0;
    for (int n = 0; n < N; n++) total += losses[n];
    TEST_RESULT("cross_entropy_loss", fabs(total - total_ref) / fabs(total_ref) <= 1e-5, "%g vs %g", total, total_ref);
    TEST_RESULT("cross_entropy_ignores_negative_target", losses[3] == 0.0f, "loss %g", losses[3]);
    double *g = fd_grad(ref_ce_fn, in, 0, N * V, &one, 1);
    check_close("cross_entropy_grad", work, g, N * V, 1e-4);
    free(logits), free(work), free(losses), free(ld), free(g);
}

static void test_embedding(void) {
    int N = gN, C = gC, V = 5; /* few rows: tokens repeat, so accumulation is exercised */
    int32_t tok[64];
    for (int n = 0; n < N; n++) tok[n] = (n * 7) % V;
    float *table = frand(V * C), *out = malloc(4 * N * C), *dout = frand(N * C), *dt = calloc(V * C, 4);
    double *ref = calloc(V * C, 8);
    be->embedding_forward(out, tok, table, N, C, 0, V);
    int ok = 1;
    for (int n = 0; n < N; n++) ok &= !memcmp(out + n * C, table + tok[n] * C, 4 * C);
    TEST_RESULT("embedding_forward", ok, "rows differ");
    be->embedding_backward(dt, tok, dout, N, C, 0, V);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) ref[tok[n] * C + c] += dout[n * C + c];
    check_close("embedding_backward", dt, ref, V * C, 1e-5);
    /* a vocab slice [2, 4): other tokens give zero rows and no gradient */
    float *dslice = calloc(2 * C, 4);
    be->embedding_forward(out, tok, table + 2 * C, N, C, 2, 2);
    ok = 1;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            ok &= out[n * C + c] == ((tok[n] >= 2 && tok[n] < 4) ? table[tok[n] * C + c] : 0.0f);
    TEST_RESULT("embedding_forward_vocab_slice", ok, "rows differ");
    be->embedding_backward(dslice, tok, dout, N, C, 2, 2);
    check_close("embedding_backward_vocab_slice", dslice, ref + 2 * C, 2 * C, 1e-5);
    free(table), free(out), free(dout), free(dt), free(ref), free(dslice);
}

/* Vocab-parallel cross-entropy over 3 slices, combined as the all-reduces
 * would, against the fused single-slice op. */
static void test_vocab_parallel_ce(void) {
    int N = gN, V = 33, parts = 3, Vl = V / parts;
    float *logits = frand(N * V), *fused = malloc(4 * N * V), *lf = malloc(4 * N);
    for (int i = 0; i < N * V; i++) logits[i] *= 5;
    int32_t tg[64];
    for (int n = 0; n < N; n++) tg[n] = (n * 11) % V;
    memcpy(fused, logits, 4 * N * V);
    be->cross_entropy(lf, fused, tg, N, V, 0.5f);
    float *slice[3], mx[64], sm[64], tl[64], part[64], part2[64], losses[64];
    for (int n = 0; n < N; n++) mx[n] = -INFINITY, sm[n] = 0, tl[n] = 0;
    for (int p = 0; p < parts; p++) { /* slice p = columns [p*Vl, (p+1)*Vl) */
        slice[p] = malloc(4 * N * Vl);
        for (int n = 0; n < N; n++) memcpy(slice[p] + n * Vl, logits + n * V + p * Vl, 4 * Vl);
        be->ce_row_max(part, slice[p], N, Vl);
        for (int n = 0; n < N; n++) mx[n] = fmaxf(mx[n], part[n]);
    }
    for (int p = 0; p < parts; p++) {
        be->ce_row_sumexp(part, part2, slice[p], tg, mx, N, Vl, p * Vl);
        for (int n = 0; n < N; n++) sm[n] += part[n], tl[n] += part2[n];
    }
    double worst = 0;
    for (int p = 0; p < parts; p++) {
        be->ce_finish(losses, slice[p], tg, mx, sm, tl, N, Vl, p * Vl, 0.5f);
        for (int n = 0; n < N; n++) {
            worst = fmax(worst, fabs(losses[n] - lf[n]) / fabs(lf[n]));
            for (int i = 0; i < Vl; i++) worst = fmax(worst, fabs(slice[p][n * Vl + i] - fused[n * V + p * Vl + i]));
        }
        free(slice[p]);
    }
    TEST_RESULT("cross_entropy_vocab_parallel", worst <= 1e-5, "max err %.3g", worst);
    free(logits), free(fused), free(lf);
}

static void test_adamw(void) {
    int n = 1000;
    float *p = frand(n), *g = frand(n), *m = calloc(n, 4), *v = calloc(n, 4);
    double *pd = to_double(p, n), *md = calloc(n, 8), *vd = calloc(n, 8);
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (int step = 1; step <= 3; step++) {
        be->adamw(p, g, m, v, n, lr, b1, b2, eps, wd, gs, step, NULL);
        for (int i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            double mh = md[i] / (1 - pow(b1, step)), vh = vd[i] / (1 - pow(b2, step));
            pd[i] -= lr * mh / (sqrt(vh) + eps);
        }
    }
    check_close("adamw_three_steps", p, pd, n, 1e-5);
    free(p), free(g), free(m), free(v), free(pd), free(md), free(vd);
}

static void test_reductions(void) {
    size_t n = 100003;
    float *x = frand(n);
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++) s += x[i], ss += (double)x[i] * x[i];
    TEST_RESULT("sum", fabs(be->sum(x, n) - s) <= 1e-9 * n, "%g vs %g", be->sum(x, n), s);
    TEST_RESULT("sum_squares", fabs(be->sum_squares(x, n) - ss) / ss <= 1e-12, "%g vs %g", be->sum_squares(x, n), ss);
    TEST_RESULT("sum_repeatable", be->sum_squares(x, n) == be->sum_squares(x, n), "differs between calls");
    free(x);
}

/* ---- mixture of experts ---- */

/* Router with the top-k choice held fixed: probs, lse, renormalised chosen
 * weights, and the objective sum R*w + sum A*p + z * sum lse^2 whose
 * gradient moe_route_backward computes. */
static double ref_route(const double *x, const int32_t *idx, const double *R, const double *A, double z, int n,
                        int E, int k, double *probs, double *lse, double *w) {
    double J = 0;
    for (int t = 0; t < n; t++) {
        const double *xt = x + (size_t)t * E;
        double mx = xt[0], sum = 0;
        for (int e = 1; e < E; e++) mx = fmax(mx, xt[e]);
        for (int e = 0; e < E; e++) sum += exp(xt[e] - mx);
        lse[t] = mx + log(sum);
        for (int e = 0; e < E; e++) probs[t * E + e] = exp(xt[e] - lse[t]), J += A[t * E + e] * probs[t * E + e];
        double S = 0;
        for (int j = 0; j < k; j++) S += probs[t * E + idx[t * k + j]];
        for (int j = 0; j < k; j++) w[t * k + j] = probs[t * E + idx[t * k + j]] / S, J += R[t * k + j] * w[t * k + j];
        J += z * lse[t] * lse[t];
    }
    return J;
}

static void test_moe(void) {
    int n = 9, E = 6, k = 2, C = 20;
    float *x = frand((size_t)n * E);
    for (int i = 0; i < n * E; i++) x[i] *= 3; /* well separated: finite differences keep the top-k */
    float *probs = malloc(4ul * n * E), *lse = malloc(4ul * n), *w = malloc(4ul * n * k);
    int32_t *idx = malloc(4ul * n * k);
    be->moe_route_forward(probs, lse, idx, w, x, n, E, k);
    double *xd = to_double(x, (size_t)n * E), *pd = malloc(8ul * n * E), *ld = malloc(8ul * n), *wd = malloc(8ul * n * k);
    int order_ok = 1;
    for (int t = 0; t < n; t++) { /* the k largest, in descending order */
        for (int j = 0; j < k; j++) {
            int rank = 0;
            for (int e = 0; e < E; e++) rank += x[t * E + e] > x[t * E + idx[t * k + j]];
            order_ok &= rank == j;
        }
    }
    TEST_RESULT("moe_route_topk", order_ok, "top-k indices are not the k largest in order");
    float *R = frand((size_t)n * k), *A = frand((size_t)n * E);
    double *Rd = to_double(R, (size_t)n * k), *Ad = to_double(A, (size_t)n * E), z = 0.3;
    ref_route(xd, idx, Rd, Ad, z, n, E, k, pd, ld, wd);
    check_close("moe_route_probs", probs, pd, (size_t)n * E, 1e-6);
    check_close("moe_route_lse", lse, ld, n, 1e-6);
    check_close("moe_route_weights", w, wd, (size_t)n * k, 1e-6);
    float *dl = malloc(4ul * n * E);
    be->moe_route_backward(dl, R, probs, lse, idx, w, A, (float)z, n, E, k, 1, 0); /* a sequence per token: A per token */
    double *fd = malloc(8ul * n * E);
    for (int i = 0; i < n * E; i++) { /* central differences of the objective */
        double h = 1e-6, keep = xd[i];
        xd[i] = keep + h;
        double jp = ref_route(xd, idx, Rd, Ad, z, n, E, k, pd, ld, wd);
        xd[i] = keep - h;
        double jm = ref_route(xd, idx, Rd, Ad, z, n, E, k, pd, ld, wd);
        xd[i] = keep;
        fd[i] = (jp - jm) / (2 * h);
    }
    check_close("moe_route_backward", dl, fd, (size_t)n * E, 1e-4);
    /* permutation and gate-weighted combine, with one dropped selection */
    int rows = n * k - 1;
    int32_t *pos = malloc(4ul * n * k), *src = malloc(4ul * rows);
    for (int i = 0, r = 0; i < n * k; i++) pos[i] = i == 3 ? -1 : (r++ * 7) % rows; /* a scattered order */
    for (int i = 0; i < n * k; i++)
        if (pos[i] >= 0) src[pos[i]] = i / k;
    float *xt = frand((size_t)n * C), *xp = malloc(4ul * rows * C), *y = frand((size_t)rows * C);
    be->gather_rows(xp, xt, src, rows, C);
    int gather_ok = 1;
    for (int r = 0; r < rows; r++) gather_ok &= !memcmp(xp + (size_t)r * C, xt + (size_t)src[r] * C, 4ul * C);
    TEST_RESULT("moe_gather_rows", gather_ok, "rows differ from x[rows[i]]");
    float *out = frand((size_t)n * C);
    double *want = malloc(8ul * n * C);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double acc = out[t * C + c];
            for (int j = 0; j < k; j++)
                if (pos[t * k + j] >= 0) acc += (double)w[t * k + j] * y[(size_t)pos[t * k + j] * C + c];
            want[t * C + c] = acc;
        }
    be->moe_combine(out, y, pos, w, n, k, C, 1);
    check_close("moe_combine_accumulate", out, want, (size_t)n * C, 1e-6);
    float *dout = frand((size_t)n * C), *dy = calloc((size_t)rows * C, 4), *dw = malloc(4ul * n * k);
    be->moe_combine_backward(dy, dw, dout, y, pos, w, n, k, C);
    double *dyd = calloc((size_t)rows * C, 8), *dwd = calloc((size_t)n * k, 8);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int r = pos[t * k + j];
            if (r < 0) continue;
            for (int c = 0; c < C; c++) {
                dyd[(size_t)r * C + c] = (double)w[t * k + j] * dout[t * C + c];
                dwd[t * k + j] += (double)dout[t * C + c] * y[(size_t)r * C + c];
            }
        }
    check_close("moe_combine_backward_dy", dy, dyd, (size_t)rows * C, 1e-6);
    check_close("moe_combine_backward_dw", dw, dwd, (size_t)n * k, 1e-6);
    free(x), free(probs), free(lse), free(w), free(idx), free(xd), free(pd), free(ld), free(wd), free(R), free(A);
    free(Rd), free(Ad), free(dl), free(fd), free(pos), free(src), free(xt), free(xp), free(y), free(out), free(want);
    free(dout), free(dy), free(dw), free(dyd), free(dwd);
}

/* DeepSeek-V3 sigmoid routing, naive: sort groups by the sum of their two
 * best biased scores, keep the best topk_group, sort their experts by biased
 * score and take the first k. */
static const double *g_sort_key;
static int by_key_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    return g_sort_key[i] > g_sort_key[j] ? -1 : g_sort_key[i] < g_sort_key[j] ? 1 : i - j;
}
static void ref_sigmoid_choice(int32_t *idx, const float *x, const float *bias, int E, int k, int G, int TG) {
    double biased[64], gscore[64], pair[64];
    int order[64], gorder[64], eligible[64] = {0};
    for (int e = 0; e < E; e++) biased[e] = (float)(1 / (1 + exp(-(double)x[e]))) + bias[e];
    int per = E / G;
    for (int g = 0; g < G; g++) { /* the two best of the group by sorting it */
        for (int i = 0; i < per; i++) pair[i] = biased[g * per + i], order[i] = i;
        g_sort_key = pair;
        qsort(order, per, sizeof(int), by_key_desc);
        gscore[g] = G > 1 ? pair[order[0]] + pair[order[1]] : 0, gorder[g] = g;
    }
    g_sort_key = gscore;
    qsort(gorder, G, sizeof(int), by_key_desc);
    for (int j = 0; j < (G > 1 ? TG : G); j++)
        for (int i = 0; i < per; i++) eligible[gorder[j] * per + i] = 1;
    int n = 0;
    for (int e = 0; e < E; e++)
        if (eligible[e]) order[n++] = e;
    g_sort_key = biased;
    qsort(order, n, sizeof(int), by_key_desc);
    for (int j = 0; j < k; j++) idx[j] = order[j];
}
/* With the choice fixed: J = sum R*w + sum A * s / sum(s), w the scaled normalised chosen scores. */
static double ref_sigmoid_objective(const double *x, const int32_t *idx, const double *R, const double *A, int n,
                                    int E, int k, double scaling, double *w) {
    double J = 0;
    for (int t = 0; t < n; t++) {
        double s[64], total = 0, chosen = 0;
        for (int e = 0; e < E; e++) s[e] = 1 / (1 + exp(-x[t * E + e])), total += s[e];
        for (int e = 0; e < E; e++) J += A[t * E + e] * s[e] / total;
        for (int j = 0; j < k; j++) chosen += s[idx[t * k + j]];
        for (int j = 0; j < k; j++) w[t * k + j] = s[idx[t * k + j]] / chosen * scaling, J += R[t * k + j] * w[t * k + j];
    }
    return J;
}

static void test_moe_sigmoid(int E, int k, int G, int TG, const char *tag) {
    int n = 11;
    double scaling = 2.5;
    char name[96];
    float *x = frand((size_t)n * E), *bias = frand(E);
    for (int i = 0; i < n * E; i++) x[i] *= 3;
    for (int e = 0; e < E; e++) bias[e] *= 0.3f; /* large enough to reorder some choices */
    float *s = malloc(4ul * n * E), *w = malloc(4ul * n * k);
    int32_t *idx = malloc(4ul * n * k), want[64];
    be->moe_route_sigmoid_forward(s, idx, w, x, bias, n, E, k, G, TG, (float)scaling);
    int same = 1;
    for (int t = 0; t < n; t++) {
        ref_sigmoid_choice(want, x + (size_t)t * E, bias, E, k, G, TG);
        same &= !memcmp(want, idx + (size_t)t * k, sizeof(int32_t) * k);
    }
    snprintf(name, sizeof name, "moe_route_sigmoid_choice_%s", tag);
    TEST_RESULT(name, same, "chosen experts differ from the sorted reference");
    double *xd = to_double(x, (size_t)n * E), *sd = malloc(8ul * n * E), *wd = malloc(8ul * n * k);
    for (int i = 0; i < n * E; i++) sd[i] = 1 / (1 + exp(-xd[i]));
    snprintf(name, sizeof name, "moe_route_sigmoid_scores_%s", tag);
    check_close(name, s, sd, (size_t)n * E, 1e-6);
    float *R = frand((size_t)n * k), *A = frand((size_t)n * E);
    double *Rd = to_double(R, (size_t)n * k), *Ad = to_double(A, (size_t)n * E);
    ref_sigmoid_objective(xd, idx, Rd, Ad, n, E, k, scaling, wd);
    snprintf(name, sizeof name, "moe_route_sigmoid_weights_%s", tag);
    check_close(name, w, wd, (size_t)n * k, 1e-6);
    float *dl = malloc(4ul * n * E);
    double *fd = malloc(8ul * n * E);
    be->moe_route_sigmoid_backward(dl, R, s, idx, w, A, n, E, k, (float)scaling, 1, 0);
    for (int i = 0; i < n * E; i++) {
        double h = 1e-6, keep = xd[i];
        xd[i] = keep + h;
        double jp = ref_sigmoid_objective(xd, idx, Rd, Ad, n, E, k, scaling, wd);
        xd[i] = keep - h;
        double jm = ref_sigmoid_objective(xd, idx, Rd, Ad, n, E, k, scaling, wd);
        xd[i] = keep;
        fd[i] = (jp - jm) / (2 * h);
    }
    snprintf(name, sizeof name, "moe_route_sigmoid_backward_%s", tag);
    check_close(name, dl, fd, (size_t)n * E, 1e-4);
    free(x), free(bias), free(s), free(w), free(idx), free(xd), free(sd), free(wd), free(R), free(A), free(Rd), free(Ad);
    free(dl), free(fd);
}

int main(void) {
    be = backend_get("cpu", "fp32");
    test_matmul();
    test_rmsnorm(24, "");
    test_rmsnorm(75, "_wide");
    test_rope();
    test_attention(4, 2, 8, "attention_forward_gqa", "attention_backward_gqa");
    test_attention(4, 4, 8, "attention_forward_mha", "attention_backward_mha");
    test_attention(4, 1, 8, "attention_forward_mqa", "attention_backward_mqa");
    test_attention(4, 4, 6, "attention_forward_value_dim", "attention_backward_value_dim");
    test_copy_cols();
    test_attention_decode(1, 9, 4, 2, gD, "attention_decode_one_query_gqa");
    test_attention_decode(5, 5, 4, 1, gD, "attention_decode_prefill_mqa");
    test_attention_decode(3, 11, 4, 4, gD, "attention_decode_chunk_mha");
    test_attention_decode(3, 11, 4, 4, gD / 2 + 3, "attention_decode_mla_value_heads");
    test_vec_exp();
    test_swiglu();
    test_cross_entropy();
    test_embedding();
    test_vocab_parallel_ce();
    test_adamw();
    test_reductions();
    test_moe();
    test_moe_sigmoid(16, 3, 4, 2, "groups");
    test_moe_sigmoid(8, 2, 1, 1, "no_groups");
    TEST_EXIT();
}
