/* The recipe schema: one table of every key with its type, field, default,
 * range and doc. Defaults, printing, the schema help, the YAML loader and
 * --set all read this table, so adding a key is one line here plus the field
 * in recipe.h. */
#include "config/recipe_schema.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/common.h"

#define FIELD(sec, f) offsetof(struct recipe, sec.f), sizeof(((struct recipe *)0)->sec.f)
#define INT(sec, f, def, lo, hi, doc) {#sec "." #f, KEY_INT, FIELD(sec, f), def, lo, hi, 0, NULL, doc}
#define POS(sec, f, def, doc) INT(sec, f, def, 1, INT_MAX, doc)
#define NONNEG(sec, f, def, doc) INT(sec, f, def, 0, INT_MAX, doc)
#define U64(sec, f, def, doc) {#sec "." #f, KEY_UINT64, FIELD(sec, f), def, 0, HUGE_VAL, 0, NULL, doc}
#define DBL(sec, f, def, lo, hi, fl, doc) {#sec "." #f, KEY_DOUBLE, FIELD(sec, f), def, lo, hi, fl, NULL, doc}
#define BOOL(sec, f, def, doc) {#sec "." #f, KEY_BOOL, FIELD(sec, f), def, 0, 1, 0, NULL, doc}
#define STR(sec, f, def, doc) {#sec "." #f, KEY_STRING, FIELD(sec, f), def, 0, 0, 0, NULL, doc}
#define BLEND(sec, f, doc) {#sec "." #f, KEY_BLEND, FIELD(sec, f), "", 0, 0, 0, NULL, doc}
#define ENUM(sec, f, def, ch, doc) {#sec "." #f, KEY_ENUM, FIELD(sec, f), def, 0, 0, 0, ch, doc}
#define INF HUGE_VAL
#define GT0 KEY_MIN_EXCL   /* (0, inf) */
#define LT1 KEY_MAX_EXCL   /* [0, 1) */

const char *const recipe_sections[] = {"model", "parallel", "train", "optimizer", "data", "checkpoint", "rewind", "log", NULL};

