/* Incremental decoding with a KV cache (see decode.h). The block is the same
 * sequence of ops as the training forward (model/transformer.c, model/mla.c),
 * with the attention reading the cache and the MoE dispatch planned on the
 * host for this one sequence (no expert parallelism, no capacity). */
#include <string.h>

#include "config/common.h"
#include "model/decode.h"

void decoder_create(struct decoder *d, const struct transformer *m, int max_T) {
    CHECK(m->tp == 1 && m->ep <= 1 && m->part.nchunks == 1 && m->part.has_embed && m->part.has_head);
    CHECK(m->be->precision == PRECISION_FP32); /* inference reads the fp32 master weights (cli/model_source.c) */
    memset(d, 0, sizeof *d);
    const struct backend *be = m->be;
    d->m = m, d->be = be, d->max_T = max_T;
    d->chunk = max_T < 256 ? max_T : 256;
    size_t n = d->chunk, C = m->C, QD = (size_t)m->H * m->D, KD = (size_t)m->KV * m->D, VD = (size_t)m->KV * m->Dv;
    d->kcache = be->alloc(sizeof(float) * (size_t)m->L * max_T * KD);
    d->vcache = be->alloc(sizeof(float) * (size_t)m->L * max_T * VD);
    size_t half = (size_t)max_T * m->Dr / 2;
    float *cs = xmalloc(sizeof(float) * 2 * half);
    rope_tables(cs, cs + half, &m->cfg, max_T);
    d->rope_cos = be->alloc(sizeof(float) * half);
    d->rope_sin = be->alloc(sizeof(float) * half);
    be->from_host(d->rope_cos, cs, sizeof(float) * half);
    be->from_host(d->rope_sin, cs + half, sizeof(float) * half);
    free(cs);
    d->x = be->alloc(sizeof(float) * n * C);
    d->xmid = be->alloc(sizeof(float) * n * C);
    d->ln = be->alloc(sizeof(float) * n * C);
    d->rstd = be->alloc(sizeof(float) * n);
    d->q = be->alloc(sizeof(float) * n * QD);
    d->att = be->alloc(sizeof(float) * n * m->H * m->Dv);
    d->logits = be->alloc(sizeof(float) * m->V);
    d->tokens = be->alloc(sizeof(int32_t) * n);
    if (m->mla) {
        size_t QR = m->QR ? m->QR : 1;
        d->qa = be->alloc(sizeof(float) * n * QR);
        d->qan = be->alloc(sizeof(float) * n * QR);
        d->ckv = be->alloc(sizeof(float) * n * m->KR);
        d->kvn = be->alloc(sizeof(float) * n * m->KR);
        d->kpe = be->alloc(sizeof(float) * n * m->Dr);
        d->kvb = be->alloc(sizeof(float) * n * m->H * (m->DN + m->Dv));
        d->rot = be->alloc(sizeof(float) * n * m->H * m->Dr);
        d->rstd2 = be->alloc(sizeof(float) * n);
    }
    /* the SwiGLU of dense layers (F) and of the shared experts (Fs) */
    size_t F = m->n_moe_layers < m->n_local_layers ? (size_t)m->F : 0, Fs = m->n_moe_layers ? (size_t)m->Fs : 0;
    if (Fs > F) F = Fs;
    if (F) {
        d->gate = be->alloc(sizeof(float) * n * F);
        d->up = be->alloc(sizeof(float) * n * F);
        d->h = be->alloc(sizeof(float) * n * F);
    }
    if (m->n_moe_layers) {
        size_t E = m->E, K = m->K, FM = m->FM;
        d->rlogits = be->alloc(sizeof(float) * n * E);
        d->probs = be->alloc(sizeof(float) * n * E);
        d->lse = be->alloc(sizeof(float) * n);
        d->topw = be->alloc(sizeof(float) * n * K);
        d->topi = be->alloc(sizeof(int32_t) * n * K);
        d->pos = be->alloc(sizeof(int32_t) * n * K);
        d->rows = be->alloc(sizeof(int32_t) * n * K);
        d->xe = be->alloc(sizeof(float) * n * K * C);
        d->ye = be->alloc(sizeof(float) * n * K * C);
        d->eg = be->alloc(sizeof(float) * n * K * FM);
        d->eu = be->alloc(sizeof(float) * n * K * FM);
        d->eh = be->alloc(sizeof(float) * n * K * FM);
        d->moe_out = be->alloc(sizeof(float) * n * C);
        d->host_topi = xmalloc(sizeof(int32_t) * n * K);
        d->host_pos = xmalloc(sizeof(int32_t) * n * K);
        d->host_rows = xmalloc(sizeof(int32_t) * n * K);
        d->host_count = xmalloc(sizeof(int) * E);
    }
}

