/* Byte-level BPE: the tables, pre-tokenization with PCRE2 and rank-ordered
 * merging (loading tokenizer.json and tiktoken files: tokenizer_bpe_load.c).
 *
 * Both file kinds become one table: token id -> bytes, bytes -> id, and
 * (left id, right id) -> (rank, merged id). A tokenizer.json's merges list
 * gives the pairs directly (rank = position in the list); a tiktoken file has
 * only ranks, and tiktoken merges any adjacent pair whose concatenation is a
 * token, ranked by that token's rank, so every split of every token into two
 * tokens becomes a pair. Merging picks the lowest rank, leftmost on ties, as
 * both reference implementations do. */
#include "data/tokenizer_bpe_internal.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "config/common.h"
#include "data/tokenizer_regex.h"

const char bpe_llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char bpe_gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define SMALL_PIECE 64        /* quadratic merge below this many bytes, heap above */

struct sym { int32_t id, prev, next; };
struct heap_item { uint32_t rank; int32_t pos, left, right, id; };

struct bpe_state {
    const struct bpe *b;
    pcre2_match_data *md[MAX_LEVELS];
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    int32_t *ids, *newid;
    uint32_t *ranks;
    struct sym *sym;
    struct heap_item *heap;
    size_t cap, heap_cap;
    uint8_t *prefixed;
    size_t prefixed_cap;
    int no_prefix;       /* the next segment continues a text: no add_prefix_space */
};

/* ---- tables ---------------------------------------------------------------- */

static size_t table_size(size_t n) {
    size_t s = 1024;
    while (s < 2 * n) s *= 2;
    return s;
}


/* Make room for ids 0..id. Ids are bounded (BPE_MAX_ID) before they get
 * here, so the tables stay below a few hundred MB; growth is in 64 bits and
 * capped at the bound, so it cannot overflow. */
void bpe_grow_ids(struct bpe *b, int id) {
    if (id < b->vocab) return;
    if (id < 0 || id > BPE_MAX_ID) die("%s: token id %d is out of range 0..%d", b->path, id, BPE_MAX_ID);
    int64_t n = b->vocab ? b->vocab : 1024;
    while (n <= id) n *= 2;
    if (n > (int64_t)BPE_MAX_ID + 1) n = (int64_t)BPE_MAX_ID + 1;
    b->tok_off = xrealloc(b->tok_off, (size_t)n * sizeof *b->tok_off);
    b->tok_len = xrealloc(b->tok_len, (size_t)n * sizeof *b->tok_len);
    b->used = xrealloc(b->used, (size_t)n);
    memset(b->used + b->vocab, 0, (size_t)(n - b->vocab));
    b->vocab = (int)n;   /* trimmed to max id + 1 once loading is done */
}

/* Record id -> bytes. Returns -1 if the id is already taken. */
int bpe_set_token(struct bpe *b, int id, const uint8_t *p, size_t n) {
    bpe_grow_ids(b, id);
    if (b->used[id]) return -1;
    if (b->pool_n + n > b->pool_cap) {
        b->pool_cap = (b->pool_n + n) * 2 + 4096;
        b->pool = xrealloc(b->pool, b->pool_cap);
    }
    memcpy(b->pool + b->pool_n, p, n);
    b->tok_off[id] = b->pool_n;
    b->tok_len[id] = (uint32_t)n;
    b->used[id] = 1;
    b->pool_n += n;
    return 0;
}

int bpe_vocab_find(const struct bpe *b, const uint8_t *p, size_t n) {
    uint64_t h = XXH3_64bits(p, n);
    for (size_t i = h & b->vt_mask;; i = (i + 1) & b->vt_mask) {
        const struct vocab_slot *s = &b->vt[i];
        if (s->id < 0) return -1;
        if (s->hash == h && b->tok_len[s->id] == n && !memcmp(bpe_tok_bytes(b, s->id), p, n)) return s->id;
    }
}

/* Index every ordinary token (not the specials) by its bytes. Returns the id
 * of a duplicate byte string, or -1. */
