/* Dataset reader: maps and checks the index, keeps every shard open, and
 * decodes frames on demand with pread + one zstd call, keeping the last few
 * decoded frames because sequential samples mostly land in the same frame.
 * The index stays on disk (mmap): frame records and document boundaries are
 * read where they lie, and only the first token of every FRAME_BLOCK-th frame
 * is kept in memory (8 bytes per 256 frames) to find frames by token. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "config/common.h"
#include "data/dataset.h"
#include "data/shard_format.h"

#define CACHE_SLOTS 4
#define MAX_FRAME_TOKENS (1u << 28)
#define FRAME_BLOCK 256

struct frame_info {
    int64_t first;          /* index of the frame's first token in the stream */
    uint64_t offset, csize, hash;
    uint32_t shard, ntok;
};

struct cache_slot {
    int64_t frame;          /* -1: empty */
    uint64_t used;          /* LRU clock */
    int32_t *tokens;
};

struct dataset {
    char *dir;
    char **shard_paths;
    int *fds;
    int dtype, vocab;
    int64_t eod, frame_tokens;
    int nshards;
    int64_t nframes, ndocs, ntokens;
    uint32_t max_ntok;
    uint64_t max_csize;
    const uint8_t *map;     /* the index file, mapped read-only */
    size_t map_size;
    const uint8_t *doc_base; /* ndocs + 1 little-endian u64 document starts, in the map */
    int64_t *block_first;   /* first token of frame k * FRAME_BLOCK */
    uint64_t *shard_need;   /* bytes each shard must hold (end of its last frame) */
    int64_t *shard_last;    /* ... and that frame */
    ZSTD_DCtx *dctx;
    uint8_t *cbuf, *raw;
    struct cache_slot cache[CACHE_SLOTS];
    uint64_t clock;
};

/* --- index --------------------------------------------------------------- */

static void parse_header(struct dataset *ds, const uint8_t *b, size_t size, const char *path) {
    if (size < INDEX_HEADER_BYTES + INDEX_TRAILER_BYTES)
        die("%s: too short (%zu bytes): truncated or not a dataset index", path, size);
    if (memcmp(b + IDX_MAGIC, DATASET_MAGIC, 8)) die("%s: bad magic: not an mtrain dataset index", path);
    uint32_t version = get_u32(b + IDX_VERSION);
    if (version < 1 || version > DATASET_VERSION)
        die("%s: unsupported format version %u (this mtrain reads versions 1 to %d)", path, version, DATASET_VERSION);
    uint64_t want = get_u64(b + size - INDEX_TRAILER_BYTES);
    if (XXH3_64bits(b, size - INDEX_TRAILER_BYTES) != want) die("%s: checksum mismatch: the index is damaged", path);
    ds->dtype = (int)get_u32(b + IDX_DTYPE);
    uint32_t vocab = get_u32(b + IDX_VOCAB), eod = get_u32(b + IDX_EOD);
    if (vocab < 1 || vocab > INT32_MAX) die("%s: bad vocab size %u", path, vocab);
    ds->vocab = (int)vocab;
    if (ds->dtype != dataset_dtype_bytes(vocab))
        die("%s: token width %d bytes does not fit vocab size %d", path, ds->dtype, ds->vocab);
    if (eod != DATASET_NO_EOD && eod >= vocab) die("%s: EOD id %u outside vocab of %u", path, eod, vocab);
    ds->eod = eod == DATASET_NO_EOD ? -1 : (int64_t)eod;
    ds->nshards = (int)get_u32(b + IDX_SHARDS);
    ds->frame_tokens = get_u32(b + IDX_FRAME_TOKENS);
    uint64_t nframes = get_u64(b + IDX_FRAMES), ndocs = get_u64(b + IDX_DOCS);
    uint64_t ntokens = get_u64(b + IDX_TOKENS);
    /* version 2 keeps the tokenizer record (data/tokenizer_record.h) between
     * the document boundaries and the trailer */
    uint64_t record = version >= 2 ? get_u64(b + IDX_RECORD_BYTES) : 0;
    /* Bound the counts before multiplying so a damaged header cannot overflow. */
    if (nframes > (1ull << 40) || ndocs > (1ull << 40) || ntokens > (1ull << 62) || ds->nshards < 0 ||
        record > DATASET_RECORD_MAX)
        die("%s: implausible counts (%llu frames, %llu documents, %llu record bytes)", path,
            (unsigned long long)nframes, (unsigned long long)ndocs, (unsigned long long)record);
    uint64_t expect =
        INDEX_HEADER_BYTES + nframes * INDEX_FRAME_BYTES + (ndocs + 1) * 8 + record + INDEX_TRAILER_BYTES;
    if (size != expect)
        die("%s: %zu bytes, expected %llu for %llu frames and %llu documents", path, size,
            (unsigned long long)expect, (unsigned long long)nframes, (unsigned long long)ndocs);
    /* every shard holds at least one frame (and the per-shard tables are sized by it) */
    if ((uint64_t)ds->nshards > nframes)
        die("%s: %d shards but only %llu frames", path, ds->nshards, (unsigned long long)nframes);
    ds->nframes = (int64_t)nframes;
    ds->ndocs = (int64_t)ndocs;
    ds->ntokens = (int64_t)ntokens;
}

