/* Where a training step's time goes: every backend op timed alone at the
 * shapes of one layer (and the head) of a Llama, on random data.
 *
 *   bench_ops DEVICE TF32 HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ
 *
 * Prints a markdown table (ms per call, median of 5 after a warm-up; times per
 * step = calls per layer x layers are left to the reader) and a JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"

static const struct backend *be;
static float sink;

static void sync_on(const void *p) { be->to_host(&sink, p, sizeof sink); }

static float *rand_dev(size_t n, uint64_t *s) {
    float *h = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = (float)((*s = *s * 6364136223846793005ull + 1) >> 40) / (1 << 24) - 0.5f;
    float *d = be->alloc(sizeof(float) * n);
    be->from_host(d, h, sizeof(float) * n);
    free(h);
    return d;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define TIME(name, call, out)                                                  \
    do {                                                                       \
        double t[5];                                                           \
        call;                                                                  \
        sync_on(out);                                                          \
        for (int r = 0; r < 5; r++) {                                          \
            double t0 = now_seconds();                                         \
            call;                                                              \
            sync_on(out);                                                      \
            t[r] = now_seconds() - t0;                                         \
        }                                                                      \
        qsort(t, 5, sizeof *t, cmp);                                           \
        printf("| %s | %.3f |\n", name, 1e3 * t[2]);                           \
        n += snprintf(json + n, sizeof json - n, "%s\"%s\":%.5f", n > 1 ? "," : "", name, 1e3 * t[2]); \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 10) die("usage: bench_ops DEVICE TF32 HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ");
    be = backend_get(argv[1], "fp32");
    if (!be) return 1;
    if (be == &cuda_backend) cuda_set_tf32(atoi(argv[2]));
    int C = atoi(argv[3]), H = atoi(argv[4]), KVH = atoi(argv[5]), F = atoi(argv[6]), V = atoi(argv[7]);
    int B = atoi(argv[8]), T = atoi(argv[9]), N = B * T, D = C / H;
    uint64_t s = 1;
    float *x = rand_dev((size_t)N * C, &s), *y = rand_dev((size_t)N * C, &s), *w = rand_dev((size_t)F * C, &s);
    float *g = rand_dev((size_t)N * F, &s), *u = rand_dev((size_t)N * F, &s), *h = rand_dev((size_t)N * F, &s);
    float *q = rand_dev((size_t)N * C, &s), *k = rand_dev((size_t)N * KVH * D, &s), *v = rand_dev((size_t)N * KVH * D, &s);
    float *o = rand_dev((size_t)N * C, &s), *att = rand_dev(be->attention_state_floats(B, H, T), &s);
    float *dq = rand_dev((size_t)N * C, &s), *dk = rand_dev((size_t)N * KVH * D, &s), *dv = rand_dev((size_t)N * KVH * D, &s);
    float *logits = rand_dev((size_t)N * V, &s), *emb = rand_dev((size_t)V * C, &s), *losses = rand_dev(N, &s);
    float *rstd = rand_dev(N, &s), *nw = rand_dev(C, &s), *dnw = rand_dev(C, &s), *cs = rand_dev((size_t)T * D / 2, &s);
    int32_t *tok_h = xmalloc(sizeof(int32_t) * N), *tok = be->alloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) tok_h[i] = (int32_t)((s = s * 6364136223846793005ull + 1) >> 33) % V;
    be->from_host(tok, tok_h, sizeof(int32_t) * N);
    char json[4096] = "{";
    int n = 1;
    printf("| op (%s%s, N=%d C=%d F=%d V=%d T=%d) | ms |\n| --- | --- |\n", be->name,
           be == &cuda_backend && atoi(argv[2]) ? " tf32" : "", N, C, F, V, T);
    TIME("matmul_forward NxCxF", be->matmul_forward(g, x, w, N, C, F, 0), g);
    TIME("matmul_backward NxCxF", be->matmul_backward(x, w, g, y, w, N, C, F, 0), w);
    TIME("matmul_forward head NxCxV", be->matmul_forward(logits, x, emb, N, C, V, 0), logits);
    TIME("matmul_backward head", be->matmul_backward(y, emb, logits, x, emb, N, C, V, 0), emb);
    TIME("attention_forward", be->attention_forward(o, att, q, k, v, B, T, H, KVH, D, D), o);
    TIME("attention_backward", be->attention_backward(dq, dk, dv, o, o, att, q, k, v, B, T, H, KVH, D, D), dq);
    TIME("rmsnorm_forward", be->rmsnorm_forward(y, rstd, x, nw, N, C, 1e-5f), y);
    TIME("rmsnorm_backward", be->rmsnorm_backward(y, dnw, o, x, nw, rstd, N, C, 1), dnw);
    TIME("rope", be->rope(q, cs, cs, B, T, H, D, 0), q);
    TIME("swiglu_forward", be->swiglu_forward(h, g, u, (size_t)N * F), h);
    TIME("swiglu_backward", be->swiglu_backward(g, u, h, g, u, (size_t)N * F), g);
    TIME("cross_entropy (fused backward)", be->cross_entropy(losses, logits, tok, N, V, 1e-4f), losses);
    TIME("embedding_forward", be->embedding_forward(x, tok, emb, N, C, 0, V), x);
    TIME("embedding_backward", be->embedding_backward(emb, tok, x, N, C, 0, V), emb);
    TIME("add NxC", be->add(x, y, (size_t)N * C), x);
    TIME("adamw FxC", be->adamw(w, w, g, u, (size_t)F * C, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 3, NULL), w);
    TIME("sum_squares FxC", sink = (float)be->sum_squares(w, (size_t)F * C), w);
    printf("%s}\n", json);
    free(tok_h);
    return 0;
}
