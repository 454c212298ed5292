/* The FP8 cast kernels (kernels/cuda/fp8_cast.cuh, the source the GPU
 * build compiles) on the CPU under tests/unit/cuda_emulation.h: the amax of
 * a bf16 tensor, and its codes row-major and transposed (through the
 * shared-memory tile, rows padded to a multiple of 16 with zero codes),
 * bitwise against kernels/fp8.h's host functions, for
 * both formats, shapes that do and do not fill the 32 x 32 tiles, values
 * spanning many binades, a tensor holding an infinity (its inverse
 * scale is NaN), delayed scaling's given exponents (one that saturates the
 * largest values) and its amax record (a non-finite amax sticks as NaN).
 * Block scaling's casts likewise: 1 x 128 blocks along the rows, 128 x 1
 * blocks along the columns written transposed (rows padded to 128 with
 * zero codes), 128 x 128 blocks row-major and transposed; each block's
 * codes and inverse scale bitwise against the host's, at the index
 * cuBLASLt's VEC128_32F / BLK128x128_32F layouts read it from, a block
 * holding an infinity (its scale NaN, its neighbours untouched), blocks
 * of very different magnitudes, aligned and unaligned buffers. */
#include <algorithm>

#include "tests/unit/cuda_emulation.h"

extern "C" {
#include "kernels/bf16.h"
}
#include "kernels/cuda/fp8_cast.cuh"

static int failures;
static unsigned long long seed = 3;
static float rnd() {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static void result(int ok, const char *what, const char *tag, const char *why) {
    printf("%s fp8_cast_emulated_%s_%s%s%s\n", ok ? "PASS" : "FAIL", what, tag, ok ? "" : ": ", ok ? "" : why);
    if (!ok) failures++;
}

/* misalign: the tensor one element and its codes one byte off their
 * 16-byte boundaries (the kernels' scalar loops; aligned ones take eight
 * elements a step and write transposed codes four at once, the rest scalar) */
static void run_case(int rows, int cols, int format, int with_inf, int k_shift, const char *tag, int misalign = 0) {
    size_t n = (size_t)rows * cols;
    std::vector<uint16_t> xs(n + 8);
    uint16_t *xp = xs.data() + (misalign ? 1 : 0);
    std::vector<uint16_t> x(n);
    for (size_t i = 0; i < n; i++) x[i] = bf16_bits(ldexpf(rnd(), (int)(i % 23) - 11)); /* 2^-11 .. 2^11 */
    if (with_inf) x[n / 2] = 0x7f80; /* +inf */
    /* host reference: amax by value, the scale exponent, the codes */
    float amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(bf16_to_float(x[i])));
    int k = fp8_scale_exp(std::isfinite(amax) ? amax : 0.0f, format);
    /* delayed scaling: an exponent k_shift binades off the current one (k_fixed), else the current one */
    int k_fixed = k_shift ? k + k_shift : FP8_SCALE_CURRENT;
    k += k_shift;
    /* the transposed codes' rows padded to a multiple of 16 with zero codes (fp8_gemm.cu's wgrad) */
    int ld = (rows + 15) / 16 * 16;
    std::vector<uint8_t> want(n), want_t((size_t)cols * ld, 0);
    for (size_t i = 0; i < n; i++) {
        want[i] = fp8_bits(bf16_to_float(x[i]) * fp8_pow2(k), format);
        want_t[(i % cols) * ld + i / cols] = want[i];
    }

    std::copy(x.begin(), x.end(), xp);
    unsigned dev_amax = 0;
    emu_launch(dim3_{3, 1, 1}, dim3_{64, 1, 1}, [&]() { amax_bf16_k(&dev_amax, xp, n); });
    result(__uint_as_float(dev_amax) == amax || (with_inf && std::isinf(__uint_as_float(dev_amax))), "amax", tag,
           "differs from the host's");
    std::vector<uint8_t> qs(n + 16, 0xaa), qts((size_t)cols * ld + 16, 0xaa);
    uint8_t *qp = qs.data() + (misalign ? 1 : 0), *qtp = qts.data() + (misalign ? 1 : 0);
    float inv = 0, inv_t = 0;
    emu_launch(dim3_{2, 1, 1}, dim3_{64, 1, 1}, [&]() { cast_k(qp, &inv, xp, n, &dev_amax, format, k_fixed); });
    std::vector<uint8_t> q(qp, qp + n);
    dim3_ tiles{(unsigned)(rows + TT - 1) / TT, (unsigned)(cols + TT - 1) / TT, 1};
    emu_launch(tiles, dim3_{32, 8, 1},
               [&]() { cast_t_k(qtp, NULL, &inv_t, xp, rows, cols, ld, &dev_amax, format, k_fixed); });
    std::vector<uint8_t> qt(qtp, qtp + (size_t)cols * ld);
    /* both layouts from one launch (the output gradient's dgrad and wgrad codes) */
    std::vector<uint8_t> qs2(n + 16, 0xaa), qts2((size_t)cols * ld + 16, 0xaa);
    uint8_t *qp2 = qs2.data() + (misalign ? 1 : 0), *qtp2 = qts2.data() + (misalign ? 1 : 0);
    float inv_b = 0;
    emu_launch(tiles, dim3_{32, 8, 1},
               [&]() { cast_t_k(qtp2, qp2, &inv_b, xp, rows, cols, ld, &dev_amax, format, k_fixed); });
    result(std::vector<uint8_t>(qp2, qp2 + n) == want && std::vector<uint8_t>(qtp2, qtp2 + (size_t)cols * ld) == want_t &&
               (inv_b == inv_t || (std::isnan(inv_b) && std::isnan(inv_t))),
           "codes_both_layouts", tag, "not bitwise the host's in one layout or the other");
    result(q == want, "codes", tag, "not bitwise the host's");
    result(qt == want_t, "codes_transposed", tag, "not bitwise the host's, transposed (zero codes in the padding)");
    int inv_ok = with_inf ? std::isnan(inv) && std::isnan(inv_t) : inv == fp8_pow2(-k) && inv_t == inv;
    result(inv_ok, "inverse_scale", tag, with_inf ? "not NaN for a tensor holding an infinity" : "not 2^-k");
}

