/* The backend: one table of function pointers that owns device memory and
 * implements every numeric op the model needs. Model, optimizer and data code
 * call only through it and never dereference tensor memory, so a CUDA backend
 * drops in beside kernels/cpu without touching them.
 *
 * Conventions (all tensors fp32, row-major, contiguous):
 *   N = tokens in the micro batch (B*T), C = hidden size, linear weights are
 *   stored as [out_features, in_features] like torch.nn.Linear / Hugging Face.
 *   Backward ops ACCUMULATE (+=) into parameter gradients (so gradient
 *   accumulation over micro batches is free) and OVERWRITE activation
 *   gradients unless stated otherwise.
 *
 * Precision is a mode of the table, not a type in the signatures: the same
 * ops, the same model code, one table per (device, precision). Every tensor
 * an op writes or reads is *activation storage*, elements of act_bytes
 * bytes (4: fp32; 2: bf16, kernels/bf16.h), EXCEPT parameter gradients (dw,
 * dtable: fp32, accumulated straight from the fp32 sums), statistics (rstd,
 * the attention state, lse, router probabilities/scores, gate weights and
 * their gradient, losses, cross-entropy row stats, rope tables), norm gains
 * and the expert bias (read from the fp32 master) and the optimizer's
 * buffers, which are fp32. Weight matrices an op reads are the model's
 * working copy (model/transformer.h `weights`), activation storage too.
 * Every op computes in fp32 and rounds once where it stores. Pointers to
 * activation storage are typed float * as handles: offsets into them are
 * in elements of act_bytes (model/transformer.h act_at). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum precision { PRECISION_FP32 = 0, PRECISION_BF16, PRECISION_FP8 };

/* How an FP8 GEMM scales its operands into the 8-bit range (kernels/fp8.h):
 * one power-of-two scale per tensor, from its current amax; or one per block
 * along the contraction (activations and gradients 1 x 128, weights
 * 128 x 128: DeepSeek-V3's recipe); or one per tensor from the amaxes of
 * earlier steps (delayed: model/fp8_history.h keeps them). */
enum fp8_scaling { FP8_SCALING_TENSOR = 0, FP8_SCALING_BLOCK, FP8_SCALING_DELAYED };
/* The operands of an FP8 GEMM, as the delayed recipe indexes them. */
enum fp8_operand { FP8_INPUT = 0, FP8_WEIGHT, FP8_GRAD, FP8_OPERANDS };
/* The FP8 recipe of a GEMM: the scaling, and the format of output
 * gradients: e4m3 (default: 3 mantissa bits, as DeepSeek-V3) or e5m2 (2
 * mantissa bits, 2^13 more range; Transformer Engine's hybrid format). */
struct fp8_recipe {
    enum fp8_scaling scaling;
    int grad_e5m2;
    /* delayed scaling only: each operand's scale exponent, from its amax
     * history (FP8_SCALE_CURRENT: no history yet, its current amax decides),
     * and where the operands' current amaxes are max-accumulated for the
     * history (FP8_OPERANDS floats in backend memory; a NaN sticks) */
    int scale_exp[FP8_OPERANDS];
    float *amax;
    /* Non-zero: this GEMM belongs to a group of consecutive FP8 GEMMs that
     * read one input x (q/k/v, gate/up; the model numbers each group), so
     * the input's FP8 codes a GEMM of the same group made from the same x
     * (pointer and shape) may be reused instead of cast again. Current and
     * block scaling only (the codes depend on x alone). */
    unsigned input_group;
};

struct backend {
    const char *name;
    enum precision precision; /* fp32; bf16; fp8 = bf16 storage with the fp8_matmul ops below */
    size_t act_bytes;         /* bytes of one stored element: 4 (fp32) or 2 (bf16, fp8) */

