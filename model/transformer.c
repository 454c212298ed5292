#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "model/init.h"
#include "model/transformer.h"
#include "model/linear.h"
#include "model/mla.h"
#include "model/cp_attention.h"
#include "model/moe.h"

/* ---- arena layout: one pass computes sizes, a second carves ---- */

struct carver {
    char *base;
    size_t used;  /* bytes */
    size_t act;   /* bytes of one stored activation element (kernels/ops.h act_bytes) */
};

/* n elements of size bytes, 64-byte aligned */
static float *carve_n(struct carver *c, size_t n, size_t size) {
    float *p = c->base ? (float *)(c->base + c->used) : NULL;
    c->used += (n * size + 63) / 64 * 64;
    return p;
}
/* fp32 statistics and int32 indices */
static float *carve(struct carver *c, size_t n) { return carve_n(c, n, sizeof(float)); }
/* activation storage: the table's precision */
static float *carve_act(struct carver *c, size_t n) { return carve_n(c, n, c->act); }

/* Layers L .. L+D-1 are the MTP modules' blocks, on the stage with the head. */
static int is_local_layer(const struct model_part *p, int L, int l) {
    if (l >= L) return p->has_head;
    for (int c = 0; c < p->nchunks; c++)
        if (l >= p->layer_begin[c] && l < p->layer_end[c]) return 1;
    return 0;
}

/* The activations of a layer with a SwiGLU of width F (dense, or a MoE
 * layer's shared experts; 0: none) and/or a MoE FFN besides its input; with
 * shared set, the attention state and output and the SwiGLU products point
 * into it instead of being carved (selective recompute). */
static void carve_layer(struct transformer *m, struct layer_acts *a, size_t F, int moe,
                        const struct layer_acts *shared, struct carver *c) {
    size_t N = m->N, Ns = m->Ns, C = m->C, QD = (size_t)m->Hl * m->D, KD = (size_t)m->KVl * m->D;
    size_t VD = (size_t)m->KVl * m->Dv, OD = (size_t)m->Hl * m->Dv;
    a->ln1 = carve_act(c, N * C);
    a->rstd1 = carve(c, Ns);
    if (m->mla) {
        a->qa = carve_act(c, N * m->QR);
        a->qan = carve_act(c, N * m->QR);
        a->rstdq = carve(c, N);
        a->ckv = carve_act(c, N * m->KR);
        a->kvn = carve_act(c, N * m->KR);
        a->rstdkv = carve(c, N);
    }
    a->q = carve_act(c, N * QD);
    a->k = carve_act(c, N * KD);
    a->v = carve_act(c, N * VD);
    a->att = shared ? shared->att : carve(c, m->be->attention_state_floats(m->B, m->Hl, m->T));
    a->attn_out = shared ? shared->attn_out : carve_act(c, N * OD);
    a->xmid = carve_act(c, Ns * C);
    a->ln2 = carve_act(c, N * C);
    a->rstd2 = carve(c, Ns);
    if (F) {
        a->gate = carve_act(c, N * F);
        a->up = carve_act(c, N * F);
        a->h = shared ? shared->h : carve_act(c, N * F);
    }
    if (!moe) return;
    size_t n = m->moe_n, k = m->K, E = m->E, R = m->moe_R0, FM = m->FM;
    a->rows_cap = (int)R;
    a->logits = carve_act(c, n * E);
    a->probs = carve(c, n * E);
    a->lse = carve(c, n);
    a->topw = carve(c, n * k);
    a->topi = (int32_t *)carve(c, n * k);
    a->pos = (int32_t *)carve(c, n * k);
    a->send_rows = (int32_t *)carve(c, n * k);
    a->recv_order = (int32_t *)carve(c, R);
    a->recv_inverse = (int32_t *)carve(c, R);
    a->xe = carve_act(c, R * C);
    a->eg = carve_act(c, R * FM);
    a->eu = carve_act(c, R * FM);
    a->eh = shared ? shared->eh : carve_act(c, R * FM);
    a->y = carve_act(c, n * k * C);
    a->aux_coef = carve(c, (size_t)m->B * E);
    a->expert_off = (int32_t *)carve(c, (size_t)m->El + 1);
}

/* What a layer keeps for backward (train.recompute): none keeps everything;
 * selective shares one copy of the attention state and output and of the
 * SwiGLU products among all layers (backward recomputes them); full keeps
 * only the layer input, the rest lives in one shared set that backward
 * refills by running the layer again. */
/* Whether slot s holds layer l's activations (l local): its chunk's layers (the MTP modules: the head's) */
static int slot_holds(const struct transformer *m, const struct act_slot *s, int l) {
    if (s->chunk < 0) return 1;
    if (l >= m->L) return s->chunk == m->part.nchunks - 1;
    return l >= m->part.layer_begin[s->chunk] && l < m->part.layer_end[s->chunk];
}
static int slot_has_head(const struct transformer *m, const struct act_slot *s) {
    return m->part.has_head && (s->chunk < 0 || s->chunk == m->part.nchunks - 1);
}

static void layout_slot(struct transformer *m, struct act_slot *s, struct carver *c) {
    size_t N = m->N, Ns = m->Ns, C = m->C;
    s->mem_begin = c->base ? c->base + c->used : NULL;
    const struct layer_acts *shared = &m->shared_acts;
    for (int l = 0; l < m->NL; l++) {
        if (!is_local_layer(&m->part, m->L, l) || !slot_holds(m, s, l)) continue;
        struct layer_acts *a = &s->acts[l];
        a->x = carve_act(c, Ns * C);
        if (m->recompute == RECOMPUTE_FULL) continue;
        int moe = model_layer_is_moe(&m->cfg, l);
        carve_layer(m, a, moe ? m->Fs : m->Fl, moe, m->recompute == RECOMPUTE_SELECTIVE ? shared : NULL, c);
    }
    if (slot_has_head(m, s)) {
        s->x_final = carve_act(c, Ns * C);
        s->lnf = carve_act(c, N * C);
        s->rstdf = carve(c, Ns);
        s->logits = carve_act(c, N * m->Vl);
        s->losses = carve(c, N);
        s->ce_max = carve(c, N);
        s->ce_sum = carve(c, N);
        s->ce_tgt = carve(c, N);
    }
    s->tokens = (int32_t *)carve(c, N);
    s->targets = (int32_t *)carve(c, N);
    for (int d = 0; d < m->mtp_depth && slot_has_head(m, s); d++) {
        struct mtp_acts *t = &s->mtp[d];
        t->emb = carve_act(c, Ns * C), t->rstde = carve(c, Ns), t->en = carve_act(c, N * C);
        t->rstdh = carve(c, Ns), t->hn = carve_act(c, N * C);
        t->cat = carve_act(c, N * 2 * C);
        t->out = carve_act(c, Ns * C), t->lnf = carve_act(c, N * C), t->rstdf = carve(c, Ns);
        t->logits = carve_act(c, N * m->Vl), t->losses = carve(c, N);
        t->ce_max = carve(c, N), t->ce_sum = carve(c, N), t->ce_tgt = carve(c, N);
        t->tokens = (int32_t *)carve(c, N), t->targets = (int32_t *)carve(c, N);
    }
    s->mem_end = c->base ? c->base + c->used : NULL;
}

/* The widest SwiGLU of the local layers (dense FFN or shared experts). */
static size_t swiglu_width(const struct transformer *m) {
    size_t dense = m->n_moe_layers < m->n_local_layers ? (size_t)m->Fl : 0, shared = m->n_moe_layers ? (size_t)m->Fs : 0;
    return dense > shared ? dense : shared;
}

/* The one set of layer activations recomputation shares: selective, the
 * recomputed products; full, a whole layer of either kind. */