/* Speculative current scaling (fp8_spec): pass 1 with a site's last
 * exponent, spec_finish_k, pass 2; whatever the guess (right, too large:
 * saturating, too small), the codes in both layouts and the inverse scale
 * are current scaling's bitwise, the amax taken in pass 1 is the tensor's,
 * the site keeps this tensor's exponent, redo says whether the guess
 * missed, and a right guess leaves pass 2 writing nothing. */
static void spec_case(int rows, int cols, int format, int with_inf, const char *tag, int misalign = 0) {
    size_t n = (size_t)rows * cols;
    std::vector<uint16_t> xs(n + 8);
    uint16_t *xp = xs.data() + (misalign ? 1 : 0);
    for (size_t i = 0; i < n; i++) xp[i] = bf16_bits(ldexpf(rnd(), (int)(i % 19) - 9));
    if (with_inf) xp[n / 3] = 0xff80; /* -inf */
    float amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(bf16_to_float(xp[i])));
    int fin = std::isfinite(amax), k = fp8_scale_exp(fin ? amax : 0.0f, format), ld = (rows + 15) / 16 * 16;
    std::vector<uint8_t> want(n), want_t((size_t)cols * ld, 0);
    for (size_t i = 0; i < n; i++) {
        want[i] = fp8_bits(bf16_to_float(xp[i]) * fp8_pow2(k), format);
        want_t[(i % cols) * ld + i / cols] = want[i];
    }
    const int offs[] = {0, 2, -3};
    for (int layout = 0; layout < 2; layout++)
        for (int off : offs) {
            struct fp8_spec sp = {k + off, 7};
            unsigned acc = 0;
            float inv = 0;
            std::vector<uint8_t> qs(n + 16, 0xaa), qts((size_t)cols * ld + 16, 0xaa);
            uint8_t *qp = qs.data() + (misalign ? 1 : 0), *qtp = qts.data() + (misalign ? 1 : 0);
            dim3_ tiles{(unsigned)(rows + TT - 1) / TT, (unsigned)(cols + TT - 1) / TT, 1};
            auto pass = [&](unsigned *a) {
                if (layout == 0)
                    emu_launch(dim3_{2, 1, 1}, dim3_{64, 1, 1},
                               [&]() { cast_k(qp, &inv, xp, n, NULL, format, FP8_SCALE_CURRENT, &sp, a); });
                else
                    emu_launch(tiles, dim3_{32, 8, 1}, [&]() {
                        cast_t_k(qtp, qp, &inv, xp, rows, cols, ld, NULL, format, FP8_SCALE_CURRENT, &sp, a);
                    });
            };
            pass(&acc);
            emu_launch(dim3_{1, 1, 1}, dim3_{32, 1, 1}, [&]() { spec_finish_k(&sp, &inv, &acc, format); });
            int skipped = 1;
            if (!sp.redo) { /* pass 2 must write nothing: poison the codes, which pass 1 made right */
                std::fill(qs.begin(), qs.end(), 0x55), std::fill(qts.begin(), qts.end(), 0x55);
                pass(NULL);
                skipped = std::count(qs.begin(), qs.end(), 0x55) == (long)qs.size() &&
                          (layout == 0 || std::count(qts.begin(), qts.end(), 0x55) == (long)qts.size());
                pass(&acc); /* the codes again, for the comparison below (acc already holds the amax) */
            } else {
                pass(NULL);
            }
            char name[96];
            snprintf(name, sizeof name, "%s_%s_guess%+d", tag, layout ? "both_layouts" : "rows", off);
            int codes_ok = std::vector<uint8_t>(qp, qp + n) == want &&
                           (layout == 0 || std::vector<uint8_t>(qtp, qtp + (size_t)cols * ld) == want_t);
            int inv_ok = fin ? inv == fp8_pow2(-k) : std::isnan(inv);
            int amax_ok = __uint_as_float(acc) == amax || (!fin && std::isinf(__uint_as_float(acc)));
            result(codes_ok && inv_ok, "spec_codes", name, "codes or inverse scale not current scaling's bitwise");
            result(amax_ok && sp.k == k && sp.redo == (off != 0), "spec_state", name,
                   "amax, the kept exponent or redo wrong");
            if (!off) result(skipped, "spec_pass2_skips", name, "pass 2 wrote codes after a right guess");
        }
}

