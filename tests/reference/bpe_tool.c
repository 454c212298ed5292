/* Test driver for the tokenizers (tests/reference/tokenizer_ref.sh):
 *   bpe_tool encode SPEC FILE.jsonl [match]   one line of ids per {"text": ...} line
 *   bpe_tool roundtrip SPEC FILE.jsonl        decode(encode(x)) == x for every text,
 *                                             every prefix cut, and random UTF-8/bytes
 *   bpe_tool speed SPEC FILE                  MB/s encoding FILE's bytes on one thread
 * SPEC is what `mtrain data build --tokenizer` takes; a last argument
 * --tiktoken-specials=S chooses the tiktoken special-token set. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "data/tokenizer.h"

static json_t *load_lines(const char *path, size_t *n) {
    FILE *f = xfopen(path, "rb");
    json_t *all = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        json_error_t err;
        json_t *o = json_loadb(line, (size_t)got, 0, &err);
        if (!o || !json_is_string(json_object_get(o, "text"))) die("%s: bad JSON line: %s", path, err.text);
        json_array_append_new(all, json_incref(json_object_get(o, "text")));
        json_decref(o);
    }
    free(line);
    fclose(f);
    *n = json_array_size(all);
    return all;
}

static int roundtrip_one(struct tokenizer *t, struct tokenizer_state *st, const char *s, size_t n, int match) {
    int32_t *tok = NULL;
    size_t len = 0, cap = 0, dl = 0, dcap = 0;
    char *dec = NULL;
    tokenizer_encode(st, s, n, match, &tok, &len, &cap);
    tokenizer_decode(t, tok, len, &dec, &dl, &dcap);
    int ok = dl == n && !memcmp(dec, s, n);
    free(tok);
    free(dec);
    return ok;
}

static uint64_t rng(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Random valid UTF-8 across all planes, plus raw random bytes. */
static size_t random_text(uint64_t *s, char *out, int raw) {
    size_t n = 0;
    int chars = 1 + (int)(rng(s) % 200);
    for (int i = 0; i < chars; i++) {
        if (raw) {
            out[n++] = (char)rng(s);
            continue;
        }
        uint32_t cp, kind = (uint32_t)(rng(s) % 4);
        cp = kind == 0 ? (uint32_t)(rng(s) % 128) : kind == 1 ? 0x80 + (uint32_t)(rng(s) % 0x780)
             : kind == 2 ? 0x800 + (uint32_t)(rng(s) % 0xF800) : 0x10000 + (uint32_t)(rng(s) % 0x100000);
        if (cp >= 0xD800 && cp < 0xE000) cp = 0x20;
        if (cp < 0x80) out[n++] = (char)cp;
        else if (cp < 0x800) out[n++] = (char)(0xC0 | cp >> 6), out[n++] = (char)(0x80 | (cp & 63));
        else if (cp < 0x10000)
            out[n++] = (char)(0xE0 | cp >> 12), out[n++] = (char)(0x80 | (cp >> 6 & 63)), out[n++] = (char)(0x80 | (cp & 63));
        else
            out[n++] = (char)(0xF0 | cp >> 18), out[n++] = (char)(0x80 | (cp >> 12 & 63)),
            out[n++] = (char)(0x80 | (cp >> 6 & 63)), out[n++] = (char)(0x80 | (cp & 63));
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 4) die("usage: bpe_tool encode|roundtrip|speed SPEC FILE [match]");
    char err[256];
    struct tokenizer_opts opts = {0};
    const char *last = argv[argc - 1];
    if (!strncmp(last, "--tiktoken-specials=", 20)) {
        opts.tiktoken_specials = last + 20;
        argc--;
    }
    struct tokenizer *t = tokenizer_open(argv[2], &opts, err, sizeof err);
    if (!t) die("%s", err);
    struct tokenizer_state *st = tokenizer_state_create(t);
    int match = argc > 4 && !strcmp(argv[4], "match");
    if (!strcmp(argv[1], "speed")) {
        size_t n;
        char *text = read_file(argv[3], &n);
        if (!text) die("cannot read %s", argv[3]);
        int32_t *tok = NULL;
        size_t len = 0, cap = 0;
        double t0 = now_seconds();
        tokenizer_encode(st, text, n, 0, &tok, &len, &cap);
        double secs = now_seconds() - t0;
        printf("%.1f MB/s %zu bytes %zu tokens %.3f s\n", n / 1e6 / secs, n, len, secs);
        free(tok);
        free(text);
    } else if (!strcmp(argv[1], "encode")) {
        size_t n;
        json_t *texts = load_lines(argv[3], &n);
        int32_t *tok = NULL;
        size_t cap = 0;
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_array_get(texts, i);
            size_t len = 0;
            tokenizer_encode(st, json_string_value(s), json_string_length(s), match, &tok, &len, &cap);
            for (size_t k = 0; k < len; k++) printf(k ? " %d" : "%d", tok[k]);
            printf("\n");
        }
        free(tok);
        json_decref(texts);
    } else if (!strcmp(argv[1], "roundtrip")) {
        size_t n, bad = 0, cases = 0;
        json_t *texts = load_lines(argv[3], &n);
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_array_get(texts, i);
            const char *p = json_string_value(s);
            size_t len = json_string_length(s);
            /* every prefix cut, even mid-character: bytes must survive */
            for (size_t cut = 0; cut <= len; cut += 1 + len / 37, cases += 2) {
                bad += !roundtrip_one(t, st, p, cut, 0);
                bad += !roundtrip_one(t, st, p, cut, 1);
            }
        }
        uint64_t seed = 12345;
        char buf[1024];
        for (int i = 0; i < 3000; i++, cases++) {
            size_t len = random_text(&seed, buf, i % 3 == 2);
            bad += !roundtrip_one(t, st, buf, len, i & 1);
        }
        printf("roundtrip %zu cases, %zu bad\n", cases, bad);
        json_decref(texts);
        tokenizer_state_free(st);
        tokenizer_close(t);
        return bad ? 1 : 0;
    } else {
        die("unknown mode %s", argv[1]);
    }
    tokenizer_state_free(st);
    tokenizer_close(t);
    return 0;
}
