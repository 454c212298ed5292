/* mtrain plan: choose the layout for N accelerators by modelling the step
 * (model/plan.h) of every valid layout that fits memory, and rank them;
 * --calibrate measures this machine's CPU ranks into a system file. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "config/common.h"
#include "config/system.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "model/plan.h"
#include "parallel/comm.h"
#include "parallel/grid.h"

static const char usage[] =
    "usage: mtrain plan RECIPE --gpus N [--gpu h100|h200|a100|b200|FILE] [--gpus-per-node K] [--top K]\n"
    "                   [--emit DIR] [--set key=value]...\n"
    "       mtrain plan RECIPE --gpus N --layout tp,pp,vpp,cp,ep,micro_batch,recompute [--gpu ...]\n"
    "       mpiexec -n R mtrain plan --calibrate FILE\n"
    "\n"
    "Enumerates the layouts of RECIPE's model on N accelerators (tp, pp, vpp, cp, ep, the micro\n"
    "batch and the recompute mode; the global batch fixed; ZeRO-1 as the recipe says), drops those\n"
    "that are invalid or do not fit memory (the dry run's estimate), predicts each one's step time\n"
    "(compute per op at the system's efficiencies, communication per collective, the pipeline\n"
    "schedule simulated with those costs; docs/plan.md) and prints the best K: step time, tokens/s,\n"
    "TFLOP/s and MFU per accelerator, memory, bubble, exposed communication. --gpu names a shipped\n"
    "system (recipes/systems/NAME.yaml) or a system file (default h100). --layout predicts one\n"
    "layout. --emit DIR writes DIR/recipe.yaml (the recipe with the best layout) and DIR/submit.sh\n"
    "(its sbatch line). --calibrate times this machine's GEMMs, attention, memory bandwidth and,\n"
    "with R >= 2 ranks, MPI collectives between them, and writes a system file of R ranks per node.\n";

/* --gpu NAME: a file, or recipes/systems/NAME.yaml beside the working directory or the executable */
static int find_system(const char *gpu, char *path, size_t n) {
    struct stat st;
    if (stat(gpu, &st) == 0 && S_ISREG(st.st_mode)) return snprintf(path, n, "%s", gpu), 0;
    snprintf(path, n, "recipes/systems/%s.yaml", gpu);
    if (stat(path, &st) == 0) return 0;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        /* beside the executable, or at the root of the tree whose build/KIND/ holds it */
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0;
            if (up == 1) continue;
            snprintf(path, n, "%.3000s/recipes/systems/%s.yaml", exe, gpu);
            if (stat(path, &st) == 0) return 0;
        }
    }
    return -1;
}

struct candidate {
    struct parallel_config par;
    int micro_batch;
    char recompute[16];
    struct plan_cost cost;
};

static void apply(struct recipe *r, const struct candidate *c) {
    r->parallel = c->par;
    r->train.micro_batch = c->micro_batch;
    snprintf(r->train.recompute, sizeof r->train.recompute, "%s", c->recompute);
}

static int by_step(const void *a, const void *b) {
    double x = ((const struct candidate *)a)->cost.step_s, y = ((const struct candidate *)b)->cost.step_s;
    return x < y ? -1 : x > y;
}

static void print_row(const struct candidate *c, int rank, int gpus) {
    const struct plan_cost *k = &c->cost;
    int dp = gpus / (c->par.tp * c->par.pp * c->par.cp);
    printf("%4d  %3d %3d %3d %3d %3d %4d %3d  %-9s %10.1f %12.0f %9.1f %6.1f%% %9.1f %7.1f%% %8.1f\n", rank,
           c->par.tp, c->par.pp, c->par.pp > 1 ? c->par.vpp : 1, c->par.cp, c->par.ep, dp, c->micro_batch, c->recompute,
           k->step_s * 1e3, k->tokens_per_s, k->tflops, 100 * k->mfu, k->mem_gib, 100 * k->bubble, k->comm_s * 1e3);
}

static void print_header(void) {
    printf("rank   tp  pp vpp  cp  ep   dp  mb  recompute    step ms  tokens/s/gpu  TFLOP/s    MFU  mem GiB  bubble  "
           "comm ms\n");
}