static int build_vocab_table(struct bpe *b, const uint8_t *is_special) {
    size_t n = 0;
    for (int i = 0; i < b->vocab; i++) n += b->used[i] && !is_special[i];
    size_t size = table_size(n);
    b->vt = xmalloc(size * sizeof *b->vt);
    for (size_t i = 0; i < size; i++) b->vt[i].id = -1;
    b->vt_mask = size - 1;
    for (int id = 0; id < b->vocab; id++) {
        if (!b->used[id] || is_special[id]) continue;
        if (bpe_vocab_find(b, bpe_tok_bytes(b, id), b->tok_len[id]) >= 0) return id;
        uint64_t h = XXH3_64bits(bpe_tok_bytes(b, id), b->tok_len[id]);
        size_t i = h & b->vt_mask;
        while (b->vt[i].id >= 0) i = (i + 1) & b->vt_mask;
        b->vt[i] = (struct vocab_slot){h, id};
    }
    return -1;
}

static uint64_t pair_key(int32_t a, int32_t c) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)c; }
static size_t pair_hash(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20); }

static const struct pair_slot *pair_find(const struct bpe *b, int32_t a, int32_t c) {
    uint64_t k = pair_key(a, c);
    for (size_t i = pair_hash(k) & b->pt_mask;; i = (i + 1) & b->pt_mask) {
        const struct pair_slot *s = &b->pt[i];
        if (s->id < 0) return NULL;
        if (s->key == k) return s;
    }
}

/* Add a pair unless present (the first, lowest-ranked definition wins). */
void bpe_pair_add(struct bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t id) {
    if (2 * (b->pt_n + 1) > b->pt_mask + 1) {
        size_t old = b->pt_mask + 1, size = b->pt ? 2 * old : 1 << 16;
        struct pair_slot *prev = b->pt;
        b->pt = xmalloc(size * sizeof *b->pt);
        for (size_t i = 0; i < size; i++) b->pt[i].id = -1;
        b->pt_mask = size - 1;
        for (size_t i = 0; prev && i < old; i++) {
            if (prev[i].id < 0) continue;
            size_t j = pair_hash(prev[i].key) & b->pt_mask;
            while (b->pt[j].id >= 0) j = (j + 1) & b->pt_mask;
            b->pt[j] = prev[i];
        }
        free(prev);
    }
    uint64_t k = pair_key(a, c);
    size_t i = pair_hash(k) & b->pt_mask;
    for (; b->pt[i].id >= 0; i = (i + 1) & b->pt_mask)
        if (b->pt[i].key == k) return;
    b->pt[i] = (struct pair_slot){k, rank, id};
    b->pt_n++;
}

/* ---- regexes and specials ---------------------------------------------------- */

void bpe_add_regex(struct bpe *b, const char *pattern, const char *what) {
    if (b->nre == MAX_LEVELS) die("%s: more than %d pre-tokenizer splits", b->path, MAX_LEVELS);
    int code;
    PCRE2_SIZE off;
    /* UCP: \d \w \p{..} are Unicode-aware, as in the engines of the
     * references; MATCH_INVALID_UTF: stray bytes never match instead of
     * failing, so they fall into the gaps between matches. The user's
     * pattern is compiled first so errors point into it; then the one with
     * \s as Unicode White_Space (data/tokenizer_regex.h) is used. */
    const uint32_t flags = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, flags, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(code, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "error %d", code);
        die("%s: %s regex does not compile at offset %zu: %s", b->path, what, (size_t)off, (char *)msg);
    }
    pcre2_code_free(re);
    char why[128];
    char *ws = regex_with_unicode_white_space(pattern, why, sizeof why);
    if (!ws) die("%s: %s regex: %s", b->path, what, why);
    re = pcre2_compile((PCRE2_SPTR)ws, PCRE2_ZERO_TERMINATED, flags, &code, &off, NULL);
    free(ws);
    if (!re) die("%s: %s regex: rewriting \\s as Unicode White_Space broke it (error %d)", b->path, what, code);
    b->jit[b->nre] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    b->re[b->nre++] = re;
}

