/* mtrain env: what this build and this process see, for cluster bring-up and
 * bug reports: the build (CUDA backend or not, CUDA, cuBLASLt), the CPU's
 * BLAS, the MPI library, NCCL and cuDNN (loadable, version and file), then one
 * line per rank: its host, node-local rank and the GPU it would drive
 * (local rank modulo the GPUs it sees, as mtrain pretrain chooses), with a
 * note when ranks of a node share a GPU (NCCL refuses that). Run it as the
 * job runs, e.g. `srun mtrain env` or `mpirun -n 8 mtrain env`: rank 0
 * prints everything, the other ranks' lines reach it by broadcast. */
#include <omp.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "config/common.h"
#include "kernels/cpu/blas_check.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/grid.h"
#ifdef MTRAIN_CUDA
#include "kernels/cuda/cudnn_attention.h"
#endif

#define LINE 512

static const char usage[] = "usage: mtrain env\n"
                            "\n"
                            "Print the build (CUDA backend, CUDA and cuBLASLt versions), the CPU BLAS, the MPI\n"
                            "library, NCCL (loadable or why not), and for every rank its host, node-local rank\n"
                            "and GPU. Run it the way the job runs (srun / mpirun) to check the GPU binding.\n";

/* this rank's line: host, local rank, GPU */
static void rank_line(const struct grid *g, char *out, size_t n) {
    char host[256] = "?", gpu[LINE] = "";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    int devices = cuda_device_count();
    if (devices > 0) {
        int dev = g->local_rank % devices;
        cuda_use_device(g->local_rank);
        char what[256];
        cuda_device_describe(dev, what, sizeof what);
        snprintf(gpu, sizeof gpu, "GPU %d of %d: %s; FP8 tensor cores: %s", dev, devices, what,
                 cuda_device_has_fp8() ? "yes" : "no");
    } else {
        snprintf(gpu, sizeof gpu, "no GPU (%s)", cuda_device_error());
    }
    snprintf(out, n, "rank %d on %s, local rank %d of %d: %s", g->world_rank, host, g->local_rank, g->local_size, gpu);
}

int cmd_env(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "mtrain env: error: unexpected argument '%s'\n%s", argv[1], usage);
        return 2;
    }
    parallel_init(&argc, &argv);
    struct parallel_config layout = {.tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1};
    struct grid g;
    grid_create(&g, &layout);
    if (g.world_rank == 0) {
        char cuda[LINE], mpi[LINE], nccl[LINE];
        struct blas_info blas;
        memset(&blas, 0, sizeof blas);
        blas_info_get(&blas);
        cuda_versions(cuda, sizeof cuda);
        parallel_library_version(mpi, sizeof mpi);
        nccl_describe(nccl, sizeof nccl);
        printf("mtrain %s\n", MTRAIN_VERSION);
#ifdef MTRAIN_CUDA
        printf("build:  CUDA backend (CUDA %s)\n", cuda);
#else
        printf("build:  CPU only (no CUDA backend: nvcc was not found at build time)\n");
#endif
        printf("cpu:    %d OpenMP threads; OpenBLAS %s kernels (%s)%s%s\n", omp_get_max_threads(), blas.core,
               blas.config, blas.note[0] ? "; " : "", blas.note);
        printf("mpi:    %s; %d rank%s\n", mpi, g.world_size, g.world_size == 1 ? "" : "s");
        printf("nccl:   %s\n", nccl);
#ifdef MTRAIN_CUDA
        char cudnn[LINE];
        cudnn_describe(cudnn, sizeof cudnn);
        printf("cudnn:  %s (fused attention; MTRAIN_ATTENTION, docs/model.md)\n", cudnn);
#endif
    }
    /* each rank's line, gathered on rank 0 in rank order */
    char mine[LINE], line[LINE];
    rank_line(&g, mine, sizeof mine);
    int shared = grid_ranks_sharing_gpu(&g); /* collective */
    float worst = (float)shared;
    comm_all_reduce_max(&g.world, &worst, 1);
    for (int r = 0; r < g.world_size; r++) {
        memcpy(line, mine, sizeof line);
        comm_broadcast(&g.world, line, sizeof line, r);
        if (g.world_rank == 0) printf("%s\n", line);
    }
    if (g.world_rank == 0 && worst > 0 && cuda_device_count() > 0)
        printf("note:   up to %d other rank%s on a node drive%s the same GPU: parallel.comm nccl needs one GPU per rank "
               "(auto falls back to MPI through host memory)\n",
               (int)worst, worst == 1 ? "" : "s", worst == 1 ? "s" : "");
    grid_free(&g);
    parallel_finalize();
    return 0;
}