static void layout_shared(struct transformer *m, struct carver *c) {
    struct layer_acts *a = &m->shared_acts;
    size_t N = m->N, OD = (size_t)m->Hl * m->Dv, F = swiglu_width(m), R = m->moe_R0, FM = m->FM;
    int moe = m->n_moe_layers > 0;
    memset(a, 0, offsetof(struct layer_acts, plan));
    if (m->recompute == RECOMPUTE_FULL) {
        carve_layer(m, a, F, moe, NULL, c);
        m->recompute_out = carve_act(c, (size_t)m->Ns * m->C);
    } else if (m->recompute == RECOMPUTE_SELECTIVE) {
        a->att = carve(c, m->be->attention_state_floats(m->B, m->Hl, m->T));
        a->attn_out = carve_act(c, N * OD);
        if (F) a->h = carve_act(c, N * F);
        if (moe) a->eh = carve_act(c, R * FM), a->rows_cap = (int)R;
    }
}

static void layout_arena(struct transformer *m, struct carver *c) {
    size_t N = m->N, Ns = m->Ns, C = m->C, QD = (size_t)m->Hl * m->D, KD = (size_t)m->KVl * m->D, F = swiglu_width(m);
    size_t VD = (size_t)m->KVl * m->Dv, OD = (size_t)m->Hl * m->Dv;
    layout_shared(m, c);
    for (int i = 0; i < m->nslots; i++) layout_slot(m, &m->slots[i], c);
    m->d_resid = carve_act(c, Ns * C);
    m->d_full = carve_act(c, N * C);
    m->d_ln_full = carve_act(c, N * C);
    m->d_ln = m->sp ? carve_act(c, Ns * C) : m->d_ln_full;
    m->tmp_full = carve_act(c, N * C);
    m->tmp_shard = carve_act(c, Ns * C);
    m->d_attn = carve_act(c, N * OD);
    m->d_q = carve_act(c, N * QD);
    m->d_k = carve_act(c, N * KD);
    m->d_v = carve_act(c, N * VD);
    if (m->mla) {
        size_t kvb = (size_t)m->Hl * (m->DN + m->Dv);
        m->mla_kvb = carve_act(c, N * kvb);
        m->d_kvb = carve_act(c, N * kvb);
        m->mla_kpe = carve_act(c, N * m->Dr);
        m->d_kpe = carve_act(c, N * m->Dr);
        m->mla_rope = carve_act(c, N * m->Hl * m->Dr);
        m->mla_heads = (int32_t *)carve(c, N * m->Hl);
        m->d_kvn = carve_act(c, N * m->KR);
        m->d_ckv = carve_act(c, N * m->KR);
        m->d_qan = carve_act(c, N * m->QR);
        m->d_qa = carve_act(c, N * m->QR);
    }
    m->d_gate = carve_act(c, N * F);
    m->d_up = carve_act(c, N * F);
    m->d_h = carve_act(c, N * F);
    if (m->n_moe_layers) {
        size_t n = m->moe_n, k = m->K, E = m->E, R = m->moe_R0, FM = m->FM;
        m->moe_scratch_rows = (int)R;
        m->moe_out = carve_act(c, n * C);
        m->d_moe_in = carve_act(c, n * C);
        m->moe_send = carve_act(c, n * k * C);
        m->moe_ra = carve_act(c, R * C);
        m->moe_rb = carve_act(c, R * C);
        m->d_eg = carve_act(c, R * FM);
        m->d_eu = carve_act(c, R * FM);
        m->d_eh = carve_act(c, R * FM);
        m->d_topw = carve(c, n * k);
        m->d_logits = carve_act(c, n * E);
        m->moe_counts = carve(c, moe_counts_len(m));
        if (m->etp > 1 && m->be->act_bytes != sizeof(float)) m->moe_f32 = carve(c, R * C);
        m->moe_tp_counts = carve(c, (size_t)(m->tp + (m->tp > 1)) * m->B * E);
    }
    if (m->mtp_depth) {
        m->d_mtp_carry = carve_act(c, Ns * C);
        m->d_mtp_rows = carve_act(c, Ns * C);
        m->d_mtp_cat = carve_act(c, N * 2 * C);
    }
    m->rope_cos = carve(c, (size_t)m->T * m->Dr / 2);
    m->rope_sin = carve(c, (size_t)m->T * m->Dr / 2);
    if (c->act != sizeof(float)) m->comm_f32 = carve(c, (N + Ns) * C); /* fp32 sums of stored activations */
}

static void set_dims(struct transformer *m, const struct model_config *cfg, const struct model_part *part, int sp, int B,
                     int T, int nslots, enum recompute rc) {
    m->cfg = *cfg;
    m->recompute = rc;
    m->part = *part;
    m->B = B, m->T = T, m->N = B * T;
    m->C = cfg->hidden_size, m->H = cfg->num_heads, m->KV = cfg->num_kv_heads;
    m->D = model_head_dim(cfg), m->Dv = model_v_head_dim(cfg), m->Dr = model_rope_dim(cfg);
    m->F = cfg->intermediate_size, m->V = cfg->vocab_size, m->L = cfg->num_layers;
    m->mla = model_is_mla(cfg);
    if (m->mla) m->KV = m->H, m->QR = cfg->q_lora_rank, m->KR = cfg->kv_lora_rank, m->DN = cfg->qk_nope_head_dim;
    m->q_scale = rope_softmax_scale(cfg);
    m->tp = part->tp;
    m->cp = 1; /* transformer_set_cp */
    m->sp = sp && part->tp > 1;
    m->Ns = m->sp ? m->N / m->tp : m->N;
    m->Hl = m->H / m->tp, m->KVl = m->KV >= m->tp ? m->KV / m->tp : 1, m->Fl = m->F / m->tp, m->Vl = m->V / m->tp;
    m->vstart = part->tp_rank * m->Vl;
    m->nslots = nslots;
    m->NL = m->L + model_mtp_depth(cfg);
    m->mtp_depth = part->has_head ? model_mtp_depth(cfg) : 0;
    for (int l = 0; l < m->NL; l++) {
        m->n_local_layers += is_local_layer(part, m->L, l);
        m->n_moe_layers += model_layer_is_moe(cfg, l) && is_local_layer(part, m->L, l);
    }
    if (cfg->num_experts > 0) {
        m->E = cfg->num_experts, m->K = cfg->experts_per_token, m->etp = part->etp;
        m->FM = model_moe_ffn_size(cfg) / m->etp;
        m->ep = part->ep, m->El = m->E / m->ep;
        m->moe_n = m->N / m->tp, m->moe_r0 = part->tp_rank * m->moe_n;
        /* the etp peers' rows are gathered: each expert slice sees etp ranks' received rows */
        m->moe_R = moe_expert_rows(cfg, m->moe_n, m->T, m->ep) * m->etp;
        m->moe_R0 = moe_initial_rows(cfg, m->moe_n, m->T, m->ep) * m->etp;
        m->Fs = cfg->moe_shared_experts * model_moe_ffn_size(cfg) / m->tp;
        m->sigmoid = !strcmp(cfg->moe_score_func, "sigmoid");
    }
}

enum recompute recompute_mode(const char *name) {
    return !strcmp(name, "full") ? RECOMPUTE_FULL : !strcmp(name, "selective") ? RECOMPUTE_SELECTIVE : RECOMPUTE_NONE;
}

size_t transformer_arena_bytes(const struct backend *be, const struct model_config *cfg, const struct model_part *part,
                         int sequence_parallel, int B, int T, int nslots, const int *slot_chunk, enum recompute rc) {
    struct transformer m = {0};
    m.be = be;
    set_dims(&m, cfg, part, sequence_parallel, B, T, nslots, rc);
    m.slots = xcalloc(nslots, sizeof *m.slots);
    for (int i = 0; i < nslots; i++) {
        m.slots[i].acts = xcalloc(m.NL, sizeof(struct layer_acts));
        m.slots[i].mtp = xcalloc(m.mtp_depth + 1, sizeof(struct mtp_acts));
        m.slots[i].chunk = slot_chunk ? slot_chunk[i] : -1;
    }
    struct carver c = {.act = be->act_bytes};
    layout_arena(&m, &c);
    for (int i = 0; i < nslots; i++) free(m.slots[i].acts), free(m.slots[i].mtp);
    free(m.slots);
    return c.used;
}

