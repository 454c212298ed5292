/* Fuzz the dataset index reader (data/shard_reader.c): the mutated index
 * gets its XXH3 trailer recomputed most of the time, so the mutations reach
 * the field checks behind the checksum; then the dataset is opened,
 * verified frame by frame and read. Seeds: the index.mtd of datasets made
 * by `mtrain data generate` (their shard files are linked next to the
 * mutated index). */
#include "tests/fuzz/fuzz.h"

#include <xxhash.h>

#include "data/dataset.h"
#include "data/shard_format.h"

const char fuzz_name[] = "fuzz_dataset_index";
static char (*dirs)[4200];

/* WORKDIR/ds-K/ holds links to seed K's shards; the index is written per input. */
void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {
    dirs = calloc((size_t)nseeds, sizeof *dirs);
    for (int k = 0; k < nseeds; k++) {
        char *abs = fuzz_seed_dir(seed_paths[k]), name[64];
        snprintf(dirs[k], sizeof dirs[k], "%s/ds-%d", workdir, k);
        mkdir(dirs[k], 0755);
        for (int s = 0; abs; s++) {
            snprintf(name, sizeof name, DATASET_SHARD_FMT, s);
            if (fuzz_link(abs, name, dirs[k])) break;
        }
        free(abs);
    }
}

int fuzz_one(const char *path, int seed_index) {
    struct fuzz_buf b;
    if (fuzz_read_file(path, &b) != 0) return 3;
    /* fix the checksum 7 times in 8 */
    if (b.n >= INDEX_TRAILER_BYTES && (XXH3_64bits(b.p, b.n) & 7))
        put_u64(b.p + b.n - INDEX_TRAILER_BYTES, XXH3_64bits(b.p, b.n - INDEX_TRAILER_BYTES));
    char idx[4300];
    snprintf(idx, sizeof idx, "%s/%s", dirs[seed_index], DATASET_INDEX_NAME);
    if (fuzz_write_file(idx, b.p, b.n) != 0) return 3;
    free(b.p);
    struct dataset *ds = dataset_open(dirs[seed_index]);
    int64_t bad = dataset_verify(ds, stderr);
    int64_t n = dataset_num_tokens(ds), docs = dataset_num_docs(ds);
    int32_t buf[4096];
    int64_t count = n < 4096 ? n : 4096;
    if (count > 0 && !bad) {
        dataset_read(ds, 0, count, buf);
        dataset_read(ds, n - count, count, buf);
    }
    for (int64_t d = 0; d <= docs && d < 1000; d++)
        if (dataset_doc_start(ds, d) > n) abort();
    dataset_close(ds);
    return bad ? 1 : 0;
}
