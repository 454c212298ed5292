/* Dataset writer: buffers one frame of tokens, compresses it as a standalone
 * zstd frame (content size + checksum, so `zstd -dc` can check it), appends it
 * to the current shard, and rolls over to a new shard at the target size.
 * The index is written last and the directory renamed into place, so a
 * reader never sees a half-written dataset. */
#define _GNU_SOURCE
#include "data/shard_writer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "config/common.h"
#include "data/shard_format.h"

#define MAX_FRAME_TOKENS (1ll << 28)

struct shard_writer {
    char *out, *tmp;
    struct shard_writer_opts o;
    char *record;            /* tokenizer record JSON, or NULL */
    int dtype;
    ZSTD_CCtx *cctx;
    uint8_t *raw;            /* current frame, encoded little-endian */
    int64_t raw_n;           /* tokens in raw */
    void *cbuf;
    size_t ccap;
    FILE *shard;             /* NULL between shards */
    char shard_path[4096];
    int nshards;
    uint64_t shard_size;
    uint8_t *frames;         /* INDEX_FRAME_BYTES per frame, ready for the index */
    int64_t nframes, frames_cap;
    int64_t *docs;           /* cumulative doc boundaries, docs[0] = 0 */
    int64_t ndocs, docs_cap;
    int64_t tokens, compressed;
};

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    return remove(path);
}

int remove_tree(const char *path) {
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) die("cannot read directory %s: %s", path, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

/* Split OUT into its parent directory and base name (both malloc'd). */
static void split_path(const char *out, char **parent, char **base) {
    const char *slash = strrchr(out, '/');
    if (!slash) {
        *parent = xstrdup(".");
        *base = xstrdup(out);
        return;
    }
    size_t n = slash == out ? 1 : (size_t)(slash - out);
    *parent = xmalloc(n + 1);
    memcpy(*parent, out, n);
    (*parent)[n] = 0;
    *base = xstrdup(slash + 1);
}

/* A pid-suffixed sibling (OUT.tmp-PID, OUT.old-PID) is stale when its build
 * is dead: kill -9 or a power cut leaves them, and nothing else would. */
static void remove_stale_siblings(const char *out) {
    char *parent, *base;
    split_path(out, &parent, &base);
    DIR *d = opendir(parent);
    if (!d) die("cannot read directory %s: %s", parent, strerror(errno));
    size_t bl = strlen(base);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, bl) || (strncmp(n + bl, ".tmp-", 5) && strncmp(n + bl, ".old-", 5))) continue;
        char *end;
        long pid = strtol(n + bl + 5, &end, 10);
        if (*end || pid <= 0) continue;
        if (pid != getpid() && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", parent, n);
        /* An old copy is the only copy if the crash came before the new one
         * was renamed in: keep it for the user to restore. */
        if (n[bl + 1] == 'o' && !path_exists(out)) {
            warn("%s holds the previous dataset of an interrupted --force build; rename it back to %s", path, out);
            continue;
        }
        if (remove_tree(path) != 0) warn("cannot remove stale %s: %s", path, strerror(errno));
    }
    closedir(d);
    free(parent);
    free(base);
}

/* Refuse to clobber data: OUT may be absent or empty; a non-empty OUT is
 * replaced only with force, and only if it is a dataset (has an index), so a
 * mistyped --out cannot wipe an unrelated directory. */
static void check_out(const char *out, int force) {
    struct stat st;
    if (stat(out, &st) != 0) {
        if (errno != ENOENT) die("%s: %s", out, strerror(errno));
        return;
    }
    if (!S_ISDIR(st.st_mode)) die("%s: exists and is not a directory", out);
    if (dir_is_empty(out)) return;
    if (!force) die("%s: exists and is not empty; pass --force to replace it", out);
    char idx[4096];
    snprintf(idx, sizeof idx, "%s/%s", out, DATASET_INDEX_NAME);
    if (!path_exists(idx))
        die("%s: --force replaces only a dataset directory (one with %s); remove it yourself", out,
            DATASET_INDEX_NAME);
}

static void check_opts(struct shard_writer_opts *o) {
    if (o->vocab_size < 1) die("dataset writer: vocab size %d must be positive", o->vocab_size);
    if (o->eod_id < -1 || o->eod_id >= o->vocab_size)
        die("dataset writer: EOD id %lld outside vocab of %d", (long long)o->eod_id, o->vocab_size);
    if (!o->frame_tokens) o->frame_tokens = SHARD_DEFAULT_FRAME_TOKENS;
    if (!o->shard_bytes) o->shard_bytes = SHARD_DEFAULT_SHARD_BYTES;
    if (!o->level) o->level = SHARD_DEFAULT_LEVEL;
    if (o->frame_tokens < 1 || o->frame_tokens > MAX_FRAME_TOKENS)
        die("frame tokens %lld must be in 1..%lld", (long long)o->frame_tokens, MAX_FRAME_TOKENS);
    if (o->shard_bytes < 1) die("shard size %lld must be positive", (long long)o->shard_bytes);
}

static void zcheck(size_t rc, const char *what) {
    if (ZSTD_isError(rc)) die("zstd %s: %s", what, ZSTD_getErrorName(rc));
}

