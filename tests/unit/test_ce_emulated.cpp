/* The cross-entropy kernels of kernels/cuda/cross_entropy.cu (the source the
 * GPU build compiles, kernels/cuda/cross_entropy.cuh) on the CPU under
 * tests/unit/cuda_emulation.h, on fp32 and bf16 logits, against a
 * double-precision loop: rows of many lengths, 16-byte aligned and not (the
 * vector and scalar loops), ignored targets, -inf logits, a NaN; the
 * whole-vocabulary kernel (one pass for the statistics) and the
 * vocabulary-parallel kernels over two slices with the statistics combined
 * as the ranks' all-reduces would. Losses within 1e-6 relative, gradients
 * within 1e-5 (fp32) or the bf16 rounding step (bf16) of the loop's. */
#include "tests/unit/cuda_emulation.h"

#include "kernels/bf16.h"
#include "kernels/cuda/cross_entropy.cuh"

enum { THREADS_E = 64 };
static int failures;
static unsigned long long rng = 7;

static float uniform(float lo, float hi) { return emu_uniform(&rng, lo, hi); }

static void result(const char *name, bool ok, const char *fmt, double a, double b) {
    printf("%s %s", ok ? "PASS" : "FAIL", name);
    if (!ok) printf(": "), printf(fmt, a, b), failures++;
    printf("\n");
}

/* storage helpers: T's bits from a float (rounded for bf16) and back */
static void put(float *p, size_t i, float v) { p[i] = v; }
static void put(bf16_t *p, size_t i, float v) { p[i].bits = bf16_bits(v); }
static float get(const float *p, size_t i) { return p[i]; }
static float get(const bf16_t *p, size_t i) { return bf16_to_float(p[i].bits); }

/* loss and gradient of one row by the loop, in double */
static void reference(const std::vector<double> &x, int t, double dscale, double *loss, std::vector<double> &g) {
    double m = -INFINITY, s = 0;
    for (double v : x) m = std::max(m, v);
    for (double v : x) s += exp(v - m);
    double logz = log(s) + m;
    *loss = t < 0 ? 0 : logz - x[t];
    g.assign(x.size(), 0.0);
    if (t >= 0)
        for (size_t i = 0; i < x.size(); i++) g[i] = dscale * (exp(x[i] - logz) - (i == (size_t)t ? 1 : 0));
}

