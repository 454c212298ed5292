/* Pipeline schedules as data: the ordered list of (forward or backward,
 * micro batch, chunk) one pipeline rank executes in a training step.
 *   vpp = 1: 1F1B (warm-up forwards, steady one-forward-one-backward, cool-down)
 *   vpp > 1: interleaved 1F1B over vpp model chunks per rank (needs m % pp == 0)
 * Sends never block (they complete at the end of the step) and receives do,
 * so a schedule is valid if executing every rank's list in order with those
 * rules cannot deadlock; schedule_simulate checks that. */
#pragma once
#include <stdio.h>

enum sched_op { SCHED_FORWARD = 0, SCHED_BACKWARD = 1 };

struct sched_item {
    enum sched_op op;
    int mb;      /* micro batch */
    int chunk;   /* model chunk on this rank (virtual stage chunk*pp + rank) */
};

/* Fill out (capacity 2*m*vpp) with rank's schedule; returns the count. */
int schedule_build(struct sched_item *out, int pp, int vpp, int rank, int m);
/* Forward-only order (evaluation): every micro batch through every chunk. */
int schedule_build_forward(struct sched_item *out, int vpp, int m);
/* Most micro batches whose activations a rank holds at once under its schedule. */
int schedule_max_in_flight(const struct sched_item *s, int n, int vpp);
/* Print every rank's schedule (for --dry-run), e.g. "rank 0: F0.0 F1.0 B0.0 ...". */
void schedule_print(FILE *out, int pp, int vpp, int m);
/* Print one line per pipeline stage (warm-up, steady and cool-down counts,
 * micro batches in flight) and the simulated bubble fraction. */
void schedule_print_summary(FILE *out, int pp, int vpp, int m);

/* Run all ranks' schedules with unit-cost forwards and backwards of cost
 * `backward_cost` under the send/receive rules. Returns 0 and the bubble
 * fraction (idle / total rank-time) if every schedule completes, -1 on a
 * deadlock. */
int schedule_simulate(int pp, int vpp, int m, double backward_cost, double *bubble);
