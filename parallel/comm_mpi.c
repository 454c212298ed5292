/* The comm interface over MPI: host buffers directly, device buffers (a comm
 * with stage set) copied through host staging buffers. */
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/common.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/timeline.h"
#include "parallel/watchdog.h"

#define MPI_CHECK(call)                                                                     \
    do {                                                                                    \
        int rc_ = (call);                                                                   \
        if (rc_ != MPI_SUCCESS) {                                                           \
            char msg_[MPI_MAX_ERROR_STRING];                                                \
            int len_ = 0;                                                                   \
            MPI_Error_string(rc_, msg_, &len_);                                             \
            fprintf(stderr, "mtrain: error: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, msg_); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                   \
        }                                                                                   \
    } while (0)

/* Complete req as MPI_Wait does, but give the core away while the wait goes
 * on (MPI_Wait polls without end): where ranks outnumber cores (the tests'
 * 4-rank layouts on 2 cores, CPU runs on a shared machine) a polling rank
 * holds the core its peer needs to reach the call, and every exchange then
 * costs scheduler time slices. A short wait polls as before. */
#define WAIT_POLLS 64
/* idle_ns > 0: a rank that stands aside (comm_barrier_idle) sleeps that long between polls from the first */
static void wait_request_paced(MPI_Request *req, long idle_ns) {
    int done = 0;
    for (unsigned polls = 0;; polls++) {
        MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (idle_ns) {
            struct timespec ts = {0, idle_ns};
            nanosleep(&ts, NULL); /* interrupted early: polls again */
        } else if (polls >= WAIT_POLLS) {
            sched_yield(); /* returns at once where nothing else waits for the core */
        }
    }
}
static void wait_request(MPI_Request *req) { wait_request_paced(req, 0); }
/* a blocking call made as its non-blocking twin and wait_request */
#define MPI_BLOCKING(icall)                \
    do {                                   \
        MPI_Request req_;                  \
        MPI_CHECK(icall);                  \
        wait_request(&req_);               \
    } while (0)

/* Outstanding non-blocking requests of this process (collectives). */
#define MAX_PENDING 4096
struct pending {
    MPI_Request req[MAX_PENDING];
    const struct comm *owner[MAX_PENDING];
    void *staged[MAX_PENDING]; /* a gather's count arrays, freed when it completes */
    int ticket[MAX_PENDING];   /* comm_all_gather_v_start's ticket, 0 for the rest */
    int span[MAX_PENDING];     /* its timeline span (parallel/timeline.h), ended by the wait */
    int n;
};
static struct pending pending;

static MPI_Comm handle(const struct comm *c) { return *(MPI_Comm *)c->handle; }

/* MPI counts are ints: an element-wise call (all-reduce, reduce, broadcast)
 * on more elements than one call takes goes in pieces of at most this many
 * (2^30; a real model's gradients under data parallelism without buckets
 * are several times 2^31 floats). MTRAIN_TEST_MPI_CHUNK sets it smaller, so
 * tests run the pieces (tests/integration/comm.sh). */
static size_t chunk_elems(void) {
    static size_t m;
    if (!m) {
        const char *e = getenv("MTRAIN_TEST_MPI_CHUNK");
        m = e && atol(e) > 0 && atol(e) < (1l << 30) ? (size_t)atol(e) : (size_t)1 << 30;
    }
    return m;
}
static int piece(size_t n, size_t off) { return (int)(n - off < chunk_elems() ? n - off : chunk_elems()); }

/* a per-rank count of a call that cannot go in pieces (its blocks interleave) */
static int rank_count(const struct comm *c, size_t n, const char *op) {
    if (n > (size_t)INT32_MAX)
        die("%s over group %s: %zu elements per rank exceed one MPI call's count (%d)", op, c->name ? c->name : "?", n,
            INT32_MAX);
    return (int)n;
}

/* Every call that reaches MPI is marked for the hang watchdog, so a rank
 * stuck waiting for a dead peer can say where. */
static void enter(const struct comm *c, const char *op) {
    watchdog_enter(op, c->name ? c->name : "?", c->rank, c->size);
}

/* the call's span on the timeline (a started one ends when it is waited
 * for), timed on the compute stream where it stages device memory (its
 * copies run there) and on the host's clock where it runs on the host alone */
static void *clock_of(const struct comm *c) { return c->stage ? NULL : TIMELINE_HOST_CLOCK; }
static int span(const struct comm *c, const char *op, size_t bytes, int started) {
    return timeline_begin(op, c->name ? c->name : "?", bytes, started, clock_of(c));
}
static void leave(const struct comm *c, int span) {
    timeline_end(span, clock_of(c));
    watchdog_leave();
}

static void track_ticket(const struct comm *c, MPI_Request r, void *staged, int ticket, int span) {
    if (pending.n == MAX_PENDING) die("too many outstanding communication requests");
    pending.req[pending.n] = r;
    pending.staged[pending.n] = staged;
    pending.ticket[pending.n] = ticket;
    pending.span[pending.n] = span;
    pending.owner[pending.n++] = c;
}
static void track(const struct comm *c, MPI_Request r, int span) { track_ticket(c, r, NULL, 0, span); }

/* Host staging buffer `which` of at least bytes. */
static void *host_buf(struct comm *c, int which, size_t bytes) {
    if (bytes > c->host_bytes[which]) {
        free(c->host[which]);
        c->host[which] = xmalloc(bytes);
        c->host_bytes[which] = bytes;
    }
    return c->host[which];
}

void comm_free_staging(struct comm *c) {
    for (int i = 0; i < 2; i++) {
        free(c->host[i]);
        c->host[i] = NULL;
        c->host_bytes[i] = 0;
    }
}

/* Device memory goes through host staging buffer `which`: stage_in returns
 * a host copy of dev (or dev itself when the comm carries host memory),
 * stage_out a host buffer for a result, stage_back copies a result home. */
static void *stage_in(struct comm *c, int which, const void *dev, size_t bytes) {
    if (!c->stage) return (void *)dev;
    void *h = host_buf(c, which, bytes);
    c->stage->to_host(h, dev, bytes);
    return h;
}
static void *stage_out(struct comm *c, int which, void *dev, size_t bytes) {
    return c->stage ? host_buf(c, which, bytes) : dev;
}
static void stage_back(const struct comm *c, void *dev, const void *host, size_t bytes) {
    if (c->stage) c->stage->from_host(dev, host, bytes);
}

/* A group of one: out = in, in whichever memory the buffers live. */
static void local_copy(const struct comm *c, void *out, const void *in, size_t bytes) {
    if (out == in || !bytes) return;
    if (c->stage) c->stage->copy(out, in, bytes);
    else memmove(out, in, bytes);
}

/* In-place float reduction, staged when the buffer is device memory. */
static void all_reduce(struct comm *c, float *buf, size_t n, MPI_Op op) {
    c->bytes += n * sizeof(float), c->calls++;
    float *h = stage_in(c, 0, buf, n * sizeof(float));
    for (size_t o = 0; o < n; o += piece(n, o))
        MPI_BLOCKING(MPI_Iallreduce(MPI_IN_PLACE, h + o, piece(n, o), MPI_FLOAT, op, handle(c), &req_));
    stage_back(c, buf, h, n * sizeof(float));
}

void comm_all_reduce_sum(struct comm *c, float *buf, size_t n) {
    if (c->nccl && n) {
        nccl_all_reduce(c, buf, n, 0, 0);
        return;
    }
    if (c->size == 1 || n == 0) return;
    enter(c, "all_reduce_sum");
    int s = span(c, "all_reduce_sum", n * sizeof(float), 0);
    all_reduce(c, buf, n, MPI_SUM);
    leave(c, s);
}

void comm_all_reduce_max(struct comm *c, float *buf, size_t n) {
    if (c->nccl && n) {
        nccl_all_reduce(c, buf, n, 1, 0);
        return;
    }
    if (c->size == 1 || n == 0) return;
    enter(c, "all_reduce_max");
    int s = span(c, "all_reduce_max", n * sizeof(float), 0);
    all_reduce(c, buf, n, MPI_MAX);
    leave(c, s);
}

void comm_all_reduce_sum_f64(struct comm *c, double *buf, size_t n) {
    if (c->size == 1 || n == 0) return;
    c->bytes += n * sizeof(double), c->calls++;
    enter(c, "all_reduce_sum_f64");
    int s = span(c, "all_reduce_sum_f64", n * sizeof(double), 0);
    for (size_t o = 0; o < n; o += piece(n, o))
        MPI_BLOCKING(MPI_Iallreduce(MPI_IN_PLACE, buf + o, piece(n, o), MPI_DOUBLE, MPI_SUM, handle(c), &req_));
    leave(c, s);
}

void comm_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n) {
    size_t in_bytes = (size_t)c->size * n * sizeof(float), out_bytes = n * sizeof(float);
    if (c->nccl && n) {
        nccl_reduce_scatter(c, in, out, n);
        return;
    }
    if (c->size == 1) {
        local_copy(c, out, in, out_bytes);
        return;
    }
    c->bytes += in_bytes, c->calls++;
    enter(c, "reduce_scatter_sum");
    int s = span(c, "reduce_scatter_sum", in_bytes, 0);
    float *hin = stage_in(c, 0, in, in_bytes), *hout = stage_out(c, 1, out, out_bytes);
    MPI_BLOCKING(MPI_Ireduce_scatter_block(hin, hout, rank_count(c, n, "reduce_scatter"), MPI_FLOAT, MPI_SUM,
                                           handle(c), &req_));
    stage_back(c, out, hout, out_bytes);
    leave(c, s);
}

void comm_all_gather(struct comm *c, const float *in, float *out, size_t n) {
    size_t in_bytes = n * sizeof(float), out_bytes = (size_t)c->size * n * sizeof(float);
    if (c->nccl && n) {
        nccl_all_gather(c, in, out, n);
        return;
    }
    if (c->size == 1) {
        local_copy(c, out, in, in_bytes);
        return;
    }
    c->bytes += out_bytes, c->calls++;
    enter(c, "all_gather");
    int s = span(c, "all_gather", out_bytes, 0);
    float *hin = stage_in(c, 0, in, in_bytes), *hout = stage_out(c, 1, out, out_bytes);
    int k = rank_count(c, n, "all_gather");
    MPI_BLOCKING(MPI_Iallgather(hin, k, MPI_FLOAT, hout, k, MPI_FLOAT, handle(c), &req_));
    stage_back(c, out, hout, out_bytes);
    leave(c, s);
}

void comm_broadcast(struct comm *c, void *buf, size_t bytes, int root) {
    if (c->nccl && bytes) {
        nccl_broadcast(c, buf, bytes, root);
        return;
    }
    if (c->size == 1) return;
    c->bytes += bytes, c->calls++;
    enter(c, "broadcast");
    int s = span(c, "broadcast", bytes, 0);
    void *h = stage_in(c, 0, buf, bytes);
    for (size_t o = 0; o < bytes; o += piece(bytes, o))
        MPI_BLOCKING(MPI_Ibcast((char *)h + o, piece(bytes, o), MPI_BYTE, root, handle(c), &req_));
    stage_back(c, buf, h, bytes);
    leave(c, s);
}

/* Every transfer posted non-blocking, then all waited for: MPI's order of
 * matching (one tag per communicator, non-overtaking) is NCCL's, and sends
 * are synchronous (MPI_Issend completes only once its receive has started),
 * as NCCL's are, so a grouping that would hang over NCCL hangs here too
 * instead of passing on MPI's buffering of small messages. Device
 * buffers go through host copies of their own, sends copied in before the
 * posting, receives copied home after the wait. */
void comm_exchange(struct comm *c, const struct comm_p2p *ops, int n) {
    if (c->nccl) {
        nccl_exchange(c, ops, n);
        return;
    }
    if (!n) return;
    size_t sent = 0;
    for (int i = 0; i < n; i++) sent += ops[i].recv ? 0 : ops[i].bytes;
    c->bytes += sent, c->calls++;
    enter(c, "exchange");
    int s = span(c, "exchange", sent, 0);
    MPI_Request req[COMM_EXCHANGE_MAX];
    void *host[COMM_EXCHANGE_MAX] = {0};
    CHECK(n <= COMM_EXCHANGE_MAX);
    for (int i = 0; i < n; i++) {
        const struct comm_p2p *o = &ops[i];
        CHECK(o->bytes <= INT32_MAX);
        void *b = o->buf;
        if (c->stage) {
            b = host[i] = xmalloc(o->bytes ? o->bytes : 1);
            if (!o->recv) c->stage->to_host(b, o->buf, o->bytes);
        }
        if (o->recv) MPI_CHECK(MPI_Irecv(b, (int)o->bytes, MPI_BYTE, o->peer, o->tag, handle(c), &req[i]));
        else MPI_CHECK(MPI_Issend(b, (int)o->bytes, MPI_BYTE, o->peer, o->tag, handle(c), &req[i]));
    }
    for (int i = 0; i < n; i++) wait_request(&req[i]);
    for (int i = 0; i < n; i++) {
        if (host[i] && ops[i].recv) c->stage->from_host(ops[i].buf, host[i], ops[i].bytes);
        free(host[i]);
    }
    leave(c, s);
}

/* pending request i stays, moved to place *kept (the list compacted as it is walked) */
static void keep_pending(int *kept, int i) {
    pending.req[*kept] = pending.req[i];
    pending.staged[*kept] = pending.staged[i];
    pending.ticket[*kept] = pending.ticket[i];
    pending.span[*kept] = pending.span[i];
    pending.owner[(*kept)++] = pending.owner[i];
}

/* complete c's requests: all of them (up_to < 0), or its gathers with
 * tickets up to up_to */
static void wait_matching(const struct comm *c, int up_to) {
    int kept = 0;
    for (int i = 0; i < pending.n; i++) {
        if (pending.owner[i] == c && (up_to < 0 || (pending.ticket[i] > 0 && pending.ticket[i] <= up_to))) {
            int ended = pending.req[i] == MPI_REQUEST_NULL; /* completed in comm_progress, its end recorded there */
            wait_request(&pending.req[i]);
            if (!ended) timeline_end(pending.span[i], clock_of(c));
            free(pending.staged[i]);
        } else
            keep_pending(&kept, i);
    }
    pending.n = kept;
}
static void wait_owned(const struct comm *c) { wait_matching(c, -1); }

void comm_progress(struct comm *c) {
    if (c->nccl || !pending.n) return;
    enter(c, "progress");
    for (int i = 0; i < pending.n; i++) {
        if (pending.owner[i] != c || pending.req[i] == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_CHECK(MPI_Test(&pending.req[i], &done, MPI_STATUS_IGNORE)); /* done: the request is now null */
        if (done) timeline_end(pending.span[i], clock_of(c));
    }
    watchdog_leave();
}

void comm_wait_all(struct comm *c) {
    if (c->nccl) nccl_wait(c);
    enter(c, "wait_all");
    wait_owned(c);
    watchdog_leave();
}

int comm_all_gather_v_start(struct comm *c, void *buf, size_t elem, const int *counts, const int *displs) {
    int ticket = ++c->tickets;
    if (c->nccl) {
        nccl_all_gather_v(c, buf, elem, counts, displs, ticket);
        return ticket;
    }
    if (c->size == 1) return ticket;
    CHECK(elem == 4 || elem == 2);
    MPI_Datatype dt = elem == 4 ? MPI_FLOAT : MPI_UINT16_T;
    size_t total = 0, end = 0;
    for (int r = 0; r < c->size; r++) {
        total += (size_t)counts[r];
        if ((size_t)displs[r] + (size_t)counts[r] > end) end = (size_t)displs[r] + (size_t)counts[r];
    }
    enter(c, "all_gather_v_start");
    c->bytes += total * elem, c->calls++;
    int s = span(c, "all_gather_v_start", total * elem, !c->stage);
    if (c->stage) { /* staged: done at once */
        void *h = stage_in(c, 0, buf, end * elem);
        MPI_BLOCKING(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h, counts, displs, dt, handle(c), &req_));
        stage_back(c, buf, h, end * elem);
        timeline_end(s, clock_of(c));
    } else { /* the count arrays must outlive the call: a copy, freed when it completes */
        MPI_Request r;
        int *arrays = xmalloc(sizeof(int) * 2 * c->size);
        memcpy(arrays, counts, sizeof(int) * c->size);
        memcpy(arrays + c->size, displs, sizeof(int) * c->size);
        MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, arrays, arrays + c->size, dt,
                                  handle(c), &r));
        track_ticket(c, r, arrays, ticket, s);
    }
    watchdog_leave();
    return ticket;
}

