/* Layout-independent initialisation: each element is a pure function of
 * (seed, tensor name, global element index), so every rank generates exactly
 * its shard and any parallel layout starts from the same global weights. */
#pragma once
#include <stdint.h>

#include "kernels/ops.h"
#include "model/params.h"

/* Standard normal for (seed, stream, index): counter-based, no state. */
double init_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* Where a tensor's values go, one tensor at a time: item i of the table,
 * numel host floats (model/master.h master_put). */
typedef void (*param_put_fn)(void *ctx, int i, const float *host);
/* put into a device buffer laid out by the table (ctx: struct param_buffer) */
struct param_buffer {
    const struct backend *be;
    float *buf;
    const struct param_table *t;
};
void param_put_buffer(void *ctx, int i, const float *host);
/* Generate every local tensor of the table and hand each to put. */
void params_init_each(const struct param_table *t, uint64_t seed, int tp_rank, param_put_fn put, void *ctx);
/* Fill a local buffer laid out by the table (device memory). */
void params_init(const struct backend *be, float *params, const struct param_table *t, uint64_t seed, int tp_rank);
