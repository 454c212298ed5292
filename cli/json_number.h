/* A JSON number for inference output (eval --dump, generate --json): the
 * value, or null where it is not finite (a diverged model's logits; JSON has
 * no NaN or infinity, and jansson's json_real refuses them with NULL, which
 * an append would then silently drop). */
#pragma once
#include <jansson.h>
#include <math.h>

static inline json_t *json_finite_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }
