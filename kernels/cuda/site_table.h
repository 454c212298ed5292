/* The FP8 GEMMs' cast sites (kernels/cuda/fp8_gemm.cu): state kept per
 * weight, found by the weight's address in an open-addressed table
 * (linear probing) that doubles when half full. Host code only, plain C,
 * so tests/unit/test_site_table.c runs it on the CPU. A record's address
 * holds until the next insertion (which may move the table); finding an
 * existing weight never moves it. */
#pragma once
#include <stdint.h>
#include <stdlib.h>

struct fp8_site {
    const void *w;            /* the key: a weight's address; NULL: an empty slot */
    void *spec;               /* device: the operands' speculative exponents (fp8_cast.cuh's fp8_spec); NULL: none yet */
    int rows, cols;           /* of the kept codes */
    unsigned long generation; /* they are valid while equal to the GEMMs' weights generation */
    uint8_t *buf;             /* device: the inverse scale, then the codes [cols, rows] at +256; NULL: none */
    size_t bytes;             /* buf's size */
};

struct site_table {
    struct fp8_site *t;
    size_t cap, used; /* cap: 0 or a power of two */
};

/* splitmix64's finaliser: weights sit at offsets that are multiples of
 * large powers of two, so the low bits the table uses must depend on all
 * of the address */
static inline size_t site_hash(const void *w) {
    unsigned long long h = (uintptr_t)w;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return (size_t)(h ^ (h >> 31));
}

/* w's slot in t [cap]: its own, or the empty one where it would go; *probes (if not NULL) += slots looked at */
static inline struct fp8_site *site_slot(struct fp8_site *t, size_t cap, const void *w, size_t *probes) {
    size_t j = site_hash(w) & (cap - 1), n = 1;
    while (t[j].w && t[j].w != w) j = (j + 1) & (cap - 1), n++;
    if (probes) *probes += n;
    return &t[j];
}

/* w's record, or NULL */
static inline struct fp8_site *site_find(struct site_table *s, const void *w) {
    if (!s->cap) return NULL;
    struct fp8_site *e = site_slot(s->t, s->cap, w, NULL);
    return e->w ? e : NULL;
}

/* a new record for w (absent from the table), zeroed but for its key;
 * NULL when out of memory (the table is then as it was) */
static inline struct fp8_site *site_insert(struct site_table *s, const void *w) {
    if (2 * (s->used + 1) > s->cap) { /* grow: rehash every record */
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct fp8_site *t = (struct fp8_site *)calloc(cap, sizeof *t);
        if (!t) return NULL;
        for (size_t i = 0; i < s->cap; i++)
            if (s->t[i].w) *site_slot(t, cap, s->t[i].w, NULL) = s->t[i];
        free(s->t);
        s->t = t, s->cap = cap;
    }
    struct fp8_site *e = site_slot(s->t, s->cap, w, NULL);
    e->w = w;
    s->used++;
    return e;
}
