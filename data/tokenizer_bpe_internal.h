/* The inside of data/tokenizer_bpe.c's tokenizer, shared by its two halves:
 * tokenizer_bpe.c (tables, pre-tokenizer regexes, encoding) and
 * tokenizer_bpe_load.c (reading tokenizer.json and tiktoken rank files into
 * the tables). Not for other files: they use data/tokenizer_bpe.h. */
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer_bpe.h"

#define MAX_LEVELS 8
#define NO_RANK UINT32_MAX

struct vocab_slot { uint64_t hash; int32_t id; };                /* id -1: empty */
struct pair_slot { uint64_t key; uint32_t rank; int32_t id; };    /* id -1: empty */
struct special { uint8_t *text; size_t len; int id; };

struct bpe {
    char *path;
    int vocab;                    /* max id + 1 */
    uint8_t *pool;                /* token bytes, back to back */
    size_t pool_n, pool_cap;
    uint64_t *tok_off;            /* per id */
    uint32_t *tok_len;            /* per id; used[id] says whether it exists */
    uint8_t *used;
    int32_t byte_tok[256];
    struct vocab_slot *vt;        /* bytes -> id of ordinary tokens */
    size_t vt_mask;
    struct pair_slot *pt;
    size_t pt_mask, pt_n;
    int ignore_merges;            /* whole piece looked up before merging */
    int tiktoken;                 /* loaded from a rank file: ranks are ids */
    pcre2_code *re[MAX_LEVELS];
    int jit[MAX_LEVELS];
    int nre, add_prefix_space;
    struct special *sp;           /* longest first, for leftmost-longest matching */
    int nsp;
    uint8_t sp_first[256];
};

extern const char bpe_gpt2_regex[];

static inline const uint8_t *bpe_tok_bytes(const struct bpe *b, int id) { return b->pool + b->tok_off[id]; }
struct bpe *bpe_alloc(const char *path);
void bpe_grow_ids(struct bpe *b, int id);
/* id -> bytes; returns -1 when id already has other bytes */
int bpe_set_token(struct bpe *b, int id, const uint8_t *p, size_t n);
int bpe_vocab_find(const struct bpe *b, const uint8_t *p, size_t n);
void bpe_pair_add(struct bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t id);
void bpe_add_regex(struct bpe *b, const char *pattern, const char *what);
void bpe_add_special(struct bpe *b, const char *text, int id);
/* Shared end of loading: trim the id range, index tokens, check bytes. */
void bpe_finish_load(struct bpe *b);
