/* A small mutation fuzzer shared by the harnesses in tests/fuzz/ (no
 * libFuzzer: gcc only). A harness defines fuzz_name, fuzz_prepare (optional
 * work before the loop) and fuzz_one, which parses one mutated input the way
 * mtrain does; main() here reads the seed files named on the command line,
 * mutates them (bit flips, interesting bytes and numbers, truncation,
 * insertion, deletion, chunk duplication, splicing two seeds) with a seeded
 * PRNG, writes each input to a file and runs fuzz_one on it in a forked
 * child for a time box.
 *
 * A child must end with exit code 0 (accepted), 1 (bad data file) or 2
 * (usage/recipe error) within FUZZ_CHILD_TIMEOUT seconds, and must not print
 * "out of memory" (the release build runs children under a 1 GiB address
 * space limit, so an input that makes a parser allocate gigabytes is caught;
 * the sanitizer build aborts on its own). Anything else - a signal, an
 * ASan/UBSan abort, a hang - is a failure: the input is kept as
 * WORKDIR/crash-N and the line
 *   FAIL fuzz_NAME: ...
 * is printed; otherwise one "PASS fuzz_NAME: N inputs in S s (seed X)" line.
 *
 * Usage: fuzz_NAME [--seconds S] [--seed X] [--workdir DIR] [--replay] SEED_FILE...
 * (FUZZ_SECONDS and FUZZ_SEED in the environment are the defaults; --replay
 * runs each file once, unmutated, e.g. to reproduce a saved crash-N). */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FUZZ_CHILD_TIMEOUT 10
#define FUZZ_MAX_INPUT (4 << 20)
#define FUZZ_AS_LIMIT (1ull << 30)

/* Provided by the harness. */
extern const char fuzz_name[];
/* Parse the input file at path; return 0 (accepted) or 1/2 (rejected), or
 * exit with those codes through die(). Runs in a forked child. */
int fuzz_one(const char *path, int seed_index);
/* Called once in the parent after the seeds are read (may be empty). */
void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths);

/* Harness helpers. */
static const char *fuzz_workdir;

struct fuzz_buf {
    uint8_t *p;
    size_t n;
};

