/* Context parallelism: each sequence of seq_len tokens is cut into 2*cp
 * chunks of c = seq_len / (2 cp) and cp rank r holds chunks r and
 * 2cp-1-r (its T = 2c local tokens: rows [0, c) and [c, 2c) of each
 * sequence), so that every rank gets the same share of the causal
 * attention's work. Everything but attention is per token and runs on the
 * local tokens as it is (RoPE reads the tables of the local positions);
 * attention runs as a ring over the cp group: each rank's keys and values
 * travel to the next rank cp - 1 times, and each rank merges the partial
 * attention of its queries against every block by log-sum-exp
 * (kernels/ops.h attention_block_forward). Backward goes the same way with
 * the gradients of the keys and values travelling with their block, and
 * one last hop home.
 *
 * Each hop of keys and values is begun before the block in hand is computed
 * and waited for after it (comm_exchange_start: overlapped over MPI on host
 * memory; NCCL and staged device memory exchange at once); the gradients'
 * hop follows the block's computation.
 *
 * Bytes each rank sends per attention layer and micro batch: forward
 * (cp-1) x K,V of its tokens in storage precision; backward (cp-1) x K,V
 * plus cp x their fp32 gradients. Memory: two K,V blocks in storage, the
 * fp32 running output and query gradient, two fp32 K,V gradient blocks
 * (cp_attention_scratch_bytes), allocated once. */
#pragma once
#include "model/transformer.h"

/* The global position of local row t (0 <= t < 2c) of cp rank r. */
int cp_position(int cp_rank, int cp, int c, int t);
/* Bytes of the ring's scratch for the model's local shapes. */
size_t cp_attention_scratch_bytes(const struct transformer *m);
/* out [B,T,Hl,Dv] (stored) and lse [B,Hl,T] (fp32, kept for backward) from
 * this rank's q, k, v, over the ring. */
void cp_attention_forward(struct transformer *m, float *out, float *lse, const float *q, const float *k,
                          const float *v);
/* dq, dk, dv (stored, overwritten) from dout and the forward's out and lse. */
void cp_attention_backward(struct transformer *m, float *dq, float *dk, float *dv, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k, const float *v);
void cp_attention_free(struct transformer *m);
