/* The recipe: every setting of a run, loaded from YAML, overridden by --set,
 * validated before anything is allocated. The schema table in recipe_schema.c
 * is the one place where keys, types, defaults, ranges and docs live. */
#pragma once
#include <stddef.h>
#include <stdio.h>

#define RECIPE_PATH_MAX 1024
#define RECIPE_STR_MAX 32
/* Upper bound on schema keys; recipe_schema.c checks it at compile time. */
#define RECIPE_MAX_KEYS 192

/* model.vocab_size: auto, until mtrain pretrain reads the dataset's tokenizer record */
#define RECIPE_VOCAB_AUTO 0
/* entries of the parameter table: 4x those of the largest published MoE models (Kimi K2 ~70k), a 48 MiB table;
 * at 2^20 a dry run built several 180 MiB tables */
#define MODEL_MAX_TENSORS (1ll << 18)

struct model_config {
    char arch[RECIPE_STR_MAX];      /* "llama" (dense) | "mixtral" (MoE) | "deepseek_v3" (MLA, MoE, MTP): names the HF export */
    int vocab_size;
    int hidden_size;
    int num_layers;
    int num_heads;
    int num_kv_heads;
    int intermediate_size;
    int max_seq_len;                /* max position for RoPE tables */
    double rope_theta;
    /* Llama 3.1 frequency scaling; factor 0 disables it. */
    double rope_scaling_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int rope_original_max_pos;
    double norm_eps;
    int tie_embeddings;             /* bool */
    double init_std;
    char init_from[RECIPE_PATH_MAX];/* optional safetensors file with HF names */
    /* Mixture of experts (model/moe.h): num_experts 0 = every layer dense. */
    int num_experts;
    int experts_per_token;          /* top-k */
    int moe_intermediate_size;      /* each expert's SwiGLU size; 0 = intermediate_size */
    int moe_layer_freq;             /* layer l is MoE when l % freq == 0 */
    double moe_aux_loss_coef;       /* load-balancing loss weight (Switch / Mixtral form) */
    double moe_z_loss_coef;         /* router z-loss weight */
    double moe_capacity_factor;     /* 0 = dropless; else capacity per expert and sequence = ceil(f * seq_len * k / experts) */
    double moe_rows_headroom;       /* ep > 1: expert buffers sized for this x the mean rows a rank receives, grown on demand */
    /* DeepSeek-V3 (arch deepseek_v3): multi-head latent attention (MLA) */
    int q_lora_rank;                /* query compression rank; 0 = a full-rank q_proj */
    int kv_lora_rank;               /* joint key/value compression rank */
    int qk_nope_head_dim;           /* per-head query/key part without position */
    int qk_rope_head_dim;           /* per-head rotary part (its key is shared by all heads) */
    int v_head_dim;                 /* per-head value size */
    char rope_scaling_type[RECIPE_STR_MAX]; /* llama3 | yarn (when rope_scaling_factor > 0) */
    double yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    /* DeepSeek MoE routing */
    char moe_score_func[RECIPE_STR_MAX]; /* softmax (Mixtral) | sigmoid (DeepSeek-V3) */
    int moe_n_group, moe_topk_group;     /* group-limited routing: keep the best topk_group of n_group groups */
    double moe_routed_scaling;      /* gate weights x this (after normalising over the chosen experts) */
    double moe_bias_update_rate;    /* aux-loss-free balancing: expert bias step per optimizer step; 0 = no bias */
    double moe_seq_aux_loss_coef;   /* DeepSeek-V3 sequence-wise balance loss weight */
    int moe_shared_experts;         /* shared experts added to every token (one SwiGLU of n x moe_intermediate_size) */
    int first_k_dense;              /* the first k layers are dense (intermediate_size) */
    int mtp_depth;                  /* multi-token prediction modules */
    double mtp_loss_weight;         /* weight of the mean MTP loss */
};

struct parallel_config {
    int tp, pp, ep, cp, vpp;
    int etp;                        /* expert tensor parallel size (parallel/grid.h); 1 = experts whole */
    int sequence_parallel;          /* bool */
    int first_stage_layers;         /* layers of pipeline stage 0; 0 = an even split */
    int last_stage_layers;          /* layers of the last stage; 0 = an even split */
    int overlap_grad_reduce;        /* bool: data-parallel gradient buckets reduce during backward */
    int overlap_param_gather;       /* bool: ZeRO-1 gathers each layer's parameters during the next forward */
    char comm[RECIPE_STR_MAX];      /* auto | nccl | mpi: how GPU ranks communicate */
    char schedule[RECIPE_STR_MAX];  /* auto | 1f1b | interleaved | zb-h1 | zbv | dualpipev: the pipeline schedule (parallel/schedule.h) */
    double grad_bucket_mb;          /* a bucket closes at this many MiB of gradients; 0 = one per layer */
};

