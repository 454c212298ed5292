/* The rewind monitor: decides, before a step's update is applied, whether
 * the step went bad (non-finite loss or grad norm, or a spike against the
 * running averages). Pure logic; the training loop does the rolling back. */
#pragma once
#include "checkpoint/checkpoint.h"
#include "config/recipe.h"

enum rewind_reason { REWIND_NONE = 0, REWIND_NONFINITE, REWIND_LOSS_SPIKE, REWIND_GRAD_SPIKE };

/* Judge a step; the averages in st are updated only for good steps. */
enum rewind_reason rewind_check(const struct rewind_config *cfg, struct train_state *st, double loss,
                                double grad_norm);
const char *rewind_reason_name(enum rewind_reason r);
