/* mtrain data: build, generate, inspect and verify token datasets. Parses
 * flags and orchestrates; the format itself lives in data/. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "config/common.h"
#include "data/dataset.h"
#include "data/megatron.h"
#include "data/shard_writer.h"
#include "data/synthetic.h"
#include "data/text_build.h"
#include "data/text_input.h"
#include "data/tokenizer.h"
#include "data/tokenizer_bytes.h"
#include "data/tokenizer_record.h"

#define GENERATE_DEFAULT_DOCS 5000

static const char usage_data[] =
    "usage: mtrain data <subcommand> [options]\n\n"
    "subcommands:\n"
    "  build      tokenize text files into a dataset directory\n"
    "  generate   write a synthetic English-like dataset (the default demo data)\n"
    "  import     copy a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx)\n"
    "  inspect    print a dataset's size, compression and first tokens\n"
    "  verify     decode every frame and check its checksums\n\n"
    "'mtrain data <subcommand> --help' shows its options.\n";

static const char usage_build[] =
    "usage: mtrain data build --tokenizer SPEC --out DIR [options] INPUT...\n\n"
    "Tokenizes text into a dataset, recording the tokenizer (spec, file checksum,\n"
    "special ids) in its index. A plain INPUT file is one document (or, with\n"
    "--split-lines, each non-empty line is); a JSON-lines INPUT (*.jsonl, or every\n"
    "input with --json-key) holds one document per line in a string field. Inputs\n"
    "may be zstd-compressed (.zst); gzip is refused (decompress it first).\n\n"
    "  --tokenizer SPEC     bytes | hf:tokenizer.json | tiktoken:RANKFILE\n"
    "  --out DIR            dataset directory to create (written atomically)\n"
    "  --json-key KEY       every input is JSON lines; the document is field KEY (default text)\n"
    "  --append-eod         end every document with the EOD token\n"
    "  --eod TOKEN          EOD token text or id (default: <|end_of_text|>, <|endoftext|>, </s>, ...)\n"
    "  --special-tokens M   text (default): special-token text is ordinary text;\n"
    "                       match: it becomes the special token's id\n"
    "  --tiktoken-regex RE  pre-tokenizer regex for tiktoken files (default: Llama 3's)\n"
    "  --tiktoken-specials S  Llama 3's 256 specials after the ranks, named as in llama3.1 (default;\n"
    "                       also llama3) or llama3.0; or none\n"
    "  --workers N          tokenizing threads (default 1); the output is the same for any N\n"
    "  --split-lines        plain text: one document per non-empty line\n"
    "  --frame-tokens N     tokens per zstd frame (default 16384)\n"
    "  --shard-size-mb N    start a new shard after N MiB compressed (default 256)\n"
    "  --quiet              no progress line on stderr\n"
    "  --force              replace an existing dataset at DIR\n";

static const char usage_generate[] =
    "usage: mtrain data generate --out DIR [--docs N] [--seed S] [--force]\n\n"
    "Writes a deterministic synthetic English-like corpus as a byte-tokenized dataset\n"
    "(EOD after each document).\n\n"
    "  --out DIR            dataset directory to create\n"
    "  --docs N             number of documents (default 5000)\n"
    "  --seed S             corpus seed (default 1)\n"
    "  --frame-tokens N     tokens per zstd frame (default 16384)\n"
    "  --shard-size-mb N    start a new shard after N MiB compressed (default 256)\n"
    "  --force              replace an existing dataset at DIR\n";

static const char usage_import[] =
    "usage: mtrain data import PREFIX --out DIR [options]\n\n"
    "Copies the Megatron-LM indexed dataset PREFIX.bin + PREFIX.idx (any dtype code)\n"
    "token for token, one document per Megatron document.\n\n"
    "  --out DIR            dataset directory to create (written atomically)\n"
    "  --vocab-size N       vocabulary size (default: largest token id + 1)\n"
    "  --eod ID             end-of-document id to record (default: none)\n"
    "  --frame-tokens N     tokens per zstd frame (default 16384)\n"
    "  --shard-size-mb N    start a new shard after N MiB compressed (default 256)\n"
    "  --force              replace an existing dataset at DIR\n";

static const char usage_inspect[] =
    "usage: mtrain data inspect DIR [--tokens N] [--tokenizer SPEC]\n\n"
    "Prints documents, tokens, shards, frames, compression ratio, a histogram of\n"
    "document lengths and the first N tokens (64 by default), decoded with SPEC\n"
    "(bytes | hf:tokenizer.json | tiktoken:RANKFILE) when given.\n\n"
    "  --tokens N           how many tokens to print\n"
    "  --tokenizer SPEC     decode them with this tokenizer\n"
    "  --tiktoken-regex RE, --tiktoken-specials S   as for 'mtrain data build'\n";

static const char usage_verify[] =
    "usage: mtrain data verify DIR\n\n"
    "Decodes every frame and checks its size and checksums; lists each bad frame\n"
    "with its shard file and offset and exits 1 if there is any.\n";

static int show(const char *usage) {
    printf("%s", usage);
    return 0;
}

static int bad_usage(const char *usage, const char *fmt, const char *arg) {
    fprintf(stderr, "mtrain: error: data: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", usage);
    return EXIT_USAGE;
}

/* Options shared by build and generate. */
struct build_args {
    const char *out, *tokenizer, *json_key, *special_tokens;
    struct tokenizer_opts topts;
    int append_eod, split_lines, force, quiet;
    int64_t frame_tokens, shard_mb, docs, workers;
    uint64_t seed;
    const char **inputs;
    int ninputs;
};

