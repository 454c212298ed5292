/* The tokenizer selector: "bytes", "hf:FILE" or "tiktoken:FILE". */
#include "data/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "data/tokenizer_bpe.h"
#include "data/tokenizer_bytes.h"

struct tokenizer {
    char *spec;
    struct bpe *bpe;        /* NULL: bytes */
    int64_t eod;
    char *specials;         /* tiktoken: the special-token set ("llama3.1", "llama3.0", "none") */
    char *regex;            /* tiktoken: --tiktoken-regex, NULL for Llama 3's */
};

struct tokenizer_state {
    const struct tokenizer *t;
    struct bpe_state *bs;
};

/* The usual end-of-document tokens of the vocabularies users bring. */
static const char *const eod_names[] = {"<|end_of_text|>", "<|endoftext|>", "</s>",
                                        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<eos>",
                                        NULL};

static int resolve_eod(struct tokenizer *t, const char *eod, char *err, size_t errsz) {
    if (!eod) {
        t->eod = -1;
        for (int i = 0; eod_names[i] && t->eod < 0; i++) t->eod = bpe_special_id(t->bpe, eod_names[i]);
        return 0;
    }
    char *end;
    long v = strtol(eod, &end, 10);
    if (*eod && !*end) t->eod = v;
    else t->eod = bpe_special_id(t->bpe, eod);
    if (t->eod < 0 || t->eod >= bpe_vocab_size(t->bpe)) {
        snprintf(err, errsz, "--eod '%s' is not a special token or id of %s", eod, t->spec);
        return -1;
    }
    return 0;
}

struct tokenizer *tokenizer_open(const char *spec, const struct tokenizer_opts *o, char *err, size_t errsz) {
    struct tokenizer_opts none = {0};
    if (!o) o = &none;
    struct tokenizer *t = xcalloc(1, sizeof *t);
    t->spec = xstrdup(spec);
    if (!strcmp(spec, "bytes")) {
        t->eod = BYTES_EOD;
        if (o->eod && strcmp(o->eod, "256")) {
            snprintf(err, errsz, "the bytes tokenizer's EOD is 256 (--eod %s)", o->eod);
            tokenizer_close(t);
            return NULL;
        }
        return t;
    }
    if (!strncmp(spec, "hf:", 3) && spec[3]) {
        t->bpe = bpe_load_hf(spec + 3);
    } else if (!strncmp(spec, "tiktoken:", 9) && spec[9]) {
        const char *sp = o->tiktoken_specials ? o->tiktoken_specials : "llama3.1";
        if (!strcmp(sp, "llama3")) sp = "llama3.1";  /* the current Llama 3 names */
        if (strcmp(sp, "llama3.1") && strcmp(sp, "llama3.0") && strcmp(sp, "none")) {
            snprintf(err, errsz, "unknown --tiktoken-specials '%s' (llama3.1, llama3.0 or none)", sp);
            tokenizer_close(t);
            return NULL;
        }
        t->specials = xstrdup(sp);
        t->regex = o->tiktoken_regex ? xstrdup(o->tiktoken_regex) : NULL;
        struct bpe_special specials[BPE_LLAMA3_SPECIALS];
        char (*names)[40] = xmalloc(BPE_LLAMA3_SPECIALS * sizeof *names);
        bpe_llama3_specials_version(strcmp(sp, "llama3.0") ? 31 : 30, 0, specials, names);
        for (int i = 0; i < BPE_LLAMA3_SPECIALS; i++) specials[i].id = -1;  /* right after the ranks */
        t->bpe = bpe_load_tiktoken(spec + 9, o->tiktoken_regex, specials, strcmp(sp, "none") ? BPE_LLAMA3_SPECIALS : 0);
        free(names);
    } else {
        snprintf(err, errsz, "unknown tokenizer '%s' (bytes, hf:FILE or tiktoken:FILE)", spec);
        tokenizer_close(t);
        return NULL;
    }
    if (resolve_eod(t, o->eod, err, errsz)) {
        tokenizer_close(t);
        return NULL;
    }
    return t;
}

