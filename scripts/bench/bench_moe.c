/* MoE layer throughput: forward + backward of one MoE FFN (router, top-k
 * dispatch, SwiGLU experts, gate-weighted combine; a DeepSeek-V3 layer's
 * shared experts are a dense SwiGLU beside it, not part of it) on random
 * hidden states, through the same code `mtrain pretrain` runs (model/moe.c).
 *
 *   bench_moe HIDDEN MOE_FFN EXPERTS TOP_K TOKENS STEPS [DEVICE]
 *   bench_moe --recipe FILE STEPS [DEVICE [PRECISION]]
 *
 * The first form is a Mixtral layer in fp32; the second the MoE layer of a
 * recipe's model (scripts/bench/shapes/), train.micro_batch x train.seq_len
 * tokens, in PRECISION (default fp32). Prints one JSON object: median
 * seconds per forward+backward, tokens/s, achieved GFLOP/s (6 x (router +
 * k experts' three matrices) x hidden x ffn per token), and the blocking
 * copies to the host per layer forward + backward. Under MTRAIN_PROFILE=1
 * the timed passes run on the profiled table, its table goes to stderr, and
 * the JSON has the backend ops per layer (each at least one kernel launch on
 * the GPU) instead of the copies (the profiler's own waits are copies). */
#include <omp.h>
#include <string.h>

#include "config/common.h"
#include "kernels/profile.h"
#include "model/moe.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    static struct recipe r;
    recipe_defaults(&r);
    struct model_config *mc = &r.model;
    int from_recipe = argc > 1 && !strcmp(argv[1], "--recipe"), steps, B = 1, T;
    const char *device = "cpu", *precision = "fp32";
    if (from_recipe) {
        if (argc < 4 || argc > 6) die("usage: bench_moe --recipe FILE STEPS [DEVICE [PRECISION]]");
        if (recipe_load(&r, argv[2]) != 0) return 2;
        if (mc->num_experts < 1) die("bench_moe: %s has no MoE layer (model.num_experts is 0)", argv[2]);
        steps = atoi(argv[3]);
        if (argc > 4) device = argv[4];
        if (argc > 5) precision = argv[5];
        B = r.train.micro_batch, T = r.train.seq_len;
        /* the one layer: MoE, no dense layers before it, no MTP module after it */
        mc->num_layers = 1, mc->first_k_dense = 0, mc->mtp_depth = 0, mc->moe_layer_freq = 1;
    } else {
        if (argc < 7 || argc > 8) die("usage: bench_moe HIDDEN MOE_FFN EXPERTS TOP_K TOKENS STEPS [DEVICE]");
        int C = atoi(argv[1]), FM = atoi(argv[2]), E = atoi(argv[3]), K = atoi(argv[4]);
        T = atoi(argv[5]), steps = atoi(argv[6]);
        if (argc > 7) device = argv[7];
        if (C < 16 || FM < 1 || E < K || K < 1 || T < 1) die("bad arguments");
        snprintf(mc->arch, sizeof mc->arch, "mixtral");
        mc->hidden_size = C, mc->num_layers = 1, mc->num_heads = C / 16, mc->num_kv_heads = C / 16;
        mc->num_experts = E, mc->experts_per_token = K, mc->moe_intermediate_size = FM, mc->moe_layer_freq = 1;
        mc->intermediate_size = FM;
    }
    if (steps < 1) die("bench_moe: STEPS must be at least 1");
    const struct backend *be = backend_get(device, precision);
    if (!be) return 1;
    int profiling = profile_requested();
    if (profiling) be = backend_profiled(be);
    int C = mc->hidden_size, N = B * T, E = mc->num_experts, K = mc->experts_per_token;
    int FM = mc->moe_intermediate_size ? mc->moe_intermediate_size : mc->intermediate_size;
    struct model_part part;
    model_part_full(&part, mc);
    struct transformer m;
    transformer_create(&m, be, mc, &part, NULL, 0, B, T, 1, NULL, RECOMPUTE_NONE, 0);
    transformer_init_params(&m, 1);
    transformer_sync_weights(&m);
    transformer_set_moe_sequences(&m, B);
    /* random hidden states and output gradient, in the table's storage precision */
    float *h = xmalloc(sizeof(float) * N * C);
    uint64_t s = 42;
    for (size_t i = 0; i < (size_t)N * C; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        h[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    struct act_slot *slot = &m.slots[0];
    float *x = slot->acts[0].ln2, *dout = m.tmp_full, *f32 = be->alloc(sizeof(float) * N * C);
    be->from_host(f32, h, sizeof(float) * N * C);
    be->to_storage(x, f32, (size_t)N * C);
    be->to_storage(dout, f32, (size_t)N * C);
    be->free(f32);
    m.moe_collect = 1;
    double *t = xmalloc(sizeof(double) * steps);
    long copies = 0;
    for (int i = -1; i < steps; i++) { /* one warm-up */
        if (i == 0 && profiling) profile_reset();
        double t0 = now_seconds();
        long c0 = backend_d2h_copies();
        moe_forward(&m, &slot->acts[0], 0, x, m.moe_out);
        moe_backward(&m, &slot->acts[0], 0, dout, m.d_moe_in);
        if (i >= 0) copies += backend_d2h_copies() - c0;
        float probe;
        be->to_host(&probe, m.d_moe_in, sizeof probe); /* waits for the device */
        if (i >= 0) t[i] = now_seconds() - t0;
    }
    /* profiled, the copies are the profiler's waits: the ops instead */
    char counts[64];
    snprintf(counts, sizeof counts, "\"d2h_copies_per_layer\":%.1f", (double)copies / steps);
    if (profiling) {
        profile_report(stderr, steps);
        snprintf(counts, sizeof counts, "\"ops_per_layer\":%.1f", (double)profile_op_calls() / steps);
    }
    qsort(t, steps, sizeof *t, cmp_double);
    double sec = t[steps / 2];
    double flops = 6.0 * N * ((double)C * E + 3.0 * K * C * FM);
    printf("{\"arch\":\"%s\",\"hidden\":%d,\"moe_ffn\":%d,\"experts\":%d,\"top_k\":%d,\"score\":\"%s\",\"tokens\":%d,"
           "\"threads\":%d,\"device\":\"%s\",\"precision\":\"%s\",\"step_s\":%.5f,\"tokens_per_s\":%.1f,"
           "\"gflops\":%.2f,\"flops_per_step\":%.6g,%s}\n",
           mc->arch, C, FM, E, K, mc->moe_score_func, N, omp_get_max_threads(), be->name, precision, sec, N / sec,
           flops / sec / 1e9, flops, counts);
    free(t);
    free(h);
    transformer_free(&m);
    return 0;
}
