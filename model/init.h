/* Layout-independent initialisation: each element is a pure function of
 * (seed, tensor name, global element index), so every rank generates exactly
 * its shard and any parallel layout starts from the same global weights. */
#pragma once
#include <stdint.h>

#include "kernels/ops.h"
#include "model/params.h"

/* Standard normal for (seed, stream, index): counter-based, no state. */
double init_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* Fill the local parameter buffer (device memory) from the table. */
void params_init(const struct backend *be, float *params, const struct param_table *t, uint64_t seed, int tp_rank);
