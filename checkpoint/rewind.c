#include "checkpoint/rewind.h"

#include <math.h>

enum rewind_reason rewind_check(const struct rewind_config *cfg, struct train_state *st, double loss,
                                double grad_norm) {
    if (!isfinite(loss) || !isfinite(grad_norm)) return REWIND_NONFINITE;
    /* spikes are judged only once the averages have seen a window of steps */
    if (st->ema_seen >= cfg->window) {
        if (loss > cfg->spike_factor * st->ema_loss) return REWIND_LOSS_SPIKE;
        if (grad_norm > cfg->grad_spike_factor * st->ema_grad_norm) return REWIND_GRAD_SPIKE;
    }
    double alpha = 2.0 / (cfg->window + 1);
    if (st->ema_seen == 0) {
        st->ema_loss = loss;
        st->ema_grad_norm = grad_norm;
    } else {
        st->ema_loss += alpha * (loss - st->ema_loss);
        st->ema_grad_norm += alpha * (grad_norm - st->ema_grad_norm);
    }
    st->ema_seen++;
    return REWIND_NONE;
}

const char *rewind_reason_name(enum rewind_reason r) {
    static const char *const names[] = {"none", "nonfinite", "loss_spike", "grad_spike"};
    return names[r];
}
