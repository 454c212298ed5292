/* The fp32 master weights of one rank: where they live, and how they move
 * to and from the host (init, checkpoints, imported weights).
 *
 * Usually one buffer, `full`, laid out by the parameter table (at fp32 it is
 * also what the ops read; at bf16 the working copy is converted from it).
 * Under ZeRO-1 with a working copy (bf16, fp8) the master is sharded like
 * the moments, as Megatron's distributed optimizer does: each optimizer
 * group's matrices keep fp32 values only for this rank's shard of the flat
 * layout, the norm gains and state tensors (read by the ops in fp32, a few
 * floats per layer) stay whole on every rank in `gains`, and the working
 * copy is the only whole copy of the weights. AdamW updates the shard and
 * writes its working copy; the all-gather assembles the working copy in
 * place. Per rank: 4 bytes per parameter unsharded, 4/dp sharded (4/edp for
 * routed experts) plus the gains. */
#pragma once
#include "kernels/ops.h"
#include "model/params.h"
#include "parallel/comm.h"

#define MASTER_GROUPS 2

struct master_shard {
    size_t base, total;    /* the optimizer group's range of the flat layout, in floats */
    size_t begin, len;     /* this rank's shard: [begin, begin+len) (the last rank's runs past the end) */
    struct comm *dp;       /* the ranks the group is sharded over (NULL: not sharded, the shard is the group) */
    float *buf;            /* [len] the matrices' fp32 values of the shard (norm and state slots unused) */
    int *gain_counts, *gain_displs; /* per rank of dp: its shard's gains, as a piece of `gains` */
};

struct master {
    const struct backend *be;
    const struct param_table *t;
    float *full;           /* every tensor at its table offset; NULL when sharded */
    void *work;            /* what the ops read: the working copy (act_bytes per value), or full at fp32 */
    float *gains;          /* sharded: every norm and state tensor, packed in table order */
    size_t *gain_at;       /* sharded: per table item, its offset in gains (matrices: unused) */
    size_t ngains;
    int nshards;
    struct master_shard shard[MASTER_GROUPS];
};

/* full: the master buffer (NULL: sharded; master_add_shard then names the
 * shards before anything is put); work: the working copy (== full at fp32). */
void master_create(struct master *ms, const struct backend *be, const struct param_table *t, float *full,
                   void *work);
void master_free(struct master *ms);
/* Kept whole on every rank even when sharded: norm gains and state. */
int master_packed(const struct param_info *p);
/* The shard of the optimizer group covering [base, base+total): this rank
 * keeps [begin, begin+len), sharded over dp (NULL or size 1: the whole group). */
void master_add_shard(struct master *ms, size_t base, size_t total, size_t begin, size_t len, struct comm *dp);
/* The fp32 master of flat offsets [off, ...) of tensor item i, for one
 * AdamW run: in full, in gains, or in shard k's buffer (off inside it). */
float *master_at(struct master *ms, int k, int i, size_t off);
/* Put tensor item i (host, numel floats) everywhere this rank keeps it: the
 * master or its shard and gains, and when sharded the working copy too
 * (otherwise transformer_sync_weights converts it). Matches
 * weights_load_each's callback (ctx is the master). */
void master_put(void *ms, int i, const float *host);
/* Every tensor from host (t->total floats at table offsets). */
void master_put_all(struct master *ms, const float *host);
/* The whole local master into host (t->total floats at table offsets): a
 * shard's values reach every rank of its group from their owners, through
 * a staging buffer of one shard (every rank of the group calls it; host
 * NULL: a rank that keeps nothing, a checkpoint's non-writing ranks). */
void master_to_host(struct master *ms, float *host);
/* A range of total floats sharded over dp in pieces of len (rank r holds
 * [r len, (r+1) len) in buf; dp NULL or of size 1: buf is the whole range)
 * into out on every rank, each owner's piece broadcast through a staging
 * buffer of len floats (none where the backend's memory is the host's).
 * out NULL: this rank only sends its piece and keeps nothing. */
void shard_to_host(const struct backend *be, struct comm *dp, const float *buf, size_t len, size_t total,
                   float *out);
/* After the owners updated the gains inside their shard of group k: every
 * rank receives them (one small all-gather). */
void master_gather_gains(struct master *ms, int k);
