#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/hf_rope_layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "config/common.h"

/* The safetensors files of a model: one file, or a Hugging Face directory
 * (model.safetensors, or model.safetensors.index.json naming a file per tensor). */
struct weight_files {
    const char *path;
    json_t *weight_map;      /* NULL: a single file */
    char dir[4096];
    struct st_file f[64];
    char *names[64];
    int n;
};

static void open_weights(struct weight_files *w, const char *path) {
    memset(w, 0, sizeof *w);
    w->path = path;
    struct stat st;
    if (stat(path, &st) != 0) die("%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return;
    snprintf(w->dir, sizeof w->dir, "%s", path);
    char index[4200];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
    if (!path_exists(index)) return; /* a directory with model.safetensors */
    json_error_t jerr;
    json_t *root = json_load_file(index, 0, &jerr);
    if (!root) die("%s:%d: %s", index, jerr.line, jerr.text);
    w->weight_map = json_incref(json_object_get(root, "weight_map"));
    json_decref(root);
    if (!json_is_object(w->weight_map)) die("%s: no \"weight_map\" object", index);
}

/* The open file that holds tensor name (dies naming what is missing). */
static struct st_file *file_for(struct weight_files *w, const char *name) {
    const char *file = "model.safetensors";
    if (w->weight_map) {
        json_t *f = json_object_get(w->weight_map, name);
        if (!json_is_string(f)) die("%s: tensor %s is missing from the weight map", w->dir, name);
        file = json_string_value(f);
    }
    if (!w->dir[0]) file = w->path;
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->names[i], file)) return &w->f[i];
    if (w->n == 64) die("%s: more than 64 weight files", w->path);
    char path[8300], err[1024];
    if (w->dir[0]) snprintf(path, sizeof path, "%s/%s", w->dir, file);
    else snprintf(path, sizeof path, "%s", file);
    if (safetensors_open(&w->f[w->n], path, err, sizeof err) != 0) die("%s", err);
    w->names[w->n] = xstrdup(file);
    return &w->f[w->n++];
}

static void close_weights(struct weight_files *w) {
    for (int i = 0; i < w->n; i++) {
        safetensors_close(&w->f[i]);
        free(w->names[i]);
    }
    json_decref(w->weight_map);
}

/* "[a, b, ...]" of n dims into buf. */
static const char *shape_str(char *buf, size_t len, const int64_t *shape, int n) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < n && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

/* Whether the weights at path keep DeepSeek-V3's rotary rows interleaved, as
 * Hugging Face DeepseekV3 checkpoints do: a config.json in the directory (or
 * beside the file) with model_type deepseek_v3 and rope_interleave not false.
 * A bare file (mtrain's final weights, checkpoint_export_weights) is in
 * mtrain's rotate_half order. Dies when config.json disagrees with the table's
 * head layout, which the permutation depends on. */
static int hf_interleaved(const char *path, const struct weight_files *w, const struct mla_dims *d) {
    if (!d->rope_dim) return 0;
    char copy[4096], config[4200];
    snprintf(copy, sizeof copy, "%s", path);
    snprintf(config, sizeof config, "%s/config.json", w->dir[0] ? w->dir : dirname(copy));
    if (!path_exists(config)) return 0;
    json_error_t jerr;
    json_t *c = json_load_file(config, 0, &jerr);
    if (!c) die("%s:%d: %s", config, jerr.line, jerr.text);
    const char *type = json_string_value(json_object_get(c, "model_type"));
    json_t *interleave = json_object_get(c, "rope_interleave");
    int yes = type && !strcmp(type, "deepseek_v3") && !json_is_false(interleave);
    if (yes) {
        json_t *rope = json_object_get(c, "qk_rope_head_dim"), *heads = json_object_get(c, "num_attention_heads"),
               *nope = json_object_get(c, "qk_nope_head_dim");
        if (json_integer_value(rope) != d->rope_dim || json_integer_value(heads) != d->heads ||
            json_integer_value(nope) + d->rope_dim != d->qk_head_dim)
            die("%s: qk_rope_head_dim %lld, num_attention_heads %lld, qk_nope_head_dim %lld differ from the recipe's "
                "%d, %d, %d; the interleaved rotary rows cannot be placed", config, json_integer_value(rope),
                json_integer_value(heads), json_integer_value(nope), d->rope_dim, d->heads,
                d->qk_head_dim - d->rope_dim);
    }
    json_decref(c);
    return yes;
}