static const struct backend *estimate_backend(const struct recipe *r, const struct system_spec *s) {
    int gpu = strcmp(s->name, "cpu") && cuda_backend.attention_state_floats;
    return backend_table(gpu, r->train.precision);
}

static int divides(long a, long b) { return b > 0 && a % b == 0; }

/* every valid layout that fits, predicted; returns the count (cands grown as needed) */
static int enumerate(const struct recipe *base, int gpus, const struct system_spec *s, struct candidate **out,
                     int *considered) {
    static struct recipe r;
    const struct model_config *m = &base->model;
    int n = 0, cap = 0;
    static const char *const modes[] = {"none", "selective", "full"};
    *considered = 0;
    recipe_validate_quiet(1);
    /* context parallelism runs on the CPU backend only so far (model/cp_attention.h) */
    int max_cp = strcmp(s->name, "cpu") ? 1 : 32;
    for (int tp = 1; tp <= s->per_node && tp <= gpus; tp *= 2)
        for (int cp = 1; cp <= max_cp && tp * cp <= gpus; cp *= 2)
            for (int pp = 1; pp <= 64 && tp * cp * pp <= gpus; pp++) {
                if (!divides(gpus, (long)tp * cp * pp) || (pp > 1 && !divides(m->num_layers, pp))) continue;
                int dp = gpus / (tp * cp * pp);
                for (int vpp = 1; vpp <= (pp > 1 ? 4 : 1); vpp *= 2)
                    for (int ep = 1; ep <= (m->num_experts ? m->num_experts : 1); ep *= 2)
                        for (int mb = 1; mb <= 8; mb *= 2)
                            for (int rc = 0; rc < 3; rc++) {
                                if (!divides(base->train.global_batch, (long)mb * dp)) continue;
                                struct candidate c = {.par = base->parallel, .micro_batch = mb};
                                c.par.tp = tp, c.par.cp = cp, c.par.pp = pp, c.par.vpp = vpp, c.par.ep = ep;
                                c.par.first_stage_layers = c.par.last_stage_layers = 0;
                                c.par.sequence_parallel = tp > 1;
                                snprintf(c.recompute, sizeof c.recompute, "%s", modes[rc]);
                                r = *base;
                                apply(&r, &c);
                                if (recipe_validate_plan(&r, gpus) != 0) continue;
                                (*considered)++;
                                plan_predict(&r, gpus, s, estimate_backend(&r, s), &c.cost);
                                if (!c.cost.fits) continue;
                                if (n == cap) *out = xrealloc(*out, sizeof **out * (cap = cap ? 2 * cap : 64));
                                (*out)[n++] = c;
                            }
            }
    recipe_validate_quiet(0);
    return n;
}

static int emit(const struct recipe *base, const struct candidate *c, int gpus, int per_node, const char *dir) {
    static struct recipe r;
    r = *base;
    apply(&r, c);
    if (mkdir_p(dir) != 0) {
        fprintf(stderr, "mtrain: error: plan --emit %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/recipe.yaml", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "mtrain: error: plan --emit: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f, "# written by mtrain plan for %d accelerators: tp %d, pp %d, vpp %d, cp %d, ep %d, micro batch %d, "
            "recompute %s\n", gpus, c->par.tp, c->par.pp, c->par.vpp, c->par.cp, c->par.ep, c->micro_batch, c->recompute);
    recipe_print(&r, f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "mtrain: error: plan --emit: cannot write %s\n", path);
        return 1;
    }
    snprintf(path, sizeof path, "%s/submit.sh", dir);
    f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "mtrain: error: plan --emit: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    int nodes = (gpus + per_node - 1) / per_node, tasks = gpus < per_node ? gpus : per_node;
    fprintf(f, "#!/bin/sh\n# submit the planned layout (mtrain plan): %d nodes x %d tasks, one per GPU\n"
            "exec sbatch --nodes=%d --ntasks-per-node=%d --gpus-per-node=%d scripts/slurm/pretrain.sbatch %s/recipe.yaml "
            "\"$@\"\n", nodes, tasks, nodes, tasks, tasks, dir);
    bad = ferror(f);
    if (fclose(f) != 0 || bad || chmod(path, 0755) != 0) {
        fprintf(stderr, "mtrain: error: plan --emit: cannot write %s\n", path);
        return 1;
    }
    printf("wrote %s/recipe.yaml and %s/submit.sh\n", dir, dir);
    return 0;
}

