/* The flash attention kernels (kernels/cuda/flash_attention.cuh, the same
 * source the GPU build compiles) run on the CPU under an emulation of CUDA
 * blocks and warps, against the CPU bf16 and fp32 attention: so CI checks
 * their tiling, masks, online softmax, GQA indexing, backward algebra and
 * synchronisation without a GPU.
 *
 * Emulation (tests/unit/cuda_emulation.h): every CUDA thread of a block is
 * an OS thread; __syncthreads is a barrier over the block, and each
 * warp-collective instruction (shuffle, and here ldmatrix and mma.sync) is
 * an exchange through per-warp slots between two barriers over the warp,
 * with the register layouts written from the PTX ISA's definitions (not
 * from the kernels' assumptions):
 *   ldmatrix .x4: lanes 8i..8i+7 give the row addresses of matrix i; lane l
 *     receives, for each i, elements (row l/4, columns 2(l%4), 2(l%4)+1) of
 *     matrix i (.trans: of its transpose), the lower column in the low half.
 *   mma.m16n8k16 .row.col, g = l/4, t = l%4: A (16x16) a0 = A[g][2t..2t+1],
 *     a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; B (16x8)
 *     b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; C (16x8) c0, c1 =
 *     C[g][2t], C[g][2t+1], c2, c3 = C[g+8][2t], C[g+8][2t+1].
 * cp.async copies land at the thread's cp_async_wait, not before.
 * Slow, so the shapes are small; they still cover partial and several
 * tiles, the diagonal, both head dims and GQA. What it cannot check: the
 * hardware's own behaviour (the PTX layouts themselves, timing, the
 * real shared-memory limits); the GPU test (test_cuda_bf16) does. */
#include "tests/unit/cuda_emulation.h"

extern "C" {
#include "kernels/bf16.h"
#include "kernels/ops.h"
}

/* ---- the flash kernels' primitive layer (kernels/cuda/flash_attention.cuh) ---- */
#define FA_FN static inline
#define FA_KERNEL(name) static void name
#define FA_SHARED(name) uint16_t *name = block_smem
#define FA_CONST constexpr
#define fa_sync() __syncthreads()
#define fa_shfl_xor(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define fa_syncwarp() __syncwarp()

static uint16_t *block_smem;
static const uint16_t *xp[EMU_MAX_WARPS][32];
static uint32_t xa[EMU_MAX_WARPS][32][4], xb[EMU_MAX_WARPS][32][2];
static inline int lane_id() { return emu_lane(); }
static inline int warp_id() { return emu_warp(); }
static inline void warp_wait() { emu_warp_wait(); }

static inline uint32_t two(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

static inline void ldsm_any(uint32_t r[4], const uint16_t *p, int trans) {
    int w = warp_id(), l = lane_id(), g = l / 4, t = l % 4;
    xp[w][l] = p;
    warp_wait();
    for (int i = 0; i < 4; i++) {
        const uint16_t *const *rows = xp[w] + 8 * i; /* matrix i's 8 row addresses */
        r[i] = trans ? two(rows[2 * t][g], rows[2 * t + 1][g]) : two(rows[g][2 * t], rows[g][2 * t + 1]);
    }
    warp_wait();
}
static inline void ldsm(uint32_t r[4], const uint16_t *p) { ldsm_any(r, p, 0); }
static inline void ldsm_t(uint32_t r[4], const uint16_t *p) { ldsm_any(r, p, 1); }

static inline float half(uint32_t v, int hi) { return bf16_to_float((uint16_t)(hi ? v >> 16 : v & 0xffff)); }

static inline void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    int w = warp_id(), l = lane_id();
    memcpy(xa[w][l], a, sizeof xa[w][l]);
    xb[w][l][0] = b0, xb[w][l][1] = b1;
    warp_wait();
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int g = L / 4, t = L % 4;
        for (int e = 0; e < 2; e++) {
            A[g][2 * t + e] = half(xa[w][L][0], e);
            A[g + 8][2 * t + e] = half(xa[w][L][1], e);
            A[g][2 * t + 8 + e] = half(xa[w][L][2], e);
            A[g + 8][2 * t + 8 + e] = half(xa[w][L][3], e);
            B[2 * t + e][g] = half(xb[w][L][0], e);
            B[2 * t + 8 + e][g] = half(xb[w][L][1], e);
        }
    }
    warp_wait();
    int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = 0;
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        c[i] += s;
    }
}

