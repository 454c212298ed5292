#include "data/prefetch.h"

#include <pthread.h>
#include <string.h>

#include "config/common.h"
#include "data/blend.h"

struct prefetcher {
    struct blend *blend;
    int dp, dp_rank, n, T, global_batch;
    int32_t *buf[2];         /* [n][T+1] each: the one handed out, the one being filled */
    int64_t first[2];        /* batch position held by buf[i] (-1 none) */
    int ready[2];
    int filling;             /* index the thread fills, or -1 */
    int64_t want;            /* position the thread should read next (-1 none) */
    int stop;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void read_batch(struct prefetcher *p, int32_t *out, int64_t first) {
    blend_get_strided(p->blend, first, p->n, p->dp, p->dp_rank, out);
}

static void *worker(void *arg) {
    struct prefetcher *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->want < 0) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        int slot = p->filling;
        int64_t first = p->want;
        p->want = -1;
        pthread_mutex_unlock(&p->mu);
        read_batch(p, p->buf[slot], first); /* the slow part, outside the lock */
        pthread_mutex_lock(&p->mu);
        p->first[slot] = first;
        p->ready[slot] = 1;
        p->filling = -1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct prefetcher *prefetcher_create(const struct recipe *r, enum split split, int dp, int dp_rank) {
    struct prefetcher *p = xcalloc(1, sizeof *p);
    p->blend = blend_from_recipe(r, split);
    p->dp = dp, p->dp_rank = dp_rank, p->global_batch = r->train.global_batch;
    p->n = r->train.global_batch / dp, p->T = r->train.seq_len;
    for (int i = 0; i < 2; i++) {
        p->buf[i] = xmalloc(sizeof(int32_t) * p->n * (p->T + 1));
        p->first[i] = -1;
    }
    p->filling = -1;
    p->want = -1;
    if (pthread_mutex_init(&p->mu, NULL) || pthread_cond_init(&p->cv, NULL)) die("cannot create the prefetch lock");
    int rc = pthread_create(&p->thread, NULL, worker, p);
    if (rc) die("cannot start the data prefetch thread: %s", strerror(rc));
    return p;
}

void prefetcher_free(struct prefetcher *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    int rc = pthread_join(p->thread, NULL);
    if (rc != 0) die("prefetcher: pthread_join failed: %s", strerror(rc));
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->buf[0]);
    free(p->buf[1]);
    blend_free(p->blend);
    free(p);
}

const int32_t *prefetcher_next(struct prefetcher *p, int64_t first) {
    pthread_mutex_lock(&p->mu);
    while (p->filling >= 0) pthread_cond_wait(&p->cv, &p->mu); /* the guess in flight finishes first */
    int have = p->ready[0] && p->first[0] == first ? 0 : p->ready[1] && p->first[1] == first ? 1 : -1;
    pthread_mutex_unlock(&p->mu);
    if (have < 0) { /* not guessed (first step, or a rewind moved the position): read it here */
        have = 0;
        read_batch(p, p->buf[have], first);
        p->first[have] = first;
        p->ready[have] = 1;
    }
    /* guess the next batch into the other buffer while the caller computes */
    pthread_mutex_lock(&p->mu);
    int other = 1 - have;
    p->ready[other] = 0;
    p->filling = other;
    p->want = first + p->global_batch;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return p->buf[have];
}

struct dataset *prefetcher_dataset(const struct prefetcher *p) { return blend_dataset(p->blend, 0); }
