/* Random-sample read throughput: mtrain's zstd dataset (dataset_read of
 * seq_len+1 tokens at seeded random positions) against the same samples read
 * from an uncompressed memory-mapped token file (the layout of a Megatron .bin),
 * both producing int32 tokens. Prints one JSON object.
 *
 *   bench_data DATASET_DIR SEQ_LEN SAMPLES
 *       page cache warm: the whole dataset was just read.
 *   bench_data --cold WORK_DIR REPEAT DATASET_DIR SEQ_LEN SAMPLES
 *       pretraining scale: the dataset is repeated REPEAT times into WORK_DIR
 *       (a zstd dataset and a .bin), both are flushed and dropped from the page
 *       cache before each pass (posix_fadvise DONTNEED, checked with mincore),
 *       so every sample is read from the disk as it is when the data is far
 *       larger than memory. The mmap side runs twice, with the kernel's default
 *       read-around (what numpy.memmap does) and with MADV_RANDOM; the ratio is
 *       against the faster of the two. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/common.h"
#include "data/dataset.h"
#include "data/shard_format.h"
#include "data/shard_writer.h"

static uint64_t rng(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Megatron's .bin layout: the token stream, uint16 or uint32, nothing else. */
static void write_bin(const char *path, const int32_t *tok, int64_t n, int dtype, int repeat) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) die("%s: %s", path, strerror(errno));
    size_t bytes = (size_t)n * dtype;
    uint8_t *raw = xmalloc(bytes);
    for (int64_t i = 0; i < n; i++) {
        if (dtype == 2) ((uint16_t *)raw)[i] = (uint16_t)tok[i];
        else ((uint32_t *)raw)[i] = (uint32_t)tok[i];
    }
    for (int r = 0; r < repeat; r++)
        if (write(fd, raw, bytes) != (ssize_t)bytes) die("%s: write failed", path);
    if (fsync(fd) != 0 || close(fd) != 0) die("%s: %s", path, strerror(errno));
    free(raw);
}

/* Flush and evict FILE from the page cache; returns the fraction of its pages
 * still resident afterwards (mincore), so the report can show the pass was cold. */
static double drop_cache(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) die("%s: %s", path, strerror(errno));
    if (fdatasync(fd) != 0) die("%s: fdatasync: %s", path, strerror(errno));
    int e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (e) die("%s: posix_fadvise: %s", path, strerror(e));
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = ((size_t)st.st_size + page - 1) / page;
    double resident = 0;
    if (pages) {
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) die("%s: mmap: %s", path, strerror(errno));
        unsigned char *vec = xmalloc(pages);
        if (mincore(map, (size_t)st.st_size, vec) != 0) die("%s: mincore: %s", path, strerror(errno));
        size_t in = 0;
        for (size_t i = 0; i < pages; i++) in += vec[i] & 1;
        resident = (double)in / (double)pages;
        free(vec);
        munmap(map, (size_t)st.st_size);
    }
    close(fd);
    return resident;
}

static double time_zstd(struct dataset *ds, const int64_t *pos, int64_t S, int L, int32_t *out, int64_t *check) {
    double t0 = now_seconds();
    for (int64_t i = 0; i < S; i++) {
        dataset_read(ds, pos[i], L + 1, out);
        *check += out[L];
    }
    return now_seconds() - t0;
}

/* Map the .bin (advice: MADV_NORMAL or MADV_RANDOM) and copy the samples out. */
static double time_mmap(const char *bin, int dtype, int advice, const int64_t *pos, int64_t S, int L,
                        int32_t *out, int64_t *check) {
    int fd = open(bin, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("%s: %s", bin, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) die("%s: %s", bin, strerror(errno));
    const uint8_t *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) die("%s: mmap: %s", bin, strerror(errno));
    if (madvise((void *)map, (size_t)st.st_size, advice) != 0) die("%s: madvise: %s", bin, strerror(errno));
    double t0 = now_seconds();
    for (int64_t i = 0; i < S; i++) {
        if (dtype == 2) {
            const uint16_t *p = (const uint16_t *)map + pos[i];
            for (int j = 0; j <= L; j++) out[j] = p[j];
        } else {
            const uint32_t *p = (const uint32_t *)map + pos[i];
            for (int j = 0; j <= L; j++) out[j] = (int32_t)p[j];
        }
        *check -= out[L];
    }
    double t = now_seconds() - t0;
    munmap((void *)map, (size_t)st.st_size);
    close(fd);
    return t;
}

static int64_t *positions(int64_t S, int64_t T, int L) {
    int64_t *pos = xmalloc((size_t)S * sizeof *pos);
    uint64_t seed = 1;
    for (int64_t i = 0; i < S; i++) pos[i] = (int64_t)(rng(&seed) % (uint64_t)(T - L - 1));
    return pos;
}

static int32_t *read_all(struct dataset *ds, struct dataset_info *in, int L) {
    dataset_get_info(ds, in);
    if (in->tokens < L + 2) die("dataset too small");
    int32_t *all = xmalloc((size_t)in->tokens * sizeof *all);
    dataset_read(ds, 0, in->tokens, all);
    return all;
}

