/* Resolving and loading a model for inference (see model_source.h). Shards
 * of any layout are read through the checkpoint reader (checkpoint.h), which
 * assembles each whole tensor; weights files through weights_load. */
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "cli/model_source.h"
#include "config/common.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists_in(const char *dir, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", dir, name);
    return path_exists(out);
}

/* ---- Hugging Face config.json ---- */

static int get_int(json_t *c, const char *key, int def, int *out, const char *path, char *err, size_t errlen) {
    json_t *v = json_object_get(c, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return snprintf(err, errlen, "%s: key \"%s\" is missing", path, key), -1;
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return snprintf(err, errlen, "%s: \"%s\" must be a positive integer", path, key), -1;
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_num(json_t *c, const char *key, double def, double *out, const char *path, char *err, size_t errlen) {
    json_t *v = json_object_get(c, key);
    if (!v || json_is_null(v)) return *out = def, 0;
    if (!json_is_number(v) || json_number_value(v) <= 0)
        return snprintf(err, errlen, "%s: \"%s\" must be a positive number", path, key), -1;
    *out = json_number_value(v);
    return 0;
}

/* A key that must be absent, null or false (a feature mtrain's blocks lack). */
static int must_be_off(json_t *c, const char *key, const char *path, char *err, size_t errlen) {
    json_t *v = json_object_get(c, key);
    if (v && !json_is_null(v) && !json_is_false(v))
        return snprintf(err, errlen, "%s: \"%s\" is set; mtrain's Llama/Mixtral blocks do not have it", path, key), -1;
    return 0;
}

/* A string key that, when present, must equal want. */
static int must_be(json_t *c, const char *key, const char *want, const char *path, char *err, size_t errlen) {
    json_t *v = json_object_get(c, key);
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), want)))
        return snprintf(err, errlen, "%s: \"%s\" must be \"%s\" (what mtrain's DeepSeek-V3 does)", path, key, want), -1;
    return 0;
}

/* A non-negative integer key; null or absent gives def. */
static int get_count(json_t *c, const char *key, int def, int *out, const char *path, char *err, size_t errlen) {
    json_t *v = json_object_get(c, key);
    if (!v || json_is_null(v)) return *out = def, 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
        return snprintf(err, errlen, "%s: \"%s\" must be a non-negative integer", path, key), -1;
    *out = (int)json_integer_value(v);
    return 0;
}

/* The keys every family's config.json has (transformers' defaults where
 * they may be absent; each family's own defaults for positions and eps). */
static int common_keys(json_t *c, const char *path, struct model_config *cfg, int max_pos, double eps, char *err,
                       size_t errlen) {
    return get_int(c, "vocab_size", -1, &cfg->vocab_size, path, err, errlen) ||
           get_int(c, "hidden_size", -1, &cfg->hidden_size, path, err, errlen) ||
           get_int(c, "intermediate_size", -1, &cfg->intermediate_size, path, err, errlen) ||
           get_int(c, "num_hidden_layers", -1, &cfg->num_layers, path, err, errlen) ||
           get_int(c, "num_attention_heads", -1, &cfg->num_heads, path, err, errlen) ||
           get_int(c, "num_key_value_heads", cfg->num_heads, &cfg->num_kv_heads, path, err, errlen) ||
           get_int(c, "max_position_embeddings", max_pos, &cfg->max_seq_len, path, err, errlen) ||
           get_num(c, "rope_theta", 10000, &cfg->rope_theta, path, err, errlen) ||
           get_num(c, "rms_norm_eps", eps, &cfg->norm_eps, path, err, errlen)
               ? -1 : 0;
}

/* transformers' DeepseekV3Config (and DeepSeek's hub config keys) into cfg:
 * MLA, YaRN, sigmoid group-limited routing with the expert bias, shared
 * experts, first_k_dense_replace, num_nextn_predict_layers MTP modules. */
