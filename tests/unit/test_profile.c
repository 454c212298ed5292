/* The profiled table (kernels/profile.h) against the table it wraps: the
 * same numbers, the table's identity kept, calls counted per (op, shape),
 * FLOP rates only for what has a count, counting paused and reset, and a
 * table that stays bounded when shapes keep changing. The report is read
 * back from a memory stream. */
#define _GNU_SOURCE
#include <string.h>

#include "kernels/profile.h"
#include "tests/unit/check.h"

static char *report(int steps) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    profile_report(f, steps);
    fclose(f);
    return buf;
}

/* the calls per step of the row (op, shape), or -1; its TFLOP/s column into rate */
static double row_calls(const char *rep, const char *op, const char *shape, char rate_out[16]) {
    const char *line = rep;
    while ((line = strchr(line, '\n'))) {
        line++;
        double ms, share, calls;
        char rate[16], o[32], s[64] = "";
        if (sscanf(line, "%lf %lf%% %lf %15s %31s %63[^\n]", &ms, &share, &calls, rate, o, s) >= 5 && !strcmp(o, op) &&
            !strcmp(s, shape)) {
            if (rate_out) strcpy(rate_out, rate);
            return calls;
        }
    }
    return -1;
}

static int rows_in(const char *rep) {
    int n = -2; /* the header and the column names */
    for (const char *p = rep; *p; p++) n += *p == '\n';
    return n;
}