/* Parse a number >= min; returns -1 if s is not one. */
static int parse_number(const char *s, int64_t min, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min) return -1;
    *out = v;
    return 0;
}

static int is_flag(const char *f, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(f, *names)) return 1;
    return 0;
}

/* Flags each command accepts; everything else is a usage error. */
static const char *const build_switches[] = {"--append-eod", "--split-lines", "--force", "--quiet", NULL};
static const char *const build_values[] = {"--out", "--tokenizer", "--frame-tokens", "--shard-size-mb",
                                           "--json-key", "--workers", "--special-tokens", "--eod",
                                           "--tiktoken-regex", "--tiktoken-specials", NULL};
static const char *const generate_switches[] = {"--force", NULL};
static const char *const generate_values[] = {"--out", "--docs", "--seed", "--frame-tokens", "--shard-size-mb",
                                              NULL};

static int set_value(struct build_args *a, const char *f, const char *v, const char *usage) {
    int64_t n = 0;
    if (!strcmp(f, "--out")) a->out = v;
    else if (!strcmp(f, "--tokenizer")) a->tokenizer = v;
    else if (!strcmp(f, "--json-key")) a->json_key = v;
    else if (!strcmp(f, "--special-tokens")) a->special_tokens = v;
    else if (!strcmp(f, "--eod")) a->topts.eod = v;
    else if (!strcmp(f, "--tiktoken-regex")) a->topts.tiktoken_regex = v;
    else if (!strcmp(f, "--tiktoken-specials")) a->topts.tiktoken_specials = v;
    else if (parse_number(v, strcmp(f, "--seed") ? 1 : 0, &n)) return bad_usage(usage, "bad number '%s'", v);
    else if (!strcmp(f, "--frame-tokens")) a->frame_tokens = n;
    else if (!strcmp(f, "--shard-size-mb")) a->shard_mb = n;
    else if (!strcmp(f, "--docs")) a->docs = n;
    else if (!strcmp(f, "--workers")) a->workers = n;
    else a->seed = (uint64_t)n;
    return 0;
}