static int deepseek_config_read(json_t *c, const char *path, struct model_config *cfg, char *err, size_t errlen) {
    snprintf(cfg->arch, sizeof cfg->arch, "deepseek_v3");
    int experts = 0;
    if (common_keys(c, path, cfg, 4096, 1e-6, err, errlen) ||
        get_count(c, "q_lora_rank", 0, &cfg->q_lora_rank, path, err, errlen) ||
        get_int(c, "kv_lora_rank", -1, &cfg->kv_lora_rank, path, err, errlen) ||
        get_int(c, "qk_nope_head_dim", -1, &cfg->qk_nope_head_dim, path, err, errlen) ||
        get_int(c, "qk_rope_head_dim", -1, &cfg->qk_rope_head_dim, path, err, errlen) ||
        get_int(c, "v_head_dim", -1, &cfg->v_head_dim, path, err, errlen) ||
        get_count(c, "n_routed_experts", 0, &experts, path, err, errlen) ||
        get_count(c, "num_nextn_predict_layers", 0, &cfg->mtp_depth, path, err, errlen) ||
        must_be(c, "hidden_act", "silu", path, err, errlen) || must_be(c, "scoring_func", "sigmoid", path, err, errlen) ||
        must_be(c, "topk_method", "noaux_tc", path, err, errlen) || must_be_off(c, "attention_bias", path, err, errlen))
        return -1;
    json_t *norm = json_object_get(c, "norm_topk_prob"), *freq = json_object_get(c, "moe_layer_freq");
    if (experts && json_is_false(norm))
        return snprintf(err, errlen, "%s: norm_topk_prob false is not supported (mtrain normalises the gate "
                        "weights over the chosen experts)", path), -1;
    if (freq && !json_is_null(freq) && json_integer_value(freq) != 1)
        return snprintf(err, errlen, "%s: moe_layer_freq must be 1 (every layer from first_k_dense_replace on is MoE)",
                        path), -1;
    cfg->tie_embeddings = json_is_true(json_object_get(c, "tie_word_embeddings"));
    cfg->num_experts = experts;
    if (experts) {
        if (get_int(c, "num_experts_per_tok", -1, &cfg->experts_per_token, path, err, errlen) ||
            get_int(c, "moe_intermediate_size", -1, &cfg->moe_intermediate_size, path, err, errlen) ||
            get_count(c, "n_shared_experts", 0, &cfg->moe_shared_experts, path, err, errlen) ||
            get_count(c, "first_k_dense_replace", 0, &cfg->first_k_dense, path, err, errlen) ||
            get_int(c, "n_group", 1, &cfg->moe_n_group, path, err, errlen) ||
            get_int(c, "topk_group", 1, &cfg->moe_topk_group, path, err, errlen) ||
            get_num(c, "routed_scaling_factor", 1, &cfg->moe_routed_scaling, path, err, errlen))
            return -1;
        snprintf(cfg->moe_score_func, sizeof cfg->moe_score_func, "sigmoid");
        cfg->moe_layer_freq = 1, cfg->moe_capacity_factor = 0, cfg->moe_aux_loss_coef = 0;
        /* the checkpoint carries e_score_correction_bias; a table only has it
         * with a bias update rate: DeepSeek-V3's published 0.001 (training only) */
        cfg->moe_bias_update_rate = 1e-3;
    }
    cfg->rope_scaling_factor = 0;
    json_t *rs = json_object_get(c, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *rt = json_string_value(json_object_get(rs, "rope_type"));
        if (!rt) rt = json_string_value(json_object_get(rs, "type"));
        if (!rt || strcmp(rt, "yarn"))
            return snprintf(err, errlen, "%s: rope_scaling type %s is not supported for deepseek_v3 (yarn only)", path,
                            rt ? rt : "missing"), -1;
        snprintf(cfg->rope_scaling_type, sizeof cfg->rope_scaling_type, "yarn");
        if (get_num(rs, "factor", -1, &cfg->rope_scaling_factor, path, err, errlen) ||
            get_int(rs, "original_max_position_embeddings", 4096, &cfg->rope_original_max_pos, path, err, errlen) ||
            get_num(rs, "beta_fast", 32, &cfg->yarn_beta_fast, path, err, errlen) ||
            get_num(rs, "beta_slow", 1, &cfg->yarn_beta_slow, path, err, errlen) ||
            get_num(rs, "mscale", 1, &cfg->yarn_mscale, path, err, errlen) ||
            get_num(rs, "mscale_all_dim", 1, &cfg->yarn_mscale_all_dim, path, err, errlen))
            return -1;
    }
    return 0;
}

