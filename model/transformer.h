/* The decoder-only transformer of every model family: layers of GQA
 * attention followed by a dense SwiGLU or a mixture-of-experts FFN, chosen per
 * layer from the recipe (model_layer_is_moe; Llama 3 = all dense, Mixtral =
 * all MoE). This rank's part of the parameters (tensor-parallel shard,
 * pipeline chunks, its experts), gradients and activations live in big
 * buffers owned by the backend; forward and backward are explicit per-block
 * functions (llm.c style). Tensor parallelism lives inside the blocks
 * (column/row-parallel linears, vocab-parallel embedding and cross-entropy,
 * optional sequence parallelism); with tp = 1 no collective is called. */
#pragma once
#include <stdint.h>

#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/fp8_history.h"
#include "model/master.h"
#include "model/params.h"
#include "parallel/comm.h"

struct layer_weights {
    float *ln1_w, *wq, *wk, *wv, *wo, *ln2_w;
    float *wgate, *wup, *wdown;  /* the dense SwiGLU; in a MoE layer the shared experts (NULL without) */
    /* MLA (model/mla.h): wq is q_proj when q_lora_rank is 0; wkv_a holds the
     * latent rows [KR, C] then the rotary key rows [DR, C] */
    float *wq_a, *q_a_ln, *wq_b, *wkv_a, *kv_a_ln, *wkv_b;
    int moe;                     /* the FFN is a mixture of experts (model/moe.h) */
    float *router;               /* [E, C] */
    float *bias;                 /* [E] expert bias of sigmoid routing (PARAM_STATE), NULL without */
    float **experts;             /* [3 * El]: w1 [Fm, C], w2 [C, Fm], w3 [Fm, C] of each local expert */
};

/* Host-side dispatch plan of one MoE layer for one micro batch (the
 * decisions themselves live on the device, model/moe.c). */
struct moe_plan {
    int nsend, nrecv;            /* ep > 1 or etp > 1: rows sent to / received from the EP group */
    int *send_counts, *recv_counts; /* [ep] floats per peer (ep > 1 or etp > 1) */
    int *etp_rows, *etp_displ;   /* [etp] rows each etp peer received, and where they start in the gathered rows */
    int rows;                    /* rows of the expert-major buffers in use (ep 1: a bound on them) */
    int32_t *host_off;           /* [El+1] the experts' first rows, when host_off_valid (model/moe.c) */
    int host_off_valid;
    float z_scale;               /* z-loss gradient coefficient of this micro batch */
};

/* Saved forward activations of one layer. Residual-stream tensors (x, xmid,
 * rstd) have Ns rows (N/tp under sequence parallelism, else N = B*T); the
 * normalised inputs of the linears (ln1, ln2) are gathered to N rows. */
struct layer_acts {
    float *x;            /* layer input (residual stream) [Ns, C] */
    float *ln1, *rstd1;  /* [N, C], [Ns] */
    float *q, *k, *v;    /* [N, Hl*D], [N, KVl*D], [N, KVl*Dv] after RoPE */
    float *qa, *qan, *rstdq;   /* MLA query latent [N, QR] before/after its norm, [N] */
    float *ckv, *kvn, *rstdkv; /* MLA key/value latent [N, KR] before/after its norm, [N] */
    float *att;          /* [B, Hl, T, T] probabilities */
    float *attn_out;     /* [N, Hl*Dv] */
    float *xmid;         /* residual after attention [Ns, C] */
    float *ln2, *rstd2;  /* [N, C], [Ns] */
    float *gate, *up, *h;/* [N, Fl] (MoE layers: the shared experts, [N, Fs]) */
    /* MoE layers: n = N/tp routed tokens, R = rows the local experts may receive */
    float *logits, *probs, *lse, *topw;   /* [n,E], [n,E], [n], [n,k] */
    int32_t *topi, *pos, *send_rows;      /* [n,k] experts, [n,k] row in the send order (-1 dropped), [n*k] token */
    int32_t *recv_order, *recv_inverse;   /* [R] expert-major row <-> received (source-major) row */
    float *xe, *eg, *eu, *eh;             /* [R,C], [R,Fm] x3: the local experts' rows, expert-major */
    float *y;                             /* [n*k, C] the experts' outputs back at the source, send order */
    float *aux_coef;                      /* [B,E] load-balancing gradient coefficients per sequence */
    int32_t *expert_off;                  /* [El+1] each local expert's first expert-major row */
    int rows_cap;                         /* rows the R-sized buffers above hold (moe_R0, or grown) */
    void *rows_mem;                       /* their own allocation once grown past the arena's (model/moe.c) */
    struct moe_plan plan;
};

