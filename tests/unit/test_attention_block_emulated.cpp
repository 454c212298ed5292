/* The context-parallel attention block kernels (kernels/cuda/attention_block.cuh,
 * the source the GPU build compiles) on the CPU under tests/unit/cuda_emulation.h,
 * against the CPU backend's block ops (kernels/cpu/attention_block.c): one
 * rank's ring of cp blocks (every chunk pairing: the same chunk causally,
 * earlier chunks whole, later ones skipped), forward merged block by block
 * into the running output and log-sum-exp, then the backward of each block
 * (dq accumulated over the ring, dk and dv per block), within 1e-5 of the
 * largest value. GQA and MHA, Dv < D, head dims above one warp's width,
 * chunks shorter and longer than a warp's 32 rows. */
#include <string>

#include "tests/unit/cuda_emulation.h"

#include "kernels/cuda/attention_block.cuh"
#include "kernels/ops.h"

static int failures;

static void result(const std::string &name, bool ok, const char *why, double err) {
    if (ok) printf("PASS %s\n", name.c_str());
    else printf("FAIL %s: %s (relative error %.3g)\n", name.c_str(), why, err);
    failures += !ok;
}

/* the largest difference over the largest value of b */
static double rel_err(const std::vector<float> &a, const std::vector<float> &b) {
    double top = 1e-30, d = 0;
    for (size_t i = 0; i < a.size(); i++) {
        top = fmax(top, fabs((double)b[i]));
        if (!std::isfinite(a[i]) && a[i] != b[i]) return INFINITY;
        if (std::isfinite(b[i])) d = fmax(d, fabs((double)a[i] - b[i]));
    }
    return d / top;
}

static std::vector<float> rnd(size_t n, unsigned long long *s) {
    std::vector<float> v(n);
    for (auto &x : v) x = emu_uniform(s, -1.0f, 1.0f);
    return v;
}

static dim3_ warps(long n) { return dim3_{(unsigned)((n * 32 + 127) / 128), 1, 1}; }

static void ring(int cp, int r, int B, int c, int H, int KVH, int D, int Dv, unsigned long long seed) {
    int T = 2 * c;
    float scale = 1.0f / sqrtf((float)D);
    std::string tag = "cp" + std::to_string(cp) + "_r" + std::to_string(r) + "_c" + std::to_string(c) + "_h" +
                      std::to_string(H) + "_" + std::to_string(KVH) + "_d" + std::to_string(D) + "_" + std::to_string(Dv);
    std::vector<float> q = rnd((size_t)B * T * H * D, &seed), dout = rnd((size_t)B * T * H * Dv, &seed);
    std::vector<std::vector<float>> k(cp), v(cp);
    for (int s = 0; s < cp; s++) k[s] = rnd((size_t)B * T * KVH * D, &seed), v[s] = rnd((size_t)B * T * KVH * Dv, &seed);
    std::vector<float> o_ref((size_t)B * T * H * Dv), lse_ref((size_t)B * H * T);
    std::vector<float> o(o_ref.size(), NAN), lse(lse_ref.size(), NAN); /* first = 1 must not read them */
    int q0 = r, q1 = 2 * cp - 1 - r;
    for (int step = 0; step < cp; step++) {
        int s = (r - step + cp) % cp, k0 = s, k1 = 2 * cp - 1 - s;
        cpu_backend.attention_block_forward(o_ref.data(), lse_ref.data(), q.data(), k[s].data(), v[s].data(), B, c, H,
                                            KVH, D, Dv, q0, q1, k0, k1, step == 0);
        float *op = o.data(), *lp = lse.data();
        const float *kp = k[s].data(), *vp = v[s].data();
        emu_launch(warps((long)B * H * T), dim3_{128, 1, 1}, [&]() {
            attb_forward_k(op, lp, q.data(), kp, vp, B, c, H, KVH, D, Dv, q0, q1, k0, k1, step == 0, scale);
        });
    }
    double eo = rel_err(o, o_ref), el = rel_err(lse, lse_ref);
    result("attention_block_emulated_forward_" + tag, eo <= 1e-5 && el <= 1e-5, "output or lse differ from the CPU op",
           fmax(eo, el));
    /* backward from the CPU's final output and lse */
    std::vector<float> dq_ref(q.size(), 0.0f), dq(q.size(), 0.0f), delta((size_t)B * H * T);
    emu_launch(warps((long)B * H * T), dim3_{128, 1, 1},
               [&]() { attb_delta_k(delta.data(), dout.data(), o_ref.data(), B, T, H, Dv); });
    double edkv = 0;
    for (int step = 0; step < cp; step++) {
        int s = (r - step + cp) % cp, k0 = s, k1 = 2 * cp - 1 - s;
        std::vector<float> dk_ref(k[s].size(), 0.0f), dv_ref(v[s].size(), 0.0f), dk(dk_ref), dv(dv_ref);
        cpu_backend.attention_block_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), o_ref.data(),
                                             lse_ref.data(), q.data(), k[s].data(), v[s].data(), B, c, H, KVH, D, Dv,
                                             q0, q1, k0, k1);
        const float *kp = k[s].data(), *vp = v[s].data();
        emu_launch(warps((long)B * H * T), dim3_{128, 1, 1}, [&]() {
            attb_dq_k(dq.data(), dout.data(), lse_ref.data(), delta.data(), q.data(), kp, vp, B, c, H, KVH, D, Dv, q0,
                      q1, k0, k1, scale);
        });
        emu_launch(warps((long)B * KVH * T), dim3_{128, 1, 1}, [&]() {
            attb_dkv_k(dk.data(), dv.data(), dout.data(), lse_ref.data(), delta.data(), q.data(), kp, vp, B, c, H, KVH,
                       D, Dv, q0, q1, k0, k1, scale);
        });
        edkv = fmax(edkv, fmax(rel_err(dk, dk_ref), rel_err(dv, dv_ref)));
    }
    double eq = rel_err(dq, dq_ref);
    result("attention_block_emulated_backward_" + tag, eq <= 1e-5 && edkv <= 1e-5,
           "dq, dk or dv differ from the CPU op", fmax(eq, edkv));
}

int main() {
    /* cp, rank, B, c, H, KVH, D, Dv */
    ring(2, 0, 2, 5, 4, 2, 40, 24, 1);  /* GQA, D over one warp's width, Dv < D */
    ring(2, 1, 1, 5, 2, 2, 16, 16, 2);  /* MHA */
    ring(3, 1, 1, 3, 2, 1, 8, 8, 3);    /* three blocks: earlier, same and later chunks */
    ring(2, 1, 1, 34, 2, 1, 8, 12, 4);  /* chunks over 32 rows: two tiles of keys and of queries */
    return failures ? 1 : 0;
}
