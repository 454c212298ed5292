#include <string.h>

#include "config/common.h"
#include "model/init.h"
#include "model/llama.h"

/* ---- activation arena layout: one pass computes sizes, a second carves ---- */

struct carver {
    float *base;
    size_t used;
};

static float *carve(struct carver *c, size_t n) {
    float *p = c->base ? c->base + c->used : NULL;
    c->used += (n + 15) / 16 * 16;
    return p;
}

static void layout_arena(struct llama *m, struct carver *c) {
    size_t N = (size_t)m->B * m->T, C = m->C, QD = (size_t)m->H * m->D, KD = (size_t)m->KV * m->D, F = m->F;
    for (int l = 0; l < m->L; l++) {
        struct layer_acts *a = &m->acts[l];
        a->x = carve(c, N * C);
        a->ln1 = carve(c, N * C);
        a->rstd1 = carve(c, N);
        a->q = carve(c, N * QD);
        a->k = carve(c, N * KD);
        a->v = carve(c, N * KD);
        a->att = carve(c, (size_t)m->B * m->H * m->T * m->T);
        a->attn_out = carve(c, N * QD);
        a->xmid = carve(c, N * C);
        a->ln2 = carve(c, N * C);
        a->rstd2 = carve(c, N);
        a->gate = carve(c, N * F);
        a->up = carve(c, N * F);
        a->h = carve(c, N * F);
    }
    m->x_final = carve(c, N * C);
    m->lnf = carve(c, N * C);
    m->rstdf = carve(c, N);
    m->logits = carve(c, N * m->V);
    m->losses = carve(c, N);
    m->d_resid = carve(c, N * C);
    m->d_ln = carve(c, N * C);
    m->d_attn = carve(c, N * QD);
    m->d_q = carve(c, N * QD);
    m->d_k = carve(c, N * KD);
    m->d_v = carve(c, N * KD);
    m->d_gate = carve(c, N * F);
    m->d_up = carve(c, N * F);
    m->d_h = carve(c, N * F);
    m->rope_cos = carve(c, (size_t)m->T * m->D / 2);
    m->rope_sin = carve(c, (size_t)m->T * m->D / 2);
    m->tokens = (int32_t *)carve(c, N);
    m->targets = (int32_t *)carve(c, N);
}

static void set_dims(struct llama *m, const struct model_config *cfg, int B, int T) {
    m->cfg = *cfg;
    m->B = B, m->T = T;
    m->C = cfg->hidden_size, m->H = cfg->num_heads, m->KV = cfg->num_kv_heads;
    m->D = m->C / m->H, m->F = cfg->intermediate_size, m->V = cfg->vocab_size, m->L = cfg->num_layers;
}

size_t llama_arena_bytes(const struct model_config *cfg, int B, int T) {
    struct llama m = {0};
    set_dims(&m, cfg, B, T);
    m.acts = xcalloc(m.L, sizeof *m.acts);
    struct carver c = {0};
    layout_arena(&m, &c);
    free(m.acts);
    return c.used * sizeof(float);
}

/* Point the per-layer weight structs into a buffer laid out by the table. */
static void bind_layers(struct llama *m, float *buf, struct llama_layer *layers, float **embed, float **norm_w,
                        float **lm_head) {
    char name[PARAM_NAME_MAX];
#define P(nm) (buf + param_find(&m->table, nm)->offset)
    for (int l = 0; l < m->L; l++) {
        struct llama_layer *y = &layers[l];
#define LP(field, suffix)                                               \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);       \
    y->field = P(name)
        LP(ln1_w, "input_layernorm.weight");
        LP(wq, "self_attn.q_proj.weight");
        LP(wk, "self_attn.k_proj.weight");
        LP(wv, "self_attn.v_proj.weight");
        LP(wo, "self_attn.o_proj.weight");
        LP(ln2_w, "post_attention_layernorm.weight");
        LP(wgate, "mlp.gate_proj.weight");
        LP(wup, "mlp.up_proj.weight");
        LP(wdown, "mlp.down_proj.weight");
#undef LP
    }
    *embed = P("model.embed_tokens.weight");
    *norm_w = P("model.norm.weight");
    *lm_head = m->cfg.tie_embeddings ? *embed : P("lm_head.weight");
#undef P
}

