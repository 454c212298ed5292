/* Which fast attention runs on the bf16 table: cuDNN's fused attention
 * (kernels/cuda/cudnn_attention.cu) or mtrain's flash kernels
 * (kernels/cuda/flash_attention.cu); where neither applies, the caller's
 * widening reference path. MTRAIN_ATTENTION in the environment chooses:
 *
 *   auto (default)  cuDNN where it has a plan for the shape, checked at its
 *                   first call per shape and direction against the flash
 *                   kernels (norm-wise relative difference at most 2e-2 for
 *                   outputs and gradients, 1e-3 for the log-sum-exp); a
 *                   shape that disagrees, or that the flash kernels do not
 *                   cover, stays on mtrain's kernels
 *   cudnn           cuDNN wherever it has a plan, unchecked
 *   flash           mtrain's flash kernels only
 *   reference       the widening reference path only
 *
 * train.deterministic (cuda_set_deterministic) picks cuDNN's backward: its
 * deterministic algorithm (default), or the faster one that adds dQ by
 * atomics and so does not repeat bitwise. Both directions keep the same
 * state (each row's log-sum-exp), so they may take different paths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cudnn_attention.h"

enum mode { AUTO, CUDNN, FLASH, REFERENCE };
static int deterministic = 1;
static const char *last = "none"; /* what ran the last call */

extern "C" const char *cuda_attention_last(void) { return last; }

extern "C" void cuda_set_deterministic(int on) { deterministic = on != 0; }

static enum mode mode(void) {
    static int m = -1;
    if (m < 0) {
        const char *e = getenv("MTRAIN_ATTENTION");
        if (!e || !*e || !strcmp(e, "auto")) m = AUTO;
        else if (!strcmp(e, "cudnn")) m = CUDNN;
        else if (!strcmp(e, "flash")) m = FLASH;
        else if (!strcmp(e, "reference")) m = REFERENCE;
        else die("MTRAIN_ATTENTION=%s: expected auto, cudnn, flash or reference", e);
    }
    return (enum mode)m;
}

/* The first-call checks of auto: 1 cuDNN agreed, -1 it did not (or could
 * not be checked), 0 not checked yet. */
static struct {
    sdpa_shape s;
    int backward, verdict;
} checks[32];
static int n_checks;

static int *verdict(const sdpa_shape *s, int backward) {
    for (int i = 0; i < n_checks; i++)
        if (checks[i].backward == backward && !memcmp(&checks[i].s, s, sizeof *s)) return &checks[i].verdict;
    if (n_checks == (int)(sizeof checks / sizeof checks[0])) return NULL;
    checks[n_checks].s = *s, checks[n_checks].backward = backward, checks[n_checks].verdict = 0;
    return &checks[n_checks++].verdict;
}

/* norm-wise relative difference |a - b| / |b| of n device values, bf16 or fp32 */
static double difference(const void *a, const void *b, size_t n, int is_bf16) {
    size_t bytes = n * (is_bf16 ? 2 : 4);
    char *ha = (char *)malloc(bytes), *hb = (char *)malloc(bytes);
    if (!ha || !hb) die("out of memory");
    CUDA_CHECK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        float x, y;
        if (is_bf16) x = bf16_to_float(((uint16_t *)ha)[i]), y = bf16_to_float(((uint16_t *)hb)[i]);
        else x = ((float *)ha)[i], y = ((float *)hb)[i];
        num += ((double)x - y) * ((double)x - y), den += (double)y * y;
    }
    free(ha);
    free(hb);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* cuDNN's tensors and the flash kernels' loads are 16-byte aligned */
static int aligned16(const void *const *p, int n) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)p[i] & 15) return 0;
    return 1;
}

/* One output of a direction: its device buffer, values (bf16 or fp32), the
 * name in the message and the norm-wise difference it may have. */
struct output {
    void *p;
    size_t n;
    int bf16;
    const char *name;
    double bound;
};
static size_t value_bytes(const output &o) { return o.n * (o.bf16 ? 2 : 4); }
static size_t output_bytes(const output &o) { return (value_bytes(o) + 255) & ~(size_t)255; } /* copies stay aligned */

/* cuDNN's results already in outs[0..n): flash(dst) writes the flash
 * kernels' into dst[0..n) (copies here): do they agree? If not, or if the
 * GPU has no memory for the copies, outs get the flash kernels' results.
 * Says which on stderr. */
template <typename F>
static int agrees(const sdpa_shape *s, int backward, const output *outs, int n, F flash) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += output_bytes(outs[i]);
    char *tmp = NULL, what[200];
    const char *verdict_word = ""; /* agrees / DISAGREES: what follows compares */
    int ok = 0;
    if (cudaMalloc((void **)&tmp, total) != cudaSuccess) {
        cudaGetLastError(); /* the GPU is full: an answer, not an error to keep */
        void *dst[3];
        for (int i = 0; i < n; i++) dst[i] = outs[i].p;
        flash(dst);
        snprintf(what, sizeof what, "not checked (no GPU memory to spare); the flash kernels run it");
    } else {
        void *copy[3];
        size_t off = 0;
        for (int i = 0; i < n; off += output_bytes(outs[i]), i++) copy[i] = tmp + off;
        flash(copy);
        int len = snprintf(what, sizeof what, "mtrain's flash kernels (");
        ok = 1;
        for (int i = 0; i < n; i++) {
            double e = difference(outs[i].p, copy[i], outs[i].n, outs[i].bf16);
            ok = ok && e <= outs[i].bound;
            len += snprintf(what + len, sizeof what - len, "%s%s %.1e", i ? ", " : "", outs[i].name, e);
        }
        for (int i = 0; !ok && i < n; i++)
            CUDA_CHECK(cudaMemcpy(outs[i].p, copy[i], value_bytes(outs[i]), cudaMemcpyDeviceToDevice));
        snprintf(what + len, sizeof what - len, ")%s", ok ? "" : "; the flash kernels run it");
        verdict_word = ok ? "agrees with " : "DISAGREES with ";
        CUDA_CHECK(cudaFree(tmp));
    }
    fprintf(stderr, "mtrain: cuDNN attention %s (B %d T %d heads %d/%d D %d/%d) %s%s\n", backward ? "backward" : "forward",
            s->B, s->T, s->H, s->KVH, s->D, s->Dv, verdict_word, what);
    return ok;
}