struct train_config {
    int seq_len;
    int micro_batch;                /* sequences per micro batch per rank */
    int global_batch;               /* sequences per optimizer step, all ranks */
    int steps;
    unsigned long long seed;
    int eval_interval;              /* 0 disables validation */
    int eval_batches;
    char device[RECIPE_STR_MAX];    /* auto | cpu | cuda */
    char precision[RECIPE_STR_MAX]; /* fp32 | bf16 | fp8: how the step computes (master weights stay fp32) */
    char fp8_scaling[RECIPE_STR_MAX]; /* tensor | block | delayed */
    int fp8_amax_history;             /* delayed: steps of amax history */
    char fp8_grad_format[RECIPE_STR_MAX]; /* e4m3 | e5m2: output gradients' format */
    int fp8_skip_layers;              /* blocks at each end kept bf16 under fp8 */
    double peak_tflops;             /* per device, for MFU */
    int tf32;                       /* bool: CUDA matmuls on TF32 tensor cores */
    int deterministic;              /* bool: CUDA attention backward repeats bitwise (cuDNN's deterministic algorithm) */
    int threads;                    /* 0: OMP default */
    char recompute[RECIPE_STR_MAX]; /* none | selective | full: activations recomputed in backward */
    double hang_timeout_s;          /* watchdog: a step or collective longer than this ends the job; 0 = automatic */
    double abort_timeout_s;         /* a failed rank's abort (NCCL communicators, MPI_Abort) gets this long */
    double device_memory_gib;       /* memory of one device, for the dry run's fit verdict; 0 = unknown */
};

struct optimizer_config {
    char type[RECIPE_STR_MAX];      /* adamw */
    double lr, min_lr;
    double beta1, beta2, eps;
    double weight_decay;
    double grad_clip;               /* 0 disables clipping */
    char schedule[RECIPE_STR_MAX];  /* cosine | linear | constant | wsd */
    int warmup_steps;
    int decay_steps;                /* 0: train.steps */
    int wsd_decay_steps;            /* length of the final decay in wsd */
    int distributed;                /* bool: ZeRO-1 over DP */
};

#define RECIPE_MAX_BLEND 16
/* data.blend: datasets mixed by weight (data/blend.h); n == 0 uses data.path */
struct data_blend {
    int n;
    struct {
        char path[RECIPE_PATH_MAX];
        double weight;
    } e[RECIPE_MAX_BLEND];
};

struct data_config {
    char path[RECIPE_PATH_MAX];     /* dataset directory */
    double valid_fraction;          /* fraction of documents held out */
    int sampler_version;            /* 2: O(1)-memory Feistel permutation; 1: Fisher-Yates tables (old checkpoints) */
    struct data_blend blend;
};

struct checkpoint_config {
    char dir[RECIPE_PATH_MAX];      /* empty: no checkpoints */
    int interval;
    int keep_last;
    int async;                      /* bool */
};

/* Rewind-on-failure: watch each step, roll back to the last checkpoint and
 * skip the offending data when the loss or grad norm goes bad. */
struct rewind_config {
    int enabled;                    /* bool */
    int window;                     /* steps of history before spikes are judged */
    double spike_factor;            /* loss > factor x EMA(loss) is a spike */
    double grad_spike_factor;       /* grad norm > factor x EMA(grad norm) is a spike */
    int skip_margin;                /* extra global batches skipped past the bad step */
    int max_rewinds;                /* consecutive rewinds before giving up (exit 1) */
    double lr_scale;                /* LR multiplier after a rewind */
    int lr_scale_steps;             /* steps the multiplier lasts */
};

struct log_config {
    char dir[RECIPE_PATH_MAX];      /* run directory for metrics.jsonl */
    int interval;                   /* print every N steps */
    int tensorboard;                /* bool: also write TensorBoard event files into dir */
};

/* Where a key got its value, for messages: line/col are 1-based in
 * recipe.source; line 0 means the default, RECIPE_MARK_SET means --set. */
#define RECIPE_MARK_SET (-1)
struct recipe_mark {
    int line, col;
};

struct recipe {
    struct model_config model;
    struct parallel_config parallel;
    struct train_config train;
    struct optimizer_config optimizer;
    struct data_config data;
    struct checkpoint_config checkpoint;
    struct rewind_config rewind;
    struct log_config log;
    char source[RECIPE_PATH_MAX];   /* file it came from, for messages */
    struct recipe_mark marks[RECIPE_MAX_KEYS]; /* by schema index; config/ only */
};

/* Fill every field with its documented default. */
void recipe_defaults(struct recipe *r);

/* Load a YAML recipe on top of the defaults. On error prints
 * "FILE:LINE:COL: key 'a.b': message" and returns -1. */
int recipe_load(struct recipe *r, const char *path);

/* Apply one "section.key=value" override with the same type and range checks.
 * Returns -1 with a message naming the override on error. */
int recipe_set(struct recipe *r, const char *assignment);

/* Cross-field checks (heads divide hidden, batch divisible, data path ...).
 * world_size is the number of ranks (1 for a single process; 0 when not
 * known, e.g. a dry run away from the cluster: the checks that need it are
 * skipped). Messages name the key and, when it came from the file, its line.
 * Prints the first problem only and returns -1. */
int recipe_validate(const struct recipe *r, int world_size);
/* The same checks except that paths exist (data.path, data.blend,
 * model.init_from): a dry run plans away from the data. */
int recipe_validate_plan(const struct recipe *r, int world_size);

/* quiet = 1: the checks above print nothing (mtrain plan tries many layouts); 0 again after. */
void recipe_validate_quiet(int quiet);

/* Print the resolved recipe as YAML (used by --dry-run and checkpoints). */
void recipe_print(const struct recipe *r, FILE *out);

/* Print every key with type, default and meaning (mtrain help recipe). */
void recipe_print_schema(FILE *out);
/* The parameter table's size (MODEL_MAX_TENSORS entries at most) for m:
 * 0, or -1 with the recipe key at fault in *key and the reason in why
 * (recipe_validate; a Hugging Face config.json's model). */
int model_check_tensor_count(const struct model_config *m, const char **key, char *why, size_t n);
