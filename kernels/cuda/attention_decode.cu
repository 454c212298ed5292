/* Attention of a few new queries against a KV cache (incremental decoding,
 * model/decode.h): one block per (query, head); the block's threads share the
 * keys, then the head dimension. The score rows live in device scratch, so
 * any cache length works. */
#include <math.h>

#include "kernels/cuda/cuda.h"

#define THREADS 128

__global__ void attention_decode_k(float *out, float *scores, const float *q, const float *k, const float *v, int n,
                                   int Tk, int H, int KVH, int D, int Dv, float scale) {
    __shared__ float buf[THREADS];
    int i = blockIdx.x / H, h = blockIdx.x % H, last = Tk - n + i, ldk = KVH * D, kh = h / (H / KVH);
    const float *qi = q + ((size_t)i * H + h) * D;
    float *s = scores + (size_t)blockIdx.x * Tk;
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        const float *kj = k + (size_t)j * ldk + (size_t)kh * D;
        float dot = 0;
        for (int d = 0; d < D; d++) dot += qi[d] * kj[d];
        s[j] = dot * scale;
        m = fmaxf(m, s[j]);
    }
    m = block_max(m, buf);
    float sum = 0;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) sum += s[j] = expf(s[j] - m);
    sum = block_sum(sum, buf);
    __syncthreads(); /* every s[j] written before any thread reads them all */
    float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        const float *vd = v + (size_t)kh * Dv + d;
        float acc = 0;
        for (int j = 0; j <= last; j++) acc += s[j] * vd[(size_t)j * KVH * Dv];
        out[((size_t)i * H + h) * Dv + d] = acc * inv;
    }
}

void cuda_attention_decode(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H,
                           int KVH, int D, int Dv) {
    if (n <= 0) return;
    float *scores = (float *)cuda_scratch(SCRATCH_WORK, sizeof(float) * (size_t)n * H * Tk);
    attention_decode_k<<<n * H, THREADS>>>(out, scores, q, k, v, n, Tk, H, KVH, D, Dv, 1.0f / sqrtf((float)D));
    LAUNCH_CHECK();
}
