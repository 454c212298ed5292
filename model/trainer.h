/* One optimizer step of a model: micro-batch gradient accumulation, global
 * grad norm, clipping, LR schedule, AdamW. Used by `mtrain pretrain` and by
 * the PyTorch reference driver, so both exercise the same path. */
#pragma once
#include <stdint.h>

#include "config/recipe.h"
#include "model/llama.h"
#include "model/optimizer.h"

struct trainer {
    struct llama model;
    struct optimizer opt;
    const struct recipe *recipe;
    int32_t *inputs, *targets;   /* host staging for one micro batch */
};

struct step_stats {
    double loss;        /* mean token loss of the global batch */
    double grad_norm;   /* before clipping */
    double lr;
    long tokens;
};

void trainer_create(struct trainer *tr, const struct backend *be, const struct recipe *r);
void trainer_free(struct trainer *tr);
/* samples: n sequences of seq_len+1 tokens (this rank's share of the global
 * batch), consumed micro_batch at a time. Computes loss, gradients and their
 * norm; parameters are untouched, so a caller can still reject the step. */
struct step_stats trainer_compute(struct trainer *tr, const int32_t *samples, int n);
/* Apply AdamW with the schedule's LR times lr_scale (stats->lr is set). */
void trainer_update(struct trainer *tr, struct step_stats *stats, double lr_scale);
/* trainer_compute + trainer_update. */
struct step_stats trainer_step(struct trainer *tr, const int32_t *samples, int n);
/* Mean token loss over n samples without touching gradients. */
double trainer_eval(struct trainer *tr, const int32_t *samples, int n);
