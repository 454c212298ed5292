/* Megatron indexed dataset reader. The .idx is little-endian:
 * 9-byte magic "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64 sequence
 * count N, u64 document count D (documents + 1), int32 lengths[N], int64
 * byte pointers[N], int64 document_indices[D] (sequence index where each
 * document starts/ends, from 0 to N), then optionally int8 modes[N]. */
#define _GNU_SOURCE
#include "data/megatron.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/common.h"
#include "data/shard_format.h"

#define MM_HEADER 34
static const uint8_t mm_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

struct dtype { const char *name; int size; };
/* by Megatron's DType code */
static const struct dtype dtypes[9] = {{NULL, 0},      {"uint8", 1},   {"int8", 1},    {"int16", 2}, {"int32", 4},
                                       {"int64", 8},   {"float64", 8}, {"float32", 4}, {"uint16", 2}};

struct megatron {
    char idx_path[4096], bin_path[4096];
    const uint8_t *idx, *bin;
    size_t idx_size, bin_size;
    int code;
    uint64_t nseq, ndoc;       /* ndoc = document_indices entries (documents + 1) */
    const uint8_t *lens, *ptrs, *docidx;
    int64_t ntokens;
};

static const uint8_t *map_file(const char *path, size_t *size, char *err, size_t errsz) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errsz, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errsz, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    *size = (size_t)st.st_size;
    void *p = *size ? mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0) : (void *)"";
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, errsz, "%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    return p;
}

static int fail(struct megatron *m, char *err, size_t errsz, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(struct megatron *m, char *err, size_t errsz, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsz, fmt, ap);
    va_end(ap);
    return -1;
}

static int check_header(struct megatron *m, char *err, size_t errsz) {
    const char *p = m->idx_path;
    if (m->idx_size < MM_HEADER)
        return fail(m, err, errsz, "%s: truncated: %zu bytes, the header alone is %d", p, m->idx_size, MM_HEADER);
    if (memcmp(m->idx, mm_magic, 9)) return fail(m, err, errsz, "%s: bad magic at offset 0: not a Megatron .idx", p);
    uint64_t version = get_u64(m->idx + 9);
    if (version != 1)
        return fail(m, err, errsz, "%s: unsupported version %llu at offset 9 (only 1)", p, (unsigned long long)version);
    m->code = m->idx[17];
    if (m->code < 1 || m->code > 8) return fail(m, err, errsz, "%s: unknown dtype code %d at offset 17", p, m->code);
    m->nseq = get_u64(m->idx + 18);
    m->ndoc = get_u64(m->idx + 26);
    if (m->nseq > (1ull << 40) || m->ndoc > (1ull << 40) || m->ndoc < 1)
        return fail(m, err, errsz, "%s: implausible counts at offset 18: %llu sequences, %llu document indices", p,
                    (unsigned long long)m->nseq, (unsigned long long)m->ndoc);
    uint64_t want = MM_HEADER + 12 * m->nseq + 8 * m->ndoc;
    if (m->idx_size != want && m->idx_size != want + m->nseq)
        return fail(m, err, errsz, "%s: size %zu, expected %llu for %llu sequences and %llu document indices", p,
                    m->idx_size, (unsigned long long)want, (unsigned long long)m->nseq, (unsigned long long)m->ndoc);
    m->lens = m->idx + MM_HEADER;
    m->ptrs = m->lens + 4 * m->nseq;
    m->docidx = m->ptrs + 8 * m->nseq;
    return 0;
}

static int check_tables(struct megatron *m, char *err, size_t errsz) {
    const char *p = m->idx_path;
    int size = dtypes[m->code].size;
    for (uint64_t i = 0; i < m->nseq; i++) {
        int32_t len = (int32_t)get_u32(m->lens + 4 * i);
        uint64_t ptr = get_u64(m->ptrs + 8 * i);
        if (len < 0)
            return fail(m, err, errsz, "%s: sequence %llu has length %d at offset %llu", p, (unsigned long long)i, len,
                        (unsigned long long)(MM_HEADER + 4 * i));
        if (ptr > m->bin_size || (uint64_t)len * size > m->bin_size - ptr)
            return fail(m, err, errsz, "%s: sequence %llu at offset %llu: bytes [%llu, %llu) are past the end of %s (%zu bytes)",
                        p, (unsigned long long)i, (unsigned long long)(MM_HEADER + 4 * m->nseq + 8 * i),
                        (unsigned long long)ptr, (unsigned long long)(ptr + (uint64_t)len * size), m->bin_path, m->bin_size);
        if (ptr % (uint64_t)size)
            return fail(m, err, errsz, "%s: sequence %llu pointer %llu is not a multiple of %d bytes", p,
                        (unsigned long long)i, (unsigned long long)ptr, size);
        m->ntokens += len;
    }
    uint64_t prev = 0;
    for (uint64_t d = 0; d < m->ndoc; d++) {
        uint64_t v = get_u64(m->docidx + 8 * d);
        uint64_t off = MM_HEADER + 12 * m->nseq + 8 * d;
        if ((d == 0 && v != 0) || v < prev || v > m->nseq || (d == m->ndoc - 1 && v != m->nseq))
            return fail(m, err, errsz, "%s: document index %llu = %llu at offset %llu out of order (0 .. %llu)", p,
                        (unsigned long long)d, (unsigned long long)v, (unsigned long long)off,
                        (unsigned long long)m->nseq);
        prev = v;
    }
    return 0;
}

