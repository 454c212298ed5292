/* Deterministic sampler: global sample k is a pure function of (seed, split,
 * k), so every parallel layout and every resumed run sees the same data.
 * Each epoch visits all samples of the split once, in a permutation keyed by
 * (seed, split, epoch):
 *   version 2 (default): a keyed Feistel network over the next power of four
 *     with cycle walking, evaluated at one index in O(1) time and memory;
 *   version 1: a Fisher-Yates permutation table (8 bytes per sample, two
 *     epochs cached), kept so checkpoints of earlier runs resume unchanged. */
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
    int seq_len, version;
    int half_bits;           /* version 2: the Feistel network permutes 2 * half_bits-bit values */
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

/* The key of one epoch's permutation (both versions). */
static uint64_t epoch_key(uint64_t seed, enum split split, int64_t epoch) {
    return mix64(mix64(mix64(seed) + (uint64_t)split + 1) + (uint64_t)epoch);
}

/* Uniform in [0, bound) by multiply-shift; the bias (< bound / 2^64) is far
 * below anything a training run could notice, and it needs no rejection loop. */
static uint64_t bounded(uint64_t *state, uint64_t bound) {
    return (uint64_t)(((unsigned __int128)splitmix64_next(state) * bound) >> 64);
}

static void draw_permutation(int64_t *perm, int64_t n, uint64_t seed, enum split split, int64_t epoch) {
    uint64_t state = epoch_key(seed, split, epoch);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)bounded(&state, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- version 2: a keyed Feistel network with cycle walking ---- */

#define FEISTEL_ROUNDS 6

/* One pass of the balanced Feistel network over [0, 4^half): a bijection for
 * any round function; rounds keyed by (key, round). */
static uint64_t feistel(uint64_t x, int half, uint64_t key, int inverse) {
    uint64_t mask = (1ull << half) - 1, l = x >> half, r = x & mask;
    for (int i = 0; i < FEISTEL_ROUNDS; i++) {
        uint64_t round = inverse ? FEISTEL_ROUNDS - 1 - i : i;
        uint64_t k = mix64(key + 0x9E3779B97F4A7C15ull * (round + 1));
        if (!inverse) {
            uint64_t t = r;
            r = l ^ (mix64(r ^ k) & mask);
            l = t;
        } else {
            uint64_t t = l;
            l = r ^ (mix64(l ^ k) & mask);
            r = t;
        }
    }
    return l << half | r;
}

/* The permutation of [0, n) by cycle walking: apply the network until the
 * value lands inside; 4^half < 4n, so fewer than 4 passes on average. */
uint64_t sampler_permute(uint64_t i, uint64_t n, int half, uint64_t key, int inverse) {
    uint64_t x = feistel(i, half, key, inverse);
    while (x >= n) x = feistel(x, half, key, inverse);
    return x;
}

static int half_bits_for(uint64_t n) {
    int bits = 2;
    while (bits < 62 && (1ull << bits) < n) bits += 2;
    return bits / 2;
}

static const char *split_name(enum split split) { return split == SPLIT_VALID ? "validation" : "train"; }

struct sampler *sampler_create(struct dataset *ds, int seq_len, uint64_t seed, enum split split,
                               double valid_fraction) {
    return sampler_create_version(ds, seq_len, seed, split, valid_fraction, SAMPLER_VERSION);
}

struct sampler *sampler_create_version(struct dataset *ds, int seq_len, uint64_t seed, enum split split,
                                       double valid_fraction, int version) {
    if (seq_len < 1) die("sampler: seq_len %d must be positive", seq_len);
    if (version != 1 && version != 2) die("sampler: version %d (this mtrain has 1 and 2)", version);
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
    s->version = version;
    s->half_bits = half_bits_for((uint64_t)s->n);
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
    int64_t epoch = index / s->n, i = index % s->n, k;
    if (s->version == 2) {
        k = (int64_t)sampler_permute((uint64_t)i, (uint64_t)s->n, s->half_bits, epoch_key(s->seed, s->split, epoch), 0);
    } else {
        k = epoch_permutation(s, epoch)[i];
    }
    return s->tok_begin + k * s->seq_len;
}

void sampler_get(struct sampler *s, int64_t index, int32_t *out) {
    dataset_read(s->ds, sampler_position(s, index), (int64_t)s->seq_len + 1, out);
}