static inline uint32_t pack2(float lo, float hi) { return two(bf16_bits(lo), bf16_bits(hi)); }
static inline float bf(uint16_t b) { return bf16_to_float(b); }

/* cp.async: each thread's copies wait in commit groups and land only when
 * a cp_async_wait lets them (the latest moment the hardware may), so a
 * tile read before its wait and barrier reads stale data and fails */
struct async_copy {
    void *dst;
    const void *src;
    int valid;
};
static thread_local std::vector<async_copy> open_group;
static thread_local std::vector<std::vector<async_copy>> groups;
static inline void cp_async16(void *dst, const void *src, int valid) { open_group.push_back({dst, src, valid}); }
static inline void cp_async_commit() {
    groups.push_back(open_group);
    open_group.clear();
}
static inline void cp_async_wait(size_t n) {
    while (groups.size() > n) {
        for (const async_copy &c : groups.front()) {
            if (c.valid) memcpy(c.dst, c.src, 16);
            else memset(c.dst, 0, 16);
        }
        groups.erase(groups.begin());
    }
}

namespace emulated {
#include "kernels/cuda/flash_attention.cuh"
}
using namespace emulated;

/* a kernel launch: THREADS_FA threads a block, smem_bytes of dynamic shared memory */
template <typename F>
static void launch(dim3_ grid, int threads, size_t smem_bytes, F body) {
    std::vector<uint16_t> smem(smem_bytes / 2 + 8, 0xffff); /* NaN until written */
    block_smem = smem.data();
    emu_launch(grid, dim3_{(unsigned)threads, 1, 1}, body, []() {
        size_t pending = open_group.size();
        for (const auto &gr : groups) pending += gr.size();
        groups.clear();
        if (pending) { /* a kernel leaves no copy in flight (empty groups are harmless) */
            fprintf(stderr, "FAIL flash_emulated: a block ended with cp.async copies pending\n");
            abort();
        }
    });
}

/* ---- the test ---- */
static int failures;
static unsigned long long seed = 11;
static float rnd() {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static double normwise(const std::vector<float> &got, const std::vector<float> &want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double d = (double)got[i] - want[i];
        num += d * d, den += (double)want[i] * want[i];
    }
    return std::isfinite(num) ? std::sqrt(num / (den > 0 ? den : 1)) : INFINITY;
}
static std::vector<float> widen(const std::vector<uint16_t> &x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = bf16_to_float(x[i]);
    return y;
}

static void check(const char *what, const char *tag, const std::vector<uint16_t> &got, const std::vector<uint16_t> &cpu16,
                  const std::vector<float> &f32) {
    std::vector<float> g = widen(got);
    double e16 = normwise(g, widen(cpu16)), e32 = normwise(g, f32);
    int ok = e16 <= 1e-2 && e32 <= 1e-2;
    printf("%s flash_emulated_%s_%s", ok ? "PASS" : "FAIL", what, tag);
    if (!ok) printf(": norm-wise error %.3g against the CPU bf16 op, %.3g against fp32", e16, e32), failures++;
    printf("\n");
}

