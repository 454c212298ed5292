/* Collective bandwidth through mtrain's comm layer (parallel/comm.h), the
 * way nccl-tests reports it, for scripts/bench/comm.sh. Run under mpiexec:
 *
 *   bench_comm [mpi|nccl] [MAX_MIB]
 *
 * mpi: host buffers over MPI; nccl: GPU buffers over NCCL (one GPU per rank
 * on each node). For message sizes from 64 KiB to MAX_MIB (default 64) MiB,
 * times all-reduce, reduce-scatter and all-gather (median of 5 after a
 * warm-up) and prints one JSON line per (collective, size) from rank 0:
 * algbw = bytes / time, busbw = algbw x 2(n-1)/n for all-reduce and
 * (n-1)/n for the others (the bytes each link carries under a ring). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/common.h"
#include "kernels/ops.h"
#include "parallel/comm_nccl.h"
#include "parallel/grid.h"

static const struct backend *mem; /* NULL: host */
static struct comm *c;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* every call issued so far has finished on this rank (a device copy to the host waits for the streams) */
static void finish(float *probe) {
    if (mem) {
        float x;
        mem->to_host(&x, probe, sizeof x);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    parallel_init(&argc, &argv);
    const char *how = argc > 1 ? argv[1] : "mpi";
    size_t max_bytes = (size_t)(argc > 2 ? atof(argv[2]) : 64) * 1048576;
    struct parallel_config layout = {.tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1};
    struct grid g;
    grid_create(&g, &layout);
    c = &g.dp_comm; /* the whole world, as a model group */
    int n = c->size;
    if (!strcmp(how, "nccl")) {
        char why[256] = "";
        int gpus = cuda_backend_available() ? cuda_device_count() : 0;
        if (gpus > 0) cuda_use_device(g.local_rank);
        /* collective; a rank may see only its own GPU (srun --gpus-per-task=1) */
        int shared = grid_ranks_sharing_gpu(&g);
        if (!gpus || shared) snprintf(why, sizeof why, "needs a GPU per rank");
        else nccl_available(why, sizeof why);
        if (why[0]) {
            if (g.world_rank == 0) printf("{\"skipped\":\"nccl: %s\"}\n", why);
            grid_free(&g);
            parallel_finalize();
            return 0;
        }
        cuda_use_device(g.local_rank);
        mem = &cuda_backend;
        comm_nccl_init(c);
    }
    size_t cap = max_bytes / sizeof(float);
    float *a = mem ? mem->alloc(sizeof(float) * cap) : xcalloc(cap, sizeof(float));
    float *b = mem ? mem->alloc(sizeof(float) * cap) : xcalloc(cap, sizeof(float));
    static const char *names[] = {"all_reduce", "reduce_scatter", "all_gather"};
    for (size_t bytes = 65536; bytes <= max_bytes; bytes *= 4) {
        size_t floats = bytes / sizeof(float), block = floats / n;
        for (int k = 0; k < 3; k++) {
            double t[6];
            for (int rep = 0; rep < 6; rep++) {
                comm_barrier(&g.world);
                double t0 = now();
                if (k == 0) comm_all_reduce_sum(c, a, floats);
                else if (k == 1) comm_reduce_scatter_sum(c, a, b, block);
                else comm_all_gather(c, b, a, block);
                finish(a);
                t[rep] = now() - t0;
            }
            qsort(t + 1, 5, sizeof(double), cmp); /* the first was the warm-up */
            double sec = t[3]; /* the median of five */
            comm_all_reduce_sum_f64(&g.world, &sec, 1);
            sec /= g.world_size; /* the ranks' mean */
            double algbw = bytes / sec / 1e9;
            double bus = algbw * (k == 0 ? 2.0 * (n - 1) / n : (double)(n - 1) / n);
            if (g.world_rank == 0)
                printf("{\"comm\":\"%s\",\"ranks\":%d,\"collective\":\"%s\",\"bytes\":%zu,\"us\":%.1f,\"algbw_gbs\":%.3f,"
                       "\"busbw_gbs\":%.3f}\n",
                       how, n, names[k], bytes, sec * 1e6, algbw, bus);
        }
    }
    if (mem) mem->free(a), mem->free(b);
    else free(a), free(b);
    grid_free(&g);
    parallel_finalize();
    return 0;
}
