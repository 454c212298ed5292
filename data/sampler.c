/* Deterministic sampler: global sample k is a pure function of (seed, split,
 * k), so every parallel layout and every resumed run sees the same data.
 * Each epoch visits all samples of the split once, in a Fisher-Yates
 * permutation drawn from a splitmix64 stream keyed by (seed, split, epoch). */
#include <math.h>
#include <stdlib.h>

#include "config/common.h"
#include "data/dataset.h"

/* Two cached epochs: at an epoch boundary a prefetcher and the step may
 * briefly ask for both, and regenerating a permutation is O(samples). */
#define PERM_SLOTS 2

struct perm_slot {
    int64_t epoch;           /* -1: empty */
    int64_t *perm;
};

struct sampler {
    struct dataset *ds;
    int seq_len;
    uint64_t seed;
    enum split split;
    int64_t doc_begin, doc_end, tok_begin, tok_end;
    int64_t n;               /* samples per epoch */
    struct perm_slot slots[PERM_SLOTS];
    int next_slot;
};

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t splitmix64_next(uint64_t *state) {
    *state += 0x9E3779B97F4A7C15ull;
    return mix64(*state);
}

/* Uniform in [0, bound) by multiply-shift; the bias (< bound / 2^64) is far
 * below anything a training run could notice, and it needs no rejection loop. */
static uint64_t bounded(uint64_t *state, uint64_t bound) {
    return (uint64_t)(((unsigned __int128)splitmix64_next(state) * bound) >> 64);
}

static void draw_permutation(int64_t *perm, int64_t n, uint64_t seed, enum split split, int64_t epoch) {
    uint64_t state = mix64(mix64(mix64(seed) + (uint64_t)split + 1) + (uint64_t)epoch);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)bounded(&state, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static const char *split_name(enum split split) { return split == SPLIT_VALID ? "validation" : "train"; }

struct sampler *sampler_create(struct dataset *ds, int seq_len, uint64_t seed, enum split split,
                               double valid_fraction) {
    if (seq_len < 1) die("sampler: seq_len %d must be positive", seq_len);
    if (!(valid_fraction >= 0 && valid_fraction < 1))
        die("sampler: data.valid_fraction %g must be in [0, 1)", valid_fraction);
    struct sampler *s = xcalloc(1, sizeof *s);
    s->ds = ds;
    s->seq_len = seq_len;
    s->seed = seed;
    s->split = split;
    int64_t ndocs = dataset_num_docs(ds);
    int64_t nvalid = valid_fraction > 0 ? (int64_t)floor((double)ndocs * valid_fraction) : 0;
    if (valid_fraction > 0 && nvalid < 1) nvalid = 1;
    if (nvalid > ndocs) nvalid = ndocs;
    int64_t cut = ndocs - nvalid;
    s->doc_begin = split == SPLIT_VALID ? cut : 0;
    s->doc_end = split == SPLIT_VALID ? ndocs : cut;
    s->tok_begin = dataset_doc_start(ds, s->doc_begin);
    s->tok_end = dataset_doc_start(ds, s->doc_end);
    int64_t ntok = s->tok_end - s->tok_begin;
    if (ntok < (int64_t)seq_len + 1)
        die("dataset %s: %s split has %lld tokens (%lld documents), need at least seq_len+1 = %lld; "
            "lower data.valid_fraction or add data",
            dataset_dir(ds), split_name(split), (long long)ntok, (long long)(s->doc_end - s->doc_begin),
            (long long)seq_len + 1);
    /* Samples overlap by one token (inputs and shifted targets), so a split of
     * T tokens holds (T-1)/seq_len of them. */
    s->n = (ntok - 1) / seq_len;
    for (int i = 0; i < PERM_SLOTS; i++) s->slots[i].epoch = -1;
    return s;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    for (int i = 0; i < PERM_SLOTS; i++) free(s->slots[i].perm);
    free(s);
}

int64_t sampler_samples_per_epoch(const struct sampler *s) { return s->n; }

void sampler_split_range(const struct sampler *s, int64_t *doc_begin, int64_t *doc_end, int64_t *tok_begin,
                         int64_t *tok_end) {
    *doc_begin = s->doc_begin;
    *doc_end = s->doc_end;
    *tok_begin = s->tok_begin;
    *tok_end = s->tok_end;
}

static const int64_t *epoch_permutation(struct sampler *s, int64_t epoch) {
    for (int i = 0; i < PERM_SLOTS; i++)
        if (s->slots[i].epoch == epoch) return s->slots[i].perm;
    struct perm_slot *slot = &s->slots[s->next_slot];
    s->next_slot = (s->next_slot + 1) % PERM_SLOTS;
    if (!slot->perm) slot->perm = xmalloc((size_t)s->n * sizeof *slot->perm);
    draw_permutation(slot->perm, s->n, s->seed, s->split, epoch);
    slot->epoch = epoch;
    return slot->perm;
}

int64_t sampler_position(struct sampler *s, int64_t index) {
    if (index < 0) die("sampler: negative sample index %lld", (long long)index);
    const int64_t *perm = epoch_permutation(s, index / s->n);
    return s->tok_begin + perm[index % s->n] * s->seq_len;
}

void sampler_get(struct sampler *s, int64_t index, int32_t *out) {
    dataset_read(s->ds, sampler_position(s, index), (int64_t)s->seq_len + 1, out);
}