const struct recipe_key recipe_keys[] = {
    ENUM(model, arch, "llama", "llama|mixtral|deepseek_v3", "model family: llama (dense SwiGLU), mixtral (MoE; needs num_experts) or deepseek_v3 (MLA attention, optional DeepSeek MoE and MTP)"),
    INT(model, vocab_size, "257", 2, INT_MAX, "vocabulary size (257 = bytes + end of document); auto = the vocabulary the dataset's tokenizer record names, exactly"),
    POS(model, hidden_size, "64", "width of the residual stream"),
    POS(model, num_layers, "2", "number of transformer blocks"),
    POS(model, num_heads, "4", "attention query heads"),
    POS(model, num_kv_heads, "2", "key/value heads (GQA groups); must divide num_heads"),
    POS(model, intermediate_size, "192", "SwiGLU hidden size of the MLP"),
    NONNEG(model, max_seq_len, "0", "longest position for RoPE tables; 0 = train.seq_len"),
    DBL(model, rope_theta, "500000", 0, INF, GT0, "RoPE base frequency"),
    DBL(model, rope_scaling_factor, "0", 0, INF, 0, "Llama 3.1 RoPE scaling factor (8); 0 disables scaling"),
    DBL(model, rope_low_freq_factor, "1", 0, INF, GT0, "Llama 3.1 RoPE scaling low_freq_factor"),
    DBL(model, rope_high_freq_factor, "4", 0, INF, GT0, "Llama 3.1 RoPE scaling high_freq_factor"),
    POS(model, rope_original_max_pos, "8192", "Llama 3.1 RoPE scaling original_max_position_embeddings"),
    DBL(model, norm_eps, "1e-5", 0, 1, GT0 | LT1, "RMSNorm epsilon"),
    BOOL(model, tie_embeddings, "false", "share the embedding and output head weights"),
    DBL(model, init_std, "0.02", 0, INF, 0, "standard deviation of the normal weight init"),
    STR(model, init_from, "", "safetensors file (Hugging Face names) to start from; empty = random init"),
    NONNEG(model, num_experts, "0", "routed experts per MoE layer; 0 = a dense model"),
    POS(model, experts_per_token, "2", "experts each token is routed to (top-k)"),
    NONNEG(model, moe_intermediate_size, "0", "SwiGLU size of each expert; 0 = intermediate_size"),
    POS(model, moe_layer_freq, "1", "layer l is a MoE layer when l % moe_layer_freq == 0 (1 = every layer)"),
    DBL(model, moe_aux_loss_coef, "0.01", 0, INF, 0, "weight of the load-balancing loss (Switch/Mixtral form, mean over sequences and MoE layers)"),
    DBL(model, moe_z_loss_coef, "0", 0, INF, 0, "weight of the router z-loss (mean of logsumexp(logits)^2)"),
    DBL(model, moe_capacity_factor, "0", 0, INF, 0, "0 = dropless; else each expert takes at most ceil(f * seq_len * k / experts) tokens of a sequence, the rest are dropped"),
    DBL(model, moe_rows_headroom, "2", 1, INF, 0, "ep > 1: the experts' row buffers are sized for this many times the mean rows a rank receives (what the memory estimate counts) and grow when a micro batch routes more, up to the worst case (every routed token of the EP group)"),
    NONNEG(model, q_lora_rank, "0", "deepseek_v3 MLA: query compression rank (q_a_proj, RMSNorm, q_b_proj); 0 = a full-rank q_proj"),
    NONNEG(model, kv_lora_rank, "0", "deepseek_v3 MLA: joint key/value compression rank (kv_a_proj_with_mqa, RMSNorm, kv_b_proj); required"),
    NONNEG(model, qk_nope_head_dim, "0", "deepseek_v3 MLA: per-head query/key size without position"),
    NONNEG(model, qk_rope_head_dim, "0", "deepseek_v3 MLA: per-head rotary query/key size; the rotary key is one head shared by all"),
    NONNEG(model, v_head_dim, "0", "deepseek_v3 MLA: per-head value size"),
    ENUM(model, rope_scaling_type, "llama3", "llama3|yarn", "RoPE scaling when rope_scaling_factor > 0: llama3 (Llama 3.1 bands) or yarn (DeepSeek-V3)"),
    DBL(model, yarn_beta_fast, "32", 0, INF, GT0, "YaRN beta_fast: rotations above which a frequency is kept"),
    DBL(model, yarn_beta_slow, "1", 0, INF, GT0, "YaRN beta_slow: rotations below which a frequency is divided by the factor"),
    DBL(model, yarn_mscale, "1", 0, INF, 0, "YaRN mscale: cos/sin x (0.1 mscale ln(factor) + 1) / (the same with mscale_all_dim)"),
    DBL(model, yarn_mscale_all_dim, "0", 0, INF, 0, "YaRN mscale_all_dim: softmax scale x (0.1 m ln(factor) + 1)^2; 0 = none"),
    ENUM(model, moe_score_func, "softmax", "softmax|sigmoid", "router scores: softmax (Mixtral) or sigmoid (DeepSeek-V3; gate weights renormalised over the chosen)"),
    POS(model, moe_n_group, "1", "group-limited routing: experts in this many groups (DeepSeek-V3 n_group)"),
    POS(model, moe_topk_group, "1", "group-limited routing: tokens pick experts only from their best topk_group groups (group score: sum of its top 2 scores)"),
    DBL(model, moe_routed_scaling, "1", 0, INF, GT0, "routed experts' gate weights x this (DeepSeek-V3 routed_scaling_factor)"),
    DBL(model, moe_bias_update_rate, "0", 0, INF, 0, "aux-loss-free balancing: after each optimizer step each expert bias moves by this toward the mean load; 0 = no bias"),
    DBL(model, moe_seq_aux_loss_coef, "0", 0, INF, 0, "DeepSeek-V3 sequence-wise balance loss weight (e.g. 1e-4)"),
    NONNEG(model, moe_shared_experts, "0", "shared experts every token goes through (one SwiGLU of n x moe_intermediate_size)"),
    NONNEG(model, first_k_dense, "0", "the first k layers are dense with intermediate_size; MoE layers follow"),
    NONNEG(model, mtp_depth, "0", "deepseek_v3: multi-token prediction modules (each predicts one more token ahead)"),
    DBL(model, mtp_loss_weight, "0.1", 0, INF, 0, "weight of the MTP loss (mean over the depths) added to the main loss"),

    POS(parallel, tp, "1", "tensor parallel size"),
    POS(parallel, pp, "1", "pipeline parallel size"),
    POS(parallel, ep, "1", "expert parallel size (MoE models only): each MoE layer's experts are split over ep ranks drawn from the tp x cp x dp ranks of a pipeline stage (etp fastest, then ep), so ep must divide tp*cp*dp / etp"),
    POS(parallel, etp, "1", "expert tensor parallel size, as Megatron's: 1 = each routed expert whole on its EP rank, not replicated over TP; etp > 1 splits each expert's FFN width over etp ranks (drawn with ep from the tp x cp x dp ranks of a pipeline stage, etp fastest), which gather each other's tokens before the experts and sum the partial outputs after"),
    POS(parallel, cp, "1", "context parallel size: each sequence is cut into 2*cp chunks, cp rank r holds chunks r and 2*cp-1-r, and attention passes keys and values around the cp ranks (a ring)"),
    POS(parallel, vpp, "1", "virtual pipeline stages per rank (interleaved 1F1B)"),
    ENUM(parallel, schedule, "auto", "auto|1f1b|interleaved|zb-h1|zbv|dualpipev", "pipeline schedule: auto = interleaved when vpp > 1, else 1f1b; zb-h1 = zero bubble's ZB-H1 (vpp 1): each backward computes the input gradient first and its weight gradients later, filling the cool-down's bubbles (about a third of 1f1b's idle time when forward, input and weight gradients cost alike), at most pp micro batches in flight on every stage; zbv = zero bubble's ZB-V (vpp 2): two chunks per rank in a V (rank 0 holds the first and the last), backwards split as in zb-h1, at most pp micro batches in flight on every rank (about a sixth of 1f1b's idle time when they cost alike); its sends do not wait for their receives, which MPI gives (CPU ranks, or GPU ranks with parallel.comm mpi) and NCCL does not yet; dualpipev = DeepSeek's DualPipeV (vpp 2, at least 2 x pp micro batches): zbv's V in DualPipe's published order, whose steady forward&backward pairs of two micro batches run interleaved so that one's MoE all-to-alls overlap the other's compute; as little idle time as zbv, up to 2 x pp micro batches in flight on rank 0, sends as zbv's"),
    BOOL(parallel, sequence_parallel, "false", "shard norm/dropout activations over TP ranks"),
    NONNEG(parallel, first_stage_layers, "0", "layers on pipeline stage 0 (it also holds the embedding); 0 = even split"),
    NONNEG(parallel, last_stage_layers, "0", "layers on the last pipeline stage (it also holds the head); 0 = even split"),
    ENUM(parallel, comm, "auto", "auto|nccl|mpi", "how ranks communicate: auto = NCCL between GPU ranks (one GPU each) when libnccl.so.2 loads, else MPI; nccl insists (exit 2 if it cannot); mpi = MPI, GPU tensors staged through host memory"),
    BOOL(parallel, overlap_grad_reduce, "true", "reduce data-parallel gradient buckets (under ZeRO-1: onto the rank owning each part) while backward goes on with the layers below; false = everything after backward"),
    BOOL(parallel, overlap_param_gather, "true", "under ZeRO-1: gather each layer's updated parameters while the next forward runs the layers before it; false = everything right after AdamW"),
    DBL(parallel, grad_bucket_mb, "0", 0, 1048576, 0, "overlap bucket size: consecutive layers' gradients are reduced together once they reach this many MiB; 0 = one bucket per layer"),

    POS(train, seq_len, "128", "tokens per training sequence"),
    POS(train, micro_batch, "4", "sequences per micro batch per data-parallel rank"),
    POS(train, global_batch, "4", "sequences per optimizer step over all ranks"),
    POS(train, steps, "100", "optimizer steps to train"),
    U64(train, seed, "1234", "seed of init and data order"),
    NONNEG(train, eval_interval, "0", "validate every N steps; 0 disables validation"),
    POS(train, eval_batches, "4", "global batches per validation"),
    ENUM(train, device, "auto", "auto|cpu|cuda", "compute backend; auto = cuda when a GPU is visible (each rank takes the GPU of its node-local rank)"),
    ENUM(train, precision, "fp32", "fp32|bf16|fp8", "fp32; or bf16 mixed precision: bf16 activations and working weights, fp32 GEMM accumulation, fp32 master weights, gradients and AdamW state (checkpoints unchanged); or fp8: bf16, and the blocks' linear layers multiply in FP8 (e4m3 weights, activations and gradients; train.fp8_grad_format); on CUDA: cuBLASLt bf16 and FP8 GEMMs and flash attention, run on an H200"),
    ENUM(train, fp8_scaling, "tensor", "tensor|block|delayed", "fp8: one power-of-two scale per tensor from its current amax (tensor), or per 1 x 128 activation / 128 x 128 weight block (block, DeepSeek-V3's recipe), or per tensor from the largest amax of its last train.fp8_amax_history steps (delayed; the history is kept in checkpoints)"),
    INT(train, fp8_amax_history, "16", 1, 1024, "fp8 delayed scaling: steps of amax history per tensor (its largest amax sets the scale)"),
    ENUM(train, fp8_grad_format, "e4m3", "e4m3|e5m2", "fp8: the output gradients' format: e4m3 (3 mantissa bits; measured 1% of bf16's loss where e5m2 was 4.8% off with per-tensor scaling) or e5m2 (2 mantissa bits, more range)"),
    NONNEG(train, fp8_skip_layers, "1", "fp8: this many blocks at each end of the stack (and the embedding, head, routers and MTP modules always) stay bf16"),
    BOOL(train, tf32, "false", "CUDA: TF32 tensor cores for fp32 matmuls (faster; ~1e-3 relative rounding)"),
    BOOL(train, deterministic, "true",
         "CUDA: runs repeat bitwise; false lets cuDNN's attention backward add dQ by atomics (faster, not bitwise repeatable; docs/model.md)"),
    DBL(train, peak_tflops, "0", 0, INF, 0, "peak TFLOP/s per device for MFU; 0 = the GPU's datasheet peak if known, else no MFU"),
    INT(train, threads, "0", 0, 4096, "CPU threads; 0 = OpenMP default"),
    ENUM(train, recompute, "none", "none|selective|full", "activation recompute: none; selective (attention core and SwiGLU products recomputed in backward); full (only each layer's input kept, the layer re-run)"),
    DBL(train, device_memory_gib, "0", 0, INF, 0, "memory of one device in GiB (80 for an H100 80GB); the dry run says whether each rank fits; 0 = unknown"),
    DBL(train, hang_timeout_s, "0", 0, INF, 0, "watchdog: a step or collective waiting longer than this many seconds ends the job (exit 1); 0 = automatic (10 x the slowest of the first steps, at least 300 s)"),
    DBL(train, abort_timeout_s, "30", 1, INF, 0, "a rank that fails (an error, an NCCL asynchronous error, the hang timeout) names itself and ends the job: it aborts its NCCL communicators and calls MPI_Abort, and exits by itself if that takes longer than this many seconds"),

    ENUM(optimizer, type, "adamw", "adamw", "optimizer"),
    DBL(optimizer, lr, "3e-4", 0, INF, GT0, "peak learning rate"),
    DBL(optimizer, min_lr, "3e-5", 0, INF, 0, "learning rate at the end of the decay"),
    DBL(optimizer, beta1, "0.9", 0, 1, LT1, "AdamW beta1"),
    DBL(optimizer, beta2, "0.95", 0, 1, LT1, "AdamW beta2"),
    DBL(optimizer, eps, "1e-8", 0, INF, GT0, "AdamW epsilon"),
    DBL(optimizer, weight_decay, "0.1", 0, INF, 0, "decoupled weight decay (matrices only)"),
    DBL(optimizer, grad_clip, "1.0", 0, INF, 0, "clip the global gradient norm to this; 0 disables"),
    ENUM(optimizer, schedule, "cosine", "cosine|linear|constant|wsd", "learning rate schedule after warmup"),
    NONNEG(optimizer, warmup_steps, "0", "linear warmup steps from 0 to lr"),
    NONNEG(optimizer, decay_steps, "0", "step where decay reaches min_lr; 0 = train.steps"),
    NONNEG(optimizer, wsd_decay_steps, "0", "wsd: length of the final decay to min_lr"),
    BOOL(optimizer, distributed, "false", "shard optimizer state over data-parallel ranks (ZeRO-1)"),

    STR(data, path, "", "dataset directory from mtrain data build (required)"),
    DBL(data, valid_fraction, "0", 0, 1, LT1, "fraction of documents held out for validation"),
    BLEND(data, blend, "datasets mixed by weight: [{path: DIR, weight: W}, ...]; replaces data.path"),
    INT(data, sampler_version, "2", 1, 2, "sample order: 2 = keyed Feistel permutation (O(1) memory); 1 = Fisher-Yates tables of mtrain before 2026-11-22 (to resume their checkpoints)"),

    STR(checkpoint, dir, "", "checkpoint directory; empty = no checkpoints"),
    NONNEG(checkpoint, interval, "0", "save every N steps; 0 = never"),
    NONNEG(checkpoint, keep_last, "2", "checkpoints kept on disk; 0 = keep all"),
    BOOL(checkpoint, async, "false", "write checkpoints in a background thread"),

    BOOL(rewind, enabled, "false", "roll back to the last checkpoint on NaN/Inf or a loss/grad-norm spike"),
    POS(rewind, window, "20", "steps of loss history before spikes are judged (EMA span)"),
    DBL(rewind, spike_factor, "3", 1, INF, GT0, "a loss above this x its running average is a spike"),
    DBL(rewind, grad_spike_factor, "20", 1, INF, GT0, "a grad norm above this x its running average is a spike"),
    NONNEG(rewind, skip_margin, "5", "global batches skipped past the bad step, besides the window"),
    POS(rewind, max_rewinds, "3", "rewinds in a row (no checkpoint in between) before exiting with code 1"),
    DBL(rewind, lr_scale, "1", 0, 1, GT0, "multiply the LR by this after a rewind"),
    NONNEG(rewind, lr_scale_steps, "0", "steps the reduced LR lasts after a rewind"),

    STR(log, dir, "runs/latest", "run directory for metrics.jsonl"),
    POS(log, interval, "1", "print a console line every N steps"),
    BOOL(log, tensorboard, "false", "also write TensorBoard event files (LOG_DIR/events.out.tfevents.*): the scalars of metrics.jsonl"),
};

