#include "parallel/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"

/* k-th forward (or backward) of a rank in interleaved order: groups of pp
 * micro batches run through chunk 0, then chunk 1, ... (backwards walk the
 * chunks in reverse). With vpp = 1 this is plain micro-batch order. */
static struct sched_item nth(int k, enum sched_op op, int pp, int vpp) {
    int group = k / (pp * vpp), within = k % (pp * vpp);
    int chunk = within / pp;
    if (op == SCHED_BACKWARD) chunk = vpp - 1 - chunk;
    return (struct sched_item){op, group * pp + within % pp, chunk, 0};
}

/* Forwards a rank runs before its first backward (then one forward, one
 * backward in turn; the same number of backwards end the step). */
static int warmup_forwards(int pp, int vpp, int rank, int m) {
    int warmup = vpp == 1 ? pp - rank - 1 : (pp - rank - 1) * 2 + (vpp - 1) * pp;
    return warmup > m * vpp ? m * vpp : warmup;
}

int schedule_kind(const char *name, int vpp) {
    if (!strcmp(name, "auto")) return vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B;
    if (!strcmp(name, "1f1b")) return SCHED_1F1B;
    if (!strcmp(name, "interleaved")) return SCHED_INTERLEAVED;
    if (!strcmp(name, "zb-h1")) return SCHED_ZB_H1;
    if (!strcmp(name, "zbv")) return SCHED_ZBV;
    if (!strcmp(name, "dualpipev")) return SCHED_DUALPIPEV;
    return -1;
}

const char *schedule_name(enum sched_kind kind) {
    return kind == SCHED_DUALPIPEV ? "dualpipev"
         : kind == SCHED_ZBV       ? "zbv"
         : kind == SCHED_ZB_H1     ? "zb-h1"
         : kind == SCHED_INTERLEAVED ? "interleaved"
                                     : "1f1b";
}

int schedule_splits(enum sched_kind kind) { return kind == SCHED_ZB_H1 || schedule_v_shaped(kind); }

int schedule_v_shaped(enum sched_kind kind) { return kind == SCHED_ZBV || kind == SCHED_DUALPIPEV; }

int schedule_stage(enum sched_kind kind, int pp, int chunk, int rank) {
    if (schedule_v_shaped(kind)) return chunk == 0 ? rank : 2 * pp - 1 - rank;
    return chunk * pp + rank;
}
static int stage_rank(enum sched_kind kind, int pp, int vs) {
    return schedule_v_shaped(kind) ? (vs < pp ? vs : 2 * pp - 1 - vs) : vs % pp;
}

/* 1F1B's order (interleaved when vpp > 1) */
static int build_1f1b(struct sched_item *out, int pp, int vpp, int rank, int m) {
    int total = m * vpp, n = 0;
    if (vpp > 1) CHECK(m % pp == 0);
    int warmup = warmup_forwards(pp, vpp, rank, m);
    int f = 0, b = 0;
    while (f < warmup) out[n++] = nth(f++, SCHED_FORWARD, pp, vpp);
    while (f < total) {
        out[n++] = nth(f++, SCHED_FORWARD, pp, vpp);
        out[n++] = nth(b++, SCHED_BACKWARD, pp, vpp);
    }
    while (b < total) out[n++] = nth(b++, SCHED_BACKWARD, pp, vpp);
    return n;
}

/* ZB-H1: 1F1B with each W `rank` backwards after its B (the last ones at
 * the end): rank r then holds up to pp - r + r = pp micro batches */
static int build_zb_h1(struct sched_item *out, int pp, int rank, int m) {
    struct sched_item *base = xmalloc(sizeof *base * 2 * m);
    int nb = build_1f1b(base, pp, 1, rank, m), n = 0, next_w = 0, pending = 0;
    for (int i = 0; i < nb; i++) {
        out[n++] = base[i];
        if (base[i].op != SCHED_BACKWARD) continue;
        if (++pending > rank) out[n++] = (struct sched_item){SCHED_WEIGHTS, next_w++, 0, 0}, pending--;
    }
    while (next_w < m) out[n++] = (struct sched_item){SCHED_WEIGHTS, next_w++, 0, 0};
    free(base);
    return n;
}

/* ZB-V's order, for every rank at once: a list scheduler over time with the
 * given F, B and W costs (the same on every rank). When a rank is free it runs, of the items whose inputs have
 * arrived, a backward (the older micro batch first: others wait for it),
 * else a forward (chunk 1's first: it takes no new slot; chunk 0's only
 * while fewer than pp micro batches are in flight on the rank, a micro
 * batch holding its slot from its chunk-0 forward to its chunk-0 W), else
 * the oldest pending W; if none is ready it waits for the next arrival.
 * Each stage runs its forwards and its backwards in micro-batch order, and
 * a rank takes the messages from each neighbour (itself at the turn) in the
 * order they were sent, as the exchanges need (no tags). */
