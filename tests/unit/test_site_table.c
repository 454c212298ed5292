/* kernels/cuda/site_table.h, the FP8 GEMMs' per-weight table, on the CPU:
 * weights at addresses that are multiples of 1 MiB (as in a flat parameter
 * buffer), many more than the first table holds: every one found with its
 * record after the table grew, absent addresses not found, a find never
 * moving the table, and probe counts that stay short (a hash whose low
 * bits ignore an aligned address's high bits would put every weight in
 * one chain). */
#include <string.h>

#include "kernels/cuda/site_table.h"
#include "tests/unit/check.h"

int main(void) {
    enum { N = 20000 };
    struct site_table s = {0};
    const char *base = (const char *)(uintptr_t)0x7f0000000000ull;
    int ok = 1;
    for (int i = 0; i < N; i++) {
        const void *w = base + ((size_t)i << 20);
        if (site_find(&s, w)) ok = 0; /* not there yet */
        struct fp8_site *e = site_insert(&s, w);
        if (!e || e->w != w || e->rows || e->buf) ok = 0;
        else e->rows = i, e->cols = -i;
    }
    TEST_RESULT("site_table_insert", ok && s.used == N && 2 * s.used <= s.cap, "used %zu, cap %zu", s.used, s.cap);
    int found = 1, moved = 0;
    size_t probes = 0, worst = 0;
    struct fp8_site *t = s.t;
    for (int i = 0; i < N; i++) {
        const void *w = base + ((size_t)i << 20);
        struct fp8_site *e = site_find(&s, w);
        if (!e || e->w != w || e->rows != i || e->cols != -i) found = 0;
        size_t p = 0;
        site_slot(s.t, s.cap, w, &p);
        probes += p, worst = p > worst ? p : worst;
    }
    moved = s.t != t;
    TEST_RESULT("site_table_find_after_growth", found && !moved, "a record lost or the table moved by a find");
    int absent = 1;
    for (int i = 0; i < 1000; i++)
        if (site_find(&s, base + ((size_t)(N + i) << 20) + 64)) absent = 0;
    TEST_RESULT("site_table_absent_not_found", absent, "an address never inserted was found");
    /* at most half full: a hash mixing every bit gives ~1.5 probes on average, short worst chains */
    double mean = (double)probes / N;
    TEST_RESULT("site_table_short_probes", mean < 3.0 && worst < 64, "mean %.2f, worst %zu probes", mean, worst);
    free(s.t);
    TEST_EXIT();
}
