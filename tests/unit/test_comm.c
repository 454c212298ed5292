/* The comm layer over MPI: every collective and point-to-point call against
 * values computed by hand, on the world group and on a split grid. Run alone
 * (size 1: the no-op paths) by the unit pass, and under mpiexec -n 4 by
 * tests/integration/comm.sh. */
#include <string.h>

#include "kernels/ops.h"
#include "parallel/grid.h"
#include "tests/unit/check.h"

/* test name + suffix (one at a time) */
static const char *nm(const char *base, const char *sfx) {
    static char buf[96];
    snprintf(buf, sizeof buf, "%s%s", base, sfx);
    return buf;
}

static int ok_all(struct comm *c, int ok) { /* every rank must agree it passed */
    float bad = !ok;
    comm_all_reduce_max(c, &bad, 1);
    return bad == 0;
}

/* Every call on w, against values computed by hand. sfx names the pass. */
static void check_calls(struct comm *w, const char *sfx) {
    int n = w->size, r = w->rank, ok;
    float x[8], all[64], out[8];

    for (int i = 0; i < 3; i++) x[i] = r + i;
    comm_all_reduce_sum(w, x, 3);
    ok = 1;
    for (int i = 0; i < 3; i++) ok &= x[i] == n * (n - 1) / 2.0f + n * i;
    ok = ok_all(w, ok);
    if (r == 0) TEST_RESULT(nm("comm_all_reduce_sum", sfx), ok, "wrong sums");

    x[0] = (float)r;
    comm_all_reduce_max(w, x, 1);
    ok = ok_all(w, x[0] == n - 1);
    if (r == 0) TEST_RESULT(nm("comm_all_reduce_max", sfx), ok, "wrong max");

    double d = r + 0.5;
    comm_all_reduce_sum_f64(w, &d, 1);
    ok = ok_all(w, d == n * (n - 1) / 2.0 + 0.5 * n);
    if (r == 0) TEST_RESULT(nm("comm_all_reduce_sum_f64", sfx), ok, "wrong sum");

    for (int k = 0; k < n; k++) all[2 * k] = all[2 * k + 1] = (float)(r * 10 + k); /* block k goes to rank k */
    comm_reduce_scatter_sum(w, all, out, 2);
    float want = 0;
    for (int q = 0; q < n; q++) want += q * 10 + r;
    ok = ok_all(w, out[0] == want && out[1] == want);
    if (r == 0) TEST_RESULT(nm("comm_reduce_scatter_sum", sfx), ok, "got %g want %g", out[0], want);

    x[0] = (float)r, x[1] = (float)(-r);
    comm_all_gather(w, x, all, 2);
    ok = 1;
    for (int k = 0; k < n; k++) ok &= all[2 * k] == k && all[2 * k + 1] == -k;
    ok = ok_all(w, ok);
    if (r == 0) TEST_RESULT(nm("comm_all_gather", sfx), ok, "wrong blocks");

    int v = r == n - 1 ? 42 : 0;
    comm_broadcast(w, &v, sizeof v, n - 1);
    ok = ok_all(w, v == 42);
    if (r == 0) TEST_RESULT(nm("comm_broadcast", sfx), ok, "got %d", v);

    for (int k = 0; k < n; k++) all[k] = (float)(r * 100 + k); /* element k goes to rank k */
    comm_all_to_all(w, all, out + 0, 1);
    /* out is only 8 long: check with n <= 8 */
    ok = 1;
    for (int k = 0; k < n && k < 8; k++) ok &= out[k] == k * 100 + r;
    ok = ok_all(w, ok);
    if (r == 0) TEST_RESULT(nm("comm_all_to_all", sfx), ok, "wrong exchange");

    /* a ring of non-blocking sends and blocking receives */
    float token = (float)r, got = -1;
    if (n > 1) {
        comm_send(w, &token, sizeof token, (r + 1) % n, 7);
        comm_recv(w, &got, sizeof got, (r + n - 1) % n, 7);
        comm_wait_sends(w);
    } else {
        got = token;
    }
    ok = ok_all(w, got == (float)((r + n - 1) % n));
    if (r == 0) TEST_RESULT(nm("comm_send_recv_ring", sfx), ok, "got %g", got);

}

int main(int argc, char **argv) {
    parallel_init(&argc, &argv);
    struct parallel_config layout = {.tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1};
    if (parallel_world_size() % 2 == 0) layout.tp = 2;
    struct grid g;
    grid_create(&g, &layout);
    struct comm *w = &g.world;
    int n = w->size, r = w->rank, ok;
    char name[64];
    float x[8];

    check_calls(w, "");
    /* the same through host staging (what GPU ranks do until NCCL), with the
     * CPU backend standing in for device memory */
    w->stage = &cpu_backend;
    check_calls(w, "_staged");
    w->stage = NULL;

    /* the grid's groups: tp pairs when the world is even */
    x[0] = 1;
    comm_all_reduce_sum(&g.tp_comm, x, 1);
    ok = ok_all(w, x[0] == g.tp && g.tp_comm.size == g.tp && g.dp_comm.size == n / g.tp);
    snprintf(name, sizeof name, "comm_grid_groups_tp%d_dp%d", g.tp, g.dp);
    if (r == 0) TEST_RESULT(name, ok, "group sizes or sums wrong");
    ok = ok_all(w, w->bytes > 0 || n == 1);
    if (r == 0) TEST_RESULT("comm_counts_payload", ok, "no bytes counted");
    comm_barrier(w);
    grid_free(&g);
    parallel_finalize();
    TEST_EXIT();
}