static const uint8_t *frame_record(const struct dataset *ds, int64_t i) {
    return ds->map + INDEX_HEADER_BYTES + (size_t)i * INDEX_FRAME_BYTES;
}

/* Frame i's record, with its first token from the block table plus the
 * token counts of the frames before it in its block. */
static struct frame_info frame_at(const struct dataset *ds, int64_t i) {
    const uint8_t *r = frame_record(ds, i);
    struct frame_info f = {.shard = get_u32(r + FR_SHARD), .ntok = get_u32(r + FR_TOKENS),
                           .offset = get_u64(r + FR_OFFSET), .csize = get_u64(r + FR_CSIZE), .hash = get_u64(r + FR_HASH)};
    f.first = ds->block_first[i / FRAME_BLOCK];
    for (int64_t j = i / FRAME_BLOCK * FRAME_BLOCK; j < i; j++) f.first += get_u32(frame_record(ds, j) + FR_TOKENS);
    return f;
}

/* Frames must tile each shard from offset 0 in order, shards in order, and
 * their token counts must add up to the stream length. One pass over the
 * records builds the block table and each shard's required size. */
static void parse_frames(struct dataset *ds, const char *path) {
    ds->block_first = xmalloc((size_t)(ds->nframes / FRAME_BLOCK + 1) * sizeof *ds->block_first);
    ds->shard_need = xcalloc((size_t)ds->nshards + 1, sizeof *ds->shard_need);
    ds->shard_last = xcalloc((size_t)ds->nshards + 1, sizeof *ds->shard_last);
    int64_t first = 0;
    uint64_t shard_end = 0;
    uint32_t prev_shard = 0;
    for (int64_t i = 0; i < ds->nframes; i++) {
        const uint8_t *r = frame_record(ds, i);
        uint32_t shard = get_u32(r + FR_SHARD), ntok = get_u32(r + FR_TOKENS);
        uint64_t offset = get_u64(r + FR_OFFSET), csize = get_u64(r + FR_CSIZE);
        if (i % FRAME_BLOCK == 0) ds->block_first[i / FRAME_BLOCK] = first;
        if (shard >= (uint32_t)ds->nshards || shard < prev_shard || shard > prev_shard + 1 || (i == 0 && shard != 0))
            die("%s: frame %lld: shard %u out of order (%d shards)", path, (long long)i, shard, ds->nshards);
        if (shard != prev_shard) shard_end = 0;
        if (offset != shard_end)
            die("%s: frame %lld: offset %llu, but the previous frame of shard %u ends at %llu", path, (long long)i,
                (unsigned long long)offset, shard, (unsigned long long)shard_end);
        if (ntok < 1 || ntok > MAX_FRAME_TOKENS || csize < 1 || csize > (1ull << 40))
            die("%s: frame %lld: bad sizes (%u tokens, %llu bytes)", path, (long long)i, ntok,
                (unsigned long long)csize);
        shard_end = offset + csize;
        ds->shard_need[shard] = shard_end;
        ds->shard_last[shard] = i;
        prev_shard = shard;
        first += ntok;
        if (ntok > ds->max_ntok) ds->max_ntok = ntok;
        if (csize > ds->max_csize) ds->max_csize = csize;
    }
    if (first != ds->ntokens)
        die("%s: frames hold %lld tokens, header says %lld", path, (long long)first, (long long)ds->ntokens);
    int64_t last_shard = ds->nframes ? (int64_t)prev_shard : -1;
    if (last_shard + 1 != ds->nshards)
        die("%s: header lists %d shards, frames use %lld", path, ds->nshards, (long long)(last_shard + 1));
}

