/* The build pipeline: a ring of chunk slots shared by the reading thread
 * (main) and the tokenizing workers. Memory is bounded by the ring: at most
 * 2 x workers + 1 chunks of ~1 MiB of text (or one document each) exist. */
#define _GNU_SOURCE
#include "data/text_build.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/common.h"
#include "data/text_input.h"

#define CHUNK_BYTES (1 << 20)
#define READ_BYTES (1 << 20)

enum { SLOT_FREE, SLOT_QUEUED, SLOT_DONE };

struct chunk {
    char *text;
    size_t n, cap;
    int file;
    int64_t first_line;      /* 1-based line number of the chunk's first line */
    int kind;                /* CHUNK_WHOLE, CHUNK_LINES, CHUNK_JSON */
    int cont_prev, cont_next; /* CHUNK_WHOLE: the document began in an earlier chunk / goes on in the next */
    int state;
    int32_t *tok;            /* results */
    size_t ntok, tokcap;
    int64_t *ends;           /* token count at each document's end */
    size_t nends, endscap;
    int failed;
    char err[512];
};
enum { CHUNK_WHOLE, CHUNK_LINES, CHUNK_JSON };

struct pipeline {
    const struct text_build_opts *o;
    const char *const *inputs;
    struct chunk *ring;
    int nslots;
    int64_t submitted, taken, consumed;
    int stop;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t *threads;
    int nthreads;
    /* progress */
    double t0, last_print, total_disk, disk_before;
    int printed;
    struct text_input *cur;
    struct text_build_stats *st;
    struct tokenizer_state *cutter; /* the reader's: finds where a long document can be cut */
};

#define PCHECK(call)                                                                    \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_) die("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, strerror(rc_)); \
    } while (0)

/* ---- workers ---- */

static void add_end(struct chunk *c) {
    if (c->nends == c->endscap) {
        c->endscap = c->endscap ? 2 * c->endscap : 256;
        c->ends = xrealloc(c->ends, c->endscap * sizeof *c->ends);
    }
    c->ends[c->nends++] = (int64_t)c->ntok;
}

static void encode_doc(struct chunk *c, struct tokenizer_state *ts, const struct text_build_opts *o, const char *p,
                       size_t n) {
    if (!n) return;   /* empty documents are dropped, with or without EOD */
    tokenizer_encode(ts, p, n, o->match_special, &c->tok, &c->ntok, &c->tokcap);
    if (o->append_eod) {
        if (c->ntok == c->tokcap) c->tok = xrealloc(c->tok, (c->tokcap = 2 * c->tokcap + 16) * sizeof *c->tok);
        c->tok[c->ntok++] = (int32_t)tokenizer_eod(o->tok);
    }
    add_end(c);
}

