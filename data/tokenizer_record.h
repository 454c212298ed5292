/* The tokenizer record of a dataset: which tokenizer made its tokens (kind,
 * file, the file's XXH3, special tokens, BOS/EOS/EOD), written by `mtrain
 * data build` into index.mtd (format version 2, docs/formats.md) as a JSON
 * object, so training can size the vocabulary (`model.vocab_size: auto`)
 * and `mtrain convert --hf` can ship the tokenizer with the model. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/tokenizer.h"

struct tokenizer_record {
    char kind[16];            /* bytes | hf | tiktoken | unknown */
    char spec[4096];          /* as given to data build ("" when unknown) */
    char file[4096];          /* absolute path of the tokenizer file ("" for bytes / unknown) */
    char file_xxh3[17];       /* 16 hex digits of the file's XXH3-64 ("" when no file) */
    int64_t file_bytes;
    char specials[16];        /* tiktoken: llama3.1 | llama3.0 | none */
    char *regex;              /* tiktoken: a custom pre-tokenizer regex, or NULL */
    int vocab_size;
    int64_t bos_id, eos_id;   /* -1: none */
    int64_t eod_id;           /* the token ending each document, -1: none appended */
    char source[4200];        /* what the tokens came from, for import ("megatron:PREFIX") */
};

/* The record of tokenizer t as a JSON text (malloc'd): reads t's file again
 * for its checksum; dies naming the file if it cannot. */
char *tokenizer_record_json(const struct tokenizer *t, int append_eod, int match_special);
/* A record that knows no tokenizer (an import): vocabulary, EOD, source. */
char *tokenizer_record_unknown_json(const char *source, int vocab_size, int64_t eod_id);

/* Read DIR/index.mtd's record without opening the whole dataset: 1 and
 * *json (malloc'd) when there is one, 0 for a dataset without (format
 * version 1), -1 with a message in err when the index is missing or bad.
 * version (may be NULL) gets the index's format version. */
int tokenizer_record_read(const char *dir, char **json, int *version, char *err, size_t errsz);
/* Parse a record's JSON; -1 with a message in err. Free with _free. */
int tokenizer_record_parse(const char *json, struct tokenizer_record *rec, char *err, size_t errsz);
void tokenizer_record_free(struct tokenizer_record *rec);
/* Both at once, for DIR: 1 found, 0 none, -1 error. */
int tokenizer_record_load(const char *dir, struct tokenizer_record *rec, char *err, size_t errsz);

/* Open the tokenizer a record names. The file must still hash to the
 * recorded XXH3 (a changed file would give other tokens): otherwise NULL
 * with a message in err, as for a missing file or an unknown kind. */
struct tokenizer *tokenizer_open_record(const struct tokenizer_record *rec, char *err, size_t errsz);

/* The record for `mtrain data inspect`: a few indented lines. */
void tokenizer_record_print(const struct tokenizer_record *rec, FILE *out);

/* model.vocab_size: auto -> the vocabulary recorded by the recipe's
 * dataset(s) (data.path, or every data.blend entry, which must agree).
 * Exact, not rounded (tp must divide it). Prints one error line naming the
 * dataset and returns -1 when a dataset has no record or they disagree. */
struct recipe;
int tokenizer_record_resolve_vocab(struct recipe *r);

/* XXH3-64 of a file as 16 hex digits, streamed; -1 with errno set. */
int tokenizer_file_xxh3(const char *path, char hex[17], int64_t *bytes);
