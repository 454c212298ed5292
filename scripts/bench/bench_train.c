/* Training-step throughput of the CPU backend on random tokens, and the
 * machine's OpenBLAS sgemm rate measured in the same process.
 *
 *   bench_train LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ STEPS
 *
 * Prints one JSON object: median step time, tokens/s, achieved GFLOP/s
 * (model_flops_per_token x tokens/s) and sgemm GFLOP/s. */
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "config/common.h"
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

/* Best of a few sgemm calls at the model's typical shapes. */
static double sgemm_gflops(int N, int K, int M) {
    float *a = xcalloc((size_t)N * K, 4), *b = xcalloc((size_t)M * K, 4), *c = xcalloc((size_t)N * M, 4);
    for (size_t i = 0; i < (size_t)N * K; i++) a[i] = (i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)M * K; i++) b[i] = (i % 5) * 0.1f;
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, M, K, 1.0f, a, K, b, K, 0.0f, c, M);
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    free(a), free(b), free(c);
    return 2.0 * N * K * M / best / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 10) die("usage: bench_train LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ STEPS");
    static struct recipe r;
    recipe_defaults(&r);
    r.model.num_layers = atoi(argv[1]);
    r.model.hidden_size = atoi(argv[2]);
    r.model.num_heads = atoi(argv[3]);
    r.model.num_kv_heads = atoi(argv[4]);
    r.model.intermediate_size = atoi(argv[5]);
    r.model.vocab_size = atoi(argv[6]);
    r.train.micro_batch = r.train.global_batch = atoi(argv[7]);
    r.train.seq_len = atoi(argv[8]);
    int steps = atoi(argv[9]), B = r.train.micro_batch, T = r.train.seq_len;
    r.train.steps = steps + 1;
    struct trainer tr;
    struct grid g;
    grid_single(&g);
    trainer_create(&tr, backend_get("cpu"), &r, &g);
    llama_init_params(&tr.model, 1);
    int32_t *samples = xmalloc(sizeof(int32_t) * B * (T + 1));
    uint64_t s = 7;
    for (int i = 0; i < B * (T + 1); i++) samples[i] = (int32_t)((s = s * 6364136223846793005ull + 1) >> 33) % r.model.vocab_size;
    double *times = xmalloc(sizeof(double) * steps), loss = 0;
    trainer_step(&tr, samples, B); /* warm-up: first touch of every buffer */
    for (int i = 0; i < steps; i++) {
        double t0 = now_seconds();
        loss = trainer_step(&tr, samples, B).loss;
        times[i] = now_seconds() - t0;
    }
    double step_s = median(times, steps), tokens = (double)B * T;
    double flops = model_flops_per_token(&r.model, T) * tokens;
    double g1 = sgemm_gflops(B * T, r.model.hidden_size, r.model.intermediate_size);
    double g2 = sgemm_gflops(B * T, r.model.hidden_size, r.model.vocab_size);
    printf("{\"params\":%lld,\"threads\":%d,\"micro_batch\":%d,\"seq_len\":%d,\"steps\":%d,\"step_s\":%.4f,"
           "\"tokens_per_s\":%.2f,\"gflops\":%.2f,\"flops_per_step\":%.6g,\"sgemm_gflops_ffn\":%.2f,"
           "\"sgemm_gflops_head\":%.2f,\"final_loss\":%.4f}\n",
           (long long)model_param_count(&r.model), omp_get_max_threads(), B, T, steps, step_s, tokens / step_s,
           flops / step_s / 1e9, flops, g1, g2, loss);
    free(times);
    free(samples);
    trainer_free(&tr);
    return 0;
}
