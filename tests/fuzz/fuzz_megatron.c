/* Fuzz the Megatron-LM .idx reader (data/megatron.c): open the mutated
 * PREFIX.idx next to the seed's PREFIX.bin and read every document, as
 * `mtrain data import` does. Seeds: .idx files (with their .bin) written by
 * the test. */
#include "tests/fuzz/fuzz.h"

#include "data/megatron.h"

const char fuzz_name[] = "fuzz_megatron";
static const char *work;

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {
    work = workdir;
    for (int k = 0; k < nseeds; k++) {
        char bin[4200], link[4300];
        size_t n = strlen(seed_paths[k]);
        if (n < 4 || strcmp(seed_paths[k] + n - 4, ".idx")) continue;
        snprintf(bin, sizeof bin, "%.*s.bin", (int)(n - 4), seed_paths[k]);
        char *abs = realpath(bin, NULL);
        snprintf(link, sizeof link, "%s/mm-%d.bin", workdir, k);
        unlink(link);
        if (!abs || symlink(abs, link) != 0) perror(link);
        free(abs);
    }
}

int fuzz_one(const char *path, int seed_index) {
    char prefix[4300], idx[4400], err[1024];
    snprintf(prefix, sizeof prefix, "%s/mm-%d", work, seed_index);
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    if (rename(path, idx) != 0) return 3;
    struct megatron *m = megatron_open(prefix, err, sizeof err);
    if (!m) return 1;
    int32_t *out = NULL;
    size_t cap = 0;
    int64_t total = 0, docs = megatron_num_docs(m);
    int rc = 0;
    for (int64_t d = 0; d < docs && d < 100000 && !rc; d++) {
        int64_t n = megatron_read_doc(m, d, &out, &cap, err, sizeof err);
        if (n < 0) rc = 1;
        else total += n;
    }
    if (!rc && docs < 100000 && total != megatron_num_tokens(m)) abort(); /* documents must hold every token */
    free(out);
    megatron_close(m);
    return rc;
}