/* the delayed-scaling record: the max of the amaxes folded in, NaN for a
 * non-finite one, and NaN stays (the GPU launches it with one thread; the
 * emulator runs whole warps: 32 identical atomic maxima, the same result) */
static void record_case() {
    float rec = 0.0f;
    unsigned rec_bits = 0, a;
    float amaxes[] = {0.5f, 3.0f, 1.0f};
    for (float v : amaxes) {
        a = __float_as_uint(v);
        emu_launch(dim3_{1, 1, 1}, dim3_{32, 1, 1}, [&]() { record_amax_k(&rec_bits, &a); });
    }
    rec = __uint_as_float(rec_bits);
    result(rec == 3.0f, "record", "max", "not the largest amax");
    a = 0x7f800000u; /* an infinity */
    emu_launch(dim3_{1, 1, 1}, dim3_{32, 1, 1}, [&]() { record_amax_k(&rec_bits, &a); });
    a = __float_as_uint(5.0f);
    emu_launch(dim3_{1, 1, 1}, dim3_{32, 1, 1}, [&]() { record_amax_k(&rec_bits, &a); });
    result(std::isnan(__uint_as_float(rec_bits)), "record", "nonfinite_sticks", "an infinity did not leave NaN");
}

/* the host's block reference: x [rows, cols] in br x bc blocks; codes of
 * each value scaled by its block's 2^k, and the block's 2^-k (NaN where
 * the block holds an infinity) */
static void host_blocks(const std::vector<uint16_t> &x, int rows, int cols, int br, int bc, int format,
                        std::vector<uint8_t> &codes, std::vector<float> &inv_rm) {
    int nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    codes.assign((size_t)rows * cols, 0);
    inv_rm.assign((size_t)nbr * nbc, 0);
    for (int b = 0; b < nbr * nbc; b++) {
        int r0 = b / nbc * br, c0 = b % nbc * bc;
        float amax = 0;
        for (int r = r0; r < std::min(r0 + br, rows); r++)
            for (int c = c0; c < std::min(c0 + bc, cols); c++) amax = fmaxf(amax, fabsf(bf16_to_float(x[(size_t)r * cols + c])));
        int fin = std::isfinite(amax), k = fp8_scale_exp(fin ? amax : 0.0f, format);
        inv_rm[b] = fin ? fp8_pow2(-k) : NAN;
        for (int r = r0; r < std::min(r0 + br, rows); r++)
            for (int c = c0; c < std::min(c0 + bc, cols); c++)
                codes[(size_t)r * cols + c] = fp8_bits(bf16_to_float(x[(size_t)r * cols + c]) * fp8_pow2(k), format);
    }
}

static int same_scales(const std::vector<float> &a, const std::vector<float> &b) {
    if (a.size() != b.size()) return 0;
    for (size_t i = 0; i < a.size(); i++)
        if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return 0;
    return 1;
}

