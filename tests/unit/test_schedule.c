/* Pipeline schedules: every (micro batch, chunk) runs forward then backward
 * (then, under zb-h1, its weight gradients) exactly once per rank, no
 * deadlock under the send/recv rules, in-flight bound, and the bubble
 * against the analytic (pp-1)/(m+pp-1) (/vpp when interleaved) and, for
 * zb-h1, a third of 1F1B's idle time, for zbv a sixth (pp dividing m); dualpipev's phases, pairs and
 * idle time. Also the LR schedules against their closed forms. */
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
    int ok = 1, split = schedule_splits(kind);
    for (int r = 0; r < pp && ok; r++) {
        int n = schedule_build(s, kind, pp, vpp, r, m), fseen[64][8] = {{0}}, bseen[64][8] = {{0}}, wseen[64][8] = {{0}};
        ok &= n == (2 + split) * m * vpp;
        for (int i = 0; i < n && ok; i++) {
            int mb = s[i].mb, c = s[i].chunk;
            if (s[i].op == SCHED_FORWARD) fseen[mb][c]++;
            else if (s[i].op == SCHED_BACKWARD) ok &= fseen[mb][c] == 1, bseen[mb][c]++;
            else ok &= split && bseen[mb][c] == 1, wseen[mb][c]++; /* W after its B */
            /* a micro batch's slot is released at chunk 0's W: every chunk's W comes before it */
            if (s[i].op == SCHED_WEIGHTS && c == 0)
                for (int k = 1; k < vpp; k++) ok &= wseen[mb][k] == 1;
        }
        for (int mb = 0; mb < m; mb++)
            for (int c = 0; c < vpp; c++) ok &= fseen[mb][c] == 1 && bseen[mb][c] == 1 && wseen[mb][c] == split;
        /* 1F1B keeps at most pp - rank micro batches in flight; zb-h1 and zbv at most pp (1F1B's on rank 0);
         * dualpipev 2pp - rank (its first 2(pp-rank)-1 chunk-0 forwards fill the V) */
        if (kind == SCHED_DUALPIPEV) ok &= schedule_max_in_flight(s, n, vpp) <= 2 * pp - r;
        else if (vpp == 1 || kind == SCHED_ZBV) ok &= schedule_max_in_flight(s, n, vpp) <= (split ? pp : pp - r);
        if (kind == SCHED_ZB_H1 && r == 0) ok &= schedule_max_in_flight(s, n, vpp) == (m < pp ? m : pp);
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

/* zb-h1 against 1F1B (F = B = W) with one rank's items `slow` times as
 * long (the ranks of scripts/bench/pipeline_schedules.sh run at unequal
 * speeds): the bubble beyond the slowest stage, pp x (span - the slowest
 * rank's busy time), stays a third of 1F1B's, while the sum of every
 * rank's idle time in the span grows with the faster ranks' waits for the
 * slow one (both measures equal at equal speeds) */
static void check_zb_unequal_ranks(int pp, int m, int slow_rank, double slow) {
    char name[112];
    snprintf(name, sizeof name, "schedule_zb_h1_unequal_ranks_pp%d_m%d_rank%d_x%.2f", pp, m, slow_rank, slow);
    double speed[8], busy[8], slowest[2], idle[2];
    for (int i = 0; i < pp; i++) speed[i] = i == slow_rank ? slow : 1.0;
    int rc = 0;
    for (int k = 0; k < 2; k++) {
        double span, most = 0;
        idle[k] = 0;
        rc |= schedule_simulate_speeds(k ? SCHED_ZB_H1 : SCHED_1F1B, pp, 1, m, 2.0, k ? 0.5 : 0, speed, busy, &span);
        for (int i = 0; i < pp; i++) idle[k] += span - busy[i], most = busy[i] > most ? busy[i] : most;
        slowest[k] = pp * (span - most);
    }
    double ratio = slowest[1] / slowest[0], idle_ratio = idle[1] / idle[0];
    int ok = rc == 0 && fabs(ratio - 1.0 / 3) < 1e-9 && (slow == 1.0 ? fabs(idle_ratio - ratio) < 1e-9 : idle_ratio > 0.4);
    TEST_RESULT(name, ok, "beyond the slowest stage %.4f x 1F1B's (want 1/3), idle in the span %.4f x (rc %d)", ratio,
                idle_ratio, rc);
}

/* zbv against 1F1B at equal work per chunk (F = B = W = 1 per chunk, so a
 * stage's forward costs 2 of them: 1F1B's F = 1, B = 2 halved), buffered
 * sends: when pp divides the micro batches the idle rank-time is a sixth of
 * 1F1B's (each rank idles only while the first forwards fill the V and the
 * last W's drain it); otherwise a last partial group of micro batches runs
 * the V with fewer, but still less idle than 1F1B. At most pp micro batches
 * in flight (1F1B's most), and a few send buffers. */
/* a V schedule's simulated idle rank-time against 1F1B's at equal work per chunk (*rc: 0 if both complete) */
static double v_idle_ratio(enum sched_kind kind, int pp, int m, int *rc) {
    double v, plain;
    *rc = schedule_simulate(kind, pp, 2, m, 0, 2.0, 0.5, &v) | schedule_simulate(SCHED_1F1B, pp, 1, m, 0, 2.0, 0, &plain);
    return v / (1 - v) / (plain / (1 - plain));
}

static void check_zbv_bubble(int pp, int m) {
    char name[96];
    snprintf(name, sizeof name, "schedule_zbv_idle_pp%d_m%d", pp, m);
    double want = m % pp ? 1.0 - 1e-9 : 1.0 / 6 + 1e-9;
    int rc;
    double ratio = v_idle_ratio(SCHED_ZBV, pp, m, &rc);
    int bufs = schedule_send_buffers(SCHED_ZBV, pp, 2, m, NULL, 0);
    TEST_RESULT(name, rc == 0 && ratio <= want && bufs <= 4, "idle time %.4f x 1F1B's, want <= %.4f (rc %d); %d send "
                "buffers", ratio, want, rc, bufs);
}

/* DualPipeV at equal work per chunk (as zbv above): the phases' idle time
 * is ZB-V's, a sixth of 1F1B's when pp divides m; every steady step is a
 * forward&backward pair of the other chunk with its W right after
 * (rank r: 2(m - 2pp + r + 1) + pp - r - 1 pairs), its chunks' activations
 * held as DualPipe's, and a few send buffers. */
static void check_dualpipev(int pp, int m) {
    char name[96];
    snprintf(name, sizeof name, "schedule_dualpipev_pp%d_m%d", pp, m);
    double want = m % pp ? 1.0 - 1e-9 : 1.0 / 6 + 1e-9;
    int rc, ok = 1, bad_pair = 0;
    double ratio = v_idle_ratio(SCHED_DUALPIPEV, pp, m, &rc);
    struct sched_item s[1024];
    for (int r = 0; r < pp; r++) {
        int n = schedule_build(s, SCHED_DUALPIPEV, pp, 2, r, m), pairs = 0;
        for (int i = 0; i < n; i++) {
            if (!s[i].pair) continue;
            pairs++;
            bad_pair |= i + 2 >= n || s[i].op != SCHED_FORWARD || s[i + 1].op != SCHED_BACKWARD ||
                        s[i + 1].chunk == s[i].chunk || s[i + 2].op != SCHED_WEIGHTS || s[i + 2].mb != s[i + 1].mb ||
                        s[i + 2].chunk != s[i + 1].chunk;
        }
        ok &= pairs == 2 * (m - 2 * pp + r + 1) + pp - r - 1;
        /* each chunk's activations apart: rank r holds 2pp - r chunk-0 and r + 1 chunk-1 ones, 2pp + 1 halves
         * of a stage's, DualPipe's pp + 1 micro batches' worth at most */
        int per_chunk[2];
        ok &= schedule_chunk_slots(SCHED_DUALPIPEV, s, n, pp, m, per_chunk) && per_chunk[0] == 2 * pp - r &&
              per_chunk[1] == r + 1;
    }
    int bufs = schedule_send_buffers(SCHED_DUALPIPEV, pp, 2, m, NULL, 0);
    TEST_RESULT(name, rc == 0 && ratio <= want && ok && !bad_pair && bufs <= 5,
                "idle time %.4f x 1F1B's, want <= %.4f (rc %d); pair counts %s, pairs %s; %d send buffers", ratio,
                want, rc, ok ? "ok" : "off", bad_pair ? "malformed" : "ok", bufs);
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
        for (int vpp = 1; vpp <= 7; vpp++) /* 5: zb-h1 (vpp 1), 6: zbv (vpp 2), 7: dualpipev (vpp 2) */
            for (int m = 1; m <= 32; m++) {
                int v = vpp == 5 ? 1 : vpp >= 6 ? 2 : vpp;
                enum sched_kind kind = vpp == 5 ? SCHED_ZB_H1 : vpp == 6 ? SCHED_ZBV : vpp == 7 ? SCHED_DUALPIPEV : kind_of(vpp);
                if ((kind == SCHED_INTERLEAVED && m % pp) || (kind == SCHED_DUALPIPEV && m < 2 * pp)) continue;
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
    for (int i = 0; i < n; i += schedule_unit(SCHED_INTERLEAVED, s, n, i))
        pairs += schedule_unit(SCHED_INTERLEAVED, s, n, i) == 2;
    int n1 = schedule_build(s, SCHED_1F1B, 4, 1, 1, 8), singles = 1;
    for (int i = 0; i < n1; i++) singles &= schedule_unit(SCHED_1F1B, s, n1, i) == 1;
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
    double slow[] = {1.0, 1.05, 1.1, 1.2};
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 2; r++) check_zb_unequal_ranks(2, 8, r, slow[i]);
    for (int r = 0; r < 4; r++) check_zb_unequal_ranks(4, 16, r, 1.1);
    for (int i = 0; i < 9; i++) check_complete_kind(SCHED_ZBV, zb[i][0], 2, zb[i][1]);
    for (int i = 2; i < 9; i++) check_zbv_bubble(zb[i][0], zb[i][1]);
    int dual[][2] = {{2, 4}, {2, 8}, {4, 8}, {4, 16}, {8, 16}, {8, 32}, {3, 7}};
    for (int i = 0; i < 7; i++) check_complete_kind(SCHED_DUALPIPEV, dual[i][0], 2, dual[i][1]);
    for (int i = 0; i < 7; i++) check_dualpipev(dual[i][0], dual[i][1]);
    check_exchanges();
    check_units();
    check_lr();
    TEST_EXIT();
}