size_t transformer_pair_bytes(const struct backend *be, const struct model_config *cfg, const struct model_part *part,
                              int sequence_parallel, int B, int T, enum recompute rc) {
    struct transformer m = {0};
    m.be = be;
    set_dims(&m, cfg, part, sequence_parallel, B, T, 1, rc);
    return transformer_pairs_overlap(&m) ? moe_lane_bytes(&m) : 0;
}

size_t transformer_wgrad_bytes(const struct backend *be, const struct model_config *cfg, const struct model_part *part,
                               int sequence_parallel, int B, int T, enum recompute rc) {
    struct transformer m = {0};
    m.be = be;
    set_dims(&m, cfg, part, sequence_parallel, B, T, 1, rc);
    size_t N = m.N, C = m.C, QD = (size_t)m.Hl * m.D, KD = (size_t)m.KVl * m.D, VD = (size_t)m.KVl * m.Dv;
    size_t OD = (size_t)m.Hl * m.Dv, n = m.moe_n, R = m.moe_R0, FM = m.FM, elems = 0;
    for (int l = 0; l < m.NL; l++) {
        if (!is_local_layer(&m.part, m.L, l)) continue;
        int moe = model_layer_is_moe(cfg, l);
        size_t F = moe ? (size_t)m.Fs : (size_t)m.Fl;
        /* the output gradients that are copied: those without a home in the slot (linear_dout_home: q, k, v,
         * MLA's latents, gate and up, o_proj's in xmid unless rows are split); every one under full recompute */
        int homes = rc != RECOMPUTE_FULL;
        elems += m.mla ? N * ((homes ? 0 : m.QR + QD + m.KR) + (size_t)model_rope_dim(cfg) + (size_t)m.Hl * (m.DN + m.Dv))
                       : (homes ? 0 : N * (QD + KD + VD));
        if (!homes || (size_t)m.Ns < N) elems += N * C;       /* o_proj */
        if (F) elems += N * ((homes ? 0 : 2 * F) + C);        /* SwiGLU */
        if (moe) elems += n * m.E + R * ((homes ? 0 : 2 * FM) + C); /* router, routed experts */
        if (l >= m.L) elems += (size_t)m.Ns * C;             /* MTP's projection */
        /* the inputs recomputation overwrites (one copy per input) */
        if (rc == RECOMPUTE_SELECTIVE) elems += N * OD + N * F + (moe ? R * FM : 0);
        if (rc == RECOMPUTE_FULL) {
            elems += 2 * N * C + N * OD + N * F + (moe ? R * (C + FM) : 0);
            if (m.mla) elems += N * (m.QR + m.KR + (m.QR ? C : 0)); /* the normed latents; wq_a reads ln1 apart */
            if (moe && F) elems += n * C;                            /* the router reads ln2 apart from them */
        }
    }
    return elems * be->act_bytes;
}

/* Where the ops read tensor p from when binding buf: matrices from the
 * working copy; norm gains and state always from the fp32 master (a gain
 * near 1 moves by less than bf16's step there, 2^-7, for many updates). */
static float *bound(struct transformer *m, float *buf, const struct param_info *p) {
    if (buf != m->weights) return buf + p->offset;
    return p->kind == PARAM_MATRIX ? act_at(m, buf, p->offset)
                                   : master_at(&m->master, 0, (int)(p - m->table.items), p->offset);
}

/* Point the per-layer weight structs into a buffer laid out by the table. */
static void bind_layers(struct transformer *m, float *buf, struct layer_weights *layers, struct mtp_weights *mtp,
                        float **embed, float **norm_w, float **lm_head) {
    char name[PARAM_NAME_MAX];
#define P(nm) bound(m, buf, param_find(&m->table, nm))
    for (int l = 0; l < m->NL; l++) {
        if (!is_local_layer(&m->part, m->L, l)) continue;
        struct layer_weights *y = &layers[l];
#define LP(field, suffix)                                               \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);       \
    y->field = P(name)
        LP(ln1_w, "input_layernorm.weight");
        if (m->mla) {
            if (m->QR) {
                LP(wq_a, "self_attn.q_a_proj.weight");
                LP(q_a_ln, "self_attn.q_a_layernorm.weight");
                LP(wq_b, "self_attn.q_b_proj.weight");
            } else {
                LP(wq, "self_attn.q_proj.weight");
            }
            LP(wkv_a, "self_attn.kv_a_proj_with_mqa.weight");
            LP(kv_a_ln, "self_attn.kv_a_layernorm.weight");
            LP(wkv_b, "self_attn.kv_b_proj.weight");
        } else {
            LP(wq, "self_attn.q_proj.weight");
            LP(wk, "self_attn.k_proj.weight");
            LP(wv, "self_attn.v_proj.weight");
        }
        LP(wo, "self_attn.o_proj.weight");
        LP(ln2_w, "post_attention_layernorm.weight");
        y->moe = model_layer_is_moe(&m->cfg, l);
        if (y->moe) {
            static const char *const mixtral[3] = {"w1", "w2", "w3"}, *const deepseek[3] = {"gate_proj", "down_proj", "up_proj"};
            int ds = m->mla;
            if (ds) {
                LP(router, "mlp.gate.weight");
            } else {
                LP(router, "block_sparse_moe.gate.weight");
            }
            if (m->cfg.moe_bias_update_rate > 0) {
                LP(bias, "mlp.gate.e_score_correction_bias");
            }
            y->experts = xcalloc(3 * m->El, sizeof *y->experts);
            for (int e = 0; e < m->El; e++)
                for (int k = 0; k < 3; k++) {
                    snprintf(name, sizeof name, ds ? "model.layers.%d.mlp.experts.%d.%s.weight"
                                                   : "model.layers.%d.block_sparse_moe.experts.%d.%s.weight",
                             l, m->part.expert_begin + e, ds ? deepseek[k] : mixtral[k]);
                    y->experts[3 * e + k] = P(name);
                }
            if (!m->Fs) continue;
            LP(wgate, "mlp.shared_experts.gate_proj.weight");
            LP(wup, "mlp.shared_experts.up_proj.weight");
            LP(wdown, "mlp.shared_experts.down_proj.weight");
            continue;
        }
        LP(wgate, "mlp.gate_proj.weight");
        LP(wup, "mlp.up_proj.weight");
        LP(wdown, "mlp.down_proj.weight");
#undef LP
    }
    for (int d = 0; m->part.has_head && d < m->mtp_depth; d++) {
        struct mtp_weights *t = &mtp[d];
        int l = m->L + d;
#define MP(field, suffix)                                               \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);       \
    t->field = P(name)
        MP(enorm, "enorm.weight");
        MP(hnorm, "hnorm.weight");
        MP(eh_proj, "eh_proj.weight");
        MP(head_norm, "shared_head.norm.weight");
#undef MP
    }
    /* the first stage's embedding, or the last stage's copy of it (tied head, MTP) */
    *embed = m->part.has_embed || m->part.embed_copy ? P("model.embed_tokens.weight") : NULL;
    *norm_w = m->part.has_head ? P("model.norm.weight") : NULL;
    *lm_head = !m->part.has_head ? NULL : m->cfg.tie_embeddings ? *embed : P("lm_head.weight");
#undef P
}

/* Host-side dispatch plan arrays: counts per EP peer and local expert. */
static void alloc_plan(struct transformer *m, struct moe_plan *p) {
    p->send_counts = xcalloc(2 * m->ep + 2 * m->etp, sizeof(int));
    p->recv_counts = p->send_counts + m->ep;
    p->etp_rows = p->recv_counts + m->ep, p->etp_displ = p->etp_rows + m->etp;
    p->host_off = xcalloc(m->El + 1, sizeof(int32_t));
}

