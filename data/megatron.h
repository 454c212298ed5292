/* Megatron-LM indexed datasets (PREFIX.idx + PREFIX.bin, format in
 * docs/formats.md): open, check, and read documents token by token, so
 * `mtrain data import` can copy them into a dataset. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct megatron;

/* Maps both files and checks the index against itself and the .bin size.
 * Returns NULL with one line (file, byte offset, what is wrong) in err. */
struct megatron *megatron_open(const char *prefix, char *err, size_t errsz);
void megatron_close(struct megatron *m);
int64_t megatron_num_docs(const struct megatron *m);
int64_t megatron_num_tokens(const struct megatron *m);
/* dtype name ("uint16", "int32", ...) and bytes per token */
const char *megatron_dtype_name(const struct megatron *m);
int megatron_itemsize(const struct megatron *m);
/* Tokens of document d (all its sequences, in order) as int32 into *out
 * (grown as needed); returns the count, or -1 with err naming the .bin
 * offset of a value that is not a token id (negative, fractional, >= 2^31).
 * Memory grows with the document: importers stream with the cursor below. */
int64_t megatron_read_doc(const struct megatron *m, int64_t d, int32_t **out, size_t *cap, char *err, size_t errsz);
/* Reading document d in pieces of at most cap tokens: doc_next returns the
 * count (0 at the document's end) or -1 with err as above. */
struct megatron_cursor {
    uint64_t seq, seq_end;  /* the sequence being read, one past the document's last */
    int32_t pos;            /* tokens of it already read */
};
void megatron_doc_begin(const struct megatron *m, int64_t d, struct megatron_cursor *c);
int64_t megatron_doc_next(const struct megatron *m, struct megatron_cursor *c, int32_t *out, size_t cap, char *err,
                          size_t errsz);
