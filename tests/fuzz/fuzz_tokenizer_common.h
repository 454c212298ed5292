/* Shared by fuzz_tokenizer_hf.c and fuzz_tiktoken.c: a loaded tokenizer must
 * encode text and decode it back to the same bytes (byte-level BPE loses
 * nothing); a mismatch aborts, so it counts as a failure. */
#include "data/tokenizer_bpe.h"

static const char fuzz_text[] =
    "Hello, world! The cat sat on the mat.\n\n  indented\ttabs 12345 caf\xc3\xa9 \xe2\x82\xac \xff\xfe raw bytes "
    "<|begin_of_text|><|eot_id|> [PAD] don't we'll 3.14159 ______ \r\n end";

static int fuzz_roundtrip(struct bpe *b) {
    struct bpe_state *st = bpe_state_create(b);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t len = 0, cap = 0;
        bpe_encode(st, fuzz_text, sizeof fuzz_text - 1, special, &ids, &len, &cap);
        char *out = malloc(64 * sizeof fuzz_text), *p = out;
        size_t room = 64 * sizeof fuzz_text;
        for (size_t i = 0; i < len; i++) {
            const uint8_t *bytes;
            size_t n;
            if (bpe_token_bytes(b, ids[i], &bytes, &n) != 0) abort(); /* an id the tokenizer does not have */
            if (n > room) abort();
            memcpy(p, bytes, n);
            p += n, room -= n;
        }
        if ((size_t)(p - out) != sizeof fuzz_text - 1 || memcmp(out, fuzz_text, sizeof fuzz_text - 1)) {
            fprintf(stderr, "ERROR: encode/decode round trip changed the text (special %d)\n", special);
            abort();
        }
        free(out);
        free(ids);
    }
    bpe_state_free(st);
    return 0;
}
