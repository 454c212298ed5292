/* The local experts' GEMMs on one GPU, bf16 (issue 28's grouped expert GEMMs):
 * per expert through the bf16 table's matmul_forward / matmul_backward (one
 * cuBLASLt call per expert and GEMM, what model/moe.c runs today) against one
 * cublasGemmGroupedBatchedEx call per GEMM kind (kernels/cuda/expert_gemm.cu),
 * for one expert matrix [M, K] of each expert (the gate / up shape: K hidden,
 * M expert FFN; the down shape: the two swapped), forward, data gradient and
 * weight gradient (fp32, accumulated), on the same rows.
 *
 *   bench_expert_gemm ROWS EXPERTS HIDDEN FFN [REPS]
 *
 * ROWS routed rows (tokens x top-k) split over the experts unevenly (a fixed
 * log-normal draw, as routing gives; the split is printed). Prints one JSON
 * object per shape: ms per call of each way and GEMM kind, TFLOP/s, and the
 * grouped results' norm-wise distance from the per-expert ones (forward and
 * dgrad bf16, wgrad fp32). Exits 0 with a message where no GPU is visible. */
#include <math.h>
#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"

static uint64_t seed = 12345;
static double uniform(void) { return (double)((seed = seed * 6364136223846793005ULL + 1442695040888963407ULL) >> 11) / 9007199254740992.0; }

/* rows split over E experts: weights exp(0.6 g), g standard normal */
static void split(int *off, int rows, int E) {
    double w[1024], sum = 0;
    for (int e = 0; e < E; e++) {
        double g = sqrt(-2 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform());
        sum += w[e] = exp(0.6 * g);
    }
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (int)(rows * w[e] / sum);
    off[E] = rows; /* the rounding's remainder to the last */
}

static float *device_random(const struct backend *be, size_t n, float scale) {
    float *h = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = (float)(uniform() * 2 - 1) * scale;
    float *f = be->alloc(sizeof(float) * n), *s = be->alloc(sizeof(float) * n);
    be->from_host(f, h, sizeof(float) * n);
    be->to_storage(s, f, n);
    be->free(f);
    free(h);
    return s;
}

static void wait(const struct backend *be, const float *p) {
    char c;
    be->to_host(&c, p, 1);
}

/* norm-wise distance of two device arrays of n values (storage when bf16, else fp32) */
static double distance(const struct backend *be, const float *a, const float *b, size_t n, int storage) {
    float *ha = xmalloc(sizeof(float) * n), *hb = xmalloc(sizeof(float) * n);
    if (storage) {
        float *t = be->alloc(sizeof(float) * n);
        be->from_storage(t, a, n), be->to_host(ha, t, sizeof(float) * n);
        be->from_storage(t, b, n), be->to_host(hb, t, sizeof(float) * n);
        be->free(t);
    } else {
        be->to_host(ha, a, sizeof(float) * n), be->to_host(hb, b, sizeof(float) * n);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)ha[i] - hb[i]) * ((double)ha[i] - hb[i]), den += (double)hb[i] * hb[i];
    free(ha), free(hb);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

enum { FWD, DGRAD, WGRAD, KINDS };

