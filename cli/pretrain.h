/* Internal to `mtrain pretrain`: options parsed in pretrain.c, the training
 * loop (checkpoints, resume, rewind, signals) in pretrain_loop.c. */
#pragma once
#include <stdio.h>

#include "checkpoint/async_save.h"
#include "checkpoint/checkpoint.h"
#include "cli/tensorboard.h"
#include "config/recipe.h"
#include "data/blend.h"
#include "data/prefetch.h"
#include "model/trainer.h"
#include "parallel/grid.h"

struct pretrain_opts {
    const char *recipe;
    int dry_run;
    int verbose;            /* --dry-run --verbose: every rank's full pipeline schedule */
    int force;              /* start in a log.dir holding another run's metrics (moved aside) */
    int stop_after;         /* save and exit 0 once this many steps are done (0: no) */
    int allow_data_change;  /* resume although the data-semantics keys differ from the checkpoint's */
    const char *resume;     /* "auto" (default), "never" or a step directory */
    /* fault injection for tests: a step number, or 0 for none */
    int inject_nan, inject_spike, inject_crash, inject_crash_in_save;
    int inject_crash_rank;  /* crash only this world rank (-1: every rank) */
};

#define HISTORY 64

/* The state of one training run on this rank. */
struct run {
    const struct recipe *r;
    const struct pretrain_opts *o;
    const struct backend *be;
    const char *comm_name;   /* "nccl", "mpi" or "none" (one rank): how the groups communicate (parallel.comm) */
    int gpu_comm_on_cpu;     /* MTRAIN_TEST_GPU_COMM_ON_CPU (tests/integration/nccl_mock.sh): CPU ranks
                              * communicate as GPU ranks do: NCCL, or MPI staged through host buffers */
    struct grid grid;
    int rank0;               /* world rank 0 prints and writes the metrics */
    struct prefetcher *train;    /* training batches, read ahead in a thread */
    struct blend *valid;
    struct trainer tr;
    struct train_state st;
    struct ckpt_snapshot snap;
    struct async_saver saver;
    int commit_pending;      /* a save was written (or is being written) but not committed */
    int saved_step;          /* step of the newest save started (-1 none) */
    int consecutive_rewinds; /* since the last checkpoint after a rewind */
    int injected_nan, injected_spike;
    FILE *metrics;
    struct tb_writer tb;     /* log.tensorboard: the same scalars as TensorBoard events */
    char metrics_path[RECIPE_PATH_MAX + 32];
    int32_t *batch;          /* global_batch x (seq_len+1) */
    double flops_per_token;
    double t_start;             /* when this process's training loop began (elapsed time and ETA) */
    int first_step;             /* the loop's first step (earlier ones were resumed) */
    double peak_tflops;         /* train.peak_tflops, else the device's from the backend's table; 0: unknown */
    struct { int step; double loss, grad_norm; } history[HISTORY];
    int nhistory;
};

int pretrain_run(const struct recipe *r, const struct pretrain_opts *o);

/* pretrain_loop.c: append one JSON object to the metrics stream (rank 0). */
void event(struct run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* pretrain_logdir.c: may this run write LOG_DIR/metrics.jsonl? Only if it holds
 * no training steps, or this run resumes the run that wrote them (from:
 * the step directory loaded, NULL for a fresh start), or --force (the old
 * files are moved aside). Otherwise every rank exits 2. Collective. */
void logdir_claim(struct run *run, const char *from);

/* pretrain_ckpt.c: checkpoints across the process grid */
void ckpt_setup(struct run *run);
/* Snapshot and write (or start writing) a checkpoint of the current step. */
void save_checkpoint(struct run *run);
/* Commit a background save once every rank's writer is done; block = wait for it. */
void finish_save(struct run *run, int block);
/* Load a step directory on every rank; all ranks agree on the outcome
 * (0, -1 damaged, -2 other model). err holds this rank's message, if any. */
int load_checkpoint(struct run *run, const char *step_dir, char *err, size_t errlen);
/* Every run ends with LOG_DIR/model.safetensors (whole tensors, Hugging Face
 * names), whatever the layout and whether checkpoints are on; every rank
 * calls it. path receives the file's name. */
void save_final_weights(struct run *run, char *path, size_t n);
/* Before training: warn (rank 0) when log.dir's free space or the file size
 * limit is below what the final weights will need. */
void check_final_space(const struct run *run);
/* --resume: returns what was loaded or NULL for a fresh start. */
const char *resume(struct run *run);