struct shard_writer *shard_writer_open(const char *out_dir, const struct shard_writer_opts *opts) {
    struct shard_writer *w = xcalloc(1, sizeof *w);
    w->o = *opts;
    check_opts(&w->o);
    w->record = w->o.tokenizer_record ? xstrdup(w->o.tokenizer_record) : NULL;
    w->o.tokenizer_record = NULL;  /* the copy is ours */
    if (w->record && strlen(w->record) > DATASET_RECORD_MAX)
        die("dataset writer: tokenizer record of %zu bytes is over %u", strlen(w->record), DATASET_RECORD_MAX);
    w->out = xstrdup(out_dir);
    for (size_t n = strlen(w->out); n > 1 && w->out[n - 1] == '/'; n--) w->out[n - 1] = 0;
    check_out(w->out, w->o.force);
    char *parent, *base;
    split_path(w->out, &parent, &base);
    if (mkdir_p(parent) != 0) die("cannot create directory %s: %s", parent, strerror(errno));
    free(parent);
    free(base);
    remove_stale_siblings(w->out);
    size_t tl = strlen(w->out) + 32;
    w->tmp = xmalloc(tl);
    snprintf(w->tmp, tl, "%s.tmp-%d", w->out, (int)getpid());
    if (mkdir(w->tmp, 0755) != 0) die("cannot create directory %s: %s", w->tmp, strerror(errno));

    w->dtype = dataset_dtype_bytes(w->o.vocab_size);
    w->raw = xmalloc((size_t)w->o.frame_tokens * w->dtype);
    w->ccap = ZSTD_compressBound((size_t)w->o.frame_tokens * w->dtype);
    w->cbuf = xmalloc(w->ccap);
    w->cctx = ZSTD_createCCtx();
    if (!w->cctx) die("out of memory creating a zstd context");
    zcheck(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, w->o.level), "set level");
    /* The checksum makes `zstd -t` and `zstd -dc` detect damage on their own;
     * the content size lets the reader size its buffer and check the frame. */
    zcheck(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1), "set checksum flag");
    zcheck(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_contentSizeFlag, 1), "set content size flag");
    w->docs_cap = 1024;
    w->docs = xmalloc(w->docs_cap * sizeof *w->docs);
    w->docs[0] = 0;
    return w;
}

const char *shard_writer_tmp_dir(const struct shard_writer *w) { return w->tmp; }

static void close_shard(struct shard_writer *w) {
    if (!w->shard) return;
    xfclose(w->shard, w->shard_path);
    w->shard = NULL;
}

static void open_next_shard(struct shard_writer *w) {
    snprintf(w->shard_path, sizeof w->shard_path, "%s/" DATASET_SHARD_FMT, w->tmp, w->nshards);
    w->shard = xfopen(w->shard_path, "wb");
    w->nshards++;
    w->shard_size = 0;
}

static void record_frame(struct shard_writer *w, uint64_t csize, uint64_t hash) {
    if (w->nframes == w->frames_cap) {
        w->frames_cap = w->frames_cap ? 2 * w->frames_cap : 256;
        w->frames = xrealloc(w->frames, (size_t)w->frames_cap * INDEX_FRAME_BYTES);
    }
    uint8_t *r = w->frames + (size_t)w->nframes++ * INDEX_FRAME_BYTES;
    put_u32(r + FR_SHARD, (uint32_t)(w->nshards - 1));
    put_u32(r + FR_TOKENS, (uint32_t)w->raw_n);
    put_u64(r + FR_OFFSET, w->shard_size);
    put_u64(r + FR_CSIZE, csize);
    put_u64(r + FR_HASH, hash);
}

static void emit_frame(struct shard_writer *w) {
    if (!w->raw_n) return;
    size_t size = (size_t)w->raw_n * w->dtype;
    size_t csize = ZSTD_compress2(w->cctx, w->cbuf, w->ccap, w->raw, size);
    zcheck(csize, "compress");
    /* Roll over before a frame would push a non-empty shard past the target;
     * a frame never spans shards, so one read reaches any token. */
    if (w->shard && w->shard_size > 0 && w->shard_size + csize > (uint64_t)w->o.shard_bytes) close_shard(w);
    if (!w->shard) open_next_shard(w);
    xfwrite(w->cbuf, csize, w->shard, w->shard_path);
    record_frame(w, csize, XXH3_64bits(w->raw, size));
    w->shard_size += csize;
    w->compressed += (int64_t)csize;
    w->raw_n = 0;
}

void shard_writer_add(struct shard_writer *w, const int32_t *tokens, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (t < 0 || t >= w->o.vocab_size)
            die("dataset writer: token %d outside vocab of %d (document %lld)", t, w->o.vocab_size,
                (long long)w->ndocs);
        uint8_t *p = w->raw + (size_t)w->raw_n * w->dtype;
        if (w->dtype == 2) {
            p[0] = (uint8_t)t;
            p[1] = (uint8_t)(t >> 8);
        } else {
            put_u32(p, (uint32_t)t);
        }
        w->tokens++;
        if (++w->raw_n == w->o.frame_tokens) emit_frame(w);
    }
}

