/* Minimal unit-test support: each test program prints one line per case,
 * "PASS name", "FAIL name: why" or "SKIP name: why", and tests/run.sh counts
 * them. A program exits non-zero if any case failed. */
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int check_failures;

#define TEST_PASS(name) printf("PASS %s\n", name)
#define TEST_FAIL(name, ...)                 \
    do {                                     \
        printf("FAIL %s: ", name);           \
        printf(__VA_ARGS__);                 \
        printf("\n");                        \
        check_failures++;                    \
    } while (0)
#define TEST_RESULT(name, ok, ...)           \
    do {                                     \
        if (ok) TEST_PASS(name);             \
        else TEST_FAIL(name, __VA_ARGS__);   \
    } while (0)
#define TEST_EXIT() return check_failures ? 1 : 0

/* Largest |a-b| / max(|b|, floor) over n elements; floor keeps near-zero
 * references from blowing the ratio up. */
static inline double max_rel_err(const float *a, const double *b, size_t n, double floor_) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), floor_);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

/* Deterministic uniform(-1,1) test data. */
static inline float test_rand(unsigned long long *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return ((*state >> 40) / (double)(1ull << 24)) * 2.0 - 1.0;
}
/* n values of test_rand in a new array (caller frees). */
static inline float *test_rand_array(unsigned long long *state, size_t n) {
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = test_rand(state);
    return x;
}
