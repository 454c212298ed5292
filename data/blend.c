/* Blending by greedy error minimization. The choice for sample s depends on
 * the realized counts after samples 0..s-1, so the sequence is replayed from
 * checkpoints: the counts are stored every BLOCK samples (grown lazily), and
 * the choices of one block are cached, so sequential and strided access cost
 * O(sources) per sample and a random jump at most BLOCK x sources. */
#include "data/blend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "config/recipe.h"

#define BLOCK 4096

struct blend {
    int n, seq_len;
    double *w;                /* normalized weights */
    struct dataset **ds;
    struct sampler **smp;
    int64_t *ckpt;            /* counts at the start of block k: n per block */
    int64_t nckpt, ckpt_cap;
    int64_t cached_block;     /* block whose choices are below, -1: none */
    uint16_t *choice;         /* source of each sample of the cached block */
    int64_t *within;          /* its index in that source */
};

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct blend *blend_create(const struct blend_source *src, int n, int seq_len, uint64_t seed, enum split split,
                           double valid_fraction, int sampler_version) {
    if (n < 1 || n > 65535) die("blend: %d datasets (1 .. 65535)", n);
    struct blend *b = xcalloc(1, sizeof *b);
    b->n = n;
    b->seq_len = seq_len;
    b->w = xmalloc((size_t)n * sizeof *b->w);
    b->ds = xcalloc((size_t)n, sizeof *b->ds);
    b->smp = xcalloc((size_t)n, sizeof *b->smp);
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (!(src[i].weight > 0) || !isfinite(src[i].weight))
            die("data.blend[%d] (%s): weight %g must be positive", i, src[i].path, src[i].weight);
        total += src[i].weight;
    }
    for (int i = 0; i < n; i++) {
        b->w[i] = src[i].weight / total;
        b->ds[i] = dataset_open(src[i].path);
        uint64_t s = i == 0 ? seed : mix64(seed ^ mix64((uint64_t)i));
        b->smp[i] = sampler_create_version(b->ds[i], seq_len, s, split, valid_fraction, sampler_version);
    }
    b->ckpt_cap = 16;
    b->ckpt = xcalloc((size_t)b->ckpt_cap * n, sizeof *b->ckpt);
    b->nckpt = 1;             /* block 0 starts with zero counts */
    b->cached_block = -1;
    b->choice = xmalloc(BLOCK * sizeof *b->choice);
    b->within = xmalloc(BLOCK * sizeof *b->within);
    return b;
}

void blend_free(struct blend *b) {
    if (!b) return;
    for (int i = 0; i < b->n; i++) {
        sampler_free(b->smp[i]);
        dataset_close(b->ds[i]);
    }
    free(b->w);
    free(b->ds);
    free(b->smp);
    free(b->ckpt);
    free(b->choice);
    free(b->within);
    free(b);
}

int blend_num_sources(const struct blend *b) { return b->n; }
struct dataset *blend_dataset(const struct blend *b, int i) { return b->ds[i]; }

/* Replay block k from its checkpoint; records choices if want, and the
 * counts at its end (the next checkpoint) into end. */
static void replay_block(struct blend *b, int64_t k, int64_t *counts, int want) {
    memcpy(counts, b->ckpt + k * b->n, (size_t)b->n * sizeof *counts);
    for (int64_t j = 0; j < BLOCK; j++) {
        int64_t s = k * BLOCK + j;
        double target = (double)(s > 1 ? s : 1);
        int best = 0;
        double best_err = b->w[0] * target - (double)counts[0];
        for (int i = 1; i < b->n; i++) {
            double err = b->w[i] * target - (double)counts[i];
            if (err > best_err) best_err = err, best = i;
        }
        if (want) {
            b->choice[j] = (uint16_t)best;
            b->within[j] = counts[best];
        }
        counts[best]++;
    }
}

void blend_locate(struct blend *b, int64_t index, int *source, int64_t *sample) {
    if (index < 0) die("blend: negative sample index %lld", (long long)index);
    int64_t k = index / BLOCK;
    if (b->n == 1) {
        *source = 0;
        *sample = index;
        return;
    }
    if (k != b->cached_block) {
        int64_t *counts = xmalloc((size_t)b->n * sizeof *counts);
        while (b->nckpt <= k) {   /* extend the checkpoints up to block k */
            if (b->nckpt == b->ckpt_cap) {
                b->ckpt_cap *= 2;
                b->ckpt = xrealloc(b->ckpt, (size_t)b->ckpt_cap * b->n * sizeof *b->ckpt);
            }
            replay_block(b, b->nckpt - 1, counts, 0);
            memcpy(b->ckpt + b->nckpt * b->n, counts, (size_t)b->n * sizeof *counts);
            b->nckpt++;
        }
        replay_block(b, k, counts, 1);
        b->cached_block = k;
        free(counts);
    }
    *source = b->choice[index % BLOCK];
    *sample = b->within[index % BLOCK];
}

void blend_get(struct blend *b, int64_t index, int32_t *out) {
    int src;
    int64_t sample;
    blend_locate(b, index, &src, &sample);
    sampler_get(b->smp[src], sample, out);
}

struct blend *blend_from_recipe(const struct recipe *r, enum split split) {
    const struct data_blend *bl = &r->data.blend;
    struct blend_source src[RECIPE_MAX_BLEND] = {{0}};
    int n = bl->n;
    for (int i = 0; i < n; i++) src[i] = (struct blend_source){bl->e[i].path, bl->e[i].weight};
    if (!n) src[n++] = (struct blend_source){r->data.path, 1.0};
    struct blend *b = blend_create(src, n, r->train.seq_len, r->train.seed, split, r->data.valid_fraction,
                                   r->data.sampler_version);
    for (int i = 0; i < n; i++)
        if (dataset_vocab_size(b->ds[i]) > r->model.vocab_size)
            die("vocabulary mismatch: dataset %s has token ids up to %d but model.vocab_size is %d (%s)", src[i].path,
                dataset_vocab_size(b->ds[i]) - 1, r->model.vocab_size, r->source);
    return b;
}

void blend_get_strided(struct blend *b, int64_t first, int n, int stride, int rank, int32_t *out) {
    for (int i = 0; i < n; i++) blend_get(b, first + (int64_t)i * stride + rank, out + (size_t)i * (b->seq_len + 1));
}
