/* One step's timeline (parallel/timeline.h). */
#include "parallel/timeline.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"

#ifdef MTRAIN_CUDA
#include <cuda_runtime_api.h>
#define CUDA_OK(call)                                                                                  \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) die("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)
#endif

/* a point in time: a CUDA event (device clock), or without one a host clock
 * reading */
struct mark {
    double host;
    void *event;
};

struct span {
    const char *what, *group;
    uint64_t bytes, flops; /* flops: a compute span's work (0: not said) */
    int started, phase, micro_batch, chunk, ended;
    struct mark begin, end;
};

static struct {
    int target, device, recording, phase, after; /* after: the traced step is done, its follower not yet */
    int due, finished, rewound;
    struct mark anchor; /* on the device clock: its event, and the host's time once it completed */
    struct span *spans;
    int n, dropped;
} tl;

int timeline_parse_step(const char *value, char *err, size_t n) {
    if (!value || !*value) return 0;
    char *end;
    if (!isdigit((unsigned char)value[0]))
        return set_error(err, n, "MTRAIN_TIMELINE is \"%s\": expected the step to trace, a positive integer", value);
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || *end || end == value || v < 1 || v > 1000000000L)
        return set_error(err, n, "MTRAIN_TIMELINE is \"%s\": expected the step to trace, a positive integer", value);
    return (int)v;
}

int timeline_step_requested(void) {
    char err[160];
    int step = timeline_parse_step(getenv("MTRAIN_TIMELINE"), err, sizeof err);
    return step > 0 ? step : 0;
}

static void take(struct mark *m, void *stream) {
#ifdef MTRAIN_CUDA
    if (tl.device && stream != TIMELINE_HOST_CLOCK) {
        cudaEvent_t e;
        CUDA_OK(cudaEventCreate(&e));
        CUDA_OK(cudaEventRecord(e, (cudaStream_t)stream));
        m->event = e;
        return;
    }
#endif
    (void)stream;
    m->event = NULL;
    m->host = now_seconds();
}

/* milliseconds from the anchor to m (waits for a device mark) */
static double ms_of(const struct mark *m) {
#ifdef MTRAIN_CUDA
    if (m->event) {
        float ms = 0;
        CUDA_OK(cudaEventSynchronize((cudaEvent_t)m->event));
        CUDA_OK(cudaEventElapsedTime(&ms, (cudaEvent_t)tl.anchor.event, (cudaEvent_t)m->event));
        return ms;
    }
#endif
    return (m->host - tl.anchor.host) * 1e3;
}

static void drop_mark(struct mark *m) {
#ifdef MTRAIN_CUDA
    if (m->event) CUDA_OK(cudaEventDestroy((cudaEvent_t)m->event));
#endif
    m->event = NULL;
}

void timeline_setup(int step, int device_clock) {
    memset(&tl, 0, sizeof tl);
    tl.target = step, tl.device = device_clock;
#ifndef MTRAIN_CUDA
    tl.device = 0;
#endif
}

void timeline_step_begin(int step) {
    if (!tl.target || tl.finished || tl.spans || step != tl.target) return;
    tl.spans = xcalloc(TIMELINE_SPANS, sizeof *tl.spans);
    tl.recording = 1, tl.phase = TIMELINE_COMPUTE;
    take(&tl.anchor, NULL);
#ifdef MTRAIN_CUDA
    if (tl.anchor.event) { /* the host's time of the anchor: the device idle, both clocks at one point */
        CUDA_OK(cudaEventSynchronize((cudaEvent_t)tl.anchor.event));
        tl.anchor.host = now_seconds();
    }
#endif
}

void timeline_step_end(int step) {
    if (!tl.spans || tl.finished) return;
    if (tl.recording) tl.recording = 0, tl.after = 1;
    else if (tl.after && step > tl.target) tl.due = 1;
}

void timeline_rewound(void) {
    if (tl.recording) tl.rewound = 1;
}

void timeline_phase(enum timeline_phase phase) { tl.phase = phase; }

int timeline_begin(const char *what, const char *group, uint64_t bytes, int started, void *stream) {
    if (!tl.recording) return 0;
    if (tl.n == TIMELINE_SPANS) {
        tl.dropped++;
        return 0;
    }
    struct span *s = &tl.spans[tl.n++];
    *s = (struct span){what, group, bytes, 0, started, tl.phase, -1, -1, 0, {0, NULL}, {0, NULL}};
    take(&s->begin, stream);
    return tl.n;
}

