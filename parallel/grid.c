#include <mpi.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"
#include "parallel/comm_nccl.h"
#include "parallel/grid.h"
#include "parallel/schedule.h"
#include "parallel/watchdog.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

static int initialized;

void parallel_init(int *argc, char ***argv) {
    if (initialized) return;
    int provided;
    /* the async checkpoint writer is a thread, but only the main thread calls MPI */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) die("MPI_Init failed");
    initialized = 1;
}

/* The one line that names this rank, then every rank ends: NCCL's
 * communicators first (a peer blocked in one is let go), then MPI_Abort,
 * whose teardown can kill the launcher's output forwarding before it has
 * read the line: it gets a moment first. */
static void end_job(const char *msg, int code) {
    ssize_t w = write(STDERR_FILENO, msg, strlen(msg));
    (void)w;
    fflush(NULL);
    watchdog_aborting();
    struct timespec t = {0, 300 * 1000 * 1000};
    nanosleep(&t, NULL);
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

static void abort_job(int code) {
    char who[96], msg[256];
    watchdog_describe_rank(who, sizeof who);
    snprintf(msg, sizeof msg, "mtrain: error: %s failed: ending the whole job (MPI_Abort)\n", who);
    end_job(msg, code);
}

/* exit() while the hook is set is not the run's end (that unsets it): a
 * library, or code outside die(), ending this rank mid-run */
static void exit_unfinished(void) {
    if (!die_abort_hook) return;
    char who[96], what[256], msg[512];
    watchdog_describe_rank(who, sizeof who);
    watchdog_describe_activity(what, sizeof what);
    snprintf(msg, sizeof msg, "mtrain: error: %s is exiting at %s before the run ended: ending the whole job "
             "(MPI_Abort)\n", who, what);
    end_job(msg, EXIT_RUNTIME);
}

void parallel_abort_on_error(int on) {
    static int registered;
    int size = 1;
    if (initialized) CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size) == MPI_SUCCESS);
    die_abort_hook = on && size > 1 ? abort_job : NULL;
    if (die_abort_hook && !registered) registered = atexit(exit_unfinished) == 0;
}

void parallel_finalize(void) {
#ifdef __SANITIZE_ADDRESS__
    /* Check our own leaks now: MPI's transport plugins leak a little in
     * MPI_Finalize and are unloaded, so LeakSanitizer's exit-time report could
     * neither be avoided nor suppressed by name. It runs only once. */
    if (initialized) __lsan_do_leak_check();
#endif
    die_abort_hook = NULL; /* every rank is ending alike: no abort */
    if (initialized) MPI_Finalize();
    initialized = 0;
}

int parallel_world_size(void) {
    int n = 1;
    if (initialized) MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

void parallel_library_version(char *buf, int n) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) len = 0;
    v[len < (int)sizeof v ? len : (int)sizeof v - 1] = 0;
    char *nl = strchr(v, '\n');
    if (nl) *nl = 0;
    for (char *t = v; *t; t++)
        if (*t == '\t') *t = ' ';
    snprintf(buf, n, "%s", v[0] ? v : "unknown");
}