    /* memory */
    void *(*alloc)(size_t bytes);               /* zero-initialised */
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*to_host)(void *host_dst, const void *src, size_t bytes);
    void (*from_host)(void *dst, const void *host_src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    /* Optional (NULL: none): p readable by the host as it is, without a
     * copy (the CPU's memory is the host's). */
    const void *(*host_view)(const void *p);

    /* Vocab-parallel embedding: table holds rows [vstart, vstart+V) of the
     * vocabulary. out[n,:] = table[tokens[n]-vstart,:], or zeros for a token
     * outside the slice (the tensor-parallel all-reduce fills it in). */
    void (*embedding_forward)(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart,
                              int V);
    /* dtable[tokens[n]-vstart,:] += dout[n,:] for tokens in the slice (deterministic order) */
    void (*embedding_backward)(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                               int V);

    /* out = x / rms(x) * w; saves rstd[N] for backward */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
    /* dx (+= if accumulate) and dw (+=) */
    void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                             const float *rstd, int N, int C, int accumulate);

    /* out[N,M] = x[N,K] @ w[M,K]^T (+= if accumulate) */
    void (*matmul_forward)(float *out, const float *x, const float *w, int N, int K, int M, int accumulate);
    /* dx[N,K] = dout @ w (+= if accumulate_dx; skipped if dx NULL); dw[M,K] += dout^T @ x */
    void (*matmul_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w, int N,
                            int K, int M, int accumulate_dx);
    /* The local experts' GEMMs at once (model/moe.c): expert e's rows are
     * off[e] .. off[e + 1] (host offsets) of the expert-major x, out, dout
     * and dx, its weight w[e] [M, K] and its gradient dw[e]. forward: out =
     * x w^T; backward: dx (+)= dout w, or dw[e] += dout^T x, one of them
     * a call (the other NULL). 0, or -1 where the table does not take them
     * (nothing written: the model calls matmul_forward / matmul_backward
     * per expert).
     * Optional: NULL in tables without them. */
    int (*experts_matmul_forward)(float *out, const float *x, const float *const *w, const int32_t *off, int E, int K,
                                  int M);
    int (*experts_matmul_backward)(float *dx, float *const *dw, const float *dout, const float *x,
                                   const float *const *w, const int32_t *off, int E, int K, int M, int accumulate_dx);

    /* Rotary embedding in place on x[B,T,H,D] (Hugging Face rotate_half
     * layout): positions 0..T-1, cos/sin tables [max_T, D/2]. inverse=1 applies
     * the transpose (the backward pass). */
    void (*rope)(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse);

    /* Causal GQA attention. q,k [B,T,H|KVH,D], v [B,T,KVH,Dv] -> out[B,T,H,Dv]
     * (Dv = D except in MLA), scores scaled by 1/sqrt(D).
     * att keeps what backward needs, attention_state_floats(B,H,T) floats:
     * the CPU keeps the softmax probabilities [B,H,T,T]; the CUDA backend only
     * each row's log-sum-exp [B,H,T] and recomputes the probabilities. */
    void (*attention_forward)(float *out, float *att, const float *q, const float *k, const float *v, int B,
                              int T, int H, int KVH, int D, int Dv);
    size_t (*attention_state_floats)(int B, int H, int T);
    /* dq, dk, dv overwritten. out: the forward's output (flash attention's
     * backward takes rowsum(dout * out) from it; other kernels ignore it). */
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                               const float *att, const float *q, const float *k, const float *v, int B, int T,
                               int H, int KVH, int D, int Dv);

    /* Context parallelism (model/cp_attention.c): causal attention of a
     * block of queries against a block of keys and values of the same
     * sequences, each block [B, 2c, ...] holding two chunks of c positions
     * (chunks q0, q1 of the queries, k0, k1 of the keys: position = chunk * c
     * + offset); a key chunk later than the query chunk is masked whole, the
     * same chunk causally. q, k, v are stored activations; o [B,2c,H,Dv] and
     * lse [B,H,2c] are fp32 running results that each call merges its block
     * into by log-sum-exp (first = 1 starts them: rows no key reached have lse
     * -inf and o 0). Scores scaled by 1/sqrt(D). (CUDA: the flash kernels'
     * block form on bf16 storage, kernels/cuda/flash_attention.cuh; else a
     * warp per row, kernels/cuda/attention_block.cuh.) */
    void (*attention_block_forward)(float *o, float *lse, const float *q, const float *k, const float *v, int B, int c,
                                    int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1, int first);
    /* The block's gradients from the final out (stored) and lse: dq [B,2c,H,D]
     * of the queries and dk, dv of the keys and values, fp32, accumulated (+=). */
    void (*attention_block_backward)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                     const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                     int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1);

    /* Incremental decoding against a KV cache: n queries q[n,H,D] at the
     * last n positions Tk-n .. Tk-1 of one sequence attend causally to the
     * cached keys k[Tk,KVH,D] and values v[Tk,KVH,Dv] (rows [0, Tk), the
     * queries' own positions included; Dv = D except in MLA) -> out[n,H,Dv],
     * scores scaled by 1/sqrt(D). No state is kept (inference only). */
    void (*attention_decode)(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H,
                             int KVH, int D, int Dv);

    /* dst[r*ldd + c] = (or += if accumulate) src[r*lds + c] for r < rows, c < cols:
     * a block of columns between row-major matrices (MLA's per-head splits). */
    void (*copy_cols)(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate);

    /* out = silu(gate) * up, elementwise over n */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                            size_t n);

    /* Mixture-of-experts routing (model/moe.c). logits [n,E] -> probs [n,E]
     * (softmax), lse [n] (log-sum-exp, for the z-loss), the top k experts
     * idx [n,k] by descending probability (ties: the lower index) and their
     * gate weights w [n,k]: the chosen probabilities renormalised to sum 1. */
    void (*moe_route_forward)(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E,
                              int k);
    /* dlogits [n,E] (overwritten) from dw [n,k], the gradient of the gate
     * weights, plus the auxiliary losses' gradients: aux_coef [B,E] per
     * sequence (NULL: none; moe_route_balance) is added to dL/dprobs[t,e],
     * token t being row r0 + t of a micro batch of sequences of T tokens
     * (load balancing), z_scale * 2 * lse[t] to dL/dlse[t] (z-loss). */
    void (*moe_route_backward)(float *dlogits, const float *dw, const float *probs, const float *lse,
                               const int32_t *idx, const float *w, const float *aux_coef, float z_scale, int n,
                               int E, int k, int T, int r0);
    /* DeepSeek-V3 routing: scores [n,E] = sigmoid(logits); the choice ranks
     * scores + bias[E] (bias NULL: none). With n_group > 1 (at most 64) only
     * experts of the best topk_group groups are eligible, a group (E/n_group
     * consecutive experts) scored by the sum of its two best biased scores.
     * idx [n,k]: the top k eligible experts by descending biased score (ties:
     * the lower index); w [n,k] = the chosen experts' unbiased scores over
     * their sum, x scaling (routed_scaling_factor). */
    void (*moe_route_sigmoid_forward)(float *scores, int32_t *idx, float *w, const float *logits, const float *bias,
                                      int n, int E, int k, int n_group, int topk_group, float scaling);
    /* dlogits [n,E] (overwritten) from dw [n,k], plus aux_coef [B,E] per
     * sequence (NULL: none; token t in sequence (r0 + t) / T) as
     * dL/d(s_e / sum_j s_j), the sequence-wise balance loss. */
    void (*moe_route_sigmoid_backward)(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                       const float *w, const float *aux_coef, int n, int E, int k, float scaling,
                                       int T, int r0);

    /* out[i,:] = x[rows[i],:] for i < n (permute tokens to experts and back) */
    void (*gather_rows)(float *out, const float *x, const int32_t *rows, int n, int C);
    /* out[t,:] (+= if accumulate) sum over j < k with pos[t,j] >= 0 of
     * w[t,j] * y[pos[t,j],:] (w NULL: weight 1). Un-permutes the experts'
     * outputs with the gate weights; with w NULL it is the backward of the
     * permutation. */
    void (*moe_combine)(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                        int accumulate);
    /* backward of moe_combine: dy[pos[t,j],:] = w[t,j] * dout[t,:] and
     * dw[t,j] = dout[t,:] . y[pos[t,j],:] (0 where pos < 0, a dropped token) */
    void (*moe_combine_backward)(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                                 const float *w, int n, int k, int C);

    /* Routing decisions on the device (model/moe.c; kernels/cpu/moe_plan.c,
     * kernels/cuda/moe_plan.cuh), so an MoE layer needs no host round trip.
     * A TP rank routes n tokens, rows [r0, r0 + n) of a micro batch of B
     * sequences of T tokens; idx [n,k] are its choices (moe_route_*).
     * Counts are whole numbers held in floats (exact below 2^24), so the
     * float collectives carry them. */
    /* counts [B,E] (overwritten): this rank's selections per sequence and expert */
    void (*moe_route_counts)(float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B);
    /* From every TP rank's counts counts_all [tp,B,E] (c = their sum):
     * coef [B,E] = aux_scale * f * c / T, the balance loss's gradient
     * coefficients (f = E/T for softmax routing, E/(kT) for sigmoid).
     * metrics (NULL: none) [E+3] += this rank's share of the step's
     * statistics, summed over ranks afterwards: [e] the selections of expert
     * e (TP rank 0: c summed over sequences), [E] the balance loss
     * f/T sum_t sum_e c[seq(t),e] p[t,e] / norm_t over this rank's tokens
     * (norm_t 1 for softmax, sum_e p[t,e] for sigmoid), [E+1] the z-loss
     * sum_t lse[t]^2 / T (softmax; lse unread for sigmoid), [E+2] selections
     * over the capacity cap (TP rank 0; cap < 0: none). */
    void (*moe_route_balance)(float *coef, double *metrics, const float *counts_all, const float *probs,
                              const float *lse, int n, int E, int k, int T, int r0, int B, int tp, int tp_rank,
                              int sigmoid, float aux_scale, long cap);
    /* The capacity and the counting sort into expert-major order. Selection
     * i of idx is kept unless its (sequence, expert) already holds cap
     * selections (cap < 0: no limit), counting TP ranks before tp_rank
     * first (counts_all [tp,B,E]), then this rank's in token order.
     * pos [n,k]: a kept selection's row in expert-major order (stable in
     * token order), -1 for a dropped one; send_rows [n*k]: each row's token,
     * the kept rows first, then the dropped selections in token order;
     * expert_counts [E]: kept rows per expert. */
    void (*moe_dispatch)(int32_t *pos, int32_t *send_rows, float *expert_counts, const int32_t *idx,
                         const float *counts_all, int n, int k, int E, int T, int r0, int B, int tp_rank, long cap);
    /* Rows received from an expert-parallel group arrive source-major: in
     * [ep,El] rows from source s for local expert e (sources in rank order,
     * experts in order within each). offsets [El+1]: the first expert-major
     * row of each local expert (offsets[El], the total). order and inverse
     * (NULL: offsets only): order[expert-major row] = received row, and its
     * inverse. rows: at least the total (the buffers' bound). */
    void (*moe_expert_order)(int32_t *order, int32_t *inverse, int32_t *offsets, const float *in, int ep, int El,
                             int rows);

    /* Softmax cross-entropy over logits[N,V] against targets[N] (a target < 0
     * is ignored). losses[n] = -log p[target]. If dscale != 0 the logits are
     * overwritten by their gradient times dscale (fused backward). */
    void (*cross_entropy)(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale);

    /* Vocab-parallel cross-entropy in three passes around two all-reduces
     * (max, then sums): logits [N,V] is this rank's slice of the vocabulary
     * starting at vstart. */
    void (*ce_row_max)(float *rowmax, const float *logits, int N, int V);
    /* sumexp[n] = sum exp(logit - rowmax); target_logit[n] = logit of the
     * target if this slice holds it, else 0 */
    void (*ce_row_sumexp)(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                          const float *rowmax, int N, int V, int vstart);
    /* losses from the global stats; logits become dscale * dloss/dlogits if dscale != 0 */
    void (*ce_finish)(float *losses, float *logits, const int32_t *targets, const float *rowmax,
                      const float *sumexp, const float *target_logit, int N, int V, int vstart, float dscale);

    /* dst (storage, n elements) = src (fp32) in this table's precision
     * (bf16: rounded to nearest even; fp32: a copy): the model's working
     * copy of the weights, and activations a communicator summed in fp32. */
    void (*to_storage)(float *dst, const float *src, size_t n);
    /* dst (fp32) = src (storage), exact. */
    void (*from_storage)(float *dst, const float *src, size_t n);

    /* dst += src */
    void (*add)(float *dst, const float *src, size_t n);
    /* x *= s */
    void (*scale)(float *x, float s, size_t n);
    /* sum of x (double accumulator, fixed order) */
    double (*sum)(const float *x, size_t n);
    /* sum of x^2 (double accumulator, fixed order) */
    double (*sum_squares)(const float *x, size_t n);

    /* torch.optim.AdamW semantics, one tensor: grad is scaled by grad_scale
     * first (clipping), step is 1-based. work: NULL, or n bf16 values (2
     * bytes each) that receive the updated parameters rounded to nearest
     * even in the same pass: the bf16 tables' working copy (to_storage's
     * numbers, without a second pass over the parameters). */
    void (*adamw)(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int step, uint16_t *work);

    /* Optional (NULL on the CPU): the device memory in use now, in MiB, and
     * the device's dense peak TFLOP/s for fp32 matmuls (tf32 = on TF32 tensor
     * cores), 0 when the device is not in the table. */
    double (*device_mem_mib)(void);
    double (*peak_tflops)(int tf32);

    /* Only in fp8 tables (NULL elsewhere): matmul_forward/backward with FP8
     * operands, for the blocks' linear layers. Weights and activations are
     * quantised to e4m3, output gradients to e4m3 or e5m2 (the recipe),
     * each scaled by its current amax (per tensor or per block), products
     * summed in fp32; outputs stored like matmul_forward's, dw accumulated
     * in fp32. */
    void (*fp8_matmul_forward)(float *out, const float *x, const float *w, int N, int K, int M, int accumulate,
                               struct fp8_recipe recipe);
    void (*fp8_matmul_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                                int M, int accumulate_dx, struct fp8_recipe recipe);
};

