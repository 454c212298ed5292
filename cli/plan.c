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
#include "parallel/schedule.h"
#include "config/common.h"
#include "config/system.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "model/plan.h"
#include "parallel/schedule.h"
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/grid.h"

static const char usage[] =
    "usage: mtrain plan RECIPE --gpus N [--gpu h100|h200|a100|b200|FILE] [--gpus-per-node K] [--top K]\n"
    "                   [--emit DIR] [--set key=value]...\n"
    "       mtrain plan RECIPE --gpus N --layout tp,pp,vpp,cp,ep,micro_batch,recompute [--gpu ...]\n"
    "       mpiexec -n R mtrain plan --calibrate FILE [--device cpu|cuda] [--base SYSTEM]\n"
    "\n"
    "Enumerates the layouts of RECIPE's model on N accelerators (tp, pp, vpp and the pipeline\n"
    "schedule, cp, ep, etp, the micro batch and the recompute mode; the global batch fixed; ZeRO-1 as\n"
    "the recipe says; --layout's schedule and etp come from the recipe or --set), drops those\n"
    "that are invalid or do not fit memory (the dry run's estimate), predicts each one's step time\n"
    "(compute per op at the system's efficiencies, communication per collective, the pipeline\n"
    "schedule simulated with those costs; docs/plan.md) and prints the best K: step time, tokens/s,\n"
    "TFLOP/s and MFU per accelerator, memory, bubble, exposed communication. --gpu names a shipped\n"
    "system (recipes/systems/NAME.yaml) or a system file (default h100). --layout predicts one\n"
    "layout. --emit DIR writes DIR/recipe.yaml (the recipe with the best layout) and DIR/submit.sh\n"
    "(its sbatch line). --calibrate times this machine's GEMMs, attention, memory bandwidth and,\n"
    "with R >= 2 ranks, collectives between them (MPI; NCCL with --device cuda), and writes a system\n"
    "file of R ranks per node; on GPUs --base SYSTEM gives the datasheet peaks, memory and network\n"
    "the measured efficiencies are relative to.\n";

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
    const char *sched = c->par.pp == 1 ? "-" : schedule_name(schedule_kind(c->par.schedule, c->par.vpp));
    printf("%4d  %3d %3d %3d %-11s %3d %3d %3d %4d %3d  %-9s %10.1f %12.0f %9.1f %6.1f%% %9.1f %7.1f%% %8.1f\n", rank,
           c->par.tp, c->par.pp, c->par.pp > 1 ? c->par.vpp : 1, sched, c->par.cp, c->par.ep, c->par.etp, dp,
           c->micro_batch, c->recompute,
           k->step_s * 1e3, k->tokens_per_s, k->tflops, 100 * k->mfu, k->mem_gib, 100 * k->bubble, k->comm_s * 1e3);
}

