#include "parallel/schedule.h"

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
    return (struct sched_item){op, group * pp + within % pp, chunk};
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
    return -1;
}

const char *schedule_name(enum sched_kind kind) {
    return kind == SCHED_ZB_H1 ? "zb-h1" : kind == SCHED_INTERLEAVED ? "interleaved" : "1f1b";
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
        if (++pending > rank) out[n++] = (struct sched_item){SCHED_WEIGHTS, next_w++, 0}, pending--;
    }
    while (next_w < m) out[n++] = (struct sched_item){SCHED_WEIGHTS, next_w++, 0};
    free(base);
    return n;
}

int schedule_build(struct sched_item *out, enum sched_kind kind, int pp, int vpp, int rank, int m) {
    if (kind == SCHED_ZB_H1) {
        CHECK(vpp == 1);
        return build_zb_h1(out, pp, rank, m);
    }
    return build_1f1b(out, pp, vpp, rank, m);
}

int schedule_build_forward(struct sched_item *out, int vpp, int m) {
    int n = 0;
    for (int mb = 0; mb < m; mb++)
        for (int c = 0; c < vpp; c++) out[n++] = (struct sched_item){SCHED_FORWARD, mb, c};
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

void schedule_print(FILE *out, enum sched_kind kind, int pp, int vpp, int m) {
    struct sched_item *s = xmalloc(sizeof *s * SCHED_ITEMS(m, vpp));
    for (int r = 0; r < pp; r++) {
        int n = schedule_build(s, kind, pp, vpp, r, m);
        fprintf(out, "pipeline rank %d:", r);
        for (int i = 0; i < n; i++) fprintf(out, " %c%d.%d", "FBW"[s[i].op], s[i].mb, s[i].chunk);
        fprintf(out, "\n");
    }
    free(s);
}

void schedule_print_summary(FILE *out, enum sched_kind kind, int pp, int vpp, int m) {
    struct sched_item *s = xmalloc(sizeof *s * SCHED_ITEMS(m, vpp));
    int total = m * vpp;
    for (int r = 0; r < pp; r++) {
        int warmup = warmup_forwards(pp, vpp, r, m);
        int in_flight = schedule_max_in_flight(s, schedule_build(s, kind, pp, vpp, r, m), vpp);
        char what[64];
        if (vpp > 1) snprintf(what, sizeof what, "%d micro batches x %d chunks", m, vpp);
        else snprintf(what, sizeof what, "%d micro batches", m);
        fprintf(out, "  stage %d: %s: warm-up %d forwards, steady %d forward+backward pairs, cool-down %d backwards%s; "
                "up to %d micro batches in flight\n", r, what, warmup, total - warmup, warmup,
                kind == SCHED_ZB_H1 ? " (each W deferred by the stage's rank)" : "", in_flight);
    }
    double bubble = 0, plain = 0;
    int rc = schedule_simulate(kind, pp, vpp, m, 0, 2.0, 0.5, &bubble);
    if (rc == 0 && kind == SCHED_ZB_H1 && schedule_simulate(SCHED_1F1B, pp, 1, m, 0, 2.0, 0.5, &plain) == 0)
        fprintf(out, "  zb-h1: bubble fraction %.1f%% (simulated: F, B and W cost alike, communication free), "
                "1f1b's %.1f%%: idle time %.2fx 1f1b's (ideal 1/3)\n", 100 * bubble, 100 * plain,
                bubble / (1 - bubble) / (plain / (1 - plain)));
    else if (rc == 0)
        fprintf(out, "  bubble fraction %.1f%% (simulated: a backward costs 2 forwards, communication free; ideal "
                "(pp-1)/(vpp*m+pp-1) = %.1f%%)\n", 100 * bubble, 100.0 * (pp - 1) / ((double)vpp * m + pp - 1));
    else
        fprintf(out, "  the schedule deadlocks in simulation (a bug: please report it)\n");
    free(s);
}

struct sched_links schedule_links(struct sched_item it, int pp, int vpp, int rank) {
    int vs = it.chunk * pp + rank, last = pp * vpp - 1;
    struct sched_links l = {-1, -1};
    if (it.op == SCHED_WEIGHTS) return l;
    if (it.op == SCHED_FORWARD) {
        if (vs > 0) l.recv_from = (vs - 1) % pp;
        if (vs < last) l.send_to = (vs + 1) % pp;
    } else {
        if (vs < last) l.recv_from = (vs + 1) % pp;
        if (vs > 0) l.send_to = (vs - 1) % pp;
    }
    return l;
}

int schedule_unit(const struct sched_item *s, int n, int i, int vpp) {
    if (vpp == 1 || i + 1 >= n || s[i].op != SCHED_FORWARD || s[i + 1].op != SCHED_BACKWARD) return 1;
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
    double clock;
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
static void sim_post_group(struct sim_channels *c, struct sim_rank *r, int pp, int vpp, int me) {
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
    r->unit = r->pos < r->n ? schedule_unit(r->s, r->n, r->pos, vpp) : 0;
    for (int i = r->pos; i < r->pos + r->unit; i++) {
        struct sched_item it = r->s[i];
        struct sched_links l = schedule_links(it, pp, vpp, me);
        int vs = it.chunk * pp + me;
        if (l.recv_from >= 0)
            r->group[r->ngroup++] =
                sim_post(c, r, (struct xfer){0, l.recv_from * pp + me, 0, it.op == SCHED_BACKWARD, it.mb, vs});
    }
    r->done = !r->ngroup && !r->unit && !r->nbegun;
}

/* rank me's group, if every transfer in it has met its peer's: run the unit
 * after it (its sends wait for the next group). 1 progressed, 0 waiting, -2
 * a receive meets another message. */
static int sim_advance(struct sim_channels *c, struct sim_rank *r, int pp, int vpp, int me, const double cost[3],
                       double *busy) {
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
        struct sched_links l = schedule_links(it, pp, vpp, me);
        int vs = it.chunk * pp + me, bw = it.op == SCHED_BACKWARD;
        r->clock += cost[it.op], *busy += cost[it.op];
        if (l.send_to >= 0) r->out[r->nout++] = (struct xfer){1, me * pp + l.send_to, 0, bw, it.mb, bw ? vs - 1 : vs + 1};
    }
    r->pos += r->unit;
    sim_post_group(c, r, pp, vpp, me);
    return 1;
}

int schedule_simulate(enum sched_kind kind, int pp, int vpp, int m, int forward_only, double backward_cost,
                      double w_share, double *bubble) {
    int per = SCHED_ITEMS(m, vpp), split = kind == SCHED_ZB_H1 && !forward_only;
    const double cost[3] = {1.0, split ? backward_cost * (1 - w_share) : backward_cost, backward_cost * w_share};
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
        r[i].n = forward_only ? schedule_build_forward(s + i * per, vpp, m)
                              : schedule_build(s + i * per, kind, pp, vpp, i, m);
        sim_post_group(&c, &r[i], pp, vpp, i);
    }
    double busy = 0;
    int progressed = 1, rc = 0;
    while (progressed && !rc) {
        progressed = 0;
        for (int i = 0; i < pp && !rc; i++)
            while (!r[i].done) {
                int a = sim_advance(&c, &r[i], pp, vpp, i, cost, &busy);
                if (a < 0) rc = a;
                if (a <= 0) break;
                progressed = 1;
            }
    }
    double end = 0;
    for (int i = 0; i < pp; i++) {
        if (!rc && !r[i].done) rc = -1;
        if (r[i].clock > end) end = r[i].clock;
    }
    if (bubble) *bubble = rc ? 1.0 : 1.0 - busy / (end * pp);
    for (int d = 0; d < 2; d++) free(c.count[d]), free(c.posted[d]), free(c.at[d]);
    free(s), free(r);
    return rc;
}