/* test data for the block casts: each row and column band at its own magnitude, an infinity if asked */
static std::vector<uint16_t> block_data(int rows, int cols, int with_inf) {
    std::vector<uint16_t> x((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            x[(size_t)r * cols + c] = bf16_bits(ldexpf(rnd(), (r % 5) * 3 - (c / 128) * 4 + (c % 7) - 3));
    if (with_inf) x[(size_t)(rows / 2) * cols + cols - 1] = 0xff80; /* -inf, in the last column block */
    return x;
}

/* 1 x 128 along the rows: codes row-major [ld, cols], scales [cols / 128, ld]; rows past rows (a GEMM's
 * padding to 4 rows) zero codes and inverse scale 1 */
static void rows128_case(int rows, int ld, int cols, int format, int with_inf, int misalign, const char *tag) {
    std::vector<uint16_t> x = block_data(rows, cols, with_inf);
    std::vector<uint8_t> want;
    std::vector<float> inv_rm;
    host_blocks(x, rows, cols, 1, BLK, format, want, inv_rm);
    want.resize((size_t)ld * cols, 0);
    int nbc = cols / BLK;
    std::vector<float> want_inv((size_t)nbc * ld, 1.0f);
    for (int r = 0; r < rows; r++)
        for (int cb = 0; cb < nbc; cb++) want_inv[(size_t)cb * ld + r] = inv_rm[(size_t)r * nbc + cb];
    std::vector<uint16_t> xs(x.size() + 8);
    uint16_t *xp = xs.data() + (misalign ? 1 : 0);
    std::copy(x.begin(), x.end(), xp);
    std::vector<uint8_t> qs(want.size() + 8, 0xaa);
    uint8_t *qp = qs.data() + (misalign ? 1 : 0);
    std::vector<float> inv(want_inv.size(), -1.0f);
    emu_launch(dim3_{2, 1, 1}, dim3_{64, 1, 1}, [&]() { cast_rows128_k(qp, inv.data(), xp, rows, ld, cols, format); });
    result(std::vector<uint8_t>(qp, qp + want.size()) == want, "rows128_codes", tag, "not bitwise the host's");
    result(same_scales(inv, want_inv), "rows128_scales", tag, "not the host's 2^-k at [cb * ld + r]");
}

/* 128 x 1 along the columns, transposed: codes [cols, ld] (ld: rows rounded up to 128, zero codes past rows),
 * scales [ld / 128, cols] */
static void cols128_t_case(int rows, int cols, int format, int with_inf, int misalign, const char *tag) {
    std::vector<uint16_t> x = block_data(rows, cols, with_inf);
    std::vector<uint8_t> codes;
    std::vector<float> inv_rm;
    host_blocks(x, rows, cols, BLK, 1, format, codes, inv_rm); /* inv_rm [rb][c]: already the layout wanted */
    int ld = (rows + BLK - 1) / BLK * BLK;
    std::vector<uint8_t> want((size_t)cols * ld, 0);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) want[(size_t)c * ld + r] = codes[(size_t)r * cols + c];
    std::vector<uint8_t> qs(want.size() + 8, 0xaa);
    uint8_t *qp = qs.data() + (misalign ? 1 : 0);
    std::vector<uint16_t> xs(x.size() + 8);
    uint16_t *xp = xs.data() + (misalign ? 1 : 0);
    std::copy(x.begin(), x.end(), xp);
    std::vector<float> inv(inv_rm.size(), -1.0f);
    dim3_ grid{(unsigned)(ld / BLK), (unsigned)(cols + COLS_T - 1) / COLS_T, 1};
    emu_launch(grid, dim3_{32, 8, 1}, [&]() { cast_cols128_t_k(qp, inv.data(), xp, rows, cols, ld, format); });
    result(std::vector<uint8_t>(qp, qp + want.size()) == want, "cols128_t_codes", tag,
           "not bitwise the host's, transposed (zero codes in the padding)");
    result(same_scales(inv, inv_rm), "cols128_t_scales", tag, "not the host's 2^-k at [rb * cols + c]");
}

/* 128 x 128 blocks: codes row-major and transposed, scales row-major over the blocks and transposed */
static void block128_case(int rows, int cols, int format, int with_inf, const char *tag, int misalign = 0) {
    std::vector<uint16_t> x0 = block_data(rows, cols, with_inf), xs(x0.size() + 8);
    uint16_t *xp = xs.data() + (misalign ? 1 : 0);
    std::copy(x0.begin(), x0.end(), xp);
    const std::vector<uint16_t> &x = x0;
    std::vector<uint8_t> want;
    std::vector<float> inv_rm;
    host_blocks(x, rows, cols, BLK, BLK, format, want, inv_rm);
    int nbr = rows / BLK, nbc = cols / BLK;
    std::vector<uint8_t> want_t(want.size());
    std::vector<float> want_inv_t(inv_rm.size());
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) want_t[(size_t)c * rows + r] = want[(size_t)r * cols + c];
    for (int rb = 0; rb < nbr; rb++)
        for (int cb = 0; cb < nbc; cb++) want_inv_t[(size_t)cb * nbr + rb] = inv_rm[(size_t)rb * nbc + cb];
    std::vector<uint8_t> q(want.size(), 0xaa), qt(want.size(), 0xaa);
    std::vector<float> inv(inv_rm.size(), -1.0f), inv_t(inv_rm.size(), -1.0f);
    dim3_ grid{(unsigned)nbr, (unsigned)nbc, 1};
    emu_launch(grid, dim3_{32, 8, 1},
               [&]() { cast_block128_k(q.data(), inv.data(), qt.data(), inv_t.data(), xp, rows, cols, format); });
    result(q == want, "block128_codes", tag, "not bitwise the host's");
    result(qt == want_t, "block128_codes_transposed", tag, "not bitwise the host's, transposed");
    result(same_scales(inv, inv_rm) && same_scales(inv_t, want_inv_t), "block128_scales", tag,
           "not the host's 2^-k, row-major over the blocks and transposed");
    /* one layout alone: the other untouched */
    std::vector<uint8_t> qt2(want.size(), 0xaa);
    std::vector<float> inv_t2(inv_rm.size(), -1.0f);
    emu_launch(grid, dim3_{32, 8, 1},
               [&]() { cast_block128_k(NULL, NULL, qt2.data(), inv_t2.data(), xp, rows, cols, format); });
    result(qt2 == want_t && same_scales(inv_t2, want_inv_t), "block128_transposed_only", tag, "differs");
}