static void create(struct transformer *m, const struct backend *be, const struct model_config *cfg,
                   const struct model_part *part, struct comm *tp_comm, int sequence_parallel, int B, int T,
                   int nslots, const int *slot_chunk, enum recompute rc, int with_grads, int shard_master) {
    memset(m, 0, sizeof *m);
    m->be = be;
    m->tp_comm = tp_comm;
    set_dims(m, cfg, part, sequence_parallel, B, T, nslots, rc);
    CHECK(m->tp == 1 || (tp_comm && tp_comm->size == m->tp));
    param_table_build(&m->table, cfg, part);
    CHECK(!shard_master || be->precision != PRECISION_FP32);
    m->params = shard_master ? NULL : be->alloc(sizeof(float) * m->table.total);
    m->grads = with_grads ? be->alloc(sizeof(float) * m->table.total) : NULL;
    m->weights = be->precision == PRECISION_FP32 ? m->params : be->alloc(be->act_bytes * m->table.total);
    master_create(&m->master, be, &m->table, m->params, m->weights);
    m->layers = xcalloc(m->NL, sizeof *m->layers);
    m->dlayers = xcalloc(m->NL, sizeof *m->dlayers);
    m->mtp = xcalloc(m->mtp_depth + 1, sizeof *m->mtp);
    m->dmtp = xcalloc(m->mtp_depth + 1, sizeof *m->dmtp);
    m->mtp_loss = xcalloc(m->mtp_depth + 1, sizeof *m->mtp_loss);
    m->mtp_host = xmalloc(sizeof(int32_t) * 2 * m->N);
    bind_layers(m, m->weights, m->layers, m->mtp, &m->embed, &m->norm_w, &m->lm_head);
    if (with_grads) bind_layers(m, m->grads, m->dlayers, m->dmtp, &m->dembed, &m->dnorm_w, &m->dlm_head);
    m->slots = xcalloc(nslots, sizeof *m->slots);
    for (int i = 0; i < nslots; i++) {
        m->slots[i].acts = xcalloc(m->NL, sizeof(struct layer_acts));
        m->slots[i].mtp = xcalloc(m->mtp_depth + 1, sizeof(struct mtp_acts));
        m->slots[i].chunk = slot_chunk ? slot_chunk[i] : -1;
    }
    struct carver c = {.act = be->act_bytes};
    layout_arena(m, &c);
    m->arena_bytes = c.used;
    m->arena = be->alloc(c.used);
    c = (struct carver){(char *)m->arena, 0, be->act_bytes};
    layout_arena(m, &c);
    if (m->recompute == RECOMPUTE_FULL && m->n_moe_layers) alloc_plan(m, &m->shared_acts.plan);
    for (int i = 0; i < nslots && m->recompute != RECOMPUTE_FULL; i++)
        for (int l = 0; l < m->NL; l++)
            if (m->layers[l].moe && slot_holds(m, &m->slots[i], l)) alloc_plan(m, &m->slots[i].acts[l].plan);
    if (m->E) {
        m->moe_load = xcalloc((size_t)m->NL * m->E, sizeof(double));
        m->moe_metrics = be->alloc(sizeof(double) * m->NL * (m->E + 3));
    }
    transformer_set_moe_sequences(m, B);
    size_t half = (size_t)T * m->Dr / 2;
    float *cs = xmalloc(sizeof(float) * half * 2);
    rope_tables(cs, cs + half, cfg, T);
    be->from_host(m->rope_cos, cs, sizeof(float) * half);
    be->from_host(m->rope_sin, cs + half, sizeof(float) * half);
    free(cs);
    if (m->mla) { /* the identity: moe_combine's rows of each token's heads */
        size_t rows = (size_t)m->N * m->Hl;
        int32_t *heads = xmalloc(sizeof(int32_t) * rows);
        for (size_t i = 0; i < rows; i++) heads[i] = (int32_t)i;
        be->from_host(m->mla_heads, heads, sizeof(int32_t) * rows);
        free(heads);
    }
}

void transformer_create(struct transformer *m, const struct backend *be, const struct model_config *cfg,
                  const struct model_part *part, struct comm *tp_comm, int sequence_parallel, int B, int T,
                  int nslots, const int *slot_chunk, enum recompute rc, int shard_master) {
    create(m, be, cfg, part, tp_comm, sequence_parallel, B, T, nslots, slot_chunk, rc, 1, shard_master);
}

void transformer_create_forward_only(struct transformer *m, const struct backend *be, const struct model_config *cfg,
                                     int B, int T) {
    struct model_part part;
    model_part_full(&part, cfg);
    create(m, be, cfg, &part, NULL, 0, B, T, 1, NULL, RECOMPUTE_NONE, 0, 0);
}

void transformer_free(struct transformer *m) {
    if (m->weights != m->params) m->be->free(m->weights);
    if (m->params) m->be->free(m->params);
    master_free(&m->master);
    m->be->free(m->grads);
    m->be->free(m->arena);
    for (int i = 0; i < m->nslots; i++) {
        for (int l = 0; l < m->NL; l++) {
            struct layer_acts *a = &m->slots[i].acts[l];
            free(a->plan.send_counts), free(a->plan.host_off);
            if (a->rows_mem) m->be->free(a->rows_mem);
        }
        free(m->slots[i].acts);
        free(m->slots[i].mtp);
    }
    free(m->shared_acts.plan.send_counts), free(m->shared_acts.plan.host_off);
    if (m->shared_acts.rows_mem) m->be->free(m->shared_acts.rows_mem);
    if (m->moe_scratch_mem) m->be->free(m->moe_scratch_mem);
    moe_lane_free(m);
    free(m->slots);
    for (int l = 0; l < m->NL; l++) free(m->layers[l].experts), free(m->dlayers[l].experts);
    free(m->layers);
    free(m->dlayers);
    free(m->moe_load);
    if (m->moe_metrics) m->be->free(m->moe_metrics);
    free(m->mtp), free(m->dmtp), free(m->mtp_loss), free(m->mtp_host);
    moe_host_free(m);
    cp_attention_free(m);
    wgrad_free(m);
    if (m->fp8_hist) fp8_history_free(m->fp8_hist), free(m->fp8_hist);
    param_table_free(&m->table);
}

void transformer_set_cp(struct transformer *m, int cp, int cp_rank, struct comm *comm, int seq_len) {
    CHECK(seq_len == m->T * cp && m->T % 2 == 0);
    m->cp = cp, m->cp_rank = cp_rank, m->cp_comm = comm;
    if (cp == 1) return;
    CHECK(m->be->attention_block_forward && m->be->attention_block_backward);
    /* the rotary tables of this rank's positions */
    size_t half = (size_t)m->Dr / 2, n = (size_t)seq_len * half;
    float *all = xmalloc(sizeof(float) * n * 2), *mine = xmalloc(sizeof(float) * (size_t)m->T * half * 2);
    rope_tables(all, all + n, &m->cfg, seq_len);
    for (int t = 0; t < m->T; t++) {
        int p = cp_position(cp_rank, cp, m->T / 2, t);
        memcpy(mine + t * half, all + p * half, sizeof(float) * half);
        memcpy(mine + ((size_t)m->T + t) * half, all + n + p * half, sizeof(float) * half);
    }
    m->be->from_host(m->rope_cos, mine, sizeof(float) * m->T * half);
    m->be->from_host(m->rope_sin, mine + (size_t)m->T * half, sizeof(float) * m->T * half);
    free(all);
    free(mine);
}

void transformer_set_moe_sequences(struct transformer *m, int sequences) {
    m->sequences = sequences;
    int layers = model_moe_layer_count_all(&m->cfg);
    if (!layers) return;
    /* the balance loss: Switch form (softmax routing) or DeepSeek-V3's sequence-wise one (sigmoid) */
    double balance = m->sigmoid ? m->cfg.moe_seq_aux_loss_coef : m->cfg.moe_aux_loss_coef;
    m->moe_aux_scale = (float)(balance / ((double)sequences * layers));
    m->moe_z_scale = (float)(m->cfg.moe_z_loss_coef / ((double)sequences * layers));
}

