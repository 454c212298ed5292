/* Tokenizing text inputs into a dataset writer with N worker threads.
 * The main thread reads inputs and cuts them into chunks of whole documents
 * (or whole JSON lines); workers parse and tokenize chunks; the main thread
 * hands finished chunks to the writer strictly in input order, so the output
 * is byte-identical for any number of workers. */
#pragma once
#include <stdint.h>

#include "data/shard_writer.h"
#include "data/tokenizer.h"

struct text_build_opts {
    const struct tokenizer *tok;
    const char *json_key;    /* JSON-lines inputs: the string field holding a document */
    int jsonl_all;           /* every input is JSON lines (else only *.jsonl[.zst]) */
    int split_lines;         /* plain text: one document per non-empty line */
    int append_eod;
    int match_special;       /* special tokens in the text become their ids */
    int workers;             /* >= 1 */
    int progress;            /* a progress line on stderr at most once a second */
};

struct text_build_stats {
    int64_t docs, tokens;
    double text_bytes;       /* decompressed input bytes */
};

/* Returns 0, or -1 with a one-line message (file and line/offset) in err;
 * on error the caller aborts the writer. */
int text_build(struct shard_writer *w, const char *const *inputs, int ninputs, const struct text_build_opts *o,
               struct text_build_stats *st, char *err, size_t errsz);
