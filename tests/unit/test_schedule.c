/* Pipeline schedules: every (micro batch, chunk) runs forward then backward
 * (then, under zb-h1, its weight gradients) exactly once per rank, no
 * deadlock under the send/recv rules, in-flight bound, and the bubble
 * against the analytic (pp-1)/(m+pp-1) (/vpp when interleaved) and, for
 * zb-h1, a third of 1F1B's idle time. Also the LR schedules against their
 * closed forms. */
#include <math.h>
#include <string.h>

#include "model/optimizer.h"
#include "parallel/schedule.h"
#include "tests/unit/check.h"

static enum sched_kind kind_of(int vpp) { return vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B; }

static void check_complete_kind(enum sched_kind kind, int pp, int vpp, int m) {
    char name[96];
    snprintf(name, sizeof name, "schedule_complete_%s_pp%d_vpp%d_m%d", schedule_name(kind), pp, vpp, m);
    struct sched_item s[1024];
    int ok = 1, split = kind == SCHED_ZB_H1;
    for (int r = 0; r < pp && ok; r++) {
        int n = schedule_build(s, kind, pp, vpp, r, m), fseen[64][8] = {{0}}, bseen[64][8] = {{0}}, wseen[64] = {0};
        ok &= n == (2 + split) * m * vpp;
        for (int i = 0; i < n && ok; i++) {
            if (s[i].op == SCHED_FORWARD) fseen[s[i].mb][s[i].chunk]++;
            else if (s[i].op == SCHED_BACKWARD) ok &= fseen[s[i].mb][s[i].chunk] == 1, bseen[s[i].mb][s[i].chunk]++;
            else ok &= split && bseen[s[i].mb][0] == 1, wseen[s[i].mb]++; /* W after its B */
        }
        for (int mb = 0; mb < m; mb++)
            for (int c = 0; c < vpp; c++) ok &= fseen[mb][c] == 1 && bseen[mb][c] == 1 && wseen[mb] == split;
        /* 1F1B keeps at most pp - rank micro batches in flight; zb-h1 at most pp (1F1B's on rank 0) */
        if (vpp == 1) ok &= schedule_max_in_flight(s, n, vpp) <= (split ? pp : pp - r);
        if (split && r == 0) ok &= schedule_max_in_flight(s, n, vpp) == (m < pp ? m : pp);
    }
    double bubble;
    ok &= schedule_simulate(kind, pp, vpp, m, 0, 2.0, 0.5, &bubble) == 0;
    TEST_RESULT(name, ok, "incomplete schedule, W before its B, too many in flight, or deadlock");
}
static void check_complete(int pp, int vpp, int m) { check_complete_kind(kind_of(vpp), pp, vpp, m); }

/* zb-h1 against 1F1B at equal work (F = B = W = 1 against F = 1, B = 2,
 * communication free): the idle rank-time (bubble / (1 - bubble) x the
 * same busy time) is a third of 1F1B's (the ZB-H1 paper's (pp-1)(F+B-2W)
 * against (pp-1)(F+B)) */
static void check_zb_bubble(int pp, int m) {
    char name[96];
    snprintf(name, sizeof name, "schedule_zb_h1_idle_third_pp%d_m%d", pp, m);
    double zb, plain;
    int rc = schedule_simulate(SCHED_ZB_H1, pp, 1, m, 0, 2.0, 0.5, &zb) |
             schedule_simulate(SCHED_1F1B, pp, 1, m, 0, 2.0, 0, &plain);
    double ratio = zb / (1 - zb) / (plain / (1 - plain));
    TEST_RESULT(name, rc == 0 && fabs(ratio - 1.0 / 3) < 1e-9, "idle time %.4f x 1F1B's, want 1/3 (rc %d)", ratio, rc);
}

static void check_bubble(int pp, int vpp, int m) {
    char name[96];
    snprintf(name, sizeof name, "schedule_bubble_pp%d_vpp%d_m%d", pp, vpp, m);
    double bubble, want = (double)(pp - 1) / (m * vpp + pp - 1);
    int rc = schedule_simulate(kind_of(vpp), pp, vpp, m, 0, 2.0, 0, &bubble);
    /* equal-cost stages: the simulated bubble is the analytic one */
    TEST_RESULT(name, rc == 0 && fabs(bubble - want) < 0.02, "bubble %.4f, analytic %.4f", bubble, want);
}

/* The grouped exchanges (comm_exchange, as NCCL needs them) of every layout
 * up to pp 8, vpp 4, 32 micro batches: no deadlock, and every receive meets
 * the message it expects in posting order; training and evaluation order. */
