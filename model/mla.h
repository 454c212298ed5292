/* Multi-head latent attention (DeepSeek-V3): queries come from a low-rank
 * latent (q_a_proj, RMSNorm, q_b_proj; or a full-rank q_proj), keys and
 * values from one joint latent (kv_a_proj_with_mqa, RMSNorm, kv_b_proj).
 * Each query/key head is [nope | rope]: the nope part from the up
 * projections, the rope part rotated; the rotary key is one head computed
 * straight from the normalised input and shared by all heads. Values have
 * their own head size Dv. The attention core is the backend's attention op
 * with D = nope + rope and Dv.
 *
 * Under tensor parallelism the heads split over TP (q_b_proj, kv_b_proj by
 * rows, o_proj by columns) while q_a_proj, kv_a_proj_with_mqa and the two
 * latent norms are replicated: every rank computes the whole latents from
 * the gathered input, and their gradients are partial over TP (each rank
 * back-propagates only its heads), summed before the update (tp_partial). */
#pragma once
#include "model/transformer.h"

/* a->q, a->k, a->v (attention inputs, after RoPE) from a->ln1; keeps the latents in a. */
void mla_forward(struct transformer *m, struct layer_acts *a, int l);
/* From m->d_q, m->d_k, m->d_v (the attention op's gradients): weight
 * gradients accumulate, m->d_ln_full is overwritten with this rank's part of
 * the gradient of ln1. */
void mla_backward(struct transformer *m, struct layer_acts *a, int l);