/* Multi-token prediction module d (1-based depth): its block is layer L+d-1
 * (layer_weights/layer_acts); these are its own norms and projection. */
struct mtp_weights {
    float *enorm, *hnorm, *eh_proj, *head_norm; /* [C], [C], [C, 2C] (embedding | hidden columns), [C] */
};

/* What depth d keeps for backward: the next-token embedding and both norms
 * (full rows [N] like every linear's input), their concatenation, the
 * block's output and its head. Tokens/targets are shifted by d. */
struct mtp_acts {
    float *emb, *rstde, *en;      /* [Ns, C], [Ns], [N, C] */
    float *rstdh, *hn;            /* [Ns], [N, C] */
    float *cat;                   /* [N, 2C] */
    float *out, *lnf, *rstdf;     /* block output [Ns, C], its head norm [N, C], [Ns] */
    float *logits, *losses, *ce_max, *ce_sum, *ce_tgt; /* [N, Vl], [N] x4 */
    int32_t *tokens, *targets;    /* [N]: token t+d (embedded), t+d+1 (predicted; -1 past the sequence) */
};

/* train.recompute */
enum recompute { RECOMPUTE_NONE = 0, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL };
enum recompute recompute_mode(const char *name);

/* Activations of one micro batch in flight (pipeline schedules keep several). */
struct act_slot {
    char *mem_begin, *mem_end;    /* its part of the arena: what stays until the slot is released */
    struct layer_acts *acts;      /* indexed by global layer; only local layers are set */
    float *x_final, *lnf, *rstdf; /* head: [Ns, C], [N, C], [Ns] */
    float *logits, *losses;       /* [N, Vl], [N] */
    float *ce_max, *ce_sum, *ce_tgt; /* vocab-parallel cross-entropy stats [N] */
    int32_t *tokens, *targets;    /* [N] */
    struct mtp_acts *mtp;         /* [mtp_depth] */
    int chunk;                    /* the one local chunk whose activations it holds (the V schedules' pools:
                                   * a micro batch takes a slot per chunk); -1: every local chunk */
};