static void check_exchanges(void) {
    int layouts = 0, bad = 0, first[4] = {0};
    for (int pp = 2; pp <= 8; pp++)
        for (int vpp = 1; vpp <= 5; vpp++) /* 5: zb-h1 (vpp 1) */
            for (int m = 1; m <= 32; m++) {
                int v = vpp == 5 ? 1 : vpp;
                enum sched_kind kind = vpp == 5 ? SCHED_ZB_H1 : kind_of(vpp);
                if (v > 1 && m % pp) continue;
                for (int fwd = 0; fwd < 2; fwd++, layouts++)
                    if (schedule_simulate(kind, pp, v, m, fwd, 2.0, 0.5, NULL) != 0 && !bad++)
                        first[0] = pp, first[1] = vpp, first[2] = m, first[3] = fwd;
            }
    TEST_RESULT("schedule_exchanges_match", layouts > 400 && bad == 0,
                "%d of %d layouts deadlock or mismatch (first: pp %d vpp %d m %d%s)", bad, layouts, first[0], first[1],
                first[2], first[3] ? " forward-only" : "");
}

/* The units: interleaved schedules pair each steady forward with the
 * backward after it (an exchange around every item deadlocks them), 1F1B
 * exchanges around every item (pairing there doubles the bubble). */
static void check_units(void) {
    struct sched_item s[64];
    int n = schedule_build(s, SCHED_INTERLEAVED, 2, 2, 0, 4), pairs = 0;
    for (int i = 0; i < n; i += schedule_unit(s, n, i, 2)) pairs += schedule_unit(s, n, i, 2) == 2;
    int n1 = schedule_build(s, SCHED_1F1B, 4, 1, 1, 8), singles = 1;
    for (int i = 0; i < n1; i++) singles &= schedule_unit(s, n1, i, 1) == 1;
    /* rank 0 of pp 2, vpp 2, m 4: warm-up 4 forwards, 4 steady pairs, 4 backwards */
    TEST_RESULT("schedule_units", pairs == 4 && singles, "%d steady pairs (want 4), 1F1B singles %d", pairs, singles);
}

static void check_lr(void) {
    struct optimizer_config c = {.lr = 1.0, .min_lr = 0.1, .warmup_steps = 10};
    int steps = 110, ok = 1;
    strcpy(c.schedule, "cosine");
    ok &= fabs(lr_at(&c, steps, 0) - 0.1) < 1e-12 && fabs(lr_at(&c, steps, 9) - 1.0) < 1e-12;
    ok &= fabs(lr_at(&c, steps, 60) - (0.1 + 0.45 * (1 + cos(M_PI * 0.5)))) < 1e-12;
    ok &= fabs(lr_at(&c, steps, 110) - 0.1) < 1e-12;
    TEST_RESULT("lr_cosine", ok, "cosine schedule off");
    strcpy(c.schedule, "linear");
    TEST_RESULT("lr_linear", fabs(lr_at(&c, steps, 60) - 0.55) < 1e-12 && fabs(lr_at(&c, steps, 200) - 0.1) < 1e-12,
                "%g", lr_at(&c, steps, 60));
    strcpy(c.schedule, "constant");
    TEST_RESULT("lr_constant", lr_at(&c, steps, 100) == 1.0, "%g", lr_at(&c, steps, 100));
    strcpy(c.schedule, "wsd");
    c.wsd_decay_steps = 20;
    ok = lr_at(&c, steps, 89) == 1.0 && fabs(lr_at(&c, steps, 100) - 0.55) < 1e-12 && fabs(lr_at(&c, steps, 110) - 0.1) < 1e-12;
    TEST_RESULT("lr_wsd", ok, "%g %g", lr_at(&c, steps, 89), lr_at(&c, steps, 100));
}

int main(void) {
    int layouts[][3] = {{1, 1, 4}, {2, 1, 1}, {2, 1, 4}, {4, 1, 8}, {2, 2, 2}, {2, 2, 4}, {4, 2, 8}, {2, 3, 6}};
    for (int i = 0; i < 8; i++) check_complete(layouts[i][0], layouts[i][1], layouts[i][2]);
    check_bubble(4, 1, 8);
    check_bubble(4, 1, 16);
    check_bubble(4, 2, 8);
    check_bubble(2, 2, 4);
    int zb[][2] = {{2, 1}, {2, 4}, {2, 8}, {4, 4}, {4, 8}, {4, 16}, {8, 8}, {8, 32}, {3, 7}};
    for (int i = 0; i < 9; i++) check_complete_kind(SCHED_ZB_H1, zb[i][0], 1, zb[i][1]);
    for (int i = 2; i < 9; i++) check_zb_bubble(zb[i][0], zb[i][1]);
    check_exchanges();
    check_units();
    check_lr();
    TEST_EXIT();
}
