/* Fuzz the safetensors header reader (checkpoint/safetensors.c): open,
 * read every tensor as float (as model.init_from does), close. Seeds:
 * model.safetensors / rank files of a tiny training run. */
#include "tests/fuzz/fuzz.h"

#include "checkpoint/safetensors.h"

const char fuzz_name[] = "fuzz_safetensors";

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {}

int fuzz_one(const char *path, int seed_index) {
    struct st_file f;
    char err[1024];
    if (safetensors_open(&f, path, err, sizeof err) != 0) return 1;
    int rc = 0;
    for (int i = 0; i < f.count && !rc; i++) {
        const struct st_entry *e = &f.entries[i];
        if (safetensors_find(&f, e->name) == NULL) abort();
        uint64_t n = e->end - e->begin;
        if (n > (64u << 20)) continue; /* the header said so and the file size agreed: too big to bother */
        float *dst = malloc(n * 2 + 16);  /* F16/BF16 widen to 4 bytes */
        if (safetensors_read_f32(&f, e, dst, err, sizeof err) != 0) rc = 1;
        free(dst);
    }
    safetensors_close(&f);
    return rc;
}
