/* mtrain eval: loss and perplexity of a model over a dataset split, through
 * the training forward (transformer_step without gradients) and the training
 * sampler, so `--split valid` holds the same samples, in the same order, as a
 * run's eval with the same seed, seq_len and valid_fraction. With --ids it
 * scores one given sequence instead, and --dump writes its per-token losses
 * and top logits as JSON. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/json_number.h"
#include "cli/options.h"
#include "cli/model_source.h"
#include "config/common.h"
#include "data/dataset.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: mtrain eval MODEL --data DIR [--split valid|train|all] [options]\n"
            "       mtrain eval MODEL (--ids ID,ID,... | --ids-file FILE) [--dump FILE|-] [--top K]\n\n"
            "MODEL: as for mtrain generate (checkpoint of any layout, run LOG_DIR, .safetensors, Hugging\n"
            "Face directory). Defaults come from the model's training recipe when it has one.\n\n"
            "  --data DIR           dataset directory (mtrain data build/import)\n"
            "  --split S            valid (default): the held-out documents, as in training's eval;\n"
            "                       train: the rest; all: every document\n"
            "  --valid-fraction F   documents held out (default: the recipe's data.valid_fraction)\n"
            "  --seq-len T          tokens per sample (default: the recipe's train.seq_len)\n"
            "  --seed S             the sampler's seed (default: the recipe's train.seed)\n"
            "  --batch-size B       samples per forward (default: the recipe's train.micro_batch, else 1)\n"
            "  --batches N          score samples [0, N*B) of the split's order, as training's eval\n"
            "                       does with B = train.global_batch (default: one pass over the split)\n"
            "  --ids LIST           score this token sequence: the loss of each token after the first\n"
            "  --ids-file FILE      ... read from FILE (ids separated by commas or whitespace)\n"
            "  --dump FILE          with --ids: write JSON with, per position, the next token's loss and\n"
            "                       the top --top (default 5) logits ('-' = stdout)\n"
            "  --device D           auto (default) | cpu | cuda\n"
            "  --recipe FILE        the model of a bare .safetensors file (and its defaults)\n"
            "  --json               print the result as one JSON object\n"
            "  --progress S         over a split: a progress line on stderr every S seconds (default 10; 0: none)\n");
}

struct eval_opts {
    const char *model, *data, *split, *ids, *ids_file, *dump, *device, *recipe;
    double valid_fraction, progress_s;
    long long seed;
    int seq_len, batch, batches, top, json;
};

static int parse(int argc, char **argv, struct eval_opts *o) {
    *o = (struct eval_opts){.split = "valid", .device = "auto", .valid_fraction = -1, .seed = -1, .top = 5,
                            .progress_s = 10};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), -1;
        OPT_STR("--data", data);
        OPT_STR("--split", split);
        OPT_STR("--ids", ids);
        OPT_STR("--ids-file", ids_file);
        OPT_STR("--dump", dump);
        OPT_STR("--device", device);
        OPT_STR("--recipe", recipe);
        OPT_NUM("eval", "--valid-fraction", valid_fraction, strtod(v, &end), o->valid_fraction >= 0 && o->valid_fraction < 1)
        OPT_NUM("eval", "--seed", seed, strtoll(v, &end, 10), o->seed >= 0)
        OPT_NUM("eval", "--seq-len", seq_len, (int)strtol(v, &end, 10), o->seq_len > 0)
        OPT_NUM("eval", "--batch-size", batch, (int)strtol(v, &end, 10), o->batch > 0)
        OPT_NUM("eval", "--batches", batches, (int)strtol(v, &end, 10), o->batches > 0)
        OPT_NUM("eval", "--top", top, (int)strtol(v, &end, 10), o->top >= 0)
        OPT_NUM("eval", "--progress", progress_s, strtod(v, &end), o->progress_s >= 0)
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (a[0] != '-' && !o->model) o->model = a;
        else {
            opt_unexpected("eval", a, v);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    int given = !!o->data + !!o->ids + !!o->ids_file;
    const char *why = !o->model ? "no MODEL given"
                      : given != 1 ? "give exactly one of --data, --ids and --ids-file"
                      : o->dump && o->data ? "--dump goes with --ids or --ids-file"
                      : strcmp(o->split, "valid") && strcmp(o->split, "train") && strcmp(o->split, "all")
                          ? "--split must be valid, train or all"
                          : NULL;
    if (why) {
        fprintf(stderr, "mtrain: error: eval: %s\n\n", why);
        usage(stderr);
        return EXIT_USAGE;
    }
    return 0;
}

static void print_loss(const struct eval_opts *o, const char *what, long samples, long long tokens, double sum) {
    double loss = tokens ? sum / tokens : NAN;
    if (o->json)
        printf("{\"split\":\"%s\",\"samples\":%ld,\"tokens\":%lld,\"loss\":%.9g,\"perplexity\":%.9g}\n", what,
               samples, tokens, loss, exp(loss));
    else
        printf("eval %s: %ld samples, %lld tokens | loss %.6f | ppl %.4f\n", what, samples, tokens, loss, exp(loss));
}

/* ---- a given sequence ---- */