static int cmp_special_len(const void *x, const void *y) {
    const struct special *a = x, *c = y;
    return a->len < c->len ? 1 : a->len > c->len ? -1 : a->id - c->id;
}

void bpe_add_special(struct bpe *b, const char *text, int id) {
    size_t n = strlen(text);
    if (!n) die("%s: special token %d has empty text", b->path, id);
    b->sp = xrealloc(b->sp, (size_t)(b->nsp + 1) * sizeof *b->sp);
    b->sp[b->nsp].text = (uint8_t *)xstrdup(text);
    b->sp[b->nsp].len = n;
    b->sp[b->nsp].id = id;
    b->nsp++;
    b->sp_first[(uint8_t)text[0]] = 1;
}

/* Shared end of loading: trim the id range, index tokens, check bytes. */
void bpe_finish_load(struct bpe *b) {
    int max = -1;
    for (int i = 0; i < b->vocab; i++)
        if (b->used[i]) max = i;
    if (max < 0) die("%s: empty vocabulary", b->path);
    b->vocab = max + 1;
    uint8_t *is_special = xcalloc((size_t)b->vocab, 1);
    for (int i = 0; i < b->nsp; i++) is_special[b->sp[i].id] = 1;
    int dup = build_vocab_table(b, is_special);
    free(is_special);
    if (dup >= 0) die("%s: token %d has the same bytes as an earlier token", b->path, dup);
    for (int c = 0; c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        b->byte_tok[c] = bpe_vocab_find(b, &byte, 1);
        if (b->byte_tok[c] < 0)
            die("%s: no token for byte 0x%02x: not a byte-level BPE vocabulary (every byte needs a token)", b->path, c);
    }
    if (b->nsp) qsort(b->sp, (size_t)b->nsp, sizeof *b->sp, cmp_special_len);  /* sp is NULL without specials */
    if (!b->pt) {  /* an empty pair table, so lookups need no NULL check */
        b->pt = xmalloc((1 << 16) * sizeof *b->pt);
        for (size_t i = 0; i < 1 << 16; i++) b->pt[i].id = -1;
        b->pt_mask = (1 << 16) - 1;
    }
}

struct bpe *bpe_alloc(const char *path) {
    struct bpe *b = xcalloc(1, sizeof *b);
    b->path = xstrdup(path);
    return b;
}

void bpe_free(struct bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->nre; i++) pcre2_code_free(b->re[i]);
    for (int i = 0; i < b->nsp; i++) free(b->sp[i].text);
    free(b->sp);
    free(b->pool);
    free(b->tok_off);
    free(b->tok_len);
    free(b->used);
    free(b->vt);
    free(b->pt);
    free(b->path);
    free(b);
}

int bpe_vocab_size(const struct bpe *b) { return b->vocab; }

int bpe_special_id(const struct bpe *b, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < b->nsp; i++)
        if (b->sp[i].len == n && !memcmp(b->sp[i].text, text, n)) return b->sp[i].id;
    return -1;
}

int bpe_special_count(const struct bpe *b) { return b->nsp; }

int bpe_special_at(const struct bpe *b, int i, const char **text, int *id) {
    if (i < 0 || i >= b->nsp) return -1;
    *text = (const char *)b->sp[i].text;
    *id = b->sp[i].id;
    return 0;
}

int bpe_is_tiktoken(const struct bpe *b) { return b->tiktoken; }

size_t bpe_pairs(const struct bpe *b, struct bpe_pair **out) {
    *out = xmalloc((b->pt_n ? b->pt_n : 1) * sizeof **out);
    size_t k = 0;
    for (size_t i = 0; i <= b->pt_mask; i++)
        if (b->pt[i].id >= 0)
            (*out)[k++] = (struct bpe_pair){(int32_t)(b->pt[i].key >> 32), (int32_t)(uint32_t)b->pt[i].key,
                                            b->pt[i].rank, b->pt[i].id};
    return k;
}