const int recipe_nkeys = sizeof recipe_keys / sizeof recipe_keys[0];
_Static_assert(sizeof recipe_keys / sizeof recipe_keys[0] <= RECIPE_MAX_KEYS, "raise RECIPE_MAX_KEYS");

static const char *const type_names[] = {"int", "uint64", "double", "bool", "string", "enum", "list"};

int recipe_key_index(const char *name) {
    for (int i = 0; i < recipe_nkeys; i++)
        if (!strcmp(recipe_keys[i].name, name)) return i;
    return -1;
}

/* ---- parsing one value ---- */

/* "[0, 1)", ">= 1", "> 0": the range as users read it in messages and docs. */
static void range_text(const struct recipe_key *k, char *out, size_t n) {
    const char *lo = k->flags & KEY_MIN_EXCL ? "(" : "[";
    const char *hi = k->flags & KEY_MAX_EXCL ? ")" : "]";
    int unbounded = k->max == INF || (k->type == KEY_INT && k->max == INT_MAX);
    if (k->type == KEY_UINT64) snprintf(out, n, ">= 0");
    else if (unbounded) snprintf(out, n, "%s %.6g", k->flags & KEY_MIN_EXCL ? ">" : ">=", k->min);
    else snprintf(out, n, "%s%.6g, %.6g%s", lo, k->min, k->max, hi);
}

