/* Internal to `mtrain pretrain`: options parsed in pretrain.c, the training
 * loop (checkpoints, resume, rewind, signals) in pretrain_loop.c. */
#pragma once
#include "config/recipe.h"

struct pretrain_opts {
    const char *recipe;
    int dry_run;
    int stop_after;         /* save and exit 0 once this many steps are done (0: no) */
    const char *resume;     /* "auto" (default), "never" or a step directory */
    /* fault injection for tests: a step number, or 0 for none */
    int inject_nan, inject_spike, inject_crash, inject_crash_in_save;
};

int pretrain_run(const struct recipe *r, const struct pretrain_opts *o);