int bpe_token_bytes(const struct bpe *b, int id, const uint8_t **bytes, size_t *len) {
    if (id < 0 || id >= b->vocab || !b->used[id]) return -1;
    *bytes = bpe_tok_bytes(b, id);
    *len = b->tok_len[id];
    return 0;
}

/* ---- encoding ------------------------------------------------------------------- */

struct bpe_state *bpe_state_create(const struct bpe *b) {
    struct bpe_state *st = xcalloc(1, sizeof *st);
    st->b = b;
    st->mctx = pcre2_match_context_create(NULL);
    /* long whitespace or letter runs need more than the default 32 KiB */
    st->jstack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    if (!st->mctx || !st->jstack) die("out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(st->mctx, NULL, st->jstack);
    for (int i = 0; i < b->nre; i++) {
        st->md[i] = pcre2_match_data_create_from_pattern(b->re[i], NULL);
        if (!st->md[i]) die("out of memory creating PCRE2 match data");
    }
    return st;
}

void bpe_state_free(struct bpe_state *st) {
    if (!st) return;
    for (int i = 0; i < st->b->nre; i++) pcre2_match_data_free(st->md[i]);
    pcre2_match_context_free(st->mctx);
    pcre2_jit_stack_free(st->jstack);
    free(st->ids);
    free(st->newid);
    free(st->ranks);
    free(st->sym);
    free(st->heap);
    free(st->prefixed);
    free(st);
}

struct out { int32_t **v; size_t *len, *cap; };

static void push(struct out *o, int32_t t) {
    if (*o->len == *o->cap) {
        *o->cap = *o->cap ? 2 * *o->cap : 1024;
        *o->v = xrealloc(*o->v, *o->cap * sizeof **o->v);
    }
    (*o->v)[(*o->len)++] = t;
}

static void scratch(struct bpe_state *st, size_t n) {
    if (n <= st->cap) return;
    st->cap = 2 * n;
    st->ids = xrealloc(st->ids, st->cap * sizeof *st->ids);
    st->newid = xrealloc(st->newid, st->cap * sizeof *st->newid);
    st->ranks = xrealloc(st->ranks, st->cap * sizeof *st->ranks);
    st->sym = xrealloc(st->sym, st->cap * sizeof *st->sym);
}

static uint32_t rank_of(const struct bpe *b, int32_t l, int32_t r, int32_t *id) {
    const struct pair_slot *s = pair_find(b, l, r);
    if (!s) return NO_RANK;
    *id = s->id;
    return s->rank;
}

/* Short pieces: rescan the pair ranks for the minimum each round. */
static void merge_small(struct bpe_state *st, size_t m, struct out *o) {
    const struct bpe *b = st->b;
    int32_t *ids = st->ids, *nid = st->newid;
    uint32_t *rk = st->ranks;
    for (size_t i = 0; i + 1 < m; i++) rk[i] = rank_of(b, ids[i], ids[i + 1], &nid[i]);
    while (m > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < m; i++)
            if (rk[i] < rk[best]) best = i;
        if (rk[best] == NO_RANK) break;
        ids[best] = nid[best];
        memmove(ids + best + 1, ids + best + 2, (m - best - 2) * sizeof *ids);
        size_t tail = m > best + 3 ? m - best - 3 : 0;  /* pairs after the removed one */
        memmove(rk + best + 1, rk + best + 2, tail * sizeof *rk);
        memmove(nid + best + 1, nid + best + 2, tail * sizeof *nid);
        m--;
        if (best > 0) rk[best - 1] = rank_of(b, ids[best - 1], ids[best], &nid[best - 1]);
        if (best + 1 < m) rk[best] = rank_of(b, ids[best], ids[best + 1], &nid[best]);
    }
    for (size_t i = 0; i < m; i++) push(o, ids[i]);
}

static int heap_less(const struct heap_item *a, const struct heap_item *c) {
    return a->rank < c->rank || (a->rank == c->rank && a->pos < c->pos);
}

