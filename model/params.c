#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/common.h"
#include "model/params.h"
#include "parallel/schedule.h"

static void add(struct param_table *t, int cap, const char *name, int64_t d0, int64_t d1, enum shard_rule shard,
                enum param_kind kind, float std, int parts, int tp_rank) {
    CHECK(t->count < cap);
    struct param_info *p = &t->items[t->count++];
    memset(p, 0, sizeof *p);
    size_t len = strlen(name);
    CHECK(len < sizeof p->name);
    memcpy(p->name, name, len + 1);
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0, p->shape[1] = d1;
    p->local_shape[0] = d0, p->local_shape[1] = d1;
    if (shard == SHARD_REPLICATED) parts = 1;
    if (shard == SHARD_TP_ROWS) p->local_shape[0] = d0 / parts;
    if (shard == SHARD_TP_COLS) p->local_shape[1] = d1 / parts;
    p->shard = shard;
    p->parts = parts;
    p->part = tp_rank * parts / t->tp; /* consecutive TP ranks share a block */
    p->kind = kind;
    p->init_std = std;
    p->numel = p->local_shape[0] * (d1 ? p->local_shape[1] : 1);
    /* keep every tensor 16-float aligned (64 bytes) for vector loads */
    p->offset = t->total;
    t->total += (p->numel + 15) / 16 * 16;
}

int model_is_mla(const struct model_config *m) { return !strcmp(m->arch, "deepseek_v3"); }

int model_layer_is_moe(const struct model_config *m, int layer) {
    return m->num_experts > 0 && layer >= m->first_k_dense && layer % m->moe_layer_freq == 0;
}

int model_moe_ffn_size(const struct model_config *m) {
    return m->moe_intermediate_size ? m->moe_intermediate_size : m->intermediate_size;
}

int model_moe_layer_count(const struct model_config *m) {
    int n = 0;
    for (int l = 0; l < m->num_layers; l++) n += model_layer_is_moe(m, l);
    return n;
}

int model_moe_layer_count_all(const struct model_config *m) {
    int n = 0;
    for (int l = 0; l < m->num_layers + model_mtp_depth(m); l++) n += model_layer_is_moe(m, l);
    return n;
}

int model_mtp_depth(const struct model_config *m) { return model_is_mla(m) ? m->mtp_depth : 0; }

int model_head_uses_embed(const struct model_config *m) { return m->tie_embeddings || model_mtp_depth(m) > 0; }

int model_head_dim(const struct model_config *m) {
    return model_is_mla(m) ? m->qk_nope_head_dim + m->qk_rope_head_dim : m->hidden_size / m->num_heads;
}

int model_v_head_dim(const struct model_config *m) {
    return model_is_mla(m) ? m->v_head_dim : m->hidden_size / m->num_heads;
}

int model_rope_dim(const struct model_config *m) {
    return model_is_mla(m) ? m->qk_rope_head_dim : m->hidden_size / m->num_heads;
}

void model_part_full(struct model_part *p, const struct model_config *m) {
    struct parallel_config one = {.tp = 1, .pp = 1, .vpp = 1, .cp = 1, .ep = 1};
    model_part_for(p, m, &one, 0, 0, 0, 0);
}