static int in_range(const struct recipe_key *k, double v) {
    if (k->flags & KEY_MIN_EXCL ? v <= k->min : v < k->min) return 0;
    if (k->flags & KEY_MAX_EXCL ? v >= k->max : v > k->max) return 0;
    return 1;
}

static int range_error(const struct recipe_key *k, const char *text, char *err, size_t n) {
    char range[64];
    range_text(k, range, sizeof range);
    const char *in = range[0] == '[' || range[0] == '(' ? "in " : "";
    snprintf(err, n, "value %s out of range: must be %s%s", text, in, range);
    return -1;
}

static int parse_int(const struct recipe_key *k, void *field, const char *text, char *err, size_t n) {
    /* model.vocab_size: auto is resolved from the dataset by mtrain pretrain */
    if (!strcmp(text, "auto") && !strcmp(k->name, "model.vocab_size")) return *(int *)field = RECIPE_VOCAB_AUTO, 0;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || isspace((unsigned char)*text)) {
        snprintf(err, n, "expected an integer, got '%s'", text);
        return -1;
    }
    if (errno == ERANGE || v > INT_MAX || v < INT_MIN) {
        snprintf(err, n, "value %s out of range: too large for an integer field", text);
        return -1;
    }
    if (!in_range(k, (double)v)) return range_error(k, text, err, n);
    *(int *)field = (int)v;
    return 0;
}

