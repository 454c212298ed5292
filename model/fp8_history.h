/* Delayed FP8 scaling (train.fp8_scaling delayed): each operand of an FP8
 * GEMM (input, weight, output gradient) is scaled by the power of two that
 * the largest amax of its last `length` steps gives, not by its current
 * amax, so its scale is known before the tensor is read (Transformer
 * Engine's delayed scaling with the "max" algorithm). The current amax is
 * still taken, for the history.
 *
 * A site is one weight tensor of an FP8 block, by its global name; a
 * layer's routed experts share one site per projection, named without the
 * expert number ("model.layers.3.mlp.experts.gate_proj.weight"). Names and
 * history are the same on every rank and in every layout, so a checkpoint
 * holds them once (manifest.json "fp8_amax_history", docs/checkpoints.md),
 * and `convert` and any resumed layout keep them.
 *
 * Per step: the trainer zeroes the record; every FP8 GEMM max-accumulates
 * its operands' current amaxes into its site's record (backend memory);
 * at the end of the step the record is max-reduced over all ranks (so the
 * history is the amax over the whole global batch and every shard: the
 * same for any layout) and pushed into the history, newest first. A step
 * with a non-finite amax pushes nothing (its loss is not finite either, so
 * it is rewound). An operand whose history holds no nonzero amax yet (the
 * first step, or a resume from a checkpoint without a history) is scaled by
 * its current amax.
 *
 * Memory: sites x 3 x (length + 2) numbers on the host and sites x 3 floats
 * in backend memory; a layer has at most 15 sites: bounded by the model's
 * depth, not by the data or the number of experts. */
#pragma once
#include <stddef.h>

#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/params.h"
#include "parallel/comm.h"

struct fp8_history {
    int sites, length;
    char (*names)[PARAM_NAME_MAX];  /* [sites], sorted */
    float *amax;                    /* host [sites][FP8_OPERANDS][length], newest first; the same on every rank */
    int *exp;                       /* host [sites][FP8_OPERANDS]: this step's scale exponents (FP8_SCALE_CURRENT) */
    float *record;                  /* backend memory [sites][FP8_OPERANDS]: this step's amaxes so far */
    float *host;                    /* [sites][FP8_OPERANDS] staging */
    int *site_of;                   /* [local table count]: the site of a local tensor, -1 for none */
    const struct param_table *table;/* this rank's tensors (the FP8 GEMMs' weights are found by offset) */
    const struct backend *be;
    int grad_e5m2;                  /* output gradients in e5m2 (their exponents follow its range) */
};

/* The sites of the blocks [begin, end) of the model, with this rank's
 * tensors `local` (its table, offsets into its parameter buffer) mapped to
 * them; an empty history of `length` steps. */
void fp8_history_create(struct fp8_history *h, const struct backend *be, const struct model_config *cfg,
                        const struct param_table *local, int begin, int end, int length, int grad_e5m2);
void fp8_history_free(struct fp8_history *h);
/* The site of the local tensor holding element `offset` of the parameter
 * buffer (a weight passed to an FP8 GEMM), or -1. */
int fp8_history_site_at(const struct fp8_history *h, size_t offset);
/* The site named `name` (experts' names with or without their number), or -1. */
int fp8_history_find(const struct fp8_history *h, const char *name);
/* Start a step's record (zero). */
void fp8_history_begin_step(struct fp8_history *h);
/* End a step on every rank together: the record max-reduced over `world`
 * and pushed. Returns 1, or 0 when some amax was not finite (not pushed). */
int fp8_history_end_step(struct fp8_history *h, struct comm *world);
/* Push one step's amaxes ([sites][FP8_OPERANDS], host) and recompute the
 * exponents; after writing h->amax directly, recompute with push NULL. */
void fp8_history_push(struct fp8_history *h, const float *step_amax);
/* The recipe of an FP8 GEMM on `site`: the exponents of its operands and
 * where to record their amaxes. */
struct fp8_recipe fp8_history_recipe(const struct fp8_history *h, struct fp8_recipe base, int site);
