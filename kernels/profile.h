/* Where a training step's time goes: a backend table that times each op of
 * the table it wraps to its completion, keyed by op and shape, and a table
 * of the totals per step. Turned on by MTRAIN_PROFILE=1 (mtrain pretrain,
 * bench_train; docs/benchmarks.md). Each op is waited for (a one-byte
 * read-back, the same wait bench_train uses), so the numbers are each op's
 * own time plus its launch, and a profiled step is slower than a plain one;
 * what the ops do is unchanged (the same calls, the same numbers). An op
 * may report parts of its time (profile_part), listed apart.
 * Memory: a fixed table of PROFILE_ENTRIES (op, shape) rows. */
#pragma once
#include <stdio.h>

#include "kernels/ops.h"

#define PROFILE_ENTRIES 512

#ifdef __cplusplus
extern "C" {
#endif

/* MTRAIN_PROFILE is set to something other than "" or "0" */
int profile_requested(void);
/* A profiled table is in use and counting: an op's implementation may then
 * time its parts (the caller waits for the device around each). */
int profile_parts_active(void);
/* Adds seconds (and flops) to the part row (what, shape): a share of the op
 * being timed around it, shown in parentheses below the ops and left out of
 * their total (e.g. the casts and the GEMMs inside an FP8 matmul). */
void profile_part(const char *what, double flops, double seconds, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A table doing what inner does, each op timed. One inner per process: a
 * second call with another table dies. */
const struct backend *backend_profiled(const struct backend *inner);
/* Forget what was timed (after a warm-up step: plans, first touches). */
void profile_reset(void);
/* Stop (0) or resume (1) counting, e.g. around evaluation (its wall time
 * is left out of the report's too); returns the previous setting. */
int profile_counting(int on);
/* The totals since the last reset as a table per step (steps: how many
 * steps they cover), most time first, with the wall time per step since the
 * reset beside them: the difference is host work and communication. */
void profile_report(FILE *f, int steps);
/* The same as one JSON object (metrics.jsonl's "profile" event): steps,
 * step_ms, ops_ms and rows [{op, shape, ms, calls, tflops (null: no FLOP
 * count)}] per step, most time first. The caller frees it. */
char *profile_json(int steps);
/* The ops called since the last reset (parts not counted): on the GPU each
 * at least one kernel launch. */
long profile_op_calls(void);

#ifdef __cplusplus
}
#endif
