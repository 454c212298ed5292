#define _GNU_SOURCE
#include "checkpoint/hf_export.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_rope_layout.h"
#include "checkpoint/safetensors.h"
#include "config/common.h"
#include "model/transformer.h"

/* config.json keys of transformers' LlamaConfig (MixtralConfig for a MoE
 * model) for this model. */
static json_t *llama_config(const struct model_config *m) {
    int moe = m->num_experts > 0;
    json_t *c = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, s:s, s:b, s:b, s:f}",
                          "architectures", moe ? "MixtralForCausalLM" : "LlamaForCausalLM", "model_type",
                          moe ? "mixtral" : "llama", "vocab_size", m->vocab_size, "hidden_size", m->hidden_size,
                          "intermediate_size", moe ? model_moe_ffn_size(m) : m->intermediate_size,
                          "num_hidden_layers", m->num_layers, "num_attention_heads", m->num_heads,
                          "num_key_value_heads", m->num_kv_heads, "max_position_embeddings",
                          m->max_seq_len ? m->max_seq_len : 8192, "rope_theta", m->rope_theta, "rms_norm_eps",
                          m->norm_eps, "tie_word_embeddings", m->tie_embeddings, "hidden_act", "silu", "torch_dtype",
                          "float32", "attention_bias", 0, "mlp_bias", 0, "initializer_range", m->init_std);
    CHECK(c);
    if (moe) {
        json_t *x = json_pack("{s:i, s:i, s:f, s:b, s:n}", "num_local_experts", m->num_experts, "num_experts_per_tok",
                              m->experts_per_token, "router_aux_loss_coef", m->moe_aux_loss_coef,
                              "output_router_logits", 0, "sliding_window");
        CHECK(x && json_object_update(c, x) == 0);
        json_decref(x);
    }
    if (m->rope_scaling_factor > 0) {
        json_t *rs = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", m->rope_scaling_factor,
                               "low_freq_factor", m->rope_low_freq_factor, "high_freq_factor", m->rope_high_freq_factor,
                               "original_max_position_embeddings", m->rope_original_max_pos);
        CHECK(rs && json_object_set_new(c, "rope_scaling", rs) == 0);
    }
    return c;
}

static void set(json_t *c, const char *key, json_t *v) { CHECK(v && json_object_set_new(c, key, v) == 0); }

/* config.json of transformers' DeepseekV3Config (plus the keys DeepSeek's own
 * hub config carries: num_nextn_predict_layers, scoring_func, topk_method,
 * moe_layer_freq). A model without routed experts is all dense layers:
 * first_k_dense_replace = every layer. */
static json_t *deepseek_config(const struct model_config *m) {
    int moe = m->num_experts > 0, D = model_mtp_depth(m);
    json_t *c = json_object();
    CHECK(c);
    set(c, "architectures", json_pack("[s]", "DeepseekV3ForCausalLM"));
    set(c, "model_type", json_string("deepseek_v3"));
    set(c, "vocab_size", json_integer(m->vocab_size));
    set(c, "hidden_size", json_integer(m->hidden_size));
    set(c, "intermediate_size", json_integer(m->intermediate_size));
    set(c, "moe_intermediate_size", json_integer(model_moe_ffn_size(m)));
    set(c, "num_hidden_layers", json_integer(m->num_layers));
    set(c, "num_attention_heads", json_integer(m->num_heads));
    set(c, "num_key_value_heads", json_integer(m->num_heads)); /* MLA: every head has its own key and value */
    set(c, "n_shared_experts", json_integer(m->moe_shared_experts));
    set(c, "n_routed_experts", moe ? json_integer(m->num_experts) : json_null());
    set(c, "routed_scaling_factor", json_real(m->moe_routed_scaling));
    set(c, "kv_lora_rank", json_integer(m->kv_lora_rank));
    set(c, "q_lora_rank", m->q_lora_rank ? json_integer(m->q_lora_rank) : json_null());
    set(c, "qk_rope_head_dim", json_integer(m->qk_rope_head_dim));
    set(c, "v_head_dim", json_integer(m->v_head_dim));
    set(c, "qk_nope_head_dim", json_integer(m->qk_nope_head_dim));
    set(c, "n_group", json_integer(m->moe_n_group));
    set(c, "topk_group", json_integer(m->moe_topk_group));
    set(c, "num_experts_per_tok", moe ? json_integer(m->experts_per_token) : json_null());
    set(c, "first_k_dense_replace", json_integer(moe ? m->first_k_dense : m->num_layers + D));
    set(c, "moe_layer_freq", json_integer(1));
    set(c, "norm_topk_prob", json_true());
    set(c, "scoring_func", json_string("sigmoid"));
    set(c, "topk_method", json_string("noaux_tc"));
    set(c, "aux_loss_alpha", json_real(m->moe_seq_aux_loss_coef));
    set(c, "seq_aux", json_true());
    set(c, "num_nextn_predict_layers", json_integer(D));
    set(c, "hidden_act", json_string("silu"));
    /* YaRN extends the original context by its factor (DeepSeek-V3: 40 x 4096);
     * transformers warns when the two disagree */
    set(c, "max_position_embeddings", json_integer(model_max_positions(m, 8192)));
    set(c, "initializer_range", json_real(m->init_std));
    set(c, "rms_norm_eps", json_real(m->norm_eps));
    set(c, "tie_word_embeddings", json_boolean(m->tie_embeddings));
    set(c, "rope_theta", json_real(m->rope_theta));
    set(c, "rope_interleave", json_true()); /* the rotary rows below are written interleaved */
    set(c, "attention_bias", json_false());
    set(c, "attention_dropout", json_real(0));
    set(c, "torch_dtype", json_string("float32"));
    if (m->rope_scaling_factor > 0)
        set(c, "rope_scaling",
            json_pack("{s:s, s:s, s:f, s:i, s:f, s:f, s:f, s:f}", "type", "yarn", "rope_type", "yarn", "factor",
                      m->rope_scaling_factor, "original_max_position_embeddings", m->rope_original_max_pos,
                      "beta_fast", m->yarn_beta_fast, "beta_slow", m->yarn_beta_slow, "mscale", m->yarn_mscale,
                      "mscale_all_dim", m->yarn_mscale_all_dim));
    else
        set(c, "rope_scaling", json_null());
    return c;
}

