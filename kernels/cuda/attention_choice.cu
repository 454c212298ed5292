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

/* device scratch for the check, or NULL (the error cleared) if the GPU is full */
static void *try_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

/* cuDNN's tensors are declared 16-byte aligned */
static int aligned16(const void *const *p, int n) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)p[i] & 15) return 0;
    return 1;
}

static void say(const sdpa_shape *s, int backward, const char *what) {
    fprintf(stderr, "mtrain: cuDNN attention %s (B %d T %d heads %d/%d D %d/%d) %s\n",
            backward ? "backward" : "forward", s->B, s->T, s->H, s->KVH, s->D, s->Dv, what);
}

/* cuDNN's forward already in out, lse: does the flash forward agree? If
 * not, out and lse get the flash kernels' result. */
static int check_forward(float *out, float *lse, const float *q, const float *k, const float *v, const sdpa_shape *s) {
    size_t n_out = (size_t)s->B * s->T * s->H * s->Dv, n_lse = (size_t)s->B * s->H * s->T;
    uint16_t *o2 = (uint16_t *)try_alloc(n_out * 2);
    float *l2 = (float *)try_alloc(n_lse * 4);
    int ok = 0;
    char what[160];
    if (o2 && l2) {
        cuda_flash_attention_forward((float *)o2, l2, q, k, v, s->B, s->T, s->H, s->KVH, s->D, s->Dv);
        double e_out = difference(out, o2, n_out, 1), e_lse = difference(lse, l2, n_lse, 0);
        ok = e_out <= 2e-2 && e_lse <= 1e-3;
        snprintf(what, sizeof what, "%s mtrain's flash kernels (out %.1e, lse %.1e)%s", ok ? "agrees with" : "DISAGREES with",
                 e_out, e_lse, ok ? "" : "; the flash kernels run it");
        if (!ok) {
            CUDA_CHECK(cudaMemcpy(out, o2, n_out * 2, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemcpy(lse, l2, n_lse * 4, cudaMemcpyDeviceToDevice));
        }
    } else {
        snprintf(what, sizeof what, "not checked (no GPU memory to spare); the flash kernels run it");
        cuda_flash_attention_forward(out, lse, q, k, v, s->B, s->T, s->H, s->KVH, s->D, s->Dv);
    }
    say(s, 0, what);
    cudaFree(o2);
    cudaFree(l2);
    return ok;
}

/* the same for the backward's dq, dk, dv */
static int check_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                          const float *q, const float *k, const float *v, const sdpa_shape *s) {
    size_t nq = (size_t)s->B * s->T * s->H * s->D, nk = (size_t)s->B * s->T * s->KVH * s->D;
    size_t nv = (size_t)s->B * s->T * s->KVH * s->Dv;
    char *tmp = (char *)try_alloc(2 * (nq + nk + nv));
    int ok = 0;
    char what[200];
    if (tmp) {
        float *q2 = (float *)tmp, *k2 = (float *)(tmp + 2 * nq), *v2 = (float *)(tmp + 2 * (nq + nk));
        cuda_flash_attention_backward(q2, k2, v2, dout, out, lse, q, k, v, s->B, s->T, s->H, s->KVH, s->D, s->Dv);
        double eq = difference(dq, q2, nq, 1), ek = difference(dk, k2, nk, 1), ev = difference(dv, v2, nv, 1);
        ok = eq <= 2e-2 && ek <= 2e-2 && ev <= 2e-2;
        snprintf(what, sizeof what, "%s mtrain's flash kernels (dq %.1e, dk %.1e, dv %.1e)%s",
                 ok ? "agrees with" : "DISAGREES with", eq, ek, ev, ok ? "" : "; the flash kernels run it");
        if (!ok) {
            CUDA_CHECK(cudaMemcpy(dq, q2, 2 * nq, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemcpy(dk, k2, 2 * nk, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemcpy(dv, v2, 2 * nv, cudaMemcpyDeviceToDevice));
        }
    } else {
        snprintf(what, sizeof what, "not checked (no GPU memory to spare); the flash kernels run it");
        cuda_flash_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s->B, s->T, s->H, s->KVH, s->D, s->Dv);
    }
    say(s, 1, what);
    cudaFree(tmp);
    return ok;
}

int cuda_fast_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                           int B, int T, int H, int KVH, int D, int Dv) {
    const void *p[] = {out, q, k, v};
    enum mode m = mode();
    int flash = m != REFERENCE && cuda_flash_attention_usable(D, Dv, p, 4);
    sdpa_shape s = {B, T, H, KVH, D, Dv, 0};
    int *seen = m == AUTO && flash ? verdict(&s, 0) : NULL;
    if ((m == CUDNN || (seen && *seen >= 0)) && aligned16(p, 4) && cudnn_attention_forward(out, lse, q, k, v, &s) == 0) {
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
    int flash = m != REFERENCE && cuda_flash_attention_usable(D, Dv, p, 8);
    sdpa_shape s = {B, T, H, KVH, D, Dv, deterministic};
    int *seen = m == AUTO && flash ? verdict(&s, 1) : NULL;
    if ((m == CUDNN || (seen && *seen >= 0)) && aligned16(p, 8) &&
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
