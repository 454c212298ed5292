/* The hang watchdog (see watchdog.h). The main thread is the only writer of
 * the marks and publishes them through a seqlock of C11 atomics: marking
 * never blocks or takes a lock, and the monitor retries a torn read. */
#define _GNU_SOURCE
#include "parallel/watchdog.h"

#include <limits.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/common.h"
#include "parallel/grid.h"

#define AUTO_STEPS 5      /* the automatic timeout is set by this many steps */
#define AUTO_FACTOR 10.0  /* ... as this multiple of the slowest of them */
#define AUTO_MIN_S 300.0  /* ... and never less (also the value until then) */
#define IO_MIN_S 1800.0   /* automatic mode: saves, loads, setup are disk-bound */

/* What the main thread is doing. seq is odd while a mark is being written. */
static struct {
    atomic_uint seq;
    atomic_int phase, step;
    atomic_llong phase_ns;        /* when the phase began */
    _Atomic(const char *) op;     /* the communication call, NULL if none */
    _Atomic(const char *) group;
    atomic_int rank, size;
    atomic_llong op_ns;           /* when the call began */
} mark;

static atomic_llong timeout_ns;  /* for steps and evals; saves may get more */
static int automatic;            /* the rest: main thread only, or set before the monitor starts */
static int timed_steps;
static double slowest;
static int world_rank, world_size, tp_rank, pp_rank, dp_rank;
static int (*failure_poll)(char *why, size_t n);
static void (*failure_release)(void);
static atomic_llong aborting_ns;  /* when the main thread began ending the job (0: not) */
static long long abort_ns;        /* train.abort_timeout_s */
static pthread_t thread;
static int running;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake;      /* signalled by watchdog_stop */
static int stopping;             /* under lock */

static long long now_ns(void) {
    struct timespec ts;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &ts) == 0);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long seconds_ns(double s) { return s >= 1e9 ? LLONG_MAX : (long long)(s * 1e9); }

