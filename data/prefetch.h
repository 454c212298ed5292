/* A background thread that reads the next global batch's samples (this
 * data-parallel rank's share) while the current step computes. It owns its
 * own dataset handles (a handle is not thread-safe) and at most two batches,
 * so memory stays bounded. Asking for a position it did not guess (after a
 * rewind) just reads that one. The samples are exactly those blend_get gives
 * for the same indices. */
#pragma once
#include <stdint.h>

#include "config/recipe.h"
#include "data/dataset.h"

struct prefetcher;

/* Rank dp_rank of dp reads samples first + dp_rank, first + dp_rank + dp, ...
 * (global_batch / dp of them, seq_len + 1 tokens each) of split. */
struct prefetcher *prefetcher_create(const struct recipe *r, enum split split, int dp, int dp_rank);
void prefetcher_free(struct prefetcher *p);
/* The batch starting at global sample `first` (waits for it if it is being
 * read, reads it if it was not requested); valid until the next call. Then
 * starts reading the batch after it. */
const int32_t *prefetcher_next(struct prefetcher *p, int64_t first);
/* The first dataset of the blend (for the run's banner). */
struct dataset *prefetcher_dataset(const struct prefetcher *p);
