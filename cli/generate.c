/* mtrain generate: continue a prompt with a trained model, one token at a
 * time through a KV cache (model/decode.h); greedy by default, or sampled
 * with temperature, top-k and top-p from a seeded generator. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/json_number.h"
#include "cli/options.h"
#include "cli/model_source.h"
#include "config/common.h"
#include "data/tokenizer.h"
#include "model/decode.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: mtrain generate MODEL (--prompt TEXT --tokenizer SPEC | --prompt-ids ID,ID,...) [options]\n\n"
            "MODEL is a checkpoint step directory or checkpoint directory (any parallel layout), a run's\n"
            "LOG_DIR (or LOG_DIR/model.safetensors: the model from model.recipe.yaml beside it or --recipe\n"
            "FILE), or a "
            "Hugging Face directory (config.json + model.safetensors; Llama, Mixtral or DeepSeek-V3).\n\n"
            "  --prompt TEXT        text to continue, encoded with --tokenizer (no BOS is added)\n"
            "  --tokenizer SPEC     bytes | hf:FILE | tiktoken:FILE; decodes the output too\n"
            "  --prompt-ids LIST    the prompt as token ids (comma separated)\n"
            "  --max-tokens N       tokens to generate (default 64); stops early at --stop-id or the\n"
            "                       model's last position\n"
            "  --temperature T      0 (default) = greedy; > 0 samples from softmax(logits / T)\n"
            "  --top-k K            sample among the K most likely tokens only (0 = all)\n"
            "  --top-p P            ... among the smallest set whose probability reaches P (1 = all)\n"
            "  --seed S             seed of the sampler (default 0): same seed, same output\n"
            "  --stop-id ID         stop after generating ID (default: the tokenizer's end of document;\n"
            "                       -1 never)\n"
            "  --device D           auto (default) | cpu | cuda\n"
            "  --recipe FILE        the model of a bare .safetensors file\n"
            "  --print-ids          also print the generated ids on a line of their own\n"
            "  --json               print one JSON object: prompt_ids, ids, text, stop reason and, per\n"
            "                       generated token, its top --json-top (default 5) ids and logits\n");
}

struct gen_opts {
    const char *model, *tokenizer, *prompt, *prompt_ids, *device, *recipe;
    int max_tokens, top_k, json_top, print_ids, json;
    double temperature, top_p;
    unsigned long long seed;
    long long stop_id;
    int stop_set;
};

/* splitmix64: a small, well-mixed generator; the sequence is fixed by the seed. */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct cand {
    float logit;
    int id;
};