struct transformer {
    const struct backend *be;
    struct comm *tp_comm;        /* tensor-parallel group (size 1: none) */
    struct model_config cfg;
    struct model_part part;
    int B, T, N, Ns;             /* micro batch shape; Ns rows of the residual stream */
    int C, H, KV, D, F, V, L;    /* global sizes */
    int NL;                      /* layer slots: L main layers + the MTP modules' blocks */
    int mtp_depth;               /* MTP modules on this rank (the head's stage), 0: none */
    int sequences;               /* sequences per optimizer step (the MTP losses are means over them) */
    double *mtp_loss;            /* [mtp_depth] summed token losses of each depth this step (TP rank 0) */
    struct mtp_weights *mtp, *dmtp; /* [mtp_depth] params, grads */
    int Dv, Dr;                  /* value head size, rotary size (GQA: both D) */
    int mla, QR, KR, DN;         /* MLA (model/mla.h): q and kv latent ranks, the nope part of D */
    float q_scale;               /* queries x this before attention: YaRN's softmax-scale correction (1 = none) */
    int tp, sp, Hl, KVl, Fl, Vl, vstart; /* tensor-parallel local sizes */
    /* context parallelism (model/cp_attention.h): this rank holds chunks cp_rank and 2cp-1-cp_rank of every
     * sequence, T of them; attention runs as a ring over cp_comm (cp 1: none) */
    int cp, cp_rank;
    struct comm *cp_comm;
    void *cp_scratch;
    /* mixture of experts: E experts, top K, expert FFN FM (this rank's slice of etp); El local of ep;
     * each TP rank routes tokens [moe_r0, moe_r0 + moe_n) of the micro batch */
    int E, K, FM, El, ep, etp, moe_n, moe_r0, moe_R, n_moe_layers;
    int moe_R0;                  /* rows of the expert buffers at first: moe_R at ep 1, else moe_initial_rows
                                  * (both x etp: the etp peers' rows are gathered) */
    int Fs;                      /* shared experts' SwiGLU width on this TP rank (0: none) */
    int sigmoid;                 /* DeepSeek-V3 sigmoid routing (kernels/ops.h moe_route_sigmoid_*) */
    struct comm *ep_comm;        /* expert-parallel group (NULL or size 1: none) */
    struct comm *etp_comm;       /* expert-tensor-parallel group (etp 1: none) */
    float moe_aux_scale, moe_z_scale; /* loss coefficients / (sequences per step * MoE layers) */
    int moe_collect;             /* forward of a training step: accumulate the statistics below */
    double *moe_metrics;         /* backend memory [L][E+3]: this step's statistics (kernels/ops.h moe_route_balance) */
    double *moe_load;            /* [L][E] tokens routed per expert (before drops), this step ... */
    double moe_aux_sum, moe_z_sum, moe_dropped; /* summed over sequences and MoE layers: this rank's share,
                                  * filled from moe_metrics by transformer_fetch_moe_stats */
    struct param_table table;
    float *params, *grads;       /* one buffer each, table offsets: fp32 master weights and gradients;
                                  * params is NULL when the master is sharded (ZeRO-1 with a working copy) */
    struct master master;        /* where the fp32 master lives (model/master.h): params, or shards and gains */
    float *weights;              /* what the ops read (layers, embed, ...): params itself at fp32; at bf16 a
                                  * working copy in the backend's storage precision (transformer_sync_weights) */
    int weights_fresh;           /* the working copy is the parameters' (AdamW wrote it); anything else that
                                  * writes params clears it (transformer_params_changed) */
    struct layer_weights *layers;  /* by global layer: pointers into params (local layers only) */
    struct layer_weights *dlayers; /* ... into grads */
    float *embed, *norm_w, *lm_head, *dembed, *dnorm_w, *dlm_head; /* NULL where not local */
    float *rope_cos, *rope_sin;  /* [T, D/2] */
    int nslots, n_local_layers;
    struct act_slot *slots;
    enum recompute recompute;
    struct layer_acts shared_acts; /* what recomputation refills, shared by all layers and slots */
    float *recompute_out;        /* [Ns, C]: a re-run layer's output (full recompute; discarded) */
    /* scratch shared by all slots */
    float *d_resid;              /* [Ns, C]: gradient flowing down the residual stream */
    float *d_full, *d_ln_full;   /* [N, C] */
    float *d_ln;                 /* [Ns, C] (aliases d_ln_full without sequence parallelism) */
    float *tmp_full, *tmp_shard; /* [N, C], [Ns, C] */
    /* MoE scratch (shared by all slots and layers) */
    float *moe_out, *d_moe_in;   /* [n, C] */
    float *moe_send, *moe_ra, *moe_rb; /* [n*k, C], [R, C], [R, C] */
    float *d_eg, *d_eu, *d_eh;   /* [R, Fm] */
    int moe_scratch_rows;        /* rows the R-sized scratch holds (moe_R0, or grown) */
    int moe_grew;                /* expert buffers grew past moe_R0 (said once) */
    void *moe_scratch_mem;       /* its own allocation once grown (model/moe.c) */
    struct moe_lane *moe_lane;   /* dualpipev's second set of the exchange scratch (model/moe.h moe_lane_swap) */
    float *d_topw, *d_logits;    /* [n*k], [n*E] */
    float *moe_counts;           /* [2E] kept rows per expert: sent, received; then [etp, E] the etp peers'
                                  * received (etp > 1) */
    float *moe_f32;              /* [R, C] fp32: the etp peers' partial rows summed (etp > 1, 2-byte storage) */
    float *moe_tp_counts;        /* [tp,B,E] selections per sequence and expert of each TP rank (then this rank's) */
    void *moe_host;              /* host scratch for the plan (model/moe.c) */
    float *d_attn, *d_q, *d_k, *d_v, *d_gate, *d_up, *d_h;
    /* MLA scratch: the kv up-projection [N, Hl*(DN+Dv)] and its gradient, the
     * rotary key [N, Dr] and its gradient, the rotary query part [N*Hl, Dr],
     * latent gradients [N, KR] x2, [N, QR] x2 */
    float *mla_kvb, *mla_kpe, *mla_rope, *d_kvb, *d_kpe, *d_kvn, *d_ckv, *d_qan, *d_qa;
    int32_t *mla_heads;          /* [N * Hl]: row t*Hl + h of [N*Hl, Dr] (head h of token t) for the sum over heads */
    float *d_mtp_carry, *d_mtp_rows; /* [Ns, C]: gradient into the previous depth's hidden state; scratch */
    float *d_mtp_cat;            /* [N, 2C] */
    int32_t *mtp_host;           /* [2 N] host scratch for the shifted tokens */
    float *comm_f32;             /* [N + Ns, C] fp32: where the TP communicator sums activations stored in bf16 */
    float *arena;
    size_t arena_bytes;
    /* called after each layer's backward when last_micro_batch is set, so
     * its gradient buckets can be reduced while backward goes on */
    void (*layer_grads_done)(void *ctx, int layer);
    void *layer_grads_ctx;
    /* called before each main layer's forward: its parameters must be in
     * place by then (ZeRO-1's overlapped gather waits for them here) */
    void (*layer_params_needed)(void *ctx, int layer);
    void *layer_params_ctx;
    int last_micro_batch;
    /* zb-h1's split backward (model/linear.h): with defer_w set, backward
     * computes input gradients only and records each weight-gradient GEMM
     * (of layer w_layer; -1: outside the main layers) in the slot's queue,
     * wgrad; transformer_weight_grads_chunk runs them. w_home: where the next
     * deferred output gradient may be kept instead of a copy (linear_dout_home) */
    int defer_w, w_layer, w_slot;
    void *wgrad;
    float *w_home;
    size_t w_home_cap;
    /* called between a W's GEMMs and between the layers of a forward or backward: MPI moves the pipeline's
     * started sends (zb-h1's before a W, zbv's always) only inside MPI calls (NULL: not needed) */
    void (*pipe_progress)(void *ctx);
    void *pipe_progress_ctx;
    /* fp8 tables: the main layers [fp8_begin, fp8_end) run their linear
     * layers' GEMMs in FP8 (transformer_set_fp8); fp8_now: the block being
     * run is one of them */
    int fp8_begin, fp8_end, fp8_now;
    /* the group of linears reading one input being run (0: none), and the
     * groups numbered so far: the FP8 GEMMs reuse the input's codes within
     * a group (fp8_recipe.input_group; MTRAIN_FP8_REUSE=0 turns it off) */
    unsigned fp8_input_group;
    int fp8_reuse;
    struct fp8_recipe fp8;
    struct fp8_history *fp8_hist; /* delayed scaling's amax history (model/fp8_history.h), else NULL */
};

