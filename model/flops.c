#include <string.h>

#include "config/common.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "parallel/schedule.h"

int64_t model_param_count(const struct model_config *m) {
    struct param_table t;
    struct model_part part;
    model_part_full(&part, m);
    param_table_build(&t, m, &part);
    int64_t n = param_table_global_count(&t);
    param_table_free(&t);
    return n;
}

int64_t model_active_param_count(const struct model_config *m) {
    int64_t n = model_param_count(m);
    int64_t expert = 3 * (int64_t)m->hidden_size * model_moe_ffn_size(m);
    return n - (int64_t)model_moe_layer_count(m) * (m->num_experts - m->experts_per_token) * expert;
}

double model_flops_per_token(const struct model_config *m, int seq_len) {
    double C = m->hidden_size, F = m->intermediate_size, L = m->num_layers, V = m->vocab_size;
    double kv = (double)m->num_kv_heads / m->num_heads, moe = model_moe_layer_count(m);
    double attn = C * C * (2 + 2 * kv);                     /* q, o, k, v */
    double dense_ffn = 3 * C * F;                           /* gate, up, down */
    double moe_ffn = C * m->num_experts + m->experts_per_token * 3 * C * model_moe_ffn_size(m); /* router + k experts */
    double matmul_params = L * attn + (L - moe) * dense_ffn + moe * moe_ffn + V * C; /* + output projection */
    return 6 * matmul_params + 6 * L * C * seq_len;
}

struct memory_estimate model_memory_estimate(const struct recipe *r, int dp, const struct backend *be) {
    struct memory_estimate e = {0};
    struct param_table t;
    struct model_part part;
    model_part_for(&part, &r->model, &r->parallel, 0, 0, 0);
    param_table_build(&t, &r->model, &part);
    e.params = t.total * sizeof(float);
    e.grads = e.params;
    /* ZeRO-1 shards the dense tensors' moments over dp, the experts' over dp / ep */
    int fe = param_table_first_expert(&t);
    size_t experts = fe < t.count ? (t.total - t.items[fe].offset) * sizeof(float) : 0;
    int zero = r->optimizer.distributed && dp > 1, edp = dp / (r->parallel.ep > 0 ? r->parallel.ep : 1);
    e.optimizer = 2 * (e.params - experts) / (zero ? dp : 1) + 2 * experts / (zero && edp > 1 ? edp : 1);
    /* ZeRO-1 keeps, per group, the reduced gradient shard and a dp-wide flat scratch */
    if (zero) e.buffers += (e.params - experts) / dp * (dp + 1) + (edp > 1 ? experts / edp * (edp + 1) : 0);
    e.buffers += param_table_shared_block_floats(&t) * sizeof(float); /* kv-block scratch */
    param_table_free(&t);
    /* pipeline stage 0 holds the most micro batches at once */
    int pp = r->parallel.pp, vpp = pp > 1 ? r->parallel.vpp : 1;
    int m = r->train.global_batch / (r->train.micro_batch * (dp > 0 ? dp : 1));
    if (m < 1) m = 1;
    int slots = 1;
    if (pp > 1 && (vpp == 1 || m % pp == 0)) {
        struct sched_item *s = xmalloc(sizeof *s * 2 * m * vpp);
        slots = schedule_max_in_flight(s, schedule_build(s, pp, vpp, 0, m), vpp);
        free(s);
    }
    e.activations = transformer_arena_bytes(be, &r->model, &part, r->parallel.sequence_parallel, r->train.micro_batch,
                                      r->train.seq_len, slots, recompute_mode(r->train.recompute));
    /* pipeline: a send buffer per (micro batch, chunk) each way, one receive buffer */
    int sp_tp = r->parallel.sequence_parallel ? r->parallel.tp : 1;
    size_t act = (size_t)r->train.micro_batch * r->train.seq_len / sp_tp * r->model.hidden_size * sizeof(float);
    if (pp > 1) e.buffers += act * (2 * (size_t)m * vpp + 1);
    /* host: the global batch, two prefetched shares, and the checkpoint snapshot (params + moments) */
    size_t sample = (size_t)(r->train.seq_len + 1) * sizeof(int32_t);
    e.host = sample * (r->train.global_batch + 2 * (size_t)(r->train.global_batch / (dp > 0 ? dp : 1)));
    /* the final weights: one rank writes them from a host copy; several write
     * a scratch checkpoint from the checkpoint snapshot (or one of their own) */
    int one_rank = dp <= 1 && r->parallel.tp * r->parallel.pp == 1;
    e.snapshot = r->checkpoint.dir[0] || !one_rank ? 3 * e.params : 0;
    e.host += e.snapshot + (one_rank ? e.params : 0);
    int cpu = !strcmp(be->name, "cpu");
    e.runtime = cpu ? MTRAIN_RUNTIME_BYTES : 0;
    e.total = e.params + e.grads + e.optimizer + e.activations + e.buffers + (cpu ? e.host + e.runtime : 0);
    return e;
}
