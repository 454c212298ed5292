/* comm.h over NCCL (see parallel/comm_nccl.h). Streams: the CUDA backend
 * computes on the legacy default stream; each NCCL group has its own
 * non-blocking stream. A call first makes the group's stream wait for the
 * compute stream's work so far (an event), runs there, and records an event
 * after itself; a blocking call makes the compute stream wait for that event
 * at once (the host does not wait: a later copy to the host is ordered
 * behind it), a started one (gradient buckets) only in nccl_wait, so
 * backward keeps computing while the bucket is reduced. The pipeline's
 * exchanges are blocking calls of their group: the compute stream waits for
 * the whole group, and the group's stream for the compute before it, so a
 * buffer is never written by a receive while a kernel still reads it. */
#define _GNU_SOURCE /* dladdr */
#include <stdio.h>
#include <string.h>

#include "config/common.h"
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/timeline.h"
#include "parallel/watchdog.h"

#ifdef MTRAIN_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <mpi.h>
#include <pthread.h>

/* NCCL's ABI, declared here so the build needs no nccl.h (libnccl-dev):
 * these types and values are fixed since NCCL 2.0 */
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
enum { ncclSuccess = 0, ncclUint8 = 1, ncclFloat32 = 7, ncclSum = 0, ncclMax = 2 };

/* the NCCL entry points, from libnccl.so.2 at run time */
static struct {
    void *lib;
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*get_version)(int *); /* optional: only reported */
    ncclResult_t (*get_async_error)(ncclComm_t, ncclResult_t *); /* optional (NCCL 2.4): failure polling */
    ncclResult_t (*abort)(ncclComm_t);                            /* optional (NCCL 2.4): failure release */
} nc;
static char load_error[256];

static int load(void) {
    if (nc.lib) return 1;
    if (load_error[0]) return 0;
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error, "libnccl.so.2 not found (%s); add its directory to LD_LIBRARY_PATH",
                 dlerror());
        return 0;
    }
    struct { void **slot; const char *name; } syms[] = {
        {(void **)&nc.error_string, "ncclGetErrorString"}, {(void **)&nc.get_unique_id, "ncclGetUniqueId"},
        {(void **)&nc.init_rank, "ncclCommInitRank"},      {(void **)&nc.destroy, "ncclCommDestroy"},
        {(void **)&nc.all_reduce, "ncclAllReduce"},        {(void **)&nc.reduce, "ncclReduce"},
        {(void **)&nc.reduce_scatter, "ncclReduceScatter"}, {(void **)&nc.all_gather, "ncclAllGather"},
        {(void **)&nc.broadcast, "ncclBroadcast"},         {(void **)&nc.send, "ncclSend"},
        {(void **)&nc.recv, "ncclRecv"},                   {(void **)&nc.group_start, "ncclGroupStart"},
        {(void **)&nc.group_end, "ncclGroupEnd"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(load_error, sizeof load_error, "libnccl.so.2 has no %s (NCCL 2.7 or newer needed)", syms[i].name);
            dlclose(lib);
            return 0;
        }
    }
    nc.get_version = (ncclResult_t(*)(int *))dlsym(lib, "ncclGetVersion");
    nc.get_async_error = (ncclResult_t(*)(ncclComm_t, ncclResult_t *))dlsym(lib, "ncclCommGetAsyncError");
    nc.abort = (ncclResult_t(*)(ncclComm_t))dlsym(lib, "ncclCommAbort");
    nc.lib = lib;
    return 1;
}

void nccl_describe(char *buf, size_t n) {
    if (!load()) {
        snprintf(buf, n, "not loadable: %s", load_error);
        return;
    }
    int v = 0;
    Dl_info info;
    const char *file = dladdr((void *)nc.init_rank, &info) && info.dli_fname ? info.dli_fname : "?";
    if (nc.get_version && nc.get_version(&v) == ncclSuccess && v > 0) /* 2.9 on: major*10000 + minor*100 + patch */
        snprintf(buf, n, "%d.%d.%d (%s)", v >= 10000 ? v / 10000 : v / 1000, v >= 10000 ? v / 100 % 100 : v / 100 % 10,
                 v % 100, file);
    else
        snprintf(buf, n, "version unknown (%s)", file);
}

int nccl_available(char *why, size_t n) {
    if (load()) return 1;
    snprintf(why, n, "%s", load_error);
    return 0;
}