int main(void) {
    const struct backend *cpu = &cpu_backend, *be = backend_profiled(cpu);
    TEST_RESULT("profile_keeps_the_table", be != cpu && !strcmp(be->name, "cpu") && be->precision == cpu->precision &&
                                                 be->act_bytes == cpu->act_bytes && !be->fp8_matmul_forward &&
                                                 be->alloc == cpu->alloc && be->matmul_forward != cpu->matmul_forward,
                "the wrapper lost a field");
    TEST_RESULT("profile_one_table_per_inner", backend_profiled(cpu) == be, "a second wrap of the same table differs");

    /* the same numbers */
    enum { N = 24, K = 40, M = 56 };
    unsigned long long seed = 3;
    float *x = test_rand_array(&seed, N * K), *w = test_rand_array(&seed, M * K);
    float *a = be->alloc(sizeof(float) * N * M), *b = cpu->alloc(sizeof(float) * N * M);
    be->matmul_forward(a, x, w, N, K, M, 0);
    cpu->matmul_forward(b, x, w, N, K, M, 0);
    TEST_RESULT("profile_same_numbers", !memcmp(a, b, sizeof(float) * N * M), "profiled matmul differs");

    /* counted by (op, shape); the GEMM has a rate, adamw none */
    profile_reset();
    for (int i = 0; i < 6; i++) be->matmul_forward(a, x, w, N, K, M, i & 1);
    be->matmul_forward(a, x, w, N / 2, K, M, 0);
    float *m = cpu->alloc(sizeof(float) * M * K), *v = cpu->alloc(sizeof(float) * M * K);
    be->adamw(w, x, m, v, (size_t)N * K, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, NULL);
    int was = profile_counting(0);
    be->matmul_forward(a, x, w, N, K, M, 0); /* not counted */
    profile_counting(was);
    char *rep = report(2);
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%dx%d", N, K, M);
    char gemm_rate[16] = "", adam_rate[16] = "";
    double full = row_calls(rep, "matmul_forward", shape, gemm_rate);
    snprintf(shape, sizeof shape, "%dx%dx%d", N / 2, K, M);
    double half = row_calls(rep, "matmul_forward", shape, NULL);
    snprintf(shape, sizeof shape, "%d", N * K);
    double adam = row_calls(rep, "adamw", shape, adam_rate);
    TEST_RESULT("profile_counts_per_shape", full == 3.0 && half == 0.5 && adam == 0.5 && rows_in(rep) == 3,
                "calls per step %g, %g, %g in %d rows:\n%s", full, half, adam, rows_in(rep), rep);
    TEST_RESULT("profile_rate_only_with_flops", !strcmp(adam_rate, "-") && atof(gemm_rate) >= 0 && strcmp(gemm_rate, "-"),
                "rates: matmul %s, adamw %s", gemm_rate, adam_rate);
    free(rep);

    profile_reset();
    rep = report(1);
    TEST_RESULT("profile_reset_forgets", rows_in(rep) == 0, "%d rows after a reset", rows_in(rep));
    free(rep);

    /* shapes without end: the table stays bounded, no call is lost */
    int calls = 3 * PROFILE_ENTRIES, add3 = 0;
    float *big = cpu->alloc(sizeof(float) * calls);
    for (int i = 0; i < calls; i++) be->add(big, big, 1 + i % 7), add3 += i % 7 == 2;
    for (int i = 0; i < calls; i++) be->scale(big, 1.0f, 1 + i);
    rep = report(1);
    double sum = 0;
    for (const char *line = strchr(rep, '\n'); line && (line = strchr(line + 1, '\n'));) {
        double ms, share, c;
        if (sscanf(line + 1, "%lf %lf%% %lf", &ms, &share, &c) == 3) sum += c;
    }
    TEST_RESULT("profile_bounded", rows_in(rep) <= PROFILE_ENTRIES && sum == 2.0 * calls &&
                                       row_calls(rep, "scale", "other", NULL) > 0 && row_calls(rep, "add", "3", NULL) == add3,
                "%d rows, %g calls of %d, add(3) %g", rows_in(rep), sum, 2 * calls, row_calls(rep, "add", "3", NULL));
    free(rep);

    /* an op's parts (profile_part): listed after the ops, in parentheses, left out of their total */
    profile_reset();
    be->matmul_forward(a, x, w, N, K, M, 0);
    profile_part("fp8_test_casts", 0, 0.25, "%dx%dx%d", N, K, M);
    profile_part("fp8_test_gemm", 2e12, 0.5, "%dx%dx%d", N, K, M);
    profile_part("fp8_test_gemm", 2e12, 0.5, "%dx%dx%d", N, K, M);
    rep = report(1);
    snprintf(shape, sizeof shape, "%dx%dx%d", N, K, M);
    char part_rate[16] = "";
    double casts = row_calls(rep, "(fp8_test_casts)", shape, NULL);
    double gemm_calls = row_calls(rep, "(fp8_test_gemm)", shape, part_rate);
    const char *parts_at = strstr(rep, "parts of the ops above"), *mm_at = strstr(rep, "matmul_forward");
    double ops_ms = -1;
    const char *its = strstr(rep, "its ops ");
    if (its) ops_ms = atof(its + 8);
    int ordered = parts_at && mm_at && mm_at < parts_at && parts_at < strstr(rep, "(fp8_test_casts)");
    TEST_RESULT("profile_parts_listed_apart",
                casts == 1 && gemm_calls == 2 && !strcmp(part_rate, "4.0") && ordered && ops_ms >= 0 && ops_ms < 250,
                "casts %g, gemm %g calls at %s TFLOP/s, ops %g ms:\n%s", casts, gemm_calls, part_rate, ops_ms, rep);
    free(rep);
    char *js = profile_json(1);
    TEST_RESULT("profile_parts_in_json", strstr(js, "\"op\":\"(fp8_test_gemm)\",\"part\":true,") &&
                                             !strstr(js, "\"op\":\"matmul_forward\",\"part\""),
                "%s", js);
    free(js);
    int on = profile_counting(0);
    int active = profile_parts_active();
    profile_counting(on);
    TEST_RESULT("profile_parts_only_while_counting", !active && profile_parts_active(), "parts active while paused");

    free(x), free(w);
    be->free(a), cpu->free(b), cpu->free(m), cpu->free(v), cpu->free(big);
    TEST_EXIT();
}