void llama_create(struct llama *m, const struct backend *be, const struct model_config *cfg, int B, int T) {
    memset(m, 0, sizeof *m);
    m->be = be;
    set_dims(m, cfg, B, T);
    param_table_build(&m->table, cfg, 1, 0);
    m->params = be->alloc(sizeof(float) * m->table.total);
    m->grads = be->alloc(sizeof(float) * m->table.total);
    m->layers = xcalloc(m->L, sizeof *m->layers);
    m->dlayers = xcalloc(m->L, sizeof *m->dlayers);
    bind_layers(m, m->params, m->layers, &m->embed, &m->norm_w, &m->lm_head);
    bind_layers(m, m->grads, m->dlayers, &m->dembed, &m->dnorm_w, &m->dlm_head);
    m->acts = xcalloc(m->L, sizeof *m->acts);
    struct carver c = {0};
    layout_arena(m, &c);
    m->arena_floats = c.used;
    m->arena = be->alloc(sizeof(float) * c.used);
    c = (struct carver){m->arena, 0};
    layout_arena(m, &c);
    size_t half = (size_t)T * m->D / 2;
    float *cs = xmalloc(sizeof(float) * half * 2);
    rope_tables(cs, cs + half, cfg, T);
    be->from_host(m->rope_cos, cs, sizeof(float) * half);
    be->from_host(m->rope_sin, cs + half, sizeof(float) * half);
    free(cs);
}

void llama_free(struct llama *m) {
    m->be->free(m->params);
    m->be->free(m->grads);
    m->be->free(m->arena);
    free(m->layers);
    free(m->dlayers);
    free(m->acts);
    param_table_free(&m->table);
}

void llama_init_params(struct llama *m, uint64_t seed) { params_init(m->be, m->params, &m->table, seed, 0); }

/* ---- forward ---- */

static void block_forward(struct llama *m, int l, float *out) {
    const struct backend *be = m->be;
    const struct llama_layer *w = &m->layers[l];
    struct layer_acts *a = &m->acts[l];
    int N = m->B * m->T, C = m->C, QD = m->H * m->D, KD = m->KV * m->D, F = m->F;
    float eps = (float)m->cfg.norm_eps;
    be->rmsnorm_forward(a->ln1, a->rstd1, a->x, w->ln1_w, N, C, eps);
    be->matmul_forward(a->q, a->ln1, w->wq, N, C, QD, 0);
    be->matmul_forward(a->k, a->ln1, w->wk, N, C, KD, 0);
    be->matmul_forward(a->v, a->ln1, w->wv, N, C, KD, 0);
    be->rope(a->q, m->rope_cos, m->rope_sin, m->B, m->T, m->H, m->D, 0);
    be->rope(a->k, m->rope_cos, m->rope_sin, m->B, m->T, m->KV, m->D, 0);
    be->attention_forward(a->attn_out, a->att, a->q, a->k, a->v, m->B, m->T, m->H, m->KV, m->D);
    be->copy(a->xmid, a->x, sizeof(float) * N * C);
    be->matmul_forward(a->xmid, a->attn_out, w->wo, N, QD, C, 1);
    be->rmsnorm_forward(a->ln2, a->rstd2, a->xmid, w->ln2_w, N, C, eps);
    be->matmul_forward(a->gate, a->ln2, w->wgate, N, C, F, 0);
    be->matmul_forward(a->up, a->ln2, w->wup, N, C, F, 0);
    be->swiglu_forward(a->h, a->gate, a->up, (size_t)N * F);
    be->copy(out, a->xmid, sizeof(float) * N * C);
    be->matmul_forward(out, a->h, w->wdown, N, F, C, 1);
}

