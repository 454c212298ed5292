/* Fuzz the Hugging Face tokenizer.json loader (data/tokenizer_bpe.c), then
 * round-trip a text through the loaded tokenizer. Seeds: a byte-level BPE
 * tokenizer.json written by the test. */
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_tokenizer_common.h"

const char fuzz_name[] = "fuzz_tokenizer_hf";

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {}

int fuzz_one(const char *path, int seed_index) {
    struct bpe *b = bpe_load_hf(path);
    fuzz_roundtrip(b);
    bpe_free(b);
    return 0;
}