/* Activation storage holds elements of be->act_bytes bytes (kernels/ops.h,
 * Precision): element n of buffer p, and n elements as a byte size or as the
 * float count the communicator moves (act_bytes * n a multiple of 4: the
 * recipe's hidden size is even at bf16). */
static inline float *act_at(const struct transformer *m, const float *p, size_t n) {
    return (float *)((const char *)p + n * m->be->act_bytes);
}
static inline size_t act_size(const struct transformer *m, size_t n) { return n * m->be->act_bytes; }
static inline size_t act_floats(const struct transformer *m, size_t n) { return n * m->be->act_bytes / sizeof(float); }

/* Allocate this rank's part for micro batches of B x T with nslots
 * activation slots, slot i holding the activations of local chunk
 * slot_chunk[i] only (NULL: every slot every chunk). tp_comm may be NULL for a single rank. Parameters are
 * zero until transformer_init_params or a load. shard_master (not at fp32):
 * no whole fp32 master; the optimizer names the shards (master_add_shard)
 * before anything initialises or loads the parameters. */
void transformer_create(struct transformer *m, const struct backend *be, const struct model_config *cfg,
                  const struct model_part *part, struct comm *tp_comm, int sequence_parallel, int B, int T,
                  int nslots, const int *slot_chunk, enum recompute rc, int shard_master);