/* ---- calibration of this machine's CPU ranks ---- */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* seconds per call of fn, the best of a few repeats */
#define TIME_BEST(expr, reps, out)                 \
    do {                                           \
        double best_ = 1e30;                       \
        for (int rep_ = 0; rep_ < (reps); rep_++) { \
            double t0_ = now();                    \
            expr;                                  \
            double dt_ = now() - t0_;              \
            if (dt_ < best_) best_ = dt_;          \
        }                                          \
        (out) = best_;                             \
    } while (0)

static int calibrate(const char *path) {
    struct grid g;
    grid_single(&g);
    int world = parallel_world_size(), rank = parallel_world_rank();
    if (world > 1) {
        struct parallel_config one = {.tp = 1, .pp = 1, .cp = 1, .ep = 1, .etp = 1, .vpp = 1};
        grid_create(&g, &one);
    }
    const struct backend *be = backend_get("cpu", "fp32"), *b16 = backend_get("cpu", "bf16");
    struct system_spec s = {.per_node = world, .mem_eff = 1.0};
    snprintf(s.name, sizeof s.name, "cpu");
    /* GEMMs: out[n, m] = x[n, k] w[m, k]^T at growing sizes; every rank at once, as a run loads the machine */
    static const int sizes[] = {32, 64, 128, 256, 512, 1024};
    double rate[6], best = 0, bf16_rate = 0;
    for (int i = 0; i < 6; i++) {
        int n = sizes[i];
        float *x = be->alloc(sizeof(float) * n * n), *w = be->alloc(sizeof(float) * n * n), *o = be->alloc(sizeof(float) * n * n);
        int reps = n <= 128 ? 50 : n <= 512 ? 8 : 3;
        double t;
        TIME_BEST(be->matmul_forward(o, x, w, n, n, n, 0), reps, t);
        rate[i] = 2.0 * n * n * n / t;
        if (rate[i] > best) best = rate[i];
        if (n == 512) {
            TIME_BEST(b16->matmul_forward(o, x, w, n, n, n, 0), 3, t);
            bf16_rate = 2.0 * n * n * n / t;
        }
        be->free(x), be->free(w), be->free(o);
    }
    s.tflops_fp32 = best / 1e12;
    s.tflops_bf16 = s.tflops_fp8 = bf16_rate / 1e12;
    s.gemm.n = 6;
    for (int i = 0; i < 6; i++) s.gemm.size[i] = 2.0 * sizes[i] * sizes[i] * sizes[i], s.gemm.eff[i] = rate[i] / best;
    /* causal attention, B 1, 4 heads of 32: flops per call 2 x (D + Dv) x H x T^2 / 2 */
    static const int tlen[] = {64, 256, 1024};
    s.attention.n = 3;
    for (int i = 0; i < 3; i++) {
        int T = tlen[i], H = 4, D = 32;
        float *q = be->alloc(sizeof(float) * T * H * D), *k = be->alloc(sizeof(float) * T * H * D);
        float *v = be->alloc(sizeof(float) * T * H * D), *o = be->alloc(sizeof(float) * T * H * D);
        float *att = be->alloc(sizeof(float) * be->attention_state_floats(1, H, T));
        double t, flops = 2.0 * (2 * D) * H * (double)T * T / 2;
        TIME_BEST(be->attention_forward(o, att, q, k, v, 1, T, H, H, D, D), T <= 256 ? 10 : 3, t);
        s.attention.size[i] = flops, s.attention.eff[i] = fmin(1.0, flops / t / best);
        be->free(q), be->free(k), be->free(v), be->free(o), be->free(att);
    }
    /* memory bandwidth: out += x over 64 MiB arrays (three streams) */
    size_t nb = (size_t)16 << 20;
    float *a = be->alloc(sizeof(float) * nb), *b = be->alloc(sizeof(float) * nb);
    double t;
    TIME_BEST(be->add(a, b, nb), 5, t);
    s.mem_gbps = 3.0 * sizeof(float) * nb / t / 1e9;
    be->free(a), be->free(b);
    /* the machine's memory over its ranks */
    FILE *mi = fopen("/proc/meminfo", "r");
    long kb = 0;
    if (mi) {
        if (fscanf(mi, "MemTotal: %ld kB", &kb) != 1) kb = 0;
        fclose(mi);
    }
    s.mem_gib = kb / 1048576.0 / (world > 0 ? world : 1);
    /* MPI between the ranks: all-reduces of 4 KiB and 16 MiB fit bytes / bw + 2 (n-1) lat */
    s.intra_gbps = s.inter_gbps = 1000, s.intra_lat_us = s.inter_lat_us = 0;
    if (world > 1) {
        size_t small = 1024, large = (size_t)4 << 20;
        float *buf = xcalloc(large, sizeof(float));
        double ts = 1e30, tl = 1e30;
        for (int rep = 0; rep < 50; rep++) { /* each call after a barrier, the slowest rank's time counts */
            size_t n = rep < 40 ? small : large;
            comm_barrier(&g.world);
            double t0 = now();
            comm_all_reduce_sum(&g.world, buf, n);
            double dt = now() - t0;
            comm_all_reduce_sum_f64(&g.world, &dt, 1); /* the mean over ranks */
            dt /= world;
            if (n == small && dt < ts) ts = dt;
            if (n == large && dt < tl) tl = dt;
        }
        free(buf);
        double f = 2.0 * (world - 1) / world;
        double per_byte = (tl - ts) / (f * (large - small) * sizeof(float));
        s.intra_gbps = s.inter_gbps = 1 / per_byte / 1e9;
        s.intra_lat_us = s.inter_lat_us = fmax(0, ts - f * small * sizeof(float) * per_byte) / (2.0 * (world - 1)) * 1e6;
    }
    int rc = 0;
    if (rank == 0) {
        char comment[512], date[32];
        time_t tt = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&tt));
        snprintf(comment, sizeof comment,
                 "# This machine's CPU ranks, measured by `mtrain plan --calibrate` on %s: %d rank(s) at once,\n"
                 "# %d OpenMP thread(s) each; GEMMs of the fp32 CPU backend (bf16: its widening table), its causal\n"
                 "# attention, an elementwise add's bandwidth, MPI all-reduces between the ranks.\n",
                 date, world, omp_get_max_threads());
        rc = system_write(&s, path, comment);
        if (rc) fprintf(stderr, "mtrain: error: plan --calibrate: cannot write %s\n", path);
        else printf("wrote %s: %.3f TFLOP/s fp32 GEMM peak, %.1f GB/s memory, MPI %.2f GB/s + %.1f us per step\n",
                    path, s.tflops_fp32, s.mem_gbps, s.intra_gbps, s.intra_lat_us);
    }
    if (world > 1) grid_free(&g);
    return rc ? 1 : 0;
}

