/* `mtrain plan`'s model of a training step (cli/plan.c): for a recipe
 * whose parallel layout is set, the time of one optimizer step on a system
 * (config/system.h), from
 *  - compute per op: GEMMs by FLOPs at the system's efficiency for their
 *    size, causal attention likewise, memory-bound ops (norms, activations,
 *    residual adds, the loss) by bytes over memory bandwidth, AdamW by the
 *    bytes it touches;
 *  - communication per collective and group (alpha-beta: latency per ring
 *    step plus bytes over the link; inside a node when the group fits one,
 *    else over the network): tensor-parallel, context-parallel and expert
 *    exchanges and pipeline sends are on the critical path as mtrain runs
 *    them; the data-parallel reduction overlaps the last micro batch's
 *    backward when parallel.overlap_grad_reduce is on;
 *  - the pipeline schedule, simulated (parallel/schedule.h) with a backward
 *    costing b/f forwards of the busiest stage.
 * Memory is the dry run's estimate (model/flops.h). The bytes each group
 * moves per step are predicted as mtrain's comm accounting counts them (the
 * `comm` metrics event) for the data-parallel, pipeline and context-parallel
 * groups. */
#pragma once
#include "config/recipe.h"
#include "config/system.h"

struct backend;

enum { PLAN_TP, PLAN_DP, PLAN_PP, PLAN_EP, PLAN_CP, PLAN_GROUPS };

struct plan_cost {
    double step_s;             /* one optimizer step */
    double forward_s, backward_s; /* one micro batch on the busiest stage, its exposed communication included */
    double bubble;             /* idle share of the pipeline schedule */
    double comm_s;             /* exposed communication per step (critical-path exchanges + what DP does not hide) */
    double optimizer_s;
    double tokens_per_s;       /* per accelerator */
    double tflops;             /* model TFLOP/s per accelerator (model_flops_per_token) */
    double mfu;                /* of the system's bf16 dense peak */
    double mem_gib;            /* the busiest stage's estimate */
    int fits;
    double bytes[PLAN_GROUPS]; /* per rank of pipeline stage 0 per step, as the comm event counts them (dp, pp,
                                * cp; tp for dense GQA layers; ep not predicted) */
};

/* The step of recipe r (its layout, micro batch, recompute, precision) on
 * world ranks of system s, for backend be's memory layout (cpu or cuda). */
void plan_predict(const struct recipe *r, int world, const struct system_spec *s, const struct backend *be,
                  struct plan_cost *out);
