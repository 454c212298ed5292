#include <math.h>
#include <string.h>

#include "config/common.h"
#include "model/optimizer.h"

void optimizer_create(struct optimizer *o, const struct backend *be, const struct param_table *t,
                      const struct optimizer_config *cfg, struct comm *dp, struct comm *tp, int sequence_parallel) {
    memset(o, 0, sizeof *o);
    o->be = be;
    o->table = t;
    o->cfg = *cfg;
    o->dp = dp, o->tp = tp;
    o->sequence_parallel = sequence_parallel && tp && tp->size > 1;
    o->distributed = cfg->distributed && dp && dp->size > 1;
    o->shard_begin = 0;
    o->shard_len = t->total;
    if (o->distributed) {
        size_t per = (t->total + dp->size - 1) / dp->size;
        per = (per + 15) / 16 * 16;
        o->shard_len = per;
        o->shard_begin = per * dp->rank;
        o->grad_shard = be->alloc(sizeof(float) * per);
        o->flat = be->alloc(sizeof(float) * per * dp->size);
    }
    o->started = xcalloc(t->count ? t->count : 1, 1);
    size_t shared = 0; /* the largest tensor whose blocks are shared by several TP ranks */
    for (int i = 0; i < t->count; i++)
        if (t->items[i].shard != SHARD_REPLICATED && t->items[i].parts < t->tp && t->items[i].numel * t->items[i].parts > shared)
            shared = t->items[i].numel * t->items[i].parts;
    if (shared) o->shared_scratch = be->alloc(sizeof(float) * shared);
    o->m = be->alloc(sizeof(float) * (o->shard_len ? o->shard_len : 1));
    o->v = be->alloc(sizeof(float) * (o->shard_len ? o->shard_len : 1));
}

void optimizer_free(struct optimizer *o) {
    free(o->started);
    if (o->shared_scratch) o->be->free(o->shared_scratch);
    o->be->free(o->m);
    o->be->free(o->v);
    if (o->distributed) {
        o->be->free(o->grad_shard);
        o->be->free(o->flat);
    }
}

/* Sum, over the TP ranks holding the same block, the gradients that each saw
 * only part of: norm weights under sequence parallelism (this rank's tokens),
 * and kv-head blocks shared by tp/kv ranks (this rank's query heads). A shared
 * block is summed through a zero-padded all-reduce over the whole TP group. */
static void reduce_shared_over_tp(struct optimizer *o, float *grads, int first, int last) {
    const struct param_table *t = o->table;
    for (int i = first; i <= last; i++) {
        const struct param_info *p = &t->items[i];
        float *g = grads + p->offset;
        if (p->shard == SHARD_REPLICATED) {
            if (o->sequence_parallel) comm_all_reduce_sum(o->tp, g, p->numel);
        } else if (p->parts < t->tp) {
            size_t n = p->numel * p->parts;
            o->be->zero(o->shared_scratch, sizeof(float) * n);
            o->be->copy(o->shared_scratch + p->part * p->numel, g, sizeof(float) * p->numel);
            comm_all_reduce_sum(o->tp, o->shared_scratch, n);
            o->be->copy(g, o->shared_scratch + p->part * p->numel, sizeof(float) * p->numel);
        }
    }
}

void optimizer_reduce_bucket_start(struct optimizer *o, float *grads, int first, int last) {
    const struct param_table *t = o->table;
    if (o->distributed) return;
    reduce_shared_over_tp(o, grads, first, last);
    size_t begin = t->items[first].offset, end = t->items[last].offset + t->items[last].numel;
    if (o->dp && o->dp->size > 1) comm_all_reduce_sum_start(o->dp, grads + begin, end - begin);
    memset(o->started + first, 1, last - first + 1);
}