int parallel_world_rank(void) {
    int r = 0;
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

void parallel_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (initialized && parallel_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static int env_int(const char *const *names, int fallback) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

/* This rank's node-local rank (which GPU it takes): the launcher's
 * (env_rank, from the first of vars set), where it numbers the node's n
 * ranks 0 .. n-1 once each, else the rank among the processes sharing this
 * node's memory. mpirun inside a Slurm allocation starts its ranks from
 * one srun task per node, so each inherits that task's SLURM_LOCALID, 0:
 * taken at its word, every rank would drive GPU 0 (said once per node). */
static int local_rank_of(MPI_Comm node, int n, int node_rank, int env_rank, const char *const *vars) {
    int *all = xmalloc(sizeof(int) * n), ok = 1, any = 0;
    if (MPI_Allgather(&env_rank, 1, MPI_INT, all, 1, MPI_INT, node) != MPI_SUCCESS)
        die("MPI_Allgather of the node-local ranks failed");
    char *seen = xcalloc(n, 1);
    for (int i = 0; i < n; i++) {
        any |= all[i] >= 0;
        if (all[i] < 0 || all[i] >= n || seen[all[i]]) ok = 0;
        else seen[all[i]] = 1;
    }
    free(seen);
    free(all);
    if (ok) return env_rank;
    if (any && node_rank == 0) {
        const char *var = "the launcher's local rank";
        for (int i = 0; vars[i]; i++)
            if (getenv(vars[i]) && *getenv(vars[i])) {
                var = vars[i];
                break;
            }
        warn("%s does not number this node's %d ranks 0 to %d once each (mpirun inside a Slurm allocation passes "
             "one task's value to all its ranks): each rank takes its GPU by its order on the node instead",
             var, n, n - 1);
    }
    return node_rank;
}

/* Group of the ranks that share every coordinate but `axis`. */
static void make_comm(struct comm *c, const char *name, int color, int key) {
    memset(c, 0, sizeof *c);
    c->name = name;
    MPI_Comm *h = xmalloc(sizeof *h);
    if (MPI_Comm_split(MPI_COMM_WORLD, color, key, h) != MPI_SUCCESS) die("MPI_Comm_split(%s) failed", name);
    MPI_Comm_rank(*h, &c->rank);
    MPI_Comm_size(*h, &c->size);
    c->handle = h;
}

void grid_create(struct grid *g, const struct parallel_config *p) {
    memset(g, 0, sizeof *g);
    g->world_rank = parallel_world_rank();
    g->world_size = parallel_world_size();
    static const char *const local_vars[] = {"SLURM_LOCALID", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", NULL};
    MPI_Comm node;
    int node_rank = 0, env_rank = env_int(local_vars, -1);
    g->local_size = 1;
    g->local_rank = env_rank >= 0 ? env_rank : 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g->world_rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &g->local_size);
        MPI_Comm_rank(node, &node_rank);
        g->local_rank = local_rank_of(node, g->local_size, node_rank, env_rank, local_vars);
        MPI_Comm_free(&node);
    }
    g->tp = p->tp, g->cp = p->cp, g->ep = p->ep > 0 ? p->ep : 1, g->pp = p->pp, g->vpp = p->vpp;
    g->dp = g->world_size / (g->tp * g->cp * g->pp);
    CHECK(g->dp * g->tp * g->cp * g->pp == g->world_size);
    /* rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank)) */
    int r = g->world_rank;
    g->tp_rank = r % g->tp, r /= g->tp;
    g->cp_rank = r % g->cp, r /= g->cp;
    g->dp_rank = r % g->dp, r /= g->dp;
    g->pp_rank = r;
    int tp = g->tp_rank, cp = g->cp_rank, dp = g->dp_rank, pp = g->pp_rank;
    make_comm(&g->world, "world", 0, g->world_rank);
    make_comm(&g->tp_comm, "tp", ((pp * g->dp) + dp) * g->cp + cp, tp);
    /* the gradients' group: the data-parallel ranks and their context-parallel peers, which hold the same
     * parameters and saw other tokens (Megatron's data-parallel group with context parallelism) */
    make_comm(&g->dp_comm, "dp", pp * g->tp + tp, dp * g->cp + cp);
    make_comm(&g->cp_comm, "cp", (pp * g->dp + dp) * g->tp + tp, cp);
    make_comm(&g->pp_comm, "pp", ((dp * g->cp) + cp) * g->tp + tp, pp);
    /* The experts' own grid over the same ranks of a pipeline stage (as
     * Megatron's expert layout): the tp x cp x dp ranks numbered in rank order
     * are etp fastest, then ep, then edp. */
    g->etp = p->etp > 0 ? p->etp : 1;
    int plane = g->tp * g->cp * g->dp, q = (dp * g->cp + cp) * g->tp + tp;
    CHECK(plane % (g->etp * g->ep) == 0);
    g->edp = plane / (g->etp * g->ep);
    g->etp_rank = q % g->etp, g->ep_rank = q / g->etp % g->ep, g->edp_rank = q / (g->etp * g->ep);
    make_comm(&g->ep_comm, "ep", (pp * g->edp + g->edp_rank) * g->etp + g->etp_rank, g->ep_rank);
    make_comm(&g->edp_comm, "edp", (pp * g->ep + g->ep_rank) * g->etp + g->etp_rank, g->edp_rank);
    make_comm(&g->etp_comm, "etp", (pp * g->edp + g->edp_rank) * g->ep + g->ep_rank, g->etp_rank);
    /* the ends of each pipeline pair up; a middle stage gets a group of its own (zbv: rank 0 holds both) */
    int v = schedule_v_shaped(schedule_kind(p->schedule, g->vpp));
    int end = g->pp > 1 && !v && (pp == 0 || pp == g->pp - 1);
    int position = (dp * g->cp + cp) * g->tp + tp;
    make_comm(&g->embed_comm, "embed", end ? position : g->world_size + g->world_rank, pp);
}

int grid_comms(struct grid *g, struct comm **out) {
    struct comm *cs[GRID_COMMS] = {&g->world,    &g->tp_comm,    &g->dp_comm, &g->pp_comm, &g->ep_comm,
                                   &g->edp_comm, &g->embed_comm, &g->cp_comm, &g->etp_comm};
    memcpy(out, cs, sizeof cs);
    return GRID_COMMS;
}

void grid_single(struct grid *g) {
    memset(g, 0, sizeof *g);
    g->world_size = g->local_size = g->tp = g->cp = g->ep = g->etp = g->dp = g->pp = g->vpp = g->edp = 1;
    struct comm *cs[GRID_COMMS];
    const char *names[GRID_COMMS] = {"world", "tp", "dp", "pp", "ep", "edp", "embed", "cp", "etp"};
    for (int i = 0, n = grid_comms(g, cs); i < n; i++) cs[i]->size = 1, cs[i]->name = names[i];
}

void grid_stage_device(struct grid *g, const struct backend *be) {
    struct comm *cs[GRID_COMMS];
    for (int i = 1, n = grid_comms(g, cs); i < n; i++) cs[i]->stage = be; /* all but world */
}

/* How many other ranks of the world drive this rank's GPU as NCCL sees it:
 * the same host identity (NCCL_HOSTID when set, else the host name) and PCI
 * bus id. NCCL refuses two ranks of a communicator on one GPU unless each
 * presents itself as its own host (scripts/mpirun.sh --shared-gpu, a test
 * technique). Works whether each rank sees every GPU of its node or only
 * its own. */
int grid_ranks_sharing_gpu(struct grid *g) {
    char id[64] = "", host[256] = "";
    const char *hostid = getenv("NCCL_HOSTID");
    cuda_device_pci_id(id, sizeof id);
    if (hostid && *hostid) snprintf(host, sizeof host, "%s", hostid);
    else if (gethostname(host, sizeof host) != 0) host[0] = 0;
    host[sizeof host - 1] = 0;
    uint64_t key = 1469598103934665603ull; /* FNV-1a of host and bus id, kept to 52 bits: exact in a double */
    for (const char *s = host; *s; s++) key = (key ^ (unsigned char)*s) * 1099511628211ull;
    for (const char *s = id; *s; s++) key = (key ^ (unsigned char)*s) * 1099511628211ull;
    double *keys = xcalloc(g->world_size, sizeof *keys);
    keys[g->world_rank] = (double)(key & ((1ull << 52) - 1)) + 1;
    comm_all_reduce_sum_f64(&g->world, keys, g->world_size);
    int shared = 0;
    for (int r = 0; r < g->world_size; r++) shared += r != g->world_rank && keys[r] == keys[g->world_rank];
    free(keys);
    return shared;
}

void grid_use_nccl(struct grid *g, int with_experts, int with_embed) {
    struct comm *cs[GRID_COMMS];
    int n = grid_comms(g, cs);
    for (int i = 1; i < n; i++) { /* all but world */
        int used = cs[i] == &g->edp_comm || cs[i] == &g->etp_comm ? with_experts
                   : cs[i] == &g->embed_comm                      ? with_embed
                                                                   : 1;
        if (cs[i]->size > 1 && used) comm_nccl_init(cs[i]);
    }
}

void grid_free(struct grid *g) {
    struct comm *cs[GRID_COMMS];
    for (int i = 0, n = grid_comms(g, cs); i < n; i++) {
        comm_nccl_free(cs[i]);
        comm_free_staging(cs[i]);
        if (!cs[i]->handle) continue;
        MPI_Comm_free((MPI_Comm *)cs[i]->handle);
        free(cs[i]->handle);
        cs[i]->handle = NULL;
    }
}

/* Every rank's process: what a launcher names when a rank dies (Hydra: "PID ... RUNNING AT host") */
struct rank_identity {
    int pid, tp, pp, dp, cp, ep;
    char host[64];
};

void grid_write_ranks(const struct grid *g, const char *path) {
    struct rank_identity me = {.pid = (int)getpid(), .tp = g->tp_rank, .pp = g->pp_rank, .dp = g->dp_rank,
                               .cp = g->cp_rank, .ep = g->ep_rank};
    if (gethostname(me.host, sizeof me.host) != 0) snprintf(me.host, sizeof me.host, "?");
    me.host[sizeof me.host - 1] = 0;
    for (char *c = me.host; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 32) *c = '?'; /* kept valid JSON */
    struct rank_identity *all = g->world_rank == 0 ? xmalloc(sizeof *all * g->world_size) : NULL;
    if (g->world_size > 1) {
        if (MPI_Gather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, 0, *(MPI_Comm *)g->world.handle) !=
            MPI_SUCCESS)
            die("MPI_Gather of the ranks' process ids failed");
    } else {
        all[0] = me;
    }
    if (g->world_rank != 0) return;
    size_t cap = 128 + (size_t)g->world_size * 160, n = 0;
    char *buf = xmalloc(cap);
    n += (size_t)snprintf(buf + n, cap - n, "{\"ranks\":[");
    for (int r = 0; r < g->world_size; r++)
        n += (size_t)snprintf(buf + n, cap - n,
                              "%s\n{\"rank\":%d,\"pid\":%d,\"host\":\"%s\",\"tp\":%d,\"pp\":%d,\"dp\":%d,\"cp\":%d,\"ep\":%d}",
                              r ? "," : "", r, all[r].pid, all[r].host, all[r].tp, all[r].pp, all[r].dp, all[r].cp,
                              all[r].ep);
    n += (size_t)snprintf(buf + n, cap - n, "\n]}\n");
    CHECK(n < cap);
    write_file_atomic(path, buf, n);
    free(buf);
    free(all);
}
