#include <limits.h>
#include <math.h>
#include <string.h>

#include "config/common.h"
#include "model/optimizer.h"

static void group_init(struct opt_group *g, const struct backend *be, const struct param_table *t, int first,
                       int count, struct comm *dp, int distributed) {
    memset(g, 0, sizeof *g);
    g->first = first, g->count = count, g->dp = dp;
    g->base = count ? t->items[first].offset : 0;
    g->total = count ? t->items[first + count - 1].offset + t->items[first + count - 1].numel - g->base : 0;
    g->distributed = distributed && dp && dp->size > 1;
    g->shard_begin = g->base;
    g->shard_len = g->total;
    if (g->distributed) {
        size_t per = (g->total + dp->size - 1) / dp->size;
        per = (per + 15) / 16 * 16;
        g->shard_len = per;
        g->shard_begin = g->base + per * dp->rank;
    }
    g->m = be->alloc(sizeof(float) * (g->shard_len ? g->shard_len : 1));
    g->v = be->alloc(sizeof(float) * (g->shard_len ? g->shard_len : 1));
}

void optimizer_create(struct optimizer *o, const struct backend *be, struct master *ms,
                      const struct optimizer_config *cfg, struct comm *dp, struct comm *tp, int sequence_parallel,
                      struct comm *edp) {
    const struct param_table *t = ms->t;
    memset(o, 0, sizeof *o);
    o->be = be;
    o->table = t;
    o->master = ms;
    o->cfg = *cfg;
    o->tp = tp;
    o->sequence_parallel = sequence_parallel && tp && tp->size > 1;
    int fe = param_table_first_expert(t);
    group_init(&o->group[0], be, t, 0, fe, dp, cfg->distributed);
    o->ngroups = 1;
    if (fe < t->count) group_init(&o->group[o->ngroups++], be, t, fe, t->count - fe, edp, cfg->distributed);
    /* a sharded master (model/master.h) keeps each group's fp32 matrices over the moments' shard */
    for (int k = 0; k < o->ngroups && !ms->full; k++) {
        struct opt_group *g = &o->group[k];
        master_add_shard(ms, g->base, g->total, g->shard_begin, g->shard_len, g->distributed ? g->dp : NULL);
    }
    o->started = xcalloc(t->count ? t->count : 1, 1);
    size_t shared = param_table_shared_block_floats(t);
    if (shared) o->shared_scratch = be->alloc(sizeof(float) * shared);
}

void optimizer_free(struct optimizer *o) {
    free(o->started);
    if (o->shared_scratch) o->be->free(o->shared_scratch);
    for (int k = 0; k < o->ngroups; k++) {
        struct opt_group *g = &o->group[k];
        o->be->free(g->m);
        o->be->free(g->v);
    }
}

/* Sum, over the TP ranks holding the same block, the gradients that each saw
 * only part of: norm weights under sequence parallelism and MoE routers
 * (this rank's tokens), and kv-head blocks shared by tp/kv ranks
 * (this rank's query heads). A shared block is summed through a zero-padded
 * all-reduce over the whole TP group. */
static void reduce_shared_over_tp(struct optimizer *o, float *grads, int first, int last) {
    const struct param_table *t = o->table;
    for (int i = first; i <= last; i++) {
        const struct param_info *p = &t->items[i];
        float *g = grads + p->offset;
        if (p->expert) continue; /* a routed expert's replicas are its edp group (parallel/grid.h) */
        if (p->shard == SHARD_REPLICATED) {
            if (o->sequence_parallel || p->tp_partial) comm_all_reduce_sum(o->tp, g, p->numel);
        } else if (p->parts < t->tp) {
            size_t n = p->numel * p->parts;
            o->be->zero(o->shared_scratch, sizeof(float) * n);
            o->be->copy(o->shared_scratch + p->part * p->numel, g, sizeof(float) * p->numel);
            comm_all_reduce_sum(o->tp, o->shared_scratch, n);
            o->be->copy(g, o->shared_scratch + p->part * p->numel, sizeof(float) * p->numel);
        }
    }
}

