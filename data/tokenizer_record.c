/* A dataset's tokenizer record: made from an open tokenizer, stored as JSON
 * in index.mtd (data/shard_writer.c writes it), read back here. */
#define _GNU_SOURCE
#include "data/tokenizer_record.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "config/common.h"
#include "config/recipe.h"
#include "data/shard_format.h"

int tokenizer_file_xxh3(const char *path, char hex[17], int64_t *bytes) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    XXH3_state_t *st = XXH3_createState();
    if (!st || XXH3_64bits_reset(st) == XXH_ERROR) die("out of memory hashing %s", path);
    char buf[1 << 16];
    ssize_t n;
    int64_t total = 0;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        XXH3_64bits_update(st, buf, (size_t)n);
        total += n;
    }
    int saved = errno;
    close(fd);
    if (n < 0) {
        XXH3_freeState(st);
        errno = saved;
        return -1;
    }
    snprintf(hex, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(st));
    XXH3_freeState(st);
    if (bytes) *bytes = total;
    return 0;
}

static json_t *id_or_null(int64_t id) { return id < 0 ? json_null() : json_integer(id); }

static char *dump(json_t *o) {
    char *text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT);
    if (!text) die("out of memory writing the tokenizer record");
    json_decref(o);
    return text;
}

static void set(json_t *o, const char *key, json_t *v) {
    if (!v || json_object_set_new(o, key, v) != 0) die("out of memory writing the tokenizer record");
}

/* The special tokens as {text: id} in id order. */
static json_t *specials_json(const struct tokenizer *t) {
    int n = tokenizer_special_count(t);
    struct { const char *text; int id; } *sp = xmalloc((size_t)(n ? n : 1) * sizeof *sp);
    for (int i = 0; i < n; i++) tokenizer_special_at(t, i, &sp[i].text, &sp[i].id);
    /* insertion sort would be quadratic for DeepSeek's 818: sort by id */
    for (int gap = n / 2; gap > 0; gap /= 2)
        for (int i = gap; i < n; i++)
            for (int j = i; j >= gap && sp[j - gap].id > sp[j].id; j -= gap) {
                __typeof__(*sp) tmp = sp[j];
                sp[j] = sp[j - gap];
                sp[j - gap] = tmp;
            }
    json_t *o = json_object();
    for (int i = 0; i < n; i++) set(o, sp[i].text, json_integer(sp[i].id));
    free(sp);
    return o;
}

char *tokenizer_record_json(const struct tokenizer *t, int append_eod, int match_special) {
    const char *spec = tokenizer_spec(t);
    const char *kind = !strncmp(spec, "hf:", 3) ? "hf" : !strncmp(spec, "tiktoken:", 9) ? "tiktoken" : "bytes";
    json_t *o = json_object();
    set(o, "tokenizer", json_string(kind));
    set(o, "spec", json_string(spec));
    if (strcmp(kind, "bytes")) {
        const char *file = strchr(spec, ':') + 1;
        char abs[PATH_MAX], hex[17];
        int64_t bytes = 0;
        if (!realpath(file, abs) || tokenizer_file_xxh3(abs, hex, &bytes) != 0)
            die("%s: cannot read the tokenizer file again for its checksum: %s", file, strerror(errno));
        set(o, "file", json_string(abs));
        set(o, "file_bytes", json_integer(bytes));
        set(o, "file_xxh3", json_string(hex));
    }
    if (!strcmp(kind, "tiktoken")) {
        set(o, "tiktoken_specials", json_string(tokenizer_tiktoken_specials(t)));
        const char *re = tokenizer_tiktoken_regex(t);
        set(o, "tiktoken_regex", re ? json_string(re) : json_null());
    }
    set(o, "vocab_size", json_integer(tokenizer_vocab_size(t)));
    set(o, "bos_id", id_or_null(tokenizer_bos(t)));
    set(o, "eos_id", id_or_null(tokenizer_eod(t)));
    set(o, "eod_id", id_or_null(append_eod ? tokenizer_eod(t) : -1));
    set(o, "special_tokens", json_string(match_special ? "match" : "text"));
    set(o, "specials", specials_json(t));
    return dump(o);
}

char *tokenizer_record_unknown_json(const char *source, int vocab_size, int64_t eod_id) {
    json_t *o = json_object();
    set(o, "tokenizer", json_string("unknown"));
    set(o, "source", json_string(source));
    set(o, "vocab_size", json_integer(vocab_size));
    set(o, "bos_id", json_null());
    set(o, "eos_id", id_or_null(eod_id));
    set(o, "eod_id", id_or_null(eod_id));
    return dump(o);
}

/* ---- reading ---------------------------------------------------------------- */


/* Hash every byte of fd before the trailer, in bounded memory. */
static int index_checksum_ok(int fd, uint64_t body, uint64_t want) {
    XXH3_state_t *st = XXH3_createState();
    if (!st || XXH3_64bits_reset(st) == XXH_ERROR) die("out of memory hashing an index");
    char buf[1 << 16];
    uint64_t off = 0;
    while (off < body) {
        size_t want_n = body - off < sizeof buf ? (size_t)(body - off) : sizeof buf;
        ssize_t n = pread(fd, buf, want_n, (off_t)off);
        if (n <= 0) break;
        XXH3_64bits_update(st, buf, (size_t)n);
        off += (uint64_t)n;
    }
    int ok = off == body && XXH3_64bits_digest(st) == want;
    XXH3_freeState(st);
    return ok;
}