/* Blocking device-to-host copies so far (every table's to_host, and any a
 * CUDA op makes inside): tests count those an MoE layer makes. */
long backend_d2h_copies(void);
void backend_count_d2h(void);
/* FP8 GEMMs (forward or backward calls) a GPU table ran on the slow
 * reference path (quantise-dequantise, a wider GEMM) because no FP8 GEMM
 * took the shape: benchmarks report it */
long backend_fp8_reference_gemms(void);
void backend_count_fp8_reference(void);

/* "cpu", "cuda" or "auto" at precision "fp32", "bf16" or "fp8"; returns
 * NULL with a message if unavailable. */
const struct backend *backend_get(const char *name, const char *precision);
/* The table of the CUDA (cuda 1) or CPU backend at a precision, NULL for an
 * unknown one; it asks nothing of the machine (the dry run plans with it). */
const struct backend *backend_table(int cuda, const char *precision);
/* Why this machine's device for `device` ("auto", "cuda", "cpu") cannot run
 * the precision (fp8 on a GPU without FP8 tensor cores), or NULL. */
const char *backend_precision_error(const char *device, const char *precision);
extern const struct backend cpu_backend, cpu_bf16_backend, cpu_fp8_backend;
/* kernels/cuda; empty tables in builds without it */
extern const struct backend cuda_backend, cuda_bf16_backend, cuda_fp8_backend;
/* The CPU table cpu with the CUDA backend's memory ops (alloc, free, zero,
 * copies): host-side kernels on memory from cudaMalloc, moved by
 * cudaMemcpy. Only for tests under the stand-in CUDA runtime (tests/mock/,
 * where that memory is host memory it keeps account of), so that NCCL and
 * the MPI staging see exactly the buffers a GPU run hands them. */