/* the part of the group's range in this rank's shard (the last shard is short) */
static size_t shard_mine(const struct opt_group *g) {
    size_t end = g->base + g->total, mine = g->shard_begin < end ? end - g->shard_begin : 0;
    return mine > g->shard_len ? g->shard_len : mine;
}

static struct opt_group *group_of(struct optimizer *o, int item) {
    return o->ngroups > 1 && item >= o->group[1].first ? &o->group[1] : &o->group[0];
}

/* ZeRO-1: sum [begin, end) of the flat buffer over the group, each part
 * onto the rank whose shard holds it (together: a reduce-scatter) */
static void reduce_to_owners_start(struct opt_group *g, float *grads, size_t begin, size_t end) {
    int dp = g->dp->size;
    size_t *lo = xmalloc(sizeof(size_t) * 2 * dp), *n = lo + dp;
    for (int r = 0; r < dp; r++) {
        size_t a = g->base + g->shard_len * r, b = a + g->shard_len;
        if (a < begin) a = begin;
        if (b > end) b = end;
        lo[r] = a, n[r] = a < b ? b - a : 0;
    }
    comm_reduce_to_owners_start(g->dp, grads, lo, n);
    free(lo);
}

void optimizer_reduce_bucket_start(struct optimizer *o, float *grads, int first, int last) {
    const struct param_table *t = o->table;
    struct opt_group *g = group_of(o, first);
    CHECK(group_of(o, last) == g);
    reduce_shared_over_tp(o, grads, first, last);
    size_t begin = t->items[first].offset, end = t->items[last].offset + t->items[last].numel;
    if (g->dp && g->dp->size > 1) g->dp->overlapped += sizeof(float) * (end - begin);
    if (g->distributed) reduce_to_owners_start(g, grads, begin, end);
    else if (g->dp && g->dp->size > 1) comm_all_reduce_sum_start(g->dp, grads + begin, end - begin);
    memset(o->started + first, 1, last - first + 1);
}

void optimizer_reduce_grads(struct optimizer *o, float *grads) {
    const struct param_table *t = o->table;
    for (int k = 0; k < o->ngroups; k++) {
        struct opt_group *g = &o->group[k];
        int end = g->first + g->count, buckets = 0;
        for (int i = g->first; i < end; i++) buckets |= o->started[i];
        /* tensors no bucket started, in contiguous runs (under ZeRO-1 after
         * buckets: onto their owners too, so every part is summed once) */
        for (int i = g->first; i < end;) {
            if (o->started[i]) {
                i++;
                continue;
            }
            int j = i;
            while (j + 1 < end && !o->started[j + 1]) j++;
            reduce_shared_over_tp(o, grads, i, j);
            size_t begin = t->items[i].offset, stop = t->items[j].offset + t->items[j].numel;
            if (g->dp && g->dp->size > 1 && !g->distributed) comm_all_reduce_sum(g->dp, grads + begin, stop - begin);
            else if (g->distributed) reduce_to_owners_start(g, grads, begin, stop);
            i = j + 1;
        }
        if (g->dp) comm_wait_all(g->dp); /* the buckets started during backward, and the rest */
        /* under ZeRO-1 this rank's shard of grads now holds the sums (in place: no scratch) */
    }
    memset(o->started, 0, t->count);
}

/* The part of tensor p inside [begin, begin+len): local offset and length. */
static int intersect(const struct param_info *p, size_t begin, size_t len, size_t *off, size_t *n) {
    size_t lo = p->offset > begin ? p->offset : begin;
    size_t hi = p->offset + p->numel < begin + len ? p->offset + p->numel : begin + len;
    if (lo >= hi) return 0;
    *off = lo, *n = hi - lo;
    return 1;
}