#define NCCL_CHECK(call)                                                                               \
    do {                                                                                               \
        ncclResult_t r_ = (call);                                                                      \
        if (r_ != ncclSuccess) die("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, nc.error_string(r_)); \
    } while (0)
#define CUDA_OK(call)                                                                                  \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) die("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

/* what a group keeps: the communicator, its stream, its two events, and an
 * event per outstanding ticket (a ring: a rank has fewer gathers in flight
 * than layers) */
#define TICKET_EVENTS 1024
struct nccl_group {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t before, after;
    cudaEvent_t *ticket_events;
    int span; /* the call's on the timeline (parallel/timeline.h), marked on the group's stream */
};

/* Every live communicator, for the watchdog's polling and a failed rank's
 * abort, which run on the monitor thread: the lock keeps a communicator
 * from being destroyed under them. */
#define MAX_GROUPS 16
static struct {
    pthread_mutex_t lock;
    ncclComm_t comm[MAX_GROUPS];
    const char *name[MAX_GROUPS];
    int aborted;
} live = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void track(ncclComm_t comm, const char *name, int add) {
    CHECK(pthread_mutex_lock(&live.lock) == 0);
    for (int i = 0; i < MAX_GROUPS; i++)
        if (add ? !live.comm[i] : live.comm[i] == comm) {
            live.comm[i] = add ? comm : NULL, live.name[i] = name;
            add = -1;
            break;
        }
    CHECK(pthread_mutex_unlock(&live.lock) == 0);
    CHECK(add <= 0); /* a free slot for every group */
}

/* ncclInProgress (7, NCCL 2.14) is not a failure: a non-blocking call still running */
int nccl_poll_async_errors(char *why, size_t n) {
    int failed = 0;
    if (!nc.get_async_error) return 0;
    CHECK(pthread_mutex_lock(&live.lock) == 0);
    for (int i = 0; i < MAX_GROUPS && !failed && !live.aborted; i++) {
        ncclResult_t async = ncclSuccess;
        if (!live.comm[i] || nc.get_async_error(live.comm[i], &async) != ncclSuccess) continue;
        if (async != ncclSuccess && async != 7) {
            snprintf(why, n, "NCCL reported an asynchronous error on group %s: %s (%d): a peer failed or the "
                     "network did", live.name[i] ? live.name[i] : "?", nc.error_string(async), async);
            failed = 1;
        }
    }
    CHECK(pthread_mutex_unlock(&live.lock) == 0);
    return failed;
}

void nccl_abort_all(void) {
    if (!nc.abort || pthread_mutex_trylock(&live.lock) != 0) return; /* the poll holds it: it is ending us */
    if (!live.aborted)
        for (int i = 0; i < MAX_GROUPS; i++)
            if (live.comm[i]) nc.abort(live.comm[i]); /* its result does not matter: the process ends next */
    live.aborted = 1;
    CHECK(pthread_mutex_unlock(&live.lock) == 0);
}

void comm_nccl_init(struct comm *c) {
    if (!load()) die("parallel.comm nccl: %s", load_error);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) NCCL_CHECK(nc.get_unique_id(&id));
    if (c->size > 1 && MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, *(MPI_Comm *)c->handle) != MPI_SUCCESS)
        die("MPI_Bcast of the NCCL id of group %s failed", c->name);
    struct nccl_group *g = xcalloc(1, sizeof *g);
    NCCL_CHECK(nc.init_rank(&g->comm, c->size, id, c->rank));
    track(g->comm, c->name, 1);
    CUDA_OK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&g->before, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&g->after, cudaEventDisableTiming));
    c->nccl = g;
}

void comm_nccl_free(struct comm *c) {
    struct nccl_group *g = c->nccl;
    if (!g) return;
    CUDA_OK(cudaStreamSynchronize(g->stream));
    track(g->comm, NULL, 0);
    NCCL_CHECK(nc.destroy(g->comm));
    CUDA_OK(cudaEventDestroy(g->before));
    CUDA_OK(cudaEventDestroy(g->after));
    if (g->ticket_events)
        for (int i = 0; i < TICKET_EVENTS; i++) CUDA_OK(cudaEventDestroy(g->ticket_events[i]));
    free(g->ticket_events);
    CUDA_OK(cudaStreamDestroy(g->stream));
    free(g);
    c->nccl = NULL;
}