/* descending logit; ties to the lower id, so top-k 1 is greedy */
static int by_logit(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

static int argmax(const float *logits, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Sort the vocabulary by logit into c (c[0..V)). */
static void rank(struct cand *c, const float *logits, int V) {
    for (int i = 0; i < V; i++) c[i] = (struct cand){logits[i], i};
    qsort(c, V, sizeof *c, by_logit);
}

static int sample(const struct gen_opts *o, const float *logits, int V, struct cand *c, double *p, uint64_t *rng) {
    if (o->temperature <= 0) return argmax(logits, V);
    rank(c, logits, V);
    int n = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += p[i] = exp(((double)c[i].logit - c[0].logit) / o->temperature);
    if (o->top_p < 1) { /* the smallest prefix whose probability reaches top_p */
        double acc = 0;
        int keep = 0;
        while (keep < n && acc < o->top_p * sum) acc += p[keep++];
        n = keep > 0 ? keep : 1;
        sum = acc > 0 ? acc : p[0];
    }
    double u = (double)(next_u64(rng) >> 11) * 0x1.0p-53 * sum;
    for (int i = 0; i < n; i++) {
        if (u < p[i]) return c[i].id;
        u -= p[i];
    }
    return c[n - 1].id;
}

/* Text as valid UTF-8 for JSON: bytes that do not form a character become U+FFFD. */
static json_t *json_text(const char *s, size_t n) {
    char *out = xmalloc(3 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)s[i];
        int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= n;
        for (int j = 1; ok && j < len; j++) ok = ((unsigned char)s[i + j] >> 6) == 2;
        if (ok && len > 1) { /* overlong forms, surrogates: jansson's check */
            json_t *t = json_stringn(s + i, len);
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) {
            memcpy(out + k, s + i, len), k += len, i += len;
        } else {
            memcpy(out + k, "\xef\xbf\xbd", 3), k += 3, i++;
        }
    }
    json_t *j = json_stringn(out, k);
    free(out);
    return j;
}

static int parse(int argc, char **argv, struct gen_opts *o) {
    *o = (struct gen_opts){.device = "auto", .max_tokens = 64, .top_p = 1, .json_top = 5, .stop_id = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), -1;
        OPT_STR("--tokenizer", tokenizer);
        OPT_STR("--prompt", prompt);
        OPT_STR("--prompt-ids", prompt_ids);
        OPT_STR("--device", device);
        OPT_STR("--recipe", recipe);
        OPT_NUM("generate", "--max-tokens", max_tokens, (int)strtol(v, &end, 10), o->max_tokens > 0)
        OPT_NUM("generate", "--top-k", top_k, (int)strtol(v, &end, 10), o->top_k >= 0)
        OPT_NUM("generate", "--json-top", json_top, (int)strtol(v, &end, 10), o->json_top >= 0)
        OPT_NUM("generate", "--temperature", temperature, strtod(v, &end), o->temperature >= 0 && isfinite(o->temperature))
        OPT_NUM("generate", "--top-p", top_p, strtod(v, &end), o->top_p > 0 && o->top_p <= 1)
        OPT_NUM("generate", "--seed", seed, strtoull(v, &end, 10), v[0] != '-')
        OPT_NUM("generate", "--stop-id", stop_id, strtoll(v, &end, 10), o->stop_id >= -1)
        else if (!strcmp(a, "--print-ids")) o->print_ids = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (a[0] != '-' && !o->model) o->model = a;
        else {
            opt_unexpected("generate", a, v);
            usage(stderr);
            return EXIT_USAGE;
        }
        if (!strcmp(a, "--stop-id")) o->stop_set = 1;
    }
    const char *why = !o->model ? "no MODEL given"
                      : !o->prompt == !o->prompt_ids ? "give exactly one of --prompt and --prompt-ids"
                      : o->prompt && !o->tokenizer ? "--prompt needs --tokenizer"
                                                  : NULL;
    if (why) {
        fprintf(stderr, "mtrain: error: generate: %s\n\n", why);
        usage(stderr);
        return EXIT_USAGE;
    }
    return 0;
}

/* The prompt as ids (encoded or parsed); returns the count or -1. */
static long prompt_tokens(const struct gen_opts *o, struct tokenizer *tok, int vocab, int32_t **ids) {
    char err[512];
    if (o->prompt_ids) {
        long n = parse_token_ids(o->prompt_ids, vocab, "--prompt-ids", ids, err, sizeof err);
        if (n < 0) fprintf(stderr, "mtrain: error: %s\n", err);
        return n;
    }
    struct tokenizer_state *st = tokenizer_state_create(tok);
    size_t len = 0, cap = 0;
    *ids = NULL;
    tokenizer_encode(st, o->prompt, strlen(o->prompt), 0, ids, &len, &cap);
    tokenizer_state_free(st);
    for (size_t i = 0; i < len; i++)
        if ((*ids)[i] >= vocab) {
            fprintf(stderr, "mtrain: error: --prompt: the tokenizer gave id %d, outside the model's vocabulary [0, %d)\n",
                    (*ids)[i], vocab);
            return -1;
        }
    return (long)len;
}

static void print_result(const struct gen_opts *o, struct tokenizer *tok, const int32_t *prompt, long np,
                         const int32_t *out, int n, const char *stop, const float *top_logits, const int32_t *top_ids,
                         int ntop) {
    char *text = NULL;
    size_t tlen = 0, tcap = 0;
    if (tok) tokenizer_decode(tok, out, n, &text, &tlen, &tcap);
    if (o->json) {
        json_t *j = json_object(), *pi = json_array(), *gi = json_array(), *steps = json_array();
        for (long i = 0; i < np; i++) json_array_append_new(pi, json_integer(prompt[i]));
        for (int i = 0; i < n; i++) {
            json_array_append_new(gi, json_integer(out[i]));
            json_t *ti = json_array(), *tl = json_array();
            for (int k = 0; k < ntop; k++) {
                json_array_append_new(ti, json_integer(top_ids[(size_t)i * ntop + k]));
                json_array_append_new(tl, json_finite_or_null(top_logits[(size_t)i * ntop + k]));
            }
            json_array_append_new(steps, json_pack("{s:i, s:o, s:o}", "id", out[i], "top_ids", ti, "top_logits", tl));
        }
        json_object_set_new(j, "prompt_ids", pi);
        json_object_set_new(j, "ids", gi);
        if (tok) json_object_set_new(j, "text", json_text(text ? text : "", tlen));
        json_object_set_new(j, "stop", json_string(stop));
        json_object_set_new(j, "steps", steps);
        char *s = json_dumps(j, JSON_COMPACT);
        CHECK(s);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        if (tok) {
            fwrite(text ? text : "", 1, tlen, stdout);
            printf("\n");
        }
        if (!tok || o->print_ids) {
            for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", out[i]);
            printf("\n");
        }
    }
    free(text);
}