int comm_exchange_start(struct comm *c, const struct comm_p2p *ops, int n) {
    int sends_only = 1;
    for (int i = 0; i < n; i++) sends_only &= !ops[i].recv;
    /* staged (device memory over MPI): sends go from a host copy of their own, freed when they complete;
     * a receive would need its copy back to the device when it completes: blocking then */
    if (c->nccl || (c->stage && !sends_only) || !n) {
        comm_exchange(c, ops, n);
        return 0;
    }
    CHECK(n <= COMM_EXCHANGE_MAX);
    int ticket = ++c->tickets;
    size_t sent = 0;
    for (int i = 0; i < n; i++) sent += ops[i].recv ? 0 : ops[i].bytes;
    c->bytes += sent, c->calls++;
    enter(c, "exchange_start");
    int s = span(c, "exchange_start", sent, 1);
    for (int i = 0; i < n; i++) { /* each request ends the shared span when waited for: the last one's end stays */
        const struct comm_p2p *o = &ops[i];
        CHECK(o->bytes <= INT32_MAX);
        MPI_Request r;
        void *host = NULL;
        if (c->stage) {
            host = xmalloc(o->bytes ? o->bytes : 1);
            c->stage->to_host(host, o->buf, o->bytes);
        }
        if (o->recv) MPI_CHECK(MPI_Irecv(o->buf, (int)o->bytes, MPI_BYTE, o->peer, o->tag, handle(c), &r));
        else MPI_CHECK(MPI_Issend(host ? host : o->buf, (int)o->bytes, MPI_BYTE, o->peer, o->tag, handle(c), &r));
        track_ticket(c, r, host, ticket, s);
    }
    watchdog_leave();
    return ticket;
}

