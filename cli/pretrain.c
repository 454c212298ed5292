/* mtrain pretrain RECIPE [--set key=value]... [--dry-run]
 * Parse options, load and validate the recipe before anything is allocated,
 * then plan (--dry-run) or train (pretrain_loop.c). */
#include <fcntl.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/pretrain.h"
#include "config/common.h"
#include "config/recipe.h"
#include "data/tokenizer_record.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "parallel/grid.h"
#include "parallel/schedule.h"
#include "parallel/timeline.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: mtrain pretrain RECIPE [--set section.key=value]... [--resume auto|never|DIR] [--force]\n"
            "                       [--allow-data-change] [--stop-after N] [--dry-run [--verbose]]\n\n"
            "Train the model a YAML recipe describes (see docs/recipe.md, 'mtrain help recipe').\n\n"
            "  --set k=v    override any recipe key, e.g. --set train.steps=50 (repeatable)\n"
            "  --dry-run    print the resolved recipe, parameter count, FLOPs per token, a\n"
            "               pipeline schedule summary and the memory estimate per pipeline\n"
            "               stage with a fit verdict (train.device_memory_gib), then exit;\n"
            "               needs no data (data.path is not checked)\n"
            "  --verbose    with --dry-run: every pipeline rank's full schedule\n"
            "  --resume R   auto (default): continue from the newest committed checkpoint in\n"
            "               checkpoint.dir, falling back to older ones if it is damaged; never:\n"
            "               start fresh; DIR: that step directory (no fallback), or the newest\n"
            "               step of a checkpoint directory\n"
            "  --allow-data-change  resume although seq_len, the batch sizes, the data, the\n"
            "               seed or the vocabulary differ from the checkpoint's recipe\n"
            "  --force      start although log.dir holds another run's metrics: they are\n"
            "               moved to LOG_DIR/metrics.jsonl.N (TensorBoard files to\n"
            "               LOG_DIR/tensorboard.N/); without it such a start exits 2\n"
            "  --stop-after N  save a checkpoint after step N and exit 0 (like SIGTERM)\n"
            "  --inject K@S fault injection for tests: nan, spike, crash or crash-in-save at step S\n"
            "               (crash@S:R crashes world rank R only)\n\n"
            "Signals: SIGTERM, SIGUSR1 or Ctrl-C (SIGINT) saves a checkpoint at the next step\n"
            "boundary and exits 0; a second SIGTERM or Ctrl-C exits at once.\n"
            "Writes LOG_DIR/metrics.jsonl (one JSON object per step and per event) and\n"
            "LOG_DIR/model.safetensors (final weights, Hugging Face names); with log.tensorboard\n"
            "also LOG_DIR/events.out.tfevents.* (the same scalars; scripts/plot_metrics.py draws them).\n"
            "Diagnostics, from the environment:\n"
            "  MTRAIN_PROFILE=1   where the steps' time goes, op by op (LOG_DIR/profile-rank-*.json)\n"
            "  MTRAIN_TIMELINE=N  step N's forwards, backwards and communication calls per rank, as a\n"
            "                     Chrome trace (LOG_DIR/timeline-rank-*.json) with how much of the\n"
            "                     data-parallel gradient reduction overlapped backward\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage or recipe error.\n");
}


