/* Reading byte-level BPE files into data/tokenizer_bpe.c's tables: a
 * Hugging Face tokenizer.json (jansson) and a tiktoken rank file. */
#include "data/tokenizer_bpe_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"

/* ---- tokenizer.json ----------------------------------------------------------- */

/* GPT-2's byte <-> unicode alphabet: printable Latin-1 bytes stand for
 * themselves, the other 68 bytes for U+0100 + n in byte order. */
static void byte_alphabet(int cp_to_byte[324]) {
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    int n = 0;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
        cp_to_byte[printable ? c : 256 + n++] = c;
    }
}

/* Decode one UTF-8 sequence; returns its length, or 0 if malformed. */
static int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (s[0] < 0x80) return *cp = s[0], 1;
    int len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (!len || (size_t)len > n) return 0;
    uint32_t v = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* A vocab string in the byte alphabet -> raw bytes (out holds strlen(s)).
 * Returns the byte count, or -1 if a character is outside the alphabet. */
static long alphabet_to_bytes(const char *s, const int cp_to_byte[324], uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s), k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = utf8_decode(p + i, n - i, &cp);
        if (!len || cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[k++] = (uint8_t)cp_to_byte[cp];
        i += (size_t)len;
    }
    return (long)k;
}

static const char *json_str(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* The pre-tokenizer: Split(Regex, Isolated) and ByteLevel steps, alone or in
 * a Sequence, become the list of regexes each piece is split by in turn. */
static void load_pretokenizer(struct bpe *b, json_t *pt, int depth) {
    if (!pt || json_is_null(pt)) return;
    const char *type = json_str(pt, "type");
    if (!type) die("%s: pre_tokenizer without a type", b->path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pt, "pretokenizers"), *item;
        size_t i;
        if (!json_is_array(list) || depth > 2) die("%s: pre_tokenizer Sequence without a pretokenizers list", b->path);
        json_array_foreach(list, i, item) load_pretokenizer(b, item, depth + 1);
    } else if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(pt, "pattern");
        const char *re = json_str(pat, "Regex"), *lit = json_str(pat, "String");
        const char *behavior = json_str(pt, "behavior");
        if (!re && !lit) die("%s: Split pre_tokenizer without a Regex or String pattern", b->path);
        if (!behavior || strcmp(behavior, "Isolated"))
            die("%s: Split behavior '%s' is not supported (only Isolated)", b->path, behavior ? behavior : "?");
        if (json_is_true(json_object_get(pt, "invert"))) die("%s: inverted Split is not supported", b->path);
        if (lit) {
            /* a literal pattern: quote it for PCRE2 */
            size_t n = strlen(lit);
            char *q = xmalloc(n + 5);
            snprintf(q, n + 5, "\\Q%s\\E", lit);
            bpe_add_regex(b, q, "Split");
            free(q);
        } else {
            bpe_add_regex(b, re, "Split");
        }
    } else if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(pt, "add_prefix_space"))) {
            if (b->nre) die("%s: ByteLevel add_prefix_space after a Split is not supported", b->path);
            b->add_prefix_space = 1;
        }
        json_t *use = json_object_get(pt, "use_regex");
        if (!use || json_is_true(use)) bpe_add_regex(b, bpe_gpt2_regex, "ByteLevel");
    } else {
        die("%s: pre_tokenizer type '%s' is not supported (Split, ByteLevel, Sequence)", b->path, type);
    }
}

static void load_added(struct bpe *b, json_t *root) {
    json_t *added = json_object_get(root, "added_tokens"), *t;
    size_t i;
    if (added && !json_is_array(added)) die("%s: added_tokens is not a list", b->path);
    json_array_foreach(added, i, t) {
        json_t *idv = json_object_get(t, "id");
        const char *content = json_str(t, "content");
        if (!json_is_integer(idv) || !content || json_integer_value(idv) < 0)
            die("%s: added_tokens[%zu]: needs an integer id and a content string", b->path, i);
        if (json_integer_value(idv) > BPE_MAX_ID)
            die("%s: added_tokens[%zu]: id %lld is above the largest supported token id %d", b->path, i,
                (long long)json_integer_value(idv), BPE_MAX_ID);
        int id = (int)json_integer_value(idv);
        bpe_add_special(b, content, id);
        /* an added token may also sit in model.vocab (trained files): the
         * added token's literal text is what it decodes to */
        bpe_grow_ids(b, id);
        b->used[id] = 0;
        bpe_set_token(b, id, (const uint8_t *)content, strlen(content));
    }
}