static int write_dump(const char *path, const int32_t *ids, int n, const float *losses, const float *logits, int V,
                      int top) {
    json_t *pos = json_array();
    int *best = xmalloc(sizeof(int) * (top ? top : 1));
    for (int t = 0; t < n; t++) {
        const float *row = logits + (size_t)t * V;
        int k = 0; /* the top logits by insertion (top is small), ties to the lower id */
        for (int i = 0; i < V; i++) {
            int at = k < top ? k++ : top;
            while (at > 0 && row[i] > row[best[at - 1]]) {
                if (at < top) best[at] = best[at - 1];
                at--;
            }
            if (at < top) best[at] = i;
        }
        json_t *ti = json_array(), *tl = json_array();
        for (int j = 0; j < k; j++) {
            json_array_append_new(ti, json_integer(best[j]));
            json_array_append_new(tl, json_finite_or_null(row[best[j]]));
        }
        json_t *e = json_pack("{s:i, s:i, s:o, s:o}", "pos", t, "id", ids[t], "top_ids", ti, "top_logits", tl);
        json_object_set_new(e, "target", t + 1 < n ? json_integer(ids[t + 1]) : json_null());
        json_object_set_new(e, "loss", t + 1 < n ? json_finite_or_null(losses[t]) : json_null());
        json_array_append_new(pos, e);
    }
    free(best);
    json_t *j = json_pack("{s:i, s:o}", "tokens", n, "positions", pos);
    char *s = json_dumps(j, JSON_COMPACT);
    CHECK(s);
    int rc = 0;
    if (!strcmp(path, "-")) {
        printf("%s\n", s);
    } else {
        FILE *f = fopen(path, "w");
        if (!f || fputs(s, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "mtrain: error: cannot write --dump %s\n", path);
            rc = EXIT_RUNTIME;
        }
    }
    free(s);
    json_decref(j);
    return rc;
}

static int eval_ids(const struct eval_opts *o, const struct model_source *src) {
    char err[8448];
    int V = src->recipe.model.vocab_size;
    char *text = NULL;
    if (o->ids_file && !(text = read_file(o->ids_file, NULL))) {
        fprintf(stderr, "mtrain: error: --ids-file %s: cannot read it\n", o->ids_file);
        return EXIT_USAGE;
    }
    int32_t *ids;
    long n = parse_token_ids(text ? text : o->ids, V, o->ids_file ? o->ids_file : "--ids", &ids, err, sizeof err);
    free(text);
    if (n < 0) return fprintf(stderr, "mtrain: error: %s\n", err), EXIT_USAGE;
    if (n < 2 || n > src->max_positions) { /* the loss of a token needs one before it */
        fprintf(stderr, "mtrain: error: the sequence has %ld tokens; scoring takes 2 to %d (the loss of each token "
                "after the first)\n", n, src->max_positions);
        free(ids);
        return EXIT_USAGE;
    }
    struct transformer m;
    int rc = model_source_build(src, o->device, 1, (int)n, &m, err, sizeof err);
    if (rc) {
        if (err[0]) fprintf(stderr, "mtrain: error: %s\n", err);
        free(ids);
        return rc;
    }
    int32_t *targets = xmalloc(sizeof(int32_t) * n);
    for (long t = 0; t < n; t++) targets[t] = t + 1 < n ? ids[t + 1] : -1;
    double sum = transformer_step(&m, ids, targets, 0.0f);
    if (o->dump) {
        float *losses = xmalloc(sizeof(float) * n), *logits = xmalloc(sizeof(float) * n * V);
        m.be->to_host(losses, m.slots[0].losses, sizeof(float) * n);
        m.be->to_host(logits, m.slots[0].logits, sizeof(float) * n * V);
        rc = write_dump(o->dump, ids, (int)n, losses, logits, V, o->top < V ? o->top : V);
        free(losses), free(logits);
    }
    if (!o->dump || strcmp(o->dump, "-")) print_loss(o, "ids", 1, n - 1, sum);
    free(targets), free(ids);
    transformer_free(&m);
    return rc;
}

/* ---- a dataset split ---- */