template <int D, int DV>
static void run_case(int B, int T, int H, int KVH, const char *tag) {
    const struct backend *c16 = backend_get("cpu", "bf16"), *c32 = backend_get("cpu", "fp32");
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D, nv = (size_t)B * T * KVH * DV;
    size_t no = (size_t)B * T * H * DV;
    std::vector<uint16_t> q(nq), k(nk), v(nv), dout(no);
    for (auto *x : {&q, &k, &v, &dout})
        for (auto &e : *x) e = bf16_bits(rnd());
    /* CPU references: the bf16 table on the stored values, fp32 on them widened */
    size_t ns = c16->attention_state_floats(B, H, T);
    std::vector<uint16_t> o16(no), dq16(nq), dk16(nk), dv16(nv);
    std::vector<float> att(ns), att32(ns), o32(no), dq32(nq), dk32(nk), dv32(nv);
    std::vector<float> q32 = widen(q), k32 = widen(k), v32 = widen(v), do32 = widen(dout);
    c16->attention_forward((float *)o16.data(), att.data(), (float *)q.data(), (float *)k.data(), (float *)v.data(), B,
                           T, H, KVH, D, DV);
    c16->attention_backward((float *)dq16.data(), (float *)dk16.data(), (float *)dv16.data(), (float *)dout.data(),
                            (float *)o16.data(), att.data(), (float *)q.data(), (float *)k.data(), (float *)v.data(), B,
                            T, H, KVH, D, DV);
    c32->attention_forward(o32.data(), att32.data(), q32.data(), k32.data(), v32.data(), B, T, H, KVH, D, DV);
    c32->attention_backward(dq32.data(), dk32.data(), dv32.data(), do32.data(), o32.data(), att32.data(), q32.data(),
                            k32.data(), v32.data(), B, T, H, KVH, D, DV);

    /* the kernels, launched as kernels/cuda/flash_attention.cu launches them */
    std::vector<uint16_t> out(no), dq(nq), dk(nk), dv(nv);
    std::vector<float> lse((size_t)B * H * T), delta((size_t)B * H * T);
    int tiles = (T + TILE - 1) / TILE;
    float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E;
    launch(dim3_{(unsigned)(B * H), (unsigned)tiles, 1}, THREADS_FA, forward_smem<D, DV>(), [&]() {
        flash_forward_k<D, DV>(out.data(), lse.data(), q.data(), k.data(), v.data(), T, H, KVH, scale_log2, fa_blk{});
    });
    check("forward", tag, out, o16, o32);
    launch(dim3_{3, 1, 1}, THREADS_FA, 0, /* fewer blocks than rows: the grid-stride loop covers the rest */
           [&]() { delta_k(delta.data(), dout.data(), out.data(), B, T, H, DV); });
    launch(dim3_{(unsigned)(B * H), (unsigned)tiles, 1}, THREADS_FA, dq_smem<D, DV>(), [&]() {
        flash_dq_k<D, DV>(dq.data(), dout.data(), lse.data(), delta.data(), q.data(), k.data(), v.data(), T, H, KVH,
                          scale_log2, scale, fa_blk{});
    });
    launch(dim3_{(unsigned)(B * KVH), (unsigned)tiles, 1}, THREADS_FA, dkdv_smem<D, DV>(), [&]() {
        flash_dkdv_k<D, DV>(dk.data(), dv.data(), dout.data(), lse.data(), delta.data(), q.data(), k.data(), v.data(), T,
                            H, KVH, scale_log2, scale, fa_blk{});
    });
    check("backward_dq", tag, dq, dq16, dq32);
    check("backward_dk", tag, dk, dk16, dk32);
    check("backward_dv", tag, dv, dv16, dv32);
    /* the state: each row's log-sum-exp, as the CUDA reference attention keeps it */
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                double m = -INFINITY, s = 0;
                const float *qr = q32.data() + ((size_t)(b * T + t) * H + h) * D;
                std::vector<double> sc(t + 1);
                for (int j = 0; j <= t; j++) {
                    const float *kr = k32.data() + ((size_t)(b * T + j) * KVH + h / (H / KVH)) * D;
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)qr[i] * kr[i];
                    sc[j] = d * scale, m = sc[j] > m ? sc[j] : m;
                }
                for (int j = 0; j <= t; j++) s += std::exp(sc[j] - m);
                double want = m + std::log(s), got = lse[((size_t)b * H + h) * T + t];
                worst = std::fabs(got - want) > worst ? std::fabs(got - want) : worst;
            }
    int ok = worst <= 1e-3;
    printf("%s flash_emulated_lse_%s", ok ? "PASS" : "FAIL", tag);
    if (!ok) printf(": log-sum-exp off by %.3g (tol 1e-3)", worst), failures++;
    printf("\n");
}

