/* Training-step throughput of a backend on random tokens, and the rate of its
 * matmul (OpenBLAS or cuBLAS sgemm) measured in the same process.
 *
 *   bench_train LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ STEPS [DEVICE [TF32 [PRECISION [FP8_SCALING]]]]
 *   bench_train --recipe FILE STEPS [DEVICE [TF32 [PRECISION [FP8_SCALING]]]]
 *
 * The first form is a dense Llama stack; the second any model of a recipe
 * (its model section, train.micro_batch and train.seq_len; the MoE-shaped
 * stacks of scripts/bench/shapes/), one rank, one micro batch a step.
 * DEVICE is cpu (default) or cuda; TF32=1 lets cuBLAS use TF32 tensor cores;
 * PRECISION is fp32 (default), bf16 or fp8 (train.precision); under fp8
 * every block multiplies in FP8 (fp8_skip_layers 0: the stack stands for
 * the middle of a deep model) with FP8_SCALING tensor (default) or block. Prints one JSON
 * object: median step time, tokens/s, achieved GFLOP/s
 * (model_flops_per_token x tokens/s), the backend's matmul GFLOP/s and the
 * device memory in use after the steps (mtrain allocates all of it up front).
 * With MTRAIN_PROFILE=1 the timed steps run on the profiled table
 * (kernels/profile.h; slower: each op is waited for) and its table per step
 * goes to stderr. MTRAIN_ATTENTION chooses the CUDA attention (docs/model.md)
 * and DETERMINISTIC=0 sets train.deterministic false; the JSON's
 * "attention" names what ran the last attention backward. */
#include <omp.h>
#include <string.h>

#include "config/common.h"
#include "kernels/profile.h"
#include "model/flops.h"
#include "model/trainer.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Reading a value back waits for the device's queued work. */
static void sync(const struct backend *be, const float *dev) {
    float x;
    be->to_host(&x, dev, sizeof x);
}