/* --inject KIND@STEP: fault injection for tests. */
static int parse_inject(struct pretrain_opts *o, const char *spec) {
    static const char *const kinds[] = {"nan", "spike", "crash", "crash-in-save"};
    int *slots[] = {&o->inject_nan, &o->inject_spike, &o->inject_crash, &o->inject_crash_in_save};
    const char *at = strchr(spec, '@'), *colon = at ? strchr(at, ':') : NULL;
    int step = at ? atoi(at + 1) : 0;
    if (colon) o->inject_crash_rank = atoi(colon + 1);
    for (int k = 0; at && step > 0 && k < 4; k++)
        if ((size_t)(at - spec) == strlen(kinds[k]) && !strncmp(spec, kinds[k], at - spec)) {
            *slots[k] = step;
            return 0;
        }
    fprintf(stderr, "mtrain: error: pretrain: bad --inject '%s' (expected nan|spike|crash|crash-in-save@STEP)\n", spec);
    return -1;
}

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
static int parse(int argc, char **argv, struct pretrain_opts *o, struct recipe *r) {
    memset(o, 0, sizeof *o);
    o->resume = "auto";
    o->inject_crash_rank = -1;
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
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            o->verbose = 1;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "--set") && i + 1 < argc) {
            if (nsets < 256) sets[nsets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            if (nsets < 256) sets[nsets++] = a + 6;
        } else if (!strcmp(a, "--resume") && i + 1 < argc) {
            o->resume = argv[++i];
        } else if (!strncmp(a, "--resume=", 9)) {
            o->resume = a + 9;
        } else if (!strcmp(a, "--allow-data-change")) {
            o->allow_data_change = 1;
        } else if (!strcmp(a, "--stop-after") && i + 1 < argc) {
            o->stop_after = atoi(argv[++i]);
            if (o->stop_after <= 0) {
                fprintf(stderr, "mtrain: error: pretrain: --stop-after needs a positive step count\n");
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--inject") && i + 1 < argc) {
            if (parse_inject(o, argv[++i]) != 0) return EXIT_USAGE;
        } else if (a[0] == '-') {
            fprintf(stderr, "mtrain: error: pretrain: unknown option '%s'\n", a);
            usage(stderr);
            return EXIT_USAGE;
        } else if (!o->recipe) {
            o->recipe = a;
        } else {
            fprintf(stderr, "mtrain: error: pretrain: more than one recipe given ('%s' and '%s')\n", o->recipe, a);
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
    /* model.vocab_size: auto -> the dataset's recorded tokenizer vocabulary */
    if (r->model.vocab_size == RECIPE_VOCAB_AUTO && tokenizer_record_resolve_vocab(r) != 0) return EXIT_USAGE;
    /* A dry run plans for the launcher's world size; alone it checks only
     * what does not depend on one (0 = unknown). */
    int world = parallel_world_size() > 1 ? parallel_world_size() : launcher_world_size();
    if (!o->dry_run && parallel_world_size() == 1 && launcher_world_size() > 1) {
        fprintf(stderr, "mtrain: error: the launcher started %d tasks but MPI sees a world of 1: this mtrain's MPI "
                "does not talk to the launcher (for srun, try --mpi=pmi2 or pmix)\n", launcher_world_size());
        return EXIT_USAGE;
    }
    if (o->verbose && !o->dry_run) {
        fprintf(stderr, "mtrain pretrain: --verbose goes with --dry-run (a training run prints its steps anyway)\n");
        return EXIT_USAGE;
    }
    /* a dry run plans away from the data: paths are not checked (it says so) */
    if (o->dry_run ? recipe_validate_plan(r, world) : recipe_validate(r, world ? world : 1)) return EXIT_USAGE;
    char err[160];
    if (timeline_parse_step(getenv("MTRAIN_TIMELINE"), err, sizeof err) < 0) { /* parallel/timeline.h */
        if (parallel_world_rank() == 0) fprintf(stderr, "mtrain: error: %s\n", err);
        return EXIT_USAGE;
    }
    return -1;
}

static int has_flag(int argc, char **argv, const char *a, const char *b) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], a) || (b && !strcmp(argv[i], b))) return 1;
    return 0;
}

#define GIB (1024.0 * 1024 * 1024)

/* What the dry run could not check without the data. */
static void print_data_note(const struct recipe *r) {
    if (r->data.blend.n)
        printf("data_checked:     no (dry run): the %d datasets of data.blend are not opened\n", r->data.blend.n);
    else if (r->data.path[0])
        printf("data_checked:     no (dry run): data.path %s is not opened\n", r->data.path);
    else
        printf("data_checked:     no (dry run): data.path is not set; a training run needs it (or data.blend)\n");
}

