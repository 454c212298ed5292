/* The grid's embedding group (parallel/grid.h embed_comm): the first and the
 * last pipeline stage of each (tp, cp, dp) position, a group of its own on
 * every other rank. Each layout the world size allows is checked against the
 * rank arithmetic of grid.h: group size, the rank in it (stage 0 first, the
 * broadcast root) and a sum over it (the two ends' world ranks). Run alone
 * by the unit pass (pp 1) and under mpiexec -n 4 by tests/integration/tied_pp.sh. */
#include <stdio.h>

#include "parallel/grid.h"
#include "tests/unit/check.h"

static int ok_all(struct comm *c, int ok) { /* every rank must agree it passed */
    float bad = !ok;
    comm_all_reduce_max(c, &bad, 1);
    return bad == 0;
}

static void check_layout(int tp, int pp) {
    struct parallel_config layout = {.tp = tp, .pp = pp, .cp = 1, .ep = 1, .vpp = 1};
    struct grid g;
    grid_create(&g, &layout);
    int end = pp > 1 && (g.pp_rank == 0 || g.pp_rank == pp - 1);
    int stride = g.tp * g.cp * g.dp; /* world ranks between consecutive pipeline stages */
    int first = g.world_rank - g.pp_rank * stride, last = first + (pp - 1) * stride;
    float x = (float)g.world_rank;
    comm_all_reduce_sum(&g.embed_comm, &x, 1);
    int ok = end ? g.embed_comm.size == 2 && g.embed_comm.rank == (g.pp_rank != 0) && x == (float)(first + last)
                 : g.embed_comm.size == 1 && x == (float)g.world_rank;
    char name[64];
    snprintf(name, sizeof name, "grid_embed_group_tp%d_pp%d", tp, pp);
    ok = ok_all(&g.world, ok);
    if (g.world_rank == 0) TEST_RESULT(name, ok, "embedding group size, rank or sum wrong");
    comm_barrier(&g.world);
    grid_free(&g);
}

int main(int argc, char **argv) {
    parallel_init(&argc, &argv);
    int n = parallel_world_size();
    check_layout(1, 1);
    if (n % 2 == 0) check_layout(1, 2);
    if (n % 4 == 0) check_layout(2, 2), check_layout(1, 4); /* pp 4: two middle stages alone */
    parallel_finalize();
    TEST_EXIT();
}
