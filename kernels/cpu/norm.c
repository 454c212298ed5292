/* RMSNorm as in Llama: y = w * x / sqrt(mean(x^2) + eps). */
#include <math.h>

#include "kernels/cpu/cpu.h"

void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *yr = out + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        rstd[n] = r;
        for (int c = 0; c < C; c++) yr[c] = w[c] * (xr[c] * r);
    }
}

/* dx = r*(w*dy) - r^3/C * x * sum(w*dy*x);  dw += sum_n dy*x*r.
 * dw is reduced over rows in a fixed order so results are repeatable. */
void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, int N, int C, int accumulate) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dxr = dx + (size_t)n * C;
        float r = rstd[n];
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)w[c] * dy[c] * xr[c];
        float k = (float)(dot * r * r * r / C);
        for (int c = 0; c < C; c++) {
            float g = r * w[c] * dy[c] - k * xr[c];
            dxr[c] = accumulate ? dxr[c] + g : g;
        }
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double acc = 0;
        for (int n = 0; n < N; n++) acc += (double)dout[(size_t)n * C + c] * x[(size_t)n * C + c] * rstd[n];
        dw[c] += (float)acc;
    }
}
