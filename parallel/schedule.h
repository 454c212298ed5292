/* Pipeline schedules as data: the ordered list of (forward, backward or
 * weight-gradient pass, micro batch, chunk) one pipeline rank executes in a
 * training step.
 *   1f1b (vpp = 1): warm-up forwards, steady one-forward-one-backward, cool-down
 *   interleaved (vpp > 1): 1F1B over vpp model chunks per rank (needs m % pp == 0)
 *   zb-h1 (vpp = 1): zero bubble's ZB-H1 (Qi et al. 2023): 1F1B's forwards and
 *     backwards, each backward computing only the input gradient (B, what
 *     the previous stage waits for) and its weight gradients later (W): rank
 *     r runs the W of a micro batch r backwards after its B, so the last
 *     stages' W fill the cool-down's bubbles while at most pp micro batches
 *     are in flight on any rank (1F1B's on rank 0): a third of 1F1B's idle
 *     time when F, B and W cost alike
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

enum sched_op { SCHED_FORWARD = 0, SCHED_BACKWARD = 1, SCHED_WEIGHTS = 2 };
enum sched_kind { SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZB_H1 };
/* The kind a recipe's parallel.schedule names ("auto": interleaved when vpp
 * > 1, else 1f1b); -1 for an unknown name. */
int schedule_kind(const char *name, int vpp);
const char *schedule_name(enum sched_kind kind);

struct sched_item {
    enum sched_op op;
    int mb;      /* micro batch */
    int chunk;   /* model chunk on this rank (virtual stage chunk*pp + rank) */
};

/* Fill out (capacity SCHED_ITEMS(m, vpp)) with rank's schedule; returns the count. */
#define SCHED_ITEMS(m, vpp) (3 * (m) * (vpp))
int schedule_build(struct sched_item *out, enum sched_kind kind, int pp, int vpp, int rank, int m);
/* Forward-only order (evaluation): every micro batch through every chunk. */
int schedule_build_forward(struct sched_item *out, int vpp, int m);
/* Most micro batches whose activations a rank holds at once under its
 * schedule (from the first forward to the last backward, or W when split). */
int schedule_max_in_flight(const struct sched_item *s, int n, int vpp);
/* Print every rank's schedule (for --dry-run), e.g. "rank 0: F0.0 F1.0 B0.0 W0.0 ...". */
void schedule_print(FILE *out, enum sched_kind kind, int pp, int vpp, int m);
/* Print one line per pipeline stage (warm-up, steady and cool-down counts,
 * micro batches in flight) and the simulated bubble fraction. */
void schedule_print_summary(FILE *out, enum sched_kind kind, int pp, int vpp, int m);

/* The transfers of one item (-1: none): the pipeline rank it receives its
 * input (forward) or output gradient (backward) from before it runs, and the
 * one it sends its result to after. A W item has none: the sends of the
 * item before it are begun (comm_exchange_start) before it runs and
 * completed with the next exchange. */
struct sched_links { int recv_from, send_to; };
struct sched_links schedule_links(struct sched_item it, int pp, int vpp, int rank);
/* How many items from s[i] on run between two exchanges (1 or 2). 1F1B
 * exchanges around every item; interleaved, a steady forward and the
 * backward after it share one exchange (one item each deadlocks there;
 * without a steady phase, m = pp, every item is a unit). */
int schedule_unit(const struct sched_item *s, int n, int i, int vpp);
#define SCHED_UNIT_MAX 2 /* the most items schedule_unit returns */

/* Run all ranks' schedules (training; forward_only: evaluation's order) with
 * unit-cost forwards and backwards of cost `backward_cost` (zb-h1: B
 * backward_cost * (1 - w_share), W backward_cost * w_share), exchanging as
 * the trainer does (free transfers that wait for their peer). Returns 0 and
 * the bubble fraction (idle / total rank-time) if every rank completes, -1
 * on a deadlock, -2 if a receive would meet another message than the one it
 * expects. */
int schedule_simulate(enum sched_kind kind, int pp, int vpp, int m, int forward_only, double backward_cost,
                      double w_share, double *bubble);
