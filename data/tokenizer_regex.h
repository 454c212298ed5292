/* Pre-tokenizer regexes as the reference engines read them. */
#pragma once
#include <stddef.h>

/* PCRE2 (UTF + UCP) counts U+180E MONGOLIAN VOWEL SEPARATOR as \s: its
 * horizontal-space list predates Unicode 6.3, which made U+180E a format
 * character. The engines behind Hugging Face tokenizers (Oniguruma) and
 * tiktoken (Rust regex) use the Unicode White_Space property. Returns a
 * malloc'd copy of pattern with every \s and \S written as an explicit
 * White_Space class, or NULL with a message in err (\S inside a [...] class
 * cannot be written that way). Escapes, \Q...\E and POSIX [:name:] classes
 * are skipped over, so only real \s / \S change. */
char *regex_with_unicode_white_space(const char *pattern, char *err, size_t errsz);

/* The White_Space code points as PCRE2 class items (no brackets). */
#define REGEX_WHITE_SPACE_ITEMS \
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
