/* FP8 (kernels/fp8.h) and the CPU fp8 table's GEMMs (kernels/bf16_table.h,
 * kernels/cpu/bf16.c).
 *
 * 1. The formats: anchor codes of e4m3 and e5m2 (largest, smallest normal
 *    and subnormal, one, NaN, infinity), decoding strictly increasing over
 *    the positive codes, and fp8_bits against a nearest-value search over
 *    every finite code (ties to the even code, saturation to the largest
 *    finite value) on every midpoint between neighbours, one fp32 step
 *    either side of it, and 2^20 random values over the whole range:
 *    bitwise.
 * 2. The scale: 2^k is the largest power of two with amax * 2^k <= max
 *    (within fp32's normal powers of two).
 * 3. The fp8 table's forward, data-gradient and weight-gradient GEMMs,
 *    per-tensor and block scaling, gradients in e4m3 and in e5m2, against a reference built here from the
 *    nearest-value search (its own amax, scale and blocks: 1 x 128 along
 *    the contraction, 128 x 128 weights, 128 x 1 along the tokens for the
 *    weight gradient) and a double-precision GEMM. Stored (bf16) outputs
 *    within 2^-8 of the reference (one bf16 rounding; elements below 1e-3
 *    of the largest are measured against that), the fp32 weight gradient
 *    within 1e-5 (fp32 vs double sums). The same outputs differ from the
 *    unquantised bf16 GEMM by far more than these tolerances (checked), so
 *    skipping or misplacing a quantisation fails. On operands whose blocks
 *    have different magnitudes, block scaling is closer to the exact GEMM
 *    than per-tensor scaling (worst output row). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/fp8.h"
#include "kernels/ops.h"
#include "tests/unit/check.h"

static unsigned long long seed = 5;

/* ---- the reference: a search over the format's finite values ---- */

static float values[2][256]; /* positive finite values of each format, ascending, from code 0 */
static int nvalues[2];

static void build_values(int f) {
    nvalues[f] = 0;
    for (int c = 0; c < 128; c++) {
        float v = fp8_to_float((uint8_t)c, f);
        if (isfinite(v)) values[f][nvalues[f]++] = v;
    }
}

/* the code of the finite value nearest |x|, ties to the even code, saturating */
static uint8_t ref_bits(float x, int f) {
    if (isnan(x)) return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    int best = nvalues[f] - 1;
    if (a < values[f][nvalues[f] - 1]) {
        best = 0;
        for (int c = 1; c < nvalues[f]; c++) {
            double d = fabs(a - values[f][c]), db = fabs(a - values[f][best]);
            if (d < db || (d == db && c % 2 == 0)) best = c;
        }
    }
    return (uint8_t)(sign | best);
}

static float ref_qdq_value(float x, int k, int f) {
    return (float)((double)fp8_to_float(ref_bits((float)((double)x * pow(2, k)), f), f) * pow(2, -k));
}

/* clamped to fp32's normal powers of two, as kernels/fp8.h states */
static int ref_scale_exp(double amax, int f) {
    if (amax == 0) return 0;
    int k = 0;
    while (amax * pow(2, k) > fp8_max(f)) k--;
    while (amax * pow(2, k + 1) <= fp8_max(f)) k++;
    return k > 126 ? 126 : k < -126 ? -126 : k;
}

/* x [rows, cols] through the reference, br x bc blocks */
static void ref_qdq(float *x, int rows, int cols, int br, int bc, int f) {
    for (int r0 = 0; r0 < rows; r0 += br)
        for (int c0 = 0; c0 < cols; c0 += bc) {
            double amax = 0;
            for (int r = r0; r < rows && r < r0 + br; r++)
                for (int c = c0; c < cols && c < c0 + bc; c++) amax = fmax(amax, fabs(x[(size_t)r * cols + c]));
            int k = ref_scale_exp(amax, f);
            for (int r = r0; r < rows && r < r0 + br; r++)
                for (int c = c0; c < cols && c < c0 + bc; c++)
                    x[(size_t)r * cols + c] = ref_qdq_value(x[(size_t)r * cols + c], k, f);
        }
}

