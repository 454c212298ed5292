/* One optimizer step of this rank's part of the model: the pipeline schedule
 * over micro batches (gradient accumulation is the schedule with pp = 1),
 * gradient synchronisation, global grad norm, clipping, LR schedule, AdamW.
 * Used by `mtrain pretrain`, the PyTorch reference driver and the benchmarks,
 * so all of them exercise the same path. */
#pragma once
#include <stdint.h>

#include "config/recipe.h"
#include "model/transformer.h"
#include "model/optimizer.h"
#include "parallel/grid.h"
#include "parallel/schedule.h"

struct trainer {
    struct transformer model;
    struct optimizer opt;
    const struct recipe *recipe;
    struct grid *grid;
    int micro_batches;           /* per data-parallel rank and step */
    struct sched_item *schedule, *eval_schedule;
    int schedule_len, eval_len;
    int *slot_of;                /* [micro batch][chunk] -> activation slot */
    int chunk_slots;             /* a slot per micro batch and chunk (the V schedules), else one per micro batch */
    struct slot_pool {           /* the slots of a chunk (chunk_slots), or all of them: [base, base + count) */
        int base, count, next, nfree, *free;
    } pool[2];
    int *layer_first, *layer_last; /* global layer -> table indices of its dense tensors (-1: not local) */
    int bucket_first, bucket_last; /* the gradient bucket being filled by backward (table indices; -1: empty) */
    size_t bucket_bytes, bucket_limit; /* its gradient bytes; it starts reducing at the limit (0: every layer) */
    double *moe_load;            /* [MoE layers][E] host: tokens per expert of the last step, all ranks */
    enum sched_kind kind;        /* the pipeline schedule */
    float *send;                 /* pipeline sends [nsend][Ns*C]: one per item of a unit, free again after the
                                  * exchange that sends them (model/trainer.c run_schedule); buffered
                                  * schedules (zbv): one per send in flight, each free once its ticket is done */
    int nsend, *send_ticket;     /* send buffers; buffered: each one's pending send (0: free) */
    double item_time[3][2];      /* zbv: this step's F, B, W host seconds and counts, until its order is made for
                                  * them (after the first training step; item_time[0][1] < 0 then) */
    float *recv_grad;            /* [Ns*C] */
    int32_t *inputs, *targets;   /* host staging for one micro batch */
    int32_t *seq_targets;        /* context parallelism: the whole sequences' targets (the MTP modules' shifts) */
    const struct param_info *embed_shared; /* the embedding (or its copy) when the first and last stage both
                                           * hold it (grid embed_comm): NULL elsewhere */
    int *gather_ticket;          /* overlapped ZeRO-1 gather: global layer -> its pending gather's ticket (0: none) */
};

struct step_stats {
    double loss;        /* mean token loss of the global batch */
    double grad_norm;   /* before clipping */
    double lr;
    long tokens;        /* tokens of the global batch */
    /* mixture of experts (zero for dense models), over the global batch */
    double aux_loss;    /* load-balancing loss, mean over micro batches and MoE layers */
    double z_loss;      /* router z-loss, likewise */
    double dropped;     /* routed selections dropped by the capacity, summed */
    double load_max;    /* max over MoE layers of (busiest expert's tokens / mean tokens per expert) */
    const double *load; /* [MoE layers][E] tokens per expert (trainer-owned; MTP blocks' MoE layers last) */
    double mtp_loss;    /* multi-token prediction: mean over depths of the mean token loss (before mtp_loss_weight) */
};

/* g describes the layout (grid_single for one process). */
void trainer_create(struct trainer *tr, const struct backend *be, const struct recipe *r, struct grid *g);
void trainer_free(struct trainer *tr);
/* Complete the parameter gathers still in flight (parallel.overlap_param_gather):
 * before anything reads or writes the parameters outside a forward pass
 * (checkpoint snapshots and restores). */
void trainer_settle(struct trainer *tr);
/* samples: this data-parallel rank's share of the global batch (global_batch
 * / dp sequences of seq_len+1 tokens). Computes the loss, reduced gradients
 * and their global norm; parameters are untouched, so a caller can still
 * reject the step. The result is the same on every rank. */
struct step_stats trainer_compute(struct trainer *tr, const int32_t *samples, int n);
/* Apply AdamW with the schedule's LR times lr_scale (stats->lr is set). */
void trainer_update(struct trainer *tr, struct step_stats *stats, double lr_scale);
/* trainer_compute + trainer_update. */
struct step_stats trainer_step(struct trainer *tr, const int32_t *samples, int n);
/* Mean token loss over this rank's n samples (all DP ranks together), no gradients. */
double trainer_eval(struct trainer *tr, const int32_t *samples, int n);
