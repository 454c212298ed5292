/* bfloat16 storage on the host: the bf16 value nearest to x (round to
 * nearest, ties to even, as PyTorch's .to(torch.bfloat16) and CUDA's
 * __float2bfloat16_rn), its bits, and back. The CPU backend's bf16 table
 * stores activations as these 2-byte values, so its numbers are the ones a
 * GPU's bf16 buffers hold. NaN stays NaN (quiet), infinities stay, and
 * finite values beyond bf16's largest round to infinity, as in IEEE. */
#pragma once
#include <stdint.h>
#include <string.h>

static inline uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x0040u); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* carries into the exponent when the mantissa overflows */
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float bf16_round(float x) { return bf16_to_float(bf16_bits(x)); }