int timeline_compute_begin(const char *what, int micro_batch, int chunk) {
    int id = timeline_begin(what, NULL, 0, 0, NULL);
    if (id) tl.spans[id - 1].micro_batch = micro_batch, tl.spans[id - 1].chunk = chunk;
    return id;
}

void timeline_work(int id, uint64_t flops) {
    if (id > 0 && tl.spans && id <= tl.n) tl.spans[id - 1].flops = flops;
}

/* a second end moves it (a call MPI takes in pieces ends with its last) */
void timeline_end(int id, void *stream) {
    if (id <= 0 || !tl.spans || id > tl.n) return;
    struct span *s = &tl.spans[id - 1];
    if (s->ended) drop_mark(&s->end);
    take(&s->end, stream);
    s->ended = 1;
}

int timeline_due(void) { return tl.due && !tl.finished; }
int timeline_pending(void) { return tl.spans && !tl.finished; }
int timeline_done(void) { return tl.finished; }

/* ---- the summary: unions of intervals */

struct iv {
    double a, b;
};

static int by_start(const void *x, const void *y) {
    const struct iv *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* sorts and merges v in place into disjoint intervals; returns their count */
static int merge(struct iv *v, int n) {
    qsort(v, n, sizeof *v, by_start);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].b <= v[i].a) continue;
        if (k && v[i].a <= v[k - 1].b) {
            if (v[i].b > v[k - 1].b) v[k - 1].b = v[i].b;
        } else {
            v[k++] = v[i];
        }
    }
    return k;
}

static double length(const struct iv *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i].b - v[i].a;
    return s;
}

/* the length of the intersection of two merged lists */
static double overlap(const struct iv *x, int nx, const struct iv *y, int ny) {
    double s = 0;
    for (int i = 0, j = 0; i < nx && j < ny;) {
        double a = x[i].a > y[j].a ? x[i].a : y[j].a, b = x[i].b < y[j].b ? x[i].b : y[j].b;
        if (b > a) s += b - a;
        if (x[i].b < y[j].b) i++;
        else j++;
    }
    return s;
}

static int is_dp(const char *group) { return group && (!strcmp(group, "dp") || !strcmp(group, "edp")); }
static int is_pass(const char *what) { return !strcmp(what, "forward") || !strcmp(what, "backward"); }

void timeline_summarize(const struct timeline_span_ms *s, int n, struct timeline_summary *out) {
    struct iv *grad = xmalloc(sizeof *grad * (n ? n : 1)), *comp = xmalloc(sizeof *comp * (n ? n : 1));
    int ng = 0, nc = 0;
    memset(out, 0, sizeof *out);
    out->spans = n;
    for (int i = 0; i < n; i++) {
        out->unfinished += s[i].unfinished;
        if (!s[i].group) {
            if (s[i].t1 > out->step_ms) out->step_ms = s[i].t1;
            if (is_pass(s[i].what)) comp[nc++] = (struct iv){s[i].t0, s[i].t1};
        } else if (is_dp(s[i].group) && s[i].phase == TIMELINE_COMPUTE) {
            grad[ng++] = (struct iv){s[i].t0, s[i].t1};
            out->grad_bytes += s[i].bytes, out->grad_calls++;
        }
    }
    ng = merge(grad, ng), nc = merge(comp, nc);
    out->compute_ms = length(comp, nc);
    out->grad_ms = length(grad, ng);
    out->grad_hidden_ms = overlap(grad, ng, comp, nc);
    out->grad_exposed_ms = out->grad_ms - out->grad_hidden_ms;
    free(grad);
    free(comp);
}

/* ---- resolving and writing */

/* a lane per communication group, in order of first appearance (0: compute) */
static int lane_of(const char *group, const char **lanes, int *nlanes) {
    if (!group) return 0;
    for (int i = 1; i < *nlanes; i++)
        if (!strcmp(lanes[i], group)) return i;
    CHECK(*nlanes < 64);
    lanes[*nlanes] = group;
    return (*nlanes)++;
}

