/* Option parsing shared by the subcommands' hand-written argv loops. Inside
 * `for (i = 1; i < argc; i++) { const char *a = argv[i], *v = next or NULL;
 * char *end = NULL; if (...) ...; OPT_STR(...) OPT_NUM(...) else ... }`:
 * OPT_STR stores a string value, OPT_NUM converts one with `conv` (which sets
 * `end`) and exits the parse with EXIT_USAGE when it is malformed or `ok`
 * fails. `o` is the options struct being filled. */
#pragma once
#include <stdio.h>
#include <string.h>

#define OPT_STR(flag, field) else if (!strcmp(a, flag) && v) o->field = v, i++
#define OPT_NUM(cmd, flag, field, conv, ok)                                                             \
    else if (!strcmp(a, flag) && v) {                                                                   \
        o->field = conv;                                                                                \
        if (end == v || *end || !(ok)) {                                                                \
            fprintf(stderr, "mtrain: error: " cmd ": %s '%s' is not valid (see mtrain help " cmd ")\n", a, v); \
            return EXIT_USAGE;                                                                          \
        }                                                                                               \
        i++;                                                                                            \
    }

/* The message for an argument no option took. */
static inline void opt_unexpected(const char *cmd, const char *a, const char *v) {
    fprintf(stderr, "mtrain: error: %s: unexpected argument '%s'%s\n\n", cmd, a,
            a[0] != '-' ? "" : v ? " (unknown option)" : " (unknown option, or its value is missing)");
}
