/* Incremental decoding with a KV cache, for `mtrain generate`: each call
 * feeds the next tokens of one sequence and appends their keys and values to
 * the cache, so a generated token costs one position's forward, not a re-run
 * of the prefix. It uses the weights of a whole-model transformer (tp = pp =
 * ep = 1, model/transformer.h) and only backend ops. MoE layers route
 * dropless (every chosen expert runs, as Hugging Face's Mixtral and
 * DeepSeek-V3 do): train.moe_capacity_factor is a training-time limit.
 * Multi-head latent attention (DeepSeek-V3) caches each position's keys and
 * values after the up projection ([H, D] and [H, Dv]), as Hugging Face's
 * DeepseekV3 does, not the latent: simpler, more memory. MTP modules are
 * not run (they train the model; generation uses the main head). */
#pragma once
#include <stdint.h>

#include "model/transformer.h"

struct decoder {
    const struct transformer *m;   /* weights */
    const struct backend *be;
    int max_T;                     /* positions the cache holds */
    int chunk;                     /* most tokens per forward (longer prompts are fed in pieces) */
    int len;                       /* positions filled so far */
    float *kcache, *vcache;        /* [L][max_T][KV*D] keys after RoPE, [L][max_T][KV*Dv] values */
    float *rope_cos, *rope_sin;    /* [max_T, Dr/2] (Dr: the rotary head size, D but in MLA) */
    float *x, *xmid, *ln, *rstd, *q, *att, *gate, *up, *h, *logits; /* chunk rows */
    int32_t *tokens;               /* [chunk] */
    /* MLA: the latents [chunk, QR], [chunk, KR], the rotary key [chunk, Dr],
     * the up projection [chunk, H*(DN+Dv)] and a rotary scratch [chunk*H, Dr] */
    float *qa, *qan, *ckv, *kvn, *kpe, *kvb, *rot, *rstd2;
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
