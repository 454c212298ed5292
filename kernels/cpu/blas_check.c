/* OpenBLAS core check: see blas_check.h. */
#include "kernels/cpu/blas_check.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Set by blas_fix_core for the exec'd process: the core OpenBLAS had chosen. */
#define REEXEC_MARK "MTRAIN_BLAS_REEXEC"

/* OpenBLAS cores with AVX2 (or AVX-512) kernels; any other is a generic fallback
 * on a CPU that has them. */
static int core_uses_avx2(const char *core) {
    static const char *const fast[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "Sapphirerapids", "Excavator"};
    for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++)
        if (!strcasecmp(core, fast[i])) return 1;
    return 0;
}

static void cpu_isa(char *out, size_t n) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) snprintf(out, n, "AVX-512");
    else if (__builtin_cpu_supports("avx2")) snprintf(out, n, "AVX2");
    else out[0] = 0;
}

/* The core OpenBLAS should use, or "" when its choice is fine. */
static void better_core(const char *core, const char *isa, char *out, size_t n) {
    out[0] = 0;
    if (!isa[0] || core_uses_avx2(core)) return;
    snprintf(out, n, "%s", !strcmp(isa, "AVX-512") ? "SkylakeX" : "Haswell");
}

void blas_info_get(struct blas_info *b) {
    memset(b, 0, sizeof *b);
    const char *core = openblas_get_corename(), *config = openblas_get_config();
    snprintf(b->core, sizeof b->core, "%s", core ? core : "unknown");
    snprintf(b->config, sizeof b->config, "%s", config ? config : "unknown");
    cpu_isa(b->isa, sizeof b->isa);
    better_core(b->core, b->isa, b->better, sizeof b->better);
    const char *set = getenv("OPENBLAS_CORETYPE"), *was = getenv(REEXEC_MARK);
    if (b->better[0])
        snprintf(b->note, sizeof b->note,
                 "OpenBLAS runs its generic %s kernels on this %s CPU (matmuls several times slower)%s%s%s: set "
                 "OPENBLAS_CORETYPE=%s", b->core, b->isa, set ? " because OPENBLAS_CORETYPE=" : "", set ? set : "",
                 set ? " is set" : "", b->better);
    else if (was && set)
        snprintf(b->note, sizeof b->note, "OpenBLAS had chosen its generic %s kernels: mtrain set OPENBLAS_CORETYPE=%s",
                 was, set);
}

void blas_fix_core(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") || getenv(REEXEC_MARK)) return; /* the user's choice, or done once */
    char isa[16], better[32];
    const char *core = openblas_get_corename();
    if (!core) return;
    cpu_isa(isa, sizeof isa);
    better_core(core, isa, better, sizeof better);
    if (!better[0]) return;
    if (setenv(REEXEC_MARK, core, 1) != 0 || setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    /* exec failed: run on, and the start line says what to set */
    unsetenv("OPENBLAS_CORETYPE");
}