static uint64_t fuzz_rng_state;
static uint64_t fuzz_rand(void) { /* splitmix64 */
    uint64_t z = (fuzz_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static size_t fuzz_below(size_t n) { return n ? (size_t)(fuzz_rand() % n) : 0; }

static int fuzz_read_file(const char *path, struct fuzz_buf *b) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    b->p = malloc(FUZZ_MAX_INPUT);
    b->n = b->p ? fread(b->p, 1, FUZZ_MAX_INPUT, f) : 0;
    fclose(f);
    return b->p ? 0 : -1;
}

static int fuzz_write_file(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return (fclose(f) != 0 || w != n) ? -1 : 0;
}

/* The absolute folder of a seed file (malloc'd; NULL if it cannot be resolved) */
static inline char *fuzz_seed_dir(const char *seed) {
    char *copy = strdup(seed), *abs = realpath(dirname(copy), NULL);
    free(copy);
    return abs;
}

/* Link FROM/NAME as TO/NAME: a seed's companion files (shards, weights) beside
 * each mutated input. -1 if FROM/NAME does not exist. */
static inline int fuzz_link(const char *from, const char *name, const char *to) {
    char src[4400], link[4400];
    snprintf(src, sizeof src, "%s/%s", from, name);
    if (access(src, F_OK) != 0) return -1;
    snprintf(link, sizeof link, "%s/%s", to, name);
    unlink(link);
    if (symlink(src, link) != 0) perror(link);
    return 0;
}

/* Values that tend to sit on boundaries, as text (for JSON, YAML and rank
 * files) and as raw little-endian integers (for binary headers). */
static const char *const fuzz_words[] = {
    "0", "-1", "1", "2", "65536", "2147483647", "2147483648", "4294967296", "-2147483649", "1073741824",
    "9223372036854775807", "18446744073709551616", "1e309", "nan", "inf", "-0", "0.5", "99999999999999999999",
    "\"\"", "[]", "{}", "null", "true", "[0,0]", "[-1]", "\"F32\"", "\"BF16\"", ":", ",", "\n", "  ", "\t",
    "\\u0000", "\xc3\xa9", "\xff", "~", "&a", "*a", "!!int", "---", "- ", "'", "\"", "#"};
static const uint64_t fuzz_ints[] = {0, 1, 2, 0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff, 0x7fffffff, 0x80000000ull,
                                     0xffffffffull, 0x100000000ull, 1ull << 40, 0x7fffffffffffffffull,
                                     0xffffffffffffffffull};

static void fuzz_insert(struct fuzz_buf *b, size_t at, const uint8_t *p, size_t n) {
    if (b->n + n > FUZZ_MAX_INPUT) return;
    memmove(b->p + at + n, b->p + at, b->n - at);
    memcpy(b->p + at, p, n);
    b->n += n;
}

/* One random edit of b (other: another seed for splicing). */
static void fuzz_mutate_once(struct fuzz_buf *b, const struct fuzz_buf *other) {
    size_t at = fuzz_below(b->n + 1);
    switch (fuzz_below(11)) {
    case 0: /* bit flip */
        if (b->n) b->p[fuzz_below(b->n)] ^= (uint8_t)(1u << fuzz_below(8));
        break;
    case 1: /* random byte */
        if (b->n) b->p[fuzz_below(b->n)] = (uint8_t)fuzz_rand();
        break;
    case 2: /* truncate */
        b->n = fuzz_below(b->n + 1);
        break;
    case 3: { /* insert random bytes */
        uint8_t tmp[16];
        size_t n = 1 + (size_t)(fuzz_rand() & 15);
        for (size_t i = 0; i < sizeof tmp; i++) tmp[i] = (uint8_t)fuzz_rand();
        fuzz_insert(b, at, tmp, n);
        break;
    }
    case 4: { /* delete a chunk */
        size_t n = fuzz_below(b->n - (at < b->n ? at : b->n) + 1);
        if (n > 64) n = 1 + fuzz_below(64);
        if (at + n <= b->n) memmove(b->p + at, b->p + at + n, b->n - at - n), b->n -= n;
        break;
    }
    case 5: { /* duplicate a chunk somewhere else */
        if (!b->n) break;
        size_t from = fuzz_below(b->n), n = 1 + fuzz_below(b->n - from);
        if (n > 256) n = 1 + fuzz_below(256);
        uint8_t *tmp = malloc(n);
        if (!tmp) break;
        memcpy(tmp, b->p + from, n);
        fuzz_insert(b, at, tmp, n);
        free(tmp);
        break;
    }
    case 6: case 7: { /* insert or overwrite a boundary word */
        const char *w = fuzz_words[fuzz_below(sizeof fuzz_words / sizeof *fuzz_words)];
        size_t n = strlen(w);
        if (fuzz_below(2) && at + n <= b->n) memcpy(b->p + at, w, n);
        else fuzz_insert(b, at, (const uint8_t *)w, n);
        break;
    }
    case 8: { /* overwrite a digit run with a boundary number */
        if (!b->n) break;
        size_t s = fuzz_below(b->n);
        while (s < b->n && (b->p[s] < '0' || b->p[s] > '9')) s++;
        if (s == b->n) break;
        size_t e = s;
        while (e < b->n && b->p[e] >= '0' && b->p[e] <= '9') e++;
        const char *w = fuzz_words[fuzz_below(18)];
        size_t n = strlen(w);
        memmove(b->p + s, b->p + e, b->n - e);
        b->n -= e - s;
        fuzz_insert(b, s, (const uint8_t *)w, n);
        break;
    }
    case 9: { /* raw little-endian boundary integer */
        uint64_t v = fuzz_ints[fuzz_below(sizeof fuzz_ints / sizeof *fuzz_ints)];
        size_t w = (size_t)1 << fuzz_below(4); /* 1, 2, 4 or 8 bytes */
        if (b->n < w) break;
        size_t pos = fuzz_below(b->n - w + 1);
        if (fuzz_below(2)) pos &= ~(w - 1); /* aligned fields are likelier */
        for (size_t i = 0; i < w; i++) b->p[pos + i] = (uint8_t)(v >> (8 * i));
        break;
    }
    default: { /* splice in a piece of another seed */
        if (!other || !other->n) break;
        size_t from = fuzz_below(other->n), n = 1 + fuzz_below(other->n - from);
        if (n > 512) n = 1 + fuzz_below(512);
        fuzz_insert(b, at, other->p + from, n);
        break;
    }
    }
}

static int fuzz_failures;

/* Run fuzz_one(path) in a child; returns 0 if it ended acceptably. */
static int fuzz_run_child(const char *path, int seed_index, int *code_out, char *why, size_t whylen) {
    char errpath[4200];
    snprintf(errpath, sizeof errpath, "%s/child.err", fuzz_workdir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen(errpath, "w", stderr)) _exit(3);
#ifndef __SANITIZE_ADDRESS__
        struct rlimit rl = {FUZZ_AS_LIMIT, FUZZ_AS_LIMIT};
        setrlimit(RLIMIT_AS, &rl);
#endif
        alarm(FUZZ_CHILD_TIMEOUT);
        int rc = fuzz_one(path, seed_index);
        fflush(NULL);
        exit(rc);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    char err[300] = "";
    FILE *f = fopen(errpath, "r");
    int oom = 0;
    if (f) {
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            if (strstr(line, "out of memory")) oom = 1;
            if (!err[0] || strstr(line, "ERROR") || strstr(line, "runtime error")) {
                line[strcspn(line, "\n")] = 0;
                snprintf(err, sizeof err, "%.290s", line);
            }
        }
        fclose(f);
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(why, whylen, "%s (%s)", sig == SIGALRM ? "hang: no exit within the time limit" : strsignal(sig), err);
        return -1;
    }
    int code = *code_out = WEXITSTATUS(status);
    if (code > 2) {
        snprintf(why, whylen, "exit code %d (%s)", code, err);
        return -1;
    }
    if (oom) {
        snprintf(why, whylen, "allocated more than %llu MiB (%s)", FUZZ_AS_LIMIT >> 20, err);
        return -1;
    }
    return 0;
}