/* the block form (context parallelism's ring steps, kernels/ops.h
 * attention_block_forward / _backward): rank r of cp holds chunks r and
 * 2cp-1-r of c rows; two ring steps, its own keys (first) then rank r+1's,
 * launched as flash_attention.cu's block_forward / block_backward launch
 * them, against the CPU fp32 block op on the same bf16 values: o and the
 * gradients within 1e-2 norm-wise, lse within 1e-3 */
static void check32(const char *what, const char *tag, const std::vector<float> &got, const std::vector<float> &want,
                    double tol) {
    double e = normwise(got, want);
    int ok = e <= tol;
    printf("%s flash_emulated_block_%s_%s", ok ? "PASS" : "FAIL", what, tag);
    if (!ok) printf(": norm-wise error %.3g against the CPU fp32 block op (tol %g)", e, tol), failures++;
    printf("\n");
}

template <int D, int DV>
static void block_case(int B, int c, int H, int KVH, int cp, int r, const char *tag) {
    const struct backend *c32 = backend_get("cpu", "fp32");
    size_t T2 = 2 * (size_t)c, nq = B * T2 * H * D, nk = B * T2 * KVH * D, nv = B * T2 * KVH * DV;
    size_t no = B * T2 * H * DV, ns = (size_t)B * H * T2;
    int own[2] = {r, 2 * cp - 1 - r}, next = (r + 1) % cp, oth[2] = {next, 2 * cp - 1 - next};
    std::vector<uint16_t> q(nq), ks[2] = {std::vector<uint16_t>(nk), std::vector<uint16_t>(nk)},
                                 vs[2] = {std::vector<uint16_t>(nv), std::vector<uint16_t>(nv)}, dout(no);
    for (auto *x : {&q, &ks[0], &ks[1], &vs[0], &vs[1], &dout})
        for (auto &e : *x) e = bf16_bits(rnd());
    std::vector<float> q32 = widen(q), k32[2] = {widen(ks[0]), widen(ks[1])}, v32[2] = {widen(vs[0]), widen(vs[1])};
    std::vector<float> do32 = widen(dout);
    const int *kc[2] = {own, oth};
    /* CPU fp32 */
    std::vector<float> o32(no), lse32(ns), dq32(nq, 0.0f), dk32[2] = {std::vector<float>(nk, 0.0f), std::vector<float>(nk, 0.0f)},
                                                  dv32[2] = {std::vector<float>(nv, 0.0f), std::vector<float>(nv, 0.0f)};
    for (int s = 0; s < 2; s++)
        c32->attention_block_forward(o32.data(), lse32.data(), q32.data(), k32[s].data(), v32[s].data(), B, c, H, KVH,
                                     D, DV, own[0], own[1], kc[s][0], kc[s][1], s == 0);
    std::vector<uint16_t> out(no); /* the stored output both backwards read */
    for (size_t i = 0; i < no; i++) out[i] = bf16_bits(o32[i]);
    std::vector<float> out32 = widen(out);
    for (int s = 0; s < 2; s++)
        c32->attention_block_backward(dq32.data(), dk32[s].data(), dv32[s].data(), do32.data(), out32.data(),
                                      lse32.data(), q32.data(), k32[s].data(), v32[s].data(), B, c, H, KVH, D, DV,
                                      own[0], own[1], kc[s][0], kc[s][1]);
    /* the kernels */
    float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E;
    unsigned tiles = (unsigned)((c + TILE - 1) / TILE);
    std::vector<float> o(no, 0.0f), lse(ns, -INFINITY), delta(ns), dq(nq, 0.0f),
        dk[2] = {std::vector<float>(nk, 0.0f), std::vector<float>(nk, 0.0f)},
        dv[2] = {std::vector<float>(nv, 0.0f), std::vector<float>(nv, 0.0f)};
    for (int s = 0; s < 2; s++)
        fa_block_pairs(c, own[0], own[1], kc[s][0], kc[s][1], [&](int qi, int kj, int q_pos) {
            fa_blk blk = {(int)T2, q_pos, o.data() + (size_t)qi * c * H * DV, NULL, NULL, NULL};
            launch(dim3_{(unsigned)(B * H), tiles, 1}, THREADS_FA, forward_smem<D, DV>(), [&]() {
                flash_forward_k<D, DV, true>(NULL, lse.data() + (size_t)qi * c, q.data() + (size_t)qi * c * H * D,
                                             ks[s].data() + (size_t)kj * c * KVH * D,
                                             vs[s].data() + (size_t)kj * c * KVH * DV, c, H, KVH, scale_log2, blk);
            });
        });
    check32("forward_o", tag, o, o32, 1e-2);
    double worst = 0;
    for (size_t i = 0; i < ns; i++) worst = std::fmax(worst, std::fabs((double)lse[i] - lse32[i]));
    int ok = worst <= 1e-3;
    printf("%s flash_emulated_block_lse_%s", ok ? "PASS" : "FAIL", tag);
    if (!ok) printf(": log-sum-exp off by %.3g (tol 1e-3)", worst), failures++;
    printf("\n");
    launch(dim3_{3, 1, 1}, THREADS_FA, 0, [&]() { delta_k(delta.data(), dout.data(), out.data(), B, (int)T2, H, DV); });
    for (int s = 0; s < 2; s++)
        fa_block_pairs(c, own[0], own[1], kc[s][0], kc[s][1], [&](int qi, int kj, int q_pos) {
            size_t qo = (size_t)qi * c, ko = (size_t)kj * c;
            fa_blk blk = {(int)T2, q_pos, NULL, dq.data() + qo * H * D, dk[s].data() + ko * KVH * D,
                          dv[s].data() + ko * KVH * DV};
            const uint16_t *qq = q.data() + qo * H * D, *dd = dout.data() + qo * H * DV;
            const uint16_t *kk = ks[s].data() + ko * KVH * D, *vv = vs[s].data() + ko * KVH * DV;
            launch(dim3_{(unsigned)(B * H), tiles, 1}, THREADS_FA, dq_smem<D, DV>(), [&]() {
                flash_dq_k<D, DV, true>(NULL, dd, lse.data() + qo, delta.data() + qo, qq, kk, vv, c, H, KVH,
                                        scale_log2, scale, blk);
            });
            launch(dim3_{(unsigned)(B * KVH), tiles, 1}, THREADS_FA, dkdv_smem<D, DV>(), [&]() {
                flash_dkdv_k<D, DV, true>(NULL, NULL, dd, lse.data() + qo, delta.data() + qo, qq, kk, vv, c, H, KVH,
                                          scale_log2, scale, blk);
            });
        });
    check32("backward_dq", tag, dq, dq32, 1e-2);
    for (int s = 0; s < 2; s++) {
        check32(s ? "backward_dk_visiting" : "backward_dk_own", tag, dk[s], dk32[s], 1e-2);
        check32(s ? "backward_dv_visiting" : "backward_dv_own", tag, dv[s], dv32[s], 1e-2);
    }
}