static double group_sum_squares(struct optimizer *o, struct opt_group *gr, const float *grads) {
    const struct param_table *t = o->table;
    double ss = 0;
    /* DP replicas hold the same reduced gradient: count it on DP rank 0 only,
     * unless ZeRO split it into disjoint shards */
    if (!(gr->distributed || !gr->dp || gr->dp->rank == 0)) return 0;
    const float *g = grads + gr->shard_begin;
    /* adjacent counted tensors are summed in one call: on a GPU each call
     * waits for its result, so one rank's whole buffer is usually one wait */
    size_t run_off = 0, run_len = 0;
    for (int i = gr->first; i < gr->first + gr->count; i++) {
        const struct param_info *p = &t->items[i];
        if (p->stage_copy) continue; /* the first stage counts the embedding */
        /* a routed expert's slice is counted by each holder (the edp replicas above: once); a dense tensor
         * replicated over TP once, a block shared by TP ranks once */
        if (!p->expert && p->shard == SHARD_REPLICATED && t->tp_rank != 0) continue;
        if (!p->expert && p->shard != SHARD_REPLICATED && t->tp_rank % (t->tp / p->parts)) continue;
        size_t off, n;
        if (!intersect(p, gr->shard_begin, gr->shard_len, &off, &n)) continue;
        if (run_len && off == run_off + run_len) {
            run_len += n;
            continue;
        }
        if (run_len) ss += o->be->sum_squares(g + (run_off - gr->shard_begin), run_len);
        run_off = off, run_len = n;
    }
    if (run_len) ss += o->be->sum_squares(g + (run_off - gr->shard_begin), run_len);
    return ss;
}

double optimizer_grad_norm(struct optimizer *o, const float *grads, struct comm *world) {
    double ss = 0;
    for (int k = 0; k < o->ngroups; k++) ss += group_sum_squares(o, &o->group[k], grads);
    if (world) comm_all_reduce_sum_f64(world, &ss, 1);
    return sqrt(ss);
}

int optimizer_step(struct optimizer *o, const float *grads, double lr, double grad_norm, uint16_t *work) {
    struct master *ms = o->master;
    const struct backend *be = o->be;
    int fresh = work != NULL, sharded = !ms->full;
    float scale = 1.0f;
    if (o->cfg.grad_clip > 0) {
        double coef = o->cfg.grad_clip / (grad_norm + 1e-6);
        if (coef < 1.0) scale = (float)coef;
    }
    o->step++;
    for (int k = 0; k < o->ngroups; k++) {
        struct opt_group *gr = &o->group[k];
        const float *g = grads + gr->shard_begin;
        /* a sharded master's shard writes its working copy, which the gather then carries; a whole fp32
         * master under ZeRO-1 (fp32 runs: the ops read it) is gathered itself */
        uint16_t *wk = gr->distributed && !sharded ? NULL : work;
        if (gr->distributed) fresh = 0;
        /* one AdamW call per run of adjacent tensors with the same weight
         * decay and the same home of their master (an element-wise update:
         * the same numbers, far fewer calls; on a GPU, launches) */
        size_t run_off = 0, run_len = 0;
        float run_wd = 0;
        int run_item = -1, run_packed = 0;
        for (int i = gr->first; i <= gr->first + gr->count; i++) {
            const struct param_info *p = i < gr->first + gr->count ? &o->table->items[i] : NULL;
            size_t off = 0, n = 0;
            /* PARAM_STATE (the MoE expert bias) moves by its own rule, not by AdamW */
            int take = p && p->kind != PARAM_STATE && intersect(p, gr->shard_begin, gr->shard_len, &off, &n);
            float wd = p && p->kind == PARAM_NORM ? 0.0f : (float)o->cfg.weight_decay;
            int packed = p && master_packed(p);
            if (take && run_len && off == run_off + run_len && wd == run_wd && packed == run_packed) {
                run_len += n;
                continue;
            }
            if (run_len) {
                size_t j = run_off - gr->shard_begin;
                float *master = master_at(ms, k, run_item, run_off);
                be->adamw(master, g + j, gr->m + j, gr->v + j, run_len, (float)lr, (float)o->cfg.beta1,
                          (float)o->cfg.beta2, (float)o->cfg.eps, run_wd, scale, o->step, wk ? wk + run_off : NULL);
                if (sharded && !wk) /* MTRAIN_FUSED_ADAMW=0: the separate conversion, as transformer_sync_weights */
                    be->to_storage((float *)((char *)ms->work + be->act_bytes * run_off), master, run_len);
            }
            run_len = take ? n : 0, run_off = off, run_wd = wd, run_item = i, run_packed = packed;
        }
        if (!gr->distributed) continue;
        master_gather_gains(ms, k); /* the norm gains this rank's shard updated, to every rank */
        if (k == 0 && o->defer_gather) continue;
        /* every DP rank updated its slice: gather the group's parameters back, in place (in
         * pieces: the gather counts in ints) */
        size_t end = gr->base + gr->total, piece = (size_t)1 << 30;
        for (size_t at = gr->base; at < end; at += piece) {
            int ticket = optimizer_group_gather_start(o, k, at, end - at < piece ? end : at + piece);
            if (ticket) comm_wait_ticket(gr->dp, ticket);
        }
    }
    return fresh;
}

