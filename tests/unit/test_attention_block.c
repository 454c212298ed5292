/* Context parallelism's block attention (kernels/ops.h attention_block_*):
 * on one process, every rank of a cp ring is simulated: its two chunks of
 * queries meet every rank's block of keys and values in ring order, merged
 * by log-sum-exp, and the gradients of each block are added where its rows
 * live. The results must equal the CPU's whole-sequence causal attention
 * (itself checked against a double loop in test_kernels): outputs and the
 * gradients of q, k and v within 1e-5 of the largest value, for cp 1,
 * 2 and 3, chunks of 1 and 3 positions, GQA and MHA, Dv = D and Dv < D. */
#include <string.h>

#include "kernels/ops.h"
#include "tests/unit/check.h"

static const struct backend *be;
static unsigned long long seed = 7;

/* global position of local row t of cp rank r (chunks r and 2cp-1-r of c rows) */
static int position(int r, int cp, int c, int t) { return t < c ? r * c + t : (2 * cp - 1 - r) * c + (t - c); }

/* rows of x [B, T, width] at rank r's positions -> out [B, 2c, width] (or back, scatter-adding) */
static void take(float *out, const float *x, int B, int T, int width, int r, int cp, int c) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < 2 * c; t++)
            memcpy(out + ((size_t)b * 2 * c + t) * width, x + ((size_t)b * T + position(r, cp, c, t)) * width,
                   sizeof(float) * width);
}
static void put_add(float *x, const float *in, int B, int T, int width, int r, int cp, int c) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < 2 * c; t++)
            for (int i = 0; i < width; i++)
                x[((size_t)b * T + position(r, cp, c, t)) * width + i] += in[((size_t)b * 2 * c + t) * width + i];
}

/* largest |a - b| over the largest |b| */
static double err(const float *a, const float *b, size_t n) {
    double worst = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        worst = d > worst || isnan(d) ? (isnan(d) ? INFINITY : d) : worst;
        top = fabs(b[i]) > top ? fabs(b[i]) : top;
    }
    return worst / (top > 0 ? top : 1);
}

static void run(int cp, int c, int H, int KVH, int D, int Dv) {
    int B = 2, T = 2 * cp * c, L = 2 * c;
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D, nv = (size_t)B * T * KVH * Dv,
           no = (size_t)B * T * H * Dv;
    float *q = test_rand_array(&seed, nq), *k = test_rand_array(&seed, nk), *v = test_rand_array(&seed, nv);
    float *dout = test_rand_array(&seed, no);
    /* the reference: the whole sequence on one rank */
    float *out = calloc(no, sizeof(float)), *att = calloc(be->attention_state_floats(B, H, T), sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float)), *dv = calloc(nv, sizeof(float));
    be->attention_forward(out, att, q, k, v, B, T, H, KVH, D, Dv);
    be->attention_backward(dq, dk, dv, dout, out, att, q, k, v, B, T, H, KVH, D, Dv);
    /* the ring */
    float *o_all = calloc(no, sizeof(float)), *gq = calloc(nq, sizeof(float)), *gk = calloc(nk, sizeof(float));
    float *gv = calloc(nv, sizeof(float));
    size_t lq = (size_t)B * L * H * D, lk = (size_t)B * L * KVH * D, lv = (size_t)B * L * KVH * Dv,
           lo = (size_t)B * L * H * Dv;
    float *ql = malloc(sizeof(float) * lq), *kl = malloc(sizeof(float) * lk), *vl = malloc(sizeof(float) * lv);
    float *o = malloc(sizeof(float) * lo), *lse = malloc(sizeof(float) * (size_t)B * H * L);
    float *dol = malloc(sizeof(float) * lo), *dql = calloc(lq, sizeof(float)), *dkl = malloc(sizeof(float) * lk);
    float *dvl = malloc(sizeof(float) * lv);
    for (int r = 0; r < cp; r++) {
        take(ql, q, B, T, H * D, r, cp, c);
        for (int s = 0; s < cp; s++) { /* the block of rank r - s arrives at step s */
            int src = (r - s + cp) % cp;
            take(kl, k, B, T, KVH * D, src, cp, c);
            take(vl, v, B, T, KVH * Dv, src, cp, c);
            be->attention_block_forward(o, lse, ql, kl, vl, B, c, H, KVH, D, Dv, r, 2 * cp - 1 - r, src,
                                        2 * cp - 1 - src, s == 0);
        }
        put_add(o_all, o, B, T, H * Dv, r, cp, c);
        take(dol, dout, B, T, H * Dv, r, cp, c);
        memset(dql, 0, sizeof(float) * lq);
        for (int s = 0; s < cp; s++) {
            int src = (r - s + cp) % cp;
            take(kl, k, B, T, KVH * D, src, cp, c);
            take(vl, v, B, T, KVH * Dv, src, cp, c);
            memset(dkl, 0, sizeof(float) * lk);
            memset(dvl, 0, sizeof(float) * lv);
            be->attention_block_backward(dql, dkl, dvl, dol, o, lse, ql, kl, vl, B, c, H, KVH, D, Dv, r,
                                         2 * cp - 1 - r, src, 2 * cp - 1 - src);
            put_add(gk, dkl, B, T, KVH * D, src, cp, c);
            put_add(gv, dvl, B, T, KVH * Dv, src, cp, c);
        }
        put_add(gq, dql, B, T, H * D, r, cp, c);
    }
    char name[128];
    snprintf(name, sizeof name, "attention_block_cp%d_c%d_h%d_kv%d_dv%d", cp, c, H, KVH, Dv);
    double eo = err(o_all, out, no), eq = err(gq, dq, nq), ek = err(gk, dk, nk), ev = err(gv, dv, nv);
    TEST_RESULT(name, eo <= 1e-5 && eq <= 1e-5 && ek <= 1e-5 && ev <= 1e-5,
                "max err (of the largest) out %.3g dq %.3g dk %.3g dv %.3g (tol 1e-5)", eo, eq, ek, ev);
    float *ptrs[] = {q, k, v, dout, out, att, dq, dk, dv, o_all, gq, gk, gv, ql, kl, vl, o, lse, dol, dql, dkl, dvl};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) free(ptrs[i]);
}

int main(void) {
    be = backend_get("cpu", "fp32");
    for (int cp = 1; cp <= 3; cp++)
        for (int c = 1; c <= 3; c += 2) {
            run(cp, c, 4, 2, 8, 8);
            run(cp, c, 4, 4, 8, 6);
        }
    run(4, 5, 6, 2, 16, 16);
    TEST_EXIT();
}