int main() {
    /* partial and several tiles, the diagonal, GQA ratios 1, 2 and 4, head dims 64, 128 and 192/128 */
    run_case<64, 64>(1, 1, 2, 2, "t1_mha_d64");
    run_case<64, 64>(2, 130, 4, 1, "t130_gqa4_d64");
    run_case<128, 128>(1, 70, 4, 2, "t70_gqa2_d128");
    run_case<128, 128>(1, 64, 2, 2, "t64_mha_d128");
    run_case<128, 128>(1, 150, 2, 1, "t150_gqa2_d128"); /* three query tiles, the last partial */
    run_case<192, 128>(1, 80, 2, 2, "t80_mla_d192_dv128"); /* DeepSeek-V3's MLA heads */
    /* the block form: chunks of 70 rows (two tiles, the second partial) on the first rank of cp 2, a middle
     * rank of cp 3 (its visiting chunks both earlier, both later), GQA, MLA's head dims */
    block_case<64, 64>(2, 70, 2, 1, 2, 0, "cp2_r0_b2_c70_gqa2_d64");
    block_case<128, 128>(1, 33, 2, 2, 3, 1, "cp3_r1_c33_d128");
    block_case<192, 128>(1, 40, 2, 2, 2, 0, "cp2_r0_c40_mla_d192_dv128");
    return failures ? 1 : 0;
}