/* the group's stream waits for the compute stream's work so far */
static struct nccl_group *begin(struct comm *c, size_t bytes, const char *op, int start) {
    struct nccl_group *g = c->nccl;
    c->bytes += bytes, c->calls++;
    CUDA_OK(cudaEventRecord(g->before, 0));
    CUDA_OK(cudaStreamWaitEvent(g->stream, g->before, 0));
    g->span = timeline_begin(op, c->name ? c->name : "?", bytes, start, g->stream);
    watchdog_enter(op, c->name ? c->name : "?", c->rank, c->size); /* a call blocked in NCCL shows */
    return g;
}

/* after the call: the compute stream waits for it now, or (started) in nccl_wait */
static void end(struct nccl_group *g, int start) {
    watchdog_leave();
    timeline_end(g->span, g->stream);
    CUDA_OK(cudaEventRecord(g->after, g->stream));
    if (!start) CUDA_OK(cudaStreamWaitEvent(0, g->after, 0));
}

void nccl_wait(struct comm *c) {
    struct nccl_group *g = c->nccl;
    CUDA_OK(cudaStreamWaitEvent(0, g->after, 0)); /* the last recorded: calls on one stream complete in order */
}

void nccl_all_reduce(struct comm *c, float *buf, size_t n, int max, int start) {
    const char *op = start ? "all_reduce_sum_start" : max ? "all_reduce_max" : "all_reduce_sum";
    struct nccl_group *g = begin(c, n * sizeof(float), op, start);
    NCCL_CHECK(nc.all_reduce(buf, buf, n, ncclFloat32, max ? ncclMax : ncclSum, g->comm, g->stream));
    end(g, start);
}

void nccl_reduce(struct comm *c, float *buf, size_t n, int root) {
    struct nccl_group *g = begin(c, n * sizeof(float), "reduce_sum_start", 1);
    NCCL_CHECK(nc.reduce(buf, buf, n, ncclFloat32, ncclSum, root, g->comm, g->stream));
    end(g, 1);
}

void nccl_reduce_to_owners(struct comm *c, float *buf, const size_t *lo, const size_t *n) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += n[r];
    if (!total) return;
    struct nccl_group *g = begin(c, total * sizeof(float), "reduce_sum_start", 1);
    NCCL_CHECK(nc.group_start());
    for (int r = 0; r < c->size; r++)
        if (n[r]) NCCL_CHECK(nc.reduce(buf + lo[r], buf + lo[r], n[r], ncclFloat32, ncclSum, r, g->comm, g->stream));
    NCCL_CHECK(nc.group_end());
    end(g, 1);
}

void nccl_reduce_scatter(struct comm *c, const float *in, float *out, size_t n) {
    struct nccl_group *g = begin(c, (size_t)c->size * n * sizeof(float), "reduce_scatter_sum", 0);
    NCCL_CHECK(nc.reduce_scatter(in, out, n, ncclFloat32, ncclSum, g->comm, g->stream));
    end(g, 0);
}

void nccl_all_gather(struct comm *c, const float *in, float *out, size_t n) {
    struct nccl_group *g = begin(c, (size_t)c->size * n * sizeof(float), "all_gather", 0);
    NCCL_CHECK(nc.all_gather(in, out, n, ncclFloat32, g->comm, g->stream));
    end(g, 0);
}

void nccl_broadcast(struct comm *c, void *buf, size_t bytes, int root) {
    struct nccl_group *g = begin(c, bytes, "broadcast", 0);
    NCCL_CHECK(nc.broadcast(buf, buf, bytes, ncclUint8, root, g->comm, g->stream));
    end(g, 0);
}

/* each piece broadcast from its owner, in place, grouped; the ticket's event
 * marks its end for nccl_wait_ticket */
void nccl_all_gather_v(struct comm *c, void *buf, size_t elem, const int *counts, const int *displs, int ticket) {
    size_t total = 0;
    char *b = buf;
    for (int r = 0; r < c->size; r++) total += (size_t)counts[r];
    struct nccl_group *g = begin(c, total * elem, "all_gather_v_start", 1);
    if (!g->ticket_events) {
        g->ticket_events = xmalloc(sizeof(cudaEvent_t) * TICKET_EVENTS);
        for (int i = 0; i < TICKET_EVENTS; i++)
            CUDA_OK(cudaEventCreateWithFlags(&g->ticket_events[i], cudaEventDisableTiming));
    }
    NCCL_CHECK(nc.group_start());
    for (int r = 0; r < c->size; r++)
        if (counts[r])
            NCCL_CHECK(nc.broadcast(b + elem * displs[r], b + elem * displs[r], elem * counts[r], ncclUint8, r,
                                    g->comm, g->stream)); /* a copy: bytes whatever the values are */
    NCCL_CHECK(nc.group_end());
    end(g, 1);
    CUDA_OK(cudaEventRecord(g->ticket_events[ticket % TICKET_EVENTS], g->stream));
}

