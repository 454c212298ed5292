/* Weighted blending of several datasets, as Megatron-LM's BlendedDataset:
 * weights are normalized, and global sample s goes to the dataset whose
 * realized count lags its target the most, argmax_i (w_i * max(s, 1) - c_i)
 * (lowest i on ties), as that dataset's next sample. Every prefix of the
 * sequence, so every global batch, holds each dataset's share to within one
 * sample. Within a dataset, samples come from its own sampler (data/dataset.h).
 *
 * blend_get is a pure function of (sources, seq_len, seed, split, index):
 * any set of readers (DP ranks taking r, r+D, ...) sees the same samples. A
 * blend owns its dataset handles, which are not thread-safe: a prefetch
 * thread creates its own blend. */
#pragma once
#include <stdint.h>

#include "data/dataset.h"

struct blend_source {
    const char *path;
    double weight;            /* > 0; normalized over the sources */
};

struct blend;

/* Opens every dataset (errors name the dataset and exit 1). A single source
 * gives exactly sampler_create_version(..., seed, ..., sampler_version)'s
 * samples; source i > 0 uses a seed derived from (seed, i) so equal datasets
 * are not read in lockstep. */
struct blend *blend_create(const struct blend_source *src, int n, int seq_len, uint64_t seed, enum split split,
                           double valid_fraction, int sampler_version);
void blend_free(struct blend *b);
int blend_num_sources(const struct blend *b);
struct dataset *blend_dataset(const struct blend *b, int i);
/* Which source global sample index comes from, and its index there. */
void blend_locate(struct blend *b, int64_t index, int *source, int64_t *sample);
/* Global sample index -> seq_len+1 tokens. */
void blend_get(struct blend *b, int64_t index, int32_t *out);
/* A data-parallel rank's share of the global batch starting at sample first:
 * n samples first + rank, first + rank + stride, ... into out ([n][seq_len+1]). */
void blend_get_strided(struct blend *b, int64_t first, int n, int stride, int rank, int32_t *out);

struct recipe;
/* The recipe's data: data.blend, or data.path alone as a one-source blend
 * (which gives exactly the plain sampler's samples). The trainer calls
 * blend_from_recipe(r, SPLIT_TRAIN) and blend_get(b, index, out) in place of
 * sampler_create / sampler_get. Checks every dataset's vocabulary against
 * model.vocab_size (one-line error, exit 1). */
struct blend *blend_from_recipe(const struct recipe *r, enum split split);