void decoder_free(struct decoder *d) {
    const struct backend *be = d->be;
    float *dev[] = {d->kcache, d->vcache, d->rope_cos, d->rope_sin, d->x, d->xmid, d->ln, d->rstd, d->q, d->att,
                    d->gate, d->up, d->h, d->logits, d->rlogits, d->probs, d->lse, d->topw, d->xe, d->ye, d->eg,
                    d->eu, d->eh, d->moe_out, d->qa, d->qan, d->ckv, d->kvn, d->kpe, d->kvb, d->rot, d->rstd2};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) be->free(dev[i]);
    int32_t *idev[] = {d->tokens, d->topi, d->pos, d->rows};
    for (size_t i = 0; i < sizeof idev / sizeof idev[0]; i++)
        if (idev[i]) be->free(idev[i]);
    free(d->host_topi), free(d->host_pos), free(d->host_rows), free(d->host_count);
    memset(d, 0, sizeof *d);
}

void decoder_reset(struct decoder *d) { d->len = 0; }

/* moe_out[n, C] = the gate-weighted sum of each token's top-k experts on ln. */
static void moe_block(struct decoder *d, const struct layer_weights *w, int n) {
    const struct backend *be = d->be;
    const struct transformer *m = d->m;
    int E = m->E, K = m->K, C = m->C, FM = m->FM, nk = n * K;
    be->matmul_forward(d->rlogits, d->ln, w->router, n, C, E, 0);
    if (m->sigmoid)
        be->moe_route_sigmoid_forward(d->probs, d->topi, d->topw, d->rlogits, w->bias, n, E, K, m->cfg.moe_n_group,
                                      m->cfg.moe_topk_group, (float)m->cfg.moe_routed_scaling);
    else
        be->moe_route_forward(d->probs, d->lse, d->topi, d->topw, d->rlogits, n, E, K);
    /* selections sorted by expert, in token order within one */
    be->to_host(d->host_topi, d->topi, sizeof(int32_t) * nk);
    memset(d->host_count, 0, sizeof(int) * E);
    for (int i = 0; i < nk; i++) d->host_count[d->host_topi[i]]++;
    int *next = d->host_count; /* becomes each expert's next free row */
    for (int e = 0, start = 0; e < E; e++) {
        int c = next[e];
        next[e] = start;
        start += c;
    }
    for (int i = 0; i < nk; i++) {
        int row = next[d->host_topi[i]]++;
        d->host_pos[i] = row;
        d->host_rows[row] = i / K;
    }
    be->from_host(d->pos, d->host_pos, sizeof(int32_t) * nk);
    be->from_host(d->rows, d->host_rows, sizeof(int32_t) * nk);
    be->gather_rows(d->xe, d->ln, d->rows, nk, C);
    /* next[e] is now the end of expert e's rows */
    for (int e = 0, o = 0; e < E; o = next[e], e++) {
        int rows = next[e] - o;
        if (!rows) continue;
        float *const *ew = w->experts + 3 * e;
        size_t of = (size_t)o * FM, oc = (size_t)o * C;
        be->matmul_forward(d->eg + of, d->xe + oc, ew[0], rows, C, FM, 0);
        be->matmul_forward(d->eu + of, d->xe + oc, ew[2], rows, C, FM, 0);
        be->swiglu_forward(d->eh + of, d->eg + of, d->eu + of, (size_t)rows * FM);
        be->matmul_forward(d->ye + oc, d->eh + of, ew[1], rows, FM, C, 0);
    }
    be->moe_combine(d->moe_out, d->ye, d->pos, d->topw, n, K, C, 0);
}

/* RoPE at positions len .. len+n-1 on the rotary columns [DN, DN+Dr) of
 * each of the heads of x [n, heads, ld] (MLA's [nope | rope] heads) */
static void rope_cols(struct decoder *d, float *x, int n, int heads, int ld, int DN) {
    const struct backend *be = d->be;
    int Dr = d->m->Dr, rows = n * heads;
    const float *cs = d->rope_cos + (size_t)d->len * Dr / 2, *sn = d->rope_sin + (size_t)d->len * Dr / 2;
    be->copy_cols(d->rot, Dr, x + DN, ld, rows, Dr, 0);
    be->rope(d->rot, cs, sn, 1, n, heads, Dr, 0);
    be->copy_cols(x + DN, ld, d->rot, Dr, rows, Dr, 0);
}

/* Multi-head latent attention's queries into d->q and this chunk's keys and
 * values into the layer's caches at d->len (as model/mla.c computes them). */