void comm_wait_ticket(struct comm *c, int ticket) {
    if (!ticket) return; /* nothing was left to wait for (comm_exchange_start) */
    if (c->nccl) {
        nccl_wait_ticket(c, ticket);
        return;
    }
    enter(c, "wait_ticket");
    wait_matching(c, ticket);
    watchdog_leave();
}

int comm_ticket_done(struct comm *c, int ticket) {
    CHECK(!c->nccl);
    int done = 1;
    for (int i = 0; i < pending.n; i++) {
        if (pending.owner[i] != c || pending.ticket[i] != ticket || pending.req[i] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        MPI_CHECK(MPI_Test(&pending.req[i], &flag, MPI_STATUS_IGNORE)); /* flag: the request is now null */
        if (flag) timeline_end(pending.span[i], clock_of(c));
        else done = 0;
    }
    if (!done) return 0;
    int kept = 0; /* all null: forget them */
    for (int i = 0; i < pending.n; i++) {
        if (pending.owner[i] == c && pending.ticket[i] == ticket) {
            free(pending.staged[i]);
            continue;
        }
        keep_pending(&kept, i);
    }
    pending.n = kept;
    return 1;
}

void comm_all_reduce_sum_start(struct comm *c, float *buf, size_t n) {
    if (c->nccl && n) {
        nccl_all_reduce(c, buf, n, 0, 1);
        return;
    }
    if (c->size == 1 || n == 0) return;
    enter(c, "all_reduce_sum_start");
    int s = span(c, "all_reduce_sum_start", n * sizeof(float), !c->stage);
    if (c->stage) { /* staged: done at once */
        all_reduce(c, buf, n, MPI_SUM);
        timeline_end(s, clock_of(c));
    } else {
        c->bytes += n * sizeof(float), c->calls++;
        for (size_t o = 0; o < n; o += piece(n, o)) {
            MPI_Request r;
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf + o, piece(n, o), MPI_FLOAT, MPI_SUM, handle(c), &r));
            track(c, r, s);
        }
    }
    watchdog_leave();
}