const struct backend *backend_in_device_memory(const struct backend *cpu);
/* "fp32", "bf16", "fp8" */
const char *precision_name(enum precision p);
/* This GPU's tensor cores multiply FP8 (compute capability 8.9 or newer);
 * 0 without a GPU. */
int cuda_device_has_fp8(void);
/* How many FP8 GEMMs ran on FP8 tensor cores so far (not the reference
 * path), with block scales (block 1) or per-tensor ones; 0 without CUDA. */
long cuda_fp8_tensor_core_gemms(int block);
/* One block-scaled FP8 GEMM on the GPU against the host under each reading
 * of its scale layouts (kernels/cuda/fp8_gemm.cu): 1 mtrain's matches, 0
 * another or none does, -1 no block-scaled GEMM here; msg says which. */
int cuda_fp8_block_layout_probe(char *msg, size_t n);
/* Every bf16 value times 2^k through the GPU's FP8 casts against
 * kernels/fp8.h's rounding, bitwise: the number of codes that differ (0
 * passes; msg names the first), -1 on a failure or without CUDA. */
long cuda_fp8_cast_check(int format, int k, char *msg, size_t n);
/* This build has the CUDA backend and a GPU is visible. */
int cuda_backend_available(void);
/* Let cuBLAS use TF32 tensor cores for fp32 matmuls (CUDA backend only). */
void cuda_set_tf32(int on);
/* train.deterministic: attention backwards that repeat bitwise (cuDNN's
 * deterministic algorithm) or the faster one with atomics (CUDA only). */