/* Returns 0, or EXIT_USAGE after printing usage. Values follow their flag. */
static int parse_build_args(int argc, char **argv, int generate, struct build_args *a) {
    const char *usage = generate ? usage_generate : usage_build;
    const char *const *switches = generate ? generate_switches : build_switches;
    const char *const *values = generate ? generate_values : build_values;
    a->inputs = (const char **)xcalloc((size_t)argc, sizeof *a->inputs);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (is_flag(f, switches)) {
            if (!strcmp(f, "--append-eod")) a->append_eod = 1;
            else if (!strcmp(f, "--split-lines")) a->split_lines = 1;
            else if (!strcmp(f, "--quiet")) a->quiet = 1;
            else a->force = 1;
        } else if (is_flag(f, values)) {
            if (i + 1 == argc) return bad_usage(usage, "%s needs a value", f);
            if (set_value(a, f, argv[++i], usage)) return EXIT_USAGE;
        } else if (f[0] == '-' && f[1]) {
            return bad_usage(usage, "unknown option '%s'", f);
        } else if (generate) {
            return bad_usage(usage, "unexpected argument '%s'", f);
        } else {
            a->inputs[a->ninputs++] = f;
        }
    }
    if (!a->out) return bad_usage(usage, "%s", "--out DIR is required");
    if (a->shard_mb == 0) a->shard_mb = SHARD_DEFAULT_SHARD_BYTES >> 20;
    return 0;
}

static struct shard_writer *open_writer(const struct build_args *a, int vocab, int64_t eod, const char *record) {
    struct shard_writer_opts o = {.vocab_size = vocab, .eod_id = eod, .frame_tokens = a->frame_tokens,
                                  .force = a->force, .tokenizer_record = record};
    if (a->shard_mb > (1ll << 40) / (1 << 20)) die("--shard-size-mb %lld is too large", (long long)a->shard_mb);
    o.shard_bytes = a->shard_mb << 20;
    return shard_writer_open(a->out, &o);
}

static void print_summary(const char *out, const struct shard_writer_stats *st, double input_bytes, double secs) {
    printf("built %s: %lld docs, %lld tokens, %lld shards, %lld frames, %lld compressed bytes "
           "(ratio %.2fx), %.1f MB/s\n",
           out, (long long)st->docs, (long long)st->tokens, (long long)st->shards, (long long)st->frames,
           (long long)st->compressed_bytes,
           st->compressed_bytes ? (double)st->raw_bytes / (double)st->compressed_bytes : 0.0,
           input_bytes / 1e6 / (secs > 1e-9 ? secs : 1e-9));
}

/* Usage checks of build that need no files: returns 0 or EXIT_USAGE. */
static int check_build_args(struct build_args *a) {
    char err[512];
    if (!a->ninputs) return bad_usage(usage_build, "%s", "no INPUT files");
    if (!a->tokenizer) return bad_usage(usage_build, "%s", "--tokenizer is required (bytes, hf:FILE or tiktoken:FILE)");
    if (strcmp(a->tokenizer, "bytes") && strncmp(a->tokenizer, "hf:", 3) && strncmp(a->tokenizer, "tiktoken:", 9))
        return bad_usage(usage_build, "unknown tokenizer '%s' (bytes, hf:FILE or tiktoken:FILE)", a->tokenizer);
    if (a->special_tokens && strcmp(a->special_tokens, "text") && strcmp(a->special_tokens, "match"))
        return bad_usage(usage_build, "--special-tokens '%s': expected text or match", a->special_tokens);
    if (a->workers > 256) return bad_usage(usage_build, "%s", "--workers: at most 256");
    if (a->json_key && a->split_lines)
        return bad_usage(usage_build, "%s", "--split-lines is for plain text; JSON lines are always one document each");
    for (int i = 0; i < a->ninputs; i++)
        if (text_input_check(a->inputs[i], err, sizeof err) == -2) return bad_usage(usage_build, "%s", err);
    return 0;
}

