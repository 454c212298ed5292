/* Pipeline schedules as data: the ordered list of (forward or backward,
 * micro batch, chunk) one pipeline rank executes in a training step.
 *   vpp = 1: 1F1B (warm-up forwards, steady one-forward-one-backward, cool-down)
 *   vpp > 1: interleaved 1F1B over vpp model chunks per rank (needs m % pp == 0)
 * Transfers between stages go in groups (comm_exchange), as NCCL needs: a
 * rank runs its list a unit at a time (schedule_unit: one item, or a steady
 * forward+backward pair when interleaved), and before each unit one group
 * holds the sends of the previous unit's results and the receives the unit
 * needs; a group completes when every transfer in it has met its peer's, and
 * transfers between two ranks meet in the order they were posted (no tags).
 * A schedule is valid if every rank's groups complete and every receive
 * meets the send of the message it expects: schedule_simulate checks both. */
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

/* The transfers of one item (-1: none): the pipeline rank it receives its
 * input (forward) or output gradient (backward) from before it runs, and the
 * one it sends its result to after. */
struct sched_links { int recv_from, send_to; };
struct sched_links schedule_links(struct sched_item it, int pp, int vpp, int rank);
/* How many items from s[i] on run between two exchanges (1 or 2). 1F1B
 * exchanges around every item; interleaved, a steady forward and the
 * backward after it share one exchange (one item each deadlocks there;
 * without a steady phase, m = pp, every item is a unit). */
int schedule_unit(const struct sched_item *s, int n, int i, int vpp);
#define SCHED_UNIT_MAX 2 /* the most items schedule_unit returns */

/* Run all ranks' schedules (training; forward_only: evaluation's order) with
 * unit-cost forwards and backwards of cost `backward_cost`, exchanging as
 * the trainer does (free transfers that wait for their peer). Returns 0 and
 * the bubble fraction (idle / total rank-time) if every rank completes, -1
 * on a deadlock, -2 if a receive would meet another message than the one it
 * expects. */
int schedule_simulate(int pp, int vpp, int m, int forward_only, double backward_cost, double *bubble);