/* ---- 1, 2: formats and scales ---- */

static void test_anchors(void) {
    struct { int f; uint8_t code; float value; } a[] = {
        {FP8_E4M3, 0x7e, 448.0f}, {FP8_E4M3, 0x08, 0x1p-6f}, {FP8_E4M3, 0x01, 0x1p-9f}, {FP8_E4M3, 0x38, 1.0f},
        {FP8_E4M3, 0xb8, -1.0f}, {FP8_E4M3, 0x07, 7 * 0x1p-9f}, {FP8_E4M3, 0x77, 240.0f},
        {FP8_E5M2, 0x7b, 57344.0f}, {FP8_E5M2, 0x04, 0x1p-14f}, {FP8_E5M2, 0x01, 0x1p-16f}, {FP8_E5M2, 0x3c, 1.0f},
        {FP8_E5M2, 0x7c, INFINITY}, {FP8_E5M2, 0xfc, -INFINITY}, {FP8_E5M2, 0x3d, 1.25f},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        if (fp8_to_float(a[i].code, a[i].f) != a[i].value) bad++;
        if (isfinite(a[i].value) && fp8_bits(a[i].value, a[i].f) != a[i].code) bad++;
    }
    int nan_ok = isnan(fp8_to_float(0x7f, FP8_E4M3)) && isnan(fp8_to_float(0xff, FP8_E4M3)) &&
                 isnan(fp8_to_float(0x7d, FP8_E5M2)) && isnan(fp8_to_float(0x7f, FP8_E5M2)) &&
                 fp8_bits(NAN, FP8_E4M3) == 0x7f && fp8_bits(NAN, FP8_E5M2) == 0x7f;
    int sat = fp8_bits(1e9f, FP8_E4M3) == 0x7e && fp8_bits(-INFINITY, FP8_E4M3) == 0xfe &&
              fp8_bits(INFINITY, FP8_E5M2) == 0x7b && fp8_bits(-1e30f, FP8_E5M2) == 0xfb &&
              fp8_bits(464.0f, FP8_E4M3) == 0x7e && fp8_bits(464.01f, FP8_E4M3) == 0x7e;
    TEST_RESULT("fp8_anchor_codes", !bad && nan_ok && sat, "%d anchors wrong, nan %d, saturation %d", bad, nan_ok, sat);
    /* e4m3: 126 positive finite non-zero values + zero; e5m2: 123 + zero */
    int mono = nvalues[FP8_E4M3] == 127 && nvalues[FP8_E5M2] == 124;
    for (int f = 0; f < 2; f++)
        for (int c = 1; c < nvalues[f]; c++) mono &= values[f][c] > values[f][c - 1] && values[f][c - 1] >= 0;
    TEST_RESULT("fp8_values_increase", mono, "counts %d %d or order broken", nvalues[0], nvalues[1]);
}

static int compare_bits(float x, int f, int *bad) {
    uint8_t got = fp8_bits(x, f), want = ref_bits(x, f);
    if (got != want && *bad < 5)
        printf("  %s %a: got 0x%02x want 0x%02x\n", f ? "e5m2" : "e4m3", x, got, want);
    *bad += got != want;
    return 1;
}

