/* Linear layers through OpenBLAS sgemm; weights are [out, in] (torch layout). */
#include <cblas.h>

#include "kernels/cpu/cpu.h"

void cpu_matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, M, K, 1.0f, x, K, w, K, accumulate ? 1.0f : 0.0f,
                out, M);
}

void cpu_matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                         int M, int accumulate_dx) {
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K, M, 1.0f, dout, M, w, K,
                    accumulate_dx ? 1.0f : 0.0f, dx, K);
    if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, K, N, 1.0f, dout, M, x, K, 1.0f, dw, K);
}