struct zbv_rank {
    double clock;
    int next[2][2];      /* [op F/B][chunk]: next micro batch */
    int in_flight, nw, w_head, n;
    struct sched_item *w; /* pending W (FIFO) */
    struct sched_item *out; /* its order */
};

/* a message on the channel from rank `from` to `to`: (op, mb) for stage vs */
struct zbv_msg { int op, mb, vs; };

/* A V links each rank to its neighbours and itself: channel from -> to */
static int link_of(int pp, int from, int to) {
    CHECK(to >= from - 1 && to <= from + 1 && to >= 0 && to < pp);
    return from * 3 + (to - from + 1);
}

/* every rank's order, made once for the last (pp, m, costs) asked (each
 * rank's trainer, the estimate's stages and the simulation ask for it again) */
static struct { int pp, m; double cost[3]; struct sched_item *items; } zbv_cache;

/* rank k's best ready forward (fwd 1) or backward (fwd 0) and when it can start */
static int v_candidate(int pp, int m, int q, const struct zbv_rank *k, int fwd, int cap, const double *fdone,
                       const double *bdone, const struct zbv_msg *ch, const int *ch_n, const int *ch_used,
                       size_t ch_cap, struct sched_item *cand, double *cand_at) {
    int S = 2 * pp, found = 0, op = fwd ? SCHED_FORWARD : SCHED_BACKWARD;
    for (int c = 1; c >= 0; c--) {
        int mb = k->next[op][c], vs = schedule_stage(SCHED_ZBV, pp, c, q);
        if (mb >= m) continue;
        if (op == SCHED_FORWARD && c == 0 && k->in_flight >= cap) continue;
        int from_vs = op == SCHED_FORWARD ? vs - 1 : vs + 1;
        double at = op == SCHED_BACKWARD ? fdone[mb * S + vs] : 0;
        if (at < 0) continue; /* its forward has not run */
        if (from_vs >= 0 && from_vs < S) {
            double dep = op == SCHED_FORWARD ? fdone[mb * S + from_vs] : bdone[mb * S + from_vs];
            if (dep < 0) continue;
            int from = stage_rank(SCHED_ZBV, pp, from_vs), c_at = link_of(pp, from, q);
            const struct zbv_msg *head = &ch[c_at * ch_cap + ch_used[c_at]];
            if (ch_used[c_at] >= ch_n[c_at] || head->op != op || head->mb != mb || head->vs != vs) continue;
            if (dep > at) at = dep;
        }
        if (at < k->clock) at = k->clock;
        /* the older micro batch first, then chunk 1 */
        if (!found || at < *cand_at - 1e-9 || (fabs(at - *cand_at) < 1e-9 && mb < cand->mb))
            *cand = (struct sched_item){op, mb, c, 0}, *cand_at = at, found = 1;
    }
    return found;
}

