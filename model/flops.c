#include <string.h>

#include "config/common.h"
#include "model/flops.h"
#include "model/master.h"
#include "model/transformer.h"
#include "parallel/schedule.h"

/* Layer number of a "model.layers.N." tensor, -1 for the others. */
static int layer_of(const char *name) {
    int l;
    return sscanf(name, "model.layers.%d.", &l) == 1 ? l : -1;
}

struct param_counts model_param_counts(const struct model_config *m) {
    struct param_table t;
    struct model_part part;
    struct param_counts c = {0};
    model_part_full(&part, m);
    param_table_build(&t, m, &part);
    int64_t experts_main = 0, experts_mtp = 0;
    for (int i = 0; i < t.count; i++) {
        const struct param_info *p = &t.items[i];
        int64_t n = p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1);
        int mtp = layer_of(p->name) >= m->num_layers;
        if (mtp) c.mtp += n;
        else c.main += n;
        if (p->expert) *(mtp ? &experts_mtp : &experts_main) += n;
        if (!strcmp(p->name, "model.embed_tokens.weight") || !strcmp(p->name, "lm_head.weight")) c.embed_head += n;
    }
    param_table_free(&t);
    /* a token visits K of the E equal routed experts of a MoE layer */
    int64_t E = m->num_experts, K = m->experts_per_token;
    c.main_active = c.main - (E ? experts_main / E * (E - K) : 0);
    c.mtp_active = c.mtp - (E ? experts_mtp / E * (E - K) : 0);
    return c;
}

int64_t model_param_count(const struct model_config *m) {
    struct param_counts c = model_param_counts(m);
    return c.main + c.mtp;
}

int64_t model_active_param_count(const struct model_config *m) {
    struct param_counts c = model_param_counts(m);
    return c.main_active + c.mtp_active;
}

void model_print_param_counts(FILE *out, const struct model_config *m) {
    struct param_counts c = model_param_counts(m);
    if (!model_mtp_depth(m)) {
        fprintf(out, "parameters:       %lld\n", (long long)c.main);
        if (m->num_experts > 0)
            fprintf(out, "active_parameters: %lld (per token: %d of %d experts in %d MoE layers)\n",
                    (long long)c.main_active, m->experts_per_token, m->num_experts, model_moe_layer_count(m));
        return;
    }
    fprintf(out, "parameters:       %lld (main model %lld + MTP modules %lld)\n", (long long)(c.main + c.mtp),
            (long long)c.main, (long long)c.mtp);
    fprintf(out, "main_parameters:  %lld\n", (long long)c.main);
    if (m->num_experts > 0)
        fprintf(out, "active_parameters: %lld (main model, per token: %d of %d experts in %d MoE layers)\n",
                (long long)c.main_active, m->experts_per_token, m->num_experts, model_moe_layer_count(m));
    /* Hugging Face stores each MTP layer with its own copies of the shared embedding and output head */
    fprintf(out, "mtp_parameters:   %lld (%d modules; %lld as Hugging Face stores them, with copies of the "
            "embedding and output head)\n", (long long)c.mtp, model_mtp_depth(m),
            (long long)(c.mtp + (int64_t)model_mtp_depth(m) * (m->tie_embeddings ? 1 : 2) * m->vocab_size * m->hidden_size));
}

/* Matmul parameters of one MLA attention (per token, all heads). */
static double mla_matmul_params(const struct model_config *m) {
    double C = m->hidden_size, H = m->num_heads, QK = model_head_dim(m), QR = m->q_lora_rank, KR = m->kv_lora_rank;
    double q = QR ? QR * C + H * QK * QR : H * QK * C;
    return q + (KR + m->qk_rope_head_dim) * C + H * (m->qk_nope_head_dim + m->v_head_dim) * KR + C * H * m->v_head_dim;
}

double model_flops_per_token(const struct model_config *m, int seq_len) {
    double C = m->hidden_size, F = m->intermediate_size, L = m->num_layers, V = m->vocab_size;
    double kv = (double)m->num_kv_heads / m->num_heads, moe = model_moe_layer_count(m);
    double FM = model_moe_ffn_size(m), shared = 3 * C * FM * m->moe_shared_experts;
    double attn = model_is_mla(m) ? mla_matmul_params(m) : C * C * (2 + 2 * kv); /* q, o, k, v */
    double dense_ffn = 3 * C * F;                           /* gate, up, down */
    double moe_ffn = C * m->num_experts + m->experts_per_token * 3 * C * FM + shared; /* router + k experts + shared */
    double matmul_params = L * attn + (L - moe) * dense_ffn + moe * moe_ffn + V * C; /* + output projection */
    /* causal QK^T and AV, forward and backward: 6 x (T/2) x heads x (qk + v head dims) per layer */
    double core = 3.0 * seq_len * m->num_heads * (model_head_dim(m) + model_v_head_dim(m));
    double flops = 6 * matmul_params + L * core;
    for (int d = 0; d < model_mtp_depth(m); d++) { /* projection, block, shared output head */
        double ffn = model_layer_is_moe(m, m->num_layers + d) ? moe_ffn : dense_ffn;
        flops += 6 * (2 * C * C + attn + ffn + V * C) + core;
    }
    return flops;
}