static int fuzz_keep_crash(const struct fuzz_buf *b, const char *why, int n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/crash-%d", fuzz_workdir, n);
    fuzz_write_file(path, b->p, b->n);
    printf("FAIL %s: %s; input kept as %s (replay: %s --replay --workdir DIR %s)\n", fuzz_name, why, path, fuzz_name,
           path);
    fflush(stdout);
    return 0;
}

static double fuzz_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    double seconds = getenv("FUZZ_SECONDS") ? atof(getenv("FUZZ_SECONDS")) : 60;
    uint64_t seed = getenv("FUZZ_SEED") ? strtoull(getenv("FUZZ_SEED"), NULL, 0) : (uint64_t)time(NULL);
    int replay = 0, nseeds = 0;
    char **seeds = calloc((size_t)argc, sizeof *seeds);
    char defdir[64];
    snprintf(defdir, sizeof defdir, "/tmp/mtrain-fuzz-%d", (int)getpid());
    fuzz_workdir = defdir;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--workdir") && i + 1 < argc) fuzz_workdir = argv[++i];
        else if (!strcmp(argv[i], "--replay")) replay = 1;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--seconds S] [--seed X] [--workdir DIR] [--replay] SEED_FILE...\n", argv[0]);
            return 2;
        } else seeds[nseeds++] = argv[i];
    }
    if (!nseeds) {
        printf("FAIL %s: no seed files given\n", fuzz_name);
        return 1;
    }
    mkdir(fuzz_workdir, 0755);
    struct fuzz_buf *in = calloc((size_t)nseeds, sizeof *in);
    for (int i = 0; i < nseeds; i++)
        if (fuzz_read_file(seeds[i], &in[i]) != 0) {
            printf("FAIL %s: cannot read seed %s: %s\n", fuzz_name, seeds[i], strerror(errno));
            return 1;
        }
    fuzz_prepare(fuzz_workdir, nseeds, seeds);
    char path[4200], why[600];
    snprintf(path, sizeof path, "%s/input", fuzz_workdir);
    fuzz_rng_state = seed;
    struct fuzz_buf cur = {malloc(FUZZ_MAX_INPUT), 0};
    double t0 = fuzz_now();
    long runs = 0;
    for (int k = 0; replay ? k < nseeds : (fuzz_now() - t0 < seconds || runs < nseeds); k++) {
        /* each seed once unmutated first: the harness must accept the good files */
        int s = k < nseeds ? k : (int)fuzz_below((size_t)nseeds);
        memcpy(cur.p, in[s].p, in[s].n);
        cur.n = in[s].n;
        if (k >= nseeds && !replay) {
            int edits = 1 + (int)fuzz_below(4);
            for (int e = 0; e < edits; e++) fuzz_mutate_once(&cur, &in[fuzz_below((size_t)nseeds)]);
        }
        fuzz_write_file(path, cur.p, cur.n);
        runs++;
        int code = -1;
        if (fuzz_run_child(path, s, &code, why, sizeof why) != 0) {
            fuzz_keep_crash(&cur, why, fuzz_failures++);
            if (fuzz_failures >= 5) break;
        } else if (k < nseeds && !replay && code != 0) {
            /* a harness that rejects the good files tests nothing */
            printf("FAIL %s: the unmutated seed %s is rejected (exit %d): see %s/child.err\n", fuzz_name, seeds[s],
                   code, fuzz_workdir);
            fuzz_failures++;
            break;
        }
    }
    if (!fuzz_failures)
        printf("PASS %s: %ld inputs in %.0f s (seed %llu)\n", fuzz_name, runs, fuzz_now() - t0,
               (unsigned long long)seed);
    for (int i = 0; i < nseeds; i++) free(in[i].p);
    free(in);
    free(cur.p);
    free(seeds);
    return fuzz_failures ? 1 : 0;
}
