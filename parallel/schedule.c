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

int schedule_build(struct sched_item *out, int pp, int vpp, int rank, int m) {
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

int schedule_build_forward(struct sched_item *out, int vpp, int m) {
    int n = 0;
    for (int mb = 0; mb < m; mb++)
        for (int c = 0; c < vpp; c++) out[n++] = (struct sched_item){SCHED_FORWARD, mb, c};
    return n;
}

/* A micro batch occupies a slot from its first forward on this rank until
 * its backward through chunk 0 (the last one). */
int schedule_max_in_flight(const struct sched_item *s, int n, int vpp) {
    int live = 0, most = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].op == SCHED_FORWARD && s[i].chunk == 0) live++;
        if (s[i].op == SCHED_BACKWARD && s[i].chunk == 0) live--;
        if (live > most) most = live;
    }
    (void)vpp;
    return most ? most : 1;
}

void schedule_print(FILE *out, int pp, int vpp, int m) {
    struct sched_item *s = xmalloc(sizeof *s * 2 * m * vpp);
    for (int r = 0; r < pp; r++) {
        int n = schedule_build(s, pp, vpp, r, m);
        fprintf(out, "pipeline rank %d:", r);
        for (int i = 0; i < n; i++) fprintf(out, " %c%d.%d", s[i].op == SCHED_FORWARD ? 'F' : 'B', s[i].mb, s[i].chunk);
        fprintf(out, "\n");
    }
    free(s);
}

void schedule_print_summary(FILE *out, int pp, int vpp, int m) {
    struct sched_item *s = xmalloc(sizeof *s * 2 * m * vpp);
    int total = m * vpp;
    for (int r = 0; r < pp; r++) {
        int warmup = warmup_forwards(pp, vpp, r, m);
        int in_flight = schedule_max_in_flight(s, schedule_build(s, pp, vpp, r, m), vpp);
        char what[64];
        if (vpp > 1) snprintf(what, sizeof what, "%d micro batches x %d chunks", m, vpp);
        else snprintf(what, sizeof what, "%d micro batches", m);
        fprintf(out, "  stage %d: %s: warm-up %d forwards, steady %d forward+backward pairs, cool-down %d backwards; "
                "up to %d micro batches in flight\n", r, what, warmup, total - warmup, warmup, in_flight);
    }
    double bubble = 0;
    if (schedule_simulate(pp, vpp, m, 2.0, &bubble) == 0)
        fprintf(out, "  bubble fraction %.1f%% (simulated: a backward costs 2 forwards, communication free; ideal "
                "(pp-1)/(vpp*m+pp-1) = %.1f%%)\n", 100 * bubble, 100.0 * (pp - 1) / ((double)vpp * m + pp - 1));
    else
        fprintf(out, "  the schedule deadlocks in simulation (a bug: please report it)\n");
    free(s);
}

int schedule_simulate(int pp, int vpp, int m, double backward_cost, double *bubble) {
    int per = 2 * m * vpp, nvs = pp * vpp;
    struct sched_item *s = xmalloc(sizeof *s * per * pp);
    int *len = xcalloc(pp, sizeof *len), *pos = xcalloc(pp, sizeof *pos);
    double *clock = xcalloc(pp, sizeof *clock), busy = 0;
    /* finish time of forward / backward of (micro batch, virtual stage); < 0 = not yet */
    double *fdone = xmalloc(sizeof(double) * m * nvs), *bdone = xmalloc(sizeof(double) * m * nvs);
    for (int i = 0; i < m * nvs; i++) fdone[i] = bdone[i] = -1;
    for (int r = 0; r < pp; r++) len[r] = schedule_build(s + r * per, pp, vpp, r, m);
    int progressed = 1, rc = 0;
    while (progressed) {
        progressed = 0;
        for (int r = 0; r < pp; r++) {
            while (pos[r] < len[r]) {
                struct sched_item it = s[r * per + pos[r]];
                int vs = it.chunk * pp + r;
                double ready = clock[r];
                if (it.op == SCHED_FORWARD && vs > 0) { /* needs the previous stage's activation */
                    double t = fdone[it.mb * nvs + vs - 1];
                    if (t < 0) break;
                    ready = t > ready ? t : ready;
                }
                if (it.op == SCHED_BACKWARD && vs < nvs - 1) { /* needs the next stage's gradient */
                    double t = bdone[it.mb * nvs + vs + 1];
                    if (t < 0) break;
                    ready = t > ready ? t : ready;
                }
                double cost = it.op == SCHED_FORWARD ? 1.0 : backward_cost;
                clock[r] = ready + cost;
                busy += cost;
                (it.op == SCHED_FORWARD ? fdone : bdone)[it.mb * nvs + vs] = clock[r];
                pos[r]++;
                progressed = 1;
            }
        }
    }
    double end = 0;
    for (int r = 0; r < pp; r++) {
        if (pos[r] < len[r]) rc = -1;
        if (clock[r] > end) end = clock[r];
    }
    if (bubble) *bubble = rc ? 1.0 : 1.0 - busy / (end * pp);
    free(s), free(len), free(pos), free(clock), free(fdone), free(bdone);
    return rc;
}