static void generate_zbv(int pp, int m, const double cost[3], struct sched_item *all) {
    int S = 2 * pp, total = 3 * m * 2;
    double *fdone = xmalloc(sizeof(double) * m * S), *bdone = xmalloc(sizeof(double) * m * S);
    for (int i = 0; i < m * S; i++) fdone[i] = bdone[i] = -1;
    struct zbv_rank *r = xcalloc(pp, sizeof *r);
    size_t ch_cap = (size_t)2 * m; /* a link carries one chunk's forwards and another's backwards */
    struct zbv_msg *ch = xmalloc(sizeof *ch * (size_t)pp * 3 * ch_cap);
    int *ch_n = xcalloc((size_t)pp * 3, sizeof(int)), *ch_used = xcalloc((size_t)pp * 3, sizeof(int));
    for (int i = 0; i < pp; i++) r[i].w = xmalloc(sizeof *r[i].w * 2 * m), r[i].out = all + (size_t)i * total;
    for (int done = 0; done < pp * total;) {
        /* each rank's best item and when it can start; the rank that can start first runs it */
        int best_rank = -1;
        double best_at = 0;
        struct sched_item best = {0};
        for (int q = 0; q < pp; q++) {
            struct zbv_rank *k = &r[q];
            if (k->n == total) continue;
            /* candidates: a backward (others wait for it), else a forward, at the earliest time */
            struct sched_item cand = {0}, fw = {0};
            double cand_at = 0, fw_at = 0;
            int found = v_candidate(pp, m, q, k, 0, pp, fdone, bdone, ch, ch_n, ch_used, ch_cap, &cand, &cand_at);
            if (v_candidate(pp, m, q, k, 1, pp, fdone, bdone, ch, ch_n, ch_used, ch_cap, &fw, &fw_at) &&
                (!found || fw_at < cand_at - 1e-9))
                cand = fw, cand_at = fw_at, found = 1;
            if (k->w_head < k->nw) { /* a W is always ready (its B ran on this rank): when nothing else is */
                struct sched_item w = k->w[k->w_head];
                double at = bdone[w.mb * S + schedule_stage(SCHED_ZBV, pp, w.chunk, q)];
                if (at < k->clock) at = k->clock;
                if (!found || at < cand_at - 1e-9) cand = w, cand_at = at, found = 1;
            }
            if (!found) continue;
            if (best_rank < 0 || cand_at < best_at - 1e-9) best_rank = q, best_at = cand_at, best = cand;
        }
        CHECK(best_rank >= 0); /* some rank can always go on */
        struct zbv_rank *k = &r[best_rank];
        if (best.op == SCHED_WEIGHTS) {
            k->out[k->n++] = best, k->clock = best_at + cost[best.op], done++;
            k->w_head++;
            if (best.chunk == 0) k->in_flight--;
            continue;
        }
        double end = best_at + cost[best.op];
        int vs = schedule_stage(SCHED_ZBV, pp, best.chunk, best_rank);
        k->out[k->n++] = best, done++;
        k->next[best.op][best.chunk]++;
        if (best.op == SCHED_FORWARD && best.chunk == 0) k->in_flight++;
        int from_vs = best.op == SCHED_FORWARD ? vs - 1 : vs + 1;
        if (from_vs >= 0 && from_vs < S) ch_used[link_of(pp, stage_rank(SCHED_ZBV, pp, from_vs), best_rank)]++;
        if (best.op == SCHED_FORWARD) fdone[best.mb * S + vs] = end;
        else bdone[best.mb * S + vs] = end;
        int to_vs = best.op == SCHED_FORWARD ? vs + 1 : vs - 1;
        if (to_vs >= 0 && to_vs < S) { /* the result goes to the next stage's rank, in this order */
            int to = stage_rank(SCHED_ZBV, pp, to_vs), c_at = link_of(pp, best_rank, to);
            CHECK((size_t)ch_n[c_at] < ch_cap);
            ch[c_at * ch_cap + ch_n[c_at]++] = (struct zbv_msg){best.op, best.mb, to_vs};
        }
        k->clock = end;
        if (best.op == SCHED_BACKWARD) k->w[k->nw++] = (struct sched_item){SCHED_WEIGHTS, best.mb, best.chunk, 0};
    }
    for (int i = 0; i < pp; i++) free(r[i].w);
    free(r), free(ch), free(ch_n), free(ch_used), free(fdone), free(bdone);
}

static int build_zbv(struct sched_item *out, int pp, int rank, int m, const double cost[3]) {
    int total = 3 * m * 2;
    if (zbv_cache.pp != pp || zbv_cache.m != m || memcmp(zbv_cache.cost, cost, sizeof zbv_cache.cost)) {
        free(zbv_cache.items);
        zbv_cache.items = xmalloc(sizeof *zbv_cache.items * (size_t)pp * total);
        zbv_cache.pp = pp, zbv_cache.m = m;
        memcpy(zbv_cache.cost, cost, sizeof zbv_cache.cost);
        generate_zbv(pp, m, cost, zbv_cache.items);
    }
    memcpy(out, zbv_cache.items + (size_t)rank * total, sizeof *out * total);
    return total;
}

/* DualPipeV's order for rank r of pp (DeepSeek's published phases; needs m >= 2pp):
 *   1. 2(pp-r-1) forwards of chunk 0          2. r+1 times F0, F1
 *   3. pp-r-1 times B1 (its W at once), F1    4. m-2pp+r+1 times the pairs F0&B1, F1&B0
 *   5. pp-r-1 times B1, the pair F1&B0        6. r+1 times B1, B0 (the last r+1 B's leave their W)
 *   7. pp-r-1 times a W, B0 (its W left)      8. r+1 W's
 * A pair's backward takes its W at once; each chunk runs in micro-batch order. */
struct dual_state { struct sched_item *out; int n, next[2][2], w[64 * 1024], w_head, nw; };

static void dual_emit(struct dual_state *d, enum sched_op op, int chunk, int pair) {
    d->out[d->n++] = (struct sched_item){op, d->next[op][chunk]++, chunk, pair};
}
/* a backward, its W at once (defer 0) or left for later */
static void dual_backward(struct dual_state *d, int chunk, int defer) {
    int mb = d->next[SCHED_BACKWARD][chunk];
    dual_emit(d, SCHED_BACKWARD, chunk, 0);
    struct sched_item w = {SCHED_WEIGHTS, mb, chunk, 0};
    if (defer) {
        CHECK(d->nw < 64 * 1024);
        d->w[d->nw++] = mb * 2 + chunk;
    } else {
        d->out[d->n++] = w;
    }
}
static void dual_pending_w(struct dual_state *d) {
    CHECK(d->w_head < d->nw);
    int x = d->w[d->w_head++];
    d->out[d->n++] = (struct sched_item){SCHED_WEIGHTS, x / 2, x % 2, 0};
}
static void dual_pair(struct dual_state *d, int fchunk) {
    dual_emit(d, SCHED_FORWARD, fchunk, 1);
    dual_backward(d, 1 - fchunk, 0);
}