static int64_t doc_at(const struct dataset *ds, int64_t d) { return (int64_t)get_u64(ds->doc_base + 8 * (size_t)d); }

static void parse_docs(struct dataset *ds, const char *path) {
    ds->doc_base = ds->map + INDEX_HEADER_BYTES + (size_t)ds->nframes * INDEX_FRAME_BYTES;
    for (int64_t d = 0, prev = 0; d <= ds->ndocs; d++) {
        int64_t start = doc_at(ds, d);
        if ((d == 0 && start != 0) || (d > 0 && start <= prev))
            die("%s: document boundary %lld (%lld) out of order", path, (long long)d, (long long)start);
        prev = start;
    }
    if (doc_at(ds, ds->ndocs) != ds->ntokens)
        die("%s: documents end at token %lld, stream has %lld", path, (long long)doc_at(ds, ds->ndocs),
            (long long)ds->ntokens);
}

/* what a path that is not a regular file is, in words */
static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a file";
}

/* Open every shard and check it is long enough for its last frame. */
static void open_shards(struct dataset *ds) {
    ds->shard_paths = xcalloc((size_t)ds->nshards + 1, sizeof *ds->shard_paths);
    ds->fds = xmalloc(((size_t)ds->nshards + 1) * sizeof *ds->fds);
    for (int s = 0; s < ds->nshards; s++) {
        size_t n = strlen(ds->dir) + 32;
        ds->shard_paths[s] = xmalloc(n);
        snprintf(ds->shard_paths[s], n, "%s/" DATASET_SHARD_FMT, ds->dir, s);
        /* non-blocking: opening a FIFO would wait for a writer (nothing else is read that way) */
        ds->fds[s] = open(ds->shard_paths[s], O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (ds->fds[s] < 0)
            die("%s: %s (the index lists %d shards)", ds->shard_paths[s],
                errno == ENOENT ? "missing" : strerror(errno), ds->nshards);
        struct stat st;
        if (fstat(ds->fds[s], &st) != 0) die("%s: %s", ds->shard_paths[s], strerror(errno));
        if (!S_ISREG(st.st_mode))
            die("%s: not a regular file (%s): a shard is a file of zstd frames written by 'mtrain data build'",
                ds->shard_paths[s], file_kind(st.st_mode));
        if ((uint64_t)st.st_size < ds->shard_need[s])
            die("%s: truncated: %lld bytes, but frame %lld at offset %llu ends at %llu", ds->shard_paths[s],
                (long long)st.st_size, (long long)ds->shard_last[s],
                (unsigned long long)get_u64(frame_record(ds, ds->shard_last[s]) + FR_OFFSET),
                (unsigned long long)ds->shard_need[s]);
    }
}

static void map_index(struct dataset *ds, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block: refused below */
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        die("%s: cannot read: %s (build a dataset with 'mtrain data build')", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        die("%s: not a regular file (%s): not a dataset index", path, file_kind(st.st_mode));
    if (st.st_size < INDEX_HEADER_BYTES + INDEX_TRAILER_BYTES)
        die("%s: too short (%lld bytes) or not a file: truncated or not a dataset index", path, (long long)st.st_size);
    ds->map_size = (size_t)st.st_size;
    ds->map = mmap(NULL, ds->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (ds->map == MAP_FAILED) die("%s: mmap: %s", path, strerror(errno));
    if (close(fd) != 0) die("%s: close: %s", path, strerror(errno));
}

struct dataset *dataset_open(const char *dir) {
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    char path[4096];
    snprintf(path, sizeof path, "%.*s/%s", (int)dl, dir, DATASET_INDEX_NAME);
    struct dataset *ds = xcalloc(1, sizeof *ds);
    map_index(ds, path);
    ds->dir = xstrdup(dir);
    ds->dir[dl] = 0;
    parse_header(ds, ds->map, ds->map_size, path);
    parse_frames(ds, path);
    parse_docs(ds, path);
    /* the checks touched every page: let them go (they are re-read on demand) */
    if (madvise((void *)ds->map, ds->map_size, MADV_DONTNEED) != 0) die("%s: madvise: %s", path, strerror(errno));
    open_shards(ds);
    ds->dctx = ZSTD_createDCtx();
    if (!ds->dctx) die("out of memory creating a zstd context");
    ds->cbuf = xmalloc(ds->max_csize ? ds->max_csize : 1);
    ds->raw = xmalloc((size_t)ds->max_ntok * ds->dtype + 1);
    for (int i = 0; i < CACHE_SLOTS; i++) ds->cache[i].frame = -1;
    return ds;
}

void dataset_close(struct dataset *ds) {
    if (!ds) return;
    for (int s = 0; s < ds->nshards; s++) {
        if (ds->fds[s] >= 0) close(ds->fds[s]);
        free(ds->shard_paths[s]);
    }
    for (int i = 0; i < CACHE_SLOTS; i++) free(ds->cache[i].tokens);
    ZSTD_freeDCtx(ds->dctx);
    free(ds->shard_paths);
    free(ds->fds);
    free(ds->block_first);
    free(ds->shard_need);
    free(ds->shard_last);
    if (ds->map && munmap((void *)ds->map, ds->map_size) != 0) die("munmap: %s", strerror(errno));
    free(ds->cbuf);
    free(ds->raw);
    free(ds->dir);
    free(ds);
}

int dataset_vocab_size(const struct dataset *ds) { return ds->vocab; }
int64_t dataset_num_tokens(const struct dataset *ds) { return ds->ntokens; }
int64_t dataset_num_docs(const struct dataset *ds) { return ds->ndocs; }
const char *dataset_dir(const struct dataset *ds) { return ds->dir; }

int64_t dataset_doc_start(const struct dataset *ds, int64_t d) {
    if (d < 0 || d > ds->ndocs)
        die("dataset %s: document %lld out of range 0..%lld", ds->dir, (long long)d, (long long)ds->ndocs);
    return doc_at(ds, d);
}

void dataset_get_info(const struct dataset *ds, struct dataset_info *info) {
    memset(info, 0, sizeof *info);
    info->dtype_bytes = ds->dtype;
    info->vocab_size = ds->vocab;
    info->eod_id = ds->eod;
    info->frame_tokens = ds->frame_tokens;
    info->docs = ds->ndocs;
    info->tokens = ds->ntokens;
    info->shards = ds->nshards;
    info->frames = ds->nframes;
    for (int64_t f = 0; f < ds->nframes; f++) info->compressed_bytes += (int64_t)get_u64(frame_record(ds, f) + FR_CSIZE);
}

/* --- frames -------------------------------------------------------------- */


static int read_compressed(struct dataset *ds, const struct frame_info *f, char *err, size_t n) {
    uint64_t done = 0;
    while (done < f->csize) {
        ssize_t got = pread(ds->fds[f->shard], ds->cbuf + done, f->csize - done, (off_t)(f->offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return set_error(err, n, "read error: %s", strerror(errno));
        if (got == 0)
            return set_error(err, n, "truncated: read %llu of %llu bytes", (unsigned long long)done,
                        (unsigned long long)f->csize);
        done += (uint64_t)got;
    }
    return 0;
}

/* Little-endian uint16/uint32 tokens -> int32, returning the largest id. One
 * branch-free pass the compiler vectorises: this loop was a fifth of a random
 * read before (byte-wise loads and a vocab test per token). */
static uint32_t widen_tokens(const uint8_t *raw, int dtype, uint32_t ntok, int32_t *out) {
    uint32_t top = 0;
    for (uint32_t i = 0; i < ntok; i++) {
        uint32_t t = dtype == 2 ? get_u16(raw + 2 * (size_t)i) : get_u32(raw + 4 * (size_t)i);
        out[i] = (int32_t)t;
        top = t > top ? t : top;
    }
    return top;
}

/* Decode frame fi into out (ntok int32 values). Returns 0, or -1 with a
 * description of the damage in err. Never exits, so verify can go on. */
static int decode_frame(struct dataset *ds, int64_t fi, int32_t *out, char *err, size_t n) {
    struct frame_info fr = frame_at(ds, fi);
    const struct frame_info *f = &fr;
    if (read_compressed(ds, f, err, n)) return -1;
    size_t want = (size_t)f->ntok * ds->dtype;
    unsigned long long content = ZSTD_getFrameContentSize(ds->cbuf, f->csize);
    if (content == ZSTD_CONTENTSIZE_ERROR) return set_error(err, n, "not a zstd frame (bad frame header)");
    if (content == ZSTD_CONTENTSIZE_UNKNOWN) return set_error(err, n, "zstd frame header lacks its content size");
    if (content != want)
        return set_error(err, n, "frame header says %llu bytes, index says %zu", content, want);
    size_t fsize = ZSTD_findFrameCompressedSize(ds->cbuf, f->csize);
    if (ZSTD_isError(fsize)) return set_error(err, n, "zstd: %s", ZSTD_getErrorName(fsize));
    if (fsize != f->csize)
        return set_error(err, n, "zstd frame is %zu bytes, index says %llu", fsize, (unsigned long long)f->csize);
    size_t got = ZSTD_decompressDCtx(ds->dctx, ds->raw, want, ds->cbuf, f->csize);
    if (ZSTD_isError(got)) return set_error(err, n, "zstd: %s", ZSTD_getErrorName(got));
    if (got != want) return set_error(err, n, "decoded %zu bytes, expected %zu", got, want);
    if (XXH3_64bits(ds->raw, want) != f->hash) return set_error(err, n, "checksum mismatch");
    uint32_t top = widen_tokens(ds->raw, ds->dtype, f->ntok, out);
    if (top >= (uint32_t)ds->vocab) {
        uint32_t i = 0;
        while ((uint32_t)out[i] < (uint32_t)ds->vocab) i++;
        return set_error(err, n, "token %u at %u outside vocab of %d", (uint32_t)out[i], i, ds->vocab);
    }
    return 0;
}

static const int32_t *get_frame(struct dataset *ds, int64_t fi) {
    struct cache_slot *slot = &ds->cache[0];
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (ds->cache[i].frame == fi) {
            ds->cache[i].used = ++ds->clock;
            return ds->cache[i].tokens;
        }
        if (ds->cache[i].used < slot->used) slot = &ds->cache[i];
    }
    if (!slot->tokens) slot->tokens = xmalloc((size_t)ds->max_ntok * sizeof(int32_t));
    slot->frame = -1;
    char err[256];
    if (decode_frame(ds, fi, slot->tokens, err, sizeof err)) {
        struct frame_info f = frame_at(ds, fi);
        die("%s: frame %lld at offset %llu: %s", ds->shard_paths[f.shard], (long long)fi,
            (unsigned long long)f.offset, err);
    }
    slot->frame = fi;
    slot->used = ++ds->clock;
    return slot->tokens;
}

/* Frame holding token t: the block whose first token is the last <= t,
 * then the frame inside it. */
static int64_t find_frame(const struct dataset *ds, int64_t t) {
    int64_t lo = 0, hi = (ds->nframes - 1) / FRAME_BLOCK;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (ds->block_first[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    int64_t fi = lo * FRAME_BLOCK, first = ds->block_first[lo];
    for (;;) {
        int64_t next = first + get_u32(frame_record(ds, fi) + FR_TOKENS);
        if (t < next || fi + 1 == ds->nframes) return fi;
        first = next, fi++;
    }
}

void dataset_read(struct dataset *ds, int64_t first, int64_t count, int32_t *out) {
    if (first < 0 || count < 0 || first > ds->ntokens - count)
        die("dataset %s: read of tokens [%lld, %lld) outside the stream of %lld", ds->dir, (long long)first,
            (long long)(first + count), (long long)ds->ntokens);
    int64_t fi = count ? find_frame(ds, first) : 0;
    while (count > 0) {
        struct frame_info fr = frame_at(ds, fi);
        const struct frame_info *f = &fr;
        const int32_t *tok = get_frame(ds, fi);
        int64_t off = first - f->first, take = f->ntok - off;
        if (take > count) take = count;
        memcpy(out, tok + off, (size_t)take * sizeof *out);
        out += take;
        first += take;
        count -= take;
        fi++;
    }
}

int64_t dataset_verify(struct dataset *ds, FILE *report) {
    int32_t *tok = xmalloc(((size_t)ds->max_ntok + 1) * sizeof *tok);
    int64_t bad = 0;
    char err[256];
    for (int64_t fi = 0; fi < ds->nframes; fi++) {
        if (!decode_frame(ds, fi, tok, err, sizeof err)) continue;
        struct frame_info f = frame_at(ds, fi);
        fprintf(report, "mtrain: error: %s: frame %lld at offset %llu: %s\n", ds->shard_paths[f.shard],
                (long long)fi, (unsigned long long)f.offset, err);
        bad++;
    }
    free(tok);
    return bad;
}