int hf_config_read(const char *path, struct model_config *cfg, char *err, size_t errlen) {
    json_error_t jerr;
    json_t *c = json_load_file(path, 0, &jerr);
    if (!c) return snprintf(err, errlen, "%s: line %d: %s", path, jerr.line, jerr.text), -1;
    int rc = -1;
    const char *type = json_string_value(json_object_get(c, "model_type"));
    int moe = type && !strcmp(type, "mixtral");
    if (json_is_object(c) && type && !strcmp(type, "deepseek_v3")) {
        rc = deepseek_config_read(c, path, cfg, err, errlen);
        goto out;
    }
    if (!json_is_object(c) || !type || (strcmp(type, "llama") && !moe)) {
        snprintf(err, errlen, "%s: model_type %s%s%s is not supported (mtrain reads \"llama\", \"mixtral\" and "
                 "\"deepseek_v3\")", path, type ? "\"" : "", type ? type : "missing", type ? "\"" : "");
        goto out;
    }
    snprintf(cfg->arch, sizeof cfg->arch, "%s", type);
    if (common_keys(c, path, cfg, 2048, moe ? 1e-5 : 1e-6, err, errlen) ||
        must_be_off(c, "attention_bias", path, err, errlen) || must_be_off(c, "mlp_bias", path, err, errlen))
        goto out;
    if (cfg->hidden_size % cfg->num_heads || cfg->num_heads % cfg->num_kv_heads) {
        snprintf(err, errlen, "%s: num_attention_heads %d must divide hidden_size %d and be a multiple of "
                 "num_key_value_heads %d", path, cfg->num_heads, cfg->hidden_size, cfg->num_kv_heads);
        goto out;
    }
    int head_dim = cfg->hidden_size / cfg->num_heads;
    json_t *hd = json_object_get(c, "head_dim");
    if (hd && !json_is_null(hd) && json_integer_value(hd) != head_dim) {
        snprintf(err, errlen, "%s: head_dim %lld differs from hidden_size / num_attention_heads = %d", path,
                 (long long)json_integer_value(hd), head_dim);
        goto out;
    }
    const char *act = json_string_value(json_object_get(c, "hidden_act"));
    if (act && strcmp(act, "silu")) {
        snprintf(err, errlen, "%s: hidden_act \"%s\" is not supported (silu only)", path, act);
        goto out;
    }
    json_t *tie = json_object_get(c, "tie_word_embeddings");
    cfg->tie_embeddings = json_is_true(tie);
    cfg->rope_scaling_factor = 0;
    json_t *rs = json_object_get(c, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *rt = json_string_value(json_object_get(rs, "rope_type"));
        if (!rt) rt = json_string_value(json_object_get(rs, "type"));
        if (!rt || strcmp(rt, "llama3")) {
            snprintf(err, errlen, "%s: rope_scaling type %s is not supported (llama3 only)", path, rt ? rt : "missing");
            goto out;
        }
        if (get_num(rs, "factor", -1, &cfg->rope_scaling_factor, path, err, errlen) ||
            get_num(rs, "low_freq_factor", 1, &cfg->rope_low_freq_factor, path, err, errlen) ||
            get_num(rs, "high_freq_factor", 4, &cfg->rope_high_freq_factor, path, err, errlen) ||
            get_int(rs, "original_max_position_embeddings", 8192, &cfg->rope_original_max_pos, path, err, errlen))
            goto out;
    }
    cfg->num_experts = 0;
    if (moe) {
        if (get_int(c, "num_local_experts", 8, &cfg->num_experts, path, err, errlen) ||
            get_int(c, "num_experts_per_tok", 2, &cfg->experts_per_token, path, err, errlen))
            goto out;
        if (cfg->experts_per_token > cfg->num_experts) {
            snprintf(err, errlen, "%s: num_experts_per_tok %d exceeds num_local_experts %d", path,
                     cfg->experts_per_token, cfg->num_experts);
            goto out;
        }
        cfg->moe_intermediate_size = cfg->intermediate_size;
        cfg->moe_layer_freq = 1;
        cfg->moe_capacity_factor = 0;
    }
    rc = 0;
out:
    json_decref(c);
    return rc;
}

/* ---- resolving ---- */

/* s's model from the Hugging Face config.json at path, within the sizes mtrain's tables take */
static int hf_model(struct model_source *s, const char *path, char *err, size_t errlen) {
    if (hf_config_read(path, &s->recipe.model, err, errlen) != 0) return EXIT_USAGE;
    const char *key;
    char why[200];
    if (model_check_tensor_count(&s->recipe.model, &key, why, sizeof why) != 0)
        return snprintf(err, errlen, "%s: %s", path, why), EXIT_USAGE;
    return 0;
}

