/* mtrain convert: reshard a checkpoint for another layout, print its
 * manifest, or export it as a Hugging Face model. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export.h"
#include "cli/cli.h"
#include "cli/model_source.h"
#include "config/common.h"
#include "config/recipe.h"
#include "data/tokenizer.h"
#include "data/tokenizer_export.h"
#include "data/tokenizer_record.h"

static void usage(FILE *out) {
    fprintf(out,
"usage: mtrain convert SRC DST --tp N --pp N [--vpp N] [--dp N] [--ep N] [--etp N] [--cp N] [--force]\n"
            "       mtrain convert --info SRC\n"
            "       mtrain convert SRC --hf OUT_DIR [--tokenizer SPEC]\n\n"
            "SRC is a checkpoint directory (its `latest` step is used) or one step directory;\n"
            "with --hf it may also be a run's LOG_DIR (its final weights, model.safetensors).\n"
            "  reshard   write SRC's step for the layout tp x pp (x vpp chunks) with dp data-parallel\n"
            "            ranks (ep of them splitting a MoE model's experts, etp each expert's width)\n"
            "            and cp context-parallel ranks\n"
            "            (the files do not depend on cp; it is checked against the sequence length) into checkpoint directory\n"
            "            DST, tensor by tensor (memory near the\n"
            "            largest tensor); `mtrain pretrain` with that layout resumes from DST.\n"
            "            DST must not exist or be empty (--force: write into it anyway); it is\n"
            "            never SRC's checkpoint directory\n"
            "  --info    print the manifest summary: step, data position, layout, files, tensors\n"
            "  --hf      write OUT_DIR/model.safetensors and config.json for transformers'\n"
            "            LlamaForCausalLM, MixtralForCausalLM or DeepseekV3ForCausalLM (fp32), and the\n"
            "            tokenizer the training data recorded (tokenizer.json, tokenizer_config.json;\n"
            "            BOS/EOS ids in config.json)\n"
            "  --tokenizer SPEC   with --hf: ship this tokenizer instead (bytes | hf:FILE | tiktoken:FILE;\n"
            "            --tiktoken-specials S and --tiktoken-regex RE as for `mtrain data build`)\n"
            "Any layout can also load any other directly; convert is for offline moves.\n");
}

/* 0 when DST may receive the converted checkpoint: not SRC's step or
 * checkpoint directory (never), and absent or empty unless forced. */
static int check_destination(const char *step_dir, const char *dst, int force) {
    char d[PATH_MAX], s[PATH_MAX], root[PATH_MAX + 4];
    if (!realpath(dst, d)) return 0; /* absent: created by the conversion */
    snprintf(root, sizeof root, "%s/..", step_dir);
    if ((realpath(step_dir, s) && !strcmp(s, d)) || (realpath(root, s) && !strcmp(s, d))) {
        fprintf(stderr, "mtrain: error: convert: DST %s is the source checkpoint's own directory: write the "
                "converted checkpoint somewhere else\n", dst);
        return 2;
    }
    DIR *dir = opendir(d);
    int empty = 1;
    for (struct dirent *e; dir && (e = readdir(dir));) empty &= !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    if (dir) closedir(dir);
    if (!dir || empty || force) return dir ? 0 : (fprintf(stderr, "mtrain: error: convert: DST %s exists and is not a "
                                                          "directory\n", dst), 2);
    fprintf(stderr, "mtrain: error: convert: DST %s exists and is not empty: choose a new directory, or pass "
            "--force to write the converted step into it\n", dst);
    return 2;
}

/* A checkpoint directory -> its latest committed step directory. */
static int resolve(const char *src, char *out, size_t n) {
    char probe[4400];
    snprintf(probe, sizeof probe, "%s/manifest.json", src);
    if (path_exists(probe)) {
        snprintf(out, n, "%s", src);
        return 0;
    }
    int step = checkpoint_latest(src);
    if (step < 0) {
        fprintf(stderr, "mtrain: error: %s: neither a step directory (no manifest.json) nor a checkpoint "
                "directory (no latest)\n", src);
        return -1;
    }
    checkpoint_step_dir(out, n, src, step);
    return 0;
}