void transformer_reset_moe_stats(struct transformer *m) {
    if (m->moe_load) memset(m->moe_load, 0, sizeof(double) * m->NL * m->E);
    if (m->moe_metrics) m->be->zero(m->moe_metrics, sizeof(double) * m->NL * (m->E + 3));
    m->moe_aux_sum = m->moe_z_sum = m->moe_dropped = 0;
    if (m->mtp_loss) memset(m->mtp_loss, 0, sizeof(double) * m->mtp_depth);
}

void transformer_fetch_moe_stats(struct transformer *m) {
    if (!m->moe_metrics) return;
    size_t per = (size_t)m->E + 3, n = per * m->NL;
    double *v = xmalloc(sizeof(double) * n);
    m->be->to_host(v, m->moe_metrics, sizeof(double) * n);
    m->moe_aux_sum = m->moe_z_sum = m->moe_dropped = 0;
    /* under context parallelism each rank counted its sequences' whole selections (summed over cp) and its
     * balance and z terms over its T = seq_len / cp tokens normalised by T (model/moe.c route_decisions):
     * what the cp ranks add up is cp, cp^2 and cp times the true sums */
    double cp = m->cp;
    for (int l = 0; l < m->NL; l++) {
        const double *s = v + (size_t)l * per;
        for (int e = 0; e < m->E; e++) m->moe_load[(size_t)l * m->E + e] = s[e] / cp;
        m->moe_aux_sum += s[m->E] / (cp * cp), m->moe_z_sum += s[m->E + 1] / cp, m->moe_dropped += s[m->E + 2];
    }
    free(v);
}

void transformer_init_params(struct transformer *m, uint64_t seed) {
    params_init_each(&m->table, seed, m->part.tp_rank, master_put, &m->master);
    transformer_params_changed(m);
}

void transformer_params_changed(struct transformer *m) { m->weights_fresh = 0; }

void transformer_sync_weights(struct transformer *m) {
    if (m->params && m->weights != m->params && !m->weights_fresh)
        m->be->to_storage(m->weights, m->params, m->table.total);
}

void transformer_stage(struct transformer *m, int slot, const int32_t *tokens, const int32_t *targets,
                       const int32_t *seq_targets) {
    m->be->from_host(m->slots[slot].tokens, tokens, sizeof(int32_t) * m->N);
    m->be->from_host(m->slots[slot].targets, targets, sizeof(int32_t) * m->N);
    /* MTP depth d at position p embeds token p+d (= targets[p+d-1]) and predicts token p+d+1 (= targets[p+d]),
     * positions of the whole sequence of S tokens (this rank's chunks under context parallelism) */
    int S = m->T * m->cp, c = m->T / 2;
    if (!seq_targets) {
        CHECK(m->cp == 1);
        seq_targets = targets;
    }
    for (int d = 1; d <= m->mtp_depth && slot_has_head(m, &m->slots[slot]); d++) {
        int32_t *tok = m->mtp_host, *tgt = m->mtp_host + m->N;
        for (int b = 0; b < m->B; b++)
            for (int i = 0; i < m->T; i++) {
                size_t r = (size_t)b * m->T;
                const int32_t *seq = seq_targets + (size_t)b * S;
                int p = m->cp > 1 ? cp_position(m->cp_rank, m->cp, c, i) : i;
                tok[r + i] = p + d - 1 < S ? seq[p + d - 1] : 0;
                tgt[r + i] = p + d < S ? seq[p + d] : -1;
            }
        m->be->from_host(m->slots[slot].mtp[d - 1].tokens, tok, sizeof(int32_t) * m->N);
        m->be->from_host(m->slots[slot].mtp[d - 1].targets, tgt, sizeof(int32_t) * m->N);
    }
}

float *transformer_chunk_input(struct transformer *m, int slot, int chunk) {
    return m->slots[slot].acts[m->part.layer_begin[chunk]].x;
}

/* ---- tensor-parallel plumbing: the conjugate pairs of Megatron's f and g ---- */

/* Normalised residual rows [Ns] -> the full [N] input of column-parallel linears. */
static void gather_rows(struct transformer *m, const float *shard, float *full) {
    if (m->sp) comm_all_gather(m->tp_comm, shard, full, act_floats(m, (size_t)m->Ns * m->C));
}

/* Partial sums [N] of a row-parallel linear (or of the input gradient of
 * column-parallel ones) -> reduced rows: [Ns] under sequence parallelism
 * (reduce-scatter into shard), else [N] in place (all-reduce). */
static float *reduce_rows(struct transformer *m, float *partial, float *shard) {
    size_t n = (size_t)m->N * m->C, ns = (size_t)m->Ns * m->C;
    if (m->tp == 1) return partial;
    float *out = m->sp ? shard : partial;
    /* bf16 storage: the communicator sums fp32 copies, the sum is stored like any activation */
    float *in32 = m->comm_f32 ? m->comm_f32 : partial, *out32 = m->comm_f32 ? m->comm_f32 + n : out;
    if (m->comm_f32) m->be->from_storage(in32, partial, n);
    if (m->sp) comm_reduce_scatter_sum(m->tp_comm, in32, out32, ns);
    else comm_all_reduce_sum(m->tp_comm, out32 = in32, n);
    if (m->comm_f32) m->be->to_storage(out, out32, m->sp ? ns : n);
    return out;
}

/* out[Ns] = residual + in @ W^T (a row-parallel linear added to the stream) */
static void row_parallel_residual(struct transformer *m, float *out, const float *residual, const float *in,
                                  const float *w, int K) {
    const struct backend *be = m->be;
    be->copy(out, residual, act_size(m, (size_t)m->Ns * m->C));
    if (m->tp == 1) {
        linear_forward(m, out, in, w, m->N, K, m->C, 1);
        return;
    }
    linear_forward(m, m->tmp_full, in, w, m->N, K, m->C, 0);
    be->add(out, reduce_rows(m, m->tmp_full, m->tmp_shard), (size_t)m->Ns * m->C);
}

/* the linear layers of block l run in FP8 from here on, or not */
static void fp8_block(struct transformer *m, int l) { m->fp8_now = l >= m->fp8_begin && l < m->fp8_end; }

void transformer_set_fp8(struct transformer *m, struct fp8_recipe recipe, int skip_layers, int history_length) {
    m->fp8_begin = m->fp8_end = 0;
    m->fp8 = recipe;
    if (m->be->precision != PRECISION_FP8) return;
    m->fp8_begin = skip_layers, m->fp8_end = m->L - skip_layers;
    const char *reuse = getenv("MTRAIN_FP8_REUSE");
    m->fp8_reuse = !(reuse && !strcmp(reuse, "0"));
    if (recipe.scaling == FP8_SCALING_DELAYED) {
        m->fp8_hist = xmalloc(sizeof *m->fp8_hist);
        fp8_history_create(m->fp8_hist, m->be, &m->cfg, &m->table, m->fp8_begin, m->fp8_end, history_length,
                           recipe.grad_e5m2);
    }
}

/* rmsnorm of residual rows into the full-row input of the next linears */
static void norm_for_linear(struct transformer *m, float *full_out, float *rstd, const float *x, const float *w) {
    float eps = (float)m->cfg.norm_eps;
    m->be->rmsnorm_forward(m->sp ? m->tmp_shard : full_out, rstd, x, w, m->Ns, m->C, eps);
    gather_rows(m, m->tmp_shard, full_out);
}

/* The residual-stream gradient [Ns] as full rows [N] for a row-parallel backward. */
static const float *grad_full_rows(struct transformer *m) {
    if (!m->sp) return m->d_resid;
    comm_all_gather(m->tp_comm, m->d_resid, m->d_full, act_floats(m, (size_t)m->Ns * m->C));
    return m->d_full;
}

/* ---- forward ---- */

/* out = residual + the MoE output: each TP rank routed its 1/tp of the
 * tokens, which under sequence parallelism are exactly its residual rows. */
static void moe_residual(struct transformer *m, float *out, const float *residual) {
    const struct backend *be = m->be;
    if (out != residual) be->copy(out, residual, act_size(m, (size_t)m->Ns * m->C));
    const float *moe = m->moe_out;
    if (!m->sp && m->tp > 1) {
        comm_all_gather(m->tp_comm, m->moe_out, m->tmp_full, act_floats(m, (size_t)m->moe_n * m->C));
        moe = m->tmp_full;
    }
    be->add(out, moe, (size_t)m->Ns * m->C);
}