void comm_reduce_to_owners_start(struct comm *c, float *buf, const size_t *lo, const size_t *n) {
    if (c->nccl) {
        nccl_reduce_to_owners(c, buf, lo, n);
        return;
    }
    for (int r = 0; r < c->size; r++)
        if (n[r]) comm_reduce_sum_start(c, buf + lo[r], n[r], r);
}

void comm_reduce_sum_start(struct comm *c, float *buf, size_t n, int root) {
    if (c->nccl && n) {
        nccl_reduce(c, buf, n, root);
        return;
    }
    if (c->size == 1 || n == 0) return;
    enter(c, "reduce_sum_start");
    c->bytes += n * sizeof(float), c->calls++;
    int me = c->rank == root, s = span(c, "reduce_sum_start", n * sizeof(float), !c->stage);
    if (c->stage) { /* staged: done at once */
        float *h = stage_in(c, 0, buf, n * sizeof(float));
        /* MPI_Ireduce and a wait, not MPI_Reduce: Debian 12's MPICH 4.0.2 (ch4:ucx) crashes in a blocking
         * in-place reduce onto a root other than 0 from about 1000 floats on (test_comm's large reduce) */
        for (size_t o = 0; o < n; o += piece(n, o)) {
            MPI_Request r;
            MPI_CHECK(MPI_Ireduce(me ? MPI_IN_PLACE : h + o, me ? h + o : NULL, piece(n, o), MPI_FLOAT, MPI_SUM, root,
                                  handle(c), &r));
            wait_request(&r);
        }
        if (me) stage_back(c, buf, h, n * sizeof(float));
        timeline_end(s, clock_of(c));
    } else {
        for (size_t o = 0; o < n; o += piece(n, o)) {
            MPI_Request r;
            MPI_CHECK(MPI_Ireduce(me ? MPI_IN_PLACE : buf + o, me ? buf + o : NULL, piece(n, o), MPI_FLOAT, MPI_SUM,
                                  root, handle(c), &r));
            track(c, r, s);
        }
    }
    watchdog_leave();
}

