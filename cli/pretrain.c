/* mtrain pretrain RECIPE [--set key=value]... [--dry-run]
 * Load and validate the recipe, then train: one console line and one JSON
 * line per step, validation loss every eval_interval steps. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/resource.h>

#include "checkpoint/weights.h"
#include "cli/cli.h"
#include "config/common.h"
#include "config/recipe.h"
#include "data/dataset.h"
#include "model/flops.h"
#include "model/trainer.h"

void openblas_set_num_threads(int);

static void usage(FILE *out) {
    fprintf(out,
            "usage: mtrain pretrain RECIPE [--set section.key=value]... [--dry-run]\n\n"
            "Train the model a YAML recipe describes (see docs/recipe.md, 'mtrain help recipe').\n\n"
            "  --set k=v    override any recipe key, e.g. --set train.steps=50 (repeatable)\n"
            "  --dry-run    print the resolved recipe, parameter count, FLOPs per token and\n"
            "               the memory estimate per rank, then exit\n\n"
            "Writes LOG_DIR/metrics.jsonl (one JSON object per step and per event) and\n"
            "LOG_DIR/model.safetensors (final weights, Hugging Face names).\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage or recipe error.\n");
}

struct options {
    const char *recipe;
    int dry_run;
};

/* World size from the launcher's environment (srun, mpirun), 0 if none. */
static int launcher_world_size(void) {
    const char *vars[] = {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 0;
}

/* Parse argv into r (recipe + overrides, validated). Returns an exit code or -1 to go on. */
static int parse(int argc, char **argv, struct options *o, struct recipe *r) {
    memset(o, 0, sizeof *o);
    recipe_defaults(r);
    const char *sets[256];
    int nsets = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dry-run")) {
            o->dry_run = 1;
        } else if (!strcmp(a, "--set") && i + 1 < argc) {
            if (nsets < 256) sets[nsets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            if (nsets < 256) sets[nsets++] = a + 6;
        } else if (a[0] == '-') {
            fprintf(stderr, "mtrain pretrain: unknown option '%s'\n", a);
            usage(stderr);
            return EXIT_USAGE;
        } else if (!o->recipe) {
            o->recipe = a;
        } else {
            fprintf(stderr, "mtrain pretrain: more than one recipe given ('%s' and '%s')\n", o->recipe, a);
            return EXIT_USAGE;
        }
    }
    if (!o->recipe) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (recipe_load(r, o->recipe) != 0) return EXIT_USAGE;
    for (int i = 0; i < nsets; i++)
        if (recipe_set(r, sets[i]) != 0) return EXIT_USAGE;
    /* A dry run plans for the launcher's world size; alone it checks only
     * what does not depend on one (0 = unknown). */
    int world = launcher_world_size();
    if (recipe_validate(r, world ? world : (o->dry_run ? 0 : 1)) != 0) return EXIT_USAGE;
    return -1;
}

static double peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return ru.ru_maxrss / 1024.0;
}

static void dry_run(const struct recipe *r) {
    printf("# resolved recipe (%s)\n", r->source);
    recipe_print(r, stdout);
    struct memory_estimate e = model_memory_estimate(r);
    double gib = 1024.0 * 1024 * 1024;
    printf("\n# plan\n");
    printf("parameters:       %lld\n", (long long)model_param_count(&r->model));
    printf("flops_per_token:  %.4g\n", model_flops_per_token(&r->model, r->train.seq_len));
    printf("flops_per_step:   %.4g\n",
           model_flops_per_token(&r->model, r->train.seq_len) * r->train.global_batch * r->train.seq_len);
    printf("memory_per_rank:  %.3f GiB (params %.3f, grads %.3f, adam %.3f, activations %.3f; fp32)\n",
           e.total / gib, e.params / gib, e.grads / gib, e.optimizer / gib, e.activations / gib);
}

struct run {
    const struct recipe *r;
    struct dataset *ds;
    struct sampler *train, *valid;
    struct trainer tr;
    FILE *metrics;
    char metrics_path[RECIPE_PATH_MAX + 32];
    int32_t *batch;      /* global_batch x (seq_len+1) */
    double flops_per_token;
};

static void open_data(struct run *run) {
    const struct recipe *r = run->r;
    run->ds = dataset_open(r->data.path);
    if (dataset_vocab_size(run->ds) > r->model.vocab_size)
        die("vocabulary mismatch: dataset %s has token ids up to %d but model.vocab_size is %d (%s)", r->data.path,
            dataset_vocab_size(run->ds) - 1, r->model.vocab_size, r->source);
    run->train = sampler_create(run->ds, r->train.seq_len, r->train.seed, SPLIT_TRAIN, r->data.valid_fraction);
    if (r->train.eval_interval > 0 && r->data.valid_fraction > 0)
        run->valid = sampler_create(run->ds, r->train.seq_len, r->train.seed, SPLIT_VALID, r->data.valid_fraction);
}

static void fill_batch(struct sampler *s, int32_t *out, int64_t first, int n, int T) {
    for (int i = 0; i < n; i++) sampler_get(s, first + i, out + (size_t)i * (T + 1));
}

