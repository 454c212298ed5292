/* tokenizer.json / tokenizer_config.json writers (see the header). */
#include "data/tokenizer_export.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "data/tokenizer_bpe.h"
#include "data/tokenizer_bytes.h"

/* GPT-2's byte -> code point map: printable Latin-1 bytes stand for
 * themselves, the other 68 for U+0100 + n in byte order. */
static void byte_to_codepoint(int cp[256]) {
    int n = 0;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
        cp[c] = printable ? c : 256 + n++;
    }
}

/* Token bytes in the byte alphabet, as UTF-8 (code points < 0x800: 1-2 bytes each). */
static char *alphabet_string(const uint8_t *p, size_t n, const int cp[256]) {
    char *s = xmalloc(2 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int c = cp[p[i]];
        if (c < 0x80) {
            s[k++] = (char)c;
        } else {
            s[k++] = (char)(0xC0 | c >> 6);
            s[k++] = (char)(0x80 | (c & 0x3F));
        }
    }
    s[k] = 0;
    return s;
}

static void set(json_t *o, const char *key, json_t *v) {
    if (!v || json_object_set_new(o, key, v) != 0) die("out of memory building tokenizer.json");
}

static void append(json_t *a, json_t *v) {
    if (!v || json_array_append_new(a, v) != 0) die("out of memory building tokenizer.json");
}

static json_t *added_token(int id, const char *content) {
    json_t *o = json_object();
    set(o, "id", json_integer(id));
    set(o, "content", json_string(content));
    set(o, "single_word", json_false());
    set(o, "lstrip", json_false());
    set(o, "rstrip", json_false());
    set(o, "normalized", json_false());
    set(o, "special", json_true());
    return o;
}

static json_t *byte_level(int add_prefix_space, int trim_offsets, int use_regex) {
    json_t *o = json_object();
    set(o, "type", json_string("ByteLevel"));
    set(o, "add_prefix_space", json_boolean(add_prefix_space));
    set(o, "trim_offsets", json_boolean(trim_offsets));
    set(o, "use_regex", json_boolean(use_regex));
    return o;
}

/* Split(regex, Isolated) then ByteLevel without its own regex; NULL regex:
 * ByteLevel alone, which maps bytes to the alphabet and splits nothing. */
static json_t *pre_tokenizer(const char *regex) {
    if (!regex) return byte_level(0, 1, 0);
    json_t *split = json_object(), *pat = json_object(), *seq = json_object(), *list = json_array();
    set(pat, "Regex", json_string(regex));
    set(split, "type", json_string("Split"));
    set(split, "pattern", pat);
    set(split, "behavior", json_string("Isolated"));
    set(split, "invert", json_false());
    append(list, split);
    append(list, byte_level(0, 1, 0));
    set(seq, "type", json_string("Sequence"));
    set(seq, "pretokenizers", list);
    return seq;
}