static int parse_uint64(void *field, const char *text, char *err, size_t n) {
    char *end;
    errno = 0;
    /* strtoull silently negates "-1", so a sign is rejected up front */
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end || !isdigit((unsigned char)*text)) {
        snprintf(err, n, "expected a non-negative integer, got '%s'", text);
        return -1;
    }
    if (errno == ERANGE) {
        snprintf(err, n, "value %s out of range: must be < 2^64", text);
        return -1;
    }
    *(unsigned long long *)field = v;
    return 0;
}

static int parse_double(const struct recipe_key *k, void *field, const char *text, char *err, size_t n) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || isspace((unsigned char)*text) || !isfinite(v)) {
        snprintf(err, n, "expected a number, got '%s'", text);
        return -1;
    }
    if (!in_range(k, v)) return range_error(k, text, err, n);
    *(double *)field = v;
    return 0;
}

/* YAML 1.1 booleans, which is what libyaml users expect. */
static int parse_bool(void *field, const char *text, char *err, size_t n) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (!strcasecmp(text, yes[i])) return *(int *)field = 1, 0;
        if (!strcasecmp(text, no[i])) return *(int *)field = 0, 0;
    }
    snprintf(err, n, "expected true/false, got '%s'", text);
    return -1;
}

static int enum_allows(const char *choices, const char *text) {
    size_t len = strlen(text);
    for (const char *c = choices; *c;) {
        size_t w = strcspn(c, "|");
        if (w == len && !strncmp(c, text, len)) return 1;
        c += w + (c[w] == '|');
    }
    return 0;
}