static int build_dualpipev(struct sched_item *out, int pp, int r, int m) {
    CHECK(m >= 2 * pp && m <= 32 * 1024);
    struct dual_state *d = xcalloc(1, sizeof *d);
    d->out = out;
    for (int i = 0; i < 2 * (pp - r - 1); i++) dual_emit(d, SCHED_FORWARD, 0, 0);
    for (int i = 0; i < r + 1; i++) dual_emit(d, SCHED_FORWARD, 0, 0), dual_emit(d, SCHED_FORWARD, 1, 0);
    for (int i = 0; i < pp - r - 1; i++) dual_backward(d, 1, 0), dual_emit(d, SCHED_FORWARD, 1, 0);
    for (int i = 0; i < m - 2 * pp + r + 1; i++) dual_pair(d, 0), dual_pair(d, 1);
    for (int i = 0; i < pp - r - 1; i++) dual_backward(d, 1, 0), dual_pair(d, 1);
    for (int i = 0; i < 2 * (r + 1); i++) dual_backward(d, i % 2 ? 0 : 1, i >= r + 1);
    for (int i = 0; i < pp - r - 1; i++) dual_pending_w(d), dual_backward(d, 0, 1);
    while (d->w_head < d->nw) dual_pending_w(d);
    int n = d->n;
    free(d);
    CHECK(n == 6 * m);
    return n;
}

static const double equal_costs[3] = {1, 1, 1};

int schedule_build_timed(struct sched_item *out, enum sched_kind kind, int pp, int vpp, int rank, int m,
                         const double cost[3]) {
    if (kind == SCHED_ZBV) {
        CHECK(vpp == 2 && cost[0] > 0 && cost[1] > 0 && cost[2] > 0);
        return build_zbv(out, pp, rank, m, cost);
    }
    return schedule_build(out, kind, pp, vpp, rank, m);
}

int schedule_build(struct sched_item *out, enum sched_kind kind, int pp, int vpp, int rank, int m) {
    if (kind == SCHED_ZBV) return schedule_build_timed(out, kind, pp, vpp, rank, m, equal_costs);
    if (kind == SCHED_DUALPIPEV) {
        CHECK(vpp == 2);
        return build_dualpipev(out, pp, rank, m);
    }
    if (kind == SCHED_ZB_H1) {
        CHECK(vpp == 1);
        return build_zb_h1(out, pp, rank, m);
    }
    return build_1f1b(out, pp, vpp, rank, m);
}

int schedule_build_forward(struct sched_item *out, int vpp, int m) {
    int n = 0;
    for (int mb = 0; mb < m; mb++)
        for (int c = 0; c < vpp; c++) out[n++] = (struct sched_item){SCHED_FORWARD, mb, c, 0};
    return n;
}

/* A micro batch occupies a slot from its first forward on this rank until
 * its backward through chunk 0 (the last one), or that backward's W when
 * the schedule splits them. */
int schedule_max_in_flight(const struct sched_item *s, int n, int vpp) {
    int live = 0, most = 0, split = 0;
    for (int i = 0; i < n; i++) split |= s[i].op == SCHED_WEIGHTS;
    enum sched_op last = split ? SCHED_WEIGHTS : SCHED_BACKWARD;
    for (int i = 0; i < n; i++) {
        if (s[i].op == SCHED_FORWARD && s[i].chunk == 0) live++;
        if (s[i].op == last && s[i].chunk == 0) live--;
        if (live > most) most = live;
    }
    (void)vpp;
    return most ? most : 1;
}

int schedule_chunk_slots(enum sched_kind kind, const struct sched_item *s, int n, int pp, int m, int per_chunk[2]) {
    if (!schedule_v_shaped(kind) || pp == 1) return 0;
    for (int c = 0; c < 2; c++) {
        int live = 0, most = 0;
        for (int i = 0; i < n; i++) {
            if (s[i].chunk != c) continue;
            live += s[i].op == SCHED_FORWARD ? 1 : s[i].op == SCHED_WEIGHTS ? -1 : 0;
            if (live > most) most = live;
        }
        per_chunk[c] = kind == SCHED_ZBV ? (pp < m ? pp : m) : most;
        if (per_chunk[c] < 1) per_chunk[c] = 1;
    }
    return 1;
}

int schedule_max_deferred(const struct sched_item *s, int n) {
    int waiting = 0, most = 0, split = 0;
    for (int i = 0; i < n; i++) split |= s[i].op == SCHED_WEIGHTS;
    for (int i = 0; i < n && split; i++) {
        waiting += s[i].op == SCHED_BACKWARD ? 1 : s[i].op == SCHED_WEIGHTS ? -1 : 0;
        if (waiting > most) most = waiting;
    }
    return most;
}

