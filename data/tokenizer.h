/* One interface over the tokenizers `mtrain data` accepts:
 *   bytes           byte = token, EOD 256, vocab 257 (data/tokenizer_bytes.h)
 *   hf:FILE         Hugging Face tokenizer.json, byte-level BPE
 *   tiktoken:FILE   tiktoken rank file (regex and specials from the options)
 * A struct tokenizer is read-only after opening and shared by threads; each
 * thread encodes through its own struct tokenizer_state. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct tokenizer_state;

struct tokenizer_opts {
    const char *tiktoken_regex;     /* NULL: the Llama 3 pattern */
    const char *tiktoken_specials;  /* "llama3.1" (default; "llama3" is the same), "llama3.0" or "none" */
    const char *eod;                /* EOD token text or numeric id; NULL: the tokenizer's usual one */
};

/* Parse SPEC and load the files. A bad spec returns NULL with a message in
 * err (a usage error); a bad file prints one line naming it and exits 1. */
struct tokenizer *tokenizer_open(const char *spec, const struct tokenizer_opts *o, char *err, size_t errsz);
void tokenizer_close(struct tokenizer *t);
int tokenizer_vocab_size(const struct tokenizer *t);
/* End-of-document id, or -1 when the tokenizer has none. */
int64_t tokenizer_eod(const struct tokenizer *t);
const char *tokenizer_spec(const struct tokenizer *t);
/* tiktoken: the special-token set and the --tiktoken-regex (NULL otherwise,
 * and the regex NULL for Llama 3's). */
const char *tokenizer_tiktoken_specials(const struct tokenizer *t);
const char *tokenizer_tiktoken_regex(const struct tokenizer *t);
/* Beginning-of-sequence id (<|begin_of_text|>, <s>, ...), or -1. */
int64_t tokenizer_bos(const struct tokenizer *t);
/* The special (added) tokens, in id order: 0 for bytes. */
int tokenizer_special_count(const struct tokenizer *t);
int tokenizer_special_at(const struct tokenizer *t, int i, const char **text, int *id);
/* The BPE tables (NULL for bytes), for writers of other formats. */
struct bpe;
const struct bpe *tokenizer_bpe(const struct tokenizer *t);

struct tokenizer_state *tokenizer_state_create(const struct tokenizer *t);
void tokenizer_state_free(struct tokenizer_state *st);
/* Append the tokens of text to *out (grown as needed; *len entries used). */
void tokenizer_encode(struct tokenizer_state *st, const char *text, size_t n, int match_special, int32_t **out,
                      size_t *len, size_t *cap);
/* Streaming a long text: tokenizer_safe_cut gives a place in text[0, n) (the
 * text's start, or a previous cut) where it can be cut so that encoding the
 * parts one after another, the later ones with continuation = 1, gives
 * exactly the tokens of the whole; 0 when there is none yet (read more). */
size_t tokenizer_safe_cut(struct tokenizer_state *st, const char *text, size_t n, int match_special);
void tokenizer_encode_cont(struct tokenizer_state *st, const char *text, size_t n, int match_special, int continuation,
                           int32_t **out, size_t *len, size_t *cap);
/* Append the bytes of tokens to *out (grown as needed). Ids the tokenizer
 * does not know are written as "<?ID>"; returns how many there were. */
size_t tokenizer_decode(const struct tokenizer *t, const int32_t *tok, size_t n, char **out, size_t *len,
                        size_t *cap);