struct memory_estimate model_memory_estimate(const struct recipe *r, int dp, const struct backend *be) {
    return model_memory_estimate_stage(r, dp, be, 0);
}

/* A bf16 table's fp32 scratch (kernels/bf16_table.h): every operand slot
 * keeps its largest use, so the sum of each slot's largest operand.
 *   CPU: everything widens: the head's logits (its GEMM's output and its
 *   backward's input, N x V twice), a widened weight matrix, SwiGLU
 *   backward's four operands, attention's.
 *   CUDA: GEMMs, RMSNorm/RoPE/SwiGLU/add/scale, the embedding gradient, the
 *   cross-entropy and flash attention (head dims 64 and 128) run on bf16
 *   storage; the
 *   reference attention (other head dims) widens its operands: seven slots
 *   of up to N x C, counted always (an upper bound; MoE's combine runs on
 *   bf16 rows). fp8 adds the reference FP8 GEMMs' widened operands (x, w
 *   and the output), an upper bound of the FP8 GEMMs' code buffers too. */
static size_t bf16_scratch_bytes(const struct recipe *r, const struct backend *be) {
    if (be->precision == PRECISION_FP32) return 0;
    const struct model_config *mc = &r->model;
    size_t tp = r->parallel.tp > 0 ? (size_t)r->parallel.tp : 1;
    size_t N = (size_t)r->train.micro_batch * r->train.seq_len / (r->parallel.cp > 0 ? r->parallel.cp : 1);
    size_t C = mc->hidden_size, V = mc->vocab_size / tp, F = mc->intermediate_size / tp;
    if (mc->num_experts > 0 && (size_t)mc->experts_per_token * model_moe_ffn_size(mc) > F)
        F = (size_t)mc->experts_per_token * model_moe_ffn_size(mc);
    size_t big = F > C ? F : C, floats;
    if (!strcmp(be->name, "cpu")) {
        floats = N * V + 4 * N * big + 2 * N * C + (V * C > N * F ? V * C : N * F) + N * V;
    } else {
        floats = 7 * N * C;
    }
    if (be->precision == PRECISION_FP8) floats += 2 * N * big + big * C; /* the FP8 GEMMs widen both operands */
    return floats * sizeof(float);
}

