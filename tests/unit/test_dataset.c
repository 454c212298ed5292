/* Dataset writer/reader round trips (uint16 and uint32 tokens, many frames
 * and shards) and the sampler's contract: deterministic, inside its split,
 * a permutation per epoch, disjoint train/valid documents. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/common.h"
#include "data/dataset.h"
#include "data/shard_writer.h"
#include "tests/unit/check.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct corpus {
    int32_t *tokens;
    int64_t ntokens, ndocs;
    int64_t *docs;          /* ndocs + 1 boundaries */
};

/* Random documents written to dir; the expected stream is kept in memory. */
static struct corpus write_random(const char *dir, int vocab, int ndocs, int64_t frame_tokens, int64_t shard_bytes,
                                  uint64_t seed) {
    struct corpus c = {0};
    c.tokens = xmalloc((size_t)ndocs * 600 * sizeof *c.tokens);
    c.docs = xmalloc(((size_t)ndocs + 1) * sizeof *c.docs);
    struct shard_writer_opts o = {.vocab_size = vocab, .eod_id = vocab - 1, .frame_tokens = frame_tokens,
                                  .shard_bytes = shard_bytes, .force = 1};
    struct shard_writer *w = shard_writer_open(dir, &o);
    for (int d = 0; d < ndocs; d++) {
        int len = 1 + (int)(rng_next(&seed) % 500);
        int32_t *t = c.tokens + c.ntokens;
        /* Small ids most of the time so frames compress, some near the top. */
        for (int i = 0; i < len; i++)
            t[i] = (int32_t)(rng_next(&seed) % 8 ? rng_next(&seed) % 50 : rng_next(&seed) % (uint64_t)(vocab - 1));
        t[len - 1] = vocab - 1;
        shard_writer_add(w, t, len / 2);
        shard_writer_add(w, t + len / 2, len - len / 2);
        shard_writer_end_doc(w);
        shard_writer_end_doc(w);  /* an empty document is not recorded */
        c.docs[c.ndocs++] = c.ntokens;
        c.ntokens += len;
    }
    c.docs[c.ndocs] = c.ntokens;
    struct shard_writer_stats st;
    shard_writer_finish(w, &st);
    if (st.tokens != c.ntokens || st.docs != c.ndocs) printf("FAIL writer_stats: %lld tokens\n", (long long)st.tokens);
    return c;
}

static void check_roundtrip(const char *name, const char *dir, int vocab, int want_dtype) {
    struct corpus c = write_random(dir, vocab, 300, 97, 4000, (uint64_t)vocab);
    struct dataset *ds = dataset_open(dir);
    struct dataset_info in;
    dataset_get_info(ds, &in);
    int ok = in.dtype_bytes == want_dtype && in.shards > 1 && in.frames > in.shards &&
             dataset_num_tokens(ds) == c.ntokens && dataset_num_docs(ds) == c.ndocs &&
             dataset_vocab_size(ds) == vocab;
    for (int64_t d = 0; ok && d <= c.ndocs; d++) ok = dataset_doc_start(ds, d) == c.docs[d];
    int32_t *out = xmalloc((size_t)c.ntokens * sizeof *out);
    dataset_read(ds, 0, c.ntokens, out);
    ok = ok && !memcmp(out, c.tokens, (size_t)c.ntokens * sizeof *out);
    uint64_t s = 7;
    for (int i = 0; ok && i < 2000; i++) {
        int64_t first = (int64_t)(rng_next(&s) % (uint64_t)c.ntokens);
        int64_t count = (int64_t)(rng_next(&s) % 400);
        if (count > c.ntokens - first) count = c.ntokens - first;
        dataset_read(ds, first, count, out);
        ok = !memcmp(out, c.tokens + first, (size_t)count * sizeof *out);
    }
    ok = ok && dataset_verify(ds, stdout) == 0;
    TEST_RESULT(name, ok, "dtype %d shards %lld frames %lld tokens %lld/%lld", in.dtype_bytes, (long long)in.shards,
                (long long)in.frames, (long long)dataset_num_tokens(ds), (long long)c.ntokens);
    free(out);
    free(c.tokens);
    free(c.docs);
    dataset_close(ds);
}

static int samples_equal(struct sampler *a, struct sampler *b, int64_t count, int seq_len) {
    int32_t *x = xmalloc(((size_t)seq_len + 1) * sizeof *x), *y = xmalloc(((size_t)seq_len + 1) * sizeof *y);
    int same = 1;
    for (int64_t i = 0; same && i < count; i++) {
        sampler_get(a, i, x);
        sampler_get(b, i, y);
        same = !memcmp(x, y, ((size_t)seq_len + 1) * sizeof *x);
    }
    free(x);
    free(y);
    return same;
}

