/* The AdamW kernel of kernels/cuda/elementwise.cu (torch.optim.AdamW, as
 * kernels/cpu/elementwise.c), in a header so that
 * tests/unit/test_adamw_emulated.cpp runs it on the CPU (under
 * tests/unit/cuda_emulation.h). Memory-bound: per parameter it reads the
 * weight, gradient and both moments and writes them back (and the bf16
 * working copy), so where the four fp32 buffers are 16-byte aligned (and the
 * copy 8-byte) a thread takes four parameters with 16-byte loads and stores
 * (past the first 16-byte boundary of the weights, when the others share
 * its phase); the scalar loop takes the rest and buffers of other phases.
 * Each parameter's arithmetic is the same either way. */
#pragma once
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/storage.cuh"

struct adamw_step {
    float beta1, beta2, eps, decay, step_size, bc2_sqrt, grad_scale;
};

/* one parameter: updates p, m, v in place */
__device__ inline void adamw1(float &p, float g, float &m, float &v, const adamw_step &a) {
    g *= a.grad_scale;
    m = a.beta1 * m + (1.0f - a.beta1) * g;
    v = a.beta2 * v + (1.0f - a.beta2) * g * g;
    float denom = sqrtf(v) / a.bc2_sqrt + a.eps;
    p = p * a.decay - a.step_size * m / denom;
}

/* the 4-parameter groups the vector loop takes: 0 where a buffer is unaligned */
__device__ inline size_t adamw_groups(const float *p, const float *g, const float *m, const float *v,
                                      const uint16_t *work, size_t n) {
    uintptr_t a = (uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v;
    return (a & 15) || ((uintptr_t)work & 7) ? 0 : n / 4;
}

static __global__ void adamw_k(float *param, const float *grad, float *m, float *v, size_t n, adamw_step a,
                               uint16_t *work) {
    size_t stride = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    /* the parameters up to param's next 16-byte boundary go scalar; past it the vectors, where the
     * other buffers are aligned there too (a run of the flat buffers starting mid-vector) */
    size_t head = ((16 - ((uintptr_t)param & 15)) & 15) / 4;
    if (head > n) head = n;
    size_t groups = adamw_groups(param + head, grad + head, m + head, v + head, work ? work + head : NULL, n - head);
    float *p0 = param + head, *m0 = m + head, *v0 = v + head;
    const float *g0 = grad + head;
    for (size_t i = tid; i < groups; i += stride) {
        float4 p4 = reinterpret_cast<float4 *>(p0)[i], g4 = reinterpret_cast<const float4 *>(g0)[i];
        float4 m4 = reinterpret_cast<float4 *>(m0)[i], v4 = reinterpret_cast<float4 *>(v0)[i];
        adamw1(p4.x, g4.x, m4.x, v4.x, a);
        adamw1(p4.y, g4.y, m4.y, v4.y, a);
        adamw1(p4.z, g4.z, m4.z, v4.z, a);
        adamw1(p4.w, g4.w, m4.w, v4.w, a);
        reinterpret_cast<float4 *>(p0)[i] = p4, reinterpret_cast<float4 *>(m0)[i] = m4;
        reinterpret_cast<float4 *>(v0)[i] = v4;
        if (work)
            reinterpret_cast<uint2 *>(work + head)[i] =
                uint2{(unsigned)bits_rne(p4.x) | (unsigned)bits_rne(p4.y) << 16,
                      (unsigned)bits_rne(p4.z) | (unsigned)bits_rne(p4.w) << 16};
    }
    auto one = [&](size_t i) {
        float p = param[i], mi = m[i], vi = v[i];
        adamw1(p, grad[i], mi, vi, a);
        param[i] = p, m[i] = mi, v[i] = vi;
        if (work) work[i] = bits_rne(p);
    };
    for (size_t i = tid; i < head; i += stride) one(i);
    for (size_t i = head + groups * 4 + tid; i < n; i += stride) one(i);
}
