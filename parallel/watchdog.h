/* Hang detection: a monitor thread per process ends the job when this rank
 * has been stuck in one activity for too long. Without it, a rank that stops
 * (SIGSTOP, a hung driver, a lost node the launcher cannot see) leaves every
 * other rank spinning in MPI forever with no message.
 *
 * The main thread marks what it is doing at two levels: a phase (setup, a
 * step, an eval, a checkpoint save ...) and, nested inside it, the collective
 * or point-to-point call it is in (comm_mpi.c marks every call). Marking is a
 * few atomic stores and a clock read. The monitor wakes about once a second,
 * never calls MPI, and when the innermost activity (the call if one is in
 * progress, else the phase) has lasted longer than the timeout it prints one
 * line to stderr and _exit(1)s; the launcher then ends the other ranks.
 *
 * Timeout: train.hang_timeout_s, or 0 for automatic: 300 s until five steps
 * have run, then 10 x the slowest of them (the first includes warm-up), at
 * least 300 s. Checkpoint saves and loads (and setup, which may load
 * weights) are disk-bound and do not scale with the step time, so in
 * automatic mode they get at least 30 minutes; a positive setting applies to
 * everything as is. Marks are harmless without a running watchdog. */
#pragma once
#include <stddef.h>

struct grid;

enum watchdog_phase {
    WATCHDOG_SETUP,  /* building the model, loading init weights */
    WATCHDOG_LOAD,   /* loading a checkpoint (resume, rewind) */
    WATCHDOG_STEP,   /* one training step */
    WATCHDOG_EVAL,   /* one validation batch after a step */
    WATCHDOG_SAVE,   /* writing or committing a checkpoint */
    WATCHDOG_END,    /* the final weights, statistics and teardown */
};

/* Start the monitor of this rank (grid: coordinates for the message);
 * timeout_s 0 = automatic; abort_s: train.abort_timeout_s. The phase starts
 * as WATCHDOG_SETUP. */
void watchdog_start(const struct grid *g, double timeout_s, double abort_s);
/* Stop and join the monitor (teardown). A no-op if it is not running. */
void watchdog_stop(void);

/* The main thread enters a phase (step: the training step it belongs to). */
void watchdog_phase(enum watchdog_phase phase, int step);
/* The current step finished: its time feeds the automatic timeout. Returns
 * the automatic timeout in seconds when this step settled it, else 0. */
double watchdog_step_done(void);

/* A communication call on group `group` (this rank is rank of size) begins
 * and ends. Not nested: one call at a time. */
void watchdog_enter(const char *op, const char *group, int rank, int size);
void watchdog_leave(void);

/* Failures the monitor looks for besides hangs, and how a failing rank lets
 * go: poll (about once a second, on the monitor thread) returns nonzero
 * with why filled when the job cannot go on (NCCL's asynchronous errors);
 * release aborts what peers could be blocked on (NCCL communicators). On
 * either failure the monitor prints one line naming this rank, what it was
 * doing and why, calls release, and _exits. Either may be NULL. */
void watchdog_set_failure_hooks(int (*poll)(char *why, size_t n), void (*release)(void));
/* The main thread is ending the job (parallel/grid.c's abort on an error):
 * releases what release holds, and if the abort itself has not ended the
 * process within abort_s the monitor _exits it. */
void watchdog_aborting(void);
/* This rank's coordinates for a failure message: "rank R of N (tp T, pp P, dp D)". */
void watchdog_describe_rank(char *buf, size_t n);
/* What the main thread is in (main thread only): "step 12, in all_reduce_sum on group dp (rank 1 of 2)". */
void watchdog_describe_activity(char *buf, size_t n);
