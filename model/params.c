#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/common.h"
#include "model/params.h"

static void add(struct param_table *t, int cap, const char *name, int64_t d0, int64_t d1, enum shard_rule shard,
                enum param_kind kind, float std, int tp, int tp_rank) {
    CHECK(t->count < cap);
    struct param_info *p = &t->items[t->count++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0, p->shape[1] = d1;
    p->local_shape[0] = d0, p->local_shape[1] = d1;
    if (shard == SHARD_TP_ROWS) p->local_shape[0] = d0 / tp;
    if (shard == SHARD_TP_COLS) p->local_shape[1] = d1 / tp;
    p->shard = shard;
    p->kind = kind;
    p->init_std = std;
    p->numel = p->local_shape[0] * (d1 ? p->local_shape[1] : 1);
    /* keep every tensor 16-float aligned (64 bytes) for vector loads */
    p->offset = t->total;
    t->total += (p->numel + 15) / 16 * 16;
    (void)tp_rank;
}

void param_table_build(struct param_table *t, const struct model_config *m, int tp, int tp_rank) {
    int L = m->num_layers, C = m->hidden_size, H = m->num_heads, KV = m->num_kv_heads;
    int D = C / H, F = m->intermediate_size, V = m->vocab_size;
    int cap = 3 + 9 * L;
    /* Residual-branch output projections get std / sqrt(2 L) (GPT-2 / Megatron
     * scaled init) so the residual stream does not grow with depth. */
    float std = m->init_std, out_std = m->init_std / sqrtf(2.0f * L);
    char name[PARAM_NAME_MAX];
    memset(t, 0, sizeof *t);
    t->items = xcalloc(cap, sizeof *t->items);
    add(t, cap, "model.embed_tokens.weight", V, C, SHARD_TP_ROWS, PARAM_MATRIX, std, tp, tp_rank);
    for (int l = 0; l < L; l++) {
#define LAYER(suffix, d0, d1, shard, kind, s)                                  \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);              \
    add(t, cap, name, d0, d1, shard, kind, s, tp, tp_rank)
        LAYER("input_layernorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0);
        LAYER("self_attn.q_proj.weight", H * D, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        LAYER("self_attn.k_proj.weight", KV * D, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        LAYER("self_attn.v_proj.weight", KV * D, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        LAYER("self_attn.o_proj.weight", C, H * D, SHARD_TP_COLS, PARAM_MATRIX, out_std);
        LAYER("post_attention_layernorm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0);
        LAYER("mlp.gate_proj.weight", F, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        LAYER("mlp.up_proj.weight", F, C, SHARD_TP_ROWS, PARAM_MATRIX, std);
        LAYER("mlp.down_proj.weight", C, F, SHARD_TP_COLS, PARAM_MATRIX, out_std);
#undef LAYER
    }
    add(t, cap, "model.norm.weight", C, 0, SHARD_REPLICATED, PARAM_NORM, 0, tp, tp_rank);
    if (!m->tie_embeddings) add(t, cap, "lm_head.weight", V, C, SHARD_TP_ROWS, PARAM_MATRIX, std, tp, tp_rank);
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
