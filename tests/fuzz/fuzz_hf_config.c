/* Fuzz the Hugging Face model directory reader (cli/model_source.c: config.json,
 * then the weights checked against it and loaded), as `mtrain generate` and
 * `mtrain eval` open one: a damaged config.json beside a tiny model's
 * model.safetensors, the model built on the CPU. A config the weights do not
 * match must be refused by name before a model its size is allocated. Seeds:
 * config.json of `mtrain convert --hf` of a tiny run (its weights file is
 * linked next to the mutated config). */
#include "tests/fuzz/fuzz.h"


#include "cli/model_source.h"
#include "config/common.h"

const char fuzz_name[] = "fuzz_hf_config";
static char (*dirs)[4200];

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {
    dirs = calloc((size_t)nseeds, sizeof *dirs);
    for (int k = 0; k < nseeds; k++) {
        char *abs = fuzz_seed_dir(seed_paths[k]);
        snprintf(dirs[k], sizeof dirs[k], "%s/hf-%d", workdir, k);
        mkdir(dirs[k], 0755);
        if (!abs || fuzz_link(abs, "model.safetensors", dirs[k])) fprintf(stderr, "%s: no weights beside it\n", seed_paths[k]);
        free(abs);
    }
}

int fuzz_one(const char *path, int seed_index) {
    char config[4400], err[4096];
    snprintf(config, sizeof config, "%s/config.json", dirs[seed_index]);
    if (rename(path, config) != 0) return 3;
    static struct model_source s;
    int rc = model_source_open(&s, dirs[seed_index], NULL, err, sizeof err);
    if (rc) return rc == EXIT_RUNTIME || rc == EXIT_USAGE ? rc : 3;
    struct transformer m;
    rc = model_source_build(&s, "cpu", 1, 8, &m, err, sizeof err);
    if (rc) return rc == EXIT_RUNTIME || rc == EXIT_USAGE ? rc : 3;
    transformer_free(&m);
    return 0;
}
