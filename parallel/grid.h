/* The process grid: world rank -> (tp, cp, ep, dp, pp) coordinates in
 * Megatron's order (tp fastest, then cp, ep, dp, pp slowest, so tensor-parallel
 * groups stay inside a node), and one communicator per group. */
#pragma once
#include "config/recipe.h"
#include "parallel/comm.h"

struct grid {
    int world_rank, world_size, local_rank, local_size; /* local: ranks on this node */
    int tp, cp, ep, dp, pp, vpp;
    int tp_rank, cp_rank, ep_rank, dp_rank, pp_rank;
    /* The routed experts have a grid of their own over the tp x cp x dp ranks
     * of a pipeline stage, as Megatron's: numbered q = tp_rank + tp * (cp_rank
     * + cp * dp_rank), q = etp_rank + etp * (ep_rank + ep * edp_rank). With
     * etp 1 experts are whole, split over ep ranks that may be
     * tensor-parallel peers, never replicated over TP for its own sake; with
     * etp > 1 each expert's FFN width is split over etp ranks as well.
     * ep_comm joins the ep ranks that split the experts (all-to-all dispatch);
     * etp_comm the etp ranks that split the same experts' width (rows
     * gathered before the experts, partial outputs summed after);
     * edp_comm the edp = tp*cp*dp / (etp*ep) ranks that hold the same expert
     * slices (their gradients' reduction). */
    int etp, etp_rank, edp, edp_rank;
    /* dp_comm sums the gradients: the dp ranks and, under context
     * parallelism, their cp peers (dp x cp ranks; ZeRO-1 shards over it).
     * cp_comm: the ranks holding the other chunks of the same sequences
     * (the attention ring, model/cp_attention.h). */
    struct comm world, tp_comm, dp_comm, pp_comm, ep_comm, edp_comm, cp_comm, etp_comm;
    /* The embedding group: the first and the last pipeline stage of each
     * (tp, cp, dp) position, which both hold the embedding when the head
     * uses it (tied embeddings, MTP); their gradients are summed over it.
     * Size 1 (no calls) on middle stages and without pipeline parallelism. */
    struct comm embed_comm;
};

/* The grid's communicators, world first, in one fixed order (every rank
 * walks them alike); returns how many (at most GRID_COMMS). */
#define GRID_COMMS 9
int grid_comms(struct grid *g, struct comm **out);

/* MPI_Init (a singleton run works without mpirun). Safe to call once. */
void parallel_init(int *argc, char ***argv);
void parallel_finalize(void);
/* From now on (several ranks) an error on this rank (die) names the rank
 * and ends the whole job at once: its NCCL communicators are aborted and
 * MPI_Abort ends the others, with train.abort_timeout_s as the backstop
 * (parallel/watchdog.h). Off again with on = 0 (the run's teardown). */
void parallel_abort_on_error(int on);
/* World size and rank after parallel_init. */
int parallel_world_size(void);
/* The MPI library's version line ("MPICH Version: 4.0.2 ...") into buf. */
void parallel_library_version(char *buf, int n);
int parallel_world_rank(void);
/* Build the grid for the recipe's layout; dp = world / (tp*cp*pp). The
 * layout must already be validated for this world size. */
void grid_create(struct grid *g, const struct parallel_config *p);
void grid_free(struct grid *g);
/* The model's groups (tp, dp, pp) carry device memory of backend be: their
 * calls stage it through host buffers (see struct comm). world stays host. */
void grid_stage_device(struct grid *g, const struct backend *be);
/* GPU ranks: the groups that carry device tensors (tp, dp, pp, ep, cp, and
 * edp, etp and embed where the model uses them: routed experts, a head or MTP that
 * reads the embedding) get NCCL communicators, each of size > 1 (collective
 * over the world; the GPU must be chosen). A communicator holds GPU memory
 * and takes time to set up, so an unused group gets none (a call on it
 * would go over MPI). */
void grid_use_nccl(struct grid *g, int with_experts, int with_embed);
/* How many other ranks drive this rank's GPU (the same host and PCI bus id;
 * collective over the world): NCCL needs a GPU per rank. Whether each rank
 * sees every GPU of its node or only its own. */
int grid_ranks_sharing_gpu(struct grid *g);
/* A single-rank grid with no MPI (tests, tools). */
void grid_single(struct grid *g);
/* Abort every rank of the job with exit code code (after a message). */
void parallel_abort(int code) __attribute__((noreturn));

/* Rank 0 writes path (JSON: every rank's pid, host and grid coordinates), so
 * that a launcher's message naming a dead process (Hydra: "PID ... RUNNING
 * AT host") maps to its rank; every rank calls it. */
void grid_write_ranks(const struct grid *g, const char *path);
