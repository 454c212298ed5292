/* parallel/timeline.h on the host clock: the summary's unions against a
 * naive count over a 1 ms grid (random spans with whole-millisecond ends,
 * so the count is exact), the recording's step boundaries (a span started
 * in the traced step ends in the next; nothing is recorded outside it; the
 * timeline is due after the following step), the Chrome trace it writes
 * (parsed with jansson: complete slices, and started calls as async
 * begin/end pairs), a rolled-back step, spans never ended, the table's
 * limit, and MTRAIN_TIMELINE's parsing. */
#include <jansson.h>
#include <string.h>
#include <time.h>

#include "parallel/timeline.h"
#include "tests/unit/check.h"

static void summary_against_grid(void) {
    enum { N = 60, T = 400 };
    static const char *groups[] = {NULL, NULL, "dp", "edp", "tp", "dp"};
    static const char *whats[] = {"forward", "backward", "optimizer", "reduce_grads"};
    unsigned long long seed = 12345;
    int ok = 1;
    for (int round = 0; round < 50 && ok; round++) {
        struct timeline_span_ms s[N];
        for (int i = 0; i < N; i++) {
            int a = (int)((test_rand(&seed) + 1) * 0.5 * T), len = (int)((test_rand(&seed) + 1) * 20);
            int g = (int)((test_rand(&seed) + 1) * 3) % 6, w = (int)((test_rand(&seed) + 1) * 2) % 4;
            s[i] = (struct timeline_span_ms){groups[g] ? "all_reduce_sum_start" : whats[w], groups[g], a, a + len,
                                             (uint64_t)(i + 1) * 100, g >= 2, (test_rand(&seed) > 0.6), 0};
        }
        struct timeline_summary got;
        timeline_summarize(s, N, &got);
        double grad = 0, hidden = 0, compute = 0, step = 0;
        uint64_t bytes = 0;
        int calls = 0;
        for (int i = 0; i < N; i++) {
            int dp = s[i].group && (!strcmp(s[i].group, "dp") || !strcmp(s[i].group, "edp")) &&
                     s[i].phase == TIMELINE_COMPUTE;
            if (dp) bytes += s[i].bytes, calls++;
            if (!s[i].group && s[i].t1 > step) step = s[i].t1;
        }
        for (int t = 0; t < T + 64; t++) { /* the cell [t, t+1) */
            int g = 0, c = 0;
            for (int i = 0; i < N; i++) {
                if (s[i].t0 > t || s[i].t1 < t + 1) continue;
                if (!s[i].group && (!strcmp(s[i].what, "forward") || !strcmp(s[i].what, "backward"))) c = 1;
                if (s[i].group && (!strcmp(s[i].group, "dp") || !strcmp(s[i].group, "edp")) &&
                    s[i].phase == TIMELINE_COMPUTE)
                    g = 1;
            }
            grad += g, hidden += g && c, compute += c;
        }
        if (fabs(got.grad_ms - grad) > 1e-9 || fabs(got.grad_hidden_ms - hidden) > 1e-9 ||
            fabs(got.grad_exposed_ms - (grad - hidden)) > 1e-9 || fabs(got.compute_ms - compute) > 1e-9 ||
            got.step_ms != step || got.grad_bytes != bytes || got.grad_calls != calls || got.spans != N) {
            TEST_FAIL("timeline_summary_against_grid",
                      "round %d: grad %g/%g hidden %g/%g compute %g/%g step %g/%g calls %d/%d", round, got.grad_ms, grad,
                      got.grad_hidden_ms, hidden, got.compute_ms, compute, got.step_ms, step, got.grad_calls, calls);
            ok = 0;
        }
    }
    if (ok) TEST_PASS("timeline_summary_against_grid");
}

/* a span of what on group, begun now and ended at once (0: not recorded) */
static int one_span(const char *what, const char *group, int started) {
    int id = timeline_begin(what, group, 64, started, NULL);
    if (!started) timeline_end(id, NULL);
    return id;
}