/* Layer l's activations in slot s: its own, or under full recompute the
 * shared set with the layer's kept input. */
static struct layer_acts *acts_of(struct transformer *m, struct act_slot *s, int l) {
    if (m->recompute != RECOMPUTE_FULL) return &s->acts[l];
    m->shared_acts.x = s->acts[l].x;
    return &m->shared_acts;
}

/* out = xmid + SwiGLU(ln2) of width F on this rank (the dense FFN or the shared experts) */
static void swiglu_block_forward(struct transformer *m, struct layer_acts *a, const struct layer_weights *w, int F,
                                 float *out) {
    const struct backend *be = m->be;
    linear_same_input(m, 1);
    linear_forward(m, a->gate, a->ln2, w->wgate, m->N, m->C, F, 0);
    linear_forward(m, a->up, a->ln2, w->wup, m->N, m->C, F, 0);
    linear_same_input(m, 0);
    be->swiglu_forward(a->h, a->gate, a->up, (size_t)m->N * F);
    row_parallel_residual(m, out, a->xmid, a->h, w->wdown, F);
}

/* attention of the layer's q, k, v: on this rank's tokens, or over the context-parallel ring */
static void attention_forward(struct transformer *m, struct layer_acts *a) {
    if (m->cp > 1) cp_attention_forward(m, a->attn_out, a->att, a->q, a->k, a->v);
    else m->be->attention_forward(a->attn_out, a->att, a->q, a->k, a->v, m->B, m->T, m->Hl, m->KVl, m->D, m->Dv);
}

/* A layer's phases: an MoE layer's split at its all-to-alls (model/moe.h), else one */
static int block_phases(const struct transformer *m, int l) { return m->layers[l].moe ? moe_phases(m) : 1; }

/* Phase `phase` of layer l's forward; returns the ticket of the all-to-all it began (0: none) */
static int block_forward_phase(struct transformer *m, struct act_slot *s, int l, float *out, int phase) {
    const struct backend *be = m->be;
    fp8_block(m, l);
    const struct layer_weights *w = &m->layers[l];
    struct layer_acts *a = acts_of(m, s, l);
    int N = m->N, C = m->C, QD = m->Hl * m->D, KD = m->KVl * m->D, F = m->Fl;
    const float *moe_in = act_at(m, a->ln2, (size_t)m->moe_r0 * C);
    if (phase == 1) return moe_forward_phase(m, a, l, moe_in, m->moe_out, 1);
    if (phase == 2) {
        moe_forward_phase(m, a, l, moe_in, m->moe_out, 2);
        moe_residual(m, out, w->wgate ? out : a->xmid);
        return 0;
    }
    norm_for_linear(m, a->ln1, a->rstd1, a->x, w->ln1_w);
    if (m->mla) {
        mla_forward(m, a, l);
    } else {
        linear_same_input(m, 1);
        linear_forward(m, a->q, a->ln1, w->wq, N, C, QD, 0);
        linear_forward(m, a->k, a->ln1, w->wk, N, C, KD, 0);
        linear_forward(m, a->v, a->ln1, w->wv, N, C, KD, 0);
        linear_same_input(m, 0);
        be->rope(a->q, m->rope_cos, m->rope_sin, m->B, m->T, m->Hl, m->D, 0);
        be->rope(a->k, m->rope_cos, m->rope_sin, m->B, m->T, m->KVl, m->D, 0);
    }
    attention_forward(m, a);
    row_parallel_residual(m, a->xmid, a->x, a->attn_out, w->wo, m->Hl * m->Dv);
    norm_for_linear(m, a->ln2, a->rstd2, a->xmid, w->ln2_w);
    if (!w->moe) {
        swiglu_block_forward(m, a, w, F, out);
        return 0;
    }
    if (w->wgate) swiglu_block_forward(m, a, w, m->Fs, out); /* shared experts: out = xmid + shared */
    int ticket = moe_forward_phase(m, a, l, moe_in, m->moe_out, 0);
    if (block_phases(m, l) == 1) moe_residual(m, out, w->wgate ? out : a->xmid);
    return ticket;
}

static void block_forward(struct transformer *m, struct act_slot *s, int l, float *out) {
    for (int phase = 0; phase < block_phases(m, l); phase++)
        comm_wait_ticket(m->ep_comm, block_forward_phase(m, s, l, out, phase));
}

static void embed_forward(struct transformer *m, const int32_t *tokens, float *x) {
    const struct backend *be = m->be;
    if (m->tp == 1) {
        be->embedding_forward(x, tokens, m->embed, m->N, m->C, 0, m->V);
        return;
    }
    /* vocab-parallel: each rank fills the rows of its vocabulary slice */
    be->embedding_forward(m->tmp_full, tokens, m->embed, m->N, m->C, m->vstart, m->Vl);
    be->copy(x, reduce_rows(m, m->tmp_full, m->tmp_shard), act_size(m, (size_t)m->Ns * m->C));
}

/* The buffers of one output head: the main model's, or an MTP depth's (shared output weights, own norm). */
struct head_io {
    const float *x, *norm_w;
    float *dnorm_w, *lnf, *rstdf, *logits, *losses, *ce_max, *ce_sum, *ce_tgt;
    const int32_t *targets;
};

static struct head_io main_head(struct transformer *m, struct act_slot *s) {
    return (struct head_io){s->x_final, m->norm_w, m->dnorm_w, s->lnf, s->rstdf, s->logits, s->losses, s->ce_max,
                            s->ce_sum, s->ce_tgt, s->targets};
}

static struct head_io mtp_head(struct transformer *m, struct act_slot *s, int d) {
    struct mtp_acts *t = &s->mtp[d];
    return (struct head_io){t->out, m->mtp[d].head_norm, m->dmtp[d].head_norm, t->lnf, t->rstdf, t->logits, t->losses,
                            t->ce_max, t->ce_sum, t->ce_tgt, t->targets};
}

/* Norm, output head and cross-entropy; returns the summed token loss. */
static double head_forward(struct transformer *m, const struct head_io *h, float dscale) {
    const struct backend *be = m->be;
    int N = m->N, C = m->C, V = m->Vl;
    norm_for_linear(m, h->lnf, h->rstdf, h->x, h->norm_w);
    be->matmul_forward(h->logits, h->lnf, m->lm_head, N, C, V, 0);
    if (m->tp == 1) {
        be->cross_entropy(h->losses, h->logits, h->targets, N, V, dscale);
    } else { /* vocab-parallel: no rank ever holds the full logits */
        be->ce_row_max(h->ce_max, h->logits, N, V);
        comm_all_reduce_max(m->tp_comm, h->ce_max, N);
        be->ce_row_sumexp(h->ce_sum, h->ce_tgt, h->logits, h->targets, h->ce_max, N, V, m->vstart);
        comm_all_reduce_sum(m->tp_comm, h->ce_sum, N);
        comm_all_reduce_sum(m->tp_comm, h->ce_tgt, N);
        be->ce_finish(h->losses, h->logits, h->targets, h->ce_max, h->ce_sum, h->ce_tgt, N, V, m->vstart, dscale);
    }
    return be->sum(h->losses, N);
}

/* MTP depth d+1's loss weight: mtp_loss_weight x the mean over depths of each
 * depth's mean token loss (T-d-1 predicted tokens per sequence). */
static float mtp_dscale(struct transformer *m, int d, float dscale) {
    if (dscale == 0.0f) return 0.0f;
    return (float)(m->cfg.mtp_loss_weight / m->mtp_depth / ((double)m->sequences * (m->T * m->cp - d - 1)));
}

/* The MTP modules after the main head: depth d combines the previous depth's
 * hidden state (depth 0: the main model's last, before its final norm) with
 * the embedding of the token d+1 ahead. */