int optimizer_gather_start(struct optimizer *o, size_t begin, size_t end) {
    return optimizer_group_gather_start(o, 0, begin, end);
}

int optimizer_group_gather_start(struct optimizer *o, int k, size_t begin, size_t end) {
    struct opt_group *g = &o->group[k];
    if (!g->distributed || begin >= end) return 0;
    CHECK(end - begin <= (size_t)INT_MAX); /* MPI's int counts */
    int n = g->dp->size, *counts = xmalloc(sizeof(int) * 2 * n), *displs = counts + n;
    for (int r = 0; r < n; r++) { /* rank r's shard within [begin, end) */
        size_t lo = g->base + g->shard_len * r, hi = lo + g->shard_len;
        if (lo < begin) lo = begin;
        if (hi > end) hi = end;
        counts[r] = lo < hi ? (int)(hi - lo) : 0;
        displs[r] = lo < hi ? (int)(lo - begin) : 0;
    }
    /* what the ops read: the bf16 working copy (sharded master), or the fp32 master itself */
    size_t elem = o->be->act_bytes;
    int ticket = comm_all_gather_v_start(g->dp, (char *)o->master->work + elem * begin, elem, counts, displs);
    free(counts);
    return ticket;
}

/* Under ZeRO-1 each owner's slice of the moments reaches every rank through
 * a staging buffer of one slice, made for the call (checkpoints only). */
void optimizer_get_moments(struct optimizer *o, float *m_out, float *v_out) {
    for (int k = 0; k < o->ngroups; k++) {
        struct opt_group *g = &o->group[k];
        struct comm *dp = g->distributed ? g->dp : NULL;
        shard_to_host(o->be, dp, g->m, g->shard_len, g->total, m_out ? m_out + g->base : NULL);
        shard_to_host(o->be, dp, g->v, g->shard_len, g->total, v_out ? v_out + g->base : NULL);
    }
}

void optimizer_set_moments(struct optimizer *o, const float *m_in, const float *v_in) {
    for (int k = 0; k < o->ngroups; k++) {
        struct opt_group *g = &o->group[k];
        float *bufs[2] = {g->m, g->v};
        const float *ins[2] = {m_in, v_in};
        size_t mine = shard_mine(g);
        for (int s = 0; s < 2; s++) {
            if (!g->distributed) {
                o->be->from_host(bufs[s], ins[s] + g->base, sizeof(float) * g->total);
                continue;
            }
            o->be->zero(bufs[s], sizeof(float) * g->shard_len);
            o->be->from_host(bufs[s], ins[s] + g->shard_begin, sizeof(float) * mine);
        }
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
