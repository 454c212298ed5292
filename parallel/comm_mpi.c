/* The comm interface over MPI (CPU buffers). */
#include <mpi.h>
#include <string.h>

#include "config/common.h"
#include "parallel/comm.h"

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

/* Outstanding non-blocking requests of this process (sends and collectives). */
#define MAX_PENDING 4096
struct pending {
    MPI_Request req[MAX_PENDING];
    const struct comm *owner[MAX_PENDING];
    int n;
};
static struct pending pending;

static MPI_Comm handle(const struct comm *c) { return *(MPI_Comm *)c->handle; }

static void track(const struct comm *c, MPI_Request r) {
    if (pending.n == MAX_PENDING) die("too many outstanding communication requests");
    pending.req[pending.n] = r;
    pending.owner[pending.n++] = c;
}

void comm_all_reduce_sum(struct comm *c, float *buf, size_t n) {
    if (c->size == 1 || n == 0) return;
    c->bytes += n * sizeof(float), c->calls++;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, handle(c)));
}

void comm_all_reduce_max(struct comm *c, float *buf, size_t n) {
    if (c->size == 1 || n == 0) return;
    c->bytes += n * sizeof(float), c->calls++;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_MAX, handle(c)));
}

void comm_all_reduce_sum_f64(struct comm *c, double *buf, size_t n) {
    if (c->size == 1 || n == 0) return;
    c->bytes += n * sizeof(double), c->calls++;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, handle(c)));
}

void comm_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n) {
    if (c->size == 1) {
        if (out != in) memmove(out, in, n * sizeof(float));
        return;
    }
    c->bytes += (size_t)c->size * n * sizeof(float), c->calls++;
    MPI_CHECK(MPI_Reduce_scatter_block(in, out, (int)n, MPI_FLOAT, MPI_SUM, handle(c)));
}

void comm_all_gather(struct comm *c, const float *in, float *out, size_t n) {
    if (c->size == 1) {
        if (out != in) memmove(out, in, n * sizeof(float));
        return;
    }
    c->bytes += (size_t)c->size * n * sizeof(float), c->calls++;
    MPI_CHECK(MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, handle(c)));
}

void comm_broadcast(struct comm *c, void *buf, size_t bytes, int root) {
    if (c->size == 1) return;
    c->bytes += bytes, c->calls++;
    MPI_CHECK(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, handle(c)));
}

void comm_send(struct comm *c, const void *buf, size_t bytes, int peer, int tag) {
    MPI_Request r;
    c->bytes += bytes, c->calls++;
    MPI_CHECK(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, handle(c), &r));
    track(c, r);
}

void comm_recv(struct comm *c, void *buf, size_t bytes, int peer, int tag) {
    MPI_CHECK(MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, tag, handle(c), MPI_STATUS_IGNORE));
}

static void wait_owned(const struct comm *c) {
    int kept = 0;
    for (int i = 0; i < pending.n; i++) {
        if (pending.owner[i] == c) {
            MPI_CHECK(MPI_Wait(&pending.req[i], MPI_STATUS_IGNORE));
        } else {
            pending.req[kept] = pending.req[i];
            pending.owner[kept++] = pending.owner[i];
        }
    }
    pending.n = kept;
}

void comm_wait_sends(struct comm *c) { wait_owned(c); }
void comm_wait_all(struct comm *c) { wait_owned(c); }

void comm_all_reduce_sum_start(struct comm *c, float *buf, size_t n) {
    if (c->size == 1 || n == 0) return;
    MPI_Request r;
    c->bytes += n * sizeof(float), c->calls++;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, handle(c), &r));
    track(c, r);
}

void comm_all_to_all(struct comm *c, const float *in, float *out, size_t n) {
    if (c->size == 1) {
        if (out != in) memmove(out, in, n * sizeof(float));
        return;
    }
    c->bytes += (size_t)c->size * n * sizeof(float), c->calls++;
    MPI_CHECK(MPI_Alltoall(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, handle(c)));
}

void comm_barrier(struct comm *c) {
    if (c->size > 1) MPI_CHECK(MPI_Barrier(handle(c)));
}
