/* Pipeline bubble of mtrain's own schedules (parallel/schedule.c), for
 * scripts/bench/parallel.sh: every (pp, vpp, m) of the grid below runs
 * through schedule_simulate with unit-cost forwards and backwards of cost
 * BACKWARD_COST (default 2). Prints one JSON array on stdout:
 *   [{"pp":4,"vpp":1,"m":8,"bubble":0.2727,"in_flight":4,"ok":true}, ...]
 * bubble = idle rank-time / total rank-time; in_flight = the most micro
 * batches whose activations pipeline rank 0 holds at once.
 * usage: bench_parallel [BACKWARD_COST] */
#include <stdio.h>
#include <stdlib.h>

#include "parallel/schedule.h"

int main(int argc, char **argv) {
    double backward_cost = argc > 1 ? atof(argv[1]) : 2.0;
    static const int pps[] = {2, 4, 8}, ms[] = {4, 8, 16, 32}, vpps[] = {1, 2};
    int first = 1;
    printf("[");
    for (int a = 0; a < 3; a++)
        for (int v = 0; v < 2; v++)
            for (int b = 0; b < 4; b++) {
                int pp = pps[a], vpp = vpps[v], m = ms[b];
                if (vpp > 1 && m % pp) continue; /* interleaved needs m % pp == 0 */
                double bubble = 1.0;
                enum sched_kind kind = vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B;
                int rc = schedule_simulate(kind, pp, vpp, m, 0, backward_cost, 0, &bubble);
                struct sched_item *s = malloc(sizeof *s * SCHED_ITEMS(m, vpp));
                int n = schedule_build(s, kind, pp, vpp, 0, m);
                int in_flight = schedule_max_in_flight(s, n, vpp);
                free(s);
                printf("%s\n {\"pp\":%d,\"vpp\":%d,\"m\":%d,\"bubble\":%.6f,\"in_flight\":%d,\"ok\":%s}", first ? "" : ",",
                       pp, vpp, m, bubble, in_flight, rc == 0 ? "true" : "false");
                first = 0;
            }
    printf("\n]\n");
    return 0;
}