static void check_determinism(struct dataset *ds) {
    const int L = 64;
    struct sampler *a = sampler_create(ds, L, 42, SPLIT_TRAIN, 0.1);
    struct sampler *b = sampler_create(ds, L, 42, SPLIT_TRAIN, 0.1);
    struct sampler *c = sampler_create(ds, L, 43, SPLIT_TRAIN, 0.1);
    int64_t n = sampler_samples_per_epoch(a);
    /* b is read backwards first so its cached epochs differ from a's. */
    int32_t tmp[65];
    for (int64_t i = 3 * n - 1; i >= 0; i -= 7) sampler_get(b, i, tmp);
    TEST_RESULT("sampler_same_seed_same_samples", samples_equal(a, b, 3 * n, L), "samples differ");
    TEST_RESULT("sampler_other_seed_differs", !samples_equal(a, c, n, L), "seed 43 gave seed 42's samples");
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

/* Every sample lies inside its split, matches the stream there, and each
 * epoch visits every sample position exactly once, in a fresh order. */
static void check_split(struct dataset *ds, enum split split, const char *name) {
    const int L = 50;
    struct sampler *s = sampler_create(ds, L, 5, split, 0.2);
    int64_t n = sampler_samples_per_epoch(s), d0, d1, t0, t1;
    sampler_split_range(s, &d0, &d1, &t0, &t1);
    char *seen = xcalloc((size_t)n, 1);
    int32_t got[51], want[51];
    int inside = n == (t1 - t0 - 1) / L, perm = 1, reorders = 0;
    for (int64_t e = 0; e < 3; e++) {
        memset(seen, 0, (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            int64_t p = sampler_position(s, e * n + i);
            inside = inside && p >= t0 && p + L + 1 <= t1 && (p - t0) % L == 0;
            if (!inside) break;
            perm = perm && !seen[(p - t0) / L];
            seen[(p - t0) / L] = 1;
            sampler_get(s, e * n + i, got);
            dataset_read(ds, p, L + 1, want);
            inside = !memcmp(got, want, sizeof got);
            if (e > 0 && p != sampler_position(s, i)) reorders++;
        }
    }
    char label[128];
    snprintf(label, sizeof label, "sampler_%s_samples_inside_split", name);
    TEST_RESULT(label, inside, "sample outside [%lld, %lld) or wrong tokens", (long long)t0, (long long)t1);
    snprintf(label, sizeof label, "sampler_%s_epoch_is_permutation", name);
    TEST_RESULT(label, perm && (n < 3 || reorders > 0), "duplicate sample or same order every epoch (n=%lld)",
                (long long)n);
    free(seen);
    sampler_free(s);
}

static void check_disjoint(struct dataset *ds) {
    struct sampler *tr = sampler_create(ds, 16, 1, SPLIT_TRAIN, 0.2);
    struct sampler *va = sampler_create(ds, 16, 1, SPLIT_VALID, 0.2);
    int64_t a0, a1, at0, at1, b0, b1, bt0, bt1;
    sampler_split_range(tr, &a0, &a1, &at0, &at1);
    sampler_split_range(va, &b0, &b1, &bt0, &bt1);
    int64_t nd = dataset_num_docs(ds);
    int ok = a0 == 0 && a1 == b0 && b1 == nd && b1 - b0 == (int64_t)(nd * 0.2) && at1 == bt0 &&
             at1 == dataset_doc_start(ds, a1) && bt1 == dataset_num_tokens(ds);
    TEST_RESULT("sampler_splits_disjoint_documents", ok, "train docs [%lld,%lld) valid [%lld,%lld) of %lld",
                (long long)a0, (long long)a1, (long long)b0, (long long)b1, (long long)nd);
    sampler_free(tr);
    sampler_free(va);
}

/* Run fn in a child and return its exit code: errors exit via die(). */
static int child_exit(void (*fn)(const char *), const char *arg) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(99);
        fn(arg);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void small_valid_split(const char *dir) {
    struct dataset *ds = dataset_open(dir);
    sampler_create(ds, 100000, 1, SPLIT_VALID, 0.01);
}
static void no_valid_split(const char *dir) {
    struct dataset *ds = dataset_open(dir);
    sampler_create(ds, 16, 1, SPLIT_VALID, 0.0);
}
static void write_without_force(const char *dir) {
    struct shard_writer_opts o = {.vocab_size = 300, .eod_id = -1};
    shard_writer_open(dir, &o);
}

int main(void) {
    char root[] = "/tmp/mtrain-test-dataset.XXXXXX";
    if (!mkdtemp(root)) die("mkdtemp failed");
    char d16[256], d32[256];
    snprintf(d16, sizeof d16, "%s/u16", root);
    snprintf(d32, sizeof d32, "%s/u32", root);
    check_roundtrip("dataset_roundtrip_uint16", d16, 1000, 2);
    check_roundtrip("dataset_roundtrip_uint32", d32, 70000, 4);
    check_roundtrip("dataset_force_replaces", d16, 1000, 2);
    struct dataset *ds = dataset_open(d16);
    check_determinism(ds);
    check_split(ds, SPLIT_TRAIN, "train");
    check_split(ds, SPLIT_VALID, "valid");
    check_disjoint(ds);
    dataset_close(ds);
    TEST_RESULT("sampler_too_small_split_exits_1", child_exit(small_valid_split, d16) == 1, "no error");
    TEST_RESULT("sampler_empty_valid_split_exits_1", child_exit(no_valid_split, d16) == 1, "no error");
    TEST_RESULT("writer_refuses_existing_without_force", child_exit(write_without_force, d16) == 1, "no error");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) printf("FAIL cleanup: %s\n", cmd);
    TEST_EXIT();
}
