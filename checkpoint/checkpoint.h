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

/* A host copy of one rank's state, taken at a step boundary, that a writer
 * (this thread or the async one) turns into files. */
struct ckpt_snapshot {
    const struct recipe *recipe;
    const struct param_table *table;
    float *host;                /* params | exp_avg | exp_avg_sq, table->total floats each */
    struct train_state state;
};

void ckpt_snapshot_init(struct ckpt_snapshot *s, const struct recipe *r, const struct param_table *t);
void ckpt_snapshot_free(struct ckpt_snapshot *s);
void ckpt_snapshot_take(struct ckpt_snapshot *s, const struct backend *be, const float *params, const float *m,
                        const float *v, const struct train_state *st);

/* Write, commit, update `latest`, apply keep_last. If crash_in_save, the
 * process aborts after the rank file is written and before the commit (a
 * fault-injection hook for tests). Dies (exit 1) on I/O errors. */
void checkpoint_write(const struct ckpt_snapshot *s, const char *dir, int crash_in_save);

/* Load a committed step directory into device buffers. Returns 0; -1 if it
 * is unreadable or damaged (checksum); -2 if it belongs to another model
 * shape. err names the file and tensor. */
int checkpoint_load(const char *step_dir, const struct param_table *t, const struct backend *be, float *params,
                    float *m, float *v, struct train_state *st, char *err, size_t errlen);

/* Committed step numbers under dir, newest first; returns the count (<= max). */
int checkpoint_list(const char *dir, int *steps, int max);
/* "DIR/step-NNNNNNNNN" */
void checkpoint_step_dir(char *out, size_t n, const char *dir, int step);
/* The step named by DIR/latest, or -1. */
int checkpoint_latest(const char *dir);
/* Remove leftovers of interrupted saves (step-*.tmp-*) under dir. */
void checkpoint_clean_partial(const char *dir);