static int data_build(int argc, char **argv) {
    if (wants_help(argc, argv)) return show(usage_build);
    struct build_args a = {.workers = 1};
    int rc = parse_build_args(argc, argv, 0, &a);
    if (!rc) rc = check_build_args(&a);
    if (rc) {
        free(a.inputs);
        return rc;
    }
    char err[1024];
    /* every input must be readable before anything is written */
    for (int i = 0; i < a.ninputs; i++)
        if (text_input_check(a.inputs[i], err, sizeof err) < -1) die("%s", err);
    double t0 = now_seconds();
    struct tokenizer *tok = tokenizer_open(a.tokenizer, &a.topts, err, sizeof err);
    if (!tok) {
        free(a.inputs);
        return bad_usage(usage_build, "%s", err);
    }
    if (a.append_eod && tokenizer_eod(tok) < 0)
        die_code(EXIT_USAGE, "--append-eod: %s has no end-of-document token; name one with --eod", a.tokenizer);
    int match_special = a.special_tokens && !strcmp(a.special_tokens, "match");
    char *record = tokenizer_record_json(tok, a.append_eod, match_special);
    struct shard_writer *w = open_writer(&a, tokenizer_vocab_size(tok), tokenizer_eod(tok), record);
    free(record);
    struct text_build_opts o = {.tok = tok, .json_key = a.json_key ? a.json_key : "text", .jsonl_all = !!a.json_key,
                                .split_lines = a.split_lines, .append_eod = a.append_eod,
                                .match_special = match_special, .workers = (int)a.workers, .progress = !a.quiet};
    struct text_build_stats ts;
    if (text_build(w, a.inputs, a.ninputs, &o, &ts, err, sizeof err)) {
        shard_writer_abort(w);
        die("%s", err);
    }
    struct shard_writer_stats st;
    shard_writer_finish(w, &st);
    print_summary(a.out, &st, ts.text_bytes, now_seconds() - t0);
    tokenizer_close(tok);
    free(a.inputs);
    return 0;
}

static int data_import(int argc, char **argv) {
    if (wants_help(argc, argv)) return show(usage_import);
    const char *prefix = NULL, *out = NULL;
    int64_t vocab = 0, eod = -1, frame_tokens = 0, shard_mb = SHARD_DEFAULT_SHARD_BYTES >> 20;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int64_t *num = !strcmp(f, "--vocab-size") ? &vocab : !strcmp(f, "--eod") ? &eod
                       : !strcmp(f, "--frame-tokens") ? &frame_tokens : !strcmp(f, "--shard-size-mb") ? &shard_mb : NULL;
        if (!strcmp(f, "--force")) force = 1;
        else if ((num || !strcmp(f, "--out")) && i + 1 == argc) return bad_usage(usage_import, "%s needs a value", f);
        else if (!strcmp(f, "--out")) out = argv[++i];
        else if (num && parse_number(argv[++i], num == &eod ? 0 : 1, num))
            return bad_usage(usage_import, "bad number '%s'", argv[i]);
        else if (num) continue;
        else if (f[0] == '-' && f[1]) return bad_usage(usage_import, "unknown option '%s'", f);
        else if (prefix) return bad_usage(usage_import, "unexpected argument '%s'", f);
        else prefix = f;
    }
    if (!prefix || !out) return bad_usage(usage_import, "%s", "PREFIX and --out DIR are required");
    if (vocab > INT32_MAX || shard_mb > (1ll << 20)) return bad_usage(usage_import, "%s", "number too large");
    char err[1024];
    double t0 = now_seconds();
    struct megatron *m = megatron_open(prefix, err, sizeof err);
    if (!m) die("%s", err);
    /* documents stream through a fixed buffer: memory does not grow with a document's length */
    enum { PIECE = 1 << 20 };
    int32_t *tok = xmalloc(sizeof(int32_t) * PIECE);
    struct megatron_cursor cur;
    int64_t ndocs = megatron_num_docs(m), max = -1, n;
    /* without --vocab-size the vocabulary is the largest id + 1: one pass to find it */
    for (int64_t d = 0; !vocab && d < ndocs; d++)
        for (megatron_doc_begin(m, d, &cur); (n = megatron_doc_next(m, &cur, tok, PIECE, err, sizeof err)) != 0;) {
            if (n < 0) die("%s", err);
            for (int64_t i = 0; i < n; i++) max = tok[i] > max ? tok[i] : max;
        }
    if (!vocab) vocab = max + 1 > eod + 1 ? max + 1 : eod + 1;
    if (vocab < 1) vocab = 1;
    if (eod >= vocab) die("--eod %lld is outside the vocabulary of %lld", (long long)eod, (long long)vocab);
    /* a Megatron dataset does not say which tokenizer made it */
    char source[4200];
    snprintf(source, sizeof source, "megatron:%s", prefix);
    char *record = tokenizer_record_unknown_json(source, (int)vocab, eod);
    struct shard_writer_opts o = {.vocab_size = (int)vocab, .eod_id = eod, .frame_tokens = frame_tokens,
                                  .shard_bytes = shard_mb << 20, .force = force, .tokenizer_record = record};
    struct shard_writer *w = shard_writer_open(out, &o);
    free(record);
    for (int64_t d = 0; d < ndocs; d++) {
        for (megatron_doc_begin(m, d, &cur); (n = megatron_doc_next(m, &cur, tok, PIECE, err, sizeof err)) != 0;) {
            for (int64_t i = 0; n > 0 && i < n; i++)
                if (tok[i] >= vocab) {
                    snprintf(err, sizeof err, "%s.bin: document %lld: token %d is outside --vocab-size %lld", prefix,
                             (long long)d, tok[i], (long long)vocab);
                    n = -1;
                }
            if (n < 0) {
                shard_writer_abort(w);
                die("%s", err);
            }
            shard_writer_add(w, tok, n);
        }
        shard_writer_end_doc(w);
    }
    struct shard_writer_stats st;
    shard_writer_finish(w, &st);
    printf("imported %s (%s, %lld documents, %lld tokens) -> ", prefix, megatron_dtype_name(m), (long long)ndocs,
           (long long)megatron_num_tokens(m));
    print_summary(out, &st, (double)megatron_num_tokens(m) * megatron_itemsize(m), now_seconds() - t0);
    free(tok);
    megatron_close(m);
    return 0;
}