int tokenizer_record_read(const char *dir, char **json, int *version_out, char *err, size_t errsz) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, DATASET_INDEX_NAME);
    *json = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return set_error(err, errsz, "%s: cannot read: %s", path, strerror(errno));
    struct stat st;
    uint8_t h[INDEX_HEADER_BYTES], tr[INDEX_TRAILER_BYTES];
    int rc = -1;
    if (fstat(fd, &st) != 0 || st.st_size < INDEX_HEADER_BYTES + INDEX_TRAILER_BYTES ||
        pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h + IDX_MAGIC, DATASET_MAGIC, 8)) {
        set_error(err, errsz, "%s: not a dataset index", path);
        goto out;
    }
    uint32_t version = get_u32(h + IDX_VERSION);
    if (version < 1 || version > DATASET_VERSION) {
        set_error(err, errsz, "%s: unsupported format version %u", path, version);
        goto out;
    }
    if (version_out) *version_out = (int)version;
    uint64_t size = (uint64_t)st.st_size, len = version >= 2 ? get_u64(h + IDX_RECORD_BYTES) : 0;
    uint64_t frames = get_u64(h + IDX_FRAMES), docs = get_u64(h + IDX_DOCS);
    if (frames > (1ull << 40) || docs > (1ull << 40) || len > DATASET_RECORD_MAX) {
        set_error(err, errsz, "%s: implausible counts in the header", path);
        goto out;
    }
    uint64_t at = INDEX_HEADER_BYTES + frames * INDEX_FRAME_BYTES + (docs + 1) * 8;
    if (at + len + INDEX_TRAILER_BYTES != size ||
        pread(fd, tr, sizeof tr, (off_t)(size - INDEX_TRAILER_BYTES)) != (ssize_t)sizeof tr ||
        !index_checksum_ok(fd, size - INDEX_TRAILER_BYTES, get_u64(tr))) {
        set_error(err, errsz, "%s: damaged index (size or checksum)", path);
        goto out;
    }
    rc = 0;
    if (len) {
        *json = xmalloc(len + 1);
        if (pread(fd, *json, len, (off_t)at) != (ssize_t)len) {
            free(*json);
            *json = NULL;
            set_error(err, errsz, "%s: cannot read the tokenizer record: %s", path, strerror(errno));
            rc = -1;
            goto out;
        }
        (*json)[len] = 0;
        rc = 1;
    }
out:
    close(fd);
    return rc;
}

static void copy_str(char *dst, size_t n, json_t *o, const char *key) {
    const char *v = json_string_value(json_object_get(o, key));
    snprintf(dst, n, "%s", v ? v : "");
}

static int64_t get_id(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
}

int tokenizer_record_parse(const char *json, struct tokenizer_record *rec, char *err, size_t errsz) {
    memset(rec, 0, sizeof *rec);
    json_error_t jerr;
    json_t *o = json_loads(json, 0, &jerr);
    if (!json_is_object(o)) {
        json_decref(o);
        return set_error(err, errsz, "tokenizer record is not a JSON object (%s)", jerr.text);
    }
    copy_str(rec->kind, sizeof rec->kind, o, "tokenizer");
    copy_str(rec->spec, sizeof rec->spec, o, "spec");
    copy_str(rec->file, sizeof rec->file, o, "file");
    copy_str(rec->file_xxh3, sizeof rec->file_xxh3, o, "file_xxh3");
    copy_str(rec->specials, sizeof rec->specials, o, "tiktoken_specials");
    copy_str(rec->source, sizeof rec->source, o, "source");
    const char *re = json_string_value(json_object_get(o, "tiktoken_regex"));
    rec->regex = re ? xstrdup(re) : NULL;
    rec->file_bytes = json_integer_value(json_object_get(o, "file_bytes"));
    json_t *v = json_object_get(o, "vocab_size");
    rec->vocab_size = json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= INT_MAX
                          ? (int)json_integer_value(v) : 0;
    rec->bos_id = get_id(o, "bos_id");
    rec->eos_id = get_id(o, "eos_id");
    rec->eod_id = get_id(o, "eod_id");
    json_decref(o);
    int known = !strcmp(rec->kind, "bytes") || !strcmp(rec->kind, "hf") || !strcmp(rec->kind, "tiktoken") ||
                !strcmp(rec->kind, "unknown");
    if (!known || !rec->vocab_size || (strcmp(rec->kind, "bytes") && strcmp(rec->kind, "unknown") && !rec->file[0])) {
        tokenizer_record_free(rec);
        return set_error(err, errsz, "tokenizer record lacks a known tokenizer kind, a file or vocab_size");
    }
    return 0;
}

void tokenizer_record_free(struct tokenizer_record *rec) {
    free(rec->regex);
    rec->regex = NULL;
}

