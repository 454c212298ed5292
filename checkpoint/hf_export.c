#define _GNU_SOURCE
#include "checkpoint/hf_export.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "config/common.h"

/* config.json keys of transformers' LlamaConfig (MixtralConfig for a MoE
 * model) for this model. */
static void write_config(const struct model_config *m, const char *path) {
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
    char *text = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    CHECK(text);
    write_file_atomic(path, text, strlen(text));
    free(text);
    json_decref(c);
}

/* Every tensor of the checkpoint's model, whole, into a safetensors file at
 * path (one tensor in memory at a time). */
static int write_weights(struct ckpt_reader *rd, const struct recipe *r, const char *path, char *err, size_t errlen) {
    struct model_part part;
    struct param_table t;
    model_part_full(&part, &r->model);
    param_table_build(&t, &r->model, &part);
    struct st_tensor *ts = xcalloc(t.count, sizeof *ts);
    size_t largest = 1;
    for (int i = 0; i < t.count; i++) {
        const struct param_info *p = &t.items[i];
        ts[i] = (struct st_tensor){.name = p->name, .dtype = "F32", .ndim = p->ndim, .nbytes = sizeof(float) * p->numel};
        for (int d = 0; d < p->ndim; d++) ts[i].shape[d] = p->shape[d];
        if (p->numel > largest) largest = p->numel;
    }
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    struct st_writer w;
    st_writer_open(&w, path, ts, t.count, mk, mv, 1);
    float *buf = xmalloc(sizeof(float) * largest);
    int rc = 0;
    for (int i = 0; i < t.count && rc == 0; i++) {
        rc = ckpt_reader_read(rd, &t.items[i], 0, 0, buf, err, errlen);
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
    return rd;
}

int checkpoint_export_weights(const char *step_dir, const char *path, char *err, size_t errlen) {
    int rc;
    static struct recipe r;
    struct ckpt_reader *rd = open_with_recipe(step_dir, &r, err, errlen, &rc);
    if (!rd) return rc;
    rc = write_weights(rd, &r, path, err, errlen);
    ckpt_reader_close(rd);
    return rc;
}

int checkpoint_hf_check_model(const struct model_config *m, const char *what, char *err, size_t errlen) {
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
    rc = write_weights(rd, &r, path, err, errlen);
    if (rc == 0) checkpoint_hf_write_config(&r.model, out_dir);
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