static void log_eval(struct run *run, int step) {
    const struct recipe *r = run->r;
    int n = r->train.eval_batches * r->train.micro_batch;
    if (n > r->train.global_batch) n = r->train.global_batch - r->train.global_batch % r->train.micro_batch;
    double sum = 0;
    int done = 0;
    /* the same fixed validation samples every time, so the curve is comparable */
    for (int first = 0; first < r->train.eval_batches * r->train.micro_batch; first += n) {
        fill_batch(run->valid, run->batch, first, n, r->train.seq_len);
        sum += trainer_eval(&run->tr, run->batch, n) * n;
        done += n;
    }
    double val = sum / done;
    printf("eval  step %6d | val_loss %.4f | ppl %.2f\n", step, val, exp(val));
    fprintf(run->metrics, "{\"event\":\"eval\",\"step\":%d,\"val_loss\":%.6f}\n", step, val);
    fflush(run->metrics);
}

static void log_step(struct run *run, int step, const struct step_stats *st, double seconds) {
    const struct recipe *r = run->r;
    double tps = st->tokens / seconds, tflops = tps * run->flops_per_token / 1e12;
    double mfu = r->train.peak_tflops > 0 ? tflops / r->train.peak_tflops : 0;
    double mem = peak_rss_mib();
    fprintf(run->metrics,
            "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"tflops\":%.6f,"
            "\"mfu\":%.6f,\"mem_mib\":%.1f,\"step_ms\":%.2f,\"consumed_samples\":%lld}\n",
            step, st->loss, st->lr, st->grad_norm, tps, tflops, mfu, mem, seconds * 1e3,
            (long long)step * r->train.global_batch);
    fflush(run->metrics);
    if (step % r->log.interval && step != 1 && step != r->train.steps) return;
    char mfu_text[32] = "-";
    if (r->train.peak_tflops > 0) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", 100 * mfu);
    printf("step %6d/%d | loss %.4f | lr %.3e | gnorm %.3f | %8.0f tok/s | %.3f TFLOP/s | mfu %s | mem %.0f MiB\n",
           step, r->train.steps, st->loss, st->lr, st->grad_norm, tps, tflops, mfu_text, mem);
    fflush(stdout);
}

static int train(const struct recipe *r) {
    struct run run = {.r = r};
    const struct backend *be = backend_get(r->train.device);
    if (!be) return EXIT_RUNTIME;
    if (r->train.threads > 0) {
        omp_set_num_threads(r->train.threads);
        openblas_set_num_threads(r->train.threads);
    }
    open_data(&run);
    if (mkdir_p(r->log.dir) != 0) die("cannot create log.dir %s", r->log.dir);
    snprintf(run.metrics_path, sizeof run.metrics_path, "%s/metrics.jsonl", r->log.dir);
    run.metrics = xfopen(run.metrics_path, "w");
    trainer_create(&run.tr, be, r);
    if (r->model.init_from[0]) weights_load(be, run.tr.model.params, &run.tr.model.table, r->model.init_from);
    else llama_init_params(&run.tr.model, r->train.seed);
    run.flops_per_token = model_flops_per_token(&r->model, r->train.seq_len);
    int T = r->train.seq_len, G = r->train.global_batch;
    run.batch = xmalloc(sizeof(int32_t) * G * (T + 1));
    printf("mtrain %s | %s | llama %lld params | device %s | threads %d | data %s: %lld tokens, %lld docs\n",
           MTRAIN_VERSION, r->source, (long long)model_param_count(&r->model), be->name, omp_get_max_threads(),
           r->data.path, (long long)dataset_num_tokens(run.ds), (long long)dataset_num_docs(run.ds));
    fprintf(run.metrics, "{\"event\":\"start\",\"params\":%lld,\"flops_per_token\":%.6g,\"steps\":%d}\n",
            (long long)model_param_count(&r->model), run.flops_per_token, r->train.steps);
    double t_start = now_seconds();
    for (int step = 1; step <= r->train.steps; step++) {
        double t0 = now_seconds();
        fill_batch(run.train, run.batch, (int64_t)(step - 1) * G, G, T);
        struct step_stats st = trainer_step(&run.tr, run.batch, G);
        log_step(&run, step, &st, now_seconds() - t0);
        if (!isfinite(st.loss)) die("loss is %g at step %d", st.loss, step);
        if (run.valid && (step % r->train.eval_interval == 0 || step == r->train.steps)) log_eval(&run, step);
    }
    char path[RECIPE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", r->log.dir);
    weights_save(be, run.tr.model.params, &run.tr.model.table, path);
    fprintf(run.metrics, "{\"event\":\"end\",\"steps\":%d,\"seconds\":%.3f}\n", r->train.steps, now_seconds() - t_start);
    printf("done: %d steps in %.1f s; metrics in %s, weights in %s\n", r->train.steps, now_seconds() - t_start,
           run.metrics_path, path);
    xfclose(run.metrics, run.metrics_path);
    free(run.batch);
    trainer_free(&run.tr);
    sampler_free(run.train);
    if (run.valid) sampler_free(run.valid);
    dataset_close(run.ds);
    return 0;
}

int cmd_pretrain(int argc, char **argv) {
    static struct recipe r; /* large (paths); keep it off the stack */
    struct options o;
    int rc = parse(argc, argv, &o, &r);
    if (rc >= 0) return rc;
    if (o.dry_run) {
        dry_run(&r);
        return 0;
    }
    return train(&r);
}
