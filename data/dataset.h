/* Token datasets: a directory with an index and zstd shard files (format in
 * docs/formats.md), and the deterministic sampler that cuts training samples
 * of seq_len+1 tokens from it. */
#pragma once
#include <stdint.h>

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

enum split { SPLIT_TRAIN = 0, SPLIT_VALID = 1 };
struct sampler;
/* Documents are split by index: the last valid_fraction of documents (at
 * least one when the fraction is > 0) form the validation split. Samples of
 * seq_len+1 tokens are cut from the split's token stream every seq_len tokens
 * (crossing document boundaries) and visited in a seeded permutation that is
 * redrawn each epoch. The sequence depends only on (seed, split, index). */
struct sampler *sampler_create(struct dataset *ds, int seq_len, uint64_t seed, enum split split,
                               double valid_fraction);
void sampler_free(struct sampler *s);
int64_t sampler_samples_per_epoch(const struct sampler *s);
/* Global sample index -> tokens (out holds seq_len+1 values). */
void sampler_get(struct sampler *s, int64_t index, int32_t *out);
