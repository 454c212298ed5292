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

/* 16-byte vectors (one load or store of 4 fp32 or 8 bf16 values): the
 * element-wise kernels take them where their buffers are 16-byte aligned,
 * one 2- or 4-byte access per thread keeping too few bytes in flight.
 * unpack16: the values of one vector of T, widened; returns how many. */
__device__ inline int unpack16(const uint4 &v, const float *, float *x) {
    x[0] = __uint_as_float(v.x), x[1] = __uint_as_float(v.y), x[2] = __uint_as_float(v.z), x[3] = __uint_as_float(v.w);
    return 4;
}
__device__ inline int unpack16(const uint4 &v, const bf16_t *, float *x) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    for (int j = 0; j < 4; j++) x[2 * j] = __uint_as_float(w[j] << 16), x[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    return 8;
}
/* pack16: g[0 .. per16) stored as one vector of T */
__device__ inline uint4 pack16(const float *g, float *) {
    return uint4{__float_as_uint(g[0]), __float_as_uint(g[1]), __float_as_uint(g[2]), __float_as_uint(g[3])};
}
__device__ inline uint4 pack16(const float *g, bf16_t *) {
    unsigned w[4];
    for (int j = 0; j < 4; j++) w[j] = (unsigned)bits_rne(g[2 * j]) | (unsigned)bits_rne(g[2 * j + 1]) << 16;
    return uint4{w[0], w[1], w[2], w[3]};
}
template <typename T>
__device__ inline int per16(const T *) {
    return 16 / (int)sizeof(T);
}
/* vector j of p (16-byte aligned) widened into x, or x stored there;
 * load16 returns how many values */
template <typename T>
__device__ inline int load16(const T *p, size_t j, float *x) {
    return unpack16(reinterpret_cast<const uint4 *>(p)[j], p, x);
}
template <typename T>
__device__ inline void store16(T *p, size_t j, const float *x) {
    reinterpret_cast<uint4 *>(p)[j] = pack16(x, p);
}
__device__ inline bool is_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
