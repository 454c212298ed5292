/* Collective and point-to-point communication over one group of ranks.
 * The interface is backend-neutral (buffers are backend memory):
 * parallel/comm_mpi.c implements it with MPI (GPU memory staged through host
 * buffers) and hands a group's collectives to NCCL (parallel/comm_nccl.h)
 * when the group has an NCCL communicator. Every call adds its payload to bytes (the buffer a
 * collective reduces or gathers: n elements for an all-reduce, size * n for a
 * reduce-scatter's input or an all-gather's output; the messages it sends),
 * for the communication-volume benchmark. A group of size 1 makes every collective a
 * no-op (or a copy), so single-rank code pays nothing. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct backend;

struct comm {
    int rank, size;
    void *handle;               /* MPI_Comm (owned) */
    uint64_t bytes;             /* payload bytes of this rank's calls on this group */
    uint64_t calls;
    uint64_t overlapped;        /* of bytes: gradient buckets started while backward went on (model/optimizer.c) */
    const char *name;           /* "tp", "dp", "pp", "world" (messages, stats) */
    /* Non-NULL: the float buffers (and sends/receives) are this backend's
     * device memory, staged through host buffers around each MPI call. This
     * is how GPU runs communicate until the NCCL implementation lands:
     * correct, not fast. comm_all_reduce_sum_f64 always takes host memory. */
    const struct backend *stage;
    void *host[2];              /* staging buffers (grown on demand) */
    /* Non-NULL: the group's float collectives and exchanges run on NCCL
     * with device buffers (parallel/comm_nccl.h), even for a group of one;
     * barriers and comm_all_reduce_sum_f64 stay on MPI. */
    void *nccl;
    size_t host_bytes[2];
    int tickets;                /* comm_all_gather_v_start's tickets issued so far */
};

/* sum (or max) in place over the group */
void comm_all_reduce_sum(struct comm *c, float *buf, size_t n);
void comm_all_reduce_max(struct comm *c, float *buf, size_t n);
void comm_all_reduce_sum_f64(struct comm *c, double *buf, size_t n);
/* in: size * n floats (rank-major blocks); out: this rank's reduced block of n */
void comm_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n);
/* in: n floats; out: size * n floats, rank-major */
void comm_all_gather(struct comm *c, const float *in, float *out, size_t n);
void comm_broadcast(struct comm *c, void *buf, size_t bytes, int root);
/* Point to point, as one group: every send and receive of ops is posted at
 * once and the call completes when all are done (the host returns at once
 * over NCCL, where the compute stream waits for them). Transfers from one
 * rank to another meet in the order they are posted, within a group and
 * across groups: there are no tags (NCCL has none), so both ends must post
 * them in the same order. A group completes only when each of its transfers
 * has met its peer's, so a send blocks like a receive: the pipeline's groups
 * are planned in parallel/schedule.h. */
struct comm_p2p {
    void *buf;
    size_t bytes;
    int peer;
    int recv;   /* 1: receive into buf, 0: send buf */
    int tag;    /* 0, or over MPI a tag that matches a send to its receive out of posting order (buffered
                 * pipeline schedules: parallel/schedule.h schedule_tag); NCCL has none and refuses it */
};
#define COMM_EXCHANGE_MAX 8 /* transfers in one group */
void comm_exchange(struct comm *c, const struct comm_p2p *ops, int n);
/* The same transfers begun without waiting for them, so that computation
 * can run meanwhile (the buffers are not touched until comm_wait_ticket of
 * the returned ticket): over MPI on host memory, and sends of device memory
 * staged through the host (each from a host copy of its own: the device
 * buffer is free again at once). Where that cannot be (NCCL, or a staged
 * receive) the exchange runs to its end here and 0 is returned (nothing to
 * wait for). */
int comm_exchange_start(struct comm *c, const struct comm_p2p *ops, int n);
/* in and out: size blocks of n floats each */
void comm_all_to_all(struct comm *c, const float *in, float *out, size_t n);
/* Variable-size all-to-all: in holds send_counts[r] floats for each rank r in
 * rank order, out receives recv_counts[r] floats from each rank r in rank
 * order (the counts are exchanged beforehand, e.g. with comm_all_to_all).
 * Counts its input as payload. */
void comm_all_to_all_v(struct comm *c, const float *in, const int *send_counts, float *out, const int *recv_counts);
/* The same begun without waiting (host memory over MPI): returns a ticket
 * for comm_wait_ticket, in and out untouched until then; elsewhere (NCCL,
 * staged device memory, a group of one) it runs to its end here and returns
 * 0. dualpipev's pairs overlap one micro batch's expert all-to-all with the
 * other's compute this way (model/pair.c). */
int comm_all_to_all_v_start(struct comm *c, const float *in, const int *send_counts, float *out,
                            const int *recv_counts);
void comm_barrier(struct comm *c);
/* A barrier whose wait sleeps (a millisecond between polls) instead of
 * yielding: for ranks that stand aside while another times something on
 * the cores they share (`mtrain plan --calibrate` oversubscribed). */
void comm_barrier_idle(struct comm *c);
/* Release the staging buffers (the MPI handle is the grid's). */
void comm_free_staging(struct comm *c);
/* Non-blocking sum all-reduce in place; comm_wait_all completes every
 * outstanding non-blocking collective of c. */
void comm_all_reduce_sum_start(struct comm *c, float *buf, size_t n);
/* Non-blocking sum onto root, in place: root's buf receives the sum over
 * the group, the others' buf is left as it was (ZeRO-1's gradient buckets:
 * each part reduced onto the rank that updates it). Completed by
 * comm_wait_all. */
void comm_reduce_sum_start(struct comm *c, float *buf, size_t n, int root);
/* Non-blocking, in place: each rank r's part of buf, n[r] floats from
 * element lo[r] (parts do not overlap), summed over the group onto rank r;
 * the other parts are left as they were. A reduce-scatter whose parts lie
 * where the caller keeps them (ZeRO-1's shards of a gradient bucket, the
 * rows of expert tensor parallelism's peers). Over NCCL one group of
 * reduces (one launch); over MPI a comm_reduce_sum_start per part.
 * Completed by comm_wait_all. */
void comm_reduce_to_owners_start(struct comm *c, float *buf, const size_t *lo, const size_t *n);
void comm_wait_all(struct comm *c);
/* Move c's started calls along without waiting for them: MPI progresses
 * non-blocking collectives only inside MPI calls, so the trainer calls this
 * as backward finishes each layer (and the forward before each layer's
 * gather wait); a call found complete is ended on the timeline then. Over
 * NCCL (its own stream) nothing. */
void comm_progress(struct comm *c);
/* Non-blocking all-gather in place (ZeRO-1's parameters, bucket by bucket):
 * rank r's piece, counts[r] values of elem bytes (4: fp32, 2: the bf16
 * working copy) at element displs[r] of buf, is already in place on rank
 * r; afterwards every rank holds every piece. Returns a ticket (> 0):
 * comm_wait_ticket completes that gather and every earlier one of c, and
 * comm_wait_all completes them all. buf must not be touched in between. */
int comm_all_gather_v_start(struct comm *c, void *buf, size_t elem, const int *counts, const int *displs);
void comm_wait_ticket(struct comm *c, int ticket);
/* Whether the calls of one ticket (comm_exchange_start's) have completed,
 * without waiting: 1 (and the ticket is done with), else 0. MPI only (host
 * memory, or staged sends), not NCCL: the buffered pipeline sends of zbv. */
int comm_ticket_done(struct comm *c, int ticket);
