/* MoE layer throughput: forward + backward of one Mixtral MoE FFN (router,
 * top-k dispatch, SwiGLU experts, gate-weighted combine) on random hidden
 * states, through the same code `mtrain pretrain` runs (model/moe.c).
 *
 *   bench_moe HIDDEN MOE_FFN EXPERTS TOP_K TOKENS STEPS [DEVICE]
 *
 * Prints one JSON object: median seconds per forward+backward, tokens/s and
 * achieved GFLOP/s (6 x (router + k experts) x hidden x ffn per token). */
#include <omp.h>
#include <string.h>

#include "config/common.h"
#include "model/moe.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 7 || argc > 8) die("usage: bench_moe HIDDEN MOE_FFN EXPERTS TOP_K TOKENS STEPS [DEVICE]");
    int C = atoi(argv[1]), FM = atoi(argv[2]), E = atoi(argv[3]), K = atoi(argv[4]), N = atoi(argv[5]);
    int steps = atoi(argv[6]);
    const struct backend *be = backend_get(argc > 7 ? argv[7] : "cpu", "fp32");
    if (!be || C < 16 || FM < 1 || E < K || K < 1 || N < 1 || steps < 1) die("bad arguments");
    static struct recipe r;
    recipe_defaults(&r);
    struct model_config *mc = &r.model;
    snprintf(mc->arch, sizeof mc->arch, "mixtral");
    mc->hidden_size = C, mc->num_layers = 1, mc->num_heads = C / 16, mc->num_kv_heads = C / 16;
    mc->num_experts = E, mc->experts_per_token = K, mc->moe_intermediate_size = FM, mc->moe_layer_freq = 1;
    mc->intermediate_size = FM;
    struct model_part part;
    model_part_full(&part, mc);
    struct transformer m;
    transformer_create(&m, be, mc, &part, NULL, 0, 1, N, 1, NULL, RECOMPUTE_NONE, 0);
    transformer_init_params(&m, 1);
    /* random hidden states and output gradient */
    float *h = xmalloc(sizeof(float) * N * C);
    uint64_t s = 42;
    for (size_t i = 0; i < (size_t)N * C; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        h[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    struct act_slot *slot = &m.slots[0];
    float *x = slot->acts[0].ln2, *dout = m.tmp_full;
    be->from_host(x, h, sizeof(float) * N * C);
    be->from_host(dout, h, sizeof(float) * N * C);
    m.moe_collect = 1;
    double *t = xmalloc(sizeof(double) * steps);
    for (int i = -1; i < steps; i++) { /* one warm-up */
        double t0 = now_seconds();
        moe_forward(&m, &slot->acts[0], 0, x, m.moe_out);
        moe_backward(&m, &slot->acts[0], 0, dout, m.d_moe_in);
        float probe;
        be->to_host(&probe, m.d_moe_in, sizeof probe);
        if (i >= 0) t[i] = now_seconds() - t0;
    }
    qsort(t, steps, sizeof *t, cmp_double);
    double sec = t[steps / 2];
    double flops = 6.0 * N * ((double)C * E + 3.0 * K * C * FM);
    printf("{\"hidden\":%d,\"moe_ffn\":%d,\"experts\":%d,\"top_k\":%d,\"tokens\":%d,\"threads\":%d,\"device\":\"%s\","
           "\"step_s\":%.5f,\"tokens_per_s\":%.1f,\"gflops\":%.2f}\n",
           C, FM, E, K, N, omp_get_max_threads(), be->name, sec, N / sec, flops / sec / 1e9);
    free(t);
    free(h);
    transformer_free(&m);
    return 0;
}