template <typename T>
static void run_case(const char *type, int V, int offset, bool vocab_parallel) {
    const int N = 4;
    const float dscale = 0.25f;
    /* rows back to back from a 16-byte aligned base plus offset elements: with V * sizeof(T) not a multiple
     * of 16 the rows alternate between aligned and not */
    std::vector<unsigned char> store(sizeof(T) * ((size_t)N * V + 16) + 16);
    T *base = (T *)(((uintptr_t)store.data() + 15) & ~(uintptr_t)15) + offset;
    std::vector<int32_t> targets(N);
    std::vector<std::vector<double>> x(N, std::vector<double>(V));
    for (int n = 0; n < N; n++) {
        targets[n] = n == 1 ? -1 : (int)(uniform(0, 1) * V) % V;
        for (int i = 0; i < V; i++) {
            float v = uniform(-8, 8);
            if (n == 2 && V > 3 && i % 5 == 3 && i != targets[n]) v = -INFINITY; /* masked logits add nothing */
            put(base, (size_t)n * V + i, v);
            x[n][i] = get(base, (size_t)n * V + i);
        }
    }
    std::vector<float> losses(N);
    if (!vocab_parallel) {
        emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1},
                   [&]() { cross_entropy_k<T, THREADS_E>(losses.data(), base, targets.data(), V, dscale); });
    } else { /* two slices [0, V1) and [V1, V), each its own buffer as a rank's */
        int V1 = V / 2, V2 = V - V1;
        std::vector<unsigned char> s1(sizeof(T) * N * V1 + 32), s2(sizeof(T) * N * V2 + 32);
        T *a = (T *)(((uintptr_t)s1.data() + 15) & ~(uintptr_t)15), *b = (T *)(((uintptr_t)s2.data() + 15) & ~(uintptr_t)15);
        for (int n = 0; n < N; n++) {
            memcpy(a + (size_t)n * V1, base + (size_t)n * V, sizeof(T) * V1);
            memcpy(b + (size_t)n * V2, base + (size_t)n * V + V1, sizeof(T) * V2);
        }
        std::vector<float> m1(N), m2(N), s1v(N), s2v(N), t1(N), t2(N), mx(N), se(N), tl(N), l2(N);
        emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1}, [&]() { ce_row_max_k<T, THREADS_E>(m1.data(), a, V1); });
        emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1}, [&]() { ce_row_max_k<T, THREADS_E>(m2.data(), b, V2); });
        for (int n = 0; n < N; n++) mx[n] = std::max(m1[n], m2[n]); /* the max all-reduce */
        emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1}, [&]() {
            ce_row_sumexp_k<T, THREADS_E>(s1v.data(), t1.data(), a, targets.data(), mx.data(), V1, 0);
        });
        emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1}, [&]() {
            ce_row_sumexp_k<T, THREADS_E>(s2v.data(), t2.data(), b, targets.data(), mx.data(), V2, V1);
        });
        for (int n = 0; n < N; n++) se[n] = s1v[n] + s2v[n], tl[n] = t1[n] + t2[n]; /* the sum all-reduces */
        emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1}, [&]() {
            ce_finish_k<T>(losses.data(), a, targets.data(), mx.data(), se.data(), tl.data(), V1, 0, dscale);
        });
        emu_launch(dim3_{(unsigned)N, 1, 1}, dim3_{THREADS_E, 1, 1}, [&]() {
            ce_finish_k<T>(l2.data(), b, targets.data(), mx.data(), se.data(), tl.data(), V2, V1, dscale);
        });
        for (int n = 0; n < N; n++) {
            memcpy(base + (size_t)n * V, a + (size_t)n * V1, sizeof(T) * V1);
            memcpy(base + (size_t)n * V + V1, b + (size_t)n * V2, sizeof(T) * V2);
        }
    }
    double worst_loss = 0, worst_grad = 0, gstep = sizeof(T) == 2 ? 1.0 / 128 : 1e-5;
    for (int n = 0; n < N; n++) {
        double want;
        std::vector<double> g;
        reference(x[n], targets[n], dscale, &want, g);
        worst_loss = std::max(worst_loss, fabs(losses[n] - want) / std::max(1.0, fabs(want)));
        for (int i = 0; i < V; i++) {
            double got = get(base, (size_t)n * V + i);
            worst_grad = std::max(worst_grad, fabs(got - g[i]) / (gstep * std::max(fabs(g[i]), 1e-3 * dscale)));
        }
    }
    char name[128];
    snprintf(name, sizeof name, "ce_emulated_%s_%s_v%d_offset%d_losses", type, vocab_parallel ? "vocab_parallel" : "whole",
             V, offset);
    result(name, worst_loss <= 1e-6, "relative error %.3g (limit %.3g)", worst_loss, 1e-6);
    snprintf(name, sizeof name, "ce_emulated_%s_%s_v%d_offset%d_gradient", type, vocab_parallel ? "vocab_parallel" : "whole",
             V, offset);
    result(name, worst_grad <= 1.0, "error %.3g steps (limit %.3g)", worst_grad, 1.0);
}

/* a NaN logit makes that row's loss NaN, not a finite number: in the middle
 * of a thread's values, as the first value a thread sees, a whole vector */
static void nan_case(const char *where, std::vector<int> at) {
    const int V = 40;
    std::vector<unsigned char> store(4 * V + 16);
    float *row = (float *)(((uintptr_t)store.data() + 15) & ~(uintptr_t)15);
    for (int i = 0; i < V; i++) row[i] = uniform(-2, 2);
    for (int i : at) row[i] = NAN;
    int32_t t = 3;
    float loss = 0;
    emu_launch(dim3_{1, 1, 1}, dim3_{THREADS_E, 1, 1},
               [&]() { cross_entropy_k<float, THREADS_E>(&loss, row, &t, V, 0.0f); });
    char name[96];
    snprintf(name, sizeof name, "ce_emulated_nan_logit_%s_gives_nan_loss", where);
    result(name, std::isnan(loss), "loss %g%.0g", loss, 0.0);
}

int main() {
    int lengths[] = {1, 7, 8, 9, 100, 1500, 4099};
    for (int V : lengths)
        for (int offset : {0, 1, 3}) {
            run_case<float>("fp32", V, offset, false);
            run_case<bf16_t>("bf16", V, offset, false);
        }
    for (int V : {9, 1500}) {
        run_case<float>("fp32", V, 1, true);
        run_case<bf16_t>("bf16", V, 0, true);
    }
    nan_case("mid_vector", {17});
    nan_case("first_of_thread", {0});
    nan_case("whole_vector", {20, 21, 22, 23});
    return failures ? 1 : 0;
}
