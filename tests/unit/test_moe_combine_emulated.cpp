/* The MoE combine kernels (kernels/cuda/moe_combine.cuh, the source the GPU
 * build compiles) on the CPU under tests/unit/cuda_emulation.h: the bf16
 * instances on bf16 rows give bitwise what the fp32 kernels give on the
 * widened rows, rounded once (the widening path they replace), and the fp32
 * kernels equal the CPU backend's ops (kernels/cpu/moe.c) within 1e-6
 * relative (the fp32 sums may fuse differently); with dropped selections,
 * accumulate on and off, weights and none. */
#include <string>

#include "tests/unit/cuda_emulation.h"

#include "kernels/bf16.h"
#include "kernels/cuda/moe_combine.cuh"
#include "kernels/ops.h"

static int failures;

static void result(const std::string &name, bool ok, const char *why) {
    printf(ok ? "PASS %s\n" : "FAIL %s: %s\n", name.c_str(), why);
    failures += !ok;
}

static bool close(const std::vector<float> &a, const std::vector<float> &b, double tol) {
    for (size_t i = 0; i < a.size(); i++)
        if (fabs((double)a[i] - b[i]) > tol * fmax(fabs((double)b[i]), 1e-3)) return false;
    return true;
}

static void run_case(int n, int k, int C, int rows, int accumulate, bool weights, unsigned long long seed) {
    std::vector<int32_t> pos((size_t)n * k);
    for (size_t i = 0; i < pos.size(); i++) /* distinct rows, some dropped */
        pos[i] = emu_uniform(&seed, 0, 1) < 0.15f ? -1 : (int32_t)(i % rows);
    std::vector<float> w((size_t)n * k), y32((size_t)rows * C), out32((size_t)n * C), dout32((size_t)n * C);
    std::vector<bf16_t> y16(y32.size()), out16(out32.size()), dout16(dout32.size());
    auto fill = [&](std::vector<float> &f, std::vector<bf16_t> &h) {
        for (size_t i = 0; i < f.size(); i++) {
            h[i].bits = bf16_bits(emu_uniform(&seed, -2, 2));
            f[i] = bf16_to_float(h[i].bits); /* the widened bf16 value */
        }
    };
    fill(y32, y16), fill(out32, out16), fill(dout32, dout16);
    for (float &v : w) v = emu_uniform(&seed, 0, 1);
    const float *wp = weights ? w.data() : NULL;
    dim3_ grid{(unsigned)((n * C + 63) / 64), 1, 1}, block{64, 1, 1};
    std::vector<float> cpu_out = out32;
    cpu_backend.moe_combine(cpu_out.data(), y32.data(), pos.data(), wp, n, k, C, accumulate);
    float *o32 = out32.data();
    bf16_t *o16 = out16.data();
    emu_launch(grid, block, [&]() { moe_combine_k<float>(o32, y32.data(), pos.data(), wp, n, k, C, accumulate); });
    emu_launch(grid, block, [&]() { moe_combine_k<bf16_t>(o16, y16.data(), pos.data(), wp, n, k, C, accumulate); });
    bool same = true;
    for (size_t i = 0; i < out32.size(); i++) same &= out16[i].bits == bf16_bits(out32[i]);
    std::string tag = "_n" + std::to_string(n) + "_k" + std::to_string(k) + "_C" + std::to_string(C) +
                      (accumulate ? "_acc" : "") + (weights ? "" : "_unweighted");
    result("moe_combine_bf16_is_rounded_fp32" + tag, same, "the bf16 instance differs from the fp32 kernel, rounded");
    result("moe_combine_fp32_vs_cpu" + tag, close(out32, cpu_out, 1e-6), "the fp32 kernel differs from the CPU op");
    if (!weights) return;
    /* backward */
    std::vector<float> dy32((size_t)rows * C, 0.0f), dw32((size_t)n * k), cdy((size_t)rows * C, 0.0f), cdw((size_t)n * k);
    std::vector<bf16_t> dy16((size_t)rows * C);
    std::vector<float> dw16((size_t)n * k);
    cpu_backend.moe_combine_backward(cdy.data(), cdw.data(), dout32.data(), y32.data(), pos.data(), w.data(), n, k, C);
    dim3_ gdy{(unsigned)((n * k * C + 63) / 64), 1, 1}, gdw{(unsigned)(n * k), 1, 1};
    float *d32 = dy32.data(), *w32 = dw32.data(), *w16 = dw16.data();
    bf16_t *d16 = dy16.data();
    emu_launch(gdy, block, [&]() { moe_combine_dy_k<float>(d32, dout32.data(), pos.data(), w.data(), n, k, C); });
    emu_launch(gdy, block, [&]() { moe_combine_dy_k<bf16_t>(d16, dout16.data(), pos.data(), w.data(), n, k, C); });
    emu_launch(gdw, block, [&]() { moe_combine_dw_k<float>(w32, dout32.data(), y32.data(), pos.data(), k, C); });
    emu_launch(gdw, block, [&]() { moe_combine_dw_k<bf16_t>(w16, dout16.data(), y16.data(), pos.data(), k, C); });
    same = true;
    for (size_t i = 0; i < dy32.size(); i++) same &= dy16[i].bits == bf16_bits(dy32[i]);
    same &= !memcmp(dw32.data(), dw16.data(), sizeof(float) * dw32.size());
    result("moe_combine_backward_bf16_is_rounded_fp32" + tag, same, "the bf16 backward differs from the fp32 kernels");
    result("moe_combine_backward_fp32_vs_cpu" + tag, close(dy32, cdy, 1e-6) && close(dw32, cdw, 1e-6),
           "the fp32 backward differs from the CPU op");
}

int main() {
    run_case(6, 2, 40, 12, 0, true, 1);
    run_case(5, 3, 33, 15, 1, true, 2);
    run_case(4, 2, 64, 8, 0, false, 3);
    return failures ? 1 : 0;
}
