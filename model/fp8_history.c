/* Delayed FP8 scaling's amax history (model/fp8_history.h). */
#include "model/fp8_history.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/fp8.h"

#define OPS FP8_OPERANDS

/* a tensor's site name: routed experts lose their number */
static void site_name(char out[PARAM_NAME_MAX], const char *name) {
    const char *e = strstr(name, ".experts.");
    const char *d = e ? e + strlen(".experts.") : NULL;
    size_t digits = d ? strspn(d, "0123456789") : 0;
    if (!digits || d[digits] != '.') {
        snprintf(out, PARAM_NAME_MAX, "%s", name);
        return;
    }
    snprintf(out, PARAM_NAME_MAX, "%.*s%s", (int)(d - name), name, d + digits + 1);
}

/* the layer a "model.layers.N." name belongs to, -1 for others */
static int layer_of(const char *name) {
    int l, n = 0;
    return sscanf(name, "model.layers.%d.%n", &l, &n) == 1 && n > 0 ? l : -1;
}

static int cmp_name(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

void fp8_history_create(struct fp8_history *h, const struct backend *be, const struct model_config *cfg,
                        const struct param_table *local, int begin, int end, int length, int grad_e5m2) {
    memset(h, 0, sizeof *h);
    h->be = be, h->table = local, h->length = length, h->grad_e5m2 = grad_e5m2;
    CHECK(length >= 1);
    /* every rank names the same sites: those of the whole model's table */
    struct model_part part;
    struct param_table full;
    model_part_full(&part, cfg);
    param_table_build(&full, cfg, &part);
    h->names = xmalloc(sizeof *h->names * (full.count ? full.count : 1));
    for (int i = 0; i < full.count; i++) {
        const struct param_info *p = &full.items[i];
        int l = layer_of(p->name);
        if (p->ndim == 2 && p->kind == PARAM_MATRIX && l >= begin && l < end) site_name(h->names[h->sites++], p->name);
    }
    param_table_free(&full);
    qsort(h->names, h->sites, sizeof *h->names, cmp_name);
    int u = 0;
    for (int i = 0; i < h->sites; i++)
        if (!u || strcmp(h->names[u - 1], h->names[i])) memmove(h->names[u++], h->names[i], sizeof *h->names);
    h->sites = u;
    size_t n = (size_t)h->sites * OPS;
    h->amax = xcalloc(n * length + 1, sizeof *h->amax);
    h->exp = xmalloc(sizeof *h->exp * (n + 1));
    h->host = xcalloc(n + 1, sizeof *h->host);
    h->record = be->alloc(sizeof(float) * (n + 1));
    h->site_of = xmalloc(sizeof *h->site_of * (local->count ? local->count : 1));
    for (int i = 0; i < local->count; i++) {
        h->site_of[i] = fp8_history_find(h, local->items[i].name);
        /* the lookup by offset bisects the table: its offsets must ascend */
        CHECK(i == 0 || local->items[i].offset >= local->items[i - 1].offset + local->items[i - 1].numel);
    }
    fp8_history_push(h, NULL);
}

void fp8_history_free(struct fp8_history *h) {
    if (h->record) h->be->free(h->record);
    free(h->names), free(h->amax), free(h->exp), free(h->host), free(h->site_of);
    memset(h, 0, sizeof *h);
}

int fp8_history_find(const struct fp8_history *h, const char *name) {
    char key[PARAM_NAME_MAX];
    site_name(key, name);
    const char(*hit)[PARAM_NAME_MAX] = bsearch(key, h->names, h->sites, sizeof *h->names, cmp_name);
    return hit ? (int)(hit - h->names) : -1;
}

int fp8_history_site_at(const struct fp8_history *h, size_t offset) {
    const struct param_table *t = h->table;
    int lo = 0, hi = t->count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const struct param_info *p = &t->items[mid];
        if (offset < p->offset) hi = mid - 1;
        else if (offset >= p->offset + p->numel) lo = mid + 1;
        else return h->site_of[mid];
    }
    return -1;
}

void fp8_history_begin_step(struct fp8_history *h) {
    h->be->zero(h->record, sizeof(float) * h->sites * OPS);
}

void fp8_history_push(struct fp8_history *h, const float *step_amax) {
    int L = h->length;
    for (int s = 0; s < h->sites; s++)
        for (int o = 0; o < OPS; o++) {
            float *row = h->amax + ((size_t)s * OPS + o) * L, worst = 0;
            if (step_amax) {
                memmove(row + 1, row, sizeof *row * (L - 1));
                row[0] = step_amax[s * OPS + o];
            }
            for (int i = 0; i < L; i++) worst = row[i] > worst ? row[i] : worst;
            int format = o == FP8_GRAD && h->grad_e5m2 ? FP8_E5M2 : FP8_E4M3;
            h->exp[s * OPS + o] = worst > 0 && isfinite(worst) ? fp8_scale_exp(worst, format) : FP8_SCALE_CURRENT;
        }
}

int fp8_history_end_step(struct fp8_history *h, struct comm *world) {
    size_t n = (size_t)h->sites * OPS;
    h->be->to_host(h->host, h->record, sizeof(float) * n);
    /* NaN as infinity: a max over ranks then means the same everywhere */
    for (size_t i = 0; i < n; i++)
        if (!isfinite(h->host[i])) h->host[i] = INFINITY;
    comm_all_reduce_max(world, h->host, n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(h->host[i])) return 0;
    fp8_history_push(h, h->host);
    return 1;
}

struct fp8_recipe fp8_history_recipe(const struct fp8_history *h, struct fp8_recipe base, int site) {
    for (int o = 0; o < OPS; o++) base.scale_exp[o] = h->exp[site * OPS + o];
    base.amax = h->record + (size_t)site * OPS;
    return base;
}