static void load_vocab(struct bpe *b, json_t *vocab, const int cp_to_byte[324]) {
    const char *key;
    json_t *v;
    uint8_t *buf = NULL;
    size_t cap = 0;
    int nsp = b->nsp;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            die("%s: model.vocab['%s']: id is not a non-negative integer", b->path, key);
        if (json_integer_value(v) > BPE_MAX_ID)
            die("%s: model.vocab['%s']: id %lld is above the largest supported token id %d", b->path, key,
                (long long)json_integer_value(v), BPE_MAX_ID);
        int id = (int)json_integer_value(v);
        int special = 0;
        for (int i = 0; i < nsp && !special; i++) special = b->sp[i].id == id;
        if (special) continue;
        size_t n = strlen(key);
        if (n + 1 > cap) buf = xrealloc(buf, cap = 2 * n + 16);
        long len = alphabet_to_bytes(key, cp_to_byte, buf);
        if (len <= 0) die("%s: model.vocab['%s']: not in the byte-level alphabet", b->path, key);
        if (bpe_set_token(b, id, buf, (size_t)len)) die("%s: model.vocab: id %d used twice", b->path, id);
    }
    free(buf);
}

/* One merge, "a b" or ["a", "b"], to the (left, right) -> merged pair. */
static void load_merge(struct bpe *b, json_t *m, size_t rank, const int cp_to_byte[324], uint8_t *buf,
                       size_t bufcap) {
    const char *l = NULL, *r = NULL;
    char *copy = NULL;
    if (json_is_string(m)) {
        copy = xstrdup(json_string_value(m));
        char *space = strchr(copy, ' ');
        if (!space || strchr(space + 1, ' ')) die("%s: model.merges[%zu]: expected \"a b\"", b->path, rank);
        *space = 0;
        l = copy;
        r = space + 1;
    } else if (json_is_array(m) && json_array_size(m) == 2) {
        l = json_string_value(json_array_get(m, 0));
        r = json_string_value(json_array_get(m, 1));
    }
    if (!l || !r) die("%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", b->path, rank);
    if (strlen(l) + strlen(r) > bufcap) die("%s: model.merges[%zu]: longer than any token", b->path, rank);
    long nl = alphabet_to_bytes(l, cp_to_byte, buf);
    long nr = nl > 0 ? alphabet_to_bytes(r, cp_to_byte, buf + nl) : -1;
    if (nl <= 0 || nr <= 0) die("%s: model.merges[%zu]: not in the byte-level alphabet", b->path, rank);
    int a = bpe_vocab_find(b, buf, (size_t)nl), c = bpe_vocab_find(b, buf + nl, (size_t)nr);
    int ab = bpe_vocab_find(b, buf, (size_t)(nl + nr));
    if (a < 0 || c < 0 || ab < 0)
        die("%s: model.merges[%zu]: '%s' + '%s' or their merge is not in model.vocab", b->path, rank, l, r);
    bpe_pair_add(b, a, c, (uint32_t)rank, ab);
    free(copy);
}

struct bpe *bpe_load_hf(const char *path) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) die("%s:%d:%d: cannot load tokenizer.json: %s", path, err.line, err.column, err.text);
    struct bpe *b = bpe_alloc(path);
    json_t *model = json_object_get(root, "model");
    const char *type = json_str(model, "type");
    if (!type || strcmp(type, "BPE")) die("%s: model.type is '%s'; only byte-level BPE is supported", path, type ? type : "?");
    if (json_is_true(json_object_get(model, "byte_fallback")))
        die("%s: byte_fallback BPE (SentencePiece style) is not supported", path);
    const char *cont = json_str(model, "continuing_subword_prefix"), *suf = json_str(model, "end_of_word_suffix");
    if ((cont && *cont) || (suf && *suf)) die("%s: subword prefixes/suffixes are not supported", path);
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) die("%s: normalizers are not supported (normalizer must be null)", path);
    b->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    load_pretokenizer(b, json_object_get(root, "pre_tokenizer"), 0);
    int cp_to_byte[324];
    byte_alphabet(cp_to_byte);
    load_added(b, root);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges"), *m;
    if (!json_is_object(vocab) || !json_is_array(merges)) die("%s: model needs a vocab object and a merges list", path);
    load_vocab(b, vocab, cp_to_byte);
    /* index the vocabulary first: merges are resolved through it */
    bpe_finish_load(b);
    size_t i, maxlen = 0;
    for (int id = 0; id < b->vocab; id++)
        if (b->used[id] && b->tok_len[id] > maxlen) maxlen = b->tok_len[id];
    /* a merge's two halves make one token: at most 2 UTF-8 bytes per token byte */
    size_t bufcap = 2 * maxlen + 16;
    uint8_t *buf = xmalloc(bufcap);
    json_array_foreach(merges, i, m) load_merge(b, m, i, cp_to_byte, buf, bufcap);
    free(buf);
    json_decref(root);
    return b;
}