struct memory_estimate model_memory_estimate_stage(const struct recipe *r, int dp, const struct backend *be,
                                                   int pp_rank) {
    struct memory_estimate e = {0};
    struct param_table t;
    struct model_part part;
    model_part_for(&part, &r->model, &r->parallel, 0, pp_rank, 0, 0);
    param_table_build(&t, &r->model, &part);
    e.local_params = t.total;
    e.grads = t.total * sizeof(float);
    if (strcmp(r->train.precision, "fp32")) e.weights = t.total * 2; /* the bf16 working copy */
    /* ZeRO-1 shards the dense tensors' moments over dp, the experts' over edp = tp*cp*dp / (etp*ep)
     * (parallel/grid.h); with a working copy the fp32 master too, but for the norm gains and state every
     * rank keeps whole (model/master.h) */
    int fe = param_table_first_expert(&t);
    size_t experts = fe < t.count ? (t.total - t.items[fe].offset) * sizeof(float) : 0, gains = 0;
    const struct parallel_config *par = &r->parallel;
    int edp = par->tp * par->cp * dp / ((par->ep > 0 ? par->ep : 1) * (par->etp > 0 ? par->etp : 1));
    int dpcp = dp * par->cp; /* the dense tensors' gradient group: dp and its cp peers */
    int zero = r->optimizer.distributed && (dpcp > 1 || (experts && edp > 1));
    int edp_div = zero && edp > 1 ? edp : 1;
    for (int i = 0; i < t.count; i++)
        if (master_packed(&t.items[i])) gains += t.items[i].numel * sizeof(float);
    e.params = zero && e.weights ? (e.grads - experts) / dpcp + experts / edp_div + gains : e.grads;
    e.optimizer = 2 * (e.grads - experts) / (zero && dpcp > 1 ? dpcp : 1) + 2 * experts / edp_div;
    /* ZeRO-1 reduces and gathers in place in the gradient and parameter buffers: no scratch */
    e.buffers += param_table_shared_block_floats(&t) * sizeof(float); /* kv-block scratch */
    param_table_free(&t);
    /* pipeline stage 0 holds the most micro batches at once, the last the fewest */
    int pp = r->parallel.pp, vpp = pp > 1 ? r->parallel.vpp : 1;
    int m = r->train.global_batch / (r->train.micro_batch * (dp > 0 ? dp : 1));
    if (m < 1) m = 1;
    int slots = 1, deferred = 0, nsend = SCHED_UNIT_MAX, per_chunk[2], chunked = 0, *slot_chunk = NULL;
    enum sched_kind kind = schedule_kind(r->parallel.schedule, vpp);
    if (pp > 1 && (vpp == 1 || m % pp == 0 || schedule_v_shaped(kind)) && (kind != SCHED_DUALPIPEV || m >= 2 * pp)) {
        struct sched_item *s = xmalloc(sizeof *s * SCHED_ITEMS(m, vpp));
        int n = schedule_build(s, kind, pp, vpp, pp_rank, m);
        slots = schedule_max_in_flight(s, n, vpp);
        /* the V schedules: a slot per micro batch and chunk, each chunk's activations only */
        chunked = schedule_chunk_slots(kind, s, n, pp, m, per_chunk);
        if (chunked) {
            slots = per_chunk[0] + per_chunk[1];
            slot_chunk = xmalloc(sizeof(int) * slots);
            for (int i = 0; i < slots; i++) slot_chunk[i] = i >= per_chunk[0];
        }
        deferred = schedule_max_deferred(s, n);
        /* GPU ranks over NCCL (parallel.comm auto or nccl) group their sends with their receives */
        int grouped = !strcmp(be->name, "cuda") && strcmp(r->parallel.comm, "mpi");
        nsend = schedule_send_buffers(kind, pp, vpp, m, NULL, grouped);
        free(s);
    }
    e.in_flight = chunked ? per_chunk[0] : slots; /* micro batches (a V holds fewer of its last chunk) */
    /* a rank holds seq_len / cp tokens of each sequence (model/cp_attention.h) */
    int T = r->train.seq_len / par->cp;
    e.activations = transformer_arena_bytes(be, &r->model, &part, r->parallel.sequence_parallel, r->train.micro_batch,
                                      T, slots, slot_chunk, recompute_mode(r->train.recompute));
    free(slot_chunk);
    /* split schedules: the copies of the deferred W's operands, as many chunks' at once as the schedule leaves
     * waiting (zb-h1: stage p defers each W p backwards, p + 1 at once); a chunk's share of the stage's */
    if (deferred)
        e.activations += (size_t)deferred * transformer_wgrad_bytes(be, &r->model, &part, r->parallel.sequence_parallel,
                                                                    r->train.micro_batch, T,
                                                                    recompute_mode(r->train.recompute)) / vpp;
    if (par->cp > 1) { /* the ring's scratch: two K,V blocks stored, their fp32 gradients, fp32 output and dq */
        size_t N = (size_t)r->train.micro_batch * T, tp = par->tp;
        size_t heads = (size_t)r->model.num_heads / tp, kv = model_is_mla(&r->model) ? heads : (size_t)r->model.num_kv_heads;
        if (!model_is_mla(&r->model)) kv = kv >= tp ? kv / tp : 1;
        size_t D = model_head_dim(&r->model), Dv = model_v_head_dim(&r->model);
        e.buffers += N * kv * (D + Dv) * (2 * be->act_bytes + 2 * sizeof(float)) + N * heads * (D + Dv) * sizeof(float);
    }
    /* pipeline: the send buffers (an exchange unit's items, or zbv's sends in flight), one receive buffer */
    int sp_tp = r->parallel.sequence_parallel ? r->parallel.tp : 1;
    size_t act = (size_t)r->train.micro_batch * T / sp_tp * r->model.hidden_size * be->act_bytes;
    if (pp > 1) e.buffers += act * (nsend + 1);
    /* dualpipev's pairs: the backward's own set of MoE exchange scratch (model/pair.c) */
    if (pp > 1 && kind == SCHED_DUALPIPEV)
        e.buffers += transformer_pair_bytes(be, &r->model, &part, r->parallel.sequence_parallel, r->train.micro_batch, T,
                                            recompute_mode(r->train.recompute));
    e.buffers += bf16_scratch_bytes(r, be);
    /* host: the global batch, two prefetched shares, and the checkpoint snapshot (params + moments) */
    size_t sample = (size_t)(r->train.seq_len + 1) * sizeof(int32_t);
    e.host = sample * (r->train.global_batch + 2 * (size_t)(r->train.global_batch / (dp > 0 ? dp : 1)));
    /* the final weights: one rank writes them from a host copy; several write
     * a scratch checkpoint from the checkpoint snapshot (or one of their own) */
    int one_rank = dp <= 1 && r->parallel.tp * r->parallel.pp == 1;
    e.snapshot = r->checkpoint.dir[0] || !one_rank ? 3 * e.grads : 0; /* whole fp32 master and moments */
    e.host += e.snapshot + (one_rank ? e.grads : 0);
    int cpu = !strcmp(be->name, "cpu");
    e.runtime = cpu ? MTRAIN_RUNTIME_BYTES : 0;
    e.total = e.params + e.weights + e.grads + e.optimizer + e.activations + e.buffers +
              (cpu ? e.host + e.runtime : 0);
    return e;
}