/* well-formed UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF): libyaml checks recipe files, but --set values come from the
 * command line, and the recipe is stored in JSON (checkpoint manifests) */
static int utf8_valid(const unsigned char *s) {
    while (*s) {
        unsigned c = *s++;
        int more = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (more < 0) return 0;
        unsigned cp = more == 0 ? c : c & (0x3f >> more);
        for (int i = 0; i < more; i++, s++) {
            if ((*s & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (*s & 0x3f);
        }
        static const unsigned least[] = {0, 0x80, 0x800, 0x10000};
        if (cp < least[more] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    }
    return 1;
}

static int parse_string(const struct recipe_key *k, void *field, const char *text, int quoted, char *err,
                        size_t n) {
    /* an unquoted ~ or null is YAML's null: treat it as "not set" */
    if (!quoted && (!strcmp(text, "~") || !strcmp(text, "null"))) text = "";
    size_t len = strlen(text);
    if (k->type == KEY_ENUM && !enum_allows(k->choices, text)) {
        char list[256];
        size_t o = 0;
        for (const char *c = k->choices; *c && o + 3 < sizeof list; c++) {
            if (*c == '|') list[o++] = ',', list[o++] = ' ';
            else list[o++] = *c;
        }
        list[o] = 0;
        snprintf(err, n, "value '%s' not allowed: expected one of %s", text, list);
        return -1;
    }
    if (len >= k->size) {
        snprintf(err, n, "string too long (%zu characters, at most %zu)", len, k->size - 1);
        return -1;
    }
    /* zero the whole buffer so equal recipes compare equal byte for byte */
    memset(field, 0, k->size);
    memcpy(field, text, len);
    return 0;
}

int recipe_blend_append(struct data_blend *b, const char *path, double weight, char *err, size_t errsz) {
    if (b->n == RECIPE_MAX_BLEND) {
        snprintf(err, errsz, "at most %d datasets", RECIPE_MAX_BLEND);
        return -1;
    }
    if (!*path || strlen(path) >= sizeof b->e[0].path) {
        snprintf(err, errsz, "entry %d: path must be 1 to %zu characters", b->n, sizeof b->e[0].path - 1);
        return -1;
    }
    if (!(weight > 0) || !isfinite(weight)) {
        snprintf(err, errsz, "entry %d (%s): weight %g must be a positive number", b->n, path, weight);
        return -1;
    }
    memset(b->e[b->n].path, 0, sizeof b->e[b->n].path);
    memcpy(b->e[b->n].path, path, strlen(path));
    b->e[b->n++].weight = weight;
    return 0;
}

/* --set form: "PATH:WEIGHT,PATH:WEIGHT" (empty: no blend). */
static int parse_blend(void *field, const char *text, char *err, size_t n) {
    struct data_blend *b = field;
    memset(b, 0, sizeof *b);
    char *copy = xstrdup(text), *save = NULL;
    int rc = 0;
    for (char *item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(item, ':'), *end;
        double w = colon ? strtod(colon + 1, &end) : 0;
        if (!colon || end == colon + 1 || *end) {
            snprintf(err, n, "expected PATH:WEIGHT[,PATH:WEIGHT...], got '%s'", item);
            rc = -1;
            break;
        }
        *colon = 0;
        rc = recipe_blend_append(b, item, w, err, n);
    }
    free(copy);
    return rc;
}

int recipe_key_assign(const struct recipe_key *k, struct recipe *r, const char *text, int quoted, char *err,
                      size_t errsz) {
    void *field = (char *)r + k->offset;
    if (!utf8_valid((const unsigned char *)text)) { /* every kind of value: the recipe is stored as JSON */
        snprintf(err, errsz, "value is not valid UTF-8 (recipes are stored as JSON in checkpoints)");
        return -1;
    }
    switch (k->type) {
    case KEY_INT: return parse_int(k, field, text, err, errsz);
    case KEY_UINT64: return parse_uint64(field, text, err, errsz);
    case KEY_DOUBLE: return parse_double(k, field, text, err, errsz);
    case KEY_BOOL: return parse_bool(field, text, err, errsz);
    case KEY_STRING:
    case KEY_ENUM: return parse_string(k, field, text, quoted, err, errsz);
    case KEY_BLEND: return parse_blend(field, text, err, errsz);
    }
    return -1;
}

void recipe_defaults(struct recipe *r) {
    char err[256];
    memset(r, 0, sizeof *r);
    for (int i = 0; i < recipe_nkeys; i++)
        if (recipe_key_assign(&recipe_keys[i], r, recipe_keys[i].def, 1, err, sizeof err) != 0)
            die("recipe schema: bad default for %s: %s", recipe_keys[i].name, err);
}

/* ---- did you mean ---- */

static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static int close_enough(const char *word, int d) {
    int limit = ((int)strlen(word) + 2) / 3;
    return d <= (limit < 1 ? 1 : limit);
}

static void suggest_section(const char *section, char *out, size_t n) {
    int best = 99;
    for (int i = 0; recipe_sections[i]; i++) {
        int d = edit_distance(section, recipe_sections[i]);
        if (d < best && close_enough(section, d)) {
            best = d;
            snprintf(out, n, " (did you mean '%s'?)", recipe_sections[i]);
        }
    }
}

void recipe_suggest(const char *section, const char *key, char *out, size_t n) {
    out[0] = 0;
    if (!key) return suggest_section(section, out, n);
    size_t slen = strlen(section);
    int best = 99;
    for (int i = 0; i < recipe_nkeys; i++) {
        const char *name = recipe_keys[i].name, *field = strchr(name, '.') + 1;
        int same = !strncmp(name, section, slen) && name[slen] == '.';
        /* same section: nearest spelling; other sections: the exact key name
         * (lr under train means optimizer.lr) */
        int d = same ? edit_distance(key, field) : (strcmp(key, field) ? 99 : 1);
        if (d < best && close_enough(key, d)) {
            best = d;
            snprintf(out, n, " (did you mean '%s'?)", name);
        }
    }
}

void recipe_where(const struct recipe *r, int key, char *out, size_t n) {
    const struct recipe_mark *m = &r->marks[key];
    const char *src = r->source[0] ? r->source : "recipe";
    if (m->line == RECIPE_MARK_SET) snprintf(out, n, "--set");
    else if (m->line > 0) snprintf(out, n, "%s:%d:%d", src, m->line, m->col);
    else snprintf(out, n, "%s", src);
}

/* ---- printing ---- */

/* Shortest text that reads back as the same double, so print -> load is exact. */
static void format_double(double v, char *out, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v) return;
    }
}

static void print_quoted(const char *s, FILE *out) {
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
    }
    fputc('"', out);
}