void comm_all_to_all(struct comm *c, const float *in, float *out, size_t n) {
    size_t bytes = (size_t)c->size * n * sizeof(float);
    if (c->nccl && n) {
        CHECK(n <= (size_t)INT32_MAX);
        int *counts = xmalloc(sizeof(int) * c->size);
        for (int r = 0; r < c->size; r++) counts[r] = (int)n;
        nccl_all_to_all_v(c, in, counts, out, counts, "all_to_all");
        free(counts);
        return;
    }
    if (c->size == 1) {
        local_copy(c, out, in, n * sizeof(float));
        return;
    }
    c->bytes += bytes, c->calls++;
    enter(c, "all_to_all");
    int s = span(c, "all_to_all", bytes, 0);
    float *hin = stage_in(c, 0, in, bytes), *hout = stage_out(c, 1, out, bytes);
    int k = rank_count(c, n, "all_to_all");
    MPI_BLOCKING(MPI_Ialltoall(hin, k, MPI_FLOAT, hout, k, MPI_FLOAT, handle(c), &req_));
    stage_back(c, out, hout, bytes);
    leave(c, s);
}

void comm_all_to_all_v(struct comm *c, const float *in, const int *send_counts, float *out,
                       const int *recv_counts) {
    size_t in_n = 0, out_n = 0;
    for (int r = 0; r < c->size; r++) in_n += send_counts[r], out_n += recv_counts[r];
    if (c->nccl) {
        nccl_all_to_all_v(c, in, send_counts, out, recv_counts, "all_to_all_v");
        return;
    }
    if (c->size == 1) {
        local_copy(c, out, in, in_n * sizeof(float));
        return;
    }
    CHECK(in_n < (size_t)INT32_MAX && out_n < (size_t)INT32_MAX);
    c->bytes += in_n * sizeof(float), c->calls++;
    int *displ = xmalloc(sizeof(int) * 2 * c->size), *rdispl = displ + c->size;
    for (int r = 0, s = 0, d = 0; r < c->size; s += send_counts[r], d += recv_counts[r], r++) displ[r] = s, rdispl[r] = d;
    enter(c, "all_to_all_v");
    int s = span(c, "all_to_all_v", in_n * sizeof(float), 0);
    float *hin = stage_in(c, 0, in, in_n * sizeof(float)), *hout = stage_out(c, 1, out, out_n * sizeof(float));
    MPI_BLOCKING(MPI_Ialltoallv(hin, send_counts, displ, MPI_FLOAT, hout, recv_counts, rdispl, MPI_FLOAT, handle(c), &req_));
    stage_back(c, out, hout, out_n * sizeof(float));
    leave(c, s);
    free(displ);
}

