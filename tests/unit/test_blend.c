/* Blending: realized proportions match the weights (over 10,000 samples and
 * per global batch), the sequence is the same for one reader and for four
 * strided readers, random access equals sequential access, and one source
 * reproduces the plain sampler. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/common.h"
#include "data/blend.h"
#include "data/shard_writer.h"
#include "tests/unit/check.h"

#define L 32

/* Dataset d holds tokens d*100 .. d*100+99, so a sample names its source. */
static void write_dataset(const char *dir, int d, int ntok) {
    struct shard_writer_opts o = {.vocab_size = 1000, .eod_id = -1, .frame_tokens = 1000, .force = 1};
    struct shard_writer *w = shard_writer_open(dir, &o);
    for (int i = 0; i < ntok; i++) {
        int32_t t = d * 100 + (int32_t)((i * 7919u) % 100);
        shard_writer_add(w, &t, 1);
        if (i % 97 == 96) shard_writer_end_doc(w);
    }
    shard_writer_finish(w, NULL);
}

int main(void) {
    char root[] = "/tmp/mtrain-test-blend.XXXXXX";
    if (!mkdtemp(root)) die("mkdtemp failed");
    char paths[3][256];
    int sizes[3] = {20000, 5000, 50000};   /* the small one wraps around many epochs */
    for (int d = 0; d < 3; d++) {
        snprintf(paths[d], sizeof paths[d], "%s/d%d", root, d);
        write_dataset(paths[d], d, sizes[d]);
    }
    struct blend_source src[3] = {{paths[0], 0.5}, {paths[1], 0.3}, {paths[2], 0.2}};
    struct blend *b = blend_create(src, 3, L, 7, SPLIT_TRAIN, 0.0, SAMPLER_VERSION);

    const int N = 10000, GB = 64;
    int64_t count[3] = {0}, batch[3] = {0};
    int32_t tok[L + 1];
    int worst_batch = 0, token_source_ok = 1;
    for (int64_t i = 0; i < N; i++) {
        int s;
        int64_t k;
        blend_locate(b, i, &s, &k);
        count[s]++;
        batch[s]++;
        if (i < 2000) {
            blend_get(b, i, tok);
            for (int j = 0; j <= L; j++) token_source_ok &= tok[j] / 100 == s;
        }
        if ((i + 1) % GB == 0) {
            for (int d = 0; d < 3; d++) {
                int dev = (int)ceil(fabs((double)batch[d] - src[d].weight * GB));
                if (dev > worst_batch) worst_batch = dev;
                batch[d] = 0;
            }
        }
    }
    double worst = 0;
    for (int d = 0; d < 3; d++) worst = fmax(worst, fabs((double)count[d] / N - src[d].weight));
    TEST_RESULT("blend_proportions_10000_within_1pct", worst < 0.01, "worst deviation %.4f (%lld %lld %lld)", worst,
                (long long)count[0], (long long)count[1], (long long)count[2]);
    TEST_RESULT("blend_proportions_per_global_batch", worst_batch <= 2, "a batch of %d is off by %d samples", GB,
                worst_batch);
    TEST_RESULT("blend_samples_come_from_their_source", token_source_ok, "a sample mixes datasets");

    /* 4 data-parallel readers, each its own handles, indices r, r+4, ... */
    struct blend *r[4];
    for (int i = 0; i < 4; i++) r[i] = blend_create(src, 3, L, 7, SPLIT_TRAIN, 0.0, SAMPLER_VERSION);
    int same = 1;
    int32_t want[L + 1];
    for (int64_t i = 0; same && i < N; i++) {
        blend_get(b, i, want);
        blend_get(r[i % 4], i, tok);
        same = !memcmp(tok, want, sizeof tok);
    }
    TEST_RESULT("blend_dp1_equals_4_strided_readers", same, "readers disagree");
    for (int i = 0; i < 4; i++) blend_free(r[i]);

    /* random access (a fresh handle jumping backwards) equals sequential */
    struct blend *j = blend_create(src, 3, L, 7, SPLIT_TRAIN, 0.0, SAMPLER_VERSION);
    int ok = 1;
    for (int64_t i = 50000; ok && i >= 0; i -= 4999) {
        int s1, s2;
        int64_t k1, k2;
        blend_locate(j, i, &s1, &k1);
        blend_locate(b, i, &s2, &k2);
        ok = s1 == s2 && k1 == k2;
    }
    TEST_RESULT("blend_random_access_equals_sequential", ok, "jumping gave another sample");
    blend_free(j);

    /* one source is exactly the plain sampler */
    struct blend *one = blend_create(src, 1, L, 7, SPLIT_TRAIN, 0.0, SAMPLER_VERSION);
    struct dataset *ds = dataset_open(paths[0]);
    struct sampler *sm = sampler_create(ds, L, 7, SPLIT_TRAIN, 0.0);
    ok = 1;
    for (int64_t i = 0; ok && i < 3000; i++) {
        blend_get(one, i, tok);
        sampler_get(sm, i, want);
        ok = !memcmp(tok, want, sizeof tok);
    }
    TEST_RESULT("blend_single_source_is_sampler", ok, "differs from sampler_get");
    sampler_free(sm);
    dataset_close(ds);
    blend_free(one);
    blend_free(b);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) printf("FAIL cleanup: %s\n", cmd);
    TEST_EXIT();
}
