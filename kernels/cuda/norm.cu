/* RMSNorm (one block per row; the row kernels: kernels/cuda/norm.cuh) and
 * rotary embedding. */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/storage.cuh"

#define THREADS 256

template <typename T>
static void rmsnorm_forward_t(T *out, float *rstd, const T *x, const float *w, int N, int C, float eps) {
    if (!N) return;
    rmsnorm_forward_k<T, THREADS><<<N, THREADS>>>(out, rstd, x, w, C, eps);
    LAUNCH_CHECK();
}

void cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    rmsnorm_forward_t(out, rstd, x, w, N, C, eps);
}

/* dw: rows split into fixed chunks (partials in double), then the chunks
 * summed in order: repeatable, and enough blocks to fill the GPU. */
#define DW_CHUNKS 64
template <typename T>
__global__ void rmsnorm_dw_part_k(double *part, const T *dout, const T *x, const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    int per = (N + DW_CHUNKS - 1) / DW_CHUNKS, n0 = chunk * per, n1 = min(N, n0 + per);
    double acc = 0;
    for (int n = n0; n < n1; n++) acc += (double)ld(dout, (size_t)n * C + c) * ld(x, (size_t)n * C + c) * rstd[n];
    part[(size_t)chunk * C + c] = acc;
}

__global__ void rmsnorm_dw_sum_k(float *dw, const double *part, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double acc = 0;
    for (int k = 0; k < DW_CHUNKS; k++) acc += part[(size_t)k * C + c];
    dw[c] += (float)acc;
}

/* dx must not alias dout or x: the gain-gradient pass reads both after dx is written */
template <typename T>
static void rmsnorm_backward_t(T *dx, float *dw, const T *dout, const T *x, const float *w, const float *rstd, int N,
                               int C, int accumulate) {
    if (!N) return;
    rmsnorm_dx_k<T, THREADS><<<N, THREADS>>>(dx, dout, x, w, rstd, C, accumulate);
    LAUNCH_CHECK();
    double *part = (double *)cuda_scratch(SCRATCH_WORK, sizeof(double) * DW_CHUNKS * C);
    rmsnorm_dw_part_k<T><<<dim3((C + 127) / 128, DW_CHUNKS), 128>>>(part, dout, x, rstd, N, C);
    LAUNCH_CHECK();
    rmsnorm_dw_sum_k<<<(C + 127) / 128, 128>>>(dw, part, C);
    LAUNCH_CHECK();
}

void cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                           int N, int C, int accumulate) {
    rmsnorm_backward_t(dx, dw, dout, x, w, rstd, N, C, accumulate);
}

/* Hugging Face rotate_half layout: element i pairs with i + D/2. */
template <typename S>
__global__ void rope_k(S *x, const float *cos, const float *sin, int T, int H, int D, float sign, size_t pairs) {
    int half = D / 2;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs; p += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(p % half);
        size_t row = p / half; /* (b*T + t)*H + h */
        int t = (int)((row / H) % T);
        size_t v = row * D;
        float c = cos[(size_t)t * half + i], s = sign * sin[(size_t)t * half + i];
        float a = ld(x, v + i), b = ld(x, v + i + half);
        st(x, v + i, a * c - b * s);
        st(x, v + i + half, b * c + a * s);
    }
}

template <typename S>
static void rope_t(S *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    size_t pairs = (size_t)B * T * H * (D / 2);
    if (!pairs) return;
    rope_k<S><<<blocks_for(pairs, THREADS), THREADS>>>(x, cos, sin, T, H, D, inverse ? -1.0f : 1.0f, pairs);
    LAUNCH_CHECK();
}

void cuda_rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    rope_t(x, cos, sin, B, T, H, D, inverse);
}

/* the bf16 table's instances: activations stored as bf16 */
void cuda_bf16_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    rmsnorm_forward_t((bf16_t *)out, rstd, (const bf16_t *)x, w, N, C, eps);
}
void cuda_bf16_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                const float *rstd, int N, int C, int accumulate) {
    rmsnorm_backward_t((bf16_t *)dx, dw, (const bf16_t *)dout, (const bf16_t *)x, w, rstd, N, C, accumulate);
}
void cuda_bf16_rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    rope_t((bf16_t *)x, cos, sin, B, T, H, D, inverse);
}