/* Per stage counts and the bubble; every rank's full list with --verbose. */
static void print_schedule(const struct recipe *r, int dp, int verbose) {
    int m = r->train.global_batch / (r->train.micro_batch * dp);
    enum sched_kind kind = schedule_kind(r->parallel.schedule, r->parallel.vpp);
    printf("pipeline schedule (%s, %d micro batches per rank, dp %d):\n",
           kind == SCHED_DUALPIPEV ? "DualPipeV, two chunks per rank in a V, forward&backward pairs overlapped"
           : kind == SCHED_ZBV     ? "ZB-V, zero bubble, two chunks per rank in a V"
           : kind == SCHED_ZB_H1 ? "ZB-H1, zero bubble"
           : kind == SCHED_INTERLEAVED ? "interleaved 1F1B" : "1F1B", m, dp);
    if (kind == SCHED_INTERLEAVED && m % r->parallel.pp) {
        printf("  (none: interleaving needs the micro batches per rank, %d, to be a multiple of pp %d)\n", m,
               r->parallel.pp);
        return;
    }
    schedule_print_summary(stdout, kind, r->parallel.pp, r->parallel.vpp, m);
    if (verbose) {
        printf("  every rank's order (F/B/W<micro batch>.<chunk>; W: a backward's weight gradients):\n");
        schedule_print(stdout, kind, r->parallel.pp, r->parallel.vpp, m);
    } else {
        printf("  (--verbose prints every rank's order)\n");
    }
}

/* Why an estimate is large: the biggest part in words. */
static void print_largest(const struct recipe *r, const struct memory_estimate *e, const struct backend *be) {
    double parts[] = {e->params + e->grads + e->optimizer, e->activations, e->buffers};
    if (e->total < 64 * GIB || parts[1] < parts[0] || parts[1] < parts[2]) return;
    printf("  (mostly activations: %d micro batch%s in flight x micro_batch %d x seq %d, recompute %s", e->in_flight,
           e->in_flight > 1 ? "es" : "", r->train.micro_batch, r->train.seq_len, r->train.recompute);
    if (!strcmp(be->name, "cpu"))
        printf("; the cpu backend keeps heads x seq x seq attention probabilities per layer (the cuda backend keeps "
               "one value per row)%s", strcmp(r->train.device, "cuda") ? "" : ": this build has no CUDA backend");
    printf(")\n");
}

/* Memory per pipeline stage against train.device_memory_gib. */
static void print_fit(const struct recipe *r, int dp, int world, const struct backend *be) {
    double cap = r->train.device_memory_gib;
    int pp = r->parallel.pp, per_stage = world ? world / pp : 0, bad = 0, worst = 0;
    double worst_over = 0;
    if (cap <= 0) {
        printf("fit:              not judged (set train.device_memory_gib to the memory of one %s)\n",
               strcmp(be->name, "cpu") ? "GPU" : "node");
        return;
    }
    printf("fit (train.device_memory_gib %g GiB per %s):\n", cap, strcmp(be->name, "cpu") ? "device" : "rank");
    for (int k = 0; k < pp; k++) {
        struct memory_estimate e = model_memory_estimate_stage(r, dp, be, k);
        double need = e.total / GIB, over = need - cap;
        char ranks[64] = "";
        if (per_stage) snprintf(ranks, sizeof ranks, " (ranks %d-%d)", k * per_stage, (k + 1) * per_stage - 1);
        if (over > 0)
            printf("  stage %d%s needs %.3f GiB of %g GiB: does not fit by %.3f GiB\n", k, ranks, need, cap, over);
        else
            printf("  stage %d%s needs %.3f GiB of %g GiB: fits, %.3f GiB to spare\n", k, ranks, need, cap, -over);
        if (over > 0) bad++;
        if (over > worst_over) worst_over = over, worst = k;
    }
    if (!bad) {
        printf("verdict:          fits on every rank\n");
        return;
    }
    printf("verdict:          does not fit: %d of %d pipeline stage%s over (worst: stage %d by %.3f GiB); try", bad, pp,
           pp > 1 ? "s" : "", worst, worst_over);
    if (strcmp(r->train.recompute, "full")) printf(" train.recompute=%s,", strcmp(r->train.recompute, "none") ? "full" : "selective or full");
    if (!r->optimizer.distributed) printf(" optimizer.distributed=true (ZeRO-1 over dp),");
    if (r->train.micro_batch > 1) printf(" a smaller train.micro_batch,");
    printf(" more parallel.pp or parallel.tp\n");
}