void schedule_print(FILE *out, enum sched_kind kind, int pp, int vpp, int m) {
    struct sched_item *s = xmalloc(sizeof *s * SCHED_ITEMS(m, vpp));
    for (int r = 0; r < pp; r++) {
        int n = schedule_build(s, kind, pp, vpp, r, m);
        fprintf(out, "pipeline rank %d:", r);
        for (int i = 0; i < n; i++) /* a dualpipev pair: "F3.0+B1.1" */
            fprintf(out, "%s%c%d.%d", i && s[i - 1].pair ? "+" : " ", "FBW"[s[i].op], s[i].mb, s[i].chunk);
        fprintf(out, "\n");
    }
    free(s);
}

void schedule_print_summary(FILE *out, enum sched_kind kind, int pp, int vpp, int m) {
    struct sched_item *s = xmalloc(sizeof *s * SCHED_ITEMS(m, vpp));
    int total = m * vpp;
    for (int r = 0; r < pp; r++) {
        int per_chunk[2], n = schedule_build(s, kind, pp, vpp, r, m), pairs = 0;
        int in_flight = schedule_max_in_flight(s, n, vpp);
        if (schedule_chunk_slots(kind, s, n, pp, m, per_chunk)) { /* a V: each chunk's activations apart */
            char what[160] = "each B's W when nothing else is ready";
            for (int i = 0; i < n; i++) pairs += s[i].pair;
            if (kind == SCHED_DUALPIPEV)
                snprintf(what, sizeof what, "%d forward&backward pairs overlapped (each with its W), the other B's W "
                         "when nothing else is ready", pairs);
            fprintf(out, "  rank %d: virtual stages %d and %d, %d micro batches, %s; up to %d micro batches in flight "
                    "(%d chunk-0 and %d chunk-1 activations held)\n", r, r, 2 * pp - 1 - r, m, what, in_flight,
                    per_chunk[0], per_chunk[1]);
            continue;
        }
        int warmup = warmup_forwards(pp, vpp, r, m);
        char what[64];
        if (vpp > 1) snprintf(what, sizeof what, "%d micro batches x %d chunks", m, vpp);
        else snprintf(what, sizeof what, "%d micro batches", m);
        fprintf(out, "  stage %d: %s: warm-up %d forwards, steady %d forward+backward pairs, cool-down %d backwards%s; "
                "up to %d micro batches in flight\n", r, what, warmup, total - warmup, warmup,
                kind == SCHED_ZB_H1 ? " (each W deferred by the stage's rank)" : "", in_flight);
    }
    double bubble = 0, plain = 0;
    int rc = schedule_simulate(kind, pp, vpp, m, 0, 2.0, 0.5, &bubble);
    if (rc == 0 && schedule_splits(kind) && schedule_simulate(SCHED_1F1B, pp, 1, m, 0, 2.0, 0.5, &plain) == 0)
        fprintf(out, "  %s: bubble fraction %.1f%% (simulated: F, B and W cost alike, communication free), "
                "1f1b's %.1f%%: idle time %.2fx 1f1b's (%s)\n", schedule_name(kind), 100 * bubble, 100 * plain,
                bubble / (1 - bubble) / (plain / (1 - plain)),
                kind == SCHED_ZBV         ? "1/6 when pp divides the micro batches: the V fills and drains once"
                : kind == SCHED_DUALPIPEV ? "the V fills and drains once; its pairs hide MoE all-to-alls"
                                          : "ideal 1/3");
    else if (rc == 0)
        fprintf(out, "  bubble fraction %.1f%% (simulated: a backward costs 2 forwards, communication free; ideal "
                "(pp-1)/(vpp*m+pp-1) = %.1f%%)\n", 100 * bubble, 100.0 * (pp - 1) / ((double)vpp * m + pp - 1));
    else
        fprintf(out, "  the schedule deadlocks in simulation (a bug: please report it)\n");
    if (rc == 0 && schedule_v_shaped(kind) && m % pp)
        fprintf(out, "  hint: pp %d does not divide the %d micro batches per rank: the last %d run the V with fewer "
                "in flight; a multiple of pp (train.global_batch) brings the idle time to a sixth of 1f1b's\n", pp, m,
                m % pp);
    free(s);
}

struct sched_links schedule_links(struct sched_item it, enum sched_kind kind, int pp, int vpp, int rank) {
    int vs = schedule_stage(kind, pp, it.chunk, rank), last = pp * vpp - 1;
    struct sched_links l = {-1, -1};
    if (it.op == SCHED_WEIGHTS) return l;
    if (it.op == SCHED_FORWARD) {
        if (vs > 0) l.recv_from = stage_rank(kind, pp, vs - 1);
        if (vs < last) l.send_to = stage_rank(kind, pp, vs + 1);
    } else {
        if (vs < last) l.recv_from = stage_rank(kind, pp, vs + 1);
        if (vs > 0) l.send_to = stage_rank(kind, pp, vs - 1);
    }
    return l;
}