static void mla_project(struct decoder *d, const struct layer_weights *w, float *knew, float *vnew, int n) {
    const struct backend *be = d->be;
    const struct transformer *m = d->m;
    int C = m->C, H = m->H, D = m->D, DN = m->DN, Dv = m->Dv, Dr = m->Dr, KR = m->KR, QR = m->QR;
    float eps = (float)m->cfg.norm_eps;
    if (QR) {
        be->matmul_forward(d->qa, d->ln, w->wq_a, n, C, QR, 0);
        be->rmsnorm_forward(d->qan, d->rstd2, d->qa, w->q_a_ln, n, QR, eps);
        be->matmul_forward(d->q, d->qan, w->wq_b, n, QR, H * D, 0);
    } else {
        be->matmul_forward(d->q, d->ln, w->wq, n, C, H * D, 0);
    }
    be->matmul_forward(d->ckv, d->ln, w->wkv_a, n, C, KR, 0);
    be->matmul_forward(d->kpe, d->ln, w->wkv_a + (size_t)KR * C, n, C, Dr, 0);
    be->rmsnorm_forward(d->kvn, d->rstd2, d->ckv, w->kv_a_ln, n, KR, eps);
    be->matmul_forward(d->kvb, d->kvn, w->wkv_b, n, KR, H * (DN + Dv), 0);
    rope_cols(d, d->q, n, H, D, DN);
    if (m->q_scale != 1.0f) be->scale(d->q, m->q_scale, (size_t)n * H * D);
    rope_cols(d, d->kpe, n, 1, Dr, 0);
    /* keys [k_nope of the head | the shared rotary key], values the rest of the up projection */
    be->copy_cols(knew, D, d->kvb, DN + Dv, n * H, DN, 0);
    for (int h = 0; h < H; h++) be->copy_cols(knew + (size_t)h * D + DN, H * D, d->kpe, Dr, n, Dr, 0);
    be->copy_cols(vnew, Dv, d->kvb + DN, DN + Dv, n * H, Dv, 0);
}

/* x += SwiGLU(ln) of width F (a dense FFN, or a MoE layer's shared experts) */
static void swiglu_add(struct decoder *d, const struct layer_weights *w, int n, int F) {
    const struct backend *be = d->be;
    int C = d->m->C;
    be->matmul_forward(d->gate, d->ln, w->wgate, n, C, F, 0);
    be->matmul_forward(d->up, d->ln, w->wup, n, C, F, 0);
    be->swiglu_forward(d->h, d->gate, d->up, (size_t)n * F);
    be->matmul_forward(d->x, d->h, w->wdown, n, F, C, 1);
}

/* One layer over n new tokens in d->x (in place). */
static void block(struct decoder *d, int l, int n) {
    const struct backend *be = d->be;
    const struct transformer *m = d->m;
    const struct layer_weights *w = &m->layers[l];
    int C = m->C, D = m->D, Dv = m->Dv, H = m->H, KV = m->KV, KD = KV * D, VD = KV * Dv;
    float eps = (float)m->cfg.norm_eps;
    float *kc = d->kcache + (size_t)l * d->max_T * KD, *vc = d->vcache + (size_t)l * d->max_T * VD;
    float *knew = kc + (size_t)d->len * KD, *vnew = vc + (size_t)d->len * VD;
    be->rmsnorm_forward(d->ln, d->rstd, d->x, w->ln1_w, n, C, eps);
    if (m->mla) {
        mla_project(d, w, knew, vnew, n);
    } else {
        const float *cs = d->rope_cos + (size_t)d->len * D / 2, *sn = d->rope_sin + (size_t)d->len * D / 2;
        be->matmul_forward(d->q, d->ln, w->wq, n, C, H * D, 0);
        be->matmul_forward(knew, d->ln, w->wk, n, C, KD, 0);
        be->matmul_forward(vnew, d->ln, w->wv, n, C, VD, 0);
        be->rope(d->q, cs, sn, 1, n, H, D, 0);
        be->rope(knew, cs, sn, 1, n, KV, D, 0);
    }
    be->attention_decode(d->att, d->q, kc, vc, n, d->len + n, H, KV, D, Dv);
    be->copy(d->xmid, d->x, sizeof(float) * n * C);
    be->matmul_forward(d->xmid, d->att, w->wo, n, H * Dv, C, 1);
    be->rmsnorm_forward(d->ln, d->rstd, d->xmid, w->ln2_w, n, C, eps);
    be->copy(d->x, d->xmid, sizeof(float) * n * C);
    if (!w->moe) {
        swiglu_add(d, w, n, m->F);
        return;
    }
    if (w->wgate) swiglu_add(d, w, n, m->Fs); /* shared experts */
    moe_block(d, w, n);
    be->add(d->x, d->moe_out, (size_t)n * C);
}

void decoder_forward(struct decoder *d, const int32_t *tokens, int n, float *logits_out) {
    const struct backend *be = d->be;
    const struct transformer *m = d->m;
    CHECK(n > 0 && d->len + n <= d->max_T);
    int C = m->C;
    while (n > 0) {
        int k = n < d->chunk ? n : d->chunk;
        be->from_host(d->tokens, tokens, sizeof(int32_t) * k);
        be->embedding_forward(d->x, d->tokens, m->embed, k, C, 0, m->V);
        for (int l = 0; l < m->L; l++) block(d, l, k);
        d->len += k, tokens += k, n -= k;
        if (n > 0) continue;
        /* the head, for the last token only */
        const float *last = d->x + (size_t)(k - 1) * C;
        be->rmsnorm_forward(d->ln, d->rstd, last, m->norm_w, 1, C, (float)m->cfg.norm_eps);
        be->matmul_forward(d->logits, d->ln, m->lm_head, 1, C, m->V, 0);
        be->to_host(logits_out, d->logits, sizeof(float) * m->V);
    }
}
