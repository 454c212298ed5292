/* Fuzz the system file loader (config/system.c) that `mtrain plan` reads,
 * then use what it accepted: every curve read at a few sizes, and the spec
 * written back and loaded again (it must load: system_write's output is a
 * system file). Seeds: recipes/systems/ *.yaml. */
#include "tests/fuzz/fuzz.h"

#include <math.h>

#include "config/system.h"

const char fuzz_name[] = "fuzz_system";
static const char *work;

void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) { work = workdir; }

int fuzz_one(const char *path, int seed_index) {
    static struct system_spec s, again;
    char err[1024], out[4300];
    if (system_load(&s, path, err, sizeof err) != 0) return 2;
    const struct system_curve *curves[] = {&s.gemm, &s.gemm_fp8, &s.attention};
    for (int c = 0; c < 3; c++)
        for (double size = 1; size < 1e16; size *= 1000)
            if (!isfinite(system_curve_at(curves[c], size))) abort(); /* an accepted curve gives numbers */
    snprintf(out, sizeof out, "%s/written.yaml", work);
    if (system_write(&s, out, "# fuzz\n") != 0) return 1;
    if (system_load(&again, out, err, sizeof err) != 0) {
        fprintf(stderr, "written back, not loaded: %s\n", err);
        abort();
    }
    return 0;
}