int schedule_unit(enum sched_kind kind, const struct sched_item *s, int n, int i) {
    if (s[i].pair) return 2;
    if (kind != SCHED_INTERLEAVED || i + 1 >= n || s[i].op != SCHED_FORWARD || s[i + 1].op != SCHED_BACKWARD) return 1;
    /* steady only: when the warm-up takes every forward (m = pp), the last
     * forward and the first backward are not a pair (pairing them deadlocks) */
    int leading = 0;
    while (leading < n && s[leading].op == SCHED_FORWARD) leading++;
    return 2 * leading < n ? 2 : 1;
}

/* ---- simulation of the grouped exchanges ---- */

/* a transfer: its channel (sender * pp + receiver), its place in the
 * channel's order, and the message: kind, micro batch, receiving virtual stage */
struct xfer { int send, ch, seq, backward, mb, vs; };

struct sim_channels {          /* per channel and direction: what was posted, in order */
    int cap, *count[2];        /* [0] sends, [1] receives */
    struct xfer *posted[2];
    double *at[2];
};

struct sim_rank {
    const struct sched_item *s;
    int n, pos, unit;          /* next item; items the posted group precedes */
    struct xfer group[6], out[2], begun[2];
    int ngroup, nout, nbegun, done; /* nout: the last unit's sends, posted with the next group; nbegun: sends
                                     * begun before a W, completed with the next group */
    double clock, speed, busy; /* speed: the factor on its items' costs (schedule_simulate_speeds) */
};

static struct xfer sim_post(struct sim_channels *c, struct sim_rank *r, struct xfer x) {
    int d = !x.send, k = c->count[d][x.ch]++;
    CHECK(k < c->cap);
    x.seq = k;
    c->posted[d][(size_t)x.ch * c->cap + k] = x;
    c->at[d][(size_t)x.ch * c->cap + k] = r->clock;
    return x;
}

/* post rank me's next group: the last unit's sends and the next unit's
 * receives; before a W unit the sends are only begun (the W waits for
 * nothing) and join the group after it */
static void sim_post_group(struct sim_channels *c, struct sim_rank *r, enum sched_kind kind, int pp, int vpp, int me) {
    r->ngroup = 0;
    int w_unit = r->pos < r->n && r->s[r->pos].op == SCHED_WEIGHTS;
    for (int i = 0; i < r->nout; i++) {
        struct xfer x = sim_post(c, r, r->out[i]);
        if (w_unit) r->begun[r->nbegun++] = x;
        else r->group[r->ngroup++] = x;
    }
    r->nout = 0;
    if (!w_unit) {
        for (int i = 0; i < r->nbegun; i++) r->group[r->ngroup++] = r->begun[i];
        r->nbegun = 0;
    }
    r->unit = r->pos < r->n ? schedule_unit(kind, r->s, r->n, r->pos) : 0;
    for (int i = r->pos; i < r->pos + r->unit; i++) {
        struct sched_item it = r->s[i];
        struct sched_links l = schedule_links(it, kind, pp, vpp, me);
        int vs = schedule_stage(kind, pp, it.chunk, me);
        if (l.recv_from >= 0)
            r->group[r->ngroup++] =
                sim_post(c, r, (struct xfer){0, l.recv_from * pp + me, 0, it.op == SCHED_BACKWARD, it.mb, vs});
    }
    r->done = !r->ngroup && !r->unit && !r->nbegun;
}

/* rank me's group, if every transfer in it has met its peer's: run the unit
 * after it (its sends wait for the next group). 1 progressed, 0 waiting, -2
 * a receive meets another message. */
static int sim_advance(struct sim_channels *c, struct sim_rank *r, enum sched_kind kind, int pp, int vpp, int me,
                       const double cost[3]) {
    double t = r->clock;
    for (int i = 0; i < r->ngroup; i++) {
        struct xfer x = r->group[i];
        int d = x.send; /* the peer's direction */
        if (c->count[d][x.ch] <= x.seq) return 0;
        size_t at = (size_t)x.ch * c->cap + x.seq;
        struct xfer y = c->posted[d][at];
        if (y.backward != x.backward || y.mb != x.mb || y.vs != x.vs) return -2;
        if (c->at[d][at] > t) t = c->at[d][at];
    }
    r->clock = t;
    for (int i = r->pos; i < r->pos + r->unit; i++) {
        struct sched_item it = r->s[i];
        struct sched_links l = schedule_links(it, kind, pp, vpp, me);
        int vs = schedule_stage(kind, pp, it.chunk, me), bw = it.op == SCHED_BACKWARD;
        r->clock += cost[it.op] * r->speed, r->busy += cost[it.op] * r->speed;
        if (l.send_to >= 0) r->out[r->nout++] = (struct xfer){1, me * pp + l.send_to, 0, bw, it.mb, bw ? vs - 1 : vs + 1};
    }
    r->pos += r->unit;
    sim_post_group(c, r, kind, pp, vpp, me);
    return 1;
}

/* ---- simulation of buffered sends (zbv, dualpipev) ---- */

