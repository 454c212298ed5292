/* The MoE routing decisions' CUDA kernels (kernels/cuda/moe_plan.cuh, the
 * source the GPU build compiles, launched as kernels/cuda/moe.cu launches
 * them) on the CPU under tests/unit/cuda_emulation.h, against the CPU ops
 * (kernels/cpu/moe_plan.c): counts, coefficients, kept rows, the send order,
 * the per-expert counts and the received rows' order bitwise; the
 * statistics within 1e-12 relative (summed in another order); with and
 * without a capacity, over TP ranks, softmax and sigmoid, and with more
 * selections than one chunk of the counting sort. */
#include <string>

#include "tests/unit/cuda_emulation.h"

/* blocks of a few tokens and experts, and 32 partial sums: several of each at these sizes */
#define MOE_COUNT_TOKENS 7
#define MOE_COUNT_TILE 5
#define MOE_BALANCE_BLOCKS 32
#include "kernels/cuda/moe_plan.cuh"
#include "kernels/ops.h"

static int failures;

static void result(const std::string &name, bool ok, const char *why) {
    printf(ok ? "PASS %s\n" : "FAIL %s: %s\n", name.c_str(), why);
    failures += !ok;
}

enum { THREADS_T = 64 };
static dim3_ grid_of(long n) { return dim3_{(unsigned)((n + THREADS_T - 1) / THREADS_T), 1, 1}; }

template <typename T>
static bool same(const std::vector<T> &a, const std::vector<T> &b) {
    return a.size() == b.size() && !memcmp(a.data(), b.data(), sizeof(T) * a.size());
}

static void run_case(const char *tag, int n, int k, int E, int T, int tp, int sigmoid, double capacity_factor,
                     unsigned long long seed) {
    int B = tp * n / T, nk = n * k, BE = B * E;
    long cap = capacity_factor > 0 ? (long)ceil(capacity_factor * T * k / E) : -1;
    std::vector<int32_t> idx_all((size_t)tp * nk);
    std::vector<float> probs_all((size_t)tp * n * E), lse_all((size_t)tp * n);
    for (int t = 0; t < tp * n; t++) {
        for (int j = 0; j < k; j++) {
            int e;
            do { /* skewed: the low experts overflow */
                float u = emu_uniform(&seed, 0, 1);
                e = (int)(u * u * E) % E;
                for (int m = 0; m < j; m++) e = idx_all[(size_t)t * k + m] == e ? -1 : e;
            } while (e < 0);
            idx_all[(size_t)t * k + j] = e;
        }
        for (int e = 0; e < E; e++) probs_all[(size_t)t * E + e] = emu_uniform(&seed, 0.05f, 1);
        lse_all[t] = emu_uniform(&seed, -3, 3);
    }
    const struct backend *cpu = &cpu_backend;
    bool ok_counts = true, ok_coef = true, ok_stats = true, ok_pos = true, ok_rows = true, ok_ec = true;
    std::vector<float> all_cpu((size_t)tp * BE), all_emu((size_t)tp * BE);
    for (int r = 0; r < tp; r++) {
        const int32_t *idx = idx_all.data() + (size_t)r * nk;
        cpu->moe_route_counts(all_cpu.data() + (size_t)r * BE, idx, n, k, E, T, r * n, B);
        float *out = all_emu.data() + (size_t)r * BE;
        std::fill(out, out + BE, 0.0f); /* moe.cu zeroes them first */
        dim3_ grid = {(unsigned)((T + MOE_COUNT_TOKENS - 1) / MOE_COUNT_TOKENS), (unsigned)B,
                      (unsigned)((E + MOE_COUNT_TILE - 1) / MOE_COUNT_TILE)};
        emu_launch(grid, dim3_{THREADS_T, 1, 1}, [&]() { moe_counts_k(out, idx, n, k, E, T, r * n, B); });
    }
    ok_counts = same(all_cpu, all_emu);
    double f_scale = sigmoid ? (double)E / ((double)k * T) : (double)E / T;
    float aux_scale = 0.21f;
    for (int r = 0; r < tp; r++) {
        const int32_t *idx = idx_all.data() + (size_t)r * nk;
        const float *probs = probs_all.data() + (size_t)r * n * E, *lse = lse_all.data() + (size_t)r * n;
        std::vector<float> coef_c(BE), coef_e(BE), ec_c(E), ec_e(E);
        std::vector<double> met_c(E + 3, 0.0), met_e(E + 3, 0.0);
        cpu->moe_route_balance(coef_c.data(), met_c.data(), all_cpu.data(), probs, lse, n, E, k, T, r * n, B, tp, r,
                               sigmoid, aux_scale, cap);
        const float *all = all_emu.data();
        float *coef = coef_e.data();
        double *met = met_e.data();
        emu_launch(grid_of(BE), dim3_{THREADS_T, 1, 1},
                   [&]() { moe_coef_k(coef, met, all, E, T, BE, tp, r, f_scale, aux_scale, cap); });
        std::vector<double> part_v(2 * MOE_BALANCE_BLOCKS);
        double *part = part_v.data();
        emu_launch(dim3_{MOE_BALANCE_BLOCKS, 1, 1}, dim3_{THREADS_T, 1, 1},
                   [&]() { moe_balance_k(part, all, probs, lse, n, E, T, r * n, BE, tp, sigmoid); });
        emu_launch(dim3_{1, 1, 1}, dim3_{MOE_BALANCE_BLOCKS, 1, 1},
                   [&]() { moe_balance_sum_k(met, part, E, T, f_scale); });
        ok_coef &= same(coef_c, coef_e);
        for (int i = 0; i < E + 3; i++)
            ok_stats &= fabs(met_c[i] - met_e[i]) <= 1e-12 * fmax(fabs(met_c[i]), 1e-30);
        /* the capacity and the counting sort */
        std::vector<int32_t> pos_c(nk), pos_e(nk), rows_c(nk), rows_e(nk);
        cpu->moe_dispatch(pos_c.data(), rows_c.data(), ec_c.data(), idx, all_cpu.data(), n, k, E, T, r * n, B, r, cap);
        int chunks = (nk + MOE_PLAN_CHUNK - 1) / MOE_PLAN_CHUNK, capped = cap >= 0;
        std::vector<int32_t> hist((size_t)(chunks + 1) * (E + 1));
        int32_t *pos = pos_e.data(), *rows = rows_e.data(), *h = hist.data();
        float *ec = ec_e.data();
        if (capped)
            emu_launch(grid_of(BE), dim3_{THREADS_T, 1, 1},
                       [&]() { moe_keep_k(pos, idx, all, n, k, E, T, r * n, B, r, cap); });
        emu_launch(grid_of(chunks), dim3_{THREADS_T, 1, 1}, [&]() { moe_hist_k(h, pos, idx, nk, E, capped); });
        emu_launch(dim3_{1, 1, 1}, dim3_{THREADS_T, 1, 1},
                   [&]() { moe_scan_k(h, h + (size_t)chunks * (E + 1), ec, chunks, E); });
        emu_launch(grid_of(chunks), dim3_{THREADS_T, 1, 1},
                   [&]() { moe_assign_k(pos, rows, h, idx, nk, k, E, capped); });
        ok_pos &= same(pos_c, pos_e);
        ok_rows &= same(rows_c, rows_e);
        ok_ec &= same(ec_c, ec_e);
    }
    std::string s = std::string("_") + tag;
    result("moe_plan_emulated_counts" + s, ok_counts, "per-sequence counts differ from the CPU op's");
    result("moe_plan_emulated_coef" + s, ok_coef, "balance coefficients differ from the CPU op's");
    result("moe_plan_emulated_stats" + s, ok_stats, "statistics differ from the CPU op's by more than 1e-12");
    result("moe_plan_emulated_pos" + s, ok_pos, "kept selections' rows differ from the CPU op's");
    result("moe_plan_emulated_send_rows" + s, ok_rows, "send order differs from the CPU op's");
    result("moe_plan_emulated_expert_counts" + s, ok_ec, "kept rows per expert differ");
}

