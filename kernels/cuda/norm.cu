/* RMSNorm (one block per row) and rotary embedding. */
#include <math.h>

#include "kernels/cuda/cuda.h"

#define THREADS 256

__global__ void rmsnorm_forward_k(float *out, float *rstd, const float *x, const float *w, int C, float eps) {
    __shared__ double buf[THREADS];
    const float *xr = x + (size_t)blockIdx.x * C;
    float *yr = out + (size_t)blockIdx.x * C;
    double ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += (double)xr[c] * xr[c];
    ss = block_sum(ss, buf);
    float r = (float)(1.0 / sqrt(ss / C + eps));
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = w[c] * (xr[c] * r);
}

void cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    if (!N) return;
    rmsnorm_forward_k<<<N, THREADS>>>(out, rstd, x, w, C, eps);
    LAUNCH_CHECK();
}

__global__ void rmsnorm_dx_k(float *dx, const float *dout, const float *x, const float *w, const float *rstd, int C,
                             int accumulate) {
    __shared__ double buf[THREADS];
    size_t base = (size_t)blockIdx.x * C;
    float r = rstd[blockIdx.x];
    double dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += (double)w[c] * dout[base + c] * x[base + c];
    dot = block_sum(dot, buf);
    float k = (float)(dot * r * r * r / C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = r * w[c] * dout[base + c] - k * x[base + c];
        dx[base + c] = accumulate ? dx[base + c] + g : g;
    }
}

/* dw: rows split into fixed chunks (partials in double), then the chunks
 * summed in order: repeatable, and enough blocks to fill the GPU. */
#define DW_CHUNKS 64
__global__ void rmsnorm_dw_part_k(double *part, const float *dout, const float *x, const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    int per = (N + DW_CHUNKS - 1) / DW_CHUNKS, n0 = chunk * per, n1 = min(N, n0 + per);
    double acc = 0;
    for (int n = n0; n < n1; n++) acc += (double)dout[(size_t)n * C + c] * x[(size_t)n * C + c] * rstd[n];
    part[(size_t)chunk * C + c] = acc;
}

__global__ void rmsnorm_dw_sum_k(float *dw, const double *part, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double acc = 0;
    for (int k = 0; k < DW_CHUNKS; k++) acc += part[(size_t)k * C + c];
    dw[c] += (float)acc;
}

void cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                           int N, int C, int accumulate) {
    if (!N) return;
    rmsnorm_dx_k<<<N, THREADS>>>(dx, dout, x, w, rstd, C, accumulate);
    LAUNCH_CHECK();
    double *part = (double *)cuda_scratch(SCRATCH_WORK, sizeof(double) * DW_CHUNKS * C);
    rmsnorm_dw_part_k<<<dim3((C + 127) / 128, DW_CHUNKS), 128>>>(part, dout, x, rstd, N, C);
    LAUNCH_CHECK();
    rmsnorm_dw_sum_k<<<(C + 127) / 128, 128>>>(dw, part, C);
    LAUNCH_CHECK();
}

/* Hugging Face rotate_half layout: element i pairs with i + D/2. */
__global__ void rope_k(float *x, const float *cos, const float *sin, int T, int H, int D, float sign, size_t pairs) {
    int half = D / 2;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs; p += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(p % half);
        size_t row = p / half; /* (b*T + t)*H + h */
        int t = (int)((row / H) % T);
        float *v = x + row * D;
        float c = cos[(size_t)t * half + i], s = sign * sin[(size_t)t * half + i];
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

void cuda_rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse) {
    size_t pairs = (size_t)B * T * H * (D / 2);
    if (!pairs) return;
    rope_k<<<blocks_for(pairs, THREADS), THREADS>>>(x, cos, sin, T, H, D, inverse ? -1.0f : 1.0f, pairs);
    LAUNCH_CHECK();
}
