/* The sampler at pretraining scale: memory independent of the corpus.
 *
 * 1. Version 2's permutation (a keyed Feistel network with cycle walking) is
 *    a bijection of [0, n): exhaustively for every n up to 1500, and sampled
 *    (inverse(permute(i)) == i, in range) for n of 1.8e9 and 3e15.
 * 2. A virtual corpus of 15 T tokens (an index describing it, shards with a
 *    byte per frame, no token data): a sampler over it at seq_len 8192
 *    (1.8e9 samples per epoch) gives the first 10,000 sample positions, the
 *    same from one reader and from 4 strided readers (dp 4), and the
 *    process's peak resident memory stays under 64 MiB (a table of 8 bytes
 *    per sample, the old sampler, would take 14.6 GB). */
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "config/common.h"
#include "data/dataset.h"
#include "data/shard_format.h"
#include "tests/unit/check.h"

static void check_bijection_exhaustive(void) {
    int ok = 1;
    for (uint64_t n = 1; n <= 1500 && ok; n++)
        for (uint64_t key = 1; key <= 3 && ok; key++) {
            int half = 1;
            while ((1ull << (2 * half)) < n) half++;
            char *seen = xcalloc(n, 1);
            for (uint64_t i = 0; i < n && ok; i++) {
                uint64_t p = sampler_permute(i, n, half, key * 0x1234567ull, 0);
                if (p >= n || seen[p]) ok = 0;
                else seen[p] = 1;
            }
            free(seen);
        }
    TEST_RESULT("sampler_permutation_bijective_small_n", ok, "a value repeats or leaves [0, n)");
}

static void check_bijection_sampled(uint64_t n, const char *name) {
    int half = 1;
    while ((1ull << (2 * half)) < n) half++;
    uint64_t state = 99, key = 0xabcdef12345ull;
    int ok = 1, moved = 0;
    for (int t = 0; t < 100000 && ok; t++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t i = (state >> 11) % n, p = sampler_permute(i, n, half, key, 0);
        ok = p < n && sampler_permute(p, n, half, key, 1) == i;
        moved += p != i;
    }
    TEST_RESULT(name, ok && moved > 99000, "inverse(permute(i)) != i or out of range (%d of 100000 moved)", moved);
}

/* An index for `tokens` tokens in frames of 2^28 tokens, `docs` equal
 * documents, one shard holding a byte per frame. */
static void write_virtual_corpus(const char *dir, int64_t tokens, int64_t docs) {
    int64_t per = 1 << 28, nframes = (tokens + per - 1) / per;
    size_t size = INDEX_HEADER_BYTES + (size_t)nframes * INDEX_FRAME_BYTES + (size_t)(docs + 1) * 8 + INDEX_TRAILER_BYTES;
    uint8_t *b = xcalloc(size, 1);
    memcpy(b + IDX_MAGIC, DATASET_MAGIC, 8);
    put_u32(b + IDX_VERSION, DATASET_VERSION);
    put_u32(b + IDX_DTYPE, 2);
    put_u32(b + IDX_VOCAB, 65536);
    put_u32(b + IDX_EOD, 0);
    put_u32(b + IDX_SHARDS, 1);
    put_u32(b + IDX_FRAME_TOKENS, (uint32_t)per);
    put_u64(b + IDX_FRAMES, (uint64_t)nframes);
    put_u64(b + IDX_DOCS, (uint64_t)docs);
    put_u64(b + IDX_TOKENS, (uint64_t)tokens);
    for (int64_t f = 0; f < nframes; f++) {
        uint8_t *r = b + INDEX_HEADER_BYTES + f * INDEX_FRAME_BYTES;
        put_u32(r + FR_TOKENS, (uint32_t)(f + 1 < nframes ? per : tokens - f * per));
        put_u64(r + FR_OFFSET, (uint64_t)f);
        put_u64(r + FR_CSIZE, 1);
    }
    uint8_t *d = b + INDEX_HEADER_BYTES + nframes * INDEX_FRAME_BYTES;
    for (int64_t i = 0; i <= docs; i++) put_u64(d + 8 * i, (uint64_t)(i == docs ? tokens : tokens / docs * i));
    put_u64(b + size - INDEX_TRAILER_BYTES, XXH3_64bits(b, size - INDEX_TRAILER_BYTES));
    char path[4200];
    if (mkdir_p(dir) != 0) die("cannot create %s", dir);
    snprintf(path, sizeof path, "%s/" DATASET_INDEX_NAME, dir);
    FILE *f = xfopen(path, "wb");
    xfwrite(b, size, f, path);
    xfclose(f, path);
    snprintf(path, sizeof path, "%s/" DATASET_SHARD_FMT, dir, 0);
    f = xfopen(path, "wb");
    memset(b, 0, (size_t)nframes);
    xfwrite(b, (size_t)nframes, f, path);
    xfclose(f, path);
    free(b);
}