/* Seqlock writer: seq odd, the stores, seq even again. */
static void write_begin(void) {
    atomic_store_explicit(&mark.seq, atomic_load_explicit(&mark.seq, memory_order_relaxed) + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}
static void write_end(void) {
    atomic_store_explicit(&mark.seq, atomic_load_explicit(&mark.seq, memory_order_relaxed) + 1, memory_order_release);
}

void watchdog_phase(enum watchdog_phase phase, int step) {
    long long t = now_ns();
    write_begin();
    atomic_store_explicit(&mark.phase, (int)phase, memory_order_relaxed);
    atomic_store_explicit(&mark.step, step, memory_order_relaxed);
    atomic_store_explicit(&mark.phase_ns, t, memory_order_relaxed);
    write_end();
}

void watchdog_enter(const char *op, const char *group, int rank, int size) {
    long long t = now_ns();
    write_begin();
    atomic_store_explicit(&mark.op, op, memory_order_relaxed);
    atomic_store_explicit(&mark.group, group, memory_order_relaxed);
    atomic_store_explicit(&mark.rank, rank, memory_order_relaxed);
    atomic_store_explicit(&mark.size, size, memory_order_relaxed);
    atomic_store_explicit(&mark.op_ns, t, memory_order_relaxed);
    write_end();
}

void watchdog_leave(void) {
    write_begin();
    atomic_store_explicit(&mark.op, NULL, memory_order_relaxed);
    write_end();
}

double watchdog_step_done(void) {
    if (!automatic || timed_steps >= AUTO_STEPS) return 0;
    double took = (now_ns() - atomic_load_explicit(&mark.phase_ns, memory_order_relaxed)) / 1e9;
    if (took > slowest) slowest = took;
    if (++timed_steps < AUTO_STEPS) return 0;
    double t = AUTO_FACTOR * slowest < AUTO_MIN_S ? AUTO_MIN_S : AUTO_FACTOR * slowest;
    atomic_store(&timeout_ns, seconds_ns(t));
    return t;
}

struct marks {
    int phase, step, rank, size;
    long long phase_ns, op_ns;
    const char *op, *group;
};

/* Seqlock reader: a consistent copy, or 0 if the writer kept changing it. */
static int read_marks(struct marks *m) {
    for (int tries = 0; tries < 1000; tries++) {
        unsigned s1 = atomic_load_explicit(&mark.seq, memory_order_acquire);
        m->phase = atomic_load_explicit(&mark.phase, memory_order_relaxed);
        m->step = atomic_load_explicit(&mark.step, memory_order_relaxed);
        m->phase_ns = atomic_load_explicit(&mark.phase_ns, memory_order_relaxed);
        m->op = atomic_load_explicit(&mark.op, memory_order_relaxed);
        m->group = atomic_load_explicit(&mark.group, memory_order_relaxed);
        m->rank = atomic_load_explicit(&mark.rank, memory_order_relaxed);
        m->size = atomic_load_explicit(&mark.size, memory_order_relaxed);
        m->op_ns = atomic_load_explicit(&mark.op_ns, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (!(s1 & 1) && s1 == atomic_load_explicit(&mark.seq, memory_order_relaxed)) return 1;
    }
    return 0;
}

static void describe(char *buf, size_t len, int phase, int step) {
    switch (phase) {
    case WATCHDOG_SETUP: snprintf(buf, len, "setup"); break;
    case WATCHDOG_LOAD: snprintf(buf, len, step > 0 ? "checkpoint load at step %d" : "checkpoint load", step); break;
    case WATCHDOG_STEP: snprintf(buf, len, "step %d", step); break;
    case WATCHDOG_EVAL: snprintf(buf, len, "eval at step %d", step); break;
    case WATCHDOG_SAVE: snprintf(buf, len, "checkpoint save at step %d", step); break;
    default: snprintf(buf, len, "the end of the run (step %d)", step); break;
    }
}

void watchdog_set_failure_hooks(int (*poll)(char *why, size_t n), void (*release)(void)) {
    CHECK(pthread_mutex_lock(&lock) == 0); /* the monitor calls them under the lock */
    failure_poll = poll, failure_release = release;
    CHECK(pthread_mutex_unlock(&lock) == 0);
}

void watchdog_describe_rank(char *buf, size_t n) {
    snprintf(buf, n, "rank %d of %d (tp %d, pp %d, dp %d)", world_rank, world_size, tp_rank, pp_rank, dp_rank);
}

void watchdog_aborting(void) {
    atomic_store(&aborting_ns, now_ns());
    CHECK(pthread_mutex_lock(&lock) == 0);
    if (failure_release) failure_release();
    CHECK(pthread_mutex_unlock(&lock) == 0);
}

/* write(2), not stdio: the stuck main thread may hold a stream's lock.
 * _exit, not exit: the other threads are inside MPI and the libraries. */
static void end_process(const char *msg) {
    ssize_t w = write(STDERR_FILENO, msg, strlen(msg));
    (void)w;
    if (failure_release) failure_release();
    _exit(EXIT_RUNTIME);
}

/* what the main thread was in, for a failure line: "step 12 in all_reduce on group dp (rank 1 of 2)" */
static void doing(char *buf, size_t n, const struct marks *m) {
    char what[96];
    describe(what, sizeof what, m->phase, m->step);
    if (m->op) snprintf(buf, n, "%s, in %s on group %s (rank %d of %d)", what, m->op, m->group, m->rank, m->size);
    else snprintf(buf, n, "%s", what);
}

void watchdog_describe_activity(char *buf, size_t n) {
    struct marks m;
    if (read_marks(&m)) doing(buf, n, &m);
    else snprintf(buf, n, "?");
}

/* One look: end the process if the job cannot go on (a failure the poll
 * found, an abort that does not end) or the innermost activity is over its
 * time. Called with the lock held. */
static void check(void) {
    struct marks m;
    if (!read_marks(&m)) return;
    long long limit = atomic_load(&timeout_ns), now = now_ns(), ab = atomic_load(&aborting_ns);
    char who[96], where[256], why[512], msg[1024];
    watchdog_describe_rank(who, sizeof who);
    if (ab && now - ab > abort_ns) {
        snprintf(msg, sizeof msg, "mtrain: error: %s: ending the job took over train.abort_timeout_s (%g s): exiting\n",
                 who, abort_ns / 1e9);
        end_process(msg);
    }
    why[0] = 0;
    if (!ab && failure_poll && failure_poll(why, sizeof why)) {
        doing(where, sizeof where, &m);
        snprintf(msg, sizeof msg, "mtrain: error: %s failed at %s: %s; ending the job (--resume auto continues from the "
                 "last checkpoint)\n", who, where, why);
        end_process(msg);
    }
    int io = m.phase != WATCHDOG_STEP && m.phase != WATCHDOG_EVAL;
    if (automatic && io && limit < seconds_ns(IO_MIN_S)) limit = seconds_ns(IO_MIN_S);
    long long since = m.op ? m.op_ns : m.phase_ns;
    if (now - since <= limit) return;
    char what[96];
    describe(what, sizeof what, m.phase, m.step);
    int n = snprintf(msg, sizeof msg, "mtrain: error: rank %d (tp %d, pp %d, dp %d): %s ", world_rank, tp_rank,
                     pp_rank, dp_rank, what);
    if (m.op)
        n += snprintf(msg + n, sizeof msg - n,
                      "has waited %.1f s in %s on group %s (rank %d of %d), over the hang timeout of %g s: a rank "
                      "is stuck or dead",
                      (now - since) / 1e9, m.op, m.group, m.rank, m.size, limit / 1e9);
    else
        n += snprintf(msg + n, sizeof msg - n,
                      "has run %.1f s outside any communication, over the hang timeout of %g s: this rank is stuck",
                      (now - since) / 1e9, limit / 1e9);
    snprintf(msg + n, sizeof msg - n,
             "; ending the job so it can be restarted (--resume auto continues from the last checkpoint)\n");
    end_process(msg);
}

static void *monitor(void *arg) {
    CHECK(pthread_mutex_lock(&lock) == 0);
    while (!stopping) {
        struct timespec t;
        CHECK(clock_gettime(CLOCK_MONOTONIC, &t) == 0);
        t.tv_sec += 1;
        int rc = pthread_cond_timedwait(&wake, &lock, &t);
        CHECK(rc == 0 || rc == ETIMEDOUT);
        if (!stopping) check();
    }
    CHECK(pthread_mutex_unlock(&lock) == 0);
    return NULL;
}

void watchdog_start(const struct grid *g, double timeout_s, double abort_s) {
    if (running) return;
    world_rank = g->world_rank, world_size = g->world_size, tp_rank = g->tp_rank, pp_rank = g->pp_rank;
    dp_rank = g->dp_rank;
    abort_ns = seconds_ns(abort_s > 0 ? abort_s : 30);
    atomic_store(&aborting_ns, 0);
    automatic = timeout_s <= 0;
    timed_steps = 0, slowest = 0;
    atomic_store(&timeout_ns, seconds_ns(automatic ? AUTO_MIN_S : timeout_s));
    watchdog_phase(WATCHDOG_SETUP, 0);
    pthread_condattr_t attr;
    CHECK(pthread_condattr_init(&attr) == 0);
    CHECK(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0);
    CHECK(pthread_cond_init(&wake, &attr) == 0);
    CHECK(pthread_condattr_destroy(&attr) == 0);
    stopping = 0;
    /* the monitor blocks every signal, so SIGTERM/SIGUSR1 reach the threads that handle them */
    sigset_t all, old;
    sigfillset(&all);
    CHECK(pthread_sigmask(SIG_BLOCK, &all, &old) == 0);
    int rc = pthread_create(&thread, NULL, monitor, NULL);
    CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0);
    if (rc != 0) die("cannot start the hang watchdog thread: %s", strerror(rc));
    running = 1;
}

void watchdog_stop(void) {
    if (!running) return;
    CHECK(pthread_mutex_lock(&lock) == 0);
    stopping = 1;
    CHECK(pthread_cond_signal(&wake) == 0);
    CHECK(pthread_mutex_unlock(&lock) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(pthread_cond_destroy(&wake) == 0);
    running = 0;
}
