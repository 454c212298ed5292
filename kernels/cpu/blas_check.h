/* Which OpenBLAS kernels the CPU backend runs, and a guard against a
 * fallback to generic kernels (Prescott, Nehalem, ...) on a CPU with
 * AVX2/AVX-512, where matmuls run several times slower. */
#pragma once

struct blas_info {
    char core[64];     /* openblas_get_corename(), e.g. "Haswell" */
    char config[256];  /* openblas_get_config() */
    char isa[16];      /* the best vector ISA of this CPU: "AVX-512", "AVX2" or "" */
    char better[32];   /* a core to set in OPENBLAS_CORETYPE when core is generic; "" if fine */
    char note[512];    /* "" if fine; else what happened or what to set, for the start line */
};

/* Describe the kernels in use (after any correction of blas_fix_core). */
void blas_info_get(struct blas_info *b);

/* Early in main, before any thread or MPI: when OpenBLAS chose a generic
 * core on an AVX2/AVX-512 CPU and the user did not set OPENBLAS_CORETYPE,
 * set it to the right core and exec this program again (once: a marker
 * variable prevents a loop; OpenBLAS reads the variable only when it loads).
 * Returns if nothing was done or the exec failed (then blas_info_get says so). */
void blas_fix_core(char **argv);
