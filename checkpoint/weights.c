#include <string.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "config/common.h"

void weights_load(const struct backend *be, float *buf, const struct param_table *t, const char *path) {
    struct st_file f;
    char err[1024];
    if (safetensors_open(&f, path, err, sizeof err) != 0) die("%s", err);
    for (int i = 0; i < t->count; i++) {
        const struct param_info *p = &t->items[i];
        const struct st_entry *e = safetensors_find(&f, p->name);
        if (!e) die("%s: tensor %s is missing", path, p->name);
        int ok = e->ndim == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = e->shape[d] == p->shape[d];
        if (!ok) {
            die("%s: tensor %s has shape [%lld%s%lld], the recipe needs [%lld%s%lld]", path, p->name,
                (long long)e->shape[0], e->ndim > 1 ? ", " : "", e->ndim > 1 ? (long long)e->shape[1] : 0LL,
                (long long)p->shape[0], p->ndim > 1 ? ", " : "", p->ndim > 1 ? (long long)p->shape[1] : 0LL);
        }
        CHECK(p->shard == SHARD_REPLICATED || p->numel == (size_t)(p->shape[0] * (p->ndim > 1 ? p->shape[1] : 1)));
        float *host = xmalloc(sizeof(float) * p->numel);
        if (safetensors_read_f32(&f, e, host, err, sizeof err) != 0) die("%s", err);
        be->from_host(buf + p->offset, host, sizeof(float) * p->numel);
        free(host);
    }
    safetensors_close(&f);
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
