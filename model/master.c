#include <string.h>

#include "config/common.h"
#include "model/master.h"

/* the working copy's conversion goes through a device buffer of at most
 * this many floats (init and loads only: bounded, not per model) */
#define MASTER_STAGE_FLOATS ((size_t)1 << 22)

int master_packed(const struct param_info *p) { return p->kind != PARAM_MATRIX; }

void master_create(struct master *ms, const struct backend *be, const struct param_table *t, float *full,
                   void *work) {
    memset(ms, 0, sizeof *ms);
    ms->be = be, ms->t = t, ms->full = full, ms->work = work;
    if (full) return;
    ms->gain_at = xcalloc(t->count ? t->count : 1, sizeof *ms->gain_at);
    for (int i = 0; i < t->count; i++)
        if (master_packed(&t->items[i])) ms->gain_at[i] = ms->ngains, ms->ngains += t->items[i].numel;
    ms->gains = be->alloc(sizeof(float) * (ms->ngains ? ms->ngains : 1));
}

void master_free(struct master *ms) {
    for (int k = 0; k < ms->nshards; k++) {
        ms->be->free(ms->shard[k].buf);
        free(ms->shard[k].gain_counts);
    }
    if (ms->gains) ms->be->free(ms->gains);
    free(ms->gain_at);
}

/* gains at flat offsets below `flat` (packed keeps the table's order) */
static size_t gains_before(const struct master *ms, size_t flat) {
    size_t n = 0;
    for (int i = 0; i < ms->t->count; i++) {
        const struct param_info *p = &ms->t->items[i];
        if (!master_packed(p) || p->offset >= flat) continue;
        n += flat - p->offset < p->numel ? flat - p->offset : p->numel;
    }
    return n;
}

void master_add_shard(struct master *ms, size_t base, size_t total, size_t begin, size_t len, struct comm *dp) {
    CHECK(!ms->full && ms->nshards < MASTER_GROUPS);
    struct master_shard *s = &ms->shard[ms->nshards++];
    s->base = base, s->total = total, s->begin = begin, s->len = len;
    s->dp = dp && dp->size > 1 ? dp : NULL;
    s->buf = ms->be->alloc(sizeof(float) * (len ? len : 1));
    int n = s->dp ? s->dp->size : 1;
    s->gain_counts = xmalloc(sizeof(int) * 2 * n), s->gain_displs = s->gain_counts + n;
    for (int r = 0; r < n; r++) {
        size_t lo = base + len * r, hi = lo + len, end = base + total;
        if (lo > end) lo = end;
        if (hi > end) hi = end;
        size_t a = gains_before(ms, lo), b = gains_before(ms, hi);
        s->gain_displs[r] = (int)a, s->gain_counts[r] = (int)(b - a);
    }
}

static int shard_of(const struct master *ms, size_t off) {
    for (int k = 0; k < ms->nshards; k++)
        if (off >= ms->shard[k].base && off < ms->shard[k].base + ms->shard[k].total) return k;
    CHECK(0);
    return -1;
}

float *master_at(struct master *ms, int k, int i, size_t off) {
    const struct param_info *p = &ms->t->items[i];
    if (ms->full) return ms->full + off;
    if (master_packed(p)) return ms->gains + ms->gain_at[i] + (off - p->offset);
    const struct master_shard *s = &ms->shard[k];
    CHECK(off >= s->begin && off < s->begin + s->len);
    return s->buf + (off - s->begin);
}