static void heap_push(struct bpe_state *st, size_t *n, struct heap_item it) {
    if (*n == st->heap_cap) {
        st->heap_cap = st->heap_cap ? 2 * st->heap_cap : 256;
        st->heap = xrealloc(st->heap, st->heap_cap * sizeof *st->heap);
    }
    size_t i = (*n)++;
    while (i > 0 && heap_less(&it, &st->heap[(i - 1) / 2])) {
        st->heap[i] = st->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    st->heap[i] = it;
}

static struct heap_item heap_pop(struct bpe_state *st, size_t *n) {
    struct heap_item top = st->heap[0], last = st->heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&st->heap[c + 1], &st->heap[c])) c++;
        if (!heap_less(&st->heap[c], &last)) break;
        st->heap[i] = st->heap[c];
        i = c;
    }
    if (*n) st->heap[i] = last;
    return top;
}

static void push_pair(struct bpe_state *st, size_t *hn, int32_t pos) {
    const struct sym *s = st->sym;
    int32_t next = s[pos].next, id;
    if (next < 0) return;
    uint32_t rank = rank_of(st->b, s[pos].id, s[next].id, &id);
    if (rank != NO_RANK) heap_push(st, hn, (struct heap_item){rank, pos, s[pos].id, s[next].id, id});
}

/* Long pieces: a linked list of symbols and a heap of candidate merges,
 * where stale entries are skipped when popped. */
static void merge_large(struct bpe_state *st, size_t m, struct out *o) {
    struct sym *s = st->sym;
    for (size_t i = 0; i < m; i++) s[i] = (struct sym){st->ids[i], (int32_t)i - 1, i + 1 < m ? (int32_t)i + 1 : -1};
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) push_pair(st, &hn, (int32_t)i);
    while (hn) {
        struct heap_item it = heap_pop(st, &hn);
        int32_t next = s[it.pos].next;
        if (s[it.pos].id != it.left || next < 0 || s[next].id != it.right) continue;
        s[it.pos].id = it.id;
        s[it.pos].next = s[next].next;
        if (s[next].next >= 0) s[s[next].next].prev = it.pos;
        s[next].id = -1;
        if (s[it.pos].prev >= 0) push_pair(st, &hn, s[it.pos].prev);
        push_pair(st, &hn, it.pos);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) push(o, s[i].id);
}

static void encode_piece(struct bpe_state *st, const uint8_t *p, size_t n, struct out *o) {
    const struct bpe *b = st->b;
    if (n == 1) return push(o, b->byte_tok[p[0]]);
    if (b->ignore_merges) {
        int id = bpe_vocab_find(b, p, n);
        if (id >= 0) return push(o, id);
    }
    scratch(st, n);
    for (size_t i = 0; i < n; i++) st->ids[i] = b->byte_tok[p[i]];
    if (n <= SMALL_PIECE) merge_small(st, n, o);
    else merge_large(st, n, o);
}