static int data_generate(int argc, char **argv) {
    if (wants_help(argc, argv)) return show(usage_generate);
    struct build_args a = {.docs = GENERATE_DEFAULT_DOCS, .seed = 1};
    int rc = parse_build_args(argc, argv, 1, &a);
    free(a.inputs);
    if (rc) return rc;
    double t0 = now_seconds(), bytes = 0;
    char err[256];
    struct tokenizer *bytes_tok = tokenizer_open("bytes", NULL, err, sizeof err);
    if (!bytes_tok) die("%s", err);
    char *record = tokenizer_record_json(bytes_tok, 1, 0);
    tokenizer_close(bytes_tok);
    struct shard_writer *w = open_writer(&a, BYTES_VOCAB_SIZE, BYTES_EOD, record);
    free(record);
    char text[SYNTHETIC_DOC_MAX + 1];
    int32_t tok[SYNTHETIC_DOC_MAX + 1];
    for (int64_t d = 0; d < a.docs; d++) {
        size_t n = synthetic_document(a.seed, d, text);
        tokenizer_bytes_encode(text, n, tok);
        tok[n] = BYTES_EOD;
        shard_writer_add(w, tok, (int64_t)n + 1);
        shard_writer_end_doc(w);
        bytes += (double)n;
    }
    struct shard_writer_stats st;
    shard_writer_finish(w, &st);
    print_summary(a.out, &st, bytes, now_seconds() - t0);
    return 0;
}

/* Show byte tokens as text with escapes, EOD as <eod>. */
static void print_bytes_text(const int32_t *tok, int64_t n) {
    printf("  as text:    \"");
    for (int64_t i = 0; i < n; i++) {
        int t = tok[i];
        if (t == BYTES_EOD) printf("<eod>");
        else if (t == '\n') printf("\\n");
        else if (t == '"' || t == '\\') printf("\\%c", t);
        else if (t >= 32 && t < 127) putchar(t);
        else printf("\\x%02x", t & 0xff);
    }
    printf("\"\n");
}

