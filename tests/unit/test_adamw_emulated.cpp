/* The AdamW kernel (kernels/cuda/adamw.cuh, the source the GPU build
 * compiles) on the CPU under tests/unit/cuda_emulation.h: every parameter
 * updated exactly once, by the 16-byte vector loop or the scalar one,
 * whatever the length and each buffer's offset from a 16-byte boundary, and
 * bitwise what the one-parameter update gives (weights, both moments and
 * the bf16 working copy), over three steps. */
#include <string>

#include "tests/unit/cuda_emulation.h"

#include "kernels/bf16.h"
#include "kernels/cuda/adamw.cuh"

static int failures;

static void run_case(size_t n, int offset, int offset_work, bool with_work, int offset_grad = -1) {
    enum { BLOCKS = 2, THREADS_T = 32 };
    std::vector<float> store[4];
    float *buf[4];
    unsigned long long s = n * 31 + offset;
    for (int b = 0; b < 4; b++) {
        store[b].assign(n + 8, 0.0f);
        float *base = store[b].data();
        while ((uintptr_t)base & 15) base++;
        buf[b] = base + (b == 1 && offset_grad >= 0 ? offset_grad : offset);
        for (size_t i = 0; i < n; i++) {
            float r = emu_uniform(&s, -0.5f, 0.5f);
            buf[b][i] = b == 3 ? r * r : r; /* v >= 0 */
        }
    }
    std::vector<uint16_t> wstore(n + 8);
    uint16_t *work = with_work ? wstore.data() + offset_work : NULL;
    std::vector<float> p(buf[0], buf[0] + n), m(buf[2], buf[2] + n), v(buf[3], buf[3] + n);
    bool same = true;
    for (int step = 1; step <= 3; step++) {
        adamw_step a = {0.9f, 0.95f, 1e-8f, 1.0f - 1e-3f, 1e-2f / (1.0f - powf(0.9f, step)),
                        sqrtf(1.0f - powf(0.95f, step)), 0.5f};
        emu_launch(dim3_{BLOCKS, 1, 1}, dim3_{THREADS_T, 1, 1},
                   [&]() { adamw_k(buf[0], buf[1], buf[2], buf[3], n, a, work); });
        for (size_t i = 0; i < n; i++) {
            adamw1(p[i], buf[1][i], m[i], v[i], a);
            same = same && !memcmp(&p[i], &buf[0][i], 4) && !memcmp(&m[i], &buf[2][i], 4) &&
                   !memcmp(&v[i], &buf[3][i], 4) && (!work || work[i] == bf16_bits(p[i]));
        }
    }
    printf("%s adamw_emulated_n%zu_offset%d%s%s%s\n", same ? "PASS" : "FAIL", n, offset,
           offset_grad >= 0 ? ("_grad_offset" + std::to_string(offset_grad)).c_str() : "",
           with_work ? "_work_offset" : "", with_work ? std::to_string(offset_work).c_str() : "");
    if (!same) failures++;
}

int main() {
    size_t lengths[] = {1, 3, 4, 5, 8, 67, 1001};
    for (size_t n : lengths)
        for (int offset = 0; offset < 4; offset++) run_case(n, offset, offset, offset != 1); /* all in one phase */
    run_case(1001, 0, 2, true); /* the copy only 4-byte aligned: the scalar loop */
    run_case(1001, 0, 4, true);
    run_case(1001, 0, 0, true, 1); /* the gradient alone misaligned: the scalar loop */
    return failures ? 1 : 0;
}
