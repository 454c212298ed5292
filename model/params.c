#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/common.h"
#include "model/params.h"

static void add(struct param_table *t, int cap, const char *name, int64_t d0, int64_t d1, enum shard_rule shard,
                enum param_kind kind, float std, int parts, int tp_rank) {
    CHECK(t->count < cap);
    struct param_info *p = &t->items[t->count++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
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

int model_layer_is_moe(const struct model_config *m, int layer) {
    return m->num_experts > 0 && layer % m->moe_layer_freq == 0;
}

int model_moe_ffn_size(const struct model_config *m) {
    return m->moe_intermediate_size ? m->moe_intermediate_size : m->intermediate_size;
}

int model_moe_layer_count(const struct model_config *m) {
    int n = 0;
    for (int l = 0; l < m->num_layers; l++) n += model_layer_is_moe(m, l);
    return n;
}

void model_part_full(struct model_part *p, const struct model_config *m) {
    struct parallel_config one = {.tp = 1, .pp = 1, .vpp = 1, .cp = 1, .ep = 1};
    model_part_for(p, m, &one, 0, 0, 0);
}

void model_part_for(struct model_part *p, const struct model_config *m, const struct parallel_config *par,
                    int tp_rank, int pp_rank, int ep_rank) {
    int tp = par->tp, pp = par->pp, vpp = pp > 1 ? par->vpp : 1, L = m->num_layers;
    int first = pp > 1 ? par->first_stage_layers : 0, last = pp > 1 ? par->last_stage_layers : 0;
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
            int vs = c * pp + pp_rank;
            p->layer_begin[c] = vs * per_stage;
            p->layer_end[c] = (vs + 1) * per_stage;
        }
    }
    p->has_embed = pp_rank == 0;
    p->has_head = pp_rank == pp - 1;
    p->ep = par->ep > 0 ? par->ep : 1, p->ep_rank = ep_rank;
    int per = m->num_experts / p->ep;
    p->expert_begin = ep_rank * per, p->expert_end = (ep_rank + 1) * per;
}

void param_table_build(struct param_table *t, const struct model_config *m, const struct model_part *part) {
    int tp = part->tp, tp_rank = part->tp_rank;
    int L = m->num_layers, C = m->hidden_size, H = m->num_heads, KV = m->num_kv_heads;
    int D = C / H, F = m->intermediate_size, V = m->vocab_size;
    int E = m->num_experts, FM = model_moe_ffn_size(m);
    int cap = 3 + 9 * L + 3 * E * L, kv_parts = tp < KV ? tp : KV;
    /* Residual-branch output projections get std / sqrt(2 L) (GPT-2 / Megatron
     * scaled init) so the residual stream does not grow with depth. */
    float std = m->init_std, out_std = m->init_std / sqrtf(2.0f * L);
    char name[PARAM_NAME_MAX];
    memset(t, 0, sizeof *t);
    t->tp = tp, t->tp_rank = tp_rank;
    t->items = xcalloc(cap, sizeof *t->items);
    if (part->has_embed) add(t, cap, "model.embed_tokens.weight", V, C, SHARD_TP_ROWS, PARAM_MATRIX, std, tp, tp_rank);
    for (int c = 0; c < part->nchunks; c++)
    for (int l = part->layer_begin[c]; l < part->layer_end[c]; l++) {
#define LAYER_PARTS(suffix, d0, d1, shard, kind, s, parts)                     \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);              \
    add(t, cap, name, d0, d1, shard, kind, s, parts, tp_rank)
#define LAYER(suffix, d0, d1, shard, kind, s) LAYER_PARTS(suffix, d0, d1, shard, kind, s, tp)
        LAYER("input_layernorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0);
        LAYER("self_attn.q_proj.weight", H * D, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        /* kv heads are replicated over the TP ranks of a group when tp > kv heads */
        LAYER_PARTS("self_attn.k_proj.weight", KV * D, C, SHARD_TP_ROWS, PARAM_MATRIX, std, kv_parts);
        LAYER_PARTS("self_attn.v_proj.weight", KV * D, C, SHARD_TP_ROWS, PARAM_MATRIX, std, kv_parts);
        LAYER("self_attn.o_proj.weight", C, H * D, SHARD_TP_COLS, PARAM_MATRIX, out_std);
        LAYER("post_attention_layernorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0);
        if (model_layer_is_moe(m, l)) { /* the router; its experts come after every other tensor */
            LAYER("block_sparse_moe.gate.weight", E, C, SHARD_REPLICATED, PARAM_MATRIX, std);
            t->items[t->count - 1].tp_partial = tp > 1;
            continue;
        }
        LAYER("mlp.gate_proj.weight", F, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        LAYER("mlp.up_proj.weight", F, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        LAYER("mlp.down_proj.weight", C, F, SHARD_TP_COLS, PARAM_MATRIX, out_std);
#undef LAYER
#undef LAYER_PARTS
    }
    if (part->has_head) {
        add(t, cap, "model.norm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, tp, tp_rank);
        if (!m->tie_embeddings) add(t, cap, "lm_head.weight", V, C, SHARD_TP_ROWS, PARAM_MATRIX, std, tp, tp_rank);
    }
    /* routed experts (Hugging Face Mixtral names: w1 gate, w2 down, w3 up), whole tensors on the EP rank that owns them */
    for (int c = 0; c < part->nchunks; c++)
    for (int l = part->layer_begin[c]; l < part->layer_end[c]; l++) {
        if (!model_layer_is_moe(m, l)) continue;
        for (int e = part->expert_begin; e < part->expert_end; e++) {
            static const char *const w[3] = {"w1", "w2", "w3"};
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, w[k]);
                add(t, cap, name, k == 1 ? C : FM, k == 1 ? FM : C, SHARD_REPLICATED, PARAM_MATRIX,
                    k == 1 ? out_std : std, tp, tp_rank);
                t->items[t->count - 1].expert = 1;
                t->items[t->count - 1].tp_partial = tp > 1;
            }
        }
    }
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
    for (int i = 0; i < t->count; i++) n += t->items[i].shape[0] * (t->items[i].ndim == 2 ? t->items[i].shape[1] : 1);
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
