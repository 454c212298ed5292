/* Token datasets: a directory with an index and zstd shard files (format in
 * docs/formats.md), and the deterministic sampler that cuts training samples
 * of seq_len+1 tokens from it. */
#pragma once
#include <stdint.h>
#include <stdio.h>

struct dataset;

/* Open DIR and check its index. On a missing or damaged dataset prints a
 * one-line error naming the file (and offset/frame) and exits 1. */
struct dataset *dataset_open(const char *dir);
void dataset_close(struct dataset *ds);
int dataset_vocab_size(const struct dataset *ds);
int64_t dataset_num_tokens(const struct dataset *ds);
int64_t dataset_num_docs(const struct dataset *ds);
/* First token of document d (0 <= d <= num_docs; d == num_docs gives the end). */
int64_t dataset_doc_start(const struct dataset *ds, int64_t d);
/* Read tokens [first, first+count) of the concatenated stream into out.
 * A corrupt or truncated frame prints an error naming the shard file and the
 * frame index/offset, and exits 1. */
void dataset_read(struct dataset *ds, int64_t first, int64_t count, int32_t *out);

/* A dataset handle keeps a decoder and a cache of decoded frames: it is not
 * thread-safe; a prefetch thread opens its own handle. */
struct dataset_info {
    int dtype_bytes;          /* 2 (uint16) or 4 (uint32) on disk */
    int vocab_size;
    int64_t eod_id;           /* -1: none */
    int64_t frame_tokens;     /* nominal tokens per frame at build time */
    int64_t docs, tokens, shards, frames;
    int64_t compressed_bytes; /* sum of frame sizes */
};
void dataset_get_info(const struct dataset *ds, struct dataset_info *info);
const char *dataset_dir(const struct dataset *ds);
/* Decode and check every frame. Prints one line per bad frame to report
 * ("mtrain: error: DIR/shard-00000.zst: frame 3 at offset 12345: why") and
 * returns the number of bad frames; never exits. */
int64_t dataset_verify(struct dataset *ds, FILE *report);

enum split { SPLIT_TRAIN = 0, SPLIT_VALID = 1 };
struct sampler;
/* Documents are split by index: the last valid_fraction of documents (at
 * least one when the fraction is > 0) form the validation split. Samples of
 * seq_len+1 tokens are cut from the split's token stream every seq_len tokens
 * (crossing document boundaries) and visited in a seeded permutation that is
 * redrawn each epoch. The sequence depends only on (seed, split, index).
 * Version 2 (the default) evaluates the permutation at one index with a keyed
 * Feistel network: O(1) memory whatever the corpus. Version 1 keeps a
 * Fisher-Yates table of 8 bytes per sample (checkpoints of earlier runs). */
#define SAMPLER_VERSION 2
struct sampler *sampler_create(struct dataset *ds, int seq_len, uint64_t seed, enum split split,
                               double valid_fraction);
struct sampler *sampler_create_version(struct dataset *ds, int seq_len, uint64_t seed, enum split split,
                                       double valid_fraction, int version);
/* Version 2's permutation of [0, n) (exposed for tests): the Feistel network
 * over [0, 4^half) keyed by key, walked until inside; inverse = 1 undoes it. */
uint64_t sampler_permute(uint64_t i, uint64_t n, int half, uint64_t key, int inverse);
void sampler_free(struct sampler *s);
int64_t sampler_samples_per_epoch(const struct sampler *s);
/* Global sample index -> tokens (out holds seq_len+1 values). */
void sampler_get(struct sampler *s, int64_t index, int32_t *out);
/* Stream position of the first token of global sample index. */
int64_t sampler_position(struct sampler *s, int64_t index);
/* The split's documents [*doc_begin, *doc_end) and tokens [*tok_begin, *tok_end). */
void sampler_split_range(const struct sampler *s, int64_t *doc_begin, int64_t *doc_end, int64_t *tok_begin,
                         int64_t *tok_end);