int main() {
    run_case(45, 70, FP8_E4M3, 0, 0, "e4m3_45x70");
    run_case(64, 32, FP8_E5M2, 0, 0, "e5m2_64x32");
    run_case(37, 48, FP8_E4M3, 0, 0, "e4m3_37x48_padded"); /* 37 rows: 11 padding, in the second tile row */
    run_case(7, 40, FP8_E5M2, 0, 0, "e5m2_7x40_padded");
    run_case(33, 40, FP8_E4M3, 1, 0, "e4m3_with_inf");
    run_case(45, 70, FP8_E4M3, 0, 3, "e4m3_delayed_saturating");
    run_case(64, 32, FP8_E5M2, 0, -2, "e5m2_delayed_headroom");
    run_case(45, 70, FP8_E4M3, 0, 0, "e4m3_45x70_unaligned", 1);
    run_case(33, 40, FP8_E5M2, 1, 0, "e5m2_with_inf_unaligned", 1);
    run_case(130, 136, FP8_E4M3, 0, 0, "e4m3_130x136"); /* several 64 x 64 tiles each way, the last ones partial */
    record_case();
    spec_case(45, 70, FP8_E4M3, 0, "e4m3_45x70");
    spec_case(37, 48, FP8_E5M2, 0, "e5m2_37x48_unaligned", 1);
    spec_case(33, 40, FP8_E4M3, 1, "e4m3_with_inf");
    rows128_case(5, 5, 256, FP8_E4M3, 0, 0, "e4m3_5x256");
    rows128_case(9, 9, 384, FP8_E5M2, 1, 0, "e5m2_9x384_with_inf");
    rows128_case(5, 5, 256, FP8_E4M3, 0, 1, "e4m3_5x256_unaligned");
    rows128_case(5, 8, 256, FP8_E4M3, 0, 0, "e4m3_5x256_padded_to_8");
    rows128_case(9, 12, 384, FP8_E5M2, 1, 1, "e5m2_9x384_padded_to_12_unaligned");
    cols128_t_case(300, 40, FP8_E4M3, 0, 0, "e4m3_300x40"); /* 300 rows: 84 padding; 40 columns: a partial tile */
    cols128_t_case(128, 32, FP8_E5M2, 1, 0, "e5m2_128x32_with_inf");
    cols128_t_case(37, 40, FP8_E5M2, 0, 1, "e5m2_37x40_unaligned");
    cols128_t_case(130, 136, FP8_E4M3, 0, 0, "e4m3_130x136"); /* three column tiles, the last partial */
    cols128_t_case(129, 70, FP8_E4M3, 1, 0, "e4m3_129x70_with_inf"); /* 70 columns: one value at a time */
    block128_case(256, 384, FP8_E4M3, 0, "e4m3_256x384");
    block128_case(128, 256, FP8_E4M3, 1, "e4m3_128x256_with_inf");
    block128_case(128, 128, FP8_E5M2, 0, "e5m2_128x128_unaligned", 1);
    return failures ? 1 : 0;
}
