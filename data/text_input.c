/* Build inputs: plain bytes or a zstd stream (ZSTD_decompressStream). */
#include "data/text_input.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>

#include "config/common.h"

struct text_input {
    char *path;
    FILE *f;
    ZSTD_DCtx *z;           /* NULL: plain */
    uint8_t *zin;
    ZSTD_inBuffer ib;
    size_t zin_cap, last_ret;
    uint64_t disk;
    int eof;
};

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

int64_t text_input_check(const char *path, char *err, size_t errsz) {
    if (ends_with(path, ".gz") || ends_with(path, ".gzip")) {
        snprintf(err, errsz, "%s: gzip input is not supported (zlib is not a dependency); decompress it first "
                 "(gunzip) or recompress it with zstd", path);
        return -2;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errsz, "cannot read %s: %s", path, strerror(errno));
        return -3;
    }
    return S_ISREG(st.st_mode) ? (int64_t)st.st_size : -1;
}

struct text_input *text_input_open(const char *path, char *err, size_t errsz) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errsz, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    struct text_input *in = xcalloc(1, sizeof *in);
    in->path = xstrdup(path);
    in->f = f;
    in->zin_cap = ZSTD_DStreamInSize();
    in->zin = xmalloc(in->zin_cap);
    /* sniff the first bytes: zstd by magic, gzip refused */
    size_t got = fread(in->zin, 1, 4, f);
    if (ferror(f)) {
        snprintf(err, errsz, "cannot read %s: %s", path, strerror(errno));
        text_input_close(in);
        return NULL;
    }
    in->ib = (ZSTD_inBuffer){in->zin, got, 0};
    in->disk = got;
    if (got >= 2 && in->zin[0] == 0x1f && in->zin[1] == 0x8b) {
        snprintf(err, errsz, "%s: gzip input is not supported (zlib is not a dependency); decompress it first", path);
        text_input_close(in);
        return NULL;
    }
    if (got == 4 && (in->zin[0] | in->zin[1] << 8 | in->zin[2] << 16 | (uint32_t)in->zin[3] << 24) == ZSTD_MAGICNUMBER) {
        in->z = ZSTD_createDCtx();
        if (!in->z) die("out of memory creating a zstd context");
    } else if (ends_with(path, ".zst")) {
        snprintf(err, errsz, "%s: not a zstd file (bad magic at offset 0)", path);
        text_input_close(in);
        return NULL;
    }
    return in;
}

static long read_plain(struct text_input *in, char *buf, size_t cap, char *err, size_t errsz) {
    size_t n = 0;
    /* the sniffed bytes come first */
    while (in->ib.pos < in->ib.size && n < cap) buf[n++] = (char)in->zin[in->ib.pos++];
    if (n < cap && !in->eof) {
        size_t got = fread(buf + n, 1, cap - n, in->f);
        if (ferror(in->f)) {
            snprintf(err, errsz, "cannot read %s at offset %llu: %s", in->path, (unsigned long long)in->disk,
                     strerror(errno));
            return -1;
        }
        if (got == 0) in->eof = 1;
        in->disk += got;
        n += got;
    }
    return (long)n;
}

static long read_zstd(struct text_input *in, char *buf, size_t cap, char *err, size_t errsz) {
    ZSTD_outBuffer ob = {buf, cap, 0};
    while (ob.pos == 0) {
        if (in->ib.pos == in->ib.size) {
            if (in->eof) break;
            size_t got = fread(in->zin, 1, in->zin_cap, in->f);
            if (ferror(in->f)) {
                snprintf(err, errsz, "cannot read %s at offset %llu: %s", in->path, (unsigned long long)in->disk,
                         strerror(errno));
                return -1;
            }
            in->disk += got;
            in->ib = (ZSTD_inBuffer){in->zin, got, 0};
            if (got == 0) {
                in->eof = 1;
                break;
            }
        }
        size_t ret = ZSTD_decompressStream(in->z, &ob, &in->ib);
        if (ZSTD_isError(ret)) {
            snprintf(err, errsz, "%s: zstd error near compressed offset %llu: %s", in->path,
                     (unsigned long long)(in->disk - (in->ib.size - in->ib.pos)), ZSTD_getErrorName(ret));
            return -1;
        }
        in->last_ret = ret;
    }
    if (ob.pos == 0 && in->eof && in->last_ret != 0) {
        snprintf(err, errsz, "%s: truncated zstd stream (ends inside a frame at offset %llu)", in->path,
                 (unsigned long long)in->disk);
        return -1;
    }
    return (long)ob.pos;
}

long text_input_read(struct text_input *in, char *buf, size_t cap, char *err, size_t errsz) {
    return in->z ? read_zstd(in, buf, cap, err, errsz) : read_plain(in, buf, cap, err, errsz);
}

uint64_t text_input_disk_bytes(const struct text_input *in) { return in->disk; }

void text_input_close(struct text_input *in) {
    if (!in) return;
    fclose(in->f);  /* read-only */
    ZSTD_freeDCtx(in->z);
    free(in->zin);
    free(in->path);
    free(in);
}
