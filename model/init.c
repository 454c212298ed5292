#include <math.h>
#include <stdlib.h>

#include "config/common.h"
#include "model/init.h"

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Box-Muller on two uniforms drawn from the hashed counter. */
double init_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t key = mix64(seed ^ mix64(stream + 0x9e3779b97f4a7c15ull));
    uint64_t a = mix64(key + 2 * index), b = mix64(key + 2 * index + 1);
    double u1 = ((a >> 11) + 0.5) / 9007199254740992.0; /* (0,1) */
    double u2 = (b >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Global index of local element i of a shard, so a split tensor draws the
 * same numbers it would have drawn whole. */
static uint64_t global_index(const struct param_info *p, size_t i, int tp_rank) {
    if (p->shard == SHARD_REPLICATED || p->ndim == 1) return i;
    int64_t lr = p->local_shape[0], lc = p->local_shape[1];
    int64_t r = i / lc, c = i % lc;
    if (p->shard == SHARD_TP_ROWS) r += (int64_t)p->part * lr;
    else c += (int64_t)p->part * lc;
    return (uint64_t)(r * p->shape[1] + c);
}

void params_init_each(const struct param_table *t, uint64_t seed, int tp_rank, param_put_fn put, void *ctx) {
    for (int k = 0; k < t->count; k++) {
        const struct param_info *p = &t->items[k];
        float *host = xmalloc(sizeof(float) * (p->numel ? p->numel : 1));
        uint64_t stream = hash_string(p->name);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < p->numel; i++)
            host[i] = p->kind == PARAM_NORM    ? 1.0f
                      : p->kind == PARAM_STATE ? 0.0f
                                               : (float)(p->init_std * init_normal(seed, stream, global_index(p, i, tp_rank)));
        put(ctx, k, host);
        free(host);
    }
}

void param_put_buffer(void *ctx, int i, const float *host) {
    struct param_buffer *b = ctx;
    b->be->from_host(b->buf + b->t->items[i].offset, host, sizeof(float) * b->t->items[i].numel);
}

void params_init(const struct backend *be, float *params, const struct param_table *t, uint64_t seed, int tp_rank) {
    struct param_buffer b = {be, params, t};
    params_init_each(t, seed, tp_rank, param_put_buffer, &b);
}
