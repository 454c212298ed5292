/* Fuzz `mtrain data build` (cli/data.c, data/text_build.c, data/text_input.c)
 * on damaged inputs: JSON lines (*.jsonl), plain text (one document per
 * file, or per line), and both zstd-compressed (*.zst), tokenized with the
 * byte tokenizer by 2 workers into a fresh dataset, which is then opened and
 * verified. Bad input must give a clear error (exit 1 or 2). Seeds: files
 * whose names carry the input kind (run.sh writes them). */
#include "tests/fuzz/fuzz.h"

#include "cli/cli.h"
#include "config/common.h"
#include "data/dataset.h"

const char fuzz_name[] = "fuzz_data_build";
/* main.c's command table, which cli/help.c links against: the harness runs cmd_data alone */
const struct command *find_command(const char *name) { return NULL; }
void print_commands(FILE *out) {}

static const char *work;
static char (*names)[256];

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {
    work = workdir;
    names = calloc((size_t)nseeds, sizeof *names);
    for (int k = 0; k < nseeds; k++) {
        char *copy = strdup(seed_paths[k]);
        snprintf(names[k], sizeof names[k], "%s", basename(copy));
        free(copy);
    }
}

int fuzz_one(const char *path, int seed_index) {
    char input[4600], out[4300];
    /* the seed's name: its extension picks the input kind, "lines" in it plain text a line a document */
    snprintf(input, sizeof input, "%s/in-%s", work, names[seed_index]);
    snprintf(out, sizeof out, "%s/out", work);
    if (rename(path, input) != 0) return 3;
    char *argv[20] = {"data", "build", "--tokenizer", "bytes", "--out", out, "--force", "--quiet", "--workers", "2",
                      "--frame-tokens", "64", "--append-eod"};
    int argc = 13;
    if (strstr(names[seed_index], "lines")) argv[argc++] = "--split-lines";
    argv[argc++] = input;
    int rc = cmd_data(argc, argv);
    if (rc) return rc == EXIT_RUNTIME || rc == EXIT_USAGE ? rc : 3;
    struct dataset *ds = dataset_open(out); /* what it wrote must be a dataset */
    if (dataset_verify(ds, stderr)) abort();
    dataset_close(ds);
    return 0;
}