static void test_rounding(int f, const char *name) {
    int bad = 0, n = 0;
    for (int c = 0; c + 1 < nvalues[f]; c++)
        for (int s = -1; s <= 1; s += 2) {
            float mid = (float)(((double)values[f][c] + values[f][c + 1]) / 2); /* exact: a few bits */
            float probes[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), values[f][c]};
            for (int i = 0; i < 4; i++) n += compare_bits(s * probes[i], f, &bad);
        }
    float top = values[f][nvalues[f] - 1], past = (float)((double)top * 1.0625);
    n += compare_bits(past, f, &bad) + compare_bits(-past, f, &bad) + compare_bits(0x1p-30f, f, &bad);
    for (int i = 0; i < (1 << 20); i++) {
        /* log-uniform magnitude from far below the smallest subnormal to past the largest */
        double e = (test_rand(&seed) + 1) / 2 * (f == FP8_E4M3 ? 26 : 38) - (f == FP8_E4M3 ? 14 : 21);
        n += compare_bits((float)(test_rand(&seed) < 0 ? -1 : 1) * (float)pow(2, e), f, &bad);
    }
    TEST_RESULT(name, bad == 0, "%d of %d values round differently from the nearest-value search", bad, n);
}

static void test_scale_exp(void) {
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        float amax = (float)pow(2, test_rand(&seed) * 60) * (float)fabs(test_rand(&seed) + 1.5);
        for (int f = 0; f < 2; f++) bad += fp8_scale_exp(amax, f) != ref_scale_exp(amax, f);
    }
    float edges[] = {448.0f, 449.0f, 447.0f, 57344.0f, 224.0f, 0x1p-126f, 0x1p-149f, 3e38f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        for (int f = 0; f < 2; f++) bad += fp8_scale_exp(edges[i], f) != ref_scale_exp(edges[i], f);
    TEST_RESULT("fp8_scale_exp", bad == 0 && fp8_scale_exp(0, 0) == 0 && fp8_scale_exp(INFINITY, 0) == 0,
                "%d amax values with the wrong power of two", bad);
    /* a block of tiny values (clamped scale) still quantises to their nearest codes, not to zero */
    int lost = 0;
    for (int f = 0; f < 2; f++)
        for (float x = 0x1p-125f; x < 0x1p-110f; x *= 1.37f) {
            int k = fp8_scale_exp(x, f);
            lost += fp8_qdq(x, k, f) != ref_qdq_value(x, k, f) || fp8_qdq(x, k, f) == 0.0f;
        }
    TEST_RESULT("fp8_tiny_blocks_survive", lost == 0, "%d tiny values lost or rounded wrongly", lost);
}

/* ---- 3: the table's GEMMs ---- */

/* random bf16 values whose rows (2^0 .. 2^-16) and 128-column blocks (2^0 .. 2^4) differ in magnitude: the
 * smallest rows fall below e4m3's normal range under one scale per tensor */
static float *operand(int rows, int cols) {
    float *x = malloc(sizeof(float) * rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            x[(size_t)r * cols + c] = bf16_round(test_rand(&seed) * ldexpf(1.0f, 2 * ((c / 128) % 3) - 4 * (r % 5)));
    return x;
}

static float *pack(const float *x, size_t n) {
    uint16_t *b = malloc(sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++) b[i] = bf16_bits(x[i]);
    return (float *)b;
}
static float *unpack(const float *p, size_t n) {
    float *y = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) y[i] = bf16_to_float(((const uint16_t *)p)[i]);
    return y;
}
static float *dup(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * n);
    memcpy(y, x, sizeof(float) * n);
    return y;
}

/* out[R, S] = a[R, J] (row-major) times b: b[S, J] when bt, else b[J, S]; transposing a when at (a[J, R]) */
static double *gemm_ref(const float *a, const float *b, int R, int S, int J, int at, int bt) {
    double *o = calloc((size_t)R * S, sizeof(double));
    for (int r = 0; r < R; r++)
        for (int s = 0; s < S; s++) {
            double acc = 0;
            for (int j = 0; j < J; j++)
                acc += (double)(at ? a[(size_t)j * R + r] : a[(size_t)r * J + j]) *
                       (bt ? b[(size_t)s * J + j] : b[(size_t)j * S + s]);
            o[(size_t)r * S + s] = acc;
        }
    return o;
}