/* The whole model on one rank for forward passes only (generate, eval): no
 * gradient buffer (half the parameter memory); backward must not be called. */
void transformer_create_forward_only(struct transformer *m, const struct backend *be, const struct model_config *cfg,
                                     int B, int T);
void transformer_free(struct transformer *m);
/* Context parallelism: m (created with the local T = seq_len / cp) holds
 * chunks cp_rank and 2cp-1-cp_rank of each sequence of seq_len tokens; its
 * attention runs over the ring comm (model/cp_attention.h). */
void transformer_set_cp(struct transformer *m, int cp, int cp_rank, struct comm *comm, int seq_len);
void transformer_init_params(struct transformer *m, uint64_t seed);
/* Refresh the working copy of the weights from the fp32 master (nothing at
 * fp32, when the optimizer's AdamW wrote it: weights_fresh, or when the
 * master is sharded: then every writer writes the working copy too). The
 * trainer calls it before every forward pass; a writer of the master other
 * than AdamW's fused update (init, loads, a rewind's restore) calls
 * transformer_params_changed. */
void transformer_sync_weights(struct transformer *m);
void transformer_params_changed(struct transformer *m);
/* Under an fp8 table, the main layers but skip_layers at each end multiply
 * their linear layers in FP8 with this recipe (nothing otherwise; the
 * embedding, head, routers and MTP modules always stay in the table's bf16);
 * delayed scaling keeps history_length steps of amaxes (m->fp8_hist). */
void transformer_set_fp8(struct transformer *m, struct fp8_recipe recipe, int skip_layers, int history_length);
/* Weights of the MoE auxiliary losses' gradients when a step has `sequences`
 * sequences (the losses are means over sequences and MoE layers). */
void transformer_set_moe_sequences(struct transformer *m, int sequences);
/* Aux-loss-free balancing after an optimizer step: each local MoE layer's
 * expert bias moves by bias_update_rate * sign(mean load - load_e), load
 * [MoE layers][E] being the step's tokens per expert over all ranks. */
void transformer_update_expert_bias(struct transformer *m, const double *load);
/* Zero the per-step MoE statistics. */
void transformer_reset_moe_stats(struct transformer *m);
/* Bring this step's MoE statistics to the host (moe_load, moe_aux_sum,
 * moe_z_sum, moe_dropped): one copy a step, after the last micro batch. */
void transformer_fetch_moe_stats(struct transformer *m);
/* Bytes of the activation arena transformer_create would allocate for this part
 * (for the memory estimate). */
size_t transformer_arena_bytes(const struct backend *be, const struct model_config *cfg, const struct model_part *part,
                         int sequence_parallel, int B, int T, int nslots, const int *slot_chunk, enum recompute rc);

/* Copy a micro batch (host, B*T each) into a slot. seq_targets: the whole
 * sequences' targets [B, T*cp] under context parallelism (the MTP modules'
 * shifted tokens cross chunk boundaries), NULL when the local tokens are
 * the whole sequences (targets). */
void transformer_stage(struct transformer *m, int slot, const int32_t *tokens, const int32_t *targets,
                       const int32_t *seq_targets);
/* Where a chunk without the embedding expects its input activation [Ns, C]. */
float *transformer_chunk_input(struct transformer *m, int slot, int chunk);
/* Forward one pipeline chunk. A chunk with the head returns the summed token
 * loss (and, if dscale != 0, leaves dscale * dloss/dlogits for backward);
 * other chunks write their output activation [Ns, C] to out and return 0. */