static int warm(const char *dir, int L, int64_t S) {
    struct dataset *ds = dataset_open(dir);
    struct dataset_info in;
    int32_t *all = read_all(ds, &in, L);
    char bin[] = "/tmp/mtrain-bench-bin.XXXXXX";
    int fd = mkstemp(bin);
    if (fd < 0 || close(fd) != 0) die("mkstemp failed");
    write_bin(bin, all, in.tokens, in.dtype_bytes, 1);
    int64_t *pos = positions(S, in.tokens, L);
    int32_t *out = xmalloc(((size_t)L + 1) * sizeof *out);
    int64_t check = 0;
    /* warm both (page cache, frame cache) on a different order, then time */
    for (int64_t i = 0; i < S / 10; i++) dataset_read(ds, pos[(i * 7) % S], L + 1, out);
    time_mmap(bin, in.dtype_bytes, MADV_NORMAL, pos, S / 10, L, out, &check);
    check = 0;
    double t_zstd = time_zstd(ds, pos, S, L, out, &check);
    double t_mmap = time_mmap(bin, in.dtype_bytes, MADV_NORMAL, pos, S, L, out, &check);
    double tok = (double)S * (L + 1);
    printf("{\"samples\": %lld, \"seq_len\": %d, \"tokens\": %lld, \"frame_tokens\": %lld, "
           "\"zstd_tokens_per_s\": %.0f, \"mmap_tokens_per_s\": %.0f, \"ratio\": %.3f, \"check\": %lld}\n",
           (long long)S, L, (long long)in.tokens, (long long)in.frame_tokens, tok / t_zstd, tok / t_mmap,
           t_mmap / t_zstd, (long long)check);
    unlink(bin);
    free(all);
    free(pos);
    free(out);
    dataset_close(ds);
    return 0;
}

static int cold(const char *work, int repeat, const char *dir, int L, int64_t S) {
    struct dataset *src = dataset_open(dir);
    struct dataset_info in;
    int32_t *all = read_all(src, &in, L);
    if (mkdir(work, 0755) != 0 && errno != EEXIST) die("%s: %s", work, strerror(errno));
    char big[4096], bin[4096], shard[4200];
    snprintf(big, sizeof big, "%s/big", work);
    snprintf(bin, sizeof bin, "%s/big.bin", work);
    /* the same documents REPEAT times, in frames of the source's size */
    struct shard_writer_opts o = {.vocab_size = in.vocab_size, .eod_id = in.eod_id,
                                  .frame_tokens = in.frame_tokens, .force = 1};
    struct shard_writer *w = shard_writer_open(big, &o);
    for (int r = 0; r < repeat; r++)
        for (int64_t d = 0; d < in.docs; d++) {
            int64_t a = dataset_doc_start(src, d), b = dataset_doc_start(src, d + 1);
            shard_writer_add(w, all + a, b - a);
            shard_writer_end_doc(w);
        }
    shard_writer_finish(w, NULL);
    write_bin(bin, all, in.tokens, in.dtype_bytes, repeat);
    free(all);
    dataset_close(src);

    struct dataset *ds = dataset_open(big);
    struct dataset_info bi;
    dataset_get_info(ds, &bi);
    int64_t *pos = positions(S, bi.tokens, L);
    int32_t *out = xmalloc(((size_t)L + 1) * sizeof *out);
    int64_t check = 0;
    double resident = 0, r;
    for (int64_t s = 0; s < bi.shards; s++) {
        snprintf(shard, sizeof shard, "%s/" DATASET_SHARD_FMT, big, (int)s);
        if ((r = drop_cache(shard)) > resident) resident = r;
    }
    double t_zstd = time_zstd(ds, pos, S, L, out, &check);
    if ((r = drop_cache(bin)) > resident) resident = r;
    double t_normal = time_mmap(bin, bi.dtype_bytes, MADV_NORMAL, pos, S, L, out, &check);
    check = 0;
    if ((r = drop_cache(bin)) > resident) resident = r;
    double t_random = time_mmap(bin, bi.dtype_bytes, MADV_RANDOM, pos, S, L, out, &check);
    double t_best = t_normal < t_random ? t_normal : t_random;
    double tok = (double)S * (L + 1);
    printf("{\"samples\": %lld, \"seq_len\": %d, \"tokens\": %lld, \"frame_tokens\": %lld, "
           "\"bin_bytes\": %lld, \"compressed_bytes\": %lld, \"resident_after_drop\": %.4f, "
           "\"zstd_tokens_per_s\": %.0f, \"mmap_tokens_per_s\": %.0f, \"mmap_random_tokens_per_s\": %.0f, "
           "\"ratio\": %.3f}\n",
           (long long)S, L, (long long)bi.tokens, (long long)bi.frame_tokens, (long long)bi.tokens * bi.dtype_bytes,
           (long long)bi.compressed_bytes, resident, tok / t_zstd, tok / t_normal, tok / t_random, t_best / t_zstd);
    free(pos);
    free(out);
    dataset_close(ds);
    if (remove_tree(big) != 0 || unlink(bin) != 0) die("%s: cannot remove: %s", work, strerror(errno));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4) return warm(argv[1], atoi(argv[2]), atoll(argv[3]));
    if (argc == 7 && !strcmp(argv[1], "--cold"))
        return cold(argv[2], atoi(argv[3]), argv[4], atoi(argv[5]), atoll(argv[6]));
    die("usage: bench_data DATASET_DIR SEQ_LEN SAMPLES\n"
        "       bench_data --cold WORK_DIR REPEAT DATASET_DIR SEQ_LEN SAMPLES");
}