static size_t utf8_len(uint8_t c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Split p[0..n) by regex level; matches and the gaps between them are pieces
 * (Split "Isolated"), each split further by the next level. */
static void split_level(struct bpe_state *st, int level, const uint8_t *p, size_t n, struct out *o) {
    const struct bpe *b = st->b;
    if (!n) return;
    if (level == b->nre) return encode_piece(st, p, n, o);
    size_t start = 0, gap = 0;
    while (start < n) {
        int rc = b->jit[level] ? pcre2_jit_match(b->re[level], p, n, start, 0, st->md[level], st->mctx)
                               : pcre2_match(b->re[level], p, n, start, 0, st->md[level], st->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            if (pcre2_get_error_message(rc, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "error %d", rc);
            die("%s: pre-tokenizer regex failed at byte %zu of a %zu-byte piece: %s", b->path, start, n, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md[level]);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {  /* empty match: not a piece; step over one character */
            start = ms + (ms < n ? utf8_len(p[ms]) : 1);
            continue;
        }
        if (ms > gap) split_level(st, level + 1, p + gap, ms - gap, o);
        split_level(st, level + 1, p + ms, me - ms, o);
        start = gap = me;
    }
    if (gap < n) split_level(st, level + 1, p + gap, n - gap, o);
}

static void encode_segment(struct bpe_state *st, const uint8_t *p, size_t n, struct out *o) {
    if (!n) return;
    if (st->b->add_prefix_space && !st->no_prefix && p[0] != ' ') {
        if (n + 1 > st->prefixed_cap) st->prefixed = xrealloc(st->prefixed, st->prefixed_cap = 2 * n + 2);
        st->prefixed[0] = ' ';
        memcpy(st->prefixed + 1, p, n);
        p = st->prefixed;
        n++;
    }
    split_level(st, 0, p, n, o);
}

/* Leftmost-longest special token at or after from; returns its index or -1. */
static int find_special(const struct bpe *b, const uint8_t *p, size_t n, size_t from, size_t *at) {
    for (size_t i = from; i < n; i++) {
        if (!b->sp_first[p[i]]) continue;
        for (int k = 0; k < b->nsp; k++)
            if (b->sp[k].len <= n - i && !memcmp(p + i, b->sp[k].text, b->sp[k].len)) return *at = i, k;
    }
    return -1;
}

void bpe_encode(struct bpe_state *st, const char *text, size_t n, int match_special, int32_t **out, size_t *len,
                size_t *cap) {
    bpe_encode_cont(st, text, n, match_special, 0, out, len, cap);
}

void bpe_encode_cont(struct bpe_state *st, const char *text, size_t n, int match_special, int continuation,
                     int32_t **out, size_t *len, size_t *cap) {
    struct out o = {out, len, cap};
    const uint8_t *p = (const uint8_t *)text;
    size_t done = 0, at;
    int k;
    /* a continuation's first segment goes on from the text before: no prefix space */
    st->no_prefix = continuation;
    while (match_special && st->b->nsp && (k = find_special(st->b, p, n, done, &at)) >= 0) {
        encode_segment(st, p + done, at - done, &o);
        st->no_prefix = 0;
        push(&o, st->b->sp[k].id);
        done = at + st->b->sp[k].len;
    }
    encode_segment(st, p + done, n - done, &o);
    st->no_prefix = 0;
}

size_t bpe_safe_cut(struct bpe_state *st, const char *text, size_t n, int match_special) {
    const struct bpe *b = st->b;
    const uint8_t *p = (const uint8_t *)text;
    size_t seg = 0, at, limit = n;
    int k;
    /* the last segment: text after the last special token */
    while (match_special && b->nsp && (k = find_special(b, p, n, seg, &at)) >= 0) seg = at + b->sp[k].len;
    /* keep a possible special token's start (cut off by the end of text) for the next piece */
    size_t longest = 0;
    for (int i = 0; match_special && i < b->nsp; i++) longest = b->sp[i].len > longest ? b->sp[i].len : longest;
    if (longest > 1) limit = n > longest - 1 ? n - (longest - 1) : 0;
    if (!b->nre) return seg <= limit ? seg : 0;
    /* level-0 pieces of the segment: matches and the gaps between them; the
     * cut is the start of the second-to-last piece, so the last two pieces
     * (and the lookahead they give) go to the next call */
    size_t starts[3] = {seg, seg, seg}, nstarts = 0, start = seg, gap = seg;
    size_t best = seg <= limit ? seg : 0;
#define PIECE(x) (starts[0] = starts[1], starts[1] = starts[2], starts[2] = (x), nstarts++)
    while (start < n) {
        int rc = b->jit[0] ? pcre2_jit_match(b->re[0], p, n, start, 0, st->md[0], st->mctx)
                           : pcre2_match(b->re[0], p, n, start, 0, st->md[0], st->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return 0; /* encode reports it */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md[0]);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            start = ms + (ms < n ? utf8_len(p[ms]) : 1);
            continue;
        }
        if (ms > gap) PIECE(gap);
        PIECE(ms);
        start = gap = me;
        if (nstarts >= 3 && starts[0] <= limit && starts[0] > best) best = starts[0];
    }
    if (gap < n) PIECE(gap);
#undef PIECE
    /* the candidate is a piece start with at least two pieces after it */
    if (nstarts >= 3 && starts[0] <= limit && starts[0] > best) best = starts[0];
    return best;
}
