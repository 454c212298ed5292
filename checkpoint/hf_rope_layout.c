#include "checkpoint/hf_rope_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The tensor "PREFIX.suffix" of the table, or NULL. */
static const struct param_info *sibling(const struct param_table *t, const char *prefix, const char *suffix) {
    char name[PARAM_NAME_MAX + 64];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    return param_find(t, name);
}

void mla_dims_from_table(const struct param_table *t, struct mla_dims *d) {
    memset(d, 0, sizeof *d);
    static const char kv_a[] = "self_attn.kv_a_proj_with_mqa.weight";
    for (int i = 0; i < t->count; i++) {
        const char *name = t->items[i].name;
        if (!ends_with(name, kv_a)) continue;
        /* one layer's attention tensors fix the split: kv_a = latent + rope
         * rows, kv_b = H (nope + v) rows, o_proj = H v columns, q = H (nope + rope) rows */
        char prefix[PARAM_NAME_MAX];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(name) - strlen(kv_a)), name);
        const struct param_info *norm = sibling(t, prefix, "self_attn.kv_a_layernorm.weight");
        const struct param_info *kv_b = sibling(t, prefix, "self_attn.kv_b_proj.weight");
        const struct param_info *o = sibling(t, prefix, "self_attn.o_proj.weight");
        const struct param_info *q = sibling(t, prefix, "self_attn.q_b_proj.weight");
        if (!q) q = sibling(t, prefix, "self_attn.q_proj.weight");
        CHECK(norm && kv_b && o && q);
        int64_t rope = t->items[i].shape[0] - norm->shape[0];
        int64_t h_nope = kv_b->shape[0] - o->shape[1], h_rope = q->shape[0] - h_nope;
        CHECK(rope > 0 && h_rope > 0 && h_rope % rope == 0);
        d->rope_dim = (int)rope;
        d->heads = (int)(h_rope / rope);
        d->qk_head_dim = (int)(q->shape[0] / d->heads);
        return;
    }
}

/* Rows [r0, r0 + R) of a matrix with `cols` columns, between the two orders;
 * tmp holds R x cols floats. */
static void permute_block(float *w, int64_t r0, int R, int64_t cols, int to_hf, float *tmp) {
    float *block = w + r0 * cols;
    size_t row = sizeof(float) * (size_t)cols;
    memcpy(tmp, block, row * (size_t)R);
    for (int i = 0; i < R / 2; i++) {
        /* rotate_half row i pairs with row i + R/2; interleaved row 2i with 2i + 1 */
        if (to_hf) {
            memcpy(block + (2 * i) * cols, tmp + i * cols, row);
            memcpy(block + (2 * i + 1) * cols, tmp + (i + R / 2) * cols, row);
        } else {
            memcpy(block + i * cols, tmp + (2 * i) * cols, row);
            memcpy(block + (i + R / 2) * cols, tmp + (2 * i + 1) * cols, row);
        }
    }
}

int hf_rope_permute(const struct mla_dims *d, const char *name, float *w, int64_t rows, int64_t cols, int to_hf) {
    int R = d->rope_dim;
    if (R <= 0) return 0;
    int kv = ends_with(name, "self_attn.kv_a_proj_with_mqa.weight");
    int q = ends_with(name, "self_attn.q_b_proj.weight") || ends_with(name, "self_attn.q_proj.weight");
    if (!kv && !q) return 0;
    float *tmp = xmalloc(sizeof(float) * (size_t)R * (size_t)cols);
    if (kv) {
        permute_block(w, rows - R, R, cols, to_hf, tmp);
    } else {
        CHECK(rows == (int64_t)d->heads * d->qk_head_dim);
        for (int h = 0; h < d->heads; h++)
            permute_block(w, (int64_t)(h + 1) * d->qk_head_dim - R, R, cols, to_hf, tmp);
    }
    free(tmp);
    return 1;
}