void optimizer_reduce_grads(struct optimizer *o, float *grads) {
    const struct param_table *t = o->table;
    /* tensors no bucket started, in contiguous runs */
    for (int i = 0; i < t->count;) {
        if (o->started[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j + 1 < t->count && !o->started[j + 1]) j++;
        reduce_shared_over_tp(o, grads, i, j);
        if (o->dp && o->dp->size > 1 && !o->distributed)
            comm_all_reduce_sum(o->dp, grads + t->items[i].offset, t->items[j].offset + t->items[j].numel - t->items[i].offset);
        i = j + 1;
    }
    if (o->dp) comm_wait_all(o->dp); /* the buckets started during backward */
    memset(o->started, 0, t->count);
    if (!o->dp || o->dp->size == 1 || !o->distributed) return;
    o->be->zero(o->flat, sizeof(float) * o->shard_len * o->dp->size);
    o->be->copy(o->flat, grads, sizeof(float) * t->total);
    comm_reduce_scatter_sum(o->dp, o->flat, o->grad_shard, o->shard_len);
}

/* The part of tensor p inside [begin, begin+len): local offset and length. */
static int intersect(const struct param_info *p, size_t begin, size_t len, size_t *off, size_t *n) {
    size_t lo = p->offset > begin ? p->offset : begin;
    size_t hi = p->offset + p->numel < begin + len ? p->offset + p->numel : begin + len;
    if (lo >= hi) return 0;
    *off = lo, *n = hi - lo;
    return 1;
}

double optimizer_grad_norm(struct optimizer *o, const float *grads, struct comm *world) {
    const struct param_table *t = o->table;
    double ss = 0;
    /* DP replicas hold the same reduced gradient: count it on DP rank 0 only,
     * unless ZeRO split it into disjoint shards */
    int count_dp = o->distributed || !o->dp || o->dp->rank == 0;
    const float *g = o->distributed ? o->grad_shard : grads;
    /* adjacent counted tensors are summed in one call: on a GPU each call
     * waits for its result, so one rank's whole buffer is usually one wait */
    size_t run_off = 0, run_len = 0;
    for (int i = 0; i < t->count && count_dp; i++) {
        const struct param_info *p = &t->items[i];
        if (p->shard == SHARD_REPLICATED && t->tp_rank != 0) continue; /* the same on every TP rank */
        if (p->shard != SHARD_REPLICATED && t->tp_rank % (t->tp / p->parts)) continue; /* a shared block: once */
        size_t off, n;
        if (!intersect(p, o->shard_begin, o->shard_len, &off, &n)) continue;
        if (run_len && off == run_off + run_len) {
            run_len += n;
            continue;
        }
        if (run_len) ss += o->be->sum_squares(g + (run_off - o->shard_begin), run_len);
        run_off = off, run_len = n;
    }
    if (run_len) ss += o->be->sum_squares(g + (run_off - o->shard_begin), run_len);
    if (world) comm_all_reduce_sum_f64(world, &ss, 1);
    return sqrt(ss);
}

void optimizer_step(struct optimizer *o, float *params, const float *grads, double lr, double grad_norm) {
    float scale = 1.0f;
    if (o->cfg.grad_clip > 0) {
        double coef = o->cfg.grad_clip / (grad_norm + 1e-6);
        if (coef < 1.0) scale = (float)coef;
    }
    o->step++;
    const float *g = o->distributed ? o->grad_shard : grads;
    for (int i = 0; i < o->table->count; i++) {
        const struct param_info *p = &o->table->items[i];
        size_t off, n;
        if (!intersect(p, o->shard_begin, o->shard_len, &off, &n)) continue;
        size_t k = off - o->shard_begin;
        float wd = p->kind == PARAM_NORM ? 0.0f : (float)o->cfg.weight_decay;
        o->be->adamw(params + off, g + k, o->m + k, o->v + k, n, (float)lr, (float)o->cfg.beta1, (float)o->cfg.beta2,
                     (float)o->cfg.eps, wd, scale, o->step);
    }
    if (!o->distributed) return;
    /* every DP rank updated its slice: gather the whole parameter buffer back */
    size_t total = o->table->total, mine = o->shard_begin < total ? total - o->shard_begin : 0;
    if (mine > o->shard_len) mine = o->shard_len;
    o->be->zero(o->grad_shard, sizeof(float) * o->shard_len); /* reused as the send buffer */
    o->be->copy(o->grad_shard, params + o->shard_begin, sizeof(float) * mine);
    comm_all_gather(o->dp, o->grad_shard, o->flat, o->shard_len);
    o->be->copy(params, o->flat, sizeof(float) * total);
}

void optimizer_get_moments(struct optimizer *o, float *m_out, float *v_out) {
    size_t total = o->table->total;
    if (!o->distributed) {
        o->be->to_host(m_out, o->m, sizeof(float) * total);
        o->be->to_host(v_out, o->v, sizeof(float) * total);
        return;
    }
    float *bufs[2] = {o->m, o->v}, *outs[2] = {m_out, v_out};
    for (int k = 0; k < 2; k++) {
        comm_all_gather(o->dp, bufs[k], o->flat, o->shard_len);
        o->be->to_host(outs[k], o->flat, sizeof(float) * total);
    }
}

void optimizer_set_moments(struct optimizer *o, const float *m_in, const float *v_in) {
    size_t total = o->table->total;
    if (!o->distributed) {
        o->be->from_host(o->m, m_in, sizeof(float) * total);
        o->be->from_host(o->v, v_in, sizeof(float) * total);
        return;
    }
    float *bufs[2] = {o->m, o->v};
    const float *ins[2] = {m_in, v_in};
    size_t mine = o->shard_begin < total ? total - o->shard_begin : 0;
    if (mine > o->shard_len) mine = o->shard_len;
    for (int k = 0; k < 2; k++) {
        o->be->zero(bufs[k], sizeof(float) * o->shard_len);
        o->be->from_host(bufs[k], ins[k] + o->shard_begin, sizeof(float) * mine);
    }
}

/* Warmup is linear from lr/warmup to lr; then the schedule runs from lr down
 * to min_lr over [warmup, decay_steps). wsd holds lr until the last
 * wsd_decay_steps of the run, then decays linearly to min_lr. */
double lr_at(const struct optimizer_config *c, int total_steps, int step) {
    if (step < c->warmup_steps) return c->lr * (step + 1) / c->warmup_steps;
    const char *s = c->schedule;
    if (!strcmp(s, "constant")) return c->lr;
    if (!strcmp(s, "wsd")) {
        int start = total_steps - c->wsd_decay_steps;
        if (step < start || c->wsd_decay_steps == 0) return c->lr;
        double p = (double)(step - start) / c->wsd_decay_steps;
        return c->lr - (c->lr - c->min_lr) * (p > 1 ? 1 : p);
    }
    int end = c->decay_steps > 0 ? c->decay_steps : total_steps;
    double span = end - c->warmup_steps;
    double p = span > 0 ? (step - c->warmup_steps) / span : 1.0;
    if (p > 1) p = 1;
    if (!strcmp(s, "linear")) return c->lr - (c->lr - c->min_lr) * p;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1 + cos(M_PI * p)); /* cosine */
}