static void write_config(const struct model_config *m, const char *path) {
    json_t *c = model_is_mla(m) ? deepseek_config(m) : llama_config(m);
    char *text = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    CHECK(text);
    write_file_atomic(path, text, strlen(text));
    free(text);
    json_decref(c);
}

/* Where write_weights reads each whole tensor of the table from (mtrain's
 * layout): a checkpoint step, or a weights file. */
struct tensor_source {
    struct ckpt_reader *rd;
    struct st_file *file;
};

static int source_read(const struct tensor_source *s, const struct param_info *p, float *buf, char *err,
                       size_t errlen) {
    if (s->rd) return ckpt_reader_read(s->rd, p, 0, 0, buf, err, errlen);
    const struct st_entry *e = safetensors_find(s->file, p->name);
    if (!e) return snprintf(err, errlen, "%s: tensor %s is missing", s->file->path, p->name), -1;
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    if ((size_t)n != p->numel)
        return snprintf(err, errlen, "%s: tensor %s has %lld elements, the recipe needs %zu", s->file->path, p->name,
                        (long long)n, p->numel), -1;
    return safetensors_read_f32(s->file, e, buf, err, errlen);
}

/* One tensor of the export: a tensor of the table (permuted to Hugging Face's
 * layout where that differs), a copy of one (the MTP layer's embed_tokens and
 * shared_head.head, as DeepSeek's checkpoints store them), or zeros (an
 * expert bias the run did not use). */
struct export_item {
    char name[PARAM_NAME_MAX + 32];
    int ndim;
    int64_t shape[2];
    size_t numel;
    int from; /* table index; -1 zeros */
};

static int add_item(struct export_item *items, int n, const char *name, const struct param_info *like, int from) {
    struct export_item *x = &items[n];
    CHECK(snprintf(x->name, sizeof x->name, "%s", name) < (int)sizeof x->name);
    x->ndim = like->ndim, x->from = from;
    x->shape[0] = like->shape[0], x->shape[1] = like->shape[1];
    x->numel = (size_t)like->shape[0] * (size_t)(like->ndim > 1 ? like->shape[1] : 1);
    return n + 1;
}

