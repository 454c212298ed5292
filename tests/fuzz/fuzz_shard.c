/* Fuzz the shard reader (data/shard_reader.c) on damaged shard files: the
 * seed is a dataset's first shard, mutated and put beside the dataset's own
 * index (whose checks it must fail or pass as the bytes say); the dataset is
 * then verified frame by frame and read from end to end, as training reads
 * it. A damaged frame must give a clear error (exit 1), never a crash or
 * wrong-sized read. Seeds: shard-00000 of datasets made by `mtrain data
 * generate`. */
#include "tests/fuzz/fuzz.h"


#include "data/dataset.h"
#include "data/shard_format.h"

const char fuzz_name[] = "fuzz_shard";
static char (*dirs)[4200];

/* WORKDIR/sh-K/ holds seed K's index and its other shards (copies and links); shard 0 is written per input */
void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {
    dirs = calloc((size_t)nseeds, sizeof *dirs);
    for (int k = 0; k < nseeds; k++) {
        char *abs = fuzz_seed_dir(seed_paths[k]), name[64];
        snprintf(dirs[k], sizeof dirs[k], "%s/sh-%d", workdir, k);
        mkdir(dirs[k], 0755);
        if (!abs || fuzz_link(abs, DATASET_INDEX_NAME, dirs[k])) fprintf(stderr, "%s: no index beside it\n", seed_paths[k]);
        for (int s = 1; abs; s++) {
            snprintf(name, sizeof name, DATASET_SHARD_FMT, s);
            if (fuzz_link(abs, name, dirs[k])) break;
        }
        free(abs);
    }
}

int fuzz_one(const char *path, int seed_index) {
    char name[64], shard[4300];
    snprintf(name, sizeof name, DATASET_SHARD_FMT, 0);
    snprintf(shard, sizeof shard, "%s/%s", dirs[seed_index], name);
    if (rename(path, shard) != 0) return 3;
    struct stat st;
    if (stat(shard, &st) != 0) return 3;
    struct dataset *ds = dataset_open(dirs[seed_index]);
    /* half the inputs verified first, as `mtrain data verify` does; the others read at once, as training does
     * (a damaged frame then ends the read with exit 1) */
    if ((st.st_size & 1) && dataset_verify(ds, stderr)) return 1;
    int64_t n = dataset_num_tokens(ds);
    int32_t buf[4096];
    for (int64_t at = 0; at < n; at += 4096) dataset_read(ds, at, n - at < 4096 ? n - at : 4096, buf);
    dataset_close(ds);
    return 0;
}
