/* Rotary embedding, Hugging Face rotate_half layout: element i pairs with
 * i + D/2. The inverse rotation is the backward pass (rotation is orthogonal). */
#include "kernels/cpu/cpu.h"

void cpu_rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    int half = D / 2;
    float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
            for (int h = 0; h < H; h++) {
                float *v = x + (((size_t)b * T + t) * H + h) * D;
                for (int i = 0; i < half; i++) {
                    float a = v[i], bb = v[i + half], si = sign * s[i];
                    v[i] = a * c[i] - bb * si;
                    v[i + half] = bb * c[i] + a * si;
                }
            }
        }
}