void model_part_for(struct model_part *p, const struct model_config *m, const struct parallel_config *par,
                    int tp_rank, int pp_rank, int ep_rank, int etp_rank) {
    int tp = par->tp, pp = par->pp, vpp = pp > 1 ? par->vpp : 1, L = m->num_layers;
    int first = pp > 1 ? par->first_stage_layers : 0, last = pp > 1 ? par->last_stage_layers : 0;
    enum sched_kind kind = pp > 1 ? schedule_kind(par->schedule, vpp) : SCHED_1F1B;
    memset(p, 0, sizeof *p);
    p->tp = tp, p->tp_rank = tp_rank, p->pp = pp, p->pp_rank = pp_rank, p->nchunks = vpp;
    if (first || last) { /* uneven: stage 0 and/or the last stage get their own counts, the rest split evenly */
        int middle = pp - (first > 0) - (last > 0), rest = L - first - last;
        int per = middle > 0 ? rest / middle : 0, begin = 0;
        for (int s = 0; s < pp; s++) {
            int n = (s == 0 && first) ? first : (s == pp - 1 && last) ? last : per;
            if (s == pp_rank) p->layer_begin[0] = begin, p->layer_end[0] = begin + n;
            begin += n;
        }
        CHECK(begin == L);
    } else {
        CHECK(vpp <= MAX_CHUNKS && L % (pp * vpp) == 0);
        int per_stage = L / (pp * vpp);
        for (int c = 0; c < vpp; c++) {
            int vs = schedule_stage(kind, pp, c, pp_rank); /* zbv: a V */
            p->layer_begin[c] = vs * per_stage;
            p->layer_end[c] = (vs + 1) * per_stage;
        }
    }
    p->has_embed = pp_rank == 0;
    p->has_head = schedule_stage(kind, pp, vpp - 1, pp_rank) == pp * vpp - 1; /* zbv: rank 0 too */
    p->embed_copy = p->has_head && !p->has_embed && model_head_uses_embed(m);
    p->ep = par->ep > 0 ? par->ep : 1, p->ep_rank = ep_rank;
    p->etp = par->etp > 0 ? par->etp : 1, p->etp_rank = etp_rank;
    int per = m->num_experts / p->ep;
    p->expert_begin = ep_rank * per, p->expert_end = (ep_rank + 1) * per;
}

/* What every tensor-adding helper needs. */
struct builder {
    struct param_table *t;
    const struct model_config *m;
    int cap, tp, tp_rank;
    float std, out_std;
};

static struct param_info *layer_add(struct builder *b, int l, const char *suffix, int64_t d0, int64_t d1,
                                    enum shard_rule shard, enum param_kind kind, float std, int parts) {
    char name[PARAM_NAME_MAX + 32];
    CHECK(snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix) < PARAM_NAME_MAX);
    add(b->t, b->cap, name, d0, d1, shard, kind, std, parts, b->tp_rank);
    return &b->t->items[b->t->count - 1];
}

/* GQA (Llama, Mixtral): kv heads are replicated over the TP ranks of a group when tp > kv heads. */
static void add_gqa(struct builder *b, int l) {
    const struct model_config *m = b->m;
    int C = m->hidden_size, H = m->num_heads, KV = m->num_kv_heads, D = C / H, tp = b->tp;
    int kv_parts = tp < KV ? tp : KV;
    layer_add(b, l, "self_attn.q_proj.weight", H * D, C, SHARD_TP_ROWS, PARAM_MATRIX, b->std, tp);
    layer_add(b, l, "self_attn.k_proj.weight", KV * D, C, SHARD_TP_ROWS, PARAM_MATRIX, b->std, kv_parts);
    layer_add(b, l, "self_attn.v_proj.weight", KV * D, C, SHARD_TP_ROWS, PARAM_MATRIX, b->std, kv_parts);
    layer_add(b, l, "self_attn.o_proj.weight", C, H * D, SHARD_TP_COLS, PARAM_MATRIX, b->out_std, tp);
}

/* MLA (DeepSeek-V3): the down projections and their norms are replicated over
 * TP (every rank needs the whole latent) with gradients partial over TP (each
 * rank back-propagates only its heads); the up projections split by heads. */
static void add_mla(struct builder *b, int l) {
    const struct model_config *m = b->m;
    int C = m->hidden_size, H = m->num_heads, tp = b->tp, partial = tp > 1;
    int QK = model_head_dim(m), R = m->qk_rope_head_dim, DN = m->qk_nope_head_dim, DV = m->v_head_dim;
    int QR = m->q_lora_rank, KR = m->kv_lora_rank;
    if (QR) {
        layer_add(b, l, "self_attn.q_a_proj.weight", QR, C, SHARD_REPLICATED, PARAM_MATRIX, b->std, 1)->tp_partial = partial;
        layer_add(b, l, "self_attn.q_a_layernorm.weight", QR, 0, SHARD_REPLICATED, PARAM_NORM, 0, 1)->tp_partial = partial;
        layer_add(b, l, "self_attn.q_b_proj.weight", (int64_t)H * QK, QR, SHARD_TP_ROWS, PARAM_MATRIX, b->std, tp);
    } else {
        layer_add(b, l, "self_attn.q_proj.weight", (int64_t)H * QK, C, SHARD_TP_ROWS, PARAM_MATRIX, b->std, tp);
    }
    layer_add(b, l, "self_attn.kv_a_proj_with_mqa.weight", KR + R, C, SHARD_REPLICATED, PARAM_MATRIX, b->std, 1)
        ->tp_partial = partial;
    layer_add(b, l, "self_attn.kv_a_layernorm.weight", KR, 0, SHARD_REPLICATED, PARAM_NORM, 0, 1)->tp_partial = partial;
    layer_add(b, l, "self_attn.kv_b_proj.weight", (int64_t)H * (DN + DV), KR, SHARD_TP_ROWS, PARAM_MATRIX, b->std, tp);
    layer_add(b, l, "self_attn.o_proj.weight", C, (int64_t)H * DV, SHARD_TP_COLS, PARAM_MATRIX, b->out_std, tp);
}

