#include <string.h>

#include "config/common.h"
#include "model/trainer.h"

void trainer_create(struct trainer *tr, const struct backend *be, const struct recipe *r) {
    memset(tr, 0, sizeof *tr);
    tr->recipe = r;
    llama_create(&tr->model, be, &r->model, r->train.micro_batch, r->train.seq_len);
    optimizer_create(&tr->opt, be, &tr->model.table, &r->optimizer);
    size_t n = (size_t)r->train.micro_batch * r->train.seq_len;
    tr->inputs = xmalloc(sizeof(int32_t) * n);
    tr->targets = xmalloc(sizeof(int32_t) * n);
}

void trainer_free(struct trainer *tr) {
    optimizer_free(&tr->opt);
    llama_free(&tr->model);
    free(tr->inputs);
    free(tr->targets);
}

/* Split micro batch i of samples into inputs (first T tokens) and targets (shifted by one). */
static void stage_micro_batch(struct trainer *tr, const int32_t *samples, int first) {
    int T = tr->recipe->train.seq_len, B = tr->recipe->train.micro_batch;
    for (int b = 0; b < B; b++) {
        const int32_t *s = samples + (size_t)(first + b) * (T + 1);
        memcpy(tr->inputs + (size_t)b * T, s, sizeof(int32_t) * T);
        memcpy(tr->targets + (size_t)b * T, s + 1, sizeof(int32_t) * T);
    }
}

struct step_stats trainer_compute(struct trainer *tr, const int32_t *samples, int n) {
    const struct recipe *r = tr->recipe;
    struct llama *m = &tr->model;
    int B = r->train.micro_batch, T = r->train.seq_len;
    CHECK(n % B == 0);
    struct step_stats st = {0};
    /* the loss is the mean over every token of the batch, so each micro
     * batch's gradient is scaled by 1 / (all tokens) */
    float dscale = 1.0f / ((float)n * T);
    m->be->zero(m->grads, sizeof(float) * m->table.total);
    double loss_sum = 0;
    for (int first = 0; first < n; first += B) {
        stage_micro_batch(tr, samples, first);
        loss_sum += llama_step(m, tr->inputs, tr->targets, dscale);
    }
    st.tokens = (long)n * T;
    st.loss = loss_sum / st.tokens;
    st.grad_norm = grad_global_norm(m->be, &m->table, m->grads);
    return st;
}

void trainer_update(struct trainer *tr, struct step_stats *st, double lr_scale) {
    st->lr = lr_at(&tr->recipe->optimizer, tr->recipe->train.steps, tr->opt.step) * lr_scale;
    optimizer_step(&tr->opt, tr->model.params, tr->model.grads, st->lr, st->grad_norm);
}

struct step_stats trainer_step(struct trainer *tr, const int32_t *samples, int n) {
    struct step_stats st = trainer_compute(tr, samples, n);
    trainer_update(tr, &st, 1.0);
    return st;
}

double trainer_eval(struct trainer *tr, const int32_t *samples, int n) {
    int B = tr->recipe->train.micro_batch, T = tr->recipe->train.seq_len;
    double loss_sum = 0;
    for (int first = 0; first + B <= n; first += B) {
        stage_micro_batch(tr, samples, first);
        loss_sum += llama_step(&tr->model, tr->inputs, tr->targets, 0.0f);
    }
    return loss_sum / ((double)(n / B) * B * T);
}
