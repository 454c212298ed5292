/* A stand-in libnccl.so.2 over MPI on host memory, for
 * tests/integration/nccl_mock.sh: the NCCL entry points parallel/comm_nccl.c
 * loads, with NCCL's documented semantics (in-place forms, root-only
 * buffers, grouped sends and receives matched in issue order per peer),
 * run at once in issue order (the stream argument is ignored: with
 * tests/mock/cudart_mock.c every "device" buffer is host memory).
 *
 * Every buffer must be device memory (what tests/mock/cudart_mock.c's
 * cudaMalloc gave, asked through its mock_cuda_is_device when it is
 * loaded): a host pointer handed to NCCL fails here as it would on a GPU.
 *
 * Communicators: ncclCommInitRank's members meet through files named by
 * the unique id in MOCK_NCCL_DIR (one node): each writes its MPI world
 * rank, reads the others', and MPI_Comm_create_group makes the group, which
 * only its members call (as only they call ncclCommInitRank).
 *
 * Failures, for tests/integration/nccl_mock.sh: MOCK_NCCL_FAIL=RANK:CALL:KIND
 * makes MPI world rank RANK's CALL-th ncclAllReduce (1-based) fail: KIND
 * error returns ncclSystemError; async blocks in the call with
 * ncclCommGetAsyncError reporting ncclRemoteError (a peer gone, as NCCL's
 * proxy thread would see it) until ncclCommAbort; exit ends the process
 * inside the call (exit(3)). */
#include <dlfcn.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };
enum { ncclUint8 = 1, ncclFloat32 = 7 };
enum { ncclSum = 0, ncclMax = 2 };

struct ncclComm {
    MPI_Comm mpi;
    int rank, size;
};
enum { ncclRemoteError = 6 };
static volatile int async_error, aborted; /* the injected asynchronous failure; set by ncclCommAbort */

ncclResult_t ncclCommGetAsyncError(struct ncclComm *c, ncclResult_t *out) {
    *out = async_error;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(struct ncclComm *c) {
    aborted = 1;
    return ncclSuccess;
}

/* the injected failure of this call, if it is the one (0: none) */
static ncclResult_t fault(void) {
    static int calls;
    const char *f = getenv("MOCK_NCCL_FAIL");
    int rank, at, world;
    char kind[16];
    if (!f || sscanf(f, "%d:%d:%15s", &rank, &at, kind) != 3) return ncclSuccess;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    if (world != rank || ++calls != at) return ncclSuccess;
    if (!strcmp(kind, "exit")) exit(3);
    if (!strcmp(kind, "async")) {
        async_error = ncclRemoteError;
        while (!aborted) usleep(10000);
    }
    return ncclSystemError;
}
typedef struct ncclComm *ncclComm_t;

const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : r == ncclInvalidArgument ? "invalid argument (mock)" : "mock NCCL error";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static unsigned counter;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "mock-%ld-%u-%ld-%ld", (long)getpid(), counter++, (long)t.tv_sec,
             t.tv_nsec);
    return ncclSuccess;
}

static const char *dir(void) {
    const char *d = getenv("MOCK_NCCL_DIR");
    return d && *d ? d : "/tmp";
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || rank < 0 || rank >= nranks || !id.internal[0]) return ncclInvalidArgument;
    int world;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/%s.%d", dir(), id.internal, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", world) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) return ncclSystemError;
    int *members = calloc(nranks, sizeof *members);
    for (int r = 0; r < nranks; r++) { /* wait for each member's file (written whole: renamed into place) */
        snprintf(path, sizeof path, "%s/%s.%d", dir(), id.internal, r);
        for (int tries = 0;; tries++) {
            FILE *g = fopen(path, "r");
            if (g) {
                int ok = fscanf(g, "%d", &members[r]) == 1;
                fclose(g);
                if (ok) break;
            }
            if (tries > 60000) return ncclSystemError; /* a minute */
            usleep(1000);
        }
    }
    MPI_Group all, group;
    MPI_Comm_group(MPI_COMM_WORLD, &all);
    MPI_Group_incl(all, nranks, members, &group);
    unsigned tag = 0;
    for (const char *s = id.internal; *s; s++) tag = tag * 31 + (unsigned char)*s;
    struct ncclComm *c = calloc(1, sizeof *c);
    if (MPI_Comm_create_group(MPI_COMM_WORLD, group, (int)(tag % 30000), &c->mpi) != MPI_SUCCESS) return ncclSystemError;
    MPI_Group_free(&group);
    MPI_Group_free(&all);
    free(members);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    if (c->rank != rank || c->size != nranks) return ncclInvalidUsage;
    MPI_Barrier(c->mpi); /* every member has read every file */
    snprintf(path, sizeof path, "%s/%s.%d", dir(), id.internal, rank);
    unlink(path);
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    MPI_Comm_free(&c->mpi);
    free(c);
    return ncclSuccess;
}

