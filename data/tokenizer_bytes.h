/* The byte tokenizer: token = byte value 0..255, EOD = 256, vocab 257.
 * Needs no vocabulary file, so tiny runs and tests work on any text. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define BYTES_VOCAB_SIZE 257
#define BYTES_EOD 256

/* Writes n tokens to out (one per byte); returns n. */
size_t tokenizer_bytes_encode(const char *text, size_t n, int32_t *out);
/* Writes the bytes of tokens 0..255 to out, skipping EOD and anything out
 * of range; returns the number of bytes written (at most n). */
size_t tokenizer_bytes_decode(const int32_t *tokens, size_t n, char *out);