int cmd_plan(int argc, char **argv) {
    const char *recipe_path = NULL, *gpu = "h100", *emit_dir = NULL, *layout = NULL, *calib = NULL;
    int gpus = 0, per_node = 0, top = 10;
    static struct recipe r;
    char *sets[64];
    int nsets = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--gpus") && more) {
            gpus = atoi(argv[++i]);
        } else if (!strcmp(a, "--gpus-per-node") && more) {
            per_node = atoi(argv[++i]);
        } else if (!strcmp(a, "--top") && more) {
            top = atoi(argv[++i]);
        } else if (!strcmp(a, "--gpu") && more) {
            gpu = argv[++i];
        } else if (!strcmp(a, "--emit") && more) {
            emit_dir = argv[++i];
        } else if (!strcmp(a, "--layout") && more) {
            layout = argv[++i];
        } else if (!strcmp(a, "--calibrate") && more) {
            calib = argv[++i];
        } else if (!strcmp(a, "--set") && more && nsets < 64) {
            sets[nsets++] = argv[++i];
        } else if (a[0] != '-' && !recipe_path) {
            recipe_path = a;
        } else {
            fprintf(stderr, "mtrain: error: plan: unexpected argument '%s'\n\n%s", a, usage);
            return 2;
        }
    }
    if (calib) {
        parallel_init(&argc, &argv);
        int rc = calibrate(calib);
        parallel_finalize();
        return rc;
    }
    if (!recipe_path || gpus < 1 || top < 1 || per_node < 0) {
        fprintf(stderr, "mtrain: error: plan: a recipe and --gpus N (N >= 1) are required\n\n%s", usage);
        return 2;
    }
    recipe_defaults(&r);
    if (recipe_load(&r, recipe_path) != 0) return 2;
    for (int i = 0; i < nsets; i++)
        if (recipe_set(&r, sets[i]) != 0) return 2;
    char path[4096], err[4400];
    struct system_spec s;
    if (find_system(gpu, path, sizeof path) != 0) {
        fprintf(stderr, "mtrain: error: plan --gpu %s: neither a file nor a shipped system (recipes/systems/%s.yaml: "
                "h100, h200, a100, b200)\n", gpu, gpu);
        return 2;
    }
    if (system_load(&s, path, err, sizeof err) != 0) {
        fprintf(stderr, "mtrain: error: %s\n", err);
        return 2;
    }
    if (per_node) s.per_node = per_node;
    printf("mtrain plan: %s on %d x %s (%s, %d per node), global batch %d x %d tokens, %s\n", recipe_path, gpus,
           s.name, path, s.per_node, r.train.global_batch, r.train.seq_len, r.train.precision);
    if (layout) { /* one layout: tp,pp,vpp,cp,ep,micro_batch,recompute */
        struct candidate c = {.par = r.parallel};
        char mode[16];
        if (sscanf(layout, "%d,%d,%d,%d,%d,%d,%15s", &c.par.tp, &c.par.pp, &c.par.vpp, &c.par.cp, &c.par.ep,
                   &c.micro_batch, mode) != 7) {
            fprintf(stderr, "mtrain: error: plan --layout %s: expected tp,pp,vpp,cp,ep,micro_batch,recompute\n", layout);
            return 2;
        }
        snprintf(c.recompute, sizeof c.recompute, "%s", mode);
        apply(&r, &c);
        if (recipe_validate_plan(&r, gpus) != 0) return 2;
        plan_predict(&r, gpus, &s, estimate_backend(&r, &s), &c.cost);
        print_header();
        print_row(&c, 1, gpus);
        printf("predicted_step_ms: %.3f\npredicted_bytes_per_step: tp %.0f dp %.0f pp %.0f ep %.0f cp %.0f (stage 0)\n",
               c.cost.step_s * 1e3, c.cost.bytes[PLAN_TP], c.cost.bytes[PLAN_DP], c.cost.bytes[PLAN_PP],
               c.cost.bytes[PLAN_EP], c.cost.bytes[PLAN_CP]);
        printf("predicted_bubble: %.6f\npredicted_memory_gib: %.3f (%s %.0f GiB)\n", c.cost.bubble, c.cost.mem_gib,
               c.cost.fits ? "fits" : "does not fit", s.mem_gib);
        return 0;
    }
    struct candidate *cands = NULL;
    int considered = 0, n = enumerate(&r, gpus, &s, &cands, &considered);
    printf("layouts: %d valid, %d fit %.0f GiB\n", considered, n, s.mem_gib);
    if (!n) {
        printf("verdict: no layout fits; try more accelerators, a shorter sequence or fp8\n");
        free(cands);
        return 1;
    }
    qsort(cands, n, sizeof *cands, by_step);
    print_header();
    for (int i = 0; i < n && i < top; i++) print_row(&cands[i], i + 1, gpus);
    int rc = emit_dir ? emit(&r, &cands[0], gpus, s.per_node, emit_dir) : 0;
    free(cands);
    return rc;
}