/* The tensors DeepSeek's Hugging Face checkpoints have beyond mtrain's table. */
static int deepseek_extras(const struct model_config *m, const struct param_table *t, struct export_item *items,
                           int n) {
    char name[PARAM_NAME_MAX + 32];
    int L = m->num_layers, D = model_mtp_depth(m);
    if (m->num_experts > 0 && m->moe_bias_update_rate <= 0) {
        struct param_info bias = {.ndim = 1, .shape = {m->num_experts, 0}};
        for (int l = 0; l < L + D; l++) {
            if (!model_layer_is_moe(m, l)) continue;
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
            n = add_item(items, n, name, &bias, -1);
        }
    }
    const struct param_info *embed = param_find(t, "model.embed_tokens.weight");
    const struct param_info *head = m->tie_embeddings ? embed : param_find(t, "lm_head.weight");
    CHECK(embed && head);
    for (int d = 0; d < D; d++) {
        snprintf(name, sizeof name, "model.layers.%d.embed_tokens.weight", L + d);
        n = add_item(items, n, name, embed, (int)(embed - t->items));
        snprintf(name, sizeof name, "model.layers.%d.shared_head.head.weight", L + d);
        n = add_item(items, n, name, head, (int)(head - t->items));
    }
    return n;
}

/* Every tensor of the model, whole, into a safetensors file at path (one
 * tensor in memory at a time). hf: Hugging Face's layout (DeepSeek-V3: the
 * rotary rows interleaved, the MTP layer's copies, zero expert biases);
 * otherwise mtrain's own (what model.init_from of a bare file expects). */
static int write_weights(const struct tensor_source *src, const struct recipe *r, const char *path, int hf, char *err,
                         size_t errlen) {
    struct model_part part;
    struct param_table t;
    struct mla_dims dims;
    const struct model_config *m = &r->model;
    model_part_full(&part, m);
    param_table_build(&t, m, &part);
    mla_dims_from_table(&t, &dims);
    int ds = hf && model_is_mla(m), cap = t.count + (ds ? m->num_layers + 3 * model_mtp_depth(m) + 1 : 0), n = 0;
    struct export_item *items = xcalloc(cap, sizeof *items);
    for (int i = 0; i < t.count; i++) n = add_item(items, n, t.items[i].name, &t.items[i], i);
    if (ds) n = deepseek_extras(m, &t, items, n);
    struct st_tensor *ts = xcalloc(n, sizeof *ts);
    size_t largest = 1;
    for (int i = 0; i < n; i++) {
        ts[i] = (struct st_tensor){.name = items[i].name, .dtype = "F32", .ndim = items[i].ndim,
                                   .nbytes = sizeof(float) * items[i].numel};
        for (int d = 0; d < items[i].ndim; d++) ts[i].shape[d] = items[i].shape[d];
        if (items[i].numel > largest) largest = items[i].numel;
    }
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    struct st_writer w;
    st_writer_open(&w, path, ts, n, mk, mv, 1);
    float *buf = xmalloc(sizeof(float) * largest);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const struct export_item *x = &items[i];
        if (x->from < 0) {
            memset(buf, 0, sizeof(float) * x->numel);
        } else {
            rc = source_read(src, &t.items[x->from], buf, err, errlen);
            if (rc == 0 && ds) hf_rope_permute(&dims, x->name, buf, x->shape[0], x->ndim > 1 ? x->shape[1] : 1, 1);
        }
        if (rc == 0) st_writer_put(&w, buf, ts[i].nbytes);
    }
    if (rc == 0) {
        st_writer_close(&w);
    } else {
        fclose(w.f);
        unlink(w.tmp);
    }
    free(buf);
    free(ts);
    free(items);
    param_table_free(&t);
    return rc;
}
static struct ckpt_reader *open_with_recipe(const char *step_dir, struct recipe *r, char *err, size_t errlen, int *rc) {
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, errlen, rc);
    if (rd && ckpt_reader_load_recipe(rd, r, err, errlen) != 0) {
        ckpt_reader_close(rd);
        *rc = -1;
        return NULL;
    }
    /* the manifest's tensors against its recipe, before buffers the recipe's size */
    if (rd && ckpt_reader_check(rd, &r->model, err, errlen) != 0) {
        ckpt_reader_close(rd);
        *rc = -1;
        return NULL;
    }
    return rd;
}

int checkpoint_export_weights(const char *step_dir, const char *path, char *err, size_t errlen) {
    int rc;
    static struct recipe r;
    struct ckpt_reader *rd = open_with_recipe(step_dir, &r, err, errlen, &rc);
    if (!rd) return rc;
    struct tensor_source src = {.rd = rd};
    rc = write_weights(&src, &r, path, 0, err, errlen);
    ckpt_reader_close(rd);
    return rc;
}

/* What transformers' DeepseekV3ForCausalLM cannot express: it routes with
 * sigmoid scores (noaux_tc, dropless), every layer from first_k_dense_replace
 * on is MoE, and its RoPE scaling is YaRN. */
