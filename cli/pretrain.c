/* mtrain pretrain RECIPE [--set key=value]... [--dry-run]
 * Parse options, load and validate the recipe before anything is allocated,
 * then plan (--dry-run) or train (pretrain_loop.c). */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/pretrain.h"
#include "config/common.h"
#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "parallel/grid.h"
#include "parallel/schedule.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: mtrain pretrain RECIPE [--set section.key=value]... [--resume auto|never|DIR] [--dry-run]\n\n"
            "Train the model a YAML recipe describes (see docs/recipe.md, 'mtrain help recipe').\n\n"
            "  --set k=v    override any recipe key, e.g. --set train.steps=50 (repeatable)\n"
            "  --dry-run    print the resolved recipe, parameter count, FLOPs per token and\n"
            "               the memory estimate per rank, then exit\n"
            "  --resume R   auto (default): continue from the newest committed checkpoint in\n"
            "               checkpoint.dir, falling back to older ones if it is damaged; never:\n"
            "               start fresh; DIR: that step directory (no fallback), or the newest\n"
            "               step of a checkpoint directory\n"
            "  --allow-data-change  resume although seq_len, the batch sizes, the data, the\n"
            "               seed or the vocabulary differ from the checkpoint's recipe\n"
            "  --stop-after N  save a checkpoint after step N and exit 0 (like SIGTERM)\n"
            "  --inject K@S fault injection for tests: nan, spike, crash or crash-in-save at step S\n"
            "               (crash@S:R crashes world rank R only)\n\n"
            "Signals: SIGTERM, SIGUSR1 or Ctrl-C (SIGINT) saves a checkpoint at the next step\n"
            "boundary and exits 0; a second SIGTERM or Ctrl-C exits at once.\n"
            "Writes LOG_DIR/metrics.jsonl (one JSON object per step and per event) and\n"
            "LOG_DIR/model.safetensors (final weights, Hugging Face names).\n"
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
    fprintf(stderr, "mtrain pretrain: bad --inject '%s' (expected nan|spike|crash|crash-in-save@STEP)\n", spec);
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
                fprintf(stderr, "mtrain pretrain: --stop-after needs a positive step count\n");
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--inject") && i + 1 < argc) {
            if (parse_inject(o, argv[++i]) != 0) return EXIT_USAGE;
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
    int world = parallel_world_size() > 1 ? parallel_world_size() : launcher_world_size();
    if (!o->dry_run && parallel_world_size() == 1 && launcher_world_size() > 1) {
        fprintf(stderr, "mtrain: error: the launcher started %d tasks but MPI sees a world of 1: this mtrain's MPI "
                "does not talk to the launcher (for srun, try --mpi=pmi2 or pmix)\n", launcher_world_size());
        return EXIT_USAGE;
    }
    if (recipe_validate(r, world ? world : (o->dry_run ? 0 : 1)) != 0) return EXIT_USAGE;
    return -1;
}

static int has_flag(int argc, char **argv, const char *a, const char *b) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], a) || (b && !strcmp(argv[i], b))) return 1;
    return 0;
}

static void dry_run(const struct recipe *r) {
    printf("# resolved recipe (%s)\n", r->source);
    recipe_print(r, stdout);
    int world = launcher_world_size();
    int dp = world ? world / (r->parallel.tp * r->parallel.pp * r->parallel.cp) : 1;
    /* the backend the run would use; "cuda" counts as CUDA even on a machine
     * without a GPU (planning on a login node) */
    int gpu = cuda_backend.attention_state_floats &&
              (!strcmp(r->train.device, "cuda") || (!strcmp(r->train.device, "auto") && cuda_backend_available()));
    const struct backend *be = gpu ? &cuda_backend : &cpu_backend;
    struct memory_estimate e = model_memory_estimate(r, dp > 0 ? dp : 1, be);
    double gib = 1024.0 * 1024 * 1024;
    printf("\n# plan\n");
    printf("parameters:       %lld\n", (long long)model_param_count(&r->model));
    if (r->model.num_experts > 0)
        printf("active_parameters: %lld (per token: %d of %d experts in %d MoE layers)\n",
               (long long)model_active_param_count(&r->model), r->model.experts_per_token, r->model.num_experts,
               model_moe_layer_count(&r->model));
    printf("flops_per_token:  %.4g\n", model_flops_per_token(&r->model, r->train.seq_len));
    printf("flops_per_step:   %.4g\n",
           model_flops_per_token(&r->model, r->train.seq_len) * r->train.global_batch * r->train.seq_len);
    if (r->parallel.pp > 1) {
        int m = r->train.global_batch / (r->train.micro_batch * dp);
        printf("pipeline schedule (%s, %d micro batches per rank, dp %d): F/B<micro batch>.<chunk>\n",
               r->parallel.vpp > 1 ? "interleaved 1F1B" : "1F1B", m, dp);
        if (r->parallel.vpp > 1 && m % r->parallel.pp)
            printf("  (none: interleaving needs the micro batches per rank, %d, to be a multiple of pp %d)\n", m,
                   r->parallel.pp);
        else
            schedule_print(stdout, r->parallel.pp, r->parallel.vpp, m);
    }
    printf("memory_per_rank:  %.3f GiB (params %.3f, grads %.3f, adam %.3f, activations %.3f, buffers %.3f; "
           "fp32, %s backend, pipeline stage 0, dp %d, recompute %s)\n",
           e.total / gib, e.params / gib, e.grads / gib, e.optimizer / gib, e.activations / gib, e.buffers / gib,
           be->name, dp > 0 ? dp : 1, r->train.recompute);
    printf("host_per_rank:    %.3f GiB (batches and final weights %.3f, checkpoint/final snapshot %.3f, process runtime %.3f)%s\n",
           (e.host + e.runtime) / gib, (e.host - e.snapshot) / gib, e.snapshot / gib, e.runtime / gib,
           e.runtime ? "; counted in memory_per_rank (the CPU backend's device is host memory)" : "");
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
        dup2(saved_stderr, STDERR_FILENO);
        close(saved_stderr);
    }
    if (rc < 0 && o.dry_run) {
        dry_run(&r);
        rc = 0;
    } else if (rc < 0) {
        rc = pretrain_run(&r, &o);
    }
    parallel_finalize();
    return rc;
}
