/* exp(x) in float that the compiler vectorises: libm's expf is a call per
 * element (scalar), which made SwiGLU's forward and backward on the CPU cost
 * as much as a tenth of the GEMMs beside them. Range reduction x = n ln2 + r,
 * |r| <= ln2/2, then Cephes' degree-6 polynomial for e^r (its published
 * coefficients) and 2^n put into the exponent bits. Within 2 ulp of expf
 * (tests/unit/test_kernels.c `vec_exp`); +inf past 88.37 (near where 2^n leaves
 * the exponent's range; expf's limit is 88.72), 0 below -87.33 (no
 * subnormals); NaN stays NaN.
 * No branches and no float-to-int conversion, so a loop of it vectorises. */
#pragma once
#include <stdint.h>
#include <string.h>

static inline float vec_exp(float x) {
    const float hi = 88.37f, lo = -87.33f;
    float c = x > hi ? hi : x; /* NaN compares false: stays NaN */
    c = c < lo ? lo : c;
    /* n = round(c / ln2), in the low bits of j (adding 1.5 * 2^23 rounds to an integer) */
    float j = c * 1.44269504088896341f + 12582912.0f;
    float n = j - 12582912.0f;
    float r = c - n * 0.693359375f + n * 2.12194440e-4f; /* ln2 in two parts: n * ln2_hi is exact */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &j, 4);
    bits = (bits << 23) + (127u << 23); /* 2^n: j's bits are 0x4B400000 + n, whose shifted high part wraps to 0 */
    float scale;
    memcpy(&scale, &bits, 4);
    float y = p * scale;
    y = x > hi ? __builtin_inff() : y;
    return x < lo ? 0.0f : y;
}
