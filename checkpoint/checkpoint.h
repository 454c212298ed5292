/* Sharded checkpoints (format in docs/checkpoints.md):
 *   DIR/step-NNNNNNNNN/rank-RRRRR.safetensors   parameters + AdamW moments of one rank
 *   DIR/step-NNNNNNNNN/manifest.json            written last: tensors, checksums, state
 *   DIR/latest                                  name of the newest committed step
 * A step directory is written under a temporary name and renamed into place
 * after everything in it is fsynced, so a crash never leaves a directory that
 * looks committed. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/fp8_history.h"
#include "model/optimizer.h"
#include "model/params.h"

#define CHECKPOINT_FORMAT_VERSION 1

/* Everything besides tensors that a resumed run needs to continue bitwise. */
struct train_state {
    int step;                   /* completed optimizer steps */
    int64_t consumed_samples;   /* data-loader position: next global train sample */
    int opt_step;               /* AdamW step count (bias correction) */
    int rewinds;                /* rewinds so far in this run */
    double lr_scale;            /* LR multiplier after a rewind (1 = none) */
    int lr_scale_until;         /* ... active while step < this */
    double ema_loss, ema_grad_norm; /* rewind monitor's running averages */
    int ema_seen;               /* steps the averages have seen */
};

/* Where a rank sits, as far as checkpoints care. */
struct ckpt_layout {
    int world_rank, tp, tp_rank, pp, pp_rank, dp, vpp;
    int writer;                 /* this rank writes its shard (DP rank 0, or expert-DP rank 0 for its experts) */
    int expert_only;            /* ... only its routed experts (DP rank > 0: its dense tensors are DP rank 0's) */
    int no_experts;             /* ... not its routed experts (expert-DP rank > 0: another rank of its edp group
                                 * writes them, parallel/grid.h) */
};

/* A host copy of one rank's state, taken at a step boundary, that a writer
 * (this thread or the async one) turns into files. */
struct ckpt_snapshot {
    const struct recipe *recipe;
    const struct param_table *table;
    struct ckpt_layout layout;
    float *host;                /* params | exp_avg | exp_avg_sq, table->total floats each; NULL where the
                                 * rank writes nothing (layout.writer 0) */
    struct train_state state;
    struct json_t *fp8;         /* delayed FP8 scaling's amax history for the manifest (owned), or NULL */
};

void ckpt_snapshot_init(struct ckpt_snapshot *s, const struct recipe *r, const struct param_table *t,
                        const struct ckpt_layout *layout);
void ckpt_snapshot_free(struct ckpt_snapshot *s);
/* Copy the fp32 master weights and optimizer moments to host, whole: every
 * rank of a data-parallel group must call it together (under ZeRO-1 both
 * come from their owners' shards, model/master.h); a rank that writes
 * nothing only sends its shards. */
void ckpt_snapshot_take(struct ckpt_snapshot *s, struct master *ms, struct optimizer *opt,
                        const struct train_state *st);

/* Keep h's amax history (NULL: none) in the snapshot, for the manifest's
 * "fp8_amax_history" (checkpoint/amax_history.c): the same on every rank,
 * so rank 0's commit writes it once, for any layout. */
void ckpt_snapshot_set_fp8(struct ckpt_snapshot *s, const struct fp8_history *h);
/* Replace h's history by the one a committed step saved (sites by name;
 * entries beyond h's length dropped, missing ones and sites zero; a
 * checkpoint without one leaves h empty). Returns 0, or -1 with err naming
 * the manifest and site. */
int checkpoint_load_fp8_history(const char *step_dir, struct fp8_history *h, char *err, size_t errlen);

/* Saving is three phases so the middle one can run in a background thread:
 * prepare (rank 0, then a barrier), write each writer's shard, and commit
 * (rank 0, once every writer has finished). */
void checkpoint_prepare(const char *dir, int step);
/* Write this rank's shard file and its part of the manifest. If crash, abort
 * after the shard file and before the part (fault injection). Dies on an
 * I/O error. */
void checkpoint_write_rank(const struct ckpt_snapshot *s, const char *dir, int crash);
/* The same, but an I/O error returns -1 with "checkpoint step N: cannot
 * write PATH: REASON" in err and prints nothing (the async writer thread
 * uses it: the main thread reports, once). */
