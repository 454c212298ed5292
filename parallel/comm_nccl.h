/* The comm interface over NCCL for GPU ranks (parallel/comm_nccl.c): device
 * buffers straight to the collectives, on a communication stream of each
 * group, ordered against the compute stream by events. libnccl.so.2 is
 * loaded when first asked for (dlopen), so mtrain starts and runs on the CPU
 * and over MPI where NCCL is absent. comm_mpi.c hands a group's calls here
 * when comm->nccl is set, the pipeline's exchanges included. */
#pragma once
#include <stddef.h>

struct comm;
struct comm_p2p;

/* NCCL can be used in this build on this machine: 1, or 0 with why filled. */
int nccl_available(char *why, size_t n);
/* The loaded NCCL's version and file ("2.27.3 (/usr/lib/libnccl.so.2)") into
 * buf, or why none loads (mtrain env). */
void nccl_describe(char *buf, size_t n);
/* Make c's calls NCCL's: rank 0 of the group makes the unique id, MPI
 * broadcasts it over c's MPI communicator, every rank joins (collective over
 * c; the GPU must already be chosen). Works for a group of one too. */
void comm_nccl_init(struct comm *c);
void comm_nccl_free(struct comm *c);

/* comm.h's calls over NCCL (c->nccl set; device buffers) */
void nccl_all_reduce(struct comm *c, float *buf, size_t n, int max, int start);
void nccl_reduce(struct comm *c, float *buf, size_t n, int root);
/* comm_reduce_to_owners_start: a reduce per part onto its owner, one NCCL group */
void nccl_reduce_to_owners(struct comm *c, float *buf, const size_t *lo, const size_t *n);
void nccl_reduce_scatter(struct comm *c, const float *in, float *out, size_t n);
void nccl_all_gather(struct comm *c, const float *in, float *out, size_t n);
void nccl_broadcast(struct comm *c, void *buf, size_t bytes, int root);
void nccl_all_to_all_v(struct comm *c, const float *in, const int *send_counts, float *out, const int *recv_counts,
                       const char *op);
/* the compute stream waits for every call started on c */
void nccl_wait(struct comm *c);
/* comm_all_gather_v_start (one broadcast per piece, grouped) and its wait */
/* The watchdog's failure hooks (parallel/watchdog.h): an asynchronous error
 * on any live communicator (ncclCommGetAsyncError), and ncclCommAbort of
 * them all. Safe from another thread. */
int nccl_poll_async_errors(char *why, size_t n);
void nccl_abort_all(void);
void nccl_all_gather_v(struct comm *c, void *buf, size_t elem, const int *counts, const int *displs, int ticket);
void nccl_wait_ticket(struct comm *c, int ticket);
/* comm_exchange: the group's sends and receives in one NCCL group */
void nccl_exchange(struct comm *c, const struct comm_p2p *ops, int n);