double transformer_forward_chunk(struct transformer *m, int slot, int chunk, float *out, float dscale);
/* Backward one chunk; d_out [Ns, C] is the gradient of its output (ignored
 * by the chunk with the head). Parameter gradients accumulate into grads;
 * the gradient of the chunk's input is left in m->d_resid. */
void transformer_backward_chunk(struct transformer *m, int slot, int chunk, const float *d_out);
/* A chunk's forward or backward as steps, split where an MoE layer begins an
 * all-to-all (model/moe.h moe_phases; one step per layer otherwise):
 * transformer_pass_step runs the next (first completing the all-to-all the
 * step before began) and returns 0 after the last. transformer_forward_chunk
 * and transformer_backward_chunk run every step in turn; dualpipev's pairs
 * interleave two passes' steps (model/pair.c). */
struct chunk_pass {
    int backward, slot, chunk;
    float *out;             /* forward: the output (NULL: the chunk with the head) */
    const float *d_out;     /* backward: the output's gradient */
    float dscale;
    int l, phase;           /* the next step: layer and phase (phase -1: the first step) */
    int ticket;             /* the all-to-all the last step began on m->ep_comm (0: none) */
    double loss;            /* forward with the head: the summed token loss, after the last step */
};
void transformer_pass_begin(struct chunk_pass *p, int backward, int slot, int chunk, float *out, const float *d_out,
                            float dscale);
int transformer_pass_step(struct transformer *m, struct chunk_pass *p);
/* dualpipev's pair: the forward of chunk fchunk of slot fslot (as
 * transformer_forward_chunk, returning its loss) and the backward of chunk
 * bchunk of slot bslot (as transformer_backward_chunk) as one unit, their
 * layers interleaved so that one pass's expert all-to-alls run while the
 * other computes (model/pair.c). The same numbers as running them in turn. */
double transformer_pair_chunks(struct transformer *m, int fslot, int fchunk, float *fout, float dscale, int bslot,
                               int bchunk, const float *d_out);
/* Whether the pairs interleave (MoE layers that exchange tokens, not under full recomputation), and the bytes
 * of the second set of exchange scratch they take then (the memory estimate; 0 otherwise) */
int transformer_pairs_overlap(const struct transformer *m);
size_t transformer_pair_bytes(const struct backend *be, const struct model_config *cfg, const struct model_part *part,
                              int sequence_parallel, int B, int T, enum recompute rc);
/* The bytes zb-h1's deferred weight gradients copy per micro batch (model/linear.c: the output gradients,
 * and the inputs recomputation overwrites), for the memory estimate. */
size_t transformer_wgrad_bytes(const struct backend *be, const struct model_config *cfg, const struct model_part *part,
                               int sequence_parallel, int B, int T, enum recompute rc);
/* With m->defer_w: the weight gradients the chunk's backward deferred (zb-h1's W), accumulated into grads
 * in the order backward met them; layer_grads_done is called here instead (last micro batch). */
void transformer_weight_grads_chunk(struct transformer *m, int slot, int chunk);

/* Whole model on one rank, slot 0: forward (and backward if dscale != 0).
 * Returns the summed token loss. */
double transformer_step(struct transformer *m, const int32_t *tokens, const int32_t *targets, float dscale);

/* Fill [T, Dr/2] cos/sin tables (Dr = model_rope_dim), with Llama 3.1 or
 * YaRN frequency scaling when cfg->rope_scaling_factor > 0 (host memory). */
void rope_tables(float *cos_out, float *sin_out, const struct model_config *cfg, int T);
/* YaRN's softmax-scale correction: (0.1 mscale_all_dim ln(factor) + 1)^2, 1 without YaRN. */
float rope_softmax_scale(const struct model_config *cfg);
/* The positions the model takes, one number for the HF export's
 * max_position_embeddings and for eval/generate's limit: YaRN's extended
 * context (factor x original_max_pos, as DeepSeek-V3's config states), else
 * model.max_seq_len, else the training seq_len. */
int model_max_positions(const struct model_config *cfg, int seq_len);