static void shape(const struct backend *be, const int *off, int E, int K, int M, int reps, const char *name) {
    int R = off[E];
    float *x = device_random(be, (size_t)R * K, 1.0f), *dout = device_random(be, (size_t)R * M, 1.0f);
    float *w[1024], *dw_a[1024], *dw_b[1024];
    for (int e = 0; e < E; e++) {
        w[e] = device_random(be, (size_t)M * K, 0.02f);
        dw_a[e] = be->alloc(sizeof(float) * M * K), dw_b[e] = be->alloc(sizeof(float) * M * K);
        be->zero(dw_a[e], sizeof(float) * M * K), be->zero(dw_b[e], sizeof(float) * M * K);
    }
    size_t bo = (size_t)R * M * be->act_bytes, bx = (size_t)R * K * be->act_bytes;
    float *out_a = be->alloc(bo), *out_b = be->alloc(bo), *dx_a = be->alloc(bx), *dx_b = be->alloc(bx);
    double ms[2][KINDS] = {{0}}, dist[KINDS] = {0};
    int grouped_ok[KINDS] = {1, 1, 1};
    for (int kind = 0; kind < KINDS; kind++) {
        for (int way = 0; way < 2; way++) {
            double best = 1e30;
            for (int r = -1; r < reps; r++) { /* one warm-up: plans, first touch */
                double t0 = now_seconds();
                if (way == 0) {
                    for (int e = 0; e < E; e++) {
                        int o = off[e], n = off[e + 1] - o;
                        if (!n) continue;
                        const char *xs = (const char *)x + (size_t)o * K * be->act_bytes;
                        const char *ds = (const char *)dout + (size_t)o * M * be->act_bytes;
                        if (kind == FWD)
                            be->matmul_forward((float *)((char *)out_a + (size_t)o * M * be->act_bytes),
                                               (const float *)xs, w[e], n, K, M, 0);
                        else if (kind == DGRAD)
                            be->matmul_backward((float *)((char *)dx_a + (size_t)o * K * be->act_bytes), NULL,
                                                (const float *)ds, (const float *)xs, w[e], n, K, M, 0);
                        else
                            be->matmul_backward(NULL, dw_a[e], (const float *)ds, (const float *)xs, w[e], n, K, M, 0);
                    }
                } else {
                    int rc = kind == FWD     ? cuda_grouped_expert_forward(out_b, x, (const float *const *)w, off, E, K, M)
                             : kind == DGRAD ? cuda_grouped_expert_dgrad(dx_b, dout, (const float *const *)w, off, E, K, M, 0)
                                             : cuda_grouped_expert_wgrad(dw_b, dout, x, off, E, K, M);
                    if (rc) {
                        grouped_ok[kind] = 0;
                        break;
                    }
                }
                wait(be, way ? out_b : out_a);
                double dt = now_seconds() - t0;
                if (r >= 0 && dt < best) best = dt;
            }
            ms[way][kind] = 1e3 * best;
        }
    }
    if (grouped_ok[FWD]) dist[FWD] = distance(be, out_b, out_a, (size_t)R * M, 1);
    if (grouped_ok[DGRAD]) dist[DGRAD] = distance(be, dx_b, dx_a, (size_t)R * K, 1);
    if (grouped_ok[WGRAD]) { /* both accumulated reps + 1 times from zero */
        double worst = 0;
        for (int e = 0; e < E; e++) {
            double d = distance(be, dw_b[e], dw_a[e], (size_t)M * K, 0);
            if (d > worst) worst = d;
        }
        dist[WGRAD] = worst;
    }
    double flops = 2.0 * R * K * M;
    static const char *kinds[KINDS] = {"forward", "dgrad", "wgrad"};
    printf("{\"shape\":\"%s\",\"rows\":%d,\"experts\":%d,\"K\":%d,\"M\":%d", name, R, E, K, M);
    for (int kind = 0; kind < KINDS; kind++) {
        printf(",\"%s\":{\"per_expert_ms\":%.3f,\"per_expert_tflops\":%.1f", kinds[kind], ms[0][kind],
               flops / ms[0][kind] / 1e9);
        if (grouped_ok[kind])
            printf(",\"grouped_ms\":%.3f,\"grouped_tflops\":%.1f,\"grouped_over_per_expert\":%.3f,\"distance\":%.3g",
                   ms[1][kind], flops / ms[1][kind] / 1e9, ms[0][kind] / ms[1][kind], dist[kind]);
        else
            printf(",\"grouped\":\"not supported by this cuBLAS\"");
        printf("}");
    }
    printf("}\n");
    fflush(stdout);
    for (int e = 0; e < E; e++) be->free(w[e]), be->free(dw_a[e]), be->free(dw_b[e]);
    be->free(x), be->free(dout), be->free(out_a), be->free(out_b), be->free(dx_a), be->free(dx_b);
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6) die("usage: bench_expert_gemm ROWS EXPERTS HIDDEN FFN [REPS]");
    int R = atoi(argv[1]), E = atoi(argv[2]), C = atoi(argv[3]), F = atoi(argv[4]), reps = argc > 5 ? atoi(argv[5]) : 5;
    if (R < 1 || E < 1 || E > 1024 || C < 1 || F < 1 || reps < 1) die("bench_expert_gemm: bad arguments");
    if (!cuda_backend_available()) {
        printf("bench_expert_gemm: no CUDA device here; skipped\n");
        return 0;
    }
    const struct backend *be = backend_get("cuda", "bf16");
    if (!be) return 1;
    int off[1025];
    split(off, R, E);
    fprintf(stderr, "bench_expert_gemm: rows per expert:");
    for (int e = 0; e < E; e++) fprintf(stderr, " %d", off[e + 1] - off[e]);
    fprintf(stderr, "\n");
    shape(be, off, E, C, F, reps, "gate/up");
    shape(be, off, E, F, C, reps, "down");
    return 0;
}
