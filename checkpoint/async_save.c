#include "checkpoint/async_save.h"

#include <string.h>

#include "config/common.h"

static void *writer_main(void *arg) {
    struct async_saver *a = arg;
    double t0 = now_seconds();
    /* no die() here: the main thread may be printing or failing itself */
    a->failed = checkpoint_write_rank_checked(a->snap, a->dir, a->crash_in_save, a->err, sizeof a->err) != 0;
    a->write_seconds = now_seconds() - t0;
    __atomic_store_n(&a->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

void async_saver_start(struct async_saver *a, struct ckpt_snapshot *snap, const char *dir, int crash_in_save) {
    CHECK(!a->busy);
    a->snap = snap;
    a->dir = dir;
    a->crash_in_save = crash_in_save;
    a->finished = 0;
    a->failed = 0;
    a->err[0] = 0;
    a->started = now_seconds();
    int rc = pthread_create(&a->thread, NULL, writer_main, a);
    if (rc != 0) die("cannot start the checkpoint writer thread: %s", strerror(rc));
    a->busy = 1;
}

int async_saver_join(struct async_saver *a, double *waited) {
    double t0 = now_seconds();
    if (a->busy) {
        int rc = pthread_join(a->thread, NULL);
        if (rc != 0) die("cannot join the checkpoint writer thread: %s", strerror(rc));
        a->busy = 0;
    }
    if (waited) *waited = now_seconds() - t0;
    return a->failed ? -1 : 0;
}

double async_saver_wait(struct async_saver *a) {
    double waited;
    if (async_saver_join(a, &waited) != 0) {
        a->failed = 0; /* reported */
        die("%s", a->err);
    }
    return waited;
}

int async_saver_finished(struct async_saver *a) {
    return !a->busy || __atomic_load_n(&a->finished, __ATOMIC_ACQUIRE);
}