/* Document lengths in power-of-two buckets: [1], [2,3], [4,7], ... */
static void print_histogram(struct dataset *ds, int64_t ndocs) {
    int64_t count[64] = {0}, longest = 0;
    int top = 0, bottom = 63;
    for (int64_t d = 0; d < ndocs; d++) {
        int64_t len = dataset_doc_start(ds, d + 1) - dataset_doc_start(ds, d);
        int b = 0;
        while ((2ll << b) <= len) b++;
        count[b]++;
        if (b > top) top = b;
        if (b < bottom) bottom = b;
        if (len > longest) longest = len;
    }
    int64_t most = 1;
    for (int b = 0; b <= top; b++) most = count[b] > most ? count[b] : most;
    printf("  document lengths (tokens; mean %.1f, longest %lld):\n",
           ndocs ? (double)dataset_num_tokens(ds) / (double)ndocs : 0.0, (long long)longest);
    for (int b = bottom; ndocs && b <= top; b++) {
        char range[48];
        snprintf(range, sizeof range, b ? "%lld-%lld" : "%lld", 1ll << b, (2ll << b) - 1);
        int bar = (int)((40 * count[b] + most - 1) / most);
        printf("    %-21s %10lld  %.*s\n", range, (long long)count[b], bar, "########################################");
    }
}

/* Decoded text with control characters escaped; UTF-8 passes through. */
static void print_decoded(const char *s, size_t n) {
    printf("  decoded:    \"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') printf("\\n");
        else if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 32 || c == 127) printf("\\x%02x", c);
        else putchar(c);
    }
    printf("\"\n");
}

static int data_inspect(int argc, char **argv) {
    if (wants_help(argc, argv)) return show(usage_inspect);
    const char *dir = NULL, *spec = NULL;
    int64_t want = 64;
    struct tokenizer_opts topts = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int value = !strcmp(f, "--tokens") || !strcmp(f, "--tokenizer") || !strcmp(f, "--tiktoken-regex") ||
                    !strcmp(f, "--tiktoken-specials");
        if (value && i + 1 == argc) return bad_usage(usage_inspect, "%s needs a value", f);
        if (!strcmp(f, "--tokens")) {
            if (parse_number(argv[++i], 0, &want) || want > (1 << 24)) return bad_usage(usage_inspect, "bad number '%s'", argv[i]);
        } else if (!strcmp(f, "--tokenizer")) spec = argv[++i];
        else if (!strcmp(f, "--tiktoken-regex")) topts.tiktoken_regex = argv[++i];
        else if (!strcmp(f, "--tiktoken-specials")) topts.tiktoken_specials = argv[++i];
        else if (f[0] == '-' && f[1]) return bad_usage(usage_inspect, "unknown option '%s'", f);
        else if (dir) return bad_usage(usage_inspect, "%s", "expected one DIR");
        else dir = f;
    }
    if (!dir) return bad_usage(usage_inspect, "%s", "expected one DIR");
    char err[512];
    struct tokenizer *tk = NULL;
    if (spec && !(tk = tokenizer_open(spec, &topts, err, sizeof err))) return bad_usage(usage_inspect, "%s", err);
    struct dataset *ds = dataset_open(dir);
    struct dataset_info in;
    dataset_get_info(ds, &in);
    if (tk && tokenizer_vocab_size(tk) < in.vocab_size)
        die("vocabulary mismatch: %s has %d ids, dataset %s has vocab %d", spec, tokenizer_vocab_size(tk), dir,
            in.vocab_size);
    double raw = (double)in.tokens * in.dtype_bytes;
    /* Read before printing so a damaged frame gives just its one error line. */
    int64_t n = in.tokens < want ? in.tokens : want;
    int32_t *tok = xmalloc((size_t)(n + 1) * sizeof *tok);
    dataset_read(ds, 0, n, tok);
    char *rjson = NULL;
    int version = 1;
    struct tokenizer_record rec;
    int has_record = tokenizer_record_read(dir, &rjson, &version, err, sizeof err);
    if (has_record < 0) die("%s", err);
    if (has_record && tokenizer_record_parse(rjson, &rec, err, sizeof err) != 0)
        die("%s/index.mtd: %s", dir, err);
    free(rjson);
    printf("dataset %s (format version %d)\n", dataset_dir(ds), version);
    if (has_record) {
        tokenizer_record_print(&rec, stdout);
        tokenizer_record_free(&rec);
    } else {
        printf("  tokenizer:  not recorded (datasets before format version 2)\n");
    }
    printf("  documents:  %lld\n", (long long)in.docs);
    printf("  tokens:     %lld (uint%d, vocab %d, eod %lld)\n", (long long)in.tokens, 8 * in.dtype_bytes,
           in.vocab_size, (long long)in.eod_id);
    printf("  shards:     %lld\n", (long long)in.shards);
    printf("  frames:     %lld (%lld tokens per frame)\n", (long long)in.frames, (long long)in.frame_tokens);
    printf("  compressed: %lld bytes, ratio %.2fx\n", (long long)in.compressed_bytes,
           in.compressed_bytes ? raw / (double)in.compressed_bytes : 0.0);
    print_histogram(ds, in.docs);
    printf("  first %lld tokens:", (long long)n);
    for (int64_t i = 0; i < n; i++) printf(" %d", tok[i]);
    printf("\n");
    if (tk) {
        char *text = NULL;
        size_t len = 0, cap = 0;
        tokenizer_decode(tk, tok, (size_t)n, &text, &len, &cap);
        print_decoded(text, len);
        free(text);
        tokenizer_close(tk);
    } else if (in.vocab_size == BYTES_VOCAB_SIZE && in.eod_id == BYTES_EOD) {
        print_bytes_text(tok, n);
    }
    free(tok);
    dataset_close(ds);
    return 0;
}