void nccl_wait_ticket(struct comm *c, int ticket) {
    struct nccl_group *g = c->nccl;
    if (g->ticket_events) CUDA_OK(cudaStreamWaitEvent(0, g->ticket_events[ticket % TICKET_EVENTS], 0));
}

/* one grouped send and receive per peer (the rank itself included: a copy) */
void nccl_all_to_all_v(struct comm *c, const float *in, const int *send_counts, float *out, const int *recv_counts,
                       const char *op) {
    size_t in_n = 0;
    for (int r = 0; r < c->size; r++) in_n += send_counts[r];
    struct nccl_group *g = begin(c, in_n * sizeof(float), op, 0);
    NCCL_CHECK(nc.group_start());
    size_t so = 0, ro = 0;
    for (int r = 0; r < c->size; r++) {
        if (send_counts[r]) NCCL_CHECK(nc.send(in + so, send_counts[r], ncclFloat32, r, g->comm, g->stream));
        if (recv_counts[r]) NCCL_CHECK(nc.recv(out + ro, recv_counts[r], ncclFloat32, r, g->comm, g->stream));
        so += send_counts[r], ro += recv_counts[r];
    }
    NCCL_CHECK(nc.group_end());
    end(g, 0);
}

/* the pipeline's transfers: one NCCL group, in the order given (NCCL
 * matches a pair's sends and receives in issue order) */
void nccl_exchange(struct comm *c, const struct comm_p2p *ops, int n) {
    size_t sent = 0;
    for (int i = 0; i < n; i++) sent += ops[i].recv ? 0 : ops[i].bytes;
    if (!n) return;
    struct nccl_group *g = begin(c, sent, "exchange", 0);
    NCCL_CHECK(nc.group_start());
    for (int i = 0; i < n; i++) {
        const struct comm_p2p *o = &ops[i];
        CHECK(!o->tag); /* NCCL matches in posting order only */
        if (o->recv) NCCL_CHECK(nc.recv(o->buf, o->bytes, ncclUint8, o->peer, g->comm, g->stream));
        else NCCL_CHECK(nc.send(o->buf, o->bytes, ncclUint8, o->peer, g->comm, g->stream));
    }
    NCCL_CHECK(nc.group_end());
    end(g, 0);
}

#else /* no CUDA in this build: no NCCL; nothing sets comm->nccl */

int nccl_available(char *why, size_t n) {
    snprintf(why, n, "this build of mtrain has no CUDA backend");
    return 0;
}
void nccl_describe(char *buf, size_t n) { snprintf(buf, n, "not used: this build of mtrain has no CUDA backend"); }
void comm_nccl_init(struct comm *c) { die("group %s: this build of mtrain has no NCCL", c->name); }
void comm_nccl_free(struct comm *c) { (void)c; }
void nccl_all_reduce(struct comm *c, float *buf, size_t n, int max, int start) { CHECK(0); }
void nccl_reduce(struct comm *c, float *buf, size_t n, int root) { CHECK(0); }
void nccl_reduce_to_owners(struct comm *c, float *buf, const size_t *lo, const size_t *n) { CHECK(0); }
void nccl_reduce_scatter(struct comm *c, const float *in, float *out, size_t n) { CHECK(0); }
void nccl_all_gather(struct comm *c, const float *in, float *out, size_t n) { CHECK(0); }
void nccl_broadcast(struct comm *c, void *buf, size_t bytes, int root) { CHECK(0); }
void nccl_all_to_all_v(struct comm *c, const float *in, const int *send_counts, float *out, const int *recv_counts,
                       const char *op) {
    CHECK(0);
}
void nccl_wait(struct comm *c) { CHECK(0); }
void nccl_all_gather_v(struct comm *c, void *buf, size_t elem, const int *counts, const int *displs, int ticket) {
    CHECK(0);
}
void nccl_wait_ticket(struct comm *c, int ticket) { CHECK(0); }
int nccl_poll_async_errors(char *why, size_t n) { return 0; }
void nccl_abort_all(void) {}
void nccl_exchange(struct comm *c, const struct comm_p2p *ops, int n) { CHECK(0); }
#endif