static int eval_data(const struct eval_opts *o, const struct model_source *src) {
    const struct recipe *r = &src->recipe;
    int T = o->seq_len ? o->seq_len : src->has_run_recipe ? r->train.seq_len : 0;
    int B = o->batch ? o->batch : src->has_run_recipe ? r->train.micro_batch : 1;
    double vf = o->valid_fraction >= 0 ? o->valid_fraction : r->data.valid_fraction;
    uint64_t seed = o->seed >= 0 ? (uint64_t)o->seed : r->train.seed;
    if (!T) return fprintf(stderr, "mtrain: error: eval: this model has no training recipe: give --seq-len\n"), EXIT_USAGE;
    if (T > src->max_positions) {
        fprintf(stderr, "mtrain: error: --seq-len %d is longer than the model's %d positions\n", T, src->max_positions);
        return EXIT_USAGE;
    }
    int all = !strcmp(o->split, "all");
    enum split split = !strcmp(o->split, "valid") ? SPLIT_VALID : SPLIT_TRAIN;
    if (split == SPLIT_VALID && vf <= 0) {
        fprintf(stderr, "mtrain: error: the valid split is empty (valid fraction 0): give --valid-fraction or "
                "--split all\n");
        return EXIT_USAGE;
    }
    struct dataset *ds = dataset_open(o->data); /* errors name the file, exit 1 */
    if (dataset_vocab_size(ds) > r->model.vocab_size) {
        fprintf(stderr, "mtrain: error: %s: dataset vocabulary %d is larger than the model's %d\n", o->data,
                dataset_vocab_size(ds), r->model.vocab_size);
        dataset_close(ds);
        return EXIT_USAGE;
    }
    struct sampler *smp = sampler_create_version(ds, T, seed, split, all ? 0.0 : vf, r->data.sampler_version);
    long per_epoch = (long)sampler_samples_per_epoch(smp);
    long samples = o->batches ? (long)o->batches * B : per_epoch;
    if (samples <= 0) {
        fprintf(stderr, "mtrain: error: %s: the %s split has no sample of %d tokens\n", o->data, o->split, T + 1);
        sampler_free(smp), dataset_close(ds);
        return EXIT_USAGE;
    }
    char err[8448];
    struct transformer m;
    int rc = model_source_build(src, o->device, B, T, &m, err, sizeof err);
    if (rc) {
        if (err[0]) fprintf(stderr, "mtrain: error: %s\n", err);
        sampler_free(smp), dataset_close(ds);
        return rc;
    }
    int32_t *sample = xmalloc(sizeof(int32_t) * (T + 1)), *tokens = xmalloc(sizeof(int32_t) * B * T),
            *targets = xmalloc(sizeof(int32_t) * B * T);
    double sum = 0, t0 = now_seconds(), said = t0;
    long long ntok = 0;
    for (long first = 0; first < samples; first += B) {
        double now = now_seconds();
        if (o->progress_s > 0 && now - said >= o->progress_s) { /* a long split: progress on stderr (stdout: the result) */
            fprintf(stderr, "eval %s: %ld of %ld samples, loss so far %.6f, %.0f tokens/s\n", o->split, first, samples,
                    ntok ? sum / ntok : 0.0, ntok / (now - t0));
            said = now;
        }
        for (int b = 0; b < B; b++) {
            int32_t *tk = tokens + (size_t)b * T, *tg = targets + (size_t)b * T;
            if (first + b >= samples) { /* a short last batch: rows that count for nothing */
                memset(tk, 0, sizeof(int32_t) * T);
                for (int t = 0; t < T; t++) tg[t] = -1;
                continue;
            }
            sampler_get(smp, first + b, sample);
            memcpy(tk, sample, sizeof(int32_t) * T);
            memcpy(tg, sample + 1, sizeof(int32_t) * T);
            ntok += T;
        }
        sum += transformer_step(&m, tokens, targets, 0.0f);
    }
    double secs = now_seconds() - t0;
    print_loss(o, o->split, samples, ntok, sum);
    fprintf(stderr, "%lld tokens in %.2f s (%.0f tokens/s) on %s\n", ntok, secs, secs > 0 ? ntok / secs : 0.0,
            m.be->name);
    free(sample), free(tokens), free(targets);
    transformer_free(&m);
    sampler_free(smp);
    dataset_close(ds);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    struct eval_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    static struct model_source src;
    char err[8448];
    if ((rc = model_source_open(&src, o.model, o.recipe, err, sizeof err))) {
        fprintf(stderr, "mtrain: error: %s\n", err);
        return rc;
    }
    return o.data ? eval_data(&o, &src) : eval_ids(&o, &src);
}
