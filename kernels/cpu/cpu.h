/* CPU implementations of the backend ops (fp32, OpenMP + OpenBLAS). */
#pragma once
#include "kernels/ops.h"

void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
void cpu_zero(void *p, size_t bytes);
void cpu_copy(void *dst, const void *src, size_t bytes);
size_t cpu_attention_state_floats(int B, int H, int T);

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V);
void cpu_embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                            int V);
void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, int N, int C, int accumulate);
void cpu_matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate);
void cpu_matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                         int M, int accumulate_dx);
void cpu_rope(float *x, const float *cos, const float *sin, int B, int T, int H, int D, int inverse);
void cpu_copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate);
void cpu_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                           int H, int KVH, int D, int Dv);
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *att,
                            const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D, int Dv);
void cpu_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B, int c,
                                 int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1, int first);
void cpu_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                  int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1);
void cpu_attention_decode(float *out, const float *q, const float *k, const float *v, int n, int Tk, int H, int KVH,
                          int D, int Dv);
void cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
void cpu_cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale);
void cpu_ce_row_max(float *rowmax, const float *logits, int N, int V);
void cpu_ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                       const float *rowmax, int N, int V, int vstart);
void cpu_ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                   const float *target_logit, int N, int V, int vstart, float dscale);
void cpu_add(float *dst, const float *src, size_t n);
void cpu_scale(float *x, float s, size_t n);
double cpu_sum(const float *x, size_t n);
double cpu_sum_squares(const float *x, size_t n);
void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
               float eps, float weight_decay, float grad_scale, int step, uint16_t *work);
void cpu_moe_route_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits, int n, int E, int k);
void cpu_moe_route_backward(float *dlogits, const float *dw, const float *probs, const float *lse, const int32_t *idx,
                            const float *w, const float *aux_coef, float z_scale, int n, int E, int k, int T, int r0);
void cpu_moe_route_sigmoid_forward(float *scores, int32_t *idx, float *w, const float *logits, const float *bias, int n,
                                   int E, int k, int n_group, int topk_group, float scaling);
void cpu_moe_route_sigmoid_backward(float *dlogits, const float *dw, const float *scores, const int32_t *idx,
                                    const float *w, const float *aux_coef, int n, int E, int k, float scaling, int T,
                                    int r0);
const void *cpu_host_view(const void *p);
void cpu_moe_route_counts(float *counts, const int32_t *idx, int n, int k, int E, int T, int r0, int B);
void cpu_moe_route_balance(float *coef, double *metrics, const float *counts_all, const float *probs, const float *lse,
                           int n, int E, int k, int T, int r0, int B, int tp, int tp_rank, int sigmoid, float aux_scale,
                           long cap);
void cpu_moe_dispatch(int32_t *pos, int32_t *send_rows, float *expert_counts, const int32_t *idx,
                      const float *counts_all, int n, int k, int E, int T, int r0, int B, int tp_rank, long cap);
void cpu_moe_expert_order(int32_t *order, int32_t *inverse, int32_t *offsets, const float *in, int ep, int El,
                          int rows);
void cpu_gather_rows(float *out, const float *x, const int32_t *rows, int n, int C);
void cpu_moe_combine(float *out, const float *y, const int32_t *pos, const float *w, int n, int k, int C,
                     int accumulate);
void cpu_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const int32_t *pos,
                              const float *w, int n, int k, int C);
