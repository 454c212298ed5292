/* AdamW over the parameter table, gradient clipping by global norm, and the
 * learning-rate schedules. */
#pragma once
#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/params.h"

struct optimizer {
    const struct backend *be;
    const struct param_table *table;
    struct optimizer_config cfg;
    float *m, *v;     /* moments, mirroring the parameter buffer */
    int step;         /* completed updates */
};

void optimizer_create(struct optimizer *o, const struct backend *be, const struct param_table *t,
                      const struct optimizer_config *cfg);
void optimizer_free(struct optimizer *o);
/* L2 norm over all gradients (each parameter counted once). */
double grad_global_norm(const struct backend *be, const struct param_table *t, const float *grads);
/* One AdamW update at learning rate lr; grads are clipped to cfg.grad_clip by
 * global norm (torch clip_grad_norm_ semantics). Weight decay skips norms. */
void optimizer_step(struct optimizer *o, float *params, const float *grads, double lr, double grad_norm);

/* Learning rate after `step` completed updates (the rate for update step+1). */
double lr_at(const struct optimizer_config *cfg, int total_steps, int step);