static void print_header(void) {
    printf("rank   tp  pp vpp schedule     cp  ep etp   dp  mb  recompute    step ms  tokens/s/gpu  TFLOP/s    MFU  "
           "mem GiB  bubble  comm ms\n");
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
    static const struct {
        int vpp;
        const char *schedule;
    } orders[] = {{1, "auto"}, {2, "auto"}, {4, "auto"}, {1, "zb-h1"}, {2, "zbv"}, {2, "dualpipev"}};
    *considered = 0;
    recipe_validate_quiet(1);
    /* context parallelism on GPUs runs a first, untiled block kernel (kernels/cuda/attention_block.cuh) whose
     * speed the system files do not model yet: planned on the CPU system only */
    int max_cp = strcmp(s->name, "cpu") ? 1 : 32;
    /* the V schedules' sends must not wait for their receives, which only CPU ranks give (model/trainer.c) */
    int norders = strcmp(s->name, "cpu") ? 4 : 6;
    for (int tp = 1; tp <= s->per_node && tp <= gpus; tp *= 2)
        for (int cp = 1; cp <= max_cp && tp * cp <= gpus; cp *= 2)
            for (int pp = 1; pp <= 64 && tp * cp * pp <= gpus; pp++) {
                if (!divides(gpus, (long)tp * cp * pp) || (pp > 1 && !divides(m->num_layers, pp))) continue;
                int dp = gpus / (tp * cp * pp);
                /* the pipeline's orders: vpp 1, 2, 4 under their default schedule, zb-h1, zbv and dualpipev (CPU) */
                for (int o = 0; o < (pp > 1 ? norders : 1); o++)
                    for (int ep = 1; ep <= (m->num_experts ? m->num_experts : 1); ep *= 2)
                        /* each expert's width over etp ranks of a node (the recipe checks what divides) */
                        for (int etp = 1; etp <= (m->num_experts ? s->per_node : 1); etp *= 2)
                        for (int mb = 1; mb <= 8; mb *= 2)
                            for (int rc = 0; rc < 3; rc++) {
                                if (!divides(base->train.global_batch, (long)mb * dp)) continue;
                                struct candidate c = {.par = base->parallel, .micro_batch = mb};
                                c.par.tp = tp, c.par.cp = cp, c.par.pp = pp, c.par.vpp = orders[o].vpp, c.par.ep = ep;
                                c.par.etp = etp;
                                snprintf(c.par.schedule, sizeof c.par.schedule, "%s", orders[o].schedule);
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
    fprintf(f, "# written by mtrain plan for %d accelerators: tp %d, pp %d, vpp %d, schedule %s, cp %d, ep %d, etp %d, "
            "micro batch %d, recompute %s\n", gpus, c->par.tp, c->par.pp, c->par.vpp, c->par.schedule, c->par.cp,
            c->par.ep, c->par.etp, c->micro_batch, c->recompute);
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

/* ---- calibration: this machine's ranks (CPU, or one GPU each) ---- */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* the calls issued on backend be have finished (a copy to the host waits for the device) */
static void finish(const struct backend *be, const float *probe) {
    float x;
    be->to_host(&x, probe, sizeof x);
}

/* seconds of one call of expr, the best of reps after one warm-up */
#define TIME_BEST(be, probe, expr, reps, out)        \
    do {                                             \
        double best_ = 1e30;                         \
        for (int rep_ = 0; rep_ <= (reps); rep_++) { \
            finish(be, probe);                       \
            double t0_ = now();                      \
            expr;                                    \
            finish(be, probe);                       \
            double dt_ = now() - t0_;                \
            if (rep_ && dt_ < best_) best_ = dt_;    \
        }                                            \
        (out) = best_;                               \
    } while (0)

/* Into s: GEMM efficiency and peak (the CPU's scaled by share), causal
 * attention, memory bandwidth (scaled by share); returns the GEMMs' best
 * rate (FLOP/s, scaled by share) */
static double measure_compute(struct system_spec *s, int gpu, double share) {
    const struct backend *be = backend_table(gpu, "fp32"), *lo = backend_table(gpu, "bf16");
    /* GEMMs out[n, n] = x w^T: fp32 on the CPU (its peak is the largest rate), bf16 on a GPU */
    const struct backend *gb = gpu ? lo : be;
    static const int cpu_sizes[] = {32, 64, 128, 256, 512, 1024}, gpu_sizes[] = {512, 1024, 2048, 4096, 8192, 16384};
    const int *sizes = gpu ? gpu_sizes : cpu_sizes;
    double rate[6], best = 0, bf16_rate = 0;
    for (int i = 0; i < 6; i++) {
        size_t n = (size_t)sizes[i];
        float *x = gb->alloc(gb->act_bytes * n * n), *w = gb->alloc(gb->act_bytes * n * n), *o = gb->alloc(gb->act_bytes * n * n);
        gb->zero(x, gb->act_bytes * n * n), gb->zero(w, gb->act_bytes * n * n);
        int reps = n <= 128 ? 50 : n <= 1024 ? 8 : 3;
        double t;
        TIME_BEST(gb, o, gb->matmul_forward(o, x, w, (int)n, (int)n, (int)n, 0), reps, t);
        rate[i] = 2.0 * n * n * n / t;
        if (rate[i] > best) best = rate[i];
        if (!gpu && n == 512) {
            TIME_BEST(lo, o, lo->matmul_forward(o, x, w, (int)n, (int)n, (int)n, 0), 3, t);
            bf16_rate = 2.0 * n * n * n / t;
        }
        gb->free(x), gb->free(w), gb->free(o);
    }
    double peak = gpu ? s->tflops_bf16 * 1e12 : best;
    best *= share, bf16_rate *= share;
    if (!gpu) s->tflops_fp32 = best / 1e12, s->tflops_bf16 = s->tflops_fp8 = bf16_rate / 1e12;
    s->gemm.n = 6;
    for (int i = 0; i < 6; i++)
        s->gemm.size[i] = 2.0 * sizes[i] * sizes[i] * sizes[i], s->gemm.eff[i] = fmin(1.0, rate[i] / peak);
    /* causal attention forward, batch 1: flops 2 x (D + Dv) x H x T^2 / 2 */
    static const int cpu_t[] = {64, 256, 1024}, gpu_t[] = {1024, 4096, 8192};
    int H = gpu ? 32 : 4, D = gpu ? 128 : 32;
    s->attention.n = 3;
    for (int i = 0; i < 3; i++) {
        size_t T = (size_t)(gpu ? gpu_t[i] : cpu_t[i]), nq = T * H * D;
        float *q = gb->alloc(gb->act_bytes * nq), *k = gb->alloc(gb->act_bytes * nq), *v = gb->alloc(gb->act_bytes * nq);
        float *o = gb->alloc(gb->act_bytes * nq), *att = gb->alloc(sizeof(float) * gb->attention_state_floats(1, H, (int)T));
        gb->zero(q, gb->act_bytes * nq), gb->zero(k, gb->act_bytes * nq), gb->zero(v, gb->act_bytes * nq);
        double t, flops = 2.0 * (2 * D) * H * (double)T * T / 2;
        TIME_BEST(gb, o, gb->attention_forward(o, att, q, k, v, 1, (int)T, H, H, D, D), i < 2 ? 10 : 3, t);
        s->attention.size[i] = flops, s->attention.eff[i] = fmin(1.0, flops / t / peak);
        gb->free(q), gb->free(k), gb->free(v), gb->free(o), gb->free(att);
    }
    /* memory bandwidth: a += b over 64 MiB arrays (three streams) */
    size_t nb = (size_t)16 << 20;
    float *a = be->alloc(sizeof(float) * nb), *b = be->alloc(sizeof(float) * nb);
    be->zero(a, sizeof(float) * nb), be->zero(b, sizeof(float) * nb);
    double t;
    TIME_BEST(be, a, be->add(a, b, nb), 5, t);
    s->mem_gbps = 3.0 * sizeof(float) * nb / t / 1e9 * share;
    be->free(a), be->free(b);
    return best;
}

/* Measure into s: GEMMs (the efficiency curve against the peak of the
 * precision the run computes in: the base's datasheet peak on a GPU, the
 * largest rate measured on a CPU), causal attention, memory bandwidth and,
 * with several ranks, all-reduces between them. */
static int calibrate(const char *path, const char *base_path, const char *device) {
    int world = parallel_world_size(), rank = parallel_world_rank();
    int gpu = !strcmp(device, "cuda") || (!strcmp(device, "auto") && cuda_backend_available());
    if (gpu && !cuda_backend_available()) {
        if (rank == 0) fprintf(stderr, "mtrain: error: plan --calibrate --device cuda: no CUDA device\n");
        return 2;
    }
    struct system_spec s = {.per_node = world, .mem_eff = 1.0}, base;
    char err[4400];
    if (base_path) {
        if (system_load(&base, base_path, err, sizeof err) != 0) {
            if (rank == 0) fprintf(stderr, "mtrain: error: %s\n", err);
            return 2;
        }
        s = base;
        s.mem_eff = 1.0;
    } else if (gpu) {
        if (rank == 0)
            fprintf(stderr, "mtrain: error: plan --calibrate on a GPU needs --base SYSTEM (its datasheet peaks, memory "
                    "and links, e.g. recipes/systems/h100.yaml): the curves are measured against its peak\n");
        return 2;
    } else {
        snprintf(s.name, sizeof s.name, "cpu");
    }
    struct grid g;
    grid_single(&g);
    struct parallel_config one = {.tp = 1, .pp = 1, .cp = 1, .ep = 1, .etp = 1, .vpp = 1};
    if (world > 1) grid_create(&g, &one);
    if (gpu) cuda_use_device(g.local_rank);
    /* More ranks' threads than cores (CPU ranks sharing a machine): each rank computes only its share of the
     * time, which a best-of timing does not see (a rank timed alone for a moment reports a whole core) */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double share = gpu || cores <= 0 ? 1.0 : fmin(1.0, (double)cores / ((double)g.local_size * omp_get_max_threads()));
    /* Oversubscribed, rank 0 times alone while the others sleep at a barrier, and its rates are scaled by its
     * share: timed all at once, the best-of caught a rank alone on one run and sharing a core on the next (4
     * ranks on 2 cores: GEMM peak 0.035 or 0.045 TFLOP/s, memory 9.6 or 5.9 GB/s from one run to the next) */
    int alone = share < 1 && world > 1;
    double best = !alone || g.world_rank == 0 ? measure_compute(&s, gpu, share) : 0;
    const struct backend *be = backend_table(gpu, "fp32");
    if (alone) comm_barrier_idle(&g.world);
    if (!gpu) { /* the machine's memory over its ranks */
        FILE *mi = fopen("/proc/meminfo", "r");
        long kb = 0;
        if (mi) {
            if (fscanf(mi, "MemTotal: %ld kB", &kb) != 1) kb = 0;
            fclose(mi);
        }
        s.mem_gib = kb / 1048576.0 / (world > 0 ? world : 1);
    }
    if (!base_path) s.intra_gbps = s.inter_gbps = 1000, s.intra_lat_us = s.inter_lat_us = 0;
    /* between the ranks: all-reduces of 4 KiB and 16 MiB (MPI on CPUs, NCCL between GPUs) fit
     * bytes / bandwidth + 2 (n-1) latency; on one node these are the links inside it */
    if (world > 1) {
        struct comm *c = &g.dp_comm; /* the whole world as a model group */
        if (gpu) grid_stage_device(&g, be), comm_nccl_init(c);
        size_t small = 1024, large = (size_t)4 << 20;
        float *buf = gpu ? be->alloc(sizeof(float) * large) : xcalloc(large, sizeof(float));
        if (gpu) be->zero(buf, sizeof(float) * large);
        double ts = 1e30, tl = 1e30;
        for (int rep = 0; rep < 50; rep++) { /* each call after a barrier; the ranks' mean */
            size_t n = rep < 40 ? small : large;
            comm_barrier(&g.world);
            double t0 = now();
            comm_all_reduce_sum(c, buf, n);
            if (gpu) finish(be, buf);
            double dt = now() - t0;
            comm_all_reduce_sum_f64(&g.world, &dt, 1);
            dt /= world;
            if (n == small && dt < ts) ts = dt;
            if (n == large && dt < tl) tl = dt;
        }
        if (gpu) be->free(buf);
        else free(buf);
        double f = 2.0 * (world - 1) / world;
        double per_byte = (tl - ts) / (f * (large - small) * sizeof(float));
        s.intra_gbps = 1 / per_byte / 1e9;
        s.intra_lat_us = fmax(0, ts - f * small * sizeof(float) * per_byte) / (2.0 * (world - 1)) * 1e6;
        if (!base_path) s.inter_gbps = s.intra_gbps, s.inter_lat_us = s.intra_lat_us;
    }
    int rc = 0;
    if (rank == 0) {
        char comment[1024], date[32];
        time_t tt = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&tt));
        snprintf(comment, sizeof comment,
                 "# Measured by `mtrain plan --calibrate` on %s: %d rank(s) at once, %s; GEMMs of the %s backend%s,\n"
                 "# its causal attention, an elementwise add's bandwidth%s.%s%s%s\n",
                 date, world, gpu ? "one GPU each" : "CPU", gpu ? "CUDA bf16" : "fp32 CPU",
                 gpu ? " (efficiency of the base's bf16 peak)" : " (bf16: its widening table)",
                 world > 1 ? (gpu ? ", NCCL all-reduces between the ranks" : ", MPI all-reduces between the ranks") : "",
                 base_path ? " Peaks, memory size and network from " : "", base_path ? base_path : "",
                 share < 1 ? "\n# More ranks' threads than cores: each rank's compute and bandwidth is its share, "
                             "cores / (ranks x threads)." : "");
        rc = system_write(&s, path, comment);
        if (rc) fprintf(stderr, "mtrain: error: plan --calibrate: cannot write %s\n", path);
        else printf("wrote %s: GEMM peak %.3f TFLOP/s measured, memory %.1f GB/s, links %.2f GB/s + %.1f us per step\n",
                    path, best / 1e12, s.mem_gbps, s.intra_gbps, s.intra_lat_us);
    }
    if (world > 1) grid_free(&g);
    return rc ? 1 : 0;
}

int cmd_plan(int argc, char **argv) {
    const char *recipe_path = NULL, *gpu = "h100", *emit_dir = NULL, *layout = NULL, *calib = NULL, *base = NULL;
    const char *device = "cpu";
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
        } else if (!strcmp(a, "--base") && more) {
            base = argv[++i];
        } else if (!strcmp(a, "--device") && more) {
            device = argv[++i];
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
        int rc = calibrate(calib, base, device);
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
    if (layout) { /* one layout: tp,pp,vpp,cp,ep,micro_batch,recompute, each set with the recipe key's checks */
        static const char *const keys[] = {"parallel.tp", "parallel.pp", "parallel.vpp", "parallel.cp", "parallel.ep",
                                           "train.micro_batch", "train.recompute"};
        char copy[256], *save = NULL, *tok;
        snprintf(copy, sizeof copy, "%s", layout);
        int k = 0;
        for (tok = strtok_r(copy, ",", &save); tok && k < 7; tok = strtok_r(NULL, ",", &save), k++) {
            char set[320];
            snprintf(set, sizeof set, "%s=%s", keys[k], tok);
            if (recipe_set(&r, set) != 0) return 2;
        }
        if (k != 7 || tok) {
            fprintf(stderr, "mtrain: error: plan --layout %s: expected tp,pp,vpp,cp,ep,micro_batch,recompute\n", layout);
            return 2;
        }
        struct candidate c = {.par = r.parallel, .micro_batch = r.train.micro_batch};
        snprintf(c.recompute, sizeof c.recompute, "%.15s", r.train.recompute);
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