int comm_all_to_all_v_start(struct comm *c, const float *in, const int *send_counts, float *out,
                            const int *recv_counts) {
    if (c->nccl || c->stage || c->size == 1) {
        comm_all_to_all_v(c, in, send_counts, out, recv_counts);
        return 0;
    }
    size_t in_n = 0, out_n = 0;
    for (int r = 0; r < c->size; r++) in_n += send_counts[r], out_n += recv_counts[r];
    CHECK(in_n < (size_t)INT32_MAX && out_n < (size_t)INT32_MAX);
    c->bytes += in_n * sizeof(float), c->calls++;
    int ticket = ++c->tickets, n = c->size;
    /* the count and displacement arrays must outlive the call: a copy, freed when it completes */
    int *a = xmalloc(sizeof(int) * 4 * n), *displ = a + n, *rcounts = a + 2 * n, *rdispl = a + 3 * n;
    for (int r = 0, s = 0, d = 0; r < n; s += send_counts[r], d += recv_counts[r], r++)
        a[r] = send_counts[r], displ[r] = s, rcounts[r] = recv_counts[r], rdispl[r] = d;
    enter(c, "all_to_all_v_start");
    int s = span(c, "all_to_all_v_start", in_n * sizeof(float), 1);
    MPI_Request req;
    MPI_CHECK(MPI_Ialltoallv(in, a, displ, MPI_FLOAT, out, rcounts, rdispl, MPI_FLOAT, handle(c), &req));
    track_ticket(c, req, a, ticket, s);
    watchdog_leave();
    return ticket;
}

void comm_barrier(struct comm *c) {
    if (c->size == 1) return;
    enter(c, "barrier");
    int s = span(c, "barrier", 0, 0);
    MPI_BLOCKING(MPI_Ibarrier(handle(c), &req_));
    leave(c, s);
}

void comm_barrier_idle(struct comm *c) {
    if (c->size == 1) return;
    enter(c, "barrier");
    int s = span(c, "barrier", 0, 0);
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(handle(c), &req));
    wait_request_paced(&req, 1000000);
    leave(c, s);
}