/* ---- tiktoken ------------------------------------------------------------------ */

static int b64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decode standard base64 with padding; returns the length or -1. */
static long b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n % 4) return -1;
    long k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int j = 0; j < 4; j++) {
            v[j] = s[i + j] == '=' && i + 4 == n && j >= 2 ? (pad++, 0) : b64_value((unsigned char)s[i + j]);
            if (v[j] < 0) return -1;
        }
        if (pad == 1 && s[i + 2] == '=') return -1;
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[k++] = (uint8_t)(w >> 16);
        if (pad < 2) out[k++] = (uint8_t)(w >> 8);
        if (pad < 1) out[k++] = (uint8_t)w;
    }
    return k;
}

/* Every way to cut token id into two tokens is a pair ranked by id's rank. */
static void add_tiktoken_pairs(struct bpe *b, int nranks) {
    for (int id = 0; id < nranks; id++) {
        if (!b->used[id] || b->tok_len[id] < 2) continue;
        const uint8_t *p = bpe_tok_bytes(b, id);
        size_t n = b->tok_len[id];
        for (size_t k = 1; k < n; k++) {
            int l = bpe_vocab_find(b, p, k), r = l >= 0 ? bpe_vocab_find(b, p + k, n - k) : -1;
            if (r >= 0) bpe_pair_add(b, l, r, (uint32_t)id, id);
        }
    }
}

struct bpe *bpe_load_tiktoken(const char *path, const char *regex, const struct bpe_special *specials,
                              int nspecials) {
    size_t size = 0;
    errno = 0;
    char *text = read_file(path, &size);
    if (!text) die("%s: cannot read tiktoken file: %s", path, errno ? strerror(errno) : "read error");
    struct bpe *b = bpe_alloc(path);
    b->ignore_merges = 1;
    b->tiktoken = 1;
    uint8_t buf[1024];
    int nranks = 0, line = 0;
    for (char *p = text, *end = text + size; p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) nl = end;
        char *sp = memchr(p, ' ', (size_t)(nl - p));
        if (nl == p || (nl == p + 1 && *p == '\r')) {  /* blank line */
            p = nl + 1;
            continue;
        }
        char *stop;
        long rank = sp ? strtol(sp + 1, &stop, 10) : -1;
        if (!sp || rank < 0 || (*stop && *stop != '\n' && *stop != '\r') || stop == sp + 1)
            die("%s:%d: expected 'BASE64 RANK'", path, line + 1);
        if (rank > BPE_MAX_ID)
            die("%s:%d: rank %ld is above the largest supported token id %d", path, line + 1, rank, BPE_MAX_ID);
        if ((size_t)(sp - p) > 4 * sizeof buf / 3)
            die("%s:%d: token longer than %zu bytes", path, line + 1, sizeof buf);
        long n = b64_decode(p, (size_t)(sp - p), buf);
        if (n <= 0) die("%s:%d: bad base64 token", path, line + 1);
        if (bpe_set_token(b, (int)rank, buf, (size_t)n)) die("%s:%d: rank %ld used twice", path, line + 1, rank);
        if (rank + 1 > nranks) nranks = (int)rank + 1;
        p = nl + 1;
    }
    free(text);
    for (int i = 0; i < nspecials; i++) {
        long long id = specials[i].id < 0 ? (long long)nranks + i : specials[i].id;
        if (id > BPE_MAX_ID)
            die("%s: special token '%s' id %lld is above the largest supported token id %d", path, specials[i].text,
                id, BPE_MAX_ID);
        if (id < nranks)
            die("%s: special token '%s' id %lld collides with the ranks 0..%d", path, specials[i].text, id, nranks - 1);
        bpe_add_special(b, specials[i].text, (int)id);
        if (bpe_set_token(b, (int)id, (const uint8_t *)specials[i].text, strlen(specials[i].text)))
            die("%s: special token id %lld given twice", path, id);
    }
    bpe_add_regex(b, regex ? regex : bpe_llama3_regex, "tiktoken");
    bpe_finish_load(b);
    add_tiktoken_pairs(b, nranks);
    return b;
}

