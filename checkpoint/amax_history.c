/* Delayed FP8 scaling's amax history in checkpoints (docs/checkpoints.md):
 *   "fp8_amax_history": {"length": 16, "operands": ["input", "weight", "grad"],
 *                        "sites": {"model.layers.1.self_attn.q_proj.weight": [[...], [...], [...]], ...}}
 * one array per operand, newest step first, only sites that recorded a
 * nonzero amax. Named by tensor, it fits any layout and any history length. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "config/common.h"

static const char *const operand_names[FP8_OPERANDS] = {"input", "weight", "grad"};

static const float *row(const struct fp8_history *h, int site, int op) {
    return h->amax + ((size_t)site * FP8_OPERANDS + op) * h->length;
}

void ckpt_snapshot_set_fp8(struct ckpt_snapshot *s, const struct fp8_history *h) {
    json_decref(s->fp8);
    s->fp8 = NULL;
    if (!h) return;
    json_t *sites = json_object(), *ops = json_array();
    CHECK(sites && ops);
    for (int o = 0; o < FP8_OPERANDS; o++) CHECK(json_array_append_new(ops, json_string(operand_names[o])) == 0);
    for (int i = 0; i < h->sites; i++) {
        int any = 0;
        for (int o = 0; o < FP8_OPERANDS; o++)
            for (int k = 0; k < h->length; k++) any |= row(h, i, o)[k] != 0;
        if (!any) continue;
        json_t *site = json_array();
        CHECK(site);
        for (int o = 0; o < FP8_OPERANDS; o++) {
            json_t *a = json_array();
            CHECK(a);
            for (int k = 0; k < h->length; k++) CHECK(json_array_append_new(a, json_real(row(h, i, o)[k])) == 0);
            CHECK(json_array_append_new(site, a) == 0);
        }
        CHECK(json_object_set_new(sites, h->names[i], site) == 0);
    }
    s->fp8 = json_pack("{s:i, s:o, s:o}", "length", h->length, "operands", ops, "sites", sites);
    CHECK(s->fp8);
}

/* one operand's entries into h's row (at most h->length; the rest zero) */
static int read_row(const json_t *a, struct fp8_history *h, int site, int op) {
    float *out = (float *)row(h, site, op);
    if (!json_is_array(a)) return -1;
    for (size_t k = 0; k < json_array_size(a); k++) {
        const json_t *v = json_array_get(a, k);
        double x = json_number_value(v);
        if (!json_is_number(v) || !(x >= 0) || !isfinite(x) || x > 3.4e38) return -1;
        if ((int)k < h->length) out[k] = (float)x;
    }
    return 0;
}

int checkpoint_load_fp8_history(const char *step_dir, struct fp8_history *h, char *err, size_t errlen) {
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, errlen, &rc);
    if (!rd) return -1;
    memset(h->amax, 0, sizeof *h->amax * (size_t)h->sites * FP8_OPERANDS * h->length);
    const json_t *j = ckpt_reader_field(rd, "fp8_amax_history"), *sites = json_object_get(j, "sites");
    const char *name;
    const json_t *v;
    rc = 0;
    if (j && !json_is_object(sites)) {
        snprintf(err, errlen, "%s/manifest.json: fp8_amax_history: expected an object \"sites\"", step_dir);
        rc = -1;
    }
    json_object_foreach((json_t *)sites, name, v) {
        if (rc) break;
        int site = fp8_history_find(h, name);
        if (json_is_array(v) && json_array_size(v) == FP8_OPERANDS) {
            if (site < 0) continue; /* a block this run keeps in bf16 (another fp8_skip_layers) */
            int bad = 0;
            for (int o = 0; o < FP8_OPERANDS; o++) bad |= read_row(json_array_get(v, o), h, site, o);
            if (!bad) continue;
        }
        snprintf(err, errlen, "%s/manifest.json: fp8_amax_history site %s: expected %d arrays (%s, %s, %s) of finite "
                 "non-negative numbers", step_dir, name, FP8_OPERANDS, operand_names[0], operand_names[1],
                 operand_names[2]);
        rc = -1;
    }
    if (rc) memset(h->amax, 0, sizeof *h->amax * (size_t)h->sites * FP8_OPERANDS * h->length);
    fp8_history_push(h, NULL);
    ckpt_reader_close(rd);
    return rc;
}
