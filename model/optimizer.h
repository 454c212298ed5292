/* AdamW over the parameter table, gradient synchronisation across the
 * process grid, clipping by global norm, and the learning-rate schedules.
 *
 * Without optimizer.distributed every data-parallel rank all-reduces the full
 * gradient and updates the full local parameters. With it (ZeRO-1, the
 * distributed optimizer) each DP rank reduce-scatters the gradient, keeps
 * fp32 moments and (with a bf16 working copy) fp32 master weights for only
 * its 1/dp slice of the flat parameter layout (model/master.h), updates that
 * slice, and all-gathers what the ops read: the working copy, or at fp32 the
 * master itself. Both work in place: each part of the gradient is summed
 * onto its owner, where AdamW reads it, and each owner's slice is gathered
 * into the others' weights, with no scratch. */
#pragma once
#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/master.h"
#include "model/params.h"
#include "parallel/comm.h"

/* Tensors whose gradients reduce over one group: the dense ones over data
 * parallelism, the routed experts (stored last in the table) over the
 * expert-data-parallel group. Each is a contiguous range of the buffer and
 * ZeRO-1 shards each over its own group. */
struct opt_group {
    int first, count;          /* table items [first, first + count) */
    size_t base, total;        /* their range of the flat buffer, in floats */
    struct comm *dp;           /* the group their gradients are summed over (may be size 1) */
    int distributed;           /* ZeRO-1 in effect (distributed and dp > 1) */
    size_t shard_begin, shard_len; /* the flat range this rank updates */
    float *m, *v;              /* moments of [shard_begin, shard_begin+shard_len) */
};

struct optimizer {
    const struct backend *be;
    const struct param_table *table;
    struct master *master;     /* the fp32 master weights AdamW updates (whole, or sharded like the moments) */
    struct optimizer_config cfg;
    struct comm *tp;           /* tensor-parallel group (may be size 1) */
    int sequence_parallel;     /* replicated tensors' grads are partial over TP */
    struct opt_group group[2]; /* dense tensors, routed experts */
    int ngroups;
    unsigned char *started;    /* per tensor: its reduction was started by a bucket */
    float *shared_scratch;     /* gradients of blocks shared by several TP ranks (kv heads) */
    int step;                  /* completed updates */
    int defer_gather;          /* ZeRO-1: optimizer_step leaves the dense group's gather to the caller
                                * (optimizer_gather_start, range by range) */
};

/* dp reduces the dense tensors' gradients, edp the routed experts' (NULL
 * when the model has none). */
void optimizer_create(struct optimizer *o, const struct backend *be, struct master *ms,
                      const struct optimizer_config *cfg, struct comm *dp, struct comm *tp, int sequence_parallel,
                      struct comm *edp);
void optimizer_free(struct optimizer *o);
/* Sum gradients over the grid as the layout needs (TP for sequence-parallel
 * replicated tensors; DP all-reduce, or reduce-scatter under ZeRO-1). */
void optimizer_reduce_grads(struct optimizer *o, float *grads);
/* Start reducing the gradients of tensors first..last (table indices,
 * contiguous in the buffer) while backward goes on with other layers; the
 * next optimizer_reduce_grads completes them. Without ZeRO-1 an all-reduce;
 * under it each part is summed onto the rank whose shard holds it (the
 * reduce-scatter, bucket by bucket; the shards keep their layout). */
void optimizer_reduce_bucket_start(struct optimizer *o, float *grads, int first, int last);
/* Global L2 norm of the reduced gradients, each parameter counted once
 * across TP, PP and DP; world is the group of all ranks. */
double optimizer_grad_norm(struct optimizer *o, const float *grads, struct comm *world);
/* One AdamW update at learning rate lr of the master's parameters;
 * gradients are clipped to cfg.grad_clip by the global norm (torch
 * clip_grad_norm_ semantics). Weight decay skips norms. work: NULL, or the
 * bf16 working copy (2-byte values at the table's offsets) that AdamW
 * writes as it updates (a sharded master's working copy is written either
 * way); returns 1 when the working copy now matches every parameter AdamW
 * updated and no group was gathered. Under ZeRO-1 every rank updates its
 * shard, then the gains of the norms reach every rank and the group is
 * gathered (the dense group left to the caller with defer_gather). */
int optimizer_step(struct optimizer *o, const float *grads, double lr, double grad_norm, uint16_t *work);
/* ZeRO-1 with defer_gather: start gathering the dense group's updated
 * parameters in [begin, end) (offsets into the flat layout) from their
 * owners into what the ops read (the master's work: the working copy, or
 * the fp32 master at fp32), in place; returns the comm ticket (0 when the
 * group is not sharded: nothing to gather). Every rank calls it for the
 * same ranges in the same order; comm_wait_ticket(group[0].dp, ticket)
 * completes it. */
int optimizer_gather_start(struct optimizer *o, size_t begin, size_t end);
/* The same for any group k. */
int optimizer_group_gather_start(struct optimizer *o, int k, size_t begin, size_t end);
/* Full local moments (gathered over DP under ZeRO) into host buffers of
 * table->total floats each, for checkpoints; and the reverse. */
void optimizer_get_moments(struct optimizer *o, float *m_out, float *v_out);
void optimizer_set_moments(struct optimizer *o, const float *m_in, const float *v_in);

/* Learning rate after `step` completed updates (the rate for update step+1). */
double lr_at(const struct optimizer_config *cfg, int total_steps, int step);
