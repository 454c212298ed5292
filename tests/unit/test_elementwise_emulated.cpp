/* SwiGLU forward and backward, add and scale (kernels/cuda/elementwise.cuh,
 * the source the GPU build compiles) on the CPU under
 * tests/unit/cuda_emulation.h, on fp32 and bf16 storage: every element
 * written once, by the 16-byte vector loop or the scalar one, whatever the
 * length and the buffers' offsets from a 16-byte boundary, and bitwise what
 * the one-element functions give (rounded as the storage rounds). */
#include <string>

#include "tests/unit/cuda_emulation.h"

#include "kernels/cuda/elementwise.cuh"

static int failures;
static unsigned long long rng = 11;

static float uniform() { return emu_uniform(&rng, -4.0f, 4.0f); }

/* a buffer of n values of T at offset elements past a 16-byte boundary */
template <typename T>
struct buffer {
    std::vector<unsigned char> store;
    T *p;
    buffer(size_t n, int offset) : store(sizeof(T) * (n + 16) + 16) {
        p = (T *)(((uintptr_t)store.data() + 15) & ~(uintptr_t)15) + offset;
        for (size_t i = 0; i < n; i++) st(p, i, uniform());
    }
};

template <typename T>
static void run(const char *type, size_t n, int offset, int other_offset) {
    buffer<T> a(n, offset), b(n, other_offset), c(n, offset), d(n, offset), e(n, offset);
    std::vector<float> ga(n), gb(n), gc(n);
    for (size_t i = 0; i < n; i++) ga[i] = ld(a.p, i), gb[i] = ld(b.p, i), gc[i] = ld(c.p, i);
    auto launch = [&](auto body) { emu_launch(dim3_{2, 1, 1}, dim3_{32, 1, 1}, body); };
    bool ok = true;
    /* forward: d = swiglu(a, b) */
    launch([&]() { swiglu_forward_k<T>(d.p, a.p, b.p, n); });
    for (size_t i = 0; i < n; i++) {
        T want[1];
        st(want, 0, swiglu1(ga[i], gb[i]));
        ok = ok && !memcmp(&want[0], &d.p[i], sizeof(T));
    }
    /* backward: (d, e) = grads of swiglu at (a, b) for dout c */
    launch([&]() { swiglu_backward_k<T>(d.p, e.p, c.p, a.p, b.p, n); });
    for (size_t i = 0; i < n; i++) {
        float dg, du;
        swiglu_grad1(gc[i], ga[i], gb[i], &dg, &du);
        T w[2];
        st(w, 0, dg), st(w, 1, du);
        ok = ok && !memcmp(&w[0], &d.p[i], sizeof(T)) && !memcmp(&w[1], &e.p[i], sizeof(T));
    }
    /* a += b, then a *= 0.75 */
    launch([&]() { add_k<T>(a.p, b.p, n); });
    launch([&]() { scale_k<T>(a.p, 0.75f, n); });
    for (size_t i = 0; i < n; i++) {
        T w[1];
        st(w, 0, ga[i] + gb[i]);
        st(w, 0, ld(w, 0) * 0.75f);
        ok = ok && !memcmp(&w[0], &a.p[i], sizeof(T));
    }
    printf("%s elementwise_emulated_%s_n%zu_offset%d_other%d\n", ok ? "PASS" : "FAIL", type, n, offset, other_offset);
    if (!ok) failures++;
}

int main() {
    size_t lengths[] = {1, 7, 8, 9, 100, 1001};
    for (size_t n : lengths)
        for (int offset : {0, 1, 3}) {
            run<float>("fp32", n, offset, offset);
            run<bf16_t>("bf16", n, offset, offset);
        }
    run<float>("fp32", 1001, 0, 2); /* one buffer misaligned: the scalar loop for all */
    run<bf16_t>("bf16", 1001, 0, 8);
    return failures ? 1 : 0;
}