/* The model of a weights file: --recipe, else model.recipe.yaml or config.json beside it. */
static int weights_model(struct model_source *s, const char *file, const char *recipe_path, char *err, size_t errlen) {
    char copy[4400], dir[4400], probe[4500];
    snprintf(copy, sizeof copy, "%s", file);
    snprintf(dir, sizeof dir, "%s", dirname(copy)); /* dirname may return a pointer into copy */
    snprintf(s->path, sizeof s->path, "%s", file);
    s->kind = SOURCE_WEIGHTS;
    if (!recipe_path && exists_in(dir, "model.recipe.yaml", probe, sizeof probe)) recipe_path = probe;
    if (recipe_path) {
        if (recipe_load(&s->recipe, recipe_path) != 0)
            return snprintf(err, errlen, "%s: cannot read the model's recipe", recipe_path), EXIT_USAGE;
        s->has_run_recipe = 1;
        return 0;
    }
    if (exists_in(dir, "config.json", probe, sizeof probe)) {
        s->kind = SOURCE_HF;
        return hf_model(s, probe, err, errlen);
    }
    snprintf(err, errlen, "%s: no model.recipe.yaml or config.json beside it says what model it holds; pass --recipe FILE "
             "(the recipe it was trained with)", file);
    return EXIT_USAGE;
}

static int checkpoint_model(struct model_source *s, const char *step_dir, char *err, size_t errlen) {
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, errlen, &rc);
    if (!rd) return EXIT_RUNTIME;
    rc = ckpt_reader_load_recipe(rd, &s->recipe, err, errlen);
    ckpt_reader_close(rd);
    if (rc) return EXIT_RUNTIME;
    s->kind = SOURCE_CHECKPOINT;
    s->has_run_recipe = 1;
    snprintf(s->path, sizeof s->path, "%s", step_dir);
    return 0;
}

static int resolve(struct model_source *s, const char *path, const char *recipe_path, char *err, size_t errlen) {
    char probe[4200];
    if (!path_exists(path)) return snprintf(err, errlen, "%s: no such file or directory", path), EXIT_USAGE;
    if (!is_dir(path)) return weights_model(s, path, recipe_path, err, errlen);
    if (exists_in(path, "manifest.json", probe, sizeof probe)) {
        if (recipe_path) return snprintf(err, errlen, "%s: a checkpoint carries its recipe; drop --recipe", path), EXIT_USAGE;
        return checkpoint_model(s, path, err, errlen);
    }
    if (exists_in(path, "config.json", probe, sizeof probe) && !recipe_path) {
        s->kind = SOURCE_HF;
        snprintf(s->path, sizeof s->path, "%s", path);
        return hf_model(s, probe, err, errlen);
    }
    if (exists_in(path, "model.safetensors", probe, sizeof probe)) return weights_model(s, probe, recipe_path, err, errlen);
    int steps[1];
    if (checkpoint_list(path, steps, 1) > 0) {
        if (recipe_path) return snprintf(err, errlen, "%s: a checkpoint carries its recipe; drop --recipe", path), EXIT_USAGE;
        snprintf(s->root, sizeof s->root, "%s", path);
        checkpoint_step_dir(probe, sizeof probe, path, steps[0]);
        return checkpoint_model(s, probe, err, errlen);
    }
    snprintf(err, errlen, "%s: expected a checkpoint step directory (manifest.json), a checkpoint directory "
             "(step-NNNNNNNNN), a Hugging Face directory (config.json + model.safetensors), a run's log directory "
             "or a .safetensors file", path);
    return EXIT_USAGE;
}

int model_source_resolve(struct model_source *s, const char *path, const char *recipe_path, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    recipe_defaults(&s->recipe);
    return resolve(s, path, recipe_path, err, errlen);
}

int model_source_open(struct model_source *s, const char *path, const char *recipe_path, char *err, size_t errlen) {
    int rc = model_source_resolve(s, path, recipe_path, err, errlen);
    if (rc) return rc;
    const struct model_config *m = &s->recipe.model;
    s->max_positions = model_max_positions(m, s->recipe.train.seq_len);
    return 0;
}

/* ---- loading ---- */