/* Empty documents are not recorded, so boundaries strictly increase. */
void shard_writer_end_doc(struct shard_writer *w) {
    if (w->tokens == w->docs[w->ndocs]) return;
    if (w->ndocs + 2 > w->docs_cap) {
        w->docs_cap *= 2;
        w->docs = xrealloc(w->docs, (size_t)w->docs_cap * sizeof *w->docs);
    }
    w->docs[++w->ndocs] = w->tokens;
}

static void write_index(struct shard_writer *w) {
    size_t rlen = w->record ? strlen(w->record) : 0;
    size_t size = INDEX_HEADER_BYTES + (size_t)w->nframes * INDEX_FRAME_BYTES +
                  (size_t)(w->ndocs + 1) * 8 + rlen + INDEX_TRAILER_BYTES;
    uint8_t *buf = xcalloc(1, size), *p = buf;
    memcpy(p + IDX_MAGIC, DATASET_MAGIC, 8);
    put_u32(p + IDX_VERSION, DATASET_VERSION);
    put_u32(p + IDX_DTYPE, (uint32_t)w->dtype);
    put_u32(p + IDX_VOCAB, (uint32_t)w->o.vocab_size);
    put_u32(p + IDX_EOD, w->o.eod_id < 0 ? DATASET_NO_EOD : (uint32_t)w->o.eod_id);
    put_u32(p + IDX_SHARDS, (uint32_t)w->nshards);
    put_u32(p + IDX_FRAME_TOKENS, (uint32_t)w->o.frame_tokens);
    put_u64(p + IDX_FRAMES, (uint64_t)w->nframes);
    put_u64(p + IDX_DOCS, (uint64_t)w->ndocs);
    put_u64(p + IDX_TOKENS, (uint64_t)w->tokens);
    put_u64(p + IDX_RECORD_BYTES, (uint64_t)rlen);
    p += INDEX_HEADER_BYTES;
    if (w->nframes) memcpy(p, w->frames, (size_t)w->nframes * INDEX_FRAME_BYTES);
    p += (size_t)w->nframes * INDEX_FRAME_BYTES;
    for (int64_t d = 0; d <= w->ndocs; d++, p += 8) put_u64(p, (uint64_t)w->docs[d]);
    if (rlen) memcpy(p, w->record, rlen);
    p += rlen;
    put_u64(p, XXH3_64bits(buf, size - INDEX_TRAILER_BYTES));
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", w->tmp, DATASET_INDEX_NAME);
    FILE *f = xfopen(path, "wb");
    xfwrite(buf, size, f, path);
    xfclose(f, path);
    free(buf);
}

static void fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) die("cannot sync directory %s: %s", path, strerror(errno));
    close(fd);
}

/* Move the finished tmp directory to OUT. An existing dataset (allowed by
 * force at open) is renamed away first and deleted only after the new one is
 * in place, so OUT is never a mix of the two. */
static void install(struct shard_writer *w) {
    struct stat st;
    char old[4096] = "";
    if (stat(w->out, &st) == 0) {
        if (dir_is_empty(w->out)) {
            if (rmdir(w->out) != 0) die("cannot remove empty %s: %s", w->out, strerror(errno));
        } else {
            check_out(w->out, w->o.force);
            snprintf(old, sizeof old, "%s.old-%d", w->out, (int)getpid());
            if (rename(w->out, old) != 0) die("cannot rename %s to %s: %s", w->out, old, strerror(errno));
        }
    }
    if (rename(w->tmp, w->out) != 0) die("cannot rename %s to %s: %s", w->tmp, w->out, strerror(errno));
    char *parent, *base;
    split_path(w->out, &parent, &base);
    fsync_dir(parent);
    free(parent);
    free(base);
    if (old[0] && remove_tree(old) != 0) warn("cannot remove old dataset %s: %s", old, strerror(errno));
}

static void writer_free(struct shard_writer *w) {
    if (w->shard) fclose(w->shard);
    ZSTD_freeCCtx(w->cctx);
    free(w->raw);
    free(w->cbuf);
    free(w->frames);
    free(w->docs);
    free(w->record);
    free(w->out);
    free(w->tmp);
    free(w);
}

void shard_writer_finish(struct shard_writer *w, struct shard_writer_stats *stats) {
    emit_frame(w);
    close_shard(w);
    shard_writer_end_doc(w);
    write_index(w);
    fsync_dir(w->tmp);
    install(w);
    if (stats) {
        stats->docs = w->ndocs;
        stats->tokens = w->tokens;
        stats->frames = w->nframes;
        stats->shards = w->nshards;
        stats->raw_bytes = w->tokens * w->dtype;
        stats->compressed_bytes = w->compressed;
    }
    writer_free(w);
}

void shard_writer_abort(struct shard_writer *w) {
    if (w->shard) fclose(w->shard);
    w->shard = NULL;
    if (remove_tree(w->tmp) != 0 && errno != ENOENT) warn("cannot remove %s: %s", w->tmp, strerror(errno));
    writer_free(w);
}
