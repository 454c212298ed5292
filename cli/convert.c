/* mtrain convert: reshard a checkpoint for another layout, print its
 * manifest, or export it as a Hugging Face model. */
#include <jansson.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export.h"
#include "cli/cli.h"
#include "config/common.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: mtrain convert SRC DST --tp N --pp N [--vpp N] [--dp N] [--ep N]\n"
            "       mtrain convert --info SRC\n"
            "       mtrain convert SRC --hf OUT_DIR\n\n"
            "SRC is a checkpoint directory (its `latest` step is used) or one step directory.\n"
            "  reshard   write SRC's step for the layout tp x pp (x vpp chunks) with dp data-parallel\n"
            "            ranks (ep of them splitting a MoE model's experts) into checkpoint directory\n"
            "            DST, tensor by tensor (memory near the\n"
            "            largest tensor); `mtrain pretrain` with that layout resumes from DST\n"
            "  --info    print the manifest summary: step, data position, layout, files, tensors\n"
            "  --hf      write OUT_DIR/model.safetensors and config.json for transformers'\n"
            "            LlamaForCausalLM or MixtralForCausalLM (fp32)\n"
            "Any layout can also load any other directly; convert is for offline moves.\n");
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
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || !strncmp(name, "optimizer.", 10) || json_integer_value(json_object_get(e, "tp_rank")) != 0) continue;
        long long n = 1;
        size_t d;
        json_t *x;
        json_array_foreach(json_object_get(e, "local_shape"), d, x) n *= json_integer_value(x);
        params += n * (!strcmp(json_string_value(json_object_get(e, "shard")), "replicated") ? 1
                       : json_integer_value(json_object_get(e, "tp")));
    }
    printf("checkpoint:        %s\n", step_dir);
    printf("format:            %s v%lld\n", json_string_value(json_object_get(m, "format")),
           (long long)json_integer_value(json_object_get(m, "version")));
    printf("step:              %lld\n", (long long)json_integer_value(json_object_get(m, "step")));
    printf("consumed_samples:  %lld\n", (long long)json_integer_value(json_object_get(m, "consumed_samples")));
    printf("rewinds:           %lld\n", (long long)json_integer_value(json_object_get(m, "rewinds")));
    printf("layout:            tp %lld, pp %lld, vpp %lld, dp %lld (%lld ranks)\n",
           (long long)json_integer_value(json_object_get(L, "tp")), (long long)json_integer_value(json_object_get(L, "pp")),
           (long long)json_integer_value(json_object_get(L, "vpp")), (long long)json_integer_value(json_object_get(L, "dp")),
           (long long)json_integer_value(json_object_get(L, "world_size")));
    printf("files:             %zu\n", json_array_size(json_object_get(m, "files")));
    printf("tensor shards:     %zu (parameters, exp_avg, exp_avg_sq)\n", json_array_size(tensors));
    printf("parameters:        %lld\n", params);
    printf("recipe:\n%s", json_string_value(json_object_get(m, "recipe")));
    json_decref(m);
    return 0;
}

int cmd_convert(int argc, char **argv) {
    const char *src = NULL, *dst = NULL, *hf = NULL;
    int tp = 1, pp = 1, vpp = 1, dp = 1, ep = 1, show = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *num = !strcmp(a, "--tp") ? &tp : !strcmp(a, "--pp") ? &pp : !strcmp(a, "--vpp") ? &vpp
                   : !strcmp(a, "--dp") ? &dp : !strcmp(a, "--ep") ? &ep : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (num && i + 1 < argc) {
            *num = atoi(argv[++i]);
            if (*num < 1) {
                fprintf(stderr, "mtrain convert: %s needs a positive number\n", a);
                return 2;
            }
        } else if (!strcmp(a, "--info")) {
            show = 1;
        } else if (!strcmp(a, "--hf") && i + 1 < argc) {
            hf = argv[++i];
        } else if (a[0] == '-' || (src && dst)) {
            fprintf(stderr, "mtrain convert: unexpected argument '%s'\n\n", a);
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
    if (resolve(src, step_dir, sizeof step_dir) != 0) return 1;
    if (show) return info(step_dir);
    int rc;
    if (hf) {
        rc = checkpoint_export_hf(step_dir, hf, err, sizeof err);
        if (rc == 0) printf("wrote %s/model.safetensors and %s/config.json from %s\n", hf, hf, step_dir);
    } else {
        rc = checkpoint_convert(step_dir, dst, tp, pp, vpp, dp, ep, err, sizeof err);
        if (rc == 0)
            printf("wrote %s (tp %d, pp %d, vpp %d, dp %d, ep %d) from %s\n", dst, tp, pp, vpp, dp, ep, step_dir);
    }
    if (rc != 0) fprintf(stderr, "mtrain: error: %s\n", err);
    return rc == 0 ? 0 : rc == -2 ? 2 : 1;
}