static int info(const char *step_dir) {
    char path[4300];
    snprintf(path, sizeof path, "%s/manifest.json", step_dir);
    json_error_t jerr;
    json_t *m = json_load_file(path, 0, &jerr);
    if (!m) {
        fprintf(stderr, "mtrain: error: %s: cannot read manifest (line %d: %s)\n", path, jerr.line, jerr.text);
        return 1;
    }
    json_t *L = json_object_get(m, "layout"), *tensors = json_object_get(m, "tensors");
    long long params = 0;
    size_t i;
    json_t *e;
    json_array_foreach(tensors, i, e) {
        /* each tensor once, whole: block 0 of it (a routed expert's slice 0 is stored once, by whichever
         * TP rank holds it; any other tensor's by TP rank 0) */
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || !strncmp(name, "optimizer.", 10)) continue;
        json_t *jpart = json_object_get(e, "part");
        long long part = json_integer_value(jpart ? jpart : json_object_get(e, "tp_rank"));
        int expert = strstr(name, ".experts.") != NULL;
        if (part != 0 || (!expert && json_integer_value(json_object_get(e, "tp_rank")) != 0)) continue;
        long long n = 1;
        size_t d;
        json_t *x;
        json_array_foreach(json_object_get(e, "shape"), d, x) n *= json_integer_value(x);
        params += n;
    }
    printf("checkpoint:        %s\n", step_dir);
    printf("format:            %s v%lld\n", json_string_value(json_object_get(m, "format")),
           (long long)json_integer_value(json_object_get(m, "version")));
    printf("step:              %lld\n", (long long)json_integer_value(json_object_get(m, "step")));
    printf("consumed_samples:  %lld\n", (long long)json_integer_value(json_object_get(m, "consumed_samples")));
    printf("rewinds:           %lld\n", (long long)json_integer_value(json_object_get(m, "rewinds")));
    json_t *lcp = json_object_get(L, "cp"), *letp = json_object_get(L, "etp");
    printf("layout:            tp %lld, pp %lld, vpp %lld, dp %lld, ep %lld, etp %lld, cp %lld (%lld ranks)\n",
           (long long)json_integer_value(json_object_get(L, "tp")), (long long)json_integer_value(json_object_get(L, "pp")),
           (long long)json_integer_value(json_object_get(L, "vpp")), (long long)json_integer_value(json_object_get(L, "dp")),
           (long long)json_integer_value(json_object_get(L, "ep")), letp ? (long long)json_integer_value(letp) : 1,
           lcp ? (long long)json_integer_value(lcp) : 1,
           (long long)json_integer_value(json_object_get(L, "world_size")));
    printf("files:             %zu\n", json_array_size(json_object_get(m, "files")));
    printf("tensor shards:     %zu (parameters, exp_avg, exp_avg_sq)\n", json_array_size(tensors));
    printf("parameters:        %lld\n", params);
    printf("recipe:\n%s", json_string_value(json_object_get(m, "recipe")));
    json_decref(m);
    return 0;
}

/* The recipe stored in a checkpoint step's manifest. */
static int step_recipe(const char *step_dir, struct recipe *r, char *err, size_t errlen) {
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, errlen, &rc);
    if (!rd) return -1;
    int ok = ckpt_reader_load_recipe(rd, r, err, errlen) == 0;
    ckpt_reader_close(rd);
    return ok ? 0 : -1;
}

/* The layout checks of the reshard, said in the user's terms (the recipe
 * inside the checkpoint has no file a message could point at). */
static int check_layout(const char *step_dir, int tp, int pp, int vpp, int ep) {
    char err[4400];
    static struct recipe r;
    if (step_recipe(step_dir, &r, err, sizeof err) != 0) {
        fprintf(stderr, "mtrain: error: %s\n", err);
        return 1;
    }
    const struct model_config *m = &r.model;
    const char *why = NULL, *flag = "--tp";
    long long a = 0, b = tp;
    if (m->num_heads % tp) why = "num_heads", a = m->num_heads;
    else if (m->num_kv_heads % tp && tp % m->num_kv_heads) why = "num_kv_heads", a = m->num_kv_heads;
    else if (m->vocab_size % tp) why = "vocab_size", a = m->vocab_size;
    else if (m->intermediate_size % tp) why = "intermediate_size", a = m->intermediate_size;
    else if (m->num_layers % ((long long)pp * vpp))
        why = "num_layers", a = m->num_layers, b = (long long)pp * vpp, flag = vpp > 1 ? "--pp x --vpp" : "--pp";
    else if (ep > 1 && (!m->num_experts || m->num_experts % ep))
        why = "num_experts", a = m->num_experts, b = ep, flag = "--ep";
    if (!why) return 0;
    if (!strcmp(why, "num_kv_heads"))
        fprintf(stderr, "mtrain: error: convert %s: num_kv_heads %lld and %s %lld must divide one another\n", step_dir,
                a, flag, b);
    else
        fprintf(stderr, "mtrain: error: convert %s: model.%s %lld is not divisible by %s %lld\n", step_dir, why, a,
                flag, b);
    return 2;
}