/* Every tensor of the table in the open files with its global shape; errors name the file and tensor, exit 1 */
static void check_tensors(struct weight_files *w, const struct param_table *t) {
    for (int i = 0; i < t->count; i++) {
        const struct param_info *p = &t->items[i];
        struct st_file *f = file_for(w, p->name);
        const struct st_entry *e = safetensors_find(f, p->name);
        if (!e) die("%s: tensor %s is missing", f->path, p->name);
        int ok = e->ndim == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = e->shape[d] == p->shape[d];
        if (!ok) {
            char have[256], want[64];
            die("%s: tensor %s has shape %s, the recipe needs %s", f->path, p->name,
                shape_str(have, sizeof have, e->shape, e->ndim), shape_str(want, sizeof want, p->shape, p->ndim));
        }
    }
}

void weights_check(const struct model_config *m, const char *path) {
    struct model_part part;
    struct param_table t;
    struct weight_files w;
    model_part_full(&part, m);
    param_table_build(&t, m, &part);
    open_weights(&w, path);
    check_tensors(&w, &t);
    close_weights(&w);
    param_table_free(&t);
}

void weights_load_each(const struct param_table *t, const char *path, param_put_fn put, void *ctx) {
    struct weight_files w;
    struct mla_dims dims;
    char err[1024];
    open_weights(&w, path);
    check_tensors(&w, t);
    mla_dims_from_table(t, &dims);
    int interleaved = hf_interleaved(path, &w, &dims);
    for (int i = 0; i < t->count; i++) {
        const struct param_info *p = &t->items[i];
        struct st_file *f = file_for(&w, p->name);
        const struct st_entry *e = safetensors_find(f, p->name);
        /* read the whole tensor, keep this rank's block of it */
        int64_t rows = p->shape[0], cols = p->ndim > 1 ? p->shape[1] : 1;
        int64_t lr = p->local_shape[0], lc = p->ndim > 1 ? p->local_shape[1] : 1;
        int64_t r0 = p->shard == SHARD_TP_ROWS ? p->part * lr : 0, c0 = p->shard == SHARD_TP_COLS ? p->part * lc : 0;
        float *whole = xmalloc(sizeof(float) * rows * cols), *local = xmalloc(sizeof(float) * p->numel);
        if (safetensors_read_f32(f, e, whole, err, sizeof err) != 0) die("%s", err);
        /* a NaN or Inf would poison training from the first step: refuse the file */
        for (int64_t k = 0; k < rows * cols; k++)
            if (!isfinite(whole[k]))
                die("%s: tensor %s has a non-finite value (%g) at element %lld; init_from weights must be finite",
                    f->path, p->name, (double)whole[k], (long long)k);
        if (interleaved) hf_rope_permute(&dims, p->name, whole, rows, cols, 0);
        for (int64_t r = 0; r < lr; r++) memcpy(local + r * lc, whole + (r0 + r) * cols + c0, sizeof(float) * lc);
        put(ctx, i, local);
        free(whole);
        free(local);
    }
    close_weights(&w);
}

void weights_load(const struct backend *be, float *buf, const struct param_table *t, const char *path) {
    struct param_buffer b = {be, buf, t};
    weights_load_each(t, path, param_put_buffer, &b);
}

void weights_save(const struct backend *be, const float *buf, const struct param_table *t, const char *path) {
    struct st_tensor *ts = xcalloc(t->count, sizeof *ts);
    float *host = xmalloc(sizeof(float) * (t->total ? t->total : 1));
    be->to_host(host, buf, sizeof(float) * t->total);
    for (int i = 0; i < t->count; i++) {
        const struct param_info *p = &t->items[i];
        ts[i] = (struct st_tensor){.name = p->name, .dtype = "F32", .ndim = p->ndim, .data = host + p->offset,
                                   .nbytes = sizeof(float) * p->numel};
        for (int d = 0; d < p->ndim; d++) ts[i].shape[d] = p->local_shape[d];
    }
    const char *k[] = {"format"}, *v[] = {"pt"};
    safetensors_save(path, ts, t->count, k, v, 1);
    free(host);
    free(ts);
}
