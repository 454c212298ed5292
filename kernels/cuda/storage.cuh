/* Element storage for kernels shared by the fp32 and bf16 tables: a kernel
 * templated on T loads its operands as fp32 and stores its results in T,
 * so its bf16 instance computes exactly what the fp32 kernel computes on the
 * widened operands, rounded once where it stores (kernels/bf16.h's rounding,
 * bit for bit: NaN stays a quiet NaN, the mantissa carry reaches the
 * exponent). The bf16 table calls these instances instead of widening,
 * running the fp32 kernel and narrowing: the same numbers, in one pass. */
#pragma once
#include <stdint.h>

struct bf16_t {
    uint16_t bits;
};

__device__ inline uint16_t bits_rne(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ inline float widen1(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ inline float ld(const float *p, size_t i) { return p[i]; }
__device__ inline float ld(const bf16_t *p, size_t i) { return widen1(p[i].bits); }
__device__ inline void st(float *p, size_t i, float v) { p[i] = v; }
__device__ inline void st(bf16_t *p, size_t i, float v) { p[i].bits = bits_rne(v); }