/* ---- backward: m->d_resid holds dL/d(layer output) on entry, dL/d(layer input) on exit ---- */

static void block_backward(struct llama *m, int l) {
    const struct backend *be = m->be;
    const struct llama_layer *w = &m->layers[l];
    struct llama_layer *dw = &m->dlayers[l];
    struct layer_acts *a = &m->acts[l];
    int N = m->B * m->T, C = m->C, QD = m->H * m->D, KD = m->KV * m->D, F = m->F;
    /* MLP branch */
    be->matmul_backward(m->d_h, dw->wdown, m->d_resid, a->h, w->wdown, N, F, C, 0);
    be->swiglu_backward(m->d_gate, m->d_up, m->d_h, a->gate, a->up, (size_t)N * F);
    be->matmul_backward(m->d_ln, dw->wgate, m->d_gate, a->ln2, w->wgate, N, C, F, 0);
    be->matmul_backward(m->d_ln, dw->wup, m->d_up, a->ln2, w->wup, N, C, F, 1);
    be->rmsnorm_backward(m->d_resid, dw->ln2_w, m->d_ln, a->xmid, w->ln2_w, a->rstd2, N, C, 1);
    /* attention branch */
    be->matmul_backward(m->d_attn, dw->wo, m->d_resid, a->attn_out, w->wo, N, QD, C, 0);
    be->attention_backward(m->d_q, m->d_k, m->d_v, m->d_attn, a->att, a->q, a->k, a->v, m->B, m->T, m->H, m->KV,
                           m->D);
    be->rope(m->d_q, m->rope_cos, m->rope_sin, m->B, m->T, m->H, m->D, 1);
    be->rope(m->d_k, m->rope_cos, m->rope_sin, m->B, m->T, m->KV, m->D, 1);
    be->matmul_backward(m->d_ln, dw->wq, m->d_q, a->ln1, w->wq, N, C, QD, 0);
    be->matmul_backward(m->d_ln, dw->wk, m->d_k, a->ln1, w->wk, N, C, KD, 1);
    be->matmul_backward(m->d_ln, dw->wv, m->d_v, a->ln1, w->wv, N, C, KD, 1);
    be->rmsnorm_backward(m->d_resid, dw->ln1_w, m->d_ln, a->x, w->ln1_w, a->rstd1, N, C, 1);
}

double llama_step(struct llama *m, const int32_t *tokens, const int32_t *targets, float dscale) {
    const struct backend *be = m->be;
    int N = m->B * m->T, C = m->C, V = m->V;
    be->from_host(m->tokens, tokens, sizeof(int32_t) * N);
    be->from_host(m->targets, targets, sizeof(int32_t) * N);
    be->embedding_forward(m->acts[0].x, m->tokens, m->embed, N, C);
    for (int l = 0; l < m->L; l++) block_forward(m, l, l + 1 < m->L ? m->acts[l + 1].x : m->x_final);
    be->rmsnorm_forward(m->lnf, m->rstdf, m->x_final, m->norm_w, N, C, (float)m->cfg.norm_eps);
    be->matmul_forward(m->logits, m->lnf, m->lm_head, N, C, V, 0);
    be->cross_entropy(m->losses, m->logits, m->targets, N, V, dscale);
    double loss = be->sum(m->losses, N);
    if (dscale == 0.0f) return loss;
    /* logits now hold dL/dlogits */
    be->matmul_backward(m->d_ln, m->dlm_head, m->logits, m->lnf, m->lm_head, N, C, V, 0);
    be->rmsnorm_backward(m->d_resid, m->dnorm_w, m->d_ln, m->x_final, m->norm_w, m->rstdf, N, C, 0);
    for (int l = m->L - 1; l >= 0; l--) block_backward(m, l);
    be->embedding_backward(m->dembed, m->tokens, m->d_resid, N, C);
    return loss;
}
