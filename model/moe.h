/* The mixture-of-experts FFN of a layer (Mixtral form): a router picks the
 * top k of E experts per token by softmax probability, renormalised over the
 * chosen; each expert is a SwiGLU MLP; the token's output is the gate-weighted
 * sum of its experts' outputs. Load-balancing (Switch/Mixtral) and z-losses
 * add gradients to the router; an optional capacity factor drops overflow
 * tokens in token order.
 *
 * Under tensor parallelism the router is replicated and each TP rank routes
 * its 1/tp share of the micro batch's tokens (rows [r*n, (r+1)*n) of the
 * gathered norm output), so its gradient is partial over TP
 * (param_info.tp_partial). Each EP rank owns E/ep experts (the EP group is
 * drawn from the tp x cp x dp ranks, parallel/grid.h: TP peers may own
 * different experts); tokens go to their experts' ranks with a variable
 * all-to-all and come back the same way. The ranks holding the same experts
 * (edp) saw different tokens: their gradients are summed over edp. */
#pragma once
#include "model/transformer.h"

/* out [n, C] = MoE(x [n, C]) for layer l; saves what backward needs in a. */
void moe_forward(struct transformer *m, struct layer_acts *a, int l, const float *x, float *out);
/* d_x [n, C] (overwritten) from d_out [n, C]; weight gradients accumulate.
 * Under selective recompute the experts' SwiGLU products are recomputed. */
void moe_backward(struct transformer *m, struct layer_acts *a, int l, const float *d_out, float *d_x);
/* The same in phases split at the layer's two all-to-alls when it exchanges
 * tokens (ep > 1 or etp > 1: moe_phases 3, else 1): each phase returns the
 * ticket of the all-to-all it began on m->ep_comm (0: none), which the
 * caller completes (comm_wait_ticket) before the next phase, and may run
 * other work meanwhile (model/pair.c); moe_forward and moe_backward run them
 * in turn. A backward's phases use the scratch set in place when they run
 * (moe_send, moe_ra, moe_rb: the pair's backward is lent its own). */
int moe_phases(const struct transformer *m);
int moe_forward_phase(struct transformer *m, struct layer_acts *a, int l, const float *x, float *out, int phase);
int moe_backward_phase(struct transformer *m, struct layer_acts *a, int l, const float *d_out, float *d_x, int phase);
/* Exchange the MoE exchange scratch in use (moe_send, moe_ra, moe_rb, the expert
 * gradients' and etp's fp32 rows) with a second set (created on the first call:
 * n k + moe_R0 rows), so that a pair's backward phases run while the forward's
 * all-to-all still moves the first set's rows (model/pair.c); again to swap
 * back. moe_lane_free releases it. */
void moe_lane_swap(struct transformer *m);
void moe_lane_free(struct transformer *m);
/* Its bytes (the memory estimate) */
size_t moe_lane_bytes(const struct transformer *m);
/* Rows of the expert buffers one MoE layer needs on this rank, n routed
 * tokens per rank in sequences of seq_len: the worst case, every routed token
 * of the EP group on this rank (bounded by the capacity if set). */
int moe_expert_rows(const struct model_config *cfg, int n, int seq_len, int ep);
/* Selections of one (sequence, expert) the capacity keeps: ceil(f * seq_len
 * * k / E) for model.moe_capacity_factor f, at most seq_len (what a sequence
 * can select: larger never drops); -1 dropless. */
long moe_capacity(const struct model_config *cfg, int seq_len);
/* Rows the expert buffers get at first: all of moe_expert_rows at ep 1
 * (where they are what one rank routes), else the mean a rank receives,
 * n k, times model.moe_rows_headroom (at most moe_expert_rows). A micro
 * batch that routes more to a rank grows its buffers (model/moe.c); the
 * memory estimate counts this size. */
int moe_initial_rows(const struct model_config *cfg, int n, int seq_len, int ep);
void moe_host_free(struct transformer *m);
/* Floats of m->moe_counts: kept rows per expert sent, then received, then (etp > 1) each etp peer's received. */
size_t moe_counts_len(const struct transformer *m);
