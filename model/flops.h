/* Analytic cost model: FLOPs per token and memory per rank. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/recipe.h"

struct backend;

/* Training FLOPs per token (forward + backward): 6 x (parameters used in
 * matmuls, the output projection included, the embedding lookup excluded)
 * + 6 x layers x hidden x seq_len for causal attention (QK^T and AV, forward
 * and backward, halved for the causal mask). A MoE layer counts its router
 * and the experts_per_token experts a token visits. */
double model_flops_per_token(const struct model_config *m, int seq_len);
/* Parameters (global, each tensor once): the main model and the MTP
 * modules (which share the embedding and output head), all and those one
 * token uses (all but the routed experts a MoE layer does not send it to). */
struct param_counts {
    int64_t main, main_active, mtp, mtp_active;
    int64_t embed_head; /* of main: the embedding and output head */
};
struct param_counts model_param_counts(const struct model_config *m);
/* The dry run's parameter lines (total, active; main model and MTP). */
void model_print_param_counts(FILE *out, const struct model_config *m);
/* Parameters (global, each tensor once), MTP modules included. */
int64_t model_param_count(const struct model_config *m);
/* Parameters one token uses: all but the experts a MoE layer does not route it to. */
int64_t model_active_param_count(const struct model_config *m);

struct memory_estimate {
    size_t params, grads, optimizer, activations; /* bytes per rank, on the backend's device: params is the
                                                   * fp32 master (sharded under ZeRO-1 with a working copy) */
    size_t local_params; /* parameters this rank holds (its table's floats) */
    size_t weights;     /* the bf16 working copy of the weights; 0 at fp32 */
    size_t buffers;     /* pipeline send/receive buffers, kv-block scratch, a bf16 table's fp32 scratch */
    size_t host;        /* host memory besides the model: batches and prefetch, final weights, the snapshot */
    size_t snapshot;    /* ... of which the host snapshot of checkpoints or of multi-rank final weights */
    size_t runtime;     /* the process itself on the CPU backend: libraries, MPI, BLAS buffers (measured) */
    size_t total;       /* what the device holds (+ host and runtime on the CPU backend) */
    int in_flight;      /* micro batches whose activations the stage holds at once */
};
/* Resident memory of a CPU-backend mtrain process before its model: code,
 * shared libraries, MPI and OpenBLAS thread buffers (measured with a
 * one-layer model on Debian 12, MPICH 4, OpenBLAS 0.3.21, this build). */
#define MTRAIN_RUNTIME_BYTES (170ull << 20)
/* The most loaded rank (pipeline stage 0: embedding + its layers + the most
 * micro batches in flight) for dp data-parallel ranks (ZeRO-1 divides the
 * moments by dp). Activations are this implementation's on backend be
 * (only its attention_state_floats is called: no device is touched): the CPU
 * keeps B x heads x T x T probabilities, CUDA a log-sum-exp per row; the
 * recompute mode decides which of them are kept. Every buffer a rank
 * allocates is counted; tests/integration/memory_estimate.sh compares the
 * total with measured peak RSS. */
struct memory_estimate model_memory_estimate(const struct recipe *r, int dp, const struct backend *be);
/* The same for the ranks of pipeline stage pp_rank (its layers, the head on
 * the last, and the micro batches its schedule keeps in flight). */
struct memory_estimate model_memory_estimate_stage(const struct recipe *r, int dp, const struct backend *be,
                                                   int pp_rank);
