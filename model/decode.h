/* Incremental decoding with a KV cache, for `mtrain generate`: each call
 * feeds the next tokens of one sequence and appends their keys and values to
 * the cache, so a generated token costs one position's forward, not a re-run
 * of the prefix. It uses the weights of a whole-model transformer (tp = pp =
 * ep = 1, model/transformer.h) and only backend ops. MoE layers route
 * dropless (every chosen expert runs, as Hugging Face's Mixtral does):
 * train.moe_capacity_factor is a training-time limit. */
#pragma once
#include <stdint.h>

#include "model/transformer.h"

struct decoder {
    const struct transformer *m;   /* weights */
    const struct backend *be;
    int max_T;                     /* positions the cache holds */
    int chunk;                     /* most tokens per forward (longer prompts are fed in pieces) */
    int len;                       /* positions filled so far */
    float *kcache, *vcache;        /* [L][max_T][KV*D], keys after RoPE */
    float *rope_cos, *rope_sin;    /* [max_T, D/2] */
    float *x, *xmid, *ln, *rstd, *q, *att, *gate, *up, *h, *logits; /* chunk rows */
    int32_t *tokens;               /* [chunk] */
    /* MoE: router output and the chosen experts' rows, expert-major */
    float *rlogits, *probs, *lse, *topw, *xe, *eg, *eu, *eh, *ye, *moe_out;
    int32_t *topi, *pos, *rows;
    int32_t *host_topi, *host_pos, *host_rows; /* [chunk * K] */
    int *host_count;               /* [E] */
};

/* A cache of max_T positions (at most the model's position limit, checked by
 * the caller) over the weights of m, which must hold the whole model. */
void decoder_create(struct decoder *d, const struct transformer *m, int max_T);
void decoder_free(struct decoder *d);
/* Forget the sequence (the cache is overwritten from position 0). */
void decoder_reset(struct decoder *d);
/* Feed tokens[0, n) at positions len .. len+n-1 (len + n <= max_T) and write
 * the logits that follow the last of them to logits_out (host, [V]). */
void decoder_forward(struct decoder *d, const int32_t *tokens, int n, float *logits_out);
