/* Fuzz the tiktoken rank file loader (data/tokenizer_bpe.c) with and
 * without Llama 3's specials, then round-trip a text. Seeds: a rank file
 * written by the test. */
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_tokenizer_common.h"

const char fuzz_name[] = "fuzz_tiktoken";

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {}

int fuzz_one(const char *path, int seed_index) {
    struct bpe_special sp[BPE_LLAMA3_SPECIALS];
    static char names[BPE_LLAMA3_SPECIALS][40];
    bpe_llama3_specials(-1, sp, names); /* id -1: numbered right after the ranks */
    for (int i = 0; i < BPE_LLAMA3_SPECIALS; i++) sp[i].id = -1;
    struct bpe *b = bpe_load_tiktoken(path, NULL, sp, BPE_LLAMA3_SPECIALS);
    fuzz_roundtrip(b);
    bpe_free(b);
    b = bpe_load_tiktoken(path, NULL, NULL, 0);
    fuzz_roundtrip(b);
    bpe_free(b);
    return 0;
}