/* Dense SwiGLU of size F under the name prefix (mlp, mlp.shared_experts). */
static void add_swiglu(struct builder *b, int l, const char *prefix, int F) {
    char suffix[64];
    int C = b->m->hidden_size, tp = b->tp;
    snprintf(suffix, sizeof suffix, "%s.gate_proj.weight", prefix);
    layer_add(b, l, suffix, F, C, SHARD_TP_ROWS, PARAM_MATRIX, b->std, tp);
    snprintf(suffix, sizeof suffix, "%s.up_proj.weight", prefix);
    layer_add(b, l, suffix, F, C, SHARD_TP_ROWS, PARAM_MATRIX, b->std, tp);
    snprintf(suffix, sizeof suffix, "%s.down_proj.weight", prefix);
    layer_add(b, l, suffix, C, F, SHARD_TP_COLS, PARAM_MATRIX, b->out_std, tp);
}

/* One block: norm, attention, norm, FFN (the routed experts come later). */
static void add_block(struct builder *b, int l) {
    const struct model_config *m = b->m;
    int C = m->hidden_size, E = m->num_experts, partial = b->tp > 1, ds = model_is_mla(m);
    layer_add(b, l, "input_layernorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, 1);
    if (ds) add_mla(b, l);
    else add_gqa(b, l);
    layer_add(b, l, "post_attention_layernorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, 1);
    if (!model_layer_is_moe(m, l)) {
        add_swiglu(b, l, "mlp", m->intermediate_size);
        return;
    }
    layer_add(b, l, ds ? "mlp.gate.weight" : "block_sparse_moe.gate.weight", E, C, SHARD_REPLICATED, PARAM_MATRIX,
              b->std, 1)->tp_partial = partial;
    if (m->moe_bias_update_rate > 0) /* not trained: moved by the load after each step, kept in checkpoints */
        layer_add(b, l, "mlp.gate.e_score_correction_bias", E, 0, SHARD_REPLICATED, PARAM_STATE, 0, 1);
    if (m->moe_shared_experts) add_swiglu(b, l, "mlp.shared_experts", m->moe_shared_experts * model_moe_ffn_size(m));
}

/* MTP module d (Hugging Face numbers it layer num_layers + d): norms of the
 * embedding and of the previous hidden state, their joint projection, a
 * block, and the norm before the shared output head. */
static void add_mtp(struct builder *b, int d) {
    int C = b->m->hidden_size, l = b->m->num_layers + d;
    layer_add(b, l, "enorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, 1);
    layer_add(b, l, "hnorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, 1);
    layer_add(b, l, "eh_proj.weight", C, 2 * C, SHARD_REPLICATED, PARAM_MATRIX, b->std, 1);
    add_block(b, l);
    layer_add(b, l, "shared_head.norm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, 1);
}

/* The routed experts of MoE layer l (Mixtral names w1 gate, w2 down, w3 up;
 * DeepSeek gate_proj, down_proj, up_proj) on the EP rank that owns them:
 * whole at etp 1, else slice etp_rank of their FFN width (gate and up by
 * rows, down by columns, as a tensor-parallel SwiGLU). */
static void add_experts(struct builder *b, const struct model_part *part, int l) {
    static const char *const mixtral[3] = {"w1", "w2", "w3"}, *const deepseek[3] = {"gate_proj", "down_proj", "up_proj"};
    const struct model_config *m = b->m;
    int C = m->hidden_size, FM = model_moe_ffn_size(m), ds = model_is_mla(m), etp = part->etp;
    char suffix[96];
    if (!model_layer_is_moe(m, l)) return;
    for (int e = part->expert_begin; e < part->expert_end; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(suffix, sizeof suffix, ds ? "mlp.experts.%d.%s.weight" : "block_sparse_moe.experts.%d.%s.weight", e,
                     ds ? deepseek[k] : mixtral[k]);
            enum shard_rule rule = etp == 1 ? SHARD_REPLICATED : k == 1 ? SHARD_TP_COLS : SHARD_TP_ROWS;
            struct param_info *p = layer_add(b, l, suffix, k == 1 ? C : FM, k == 1 ? FM : C, rule, PARAM_MATRIX,
                                             k == 1 ? b->out_std : b->std, etp);
            p->expert = 1; /* its replicas are the edp group: no TP reduction of its own */
            p->part = etp == 1 ? 0 : part->etp_rank;
        }
}

void param_table_build(struct param_table *t, const struct model_config *m, const struct model_part *part) {
    int L = m->num_layers, C = m->hidden_size, V = m->vocab_size, D = model_mtp_depth(m), tp = part->tp;
    int per_layer = 24 + 3 * (m->num_experts / part->ep);
    /* Residual-branch output projections get std / sqrt(2 L) (GPT-2 / Megatron
     * scaled init) so the residual stream does not grow with depth. */
    struct builder b = {t, m, 4 + per_layer * (L + D), tp, part->tp_rank, (float)m->init_std,
                        (float)(m->init_std / sqrt(2.0 * L))};
    memset(t, 0, sizeof *t);
    t->tp = tp, t->tp_rank = part->tp_rank;
    t->items = xcalloc(b.cap, sizeof *t->items);
    if (part->has_embed || part->embed_copy) {
        /* the copy has the owner's name, so init (seeded by name) and loads give it the same values */
        add(t, b.cap, "model.embed_tokens.weight", V, C, SHARD_TP_ROWS, PARAM_MATRIX, b.std, tp, b.tp_rank);
        t->items[t->count - 1].stage_copy = !part->has_embed;
    }
    for (int c = 0; c < part->nchunks; c++)
        for (int l = part->layer_begin[c]; l < part->layer_end[c]; l++) add_block(&b, l);
    if (part->has_head) {
        add(t, b.cap, "model.norm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, tp, b.tp_rank);
        if (!m->tie_embeddings) add(t, b.cap, "lm_head.weight", V, C, SHARD_TP_ROWS, PARAM_MATRIX, b.std, tp, b.tp_rank);
        for (int d = 0; d < D; d++) add_mtp(&b, d);
    }
    /* routed experts after every other tensor: the two regions reduce over different groups */
    for (int c = 0; c < part->nchunks; c++)
        for (int l = part->layer_begin[c]; l < part->layer_end[c]; l++) add_experts(&b, part, l);
    if (part->has_head)
        for (int d = 0; d < D; d++) add_experts(&b, part, L + d);
}

int param_table_first_expert(const struct param_table *t) {
    for (int i = 0; i < t->count; i++)
        if (t->items[i].expert) return i;
    return t->count;
}

void param_table_free(struct param_table *t) {
    free(t->items);
    memset(t, 0, sizeof *t);
}

const struct param_info *param_find(const struct param_table *t, const char *name) {
    for (int i = 0; i < t->count; i++)
        if (!strcmp(t->items[i].name, name)) return &t->items[i];
    return NULL;
}

int64_t param_table_global_count(const struct param_table *t) {
    int64_t n = 0;
    for (int i = 0; i < t->count; i++)
        if (!t->items[i].stage_copy) n += t->items[i].shape[0] * (t->items[i].ndim == 2 ? t->items[i].shape[1] : 1);
    return n;
}

size_t param_table_shared_block_floats(const struct param_table *t) {
    size_t shared = 0;
    for (int i = 0; i < t->count; i++)
        if (t->items[i].shard != SHARD_REPLICATED && t->items[i].parts < t->tp &&
            t->items[i].numel * t->items[i].parts > shared)
            shared = t->items[i].numel * t->items[i].parts;
    return shared;
}