/* largest |got - want| over max(|want|, 1e-3 max|want|) */
static double err(const float *got, const double *want, size_t n) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(want[i]));
    return max_rel_err(got, want, n, 1e-3 * mx);
}
/* the worst row's ||got - want|| / ||want|| */
static double worst_row(const float *got, const double *want, int rows, int cols) {
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double num = 0, den = 0;
        for (int c = 0; c < cols; c++) {
            double d = got[(size_t)r * cols + c] - want[(size_t)r * cols + c];
            num += d * d, den += want[(size_t)r * cols + c] * want[(size_t)r * cols + c];
        }
        worst = fmax(worst, sqrt(num / den));
    }
    return worst;
}

static void test_gemms(const struct backend *fp8, struct fp8_recipe sc, const char *tag) {
    const int N = 160, K = 272, M = 200, blk = sc.scaling == FP8_SCALING_BLOCK, gf = sc.grad_e5m2 ? FP8_E5M2 : FP8_E4M3;
    float *x = operand(N, K), *w = operand(M, K), *dout = operand(N, M);
    float *xb = pack(x, (size_t)N * K), *wb = pack(w, (size_t)M * K), *db = pack(dout, (size_t)N * M);
    /* the reference operands */
    float *xq = dup(x, (size_t)N * K), *wq = dup(w, (size_t)M * K), *dq = dup(dout, (size_t)N * M);
    float *xq_t = dup(x, (size_t)N * K), *dq_t = dup(dout, (size_t)N * M);
    ref_qdq(xq, N, K, blk ? 1 : N, blk ? 128 : K, FP8_E4M3);
    ref_qdq(wq, M, K, blk ? 128 : M, blk ? 128 : K, FP8_E4M3);
    ref_qdq(dq, N, M, blk ? 1 : N, blk ? 128 : M, gf);
    ref_qdq(xq_t, N, K, blk ? 128 : N, blk ? 1 : K, FP8_E4M3);
    ref_qdq(dq_t, N, M, blk ? 128 : N, blk ? 1 : M, gf);
    double *out_ref = gemm_ref(xq, wq, N, M, K, 0, 1);   /* x @ w^T */
    double *dx_ref = gemm_ref(dq, wq, N, K, M, 0, 0);    /* dout @ w */
    double *dw_ref = gemm_ref(dq_t, xq_t, M, K, N, 1, 0); /* dout^T @ x */
    double *out_exact = gemm_ref(x, w, N, M, K, 0, 1);
    char name[96];

    float *out = fp8->alloc(sizeof(uint16_t) * N * M);
    fp8->fp8_matmul_forward(out, xb, wb, N, K, M, 0, sc);
    float *o = unpack(out, (size_t)N * M);
    float *plain = fp8->alloc(sizeof(uint16_t) * N * M); /* the bf16 GEMM, unquantised */
    fp8->matmul_forward(plain, xb, wb, N, K, M, 0);
    float *p = unpack(plain, (size_t)N * M);
    double e = err(o, out_ref, (size_t)N * M), e_plain = err(p, out_ref, (size_t)N * M);
    snprintf(name, sizeof name, "fp8_%s_forward", tag);
    TEST_RESULT(name, e <= 0x1p-8 && e_plain > 0.05, "error %.3g against the reference (tol 2^-8); unquantised %.3g",
                e, e_plain);
    double vs_exact = worst_row(o, out_exact, N, M);

    float *dx = fp8->alloc(sizeof(uint16_t) * N * K), *dw = fp8->alloc(sizeof(float) * M * K);
    fp8->fp8_matmul_backward(dx, dw, db, xb, wb, N, K, M, 0, sc);
    float *g = unpack(dx, (size_t)N * K), *gw = malloc(sizeof(float) * M * K);
    fp8->to_host(gw, dw, sizeof(float) * M * K);
    snprintf(name, sizeof name, "fp8_%s_dgrad", tag);
    e = err(g, dx_ref, (size_t)N * K);
    TEST_RESULT(name, e <= 0x1p-8, "error %.3g (tol 2^-8)", e);
    snprintf(name, sizeof name, "fp8_%s_wgrad", tag);
    e = err(gw, dw_ref, (size_t)M * K);
    TEST_RESULT(name, e <= 1e-4, "error %.3g (tol 1e-4)", e);

    /* dw accumulates onto what is there; dx accumulates when asked */
    fp8->fp8_matmul_backward(dx, dw, db, xb, wb, N, K, M, 1, sc);
    float *g2 = unpack(dx, (size_t)N * K), *gw2 = malloc(sizeof(float) * M * K);
    fp8->to_host(gw2, dw, sizeof(float) * M * K);
    double *twice = malloc(sizeof(double) * M * K), *twice_x = malloc(sizeof(double) * N * K);
    for (size_t i = 0; i < (size_t)M * K; i++) twice[i] = 2 * dw_ref[i];
    for (size_t i = 0; i < (size_t)N * K; i++) twice_x[i] = 2 * (double)g[i];
    snprintf(name, sizeof name, "fp8_%s_accumulates", tag);
    double ea = err(gw2, twice, (size_t)M * K), ex = err(g2, twice_x, (size_t)N * K);
    TEST_RESULT(name, ea <= 1e-4 && ex <= 0x1p-8, "dw %.3g, dx %.3g", ea, ex);

    static double tensor_vs_exact;
    if (!blk) tensor_vs_exact = vs_exact;
    else if (!sc.grad_e5m2) /* the forward pass: the gradients' format does not enter */
        TEST_RESULT("fp8_block_closer_than_tensor", vs_exact < tensor_vs_exact,
                    "worst row: block scaling %.3g vs per-tensor %.3g from the exact GEMM", vs_exact, tensor_vs_exact);
    if (!sc.grad_e5m2) printf("  %s scaling: worst output row %.3g from the exact GEMM\n", tag, vs_exact);
    fp8->free(out), fp8->free(plain), fp8->free(dx), fp8->free(dw);
    free(x), free(w), free(dout), free(xb), free(wb), free(db), free(xq), free(wq), free(dq), free(xq_t), free(dq_t);
    free(out_ref), free(dx_ref), free(dw_ref), free(out_exact), free(o), free(p), free(g), free(gw), free(g2), free(gw2);
    free(twice), free(twice_x);
}

