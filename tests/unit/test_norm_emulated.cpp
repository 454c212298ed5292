/* RMSNorm's row kernels (kernels/cuda/norm.cuh, the source the GPU build
 * compiles) on the CPU under tests/unit/cuda_emulation.h, fp32 and bf16
 * storage, rows 16-byte aligned and not (the vector and scalar loops),
 * against a double loop: rstd within 1e-6 relative, outputs and input
 * gradients (written and accumulated) within the storage's rounding step
 * (bf16: 2^-8 relative) plus 1e-5 of the row's scale. */
#include "tests/unit/cuda_emulation.h"

#include "kernels/cuda/norm.cuh"

enum { THREADS_E = 64 };
static int failures;
static unsigned long long rng = 3;

static float uniform(float lo, float hi) { return emu_uniform(&rng, lo, hi); }

template <typename T>
static T *aligned_at(std::vector<unsigned char> &store, size_t n, int offset) {
    store.assign(sizeof(T) * (n + 16) + 16, 0);
    return (T *)(((uintptr_t)store.data() + 15) & ~(uintptr_t)15) + offset;
}

template <typename T>
static void run(const char *type, int C, int offset, int accumulate) {
    const int N = 3;
    const float eps = 1e-5f;
    std::vector<unsigned char> sx, sd, so, sdx, sw;
    size_t n = (size_t)N * C;
    T *x = aligned_at<T>(sx, n, offset), *dout = aligned_at<T>(sd, n, offset), *out = aligned_at<T>(so, n, offset);
    T *dx = aligned_at<T>(sdx, n, offset);
    float *w = aligned_at<float>(sw, C, 0);
    for (size_t i = 0; i < n; i++) st(x, i, uniform(-2, 2)), st(dout, i, uniform(-1, 1)), st(dx, i, uniform(-1, 1));
    for (int c = 0; c < C; c++) w[c] = uniform(0.5f, 1.5f);
    std::vector<float> dx0(n), rstd(N);
    for (size_t i = 0; i < n; i++) dx0[i] = ld(dx, i);
    emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1},
               [&]() { rmsnorm_forward_k<T, THREADS_E>(out, rstd.data(), x, w, C, eps); });
    emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1},
               [&]() { rmsnorm_dx_k<T, THREADS_E>(dx, dout, x, w, rstd.data(), C, accumulate); });
    double step = sizeof(T) == 2 ? 1.0 / 256 : 1e-6, worst_r = 0, worst = 0;
    for (int r = 0; r < N; r++) {
        double ss = 0, dot = 0;
        for (int c = 0; c < C; c++) ss += (double)ld(x, (size_t)r * C + c) * ld(x, (size_t)r * C + c);
        double rs = 1.0 / sqrt(ss / C + eps);
        worst_r = std::max(worst_r, fabs(rstd[r] - rs) / rs);
        for (int c = 0; c < C; c++) dot += (double)w[c] * ld(dout, (size_t)r * C + c) * ld(x, (size_t)r * C + c);
        double k = dot * rs * rs * rs / C;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            double o = w[c] * (ld(x, i) * rs), g = rs * w[c] * ld(dout, i) - k * ld(x, i);
            if (accumulate) g += dx0[i];
            worst = std::max(worst, fabs(ld(out, i) - o) / (step * fabs(o) + 1e-5 * rs));
            worst = std::max(worst, fabs(ld(dx, i) - g) / (step * fabs(g) + 1e-5 * rs));
        }
    }
    bool ok = worst_r <= 1e-6 && worst <= 1.0;
    printf("%s norm_emulated_%s_c%d_offset%d%s", ok ? "PASS" : "FAIL", type, C, offset, accumulate ? "_accumulate" : "");
    if (!ok) printf(": rstd %.3g, values %.3g steps", worst_r, worst), failures++;
    printf("\n");
}

int main() {
    for (int C : {1, 7, 8, 64, 100, 1000})
        for (int offset : {0, 1})
            for (int acc : {0, 1}) {
                run<float>("fp32", C, offset, acc);
                run<bf16_t>("bf16", C, offset, acc);
            }
    return failures ? 1 : 0;
}