static int cmp_pair(const void *x, const void *y) {
    const struct bpe_pair *a = x, *b = y;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    if (a->left != b->left) return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

/* The BPE model of a tiktoken tokenizer (vocab and merges from the ranks),
 * or of the bytes tokenizer (b NULL: 256 one-byte tokens, no merges). */
static json_t *bpe_model(const struct bpe *b, const uint8_t *is_special, const int cp[256]) {
    json_t *vocab = json_object(), *merges = json_array();
    int n = b ? bpe_vocab_size(b) : 256;
    for (int id = 0; id < n; id++) {
        const uint8_t *p;
        size_t len;
        uint8_t byte = (uint8_t)id;
        if (b && (is_special[id] || bpe_token_bytes(b, id, &p, &len))) continue;
        if (!b) p = &byte, len = 1;
        char *s = alphabet_string(p, len, cp);
        set(vocab, s, json_integer(id));
        free(s);
    }
    struct bpe_pair *pairs = NULL;
    size_t np = b ? bpe_pairs(b, &pairs) : 0;
    if (np) qsort(pairs, np, sizeof *pairs, cmp_pair); /* qsort(NULL, 0) is undefined */
    for (size_t i = 0; i < np; i++) {
        const uint8_t *lp, *rp;
        size_t ll, rl;
        if (bpe_token_bytes(b, pairs[i].left, &lp, &ll) || bpe_token_bytes(b, pairs[i].right, &rp, &rl))
            die("tokenizer export: merge %zu names an unknown token", i);
        char *l = alphabet_string(lp, ll, cp), *r = alphabet_string(rp, rl, cp);
        char *m = xmalloc(strlen(l) + strlen(r) + 2);
        sprintf(m, "%s %s", l, r);
        append(merges, json_string(m));
        free(l);
        free(r);
        free(m);
    }
    free(pairs);
    json_t *model = json_object();
    set(model, "type", json_string("BPE"));
    set(model, "dropout", json_null());
    set(model, "unk_token", json_null());
    set(model, "continuing_subword_prefix", json_null());
    set(model, "end_of_word_suffix", json_null());
    set(model, "fuse_unk", json_false());
    set(model, "byte_fallback", json_false());
    set(model, "ignore_merges", json_true());
    set(model, "vocab", vocab);
    set(model, "merges", merges);
    return model;
}

/* tokenizer.json for a tiktoken or bytes tokenizer. */
static json_t *converted(const struct tokenizer *t) {
    const struct bpe *b = tokenizer_bpe(t);
    int cp[256];
    byte_to_codepoint(cp);
    json_t *root = json_object(), *added = json_array();
    int n = b ? bpe_vocab_size(b) : BYTES_VOCAB_SIZE;
    uint8_t *is_special = xcalloc((size_t)n, 1);
    /* added tokens in id order, as tokenizers writes them */
    int ns = tokenizer_special_count(t);
    const char **text = xcalloc((size_t)n, sizeof *text);
    for (int i = 0; i < ns; i++) {
        const char *s;
        int id;
        tokenizer_special_at(t, i, &s, &id);
        text[id] = s;
        is_special[id] = 1;
    }
    if (!b) text[BYTES_EOD] = "<eod>";
    for (int id = 0; id < n; id++)
        if (text[id]) append(added, added_token(id, text[id]));
    free(text);
    set(root, "version", json_string("1.0"));
    set(root, "truncation", json_null());
    set(root, "padding", json_null());
    set(root, "added_tokens", added);
    set(root, "normalizer", json_null());
    const char *re = tokenizer_tiktoken_regex(t);
    set(root, "pre_tokenizer", pre_tokenizer(b ? (re ? re : bpe_llama3_regex) : NULL));
    set(root, "post_processor", byte_level(1, 0, 1));
    set(root, "decoder", byte_level(1, 1, 1));
    set(root, "model", bpe_model(b, is_special, cp));
    free(is_special);
    return root;
}

/* The text of a special token id, or NULL. */
static const char *special_text(const struct tokenizer *t, int64_t id) {
    if (id < 0) return NULL;
    if (!tokenizer_bpe(t)) return id == BYTES_EOD ? "<eod>" : NULL;
    for (int i = 0; i < tokenizer_special_count(t); i++) {
        const char *s;
        int sid;
        tokenizer_special_at(t, i, &s, &sid);
        if (sid == id) return s;
    }
    return NULL;
}

static int write_json(json_t *o, const char *path, char *err, size_t errsz) {
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) {
        snprintf(err, errsz, "%s: out of memory writing JSON", path);
        return -1;
    }
    write_file_atomic(path, text, strlen(text));
    free(text);
    return 0;
}

int tokenizer_export_hf(const struct tokenizer *t, const char *out_dir, int model_max_length, char *err,
                        size_t errsz) {
    char path[4400];
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    const char *spec = tokenizer_spec(t);
    if (!strncmp(spec, "hf:", 3)) {
        size_t n;
        errno = 0;
        char *text = read_file(spec + 3, &n);
        if (!text) {
            snprintf(err, errsz, "%s: cannot read: %s", spec + 3, errno ? strerror(errno) : "read error");
            return -1;
        }
        write_file_atomic(path, text, n);
        free(text);
    } else if (write_json(converted(t), path, err, errsz)) {
        return -1;
    }
    const char *bos = special_text(t, tokenizer_bos(t)), *eos = special_text(t, tokenizer_eod(t));
    json_t *c = json_object();
    set(c, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    set(c, "bos_token", bos ? json_string(bos) : json_null());
    set(c, "eos_token", eos ? json_string(eos) : json_null());
    set(c, "model_max_length", json_integer(model_max_length));
    set(c, "clean_up_tokenization_spaces", json_false());
    json_t *names = json_array();
    append(names, json_string("input_ids"));
    append(names, json_string("attention_mask"));
    set(c, "model_input_names", names);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out_dir);
    return write_json(c, path, err, errsz);
}