int tokenizer_record_load(const char *dir, struct tokenizer_record *rec, char *err, size_t errsz) {
    char *json;
    int rc = tokenizer_record_read(dir, &json, NULL, err, errsz);
    if (rc == 1) {
        char why[256];
        if (tokenizer_record_parse(json, rec, why, sizeof why) != 0)
            rc = set_error(err, errsz, "%s/%s: %s", dir, DATASET_INDEX_NAME, why);
    }
    free(json);
    return rc;
}

struct tokenizer *tokenizer_open_record(const struct tokenizer_record *rec, char *err, size_t errsz) {
    if (!strcmp(rec->kind, "unknown")) {
        snprintf(err, errsz, "the dataset does not name its tokenizer (%s)", rec->source[0] ? rec->source : "unknown");
        return NULL;
    }
    char spec[4200];
    if (!strcmp(rec->kind, "bytes")) {
        snprintf(spec, sizeof spec, "bytes");
    } else {
        char hex[17];
        if (tokenizer_file_xxh3(rec->file, hex, NULL) != 0) {
            snprintf(err, errsz, "tokenizer file %s: %s", rec->file, strerror(errno));
            return NULL;
        }
        if (strcmp(hex, rec->file_xxh3)) {
            snprintf(err, errsz, "tokenizer file %s has changed since the dataset was built (XXH3 %s, recorded %s)",
                     rec->file, hex, rec->file_xxh3);
            return NULL;
        }
        snprintf(spec, sizeof spec, "%s:%s", rec->kind, rec->file);
    }
    char eod[24];
    snprintf(eod, sizeof eod, "%lld", (long long)rec->eos_id);
    struct tokenizer_opts o = {.tiktoken_regex = rec->regex, .tiktoken_specials = rec->specials[0] ? rec->specials : NULL,
                               .eod = rec->eos_id >= 0 && strcmp(rec->kind, "bytes") ? eod : NULL};
    struct tokenizer *t = tokenizer_open(spec, &o, err, errsz);
    if (t && tokenizer_vocab_size(t) != rec->vocab_size) {
        snprintf(err, errsz, "tokenizer %s has %d ids, the dataset recorded %d", spec, tokenizer_vocab_size(t),
                 rec->vocab_size);
        tokenizer_close(t);
        return NULL;
    }
    return t;
}

static void print_id(FILE *out, const char *name, int64_t id) {
    if (id < 0) fprintf(out, " %s none", name);
    else fprintf(out, " %s %lld", name, (long long)id);
}

void tokenizer_record_print(const struct tokenizer_record *rec, FILE *out) {
    if (!strcmp(rec->kind, "unknown")) {
        fprintf(out, "  tokenizer:  unknown (%s)\n", rec->source[0] ? rec->source : "no source");
    } else {
        fprintf(out, "  tokenizer:  %s", rec->spec);
        if (rec->specials[0]) fprintf(out, " (specials %s%s)", rec->specials, rec->regex ? ", custom regex" : "");
        fprintf(out, "\n");
        if (rec->file[0])
            fprintf(out, "  file:       %s (%lld bytes, xxh3 %s)\n", rec->file, (long long)rec->file_bytes,
                    rec->file_xxh3);
    }
    fprintf(out, "  ids:        vocab %d,", rec->vocab_size);
    print_id(out, "bos", rec->bos_id);
    print_id(out, "eos", rec->eos_id);
    print_id(out, "eod", rec->eod_id);
    fprintf(out, "\n");
}

int tokenizer_record_resolve_vocab(struct recipe *r) {
    const struct data_blend *bl = &r->data.blend;
    const char *where = r->source[0] ? r->source : "recipe";
    int n = bl->n ? bl->n : 1, vocab = 0;
    const char *first = NULL;
    for (int i = 0; i < n; i++) {
        const char *dir = bl->n ? bl->e[i].path : r->data.path;
        struct tokenizer_record rec;
        char err[4400];
        int rc = dir[0] ? tokenizer_record_load(dir, &rec, err, sizeof err) : -1;
        if (!dir[0]) snprintf(err, sizeof err, "data.path is not set");
        if (rc <= 0) {
            fflush(stdout);
            if (rc < 0)
                fprintf(stderr, "mtrain: error: %s: model.vocab_size auto needs the dataset's tokenizer record: %s\n",
                        where, err);
            else
                fprintf(stderr, "mtrain: error: %s: model.vocab_size auto: dataset %s records no tokenizer (built "
                        "before dataset format version 2); set model.vocab_size to its vocabulary, or rebuild it\n",
                        where, dir);
            return -1;
        }
        tokenizer_record_free(&rec);
        if (vocab && rec.vocab_size != vocab) {
            fflush(stdout);
            fprintf(stderr, "mtrain: error: %s: model.vocab_size auto: the blended datasets disagree: %s has %d ids, "
                    "%s has %d\n", where, first, vocab, dir, rec.vocab_size);
            return -1;
        }
        vocab = rec.vocab_size;
        first = dir;
    }
    r->model.vocab_size = vocab;
    return 0;
}
