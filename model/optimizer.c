#include <math.h>
#include <string.h>

#include "config/common.h"
#include "model/optimizer.h"

void optimizer_create(struct optimizer *o, const struct backend *be, const struct param_table *t,
                      const struct optimizer_config *cfg) {
    memset(o, 0, sizeof *o);
    o->be = be;
    o->table = t;
    o->cfg = *cfg;
    o->m = be->alloc(sizeof(float) * t->total);
    o->v = be->alloc(sizeof(float) * t->total);
}

void optimizer_free(struct optimizer *o) {
    o->be->free(o->m);
    o->be->free(o->v);
}

double grad_global_norm(const struct backend *be, const struct param_table *t, const float *grads) {
    double ss = 0;
    for (int i = 0; i < t->count; i++) ss += be->sum_squares(grads + t->items[i].offset, t->items[i].numel);
    return sqrt(ss);
}

void optimizer_step(struct optimizer *o, float *params, const float *grads, double lr, double grad_norm) {
    float scale = 1.0f;
    if (o->cfg.grad_clip > 0) {
        double coef = o->cfg.grad_clip / (grad_norm + 1e-6);
        if (coef < 1.0) scale = (float)coef;
    }
    o->step++;
    for (int i = 0; i < o->table->count; i++) {
        const struct param_info *p = &o->table->items[i];
        float wd = p->kind == PARAM_NORM ? 0.0f : (float)o->cfg.weight_decay;
        o->be->adamw(params + p->offset, grads + p->offset, o->m + p->offset, o->v + p->offset, p->numel,
                     (float)lr, (float)o->cfg.beta1, (float)o->cfg.beta2, (float)o->cfg.eps, wd, scale, o->step);
    }
}

/* Warmup is linear from lr/warmup to lr; then the schedule runs from lr down
 * to min_lr over [warmup, decay_steps). wsd holds lr until the last
 * wsd_decay_steps of the run, then decays linearly to min_lr. */
double lr_at(const struct optimizer_config *c, int total_steps, int step) {
    if (step < c->warmup_steps) return c->lr * (step + 1) / c->warmup_steps;
    const char *s = c->schedule;
    if (!strcmp(s, "constant")) return c->lr;
    if (!strcmp(s, "wsd")) {
        int start = total_steps - c->wsd_decay_steps;
        if (step < start || c->wsd_decay_steps == 0) return c->lr;
        double p = (double)(step - start) / c->wsd_decay_steps;
        return c->lr - (c->lr - c->min_lr) * (p > 1 ? 1 : p);
    }
    int end = c->decay_steps > 0 ? c->decay_steps : total_steps;
    double span = end - c->warmup_steps;
    double p = span > 0 ? (step - c->warmup_steps) / span : 1.0;
    if (p > 1) p = 1;
    if (!strcmp(s, "linear")) return c->lr - (c->lr - c->min_lr) * p;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1 + cos(M_PI * p)); /* cosine */
}