struct tokenizer_choice {
    const char *spec;               /* --tokenizer, or NULL: the dataset's record */
    struct tokenizer_opts opts;
};

/* The tokenizer that made the training data of the run whose recipe is r
 * (NULL: unknown), from the record of the dataset it names; NULL with a
 * warning when that cannot be had (the model is still exported). */
static struct tokenizer *recorded_tokenizer(const struct recipe *rp, int lookup, int *model_vocab, int *max_len) {
    char err[4400];
    if (!rp) return NULL;
    const struct recipe r = *rp;
    *model_vocab = r.model.vocab_size;
    *max_len = r.model.max_seq_len ? r.model.max_seq_len : 8192;
    if (!lookup) return NULL;
    const char *dir = r.data.blend.n ? r.data.blend.e[0].path : r.data.path;
    struct tokenizer_record rec;
    int rc = tokenizer_record_load(dir, &rec, err, sizeof err);
    struct tokenizer *t = NULL;
    if (rc < 0)
        warn("no tokenizer files written: the training data's tokenizer is unknown (%s); pass --tokenizer SPEC", err);
    else if (rc == 0)
        warn("no tokenizer files written: dataset %s records no tokenizer (built before format version 2); pass "
             "--tokenizer SPEC", dir);
    else if (!(t = tokenizer_open_record(&rec, err, sizeof err)))
        warn("no tokenizer files written: dataset %s: %s; pass --tokenizer SPEC", dir, err);
    if (rc > 0) tokenizer_record_free(&rec);
    return t;
}

/* After the model: tokenizer.json, tokenizer_config.json and the BOS/EOS
 * ids in config.json. Returns an exit code. */
static int export_tokenizer(const struct recipe *r, const char *out, const struct tokenizer_choice *c) {
    char err[4400];
    int model_vocab = 0, max_len = 8192;
    struct tokenizer *t = recorded_tokenizer(r, !c->spec, &model_vocab, &max_len);
    if (c->spec) {
        if (!(t = tokenizer_open(c->spec, &c->opts, err, sizeof err))) {
            fprintf(stderr, "mtrain: error: convert: --tokenizer: %s\n", err);
            return 2;
        }
    }
    if (!t) return 0;
    int rc = 0;
    if (model_vocab && tokenizer_vocab_size(t) > model_vocab) {
        fprintf(stderr, "mtrain: %s: tokenizer %s has %d ids but the model only %d: no tokenizer files written\n",
                c->spec ? "error" : "warning", tokenizer_spec(t), tokenizer_vocab_size(t), model_vocab);
        rc = c->spec ? 1 : 0;
    } else if (tokenizer_export_hf(t, out, max_len, err, sizeof err) != 0 ||
               checkpoint_hf_set_token_ids(out, tokenizer_bos(t), tokenizer_eod(t), err, sizeof err) != 0) {
        fprintf(stderr, "mtrain: error: %s\n", err);
        rc = 1;
    } else {
        printf("wrote %s/tokenizer.json and tokenizer_config.json (%s, %d ids, bos %lld, eos %lld)\n", out,
               tokenizer_spec(t), tokenizer_vocab_size(t), (long long)tokenizer_bos(t), (long long)tokenizer_eod(t));
    }
    tokenizer_close(t);
    return rc;
}

/* A run's final weights (LOG_DIR or LOG_DIR/model.safetensors) rather than
 * a checkpoint: what a run without checkpoint.interval leaves. */
static int is_final_weights(const char *src) {
    char probe[4400];
    snprintf(probe, sizeof probe, "%s/manifest.json", src);
    if (path_exists(probe) || checkpoint_latest(src) >= 0) return 0;
    size_t n = strlen(src);
    snprintf(probe, sizeof probe, "%s/model.safetensors", src);
    return path_exists(probe) || (n > 12 && !strcmp(src + n - 12, ".safetensors"));
}

/* --hf from final weights: the tensors already carry Hugging Face names, so
 * the file is copied as it is (DeepSeek-V3: rewritten with its rotary rows
 * interleaved); the model comes from model.recipe.yaml. */