int cmd_generate(int argc, char **argv) {
    struct gen_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    char err[8448];
    struct tokenizer *tok = NULL;
    if (o.tokenizer && !(tok = tokenizer_open(o.tokenizer, &(struct tokenizer_opts){0}, err, sizeof err))) {
        fprintf(stderr, "mtrain: error: generate: --tokenizer: %s\n", err);
        return EXIT_USAGE;
    }
    static struct model_source src;
    if ((rc = model_source_open(&src, o.model, o.recipe, err, sizeof err))) {
        fprintf(stderr, "mtrain: error: %s\n", err);
        tokenizer_close(tok);
        return rc;
    }
    int V = src.recipe.model.vocab_size, maxpos = src.max_positions;
    int32_t *prompt = NULL;
    long np = prompt_tokens(&o, tok, V, &prompt);
    if (np == 0) fprintf(stderr, "mtrain: error: the prompt is empty (at least one token is needed)\n");
    if (np > maxpos)
        fprintf(stderr, "mtrain: error: the prompt has %ld tokens, more than the model's %d positions\n", np, maxpos);
    if (np <= 0 || np > maxpos) {
        free(prompt);
        tokenizer_close(tok);
        return EXIT_USAGE;
    }
    if (!o.stop_set && tok) o.stop_id = tokenizer_eod(tok);
    /* the last generated token is never fed back: positions = prompt + tokens - 1 */
    long want = np + o.max_tokens - 1, max_T = want < maxpos ? want : maxpos;
    struct transformer m;
    if ((rc = model_source_build(&src, o.device, 1, 1, &m, err, sizeof err))) {
        if (err[0]) fprintf(stderr, "mtrain: error: %s\n", err);
        free(prompt);
        tokenizer_close(tok);
        return rc;
    }
    struct decoder d;
    decoder_create(&d, &m, (int)max_T);
    float *logits = xmalloc(sizeof(float) * V);
    double *p = xmalloc(sizeof(double) * V);
    struct cand *c = xmalloc(sizeof *c * V);
    int ntop = o.json ? (o.json_top < V ? o.json_top : V) : 0;
    int32_t *out = xmalloc(sizeof(int32_t) * o.max_tokens), *top_ids = xmalloc(sizeof(int32_t) * o.max_tokens * (ntop + 1));
    float *top_logits = xmalloc(sizeof(float) * o.max_tokens * (ntop + 1));
    uint64_t rng = o.seed;
    const char *stop = "max_tokens";
    double t0 = now_seconds();
    decoder_forward(&d, prompt, (int)np, logits);
    double t_prompt = now_seconds() - t0;
    int n = 0;
    for (;;) {
        if (ntop) {
            rank(c, logits, V);
            for (int k = 0; k < ntop; k++) top_ids[(size_t)n * ntop + k] = c[k].id, top_logits[(size_t)n * ntop + k] = c[k].logit;
        }
        int32_t next = sample(&o, logits, V, c, p, &rng);
        out[n++] = next;
        if (next == o.stop_id) {
            stop = "stop_id";
            break;
        }
        if (n == o.max_tokens) break;
        if (d.len == d.max_T) {
            stop = "max_positions";
            fprintf(stderr, "stopped at the model's %d positions\n", maxpos);
            break;
        }
        decoder_forward(&d, &next, 1, logits);
    }
    double t_all = now_seconds() - t0;
    print_result(&o, tok, prompt, np, out, n, stop, top_logits, top_ids, ntop);
    fprintf(stderr, "prompt %ld tokens in %.3f s; generated %d tokens in %.3f s (%.1f tokens/s) on %s\n", np, t_prompt,
            n, t_all - t_prompt, n > 1 ? (n - 1) / (t_all - t_prompt) : 0.0, m.be->name);
    free(logits), free(p), free(c), free(out), free(top_ids), free(top_logits), free(prompt);
    decoder_free(&d);
    transformer_free(&m);
    tokenizer_close(tok);
    return 0;
}
