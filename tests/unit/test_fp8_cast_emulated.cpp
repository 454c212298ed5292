/* The FP8 cast kernels (kernels/cuda/fp8_cast.cuh, the source the GPU
 * build compiles) on the CPU under tests/unit/cuda_emulation.h: the amax of
 * a bf16 tensor, and its codes row-major and transposed (through the
 * shared-memory tile, rows padded to a multiple of 16 with zero codes),
 * bitwise against kernels/fp8.h's host functions, for
 * both formats, shapes that do and do not fill the 32 x 32 tiles, values
 * spanning many binades, a tensor holding an infinity (its inverse
 * scale is NaN), delayed scaling's given exponents (one that saturates the
 * largest values) and its amax record (a non-finite amax sticks as NaN). */
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
    emu_launch(tiles, dim3_{TT, 8, 1},
               [&]() { cast_t_k(qtp, &inv_t, xp, rows, cols, ld, &dev_amax, format, k_fixed); });
    std::vector<uint8_t> qt(qtp, qtp + (size_t)cols * ld);
    result(q == want, "codes", tag, "not bitwise the host's");
    result(qt == want_t, "codes_transposed", tag, "not bitwise the host's, transposed (zero codes in the padding)");
    int inv_ok = with_inf ? std::isnan(inv) && std::isnan(inv_t) : inv == fp8_pow2(-k) && inv_t == inv;
    result(inv_ok, "inverse_scale", tag, with_inf ? "not NaN for a tensor holding an infinity" : "not 2^-k");
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
    record_case();
    return failures ? 1 : 0;
}
