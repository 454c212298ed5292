/* Cross-field checks of a loaded recipe, run before any rank allocates
 * memory. Single values were range-checked while loading; here we check
 * what only makes sense together (shapes that divide, batches that split over
 * ranks, schedules that fit in the run, paths that exist). The first problem
 * is reported as one line naming the key and where it was set. */
#include <limits.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

#include "config/recipe_schema.h"

/* "mtrain: error: WHERE: key 'K': message", WHERE being the file:line:col,
 * --set or the recipe file (for a default). */
static int verr(const struct recipe *r, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int quiet;
void recipe_validate_quiet(int on) { quiet = on; }

static int verr(const struct recipe *r, const char *key, const char *fmt, ...) {
    if (quiet) return -1;
    char where[RECIPE_PATH_MAX + 32];
    recipe_where(r, recipe_key_index(key), where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "mtrain: error: %s: key '%s': ", where, key);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* " (model.num_heads set at FILE:5:3)" for the other key of a pair. */
static const char *other(const struct recipe *r, const char *key, char *buf, size_t n) {
    char where[RECIPE_PATH_MAX + 32];
    int i = recipe_key_index(key);
    if (r->marks[i].line == 0) snprintf(buf, n, " (%s is the default)", key);
    else if (r->marks[i].line == RECIPE_MARK_SET) snprintf(buf, n, " (%s set by --set)", key);
    else snprintf(buf, n, " (%s set at %s)", key, (recipe_where(r, i, where, sizeof where), where));
    return buf;
}

/* DeepSeek-V3: MLA head sizes, routing groups, dense prefix, MTP. */
static int check_deepseek(const struct recipe *r) {
    const struct model_config *m = &r->model;
    int mla = !strcmp(m->arch, "deepseek_v3");
    if (!mla) {
        static const char *const only[] = {"model.kv_lora_rank", "model.q_lora_rank", "model.mtp_depth"};
        const int vals[] = {m->kv_lora_rank, m->q_lora_rank, m->mtp_depth};
        for (int i = 0; i < 3; i++)
            if (vals[i]) return verr(r, only[i], "only arch deepseek_v3 has MLA attention and MTP modules; set model.arch");
    } else {
        if (m->kv_lora_rank < 1) return verr(r, "model.kv_lora_rank", "deepseek_v3 (MLA) needs kv_lora_rank >= 1");
        if (m->qk_nope_head_dim < 1) return verr(r, "model.qk_nope_head_dim", "deepseek_v3 (MLA) needs qk_nope_head_dim >= 1");
        if (m->v_head_dim < 1) return verr(r, "model.v_head_dim", "deepseek_v3 (MLA) needs v_head_dim >= 1");
        if (m->qk_rope_head_dim < 2 || m->qk_rope_head_dim % 2)
            return verr(r, "model.qk_rope_head_dim", "qk_rope_head_dim must be even and >= 2 for RoPE, got %d",
                        m->qk_rope_head_dim);
    }
    if (!strcmp(m->arch, "llama") || m->num_experts == 0) return 0;
    if (m->num_experts % m->moe_n_group)
        return verr(r, "model.moe_n_group", "moe_n_group %d does not divide num_experts %d", m->moe_n_group,
                    m->num_experts);
    if (m->moe_topk_group > m->moe_n_group)
        return verr(r, "model.moe_topk_group", "moe_topk_group %d is more than moe_n_group %d", m->moe_topk_group,
                    m->moe_n_group);
    if (m->moe_n_group > 1 && (long)m->moe_topk_group * (m->num_experts / m->moe_n_group) < m->experts_per_token)
        return verr(r, "model.moe_topk_group", "the best %d groups of %d experts hold fewer than experts_per_token %d",
                    m->moe_topk_group, m->num_experts / m->moe_n_group, m->experts_per_token);
    if (m->moe_n_group > 1 && m->num_experts / m->moe_n_group < 2)
        return verr(r, "model.moe_n_group", "group-limited routing scores a group by its top 2 experts: groups need "
                    "at least 2 experts (num_experts %d / moe_n_group %d)", m->num_experts, m->moe_n_group);
    if (m->moe_n_group > 64)
        return verr(r, "model.moe_n_group", "moe_n_group %d is more than the 64 groups supported", m->moe_n_group);
    if (!strcmp(m->moe_score_func, "softmax")) { /* DeepSeek-V3's routing keys, with Mixtral's router */
        const char *key = m->moe_n_group > 1 ? "model.moe_n_group" : m->moe_routed_scaling != 1 ? "model.moe_routed_scaling"
                          : m->moe_bias_update_rate > 0 ? "model.moe_bias_update_rate"
                          : m->moe_seq_aux_loss_coef > 0 ? "model.moe_seq_aux_loss_coef" : NULL;
        if (key)
            return verr(r, key, "moe_n_group, moe_routed_scaling, moe_bias_update_rate and moe_seq_aux_loss_coef "
                        "belong to sigmoid routing (DeepSeek-V3): set model.moe_score_func sigmoid");
    }
    if (!strcmp(m->moe_score_func, "sigmoid") && (m->moe_aux_loss_coef > 0 || m->moe_z_loss_coef > 0))
        return verr(r, m->moe_aux_loss_coef > 0 ? "model.moe_aux_loss_coef" : "model.moe_z_loss_coef",
                    "sigmoid routing balances with moe_bias_update_rate and moe_seq_aux_loss_coef: set "
                    "moe_aux_loss_coef and moe_z_loss_coef to 0 (moe_aux_loss_coef defaults to 0.01)");
    if (m->first_k_dense >= m->num_layers)
        return verr(r, "model.first_k_dense", "first_k_dense %d leaves no MoE layer of %d", m->first_k_dense,
                    m->num_layers);
    return 0;
}

static int check_model(const struct recipe *r) {
    const struct model_config *m = &r->model;
    char o[RECIPE_PATH_MAX + 96];
    if (check_deepseek(r)) return -1;
    if (!strcmp(m->arch, "mixtral") && m->num_experts == 0)
        return verr(r, "model.arch", "arch mixtral is a mixture of experts: set model.num_experts");
    if (!strcmp(m->arch, "llama") && m->num_experts > 0)
        return verr(r, "model.num_experts", "num_experts %d makes a mixture of experts: set model.arch to mixtral",
                    m->num_experts);
    if (m->num_experts > 0 && m->experts_per_token > m->num_experts)
        return verr(r, "model.experts_per_token", "experts_per_token %d is more than num_experts %d%s",
                    m->experts_per_token, m->num_experts, other(r, "model.num_experts", o, sizeof o));
    if (m->num_experts > 0 && m->moe_layer_freq > m->num_layers)
        return verr(r, "model.moe_layer_freq", "moe_layer_freq %d leaves only layer 0 of %d as MoE; use 1..num_layers",
                    m->moe_layer_freq, m->num_layers);
    if (m->vocab_size == RECIPE_VOCAB_AUTO)
        return verr(r, "model.vocab_size", "vocab_size auto is resolved from the dataset's tokenizer record by "
                    "mtrain pretrain; give a number here");
    if (m->vocab_size < 2) return verr(r, "model.vocab_size", "vocab_size must be at least 2");
    if (strcmp(m->arch, "deepseek_v3") && m->hidden_size % m->num_heads)
        return verr(r, "model.hidden_size", "hidden_size %d is not divisible by num_heads %d%s", m->hidden_size,
                    m->num_heads, other(r, "model.num_heads", o, sizeof o));
    if (m->num_heads % m->num_kv_heads)
        return verr(r, "model.num_kv_heads", "num_kv_heads %d does not divide num_heads %d%s", m->num_kv_heads,
                    m->num_heads, other(r, "model.num_heads", o, sizeof o));
    if (strcmp(m->arch, "deepseek_v3") && (m->hidden_size / m->num_heads) % 2)
        return verr(r, "model.hidden_size", "head dimension hidden_size/num_heads = %d must be even for RoPE%s",
                    m->hidden_size / m->num_heads, other(r, "model.num_heads", o, sizeof o));
    if (m->max_seq_len && m->max_seq_len < r->train.seq_len)
        return verr(r, "model.max_seq_len", "max_seq_len %d is shorter than train.seq_len %d%s", m->max_seq_len,
                    r->train.seq_len, other(r, "train.seq_len", o, sizeof o));
    if (m->rope_scaling_factor != 0 && m->rope_scaling_factor < 1)
        return verr(r, "model.rope_scaling_factor", "rope_scaling_factor must be 0 (off) or >= 1, got %g",
                    m->rope_scaling_factor);
    if (m->rope_scaling_factor != 0 && m->rope_low_freq_factor >= m->rope_high_freq_factor)
        return verr(r, "model.rope_low_freq_factor", "rope_low_freq_factor %g must be below rope_high_freq_factor %g%s",
                    m->rope_low_freq_factor, m->rope_high_freq_factor,
                    other(r, "model.rope_high_freq_factor", o, sizeof o));
    return 0;
}

/* the parameter table: 3 + 9 per layer (and MTP module) + 3 per expert of each MoE layer (an upper bound) */
int model_check_tensor_count(const struct model_config *m, const char **key, char *why, size_t n) {
    const long long most = MODEL_MAX_TENSORS;
    *key = "model.num_layers";
    if (m->num_layers > most / 9)
        return snprintf(why, n, "num_layers %d is more than the supported %lld", m->num_layers, most / 9), -1;
    *key = "model.num_experts";
    if (m->num_experts > most / 3)
        return snprintf(why, n, "num_experts %d is more than the supported %lld", m->num_experts, most / 3), -1;
    long long freq = m->moe_layer_freq > 0 ? m->moe_layer_freq : 1;
    /* every MTP module's block may be an MoE block too */
    long long moe_layers = m->num_experts > 0 ? (m->num_layers + freq - 1) / freq + m->mtp_depth : 0;
    long long tensors = 3 + 9ll * m->mtp_depth + 9ll * m->num_layers + 3ll * m->num_experts * moe_layers;
    if (tensors > most)
        return snprintf(why, n, "num_experts %d in %lld MoE layers make %lld tensors, more than the supported %lld",
                        m->num_experts, moe_layers, tensors, most), -1;
    return 0;
}

/* Bounds on sizes, checked before anything multiplies them: each value
 * was only range-checked alone (1..INT_MAX), and the products below (and in
 * the model code: pp*vpp, tp*pp*cp, micro_batch*dp, the tensor table) must
 * neither overflow nor ask for absurd memory. The limits are far above any
 * real model or cluster. */
#define MAX_PARALLEL (1 << 15)      /* ranks along one dimension (tp_rank * tp fits an int) */
#define MAX_VPP 16                  /* MAX_CHUNKS in model/params.h */
#define MAX_MICRO_BATCHES (1 << 16) /* per data-parallel rank and step (pipeline schedules) */
#define MAX_SCHEDULE (1 << 24)      /* pp x vpp x micro batches: the schedule the dry run prints */
#define MAX_ZBV (1 << 16)           /* pp x micro batches of zbv, whose order is made for all ranks at once */

static int check_sizes(const struct recipe *r) {
    const struct parallel_config *p = &r->parallel;
    const struct model_config *m = &r->model;
    const struct train_config *t = &r->train;
    static const char *const keys[] = {"parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep", "parallel.etp"};
    const int vals[] = {p->tp, p->pp, p->cp, p->ep, p->etp};
    for (int i = 0; i < 5; i++)
        if (vals[i] > MAX_PARALLEL)
            return verr(r, keys[i], "%d ranks is more than the supported %d", vals[i], MAX_PARALLEL);
    if (p->vpp > MAX_VPP)
        return verr(r, "parallel.vpp", "vpp %d is more than the supported %d virtual stages per rank", p->vpp, MAX_VPP);
    char why[200];
    const char *key;
    if (model_check_tensor_count(m, &key, why, sizeof why) != 0) return verr(r, key, "%s", why);
    /* tokens of a micro batch are counted in int by the model */
    long long tokens = (long long)t->micro_batch * t->seq_len;
    if (tokens > INT_MAX)
        return verr(r, "train.micro_batch", "micro_batch * seq_len = %d * %d = %lld tokens is more than %d",
                    t->micro_batch, t->seq_len, tokens, INT_MAX);
    /* a MoE layer's token exchange counts the elements it sends one peer in int (MPI's counts): at worst every
     * routed copy of the micro batch's tokens, hidden_size elements each */
    long long routed = tokens * (m->num_experts > 0 ? m->experts_per_token : 0) * m->hidden_size;
    if (routed > INT_MAX)
        return verr(r, "train.micro_batch", "micro_batch * seq_len * experts_per_token * hidden_size = %lld * %d * %d = "
                    "%lld elements a MoE layer may send one rank, more than %d: use a smaller micro_batch",
                    tokens, m->experts_per_token, m->hidden_size, routed, INT_MAX);
    return 0;
}

/* Layout: world = tp * cp * pp * dp (ep lives inside dp for MoE models). */
static int check_parallel(const struct recipe *r, int world_size) {
    const struct parallel_config *p = &r->parallel;
    const struct model_config *m = &r->model;
    char o[RECIPE_PATH_MAX + 96];
    int uneven = (p->first_stage_layers > 0) + (p->last_stage_layers > 0);
    if (uneven) {
        long long middle = p->pp - uneven;
        long long rest = (long long)m->num_layers - p->first_stage_layers - p->last_stage_layers;
        const char *key = p->first_stage_layers ? "parallel.first_stage_layers" : "parallel.last_stage_layers";
        if (p->pp < 2) return verr(r, key, "uneven pipeline stages need pp > 1");
        if (p->vpp > 1) return verr(r, key, "uneven pipeline stages cannot be combined with vpp %d", p->vpp);
        if (rest < middle || (middle == 0 && rest != 0) || (middle > 0 && rest % middle))
            return verr(r, key, "first %d + last %d stage layers leave %lld of model.num_layers %d for %lld middle stages: "
                        "each needs the same number, at least 1", p->first_stage_layers, p->last_stage_layers, rest,
                        m->num_layers, middle);
    } else if (m->num_layers % p->pp)
        return verr(r, "parallel.pp", "pp %d does not divide model.num_layers %d%s", p->pp, m->num_layers,
                    other(r, "model.num_layers", o, sizeof o));
    if (p->vpp > 1 && p->pp == 1)
        return verr(r, "parallel.vpp", "vpp %d needs pipeline parallelism (pp > 1)", p->vpp);
    /* the schedule's names (parallel/schedule.h schedule_kind) */
    int auto_ = !strcmp(p->schedule, "auto"), zbv = !strcmp(p->schedule, "zbv") || !strcmp(p->schedule, "dualpipev");
    int zb = !strcmp(p->schedule, "zb-h1") || zbv;
    if (!strcmp(p->schedule, "interleaved") && p->vpp == 1)
        return verr(r, "parallel.schedule", "the interleaved schedule needs vpp > 1 (virtual stages per rank)");
    if (zbv && p->pp > 1 && p->vpp != 2)
        return verr(r, "parallel.vpp", "the %s schedule places two model chunks per rank in a V: it needs vpp 2, not %d",
                    p->schedule, p->vpp);
    if (!auto_ && !zbv && strcmp(p->schedule, "interleaved") && p->vpp > 1)
        return verr(r, "parallel.schedule", "%s runs one model chunk per rank: vpp %d needs the interleaved schedule "
                    "(or auto)", p->schedule, p->vpp);
    if (zb && p->pp == 1) return verr(r, "parallel.schedule", "%s is a pipeline schedule: it needs pp > 1", p->schedule);
    if (!uneven && m->num_layers % ((long long)p->pp * p->vpp))
        return verr(r, "parallel.vpp", "pp*vpp = %lld does not divide model.num_layers %d%s", (long long)p->pp * p->vpp,
                    m->num_layers, other(r, "model.num_layers", o, sizeof o));
    if (m->num_heads % p->tp)
        return verr(r, "parallel.tp", "tp %d does not divide model.num_heads %d%s", p->tp, m->num_heads,
                    other(r, "model.num_heads", o, sizeof o));
    /* tp > kv heads: each kv head is replicated over tp / kv_heads ranks */
    if (m->num_kv_heads % p->tp && p->tp % m->num_kv_heads)
        return verr(r, "parallel.tp", "tp %d and model.num_kv_heads %d must divide one another%s", p->tp, m->num_kv_heads,
                    other(r, "model.num_kv_heads", o, sizeof o));
    if (m->vocab_size % p->tp)
        return verr(r, "parallel.tp", "tp %d does not divide model.vocab_size %d (vocab-parallel embedding; pad the "
                    "vocabulary to a multiple of tp)%s", p->tp, m->vocab_size, other(r, "model.vocab_size", o, sizeof o));
    if (m->intermediate_size % p->tp)
        return verr(r, "parallel.tp", "tp %d does not divide model.intermediate_size %d%s", p->tp,
                    m->intermediate_size, other(r, "model.intermediate_size", o, sizeof o));
    if (m->num_experts > 0 && ((long)m->moe_shared_experts * (m->moe_intermediate_size ? m->moe_intermediate_size
                                                                                 : m->intermediate_size)) % p->tp)
        return verr(r, "parallel.tp", "tp %d does not divide the shared experts' width (moe_shared_experts x "
                    "moe_intermediate_size)", p->tp);
    /* context parallelism splits each sequence into 2*cp chunks for load balance: a rank holds 2 of them */
    if (p->cp > 1 && r->train.seq_len % (2ll * p->cp))
        return verr(r, "parallel.cp", "2*cp = %lld does not divide train.seq_len %d: each rank holds chunks cp_rank "
                    "and 2*cp-1-cp_rank of every sequence%s", 2ll * p->cp, r->train.seq_len,
                    other(r, "train.seq_len", o, sizeof o));
    if (p->cp > 1 && m->num_experts > 0 && m->moe_capacity_factor > 0)
        return verr(r, "parallel.cp", "context parallelism (cp %d) with an expert capacity (model.moe_capacity_factor "
                    "%g) is not implemented yet: the capacity keeps a sequence's first selections, and cp splits the "
                    "sequence over ranks (set moe_capacity_factor 0, dropless)", p->cp, m->moe_capacity_factor);
    long rank_tokens = (long)r->train.micro_batch * (r->train.seq_len / p->cp); /* a micro batch's tokens on a rank */
    if (p->sequence_parallel && rank_tokens % p->tp)
        return verr(r, "parallel.sequence_parallel", "sequence parallel needs micro_batch * seq_len%s (%ld) divisible "
                    "by tp %d", p->cp > 1 ? " / cp" : "", rank_tokens, p->tp);
    if (p->etp > 1 && m->num_experts == 0)
        return verr(r, "parallel.etp", "etp %d needs a mixture-of-experts model (model.num_experts > 0)", p->etp);
    int expert_width = m->moe_intermediate_size ? m->moe_intermediate_size : m->intermediate_size;
    if (p->etp > 1 && expert_width % p->etp)
        return verr(r, "parallel.etp", "etp %d does not divide the experts' width %d (model.moe_intermediate_size)",
                    p->etp, expert_width);
    if (p->ep > 1 && m->num_experts == 0)
        return verr(r, "parallel.ep", "ep %d needs a mixture-of-experts model (model.num_experts > 0)", p->ep);
    if (p->ep > 1 && m->num_experts % p->ep)
        return verr(r, "parallel.ep", "ep %d does not divide model.num_experts %d%s", p->ep, m->num_experts,
                    other(r, "model.num_experts", o, sizeof o));
    /* MoE layers under TP route 1/tp of the micro batch's tokens on each rank */
    if (m->num_experts > 0 && p->tp > 1 && rank_tokens % p->tp)
        return verr(r, "parallel.tp", "MoE layers split the micro batch's tokens over TP: micro_batch * seq_len%s "
                    "(%ld) must be divisible by tp %d", p->cp > 1 ? " / cp" : "", rank_tokens, p->tp);
    /* last: the layout itself may be fine and the job merely launched on the wrong number of ranks */
    long long model_par = (long long)p->tp * p->pp * p->cp;  /* each <= MAX_PARALLEL: no overflow */
    if (world_size > 0 && world_size % model_par)
        return verr(r, "parallel.tp", "world size %d is not divisible by tp*pp*cp = %d*%d*%d = %lld", world_size,
                    p->tp, p->pp, p->cp, model_par);
    /* the experts' grid (etp x ep x edp) is drawn from the tp x cp x dp ranks of a pipeline stage */
    long long stage_ranks = world_size > 0 ? world_size / p->pp : 0, expert_par = (long long)p->etp * p->ep;
    if (world_size > 0 && stage_ranks % expert_par)
        return verr(r, p->etp > 1 ? "parallel.etp" : "parallel.ep",
                    "etp*ep = %d*%d = %lld does not divide the ranks of a pipeline stage, tp*cp*dp = %lld (world %d / "
                    "pp %d): the experts' groups are drawn from them", p->etp, p->ep, expert_par, stage_ranks,
                    world_size, p->pp);
    return 0;
}

static int check_train(const struct recipe *r, int world_size) {
    const struct train_config *t = &r->train;
    const struct parallel_config *p = &r->parallel;
    char o[RECIPE_PATH_MAX + 96];
    /* world size unknown (0): only the micro batch split can be checked */
    /* check_parallel made tp*pp*cp divide the world size, so dp >= 1 */
    long long dp = world_size > 0 ? world_size / ((long long)p->tp * p->pp * p->cp) : 1;
    long long per_step = (long long)t->micro_batch * dp;
    if (t->global_batch % per_step) {
        /* say what works: the largest micro batch that divides the share of each data-parallel rank */
        int mb = 0;
        for (int b = t->micro_batch; b >= 1 && !mb; b--)
            if (t->global_batch % ((long long)b * dp) == 0) mb = b;
        char fix[96] = "";
        if (mb) snprintf(fix, sizeof fix, "; with %lld data-parallel ranks set train.micro_batch=%d", dp, mb);
        return verr(r, "train.global_batch",
                    "global_batch %d is not divisible by micro_batch * data-parallel size = %d * %lld = %lld%s%s",
                    t->global_batch, t->micro_batch, dp, per_step, other(r, "train.micro_batch", o, sizeof o), fix);
    }
    long long micro_batches = t->global_batch / per_step;
    int dual = p->pp > 1 && !strcmp(p->schedule, "dualpipev"), zbv = (p->pp > 1 && !strcmp(p->schedule, "zbv")) || dual;
    if (p->vpp > 1 && !zbv && world_size > 0 && micro_batches % p->pp)
        return verr(r, "parallel.vpp", "interleaved 1F1B (vpp %d) needs the micro batches per data-parallel rank (%lld) "
                    "to be a multiple of pp %d", p->vpp, micro_batches, p->pp);
    /* zbv's order is made for every rank at once (parallel/schedule.c): its size is bounded */
    if (zbv && (long long)p->pp * micro_batches > MAX_ZBV)
        return verr(r, "train.global_batch", "the %s schedule of pp %d x %lld micro batches per data-parallel rank is "
                    "more than the supported %d (raise train.micro_batch, or use zb-h1)", p->schedule, p->pp,
                    micro_batches, MAX_ZBV);
    /* DualPipeV's phases fill the V with 2pp micro batches before its steady pairs */
    if (dual && world_size > 0 && micro_batches < 2LL * p->pp)
        return verr(r, "train.global_batch", "the dualpipev schedule needs at least 2 x pp = %d micro batches per "
                    "data-parallel rank, not %lld (raise train.global_batch or lower train.micro_batch)", 2 * p->pp,
                    micro_batches);
    /* a pipeline schedule holds 2 entries per micro batch and chunk */
    if (p->pp > 1 && micro_batches > MAX_MICRO_BATCHES)
        return verr(r, "train.global_batch", "global_batch %d makes %lld micro batches per data-parallel rank and step, "
                    "more than the supported %d with pipeline parallelism (raise train.micro_batch)", t->global_batch,
                    micro_batches, MAX_MICRO_BATCHES);
    long long sched = (long long)p->pp * p->vpp * micro_batches;  /* <= 2^15 * 2^4 * 2^16 */
    if (p->pp > 1 && sched > MAX_SCHEDULE)
        return verr(r, "train.global_batch", "global_batch %d makes a pipeline schedule of %lld micro batch steps "
                    "(pp %d x vpp %d x %lld micro batches), more than the supported %d (raise train.micro_batch)",
                    t->global_batch, sched, p->pp, p->vpp, micro_batches, MAX_SCHEDULE);
    if (t->eval_interval > 0 && r->data.valid_fraction == 0)
        return verr(r, "train.eval_interval", "validation every %d steps needs data.valid_fraction > 0%s",
                    t->eval_interval, other(r, "data.valid_fraction", o, sizeof o));
    if (strcmp(t->precision, "fp32") && r->model.hidden_size % 2)
        return verr(r, "train.precision", "%s stores rows of hidden_size 2-byte values and moves them as 4-byte "
                    "words: hidden_size %d must be even", t->precision, r->model.hidden_size);
    if (!strcmp(t->precision, "fp8") && 2 * t->fp8_skip_layers >= r->model.num_layers)
        return verr(r, "train.fp8_skip_layers", "fp8_skip_layers %d keeps %d blocks at each end in bf16, every one of "
                    "num_layers %d: no block would multiply in FP8 (lower it, or use train.precision bf16)",
                    t->fp8_skip_layers, t->fp8_skip_layers, r->model.num_layers);
    return 0;
}

static int check_schedule(const struct recipe *r) {
    const struct optimizer_config *op = &r->optimizer;
    int steps = r->train.steps;
    char o[RECIPE_PATH_MAX + 96];
    if (op->warmup_steps > steps)
        return verr(r, "optimizer.warmup_steps",
                    "warmup_steps %d is more than train.steps %d%s: for a short run set both, e.g. --set "
                    "train.steps=%d --set optimizer.warmup_steps=%d", op->warmup_steps, steps,
                    other(r, "train.steps", o, sizeof o), steps, steps / 10 > 0 ? steps / 10 : 1);
    if (op->decay_steps && op->decay_steps < op->warmup_steps)
        return verr(r, "optimizer.decay_steps", "decay_steps %d is less than warmup_steps %d%s", op->decay_steps,
                    op->warmup_steps, other(r, "optimizer.warmup_steps", o, sizeof o));
    if (op->wsd_decay_steps > steps)
        return verr(r, "optimizer.wsd_decay_steps", "wsd_decay_steps %d is more than train.steps %d%s",
                    op->wsd_decay_steps, steps, other(r, "train.steps", o, sizeof o));
    if (!strcmp(op->schedule, "wsd") && op->warmup_steps + op->wsd_decay_steps > steps)
        return verr(r, "optimizer.wsd_decay_steps", "warmup_steps + wsd_decay_steps = %d is more than train.steps %d",
                    op->warmup_steps + op->wsd_decay_steps, steps);
    if (op->min_lr > op->lr)
        return verr(r, "optimizer.min_lr", "min_lr %g is above lr %g%s", op->min_lr, op->lr,
                    other(r, "optimizer.lr", o, sizeof o));
    return 0;
}

static int check_paths(const struct recipe *r, int check_exist) {
    struct stat st;
    if (r->rewind.enabled && (!r->checkpoint.dir[0] || r->checkpoint.interval == 0))
        return verr(r, "rewind.enabled", "rewinding needs checkpoints: set checkpoint.dir and checkpoint.interval");
    if (!r->log.dir[0])
        return verr(r, "log.dir", "log.dir is empty: the run directory (metrics, final weights) needs a path");
    if (r->checkpoint.interval > 0 && !r->checkpoint.dir[0])
        return verr(r, "checkpoint.interval", "checkpoints every %d steps need checkpoint.dir", r->checkpoint.interval);
    const struct data_blend *bl = &r->data.blend;
    if (bl->n && r->data.path[0]) return verr(r, "data.blend", "set data.path or data.blend, not both");
    for (int i = 0; check_exist && i < bl->n; i++)
        if (stat(bl->e[i].path, &st) != 0 || !S_ISDIR(st.st_mode))
            return verr(r, "data.blend", "entry %d: dataset directory '%s' does not exist", i, bl->e[i].path);
    if (!check_exist) return 0; /* the dry run says what it did not check */
    if (!bl->n && !r->data.path[0])
        return verr(r, "data.path", "data.path is required (a dataset directory from 'mtrain data build')");
    if (!bl->n && stat(r->data.path, &st) != 0)
        return verr(r, "data.path", "dataset directory '%s' does not exist", r->data.path);
    if (!bl->n && !S_ISDIR(st.st_mode))
        return verr(r, "data.path", "'%s' is not a directory (expected a dataset directory)", r->data.path);
    if (r->model.init_from[0] && stat(r->model.init_from, &st) != 0)
        return verr(r, "model.init_from", "weights file '%s' does not exist", r->model.init_from);
    return 0;
}

static int validate(const struct recipe *r, int world_size, int check_exist) {
    if (world_size < 0) world_size = 0;
    if (check_sizes(r) || check_model(r) || check_parallel(r, world_size) || check_train(r, world_size) || check_schedule(r) ||
        check_paths(r, check_exist))
        return -1;
    return 0;
}

int recipe_validate(const struct recipe *r, int world_size) { return validate(r, world_size, 1); }

int recipe_validate_plan(const struct recipe *r, int world_size) { return validate(r, world_size, 0); }