static void print_value(const struct recipe_key *k, const struct recipe *r, FILE *out) {
    const void *field = (const char *)r + k->offset;
    char buf[64];
    switch (k->type) {
    case KEY_INT:
        if (*(const int *)field == RECIPE_VOCAB_AUTO && !strcmp(k->name, "model.vocab_size")) fputs("auto", out);
        else fprintf(out, "%d", *(const int *)field);
        break;
    case KEY_UINT64: fprintf(out, "%llu", *(const unsigned long long *)field); break;
    case KEY_DOUBLE: format_double(*(const double *)field, buf, sizeof buf), fputs(buf, out); break;
    case KEY_BOOL: fputs(*(const int *)field ? "true" : "false", out); break;
    case KEY_ENUM: fputs(field, out); break;
    case KEY_STRING: print_quoted(field, out); break;
    case KEY_BLEND: {
        const struct data_blend *b = field;
        fputc('[', out);
        for (int i = 0; i < b->n; i++) {
            format_double(b->e[i].weight, buf, sizeof buf);
            fprintf(out, "%s{path: ", i ? ", " : "");
            print_quoted(b->e[i].path, out);
            fprintf(out, ", weight: %s}", buf);
        }
        fputc(']', out);
        break;
    }
    }
}

static int in_section(const struct recipe_key *k, const char *section) {
    size_t n = strlen(section);
    return !strncmp(k->name, section, n) && k->name[n] == '.';
}