static void mtp_forward(struct transformer *m, struct act_slot *s, float dscale) {
    const struct backend *be = m->be;
    int N = m->N, C = m->C;
    const float *h_prev = s->x_final;
    for (int d = 0; d < m->mtp_depth; d++) {
        struct mtp_acts *t = &s->mtp[d];
        const struct mtp_weights *w = &m->mtp[d];
        int l = m->L + d;
        embed_forward(m, t->tokens, t->emb);
        norm_for_linear(m, t->en, t->rstde, t->emb, w->enorm);
        norm_for_linear(m, t->hn, t->rstdh, h_prev, w->hnorm);
        be->copy_cols(t->cat, 2 * C, t->en, C, N, C, 0);
        be->copy_cols(act_at(m, t->cat, C), 2 * C, t->hn, C, N, C, 0);
        /* eh_proj is replicated: every rank projects all rows and keeps its residual rows */
        be->matmul_forward(m->tmp_full, t->cat, w->eh_proj, N, 2 * C, C, 0);
        be->copy(s->acts[l].x, act_at(m, m->tmp_full, m->sp ? (size_t)m->part.tp_rank * m->Ns * C : 0),
                 act_size(m, (size_t)m->Ns * C));
        block_forward(m, s, l, t->out);
        struct head_io h = mtp_head(m, s, d);
        double loss = head_forward(m, &h, mtp_dscale(m, d, dscale));
        if (dscale != 0.0f && m->part.tp_rank == 0) m->mtp_loss[d] += loss;
        h_prev = t->out;
    }
}

/* ---- a chunk's forward or backward as steps (model/transformer.h struct chunk_pass) ---- */

void transformer_pass_begin(struct chunk_pass *p, int backward, int slot, int chunk, float *out, const float *d_out,
                            float dscale) {
    *p = (struct chunk_pass){.backward = backward, .slot = slot, .chunk = chunk, .out = out, .d_out = d_out,
                             .dscale = dscale, .phase = -1};
}

/* the forward's steps: the embedding with the first layer's first phase, one layer phase per step, the head
 * with the last */
static int forward_step(struct transformer *m, struct chunk_pass *p) {
    struct act_slot *s = &m->slots[p->slot];
    int l0 = m->part.layer_begin[p->chunk], l1 = m->part.layer_end[p->chunk];
    int head = m->part.has_head && p->chunk == m->part.nchunks - 1;
    m->moe_collect = p->dscale != 0.0f;
    if (p->phase < 0) {
        if (m->part.has_embed && p->chunk == 0) embed_forward(m, s->tokens, s->acts[l0].x);
        p->l = l0, p->phase = 0;
    }
    if (p->l < l1) {
        int l = p->l;
        if (p->phase == 0) {
            if (m->layer_params_needed) m->layer_params_needed(m->layer_params_ctx, l);
            if (m->pipe_progress) m->pipe_progress(m->pipe_progress_ctx);
        }
        p->ticket = block_forward_phase(m, s, l, l + 1 < l1 ? s->acts[l + 1].x : head ? s->x_final : p->out, p->phase);
        if (++p->phase < block_phases(m, l)) return 1;
        p->phase = 0;
        if (++p->l < l1) return 1;
    }
    if (head) {
        struct head_io h = main_head(m, s);
        p->loss = head_forward(m, &h, p->dscale);
        if (m->mtp_depth && p->dscale != 0.0f) mtp_forward(m, s, p->dscale); /* training only: evaluation reports the
                                                                               * main loss */
    }
    return 0;
}

static int backward_step(struct transformer *m, struct chunk_pass *p);

int transformer_pass_step(struct transformer *m, struct chunk_pass *p) {
    if (p->ticket) comm_wait_ticket(m->ep_comm, p->ticket), p->ticket = 0;
    return p->backward ? backward_step(m, p) : forward_step(m, p);
}

/* a pass run to its end (the ticket a step leaves is waited for by the next, the last leaves none) */
static void run_pass(struct transformer *m, struct chunk_pass *p) {
    while (transformer_pass_step(m, p)) {
    }
}

double transformer_forward_chunk(struct transformer *m, int slot, int chunk, float *out, float dscale) {
    struct chunk_pass p;
    transformer_pass_begin(&p, 0, slot, chunk, out, NULL, dscale);
    run_pass(m, &p);
    return p.loss;
}

/* ---- backward: m->d_resid holds dL/d(layer output) on entry, dL/d(layer input) on exit ---- */

/* Backward of swiglu_block_forward from the residual gradient: returns the
 * gradient of ln2's rows (reduced over TP). */
static float *swiglu_block_backward(struct transformer *m, struct layer_acts *a, const struct layer_weights *w,
                                    struct layer_weights *dw, int F) {
    const struct backend *be = m->be;
    int N = m->N, C = m->C;
    if (m->recompute == RECOMPUTE_SELECTIVE) be->swiglu_forward(a->h, a->gate, a->up, (size_t)N * F);
    linear_backward(m, m->d_h, dw->wdown, grad_full_rows(m), a->h, w->wdown, N, F, C, 0);
    be->swiglu_backward(m->d_gate, m->d_up, m->d_h, a->gate, a->up, (size_t)N * F);
    /* gate and up are read for the last time: a deferred W keeps its output gradients there */
    linear_same_input(m, 1);
    linear_dout_home(m, a->gate, (size_t)N * F);
    linear_backward(m, m->d_ln_full, dw->wgate, m->d_gate, a->ln2, w->wgate, N, C, F, 0);
    linear_dout_home(m, a->up, (size_t)N * F);
    linear_backward(m, m->d_ln_full, dw->wup, m->d_up, a->ln2, w->wup, N, C, F, 1);
    linear_same_input(m, 0);
    return reduce_rows(m, m->d_ln_full, m->d_ln);
}

/* Phase `phase` of layer l's backward; returns the ticket of the all-to-all it began (0: none). The routed
 * experts' backward comes first, so that the rest of the layer follows its last all-to-all. */