/* Best of a few matmul_forward calls at the model's typical shapes. */
static double sgemm_gflops(const struct backend *be, int N, int K, int M) {
    float *h = xcalloc((size_t)N * K + (size_t)M * K, 4);
    for (size_t i = 0; i < (size_t)N * K + (size_t)M * K; i++) h[i] = (float)(i % 7) * 0.1f - 0.3f;
    float *a = be->alloc(sizeof(float) * N * K), *b = be->alloc(sizeof(float) * M * K);
    float *c = be->alloc(sizeof(float) * N * M);
    be->from_host(a, h, sizeof(float) * N * K);
    be->from_host(b, h + (size_t)N * K, sizeof(float) * M * K);
    double best = 1e30;
    be->matmul_forward(c, a, b, N, K, M, 0);
    sync(be, c);
    for (int r = 0; r < 5; r++) {
        double t0 = now_seconds();
        be->matmul_forward(c, a, b, N, K, M, 0);
        sync(be, c);
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    free(h);
    be->free(a), be->free(b), be->free(c);
    return 2.0 * N * K * M / best / 1e9;
}

/* the recipe of the --recipe form: its model, micro batch and sequence, on one rank */
static void load_shape(struct recipe *r, const char *path) {
    if (recipe_load(r, path) != 0) exit(2);
    struct parallel_config one = {.tp = 1, .pp = 1, .ep = 1, .cp = 1, .vpp = 1, .etp = 1};
    snprintf(one.comm, sizeof one.comm, "auto");
    snprintf(one.schedule, sizeof one.schedule, "auto");
    r->parallel = one;
    r->train.global_batch = r->train.micro_batch;
    if (recipe_validate_plan(r, 1) != 0) exit(2);
}

int main(int argc, char **argv) {
    static struct recipe r;
    recipe_defaults(&r);
    /* a: the arguments after the model's (STEPS onwards) */
    int from_recipe = argc > 1 && !strcmp(argv[1], "--recipe"), first = from_recipe ? 3 : 9, n = argc - first;
    if (n < 1 || n > 5)
        die("usage: bench_train LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ STEPS [DEVICE [TF32 [PRECISION "
            "[FP8_SCALING]]]]\n       bench_train --recipe FILE STEPS [DEVICE [TF32 [PRECISION [FP8_SCALING]]]]");
    char **a = argv + first;
    if (from_recipe) {
        load_shape(&r, argv[2]);
    } else {
        r.model.num_layers = atoi(argv[1]);
        r.model.hidden_size = atoi(argv[2]);
        r.model.num_heads = atoi(argv[3]);
        r.model.num_kv_heads = atoi(argv[4]);
        r.model.intermediate_size = atoi(argv[5]);
        r.model.vocab_size = atoi(argv[6]);
        r.train.micro_batch = r.train.global_batch = atoi(argv[7]);
        r.train.seq_len = atoi(argv[8]);
    }
    const char *precision = n > 3 ? a[3] : "fp32";
    const struct backend *be = backend_get(n > 1 ? a[1] : "cpu", precision);
    if (!be) return 1;
    int profiling = profile_requested();
    if (profiling) be = backend_profiled(be);
    int tf32 = n > 2 && atoi(a[2]);
    const char *det = getenv("DETERMINISTIC");
    if (!strcmp(be->name, "cuda")) cuda_set_tf32(tf32), cuda_set_deterministic(!det || strcmp(det, "0"));
    int steps = atoi(a[0]), B = r.train.micro_batch, T = r.train.seq_len;
    if (steps < 1) die("bench_train: STEPS must be at least 1");
    r.train.steps = steps + 1;
    snprintf(r.train.precision, sizeof r.train.precision, "%s", precision);
    snprintf(r.train.fp8_scaling, sizeof r.train.fp8_scaling, "%s", n > 4 ? a[4] : "tensor");
    r.train.fp8_skip_layers = 0;
    struct trainer tr;
    struct grid g;
    grid_single(&g);
    trainer_create(&tr, be, &r, &g);
    transformer_init_params(&tr.model, 1);
    int32_t *samples = xmalloc(sizeof(int32_t) * B * (T + 1));
    uint64_t s = 7;
    for (int i = 0; i < B * (T + 1); i++) samples[i] = (int32_t)((s = s * 6364136223846793005ull + 1) >> 33) % r.model.vocab_size;
    double *times = xmalloc(sizeof(double) * steps), loss = 0;
    trainer_step(&tr, samples, B); /* warm-up: first touch of every buffer */
    if (profiling) profile_reset();
    long copies = 0; /* blocking copies to the host inside the steps (the loss's among them) */
    long slow0 = backend_fp8_reference_gemms();
    for (int i = 0; i < steps; i++) {
        double t0 = now_seconds();
        long c0 = backend_d2h_copies();
        loss = trainer_step(&tr, samples, B).loss;
        copies += backend_d2h_copies() - c0;
        sync(be, tr.model.params); /* the optimizer's kernels too */
        times[i] = now_seconds() - t0;
    }
    if (profiling) profile_report(stderr, steps), profile_counting(0);
    double step_s = median(times, steps), tokens = (double)B * T;
    double flops = model_flops_per_token(&r.model, T) * tokens;
    double mem = be->device_mem_mib ? be->device_mem_mib() : 0;
    /* the GEMM rates beside the step (the dense form only: a recipe's stack may leave no room for the head's
     * fp32 operands, which would lose the measurement above) */
    char g1[32] = "null", g2[32] = "null";
    if (!from_recipe) {
        snprintf(g1, sizeof g1, "%.2f", sgemm_gflops(be, B * T, r.model.hidden_size, r.model.intermediate_size));
        snprintf(g2, sizeof g2, "%.2f", sgemm_gflops(be, B * T, r.model.hidden_size, r.model.vocab_size));
    }
    printf("{\"device\":\"%s\",\"precision\":\"%s\",\"mem_mib\":%.1f,\"tf32\":%d,\"params\":%lld,\"threads\":%d,\"micro_batch\":%d,\"seq_len\":%d,\"steps\":%d,\"step_s\":%.4f,"
           "\"tokens_per_s\":%.2f,\"gflops\":%.2f,\"flops_per_step\":%.6g,\"sgemm_gflops_ffn\":%s,"
           "\"sgemm_gflops_head\":%s,\"final_loss\":%.4f,\"attention\":\"%s\","
           "\"arch\":\"%s\",\"d2h_copies_per_step\":%.1f,\"fp8_reference_gemms_per_step\":%.1f}\n",
           be->name, precision, mem, tf32, (long long)model_param_count(&r.model), omp_get_max_threads(), B, T, steps, step_s, tokens / step_s,
           flops / step_s / 1e9, flops, g1, g2, loss, cuda_attention_last(),
           r.model.arch, (double)copies / steps, (double)(backend_fp8_reference_gemms() - slow0) / steps);
    free(times);
    free(samples);
    trainer_free(&tr);
    return 0;
}