int checkpoint_write_rank_checked(const struct ckpt_snapshot *s, const char *dir, int crash, char *err,
                                  size_t errlen);
/* Merge the parts into manifest.json, commit by rename, update `latest`,
 * apply keep_last. */
void checkpoint_commit(const struct ckpt_snapshot *s, const char *dir);
/* All three on one rank. */
void checkpoint_write(const struct ckpt_snapshot *s, const char *dir, int crash_in_save);

/* Load a committed step directory, saved with any layout, into host buffers
 * of t->total floats each (params, moments) for the part of the model t
 * describes. Returns 0; -1 if it is unreadable or damaged (a tensor's
 * checksum, or the manifest's own checksum `manifest_xxh3`); -2 if it belongs
 * to another model shape. err names the file (and tensor). A manifest without
 * a checksum (older mtrain) loads with a warning. */
int checkpoint_load(const char *step_dir, const struct param_table *t, float *params, float *m, float *v,
                    struct train_state *st, char *err, size_t errlen);
/* Read just the manifest's state and recipe text (caller frees *recipe_text). */
int checkpoint_read_manifest(const char *step_dir, struct train_state *st, char **recipe_text, char *err,
                             size_t errlen);

/* Reading a checkpoint tensor by tensor, whatever layout wrote it. */
struct ckpt_reader;
struct ckpt_reader *ckpt_reader_open(const char *step_dir, char *err, size_t errlen, int *rc);
/* A top-level field of the manifest (borrowed), or NULL. */
struct json_t *ckpt_reader_field(const struct ckpt_reader *rd, const char *key);
/* The resolved recipe text the checkpoint was saved with. */
const char *ckpt_reader_recipe(const struct ckpt_reader *rd);
/* That recipe, read back through the recipe loader into r. Returns 0, or -1
 * with a message in err. */
int ckpt_reader_load_recipe(const struct ckpt_reader *rd, struct recipe *r, char *err, size_t errlen);
/* Fill out with tensor p's shard for tensor-parallel rank tp_rank (p's
 * local shape); section 0 = parameter, 1 = exp_avg, 2 = exp_avg_sq. */
int ckpt_reader_read(struct ckpt_reader *rd, const struct param_info *p, int tp_rank, int section, float *out,
                     char *err, size_t errlen);
/* Every parameter of model m (whole, one rank) has a manifest entry of its
 * shape: 0, or -1 with the tensor named in err. For callers that allocate
 * a model the size the manifest's recipe names. */
int ckpt_reader_check(const struct ckpt_reader *rd, const struct model_config *m, char *err, size_t errlen);
void ckpt_reader_close(struct ckpt_reader *rd);

/* Rewrite a committed step directory for another layout, streaming tensor by
 * tensor (memory near the largest tensor). Returns 0, -1 (damaged source),
 * -2 (layout does not fit the model; err says why). */
int checkpoint_convert(const char *src_step_dir, const char *dst_dir, int tp, int pp, int vpp, int dp, int ep, int etp,
                       int cp, char *err, size_t errlen);

/* Committed step numbers under dir, newest first; returns the count (<= max). */
int checkpoint_list(const char *dir, int *steps, int max);
/* Remove DIR holding one committed step (and `latest`): a scratch checkpoint. */
void checkpoint_remove_step(const char *dir, int step);
/* "DIR/step-NNNNNNNNN" */
void checkpoint_step_dir(char *out, size_t n, const char *dir, int step);
/* The step named by DIR/latest, or -1. */
int checkpoint_latest(const char *dir);
/* Remove leftovers of interrupted saves under dir, with a warning each:
 * step-*.tmp-* directories, step directories without a manifest (an
 * interrupted removal), latest.tmp.PID (an interrupted `latest` update) and
 * .mtrain-probe-*.tmp.PID (a start-up probe) unless process PID is alive on
 * this machine and may have written it. */
void checkpoint_clean_partial(const char *dir);
/* Warnings from loads (a manifest without a checksum) on (default) or off:
 * off on every rank but one, so a multi-rank run says it once. */
void checkpoint_set_warnings(int on);