static void dry_run(const struct recipe *r, int verbose) {
    printf("# resolved recipe (%s)\n", r->source);
    recipe_print(r, stdout);
    int world = launcher_world_size();
    int dp = world ? world / (r->parallel.tp * r->parallel.pp * r->parallel.cp) : 1;
    if (dp < 1) dp = 1;
    /* the backend the run would use; "cuda" counts as CUDA even on a machine
     * without a GPU (planning on a login node) */
    int gpu = cuda_backend.attention_state_floats &&
              (!strcmp(r->train.device, "cuda") || (!strcmp(r->train.device, "auto") && cuda_backend_available()));
    const struct backend *be = backend_table(gpu, r->train.precision);
    struct memory_estimate e = model_memory_estimate(r, dp, be);
    printf("\n# plan (%s)\n", world ? "for the launcher's world size" : "world size unknown: dp 1 assumed; SLURM_NTASKS=N plans for N ranks");
    print_data_note(r);
    model_print_param_counts(stdout, &r->model); /* total and active; main model and MTP */
    printf("flops_per_token:  %.4g\n", model_flops_per_token(&r->model, r->train.seq_len));
    printf("flops_per_step:   %.4g\n",
           model_flops_per_token(&r->model, r->train.seq_len) * r->train.global_batch * r->train.seq_len);
    if (r->parallel.pp > 1) print_schedule(r, dp, verbose);
    char working[64] = "";
    if (e.weights) snprintf(working, sizeof working, ", bf16 working weights %.3f", e.weights / GIB);
    printf("memory_per_rank:  %.3f GiB (params %.3f%s, grads %.3f, adam %.3f, activations %.3f, buffers %.3f; "
           "%s, %s backend, pipeline stage 0, dp %d, recompute %s)\n",
           e.total / GIB, e.params / GIB, working, e.grads / GIB, e.optimizer / GIB, e.activations / GIB,
           e.buffers / GIB, r->train.precision, be->name, dp, r->train.recompute);
    print_largest(r, &e, be);
    if (e.local_params) { /* what each parameter this rank holds costs it (Megatron's 6 + 12/dp at bf16 ZeRO-1) */
        double n = (double)e.local_params;
        printf("bytes_per_param:  %.3f (fp32 master %.3f, working weights %.3f, grads %.3f, adam %.3f; %.4g local "
               "parameters)\n",
               (e.params + e.weights + e.grads + e.optimizer) / n, e.params / n, e.weights / n, e.grads / n,
               e.optimizer / n, n);
    }
    printf("host_per_rank:    %.3f GiB (batches and final weights %.3f, checkpoint/final snapshot %.3f on the ranks that "
           "write one: data-parallel rank 0 of each shard, process runtime %.3f)%s\n",
           (e.host + e.runtime) / GIB, (e.host - e.snapshot) / GIB, e.snapshot / GIB, e.runtime / GIB,
           e.runtime ? "; counted in memory_per_rank (the CPU backend's device is host memory)" : "");
    print_fit(r, dp, world, be);
}

int cmd_pretrain(int argc, char **argv) {
    static struct recipe r; /* large (paths); keep it off the stack */
    struct pretrain_opts o;
    int launched = !has_flag(argc, argv, "--dry-run", NULL) && !has_flag(argc, argv, "--help", "-h");
    int saved_stderr = -1;
    if (launched) {
        parallel_init(&argc, &argv);
        /* every rank checks the recipe; only rank 0 says what is wrong */
        if (parallel_world_rank() != 0) {
            int devnull = open("/dev/null", O_WRONLY);
            saved_stderr = dup(STDERR_FILENO);
            if (devnull >= 0 && saved_stderr >= 0) dup2(devnull, STDERR_FILENO);
            if (devnull >= 0) close(devnull);
        }
    }
    int rc = parse(argc, argv, &o, &r);
    if (saved_stderr >= 0) {
        fflush(stderr);
        if (dup2(saved_stderr, STDERR_FILENO) < 0) die("cannot restore stderr: %s", strerror(errno));
        close(saved_stderr);
    }
    if (rc < 0 && o.dry_run) {
        dry_run(&r, o.verbose);
        rc = 0;
    } else if (rc < 0) {
        rc = pretrain_run(&r, &o);
    }
    parallel_finalize();
    return rc;
}
