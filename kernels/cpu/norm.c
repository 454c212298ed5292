/* RMSNorm as in Llama: y = w * x / sqrt(mean(x^2) + eps). Sums run in
 * double over 8 fixed lanes (then the lanes in order), so they vectorise and
 * repeat bitwise on every machine and thread count. */
#include <math.h>

#include "kernels/cpu/cpu.h"

/* sum over c of (double)a[c] * b[c] * (w ? w[c] : 1) */
static double dot_lanes(const float *a, const float *b, const float *w, int C) {
    double lane[8] = {0}, s = 0;
    int c = 0;
    for (; c + 8 <= C; c += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)(w ? w[c + l] : 1.0f) * a[c + l] * b[c + l];
    for (; c < C; c++) s += (double)(w ? w[c] : 1.0f) * a[c] * b[c];
    for (int l = 0; l < 8; l++) s += lane[l];
    return s;
}

void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *yr = out + (size_t)n * C;
        float r = (float)(1.0 / sqrt(dot_lanes(xr, xr, NULL, C) / C + eps));
        rstd[n] = r;
        for (int c = 0; c < C; c++) yr[c] = w[c] * (xr[c] * r);
    }
}

/* dx = r*(w*dy) - r^3/C * x * sum(w*dy*x);  dw += sum_n dy*x*r.
 * dw sums the rows in order per column, 64 columns at a time (contiguous
 * rows of the block, one accumulator per column), so results are repeatable. */
void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, int N, int C, int accumulate) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dxr = dx + (size_t)n * C;
        float r = rstd[n];
        float k = (float)(dot_lanes(dy, xr, w, C) * r * r * r / C);
        for (int c = 0; c < C; c++) {
            float g = r * w[c] * dy[c] - k * xr[c];
            dxr[c] = accumulate ? dxr[c] + g : g;
        }
    }
    enum { COLS = 64 };
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COLS) {
        int width = C - c0 < COLS ? C - c0 : COLS;
        double acc[COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *dy = dout + (size_t)n * C + c0, *xr = x + (size_t)n * C + c0;
            for (int c = 0; c < width; c++) acc[c] += (double)dy[c] * xr[c] * rstd[n];
        }
        for (int c = 0; c < width; c++) dw[c0 + c] += (float)acc[c];
    }
}