/* x through one fixed exponent k (delayed scaling), or its own amax's (k = FP8_SCALE_CURRENT) */
static void ref_qdq_fixed(float *x, size_t n, int k, int f) {
    if (k == FP8_SCALE_CURRENT) {
        ref_qdq(x, 1, (int)n, 1, (int)n, f);
        return;
    }
    for (size_t i = 0; i < n; i++) x[i] = ref_qdq_value(x[i], k, f);
}

static float amax_of(const float *x, size_t n) {
    float a = 0;
    for (size_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

/* Delayed scaling: each operand through the exponent its history gave (one
 * with more headroom than its amax needs, one that saturates its largest
 * values, one not yet known: its current amax's), against the reference
 * quantisation with those exponents; the current amaxes recorded exactly,
 * the largest over calls kept; a NaN recorded as NaN and passed through. */
static void test_delayed(const struct backend *fp8, int grad_e5m2) {
    const int N = 96, K = 144, M = 80, gf = grad_e5m2 ? FP8_E5M2 : FP8_E4M3;
    float *x = operand(N, K), *w = operand(M, K), *dout = operand(N, M);
    float *xb = pack(x, (size_t)N * K), *wb = pack(w, (size_t)M * K), *db = pack(dout, (size_t)N * M);
    float ax = amax_of(x, (size_t)N * K), aw = amax_of(w, (size_t)M * K), ag = amax_of(dout, (size_t)N * M);
    struct fp8_recipe sc = {.scaling = FP8_SCALING_DELAYED, .grad_e5m2 = grad_e5m2};
    sc.scale_exp[FP8_INPUT] = ref_scale_exp(ax, FP8_E4M3) - 3;
    sc.scale_exp[FP8_WEIGHT] = ref_scale_exp(aw, FP8_E4M3) + 2;
    sc.scale_exp[FP8_GRAD] = FP8_SCALE_CURRENT;
    sc.amax = fp8->alloc(sizeof(float) * FP8_OPERANDS);
    float *xq = dup(x, (size_t)N * K), *wq = dup(w, (size_t)M * K), *dq = dup(dout, (size_t)N * M);
    ref_qdq_fixed(xq, (size_t)N * K, sc.scale_exp[FP8_INPUT], FP8_E4M3);
    ref_qdq_fixed(wq, (size_t)M * K, sc.scale_exp[FP8_WEIGHT], FP8_E4M3);
    ref_qdq_fixed(dq, (size_t)N * M, sc.scale_exp[FP8_GRAD], gf);
    double *out_ref = gemm_ref(xq, wq, N, M, K, 0, 1), *dx_ref = gemm_ref(dq, wq, N, K, M, 0, 0);
    double *dw_ref = gemm_ref(dq, xq, M, K, N, 1, 0);
    const char *tag = grad_e5m2 ? "_e5m2" : "";
    char name[96];

    float *out = fp8->alloc(sizeof(uint16_t) * N * M), rec[FP8_OPERANDS];
    fp8->fp8_matmul_forward(out, xb, wb, N, K, M, 0, sc);
    float *o = unpack(out, (size_t)N * M);
    double e = err(o, out_ref, (size_t)N * M);
    fp8->to_host(rec, sc.amax, sizeof rec);
    snprintf(name, sizeof name, "fp8_delayed%s_forward", tag);
    TEST_RESULT(name, e <= 0x1p-8, "error %.3g against the reference with the given exponents (tol 2^-8)", e);
    snprintf(name, sizeof name, "fp8_delayed%s_forward_records_amax", tag);
    TEST_RESULT(name, rec[0] == ax && rec[1] == aw && rec[2] == 0, "recorded %g %g %g, amaxes %g %g (and 0)", rec[0],
                rec[1], rec[2], ax, aw);
    /* the saturating weight exponent is really used: current scaling differs */
    float *cur = fp8->alloc(sizeof(uint16_t) * N * M);
    fp8->fp8_matmul_forward(cur, xb, wb, N, K, M, 0, (struct fp8_recipe){.scaling = FP8_SCALING_TENSOR});
    float *c = unpack(cur, (size_t)N * M);
    snprintf(name, sizeof name, "fp8_delayed%s_differs_from_current", tag);
    TEST_RESULT(name, err(c, out_ref, (size_t)N * M) > 4 * e, "current scaling %.3g, delayed %.3g from the delayed "
                "reference", err(c, out_ref, (size_t)N * M), e);

    float *dx = fp8->alloc(sizeof(uint16_t) * N * K), *dw = fp8->alloc(sizeof(float) * M * K);
    fp8->fp8_matmul_backward(dx, dw, db, xb, wb, N, K, M, 0, sc);
    float *g = unpack(dx, (size_t)N * K), *gw = malloc(sizeof(float) * M * K);
    fp8->to_host(gw, dw, sizeof(float) * M * K);
    fp8->to_host(rec, sc.amax, sizeof rec);
    double ed = err(g, dx_ref, (size_t)N * K), ew = err(gw, dw_ref, (size_t)M * K);
    snprintf(name, sizeof name, "fp8_delayed%s_backward", tag);
    TEST_RESULT(name, ed <= 0x1p-8 && ew <= 1e-4, "dgrad %.3g (tol 2^-8), wgrad %.3g (tol 1e-4)", ed, ew);
    snprintf(name, sizeof name, "fp8_delayed%s_backward_records_amax", tag);
    TEST_RESULT(name, rec[0] == ax && rec[1] == aw && rec[2] == ag, "recorded %g %g %g, amaxes %g %g %g", rec[0],
                rec[1], rec[2], ax, aw, ag);

    /* a NaN in the input: recorded as NaN, and it reaches the output */
    x[7] = NAN;
    float *xn = pack(x, (size_t)N * K);
    fp8->fp8_matmul_forward(out, xn, wb, N, K, M, 0, sc);
    fp8->to_host(rec, sc.amax, sizeof rec);
    float *on = unpack(out, (size_t)N * M);
    snprintf(name, sizeof name, "fp8_delayed%s_nan_recorded_and_passed", tag);
    TEST_RESULT(name, isnan(rec[0]) && isnan(on[0]) && !isnan(on[M]), "record %g, row 0 %g, row 1 %g", rec[0], on[0],
                on[M]);
    fp8->free(out), fp8->free(cur), fp8->free(dx), fp8->free(dw), fp8->free(sc.amax);
    free(x), free(w), free(dout), free(xb), free(wb), free(db), free(xn), free(xq), free(wq), free(dq), free(o),
        free(c), free(g), free(gw), free(on), free(out_ref), free(dx_ref), free(dw_ref);
}

/* A block holding a NaN passes through, so the loss sees it. */
static void test_nan_passes(const struct backend *fp8) {
    int N = 4, K = 8, M = 3;
    float x[32], w[24];
    for (int i = 0; i < 32; i++) x[i] = 0.5f;
    for (int i = 0; i < 24; i++) w[i] = 0.25f;
    x[5] = NAN;
    float *xb = pack(x, 32), *wb = pack(w, 24), *out = fp8->alloc(sizeof(uint16_t) * N * M);
    fp8->fp8_matmul_forward(out, xb, wb, N, K, M, 0, (struct fp8_recipe){.scaling = FP8_SCALING_TENSOR, .grad_e5m2 = 0});
    float *o = unpack(out, (size_t)N * M);
    TEST_RESULT("fp8_nan_reaches_output", isnan(o[0]) && o[3] == 1.0f, "row 0 %g, row 1 %g", o[0], o[3]);
    fp8->free(out), free(xb), free(wb), free(o);
}

/* Input groups (fp8_recipe.input_group): the second GEMM of a group on the
 * same x reuses the first one's codes: bitwise what casting again gives
 * (forward and weight gradient); x rewritten in between shows the codes
 * really are reused (the group's contract: nothing changes x inside it),
 * and a new group, or no group, casts again. */
static void test_input_groups(const struct backend *fp8, enum fp8_scaling scaling, const char *tag) {
    const int N = 64, K = 256, M = 48;
    float *x = operand(N, K), *w1 = operand(M, K), *w2 = operand(M, K), *dout = operand(N, M);
    float *xb = pack(x, (size_t)N * K), *w1b = pack(w1, (size_t)M * K), *w2b = pack(w2, (size_t)M * K);
    float *db = pack(dout, (size_t)N * M);
    struct fp8_recipe plain = {.scaling = scaling}, g7 = {.scaling = scaling, .input_group = 7};
    struct fp8_recipe g8 = {.scaling = scaling, .input_group = 8}, g9 = {.scaling = scaling, .input_group = 9};
    size_t no = (size_t)N * M, nw = (size_t)M * K;
    float *a = fp8->alloc(2 * no), *b = fp8->alloc(2 * no), *dwa = fp8->alloc(4 * nw), *dwb = fp8->alloc(4 * nw);
    char name[96];
    fp8->fp8_matmul_forward(a, xb, w2b, N, K, M, 0, plain);
    fp8->fp8_matmul_forward(b, xb, w1b, N, K, M, 0, g7);
    fp8->fp8_matmul_forward(b, xb, w2b, N, K, M, 0, g7); /* reuses x's codes */
    int same = !memcmp(a, b, 2 * no);
    /* x halved in place: the same group still multiplies the old codes, another group the new ones */
    for (size_t i = 0; i < (size_t)N * K; i++) x[i] *= 0.5f;
    float *xh = pack(x, (size_t)N * K);
    memcpy(xb, xh, 2 * (size_t)N * K);
    fp8->fp8_matmul_forward(b, xb, w2b, N, K, M, 0, g7);
    int reused = !memcmp(a, b, 2 * no);
    fp8->fp8_matmul_forward(b, xb, w2b, N, K, M, 0, g8);
    int recast = memcmp(a, b, 2 * no) != 0;
    fp8->fp8_matmul_forward(a, xb, w2b, N, K, M, 0, plain);
    recast &= !memcmp(a, b, 2 * no);
    /* the weight gradient's transposed input codes */
    fp8->zero(dwa, 4 * nw), fp8->zero(dwb, 4 * nw);
    fp8->fp8_matmul_backward(NULL, dwa, db, xb, w2b, N, K, M, 0, plain);
    fp8->fp8_matmul_backward(NULL, dwb, db, xb, w1b, N, K, M, 0, g9);
    fp8->zero(dwb, 4 * nw);
    fp8->fp8_matmul_backward(NULL, dwb, db, xb, w2b, N, K, M, 0, g9); /* reuses them */
    same &= !memcmp(dwa, dwb, 4 * nw);
    snprintf(name, sizeof name, "fp8_input_group_same_numbers_%s", tag);
    TEST_RESULT(name, same, "a grouped GEMM differs from casting its input again");
    snprintf(name, sizeof name, "fp8_input_group_reuses_codes_%s", tag);
    TEST_RESULT(name, reused && recast, "reused %d (want 1), recast in a new group %d (want 1)", reused, recast);
    fp8->free(a), fp8->free(b), fp8->free(dwa), fp8->free(dwb);
    free(x), free(w1), free(w2), free(dout), free(xb), free(w1b), free(w2b), free(db), free(xh);
}

int main(void) {
    build_values(FP8_E4M3);
    build_values(FP8_E5M2);
    test_anchors();
    test_rounding(FP8_E4M3, "fp8_e4m3_rounding_bitwise");
    test_rounding(FP8_E5M2, "fp8_e5m2_rounding_bitwise");
    test_scale_exp();
    const struct backend *fp8 = backend_get("cpu", "fp8");
    TEST_RESULT("fp8_cpu_table", fp8 && fp8->precision == PRECISION_FP8 && fp8->act_bytes == 2 &&
                                     fp8->fp8_matmul_forward && !backend_get("cpu", "bf16")->fp8_matmul_forward,
                "backend_get(cpu, fp8) is not a 2-byte fp8 table");
    if (!fp8) TEST_EXIT();
    test_gemms(fp8, (struct fp8_recipe){.scaling = FP8_SCALING_TENSOR, .grad_e5m2 = 0}, "tensor");
    test_gemms(fp8, (struct fp8_recipe){.scaling = FP8_SCALING_BLOCK, .grad_e5m2 = 0}, "block");
    test_gemms(fp8, (struct fp8_recipe){.scaling = FP8_SCALING_TENSOR, .grad_e5m2 = 1}, "tensor_e5m2");
    test_gemms(fp8, (struct fp8_recipe){.scaling = FP8_SCALING_BLOCK, .grad_e5m2 = 1}, "block_e5m2");
    test_delayed(fp8, 0);
    test_delayed(fp8, 1);
    test_nan_passes(fp8);
    test_input_groups(fp8, FP8_SCALING_TENSOR, "tensor");
    test_input_groups(fp8, FP8_SCALING_BLOCK, "block");
    TEST_EXIT();
}