/* Resident memory now (not the peak), in MiB. */
static double resident_mib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    if (f) fclose(f);
    return resident * (double)sysconf(_SC_PAGESIZE) / (1 << 20);
}

static void check_virtual_corpus(const char *dir) {
    const int64_t tokens = 15000000000000ll, count = 10000;
    const int L = 8192, dp = 4;
    write_virtual_corpus(dir, tokens, 1000);
    double before = resident_mib();
    struct dataset *ds = dataset_open(dir);
    struct sampler *one = sampler_create(ds, L, 1234, SPLIT_TRAIN, 0.001);
    int64_t n = sampler_samples_per_epoch(one);
    TEST_RESULT("sampler_15T_samples_per_epoch", n > 1800000000ll, "%lld samples", (long long)n);
    int64_t *pos = xmalloc(sizeof(int64_t) * count);
    int in_range = 1;
    for (int64_t i = 0; i < count; i++) {
        pos[i] = sampler_position(one, i);
        in_range &= pos[i] >= 0 && pos[i] + L < tokens && pos[i] % L == 0;
    }
    TEST_RESULT("sampler_15T_positions_in_split", in_range, "a position leaves the training split");
    /* four data-parallel readers, each with its own handle, take r, r+4, ... */
    struct sampler *rd[4];
    for (int r = 0; r < dp; r++) rd[r] = sampler_create(ds, L, 1234, SPLIT_TRAIN, 0.001);
    int same = 1;
    for (int64_t i = 0; i < count; i++) same &= sampler_position(rd[i % dp], i) == pos[i];
    TEST_RESULT("sampler_15T_dp1_equals_dp4", same, "the strided readers see other samples");
    /* what the reader and five samplers hold (a sanitizer's own memory is in `before`) */
    double grew = resident_mib() - before;
    struct rusage ru;
    CHECK(getrusage(RUSAGE_SELF, &ru) == 0);
    TEST_RESULT("sampler_15T_memory_under_64MiB", grew < 64, "reader + samplers hold %.1f MiB", grew);
    printf("  15 T tokens, %lld samples per epoch: reader + samplers %.1f MiB, process peak %.1f MiB\n", (long long)n,
           grew, ru.ru_maxrss / 1024.0);
    for (int r = 0; r < dp; r++) sampler_free(rd[r]);
    sampler_free(one);
    dataset_close(ds);
    free(pos);
}

/* Both versions visit every sample of an epoch exactly once, and differ. */
static void check_versions(const char *dir) {
    write_virtual_corpus(dir, 3000000, 10);
    struct dataset *ds = dataset_open(dir);
    int64_t first[2] = {0};
    for (int v = 1; v <= 2; v++) {
        struct sampler *s = sampler_create_version(ds, 100, 7, SPLIT_TRAIN, 0.0, v);
        int64_t n = sampler_samples_per_epoch(s);
        char *seen = xcalloc((size_t)n, 1);
        int ok = 1;
        for (int64_t e = 0; e < 2; e++)
            for (int64_t i = 0; i < n; i++) {
                int64_t k = sampler_position(s, e * n + i) / 100;
                ok &= k >= 0 && k < n && seen[k] == e;
                if (ok) seen[k]++;
            }
        first[v - 1] = sampler_position(s, 0);
        char name[64];
        snprintf(name, sizeof name, "sampler_v%d_each_sample_once_per_epoch", v);
        TEST_RESULT(name, ok, "a sample repeats or is skipped within an epoch");
        free(seen);
        sampler_free(s);
    }
    TEST_RESULT("sampler_versions_differ", first[0] != first[1], "versions 1 and 2 start at the same sample");
    dataset_close(ds);
}

int main(void) {
    check_bijection_exhaustive();
    check_bijection_sampled(1831054687ull, "sampler_permutation_bijective_n_1.8e9");
    check_bijection_sampled(3000000000000007ull, "sampler_permutation_bijective_n_3e15");
    char dir[] = "/tmp/mtrain-sampler-XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp failed");
    check_virtual_corpus(dir);
    check_versions(dir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) warn("could not remove %s", dir);
    TEST_EXIT();
}