static void pause_ms(int ms) {
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

static void recording(void) {
    timeline_setup(2, 0);
    timeline_step_begin(1);
    int before = one_span("all_reduce_sum", "dp", 0) || timeline_compute_begin("forward", 0, 0);
    timeline_step_end(1);
    TEST_RESULT("timeline_nothing_before_the_step", !before && !timeline_pending() && !timeline_due(),
                "a span was recorded in step 1 while tracing step 2");
    timeline_step_begin(2);
    int f = timeline_compute_begin("forward", 0, 0);
    timeline_end(f, NULL);
    int b = timeline_compute_begin("backward", 0, 0);
    int bucket = one_span("all_reduce_sum_start", "dp", 1);
    pause_ms(2); /* the bucket's first 2 ms run during backward */
    timeline_end(b, NULL);
    pause_ms(1);
    one_span("all_reduce_sum", "tp", 0);
    timeline_phase(TIMELINE_UPDATE);
    int gather = one_span("all_gather_v_start", "dp", 1);
    timeline_step_end(2);
    int after = one_span("all_reduce_sum", "dp", 0);
    timeline_step_begin(3);
    int due_early = timeline_due();
    timeline_end(bucket, NULL); /* the waits, in the next step */
    timeline_end(gather, NULL);
    timeline_step_end(3);
    TEST_RESULT("timeline_records_the_step", f && b && bucket && gather && !after && !due_early && timeline_due(),
                "ids %d %d %d %d, after %d, due early %d, due %d", f, b, bucket, gather, after, due_early,
                timeline_due());
    struct timeline_summary sum;
    char *json = timeline_finish(3, &sum);
    TEST_RESULT("timeline_summary_of_the_step",
                sum.step == 2 && sum.spans == 5 && sum.unfinished == 0 && !sum.rewound && sum.grad_calls == 1 &&
                    sum.grad_bytes == 64 && sum.grad_hidden_ms >= 2 && sum.grad_exposed_ms >= 1 &&
                    fabs(sum.grad_ms - sum.grad_hidden_ms - sum.grad_exposed_ms) < 1e-9 && timeline_done() &&
                    !timeline_pending(),
                "step %d spans %d unfinished %d calls %d hidden %g exposed %g", sum.step, sum.spans, sum.unfinished,
                sum.grad_calls, sum.grad_hidden_ms, sum.grad_exposed_ms);
    json_error_t err;
    json_t *root = json_loads(json, 0, &err);
    json_t *ev = root ? json_object_get(root, "traceEvents") : NULL;
    int lanes = 0, complete = 0, begins = 0, ends = 0, ordered = 1;
    double last_ts = -1, begin_ts = -1;
    for (size_t i = 0; ev && i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        double ts = json_number_value(json_object_get(e, "ts"));
        if (!ph) continue;
        if (!strcmp(ph, "M") && json_object_get(e, "tid")) lanes++;
        if (!strcmp(ph, "X") || !strcmp(ph, "b")) { /* in the order begun */
            complete += !strcmp(ph, "X"), begins += !strcmp(ph, "b");
            if (ts < last_ts || json_integer_value(json_object_get(e, "pid")) != 3) ordered = 0;
            if (!strcmp(ph, "X") && json_number_value(json_object_get(e, "dur")) < 0) ordered = 0;
            if (!strcmp(ph, "b")) begin_ts = ts;
            last_ts = ts;
        }
        if (!strcmp(ph, "e")) { /* right after its begin, the same id, not earlier */
            json_t *b = json_array_get(ev, i - 1);
            ends++;
            if (ts < begin_ts || !json_equal(json_object_get(b, "id"), json_object_get(e, "id"))) ordered = 0;
        }
    }
    /* three complete slices (forward, backward, the tp call), two started calls; lanes: compute, dp, tp */
    TEST_RESULT("timeline_trace_json", root && complete == 3 && begins == 2 && ends == 2 && lanes == 3 && ordered,
                "%s: %d complete, %d begun, %d ended, %d lanes, ordered %d", root ? "parsed" : err.text, complete,
                begins, ends, lanes, ordered);
    json_decref(root);
    free(json);
    timeline_step_begin(2);
    TEST_RESULT("timeline_only_once", !one_span("forward", NULL, 0), "recorded again after it was written");
}

static void rolled_back(void) {
    timeline_setup(4, 0);
    timeline_step_begin(4);
    timeline_end(timeline_compute_begin("forward", 0, 0), NULL);
    timeline_rewound();
    timeline_step_end(4);
    timeline_rewound(); /* not recording: no effect on what follows */
    struct timeline_summary sum;
    char *json = timeline_finish(0, &sum);
    TEST_RESULT("timeline_rolled_back_step", sum.rewound && strstr(json, "\"rewound\":true") && sum.spans == 1,
                "rewound %d, spans %d", sum.rewound, sum.spans);
    free(json);
}

static void unfinished_and_dropped(void) {
    timeline_setup(1, 0);
    timeline_step_begin(1);
    one_span("reduce_sum_start", "dp", 1);
    for (int i = 0; i < TIMELINE_SPANS + 4; i++) one_span("all_reduce_sum", "tp", 0);
    timeline_step_end(1);
    struct timeline_summary sum;
    char *json = timeline_finish(0, &sum); /* the end of the run: never waited for */
    TEST_RESULT("timeline_unfinished_and_dropped",
                sum.unfinished == 1 && sum.dropped == 5 && sum.spans == TIMELINE_SPANS &&
                    strstr(json, "\"unfinished\":true"),
                "unfinished %d, dropped %d, spans %d", sum.unfinished, sum.dropped, sum.spans);
    free(json);
}

static void parse(void) {
    char err[160] = "";
    int ok = timeline_parse_step(NULL, err, sizeof err) == 0 && timeline_parse_step("", err, sizeof err) == 0 &&
             timeline_parse_step("12", err, sizeof err) == 12;
    const char *bad[] = {"abc", "0", "-3", "5x", " ", " 3", "+3", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (timeline_parse_step(bad[i], err, sizeof err) != -1 || !strstr(err, "MTRAIN_TIMELINE")) ok = 0;
    }
    TEST_RESULT("timeline_parse_step", ok, "last message: %s", err);
}

int main(void) {
    summary_against_grid();
    recording();
    rolled_back();
    unfinished_and_dropped();
    parse();
    TEST_EXIT();
}