/* [p, p + bytes) is device memory (the CUDA runtime stand-in must be preloaded: without it nothing could say) */
static int device(const void *p, size_t bytes) {
    static int (*is_device)(const void *, size_t);
    if (!is_device) is_device = (int (*)(const void *, size_t))dlsym(RTLD_DEFAULT, "mock_cuda_is_device");
    if (!is_device) {
        fprintf(stderr, "nccl_mock: mock_cuda_is_device not found: preload tests/mock/cudart_mock.c's library\n");
        abort();
    }
    return !bytes || is_device(p, bytes);
}

static MPI_Datatype type(int t) { return t == ncclUint8 ? MPI_BYTE : t == ncclFloat32 ? MPI_FLOAT : MPI_DATATYPE_NULL; }
static size_t bytes_of(int t) { return t == ncclUint8 ? 1 : 4; }
static MPI_Op op(int o) { return o == ncclSum ? MPI_SUM : o == ncclMax ? MPI_MAX : MPI_OP_NULL; }
#define ARGS_OK(t, c) (type(t) != MPI_DATATYPE_NULL && (c))
#define MPI_OK(call) ((call) == MPI_SUCCESS ? ncclSuccess : ncclSystemError)

/* MPI_Wait that gives the core away between polls, as mtrain's own MPI waits do (parallel/comm_mpi.c
 * wait_request): the tests run more ranks than cores */
static int wait_yielding(MPI_Request *q) {
    for (unsigned polls = 0;; polls++) {
        int done = 0, rc = MPI_Test(q, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        if (polls >= 64) sched_yield();
    }
}
/* a blocking call as its non-blocking twin (taking &q) and wait_yielding */
#define BLOCKING(icall) (MPI_OK((icall) == MPI_SUCCESS ? wait_yielding(&q) : MPI_ERR_OTHER))

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, int t, int o, ncclComm_t c, void *stream) {
    if (!ARGS_OK(t, c) || op(o) == MPI_OP_NULL) return ncclInvalidArgument;
    ncclResult_t f = fault();
    if (f != ncclSuccess) return f;
    if (!device(send, n * bytes_of(t)) || !device(recv, n * bytes_of(t))) return ncclInvalidArgument;
    MPI_Request q;
    return BLOCKING(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)n, type(t), op(o), c->mpi, &q));
}

/* recv matters at the root only */
ncclResult_t ncclReduce(const void *send, void *recv, size_t n, int t, int o, int root, ncclComm_t c, void *stream) {
    if (!ARGS_OK(t, c) || op(o) == MPI_OP_NULL || root < 0 || root >= c->size) return ncclInvalidArgument;
    if (!device(send, n * bytes_of(t)) || (c->rank == root && !device(recv, n * bytes_of(t)))) return ncclInvalidArgument;
    const void *s = c->rank == root && send == recv ? MPI_IN_PLACE : send;
    /* non-blocking and a wait: MPICH 4.0.2's blocking in-place reduce onto a root other than 0 crashes
     * (parallel/comm_mpi.c) */
    MPI_Request q;
    int rc = MPI_Ireduce(s, c->rank == root ? recv : NULL, (int)n, type(t), op(o), root, c->mpi, &q);
    return MPI_OK(rc == MPI_SUCCESS ? wait_yielding(&q) : rc);
}

