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
 *   zbv (vpp = 2, which it needs): zero bubble's ZB-V: two chunks per rank
 *     placed in a V (rank r holds virtual stages r and 2pp-1-r, so rank 0
 *     holds the embedding and the head, and the turn at rank pp-1 stays on
 *     the rank), backwards split into B and W as in zb-h1. The order is made
 *     by a greedy list scheduler over given F, B and W costs (schedule.c
 *     generate_zbv; equal ones, until the trainer has measured its first
 *     step): backwards first, then forwards while at most pp micro batches
 *     are in flight (1F1B's most), weight gradients when nothing else is
 *     ready. Each chunk's items run in micro-batch order whatever the costs,
 *     so every gradient sums in the same order: the costs change no number.
 *   dualpipev (vpp = 2): DualPipeV, the cut-in-half DualPipe of DeepSeek-V3:
 *     ZB-V's V and its list scheduler, with up to pp + 1 micro batches in
 *     flight (DualPipe's activation memory), and whenever a forward and a
 *     backward of the other chunk are both ready they run as one overlapped
 *     pair (F0&B1 or F1&B0, item.pair), the pair's W at once after it: the
 *     model interleaves the two passes layer by layer so that one's expert
 *     all-to-alls run while the other computes (model/pair.c). Warm-up and
 *     cool-down B's leave their W for the bubbles, as in zbv.
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
enum sched_kind { SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZB_H1, SCHED_ZBV, SCHED_DUALPIPEV };
/* The kind a recipe's parallel.schedule names ("auto": interleaved when vpp
 * > 1, else 1f1b); -1 for an unknown name. */
int schedule_kind(const char *name, int vpp);
const char *schedule_name(enum sched_kind kind);
/* Whether the kind splits backwards into B and W items */
int schedule_splits(enum sched_kind kind);
/* Whether the kind places its two chunks in a V (zbv, dualpipev) */
int schedule_v_shaped(enum sched_kind kind);
/* The virtual stage of a rank's chunk: chunk * pp + rank, or in a V (zbv, dualpipev)
 * rank for chunk 0 and 2pp-1-rank for chunk 1. Stage 0 holds the embedding,
 * stage pp*chunks-1 the head. */
int schedule_stage(enum sched_kind kind, int pp, int chunk, int rank);

struct sched_item {
    enum sched_op op;
    int mb;      /* micro batch */
    int chunk;   /* model chunk on this rank (its virtual stage: schedule_stage) */
    int pair;    /* dualpipev: 1 when this forward and the backward after it run as one overlapped unit */
};

/* Fill out (capacity SCHED_ITEMS(m, vpp)) with rank's schedule; returns the count. */
#define SCHED_ITEMS(m, vpp) (3 * (m) * (vpp))
int schedule_build(struct sched_item *out, enum sched_kind kind, int pp, int vpp, int rank, int m);
/* The same for costs of a forward, backward and W item in cost[] (zbv's
 * order is made for them; schedule_build: equal costs; other kinds: theirs) */
int schedule_build_timed(struct sched_item *out, enum sched_kind kind, int pp, int vpp, int rank, int m,
                         const double cost[3]);
/* Forward-only order (evaluation): every micro batch through every chunk. */
int schedule_build_forward(struct sched_item *out, int vpp, int m);
/* Most micro batches whose activations a rank holds at once under its
 * schedule (from the first forward to the last backward, or W when split). */
int schedule_max_in_flight(const struct sched_item *s, int n, int vpp);
/* The V schedules (pp > 1) take a slot per micro batch and chunk, each
 * holding that chunk's activations only: returns 1 and the slots of each
 * chunk (zbv: min(pp, m) each, whatever costs its order is made for, as a
 * chunk-1 slot lives within its chunk-0 slot's time; dualpipev: the most
 * its order holds, from a chunk's forward to its W), else 0. */
int schedule_chunk_slots(enum sched_kind kind, const struct sched_item *s, int n, int pp, int m, int per_chunk[2]);
/* Most chunks whose backward ran and whose W has not (0: not split) */
int schedule_max_deferred(const struct sched_item *s, int n);
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
struct sched_links schedule_links(struct sched_item it, enum sched_kind kind, int pp, int vpp, int rank);
/* How many items from s[i] on run between two exchanges (1 or 2). 1F1B
 * exchanges around every item; interleaved, a steady forward and the
 * backward after it share one exchange (one item each deadlocks there;
 * without a steady phase, m = pp, every item is a unit); the others
 * (zb-h1, zbv) around every item; dualpipev's pairs are one unit (both
 * inputs received before it, both results sent after). */
int schedule_unit(enum sched_kind kind, const struct sched_item *s, int n, int i);
#define SCHED_UNIT_MAX 2 /* the most items schedule_unit returns */

/* The V kinds' sends do not wait for their receives (a V order has traffic both
 * ways on every link, so grouped exchanges deadlock): each result goes into
 * a send buffer of its own, begun at once, and the buffer is free again
 * when the receiver takes it. The buffers a rank needs: one more than the
 * most in use at once when F, B and W cost alike, which keeps the run from
 * waiting on a full set of buffers in a way that could close a cycle (the
 * trainer takes whichever buffer completes first). Other kinds: two sets of
 * SCHED_UNIT_MAX (grouped, where the sends go in one group with the
 * receives, as over NCCL: one set): a unit's results go out as the next
 * unit or W begins, and the receiver need not have taken them before the
 * unit after next reuses their set, so a rank never waits for its peer to
 * take its results before it takes its own inputs (zb-h1's last stage runs
 * a W before its next receive). cost: what the order was made for
 * (schedule_build_timed; NULL: equal), and the simulation runs. */
int schedule_send_buffers(enum sched_kind kind, int pp, int vpp, int m, const double cost[3], int grouped);
/* The message tag of a forward's input (op SCHED_FORWARD) or a backward's
 * output gradient received by virtual stage vs: buffered sends are matched
 * by tag (MPI), so a V order may take a link's messages in another order
 * than they were sent (dualpipev does); within a tag, micro-batch order. */
int schedule_tag(enum sched_op op, int vs);
/* Whether a kind's sends are buffered (not grouped with the receives) */
#define SCHED_BUFFERED(kind) ((kind) == SCHED_ZBV || (kind) == SCHED_DUALPIPEV)

/* Run all ranks' schedules (training; forward_only: evaluation's order) with
 * unit-cost forwards and backwards of cost `backward_cost` (split kinds: B
 * backward_cost * (1 - w_share), W backward_cost * w_share), exchanging as
 * the trainer does (free transfers that wait for their peer). Returns 0 and
 * the bubble fraction (idle / total rank-time) if every rank completes, -1
 * on a deadlock, -2 if a receive would meet another message than the one it
 * expects. */
int schedule_simulate(enum sched_kind kind, int pp, int vpp, int m, int forward_only, double backward_cost,
                      double w_share, double *bubble);
/* The same with the V kinds' order made for made_for[] (forward, backward, W costs) */
int schedule_simulate_timed(enum sched_kind kind, int pp, int vpp, int m, int forward_only, double backward_cost,
                            double w_share, const double made_for[3], double *bubble);
/* The grouped kinds (1f1b, interleaved, zb-h1) on ranks of unequal speed:
 * rank i's items take speed[i] times their cost. Gives each rank's busy
 * time (busy[pp]) and the span (the last rank's end), from which a bubble
 * can be measured as scripts/bench/pipeline_schedules.sh measures it. */
int schedule_simulate_speeds(enum sched_kind kind, int pp, int vpp, int m, double backward_cost, double w_share,
                             const double *speed, double *busy, double *span);