void tokenizer_close(struct tokenizer *t) {
    if (!t) return;
    bpe_free(t->bpe);
    free(t->spec);
    free(t->specials);
    free(t->regex);
    free(t);
}

int tokenizer_vocab_size(const struct tokenizer *t) { return t->bpe ? bpe_vocab_size(t->bpe) : BYTES_VOCAB_SIZE; }
int64_t tokenizer_eod(const struct tokenizer *t) { return t->eod; }
const char *tokenizer_spec(const struct tokenizer *t) { return t->spec; }
const char *tokenizer_tiktoken_specials(const struct tokenizer *t) { return t->specials; }
const char *tokenizer_tiktoken_regex(const struct tokenizer *t) { return t->regex; }

/* The usual beginning-of-sequence tokens, as for EOD above. */
static const char *const bos_names[] = {"<|begin_of_text|>", "<s>",
                                        "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                        "<bos>", "<|startoftext|>", NULL};

int64_t tokenizer_bos(const struct tokenizer *t) {
    int64_t id = -1;
    for (int i = 0; t->bpe && bos_names[i] && id < 0; i++) id = bpe_special_id(t->bpe, bos_names[i]);
    return id;
}

int tokenizer_special_count(const struct tokenizer *t) { return t->bpe ? bpe_special_count(t->bpe) : 0; }

int tokenizer_special_at(const struct tokenizer *t, int i, const char **text, int *id) {
    return t->bpe ? bpe_special_at(t->bpe, i, text, id) : -1;
}

const struct bpe *tokenizer_bpe(const struct tokenizer *t) { return t->bpe; }

struct tokenizer_state *tokenizer_state_create(const struct tokenizer *t) {
    struct tokenizer_state *st = xcalloc(1, sizeof *st);
    st->t = t;
    if (t->bpe) st->bs = bpe_state_create(t->bpe);
    return st;
}

void tokenizer_state_free(struct tokenizer_state *st) {
    if (!st) return;
    bpe_state_free(st->bs);
    free(st);
}

void tokenizer_encode(struct tokenizer_state *st, const char *text, size_t n, int match_special, int32_t **out,
                      size_t *len, size_t *cap) {
    tokenizer_encode_cont(st, text, n, match_special, 0, out, len, cap);
}

size_t tokenizer_safe_cut(struct tokenizer_state *st, const char *text, size_t n, int match_special) {
    return st->bs ? bpe_safe_cut(st->bs, text, n, match_special) : n;
}

void tokenizer_encode_cont(struct tokenizer_state *st, const char *text, size_t n, int match_special, int continuation,
                           int32_t **out, size_t *len, size_t *cap) {
    if (st->bs) return bpe_encode_cont(st->bs, text, n, match_special, continuation, out, len, cap);
    if (*len + n > *cap) {
        *cap = 2 * (*len + n) + 1024;
        *out = xrealloc(*out, *cap * sizeof **out);
    }
    *len += tokenizer_bytes_encode(text, n, *out + *len);
}

static void append(char **out, size_t *len, size_t *cap, const void *p, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = 2 * (*len + n) + 1024;
        *out = xrealloc(*out, *cap);
    }
    memcpy(*out + *len, p, n);
    *len += n;
    (*out)[*len] = 0;
}

size_t tokenizer_decode(const struct tokenizer *t, const int32_t *tok, size_t n, char **out, size_t *len,
                        size_t *cap) {
    size_t unknown = 0;
    append(out, len, cap, "", 0);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b;
        size_t bl;
        uint8_t byte;
        if (!t->bpe && tok[i] >= 0 && tok[i] < 256) {
            byte = (uint8_t)tok[i];
            b = &byte;
            bl = 1;
        } else if (!t->bpe || bpe_token_bytes(t->bpe, tok[i], &b, &bl)) {
            char tmp[32];
            int k = snprintf(tmp, sizeof tmp, !t->bpe && tok[i] == BYTES_EOD ? "<eod>" : "<?%d>", tok[i]);
            append(out, len, cap, tmp, (size_t)k);
            unknown += t->bpe || tok[i] != BYTES_EOD;
            continue;
        }
        append(out, len, cap, b, bl);
    }
    return unknown;
}