/* Every tensor of the table from one step directory, whole (tp_rank 0 of a
 * tp = 1 table), into the device buffer. */
static int load_step(const char *step_dir, struct transformer *m, char *err, size_t errlen) {
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, errlen, &rc);
    if (!rd) return rc;
    const struct param_table *t = &m->table;
    size_t largest = 1;
    for (int i = 0; i < t->count; i++) largest = t->items[i].numel > largest ? t->items[i].numel : largest;
    float *buf = xmalloc(sizeof(float) * largest);
    rc = 0;
    for (int i = 0; i < t->count && rc == 0; i++) {
        rc = ckpt_reader_read(rd, &t->items[i], 0, 0, buf, err, errlen);
        if (rc == 0) m->be->from_host(m->params + t->items[i].offset, buf, sizeof(float) * t->items[i].numel);
    }
    free(buf);
    ckpt_reader_close(rd);
    transformer_params_changed(m);
    return rc;
}

int model_source_load(const struct model_source *s, struct transformer *m, char *err, size_t errlen) {
    if (s->kind != SOURCE_CHECKPOINT) {
        weights_load(m->be, m->params, &m->table, s->path); /* errors name the file and exit 1 */
        transformer_params_changed(m);
        fprintf(stderr, "loaded %s\n", s->path);
        return 0;
    }
    if (!s->root[0]) {
        int rc = load_step(s->path, m, err, errlen);
        if (rc == 0) fprintf(stderr, "loaded %s\n", s->path);
        return rc == 0 ? 0 : rc == -2 ? EXIT_USAGE : EXIT_RUNTIME;
    }
    /* a checkpoint directory: the newest step that verifies */
    int steps[4096], count = checkpoint_list(s->root, steps, 4096);
    char step_dir[4200];
    for (int i = 0; i < count; i++) {
        checkpoint_step_dir(step_dir, sizeof step_dir, s->root, steps[i]);
        int rc = load_step(step_dir, m, err, errlen);
        if (rc == 0) {
            fprintf(stderr, "loaded %s\n", step_dir);
            return 0;
        }
        if (rc == -2) return EXIT_USAGE;
        warn("%s; falling back to the previous checkpoint", err);
    }
    snprintf(err, errlen, "no loadable checkpoint in %s", s->root);
    return EXIT_RUNTIME;
}

int model_source_build(const struct model_source *s, const char *device, int B, int T, struct transformer *m,
                       char *err, size_t errlen) {
    err[0] = 0;
    const struct backend *be = backend_get(device, "fp32"); /* inference reads the fp32 master weights */
    if (!be) return EXIT_USAGE;
    if (be != &cpu_backend) cuda_use_device(0);
    /* the weights' shapes against the model's config (config.json, a recipe, a manifest's) before allocating it;
     * a step that does not open is left to model_source_load, which falls back to older steps */
    if (s->kind != SOURCE_CHECKPOINT) {
        weights_check(&s->recipe.model, s->path);
    } else {
        int rc;
        struct ckpt_reader *rd = ckpt_reader_open(s->path, err, errlen, &rc);
        rc = rd ? ckpt_reader_check(rd, &s->recipe.model, err, errlen) : (err[0] = 0);
        ckpt_reader_close(rd);
        if (rc) return EXIT_RUNTIME;
    }
    transformer_create_forward_only(m, be, &s->recipe.model, B, T);
    int rc = model_source_load(s, m, err, errlen);
    if (rc) transformer_free(m);
    return rc;
}

long parse_token_ids(const char *text, int vocab, const char *what, int32_t **ids, char *err, size_t errlen) {
    size_t n = 0, cap = 16;
    int32_t *out = xmalloc(sizeof(int32_t) * cap);
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || (*end && !strchr(" \t\r\n,", *end))) {
            snprintf(err, errlen, "%s: item %zu (\"%.20s\") is not an integer token id", what, n + 1, p);
            free(out);
            return -1;
        }
        if (v < 0 || v >= vocab) {
            snprintf(err, errlen, "%s: token id %lld (item %zu) is outside the model's vocabulary [0, %d)", what, v,
                     n + 1, vocab);
            free(out);
            return -1;
        }
        if (n == cap) out = xrealloc(out, sizeof(int32_t) * (cap *= 2));
        out[n++] = (int32_t)v;
        p = end;
    }
    *ids = out;
    return (long)n;
}