/* Every rank runs its units in order; a unit waits for its inputs (its
 * message on each channel, matched by tag: the receiving virtual stage and
 * direction, in micro-batch order within a tag), and its results are sent at
 * once into send buffers, never waiting for the receiver: a buffer is free
 * again when the receiver's unit begins. *most: the most buffers any rank
 * has in use at once. */
struct bmsg { int backward, mb, vs; double sent, taken; };

static int by_time(const void *a, const void *b) { /* (time, +1 sent / -1 taken): at one time, sends first */
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : y[1] > x[1] ? 1 : y[1] < x[1] ? -1 : 0;
}

int schedule_tag(enum sched_op op, int vs) { return 1 + 2 * vs + (op == SCHED_BACKWARD); }

/* the next untaken message of tag `tag` on channel c (NULL: not sent yet); cursor: where to look from */
static struct bmsg *next_tagged(struct bmsg *ch, int sent, int *cursor, int tag) {
    for (int i = *cursor; i < sent; i++) {
        struct bmsg *x = &ch[i];
        if (x->taken >= 0 || schedule_tag(x->backward ? SCHED_BACKWARD : SCHED_FORWARD, x->vs) != tag) continue;
        *cursor = i;
        return x;
    }
    *cursor = sent;
    return NULL;
}

static int simulate_buffered(enum sched_kind kind, int pp, int vpp, int m, int forward_only, const double cost[3],
                             const double *made_for, double *bubble, int *most) {
    int per = SCHED_ITEMS(m, vpp), rc = 0, tags = 2 * pp * vpp + 2;
    struct sched_item *s = xmalloc(sizeof *s * per * pp);
    int *n = xcalloc(pp, sizeof(int)), *pos = xcalloc(pp, sizeof(int));
    double *clock = xcalloc(pp, sizeof(double)), busy = 0;
    struct bmsg *ch = xmalloc(sizeof *ch * (size_t)pp * 3 * per);
    int *sent = xcalloc((size_t)pp * 3, sizeof(int)), *cursor = xcalloc((size_t)pp * 3 * tags, sizeof(int));
    for (int i = 0; i < pp; i++)
        n[i] = forward_only ? schedule_build_forward(s + i * per, vpp, m)
                            : schedule_build_timed(s + i * per, kind, pp, vpp, i, m, made_for);
    for (int progressed = 1; progressed && !rc;) {
        progressed = 0;
        for (int me = 0; me < pp && !rc; me++)
            while (pos[me] < n[me]) {
                /* a unit (an item, or a dualpipev pair): every input taken before it runs, results sent after */
                const struct sched_item *u = &s[me * per + pos[me]];
                int nu = schedule_unit(kind, u, n[me] - pos[me], 0), ready = 1;
                struct bmsg *got[SCHED_UNIT_MAX] = {0};
                double t = clock[me];
                for (int j = 0; j < nu && ready; j++) {
                    struct sched_links l = schedule_links(u[j], kind, pp, vpp, me);
                    if (l.recv_from < 0) continue;
                    int c = link_of(pp, l.recv_from, me), vs = schedule_stage(kind, pp, u[j].chunk, me);
                    int tag = schedule_tag(u[j].op, vs);
                    got[j] = next_tagged(ch + (size_t)c * per, sent[c], &cursor[c * tags + tag], tag);
                    ready = got[j] != NULL;
                    if (ready && got[j]->mb != u[j].mb) rc = -2; /* another micro batch's: out of order */
                    else if (ready && got[j]->sent > t) t = got[j]->sent;
                }
                if (!ready || rc) break; /* not sent yet */
                for (int j = 0; j < nu; j++) /* every input is taken when the unit starts */
                    if (got[j]) got[j]->taken = t;
                for (int j = 0; j < nu; j++) t += cost[u[j].op], busy += cost[u[j].op];
                clock[me] = t, pos[me] += nu, progressed = 1;
                for (int j = 0; j < nu; j++) {
                    struct sched_links l = schedule_links(u[j], kind, pp, vpp, me);
                    int vs = schedule_stage(kind, pp, u[j].chunk, me), bw = u[j].op == SCHED_BACKWARD;
                    if (l.send_to < 0) continue;
                    int c = link_of(pp, me, l.send_to);
                    ch[(size_t)c * per + sent[c]++] = (struct bmsg){bw, u[j].mb, bw ? vs - 1 : vs + 1, t, -1};
                }
            }
    }
    double end = 0;
    for (int i = 0; i < pp; i++) {
        if (!rc && pos[i] < n[i]) rc = -1;
        if (clock[i] > end) end = clock[i];
    }
    if (bubble) *bubble = rc ? 1.0 : 1.0 - busy / (end * pp);
    if (most) { /* per sender, a sweep over its sends and takes: the most in use at one time */
        *most = 0;
        double *ev = xmalloc(sizeof(double) * 2 * 2 * 3 * per);
        for (int from = 0; from < pp && !rc; from++) {
            int ne = 0;
            for (int c = from * 3; c < from * 3 + 3; c++)
                for (int i = 0; i < sent[c]; i++) {
                    struct bmsg *y = &ch[(size_t)c * per + i];
                    ev[2 * ne] = y->sent, ev[2 * ne++ + 1] = 1;
                    ev[2 * ne] = y->taken, ev[2 * ne++ + 1] = -1;
                }
            qsort(ev, ne, 2 * sizeof(double), by_time);
            for (int i = 0, live = 0; i < ne; i++)
                if ((live += (int)ev[2 * i + 1]) > *most) *most = live;
        }
        free(ev);
    }
    free(s), free(n), free(pos), free(clock), free(ch), free(sent), free(cursor);
    return rc;
}