void cuda_set_deterministic(int on);
/* What ran the last CUDA bf16 attention call: "cudnn", "cudnn-atomic"
 * (backward, train.deterministic false), "flash", "reference" ("none"
 * before any, or without the CUDA backend). */
const char *cuda_attention_last(void);
int cuda_device_count(void);
const char *cuda_device_error(void); /* why cuda_device_count() said 0 */
/* The PCI bus id of the current GPU ("0000:1b:00.0") into buf; 0 without one. */
int cuda_device_pci_id(char *buf, int n);
/* GPU dev in words into buf ("NVIDIA H100 80GB HBM3, compute capability 9.0,
 * 79.1 GiB, PCI 0000:1b:00.0"); 0 without it. */
int cuda_device_describe(int dev, char *buf, int n);
/* The CUDA runtime, driver and cuBLASLt versions in words into buf (mtrain env). */
void cuda_versions(char *buf, int n);
/* Bind this process to GPU local_rank % devices (one GPU per rank on a node). */
void cuda_use_device(int local_rank);
/* The local experts' GEMMs in one cuBLAS grouped call each (kernels/cuda/
 * expert_gemm.cu; bf16 storage, expert-major rows off[e] .. off[e + 1] with
 * host offsets, w / dw one device matrix [M, K] per expert): out = x w^T,
 * dx (+)= dout w, dw (fp32) += dout^T x. 0, or -1 where cuBLAS has none
 * (nothing written; always without CUDA). Measured by
 * scripts/bench/bench_expert_gemm.c; not yet the model's path. */
int cuda_grouped_expert_forward(float *out, const float *x, const float *const *w, const int *off, int E, int K, int M);
int cuda_grouped_expert_dgrad(float *dx, const float *dout, const float *const *w, const int *off, int E, int K, int M,
                              int accumulate);
int cuda_grouped_expert_wgrad(float *const *dw, const float *dout, const float *x, const int *off, int E, int K, int M);

#ifdef __cplusplus
}
#endif