static int block_backward_phase(struct transformer *m, struct act_slot *s, int l, int phase) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    struct layer_weights *dw = &m->dlayers[l];
    struct layer_acts *a = acts_of(m, s, l);
    int N = m->N, Ns = m->Ns, C = m->C, QD = m->Hl * m->D, KD = m->KVl * m->D, OD = m->Hl * m->Dv, F = m->Fl;
    int selective = m->recompute == RECOMPUTE_SELECTIVE;
    if (m->recompute == RECOMPUTE_FULL && phase == 0) { /* run the layer again from its kept input (statistics
                                                          * already counted) */
        int collect = m->moe_collect;
        m->moe_collect = 0;
        block_forward(m, s, l, m->recompute_out);
        m->moe_collect = collect;
    }
    fp8_block(m, l);
    float *d_ln;
    if (w->moe) { /* this rank's tokens' rows of the residual gradient; the input gradient of all rows */
        int own_rows = m->sp || m->tp == 1;
        const float *d_out = own_rows ? m->d_resid : act_at(m, m->d_resid, (size_t)m->moe_r0 * C);
        int ticket = moe_backward_phase(m, a, l, d_out, m->d_moe_in, phase);
        if (phase + 1 < block_phases(m, l)) return ticket;
        float *d_shared = w->wgate ? swiglu_block_backward(m, a, w, dw, m->Fs) : NULL;
        if (d_shared && own_rows) { /* both on this rank's residual rows */
            be->add(d_shared, m->d_moe_in, (size_t)m->moe_n * C);
            d_ln = d_shared;
        } else if (d_shared) { /* d_shared is all N rows (d_ln_full): add every rank's routed part */
            comm_all_gather(m->tp_comm, m->d_moe_in, m->tmp_full, act_floats(m, (size_t)m->moe_n * C));
            be->add(d_shared, m->tmp_full, (size_t)N * C);
            d_ln = d_shared;
        } else {
            d_ln = m->d_moe_in;
            if (!own_rows) comm_all_gather(m->tp_comm, m->d_moe_in, d_ln = m->d_ln_full, act_floats(m, (size_t)m->moe_n * C));
        }
    } else {
        d_ln = swiglu_block_backward(m, a, w, dw, F);
    }
    be->rmsnorm_backward(m->d_resid, dw->ln2_w, d_ln, a->xmid, w->ln2_w, a->rstd2, Ns, C, 1);
    /* attention branch */
    if (selective) attention_forward(m, a);
    linear_dout_home(m, a->xmid, (size_t)Ns * C); /* ln2's backward read it last (fits unless rows are split) */
    linear_backward(m, m->d_attn, dw->wo, grad_full_rows(m), a->attn_out, w->wo, N, OD, C, 0);
    if (m->cp > 1)
        cp_attention_backward(m, m->d_q, m->d_k, m->d_v, m->d_attn, a->attn_out, a->att, a->q, a->k, a->v);
    else
        be->attention_backward(m->d_q, m->d_k, m->d_v, m->d_attn, a->attn_out, a->att, a->q, a->k, a->v, m->B, m->T,
                               m->Hl, m->KVl, m->D, m->Dv);
    if (m->mla) {
        mla_backward(m, a, l);
    } else {
        be->rope(m->d_q, m->rope_cos, m->rope_sin, m->B, m->T, m->Hl, m->D, 1);
        be->rope(m->d_k, m->rope_cos, m->rope_sin, m->B, m->T, m->KVl, m->D, 1);
        linear_same_input(m, 1); /* q, k and v were read for the last time by attention's backward */
        linear_dout_home(m, a->q, (size_t)N * QD);
        linear_backward(m, m->d_ln_full, dw->wq, m->d_q, a->ln1, w->wq, N, C, QD, 0);
        linear_dout_home(m, a->k, (size_t)N * KD);
        linear_backward(m, m->d_ln_full, dw->wk, m->d_k, a->ln1, w->wk, N, C, KD, 1);
        linear_dout_home(m, a->v, (size_t)N * m->KVl * m->Dv);
        linear_backward(m, m->d_ln_full, dw->wv, m->d_v, a->ln1, w->wv, N, C, KD, 1);
        linear_same_input(m, 0);
    }
    d_ln = reduce_rows(m, m->d_ln_full, m->d_ln);
    be->rmsnorm_backward(m->d_resid, dw->ln1_w, d_ln, a->x, w->ln1_w, a->rstd1, Ns, C, 1);
    return 0;
}

static void block_backward(struct transformer *m, struct act_slot *s, int l) {
    for (int phase = 0; phase < block_phases(m, l); phase++)
        comm_wait_ticket(m->ep_comm, block_backward_phase(m, s, l, phase));
}

/* d_resid = the gradient of the head's input */
static void head_backward(struct transformer *m, const struct head_io *h) {
    const struct backend *be = m->be;
    /* logits hold dL/dlogits (written by the cross-entropy) */
    linear_backward_plain(m, m->d_ln_full, m->dlm_head, h->logits, h->lnf, m->lm_head, m->N, m->C, m->Vl, 0);
    float *d_ln = reduce_rows(m, m->d_ln_full, m->d_ln);
    be->rmsnorm_backward(m->d_resid, h->dnorm_w, d_ln, h->x, h->norm_w, h->rstdf, m->Ns, m->C, 0);
}

static void embed_backward(struct transformer *m, const int32_t *tokens) {
    m->be->embedding_backward(m->dembed, tokens, grad_full_rows(m), m->N, m->C, m->vstart, m->Vl);
}

/* Backward of mtp_forward, deepest first; leaves in d_mtp_carry the gradient
 * of the main model's last hidden state through depth 1. */
static void mtp_backward(struct transformer *m, struct act_slot *s) {
    const struct backend *be = m->be;
    int Ns = m->Ns, C = m->C;
    size_t own = m->sp ? (size_t)m->part.tp_rank * Ns * C : 0; /* this rank's first residual row, in floats of C */
    for (int d = m->mtp_depth - 1; d >= 0; d--) {
        struct mtp_acts *t = &s->mtp[d];
        const struct mtp_weights *w = &m->mtp[d];
        struct mtp_weights *dw = &m->dmtp[d];
        int l = m->L + d;
        struct head_io h = mtp_head(m, s, d);
        head_backward(m, &h);
        if (d + 1 < m->mtp_depth) be->add(m->d_resid, m->d_mtp_carry, (size_t)Ns * C); /* through depth d+2's hnorm */
        block_backward(m, s, l);
        /* each rank back-propagates the projection of its own residual rows: under sequence parallelism
         * eh_proj's gradient is then partial and summed over TP like the norms' (optimizer.c) */
        linear_backward_plain(m, m->d_mtp_cat, dw->eh_proj, m->d_resid, act_at(m, t->cat, own * 2), w->eh_proj, Ns,
                              2 * C, C, 0);
        be->copy_cols(m->d_ln_full, C, m->d_mtp_cat, 2 * C, Ns, C, 0);
        be->rmsnorm_backward(m->d_mtp_rows, dw->enorm, m->d_ln_full, t->emb, w->enorm, t->rstde, Ns, C, 0);
        be->copy_cols(m->d_ln_full, C, act_at(m, m->d_mtp_cat, C), 2 * C, Ns, C, 0);
        be->rmsnorm_backward(m->d_mtp_carry, dw->hnorm, m->d_ln_full, d ? s->mtp[d - 1].out : s->x_final, w->hnorm,
                             t->rstdh, Ns, C, 0);
        be->copy(m->d_resid, m->d_mtp_rows, act_size(m, (size_t)Ns * C));
        embed_backward(m, t->tokens);
    }
}

/* the backward's steps: the head (or the incoming gradient) with the last layer's first phase, one layer phase
 * per step, the embedding with the first layer's last */
static int backward_step(struct transformer *m, struct chunk_pass *p) {
    struct act_slot *s = &m->slots[p->slot];
    int l0 = m->part.layer_begin[p->chunk], l1 = m->part.layer_end[p->chunk];
    m->w_slot = p->slot, m->w_layer = -1;
    if (p->phase < 0) {
        if (m->part.has_head && p->chunk == m->part.nchunks - 1) {
            if (m->mtp_depth) mtp_backward(m, s);
            struct head_io h = main_head(m, s);
            head_backward(m, &h);
            if (m->mtp_depth) m->be->add(m->d_resid, m->d_mtp_carry, (size_t)m->Ns * m->C);
        } else {
            m->be->copy(m->d_resid, p->d_out, act_size(m, (size_t)m->Ns * m->C));
        }
        p->l = l1 - 1, p->phase = 0;
    }
    if (p->l >= l0) {
        int l = p->l;
        m->w_layer = l;
        p->ticket = block_backward_phase(m, s, l, p->phase);
        m->w_layer = -1;
        if (++p->phase < block_phases(m, l)) return 1;
        p->phase = 0;
        if (m->last_micro_batch && m->layer_grads_done && !m->defer_w) m->layer_grads_done(m->layer_grads_ctx, l);
        if (m->pipe_progress) m->pipe_progress(m->pipe_progress_ctx);
        if (--p->l >= l0) return 1;
    }
    if (m->part.has_embed && p->chunk == 0) embed_backward(m, s->tokens);
    return 0;
}

void transformer_backward_chunk(struct transformer *m, int slot, int chunk, const float *d_out) {
    struct chunk_pass p;
    transformer_pass_begin(&p, 1, slot, chunk, NULL, d_out, 0.0f);
    run_pass(m, &p);
}

void transformer_weight_grads_chunk(struct transformer *m, int slot, int chunk) {
    (void)chunk; /* one chunk per rank under zb-h1 (the queue is the slot's) */
    wgrad_run(m, slot);
}

double transformer_step(struct transformer *m, const int32_t *tokens, const int32_t *targets, float dscale) {
    CHECK(m->part.nchunks == 1 && m->part.has_embed && m->part.has_head);
    transformer_sync_weights(m);
    transformer_stage(m, 0, tokens, targets, NULL);
    double loss = transformer_forward_chunk(m, 0, 0, NULL, dscale);
    if (dscale != 0.0f) transformer_backward_chunk(m, 0, 0, NULL);
    return loss;
}
