/* Rewriting \s and \S as Unicode White_Space classes (see the header). */
#include "data/tokenizer_regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"

static void put(char *out, size_t *k, const char *s, size_t n) {
    memcpy(out + *k, s, n);
    *k += n;
}

char *regex_with_unicode_white_space(const char *pattern, char *err, size_t errsz) {
    static const char items[] = REGEX_WHITE_SPACE_ITEMS;
    size_t n = strlen(pattern), k = 0;
    /* each two-character \s grows to at most the items plus "[^]" */
    char *out = xmalloc(n / 2 * (sizeof items + 3) + n + 1);
    int in_class = 0;
    for (size_t i = 0; i < n;) {
        char c = pattern[i];
        if (c == '\\' && i + 1 < n && pattern[i + 1] == 'Q') {
            /* \Q...\E is literal text: copy it unchanged */
            const char *end = strstr(pattern + i + 2, "\\E");
            size_t stop = end ? (size_t)(end - pattern) + 2 : n;
            put(out, &k, pattern + i, stop - i);
            i = stop;
        } else if (c == '\\' && i + 1 < n && (pattern[i + 1] == 's' || pattern[i + 1] == 'S')) {
            int negated = pattern[i + 1] == 'S';
            if (in_class && negated) {
                snprintf(err, errsz, "\\S inside a [...] class (at offset %zu) is not supported", i);
                free(out);
                return NULL;
            }
            if (!in_class) put(out, &k, negated ? "[^" : "[", negated ? 2 : 1);
            put(out, &k, items, sizeof items - 1);
            if (!in_class) put(out, &k, "]", 1);
            i += 2;
        } else if (c == '\\') {
            /* any other escape: the backslash and the escaped character */
            size_t len = i + 1 < n ? 2 : 1;
            put(out, &k, pattern + i, len);
            i += len;
        } else if (c == '[' && !in_class) {
            in_class = 1;
            put(out, &k, "[", 1);
            i++;
            if (i < n && pattern[i] == '^') put(out, &k, "^", 1), i++;
            if (i < n && pattern[i] == ']') put(out, &k, "]", 1), i++;  /* a leading ] is literal */
        } else if (c == '[' && in_class && i + 1 < n && pattern[i + 1] == ':') {
            /* a POSIX class such as [:alpha:] inside a class */
            const char *end = strstr(pattern + i + 2, ":]");
            size_t stop = end ? (size_t)(end - pattern) + 2 : i + 1;
            put(out, &k, pattern + i, stop - i);
            i = stop;
        } else {
            if (c == ']' && in_class) in_class = 0;
            put(out, &k, pattern + i, 1);
            i++;
        }
    }
    out[k] = 0;
    return out;
}