static void order_case(int ep, int El, unsigned long long seed) {
    std::vector<float> in((size_t)ep * El);
    int total = 0;
    for (float &v : in) total += (int)(v = (float)(int)emu_uniform(&seed, 0, 6));
    std::vector<int32_t> oc(total), ic(total), offc(El + 1), oe(total), ie(total), offe(El + 1),
        blocks(2 * (size_t)ep * El);
    cpu_backend.moe_expert_order(oc.data(), ic.data(), offc.data(), in.data(), ep, El, total);
    int32_t *o = oe.data(), *i = ie.data(), *off = offe.data(), *b = blocks.data();
    const float *src = in.data();
    emu_launch(dim3_{1, 1, 1}, dim3_{32, 1, 1}, [&]() { moe_offsets_k(off, b, src, ep, El); });
    emu_launch(grid_of(total + 5), dim3_{THREADS_T, 1, 1}, [&]() { moe_order_k(o, i, b, off, src, ep, El, total + 5); });
    result("moe_plan_emulated_expert_order_ep" + std::to_string(ep) + "_el" + std::to_string(El),
           same(oc, oe) && same(ic, ie) && same(offc, offe), "order, inverse or offsets differ from the CPU op's");
}

int main() {
    /* n tokens per TP rank, k, E, T, tp, sigmoid, capacity factor */
    run_case("softmax_tp1", 40, 2, 8, 20, 1, 0, 0, 1);
    run_case("softmax_tp2_capacity", 24, 2, 8, 16, 2, 0, 1.0, 2);
    run_case("sigmoid_tp3_capacity_split_sequences", 16, 3, 16, 24, 3, 1, 1.25, 3);
    run_case("sigmoid_chunks", 200, 4, 32, 100, 2, 1, 0, 4); /* 800 selections: 4 chunks */
    run_case("softmax_chunks_capacity", 160, 2, 8, 80, 1, 0, 0.75, 5);
    order_case(1, 8, 6);
    order_case(2, 4, 7);
    order_case(4, 3, 8);
    return failures ? 1 : 0;
}
