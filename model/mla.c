/* Multi-head latent attention forward and backward (see mla.h). */
#include "model/linear.h"
#include "model/mla.h"

/* RoPE (or its transpose) on the rotary columns [DN, DN+Dr) of each head of x [N, Hl, D]. */
static void rope_cols(struct transformer *m, float *x, int inverse) {
    const struct backend *be = m->be;
    int rows = m->N * m->Hl;
    be->copy_cols(m->mla_rope, m->Dr, act_at(m, x, m->DN), m->D, rows, m->Dr, 0);
    be->rope(m->mla_rope, m->rope_cos, m->rope_sin, m->B, m->T, m->Hl, m->Dr, inverse);
    be->copy_cols(act_at(m, x, m->DN), m->D, m->mla_rope, m->Dr, rows, m->Dr, 0);
}

void mla_forward(struct transformer *m, struct layer_acts *a, int l) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    int N = m->N, C = m->C, Hl = m->Hl, D = m->D, DN = m->DN, Dv = m->Dv, Dr = m->Dr, KR = m->KR, QR = m->QR;
    float eps = (float)m->cfg.norm_eps;
    /* the three projections of ln1 first: one FP8 input group (linear_same_input) */
    linear_same_input(m, 1);
    linear_forward(m, QR ? a->qa : a->q, a->ln1, QR ? w->wq_a : w->wq, N, C, QR ? QR : Hl * D, 0);
    linear_forward(m, a->ckv, a->ln1, w->wkv_a, N, C, KR, 0);
    linear_forward(m, m->mla_kpe, a->ln1, act_at(m, w->wkv_a, (size_t)KR * C), N, C, Dr, 0);
    linear_same_input(m, 0);
    if (QR) {
        be->rmsnorm_forward(a->qan, a->rstdq, a->qa, w->q_a_ln, N, QR, eps);
        linear_forward(m, a->q, a->qan, w->wq_b, N, QR, Hl * D, 0);
    }
    be->rmsnorm_forward(a->kvn, a->rstdkv, a->ckv, w->kv_a_ln, N, KR, eps);
    linear_forward(m, m->mla_kvb, a->kvn, w->wkv_b, N, KR, Hl * (DN + Dv), 0);
    rope_cols(m, a->q, 0);
    if (m->q_scale != 1.0f) be->scale(a->q, m->q_scale, (size_t)N * Hl * D);
    be->rope(m->mla_kpe, m->rope_cos, m->rope_sin, m->B, m->T, 1, Dr, 0);
    /* k = [k_nope of the head | the shared rotary key], v = the rest of the up projection */
    be->copy_cols(a->k, D, m->mla_kvb, DN + Dv, N * Hl, DN, 0);
    for (int h = 0; h < Hl; h++) be->copy_cols(act_at(m, a->k, (size_t)h * D + DN), Hl * D, m->mla_kpe, Dr, N, Dr, 0);
    be->copy_cols(a->v, Dv, act_at(m, m->mla_kvb, DN), DN + Dv, N * Hl, Dv, 0);
}

void mla_backward(struct transformer *m, struct layer_acts *a, int l) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    struct layer_weights *dw = &m->dlayers[l];
    int N = m->N, C = m->C, Hl = m->Hl, D = m->D, DN = m->DN, Dv = m->Dv, Dr = m->Dr, KR = m->KR, QR = m->QR;
    if (m->q_scale != 1.0f) be->scale(m->d_q, m->q_scale, (size_t)N * Hl * D);
    rope_cols(m, m->d_q, 1);
    /* the shared rotary key: its gradient is the sum over heads, in head order, in fp32 and
     * stored once (a sum of Hl heads as Hl - 1 stored additions would round at each in bf16) */
    be->copy_cols(m->mla_rope, Dr, act_at(m, m->d_k, DN), D, N * Hl, Dr, 0);
    be->moe_combine(m->d_kpe, m->mla_rope, m->mla_heads, NULL, N, Hl, Dr, 0);
    be->rope(m->d_kpe, m->rope_cos, m->rope_sin, m->B, m->T, 1, Dr, 1);
    be->copy_cols(m->d_kvb, DN + Dv, m->d_k, D, N * Hl, DN, 0);
    be->copy_cols(act_at(m, m->d_kvb, DN), DN + Dv, m->d_v, Dv, N * Hl, Dv, 0);
    linear_backward(m, m->d_kvn, dw->wkv_b, m->d_kvb, a->kvn, w->wkv_b, N, KR, Hl * (DN + Dv), 0);
    be->rmsnorm_backward(m->d_ckv, dw->kv_a_ln, m->d_kvn, a->ckv, w->kv_a_ln, a->rstdkv, N, KR, 0);
    /* (a deferred W keeps an output gradient where this backward read its tensor for the last time) */
    linear_same_input(m, 1);
    linear_dout_home(m, a->ckv, (size_t)N * KR);
    linear_backward(m, m->d_ln_full, dw->wkv_a, m->d_ckv, a->ln1, w->wkv_a, N, C, KR, 0);
    /* the rotary rows of the projection: the gradient is fp32, the working weights are storage */
    linear_backward(m, m->d_ln_full, dw->wkv_a + (size_t)KR * C, m->d_kpe, a->ln1, act_at(m, w->wkv_a, (size_t)KR * C),
                        N, C, Dr, 1);
    linear_same_input(m, 0);
    if (QR) {
        linear_dout_home(m, a->q, (size_t)N * Hl * D);
        linear_backward(m, m->d_qan, dw->wq_b, m->d_q, a->qan, w->wq_b, N, QR, Hl * D, 0);
        be->rmsnorm_backward(m->d_qa, dw->q_a_ln, m->d_qan, a->qa, w->q_a_ln, a->rstdq, N, QR, 0);
        linear_dout_home(m, a->qa, (size_t)N * QR);
        linear_backward(m, m->d_ln_full, dw->wq_a, m->d_qa, a->ln1, w->wq_a, N, C, QR, 1);
    } else {
        linear_dout_home(m, a->q, (size_t)N * Hl * D);
        linear_backward(m, m->d_ln_full, dw->wq, m->d_q, a->ln1, w->wq, N, C, Hl * D, 1);
    }
}