static int check_deepseek(const struct model_config *m, const char *what, char *err, size_t errlen) {
    const char *bad = NULL;
    if (m->num_experts > 0 && strcmp(m->moe_score_func, "sigmoid"))
        bad = "model.moe_score_func is softmax; Hugging Face DeepseekV3 routes with sigmoid scores";
    else if (m->num_experts > 0 && m->moe_layer_freq != 1)
        bad = "model.moe_layer_freq is not 1; Hugging Face DeepseekV3 makes every layer after first_k_dense MoE";
    else if (m->num_experts > 0 && m->moe_capacity_factor > 0)
        bad = "model.moe_capacity_factor drops tokens; Hugging Face DeepseekV3 is dropless";
    else if (m->rope_scaling_factor > 0 && strcmp(m->rope_scaling_type, "yarn"))
        bad = "model.rope_scaling_type is not yarn; Hugging Face DeepseekV3 scales RoPE with YaRN";
    if (bad) return snprintf(err, errlen, "%s: %s", what, bad), -2;
    return 0;
}

int checkpoint_hf_check_model(const struct model_config *m, const char *what, char *err, size_t errlen) {
    if (model_is_mla(m)) return check_deepseek(m, what, err, errlen);
    if (m->num_experts > 0 && model_moe_layer_count(m) != m->num_layers) {
        snprintf(err, errlen, "%s: model.moe_layer_freq %d mixes dense and MoE layers, which Hugging Face "
                 "MixtralForCausalLM cannot hold (every layer is MoE there)", what, m->moe_layer_freq);
        return -2;
    }
    return 0;
}

void checkpoint_hf_write_config(const struct model_config *m, const char *out_dir) {
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    write_config(m, path);
}

int checkpoint_export_hf(const char *step_dir, const char *out_dir, char *err, size_t errlen) {
    int rc;
    static struct recipe r;
    struct ckpt_reader *rd = open_with_recipe(step_dir, &r, err, errlen, &rc);
    if (!rd) return rc;
    if ((rc = checkpoint_hf_check_model(&r.model, step_dir, err, errlen)) != 0) {
        ckpt_reader_close(rd);
        return rc;
    }
    if (mkdir_p(out_dir) != 0) die("cannot create %s: %s", out_dir, strerror(errno));
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    struct tensor_source src = {.rd = rd};
    rc = write_weights(&src, &r, path, 1, err, errlen);
    struct model_config mc = r.model; /* config.json states the positions eval and generate accept */
    mc.max_seq_len = model_max_positions(&r.model, r.train.seq_len);
    if (rc == 0) checkpoint_hf_write_config(&mc, out_dir);
    ckpt_reader_close(rd);
    return rc;
}

int checkpoint_hf_set_token_ids(const char *out_dir, long long bos, long long eos, char *err, size_t errlen) {
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    json_error_t jerr;
    json_t *c = json_load_file(path, JSON_PRESERVE_ORDER, &jerr);
    if (!json_is_object(c)) {
        snprintf(err, errlen, "%s: cannot read back (line %d: %s)", path, jerr.line, jerr.text);
        json_decref(c);
        return -1;
    }
    CHECK(json_object_set_new(c, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null()) == 0);
    CHECK(json_object_set_new(c, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null()) == 0);
    char *text = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    CHECK(text);
    write_file_atomic(path, text, strlen(text));
    free(text);
    json_decref(c);
    return 0;
}

int checkpoint_hf_weights_from_file(const struct model_config *m, const char *src, const char *dst, char *err,
                                    size_t errlen) {
    struct stat st;
    if (stat(src, &st) != 0) return snprintf(err, errlen, "%s: %s", src, strerror(errno)), -1;
    if (S_ISDIR(st.st_mode)) { /* a Hugging Face directory: already in its layout */
        char file[4400];
        snprintf(file, sizeof file, "%s/model.safetensors", src);
        if (!path_exists(file))
            return snprintf(err, errlen, "%s: no model.safetensors (a sharded directory cannot be re-exported)", src), -1;
        copy_file(file, dst);
        return 0;
    }
    if (!model_is_mla(m)) { /* Llama and Mixtral: mtrain's layout is Hugging Face's */
        copy_file(src, dst);
        return 0;
    }
    static struct recipe r;
    recipe_defaults(&r);
    r.model = *m;
    struct st_file f;
    if (safetensors_open(&f, src, err, errlen) != 0) return -1;
    struct tensor_source s = {.file = &f};
    int rc = write_weights(&s, &r, dst, 1, err, errlen);
    safetensors_close(&f);
    return rc;
}