static int data_verify(int argc, char **argv) {
    if (wants_help(argc, argv)) return show(usage_verify);
    if (argc != 2 || argv[1][0] == '-') return bad_usage(usage_verify, "%s", "expected one DIR");
    struct dataset *ds = dataset_open(argv[1]);
    struct dataset_info in;
    dataset_get_info(ds, &in);
    int64_t bad = dataset_verify(ds, stderr);
    /* the tokenizer record too, as inspect and training read it */
    char *rjson = NULL, err[4096];
    int version = 0, has_record = tokenizer_record_read(argv[1], &rjson, &version, err, sizeof err), bad_record = 0;
    struct tokenizer_record rec;
    if (has_record > 0 && tokenizer_record_parse(rjson, &rec, err, sizeof err) != 0)
        fprintf(stderr, "mtrain: error: %s/index.mtd: %s\n", argv[1], err), bad_record = 1;
    else if (has_record > 0) tokenizer_record_free(&rec);
    if (has_record < 0) fprintf(stderr, "mtrain: error: %s\n", err), bad_record = 1;
    free(rjson);
    if (bad) fprintf(stderr, "mtrain: error: verify %s: %lld of %lld frames bad\n", argv[1], (long long)bad,
                     (long long)in.frames);
    else if (!bad_record) printf("verify %s: ok, %lld frames, %lld tokens, %lld documents\n", argv[1], (long long)in.frames,
                (long long)in.tokens, (long long)in.docs);
    dataset_close(ds);
    return bad || bad_record ? EXIT_RUNTIME : 0;
}

int cmd_data(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "%s", usage_data);
        return EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) return show(usage_data);
    if (!strcmp(sub, "build")) return data_build(argc - 1, argv + 1);
    if (!strcmp(sub, "generate")) return data_generate(argc - 1, argv + 1);
    if (!strcmp(sub, "import")) return data_import(argc - 1, argv + 1);
    if (!strcmp(sub, "inspect")) return data_inspect(argc - 1, argv + 1);
    if (!strcmp(sub, "verify")) return data_verify(argc - 1, argv + 1);
    return bad_usage(usage_data, "unknown subcommand '%s'", sub);
}