static void process_json_line(struct chunk *c, struct tokenizer_state *ts, const struct text_build_opts *o,
                              const char *path, int64_t line, const char *p, size_t n) {
    while (n && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    if (!n || c->failed) return;  /* blank lines are skipped */
    json_error_t e;
    json_t *obj = json_loadb(p, n, JSON_ALLOW_NUL, &e);
    if (!obj) {
        snprintf(c->err, sizeof c->err, "%s:%lld:%d: bad JSON: %s", path, (long long)line, e.column, e.text);
        c->failed = 1;
        return;
    }
    json_t *v = json_object_get(obj, o->json_key);
    if (!json_is_string(v)) {
        snprintf(c->err, sizeof c->err, "%s:%lld: no string field '%s' in this JSON line", path, (long long)line,
                 o->json_key);
        c->failed = 1;
    } else {
        encode_doc(c, ts, o, json_string_value(v), json_string_length(v));
    }
    json_decref(obj);
}

/* A piece of one whole-file document: only its last piece ends the document
 * (EOD and all); later pieces continue the text of earlier ones. */
static void encode_piece_of_doc(struct chunk *c, struct tokenizer_state *ts, const struct text_build_opts *o) {
    if (!c->cont_prev && !c->cont_next) return encode_doc(c, ts, o, c->text, c->n);
    tokenizer_encode_cont(ts, c->text, c->n, o->match_special, c->cont_prev, &c->tok, &c->ntok, &c->tokcap);
    if (c->cont_next) return;
    if (o->append_eod) {
        if (c->ntok == c->tokcap) c->tok = xrealloc(c->tok, (c->tokcap = 2 * c->tokcap + 16) * sizeof *c->tok);
        c->tok[c->ntok++] = (int32_t)tokenizer_eod(o->tok);
    }
    add_end(c);
}

static void process_chunk(struct pipeline *pl, struct chunk *c, struct tokenizer_state *ts) {
    const struct text_build_opts *o = pl->o;
    c->ntok = c->nends = 0;
    c->failed = 0;
    if (c->kind == CHUNK_WHOLE) return encode_piece_of_doc(c, ts, o);
    int64_t line = c->first_line;
    for (size_t i = 0; i < c->n; line++) {
        const char *nl = memchr(c->text + i, '\n', c->n - i);
        size_t end = nl ? (size_t)(nl - c->text) : c->n;
        if (c->kind == CHUNK_JSON) process_json_line(c, ts, o, pl->inputs[c->file], line, c->text + i, end - i);
        else encode_doc(c, ts, o, c->text + i, end - i);
        i = end + 1;
    }
}

static void *worker_main(void *arg) {
    struct pipeline *pl = arg;
    struct tokenizer_state *ts = tokenizer_state_create(pl->o->tok);
    for (;;) {
        PCHECK(pthread_mutex_lock(&pl->mu));
        while (!pl->stop && pl->taken == pl->submitted) PCHECK(pthread_cond_wait(&pl->work, &pl->mu));
        if (pl->taken == pl->submitted) {
            PCHECK(pthread_mutex_unlock(&pl->mu));
            break;
        }
        struct chunk *c = &pl->ring[pl->taken++ % pl->nslots];
        PCHECK(pthread_mutex_unlock(&pl->mu));
        process_chunk(pl, c, ts);
        PCHECK(pthread_mutex_lock(&pl->mu));
        c->state = SLOT_DONE;
        PCHECK(pthread_cond_broadcast(&pl->done));
        PCHECK(pthread_mutex_unlock(&pl->mu));
    }
    tokenizer_state_free(ts);
    return NULL;
}

/* ---- main thread ---- */

static void progress(struct pipeline *pl, int final) {
    if (!pl->o->progress) return;
    double now = now_seconds();
    if (final ? !pl->printed : now - pl->last_print < 1.0) return;  /* quick builds print no progress */
    pl->last_print = now;
    pl->printed = 1;
    double secs = now - pl->t0 > 1e-9 ? now - pl->t0 : 1e-9;
    double disk = pl->disk_before + (pl->cur ? (double)text_input_disk_bytes(pl->cur) : 0);
    char eta[64] = "";
    if (pl->total_disk > 0 && disk > 0 && !final)
        snprintf(eta, sizeof eta, ", %.0f%%, ETA %.0f s", 100 * disk / pl->total_disk,
                 secs * (pl->total_disk - disk) / disk);
    int tty = isatty(2);
    fprintf(stderr, "%sbuild: %lld docs, %lld tokens, %.1f MB text, %.1f MB/s%s%s", tty ? "\r" : "",
            (long long)pl->st->docs, (long long)pl->st->tokens, pl->st->text_bytes / 1e6,
            pl->st->text_bytes / 1e6 / secs, eta, tty && !final ? "   " : "\n");
    fflush(stderr);
}

/* Wait for chunk seq, write its documents, free its slot. */
static int consume(struct pipeline *pl, struct shard_writer *w, char *err, size_t errsz) {
    struct chunk *c = &pl->ring[pl->consumed % pl->nslots];
    PCHECK(pthread_mutex_lock(&pl->mu));
    while (c->state != SLOT_DONE) PCHECK(pthread_cond_wait(&pl->done, &pl->mu));
    PCHECK(pthread_mutex_unlock(&pl->mu));
    pl->consumed++;
    c->state = SLOT_FREE;
    if (c->failed) {
        snprintf(err, errsz, "%s", c->err);
        return -1;
    }
    int64_t start = 0;
    for (size_t d = 0; d < c->nends; d++) {
        shard_writer_add(w, c->tok + start, c->ends[d] - start);
        shard_writer_end_doc(w);
        start = c->ends[d];
    }
    if ((int64_t)c->ntok > start) shard_writer_add(w, c->tok + start, (int64_t)c->ntok - start); /* goes on next chunk */
    pl->st->docs += (int64_t)c->nends;
    pl->st->tokens += (int64_t)c->ntok;
    progress(pl, 0);
    return 0;
}

/* A free slot for the next chunk (consuming the oldest one if the ring is full). */
static struct chunk *next_slot(struct pipeline *pl, struct shard_writer *w, char *err, size_t errsz) {
    if (pl->submitted - pl->consumed == pl->nslots && consume(pl, w, err, errsz)) return NULL;
    struct chunk *c = &pl->ring[pl->submitted % pl->nslots];
    c->n = 0;
    return c;
}

static void submit(struct pipeline *pl, struct chunk *c) {
    PCHECK(pthread_mutex_lock(&pl->mu));
    c->state = SLOT_QUEUED;
    pl->submitted++;
    PCHECK(pthread_cond_signal(&pl->work));
    PCHECK(pthread_mutex_unlock(&pl->mu));
}

static void reserve(struct chunk *c, size_t n) {
    if (c->n + n <= c->cap) return;
    c->cap = 2 * (c->n + n);
    c->text = xrealloc(c->text, c->cap);
}

/* Queue c's first n bytes (doc_goes_on: a long document continues in the
 * next chunk); the next chunk starts with the rest, which is still ours to
 * read (a worker reads only c's first n bytes). NULL on a write error. */
static struct chunk *hand_over(struct pipeline *pl, struct shard_writer *w, struct chunk *c, size_t n, int doc_goes_on,
                               char *err, size_t errsz) {
    size_t keep = c->n - n;
    c->n = n;
    c->cont_next = doc_goes_on;
    submit(pl, c);
    struct chunk *next = next_slot(pl, w, err, errsz);
    if (!next) return NULL;
    reserve(next, keep);
    if (keep) memcpy(next->text, c->text + n, keep);
    next->n = keep;
    next->file = c->file, next->kind = c->kind, next->first_line = c->first_line;
    next->cont_prev = doc_goes_on, next->cont_next = 0;
    return next;
}

/* Read one input and submit it as chunks. */
static int read_input(struct pipeline *pl, struct shard_writer *w, int file, char *buf, char *err, size_t errsz) {
    const char *path = pl->inputs[file];
    size_t plen = strlen(path);
    int json = pl->o->jsonl_all || (plen > 6 && !strcmp(path + plen - 6, ".jsonl")) ||
               (plen > 10 && !strcmp(path + plen - 10, ".jsonl.zst"));
    int kind = json ? CHUNK_JSON : pl->o->split_lines ? CHUNK_LINES : CHUNK_WHOLE;
    struct text_input *in = text_input_open(path, err, errsz);
    if (!in) return -1;
    pl->cur = in;
    struct chunk *c = next_slot(pl, w, err, errsz);
    int64_t line = 1;
    int rc = 0;
    if (!c) {
        text_input_close(in);
        pl->cur = NULL;
        return -1;
    }
    c->file = file;
    c->kind = kind;
    c->first_line = 1;
    c->cont_prev = c->cont_next = 0;
    for (;;) {
        long got = text_input_read(in, buf, READ_BYTES, err, errsz);
        if (got < 0) {
            rc = -1;
            break;
        }
        if (got == 0) break;
        pl->st->text_bytes += (double)got;
        reserve(c, (size_t)got);
        memcpy(c->text + c->n, buf, (size_t)got);
        c->n += (size_t)got;
        if (c->n < CHUNK_BYTES) continue;
        if (kind == CHUNK_WHOLE) { /* a long document: hand over its text up to a place it can be cut */
            size_t cut = tokenizer_safe_cut(pl->cutter, c->text, c->n, pl->o->match_special);
            if (cut && !(c = hand_over(pl, w, c, cut, 1, err, errsz))) {
                rc = -1;
                break;
            }
            continue;
        }
        /* hand over whole lines; the partial last line starts the next chunk */
        char *last = memrchr(c->text, '\n', c->n);
        if (!last) continue;
        for (char *p = c->text; p <= last; p++) line += *p == '\n';
        if (!(c = hand_over(pl, w, c, (size_t)(last + 1 - c->text), 0, err, errsz))) {
            rc = -1;
            break;
        }
        c->first_line = line;
    }
    /* the last chunk (a whole document, or the remaining lines) */
    if (!rc) submit(pl, c);
    pl->disk_before += (double)text_input_disk_bytes(in);
    pl->cur = NULL;
    text_input_close(in);
    return rc;
}

static void stop_workers(struct pipeline *pl) {
    PCHECK(pthread_mutex_lock(&pl->mu));
    pl->stop = 1;
    PCHECK(pthread_cond_broadcast(&pl->work));
    PCHECK(pthread_mutex_unlock(&pl->mu));
    for (int i = 0; i < pl->nthreads; i++) PCHECK(pthread_join(pl->threads[i], NULL));
}

/* A build that dies instead of returning an error (die() -> exit(): a write
 * error on a full disk, a failed rename) would leave OUT.tmp-PID behind, so
 * the writer's temporary directory is removed at exit unless it is gone by
 * then (renamed to OUT by shard_writer_finish, or removed by
 * shard_writer_abort). The path holds this process's PID, so nothing else
 * can own it. A death on a worker thread (_exit) or a signal skips this; the
 * next build into the same OUT removes such leftovers whose PID is dead
 * (shard_writer_open). */
static char *tmp_to_remove;

static void remove_tmp_at_exit(void) {
    struct stat st; /* not path_exists: it may die, and exit() must not run from an exit handler */
    if (tmp_to_remove && stat(tmp_to_remove, &st) == 0) remove_tree(tmp_to_remove);
    free(tmp_to_remove);
    tmp_to_remove = NULL;
}

static void remove_tmp_on_exit(const char *tmp) {
    static int registered;
    free(tmp_to_remove);
    tmp_to_remove = xstrdup(tmp);
    if (!registered && atexit(remove_tmp_at_exit) == 0) registered = 1;
}

int text_build(struct shard_writer *w, const char *const *inputs, int ninputs, const struct text_build_opts *o,
               struct text_build_stats *st, char *err, size_t errsz) {
    memset(st, 0, sizeof *st);
    remove_tmp_on_exit(shard_writer_tmp_dir(w));
    struct pipeline pl = {.o = o, .inputs = inputs, .st = st};
    pl.nslots = 2 * o->workers + 1;
    pl.ring = xcalloc((size_t)pl.nslots, sizeof *pl.ring);
    pl.t0 = pl.last_print = now_seconds();
    for (int i = 0; i < ninputs; i++) {
        int64_t size = text_input_check(inputs[i], err, errsz);
        if (size > 0) pl.total_disk += (double)size;
    }
    /* jansson seeds its hash function on first use: do it before threads */
    json_object_seed(0);
    PCHECK(pthread_mutex_init(&pl.mu, NULL));
    PCHECK(pthread_cond_init(&pl.work, NULL));
    PCHECK(pthread_cond_init(&pl.done, NULL));
    pl.threads = xmalloc((size_t)o->workers * sizeof *pl.threads);
    for (; pl.nthreads < o->workers; pl.nthreads++)
        PCHECK(pthread_create(&pl.threads[pl.nthreads], NULL, worker_main, &pl));
    char *buf = xmalloc(READ_BYTES);
    pl.cutter = tokenizer_state_create(o->tok);
    int rc = 0;
    for (int i = 0; i < ninputs && !rc; i++) rc = read_input(&pl, w, i, buf, err, errsz);
    while (!rc && pl.consumed < pl.submitted) rc = consume(&pl, w, err, errsz);
    stop_workers(&pl);
    /* a dataset of no documents cannot train: most likely a wrong input */
    if (!rc && st->docs == 0) {
        rc = -1;
        if (ninputs == 1)
            snprintf(err, errsz, "%s: no documents: the input is empty (or holds only blank lines or empty documents)",
                     inputs[0]);
        else
            snprintf(err, errsz, "no documents in any of the %d inputs (%s, %s%s): they are empty", ninputs, inputs[0],
                     inputs[1], ninputs > 2 ? ", ..." : "");
    }
    if (!rc) progress(&pl, 1);
    for (int i = 0; i < pl.nslots; i++) {
        free(pl.ring[i].text);
        free(pl.ring[i].tok);
        free(pl.ring[i].ends);
    }
    free(pl.ring);
    free(pl.threads);
    free(buf);
    tokenizer_state_free(pl.cutter);
    PCHECK(pthread_mutex_destroy(&pl.mu));
    PCHECK(pthread_cond_destroy(&pl.work));
    PCHECK(pthread_cond_destroy(&pl.done));
    return rc;
}