static int check_forward(float *out, float *lse, const float *q, const float *k, const float *v, const sdpa_shape *s) {
    output outs[] = {{out, (size_t)s->B * s->T * s->H * s->Dv, 1, "out", 2e-2},
                     {lse, (size_t)s->B * s->H * s->T, 0, "lse", 1e-3}};
    return agrees(s, 0, outs, 2, [&](void **d) {
        cuda_flash_attention_forward((float *)d[0], (float *)d[1], q, k, v, s->B, s->T, s->H, s->KVH, s->D, s->Dv);
    });
}

static int check_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                          const float *q, const float *k, const float *v, const sdpa_shape *s) {
    size_t rows = (size_t)s->B * s->T;
    output outs[] = {{dq, rows * s->H * s->D, 1, "dq", 2e-2},
                     {dk, rows * s->KVH * s->D, 1, "dk", 2e-2},
                     {dv, rows * s->KVH * s->Dv, 1, "dv", 2e-2}};
    return agrees(s, 1, outs, 3, [&](void **d) {
        cuda_flash_attention_backward((float *)d[0], (float *)d[1], (float *)d[2], dout, out, lse, q, k, v, s->B,
                                      s->T, s->H, s->KVH, s->D, s->Dv);
    });
}

int cuda_fast_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                           int B, int T, int H, int KVH, int D, int Dv) {
    const void *p[] = {out, q, k, v};
    enum mode m = mode();
    int aligned = m != REFERENCE && aligned16(p, 4), flash = aligned && cuda_flash_attention_usable(D, Dv);
    sdpa_shape s = {B, T, H, KVH, D, Dv, 0, 0, 0};
    int *seen = m == AUTO && flash ? verdict(&s, 0) : NULL;
    if (aligned && (m == CUDNN || (seen && *seen >= 0)) && cudnn_attention_forward(out, lse, q, k, v, &s) == 0) {
        last = "cudnn";
        if (seen && !*seen) *seen = check_forward(out, lse, q, k, v, &s) ? 1 : -1;
        if (seen && *seen < 0) last = "flash";
        return 1;
    }
    last = flash ? "flash" : "reference";
    if (!flash) return 0;
    cuda_flash_attention_forward(out, lse, q, k, v, B, T, H, KVH, D, Dv);
    return 1;
}

int cuda_fast_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                            const float *lse, const float *q, const float *k, const float *v, int B,
                                            int T, int H, int KVH, int D, int Dv) {
    last = "reference";
    if (!out) return 0;
    const void *p[] = {dq, dk, dv, dout, out, q, k, v};
    enum mode m = mode();
    int aligned = m != REFERENCE && aligned16(p, 8), flash = aligned && cuda_flash_attention_usable(D, Dv);
    sdpa_shape s = {B, T, H, KVH, D, Dv, deterministic, 0, 0};
    int *seen = m == AUTO && flash ? verdict(&s, 1) : NULL;
    if (aligned && (m == CUDNN || (seen && *seen >= 0)) &&
        cudnn_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &s) == 0) {
        last = deterministic ? "cudnn" : "cudnn-atomic";
        if (seen && !*seen) *seen = check_backward(dq, dk, dv, dout, out, lse, q, k, v, &s) ? 1 : -1;
        if (seen && *seen < 0) last = "flash";
        return 1;
    }
    last = flash ? "flash" : "reference";
    if (!flash) return 0;
    cuda_flash_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH, D, Dv);
    return 1;
}

/* Context parallelism's block ops (kernels/ops.h attention_block_forward)
 * on the flash kernels where they apply, in every mode but reference
 * (cuDNN's graphs here have no block form): 1 done, 0 the caller widens
 * the operands for the fp32 block kernels (kernels/cuda/attention_block.cu). */
int cuda_fast_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B,
                                      int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1,
                                      int first) {
    const void *p[] = {q, k, v};
    last = "reference";
    if (mode() == REFERENCE || !aligned16(p, 3) || !cuda_flash_attention_usable(D, Dv)) return 0;
    cuda_flash_attention_block_forward(o, lse, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0, k1, first);
    last = "flash";
    return 1;
}

int cuda_fast_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                       const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                       int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1) {
    const void *p[] = {dout, out, q, k, v};
    last = "reference";
    if (mode() == REFERENCE || !aligned16(p, 5) || !cuda_flash_attention_usable(D, Dv)) return 0;
    cuda_flash_attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0, k1);
    last = "flash";
    return 1;
}
