/* Causal GQA attention alone on the GPU's bf16 table, forward + backward:
 * mtrain's side of scripts/bench/torch_attention.py (the same shapes and
 * FLOP count). MTRAIN_ATTENTION chooses the implementation (cudnn, flash,
 * reference; default auto: kernels/cuda/attention_choice.cu), DETERMINISTIC=0
 * cuDNN's faster backward (train.deterministic false); the JSON names what
 * ran each direction.
 *
 *   bench_attention B HEADS KV_HEADS SEQ HEAD_DIM [REPEATS]
 *
 * Prints one JSON object: median forward, backward and total ms over
 * REPEATS (default 10) after a warm-up, and TFLOP/s counting the causal
 * half (forward 4*B*H*T*T*D/2, backward 2.5x forward). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"

static const struct backend *be;

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* n bf16 values (2 bytes each) of small random numbers on the device */
static float *rand_bf16(size_t n, uint64_t *s) {
    uint16_t *h = xmalloc(2 * n);
    for (size_t i = 0; i < n; i++) {
        float x = (float)((*s = *s * 6364136223846793005ull + 1) >> 40) / (1 << 24) - 0.5f;
        uint32_t u;
        memcpy(&u, &x, 4);
        h[i] = (uint16_t)(u >> 16);
    }
    float *d = be->alloc(2 * n);
    be->from_host(d, h, 2 * n);
    free(h);
    return d;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) die("usage: bench_attention B HEADS KV_HEADS SEQ HEAD_DIM [REPEATS]");
    if (!cuda_backend_available()) die("bench_attention: no CUDA device");
    be = backend_get("cuda", "bf16");
    if (!be) return 1;
    const char *det = getenv("DETERMINISTIC");
    cuda_set_deterministic(!det || strcmp(det, "0"));
    int B = atoi(argv[1]), H = atoi(argv[2]), KVH = atoi(argv[3]), T = atoi(argv[4]), D = atoi(argv[5]);
    int R = argc == 7 ? atoi(argv[6]) : 10;
    if (B < 1 || H < 1 || KVH < 1 || H % KVH || T < 1 || D < 1 || R < 1 || R > 1000) die("bench_attention: bad shape");
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D;
    uint64_t s = 1;
    float *q = rand_bf16(nq, &s), *k = rand_bf16(nk, &s), *v = rand_bf16(nk, &s), *dout = rand_bf16(nq, &s);
    float *out = be->alloc(2 * nq), *dq = be->alloc(2 * nq), *dk = be->alloc(2 * nk), *dv = be->alloc(2 * nk);
    float *att = be->alloc(sizeof(float) * be->attention_state_floats(B, H, T));
    double *tf = xmalloc(sizeof(double) * R), *tb = xmalloc(sizeof(double) * R), *tt = xmalloc(sizeof(double) * R);
    float sink;
    const char *fwd_impl = "none";
    for (int r = -1; r < R; r++) { /* r = -1: warm-up */
        double t0 = now_seconds();
        be->attention_forward(out, att, q, k, v, B, T, H, KVH, D, D);
        be->to_host(&sink, att, sizeof sink); /* waits for the device */
        double t1 = now_seconds();
        fwd_impl = cuda_attention_last();
        be->attention_backward(dq, dk, dv, dout, out, att, q, k, v, B, T, H, KVH, D, D);
        be->to_host(&sink, dv, sizeof sink);
        double t2 = now_seconds();
        if (r >= 0) tf[r] = t1 - t0, tb[r] = t2 - t1, tt[r] = t2 - t0;
    }
    qsort(tf, R, sizeof *tf, cmp), qsort(tb, R, sizeof *tb, cmp), qsort(tt, R, sizeof *tt, cmp);
    const char *e = getenv("MTRAIN_ATTENTION"), *bwd_impl = cuda_attention_last();
    char impl[160];
    if (!strcmp(fwd_impl, "reference")) snprintf(impl, sizeof impl, "reference attention (MTRAIN_ATTENTION=reference)");
    else if (!strcmp(fwd_impl, bwd_impl)) snprintf(impl, sizeof impl, "%s attention", fwd_impl);
    else snprintf(impl, sizeof impl, "%s forward, %s backward attention", fwd_impl, bwd_impl);
    double flops = 4.0 * B * H * (double)T * T * D / 2 * 3.5;
    printf("{\"impl\":\"mtrain %s\",\"mode\":\"%s\",\"D\":%d,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"fwd_bwd_ms\":%.3f,"
           "\"tflops\":%.1f}\n",
           impl, e ? e : "auto", D, 1e3 * tf[R / 2], 1e3 * tb[R / 2], 1e3 * tt[R / 2], flops / tt[R / 2] / 1e12);
    be->free(q), be->free(k), be->free(v), be->free(dout), be->free(out), be->free(dq), be->free(dk), be->free(dv);
    be->free(att), free(tf), free(tb), free(tt);
    return 0;
}