/* in place when send is recv's block of the whole: recv == send + rank * n */
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, int t, int o, ncclComm_t c, void *stream) {
    if (!ARGS_OK(t, c) || op(o) == MPI_OP_NULL) return ncclInvalidArgument;
    if (!device(send, c->size * n * bytes_of(t)) || !device(recv, n * bytes_of(t))) return ncclInvalidArgument;
    if ((const char *)recv == (const char *)send + c->rank * n * bytes_of(t)) {
        size_t b = n * bytes_of(t);
        void *tmp = malloc(b ? b : 1);
        MPI_Request q;
        ncclResult_t rc = BLOCKING(MPI_Ireduce_scatter_block(send, tmp, (int)n, type(t), op(o), c->mpi, &q));
        memcpy(recv, tmp, b);
        free(tmp);
        return rc;
    }
    MPI_Request q;
    return BLOCKING(MPI_Ireduce_scatter_block(send, recv, (int)n, type(t), op(o), c->mpi, &q));
}

/* in place when send == recv + rank * n */
ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, int t, ncclComm_t c, void *stream) {
    if (!ARGS_OK(t, c)) return ncclInvalidArgument;
    if (!device(send, n * bytes_of(t)) || !device(recv, c->size * n * bytes_of(t))) return ncclInvalidArgument;
    int in_place = (const char *)send == (const char *)recv + c->rank * n * bytes_of(t);
    MPI_Request q;
    return BLOCKING(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)n, type(t), recv, (int)n, type(t), c->mpi, &q));
}

/* send matters at the root only; every rank's recv receives */
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t n, int t, int root, ncclComm_t c, void *stream) {
    if (!ARGS_OK(t, c) || root < 0 || root >= c->size) return ncclInvalidArgument;
    if ((c->rank == root && !device(send, n * bytes_of(t))) || !device(recv, n * bytes_of(t))) return ncclInvalidArgument;
    if (c->rank == root && send != recv) memmove(recv, send, n * bytes_of(t));
    MPI_Request q;
    return BLOCKING(MPI_Ibcast(recv, (int)n, type(t), root, c->mpi, &q));
}

/* point to point: inside a group, posted at ncclGroupEnd in issue order
 * (MPI matches a pair's messages in order, as NCCL does); outside one, a
 * group of one */
#define MAX_P2P 4096
static struct p2p { void *buf; size_t n; int t, peer, recv; ncclComm_t c; } queue[MAX_P2P];
static int queued, depth;

static ncclResult_t flush(void) {
    MPI_Request *req = malloc(sizeof *req * (queued ? queued : 1));
    int rc = MPI_SUCCESS;
    for (int i = 0; i < queued && rc == MPI_SUCCESS; i++) {
        struct p2p *p = &queue[i];
        rc = p->recv ? MPI_Irecv(p->buf, (int)p->n, type(p->t), p->peer, 77, p->c->mpi, &req[i])
                     : MPI_Isend(p->buf, (int)p->n, type(p->t), p->peer, 77, p->c->mpi, &req[i]);
    }
    for (int i = 0; i < queued && rc == MPI_SUCCESS; i++) rc = wait_yielding(&req[i]);
    free(req);
    queued = 0;
    return MPI_OK(rc);
}

static ncclResult_t p2p(void *buf, size_t n, int t, int peer, int recv, ncclComm_t c) {
    if (!ARGS_OK(t, c) || peer < 0 || peer >= c->size || queued == MAX_P2P) return ncclInvalidArgument;
    if (!device(buf, n * bytes_of(t))) return ncclInvalidArgument;
    queue[queued++] = (struct p2p){buf, n, t, peer, recv, c};
    return depth ? ncclSuccess : flush();
}
ncclResult_t ncclSend(const void *buf, size_t n, int t, int peer, ncclComm_t c, void *stream) {
    return p2p((void *)buf, n, t, peer, 0, c);
}
ncclResult_t ncclRecv(void *buf, size_t n, int t, int peer, ncclComm_t c, void *stream) {
    return p2p(buf, n, t, peer, 1, c);
}

ncclResult_t ncclGroupStart(void) {
    depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (depth == 0) return ncclInvalidUsage;
    return --depth ? ncclSuccess : flush();
}
