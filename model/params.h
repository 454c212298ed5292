/* The parameter table: every tensor of the model with its Hugging Face name,
 * global shape, shard rule and offset in this rank's one contiguous buffer.
 * It drives init, the optimizer, checkpoints and the memory estimate;
 * gradients and optimizer moments mirror it offset for offset. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config/recipe.h"

#define PARAM_NAME_MAX 96

enum shard_rule {
    SHARD_REPLICATED = 0,   /* every rank holds the whole tensor */
    SHARD_TP_ROWS,          /* split on dim 0 over tensor parallel (column-parallel linear, vocab) */
    SHARD_TP_COLS,          /* split on dim 1 over tensor parallel (row-parallel linear) */
};

enum param_kind {
    PARAM_MATRIX = 0,       /* weight-decayed, N(0, std) */
    PARAM_NORM,             /* no weight decay, ones */
    PARAM_STATE,            /* not trained (no gradient, skipped by AdamW), zeros: the MoE expert bias, moved
                             * by the expert loads after each step and kept in checkpoints */
};

struct param_info {
    char name[PARAM_NAME_MAX];
    int ndim;
    int64_t shape[2];       /* global shape */
    int64_t local_shape[2]; /* this rank's shard */
    enum shard_rule shard;
    int parts, part;        /* the split dim holds `parts` blocks; this rank has block `part`.
                             * parts = tp, except k/v projections when tp > kv heads:
                             * parts = kv heads, each block shared by tp/parts ranks */
    enum param_kind kind;
    float init_std;
    int expert;             /* a routed expert's weight: whole on the EP rank that owns the expert, its gradient
                             * reduced over the expert-data-parallel group, which holds its every replica
                             * (parallel/grid.h, model/moe.h) */
    int tp_partial;         /* replicated over TP, but each TP rank's gradient covers only its share of the
                             * tokens (MoE router, MLA's replicated projections): summed over TP before the update */
    int stage_copy;         /* a copy of a tensor that pipeline stage 0 owns (the embedding on the last stage,
                             * for tied embeddings and MTP): its gradient is summed with the owner's over the
                             * embedding group, so both update identically; not counted in the grad norm and
                             * not saved in checkpoints (loads read the owner's) */
    size_t offset;          /* in floats, into the local parameter buffer */
    size_t numel;           /* local element count */
};

struct param_table {
    struct param_info *items;
    int count;
    size_t total;           /* local floats */
    int tp, tp_rank;        /* the tensor-parallel shard this table describes */
};

/* The part of the model one rank holds: its tensor-parallel shard and its
 * pipeline chunks (vpp of them, interleaved: chunk c of pipeline rank p is
 * virtual stage c*pp + p). The embedding lives on virtual stage 0, the final
 * norm and output head on the last. */
#define MAX_CHUNKS 16
struct model_part {
    int tp, tp_rank;
    int pp, pp_rank, nchunks;
    int layer_begin[MAX_CHUNKS], layer_end[MAX_CHUNKS];
    int has_embed, has_head;    /* chunk 0 has the embedding / chunk nchunks-1 the head */
    int embed_copy;             /* the last of pp > 1 stages also holds the embedding (model_head_uses_embed) */
    int ep, ep_rank;            /* expert parallelism: this rank owns experts [expert_begin, expert_end) */
    int etp, etp_rank;          /* ... and slice etp_rank of etp of each one's FFN width (parallel/grid.h) */
    int expert_begin, expert_end;
};

/* Block kinds: every layer is an attention (GQA, or MLA for deepseek_v3)
 * followed by an FFN that is dense SwiGLU (intermediate_size) or, in a
 * mixture-of-experts model, a MoE layer (router + num_experts SwiGLU experts
 * of moe_intermediate_size, + optional shared experts) for every
 * moe_layer_freq-th layer from layer first_k_dense on. */
int model_layer_is_moe(const struct model_config *m, int layer);
/* DeepSeek-V3 (arch deepseek_v3): MLA attention instead of GQA; a dense
 * prefix of first_k_dense layers; mtp_depth MTP modules after the last layer
 * (Hugging Face numbers them layers num_layers .. num_layers + depth - 1). */
int model_is_mla(const struct model_config *m);
int model_mtp_depth(const struct model_config *m);
/* Per-head sizes: query/key (MLA: nope + rope), value, and the rotary part. */
int model_head_dim(const struct model_config *m);
int model_v_head_dim(const struct model_config *m);
int model_rope_dim(const struct model_config *m);
int model_moe_ffn_size(const struct model_config *m);
int model_moe_layer_count(const struct model_config *m);
/* MoE layers including the MTP modules' blocks (layers num_layers ..). */
int model_moe_layer_count_all(const struct model_config *m);

/* The head's stage uses the embedding too: the output head is the embedding
 * (tie_embeddings) or the MTP modules embed the next tokens (mtp_depth). */
int model_head_uses_embed(const struct model_config *m);

/* The whole model on one rank. */
void model_part_full(struct model_part *p, const struct model_config *m);
/* The part of pipeline rank pp_rank, tensor-parallel rank tp_rank,
 * expert-parallel rank ep_rank and expert-tensor-parallel rank etp_rank in
 * layout par (tp, pp, vpp, ep, etp and the optional uneven first/last stage
 * sizes). */
void model_part_for(struct model_part *p, const struct model_config *m, const struct parallel_config *par,
                    int tp_rank, int pp_rank, int ep_rank, int etp_rank);
/* Build the table of the tensors `part` holds (names and global shapes are
 * those of the whole model; local shapes are the TP shard). */
void param_table_build(struct param_table *t, const struct model_config *m, const struct model_part *part);
void param_table_free(struct param_table *t);
const struct param_info *param_find(const struct param_table *t, const char *name);
/* Global element count (all shards), counting each tensor once. */
int64_t param_table_global_count(const struct param_table *t);
/* Index of the first routed-expert tensor: experts are stored after every
 * other tensor, so [0, first) and [first, count) are contiguous regions of
 * the buffer that reduce over different groups. count when there are none. */
int param_table_first_expert(const struct param_table *t);
/* Floats of the largest tensor whose blocks several TP ranks share (kv heads
 * when tp > kv heads): the optimizer's scratch for summing them; 0 if none. */
size_t param_table_shared_block_floats(const struct param_table *t);
