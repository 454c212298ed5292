/* A Llama 3 decoder: parameters, gradients and activations in three big
 * buffers owned by the backend, forward and backward as explicit per-block
 * functions (llm.c style). */
#pragma once
#include <stdint.h>

#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/params.h"

struct llama_layer {
    float *ln1_w, *wq, *wk, *wv, *wo, *ln2_w, *wgate, *wup, *wdown;
};

/* Saved forward activations of one layer, [N, ...] with N = B*T. */
struct layer_acts {
    float *x;            /* layer input (residual stream) */
    float *ln1, *rstd1;
    float *q, *k, *v;    /* after RoPE */
    float *att;          /* [B,H,T,T] probabilities */
    float *attn_out;     /* [N, H*D] */
    float *xmid;         /* residual after attention */
    float *ln2, *rstd2;
    float *gate, *up, *h;
};

struct llama {
    const struct backend *be;
    struct model_config cfg;
    int B, T;                    /* micro batch shape the arena is sized for */
    int C, H, KV, D, F, V, L;
    struct param_table table;
    float *params, *grads;       /* one buffer each, table offsets */
    struct llama_layer *layers;  /* pointers into params */
    struct llama_layer *dlayers; /* pointers into grads */
    float *embed, *norm_w, *lm_head, *dembed, *dnorm_w, *dlm_head;
    float *rope_cos, *rope_sin;  /* [T, D/2] */
    /* activation arena */
    float *arena;
    size_t arena_floats;
    struct layer_acts *acts;     /* L entries */
    float *x_final, *lnf, *rstdf, *logits, *losses;
    float *d_resid, *d_ln, *d_attn, *d_q, *d_k, *d_v, *d_gate, *d_up, *d_h;
    int32_t *tokens, *targets;   /* device copies of the micro batch */
};

/* Allocate everything for micro batches of B x T. Parameters are zero until
 * llama_init_params or a load. */
void llama_create(struct llama *m, const struct backend *be, const struct model_config *cfg, int B, int T);
void llama_free(struct llama *m);
void llama_init_params(struct llama *m, uint64_t seed);
/* Bytes the activation arena takes for B x T (for the memory estimate). */
size_t llama_arena_bytes(const struct model_config *cfg, int B, int T);

/* Forward a micro batch (host tokens/targets, B*T each). Returns the summed
 * token loss (host). If dscale != 0, also runs the backward pass, adding
 * dscale * d(sum loss)/d(param) into m->grads. */
double llama_step(struct llama *m, const int32_t *tokens, const int32_t *targets, float dscale);

/* Fill [T, D/2] cos/sin tables, with Llama 3.1 frequency scaling when
 * cfg->rope_scaling_factor > 0 (host memory). */
void rope_tables(float *cos_out, float *sin_out, const struct model_config *cfg, int T);
