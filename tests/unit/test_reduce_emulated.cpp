/* The sum kernel of the gradient norm (kernels/cuda/reduce.cuh, the source
 * the GPU build compiles) on the CPU under tests/unit/cuda_emulation.h:
 * every element counted exactly once, whatever the length and the address's
 * offset from a 16-byte boundary (the unaligned ends go to block 0's first
 * threads, the rest as float4 loads over the grid). The values are small
 * integers, so the double sums are exact and compared exactly. */
#include "tests/unit/cuda_emulation.h"

#include "kernels/cuda/reduce.cuh"

static int failures;

static void run_case(size_t n, int offset, int square) {
    enum { BLOCKS = 6, THREADS_T = 32 };
    std::vector<float> store(n + 8);
    float *base = store.data();
    while ((uintptr_t)base & 15) base++; /* 16-byte aligned, then offset floats on */
    float *x = base + offset;
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(i % 7) - 3.0f + (i == n / 2 ? 100.0f : 0.0f);
        want += square ? (double)x[i] * x[i] : x[i];
    }
    double part[BLOCKS];
    emu_launch(dim3_{BLOCKS, 1, 1}, dim3_{THREADS_T, 1, 1}, [&]() { reduce_k<THREADS_T>(part, x, n, square); });
    double got = 0;
    for (int b = 0; b < BLOCKS; b++) got += part[b];
    int ok = got == want;
    printf("%s reduce_emulated_%s_n%zu_offset%d%s", ok ? "PASS" : "FAIL", square ? "sum_squares" : "sum", n, offset,
           ok ? "\n" : "");
    if (!ok) printf(": %.17g, want %.17g\n", got, want), failures++;
}

int main() {
    size_t lengths[] = {1, 2, 3, 4, 5, 7, 8, 13, 100, 1001, 4099};
    for (size_t n : lengths)
        for (int offset = 0; offset < 4; offset++) run_case(n, offset, 1);
    run_case(4099, 1, 0);
    run_case(6, 3, 0);
    return failures ? 1 : 0;
}
