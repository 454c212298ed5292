/* Byte-level BPE tokenizer (GPT-2 / Llama 3 / DeepSeek style), loaded from a
 * Hugging Face tokenizer.json or a tiktoken rank file. Text is cut into
 * special tokens and the rest; the rest is split by the pre-tokenizer
 * regexes (PCRE2, JIT) into pieces, and each piece's bytes are merged by
 * rank. Formats and the exact semantics are in docs/data.md.
 *
 * A struct bpe is immutable after loading and may be shared by threads; each
 * thread encodes with its own struct bpe_state (PCRE2 match data, scratch). */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct bpe;
struct bpe_state;

/* Largest token id (or tiktoken rank) a file may use: real vocabularies are
 * below 2^21; a larger id is taken as a damaged file and rejected. */
#define BPE_MAX_ID (1 << 24)

struct bpe_special {
    const char *text;   /* the literal text that is matched and decoded */
    int id;
};

/* Load tokenizer.json (model.type BPE, byte-level). Any problem prints one
 * line naming the file (and the JSON line:column or the entry) and exits 1. */
struct bpe *bpe_load_hf(const char *path);
/* Load a tiktoken rank file ("base64 rank" per line). regex NULL means the
 * Llama 3 pattern; specials are matched literally when encoding with
 * match_special. A special with id -1 gets id ranks + its index in the list
 * (Llama 3 numbers its specials right after the ranks). */
struct bpe *bpe_load_tiktoken(const char *path, const char *regex, const struct bpe_special *specials,
                              int nspecials);
void bpe_free(struct bpe *b);

/* Ids are 0..vocab-1 (some ids may be unused). */
int bpe_vocab_size(const struct bpe *b);
/* Id of the special (added) token with this text, or -1. */
int bpe_special_id(const struct bpe *b, const char *text);
/* The special (added) tokens, i in 0..count-1 (longest first); -1 if out of range. */
int bpe_special_count(const struct bpe *b);
int bpe_special_at(const struct bpe *b, int i, const char **text, int *id);
/* Loaded from a tiktoken rank file (token id = rank). */
int bpe_is_tiktoken(const struct bpe *b);
/* Every merge: (left, right) -> id at rank (a tokenizer.json's merge
 * position; for tiktoken the merged token's rank, one entry per way to cut
 * it in two). *out is malloc'd, in no particular order; returns the count. */
struct bpe_pair { int32_t left, right; uint32_t rank; int32_t id; };
size_t bpe_pairs(const struct bpe *b, struct bpe_pair **out);
/* The bytes a token decodes to; returns 0, or -1 for an unused/out of range id. */
int bpe_token_bytes(const struct bpe *b, int id, const uint8_t **bytes, size_t *len);

struct bpe_state *bpe_state_create(const struct bpe *b);
void bpe_state_free(struct bpe_state *st);

/* Append the tokens of text[0..n) to *out (growable array of *cap entries,
 * *len used). match_special: find special tokens in the text first;
 * otherwise their text is encoded like any other text. */
void bpe_encode(struct bpe_state *st, const char *text, size_t n, int match_special, int32_t **out, size_t *len,
                size_t *cap);
/* The same, for a text that continues one encoded before (continuation = 1:
 * no add_prefix_space at its start). */
void bpe_encode_cont(struct bpe_state *st, const char *text, size_t n, int match_special, int continuation,
                     int32_t **out, size_t *len, size_t *cap);
/* Where text[0, n) (a text's start or a previous cut) can be cut so that
 * encoding the two sides separately gives the tokens of the whole: the start
 * of its second-to-last level-0 pre-tokenizer piece, kept clear of special
 * tokens (and of one cut off at the end). 0: no such place yet. */
size_t bpe_safe_cut(struct bpe_state *st, const char *text, size_t n, int match_special);

/* The Llama 3 pre-tokenizer regex (also tiktoken's cl100k-style pattern). */
extern const char bpe_llama3_regex[];
/* Llama 3's 256 special tokens for ids base+0 .. base+255 (128000.. for the
 * real vocabulary): fills out[256], whose texts point into names. version 31
 * names them as Llama 3.1-3.3 do, 30 as Llama 3.0 (data/tokenizer_llama3.c);
 * bpe_llama3_specials is version 31. */
#define BPE_LLAMA3_SPECIALS 256
void bpe_llama3_specials_version(int version, int base, struct bpe_special out[BPE_LLAMA3_SPECIALS],
                                 char names[BPE_LLAMA3_SPECIALS][40]);
void bpe_llama3_specials(int base, struct bpe_special out[BPE_LLAMA3_SPECIALS], char names[BPE_LLAMA3_SPECIALS][40]);