void master_put(void *ctx, int i, const float *host) {
    struct master *ms = ctx;
    const struct backend *be = ms->be;
    const struct param_info *p = &ms->t->items[i];
    if (ms->full) {
        be->from_host(ms->full + p->offset, host, sizeof(float) * p->numel);
        return;
    }
    if (master_packed(p)) {
        be->from_host(ms->gains + ms->gain_at[i], host, sizeof(float) * p->numel);
    } else if (p->numel) {
        const struct master_shard *s = &ms->shard[shard_of(ms, p->offset)];
        size_t lo = p->offset > s->begin ? p->offset : s->begin, hi = p->offset + p->numel;
        if (hi > s->begin + s->len) hi = s->begin + s->len;
        if (lo < hi) be->from_host(s->buf + (lo - s->begin), host + (lo - p->offset), sizeof(float) * (hi - lo));
    }
    /* the working copy: the same conversion as transformer_sync_weights */
    size_t chunk = p->numel < MASTER_STAGE_FLOATS ? p->numel : MASTER_STAGE_FLOATS;
    if (!chunk) return;
    float *stage = be->alloc(sizeof(float) * chunk);
    for (size_t at = 0; at < p->numel; at += chunk) {
        size_t n = p->numel - at < chunk ? p->numel - at : chunk;
        be->from_host(stage, host + at, sizeof(float) * n);
        be->to_storage((float *)((char *)ms->work + be->act_bytes * (p->offset + at)), stage, n);
    }
    be->free(stage);
}

void master_put_all(struct master *ms, const float *host) {
    for (int i = 0; i < ms->t->count; i++) master_put(ms, i, host + ms->t->items[i].offset);
}

/* floats a rank that keeps nothing receives at a time (16 MiB) */
#define SHARD_PART ((size_t)4 << 20)

void shard_to_host(const struct backend *be, struct comm *dp, const float *buf, size_t len, size_t total,
                   float *out) {
    if (!dp || dp->size == 1) {
        if (out) be->to_host(out, buf, sizeof(float) * total);
        return;
    }
    if (be->host_view) { /* host memory (the CPU backend): each piece is broadcast where it goes, no staging */
        /* in parts of a bounded size (the same on every rank: they are collectives), which a rank that keeps
         * nothing receives into one scratch part */
        size_t part = len < SHARD_PART ? len : SHARD_PART;
        float *scratch = out ? NULL : xmalloc(sizeof(float) * (part ? part : 1));
        for (int r = 0; r < dp->size; r++) {
            size_t at = len * r, n = at < total ? total - at : 0;
            if (n > len) n = len;
            if (r == dp->rank && n && out) be->to_host(out + at, buf, sizeof(float) * n);
            for (size_t o = 0; o < n; o += part) {
                size_t k = n - o < part ? n - o : part;
                /* (the owner's own piece is only read) */
                float *to = out ? out + at + o : r == dp->rank ? (float *)buf + o : scratch;
                comm_broadcast(dp, to, sizeof(float) * k, r);
            }
        }
        free(scratch);
        return;
    }
    float *stage = be->alloc(sizeof(float) * (len ? len : 1));
    for (int r = 0; r < dp->size; r++) {
        size_t at = len * r, n = at < total ? total - at : 0;
        if (n > len) n = len;
        if (r == dp->rank) be->copy(stage, buf, sizeof(float) * len);
        comm_broadcast(dp, stage, sizeof(float) * len, r);
        if (out) be->to_host(out + at, stage, sizeof(float) * n);
    }
    be->free(stage);
}

void master_to_host(struct master *ms, float *host) {
    const struct backend *be = ms->be;
    const struct param_table *t = ms->t;
    if (ms->full) {
        if (host) be->to_host(host, ms->full, sizeof(float) * t->total);
        return;
    }
    for (int k = 0; k < ms->nshards; k++) {
        struct master_shard *s = &ms->shard[k];
        shard_to_host(be, s->dp, s->buf, s->len, s->total, host ? host + s->base : NULL);
    }
    for (int i = 0; host && i < t->count; i++) /* over the unused slots the shards carried */
        if (master_packed(&t->items[i]))
            be->to_host(host + t->items[i].offset, ms->gains + ms->gain_at[i], sizeof(float) * t->items[i].numel);
}

void master_gather_gains(struct master *ms, int k) {
    struct master_shard *s = &ms->shard[k];
    int any = 0;
    for (int r = 0; !ms->full && s->dp && r < s->dp->size; r++) any |= s->gain_counts[r] > 0;
    if (!any) return; /* no norm or state tensor in the group (the routed experts) */
    comm_wait_ticket(s->dp, comm_all_gather_v_start(s->dp, ms->gains, sizeof(float), s->gain_counts, s->gain_displs));
}
