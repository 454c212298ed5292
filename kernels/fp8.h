/* The two 8-bit float formats of FP8 training (OCP FP8, as Hopper's tensor
 * cores and CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 define them), their
 * rounding, and the power-of-two scaling that maps a tensor's values into
 * their range.
 *
 *   e4m3 (weights, activations): 4 exponent bits (bias 7), 3 mantissa bits,
 *        no infinities, S.1111.111 is NaN; largest 448, smallest normal 2^-6,
 *        subnormal step 2^-9.
 *   e5m2 (gradients): 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like
 *        (S.11111.00 infinity, other S.11111.xx NaN); largest 57344,
 *        smallest normal 2^-14, subnormal step 2^-16.
 *
 * Rounding is to nearest, ties to even, and saturating (CUDA's
 * __NV_SATFINITE): a finite value or infinity beyond the largest finite
 * value becomes the largest finite value of its sign; NaN stays NaN.
 *
 * Scales are powers of two, 2^k with k the largest integer such that
 * amax * 2^k <= the format's largest value: multiplying by them, and
 * dequantising by 2^-k, is exact in fp32, so an FP8 GEMM (products of 8-bit
 * values summed in fp32, times the two inverse scales) and this file's
 * quantise-dequantise followed by an fp32 GEMM differ only in the order of
 * the fp32 sums. The usable range loses at most one binade against
 * amax-exact scales. Host and device (CUDA) code share these functions. */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FP8_FN __host__ __device__ static inline
#else
#define FP8_FN static inline
#endif

enum fp8_format { FP8_E4M3 = 0, FP8_E5M2 = 1 };

/* mantissa bits, smallest normal exponent, largest finite value */
FP8_FN int fp8_mbits(int f) { return f == FP8_E4M3 ? 3 : 2; }
FP8_FN int fp8_emin(int f) { return f == FP8_E4M3 ? -6 : -14; }
FP8_FN int fp8_bias(int f) { return f == FP8_E4M3 ? 7 : 15; }
FP8_FN float fp8_max(int f) { return f == FP8_E4M3 ? 448.0f : 57344.0f; }

FP8_FN uint32_t fp8_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
FP8_FN float fp8_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* the format's value nearest to x (ties to even, saturating), as an fp32 */
FP8_FN float fp8_round(float x, int f) {
    int M = fp8_mbits(f);
    float a = fabsf(x), mx = fp8_max(f);
    if (!(a < mx)) return a == a ? copysignf(mx, x) : x; /* saturate; NaN stays */
    if (a < fp8_f32_from_bits((uint32_t)(fp8_emin(f) + 127) << 23)) {
        /* below the smallest normal the step is 2^(emin - M): adding 2^(emin - M + 23) leaves
         * fp32 exactly that step, so the addition rounds to nearest even (the default mode) */
        float c = fp8_f32_from_bits((uint32_t)(fp8_emin(f) - M + 23 + 127) << 23);
#ifdef __CUDA_ARCH__
        return copysignf(__fsub_rn(__fadd_rn(a, c), c), x); /* never contracted or folded */
#else
        volatile float t = a + c; /* kept apart: (a + c) - c must not be folded */
        return copysignf(t - c, x);
#endif
    }
    uint32_t u = fp8_f32_bits(a), drop = 23 - M;
    u += (1u << (drop - 1)) - 1 + ((u >> drop) & 1); /* to nearest even on the kept bits; carries into the exponent */
    return copysignf(fp8_f32_from_bits(u & ~((1u << drop) - 1)), x);
}

/* the bits of fp8_round(x) */
FP8_FN uint8_t fp8_bits(float x, int f) {
    int M = fp8_mbits(f), emin = fp8_emin(f);
    float v = fp8_round(x, f);
    if (v != v) return 0x7f; /* NaN, both formats */
    uint8_t sign = signbit(v) ? 0x80 : 0;
    v = fabsf(v);
    if (v < fp8_f32_from_bits((uint32_t)(emin + 127) << 23)) /* subnormal or zero: whole steps of 2^(emin - M) */
        return (uint8_t)(sign | (int)(v * fp8_f32_from_bits((uint32_t)(M - emin + 127) << 23)));
    uint32_t u = fp8_f32_bits(v);
    int e = (int)(u >> 23) - 127, mant = (int)((u >> (23 - M)) & ((1u << M) - 1));
    return (uint8_t)(sign | ((e + fp8_bias(f)) << M) | mant);
}

FP8_FN float fp8_to_float(uint8_t b, int f) {
    int M = fp8_mbits(f), field = (b & 0x7f) >> M, mant = b & ((1 << M) - 1);
    float s = (b & 0x80) ? -1.0f : 1.0f;
    if (f == FP8_E4M3 && field == 15 && mant == 7) return NAN;
    if (f == FP8_E5M2 && field == 31) return mant ? NAN : s * INFINITY;
    if (field == 0) return s * ldexpf((float)mant, fp8_emin(f) - M);
    return s * ldexpf((float)((1 << M) + mant), field - fp8_bias(f) - M);
}

/* k such that amax * 2^k fits the format with the least headroom, at most
 * 126 and at least -126 (2^k and 2^-k are then normal fp32 numbers); 0 for
 * a zero or non-finite amax (the caller passes such blocks through) */
FP8_FN int fp8_scale_exp(float amax, int f) {
    if (!(amax > 0.0f) || isinf(amax)) return 0;
    int ea, em;
    float ma = frexpf(amax, &ea), mm = frexpf(fp8_max(f), &em);
    int k = em - ea - (ma > mm ? 1 : 0);
    return k > 126 ? 126 : k < -126 ? -126 : k;
}

/* a scale exponent that is not one: "scale by the tensor's current amax"
 * (delayed scaling before a tensor has a history) */
#define FP8_SCALE_CURRENT 1000

/* 2^k as an fp32, -126 <= k <= 127 */
FP8_FN float fp8_pow2(int k) { return fp8_f32_from_bits((uint32_t)(k + 127) << 23); }

/* x as it reaches an FP8 GEMM whose block has scale exponent k: the value
 * of its 8-bit code, times 2^-k (both products exact: powers of two, and
 * values far below the format's smallest step flush to zero either way) */
FP8_FN float fp8_qdq(float x, int k, int f) { return fp8_round(x * fp8_pow2(k), f) * fp8_pow2(-k); }
