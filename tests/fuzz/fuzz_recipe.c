/* Fuzz the recipe YAML loader (config/recipe_yaml.c) and the cross-field
 * validation (config/recipe_validate.c), then plan the model the way
 * `mtrain pretrain --dry-run` does (parameter table, memory estimate).
 * Seeds: recipes from recipes/. */
#include "tests/fuzz/fuzz.h"

#include "config/recipe.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "parallel/schedule.h"

const char fuzz_name[] = "fuzz_recipe";
static char data_dir[4200];

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {
    snprintf(data_dir, sizeof data_dir, "data.path=%s/data", workdir);
    char d[4200];
    snprintf(d, sizeof d, "%s/data", workdir);
    mkdir(d, 0755);
}

int fuzz_one(const char *path, int seed_index) {
    static struct recipe r;
    recipe_defaults(&r);
    if (recipe_load(&r, path) != 0) return 2;
    /* the seeds' data directories do not exist here; any other path error still counts */
    if (!r.data.blend.n && recipe_set(&r, data_dir) != 0) return 2;
    if (recipe_validate(&r, 0) != 0) return 2;
    /* what the dry run computes on one rank */
    int64_t n = model_param_count(&r.model);
    struct memory_estimate e = model_memory_estimate(&r, 1, &cpu_backend);
    printf("%lld %zu %g\n", (long long)n, e.total, model_flops_per_token(&r.model, r.train.seq_len));
    int m = r.train.global_batch / r.train.micro_batch;
    if (r.parallel.pp > 1 && !(r.parallel.vpp > 1 && m % r.parallel.pp))
        schedule_print(stdout, schedule_kind(r.parallel.schedule, r.parallel.vpp), r.parallel.pp, r.parallel.vpp, m);
    return 0;
}