int schedule_send_buffers(enum sched_kind kind, int pp, int vpp, int m, const double cost[3], int grouped) {
    if (!SCHED_BUFFERED(kind)) return grouped ? SCHED_UNIT_MAX : 2 * SCHED_UNIT_MAX;
    if (!cost) cost = equal_costs;
    int train = 0, eval = 0;
    CHECK(simulate_buffered(kind, pp, vpp, m, 0, cost, cost, NULL, &train) == 0);
    CHECK(simulate_buffered(kind, pp, vpp, m, 1, cost, cost, NULL, &eval) == 0);
    /* a dualpipev pair takes two buffers at once: one more spare */
    return (train > eval ? train : eval) + (kind == SCHED_DUALPIPEV ? 2 : 1);
}

int schedule_simulate(enum sched_kind kind, int pp, int vpp, int m, int forward_only, double backward_cost,
                      double w_share, double *bubble) {
    return schedule_simulate_timed(kind, pp, vpp, m, forward_only, backward_cost, w_share, equal_costs, bubble);
}

/* the grouped kinds' simulation: each rank's busy time (busy[pp]) and the span */
static int simulate_grouped(enum sched_kind kind, int pp, int vpp, int m, int forward_only, const double cost[3],
                            const double *speed, double *busy, double *span) {
    int per = SCHED_ITEMS(m, vpp);
    struct sched_item *s = xmalloc(sizeof *s * per * pp);
    struct sim_rank *r = xcalloc(pp, sizeof *r);
    struct sim_channels c = {.cap = per};
    for (int d = 0; d < 2; d++) {
        c.count[d] = xcalloc((size_t)pp * pp, sizeof(int));
        c.posted[d] = xmalloc(sizeof(struct xfer) * pp * pp * per);
        c.at[d] = xmalloc(sizeof(double) * pp * pp * per);
    }
    for (int i = 0; i < pp; i++) {
        r[i].s = s + i * per;
        r[i].speed = speed ? speed[i] : 1.0;
        r[i].n = forward_only ? schedule_build_forward(s + i * per, vpp, m)
                              : schedule_build(s + i * per, kind, pp, vpp, i, m);
        sim_post_group(&c, &r[i], kind, pp, vpp, i);
    }
    int progressed = 1, rc = 0;
    while (progressed && !rc) {
        progressed = 0;
        for (int i = 0; i < pp && !rc; i++)
            while (!r[i].done) {
                int a = sim_advance(&c, &r[i], kind, pp, vpp, i, cost);
                if (a < 0) rc = a;
                if (a <= 0) break;
                progressed = 1;
            }
    }
    *span = 0;
    for (int i = 0; i < pp; i++) {
        if (!rc && !r[i].done) rc = -1;
        if (r[i].clock > *span) *span = r[i].clock;
        busy[i] = r[i].busy;
    }
    for (int d = 0; d < 2; d++) free(c.count[d]), free(c.posted[d]), free(c.at[d]);
    free(s), free(r);
    return rc;
}

int schedule_simulate_timed(enum sched_kind kind, int pp, int vpp, int m, int forward_only, double backward_cost,
                            double w_share, const double made_for[3], double *bubble) {
    int split = schedule_splits(kind) && !forward_only;
    const double cost[3] = {1.0, split ? backward_cost * (1 - w_share) : backward_cost, backward_cost * w_share};
    if (SCHED_BUFFERED(kind)) return simulate_buffered(kind, pp, vpp, m, forward_only, cost, made_for, bubble, NULL);
    double *busy = xmalloc(sizeof *busy * pp), span, all = 0;
    int rc = simulate_grouped(kind, pp, vpp, m, forward_only, cost, NULL, busy, &span);
    for (int i = 0; i < pp; i++) all += busy[i];
    if (bubble) *bubble = rc ? 1.0 : 1.0 - all / (span * pp);
    free(busy);
    return rc;
}

int schedule_simulate_speeds(enum sched_kind kind, int pp, int vpp, int m, double backward_cost, double w_share,
                             const double *speed, double *busy, double *span) {
    CHECK(!SCHED_BUFFERED(kind));
    const double cost[3] = {1.0, schedule_splits(kind) ? backward_cost * (1 - w_share) : backward_cost,
                            backward_cost * w_share};
    return simulate_grouped(kind, pp, vpp, m, 0, cost, speed, busy, span);
}
