/* The tiny model the model-level unit tests build their families on, and
 * random tokens for it (deterministic: an LCG from the seed). */
#pragma once
#include <stdint.h>

#include "config/recipe.h"

/* recipe defaults at vocabulary 264, hidden 64, 3 layers, 4/2 heads, FFN 128 */
static inline void tiny_model(struct model_config *m) {
    struct recipe r;
    recipe_defaults(&r);
    *m = r.model;
    m->vocab_size = 264, m->hidden_size = 64, m->num_layers = 3, m->num_heads = 4, m->num_kv_heads = 2;
    m->intermediate_size = 128;
}

/* n tokens and targets in [0, vocab) */
static inline void tiny_tokens(int32_t *tok, int32_t *tgt, int n, int vocab, unsigned long long s) {
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (unsigned)vocab);
        tgt[i] = (int32_t)((s >> 13) % (unsigned)vocab);
    }
}
