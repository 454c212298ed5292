/* The prefetch thread hands out exactly the samples blend_get gives for the
 * same positions, for a run of consecutive batches and after jumps (a rewind
 * moving the data position), for every data-parallel rank. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/common.h"
#include "data/blend.h"
#include "data/prefetch.h"
#include "data/shard_writer.h"
#include "tests/unit/check.h"

int main(void) {
    char root[] = "/tmp/mtrain-test-prefetch.XXXXXX";
    if (!mkdtemp(root)) die("mkdtemp failed");
    char dir[300];
    snprintf(dir, sizeof dir, "%s/d", root);
    struct shard_writer_opts o = {.vocab_size = 5000, .eod_id = -1, .frame_tokens = 512, .force = 1};
    struct shard_writer *w = shard_writer_open(dir, &o);
    for (int i = 0; i < 40000; i++) {
        int32_t t = (int32_t)((i * 2654435761u) % 5000);
        shard_writer_add(w, &t, 1);
        if (i % 300 == 299) shard_writer_end_doc(w);
    }
    shard_writer_finish(w, NULL);

    static struct recipe r;
    recipe_defaults(&r);
    snprintf(r.data.path, sizeof r.data.path, "%s", dir);
    r.train.seq_len = 24, r.train.global_batch = 8, r.train.seed = 3;
    r.model.vocab_size = 5000;
    int T = r.train.seq_len, ok = 1, dp = 2;
    int64_t positions[] = {0, 8, 16, 24, 8, 16, 200, 208, 216, 0};
    struct blend *ref = blend_from_recipe(&r, SPLIT_TRAIN);
    int32_t *want = malloc(sizeof(int32_t) * (T + 1));
    for (int rank = 0; rank < dp; rank++) {
        struct prefetcher *p = prefetcher_create(&r, SPLIT_TRAIN, dp, rank);
        for (size_t k = 0; k < sizeof positions / sizeof positions[0]; k++) {
            const int32_t *got = prefetcher_next(p, positions[k]);
            for (int i = 0; i < r.train.global_batch / dp; i++) {
                blend_get(ref, positions[k] + (int64_t)i * dp + rank, want);
                ok &= !memcmp(got + (size_t)i * (T + 1), want, sizeof(int32_t) * (T + 1));
            }
        }
        prefetcher_free(p);
    }
    TEST_RESULT("prefetch_same_samples_as_blend", ok, "a batch differs from blend_get");
    free(want);
    blend_free(ref);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) warn("cannot remove %s", root);
    TEST_EXIT();
}