static int export_final_weights(const char *src, const char *out, const struct tokenizer_choice *c) {
    char err[4400];
    static struct model_source s;
    int rc = model_source_resolve(&s, src, NULL, err, sizeof err);
    if (rc == 0) rc = checkpoint_hf_check_model(&s.recipe.model, src, err, sizeof err) ? EXIT_USAGE : 0;
    if (rc) {
        fprintf(stderr, "mtrain: error: convert: %s\n", err);
        return rc;
    }
    if (mkdir_p(out) != 0) die("cannot create %s: %s", out, strerror(errno));
    char dst[4400];
    snprintf(dst, sizeof dst, "%s/model.safetensors", out);
    if (checkpoint_hf_weights_from_file(&s.recipe.model, s.path, dst, err, sizeof err) != 0) {
        fprintf(stderr, "mtrain: error: convert: %s\n", err);
        return EXIT_RUNTIME;
    }
    struct model_config mc = s.recipe.model; /* the positions eval and generate accept */
    mc.max_seq_len = model_max_positions(&mc, s.recipe.train.seq_len);
    checkpoint_hf_write_config(&mc, out);
    printf("wrote %s/model.safetensors and %s/config.json from %s\n", out, out, s.path);
    return export_tokenizer(s.has_run_recipe ? &s.recipe : NULL, out, c);
}

int cmd_convert(int argc, char **argv) {
    const char *src = NULL, *dst = NULL, *hf = NULL;
    struct tokenizer_choice tc = {0};
    int tp = 1, pp = 1, vpp = 1, dp = 1, ep = 1, etp = 1, cp = 1, show = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *num = !strcmp(a, "--tp") ? &tp : !strcmp(a, "--pp") ? &pp : !strcmp(a, "--vpp") ? &vpp
                   : !strcmp(a, "--dp") ? &dp : !strcmp(a, "--ep") ? &ep : !strcmp(a, "--etp") ? &etp
                   : !strcmp(a, "--cp") ? &cp : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (num && i + 1 < argc) {
            *num = atoi(argv[++i]);
            if (*num < 1) {
                fprintf(stderr, "mtrain: error: convert: %s needs a positive number\n", a);
                return 2;
            }
        } else if (!strcmp(a, "--info")) {
            show = 1;
        } else if (!strcmp(a, "--force")) {
            force = 1;
        } else if (!strcmp(a, "--hf") && i + 1 < argc) {
            hf = argv[++i];
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            tc.spec = argv[++i];
        } else if (!strcmp(a, "--tiktoken-specials") && i + 1 < argc) {
            tc.opts.tiktoken_specials = argv[++i];
        } else if (!strcmp(a, "--tiktoken-regex") && i + 1 < argc) {
            tc.opts.tiktoken_regex = argv[++i];
        } else if (a[0] == '-' || (src && dst)) {
            fprintf(stderr, "mtrain: error: convert: unexpected argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (!src) {
            src = a;
        } else {
            dst = a;
        }
    }
    if (!src || (!show && !hf && !dst)) {
        usage(stderr);
        return 2;
    }
    char step_dir[4096], err[4096];
    if (hf && !show && is_final_weights(src)) return export_final_weights(src, hf, &tc);
    if (resolve(src, step_dir, sizeof step_dir) != 0) return 1;
    if (show) return info(step_dir);
    int rc;
    if (hf) {
        rc = checkpoint_export_hf(step_dir, hf, err, sizeof err);
        if (rc == 0) printf("wrote %s/model.safetensors and %s/config.json from %s\n", hf, hf, step_dir);
        if (rc == 0) {
            static struct recipe r;
            if (step_recipe(step_dir, &r, err, sizeof err) != 0) {
                warn("%s: no tokenizer files written: %s", step_dir, err);
                return export_tokenizer(NULL, hf, &tc);
            }
            return export_tokenizer(&r, hf, &tc);
        }
    } else {
        int bad = check_layout(step_dir, tp, pp, vpp, ep);
        if (!bad) bad = check_destination(step_dir, dst, force);
        if (bad) return bad;
        rc = checkpoint_convert(step_dir, dst, tp, pp, vpp, dp, ep, etp, cp, err, sizeof err);
        if (rc == 0)
            printf("wrote %s (tp %d, pp %d, vpp %d, dp %d, ep %d, etp %d, cp %d) from %s\n", dst, tp, pp, vpp, dp, ep,
                   etp, cp, step_dir);
    }
    if (rc != 0) fprintf(stderr, "mtrain: error: %s\n", err);
    return rc == 0 ? 0 : rc == -2 ? 2 : 1;
}
