#include "data/tokenizer_bytes.h"

size_t tokenizer_bytes_encode(const char *text, size_t n, int32_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = (unsigned char)text[i];
    return n;
}

size_t tokenizer_bytes_decode(const int32_t *tokens, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= 0 && tokens[i] < 256) out[k++] = (char)tokens[i];
    return k;
}
