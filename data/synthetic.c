/* Synthetic text: every document is a pure function of (seed, doc index),
 * so a corpus is reproducible and any document can be regenerated alone. */
#include "data/synthetic.h"

#include <string.h>

struct noun { const char *one, *many; };
struct verb { const char *one, *many; };   /* third person singular / plural */

/* Every noun and adjective starts with a consonant so "a" is always right. */
static const struct noun nouns[] = {
    {"cat", "cats"},         {"dog", "dogs"},       {"bird", "birds"},     {"child", "children"},
    {"farmer", "farmers"},   {"teacher", "teachers"}, {"king", "kings"},   {"fox", "foxes"},
    {"horse", "horses"},     {"girl", "girls"},     {"boy", "boys"},       {"robot", "robots"},
    {"baker", "bakers"},     {"mouse", "mice"},     {"wolf", "wolves"},    {"sailor", "sailors"},
};
static const struct verb transitive[] = {
    {"sees", "see"},   {"likes", "like"},   {"chases", "chase"},     {"finds", "find"},
    {"helps", "help"}, {"watches", "watch"}, {"follows", "follow"},  {"calls", "call"},
};
static const struct verb intransitive[] = {
    {"sleeps", "sleep"}, {"runs", "run"}, {"sings", "sing"}, {"waits", "wait"}, {"jumps", "jump"}, {"smiles", "smile"},
};
static const char *adjectives[] = {"big", "small", "red", "quiet", "happy", "lazy", "brown", "clever", "young", "tired"};
static const char *det_one[] = {"the", "a", "this", "every"};
static const char *det_many[] = {"the", "some", "these", "many"};
static const char *adverbs[] = {"quickly", "slowly", "today", "again", "quietly", "at night"};
static const char *places[] = {"in the garden", "near the river", "under the tree", "on the hill", "by the house",
                               "in the market"};

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static size_t pick(uint64_t *s, size_t n) { return (size_t)(next(s) % n); }

struct text { char *buf; size_t len; };

static void put(struct text *t, const char *word) {
    size_t n = strlen(word);
    if (t->len + n + 1 > SYNTHETIC_DOC_MAX) return;
    if (t->len && t->buf[t->len - 1] != ' ' && word[0] != '.' && word[0] != ',') t->buf[t->len++] = ' ';
    memcpy(t->buf + t->len, word, n);
    t->len += n;
}

/* A noun phrase; returns whether it is plural (for verb agreement). */
static int noun_phrase(struct text *t, uint64_t *s, size_t noun) {
    int many = pick(s, 3) == 0;
    put(t, many ? det_many[pick(s, LEN(det_many))] : det_one[pick(s, LEN(det_one))]);
    if (pick(s, 2)) put(t, adjectives[pick(s, LEN(adjectives))]);
    put(t, many ? nouns[noun].many : nouns[noun].one);
    return many;
}

static void sentence(struct text *t, uint64_t *s, size_t hero) {
    size_t start = t->len + (t->len > 0);
    size_t subject = pick(s, 2) ? hero : pick(s, LEN(nouns));
    int many = noun_phrase(t, s, subject);
    if (pick(s, 3)) {
        const struct verb *v = &transitive[pick(s, LEN(transitive))];
        put(t, many ? v->many : v->one);
        noun_phrase(t, s, pick(s, LEN(nouns)));
    } else {
        const struct verb *v = &intransitive[pick(s, LEN(intransitive))];
        put(t, many ? v->many : v->one);
        if (pick(s, 2)) put(t, adverbs[pick(s, LEN(adverbs))]);
    }
    if (pick(s, 2)) put(t, places[pick(s, LEN(places))]);
    put(t, ".");
    if (start < t->len && t->buf[start] >= 'a' && t->buf[start] <= 'z') t->buf[start] -= 'a' - 'A';
}

size_t synthetic_document(uint64_t seed, int64_t doc, char *buf) {
    uint64_t s = seed * 0xD1B54A32D192ED03ull + (uint64_t)doc;
    next(&s);
    struct text t = {buf, 0};
    size_t hero = pick(&s, LEN(nouns));
    size_t sentences = 3 + pick(&s, 6);
    for (size_t i = 0; i < sentences; i++) sentence(&t, &s, hero);
    t.buf[t.len++] = '\n';
    t.buf[t.len] = 0;
    return t.len;
}