char *timeline_finish(int rank, struct timeline_summary *sum) {
    CHECK(tl.spans && !tl.finished);
    int n = tl.n;
    struct timeline_span_ms *ms = xcalloc(n ? n : 1, sizeof *ms);
    for (int i = 0; i < n; i++) {
        struct span *s = &tl.spans[i];
        ms[i] = (struct timeline_span_ms){s->what, s->group, ms_of(&s->begin), 0, s->bytes, s->started, s->phase, 0};
        if (!s->ended) take(&s->end, NULL), ms[i].unfinished = 1; /* never waited for: up to now */
        ms[i].t1 = ms_of(&s->end);
        if (ms[i].t1 < ms[i].t0) ms[i].t1 = ms[i].t0;
    }
    timeline_summarize(ms, n, sum);
    sum->step = tl.target, sum->dropped = tl.dropped, sum->rewound = tl.rewound;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) die("timeline: open_memstream failed");
    fprintf(f,
            "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"step\":%d,\"rank\":%d,\"clock\":\"%s\",\"spans\":%d,"
            "\"dropped\":%d,\"unfinished\":%d,\"rewound\":%s,\"step_ms\":%.6f,\"compute_ms\":%.6f,\"grad_ms\":%.6f,"
            "\"grad_hidden_ms\":%.6f,\"grad_exposed_ms\":%.6f,\"grad_bytes\":%llu,\"grad_calls\":%d},\n"
            "\"traceEvents\":[\n",
            sum->step, rank, tl.device ? "device" : "host", sum->spans, sum->dropped, sum->unfinished,
            sum->rewound ? "true" : "false", sum->step_ms,
            sum->compute_ms, sum->grad_ms, sum->grad_hidden_ms, sum->grad_exposed_ms,
            (unsigned long long)sum->grad_bytes, sum->grad_calls);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank, rank);
    const char *lanes[64] = {"compute"};
    int nlanes = 1;
    for (int i = 0; i < n; i++) {
        struct span *s = &tl.spans[i];
        int lane = lane_of(s->group, lanes, &nlanes);
        /* a started call as an async slice (begin, end; id: its span's): on one group they overlap, which
         * complete ("X") slices of one lane must not */
        fprintf(f, ",\n{\"ph\":\"%s\",\"name\":\"%s\",\"cat\":\"%s\",", s->started ? "b" : "X", s->what,
                s->group ? "comm" : "compute");
        if (s->started) fprintf(f, "\"id\":%d,", i + 1);
        else fprintf(f, "\"dur\":%.3f,", (ms[i].t1 - ms[i].t0) * 1e3);
        fprintf(f, "\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"args\":{", rank, lane, ms[i].t0 * 1e3);
        if (s->group)
            fprintf(f, "\"group\":\"%s\",\"bytes\":%llu,\"started\":%s,\"phase\":\"%s\"%s", s->group,
                    (unsigned long long)s->bytes, s->started ? "true" : "false",
                    s->phase == TIMELINE_UPDATE ? "update" : "compute", ms[i].unfinished ? ",\"unfinished\":true" : "");
        else if (s->micro_batch >= 0)
            fprintf(f, "\"micro_batch\":%d,\"chunk\":%d", s->micro_batch, s->chunk);
        else if (s->flops)
            fprintf(f, "\"flops\":%llu", (unsigned long long)s->flops);
        fprintf(f, "}}");
        if (s->started)
            fprintf(f,
                    ",\n{\"ph\":\"e\",\"name\":\"%s\",\"cat\":\"comm\",\"id\":%d,\"pid\":%d,\"tid\":%d,"
                    "\"ts\":%.3f}",
                    s->what, i + 1, rank, lane, ms[i].t1 * 1e3);
    }
    for (int i = 0; i < nlanes; i++)
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s%s\"}}",
                rank, i, i ? "comm " : "", lanes[i]);
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0) die("timeline: cannot build the trace");
    for (int i = 0; i < n; i++) drop_mark(&tl.spans[i].begin), drop_mark(&tl.spans[i].end);
    drop_mark(&tl.anchor);
    free(tl.spans);
    free(ms);
    tl.spans = NULL, tl.n = 0, tl.recording = tl.after = tl.due = tl.rewound = 0, tl.finished = 1;
    return out;
}
