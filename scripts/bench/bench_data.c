/* Random-sample read throughput: mtrain's zstd dataset (dataset_read of
 * seq_len+1 tokens at seeded random positions) against the same samples read
 * from an uncompressed memory-mapped token file (the layout of a Megatron .bin),
 * both producing int32 tokens. Usage: bench_data DATASET_DIR SEQ_LEN SAMPLES
 * Prints one JSON object. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config/common.h"
#include "data/dataset.h"

static uint64_t rng(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int main(int argc, char **argv) {
    if (argc != 4) die("usage: bench_data DATASET_DIR SEQ_LEN SAMPLES");
    int L = atoi(argv[2]);
    int64_t S = atoll(argv[3]);
    struct dataset *ds = dataset_open(argv[1]);
    struct dataset_info in;
    dataset_get_info(ds, &in);
    int64_t T = in.tokens;
    if (T < L + 2) die("dataset too small");
    /* the uncompressed file, as Megatron would store it */
    int32_t *all = xmalloc((size_t)T * sizeof *all);
    dataset_read(ds, 0, T, all);
    char path[] = "/tmp/mtrain-bench-bin.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp failed");
    size_t bytes = (size_t)T * in.dtype_bytes;
    uint8_t *raw = xmalloc(bytes);
    for (int64_t i = 0; i < T; i++) {
        if (in.dtype_bytes == 2) ((uint16_t *)raw)[i] = (uint16_t)all[i];
        else ((uint32_t *)raw)[i] = (uint32_t)all[i];
    }
    if (write(fd, raw, bytes) != (ssize_t)bytes) die("write failed");
    free(raw);
    const uint8_t *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) die("mmap failed");
    int64_t *pos = xmalloc((size_t)S * sizeof *pos);
    uint64_t seed = 1;
    for (int64_t i = 0; i < S; i++) pos[i] = (int64_t)(rng(&seed) % (uint64_t)(T - L - 1));
    int32_t *out = xmalloc(((size_t)L + 1) * sizeof *out);
    int64_t check = 0;
    /* warm both (page cache, frame cache) on a different seed, then time */
    for (int64_t i = 0; i < S / 10; i++) dataset_read(ds, pos[(i * 7) % S], L + 1, out);
    double t0 = now_seconds();
    for (int64_t i = 0; i < S; i++) {
        dataset_read(ds, pos[i], L + 1, out);
        check += out[L];
    }
    double t_zstd = now_seconds() - t0;
    t0 = now_seconds();
    for (int64_t i = 0; i < S; i++) {
        if (in.dtype_bytes == 2) {
            const uint16_t *p = (const uint16_t *)map + pos[i];
            for (int j = 0; j <= L; j++) out[j] = p[j];
        } else {
            const uint32_t *p = (const uint32_t *)map + pos[i];
            for (int j = 0; j <= L; j++) out[j] = (int32_t)p[j];
        }
        check -= out[L];
    }
    double t_mmap = now_seconds() - t0;
    double tok = (double)S * (L + 1);
    printf("{\"samples\": %lld, \"seq_len\": %d, \"tokens\": %lld, \"frame_tokens\": %lld, "
           "\"zstd_tokens_per_s\": %.0f, \"mmap_tokens_per_s\": %.0f, \"ratio\": %.3f, \"check\": %lld}\n",
           (long long)S, L, (long long)T, (long long)in.frame_tokens, tok / t_zstd, tok / t_mmap, t_mmap / t_zstd,
           (long long)check);
    munmap((void *)map, bytes);
    close(fd);
    unlink(path);
    free(all);
    free(pos);
    free(out);
    dataset_close(ds);
    return 0;
}