void recipe_print(const struct recipe *r, FILE *out) {
    for (int s = 0; recipe_sections[s]; s++) {
        fprintf(out, "%s%s:\n", s ? "\n" : "", recipe_sections[s]);
        for (int i = 0; i < recipe_nkeys; i++) {
            const struct recipe_key *k = &recipe_keys[i];
            if (!in_section(k, recipe_sections[s])) continue;
            fprintf(out, "  %s: ", strchr(k->name, '.') + 1);
            print_value(k, r, out);
            fputc('\n', out);
        }
    }
}

static void print_schema_key(const struct recipe_key *k, FILE *out) {
    char range[64] = "", def[64];
    if (k->type == KEY_ENUM) snprintf(range, sizeof range, "%s", k->choices);
    else if (k->type == KEY_BLEND) snprintf(range, sizeof range, "1..%d entries", RECIPE_MAX_BLEND);
    else if (k->type != KEY_STRING && k->type != KEY_BOOL) range_text(k, range, sizeof range);
    if (k->type == KEY_STRING) snprintf(def, sizeof def, "\"%s\"", k->def);
    else if (k->type == KEY_BLEND) snprintf(def, sizeof def, "[]");
    else snprintf(def, sizeof def, "%s", k->def);
    fprintf(out, "  %-30s %-7s %-13s %-26s %s\n", k->name, type_names[k->type], def, range, k->doc);
}

void recipe_print_schema(FILE *out) {
    fprintf(out, "  %-30s %-7s %-13s %-26s %s\n", "KEY", "TYPE", "DEFAULT", "RANGE", "MEANING");
    for (int s = 0; recipe_sections[s]; s++) {
        fprintf(out, "%s:\n", recipe_sections[s]);
        for (int i = 0; i < recipe_nkeys; i++)
            if (in_section(&recipe_keys[i], recipe_sections[s])) print_schema_key(&recipe_keys[i], out);
    }
}
