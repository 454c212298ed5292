/* Background checkpoint writer: the training thread takes a host snapshot,
 * hands it over and goes on; the thread writes this rank's shard. The commit
 * (once every rank's writer is done) is the training loop's job, on the main
 * thread, since it needs the other ranks. A second save waits for the first.
 * The thread never prints or exits: a failed write is kept for the main
 * thread to report (one line), so it does not garble the output. */
#pragma once
#include <pthread.h>

#include "checkpoint/checkpoint.h"

struct async_saver {
    pthread_t thread;
    int busy;                 /* a write was started and not yet joined */
    volatile int finished;    /* set by the writer thread when done */
    struct ckpt_snapshot *snap;
    const char *dir;
    int crash_in_save;
    double started, write_seconds;
    int failed;               /* the last write failed: err says why */
    char err[8448];
};

void async_saver_start(struct async_saver *a, struct ckpt_snapshot *snap, const char *dir, int crash_in_save);
/* Block until the write in flight (if any) is done; returns seconds waited.
 * If it failed, die with its error (from this thread, one line). */
double async_saver_wait(struct async_saver *a);
/* Block until the write in flight (if any) is done; returns 0, or -1 if the
 * last write failed (a->err says why; nothing printed). *waited (if not
 * NULL): seconds waited. */
int async_saver_join(struct async_saver *a, double *waited);
/* Non-blocking: 1 if no write is in flight or it has finished (not yet joined). */
int async_saver_finished(struct async_saver *a);