struct megatron *megatron_open(const char *prefix, char *err, size_t errsz) {
    struct megatron *m = xcalloc(1, sizeof *m);
    snprintf(m->idx_path, sizeof m->idx_path, "%s.idx", prefix);
    snprintf(m->bin_path, sizeof m->bin_path, "%s.bin", prefix);
    if (!(m->idx = map_file(m->idx_path, &m->idx_size, err, errsz)) ||
        !(m->bin = map_file(m->bin_path, &m->bin_size, err, errsz)) || check_header(m, err, errsz) ||
        check_tables(m, err, errsz)) {
        megatron_close(m);
        return NULL;
    }
    return m;
}

void megatron_close(struct megatron *m) {
    if (!m) return;
    if (m->idx && m->idx_size && munmap((void *)m->idx, m->idx_size) != 0) die("munmap of a Megatron index: %s", strerror(errno));
    if (m->bin && m->bin_size && munmap((void *)m->bin, m->bin_size) != 0) die("munmap of a Megatron .bin: %s", strerror(errno));
    free(m);
}

int64_t megatron_num_docs(const struct megatron *m) { return (int64_t)m->ndoc - 1; }
int64_t megatron_num_tokens(const struct megatron *m) { return m->ntokens; }
const char *megatron_dtype_name(const struct megatron *m) { return dtypes[m->code].name; }
int megatron_itemsize(const struct megatron *m) { return dtypes[m->code].size; }

/* One value as a token id, or -1 if it is not one. */
static int64_t token_at(int code, const uint8_t *p) {
    switch (code) {
    case 1: return p[0];
    case 2: return (int8_t)p[0];
    case 3: return (int16_t)(p[0] | p[1] << 8);
    case 4: return (int32_t)get_u32(p);
    case 5: {
        int64_t v = (int64_t)get_u64(p);
        return v > INT32_MAX ? -1 : v;
    }
    case 6: {
        double v;
        uint64_t u = get_u64(p);
        memcpy(&v, &u, 8);
        return v >= 0 && v <= INT32_MAX && v == floor(v) ? (int64_t)v : -1;
    }
    case 7: {
        float v;
        uint32_t u = get_u32(p);
        memcpy(&v, &u, 4);
        return v >= 0 && v <= 2147483520.0f && v == floorf(v) ? (int64_t)v : -1;
    }
    case 8: return p[0] | p[1] << 8;
    }
    return -1;
}

void megatron_doc_begin(const struct megatron *m, int64_t d, struct megatron_cursor *c) {
    c->seq = get_u64(m->docidx + 8 * d), c->seq_end = get_u64(m->docidx + 8 * (d + 1)), c->pos = 0;
}

int64_t megatron_doc_next(const struct megatron *m, struct megatron_cursor *c, int32_t *out, size_t cap, char *err,
                          size_t errsz) {
    int size = dtypes[m->code].size;
    size_t n = 0;
    while (n < cap && c->seq < c->seq_end) {
        int32_t len = (int32_t)get_u32(m->lens + 4 * c->seq);
        uint64_t ptr = get_u64(m->ptrs + 8 * c->seq);
        while (n < cap && c->pos < len) {
            const uint8_t *p = m->bin + ptr + (uint64_t)c->pos * size;
            int64_t t = token_at(m->code, p);
            if (t < 0) {
                snprintf(err, errsz, "%s: offset %llu: %s value is not a token id (negative, fractional or >= 2^31)",
                         m->bin_path, (unsigned long long)(ptr + (uint64_t)c->pos * size), dtypes[m->code].name);
                return -1;
            }
            out[n++] = (int32_t)t;
            c->pos++;
        }
        if (c->pos == len) c->seq++, c->pos = 0;
    }
    return (int64_t)n;
}

int64_t megatron_read_doc(const struct megatron *m, int64_t d, int32_t **out, size_t *cap, char *err, size_t errsz) {
    struct megatron_cursor c;
    megatron_doc_begin(m, d, &c);
    int64_t n = 0, got;
    do {
        if (*cap - (size_t)n < 4096) *out = xrealloc(*out, (*cap = 2 * *cap + 4096) * sizeof **out);
        got = megatron_doc_next(m, &c, *out + n, *cap - (size_t)n, err, errsz);
        if (got < 0) return -1;
        n += got;
    } while (got > 0);
    return n;
}
